"""Parmesan's operator-level partitioning (§IV): DP over downsets, then iterative refinement.

Three layers (STYLE item 8):

- **tables**: :func:`stage_tables` turns a DAG of K nodes and its downsets F_0 = ∅ … F_{D−1} = V into
  ``[D, D]`` arrays over pairs F' ⊂ F, the stage F − F' at micro-batch granularity:
  time eq. (3), t = Σ_v c_u(v) + λ · Σ bytes of the edges entering or leaving the stage, with
  λ = ``comm_scale`` (seconds per byte: 2 / bandwidth, as each boundary tensor crosses once forward and
  once back as a gradient; an edge that jumps over the stage does not touch it); memory split into a
  fixed part (parameters × 4 for Adam) and a per-micro-batch part (activations kept for backward plus
  the inputs received), the in-flight form of eq. (14);
- **kernel**: :func:`dp_over_downsets`, eq. (13) with a constant replica count R,
  T[F, s] = min over F' ⊂ F of max(T[F', s−1], t(F − F')), where a stage that does not fit device
  memory with the micro-batches it holds in flight at its position is infinite; it keeps the argmins
  and returns ``(cost, cuts)``;
- **drivers**: :func:`partition_parmesan` (clustering to K hyper-ops, DP, refinement) and
  :func:`partition_pipedream` (the same kernel over the prefixes of one topological order: contiguous
  chunks, as PipeDream's planner cuts a layer list). Profiling and simulation live elsewhere; the pipeline
  planner (:mod:`tag.exact.pipeline`) picks α by simulating.

**Refinement** (§IV-C, :func:`refine_partition`) moves single forward ops on a stage boundary to the
neighbouring stage. A move must keep every edge going forward (stage(u) ≤ stage(v)), leave its stage
non-empty and fit memory; among the valid ones the move of greatest lexicographic gain in
(1) Σ over boundary ops of their distance to the nearest reconverging op (an articulation point of the
undirected graph with in- or out-degree above one), (2) total bytes cut, (3) largest stage compute time
is taken, while its gain is positive. One guard is ours: a move may not raise the largest stage time of
eq. (3), so refinement never undoes the DP's objective. At most ``max_moves`` (I = 100) moves.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from tag.exact.clustering import cluster_operators, quotient_edges
from tag.exact.downsets import (
    DEFAULT_DOWNSET_LIMIT,
    DownsetLimitError,
    downsets,
    membership,
    subset_matrix,
)
from tag.exact.stage_graph import ForwardGraph, PartitionError, inflight_micro_batches

__all__ = [
    "StageTables",
    "stage_tables",
    "downset_tables",
    "dp_over_downsets",
    "cuts_to_stages",
    "refine_partition",
    "PartitionResult",
    "partition_parmesan",
    "partition_pipedream",
    "partition_objective",
    "COMM_CROSSINGS",
    "DEFAULT_MAX_MOVES",
]

log = logging.getLogger(__name__)

COMM_CROSSINGS = 2.0  # a boundary tensor crosses forward, and its gradient back
DEFAULT_MAX_MOVES = 100  # Parmesan §IV-C: I = 100


# ------------------------------------------------------------------------------------------- tables


@dataclass(frozen=True)
class StageTables:
    """Stage F_i − F_j for every pair j ⊂ i of D downsets; ``inf`` time where j is not a proper subset."""

    stage_time: np.ndarray  # [D, D] seconds per micro-batch
    memory_fixed: np.ndarray  # [D, D] bytes independent of the micro-batches in flight
    memory_per_micro_batch: np.ndarray  # [D, D] bytes per micro-batch in flight
    members: np.ndarray  # [D, K] bool


def stage_tables(members: np.ndarray, subset: np.ndarray, node_cost: np.ndarray, node_static: np.ndarray,
                 node_activation: np.ndarray, edge_src: np.ndarray, edge_dst: np.ndarray, edge_bytes: np.ndarray,
                 comm_scale: float) -> StageTables:
    """Tables of eq. (3) and the memory model over downsets given by ``members`` [D, K] and ``subset``
    [D, D] (``subset[i, j]``: downset j ⊂ downset i); node arrays [K], edge arrays [E]."""
    members = np.asarray(members, dtype=bool)
    cost = members @ np.asarray(node_cost, dtype=np.float64)  # [D]
    static = members @ np.asarray(node_static, dtype=np.float64)
    activation = members @ np.asarray(node_activation, dtype=np.float64)
    src_in = members[:, edge_src]  # [D, E]
    dst_in = members[:, edge_dst]
    weight = np.asarray(edge_bytes, dtype=np.float64)
    cut = (src_in & ~dst_in) @ weight  # [D] bytes leaving each downset
    # [i, j] bytes from F_j to outside F_i (edges that jump over the stage F_i − F_j)
    bypass = (~dst_in).astype(np.float64) @ (src_in * weight).T
    entering = np.subtract(cut[None, :], bypass, out=bypass)  # [i, j] bytes from F_j into F_i − F_j
    np.maximum(entering, 0.0, out=entering)
    stage_time = np.subtract.outer(cost, cost)
    stage_time += comm_scale * (entering + (cut[:, None] - cut[None, :]))  # leaving = cut_i − cut_j + entering
    stage_time += comm_scale * entering
    np.maximum(stage_time, 0.0, out=stage_time)
    np.putmask(stage_time, ~np.asarray(subset, dtype=bool), np.inf)
    memory_fixed = np.subtract.outer(static, static)
    per_micro_batch = np.subtract.outer(activation, activation)
    per_micro_batch += entering
    return StageTables(stage_time, memory_fixed, per_micro_batch, members)


def downset_tables(masks: Sequence[int], num_nodes: int, *args, **kwargs) -> StageTables:
    """:func:`stage_tables` over downsets given as bitmasks (ordered by size, as :func:`downsets` gives)."""
    return stage_tables(membership(masks, num_nodes), subset_matrix(masks, num_nodes), *args, **kwargs)


# ------------------------------------------------------------------------------------------- kernel


def dp_over_downsets(stage_time: np.ndarray, memory_fixed: np.ndarray, memory_per_micro_batch: np.ndarray,
                     inflight: np.ndarray, capacity: float) -> tuple[float, list[int] | None]:
    """Eq. (13): the least largest stage time over chains of S = len(inflight) stages.

    Downset 0 must be ∅ and D−1 the whole graph; ``stage_time[i, j]`` is ``inf`` unless j ⊂ i strictly.
    Stage s (0-based, from the input side) holds ``inflight[s]`` micro-batches and fits when
    ``memory_fixed + inflight[s] · memory_per_micro_batch <= capacity``. Returns ``(cost, cuts)`` with
    cuts the S + 1 downset indices 0 = c_0 < … < c_S = D − 1 (stage s is F_{c_{s+1}} − F_{c_s}), or
    ``(inf, None)`` when no chain fits.
    """
    num_downsets = stage_time.shape[0]
    num_stages = len(inflight)
    best = np.full(num_downsets, np.inf)  # [D] T[F, s] for the stages placed so far
    best[0] = 0.0
    choice = np.zeros((num_stages, num_downsets), dtype=np.int64)  # [S, D] argmin F' of each T[F, s]
    rows = np.arange(num_downsets)
    # Stages deeper in a 1F1B pipeline hold fewer micro-batches; equal counts share one mask.
    unconstrained = not np.isfinite(capacity)
    masked: dict[float, np.ndarray] = {}
    for s in range(num_stages):
        candidate = np.maximum(best[None, :], stage_time)  # [D, D]
        if not unconstrained:
            if inflight[s] not in masked:
                masked[inflight[s]] = memory_fixed + inflight[s] * memory_per_micro_batch > capacity
            candidate[masked[inflight[s]]] = np.inf
        choice[s] = np.argmin(candidate, axis=1)
        best = candidate[rows, choice[s]]
    cost = float(best[-1])
    if not np.isfinite(cost):
        return np.inf, None
    cuts = [num_downsets - 1]
    for s in range(num_stages - 1, -1, -1):
        cuts.append(int(choice[s, cuts[-1]]))
    return cost, cuts[::-1]


def cuts_to_stages(cuts: Sequence[int], members: np.ndarray) -> np.ndarray:
    """[K] stage of each node from the kernel's cuts and the downsets' ``members`` [D, K]."""
    stage = np.full(members.shape[1], -1, dtype=np.int64)
    for s in range(len(cuts) - 1):
        stage[members[cuts[s + 1]] & ~members[cuts[s]]] = s
    return stage


def partition_objective(stage: np.ndarray, node_cost: np.ndarray, edge_src: np.ndarray, edge_dst: np.ndarray,
                        edge_bytes: np.ndarray, comm_scale: float, num_stages: int | None = None) -> np.ndarray:
    """[S] eq. (3) stage times of a stage assignment [K] (the quantity the DP minimises the max of)."""
    num_stages = int(stage.max()) + 1 if num_stages is None else num_stages
    cost = np.bincount(stage, weights=node_cost, minlength=num_stages)
    a, b = stage[edge_src], stage[edge_dst]
    cross = a != b
    comm = np.bincount(a[cross], weights=edge_bytes[cross], minlength=num_stages) + \
        np.bincount(b[cross], weights=edge_bytes[cross], minlength=num_stages)
    return cost + comm_scale * comm


# ------------------------------------------------------------------------------------------- refinement


def _reconverging_distance(num_nodes: int, edge_src: np.ndarray, edge_dst: np.ndarray) -> np.ndarray:
    """[N] undirected hop distance to the nearest reconverging op (0 everywhere if there is none)."""
    import networkx as nx

    undirected = nx.Graph()
    undirected.add_nodes_from(range(num_nodes))
    undirected.add_edges_from(zip(edge_src.tolist(), edge_dst.tolist()))
    indegree = np.bincount(edge_dst, minlength=num_nodes)
    outdegree = np.bincount(edge_src, minlength=num_nodes)
    sources = [v for v in nx.articulation_points(undirected) if indegree[v] > 1 or outdegree[v] > 1]
    distance = np.zeros(num_nodes, dtype=np.int64)
    if not sources:
        return distance
    distance[:] = np.iinfo(np.int64).max // 4  # unreachable (another component): large, finite
    queue = deque(sources)
    distance[sources] = 0
    while queue:
        v = queue.popleft()
        for w in undirected.neighbors(v):
            if distance[w] > distance[v] + 1:
                distance[w] = distance[v] + 1
                queue.append(w)
    return distance


class _RefineState:
    """Per-stage sums that a single move updates in O(degree + S)."""

    def __init__(self, stage, node_cost, node_static, node_activation, edge_src, edge_dst, edge_bytes,
                 num_stages, comm_scale, distance):
        self.stage = stage
        self.cost, self.static, self.activation = node_cost, node_static, node_activation
        self.comm_scale = comm_scale
        self.distance = distance
        n = stage.size
        self.out_edges: list[list[tuple[int, float]]] = [[] for _ in range(n)]
        self.in_edges: list[list[tuple[int, float]]] = [[] for _ in range(n)]
        for a, b, w in zip(edge_src.tolist(), edge_dst.tolist(), edge_bytes.tolist()):
            self.out_edges[a].append((b, w))
            self.in_edges[b].append((a, w))
        self.stage_cost = np.bincount(stage, weights=node_cost, minlength=num_stages)
        self.stage_static = np.bincount(stage, weights=node_static, minlength=num_stages)
        self.stage_activation = np.bincount(stage, weights=node_activation, minlength=num_stages)
        self.count = np.bincount(stage, minlength=num_stages)
        a, b = stage[edge_src], stage[edge_dst]
        cross = a != b
        self.bytes_in = np.bincount(b[cross], weights=edge_bytes[cross], minlength=num_stages)
        self.bytes_out = np.bincount(a[cross], weights=edge_bytes[cross], minlength=num_stages)
        self.boundary = np.array([self._is_boundary(v, stage) for v in range(n)], dtype=bool)

    def _is_boundary(self, v: int, stage: np.ndarray) -> bool:
        s = stage[v]
        return any(stage[w] != s for w, _ in self.out_edges[v]) or any(stage[u] != s for u, _ in self.in_edges[v])

    def stage_time(self, cost, bytes_in, bytes_out) -> np.ndarray:
        return cost + self.comm_scale * (bytes_in + bytes_out)

    def evaluate(self, v: int, target: int):
        """(new bytes_in, new bytes_out, Δ cut bytes, Δ boundary distance) of moving v to ``target``."""
        stage = self.stage
        here = stage[v]
        bytes_in, bytes_out = self.bytes_in.copy(), self.bytes_out.copy()
        delta_cut = 0.0
        for w, weight in self.out_edges[v]:
            other = stage[w]
            if other != here:
                bytes_out[here] -= weight
                bytes_in[other] -= weight
                delta_cut -= weight
            if other != target:
                bytes_out[target] += weight
                bytes_in[other] += weight
                delta_cut += weight
        for u, weight in self.in_edges[v]:
            other = stage[u]
            if other != here:
                bytes_in[here] -= weight
                bytes_out[other] -= weight
                delta_cut -= weight
            if other != target:
                bytes_in[target] += weight
                bytes_out[other] += weight
                delta_cut += weight
        touched = {v, *(w for w, _ in self.out_edges[v]), *(u for u, _ in self.in_edges[v])}
        stage[v] = target
        after = sum(int(self.distance[x]) for x in touched if self._is_boundary(x, stage))
        stage[v] = here
        before = sum(int(self.distance[x]) for x in touched if self.boundary[x])
        return bytes_in, bytes_out, delta_cut, after - before

    def apply(self, v: int, target: int, bytes_in, bytes_out) -> None:
        here = self.stage[v]
        self.stage[v] = target
        for s, sign in ((here, -1.0), (target, 1.0)):
            self.stage_cost[s] += sign * self.cost[v]
            self.stage_static[s] += sign * self.static[v]
            self.stage_activation[s] += sign * self.activation[v]
            self.count[s] += int(sign)
        self.bytes_in, self.bytes_out = bytes_in, bytes_out
        for x in {v, *(w for w, _ in self.out_edges[v]), *(u for u, _ in self.in_edges[v])}:
            self.boundary[x] = self._is_boundary(x, self.stage)


def refine_partition(stage: np.ndarray, node_cost: np.ndarray, node_static: np.ndarray,
                     node_activation: np.ndarray, edge_src: np.ndarray, edge_dst: np.ndarray,
                     edge_bytes: np.ndarray, *, inflight: np.ndarray, capacity: float, comm_scale: float,
                     max_moves: int = DEFAULT_MAX_MOVES) -> tuple[np.ndarray, int]:
    """Parmesan §IV-C on a stage assignment [N] of N nodes; returns (refined assignment [N], moves made).

    Node arrays [N]: seconds per micro-batch, fixed bytes, bytes per micro-batch in flight; edges [E]
    with bytes per micro-batch. Rules and gains in the module docstring.
    """
    stage = np.array(stage, dtype=np.int64)
    num_stages = int(stage.max()) + 1
    distance = _reconverging_distance(stage.size, edge_src, edge_dst)
    state = _RefineState(stage, node_cost, node_static, node_activation, edge_src, edge_dst, edge_bytes,
                         num_stages, comm_scale, distance)
    scale_bytes = max(float(np.sum(edge_bytes)), 1.0) * 1e-12
    scale_time = max(float(np.sum(node_cost)), 1e-30) * 1e-12
    moves = 0
    while moves < max_moves:
        current = state.stage_time(state.stage_cost, state.bytes_in, state.bytes_out).max()
        best_gain, best_move = None, None
        for v in np.flatnonzero(state.boundary).tolist():
            here = int(stage[v])
            if state.count[here] == 1:
                continue
            low = max((stage[u] for u, _ in state.in_edges[v]), default=0)
            high = min((stage[w] for w, _ in state.out_edges[v]), default=num_stages - 1)
            for target in (here - 1, here + 1):
                if not (0 <= target < num_stages and low <= target <= high):
                    continue
                bytes_in, bytes_out, delta_cut, delta_distance = state.evaluate(v, target)
                cost = state.stage_cost.copy()
                cost[here] -= node_cost[v]
                cost[target] += node_cost[v]
                if state.stage_time(cost, bytes_in, bytes_out).max() > current + scale_time:
                    continue
                memory = state.stage_static[target] + node_static[v] + inflight[target] * (
                    state.stage_activation[target] + node_activation[v] + bytes_in[target])
                if memory > capacity:
                    continue
                gain_cut = -delta_cut if abs(delta_cut) > scale_bytes else 0.0
                gain_compute = state.stage_cost.max() - cost.max()
                gain_compute = gain_compute if abs(gain_compute) > scale_time else 0.0
                gain = (-delta_distance, gain_cut, gain_compute)
                if gain > (0, 0.0, 0.0) and (best_gain is None or gain > best_gain):
                    best_gain, best_move = gain, (v, target, bytes_in, bytes_out)
        if best_move is None:
            break
        state.apply(*best_move)
        moves += 1
    return state.stage, moves


# ------------------------------------------------------------------------------------------- drivers


@dataclass
class PartitionResult:
    """A cut of the forward graph into S stages and how it was found."""

    forward_stage: np.ndarray  # [F] stage of each forward node
    max_stage_time: float  # eq. (3) bottleneck of the final cut, seconds per micro-batch
    dp_cost: float  # the DP's optimum on the hyper-op graph (before refinement)
    info: dict[str, Any] = field(default_factory=dict)  # method, alpha, K, downsets, moves, timings


@dataclass(frozen=True)
class _Costs:
    """Per-node arrays of the forward graph at one micro-batch size on the reference GPU type."""

    cost: np.ndarray  # [F] seconds fwd + bwd
    static: np.ndarray  # [F] bytes
    activation: np.ndarray  # [F] bytes per micro-batch
    edge_bytes: np.ndarray  # [E] bytes per micro-batch


def _node_costs(fg: ForwardGraph, fraction: float, reference_type: int) -> _Costs:
    return _Costs(fg.compute_time(fraction, reference_type), fg.static_bytes(), fg.activation_bytes(fraction),
                  fg.edge_bytes(fraction))


def _check_request(fg: ForwardGraph, stages: int, replicas: int, micro_batches: int) -> None:
    for name, value in (("stages", stages), ("replicas", replicas), ("micro_batches", micro_batches)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise PartitionError(f"{name} must be a positive integer, got {value!r}")
    if stages > fg.num_nodes:
        raise PartitionError(f"cannot cut {fg.num_nodes} forward ops into {stages} non-empty stages")


def _infeasible(stages: int, capacity: float) -> PartitionError:
    return PartitionError(f"no cut into {stages} stages fits device memory ({capacity / 2**30:.3g} GiB per device); "
                          "use more stages, more replicas or more micro-batches")


def partition_parmesan(fg: ForwardGraph, *, stages: int, replicas: int = 1, micro_batches: int = 1,
                       capacity: float = np.inf, bandwidth: float, reference_type: int = 0,
                       num_hyper_ops: int | None = None, alpha: float = 1.0, refine: bool = True,
                       schedule: str = "1f1b", downset_limit: int = DEFAULT_DOWNSET_LIMIT,
                       max_moves: int = DEFAULT_MAX_MOVES, clusterings: dict | None = None) -> PartitionResult:
    """Parmesan's flow for one α: cluster to K hyper-ops, DP over their downsets, refine at op level.

    Stage times are per micro-batch of 1 / (M · R) of the graph's batch on ``gpu_types[reference_type]``;
    ``bandwidth`` (bytes/s) prices the boundary tensors. When the hyper-op graph has more than
    ``downset_limit`` downsets, K is lowered (by a quarter at a time) until it fits. ``clusterings``: a
    dict the caller keeps across calls on the same ``fg``, holding each clustering by what it depends on
    (M · R, the price, K, α, the capacity), so configurations that share them cluster once.
    """
    _check_request(fg, stages, replicas, micro_batches)
    timings: dict[str, float] = {}
    fraction = 1.0 / (micro_batches * replicas)
    costs = _node_costs(fg, fraction, reference_type)
    comm_scale = COMM_CROSSINGS / bandwidth
    inflight = inflight_micro_batches(stages, micro_batches, schedule)
    k = min(fg.num_nodes, num_hyper_ops or max(48, 3 * stages))
    while True:
        start = time.perf_counter()
        key = (micro_batches * replicas, reference_type, comm_scale, k, alpha, capacity)
        group = None if clusterings is None else clusterings.get(key)
        if group is None:
            group = cluster_operators(fg.num_nodes, fg.edge_src, fg.edge_dst, node_cost=costs.cost,
                                      edge_comm=costs.edge_bytes * comm_scale, num_clusters=k, alpha=alpha,
                                      node_memory=costs.static + costs.activation, memory_limit=capacity)
            if clusterings is not None:
                clusterings[key] = group
        timings["clustering_s"] = time.perf_counter() - start
        start = time.perf_counter()
        num_groups = int(group.max()) + 1
        q_src, q_dst, q_bytes = quotient_edges(group, fg.edge_src, fg.edge_dst, costs.edge_bytes)
        try:
            masks = downsets(num_groups, q_src, q_dst, limit=downset_limit)
        except DownsetLimitError as error:
            if k <= stages:
                raise
            log.info("%s; retrying with K = %d", error, max(stages, (3 * k) // 4))
            k = max(stages, (3 * k) // 4)
            continue
        break
    if num_groups < stages:
        raise PartitionError(f"clustering left {num_groups} hyper-ops, fewer than {stages} stages")
    tables = downset_tables(masks, num_groups, *(np.bincount(group, weights=x, minlength=num_groups)
                                                 for x in (costs.cost, costs.static, costs.activation)),
                            q_src, q_dst, q_bytes, comm_scale)
    dp_cost, cuts = dp_over_downsets(tables.stage_time, tables.memory_fixed, tables.memory_per_micro_batch,
                                     inflight, capacity)
    timings["dp_s"] = time.perf_counter() - start
    if cuts is None:
        raise _infeasible(stages, capacity)
    forward_stage = cuts_to_stages(cuts, tables.members)[group]
    moves = 0
    if refine and stages > 1:
        start = time.perf_counter()
        forward_stage, moves = refine_partition(forward_stage, costs.cost, costs.static, costs.activation,
                                                fg.edge_src, fg.edge_dst, costs.edge_bytes, inflight=inflight,
                                                capacity=capacity, comm_scale=comm_scale, max_moves=max_moves)
        timings["refine_s"] = time.perf_counter() - start
    final = partition_objective(forward_stage, costs.cost, fg.edge_src, fg.edge_dst, costs.edge_bytes,
                                comm_scale, stages)
    info = {"method": "parmesan", "alpha": alpha, "hyper_ops": num_groups, "downsets": len(masks),
            "refine_moves": moves, **timings}
    return PartitionResult(forward_stage, float(final.max()), dp_cost, info)


def partition_pipedream(fg: ForwardGraph, *, stages: int, replicas: int = 1, micro_batches: int = 1,
                        capacity: float = np.inf, bandwidth: float, reference_type: int = 0,
                        schedule: str = "1f1b") -> PartitionResult:
    """Contiguous chunks of the forward ops in one topological order (the ``forward_ops`` order), by the
    same kernel over the F + 1 prefixes of that order."""
    _check_request(fg, stages, replicas, micro_batches)
    start = time.perf_counter()
    costs = _node_costs(fg, 1.0 / (micro_batches * replicas), reference_type)
    comm_scale = COMM_CROSSINGS / bandwidth
    n = fg.num_nodes
    members = np.arange(n + 1)[:, None] > np.arange(n)[None, :]  # prefix d holds nodes 0..d-1
    subset = np.arange(n + 1)[None, :] < np.arange(n + 1)[:, None]
    tables = stage_tables(members, subset, costs.cost, costs.static, costs.activation, fg.edge_src, fg.edge_dst,
                          costs.edge_bytes, comm_scale)
    cost, cuts = dp_over_downsets(tables.stage_time, tables.memory_fixed, tables.memory_per_micro_batch,
                                  inflight_micro_batches(stages, micro_batches, schedule), capacity)
    if cuts is None:
        raise _infeasible(stages, capacity)
    forward_stage = cuts_to_stages(cuts, members)
    return PartitionResult(forward_stage, cost, cost, {"method": "pipedream", "downsets": n + 1,
                                                      "dp_s": time.perf_counter() - start})
