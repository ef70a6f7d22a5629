"""Parmesan's operator clustering (§IV-B): merge adjacent ops into K hyper-ops before the DP.

Starting from the op DAG, repeatedly fuse the adjacent pair (u, v), u → v, of least

    cost(u, v) = c(u) + c(v) − α · c_m(u, v)                                       (eq. 4)

among the pairs whose fusion is **convex** (no other path u ⇝ v, so the hyper-op graph stays a DAG) and
**memory-feasible** (the fused hyper-op fits ``memory_limit``), until K hyper-ops are left. c is a
node's compute time, c_m the communication time of the edges between the two; α trades balance
(small α: fuse the lightest pair) against cut (large α: fuse the pair joined by the most bytes).

Candidate pairs sit in a heap stamped with the versions of their two ends. Fusing changes only the
fused node, so a stale entry is skipped and the pairs around the fused node are pushed again; a pair
that is not convex or does not fit stays that way until one of its ends changes, so it is dropped
until then. The convexity test is a depth-first search from u's other successors towards v.
"""

from __future__ import annotations

import heapq
import logging
from typing import Sequence

import numpy as np

from tag._arrays import least_first_order
from tag.exact.stage_graph import PartitionError

__all__ = ["cluster_operators", "ALPHAS", "is_convex", "quotient_edges"]

log = logging.getLogger(__name__)

ALPHAS = (0.01, 1.0, 100.0)  # Parmesan §IV-B: α is picked from these by the pipeline simulator


def cluster_operators(num_nodes: int, edge_src: Sequence[int], edge_dst: Sequence[int], *,
                      node_cost: Sequence[float], edge_comm: Sequence[float], num_clusters: int,
                      alpha: float = 1.0, node_memory: Sequence[float] | None = None,
                      memory_limit: float = float("inf")) -> np.ndarray:
    """[N] hyper-op id of each node, ids 0..K'-1 in a topological order of the hyper-op DAG.

    ``node_cost`` [N] seconds, ``edge_comm`` [E] seconds, ``node_memory`` [N] bytes (fused memory is the
    sum). K' is ``num_clusters`` unless no convex, feasible adjacent pair is left first (then K' > K).
    """
    src = np.asarray(edge_src, dtype=np.int64).reshape(-1)
    dst = np.asarray(edge_dst, dtype=np.int64).reshape(-1)
    comm = np.asarray(edge_comm, dtype=np.float64).reshape(-1)
    cost = [float(c) for c in np.asarray(node_cost, dtype=np.float64).reshape(-1)]
    memory = [0.0] * num_nodes if node_memory is None else [float(m) for m in np.asarray(node_memory).reshape(-1)]
    if len(cost) != num_nodes or len(memory) != num_nodes or comm.shape != src.shape or dst.shape != src.shape:
        raise PartitionError("cluster_operators: node and edge arrays disagree in length")
    if num_clusters < 1:
        raise PartitionError(f"num_clusters must be at least 1, got {num_clusters}")
    succ: list[dict[int, float]] = [{} for _ in range(num_nodes)]
    pred: list[dict[int, float]] = [{} for _ in range(num_nodes)]
    for a, b, w in zip(src.tolist(), dst.tolist(), comm.tolist()):
        if a != b:
            succ[a][b] = succ[a].get(b, 0.0) + w
            pred[b][a] = pred[b].get(a, 0.0) + w
    leader = list(range(num_nodes))  # union-find parent
    version = [0] * num_nodes
    alive = num_nodes
    heap: list[tuple[float, int, int, int, int]] = []

    def push(u: int, v: int) -> None:
        score = cost[u] + cost[v] - alpha * succ[u][v]
        heap.append((score, u, v, version[u], version[v]))

    for u in range(num_nodes):
        for v in succ[u]:
            push(u, v)
    heapq.heapify(heap)
    while alive > num_clusters and heap:
        _, u, v, ver_u, ver_v = heapq.heappop(heap)
        if leader[u] != u or leader[v] != v or version[u] != ver_u or version[v] != ver_v or v not in succ[u]:
            continue
        if memory[u] + memory[v] > memory_limit or _other_path(succ, u, v):
            continue
        _fuse(u, v, succ, pred, leader, cost, memory)
        version[u] += 1
        alive -= 1
        for w in succ[u]:
            heapq.heappush(heap, (cost[u] + cost[w] - alpha * succ[u][w], u, w, version[u], version[w]))
        for p in pred[u]:
            heapq.heappush(heap, (cost[p] + cost[u] - alpha * succ[p][u], p, u, version[p], version[u]))
    if alive > num_clusters:
        log.info("operator clustering stopped at %d hyper-ops (asked for %d): no convex, memory-feasible "
                 "adjacent pair is left", alive, num_clusters)
    return _topological_ids(num_nodes, src, dst, leader)


