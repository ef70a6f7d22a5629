"""Turn any partition of a DAG into one whose quotient is a DAG, and the baselines to compare it with.

METIS partitions the graph made undirected, so its parts are not convex: in a training graph the
forward and the backward of one layer usually share a part, and two such parts A (early layers) and
B (late layers) give A → B (activations) and B → A (gradients), a cycle between groups that no
pipeline or placement planner can schedule as two tasks. :func:`repair_acyclic` fixes a partition in
two steps:

1. **Split** every part by its *crossing rank*: visit the nodes in a topological order and give each
   node v the rank r(v) = max over predecessors u of r(u) if u is in v's part, r(u) + 1 otherwise
   (0 for a source). Pieces are the (part, rank) pairs. Every edge between two pieces goes from a
   lower rank to a strictly higher one, so the pieces form a DAG. The rank is the least that does
   this: a part is split only where a path leaves it and comes back.
2. **Merge** pieces back while keeping a DAG. Two groups X and Y can be merged iff no path runs
   from one to the other through a third group; that is read off a reachability matrix kept up to
   date after each merge. First, pieces of the same original part are merged back wherever this is
   allowed, the pair joined by the most bytes first (undoing splits that were not needed; the merged
   group is no heavier than the part METIS balanced). Then, while there are more than ``max_groups``
   groups, the allowed adjacent pair of least combined weight is merged (ties: most bytes between
   them), in the spirit of Parmesan's operator clustering (§IV-B); if no adjacent pair may merge,
   the two lightest-combined groups that are consecutive in a topological order do (always allowed).

Splitting only adds cut edges and merging only removes them, so the result's cut is METIS's cut plus
what the splits of step 1 had to add and step 2 could not take back.

Groups are numbered in a topological order of the group DAG (ties by their first node in the input
order), so ``group[u] <= group[v]`` for every edge u → v.

:func:`refine_acyclic` then moves single nodes between groups where that cuts fewer bytes, without
leaving that order (a node may go to any group between its predecessors' and its successors'), and
:func:`topological_chunks` is the naive grouping both are compared with.
"""

from __future__ import annotations

import heapq
from typing import NamedTuple

import numpy as np

from tag._arrays import csr_by_key, least_first_order
from tag._compiled import jit, kahn_least_first, successor_lists
from tag.errors import GraphError
from tag.grouping.errors import GroupingError

__all__ = ["repair_acyclic", "refine_acyclic", "RepairStats", "topological_chunks", "edge_cut", "quotient_is_dag",
           "quotients_are_dags", "dag_order"]


class RepairStats(NamedTuple):
    """What :func:`repair_acyclic` did."""

    parts: int  # non-empty parts in the input partition
    pieces: int  # pieces after splitting by crossing rank
    same_part_merges: int  # pieces merged back into their part
    extra_merges: int  # merges of pieces from different parts, to reach max_groups
    groups: int  # groups in the result


def dag_order(num_nodes: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """[K] Kahn's topological order of a DAG given by edge lists (ties by node index); GraphError on a cycle or
    an edge with an end outside the K nodes."""
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    ends = np.concatenate([src, dst])
    if src.shape != dst.shape or (ends.size and (ends.min() < 0 or ends.max() >= num_nodes)):
        raise GraphError(f"dag_order: every edge must join two of the nodes 0..{num_nodes - 1} "
                         f"({src.size} sources, {dst.size} targets)")
    order, placed = least_first_order(num_nodes, src, dst)
    if placed != num_nodes:
        raise GraphError(f"graph has a cycle through {num_nodes - placed} of its {num_nodes} nodes")
    return order


def quotient_is_dag(src: np.ndarray, dst: np.ndarray, labels: np.ndarray) -> bool:
    """Whether contracting each label class of a graph's nodes gives a DAG (self loops ignored); GroupingError
    on a negative label."""
    return bool(quotients_are_dags([0, np.size(labels)], [0, np.size(src)], src, dst, labels, [0])[0])


def quotients_are_dags(node_ptr: np.ndarray, edge_ptr: np.ndarray, src: np.ndarray, dst: np.ndarray,
                       labels: np.ndarray, which: np.ndarray) -> np.ndarray:
    """[len(which)] :func:`quotient_is_dag` of each graph ``which[i]`` of a batch: graph k has the nodes
    ``node_ptr[k]:node_ptr[k+1]`` (their ``labels``) and the edges ``edge_ptr[k]:edge_ptr[k+1]`` of ``src``
    and ``dst``, which number its nodes from 0. One compiled call for the batch."""
    labels = np.asarray(labels, dtype=np.int64)
    if labels.size and labels.min() < 0:
        raise GroupingError(f"quotients_are_dags: labels must be non-negative, got {int(labels.min())}")
    return _quotients_are_dags(np.asarray(node_ptr, dtype=np.int64), np.asarray(edge_ptr, dtype=np.int64),
                               np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64), labels,
                               np.asarray(which, dtype=np.int64))


