"""A FlexFlow-style MCMC baseline over the same placements, simulator and budget as MCTS.

Start from the environment's root plan (DP-NCCL). Each iteration proposes a neighbour: one op group,
drawn uniformly, moves to one of its candidate actions other than its current one, drawn uniformly.
The proposal is simulated (through the environment's cache) and accepted by the Metropolis rule on
iteration time:

    P(accept) = min(1, exp(−α · Δ)),   Δ = (t_proposed − t_current) / t_current

so a faster plan is always taken and a slower one with a probability that falls with its relative
slow-down. Memory comes first: a plan that fits is always accepted over one that does not, a plan that
does not fit is never accepted over one that does; between two OOM plans the rule runs on their
unlimited-memory times, so a walk that starts out of memory still drifts toward smaller plans.
"""

from __future__ import annotations

import math

import numpy as np

from tag._rng import as_rng
from tag.search.base import frozen_gc
from tag.search.env import LeafEvaluation
from tag.search.placement import PlacementEnv
from tag.search.result import ProgressCallback, SearchResult, Tracker
from tag.strategy import Strategy

__all__ = ["mcmc_search", "acceptance_probability", "metropolis_step", "propose", "DEFAULT_ALPHA"]

DEFAULT_ALPHA = 20.0  # a plan 5% slower is accepted with probability e^-1
# Proposals in a row that all hit the cache before the chain gives up: only a candidate space smaller than
# the simulation budget gets there.
_STALL_ITERATIONS = 10_000


def acceptance_probability(current_time: float, current_feasible: bool, proposed_time: float,
                           proposed_feasible: bool, *, alpha: float) -> float:
    """Metropolis acceptance of a proposal (module docstring)."""
    if proposed_feasible != current_feasible:
        return 1.0 if proposed_feasible else 0.0
    if proposed_time <= current_time:
        return 1.0
    return math.exp(-alpha * (proposed_time - current_time) / current_time)


def metropolis_step(current: LeafEvaluation, proposal: LeafEvaluation, *, alpha: float,
                    rng: np.random.Generator) -> LeafEvaluation:
    """The chain's next plan: ``proposal`` with :func:`acceptance_probability`, else ``current``. Draws one
    uniform number from ``rng`` only when that probability is below 1."""
    p = acceptance_probability(current.time, current.feasible, proposal.time, proposal.feasible, alpha=alpha)
    return proposal if p >= 1.0 or rng.random() < p else current


def propose(strategy: Strategy, masks: np.ndarray, options: np.ndarray, rng: np.random.Generator) -> Strategy:
    """``strategy`` with one uniformly drawn op group moved to a uniformly drawn candidate action other than
    its current one. ``masks`` [A, M], ``options`` [A]."""
    group = int(rng.integers(strategy.num_groups))
    differs = (masks != strategy.placement[group]).any(axis=1) | (options != strategy.option[group])  # [A]
    choices = np.flatnonzero(differs)
    if not len(choices):  # a single candidate, already taken
        return strategy
    action = int(rng.choice(choices))
    return strategy.with_group(group, masks[action], options[action])


def mcmc_search(env: PlacementEnv, *, alpha: float = DEFAULT_ALPHA, max_iterations: int | None = None,
                max_simulations: int | None = None, time_limit_s: float | None = None,
                seed: int | np.random.Generator | None = 0, initial: Strategy | None = None,
                progress: ProgressCallback | None = None) -> SearchResult:
    """Markov chain Monte Carlo over complete strategies of ``env`` until a budget is spent.

    ``alpha``: α of the acceptance rule. ``initial``: the starting plan (default the environment's root
    plan, DP-NCCL). Budgets, ``progress`` and the result as for :func:`~tag.search.mcts.mcts_search`
    (one iteration = one proposal); ``targets`` is empty. It also stops after 10 000 proposals in a row
    that were all simulated before (a candidate space smaller than the budget).
    """
    if not alpha >= 0:
        raise ValueError(f"alpha must be non-negative, got {alpha!r}")
    rng = as_rng(seed)
    tracker = Tracker(env, max_iterations=max_iterations, max_simulations=max_simulations,
                      time_limit_s=time_limit_s, progress=progress)
    current = env.score(env.strategy(env.root()) if initial is None else initial)
    tracker.record(current, iteration=0)
    stalled, simulations = 0, tracker.num_simulations
    with frozen_gc():  # the environment's tables and caches, built by now, stay out of the collector's scans
        while not tracker.done() and stalled < _STALL_ITERATIONS:
            proposal = env.score(propose(current.candidate, env.masks, env.options, rng))
            stalled = 0 if tracker.num_simulations > simulations else stalled + 1
            simulations = tracker.num_simulations
            tracker.record(proposal)
            current = metropolis_step(current, proposal, alpha=alpha, rng=rng)
            tracker.step()
    return tracker.result("mcmc", [])
