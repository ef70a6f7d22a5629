"""Series-parallel decomposition of a DAG (GraphPipe §5), with a fallback for graphs that are not SP.

The decomposition is of the *partial order* the DAG induces (node-series-parallel, as in Unity and
GraphPipe's use of it): a set of nodes V is

- a **leaf** when |V| = 1;
- a **parallel** composition when the comparability graph of V (u ~ v iff one reaches the other) is
  disconnected: its components share no path and can run concurrently;
- a **series** composition when the *in*comparability graph is disconnected: its components are totally
  ordered (every node of one reaches every node of the next), so each is a pipeline segment.

Transitive edges (a residual connection x → add beside x → f → add) do not change the order, so a
transformer layer is a plain series. A set where both graphs are connected is a **prime** region: the
order contains an "N" (a < c, b < c, b < d, with a ∥ b, a ∥ d, c ∥ d) and is not SP.

**Fallback** (``fallback="linearise"``, the default): a prime region V is split in series at the
prefix of its topological order that adds the fewest false dependencies (incomparable pairs (a, b)
with a in the prefix and b in the suffix, which the series split orders a < b), ties to the most
balanced cut; both sides are convex (a downset and an upset of V) and are decomposed again. Only the
minimal region that is not SP is touched, and only by the cheapest cut, so the parallelism elsewhere
(and inside each side) survives; for the N graph it adds one dependency, a < d, giving
series(parallel(a, b), parallel(c, d)). ``fallback="merge"`` instead makes the whole prime region one
leaf (GraphPipe's "convert to an SP graph" in its bluntest form): simpler, but a region that spans
several branches then becomes a single stage candidate. Linearising is the default because a single
stray cross-branch edge would otherwise fuse whole branches into one stage.

:func:`contract_dangling` prepares a forward graph for the decomposition: forward ops whose output only
the backward pass reads (extra sinks) and constant sources (no batch-scaled work, no predecessor) would
each form an "N" or a useless parallel branch with the real graph, so they are contracted into a
neighbour first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Sequence

import numpy as np

from tag._arrays import edge_arrays, kahn_order
from tag.errors import TagError

__all__ = [
    "SPError",
    "SPNode",
    "SPTree",
    "LEAF",
    "SERIES",
    "PARALLEL",
    "FALLBACKS",
    "reachability",
    "sp_decompose",
    "contract_dangling",
    "quotient_dag",
]

LEAF, SERIES, PARALLEL = "leaf", "series", "parallel"
FALLBACKS = ("linearise", "merge")


class SPError(TagError):
    """A graph cannot be decomposed as asked: a cycle, a bad node id, an unknown fallback."""


class SPNode(NamedTuple):
    """One node of the decomposition tree."""

    kind: str  # LEAF, SERIES or PARALLEL
    children: tuple[int, ...]  # node ids in the tree; series children in execution order
    members: np.ndarray  # [k] graph node ids covered, ascending topological position

    def __repr__(self) -> str:
        if self.kind == LEAF:
            return f"L{self.members.tolist()}"
        return f"{self.kind[0].upper()}{list(self.children)}"


@dataclass(eq=False)
class SPTree:
    """A decomposition tree over the nodes of a DAG; ``nodes[root]`` covers them all."""

    nodes: list[SPNode]
    root: int
    num_graph_nodes: int
    fallbacks: list[dict[str, Any]] = field(default_factory=list)  # one entry per prime region handled

    def leaves(self, node: int | None = None) -> list[int]:
        """Tree ids of the leaves under ``node`` (default the root), in series order."""
        out, stack = [], [self.root if node is None else node]
        while stack:
            v = stack.pop()
            if self.nodes[v].kind == LEAF:
                out.append(v)
            else:
                stack.extend(reversed(self.nodes[v].children))
        return out

    @property
    def is_series_parallel(self) -> bool:
        """True when no fallback was needed."""
        return not self.fallbacks

    def describe(self, node: int | None = None) -> str:
        """Nested text, e.g. ``S(0, P(1, 2), 3)``."""
        v = self.nodes[self.root if node is None else node]
        if v.kind == LEAF:
            ids = v.members.tolist()
            return str(ids[0]) if len(ids) == 1 else "{" + ",".join(map(str, ids)) + "}"
        inner = ", ".join(self.describe(c) for c in v.children)
        return f"{v.kind[0].upper()}({inner})"


def _topological_position(num_nodes: int, edge_src: np.ndarray, edge_dst: np.ndarray) -> np.ndarray:
    # the smallest id among a few ready nodes (a stable order), the oldest among many (linear time)
    order, _ = kahn_order(num_nodes, edge_src, edge_dst,
                          pick=lambda ready: ready.index(min(ready)) if len(ready) < 64 else 0)
    if len(order) != num_nodes:
        raise SPError(f"the graph has a cycle through {num_nodes - len(order)} nodes")
    position = np.empty(num_nodes, dtype=np.int64)
    position[np.asarray(order, dtype=np.int64)] = np.arange(num_nodes)
    return position


def reachability(num_nodes: int, edge_src: Sequence[int], edge_dst: Sequence[int]) -> np.ndarray:
    """[N, N] bool, ``reach[u, v]``: a path of at least one edge runs u → v. Raises SPError on a cycle."""
    src = np.asarray(edge_src, dtype=np.int64)
    dst = np.asarray(edge_dst, dtype=np.int64)
    position = _topological_position(num_nodes, src, dst)
    order = np.argsort(position)
    succ: list[list[int]] = [[] for _ in range(num_nodes)]
    for a, b in zip(src.tolist(), dst.tolist()):
        succ[a].append(b)
    reach = np.zeros((num_nodes, num_nodes), dtype=bool)
    for v in order[::-1].tolist():
        for w in succ[v]:
            reach[v, w] = True
            reach[v] |= reach[w]
    return reach


def _components(adjacency: np.ndarray) -> tuple[int, np.ndarray]:
    """(count, labels [n]) of the connected components of a symmetric [n, n] bool adjacency, by
    breadth-first frontiers over whole rows."""
    n = adjacency.shape[0]
    labels = np.full(n, -1, dtype=np.int64)
    count = 0
    for start in range(n):
        if labels[start] >= 0:
            continue
        frontier = np.zeros(n, dtype=bool)
        frontier[start] = True
        labels[start] = count
        while frontier.any():
            reached = adjacency[frontier].any(axis=0) & (labels < 0)
            labels[reached] = count
            frontier = reached
        count += 1
    return count, labels


def _best_cut(incomparable: np.ndarray) -> tuple[int, int]:
    """(k, false dependencies) of the prefix cut [0, k) | [k, n) of the fewest incomparable pairs across
    it, ties to the most balanced; ``incomparable`` [n, n] over nodes in topological order."""
    n = incomparable.shape[0]
    upper = np.triu(incomparable, 1).astype(np.int64)
    # across[k] = Σ_{a<k≤b} upper[a, b]: rows < k, columns ≥ k
    row_cum = np.cumsum(upper, axis=0)  # [n, n] Σ_{a≤r} upper[a, b]
    col_tail = np.cumsum(row_cum[:, ::-1], axis=1)[:, ::-1]  # [r, c] Σ_{a≤r, b≥c}
    ks = np.arange(1, n)
    across = col_tail[ks - 1, ks]
    balance = np.abs(2 * ks - n)
    best = int(np.lexsort((balance, across))[0])
    return int(ks[best]), int(across[best])


def sp_decompose(num_nodes: int, edge_src: Sequence[int], edge_dst: Sequence[int], *,
                 fallback: str = "linearise") -> SPTree:
    """The SP decomposition tree of a DAG of ``num_nodes`` nodes (module docstring).

    Series children are in execution order; parallel children are in order of their earliest node.
    ``fallback`` handles prime regions: ``"linearise"`` (cheapest series cut) or ``"merge"`` (one leaf);
    every region handled is logged in ``SPTree.fallbacks``.
    """
    if fallback not in FALLBACKS:
        raise SPError(f"fallback must be one of {', '.join(FALLBACKS)}, got {fallback!r}")
    if num_nodes < 1:
        raise SPError("the graph has no nodes")
    src, dst = edge_arrays(num_nodes, edge_src, edge_dst, SPError)
    reach = reachability(num_nodes, src, dst)
    position = _topological_position(num_nodes, src, dst)
    comparable = reach | reach.T
    tree = SPTree([], -1, num_nodes)

    def add(kind: str, children: Sequence[int], members: np.ndarray) -> int:
        tree.nodes.append(SPNode(kind, tuple(children), members))
        return len(tree.nodes) - 1

    def decompose(members: np.ndarray) -> int:
        members = members[np.argsort(position[members], kind="stable")]
        if members.size == 1:
            return add(LEAF, (), members)
        sub = comparable[np.ix_(members, members)]
        count, labels = _components(sub)
        if count > 1:
            groups = [members[labels == c] for c in range(count)]
            groups.sort(key=lambda g: int(position[g].min()))
            return add(PARALLEL, [decompose(g) for g in groups], members)
        incomparable = ~sub
        np.fill_diagonal(incomparable, False)
        count, labels = _components(incomparable)
        if count > 1:
            groups = [members[labels == c] for c in range(count)]
            groups.sort(key=lambda g: int(position[g].min()))
            return add(SERIES, _flatten(SERIES, [decompose(g) for g in groups]), members)
        # prime: an N lies inside; both graphs are connected
        if fallback == "merge":
            tree.fallbacks.append({"nodes": members.tolist(), "action": "merge"})
            return add(LEAF, (), members)
        k, added = _best_cut(incomparable)
        tree.fallbacks.append({"nodes": members.tolist(), "action": "linearise", "cut": k,
                               "false_dependencies": added})
        return add(SERIES, _flatten(SERIES, [decompose(members[:k]), decompose(members[k:])]), members)

    def _flatten(kind: str, children: list[int]) -> list[int]:
        out: list[int] = []
        for c in children:
            out.extend(tree.nodes[c].children if tree.nodes[c].kind == kind else (c,))
        return out

    tree.root = decompose(np.arange(num_nodes, dtype=np.int64))
    return tree


# ------------------------------------------------------------------------------------------- preparation


def quotient_dag(group: np.ndarray, edge_src: np.ndarray, edge_dst: np.ndarray,
                 edge_weight: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(src [E'], dst [E'], summed weight [E']) of the graph with nodes contracted by ``group`` [N]
    (self-loops dropped, parallel edges summed)."""
    group = np.asarray(group, dtype=np.int64)
    a, b = group[np.asarray(edge_src)], group[np.asarray(edge_dst)]
    keep = a != b
    weight = np.ones(a.size) if edge_weight is None else np.asarray(edge_weight, dtype=np.float64)
    num = int(group.max()) + 1 if group.size else 0
    pairs, inverse = np.unique(a[keep] * num + b[keep], return_inverse=True)
    summed = np.bincount(inverse, weights=weight[keep], minlength=pairs.size)
    return pairs // max(num, 1), pairs % max(num, 1), summed