@jit
def _quotients_are_dags(node_ptr, edge_ptr, src, dst, labels, which):
    out = np.empty(which.size, dtype=np.bool_)
    for i in range(which.size):
        k = which[i]
        graph_labels = labels[node_ptr[k]:node_ptr[k + 1]]
        num = graph_labels.max() + 1 if graph_labels.size else 0
        out[i] = _quotient_is_dag(src[edge_ptr[k]:edge_ptr[k + 1]], dst[edge_ptr[k]:edge_ptr[k + 1]], graph_labels,
                                  num)
    return out


@jit
def _quotient_is_dag(src, dst, labels, num):
    """:func:`quotient_is_dag` over ``num`` labels: Kahn's algorithm over the edges between classes."""
    a, b = labels[src], labels[dst]
    cross = a != b
    ptr, succ, _, indegree = successor_lists(num, b[cross], a[cross], np.empty(0))
    return kahn_least_first(ptr, succ, indegree)[1] == num


def edge_cut(src: np.ndarray, dst: np.ndarray, edge_bytes: np.ndarray, labels: np.ndarray) -> float:
    """Bytes on the edges whose ends have different labels."""
    labels = np.asarray(labels)
    return float(np.asarray(edge_bytes)[labels[src] != labels[dst]].sum())


def topological_chunks(order: np.ndarray, weight: np.ndarray, num_groups: int) -> np.ndarray:
    """[K] group of each node when a topological ``order`` is cut into ``num_groups`` runs of about equal
    ``weight`` (the naive baseline). Runs of a topological order always form a DAG; a node goes to the
    run its weight midpoint falls in, so zero-weight nodes follow their predecessor in the order."""
    order = np.asarray(order, dtype=np.int64)
    weight = np.asarray(weight, dtype=np.float64)[order]
    if weight.sum() <= 0:
        weight = np.ones_like(weight)
    before = np.cumsum(weight) - weight
    midpoint = (before + weight / 2) / weight.sum()
    run = np.minimum((midpoint * num_groups).astype(np.int64), num_groups - 1)
    _, run = np.unique(run, return_inverse=True)  # drop empty runs
    labels = np.empty(order.size, dtype=np.int64)
    labels[order] = run
    return labels


def repair_acyclic(num_nodes: int, src: np.ndarray, dst: np.ndarray, edge_bytes: np.ndarray,
                   weight: np.ndarray, part: np.ndarray, *, max_groups: int) -> tuple[np.ndarray, RepairStats]:
    """[K] group of each node of a DAG, such that the groups form a DAG, from any partition ``part`` [K].

    ``src``, ``dst``, ``edge_bytes``: [E] edges (parallel edges allowed) of a DAG over K nodes;
    ``weight`` [K] node weights (compute time); at most ``max_groups`` groups result. See the module
    docstring for the method. GraphError if the input graph has a cycle.
    """
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    edge_bytes = np.asarray(edge_bytes, dtype=np.float64)
    weight = np.asarray(weight, dtype=np.float64)
    part = np.asarray(part, dtype=np.int64)
    if max_groups < 1:
        raise GroupingError(f"max_groups must be at least 1, got {max_groups}")
    order = dag_order(num_nodes, src, dst)
    if num_nodes == 0:
        return np.zeros(0, dtype=np.int64), RepairStats(0, 0, 0, 0, 0)
    piece, piece_rank = _split_by_crossing_rank(num_nodes, src, dst, part, order)
    num_pieces = int(piece.max()) + 1
    state = _MergeState.build(piece, piece_rank, src, dst, edge_bytes, weight, part)
    same_part = state.merge_same_parts()
    extra = state.merge_down_to(max_groups)
    group = state.labels()[piece]
    # Renumber groups in a topological order (ancestors count), ties by first node in input order.
    ancestors = state.ancestor_counts()
    first = np.full(int(group.max()) + 1, num_nodes, dtype=np.int64)
    np.minimum.at(first, group, np.arange(num_nodes))
    rank = np.lexsort((first, ancestors[state.alive_ids()]))
    renumber = np.empty_like(rank)
    renumber[rank] = np.arange(rank.size)
    group = renumber[group]
    stats = RepairStats(parts=int(np.unique(part).size), pieces=num_pieces, same_part_merges=same_part,
                        extra_merges=extra, groups=int(rank.size))
    return group, stats


