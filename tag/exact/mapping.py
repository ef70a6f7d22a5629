"""Provably optimal stage-to-device mapping on any topology (Parmesan §V, Algorithms 1–2).

A pipeline of S stages, each replicated R times (S·R ≤ D devices), goes onto a cluster's devices, one
replica per device. The objective (eq. 5) is the largest stage time, in one of two instantiations
(§V-B), chosen by the ratio of all-reduce to inter-stage bytes when ``instantiation="auto"``:

- ``"p2p"``, eq. (6) with (8): compute + Σ over adjacent stages of M(s, s') / B(p(s), p(s')); replica r
  of a stage exchanges activations with replica r of its neighbours;
- ``"allreduce"``, eq. (7) with (9): compute + max over the hops of the stage's ring of
  2 (R−1)/R · P(s) / B; the ring visits the replicas in replica order and closes.

Every time is seconds per training iteration (all micro-batches of one stage replica, and one gradient
all-reduce); :meth:`MappingProblem.from_stage_graph` converts a per-micro-batch StageGraph.

``"full"`` (compute + both) is the formulation both approximate; :func:`stage_times` evaluates it, the
search does not optimise it. Link latency enters as α + M/B for a transfer and as a hop's share
2(R−1)·α of a ring all-reduce, which is how a ring's 2(R−1) steps each wait for the slowest hop; with
zero latency (Parmesan's tables) every formula is the paper's.

Layers (STYLE 8): :mod:`tag.exact._mapping_kernel` decides "is there a mapping with every stage time
≤ t?" over arrays; :func:`solve_mapping` here runs the binary search of Algorithm 1 over it; no I/O.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from tag._rng import as_rng
from tag.errors import TagError
from tag.exact import _mapping_kernel as kernel
from tag.exact.heuristics import cs_map, p2p_map, random_map

__all__ = [
    "MappingError",
    "MappingProblem",
    "MappingResult",
    "INSTANTIATIONS",
    "P2P",
    "ALLREDUCE",
    "FULL",
    "AUTO",
    "choose_instantiation",
    "stage_times",
    "max_stage_time",
    "StageTimer",
    "initial_lower_bound",
    "assignment_lower_bound",
    "solve_mapping",
    "search_tables",
]

log = logging.getLogger(__name__)

P2P, ALLREDUCE, FULL, AUTO = "p2p", "allreduce", "full", "auto"
INSTANTIATIONS = (P2P, ALLREDUCE)  # what the search optimises; FULL is for evaluation only
# Bisection stops at this relative width; one last search just below the best then proves optimality.
_RTOL = 1e-9
# Relative rounding error per addition allowed for when a bound adds its terms in another order.
_SUM_ORDER_SLACK = 4 * np.finfo(np.float64).eps
# Adjacent stages of one stage placed on distinct devices exactly (2^n subsets) up to this many.
_DISTINCT_NEIGHBOUR_LIMIT = 8
# The per-pair cost tables of the search may take this much memory.
_TABLE_LIMIT_BYTES = 1 << 31
# Stage time values listed at most for the binary search over candidates (else it bisects the interval).
_CANDIDATE_LIMIT = 1 << 23


class MappingError(TagError):
    """A mapping problem or a mapping is malformed (shapes, sizes, negative times or bytes, a reused device)."""


# --------------------------------------------------------------------------------------- the problem


@dataclass(frozen=True, eq=False)
class MappingProblem:
    """S stages × R replicas onto D devices. Seconds, bytes, bytes/s.

    Stages form a DAG given as an edge list; replica r of ``edge_src[e]`` sends ``edge_bytes[e]`` to
    replica r of ``edge_dst[e]`` (activations forward and gradients back, both counted in the bytes).
    ``stage_time`` is [S] for one GPU type or [S, T] with ``device_type`` [D] indexing its columns.
    """

    stage_time: np.ndarray  # [S] or [S, T] compute seconds of one stage replica (per GPU type)
    edge_src: np.ndarray  # [E] int64 stage ids
    edge_dst: np.ndarray  # [E] int64 stage ids
    edge_bytes: np.ndarray  # [E] float64 bytes a replica moves over the edge per iteration
    param_bytes: np.ndarray  # [S] float64 parameter bytes of a stage, all-reduced among its replicas
    num_replicas: int  # R
    bandwidth: np.ndarray  # [D, D] float64 bytes/s; the diagonal is ignored
    latency: np.ndarray | None = None  # [D, D] float64 seconds; None for zeros
    device_type: np.ndarray | None = None  # [D] int64 column of stage_time; None for zeros

    def __post_init__(self) -> None:
        stage_time = _float_array(self.stage_time, "stage_time")
        if stage_time.ndim == 1:
            stage_time = stage_time[:, None]
        if stage_time.ndim != 2 or stage_time.shape[0] == 0 or stage_time.shape[1] == 0:
            raise MappingError(f"stage_time must be [S] or [S, T] with S, T ≥ 1, got shape {stage_time.shape}")
        _non_negative(stage_time, "stage_time")
        num_stages = stage_time.shape[0]
        edge_src = _int_array(self.edge_src, "edge_src")
        edge_dst = _int_array(self.edge_dst, "edge_dst")
        edge_bytes = _float_array(self.edge_bytes, "edge_bytes").reshape(-1)
        if not (len(edge_src) == len(edge_dst) == len(edge_bytes)):
            raise MappingError(f"edge_src, edge_dst and edge_bytes differ in length "
                               f"({len(edge_src)}, {len(edge_dst)}, {len(edge_bytes)})")
        for name, ids in (("edge_src", edge_src), ("edge_dst", edge_dst)):
            bad = np.flatnonzero((ids < 0) | (ids >= num_stages))
            if len(bad):
                raise MappingError(f"{name}[{bad[0]}] = {ids[bad[0]]}: no such stage (0..{num_stages - 1})")
        loops = np.flatnonzero(edge_src == edge_dst)
        if len(loops):
            raise MappingError(f"edge {loops[0]} joins stage {edge_src[loops[0]]} to itself")
        _non_negative(edge_bytes, "edge_bytes")
        param_bytes = _float_array(self.param_bytes, "param_bytes").reshape(-1)
        if len(param_bytes) != num_stages:
            raise MappingError(f"param_bytes has {len(param_bytes)} entries for {num_stages} stages")
        _non_negative(param_bytes, "param_bytes")
        replicas = self.num_replicas
        if isinstance(replicas, bool) or not isinstance(replicas, (int, np.integer)) or replicas < 1:
            raise MappingError(f"num_replicas must be a positive integer, got {replicas!r}")
        bandwidth = _float_array(self.bandwidth, "bandwidth")
        num_devices = bandwidth.shape[0] if bandwidth.ndim == 2 else -1
        if bandwidth.ndim != 2 or bandwidth.shape != (num_devices, num_devices):
            raise MappingError(f"bandwidth must be a square [D, D] matrix, got shape {bandwidth.shape}")
        off = ~np.eye(num_devices, dtype=bool)
        bad = np.argwhere(off & ~(bandwidth > 0))
        if len(bad):
            i, j = bad[0]
            raise MappingError(f"bandwidth[{i}, {j}] = {bandwidth[i, j]}: must be positive")
        bad = np.argwhere(off & np.isinf(bandwidth))
        if len(bad):
            i, j = bad[0]
            raise MappingError(f"bandwidth[{i}, {j}] is infinite: only a device to itself is free")
        latency = np.zeros_like(bandwidth) if self.latency is None else _float_array(self.latency, "latency")
        if latency.shape != bandwidth.shape:
            raise MappingError(f"latency has shape {latency.shape}, bandwidth {bandwidth.shape}")
        _non_negative(np.where(off, latency, 0.0), "latency")
        for name, table in (("bandwidth", bandwidth), ("latency", latency)):
            asym = np.argwhere(off & (table != table.T))
            if len(asym):
                i, j = asym[0]
                raise MappingError(f"{name} is not symmetric: [{i}, {j}] = {table[i, j]}, [{j}, {i}] = {table[j, i]}")
        device_type = (np.zeros(num_devices, dtype=np.int64) if self.device_type is None
                       else _int_array(self.device_type, "device_type"))
        if len(device_type) != num_devices:
            raise MappingError(f"device_type has {len(device_type)} entries for {num_devices} devices")
        bad = np.flatnonzero((device_type < 0) | (device_type >= stage_time.shape[1]))
        if len(bad):
            raise MappingError(f"device_type[{bad[0]}] = {device_type[bad[0]]}: stage_time has "
                               f"{stage_time.shape[1]} column(s)")
        if num_stages * replicas > num_devices:
            raise MappingError(f"{num_stages} stages × {replicas} replicas need {num_stages * replicas} devices; "
                               f"the cluster has {num_devices}")
        bandwidth = bandwidth.copy()
        latency = latency.copy()
        np.fill_diagonal(bandwidth, np.inf)
        np.fill_diagonal(latency, 0.0)
        for name, value in (("stage_time", stage_time), ("edge_src", edge_src), ("edge_dst", edge_dst),
                            ("edge_bytes", edge_bytes), ("param_bytes", param_bytes),
                            ("num_replicas", int(replicas)), ("bandwidth", bandwidth), ("latency", latency),
                            ("device_type", device_type)):
            if isinstance(value, np.ndarray):
                value.setflags(write=False)
            object.__setattr__(self, name, value)

    @property
    def num_stages(self) -> int:
        return self.stage_time.shape[0]

    @property
    def num_devices(self) -> int:
        return self.bandwidth.shape[0]

    @property
    def num_vertices(self) -> int:
        """S·R: the vertices of Parmesan's G'."""
        return self.num_stages * self.num_replicas

    def compute_time(self) -> np.ndarray:
        """[S, D] compute seconds of each stage on each device."""
        return self.stage_time[:, self.device_type]

    def stage_pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """(pairs [K, 2] with a < b, bytes [K]): the edges merged per unordered stage pair, zero-byte
        pairs left out, sorted. M(s, s') of eq. (8)."""
        totals: dict[tuple[int, int], float] = {}
        for a, b, nbytes in zip(self.edge_src.tolist(), self.edge_dst.tolist(), self.edge_bytes.tolist()):
            key = (min(a, b), max(a, b))
            totals[key] = totals.get(key, 0.0) + nbytes
        keys = sorted(k for k, v in totals.items() if v > 0)
        return np.array(keys, dtype=np.int64).reshape(-1, 2), np.array([totals[k] for k in keys], dtype=np.float64)

    @classmethod
    def from_cluster(cls, cluster: Any, *, stage_time: Any, edge_src: Any, edge_dst: Any, edge_bytes: Any,
                     param_bytes: Any, replicas: int) -> MappingProblem:
        """Take bandwidth, latency and device types from a :class:`tag.cluster.Cluster` (its routed
        pair table: Parmesan's look-up table; NIC sharing is not part of the mapping model).
        ``stage_time`` is [S] (one time for every device) or [S, len(cluster.types)]."""
        times = np.asarray(stage_time, dtype=np.float64)
        device_type = None
        if times.ndim == 2 and times.shape[1] > 1:
            if times.shape[1] != len(cluster.types):
                raise MappingError(f"stage_time has {times.shape[1]} columns; the cluster has "
                                   f"{len(cluster.types)} GPU types")
            device_type = cluster.device_type
        return cls(stage_time=times, edge_src=edge_src, edge_dst=edge_dst, edge_bytes=edge_bytes,
                   param_bytes=param_bytes, num_replicas=replicas, bandwidth=cluster.bandwidth,
                   latency=cluster.latency, device_type=device_type)

    @classmethod
    def from_stage_graph(cls, stage_graph: Any, replicas: int, cluster: Any, *,
                         transfers_per_edge: float = 2.0) -> MappingProblem:
        """From anything with ``stage_time`` [S], ``edge_src`` [E], ``edge_dst`` [E], ``edge_bytes`` [E]
        and ``param_bytes`` [S] (a partitioner's StageGraph) and a cluster.

        **Units: one training iteration.** A StageGraph times one micro-batch (``stage_time``,
        ``edge_bytes``) but all-reduces its gradients once per iteration (``param_bytes``); a stage
        replica runs all M = ``micro_batches`` of them (1 when the graph has no such field), so compute
        and inter-stage bytes are multiplied by M here and eq. (5)'s objective, its lower bounds and the
        simulated iteration time are all seconds per iteration: a pipeline's iteration is about the
        objective plus the fill and drain, (S − 1) micro-batches of the other stages.

        M(s, s') of eq. (8) is ``transfers_per_edge`` × M × the edge's bytes: 2 for the partitioner's
        StageGraph, whose ``edge_bytes`` are the forward activations (their gradients return in the
        backward pass, as ``stage_time`` holds forward + backward); 1 when ``edge_bytes`` already count
        both directions. When the stage graph also has ``forward_time`` and ``backward_time`` [S, T] over
        ``gpu_types`` that name every GPU type of the cluster, each device gets its own type's time.
        """
        missing = [f for f in ("stage_time", "edge_src", "edge_dst", "edge_bytes", "param_bytes")
                   if not hasattr(stage_graph, f)]
        if missing:
            raise MappingError(f"stage graph lacks field(s) {', '.join(missing)}")
        if not (isinstance(transfers_per_edge, (int, float)) and transfers_per_edge > 0):
            raise MappingError(f"transfers_per_edge must be positive, got {transfers_per_edge!r}")
        micro_batches = getattr(stage_graph, "micro_batches", 1)
        if isinstance(micro_batches, bool) or not isinstance(micro_batches, (int, np.integer)) or micro_batches < 1:
            raise MappingError(f"stage graph micro_batches must be a positive integer, got {micro_batches!r}")
        stage_time = np.asarray(stage_graph.stage_time, dtype=np.float64)
        per_type = _times_per_cluster_type(stage_graph, cluster)
        per_micro_batch = stage_time if per_type is None else per_type
        edge_bytes = transfers_per_edge * micro_batches * np.asarray(stage_graph.edge_bytes, dtype=np.float64)
        return cls.from_cluster(cluster, stage_time=micro_batches * per_micro_batch,
                                edge_src=stage_graph.edge_src, edge_dst=stage_graph.edge_dst,
                                edge_bytes=edge_bytes, param_bytes=stage_graph.param_bytes, replicas=replicas)


def _times_per_cluster_type(stage_graph: Any, cluster: Any) -> np.ndarray | None:
    """[S, T] forward + backward time on each of the cluster's GPU types, when the stage graph has them
    for every one (and the cluster has more than one); else None."""
    names = [getattr(t, "name", t) for t in getattr(stage_graph, "gpu_types", ())]
    if len(cluster.types) < 2 or not all(hasattr(stage_graph, f) for f in ("forward_time", "backward_time")):
        return None
    if not all(t.name in names for t in cluster.types):
        return None
    both = np.asarray(stage_graph.forward_time, dtype=np.float64) + np.asarray(stage_graph.backward_time,
                                                                               dtype=np.float64)
    return both[:, [names.index(t.name) for t in cluster.types]]


def _float_array(values: Any, field: str) -> np.ndarray:
    try:
        array = np.array(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise MappingError(f"{field} must be numeric") from None
    if np.isnan(array).any():
        raise MappingError(f"{field} holds NaN")
    return array


def _int_array(values: Any, field: str) -> np.ndarray:
    array = np.asarray(values)
    if array.size and not np.issubdtype(array.dtype, np.integer):
        as_float = _float_array(array, field)
        if not np.all(np.mod(as_float, 1) == 0):
            raise MappingError(f"{field} must hold integers")
    return array.astype(np.int64).reshape(-1)


def _non_negative(array: np.ndarray, field: str) -> None:
    bad = np.argwhere(~(array >= 0) | np.isinf(array))
    if len(bad):
        index = tuple(int(i) for i in bad[0])
        shown = index[0] if len(index) == 1 else list(index)
        raise MappingError(f"{field}[{shown}] = {array[index]}: must be finite and non-negative")


# --------------------------------------------------------------------------------------- eqs. (6)–(9)


def _p2p_seconds(nbytes, bandwidth, latency):
    """Eq. (8) term: one transfer of ``nbytes`` over a link (α + M/B)."""
    return latency + nbytes / bandwidth


def _hop_seconds(param_bytes, replicas: int, bandwidth, latency):
    """Eq. (9) term: a ring hop's share of a ring all-reduce of R replicas, 2(R−1)/R · P/B (+ 2(R−1)·α)."""
    return 2.0 * (replicas - 1) * latency + 2.0 * (replicas - 1) / replicas * param_bytes / bandwidth


def search_tables(problem: MappingProblem) -> kernel.SearchTables:
    """The arrays the search reads (see :class:`tag.exact._mapping_kernel.SearchTables`)."""
    pairs, pair_bytes = problem.stage_pairs()
    table_bytes = 8 * (len(pairs) + problem.num_stages) * problem.num_devices ** 2
    if table_bytes > _TABLE_LIMIT_BYTES:
        raise MappingError(f"{problem.num_devices} devices need {table_bytes / 2**30:.1f} GiB of cost tables for "
                           f"{problem.num_stages} stages; map onto a subset of the cluster (Cluster.subset)")
    bandwidth, latency = problem.bandwidth, problem.latency
    transfer = _p2p_seconds(pair_bytes[:, None, None], bandwidth[None], latency[None])  # [K, D, D]
    replicas = problem.num_replicas
    hop = np.zeros((problem.num_stages,) + bandwidth.shape)
    if replicas >= 2:
        ring = problem.param_bytes > 0
        hop[ring] = _hop_seconds(problem.param_bytes[ring, None, None], replicas, bandwidth[None], latency[None])
    diagonal = np.eye(problem.num_devices, dtype=bool)
    transfer[:, diagonal] = np.inf
    hop[:, diagonal] = np.inf
    compute = problem.compute_time()
    return kernel.SearchTables(
        compute=compute,
        pair_stages=pairs,
        transfer=transfer,
        hop=hop,
        num_replicas=replicas,
        twin_class=_twin_classes(problem),
        stage_class=_stage_classes(compute, problem.param_bytes),
        p2p_bound=_p2p_vertex_bounds(compute, pairs, transfer),
    )


def _p2p_vertex_bounds(compute: np.ndarray, pair_stages: np.ndarray, transfer: np.ndarray) -> np.ndarray:
    """[S, D] the least eq. (6) time stage s can have on device d: the inner term of eq. (10).

    Replica r of each adjacent stage sits on its own device other than d, so the least sum of
    transfers is a min-cost assignment of the n adjacent stages to distinct devices (on a mesh's edge
    device, four neighbours cannot all be one hop away). Some optimal assignment gives every adjacent
    stage one of its n cheapest devices (were one elsewhere, one of its n cheapest would be free and no
    dearer), so a DP over the subsets of adjacent stages runs over those ≤ n² devices, for every d at
    once. Exact up to ``_DISTINCT_NEIGHBOUR_LIMIT`` adjacent stages; beyond that each takes its cheapest
    link independently, a weaker bound. The DP adds in another order than eq. (6) does, so its values
    step down past any rounding difference.
    """
    num_stages, num_devices = compute.shape
    bounds = compute.copy()
    for s, neighbours in enumerate(kernel.stage_adjacency(num_stages, pair_stages)):
        links = [k for k, _ in neighbours]
        n = len(links)
        if n <= 1 or n > _DISTINCT_NEIGHBOUR_LIMIT:
            for k in links:  # eq. (6)'s own order of additions: exact where it is the least
                bounds[s] = bounds[s] + transfer[k].min(axis=1)
            continue
        costs = transfer[links]  # [n, D, D] adjacent stage a on device y when s is on x
        cheapest = np.argpartition(costs, n - 1, axis=2)[:, :, :n]  # [n, D, n]
        options = np.sort(cheapest.transpose(1, 0, 2).reshape(num_devices, n * n), axis=1)  # [D, n²]
        option_cost = costs[:, np.arange(num_devices)[:, None], options]  # [n, D, n²]
        option_cost[:, :, 1:][:, options[:, 1:] == options[:, :-1]] = np.inf  # a device listed twice
        subsets = np.arange(1 << n)
        least = np.full((num_devices, len(subsets)), np.inf)  # [D, 2^n] compute + the subset placed
        least[:, 0] = compute[s]
        for c in range(n * n):  # each option device takes at most one adjacent stage
            step = least.copy()
            for a in range(n):
                without = subsets[(subsets >> a & 1) == 0]
                step[:, without | 1 << a] = np.minimum(step[:, without | 1 << a],
                                                       least[:, without] + option_cost[a, :, c, None])
            least = step
        bounds[s] = least[:, -1] * (1.0 - _SUM_ORDER_SLACK * (n + 1))
    return bounds


def _twin_classes(problem: MappingProblem) -> np.ndarray:
    """[D] class ids: two devices are twins when swapping them changes no table (same type, same
    bandwidth and latency to every third device); twins form classes."""
    num_devices = problem.num_devices
    bandwidth, latency, device_type = problem.bandwidth, problem.latency, problem.device_type
    classes = np.arange(num_devices)
    # Twins have the same multiset of off-diagonal entries: bucket by it, compare inside buckets.
    off = ~np.eye(num_devices, dtype=bool)
    keys: dict[bytes, list[int]] = {}
    for d in range(num_devices):
        key = (np.sort(bandwidth[d][off[d]]).tobytes() + np.sort(latency[d][off[d]]).tobytes()
               + int(device_type[d]).to_bytes(8, "little"))
        keys.setdefault(key, []).append(d)
    for bucket in keys.values():
        for n, d in enumerate(bucket):
            if classes[d] != d:
                continue
            for e in bucket[n + 1:]:
                if classes[e] != e:
                    continue
                others = np.ones(num_devices, dtype=bool)
                others[[d, e]] = False
                if (np.array_equal(bandwidth[d][others], bandwidth[e][others])
                        and np.array_equal(latency[d][others], latency[e][others])):
                    classes[e] = d
    return classes


def _stage_classes(compute: np.ndarray, param_bytes: np.ndarray) -> np.ndarray:
    """[S] class ids: stages with equal compute on every device and equal parameter bytes are
    interchangeable under eq. (7)."""
    classes = np.arange(len(param_bytes))
    for s in range(len(param_bytes)):
        for e in range(s):
            if classes[e] == e and param_bytes[e] == param_bytes[s] and np.array_equal(compute[e], compute[s]):
                classes[s] = e
                break
    return classes


def choose_instantiation(problem: MappingProblem) -> str:
    """Parmesan §V-B: ``"allreduce"`` when the all-reduce bytes exceed the inter-stage bytes, else ``"p2p"``.

    All-reduce bytes: Σ_s 2(R−1)/R · P(s), what one replica of every stage sends around its rings;
    inter-stage bytes: Σ_e M(e), what one replica chain sends between stages. R = 1 means no all-reduce.
    """
    replicas = problem.num_replicas
    allreduce = 2.0 * (replicas - 1) / replicas * float(problem.param_bytes.sum())
    p2p = float(problem.edge_bytes.sum())
    return ALLREDUCE if allreduce > p2p else P2P


def _resolve_instantiation(problem: MappingProblem, instantiation: str, *, allow_full: bool) -> str:
    allowed = (P2P, ALLREDUCE, AUTO) + ((FULL,) if allow_full else ())
    if instantiation not in allowed:
        raise MappingError(f"instantiation must be one of {', '.join(allowed)}, got {instantiation!r}")
    return choose_instantiation(problem) if instantiation == AUTO else instantiation


def _check_mapping(problem: MappingProblem, mapping: Any) -> np.ndarray:
    array = np.asarray(mapping)
    shape = (problem.num_stages, problem.num_replicas)
    if array.shape != shape:
        raise MappingError(f"mapping must have shape {shape} (stages × replicas), got {array.shape}")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise MappingError("mapping must hold integer device ids")
    array = array.astype(np.int64)
    bad = np.argwhere((array < 0) | (array >= problem.num_devices))
    if len(bad):
        s, r = bad[0]
        raise MappingError(f"mapping[{s}, {r}] = {array[s, r]}: no such device (0..{problem.num_devices - 1})")
    counts = np.bincount(array.reshape(-1), minlength=problem.num_devices)  # cheaper than np.unique: searches
    if counts.max(initial=0) > 1:  # score thousands of mappings
        raise MappingError(f"mapping uses device {int(np.argmax(counts > 1))} more than once")
    return array


def stage_times(problem: MappingProblem, mapping: Any, instantiation: str = FULL) -> np.ndarray:
    """[S, R] time of every stage replica under ``mapping`` [S, R] (row s: stage s's ring, in order).

    ``"p2p"``: eq. (6); ``"allreduce"``: eq. (7); ``"full"``: compute + eq. (8) + eq. (9); ``"auto"``:
    the instantiation :func:`choose_instantiation` picks. The sums run in the order the search adds in,
    so a search's bound and this value agree to the last bit.
    """
    mode = _resolve_instantiation(problem, instantiation, allow_full=True)
    return StageTimer(problem, mode).times(_check_mapping(problem, mapping))


def max_stage_time(problem: MappingProblem, mapping: Any, instantiation: str = FULL) -> float:
    """Eq. (5)'s objective: the largest of :func:`stage_times`."""
    return float(stage_times(problem, mapping, instantiation).max())


class StageTimer:
    """:func:`stage_times` of one problem and instantiation, its tables built once, for callers that score
    many mappings (a search). Eq. (8)'s sums run in rounds: round j adds the j-th pair (by pair index,
    :func:`stage_adjacency`'s order) of every stage that has one, so each stage's sum keeps its order and
    the times agree bit for bit with adding pair by pair. ``times`` does not check the mapping."""

    def __init__(self, problem: MappingProblem, instantiation: str) -> None:
        self.problem = problem
        self.mode = _resolve_instantiation(problem, instantiation, allow_full=True)
        self.rows = np.arange(problem.num_stages)[:, None]  # [S, 1]
        self.rounds: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (stages, other stages, bytes)
        if self.mode in (P2P, FULL):
            pairs, pair_bytes = problem.stage_pairs()
            adjacency = kernel.stage_adjacency(problem.num_stages, pairs)
            for j in range(max((len(a) for a in adjacency), default=0)):
                stages = [s for s, a in enumerate(adjacency) if len(a) > j]
                self.rounds.append((np.asarray(stages, dtype=np.int64),
                                    np.asarray([adjacency[s][j][1] for s in stages], dtype=np.int64),
                                    pair_bytes[[adjacency[s][j][0] for s in stages]][:, None]))
        self.rings = self.mode in (ALLREDUCE, FULL) and problem.num_replicas >= 2
        self.param_bytes = problem.param_bytes[:, None]  # [S, 1]
        self.no_ring = problem.param_bytes == 0

    def times(self, devices: np.ndarray) -> np.ndarray:
        """[S, R] stage times under the mapping ``devices`` [S, R] (int64, already valid)."""
        problem = self.problem
        bandwidth, latency = problem.bandwidth, problem.latency
        times = problem.stage_time[self.rows, problem.device_type[devices]]  # [S, R]
        for stages, others, nbytes in self.rounds:
            x, y = devices[stages], devices[others]  # [n, R]
            times[stages] = times[stages] + _p2p_seconds(nbytes, bandwidth[x, y], latency[x, y])
        if self.rings:
            ring_next = np.roll(devices, -1, axis=1)
            hops = _hop_seconds(self.param_bytes, problem.num_replicas, bandwidth[devices, ring_next],
                                latency[devices, ring_next])  # [S, R]
            hops[self.no_ring] = 0.0
            times = times + hops.max(axis=1, keepdims=True)
        return times

    def max_time(self, devices: np.ndarray) -> float:
        """Eq. (5)'s objective of ``devices`` [S, R]: the largest of :meth:`times`."""
        return float(self.times(devices).max())


# --------------------------------------------------------------------------------------- lower bounds


def _device_bounds(problem: MappingProblem, mode: str, tables: kernel.SearchTables) -> np.ndarray:
    """[S, D] the least time stage s can have on device d, whatever the rest of the mapping: the inner
    terms of eqs. (10) and (11).

    eq. (10): the adjacent stages go to distinct other devices (:func:`_p2p_vertex_bounds`; with zero
    latency this is Parmesan's "sorting-based approach", the largest message on the widest link).
    eq. (11): the two ring neighbours take the two cheapest hops, so the second cheapest bounds the ring.
    """
    if mode == P2P:
        return tables.p2p_bound
    if problem.num_replicas < 2:
        return tables.compute
    rank = 1 if problem.num_replicas >= 3 and problem.num_devices >= 3 else 0
    return tables.compute + np.sort(tables.hop, axis=2)[:, :, rank]


def initial_lower_bound(problem: MappingProblem, instantiation: str = AUTO) -> float:
    """Parmesan's t_l0: eq. (10) for ``"p2p"``, eq. (11) for ``"allreduce"``: max over stages of the
    least time the stage can have on any device."""
    mode = _resolve_instantiation(problem, instantiation, allow_full=False)
    bounds = _device_bounds(problem, mode, search_tables(problem))
    return float(bounds.min(axis=1).max())


def assignment_lower_bound(problem: MappingProblem, instantiation: str = AUTO) -> float:
    """A bound at least as tight as :func:`initial_lower_bound`: each of the S·R vertices needs its own
    device, so the optimum is at least the bottleneck assignment of vertices to devices under the
    per-device bounds of eqs. (10)/(11) (binary search over those values, a b-matching each step)."""
    mode = _resolve_instantiation(problem, instantiation, allow_full=False)
    return _assignment_bound(_device_bounds(problem, mode, search_tables(problem)), problem.num_replicas)


def _assignment_bound(bounds: np.ndarray, replicas: int) -> float:
    """Least τ such that every stage gets ``replicas`` distinct devices d with bounds[s, d] ≤ τ."""
    values = np.unique(bounds)
    low = int(np.searchsorted(values, bounds.min(axis=1).max()))
    high = len(values) - 1
    while low < high:
        mid = (low + high) // 2
        if _saturates(bounds <= values[mid], replicas):
            high = mid
        else:
            low = mid + 1
    return float(values[low])


def _saturates(allowed: np.ndarray, replicas: int) -> bool:
    """Can every stage take ``replicas`` devices among ``allowed`` [S, D], no device twice? (augmenting paths)"""
    num_stages, num_devices = allowed.shape
    options = [np.flatnonzero(row).tolist() for row in allowed]
    owner = [-1] * num_devices

    def augment(s: int, seen: list[bool]) -> bool:
        for d in options[s]:
            if seen[d]:
                continue
            seen[d] = True
            if owner[d] < 0 or augment(owner[d], seen):
                owner[d] = s
                return True
        return False

    for s in range(num_stages):
        if len(options[s]) < replicas:
            return False
        for _ in range(replicas):
            if not augment(s, [False] * num_devices):
                return False
    return True


# --------------------------------------------------------------------------------------- Algorithm 1


class MappingResult(NamedTuple):
    """The best mapping found and what is proven about it (times in seconds)."""

    mapping: np.ndarray  # [S, R] device of each stage replica; row s is stage s's all-reduce ring in order
    max_stage_time: float  # eq. (5) objective of ``mapping`` under ``instantiation``
    lower_bound: float  # proven: no mapping does better than this
    proven_optimal: bool  # lower_bound == max_stage_time
    gap: float  # (max_stage_time − lower_bound) / max_stage_time; 0 when proven
    solve_time_s: float
    nodes: int  # assignments tried by the inner searches, all together
    instantiation: str  # "p2p" (eq. 6) or "allreduce" (eq. 7)
    searches: int  # inner-level searches run (targets tried)
    heuristic: str  # which starting mapping gave the first upper bound: "cs", "p2p" or "random"


_SEARCH = {P2P: kernel.search_p2p, ALLREDUCE: kernel.search_allreduce}


def _decide(mode: str, tables: kernel.SearchTables, target: float, seconds: float) -> kernel.Decision:
    """One inner-level search with ``seconds`` to run (a top-level function, so that workers can run it)."""
    return _SEARCH[mode](tables, target, time.monotonic() + seconds)


def _upper_bound(problem: MappingProblem, mode: str, rng: np.random.Generator,
                 num_random: int) -> tuple[np.ndarray, float, str]:
    """Parmesan's t_r0: the better of the heuristic mappings (CS map, p2p map) and random mappings."""
    starts = [("cs", cs_map(problem)), ("p2p", p2p_map(problem))]
    starts += [("random", random_map(problem, rng)) for _ in range(num_random)]
    scored = [(max_stage_time(problem, mapping, mode), n, name, mapping) for n, (name, mapping) in enumerate(starts)]
    value, _, name, mapping = min(scored, key=lambda item: item[:2])
    return mapping, value, name


def _midpoint(low: float, high: float) -> float:
    """Geometric midpoint where both are positive (times span orders of magnitude), else arithmetic."""
    middle = math.sqrt(low * high) if low > 0 else 0.5 * (low + high)
    return min(max(middle, low), high)


def solve_mapping(problem: MappingProblem, *, instantiation: str = AUTO, time_limit: float = 60.0,
                  workers: int = 1, seed: int | np.random.Generator | None = 0,
                  num_random: int = 8) -> MappingResult:
    """Parmesan Algorithm 1: binary search on the target t, each step an exact inner search (Algorithm 2).

    The interval starts at [bound, heuristic]: the bound is the tighter of eq. (10)/(11) and the
    assignment bound, the heuristic the best of CS map, p2p map and ``num_random`` random mappings. A
    search that finds a mapping lowers the top to that mapping's time; one that proves there is none
    raises the bottom to its target. The targets are the values a stage time can take (listed when
    there are at most ``_CANDIDATE_LIMIT``), so the best mapping is proven optimal as soon as no such
    value lies between the two; otherwise the interval is bisected down to a relative 1e-9 and a last
    search just below the best time proves it.

    Tight targets prune hardest, so the first target is the bound itself (often optimal on regular
    topologies). A search may take 1/16 of ``time_limit``, twice that after each search that ran out
    (at most half the time left); after one runs out, the next targets go below and above the targets
    that ran out, in turn.
    After ``time_limit`` seconds the best mapping so far comes back with the proven bound and gap.
    ``workers`` > 1 runs that many targets at once, evenly dividing the interval, in parallel processes
    (Parmesan's enhancement); the answer is the same.
    """
    started = time.monotonic()
    mode = _resolve_instantiation(problem, instantiation, allow_full=False)
    if not (isinstance(time_limit, (int, float)) and time_limit > 0):
        raise MappingError(f"time_limit must be a positive number of seconds, got {time_limit!r}")
    if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 1:
        raise MappingError(f"workers must be a positive integer, got {workers!r}")
    rng = as_rng(seed)
    deadline = started + time_limit
    tables = search_tables(problem)
    low = _assignment_bound(_device_bounds(problem, mode, tables), problem.num_replicas)
    best, high, heuristic = _upper_bound(problem, mode, rng, num_random)
    state = _Bisection(low=low, high=high, best=best, heuristic=heuristic,
                       candidates=_candidate_times(tables, mode, low, high) if high > low else None,
                       first_share=time_limit / 16)
    pool = concurrent.futures.ProcessPoolExecutor(max_workers=workers) if workers > 1 else None
    try:
        while not state.proven():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            targets, share = state.next_targets(1 if pool is None else workers, left)
            if pool is None:
                decisions = [_decide(mode, tables, targets[0], share)]
            else:
                futures = [pool.submit(_decide, mode, tables, t, share) for t in targets]
                decisions = [f.result() for f in futures]
            for target, decision in zip(targets, decisions):
                value = (max_stage_time(problem, decision.mapping, mode)
                         if decision.status == kernel.FOUND else math.nan)
                state.record(target, decision, value)
            log.debug("mapping search: targets %s → [%g, %g], %d nodes", targets, state.low, state.high, state.nodes)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    low = min(state.low, state.high)
    proven = low >= state.high
    gap = 0.0 if proven or state.high <= 0 else (state.high - low) / state.high
    return MappingResult(
        mapping=np.asarray(state.best, dtype=np.int64),
        max_stage_time=float(state.high),
        lower_bound=float(state.high if proven else low),
        proven_optimal=proven,
        gap=float(gap),
        solve_time_s=time.monotonic() - started,
        nodes=state.nodes,
        instantiation=mode,
        searches=state.searches,
        heuristic=state.heuristic,
    )


class _Bisection:
    """The interval of Algorithm 1 and what the searches so far have shown.

    ``low``: no mapping is better (proven; strictly, once a search has failed at it); ``high``: the time
    of ``best``. ``candidates``: the sorted values a stage time can take, when few enough to list; the
    optimum is one of them, so the search is over once none lies between the two. Targets whose
    search ran out of time are remembered; after each such search the next target goes, in turn, below
    the lowest of them (a tighter target prunes harder, and often finds the optimum at once) and above
    the highest (a looser one finds a better mapping than the best so far sooner).
    """

    def __init__(self, *, low: float, high: float, best: np.ndarray, heuristic: str,
                 candidates: np.ndarray | None, first_share: float) -> None:
        self.low, self.high, self.best, self.heuristic = low, high, best, heuristic
        self.first_share = first_share  # seconds a search may take before any has run out of time
        self.candidates = candidates
        self.low_is_strict = False  # the optimum exceeds low (not only reaches it)
        self.timed_out: list[float] = []  # targets whose search ran out of time
        self.probed = False  # has the bound itself been tried?
        self.nodes = self.searches = 0

    def _open(self) -> np.ndarray:
        """The candidates the optimum may still be: between low and high."""
        above = self.candidates > self.low if self.low_is_strict else self.candidates >= self.low
        return self.candidates[above & (self.candidates < self.high)]

    def proven(self) -> bool:
        if self.high <= self.low:
            return True
        if self.candidates is not None and not len(self._open()):
            self.low = self.high
            return True
        return False

    def next_targets(self, count: int, left: float) -> tuple[list[float], float]:
        """The targets of the next round and the seconds each search may take."""
        # A search may take first_share, doubled for every search that ran out so far, at most half of
        # what is left (all of it for a round of parallel searches).
        share = min(self.first_share * 2 ** len(self.timed_out), 0.5 * left if count == 1 else left)
        if not self.probed:
            # The bound itself, within the bisection's tolerance: a bound added up in another order than
            # the stage times may sit a rounding step below the optimum it equals.
            self.probed = True
            return [min(self.low * (1.0 + _RTOL), math.nextafter(self.high, -math.inf))], share
        unknown = [t for t in self.timed_out if self.low < t < self.high]
        regions = [(self.low, self.high)]
        if unknown:  # below the lowest and above the highest timed-out target, in turn
            regions = [(self.low, min(unknown)), (max(unknown), self.high)]
            if len(self.timed_out) % 2 == 0:
                regions.reverse()
        for bottom, top in regions:
            targets = self._inside(bottom, top, count, strict_bottom=bool(unknown) and bottom > self.low)
            if targets:
                return targets, share
        # Every target left has run out of time once: try the largest value below the best with all
        # the time left (success proves the best optimal).
        if self.candidates is not None:
            return [float(self._open()[-1])], left
        return [math.nextafter(self.high, -math.inf)], left

    def _inside(self, bottom: float, top: float, count: int, *, strict_bottom: bool) -> list[float]:
        """Up to ``count`` targets evenly inside (bottom, top); none when nothing is left to try there."""
        if self.candidates is not None:
            values = self._open()
            values = values[(values > bottom if strict_bottom else values >= bottom) & (values < top)]
            if not len(values):
                return []
            # Split by value (not by count: the values crowd near the optimum, where searches are
            # hardest), then take the largest candidate at or below each split point.
            points = [_midpoint(values[0], top)] if count == 1 else _spread(values[0], top, count)
            picks = np.searchsorted(values, points, side="right") - 1
            return [float(t) for t in np.unique(values[np.maximum(picks, 0)])]
        if top - bottom <= _RTOL * top:
            return [] if strict_bottom else [math.nextafter(self.high, -math.inf)]
        return [_midpoint(bottom, top)] if count == 1 else _spread(bottom, top, count)

    def record(self, target: float, decision: kernel.Decision, value: float) -> None:
        self.nodes += decision.nodes
        self.searches += 1
        if decision.status == kernel.FOUND and value < self.high:
            self.best, self.high = decision.mapping, value
        elif decision.status == kernel.INFEASIBLE and target >= self.low:
            # No mapping has every stage ≤ target: the optimum lies above it (at the best, when the
            # target was the largest value below it).
            self.low = self.high if target == math.nextafter(self.high, -math.inf) else target
            self.low_is_strict = True
        elif decision.status == kernel.TIMEOUT:
            self.timed_out.append(target)


def _candidate_times(tables: kernel.SearchTables, mode: str, low: float, high: float) -> np.ndarray | None:
    """Sorted distinct values in [low, high) a stage time can take (None when there are too many to list).

    eq. (6): compute + one transfer per adjacent stage, summed in the search's order; eq. (7): a
    compute time of the stage plus one ring hop. Every mapping's maximum stage time is among them.
    """
    compute = tables.compute
    num_stages, num_devices = compute.shape
    chunks = []
    if mode == P2P:
        adj = kernel.stage_adjacency(num_stages, tables.pair_stages)
        if sum(num_devices ** (len(adj[s]) + 1) for s in range(num_stages)) > _CANDIDATE_LIMIT:
            return None
        for s in range(num_stages):
            value = compute[s].reshape((num_devices,) + (1,) * len(adj[s]))
            for a, (k, _) in enumerate(adj[s]):
                shape = [num_devices] + [1] * len(adj[s])
                shape[a + 1] = num_devices
                value = value + tables.transfer[k].reshape(shape)
            chunks.append(value[(value >= low) & (value < high)])
    else:
        levels = [np.unique(row) for row in compute]
        if tables.num_replicas == 1:
            chunks = levels
        else:
            if sum(len(c) for c in levels) * num_devices ** 2 > _CANDIDATE_LIMIT:
                return None
            for s, level in enumerate(levels):
                value = level[:, None, None] + tables.hop[s][None]
                chunks.append(value[(value >= low) & (value < high)])
    values = np.unique(np.concatenate([np.ravel(c) for c in chunks]))
    return values[(values >= low) & (values < high)]


def _spread(low: float, high: float, count: int) -> list[float]:
    """``count`` targets dividing [low, high] evenly (geometrically where low > 0)."""
    if low > 0:
        return [low * (high / low) ** (n / (count + 1)) for n in range(1, count + 1)]
    return [low + (high - low) * n / (count + 1) for n in range(1, count + 1)]
