"""The learned mapper: place a :class:`~tag.exact.MappingProblem`'s stage replicas with the mapping GNN
(:mod:`tag.policy.mapping`) guiding the shared MCTS (:mod:`tag.search`).

:func:`learned_mapping` searches a :class:`~tag.search.MappingEnv` whose fill is the decoder's greedy
completion: the greedy decode, greedy decodes under rising thresholds of the stage time, a
backtracking search under a bisection of targets (:mod:`tag.policy.mapping.backtrack`: limited
discrepancy search over the decoder's ranking, pruned by each slot's reach and the rings' regions), one
pass of limited discrepancy search without a target (the runner-up device at each slot in turn), then
MCTS with the decoder's priors. The decoder is built first (the slots' order is the problem's,
:func:`search_order`) and handed to the environment as its fill.
"""

from __future__ import annotations

import math
import time

import numpy as np

from tag.exact.mapping import MappingProblem
from tag.policy.mapping import (MASKED_LOGIT, MappingDecoder, MappingInstance, MappingPolicy, quick_lower_bound,
                                search_order)
from tag.policy.mapping.backtrack import backtrack, limited_discrepancy
from tag.search import LeafEvaluation, MappingEnv, MappingObservation, mcts_search

__all__ = ["learned_mapping", "DEFAULT_MAPPER_ITERATIONS", "DEFAULT_MAPPER_DISCREPANCIES", "FAST_MAPPER_ITERATIONS",
           "FAST_MAPPER_DISCREPANCIES", "RING_START_WIDTH", "THRESHOLD_STEPS", "DEFAULT_BACKTRACK_DIVES",
           "FAST_BACKTRACK_DIVES", "LDS", "DFS"]

DEFAULT_MAPPER_ITERATIONS = 32  # MCTS leaves after the greedy decode and the discrepancy pass
DEFAULT_MAPPER_DISCREPANCIES: int | None = None  # one-discrepancy leaves after the greedy decode (None: a pass)
# runners-up the discrepancy pass tries at a stage's replica 0, where no neighbour constrains the decoder yet
# and a ring's region is chosen (wider than elsewhere: it lowered the gaps on held-out problems)
RING_START_WIDTH = 4
THRESHOLD_STEPS = 8  # greedy decodes under thresholds from the lower bound up to the greedy decode's time
DEFAULT_BACKTRACK_DIVES = 400  # greedy dives of the backtracking search after the threshold decodes
BACKTRACK_TARGET_SHARE = 4  # a target of the backtracking search's bisection gets 1/this of its dives left
BACKTRACK_RESOLUTION = 1e-3  # the bisection stops once its targets are this close (relative)
FAST_BACKTRACK_DIVES = 0  # the fast setting does not backtrack: it is timed against the exact mapper at 64
LDS, DFS = "lds", "dfs"  # the backtracking search's orders (_backtrack_pass)
_TARGET_RTOL = 1e-9  # a map within this relative distance of a target meets it (rounding)
# the fast setting ("learned fast", docs/benchmarks/mappers.md): the greedy and threshold decodes and a few
# MCTS leaves, no discrepancy pass; within 5% of the optimum at 16-64 devices at about a tenth of the exact
# mapper's time (2 leaves: as close as 4 on held-out topologies, and faster)
FAST_MAPPER_ITERATIONS = 2
FAST_MAPPER_DISCREPANCIES = 0
_PROVEN = 1.0 - 1e-12  # a map's value (quick lower bound / its time) at which it is optimal


