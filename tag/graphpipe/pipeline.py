"""Graph-pipeline plans: a DAG of stages compiled to the shared TaskGraph, simulated, planned end to end.

**Compilation** (:func:`compile_graph_pipeline`) is :func:`tag.exact.compile_pipeline` (same task names,
labels and memory rules; the stage graph is a DAG, so a stage may send to and receive from several
stages) with each stage running its own order from the static scheduler
(:mod:`tag.graphpipe.scheduler`) instead of the chain's 1F1B. Per replica and micro-batch: ``sFm`` and
``sBm`` chained in the stage's order; for every stage edge a → b a p2p transfer of the activation
after ``aFm`` that ``bFm`` waits for and of its gradient after ``bBm`` that ``aBm`` waits for (replica
pairs exchange the overlap of their batch slices); during the last backward pass a ring all-reduce of
each gradient bucket over the stage's replicas, then its optimizer step (:mod:`tag.exact.buckets`).
Memory: parameters × 4 per device, the activations of a micro-batch from ``sFm`` to the end of
``sBm``, received activations and gradients until ``sBm`` ends.

**Planning** (:func:`plan_graph_pipeline`): for every micro-batch count M (powers of two, at most the
batch) and every tail share of :data:`TAIL_SHARES`, the partitioner's Pareto front of (bottleneck T,
depth) (:func:`tag.graphpipe.depth_frontier`), each point rebuilt into its plan. The partitioner
amortises a stage's all-reduce and optimizer step over the M micro-batches, but the simulator (like a
real iteration) runs them once, during and after the stage's last backward pass — and the entry stages
of a graph pipeline finish their backward passes last — so a plan the DP ranks first can simulate worse;
the tail shares add plans that keep those steps short, and plans are ranked by
:func:`_iteration_estimate`, which puts each step after its stage's last backward pass. Every plan within
``slack`` of the best estimate is compiled and simulated, and the fastest feasible one is kept — the
same "score candidates by simulation" rule as :func:`tag.exact.plan_pipeline`. A chain of stages is a
series-parallel graph, so the sequential pipelines of :data:`SEQUENTIAL` (PipeDream-style and Parmesan
DPs, through :func:`tag.exact.plan_pipeline`) are graph pipelines too: they are simulated in the same
pass, with this module's orders, so the plan returned is never slower in simulation than they are
(``info["chosen"]`` says which partitioner's plan won). Each runs twice: as the sequential pipeline it
is (stage edges s → s + 1, ``links="chain"``, the runtime GraphPipe compares against), and as the graph
pipeline of its stages (their data edges; chosen ``"<partitioner>-graph"``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from tag.cluster.cluster import Cluster
from tag.cost.comm import allreduce_time
from tag.cost.compute import CostModel
from tag.exact.pipeline import PipelinePlan, compile_pipeline, plan_pipeline, reference_bandwidth, stored_stage_graph
from tag.exact.schedules import Action
from tag.exact.stage_graph import ADAM_MEMORY_COPIES, ForwardGraph, PartitionError, StageGraph, build_stage_graph
from tag.graph.opgraph import OpGraph
from tag.graphpipe.partition import DEFAULT_MAX_CHAIN, GraphPartition, block_graph, depth_frontier, \
    partition_graphpipe
from tag.graphpipe.scheduler import graph_stage_orders, stage_depths, stage_inflight
from tag.sim import SimulationResult, TaskGraph, simulate_fast

__all__ = ["compile_graph_pipeline", "simulate_graph_pipeline", "GraphPipelinePlan", "plan_graph_pipeline",
           "replay_graph_pipeline",
           "graph_stage_graph", "DEFAULT_SLACK", "TAIL_SHARES", "SEQUENTIAL"]

log = logging.getLogger(__name__)

# plans simulated: those whose estimated iteration (_iteration_estimate) is within this fraction of the best
# estimate over every M
DEFAULT_SLACK = 0.25
# shares of the steady state M·T a stage's all-reduce and optimizer step may take (partition_graphpipe's
# tail_share): 1 is the amortised cost alone; lower shares add plans that split optimizer-heavy stages
TAIL_SHARES = (1.0, 0.5, 0.25)
# sequential partitioners of tag.exact whose plans are candidates too: their chains are graph pipelines
SEQUENTIAL = ("pipedream", "parmesan")


def compile_graph_pipeline(stage_graph: StageGraph, cluster: Cluster, mapping: Sequence[Sequence[int]],
                           orders: Sequence[Sequence[Action]] | None = None) -> TaskGraph:
    """The TaskGraph of one iteration (module docstring): :func:`tag.exact.compile_pipeline` with each
    stage's own order, by default the static scheduler's over the stage DAG of ``stage_graph``."""
    sg = stage_graph
    if orders is None:
        inflight = stage_inflight(sg.num_stages, sg.edge_src, sg.edge_dst, micro_batches=sg.micro_batches)
        orders = graph_stage_orders(inflight, sg.micro_batches)
    return compile_pipeline(sg, cluster, mapping, orders=orders)


def simulate_graph_pipeline(stage_graph: StageGraph, cluster: Cluster, mapping: Sequence[Sequence[int]],
                            orders: Sequence[Sequence[Action]] | None = None, *,
                            feedback: bool = False) -> tuple[TaskGraph, SimulationResult]:
    taskgraph = compile_graph_pipeline(stage_graph, cluster, mapping, orders)
    return taskgraph, simulate_fast(taskgraph, feedback=feedback)


def graph_stage_graph(fg: ForwardGraph, partition: GraphPartition, *, reference_type: int = 0) -> StageGraph:
    """The StageGraph of a graph partition (its data edges, or a chain where ``partition.info["links"]``
    says so), its ``memory_bytes`` from the stage DAG's in-flight counts."""
    sg = build_stage_graph(fg, partition.forward_stage, replicas=partition.replicas,
                           micro_batches=partition.micro_batches, reference_type=reference_type,
                           links=partition.info.get("links", "data"), info=dict(partition.info))
    inflight = stage_inflight(sg.num_stages, sg.edge_src, sg.edge_dst, micro_batches=sg.micro_batches)
    sg.memory_bytes = ADAM_MEMORY_COPIES * sg.param_bytes + inflight * (sg.activation_bytes + sg.input_bytes)
    return sg


