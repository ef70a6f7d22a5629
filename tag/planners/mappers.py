"""Mappers for :func:`tag.exact.plan_pipeline`: place a StageGraph's replicas on devices.

A mapper is called as ``mapper(stage_graph, replicas, cluster, devices, seed=...)`` and returns a
:class:`~tag.exact.pipeline.Placement`. Those made here build the Parmesan :class:`~tag.exact.MappingProblem`
of the stage graph on the sub-cluster of ``devices`` (:func:`tag.exact.pipeline_problem`), place it, and
report its eq. (5) objective and a lower bound in the same unit:

- ``"exact"``: :func:`~tag.exact.solve_mapping` (binary search + DFS), proven optimal or with its gap;
- ``"cs"``, ``"p2p"``, ``"random"``: the heuristic mapping, with the assignment lower bound beside it;
- ``"mcts"``: the shared MCTS over :class:`tag.search.MappingEnv` with uniform priors (pure MCTS),
  ``mcts_iterations`` leaves or ``time_limit`` seconds, whichever ends first; the assignment lower bound
  beside it;
- ``"learned"``: the mapping GNN's greedy decode, its greedy decodes under rising thresholds,
  ``learned_backtrack_dives`` dives of the backtracking search (None: DEFAULT_BACKTRACK_DIVES),
  ``learned_discrepancies`` one-discrepancy leaves (None: one per stage replica) and
  ``learned_iterations`` leaves of the same MCTS with its priors and greedy fill
  (:func:`tag.planners.learned_mapper.learned_mapping`); ``policy`` is a checkpoint path or a loaded
  MappingPolicy, the shipped ``checkpoints/tag-mapper.pt`` by default;
- ``"learned-fast"``: the same with the fast setting's defaults (no backtracking, no discrepancy pass,
  FAST_MAPPER_ITERATIONS leaves): about a tenth of the exact mapper's time at 64 devices, a few per cent
  further from the optimum.

Every stage needs the same replica count (RaNNC may give unequal ones: :class:`~tag.exact.MappingError`).
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np

from tag._rng import as_rng
from tag.cluster.cluster import Cluster
from tag.exact.heuristics import cs_map, p2p_map, random_map
from tag.exact.mappers import MAPPERS, pipeline_problem
from tag.exact.mapping import (
    AUTO,
    MappingError,
    MappingProblem,
    assignment_lower_bound,
    choose_instantiation,
    max_stage_time,
    solve_mapping,
)
from tag.exact.pipeline import Mapper, Placement
from tag.exact.stage_graph import StageGraph
from tag.search import MappingEnv, mcts_search, uniform_mapping_evaluator

__all__ = ["MAPPERS", "make_mapper"]

DEFAULT_MCTS_ITERATIONS = 2000
_HEURISTICS = {"cs": cs_map, "p2p": p2p_map}


def make_mapper(name: str, *, time_limit: float = 60.0, instantiation: str = AUTO, workers: int = 1,
                mcts_iterations: int = DEFAULT_MCTS_ITERATIONS, learned_iterations: int | None = None,
                learned_discrepancies: int | None = None, learned_backtrack_dives: int | None = None,
                policy: Any = None) -> Mapper:
    """The mapper called ``name`` (one of :data:`MAPPERS`); ``time_limit`` bounds the exact solver and
    MCTS, ``workers`` is the exact solver's."""
    if name not in MAPPERS:
        raise MappingError(f"mapper must be one of {', '.join(MAPPERS)}, got {name!r}")
    learned = name in ("learned", "learned-fast")
    if learned:  # load (and check) the policy now, not at the first placement
        # imported here, not above: the learned mapper needs torch, which no other mapper loads
        from tag.planners import learned_mapper
        from tag.policy.mapping import resolve_mapping_policy

        policy = resolve_mapping_policy(policy)
        fast = name == "learned-fast"
        if learned_iterations is None:
            learned_iterations = (learned_mapper.FAST_MAPPER_ITERATIONS if fast
                                  else learned_mapper.DEFAULT_MAPPER_ITERATIONS)
        if learned_discrepancies is None and fast:
            learned_discrepancies = learned_mapper.FAST_MAPPER_DISCREPANCIES
        if learned_backtrack_dives is None:
            learned_backtrack_dives = (learned_mapper.FAST_BACKTRACK_DIVES if fast
                                       else learned_mapper.DEFAULT_BACKTRACK_DIVES)

    def mapper(stage_graph: StageGraph, replicas: Any, cluster: Cluster, devices: Sequence[int], *,
               seed: int | np.random.Generator | None = 0) -> Placement:
        ids = np.asarray(list(devices), dtype=np.int64)
        problem = pipeline_problem(stage_graph, cluster, ids)
        mode = choose_instantiation(problem) if instantiation == AUTO else instantiation
        if name == "exact":
            result = solve_mapping(problem, instantiation=mode, time_limit=time_limit, workers=workers, seed=seed)
            return Placement(ids[result.mapping].tolist(), result.lower_bound, result.proven_optimal,
                             result.solve_time_s, result.max_stage_time, mode, result.gap)
        start = time.perf_counter()
        if name == "mcts":
            mapping = _mcts_map(problem, mode, mcts_iterations, time_limit, seed)
        elif learned:
            mapping = learned_mapper.learned_mapping(problem, policy, instantiation=mode,
                                                     iterations=learned_iterations,
                                                     discrepancies=learned_discrepancies, time_limit_s=time_limit,
                                                     seed=seed, backtrack_dives=learned_backtrack_dives)
        else:
            mapping = random_map(problem, as_rng(seed)) if name == "random" else _HEURISTICS[name](problem)
        value = max_stage_time(problem, mapping, mode)
        bound = min(assignment_lower_bound(problem, mode), value)
        gap = 0.0 if value <= bound or value <= 0 else (value - bound) / value
        return Placement(ids[mapping].tolist(), bound, bound >= value, time.perf_counter() - start, value, mode, gap)

    mapper.__name__ = f"{name}_mapper"
    return mapper


def _mcts_map(problem: MappingProblem, mode: str, iterations: int, time_limit: float,
              seed: int | np.random.Generator | None) -> np.ndarray:
    """[S, R] the best mapping pure MCTS finds."""
    env = MappingEnv(problem, instantiation=mode)
    result = mcts_search(env, uniform_mapping_evaluator, max_iterations=iterations, time_limit_s=time_limit,
                         target_visits=None, seed=seed)
    return np.asarray(result.best, dtype=np.int64)