def _split_by_crossing_rank(num_nodes: int, src: np.ndarray, dst: np.ndarray, part: np.ndarray,
                            order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Piece [K] of each node (0..P-1) and the crossing rank [P] of each piece (module docstring, step 1)."""
    pred_ptr, by_target = csr_by_key(num_nodes, dst)
    pred = src[by_target].tolist()
    ptr = pred_ptr.tolist()
    part_list = part.tolist()
    rank = [0] * num_nodes
    for v in order.tolist():
        r, pv = 0, part_list[v]
        for u in pred[ptr[v] : ptr[v + 1]]:
            ru = rank[u] if part_list[u] == pv else rank[u] + 1
            if ru > r:
                r = ru
        rank[v] = r
    rank_arr = np.asarray(rank, dtype=np.int64)
    keys = part * (int(rank_arr.max()) + 1) + rank_arr
    unique_keys, piece = np.unique(keys, return_inverse=True)
    return piece.astype(np.int64), unique_keys % (int(rank_arr.max()) + 1)


class _MergeState:
    """Pieces being merged: weights, part labels, byte adjacency and reachability over the P pieces."""

    def __init__(self, weight: np.ndarray, part: np.ndarray, adjacency: np.ndarray, linked: np.ndarray,
                 reach: np.ndarray) -> None:
        self.weight = weight  # [P] float
        self.part = part  # [P] original part of the piece (of its first member)
        self.adjacency = adjacency  # [P, P] bytes between two pieces, both directions summed
        self.linked = linked  # [P, P] bool, an edge between the two pieces in either direction
        self.reach = reach  # [P, P] bool, reach[a, b]: a path of length >= 1 from a to b
        self.alive = np.ones(weight.size, dtype=bool)
        self.parent = np.arange(weight.size)

    @classmethod
    def build(cls, piece, piece_rank, src, dst, edge_bytes, weight, part) -> _MergeState:
        num = int(piece.max()) + 1
        piece_weight = np.bincount(piece, weights=weight, minlength=num)
        piece_part = np.zeros(num, dtype=np.int64)
        piece_part[piece] = part
        a, b = piece[src], piece[dst]
        cross = a != b
        adjacency = np.zeros((num, num), dtype=np.float32)  # O(P²) memory: ~1800 pieces for 20k random ops
        np.add.at(adjacency, (a[cross], b[cross]), edge_bytes[cross])
        adjacency = adjacency + adjacency.T
        direct = np.zeros((num, num), dtype=bool)  # not adjacency > 0: a tensor may have 0 bytes
        direct[a[cross], b[cross]] = True
        # Edges go to strictly higher crossing ranks: descending rank is a reverse topological order.
        reach = np.zeros((num, num), dtype=bool)
        for p in np.argsort(-piece_rank, kind="stable"):
            successors = np.flatnonzero(direct[p])
            if successors.size:
                reach[p] = direct[p] | reach[successors].any(axis=0)
        return cls(piece_weight, piece_part, adjacency, direct | direct.T, reach)

    def can_merge(self, x: int, y: int) -> bool:
        """No path between x and y through a third group (else the merged group would sit on a cycle)."""
        return not ((self.reach[x] & self.reach[:, y]).any() or (self.reach[y] & self.reach[:, x]).any())

    def merge(self, x: int, y: int) -> None:
        """Fold y into x."""
        self.weight[x] += self.weight[y]
        self.weight[y] = 0.0
        self.adjacency[x] += self.adjacency[y]
        self.adjacency[:, x] += self.adjacency[:, y]
        self.adjacency[y] = 0.0
        self.adjacency[:, y] = 0.0
        self.adjacency[x, x] = 0.0
        self.linked[x] |= self.linked[y]
        self.linked[:, x] |= self.linked[:, y]
        self.linked[y] = False
        self.linked[:, y] = False
        self.linked[x, x] = False
        reaching = self.reach[:, x] | self.reach[:, y]
        reached = self.reach[x] | self.reach[y]
        reaching[[x, y]] = False
        reached[[x, y]] = False
        self.reach[reaching] |= reached  # a path into x or y now continues out of either
        self.reach[x] = reached
        self.reach[:, x] = reaching
        self.reach[y] = False
        self.reach[:, y] = False
        self.alive[y] = False
        self.parent[y] = x

    def merge_same_parts(self) -> int:
        """Merge pieces of one original part wherever allowed, most bytes between them first.

        Passes over the same-part pairs (ordered at the start of each pass) until one merges nothing:
        a merge can make another pair mergeable by absorbing the group that stood between them.
        """
        merges = 0
        while True:
            ids = self.alive_ids()
            same = self.part[ids][:, None] == self.part[ids][None, :]
            xs, ys = np.nonzero(np.triu(same, k=1))
            x, y = ids[xs], ids[ys]
            merged = 0
            for k in np.lexsort((self.weight[x] + self.weight[y], -self.adjacency[x, y])).tolist():
                a, b = self.find(int(x[k])), self.find(int(y[k]))
                if a != b and self.can_merge(a, b):
                    self.merge(min(a, b), max(a, b))
                    merged += 1
            merges += merged
            if not merged:
                return merges

    def merge_down_to(self, max_groups: int) -> int:
        """Merge allowed pairs, lightest combined first, until at most ``max_groups`` groups remain.

        Candidate pairs (linked groups) sit in a heap keyed by (combined weight, -bytes), stale entries
        are skipped by version stamps; a pair that may not merge is set aside and tried again only
        when the heap runs dry. If no linked pair may merge, the lightest pair of groups consecutive in
        a topological order merges (always allowed: no third group lies between them).
        """
        version = np.zeros(self.weight.size, dtype=np.int64)
        heap: list[tuple[float, float, int, int, int, int]] = []

        def push(a: int, b: int) -> None:
            a, b = min(a, b), max(a, b)
            heapq.heappush(heap, (float(self.weight[a] + self.weight[b]), -float(self.adjacency[a, b]), a, b,
                                  int(version[a]), int(version[b])))

        def merge(a: int, b: int) -> None:
            self.merge(a, b)
            version[a] += 1
            for c in np.flatnonzero(self.linked[a] & self.alive).tolist():
                push(a, c)

        ids = self.alive_ids()
        for i, j in zip(*np.nonzero(np.triu(self.linked[np.ix_(ids, ids)], k=1))):
            push(int(ids[i]), int(ids[j]))
        blocked: list[tuple[int, int]] = []
        retry = False
        merges = 0
        while self.alive.sum() > max_groups:
            if not heap and blocked and retry:
                for a, b in blocked:
                    if self.alive[a] and self.alive[b]:
                        push(a, b)
                blocked, retry = [], False
            if not heap:
                ids = self.alive_ids()
                topo = ids[np.argsort(self.ancestor_counts()[ids], kind="stable")]
                k = int(np.argmin(self.weight[topo[:-1]] + self.weight[topo[1:]]))
                merge(int(min(topo[k], topo[k + 1])), int(max(topo[k], topo[k + 1])))
                merges += 1
                retry = True
                continue
            _, _, a, b, version_a, version_b = heapq.heappop(heap)
            if not (self.alive[a] and self.alive[b]) or version[a] != version_a or version[b] != version_b:
                continue
            if self.can_merge(a, b):
                merge(a, b)
                merges += 1
                retry = True
            else:
                blocked.append((a, b))
        return merges

    def find(self, piece: int) -> int:
        """The surviving group ``piece`` was merged into."""
        while self.parent[piece] != piece:
            piece = int(self.parent[piece])
        return piece

    def alive_ids(self) -> np.ndarray:
        return np.flatnonzero(self.alive)

    def ancestor_counts(self) -> np.ndarray:
        """[P] number of groups reaching each group: strictly larger for a descendant, so a topological key."""
        return self.reach.sum(axis=0)

    def labels(self) -> np.ndarray:
        """[P] group of each piece, numbered 0..G-1 in the order of the surviving representative pieces."""
        root = self.parent.copy()
        while True:
            nxt = root[root]
            if np.array_equal(nxt, root):
                break
            root = nxt
        _, label = np.unique(root, return_inverse=True)
        return label.astype(np.int64)


def refine_acyclic(num_nodes: int, src: np.ndarray, dst: np.ndarray, edge_bytes: np.ndarray, weight: np.ndarray,
                   group: np.ndarray, *, max_weight: float, max_passes: int = 8) -> tuple[np.ndarray, int]:
    """Greedy cut refinement that keeps ``group`` [K] a topological labelling (group[u] <= group[v] on every
    edge, which :func:`repair_acyclic` returns): returns (refined groups [K], number of moves).

    A node v may move to any group j with max(group of its predecessors) <= j <= min(group of its
    successors): every edge still goes to an equal or higher group, so the groups stay a DAG in the
    same order. Each pass visits the nodes in index order and moves a node to the allowed group it
    sends or receives the most bytes to or from, if that beats its own group, the target stays at most
    ``max_weight`` heavy and the node's group keeps another member. Passes repeat until none moves.
    """
    group = np.asarray(group, dtype=np.int64).copy()
    num_groups = int(group.max()) + 1 if num_nodes else 0
    group_weight = np.bincount(group, weights=weight, minlength=num_groups).tolist()
    group_size = np.bincount(group, minlength=num_groups).tolist()
    succ_ptr, succ, succ_bytes = _incident(num_nodes, src, dst, edge_bytes)
    pred_ptr, pred, pred_bytes = _incident(num_nodes, dst, src, edge_bytes)
    label = group.tolist()
    node_weight = np.asarray(weight, dtype=np.float64).tolist()
    moves = 0
    for _ in range(max_passes):
        moved = 0
        for v in range(num_nodes):
            own = label[v]
            if group_size[own] == 1:
                continue
            lo, hi, links = 0, num_groups - 1, {}
            for k in range(pred_ptr[v], pred_ptr[v + 1]):
                g = label[pred[k]]
                lo = max(lo, g)
                links[g] = links.get(g, 0.0) + pred_bytes[k]
            for k in range(succ_ptr[v], succ_ptr[v + 1]):
                g = label[succ[k]]
                hi = min(hi, g)
                links[g] = links.get(g, 0.0) + succ_bytes[k]
            best, best_gain = own, 0.0
            for g, linked in sorted(links.items()):
                gain = linked - links.get(own, 0.0)
                if lo <= g <= hi and g != own and gain > best_gain and group_weight[g] + node_weight[v] <= max_weight:
                    best, best_gain = g, gain
            if best != own:
                label[v] = best
                group_weight[own] -= node_weight[v]
                group_weight[best] += node_weight[v]
                group_size[own] -= 1
                group_size[best] += 1
                moved += 1
        moves += moved
        if not moved:
            break
    return np.asarray(label, dtype=np.int64), moves


def _incident(num_nodes: int, key: np.ndarray, other: np.ndarray, values: np.ndarray) -> tuple[list, list, list]:
    """CSR of edges grouped by ``key`` as Python lists: (ptr [K+1], other end [E], value [E])."""
    ptr, order = csr_by_key(num_nodes, key)
    return ptr.tolist(), other[order].tolist(), np.asarray(values, dtype=np.float64)[order].tolist()