def replay_graph_pipeline(graph: OpGraph, cluster: Cluster, *, forward_assignment: Sequence[int] | np.ndarray,
                          replicas: Sequence[int], micro_batches: int, mapping: Sequence[Sequence[int]],
                          reference_gpu: str | None = None, links: str = "data",
                          cost: CostModel | None = None) -> PipelinePlan:
    """Rebuild and simulate a stored graph pipeline plan (a plan file of partitioner ``"graphpipe"``):
    its stage graph, the static scheduler's orders over its stage DAG, and the simulated iteration."""
    sg = stored_stage_graph(graph, cluster, forward_assignment=forward_assignment, replicas=replicas,
                            micro_batches=micro_batches, reference_gpu=reference_gpu, links=links, cost=cost)
    inflight = stage_inflight(sg.num_stages, sg.edge_src, sg.edge_dst, micro_batches=sg.micro_batches)
    sg.memory_bytes = ADAM_MEMORY_COPIES * sg.param_bytes + inflight * (sg.activation_bytes + sg.input_bytes)
    rows = [list(row) for row in mapping]
    taskgraph, result = simulate_graph_pipeline(sg, cluster, rows, graph_stage_orders(inflight, sg.micro_batches))
    return PipelinePlan(sg, rows, "1f1b", "graphpipe", taskgraph, result)


