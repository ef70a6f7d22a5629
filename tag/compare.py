"""Every planner on one (model, cluster), through one simulator (DESIGN.md: Comparing learned and exact).

:func:`compare_planners` runs, in order:

- the data-parallel baselines DP-NCCL, DP-NCCL-P and Horovod-like (tag.baselines);
- the strategy searches of tag plan at one budget: MCMC (FlexFlow-style), pure MCTS (uniform priors),
  and tag (GNN priors + MCTS; the shipped policy unless another checkpoint is given);
- Parmesan pipelines: one partition, (S, R, M) chosen by simulation (Parmesan App. B), then mapped by
  each stage-to-device mapper (exact, CS, p2p, pure MCTS, learned: GNN + MCTS) and re-simulated on that
  mapping; the mappers
  report their max stage time against the exact mapper's lower bound;
- RaNNC (its Algorithms 1–2, its own placement), and GraphPipe's graph pipeline where the model has
  branches to exploit.

Each row: planner, kind, iteration time, speed-up over DP-NCCL (None when either does not fit), peak
memory, search time, feasibility; mapper rows add the max stage time, the lower bound and the gap to it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from tag.cluster import Cluster
from tag.cost import CostModel
from tag.graph import OpGraph

__all__ = ["CompareConfig", "compare_planners", "PIPELINE_MAPPERS"]

log = logging.getLogger(__name__)

PIPELINE_MAPPERS = ("exact", "cs", "p2p", "mcts", "learned")  # Parmesan's partition, each of these placing it
_MAPPER_LABELS = {"cs": "CS", "p2p": "p2p", "mcts": "pure-MCTS", "learned": "learned (GNN+MCTS)"}


@dataclass(frozen=True)
class CompareConfig:
    """What ``tag compare`` gathers from its flags."""

    budget: int = 300  # search iterations of MCMC, pure MCTS and tag
    num_groups: int = 60  # METIS op groups of the strategy searches
    policy: str | None = None  # GNN checkpoint for the tag row; None: the shipped one
    mapping_time_limit: float = 60.0  # seconds for the exact mapper (and the MCTS mapper's cap)
    mcts_mapper_iterations: int = 2000  # leaves of the pure-MCTS mapper
    mapper_policy: str | None = None  # mapping GNN checkpoint of the learned mapper; None: the shipped one
    graphpipe: bool = True  # include GraphPipe's graph pipeline
    seed: int = 0


Progress = Callable[[str], None]


def compare_planners(graph: OpGraph, cluster: Cluster, *, config: CompareConfig = CompareConfig(),
                     progress: Progress | None = None, cost: CostModel | None = None) -> list[dict[str, Any]]:
    """One row per planner (module docstring); every figure simulated with ``cost``'s op times (default the
    roofline)."""
    say = progress or (lambda message: None)
    rows: list[dict[str, Any]] = []
    rows += _strategy_rows(graph, cluster, config, say, cost)
    rows += _pipeline_rows(graph, cluster, config, say, cost)
    reference = rows[0]  # DP-NCCL
    for row in rows:
        fits = row["feasible"] and reference["feasible"] and row["iteration_time_s"] > 0
        row["speedup_over_dp_nccl"] = reference["iteration_time_s"] / row["iteration_time_s"] if fits else None
    return rows


def _row(planner: str, kind: str, iteration_time_s: float, feasible: bool, peak_memory_bytes: float,
         search_time_s: float, **extra: Any) -> dict[str, Any]:
    return {"planner": planner, "kind": kind, "iteration_time_s": float(iteration_time_s), "feasible": bool(feasible),
            "peak_memory_bytes": float(peak_memory_bytes), "search_time_s": float(search_time_s),
            "max_stage_time_s": None, "lower_bound_s": None, "gap": None, "proven_optimal": None, **extra}


def _strategy_rows(graph: OpGraph, cluster: Cluster, config: CompareConfig, say: Progress,
                   cost: CostModel | None = None) -> list[dict[str, Any]]:
    from tag.planner import COMPARED_BASELINES, PlanConfig, load_priors, plan_training

    from tag.policy import shipped_policy_path

    searches = [("MCMC", "mcmc", None), ("pure MCTS", "mcts", None),
                ("tag (GNN+MCTS)", "mcts", config.policy or str(shipped_policy_path()))]
    rows, outcome = [], None
    for label, search, policy in searches:
        say(f"{label}: {config.budget} iterations")
        priors = load_priors(policy)
        plan_config = PlanConfig(num_groups=config.num_groups, max_iterations=config.budget, search=search,
                                 seed=config.seed)
        outcome = plan_training(graph, cluster, config=plan_config, evaluator=priors.evaluator,
                                batch_evaluator=priors.batch_evaluator,
                                batch_size=8 if priors.batch_evaluator is not None else 1, cost=cost)
        if not rows:  # the baselines, as the first planning run simulated them
            names = {"dp-nccl": "DP-NCCL", "dp-nccl-p": "DP-NCCL-P", "horovod": "Horovod-like"}
            for key, baseline in zip(COMPARED_BASELINES, outcome.baselines):
                rows.append(_row(names[key], "baseline", baseline.iteration_time_s, not baseline.oom,
                                 float(np.max(baseline.peak_memory)), 0.0))
        result = outcome.result
        rows.append(_row(label, "strategy", result.iteration_time, result.feasible, float(result.peak_memory.max()),
                         outcome.search.search_time_s, iterations=outcome.search.num_iterations,
                         origin=outcome.origin))
    return rows


def _pipeline_rows(graph: OpGraph, cluster: Cluster, config: CompareConfig, say: Progress,
                   cost: CostModel | None = None) -> list[dict[str, Any]]:
    from tag.errors import TagError
    from tag.exact import plan_pipeline, simulate_pipeline
    from tag.planners.mappers import make_mapper

    rows = []
    say("Parmesan partition + exact map")
    start = time.perf_counter()
    try:
        plan = plan_pipeline(graph, cluster, partitioner="parmesan", seed=config.seed, cost=cost,
                             mapper=make_mapper("exact", time_limit=config.mapping_time_limit))
    except TagError as error:
        log.warning("Parmesan pipeline: %s", error)
        rows.append(_failed("Parmesan + exact map", "pipeline", str(error)))
        plan = None
    if plan is not None:
        partition_s = time.perf_counter() - start - plan.solve_time_s
        sg = plan.stage_graph
        devices = sorted(d for row in plan.mapping for d in row)
        # the exact mapper's own mapping (plan_pipeline keeps the search's placement where the simulator
        # prefers it, which is then no longer the mapping the bound was proven for)
        exact_mapper = make_mapper("exact", time_limit=config.mapping_time_limit)
        exact = exact_mapper(sg, sg.replicas.tolist(), cluster, devices, seed=config.seed)
        _, exact_result = simulate_pipeline(sg, cluster, exact.mapping, schedule=plan.schedule)
        rows.append(_pipeline_row("Parmesan + exact map", exact_result, exact.max_stage_time, exact.lower_bound,
                                  exact.proven_optimal, partition_s + exact.solve_time_s, plan))
        for name in PIPELINE_MAPPERS[1:]:
            label = _MAPPER_LABELS[name]
            say(f"Parmesan partition + {name} map")
            try:
                mapper = make_mapper(name, time_limit=config.mapping_time_limit,
                                     mcts_iterations=config.mcts_mapper_iterations, policy=config.mapper_policy)
            except TagError as error:  # the learned mapper without a checkpoint
                log.warning("%s map: %s", label, error)
                rows.append(_failed(f"Parmesan + {label} map", "pipeline", str(error)))
                continue
            placement = mapper(sg, sg.replicas.tolist(), cluster, devices, seed=config.seed)
            _, result = simulate_pipeline(sg, cluster, placement.mapping, schedule=plan.schedule)
            bound = exact.lower_bound  # the exact mapper's: the optimum when it was proven
            rows.append(_pipeline_row(f"Parmesan + {label} map", result, placement.max_stage_time, bound,
                                      None, partition_s + placement.solve_time_s, plan))
    say("RaNNC")
    start = time.perf_counter()
    try:
        rannc = plan_pipeline(graph, cluster, partitioner="rannc", seed=config.seed, cost=cost)
        rows.append(_pipeline_row("RaNNC", rannc.result, rannc.max_stage_time, None, None,
                                  time.perf_counter() - start, rannc))
    except TagError as error:
        log.warning("RaNNC: %s", error)
        rows.append(_failed("RaNNC", "pipeline", str(error)))
    if config.graphpipe:
        say("GraphPipe")
        from tag.graphpipe import plan_graph_pipeline

        start = time.perf_counter()
        try:
            gp = plan_graph_pipeline(graph, cluster, cost=cost)
            figures = gp.as_dict()
            rows.append(_row("GraphPipe", "graph pipeline", figures["iteration_time_s"], figures["feasible"],
                             figures["peak_memory_bytes"], time.perf_counter() - start,
                             max_stage_time_s=figures["max_stage_time_s"], stages=figures["stages"]))
        except TagError as error:
            log.warning("GraphPipe: %s", error)
            rows.append(_failed("GraphPipe", "graph pipeline", str(error)))
    return rows


def _pipeline_row(planner: str, result, max_stage_time: float | None, lower_bound: float | None,
                  proven: bool | None, search_time_s: float, plan) -> dict[str, Any]:
    gap = None
    if lower_bound is not None and max_stage_time is not None and max_stage_time > 0:
        gap = max(0.0, (max_stage_time - lower_bound) / max_stage_time)
        proven = (gap == 0.0) if proven is None else proven
    sg = plan.stage_graph
    counts = sg.replicas.tolist()
    return _row(planner, "pipeline", result.iteration_time, result.feasible, float(result.peak_memory.max()),
                search_time_s, max_stage_time_s=max_stage_time, lower_bound_s=lower_bound, gap=gap,
                proven_optimal=proven, stages=sg.num_stages, replicas=counts[0] if len(set(counts)) == 1 else counts,
                micro_batches=sg.micro_batches)


def _failed(planner: str, kind: str, why: str) -> dict[str, Any]:
    return _row(planner, kind, float("inf"), False, float("nan"), 0.0, note=why)
