"""Pipeline plans: partition, map and simulate end to end (compilation: :mod:`tag.exact.pipeline_compile`).

**Planning** (:func:`plan_pipeline`). A partitioner (Parmesan: clustering + DP over downsets +
refinement; PipeDream-style contiguous DP; RaNNC's Algorithms 1–2) cuts the forward graph, a mapper
places stage replicas on devices (default: consecutive, stage-major), and the simulator scores the plan.
(S, R, M) and Parmesan's α are chosen by simulation (Parmesan App. B) with the consecutive placement;
the mapper is called once, on the chosen configuration, and the plan re-simulated on its placement.
With ``time_limit_s`` the (S, R, M) search stops there and keeps the best candidate simulated so far
(the mapper then runs under its own limit).
"""

from __future__ import annotations

import inspect
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from tag.cluster.cluster import Cluster
from tag.cost.compute import CostModel
from tag.exact.clustering import ALPHAS, cluster_operators
from tag.exact.downsets import DEFAULT_DOWNSET_LIMIT, DownsetLimitError
from tag.exact.mapping import MappingError, MappingProblem, choose_instantiation, stage_times
from tag.exact.partition import (
    COMM_CROSSINGS,
    PartitionResult,
    partition_parmesan,
    partition_pipedream,
)
from tag.exact.pipeline_compile import Placement, check_mapping, compile_pipeline, consecutive_mapping, simulate_pipeline
from tag.exact.placements import consecutive_placements
from tag.exact.rannc import RannCSolution, blocks_from_groups, form_stage, rannc_dp, solution_stages
from tag.exact.replicated import partition_replicated
from tag.exact.stage_graph import (
    LINKS,
    SCHEDULES,
    ForwardGraph,
    PartitionError,
    StageGraph,
    build_stage_graph,
)
from tag.graph.opgraph import OpGraph
from tag.sim import SimulationResult, TaskGraph

__all__ = [
    "Placement",
    "Mapper",
    "consecutive_mapping",
    "compile_pipeline",
    "simulate_pipeline",
    "stored_stage_graph",
    "PipelinePlan",
    "plan_pipeline",
    "PARTITIONERS",
    "reference_bandwidth",
    "mapping_objective",
    "mapped_stage_times",
    "replay_pipeline",
]

log = logging.getLogger(__name__)

PARTITIONERS = ("parmesan", "rannc", "pipedream")
RANNC_BLOCKS = 32  # RaNNC §IV-A: k = 32 blocks
# While (S, R, M) are being compared, hyper-op graphs are kept to this many downsets (K is lowered until
# they fit); the chosen configuration is then partitioned again under the caller's limit, for every α.
SEARCH_DOWNSET_LIMIT = 256


# (stage_graph, replicas: int when uniform else [S] list, cluster, devices) -> object with .mapping,
# .lower_bound, .proven_optimal, .solve_time_s
Mapper = Callable[[StageGraph, Any, Cluster, list[int]], Any]




# ------------------------------------------------------------------------------------------- plans


