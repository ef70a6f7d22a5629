"""One planner for the user: the fastest plan of any family, each family's best, and the compute bound.

:func:`plan_fastest` asks the families of :mod:`tag.planners.families` in order of cost (data-parallel
and pipelines first, then graph pipelines, then the placement search, which takes what is left of the
time budget), keeps every candidate's simulated iteration, and returns the fastest feasible one (the
fastest of all when none fits). Every figure is the one simulator's, so the families compare; the
ratio to :func:`tag.planners.compute_bound` says how far a plan is from what the hardware allows.

Time budget (``time_limit_s``): the pipeline and graph pipeline planners run to the end of their own
searches (their cost is in each row's planning time); the exact mapper gets at most a tenth of the
budget per partitioner; the placement search gets what is left, at least a quarter of the budget.
Without a budget the placement search runs its ``config``'s iterations.
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
    data_parallel_candidates,
    graph_pipeline_candidates,
    pipeline_candidates,
    placement_candidates,
)
from tag.search import ProgressCallback

__all__ = ["FastestPlan", "PlannerError", "plan_fastest", "DEFAULT_MAPPER_SECONDS"]

DEFAULT_MAPPER_SECONDS = 10.0  # the exact mapper's limit per partitioner without a time budget


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
                "families": [row(c) for c in self.families.values()],
                "candidates": [row(c) for c in self.candidates]}


def _check_families(families: Sequence[str]) -> tuple[str, ...]:
    chosen = tuple(dict.fromkeys(families))
    unknown = [f for f in chosen if f not in FAMILIES]
    if not chosen or unknown:
        raise PlannerError(f"families must be some of {', '.join(FAMILIES)}, got {list(families)!r}")
    return chosen


def plan_fastest(graph: OpGraph, cluster: Cluster, *, families: Sequence[str] = FAMILIES,
                 time_limit_s: float | None = None, config: PlanConfig | None = None, priors: Priors | None = None,
                 cost: CostModel | None = None, progress: ProgressCallback | None = None) -> FastestPlan:
    """The fastest plan of ``graph`` on ``cluster`` over ``families`` (module docstring). ``config`` and
    ``priors`` drive the placement search (default: :class:`~tag.planner.PlanConfig` and uniform priors)."""
    chosen = _check_families(families)
    if time_limit_s is not None and not time_limit_s > 0:
        raise PlannerError(f"time_limit_s must be positive, got {time_limit_s!r}")
    config = config if config is not None else PlanConfig()
    priors = priors if priors is not None else load_priors(None)
    start = time.perf_counter()
    mapper_seconds = DEFAULT_MAPPER_SECONDS if time_limit_s is None else min(DEFAULT_MAPPER_SECONDS,
                                                                             time_limit_s / 10)
    candidates: list[Candidate] = []
    if "pipeline" in chosen:
        candidates += pipeline_candidates(graph, cluster, cost=cost, mapper_time_limit=mapper_seconds)
    if "graph-pipeline" in chosen:
        candidates += graph_pipeline_candidates(graph, cluster, cost=cost)
    outcome = None
    if "placement" in chosen:
        if time_limit_s is not None:
            left = max(time_limit_s - (time.perf_counter() - start), time_limit_s / 4)
            config = dataclasses.replace(config, time_limit_s=left, max_iterations=None)
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
                       time.perf_counter() - start, graph, cluster)
