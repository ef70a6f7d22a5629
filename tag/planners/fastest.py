"""One planner for the user: the fastest plan of any family, each family's best, and the compute bound.

:func:`plan_fastest` asks the families of :mod:`tag.planners.families` in order of cost (data-parallel
and pipelines first, then graph pipelines, then the placement search, which takes what is left of the
time budget), keeps every candidate's simulated iteration, and returns the fastest feasible one (the
fastest of all when none fits). Every figure is the one simulator's, so the families compare; the
ratio to :func:`tag.planners.compute_bound` says how far a plan is from what the hardware allows.

Time budget (``time_limit_s``): the families run one after another, pipelines first, and each gets its
weight's share (:data:`BUDGET_WEIGHTS`) of what the ones before it left; time a family leaves unused
flows to the next. The pipeline and graph pipeline searches stop at their share and keep the best plan
simulated so far; the placement search is given its share less :data:`PLACEMENT_OVERHEAD` of it, which
its grouping, baselines, SFB and final compilation take (:data:`PLACEMENT_OVERHEAD_S` at least), and the
whole placement planner its share as a deadline (:attr:`tag.planner.PlanConfig.deadline`: SFB stops
trying groups in time for the final pass). The data-parallel baselines come with the
placement search (or take a grouping and three simulations without it). Without a budget every family
runs its search to the end (the placement search its ``config``'s iterations).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Sequence

from tag.cluster import Cluster
from tag.cost import CostModel
from tag.errors import TagError
from tag.graph.opgraph import OpGraph
from tag.planner import PlanConfig, Priors, load_priors
from tag.planners.bounds import compute_bound
from tag.planners.families import (
    FAMILIES,
    Candidate,
    branches,
    data_parallel_candidates,
    graph_pipeline_candidates,
    pipeline_candidates,
    placement_candidates,
)
from tag.search import ProgressCallback

__all__ = ["FastestPlan", "PlannerError", "plan_fastest", "DEFAULT_MAPPER_SECONDS", "BUDGET_WEIGHTS",
           "PLACEMENT_OVERHEAD", "PLACEMENT_OVERHEAD_S"]

DEFAULT_MAPPER_SECONDS = 10.0  # the exact mapper's limit per partitioner (at most a quarter of its share)
# each budgeted family's weight: its share is weight / (sum of the weights of it and the families after it)
# of the time left when it starts
BUDGET_WEIGHTS = {"pipeline": 1.0, "graph-pipeline": 1.0, "placement": 2.0}
# share of the placement family's time kept for what runs around its search (grouping, baselines, SFB,
# final compilation and simulation)
PLACEMENT_OVERHEAD = 0.2
PLACEMENT_OVERHEAD_S = 4.0  # ... and at least this many seconds (or half the share), which they take on BERT-Large


class PlannerError(TagError):
    """A request the planners cannot meet: an unknown family, a bad budget, no family made a plan."""


@dataclass(eq=False)
class FastestPlan:
    """What :func:`plan_fastest` found."""

    best: Candidate  # the fastest feasible plan (the fastest of all when none fits)
    families: dict[str, Candidate]  # each family's best, for the families asked
    candidates: list[Candidate]  # every plan simulated, failures included
    compute_bound_s: float  # no plan is faster (tag.planners.bounds)
    planning_time_s: float
    graph: OpGraph
    cluster: Cluster
    time_limit_s: float | None = None  # the budget asked for
    shares_s: dict[str, float] = dataclasses.field(default_factory=dict)  # each budgeted family's share

    def family_times(self) -> dict[str, float]:
        """Seconds each family planned for (its candidates' planning times summed)."""
        out: dict[str, float] = {}
        for c in self.candidates:
            out[c.family] = out.get(c.family, 0.0) + c.planning_time_s
        return out

    @property
    def iteration_time_s(self) -> float:
        return self.best.iteration_time_s

    @property
    def bound_ratio(self) -> float:
        """The best plan's iteration over the compute bound (≥ 1)."""
        return self.best.iteration_time_s / self.compute_bound_s if self.compute_bound_s > 0 else float("inf")

    def as_dict(self) -> dict[str, Any]:
        bound = self.compute_bound_s

        def row(c: Candidate) -> dict[str, Any]:
            ratio = c.iteration_time_s / bound if c.ok and bound > 0 else None
            return {**c.as_dict(), "bound_ratio": ratio}

        return {"model": self.graph.meta.get("model", ""), "cluster": self.cluster.name,
                "devices": self.cluster.num_devices, "batch_size": self.graph.batch_size,
                "family": self.best.family, "planner": self.best.planner, "shape": self.best.shape,
                "iteration_time_s": self.best.iteration_time_s, "feasible": self.best.feasible,
                "peak_memory_bytes": self.best.peak_memory_bytes, "compute_bound_s": bound,
                "bound_ratio": self.bound_ratio, "planning_time_s": self.planning_time_s,
                "time_limit_s": self.time_limit_s, "family_shares_s": self.shares_s,
                "family_planning_time_s": self.family_times(),
                "families": [row(c) for c in self.families.values()],
                "candidates": [row(c) for c in self.candidates]}


def _check_families(families: Sequence[str]) -> tuple[str, ...]:
    chosen = tuple(dict.fromkeys(families))
    unknown = [f for f in chosen if f not in FAMILIES]
    if not chosen or unknown:
        raise PlannerError(f"families must be some of {', '.join(FAMILIES)}, got {list(families)!r}")
    return chosen


class _Budget:
    """The time left of a budget and each family's share of it (module docstring)."""

    def __init__(self, seconds: float | None, families: Sequence[str], start: float):
        self.deadline = None if seconds is None else start + seconds
        self.pending = [f for f in BUDGET_WEIGHTS if f in families]  # budgeted families not yet run
        self.shares: dict[str, float] = {}

    def share(self, family: str) -> float | None:
        """Seconds ``family`` may take now (None without a budget); it counts as run from here on."""
        weights = sum(BUDGET_WEIGHTS[f] for f in self.pending)
        self.pending.remove(family)
        if self.deadline is None:
            return None
        left = max(self.deadline - time.perf_counter(), 0.0)
        self.shares[family] = max(left * BUDGET_WEIGHTS[family] / weights, 0.05)
        return self.shares[family]


def plan_fastest(graph: OpGraph, cluster: Cluster, *, families: Sequence[str] = FAMILIES,
                 time_limit_s: float | None = None, config: PlanConfig | None = None, priors: Priors | None = None,
                 cost: CostModel | None = None, progress: ProgressCallback | None = None,
                 started: float | None = None) -> FastestPlan:
    """The fastest plan of ``graph`` on ``cluster`` over ``families`` (module docstring). ``config`` and
    ``priors`` drive the placement search (default: :class:`~tag.planner.PlanConfig` and uniform priors).
    ``started``: the ``time.perf_counter()`` the budget counts from (default: this call), so that a
    caller's loading of the model and priors comes out of it."""
    chosen = _check_families(families)
    if time_limit_s is not None and not time_limit_s > 0:
        raise PlannerError(f"time_limit_s must be positive, got {time_limit_s!r}")
    config = config if config is not None else PlanConfig()
    priors = priors if priors is not None else load_priors(None)
    start = time.perf_counter()
    graph_family = "graph-pipeline" in chosen and branches(graph, cluster)
    budget = _Budget(time_limit_s, [f for f in chosen if f != "graph-pipeline" or graph_family],
                     start if started is None else min(started, start))
    candidates: list[Candidate] = []
    if "pipeline" in chosen:
        candidates += pipeline_candidates(graph, cluster, cost=cost, mapper_time_limit=DEFAULT_MAPPER_SECONDS,
                                          time_limit_s=budget.share("pipeline"))
    if "graph-pipeline" in chosen:
        sequential = [c.plan for c in candidates if c.family == "pipeline" and c.ok]
        candidates += graph_pipeline_candidates(graph, cluster, cost=cost, sequential_plans=sequential,
                                                time_limit_s=budget.share("graph-pipeline") if graph_family else None)
    outcome = None
    if "placement" in chosen:
        seconds = budget.share("placement")
        if seconds is not None:
            around = max(seconds * PLACEMENT_OVERHEAD, min(PLACEMENT_OVERHEAD_S, seconds / 2))
            config = dataclasses.replace(config, time_limit_s=seconds - around, max_iterations=None,
                                         deadline=time.perf_counter() + seconds)
        placed = placement_candidates(graph, cluster, config=config, priors=priors, cost=cost, progress=progress)
        outcome = placed[0].plan
        candidates += placed
    if "data-parallel" in chosen:
        candidates += data_parallel_candidates(graph, cluster, config=config, cost=cost, outcome=outcome)
    best_of: dict[str, Candidate] = {}
    for candidate in candidates:
        current = best_of.get(candidate.family)
        if current is None or (candidate.ok and (not current.ok or candidate.key() < current.key())):
            best_of[candidate.family] = candidate
    made = [c for c in candidates if c.ok]
    if not made:
        raise PlannerError("no family made a plan: " + "; ".join(f"{c.planner}: {c.note}" for c in candidates))
    best = min(made, key=Candidate.key)
    families_best = {f: best_of[f] for f in chosen if f in best_of}
    return FastestPlan(best, families_best, candidates, compute_bound(graph, cluster, cost=cost),
                       time.perf_counter() - start, graph, cluster, time_limit_s, budget.shares)
