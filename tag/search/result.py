"""What a search returns, what it reports while it runs, and the bookkeeping both searches share.

Every search (MCTS, MCMC) keeps the best complete plan it simulated: a feasible plan beats an OOM one,
then the shorter iteration time wins; ties keep the earlier. The environment's reference plan (DP-NCCL)
is the first candidate, so a search never returns a plan worse than DP-NCCL when DP-NCCL fits.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, NamedTuple

import numpy as np

from tag.search.env import LeafEvaluation

__all__ = ["SearchResult", "HistoryPoint", "TrainingTarget", "SearchProgress", "ProgressCallback", "BEAT_RTOL",
           "beats_reference"]

# A plan "beats" the reference only when it is faster by more than this share of the reference time. Two
# plans that run the same tasks in a different order (a DP-like placement reached through the tree, say)
# can differ in the last bits of their summed times; that is not a better strategy, and counting it as
# one made searches "beat DP-NCCL" with a speed-up of 1.0000000000000004.
BEAT_RTOL = 1e-6


class HistoryPoint(NamedTuple):
    """The best plan so far, recorded each time it improves."""

    iteration: int  # search iterations done when it was found (0: the reference plan)
    elapsed_s: float
    num_simulations: int
    best_time: float
    best_speedup: float  # reference_time / best_time; 0.0 while no feasible plan is known


class TrainingTarget(NamedTuple):
    """A well-visited vertex: the state the evaluator saw there and MCTS's visit-count distribution."""

    state: Any  # a PlacementState for the placement environment
    policy: np.ndarray  # [A] π(s, a) = N(s, a) / Σ N(s, ·) over the state's candidates; sums to 1
    visits: int  # N(s)


class SearchProgress(NamedTuple):
    """Handed to the progress callback after every iteration."""

    iteration: int
    num_simulations: int
    elapsed_s: float
    best_time: float
    best_speedup: float
    max_iterations: int | None
    max_simulations: int | None
    time_limit_s: float | None

    def fraction(self) -> float:
        """How much of the tightest budget is spent, in [0, 1]."""
        parts = [self.iteration / self.max_iterations if self.max_iterations else 0.0,
                 self.num_simulations / self.max_simulations if self.max_simulations else 0.0,
                 self.elapsed_s / self.time_limit_s if self.time_limit_s else 0.0]
        return min(1.0, max(parts))


ProgressCallback = Callable[[SearchProgress], None]


class SearchResult(NamedTuple):
    """The outcome of a search over complete plans."""

    method: str  # "mcts" or "mcmc"
    best: Any  # the best complete plan simulated (a Strategy for the placement environment)
    best_time: float  # its simulated iteration time, seconds
    best_feasible: bool  # False only when no feasible plan was simulated
    reference_time: float  # seconds per iteration of the reference (DP-NCCL, or the environment's fallback)
    reference_name: str
    num_iterations: int
    num_simulations: int  # distinct plans simulated during the search (the reference's not counted)
    search_time_s: float
    history: list[HistoryPoint]  # the best so far, one point per improvement, the reference first
    first_beat_iteration: int | None  # iterations until a plan first beat the reference; None if none did
    targets: list[TrainingTarget]  # MCTS: vertices with enough visits; MCMC: none
    tree: Any = None  # MCTS: the search tree (tag.search.tree.Tree); MCMC: None

    @property
    def best_speedup(self) -> float:
        """reference_time / best_time; 0.0 when the best plan does not fit."""
        return _speedup(self.reference_time, self.best_time, self.best_feasible)


def _speedup(reference_time: float, time_s: float, feasible: bool) -> float:
    if not feasible:
        return 0.0
    return reference_time / time_s if time_s > 0 else math.inf


def beats_reference(time_s: float, reference_time: float) -> bool:
    """``time_s`` is faster than ``reference_time`` by more than :data:`BEAT_RTOL` of it."""
    return time_s < reference_time * (1.0 - BEAT_RTOL)


def check_budget(max_iterations: int | None, max_simulations: int | None, time_limit_s: float | None) -> None:
    """ValueError unless at least one budget is given and each given one is positive."""
    if max_iterations is None and max_simulations is None and time_limit_s is None:
        raise ValueError("give a budget: max_iterations, max_simulations or time_limit_s")
    for name, value in (("max_iterations", max_iterations), ("max_simulations", max_simulations)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1):
            raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
    if time_limit_s is not None and not (isinstance(time_limit_s, (int, float)) and time_limit_s > 0):
        raise ValueError(f"time_limit_s must be a positive number of seconds or None, got {time_limit_s!r}")


class Tracker:
    """Best plan, history, budgets and progress reports of one search."""

    def __init__(self, env: Any, *, max_iterations: int | None, max_simulations: int | None,
                 time_limit_s: float | None, progress: ProgressCallback | None) -> None:
        check_budget(max_iterations, max_simulations, time_limit_s)
        self.env = env
        self.max_iterations = max_iterations
        self.max_simulations = max_simulations
        self.time_limit_s = time_limit_s
        self.progress = progress
        self.start = time.perf_counter()
        self.simulations_before = env.num_simulations
        self.iteration = 0
        self.best: LeafEvaluation | None = None
        self.history: list[HistoryPoint] = []
        self.first_beat_iteration: int | None = None
        self.record(env.baseline(), iteration=0)

    @property
    def num_simulations(self) -> int:
        return self.env.num_simulations - self.simulations_before

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def record(self, evaluation: LeafEvaluation, *, iteration: int | None = None) -> None:
        """Keep ``evaluation`` if it beats the best so far (feasible first, then faster). It belongs to
        ``iteration`` (default: the one under way, 1-based)."""
        iteration = self.iteration + 1 if iteration is None else iteration
        reference = self.env.reference_time
        if self.first_beat_iteration is None and evaluation.feasible and beats_reference(evaluation.time, reference):
            self.first_beat_iteration = iteration
        best = self.best
        if best is not None and (best.feasible, -best.time) >= (evaluation.feasible, -evaluation.time):
            return
        self.best = evaluation
        self.history.append(HistoryPoint(iteration, self.elapsed(), self.num_simulations, evaluation.time,
                                         _speedup(reference, evaluation.time, evaluation.feasible)))

    def done(self) -> bool:
        """A budget is spent."""
        return ((self.max_iterations is not None and self.iteration >= self.max_iterations)
                or (self.max_simulations is not None and self.num_simulations >= self.max_simulations)
                or (self.time_limit_s is not None and self.elapsed() >= self.time_limit_s))

    def step(self) -> None:
        """One iteration done: count it and report progress."""
        self.iteration += 1
        if self.progress is not None:
            best = self.best
            self.progress(SearchProgress(self.iteration, self.num_simulations, self.elapsed(), best.time,
                                         _speedup(self.env.reference_time, best.time, best.feasible),
                                         self.max_iterations, self.max_simulations, self.time_limit_s))

    def result(self, method: str, targets: list[TrainingTarget], tree: Any = None) -> SearchResult:
        best = self.best
        return SearchResult(method, best.candidate, best.time, best.feasible, self.env.reference_time,
                            self.env.reference_name, self.iteration, self.num_simulations, self.elapsed(),
                            self.history, self.first_beat_iteration, targets, tree)