def learned_mapping(problem: MappingProblem, policy: MappingPolicy, *, instantiation: str,
                    iterations: int = DEFAULT_MAPPER_ITERATIONS,
                    discrepancies: int | None = DEFAULT_MAPPER_DISCREPANCIES, time_limit_s: float | None = None,
                    lower_bound: float | None = None, seed: int | np.random.Generator | None = 0,
                    patience: int | None = None, backtrack_dives: int = DEFAULT_BACKTRACK_DIVES) -> np.ndarray:
    """[S, R] the best mapping of the mapping GNN's decoder on a :class:`~tag.search.MappingEnv`: one
    forward pass and the greedy decode; then up to THRESHOLD_STEPS greedy decodes under thresholds
    from the lower bound up (:func:`_threshold_pass`); then up to ``backtrack_dives`` greedy dives of
    a backtracking search under a bisection of targets (:func:`_backtrack_pass`); then up to
    ``discrepancies`` one-discrepancy leaves (None: a whole pass, S·(R − 1 + RING_START_WIDTH) leaves at
    most; :func:`_discrepancy_pass`:
    a runner-up device at one slot of the best map, the rest greedy under the best map's time); then up
    to ``iterations`` leaves of MCTS with the decoder's priors and greedy fill. ``time_limit_s`` caps
    all five steps; each stops once a map meets ``lower_bound`` (by default :func:`quick_lower_bound`:
    the map is then optimal, and the search is skipped when the greedy decode does), and MCTS after
    ``patience`` leaves in a row that did not improve its best (None: no such stop). The CS map is among
    the candidates, so the result is never worse than it."""
    start = time.perf_counter()
    if lower_bound is None:  # the search's value is a bound over the time: the quick one costs nothing
        lower_bound = quick_lower_bound(problem, instantiation)
    decoder = MappingDecoder(policy, MappingInstance.build(problem, instantiation, *search_order(problem)))
    env = MappingEnv(problem, instantiation=instantiation, lower_bound=lower_bound, fill=decoder.complete)
    if not (np.array_equal(env.slot_stage, decoder.instance.slot_stage)
            and np.array_equal(env.slot_replica, decoder.instance.slot_replica)):
        raise RuntimeError("search_order disagrees with MappingEnv's slot order: the decoder would fill wrongly")
    best = max((env.baseline(), env.evaluate(env.root())), key=lambda leaf: -leaf.time)
    deadline = math.inf if time_limit_s is None else start + time_limit_s
    budget = math.inf if discrepancies is None else discrepancies
    if best.value < _PROVEN:
        best = _threshold_pass(env, decoder, best, lower_bound, deadline)
    if best.value < _PROVEN and backtrack_dives > 0:
        best = _backtrack_pass(env, decoder, best, lower_bound, deadline, backtrack_dives)
    if best.value < _PROVEN and budget > 0:
        best = _discrepancy_pass(env, decoder, best, budget, deadline)
    if best.value >= _PROVEN or iterations <= 0 or time.perf_counter() >= deadline:
        return np.asarray(best.candidate, dtype=np.int64)

    def evaluator(observation: MappingObservation) -> np.ndarray:
        if observation.next_slot < 0:  # terminal: no candidates
            return np.zeros(0)
        return decoder.priors(observation.assigned[:observation.next_slot].tolist())

    result = mcts_search(env, evaluator, max_iterations=iterations + 1, target_visits=None, seed=seed,
                         time_limit_s=None if time_limit_s is None else max(deadline - time.perf_counter(), 1e-9),
                         stop_value=_PROVEN, patience=patience)  # its first leaf, the root, is the greedy decode
    return np.asarray(result.best if result.best_time < best.time else best.candidate, dtype=np.int64)


def _threshold_pass(env: MappingEnv, decoder: MappingDecoder, best: LeafEvaluation, lower_bound: float,
                    deadline: float, *, steps: int = THRESHOLD_STEPS) -> LeafEvaluation:
    """The best leaf of greedy decodes under the thresholds τ_i = LB · (t / LB)^(i / steps), i = 0, 1, …,
    from the lower bound ``lower_bound`` up to the time t of ``best`` (:meth:`MappingDecoder.complete`
    with ``bound=τ_i``: each slot on the decoder's best device that keeps its reach within τ_i); the first
    leaf faster than ``best`` ends the pass. Stops at ``deadline`` or once a leaf is optimal.

    The decoder's physical terms weigh a slow link against its learned scores by a few tenths of a
    logit per lower bound of time, which its learned terms outweigh: a ring on a mesh takes a two-hop
    link or runs into a corner it cannot close from, and one discrepancy per slot cannot undo several
    such choices at once. Under a threshold those devices are masked (like the exact mapper's Algorithm
    1, which searches under one), and the decoder chooses among the rest. The lowest thresholds fail
    most often, so they come first: a decode that fits τ_i is what higher thresholds would find at best."""
    start = best.time
    if lower_bound <= 0 or start <= lower_bound:
        return best
    for i in range(steps):
        if time.perf_counter() >= deadline:
            break
        full = decoder.complete([], bound=lower_bound * (start / lower_bound) ** (i / steps))
        if full is None:
            continue
        leaf = env.evaluate(tuple(full))
        if leaf.time < best.time:
            return leaf
    return best