def _find(leader: list[int], v: int) -> int:
    root = v
    while leader[root] != root:
        root = leader[root]
    while leader[v] != root:
        leader[v], v = root, leader[v]
    return root


def _other_path(succ: list[dict[int, float]], u: int, v: int) -> bool:
    """Whether some path u ⇝ v other than the edge u → v exists."""
    stack = [w for w in succ[u] if w != v]
    seen = set(stack)
    while stack:
        w = stack.pop()
        for x in succ[w]:
            if x == v:
                return True
            if x not in seen:
                seen.add(x)
                stack.append(x)
    return False


def _fuse(u: int, v: int, succ, pred, leader, cost, memory) -> None:
    """Fuse v into u (u → v); edges of v move to u, weights of parallel edges add up."""
    del succ[u][v]
    del pred[v][u]
    for w, weight in succ[v].items():
        del pred[w][v]
        succ[u][w] = succ[u].get(w, 0.0) + weight
        pred[w][u] = pred[w].get(u, 0.0) + weight
    for p, weight in pred[v].items():
        del succ[p][v]
        succ[p][u] = succ[p].get(u, 0.0) + weight
        pred[u][p] = pred[u].get(p, 0.0) + weight
    succ[v], pred[v] = {}, {}
    leader[v] = u
    cost[u] += cost[v]
    memory[u] += memory[v]


def _topological_ids(num_nodes: int, src: np.ndarray, dst: np.ndarray, leader: list[int]) -> np.ndarray:
    roots = np.array([_find(leader, v) for v in range(num_nodes)], dtype=np.int64)
    unique, group = np.unique(roots, return_inverse=True)
    q_src, q_dst = quotient_edges(group, src, dst)
    count = unique.size
    order, placed = least_first_order(count, q_src, q_dst)
    if placed != count:  # cannot happen: every fusion was convex
        raise PartitionError("operator clustering produced a cyclic hyper-op graph")
    rank = np.empty(count, dtype=np.int64)
    rank[order] = np.arange(count)
    return rank[group]


def quotient_edges(group: np.ndarray, src: np.ndarray, dst: np.ndarray,
                   weight: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
    """Distinct (src, dst) group pairs of the edges between different groups; with ``weight`` [E],
    also the summed weight of each pair."""
    a, b = group[src], group[dst]
    cross = a != b
    num = int(group.max()) + 1 if group.size else 0
    pairs, inverse = np.unique(a[cross] * num + b[cross], return_inverse=True)
    if weight is None:
        return pairs // max(num, 1), pairs % max(num, 1)
    return pairs // max(num, 1), pairs % max(num, 1), np.bincount(inverse, weights=weight[cross], minlength=pairs.size)


def is_convex(members: np.ndarray, num_nodes: int, src: np.ndarray, dst: np.ndarray) -> bool:
    """Whether the node set ``members`` [N] bool is convex: no path leaves it and comes back."""
    members = np.asarray(members, dtype=bool)
    succ: list[list[int]] = [[] for _ in range(num_nodes)]
    for a, b in zip(np.asarray(src).tolist(), np.asarray(dst).tolist()):
        succ[a].append(b)
    # Nodes reachable from the set through at least one outside node must all be outside it.
    stack = [w for v in np.flatnonzero(members) for w in succ[v] if not members[w]]
    seen = set(stack)
    while stack:
        w = stack.pop()
        for x in succ[w]:
            if members[x]:
                return False
            if x not in seen:
                seen.add(x)
                stack.append(x)
    return True