@dataclass(eq=False)
class GraphPipelinePlan:
    """A graph-pipeline plan and its simulated iteration."""

    stage_graph: StageGraph
    mapping: list[list[int]]  # [S][R_s] device ids
    orders: list[list[Action]]  # [S] each stage's order
    inflight: np.ndarray  # [S] micro-batches in flight at the peak
    partition: GraphPartition
    taskgraph: TaskGraph
    result: SimulationResult
    solve_time_s: float = 0.0  # the whole search: partitioning, scheduling, simulation
    info: dict[str, Any] = field(default_factory=dict)

    partitioner = "graphpipe"  # what plan files name it (replay_graph_pipeline)
    schedule = "1f1b"  # the static scheduler's orders are 1F1B-like per stage

    @property
    def iteration_time(self) -> float:
        return self.result.iteration_time

    @property
    def num_stages(self) -> int:
        return self.stage_graph.num_stages

    @property
    def depth(self) -> int:
        """Stages on the longest path of the stage DAG (GraphPipe's pipeline depth)."""
        sg = self.stage_graph
        return int(stage_depths(sg.num_stages, sg.edge_src, sg.edge_dst).max())

    @property
    def throughput(self) -> float:
        """Samples per second of the simulated iteration."""
        return self.stage_graph.info.get("batch_size", 0) / self.iteration_time if self.iteration_time else 0.0

    def as_dict(self) -> dict[str, Any]:
        sg = self.stage_graph
        return {
            "kind": "graph_pipeline",
            "partitioner": "graphpipe",
            "schedule": "1f1b",
            "stages": sg.num_stages,
            "replicas": sg.replicas.tolist(),
            "micro_batches": sg.micro_batches,
            "mapping": self.mapping,
            "stage_edges": [[int(a), int(b)] for a, b in zip(sg.edge_src, sg.edge_dst)],
            "inflight": self.inflight.tolist(),
            "depth": self.depth,
            "stage_time_s": sg.stage_time.tolist(),
            "max_stage_time_s": float(sg.stage_time.max()),
            "iteration_time_s": self.result.iteration_time,
            "throughput_samples_s": self.throughput,
            "peak_memory_bytes": float(self.result.peak_memory.max()),
            "feasible": bool(self.result.feasible),
            "lower_bound_s": None,
            "proven_optimal": False,
            "solve_time_s": float(self.solve_time_s),
            "stage_ops": np.bincount(sg.forward_assignment, minlength=sg.num_stages).tolist(),
            "edge_bytes": sg.edge_bytes.tolist(),
            **{k: v for k, v in self.info.items() if isinstance(v, (int, float, str, bool)) or v is None},
        }

    def __repr__(self) -> str:
        return (f"GraphPipelinePlan(S={self.num_stages}, depth={self.depth}, R={self.stage_graph.replicas.tolist()}, "
                f"M={self.stage_graph.micro_batches}, {self.iteration_time * 1e3:.4g} ms)")


def _micro_batch_counts(batch: int, num_devices: int, given: int | None) -> list[int]:
    if given is not None:
        return [given]
    out, m = [], 1
    while m <= min(batch, 4 * num_devices):
        out.append(m)
        m *= 2
    return out


def _backward_share(fg: ForwardGraph, reference_type: int) -> float:
    """Share of a micro-batch's passes that is backward, at the full batch on the reference type."""
    t = reference_type
    backward = float((fg.bwd_fixed[:, t] + fg.bwd_scaled[:, t]).sum())
    total = backward + float((fg.fwd_fixed[:, t] + fg.fwd_scaled[:, t]).sum())
    return backward / total if total > 0 else 0.5


def _iteration_estimate(partition: GraphPartition, backward_share: float) -> float:
    """Seconds per iteration of a partition under 1F1B, closer than (M + depth - 1)·T: the passes fill
    (M + depth - 1) slots of the slowest stage's per-micro-batch time P, and a stage's all-reduce and
    optimizer step start only after its last backward pass, which ends (depth - in-flight) backward
    hops before the entry stages' — so the step of a stage near the exit hides behind the backward
    passes still draining upstream, and the step of an entry stage adds in full."""
    m = partition.micro_batches
    passes = partition.stage_time - partition.once_time / m  # [S]
    slowest = float(passes.max())
    depth = int(partition.inflight.max())
    drain = (depth - partition.inflight) * backward_share * slowest  # [S]
    return (m + depth - 1) * slowest + float(np.max(partition.once_time - drain))