@dataclass(eq=False)
class PipelinePlan:
    """A pipeline plan and its simulated iteration."""

    stage_graph: StageGraph
    mapping: list[list[int]]  # [S][R_s] device ids
    schedule: str
    partitioner: str
    taskgraph: TaskGraph
    result: SimulationResult
    lower_bound: float | None = None  # from the mapper, seconds per iteration
    proven_optimal: bool = False
    solve_time_s: float = 0.0  # the mapper's
    max_stage_time: float | None = None  # eq. (5) objective of ``mapping``, seconds per iteration
    instantiation: str | None = None  # of ``max_stage_time``: "p2p" or "allreduce"
    info: dict[str, Any] = field(default_factory=dict)  # partition details, search log, timings

    @property
    def iteration_time(self) -> float:
        return self.result.iteration_time

    @property
    def num_stages(self) -> int:
        return self.stage_graph.num_stages

    def as_dict(self) -> dict[str, Any]:
        """Figures of the plan. ``max_stage_time_s`` and ``lower_bound_s`` are seconds per iteration (all
        M micro-batches of the bottleneck stage replica, its transfers or its all-reduce: Parmesan's
        eq. (5) under ``instantiation``), as is ``iteration_time_s``, which adds the fill and drain;
        ``stage_time_s`` lists each stage's compute per micro-batch."""
        sg = self.stage_graph
        objective = self.max_stage_time if self.max_stage_time is not None else float(sg.iteration_stage_time.max())
        counts = sg.replicas.tolist()
        return {
            "kind": "pipeline",
            "partitioner": self.partitioner,
            "schedule": self.schedule,
            "stages": sg.num_stages,
            "replicas": counts[0] if len(set(counts)) == 1 else counts,
            "micro_batches": sg.micro_batches,
            "mapping": self.mapping,
            "stage_time_s": sg.stage_time.tolist(),
            "max_stage_time_s": objective,
            "instantiation": self.instantiation,
            "iteration_time_s": self.result.iteration_time,
            "peak_memory_bytes": float(self.result.peak_memory.max()),
            "feasible": bool(self.result.feasible),
            "lower_bound_s": self.lower_bound,
            "gap": (None if self.lower_bound is None or objective <= 0
                    else max(0.0, (objective - self.lower_bound) / objective)),
            "proven_optimal": bool(self.proven_optimal),
            "solve_time_s": float(self.solve_time_s),
            "stage_ops": np.bincount(sg.forward_assignment, minlength=sg.num_stages).tolist(),
            "edge_bytes": sg.edge_bytes.tolist(),
            "links": sg.info.get("links", "data"),
            **{k: v for k, v in self.info.items() if isinstance(v, (int, float, str, bool)) or v is None},
        }

    def __repr__(self) -> str:
        return (f"PipelinePlan({self.partitioner}, S={self.num_stages}, R={self.stage_graph.replicas.tolist()}, "
                f"M={self.stage_graph.micro_batches}, {self.schedule}, {self.iteration_time * 1e3:.4g} ms)")


@dataclass
class _Context:
    """What every candidate of one planning run shares."""

    fg: ForwardGraph
    cluster: Cluster
    devices: list[int]
    reference_type: int
    capacity: float
    bandwidth: float
    schedule: str
    num_hyper_ops: int | None
    downset_limit: int
    links: str = "data"  # StageGraph stage edges (tag.exact.stage_graph, Links)
    log: list[dict[str, Any]] = field(default_factory=list)  # one entry per simulated candidate
    clusterings: dict = field(default_factory=dict)  # Parmesan's operator clusterings (partition_parmesan)
    failures: list[str] = field(default_factory=list)  # why candidates could not be partitioned
    deadline: float = float("inf")  # perf_counter seconds: the search keeps what it has from then on

    def late(self) -> bool:
        return time.perf_counter() >= self.deadline


class _Candidate(NamedTuple):
    stage_graph: StageGraph
    mapping: list[list[int]]
    taskgraph: TaskGraph
    result: SimulationResult
    info: dict[str, Any]

    def key(self) -> tuple[bool, float]:
        return (not self.result.feasible, self.result.iteration_time)


def reference_bandwidth(cluster: Cluster, devices: Sequence[int]) -> float:
    """Median bandwidth between two of ``devices`` (inf for one device): what the partitioners price
    boundary tensors at before a mapping exists."""
    ids = np.asarray(devices)
    if ids.size < 2:
        return float("inf")
    table = cluster.bandwidth[np.ix_(ids, ids)]
    return float(np.median(table[~np.eye(ids.size, dtype=bool)]))


def _reference_type(fg: ForwardGraph, cluster: Cluster, devices: Sequence[int]) -> int:
    counts = np.bincount(cluster.device_type[np.asarray(devices)], minlength=len(cluster.types))
    return fg.gpu_types.index(cluster.types[int(np.argmax(counts))])


