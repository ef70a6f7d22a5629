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
from networkx.utils import UnionFind

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
    alive = [True] * num_nodes  # [N] not yet fused into another node: the node that stands for its hyper-op
    fused = UnionFind(range(num_nodes))  # the hyper-op of every node
    version = [0] * num_nodes
    remaining = num_nodes
    heap: list[tuple[float, int, int, int, int]] = []

    def push(u: int, v: int) -> None:
        score = cost[u] + cost[v] - alpha * succ[u][v]
        heap.append((score, u, v, version[u], version[v]))

    for u in range(num_nodes):
        for v in succ[u]:
            push(u, v)
    heapq.heapify(heap)
    while remaining > num_clusters and heap:
        _, u, v, ver_u, ver_v = heapq.heappop(heap)
        if not (alive[u] and alive[v]) or version[u] != ver_u or version[v] != ver_v or v not in succ[u]:
            continue
        if memory[u] + memory[v] > memory_limit or _other_path(succ, u, v):
            continue
        _fuse(u, v, succ, pred, cost, memory)
        alive[v] = False
        fused.union(u, v)
        version[u] += 1
        remaining -= 1
        for w in succ[u]:
            heapq.heappush(heap, (cost[u] + cost[w] - alpha * succ[u][w], u, w, version[u], version[w]))
        for p in pred[u]:
            heapq.heappush(heap, (cost[p] + cost[u] - alpha * succ[p][u], p, u, version[p], version[u]))
    if remaining > num_clusters:
        log.info("operator clustering stopped at %d hyper-ops (asked for %d): no convex, memory-feasible "
                 "adjacent pair is left", alive, num_clusters)
    return _topological_ids(num_nodes, src, dst, fused, alive)


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


def _fuse(u: int, v: int, succ, pred, cost, memory) -> None:
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
    cost[u] += cost[v]
    memory[u] += memory[v]


def _topological_ids(num_nodes: int, src: np.ndarray, dst: np.ndarray, fused: UnionFind,
                     alive: list[bool]) -> np.ndarray:
    """[N] hyper-op id of each node: hyper-ops first numbered by the node that stands for each (the one
    never fused into another), then renumbered in a least-first topological order of their DAG."""
    standing = {fused[u]: u for u in range(num_nodes) if alive[u]}  # the set's representative -> its node
    roots = np.array([standing[fused[v]] for v in range(num_nodes)], dtype=np.int64)
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
