"""The plan families :func:`tag.planners.plan_fastest` asks, each run by one function that returns its
candidates, every one simulated on the one simulator:

- **placement** (TAG): METIS groups, MCTS over per-group placements and options, SFB, fusion
  (:func:`tag.planner.plan_training`);
- **data-parallel**: the DP baselines DP-NCCL, DP-NCCL-P and Horovod (:mod:`tag.baselines`);
- **pipeline**: sequential pipelines, each partitioner of :data:`PIPELINE_PARTITIONERS` with its
  (S, R, M) search and the exact mapper (:func:`tag.exact.plan_pipeline`);
- **graph-pipeline**: GraphPipe's stage DAGs (:func:`tag.graphpipe.plan_graph_pipeline`), asked only
  when the model branches (on a chain a graph pipeline is a sequential one).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from tag.baselines import run_baselines
from tag.cluster import Cluster
from tag.cost import CostModel
from tag.exact import plan_pipeline
from tag.exact.stage_graph import ForwardGraph, PartitionError
from tag.graph.opgraph import OpGraph
from tag.graphpipe import plan_graph_pipeline
from tag.planner import COMPARED_BASELINES, PlanConfig, PlanOutcome, Priors, plan_training
from tag.planners.mappers import make_mapper
from tag.search import ProgressCallback

__all__ = ["Candidate", "FAMILIES", "PIPELINE_PARTITIONERS", "placement_candidates", "data_parallel_candidates",
           "pipeline_candidates", "graph_pipeline_candidates", "branches", "fastest_pipeline"]

log = logging.getLogger(__name__)

FAMILIES = ("placement", "data-parallel", "pipeline", "graph-pipeline")
PIPELINE_PARTITIONERS = ("parmesan", "pipedream", "rannc")
_DP_NAMES = {"DP-NCCL": "dp-nccl", "DP-NCCL-P": "dp-nccl-p", "Horovod": "horovod"}


@dataclass(eq=False)
class Candidate:
    """One simulated plan of one family."""

    family: str  # one of FAMILIES
    planner: str  # "tag", "DP-NCCL", "parmesan", "graphpipe", …
    iteration_time_s: float  # simulated (with unlimited memory when it does not fit)
    feasible: bool
    peak_memory_bytes: float  # the largest device's peak
    planning_time_s: float
    plan: Any = None  # PlanOutcome | BaselineResult | PipelinePlan | GraphPipelinePlan; None when it failed
    shape: str = ""  # what the plan is, in a few words ("2 stages x 8, M=2")
    note: str = ""  # why it failed or was skipped
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """A plan was made (feasible or not)."""
        return self.plan is not None

    def key(self) -> tuple[bool, float]:
        return (not self.feasible, self.iteration_time_s)

    def as_dict(self) -> dict[str, Any]:
        return {"family": self.family, "planner": self.planner,
                "iteration_time_s": self.iteration_time_s if self.ok else None,
                "feasible": self.feasible, "peak_memory_bytes": self.peak_memory_bytes,
                "planning_time_s": self.planning_time_s, "shape": self.shape, "note": self.note}


def _failed(family: str, planner: str, seconds: float, note: str) -> Candidate:
    return Candidate(family, planner, float("inf"), False, 0.0, seconds, None, "", note)


def branches(graph: OpGraph, cluster: Cluster) -> bool:
    """Whether some forward op feeds two others (a graph pipeline can then run branches side by side)."""
    fg = ForwardGraph.from_graph(graph, cluster.types[:1])
    return bool(fg.edge_src.size) and int(np.bincount(fg.edge_src).max()) > 1


def placement_candidates(graph: OpGraph, cluster: Cluster, *, config: PlanConfig, priors: Priors,
                         cost: CostModel | None = None, progress: ProgressCallback | None = None) -> list[Candidate]:
    """TAG's placement search: one candidate (its final plan)."""
    start = time.perf_counter()
    outcome: PlanOutcome = plan_training(graph, cluster, config=config, evaluator=priors.evaluator,
                                         batch_evaluator=priors.batch_evaluator,
                                         batch_size=8 if priors.batch_evaluator is not None else 1,
                                         progress=progress, cost=cost)
    result = outcome.result
    shape = f"{outcome.group_graph.num_groups} groups"
    return [Candidate("placement", "tag", float(result.iteration_time), bool(result.feasible),
                      float(result.peak_memory.max()), time.perf_counter() - start, outcome, shape,
                      info={"origin": outcome.origin})]