def _sequential_candidates(graph: OpGraph, fg: ForwardGraph, cluster: Cluster, devices: list[int], partitioner: str, *,
                           micro_batches: int | None, bandwidth: float, cost: CostModel | None,
                           max_replicas: int | None) -> list[tuple[GraphPartition, list[list[int]]]]:
    """The sequential pipeline of :func:`tag.exact.plan_pipeline` with ``partitioner`` (its (S, R, M)
    search, run on a chain of stages: ``links="chain"``) as graph partitions with its mapping, twice:
    as the chain itself (edges s → s + 1, 1F1B in-flight counts: the sequential pipeline as such, so
    its re-simulation here matches :func:`tag.exact.simulate_pipeline`'s), and as the graph pipeline of
    the same stages (their data edges, the stage DAG's in-flight counts); none when it finds nothing or
    its replicas exceed ``max_replicas``."""
    try:
        plan = plan_pipeline(graph, cluster, partitioner=partitioner, auto=True, devices=devices,
                             micro_batches=micro_batches, bandwidth=bandwidth, cost=cost, links="chain")
    except PartitionError as error:
        log.info("no %s candidate: %s", partitioner, error)
        return []
    sg = plan.stage_graph
    if max_replicas is not None and int(sg.replicas.max()) > max_replicas:
        return []
    t = sg.reference_type
    once = sg.optimizer_time[:, t] + np.array([allreduce_time(cluster, row, float(sg.param_bytes[s]))
                                               if len(row) > 1 else 0.0 for s, row in enumerate(plan.mapping)])
    data = build_stage_graph(fg, sg.forward_assignment, replicas=sg.replicas, micro_batches=sg.micro_batches,
                             reference_type=t)
    out = []
    for links, edges in (("chain", sg), ("data", data)):
        inflight = stage_inflight(sg.num_stages, edges.edge_src, edges.edge_dst, micro_batches=sg.micro_batches)
        out.append((GraphPartition(sg.forward_assignment.copy(), sg.replicas.copy(), edges.edge_src.copy(),
                                   edges.edge_dst.copy(), inflight, sg.stage_time + once / sg.micro_batches, once,
                                   sg.micro_batches, float(sg.stage_time.max()), list(range(sg.num_stages)),
                                   {"method": partitioner if links == "chain" else f"{partitioner}-graph",
                                    "links": links}), plan.mapping))
    return out


def _mapping(partition: GraphPartition, devices: list[int]) -> list[list[int]]:
    """Devices handed out stage by stage in the DP's order (a branch's stages get neighbouring ids)."""
    rows: list[list[int]] = [[] for _ in range(partition.num_stages)]
    k = 0
    for s in partition.device_order:
        count = int(partition.replicas[s])
        rows[s] = devices[k:k + count]
        k += count
    return rows