def _discrepancy_pass(env: MappingEnv, decoder: MappingDecoder, best: LeafEvaluation, budget: float,
                      deadline: float, *, start_width: int = RING_START_WIDTH) -> LeafEvaluation:
    """The best leaf of one pass of limited discrepancy search from ``best`` (a LeafEvaluation of the
    greedy decode or better): for slot k = 0, 1, …, the runner-up device of the decoder's logits at k
    after the best map's first k slots (the ``start_width`` runners-up at a stage's replica 0), completed
    greedily under the best map's time (each slot within it, :meth:`MappingDecoder.complete`), replaces
    the best when it is faster. Up to ``budget`` leaves; stops at ``deadline``
    (perf_counter seconds) or once a leaf is optimal. MCTS's leaves deviate near the root; these deviate
    at every depth, where the greedy decode's mistakes on 32-64 devices are (a ring placed across a slow
    link, the last rings once earlier ones took the good regions)."""
    slots = env.slot_stage, env.slot_replica
    devices = np.asarray(best.candidate)[slots].tolist()  # [K] the best map in the search's slot order
    for k in range(len(devices)):
        if budget <= 0 or best.value >= _PROVEN or time.perf_counter() >= deadline:
            break
        logits = decoder.logits(devices[:k])
        logits[devices[k]] = MASKED_LOGIT
        width = start_width if env.slot_replica[k] == 0 else 1
        for runner_up in np.argsort(-logits, kind="stable")[:width].tolist():
            if logits[runner_up] <= MASKED_LOGIT or budget <= 0:  # no other free device, or no budget left
                break
            budget -= 1
            full = decoder.complete(devices[:k] + [runner_up], bound=best.time)
            if full is None:  # provably no faster: its running time passed the best map's
                continue
            leaf = env.evaluate(tuple(full))
            if leaf.time < best.time:
                best, devices = leaf, full
                break
    return best


def _backtrack_pass(env: MappingEnv, decoder: MappingDecoder, best: LeafEvaluation, lower_bound: float,
                    deadline: float, dives: int, *, strategy: str = LDS) -> LeafEvaluation:
    """The best leaf of a bisection over targets between ``lower_bound`` and the time of ``best``, each
    searched under the target with a 1/BACKTRACK_TARGET_SHARE share of what is left of ``dives``:
    :func:`~tag.policy.mapping.backtrack.limited_discrepancy` (``strategy`` LDS) or the chronological
    :func:`~tag.policy.mapping.backtrack.backtrack` (DFS), both over the decoder's ranking with its reach
    and the rings' regions as pruning. A map found lowers the upper end to its time; a target without one
    (none exists, or out of dives) raises the lower end. The first target is the lower bound itself,
    which the meshes' rings meet (a map found there is optimal). Stops at ``deadline``, once the targets
    are BACKTRACK_RESOLUTION apart, or once a leaf is optimal.

    Why limited discrepancy by default: a greedy decode under a target gets stuck in the last rings of a
    256-device mesh, where an early choice (the region a ring took) is the mistake; the chronological
    search spends its dives varying the last slots, while discrepancy order varies each slot once before
    it varies two (on the 256-device meshes, both depths reach the optimum within 400 dives; the
    chronological search stays 41–51% from it)."""
    search = {LDS: limited_discrepancy, DFS: backtrack}[strategy]

    def evaluate(devices: list[int]) -> float:
        return env.evaluate(tuple(devices)).time

    low, left = lower_bound, dives
    target = lower_bound
    while left > 0 and best.value < _PROVEN and time.perf_counter() < deadline:
        if target <= 0 or target >= best.time * (1.0 - BACKTRACK_RESOLUTION):
            break
        share = left if left < 2 * BACKTRACK_TARGET_SHARE else left // BACKTRACK_TARGET_SHARE
        found = search(decoder, target, evaluate, dives=share, deadline=deadline)
        left -= found.dives
        if found.devices is not None and found.time < best.time:
            best = env.evaluate(tuple(found.devices))
        if found.devices is None or found.time > target * (1.0 + _TARGET_RTOL):
            low = target
        target = math.sqrt(low * best.time)
    return best