def data_parallel_candidates(graph: OpGraph, cluster: Cluster, *, config: PlanConfig, cost: CostModel | None = None,
                             outcome: PlanOutcome | None = None) -> list[Candidate]:
    """DP-NCCL, DP-NCCL-P and Horovod; reused from the placement search's ``outcome`` when there is one."""
    start = time.perf_counter()
    if outcome is not None:
        results, group_graph = outcome.baselines, outcome.group_graph
        start -= outcome.timings.get("baselines", 0.0)  # they ran inside the placement planner
    else:
        from tag.grouping import group_ops

        group_graph = group_ops(graph, num_groups=config.num_groups, cost=cost, gpus=cluster, seed=config.seed)
        results = run_baselines(group_graph, cluster, cost=cost, names=COMPARED_BASELINES)
    seconds = (time.perf_counter() - start) / max(len(results), 1)
    out = []
    for b in results:
        out.append(Candidate("data-parallel", b.name, float(b.iteration_time_s), not b.oom, float(b.peak_memory.max()),
                             seconds, b, f"1x{cluster.num_devices}", b.note,
                             info={"group_graph": group_graph}))
    return out


def pipeline_candidates(graph: OpGraph, cluster: Cluster, *, cost: CostModel | None = None,
                        mapper_time_limit: float = 10.0, partitioners: tuple[str, ...] = PIPELINE_PARTITIONERS,
                        time_limit_s: float | None = None) -> list[Candidate]:
    """Each partitioner's best sequential pipeline ((S, R, M) searched, then the exact mapper). With
    ``time_limit_s`` each partitioner searches for an even share of what the ones before it left, and
    its mapper for at most ``mapper_time_limit`` of that share."""
    out = []
    deadline = None if time_limit_s is None else time.perf_counter() + time_limit_s
    # RaNNC first: it takes a second or two, and what it leaves of its share goes to the DPs after it
    for k, partitioner in enumerate(sorted(partitioners, key=lambda p: p != "rannc")):
        start = time.perf_counter()
        share = None if deadline is None else max(deadline - start, 1e-3) / (len(partitioners) - k)
        mapper = make_mapper("exact", time_limit=mapper_time_limit if share is None
                             else max(min(mapper_time_limit, share / 4), 1e-3))
        try:
            plan = plan_pipeline(graph, cluster, auto=True, partitioner=partitioner, cost=cost, mapper=mapper,
                                 time_limit_s=None if share is None else share * 3 / 4)
        except PartitionError as error:
            out.append(_failed("pipeline", partitioner, time.perf_counter() - start, str(error)))
            continue
        out.append(Candidate("pipeline", partitioner, float(plan.iteration_time), bool(plan.result.feasible),
                             float(plan.result.peak_memory.max()), time.perf_counter() - start, plan,
                             _pipeline_shape(plan), info={"stopped_at_limit": plan.info.get("stopped_at_limit")}))
    return sorted(out, key=lambda c: partitioners.index(c.planner))


def fastest_pipeline(graph: OpGraph, cluster: Cluster, *, partitioners: tuple[str, ...] = PIPELINE_PARTITIONERS,
                     **options: Any):
    """The fastest feasible :func:`tag.exact.plan_pipeline` plan over ``partitioners`` (``options`` go to
    each run); ``info["partitioners"]`` says what each found. Raises the last PartitionError when none
    finds a plan."""
    best, found, error = None, {}, None
    for partitioner in partitioners:
        try:
            plan = plan_pipeline(graph, cluster, partitioner=partitioner, **options)
        except PartitionError as failure:
            found[partitioner], error = str(failure), failure
            continue
        found[partitioner] = plan.iteration_time
        if best is None or (not plan.result.feasible, plan.iteration_time) < \
                (not best.result.feasible, best.iteration_time):
            best = plan
    if best is None:
        raise error
    best.info["partitioners"] = found
    return best


def graph_pipeline_candidates(graph: OpGraph, cluster: Cluster, *, cost: CostModel | None = None,
                              sequential_plans: Sequence[Any] = (),
                              time_limit_s: float | None = None) -> list[Candidate]:
    """GraphPipe's plan when the model branches (a skipped row otherwise). ``sequential_plans`` (the
    pipeline family's) are its candidates too, so the graph pipeline family is never slower than the
    sequential one; it runs the sequential partitioners itself only as chains (GraphPipe's SPP)."""
    start = time.perf_counter()
    if not branches(graph, cluster):
        return [_failed("graph-pipeline", "graphpipe", 0.0, "the model is a chain: its graph pipelines are the "
                                                           "sequential ones")]
    try:
        plan = plan_graph_pipeline(graph, cluster, cost=cost, sequential_plans=sequential_plans,
                                   sequential_links=("chain",), time_limit_s=time_limit_s)
    except PartitionError as error:
        return [_failed("graph-pipeline", "graphpipe", time.perf_counter() - start, str(error))]
    return [Candidate("graph-pipeline", "graphpipe", float(plan.iteration_time), bool(plan.result.feasible),
                      float(plan.result.peak_memory.max()), time.perf_counter() - start, plan,
                      _pipeline_shape(plan), info={"chosen": plan.info.get("chosen"),
                                                   "stopped_at_limit": plan.info.get("stopped_at_limit")})]


def _pipeline_shape(plan) -> str:
    counts = plan.stage_graph.replicas.tolist()
    replicas = str(counts[0]) if len(set(counts)) == 1 else "/".join(map(str, counts))
    return f"{plan.num_stages}x{replicas} M={plan.stage_graph.micro_batches}"  # stages x replicas
