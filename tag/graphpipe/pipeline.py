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
same "score candidates by simulation" rule as :func:`tag.exact.plan_pipeline`.

**Sequential plans are candidates.** A chain of stages is a series-parallel graph, so the sequential
pipelines are graph pipelines too. The partitioners of :data:`SEQUENTIAL` (PipeDream-style, Parmesan,
RaNNC) each run through :func:`tag.exact.plan_pipeline` with every stage-edge kind of
:data:`SEQUENTIAL_LINKS` (``"chain"``: s → s + 1, the runtime GraphPipe compares against; ``"data"``: direct
edges, the pipeline family's), and plans made elsewhere (``sequential_plans``: ``tag plan`` passes its
pipeline family's, mapped by the exact mapper) join them. Each is a candidate twice: as it is (its own
schedule, stage edges, mapping and simulated iteration, so the plan returned is never slower than any
of them; its plan keeps the sequential partitioner's name, so a plan file replays it with its own
schedule) and as the graph pipeline of its stages (their data edges under this module's orders).
``info["chosen"]`` says which won: ``"graphpipe"``, ``"<partitioner>:<links>"`` or
``"<partitioner>:<links>-graph"``. With ``time_limit_s`` every step stops at the limit (the frontier's
bisection included) and the best plan found is returned.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Sequence

import numpy as np

from tag.cluster.cluster import Cluster
from tag.cost.comm import allreduce_time
from tag.cost.compute import CostModel
from tag.exact.pipeline import PipelinePlan, compile_pipeline, plan_pipeline, reference_bandwidth, stored_stage_graph
from tag.exact.schedules import Action, stage_orders
from tag.exact.stage_graph import ADAM_MEMORY_COPIES, ForwardGraph, PartitionError, StageGraph, build_stage_graph
from tag.graph.opgraph import OpGraph
from tag.graphpipe.partition import (
    DEFAULT_MAX_CHAIN,
    BlockGraph,
    GraphPartition,
    block_graph,
    depth_frontier,
    partition_graphpipe,
)
from tag.graphpipe.scheduler import graph_stage_orders, stage_depths, stage_inflight
from tag.sim import SimulationResult, TaskGraph, simulate_fast

__all__ = ["compile_graph_pipeline", "simulate_graph_pipeline", "GraphPipelinePlan", "plan_graph_pipeline",
           "replay_graph_pipeline",
           "graph_stage_graph", "DEFAULT_SLACK", "TAIL_SHARES", "SEQUENTIAL", "SEQUENTIAL_LINKS"]

log = logging.getLogger(__name__)

# plans simulated: those whose estimated iteration (_iteration_estimate) is within this fraction of the best
# estimate over every M
DEFAULT_SLACK = 0.25
# shares of the steady state M·T a stage's all-reduce and optimizer step may take (partition_graphpipe's
# tail_share): 1 is the amortised cost alone; lower shares add plans that split optimizer-heavy stages
TAIL_SHARES = (1.0, 0.5, 0.25)
# sequential partitioners of tag.exact whose plans are candidates too (a chain of stages is a graph
# pipeline), and the stage edges each runs with (tag.exact.stage_graph, Links)
SEQUENTIAL = ("pipedream", "parmesan", "rannc")
SEQUENTIAL_LINKS = ("chain", "data")


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
    # what plan files name it: "graphpipe" (replay_graph_pipeline: the static scheduler's orders, 1F1B-like
    # per stage), or the sequential partitioner whose plan won as it is (replay_pipeline with ``schedule``)
    partitioner: str = "graphpipe"
    schedule: str = "1f1b"

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
            "partitioner": self.partitioner,
            "schedule": self.schedule,
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


class _Entry(NamedTuple):
    """One plan of the shortlist: a partition and its mapping, and for a sequential plan kept as it is
    (its own schedule and stage edges), that plan, already simulated."""

    estimate: float  # _iteration_estimate, seconds
    partition: GraphPartition
    mapping: list[list[int]]
    inflight: np.ndarray  # [S]
    method: str  # "graphpipe", "<partitioner>:<links>" or "<partitioner>:<links>-graph"
    sequential: PipelinePlan | None = None


def _sequential_plans(graph: OpGraph, cluster: Cluster, devices: list[int], partitioners: Sequence[str],
                      links: Sequence[str], *, micro_batches: int | None, bandwidth: float, cost: CostModel | None,
                      deadline: float) -> list[PipelinePlan]:
    """:func:`tag.exact.plan_pipeline`'s (S, R, M) search with each partitioner and each kind of stage
    edges (``"chain"``: the sequential pipeline GraphPipe compares against; ``"data"``: the pipeline
    family's), on the consecutive placement; what it finds before ``deadline``."""
    plans = []
    for partitioner in partitioners:
        for kind in links:
            left = deadline - time.perf_counter()
            if left <= 0:
                return plans
            try:
                plans.append(plan_pipeline(graph, cluster, partitioner=partitioner, auto=True, devices=devices,
                                           micro_batches=micro_batches, bandwidth=bandwidth, cost=cost,
                                           links=kind, time_limit_s=None if left == np.inf else left))
            except PartitionError as error:
                log.info("no %s candidate with %s links: %s", partitioner, kind, error)
    return plans


def _sequential_entries(plan: PipelinePlan, fg: ForwardGraph, cluster: Cluster, backward_share: float,
                        max_replicas: int | None, micro_batches: int | None) -> list[_Entry]:
    """A sequential pipeline plan as shortlist entries, twice: as it is (its schedule, its stage edges and
    mapping, its simulated iteration: so the graph planner is never slower than the plans it is given),
    and as the graph pipeline of its stages (their data edges, the static scheduler's orders over the
    stage DAG's in-flight counts); none when its replicas exceed ``max_replicas`` or its M is not
    ``micro_batches`` (when given; RaNNC takes it as a cap)."""
    sg = plan.stage_graph
    if (max_replicas is not None and int(sg.replicas.max()) > max_replicas) or \
            (micro_batches is not None and sg.micro_batches != micro_batches):
        return []
    t = sg.reference_type
    once = sg.optimizer_time[:, t] + np.array([allreduce_time(cluster, row, float(sg.param_bytes[s]))
                                               if len(row) > 1 else 0.0 for s, row in enumerate(plan.mapping)])
    data = build_stage_graph(fg, sg.forward_assignment, replicas=sg.replicas, micro_batches=sg.micro_batches,
                             reference_type=t)
    links = sg.info.get("links", "data")
    label = f"{plan.partitioner}:{links}"
    out = []
    for edges, method in ((sg, label), (data, f"{label}-graph")):
        inflight = stage_inflight(sg.num_stages, edges.edge_src, edges.edge_dst, micro_batches=sg.micro_batches)
        if edges is sg:  # the sequential schedule's own in-flight counts
            inflight = np.minimum(sg.num_stages - np.arange(sg.num_stages), sg.micro_batches)
        part = GraphPartition(sg.forward_assignment.copy(), sg.replicas.copy(), edges.edge_src.copy(),
                              edges.edge_dst.copy(), inflight, sg.stage_time + once / sg.micro_batches, once,
                              sg.micro_batches, float(sg.stage_time.max()), list(range(sg.num_stages)),
                              {"method": method, "links": links if edges is sg else "data"})
        out.append(_Entry(_iteration_estimate(part, backward_share), part, [list(row) for row in plan.mapping],
                          inflight, method, plan if edges is sg else None))
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


def _device_list(cluster: Cluster, num_devices: int | None, devices: Sequence[int] | None) -> list[int]:
    if devices is None:
        count = cluster.num_devices if num_devices is None else num_devices
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or not 1 <= count <= cluster.num_devices:
            raise PartitionError(f"num_devices must be in 1..{cluster.num_devices}, got {num_devices!r}")
        return list(range(int(count)))
    device_list = [int(d) for d in devices]
    if not device_list or len(set(device_list)) != len(device_list) or \
            any(not 0 <= d < cluster.num_devices for d in device_list):
        raise PartitionError(f"devices must be distinct ids in 0..{cluster.num_devices - 1}, got {devices!r}")
    return device_list


def _frontier_entries(bg: BlockGraph, batch: int, device_list: list[int], micro_batches: int | None, *,
                      slack: float, backward_share: float, deadline: float,
                      **options: Any) -> tuple[list[_Entry], list[str], int]:
    """(the shortlist of GraphPipe's own plans, why some M found nothing, frontier points): every point
    of the depth frontier for each M and tail share, rebuilt into its partition, those within ``slack``
    of the best estimate kept, best first; the M reached before ``deadline``."""
    candidates: dict[tuple, tuple[float, GraphPartition]] = {}  # plan key -> (estimated iteration s, partition)
    failures: list[str] = []
    points = 0
    for m in _micro_batch_counts(batch, len(device_list), micro_batches):
        for share in TAIL_SHARES:
            if time.perf_counter() >= deadline:
                break
            front = depth_frontier(bg, micro_batches=m, tail_share=share, deadline=deadline, **options)
            if not front and share == TAIL_SHARES[0]:
                failures.append(f"M={m}: nothing fits device memory ({options['capacity'] / 2**30:.3g} GiB)")
            points += len(front)
            for k, (_, depth) in enumerate(front):
                if k and time.perf_counter() >= deadline:  # the least bottleneck's plan at least
                    break
                part = partition_graphpipe(bg, micro_batches=m, max_depth=depth, tail_share=share, **options)
                key = (m, part.forward_stage.tobytes(), part.replicas.tobytes())
                candidates.setdefault(key, (_iteration_estimate(part, backward_share), part))
    if not candidates:
        return [], failures, points
    cutoff = (1.0 + slack) * min(estimate for estimate, _ in candidates.values())
    entries = [_Entry(estimate, part, _mapping(part, device_list),
                      stage_inflight(part.num_stages, part.edge_src, part.edge_dst, micro_batches=part.micro_batches),
                      "graphpipe")
               for estimate, part in sorted(candidates.values(), key=lambda c: c[0]) if estimate <= cutoff]
    return entries, failures, points


def _simulate(entry: _Entry, fg: ForwardGraph, cluster: Cluster, batch: int, reference_type: int) -> GraphPipelinePlan:
    """The plan of a shortlist entry: a sequential plan as it is, or the partition's stage DAG simulated
    with the static scheduler's orders."""
    part, seq = entry.partition, entry.sequential
    if seq is not None:
        sg = dataclasses.replace(seq.stage_graph, info={**seq.stage_graph.info, "batch_size": batch})
        orders = stage_orders(sg.num_stages, sg.micro_batches, seq.schedule)
        return GraphPipelinePlan(sg, entry.mapping, orders, entry.inflight, part, seq.taskgraph, seq.result,
                                 partitioner=seq.partitioner, schedule=seq.schedule)
    sg = graph_stage_graph(fg, part, reference_type=reference_type)
    sg.info["batch_size"] = batch
    orders = graph_stage_orders(entry.inflight, part.micro_batches)
    taskgraph, result = simulate_graph_pipeline(sg, cluster, entry.mapping, orders)
    return GraphPipelinePlan(sg, entry.mapping, orders, entry.inflight, part, taskgraph, result)


def plan_graph_pipeline(graph: OpGraph, cluster: Cluster, *, num_devices: int | None = None,
                        devices: Sequence[int] | None = None, micro_batches: int | None = None,
                        slack: float = DEFAULT_SLACK, max_replicas: int | None = None,
                        fallback: str = "linearise", max_chain: int = DEFAULT_MAX_CHAIN,
                        bandwidth: float | None = None, cost: CostModel | None = None,
                        sequential: Sequence[str] = SEQUENTIAL, sequential_links: Sequence[str] = SEQUENTIAL_LINKS,
                        sequential_plans: Sequence[PipelinePlan] = (),
                        time_limit_s: float | None = None) -> GraphPipelinePlan:
    """Plan a graph pipeline of ``graph`` on ``cluster`` (module docstring).

    ``num_devices`` takes the first devices (default all), ``devices`` names them; ``micro_batches``
    fixes M (default: powers of two up to min(batch, 4·D)); ``slack`` how far above the best estimated
    iteration a frontier point may be and still be simulated; ``max_replicas`` caps a stage's
    data-parallel degree; ``fallback`` / ``max_chain`` go to the SP decomposition and its coarsening;
    ``bandwidth`` overrides the median link bandwidth boundary tensors are priced at; ``sequential``
    names the sequential partitioners whose plans are candidates too, run with each stage-edge kind of
    ``sequential_links`` (module docstring; () for none); ``sequential_plans`` are sequential plans made
    elsewhere (on the same devices), candidates as they are and as graphs. ``time_limit_s`` stops the
    search there (each step checks it between frontier points, partitioners and simulations) and
    returns the best plan found; a PartitionError when none was.
    """
    device_list = _device_list(cluster, num_devices, devices)
    if micro_batches is not None and (isinstance(micro_batches, bool) or micro_batches < 1
                                      or micro_batches > graph.batch_size):
        raise PartitionError(f"micro_batches must be in 1..{graph.batch_size}, got {micro_batches!r}")
    if not slack >= 0:
        raise PartitionError(f"slack must be a non-negative number, got {slack!r}")
    if time_limit_s is not None and not time_limit_s > 0:
        raise PartitionError(f"time_limit_s must be positive, got {time_limit_s!r}")
    start = time.perf_counter()
    deadline = np.inf if time_limit_s is None else start + time_limit_s
    fg = ForwardGraph.from_graph(graph, cluster.types, cost=cost)
    counts = np.bincount(cluster.device_type[np.asarray(device_list)], minlength=len(cluster.types))
    reference_type = fg.gpu_types.index(cluster.types[int(np.argmax(counts))])
    capacity = float(cluster.memory_bytes()[device_list].min())
    price = bandwidth if bandwidth is not None else reference_bandwidth(cluster, device_list)
    bg = block_graph(fg, reference_type=reference_type, fallback=fallback, max_chain=max_chain)
    backward_share = _backward_share(fg, reference_type)
    shortlist: list[_Entry] = []
    for plan in sequential_plans:  # already simulated: cheap, and they make the floor
        shortlist += _sequential_entries(plan, fg, cluster, backward_share, max_replicas, micro_batches)
    entries, failures, points = _frontier_entries(
        bg, graph.batch_size, device_list, micro_batches, slack=slack, backward_share=backward_share,
        deadline=deadline, num_devices=len(device_list), capacity=capacity, bandwidth=price,
        max_replicas=max_replicas)
    for plan in _sequential_plans(graph, cluster, device_list, sequential, sequential_links,
                                  micro_batches=micro_batches, bandwidth=price, cost=cost, deadline=deadline):
        shortlist += _sequential_entries(plan, fg, cluster, backward_share, max_replicas, micro_batches)
    shortlist = [e for e in shortlist if e.sequential is not None] + entries + \
                [e for e in shortlist if e.sequential is None]
    if not shortlist:
        reason = f"; first failure: {failures[0]}" if failures else \
            (f"; stopped at the time limit of {time_limit_s:g} s" if time_limit_s is not None else "")
        raise PartitionError(f"no graph pipeline fits {len(device_list)} devices{reason}")
    best: GraphPipelinePlan | None = None
    search: list[dict[str, Any]] = []
    seen: set[tuple] = set()
    for entry in shortlist:
        part = entry.partition
        # a plan kept as it is costs no simulation; two graphs of the same stages and mapping are one plan
        key = (part.micro_batches, part.forward_stage.tobytes(), part.replicas.tobytes(), part.edge_src.tobytes(),
               part.edge_dst.tobytes(), str(entry.mapping))
        if entry.sequential is None and (key in seen or (best is not None and time.perf_counter() >= deadline)):
            continue
        seen.add(key)
        plan = _simulate(entry, fg, cluster, graph.batch_size, reference_type)
        result = plan.result
        search.append({"method": entry.method, "micro_batches": part.micro_batches, "depth": int(entry.inflight.max()),
                       "stages": part.num_stages, "target_s": part.target, "tail_share": part.info.get("tail_share"),
                       "estimate_s": entry.estimate, "iteration_time_s": result.iteration_time,
                       "feasible": bool(result.feasible)})
        if best is None or (not result.feasible, result.iteration_time) < \
                (not best.result.feasible, best.result.iteration_time):
            best = plan
    best.solve_time_s = time.perf_counter() - start
    best.info.update({"planning_time_s": best.solve_time_s, "configurations_simulated": len(search),
                      "frontier_points": points, "blocks": bg.num_blocks,
                      "sp_fallbacks": len(bg.sp_tree.fallbacks), "target_s": best.partition.target,
                      "chosen": best.partition.info["method"], "stopped_at_limit": time.perf_counter() >= deadline})
    best.info["search"] = search
    return best