def contract_dangling(num_nodes: int, edge_src: Sequence[int], edge_dst: Sequence[int],
                      constant: np.ndarray | None = None) -> np.ndarray:
    """[N] group id (0..G-1, numbered in topological order of the groups) that contracts every sink but
    the topologically last into its topologically latest predecessor, and every source group whose
    members are all marked ``constant`` [N] (contractible) into its topologically earliest successor,
    until none is left. Contracting into
    those neighbours cannot close a cycle. Isolated nodes join the last sink."""
    src = np.asarray(edge_src, dtype=np.int64)
    dst = np.asarray(edge_dst, dtype=np.int64)
    position = _topological_position(num_nodes, src, dst)
    constant = np.zeros(num_nodes, dtype=bool) if constant is None else np.asarray(constant, dtype=bool)
    parent = np.arange(num_nodes)

    def find(v: int) -> int:
        while parent[v] != v:
            parent[v] = parent[parent[v]]
            v = int(parent[v])
        return v

    while True:
        roots = np.array([find(v) for v in range(num_nodes)])
        a, b = roots[src], roots[dst]
        keep = a != b
        a, b = a[keep], b[keep]
        alive = np.unique(roots)
        outdeg = np.bincount(a, minlength=num_nodes)
        indeg = np.bincount(b, minlength=num_nodes)
        # a group's position is its latest member's (sinks) or earliest member's (sources)
        last = np.full(num_nodes, -1)
        np.maximum.at(last, roots, position)
        first = np.full(num_nodes, num_nodes)
        np.minimum.at(first, roots, position)
        sinks = [int(v) for v in alive if outdeg[v] == 0]
        final = max(sinks, key=lambda v: last[v])
        changed = False
        for v in sinks:
            if v == final:
                continue
            preds = a[b == v]
            target = int(max(preds.tolist(), key=lambda u: last[u])) if preds.size else final
            parent[v] = target
            changed = True
            break  # degrees change: recompute
        if changed:
            continue
        members_all_constant = np.ones(num_nodes, dtype=bool)
        np.logical_and.at(members_all_constant, roots, constant)
        for v in alive.tolist():
            if indeg[v] == 0 and outdeg[v] > 0 and members_all_constant[v]:
                succs = b[a == v]
                parent[v] = int(min(succs.tolist(), key=lambda u: first[u]))
                changed = True
                break
        if not changed:
            break
    roots = np.array([find(v) for v in range(num_nodes)])
    alive, dense = np.unique(roots, return_inverse=True)
    q_src, q_dst, _ = quotient_dag(dense, src, dst)
    group_position = _topological_position(alive.size, q_src, q_dst)
    return group_position[dense]