def _evaluate(ctx: _Context, forward_stage: np.ndarray, replicas, micro_batches: int, info: dict[str, Any],
              mapping: list[list[int]] | None = None) -> _Candidate:
    sg = build_stage_graph(ctx.fg, forward_stage, replicas=replicas, micro_batches=micro_batches,
                           reference_type=ctx.reference_type, links=ctx.links, info=info)
    mapping = mapping if mapping is not None else consecutive_mapping(sg, sg.replicas, ctx.cluster, ctx.devices).mapping
    taskgraph, result = simulate_pipeline(sg, ctx.cluster, mapping, schedule=ctx.schedule)
    ctx.log.append({"stages": sg.num_stages, "replicas": sg.replicas.tolist(), "micro_batches": micro_batches,
                    "alpha": info.get("alpha"), "iteration_time_s": result.iteration_time,
                    "feasible": bool(result.feasible)})
    return _Candidate(sg, mapping, taskgraph, result, info)


def _partition(ctx: _Context, method: str, stages: int, replicas: int, micro_batches: int,
               alpha: float, downset_limit: int, bandwidth: float) -> PartitionResult:
    common = dict(stages=stages, replicas=replicas, micro_batches=micro_batches, capacity=ctx.capacity,
                  bandwidth=bandwidth, reference_type=ctx.reference_type, schedule=ctx.schedule)
    if method == "pipedream":
        return partition_pipedream(ctx.fg, **common)
    return partition_parmesan(ctx.fg, **common, alpha=alpha, num_hyper_ops=ctx.num_hyper_ops,
                              downset_limit=downset_limit, clusterings=ctx.clusterings)


def _try(ctx: _Context, method: str, stages: int, replicas: int, micro_batches: int,
         alpha: float, downset_limit: int) -> _Candidate | None:
    """The partitioner's cut of (S, R, M) for each price of a boundary byte (the planning bandwidth, each
    placement's stage-link bandwidth, and free: eq. (3) adds the transfers to the compute, where the
    simulator overlaps them, so a compute-balanced cut can win), each simulated on the consecutive
    placements it was priced for (the free cut on both); the fastest. None when no price gives a
    partition."""
    placements = consecutive_placements(ctx.cluster, ctx.devices, stages, replicas)
    # (price, placements its cut is simulated on): the planning bandwidth on the stage-major placement
    # (Parmesan's own), each placement's link bandwidth on that placement, free transfers on both
    prices: dict[float, list[int]] = {ctx.bandwidth: [0]}
    for k, (_, _, bandwidth) in enumerate(placements):
        prices.setdefault(bandwidth, []).append(k)
    prices.setdefault(float("inf"), []).extend(range(len(placements)))
    best: _Candidate | None = None
    seen: set[tuple[bytes, int]] = set()
    for bandwidth, where in prices.items():
        if best is not None and ctx.late():
            break
        try:
            part = _partition(ctx, method, stages, replicas, micro_batches, alpha, downset_limit, bandwidth)
        except (PartitionError, DownsetLimitError) as error:
            log.info("S=%d R=%d M=%d alpha=%s: %s", stages, replicas, micro_batches, alpha, error)
            ctx.failures.append(f"S={stages} R={replicas} M={micro_batches}: {error}")
            continue
        info = {**part.info, "dp_cost_s": part.dp_cost, "partition_max_stage_time_s": part.max_stage_time,
                "partition_bandwidth": bandwidth}
        for k in dict.fromkeys(where):
            if (part.forward_stage.tobytes(), k) in seen:
                continue
            seen.add((part.forward_stage.tobytes(), k))
            name, rows, _ = placements[k]
            candidate = _evaluate(ctx, part.forward_stage, replicas, micro_batches, {**info, "placement": name}, rows)
            if best is None or candidate.key() < best.key():
                best = candidate
    return best


def _powers_of_two(limit: int) -> list[int]:
    out, m = [], 1
    while m <= limit:
        out.append(m)
        m *= 2
    return out