def plan_graph_pipeline(graph: OpGraph, cluster: Cluster, *, num_devices: int | None = None,
                        devices: Sequence[int] | None = None, micro_batches: int | None = None,
                        slack: float = DEFAULT_SLACK, max_replicas: int | None = None,
                        fallback: str = "linearise", max_chain: int = DEFAULT_MAX_CHAIN,
                        bandwidth: float | None = None, cost: CostModel | None = None,
                        sequential: Sequence[str] = SEQUENTIAL) -> GraphPipelinePlan:
    """Plan a graph pipeline of ``graph`` on ``cluster`` (module docstring).

    ``num_devices`` takes the first devices (default all), ``devices`` names them; ``micro_batches``
    fixes M (default: powers of two up to min(batch, 4·D)); ``slack`` how far above the best estimated
    iteration a frontier point may be and still be simulated; ``max_replicas`` caps a stage's
    data-parallel degree; ``fallback`` / ``max_chain`` go to the SP decomposition and its coarsening;
    ``bandwidth`` overrides the median link bandwidth boundary tensors are priced at; ``sequential``
    names the sequential partitioners whose plans are candidates too (module docstring; () for none).
    """
    if devices is None:
        count = cluster.num_devices if num_devices is None else num_devices
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or not 1 <= count <= cluster.num_devices:
            raise PartitionError(f"num_devices must be in 1..{cluster.num_devices}, got {num_devices!r}")
        device_list = list(range(int(count)))
    else:
        device_list = [int(d) for d in devices]
        if not device_list or len(set(device_list)) != len(device_list) or \
                any(not 0 <= d < cluster.num_devices for d in device_list):
            raise PartitionError(f"devices must be distinct ids in 0..{cluster.num_devices - 1}, got {devices!r}")
    if micro_batches is not None and (isinstance(micro_batches, bool) or micro_batches < 1
                                      or micro_batches > graph.batch_size):
        raise PartitionError(f"micro_batches must be in 1..{graph.batch_size}, got {micro_batches!r}")
    if not slack >= 0:
        raise PartitionError(f"slack must be a non-negative number, got {slack!r}")
    start = time.perf_counter()
    fg = ForwardGraph.from_graph(graph, cluster.types, cost=cost)
    counts = np.bincount(cluster.device_type[np.asarray(device_list)], minlength=len(cluster.types))
    reference_type = fg.gpu_types.index(cluster.types[int(np.argmax(counts))])
    capacity = float(cluster.memory_bytes()[device_list].min())
    price = bandwidth if bandwidth is not None else reference_bandwidth(cluster, device_list)
    bg = block_graph(fg, reference_type=reference_type, fallback=fallback, max_chain=max_chain)
    options = dict(num_devices=len(device_list), capacity=capacity, bandwidth=price, max_replicas=max_replicas)
    backward_share = _backward_share(fg, reference_type)
    candidates: dict[tuple, tuple[float, GraphPartition]] = {}  # plan key -> (estimated iteration s, partition)
    failures: list[str] = []
    points = 0
    for m in _micro_batch_counts(graph.batch_size, len(device_list), micro_batches):
        for share in TAIL_SHARES:
            front = depth_frontier(bg, micro_batches=m, tail_share=share, **options)
            if not front and share == TAIL_SHARES[0]:
                failures.append(f"M={m}: nothing fits device memory ({capacity / 2**30:.3g} GiB)")
            points += len(front)
            for _, depth in front:
                part = partition_graphpipe(bg, micro_batches=m, max_depth=depth, tail_share=share, **options)
                key = (m, part.forward_stage.tobytes(), part.replicas.tobytes())
                candidates.setdefault(key, (_iteration_estimate(part, backward_share), part))
    if not candidates:
        reason = f"; first failure: {failures[0]}" if failures else ""
        raise PartitionError(f"no graph pipeline fits {len(device_list)} devices{reason}")
    cutoff = (1.0 + slack) * min(estimate for estimate, _ in candidates.values())
    shortlist = [(estimate, part, _mapping(part, device_list),
                  stage_inflight(part.num_stages, part.edge_src, part.edge_dst, micro_batches=part.micro_batches))
                 for estimate, part in sorted(candidates.values(), key=lambda c: c[0]) if estimate <= cutoff]
    for partitioner in sequential:
        for part, mapping in _sequential_candidates(graph, fg, cluster, device_list, partitioner, cost=cost,
                                                    micro_batches=micro_batches, bandwidth=price,
                                                    max_replicas=max_replicas):
            shortlist.append((_iteration_estimate(part, backward_share), part, mapping, part.inflight))
    best: GraphPipelinePlan | None = None
    search: list[dict[str, Any]] = []
    for estimate, part, mapping, inflight in shortlist:
        m = part.micro_batches
        sg = graph_stage_graph(fg, part, reference_type=reference_type)
        sg.info["batch_size"] = graph.batch_size
        orders = graph_stage_orders(inflight, m)
        taskgraph, result = simulate_graph_pipeline(sg, cluster, mapping, orders)
        search.append({"method": part.info["method"], "micro_batches": m, "depth": int(inflight.max()),
                       "stages": sg.num_stages, "target_s": part.target, "tail_share": part.info.get("tail_share"),
                       "estimate_s": estimate, "iteration_time_s": result.iteration_time,
                       "feasible": bool(result.feasible)})
        plan = GraphPipelinePlan(sg, mapping, orders, inflight, part, taskgraph, result)
        if best is None or (not result.feasible, result.iteration_time) < \
                (not best.result.feasible, best.result.iteration_time):
            best = plan
    best.solve_time_s = time.perf_counter() - start
    best.info.update({"planning_time_s": best.solve_time_s, "configurations_simulated": len(search),
                      "frontier_points": points, "blocks": bg.num_blocks,
                      "sp_fallbacks": len(bg.sp_tree.fallbacks), "target_s": best.partition.target,
                      "chosen": best.partition.info["method"]})
    best.info["search"] = search
    return best