def _micro_batch_choices(stages: int, replicas: int, batch: int, given: int | None) -> list[int]:
    if given is not None:
        return [given]
    limit = max(1, batch // replicas)
    choices = [m for m in _powers_of_two(limit) if stages <= m <= 4 * stages] or [max(_powers_of_two(limit))]
    return choices


def _configurations(num_devices: int, num_nodes: int) -> list[tuple[int, int]]:
    """(S, R) pairs of Parmesan App. B's search: powers of two and the full S = D // R, at least half the
    devices busy."""
    pairs = set()
    for replicas in _powers_of_two(num_devices):
        most = num_devices // replicas
        for stages in set(_powers_of_two(most)) | {most}:
            if stages <= num_nodes and 2 * stages * replicas >= num_devices:
                pairs.add((stages, replicas))
    return sorted(pairs)


def _check_positive(name: str, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1):
        raise PartitionError(f"{name} must be a positive integer, got {value!r}")


def _search_uniform(ctx: _Context, method: str, stages: int | None, replicas: int | None, auto: bool,
                    micro_batches: int | None, alphas: Sequence[float]) -> _Candidate:
    num_devices = len(ctx.devices)
    batch = ctx.fg.batch_size
    if auto or (stages is None and replicas is None):
        pairs = [(s, r) for s, r in _configurations(num_devices, ctx.fg.num_nodes)
                 if (stages is None or s == stages) and (replicas is None or r == replicas)]
    else:
        s = stages if stages is not None else max(1, num_devices // replicas)
        r = replicas if replicas is not None else max(1, num_devices // stages)
        pairs = [(s, r)]
    if not pairs:
        raise PartitionError(f"no (stages, replicas) configuration with stages={stages}, replicas={replicas} "
                             f"fits {num_devices} devices and {ctx.fg.num_nodes} forward ops")
    best: _Candidate | None = None
    first_alpha = 1.0 if 1.0 in alphas or method == "pipedream" else alphas[0]
    scan_limit = min(ctx.downset_limit, SEARCH_DOWNSET_LIMIT) if len(pairs) > 1 or micro_batches is None \
        else ctx.downset_limit
    full_deadline = ctx.deadline
    if method == "pipedream" and replicas is None and np.isfinite(full_deadline):
        # the per-stage replica search below gets half of what is left: its uneven plans win on slow links
        ctx.deadline = time.perf_counter() + (full_deadline - time.perf_counter()) / 2
    for s, r in pairs:
        if s * r > num_devices:
            raise PartitionError(f"{s} stages x {r} replicas need {s * r} devices; {num_devices} given")
        if micro_batches is not None and micro_batches * r > batch:
            raise PartitionError(f"{micro_batches} micro-batches x {r} replicas exceed the batch of {batch} "
                                 "samples (each replica needs at least one sample per micro-batch)")
        for m in _micro_batch_choices(s, r, batch, micro_batches):
            if best is not None and ctx.late():
                break
            candidate = _try(ctx, method, s, r, m, first_alpha, scan_limit)
            if candidate is not None and (best is None or candidate.key() < best.key()):
                best = candidate
    if best is None:
        reason = f"; first failure: {ctx.failures[0]}" if ctx.failures else ""
        raise PartitionError(f"none of {len(ctx.failures)} pipeline configuration(s) could be partitioned on "
                             f"{num_devices} devices{reason}")
    ctx.deadline = full_deadline
    if method == "parmesan":
        s, r, m = best.stage_graph.num_stages, int(best.stage_graph.replicas[0]), best.stage_graph.micro_batches
        for alpha in alphas:
            if (alpha == first_alpha and scan_limit == ctx.downset_limit) or ctx.late():
                continue
            candidate = _try(ctx, method, s, r, m, alpha, ctx.downset_limit)
            if candidate is not None and candidate.key() < best.key():
                best = candidate
    if method == "pipedream" and replicas is None and not ctx.late():
        # every S up to 8 on a small cluster (PipeDream's uneven plans often have odd S), else the scan's
        stage_counts = [stages] if stages is not None else sorted(
            {s for s, _ in pairs if 1 < s < num_devices} | (set(range(2, min(num_devices, 9))) if num_devices <= 16
                                                             else set()))
        candidate = _search_replicated(ctx, stage_counts, micro_batches)
        if candidate is not None and candidate.key() < best.key():
            best = candidate
    return best


def _search_replicated(ctx: _Context, stage_counts: list[int], micro_batches: int | None) -> _Candidate | None:
    """PipeDream's per-stage replica counts (:mod:`tag.exact.replicated`) for each S, M and price of a
    boundary byte (the planning bandwidth, free), on the stage-major consecutive placement."""
    best: _Candidate | None = None
    for s in stage_counts:
        for m in _micro_batch_choices(s, 1, ctx.fg.batch_size, micro_batches):
            for bandwidth in dict.fromkeys([ctx.bandwidth, float("inf")]):
                if ctx.late():
                    return best
                try:
                    part = partition_replicated(ctx.fg, stages=s, devices=len(ctx.devices), micro_batches=m,
                                                bandwidth=bandwidth, sync_bandwidth=ctx.bandwidth,
                                                capacity=ctx.capacity, reference_type=ctx.reference_type,
                                                schedule=ctx.schedule, max_blocks=64 if len(ctx.devices) <= 16 else 32)
                except PartitionError as error:
                    ctx.failures.append(f"S={s} M={m} per-stage replicas: {error}")
                    continue
                info = {**part.info, "dp_cost_s": part.dp_cost, "partition_bandwidth": bandwidth}
                candidate = _evaluate(ctx, part.forward_stage, part.info["replicas"], m, info)
                if best is None or candidate.key() < best.key():
                    best = candidate
    return best


def _rannc_blocks(ctx: _Context):
    fg = ctx.fg
    t = ctx.reference_type
    group = cluster_operators(fg.num_nodes, fg.edge_src, fg.edge_dst, node_cost=fg.compute_time(1.0, t),
                              edge_comm=fg.edge_bytes(1.0) * COMM_CROSSINGS / ctx.bandwidth,
                              num_clusters=min(RANNC_BLOCKS, fg.num_nodes), alpha=ALPHAS[0])
    blocks = blocks_from_groups(group, fg.fwd_fixed[:, t], fg.fwd_scaled[:, t], fg.bwd_fixed[:, t],
                                fg.bwd_scaled[:, t], fg.static_bytes(), fg.act_fixed, fg.act_scaled,
                                fg.edge_src, fg.edge_dst, fg.edge_fixed, fg.edge_scaled, fg.batch_size)
    return group, blocks


def _rannc_mapping(ctx: _Context, solution: RannCSolution, nodes_per_copy: int, per_node: int) -> list[list[int]]:
    """Pipeline copy c on machines [c·n, (c+1)·n) of the used devices, stage i on the next d_i devices
    of its copy; rows list every copy's replicas, copy-major."""
    machines: dict[int, list[int]] = {}
    for d in ctx.devices:
        machines.setdefault(int(ctx.cluster.machine[d]), []).append(d)
    ordered = [devs[:per_node] for _, devs in sorted(machines.items())]
    rows: list[list[int]] = [[] for _ in solution.devices]
    for c in range(solution.copies):
        pool = [d for devs in ordered[c * nodes_per_copy:(c + 1) * nodes_per_copy] for d in devs]
        k = 0
        for i, count in enumerate(solution.devices):
            rows[i].extend(pool[k:k + count])
            k += count
    return rows


def _search_rannc(ctx: _Context, stages: int | None, replicas: int | None, auto: bool,
                  micro_batches: int | None) -> _Candidate:
    group, blocks = _rannc_blocks(ctx)
    comm_scale = 1.0 / ctx.bandwidth
    start = time.perf_counter()
    if auto or stages is None:
        machine_sizes = np.bincount(ctx.cluster.machine[np.asarray(ctx.devices)])
        machine_sizes = machine_sizes[machine_sizes > 0]
        per_node, nodes = int(machine_sizes.min()), int(machine_sizes.size)
        cache: dict[RannCSolution, _Candidate] = {}

        def evaluate(solution: RannCSolution) -> float:
            n = sum(solution.devices) // per_node
            mapping = _rannc_mapping(ctx, solution, max(n, 1), per_node)
            counts = [c * solution.copies for c in solution.devices]
            info = {"method": "rannc", "dp_cost_s": solution.value, "blocks": blocks.num_blocks}
            cache[solution] = _evaluate(ctx, solution_stages(solution, group), counts, solution.micro_batches,
                                        info, mapping)
            key = cache[solution].key()
            return key[1] + (1e9 if key[0] else 0.0)

        solution = form_stage(blocks, nodes=nodes, devices_per_node=per_node, capacity=ctx.capacity,
                              comm_scale=comm_scale, schedule=ctx.schedule, evaluate=evaluate,
                              max_micro_batches=micro_batches)
        best = cache[solution]
    else:
        devices = stages * replicas if replicas is not None else len(ctx.devices)
        if devices > len(ctx.devices):
            raise PartitionError(f"{stages} stages x {replicas} replicas need {devices} devices; "
                                 f"{len(ctx.devices)} given")
        best = None
        for m in _micro_batch_choices(stages, max(1, devices // stages), ctx.fg.batch_size, micro_batches):
            solution = rannc_dp(blocks, stages=stages, devices=devices, micro_batches=m, capacity=ctx.capacity,
                                comm_scale=comm_scale, schedule=ctx.schedule)
            if solution is None:
                continue
            info = {"method": "rannc", "dp_cost_s": solution.value, "blocks": blocks.num_blocks}
            candidate = _evaluate(ctx, solution_stages(solution, group), list(solution.devices), m, info)
            if best is None or candidate.key() < best.key():
                best = candidate
        if best is None:
            raise PartitionError(f"RaNNC found no feasible partition into {stages} stages on {devices} devices")
    best.info["dp_s"] = time.perf_counter() - start
    return best


def _call_mapper(mapper: Mapper, sg: StageGraph, cluster: Cluster, devices: list[int], seed: int):
    counts = sg.replicas.tolist()
    replicas = counts[0] if len(set(counts)) == 1 else counts
    try:
        takes_seed = "seed" in inspect.signature(mapper).parameters
    except (TypeError, ValueError):
        takes_seed = False
    return mapper(sg, replicas, cluster, devices, seed=seed) if takes_seed else mapper(sg, replicas, cluster, devices)


def plan_pipeline(graph: OpGraph, cluster: Cluster, *, stages: int | None = None, replicas: int | None = None,
                  auto: bool = False, partitioner: str = "parmesan", mapper: Mapper | None = None,
                  micro_batches: int | None = None, schedule: str = "1f1b", seed: int = 0,
                  cost: CostModel | None = None, devices: Sequence[int] | None = None,
                  num_hyper_ops: int | None = None, alphas: Sequence[float] | None = None,
                  bandwidth: float | None = None, downset_limit: int = DEFAULT_DOWNSET_LIMIT,
                  links: str = "data", time_limit_s: float | None = None) -> PipelinePlan:
    """Partition ``graph``, map the stages onto ``cluster`` and simulate one iteration.

    ``stages`` / ``replicas`` fix S and R (the other defaults to filling the devices); with neither, or
    ``auto``, (S, R) is searched as in Parmesan App. B (RaNNC: its Algorithm 2). ``micro_batches``
    defaults to the best power of two in [S, 4S] by simulation (at most batch / R). ``mapper`` places the
    chosen stage graph (default consecutive); ``seed`` is passed to a mapper that takes one.
    ``devices`` restricts the plan to some devices; ``bandwidth`` overrides the median link bandwidth the
    partitioners price boundary tensors at; ``alphas`` are Parmesan's clustering weights to try.
    ``links``: the stage edges the plan runs with, ``"data"`` (direct, Parmesan) or ``"chain"`` (a
    sequential pipeline's runtime, PipeDream; :mod:`tag.exact.stage_graph`, Links). ``time_limit_s``
    stops the (S, R, M) search there with the best candidate simulated so far (module docstring).
    """
    if partitioner not in PARTITIONERS:
        raise PartitionError(f"partitioner must be one of {', '.join(PARTITIONERS)}, got {partitioner!r}")
    if schedule not in SCHEDULES:
        raise PartitionError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    for name, value in (("stages", stages), ("replicas", replicas), ("micro_batches", micro_batches),
                        ("num_hyper_ops", num_hyper_ops)):
        _check_positive(name, value)
    device_list = list(range(cluster.num_devices)) if devices is None else [int(d) for d in devices]
    if not device_list or len(set(device_list)) != len(device_list) or \
            any(not 0 <= d < cluster.num_devices for d in device_list):
        raise PartitionError(f"devices must be distinct ids in 0..{cluster.num_devices - 1}, got {devices!r}")
    alphas = tuple(ALPHAS if alphas is None else alphas)
    if not alphas or not all(isinstance(a, (int, float)) and np.isfinite(a) and a >= 0 for a in alphas):
        raise PartitionError(f"alphas must be a non-empty list of non-negative numbers, got {alphas!r}")
    if bandwidth is not None and not bandwidth > 0:
        raise PartitionError(f"bandwidth must be positive, got {bandwidth!r}")
    if links not in LINKS:
        raise PartitionError(f"links must be one of {', '.join(LINKS)}, got {links!r}")
    if time_limit_s is not None and not time_limit_s > 0:
        raise PartitionError(f"time_limit_s must be positive, got {time_limit_s!r}")
    start = time.perf_counter()
    fg = ForwardGraph.from_graph(graph, cluster.types, cost=cost)
    ctx = _Context(fg, cluster, device_list, _reference_type(fg, cluster, device_list),
                   float(cluster.memory_bytes()[device_list].min()),
                   bandwidth if bandwidth is not None else reference_bandwidth(cluster, device_list),
                   schedule, num_hyper_ops, downset_limit, links,
                   deadline=float("inf") if time_limit_s is None else start + time_limit_s)
    if partitioner == "rannc":
        best = _search_rannc(ctx, stages, replicas, auto, micro_batches)
    else:
        best = _search_uniform(ctx, partitioner, stages, replicas, auto, micro_batches, alphas)
    info = dict(best.info)
    info["planning_time_s"] = time.perf_counter() - start
    info["configurations_simulated"] = len(ctx.log)
    info["stopped_at_limit"] = ctx.late()
    lower_bound, proven, solve_time, objective, mode = None, False, 0.0, None, None
    mapping, taskgraph, result = best.mapping, best.taskgraph, best.result
    mapped = None
    if mapper is not None:
        try:
            mapped = _call_mapper(mapper, best.stage_graph, cluster, device_list, seed)
        except MappingError as error:
            if len(set(best.stage_graph.replicas.tolist())) == 1:
                raise
            # RaNNC gave stages unequal replica counts, which the mappers cannot place: keep its placement.
            info["mapper_skipped"] = str(error)
    if mapped is not None:
        lower_bound, proven, solve_time = mapped.lower_bound, bool(mapped.proven_optimal), float(mapped.solve_time_s)
        rows = check_mapping(best.stage_graph, cluster, mapped.mapping)
        mapped_graph, mapped_result = simulate_pipeline(best.stage_graph, cluster, rows, schedule=schedule)
        if (not mapped_result.feasible, mapped_result.iteration_time) <= best.key():
            mapping, taskgraph, result = rows, mapped_graph, mapped_result
            objective, mode = getattr(mapped, "max_stage_time", None), getattr(mapped, "instantiation", None)
        else:
            # the mapper optimises eq. (5); the simulator says the search's placement is faster: keep it
            info["mapper_iteration_time_s"] = mapped_result.iteration_time
            info["placement_kept"] = info.get("placement", "search")
    if objective is None:
        objective, mode = mapping_objective(best.stage_graph, cluster, mapping)
    info["search"] = ctx.log
    return PipelinePlan(best.stage_graph, mapping, schedule, partitioner, taskgraph, result,
                        lower_bound=None if lower_bound is None else float(lower_bound), proven_optimal=proven,
                        solve_time_s=solve_time, max_stage_time=None if objective is None else float(objective),
                        instantiation=mode, info=info)


def mapped_stage_times(stage_graph: StageGraph, cluster: Cluster, mapping: Sequence[Sequence[int]],
                       instantiation: str | None = None) -> tuple[np.ndarray | None, str | None]:
    """([S] each stage's time under ``mapping``, its slowest replica, in seconds per iteration: Parmesan's
    eq. (6) or (7), the instantiation chosen by the all-reduce : p2p ratio unless given); (None, None)
    when the stages have unequal replica counts."""
    counts = stage_graph.replicas.tolist()
    if len(set(counts)) != 1:
        return None, None
    rows = check_mapping(stage_graph, cluster, mapping)
    used = sorted({d for row in rows for d in row})
    index = {d: i for i, d in enumerate(used)}
    sub = cluster if len(used) == cluster.num_devices else cluster.subset(used)
    problem = MappingProblem.from_stage_graph(stage_graph, int(counts[0]), sub)
    mode = instantiation or choose_instantiation(problem)
    return stage_times(problem, [[index[d] for d in row] for row in rows], mode).max(axis=1), mode


def mapping_objective(stage_graph: StageGraph, cluster: Cluster,
                      mapping: Sequence[Sequence[int]]) -> tuple[float | None, str | None]:
    """(Parmesan's eq. (5) objective of ``mapping`` in seconds per iteration, its instantiation): the
    largest of :func:`mapped_stage_times`; (None, None) when the stages have unequal replica counts."""
    times, mode = mapped_stage_times(stage_graph, cluster, mapping)
    return (None, None) if times is None else (float(times.max()), mode)


def stored_stage_graph(graph: OpGraph, cluster: Cluster, *, forward_assignment: Sequence[int] | np.ndarray,
                       replicas: Sequence[int], micro_batches: int, reference_gpu: str | None = None,
                       links: str = "data", cost: CostModel | None = None) -> StageGraph:
    """The StageGraph of a stored pipeline plan (a plan file's ``pipeline`` section) on ``graph``."""
    fg = ForwardGraph.from_graph(graph, cluster.types, cost=cost)
    forward_stage = np.asarray(forward_assignment, dtype=np.int64).reshape(-1)
    if forward_stage.shape != (fg.num_nodes,):
        raise PartitionError(f"the plan assigns {forward_stage.size} forward ops; the model has {fg.num_nodes}")
    names = [t.name for t in fg.gpu_types]
    reference = names.index(reference_gpu) if reference_gpu in names else 0
    return build_stage_graph(fg, forward_stage, replicas=list(replicas), micro_batches=micro_batches,
                             reference_type=reference, links=links)


def replay_pipeline(graph: OpGraph, cluster: Cluster, *, forward_assignment: Sequence[int] | np.ndarray,
                    replicas: Sequence[int], micro_batches: int, mapping: Sequence[Sequence[int]],
                    schedule: str = "1f1b", reference_gpu: str | None = None, partitioner: str = "replay",
                    cost: CostModel | None = None, links: str = "data") -> PipelinePlan:
    """Rebuild and simulate a stored pipeline plan: the stage of every forward op of ``graph``'s forward
    view, the replica counts, M and the mapping (a plan file's ``pipeline`` section)."""
    if schedule not in SCHEDULES:
        raise PartitionError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    sg = stored_stage_graph(graph, cluster, forward_assignment=forward_assignment, replicas=replicas,
                            micro_batches=micro_batches, reference_gpu=reference_gpu, links=links, cost=cost)
    rows = check_mapping(sg, cluster, mapping)
    taskgraph, result = simulate_pipeline(sg, cluster, rows, schedule=schedule)
    objective, mode = mapping_objective(sg, cluster, rows)
    return PipelinePlan(sg, rows, schedule, partitioner, taskgraph, result, max_stage_time=objective,
                        instantiation=mode)
