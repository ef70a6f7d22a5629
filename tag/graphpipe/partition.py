"""GraphPipe's pipeline stage partitioner (§5, Algorithm 1): binary search on the bottleneck stage time,
a DP over the series-parallel decomposition choosing stages, devices per stage and in-flight counts.

Three layers (STYLE item 8):

- **block graph** (:func:`block_graph`): the forward graph of :class:`tag.exact.ForwardGraph` with
  dangling sinks and constant sources contracted (:func:`tag.graphpipe.sp.contract_dangling`), its SP
  tree (:func:`tag.graphpipe.sp.sp_decompose`) and the tree coarsened so no series has more than
  ``max_chain`` children (consecutive children merged into blocks of balanced compute; a heavy parallel
  child is never merged, so branch parallelism survives);
- **kernel** (:func:`solve_for_target`): for a target stage time T, the DP of Algorithm 1. A table
  F[d, o] per subgraph holds the least in-flight count of its entry stage(s) when it gets d devices and
  the stage after it holds o micro-batches (GraphPipe's "minimise the source stage's in-flight count";
  1F1B with one micro-batch size, so a stage's count is one more than its successors'). Cases:
  *base* — the subgraph is one stage on d data-parallel replicas, feasible when its time ≤ T and its
  memory with o + 1 micro-batches in flight fits; *series* — F = F_1[d_1, F_2[d_2, o]], the later part
  solved first; *parallel* — F = max(F_1[d_1, o], F_2[d_2, o]). A series of n children is solved over
  all its contiguous ranges (a range as one stage, or a child by its own table), a parallel node by a
  fold over its children sorted by cost in which a contiguous group may share one stage. One addition
  of ours: the *join tail* of a parallel node (the leaves that follow it in its series) may share the
  last stage of one branch, the other branches then seeing in-flight o + 1; without it a tiny concat /
  head would need a device of its own.
- **driver** (:func:`partition_graphpipe`): binary search over the sorted distinct stage times for the
  least feasible T; the argmins are rebuilt from the tables; devices left idle go to the slowest stages.

**Costs** match the sequential partitioners (:mod:`tag.exact.partition`) so that on a chain they agree:
a stage of nodes V with d replicas and M micro-batches takes, per micro-batch,
Σ_V (fixed + f·scaled) + (2 / bandwidth)·(bytes entering + leaving V at fraction f), f = 1 / (M·d),
plus the ring all-reduce of its parameters amortised over the M micro-batches,
2(d − 1)/d · params / bandwidth / M. Memory per device: 4 × parameters (fp32 Adam) + min(i, M) ×
(activations kept + inputs received) per micro-batch share.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tag.exact.partition import COMM_CROSSINGS
from tag.exact.stage_graph import ADAM_MEMORY_COPIES, ForwardGraph, PartitionError
from tag.graphpipe import _kernels as K
from tag.graphpipe.sp import LEAF, PARALLEL, SERIES, SPTree, _topological_position, contract_dangling, \
    quotient_dag, sp_decompose

__all__ = ["BlockGraph", "block_graph", "GraphPartition", "partition_graphpipe", "solve_for_target",
           "DEFAULT_MAX_CHAIN"]

log = logging.getLogger(__name__)

DEFAULT_MAX_CHAIN = 24  # children of a series after coarsening
_LIGHT_SOURCE = 1e-3  # a source below this share of the total compute is contracted into its successor


# ------------------------------------------------------------------------------------------- block graph


@dataclass(eq=False)
class BlockGraph:
    """K blocks of forward nodes (after contraction) and the coarsened SP tree over them."""

    fg: ForwardGraph
    reference_type: int
    group: np.ndarray  # [F] block of each forward node
    cost_fixed: np.ndarray  # [K] fwd + bwd seconds that do not scale with the batch
    cost_scaled: np.ndarray  # [K] fwd + bwd seconds at the reference batch that scale
    param_bytes: np.ndarray  # [K]
    act_fixed: np.ndarray  # [K] bytes kept for backward
    act_scaled: np.ndarray  # [K]
    edge_src: np.ndarray  # [E] block ids
    edge_dst: np.ndarray  # [E]
    edge_fixed: np.ndarray  # [E] bytes
    edge_scaled: np.ndarray  # [E] bytes at the reference batch
    sp_tree: SPTree  # over the K blocks, before coarsening
    kind: list[str]  # [T] coarsened tree: LEAF / SERIES / PARALLEL
    children: list[list[int]]  # [T]
    members: list[np.ndarray]  # [T] block ids
    root: int
    linear: dict[int, int] = field(default_factory=dict)  # non-leaf node -> its linearised twin (a series)

    @property
    def num_blocks(self) -> int:
        return int(self.cost_fixed.size)


def block_graph(fg: ForwardGraph, *, reference_type: int = 0, fallback: str = "linearise",
                max_chain: int = DEFAULT_MAX_CHAIN, linearise: bool = True) -> BlockGraph:
    """Contract, decompose and coarsen the forward graph (module docstring); with ``linearise`` every
    node holding branches also gets a linearised twin the DP may choose instead."""
    if max_chain < 2:
        raise PartitionError(f"max_chain must be at least 2, got {max_chain!r}")
    t = reference_type
    node_cost = fg.compute_time(1.0, t)
    contractible = ((fg.fwd_scaled[:, t] + fg.bwd_scaled[:, t]) == 0) | \
        (node_cost <= _LIGHT_SOURCE * max(node_cost.sum(), 1e-30))
    group = contract_dangling(fg.num_nodes, fg.edge_src, fg.edge_dst, contractible)
    num = int(group.max()) + 1

    def per_block(values: np.ndarray) -> np.ndarray:
        return np.bincount(group, weights=values, minlength=num)

    q_src, q_dst, q_fixed = quotient_dag(group, fg.edge_src, fg.edge_dst, fg.edge_fixed)
    _, _, q_scaled = quotient_dag(group, fg.edge_src, fg.edge_dst, fg.edge_scaled)
    tree = sp_decompose(num, q_src, q_dst, fallback=fallback)
    cost_fixed = per_block(fg.fwd_fixed[:, t] + fg.bwd_fixed[:, t])
    cost_scaled = per_block(fg.fwd_scaled[:, t] + fg.bwd_scaled[:, t])
    bg = BlockGraph(fg, t, group, cost_fixed, cost_scaled, per_block(fg.param_bytes), per_block(fg.act_fixed),
                    per_block(fg.act_scaled), q_src, q_dst, q_fixed, q_scaled, tree, [], [], [], -1)
    cost = cost_fixed + cost_scaled
    bg.root = _coarsen(bg, tree, tree.root, cost, max_chain)
    if linearise:
        for v in range(len(bg.kind)):
            if bg.kind[v] == PARALLEL or (bg.kind[v] == SERIES and any(bg.kind[c] == PARALLEL
                                                                       for c in bg.children[v])):
                bg.linear[v] = _linear_twin(bg, v, cost, max_chain)
    return bg


def _linear_twin(bg: BlockGraph, v: int, cost: np.ndarray, max_chain: int) -> int:
    """A series of at most ``max_chain`` leaves cutting node v's blocks in topological order into
    chunks of balanced compute: the sequential pipeline's view of the subgraph (GPP ⊇ SPP)."""
    blocks = np.sort(bg.members[v])
    share = np.cumsum(cost[blocks]) / max(float(cost[blocks].sum()), 1e-30)  # [k] in (0, 1]
    chunk = np.minimum((share * max_chain - 1e-9).astype(np.int64), max_chain - 1)
    chunk = np.maximum.accumulate(np.maximum(chunk, 0))
    kids = [_add(bg, LEAF, [], blocks[chunk == c]) for c in np.unique(chunk)]
    if len(kids) == 1:
        return kids[0]
    return _add(bg, SERIES, kids, blocks)


def _add(bg: BlockGraph, kind: str, children: list[int], members: np.ndarray) -> int:
    bg.kind.append(kind)
    bg.children.append(children)
    bg.members.append(np.sort(members))
    return len(bg.kind) - 1


def _coarsen(bg: BlockGraph, tree: SPTree, node: int, cost: np.ndarray, max_chain: int) -> int:
    sp = tree.nodes[node]
    if sp.kind == LEAF:
        return _add(bg, LEAF, [], sp.members)
    if sp.kind == PARALLEL:
        kids = sorted(sp.children, key=lambda c: -cost[tree.nodes[c].members].sum())
        return _add(bg, PARALLEL, [_coarsen(bg, tree, c, cost, max_chain) for c in kids], sp.members)
    kids = list(sp.children)
    if len(kids) <= max_chain:
        return _add(bg, SERIES, [_coarsen(bg, tree, c, cost, max_chain) for c in kids], sp.members)
    weight = [float(cost[tree.nodes[c].members].sum()) for c in kids]
    target = sum(weight) / max_chain
    chunks: list[list[int]] = []
    current: list[int] = []
    current_cost = 0.0
    for c, w in zip(kids, weight):
        if tree.nodes[c].kind != LEAF and w >= target / 2:
            if current:
                chunks.append(current)
            chunks.append([c])
            current, current_cost = [], 0.0
            continue
        current.append(c)
        current_cost += w
        if current_cost >= target:
            chunks.append(current)
            current, current_cost = [], 0.0
    if current:
        chunks.append(current)
    out = []
    for chunk in chunks:
        if len(chunk) == 1:
            out.append(_coarsen(bg, tree, chunk[0], cost, max_chain))
        else:
            out.append(_add(bg, LEAF, [], np.concatenate([tree.nodes[c].members for c in chunk])))
    if len(out) == 1:
        return out[0]
    return _add(bg, SERIES, out, sp.members)


# ------------------------------------------------------------------------------------------- candidates


class _Candidates:
    """Stage candidates (sets of blocks) keyed by how the DP forms them, with their cost sums."""

    def __init__(self, bg: BlockGraph) -> None:
        self.bg = bg
        self.key_to_id: dict[tuple, int] = {}
        self.sets: list[np.ndarray] = []

    def add(self, key: tuple, members: np.ndarray) -> int:
        cid = self.key_to_id.get(key)
        if cid is None:
            cid = len(self.sets)
            self.key_to_id[key] = cid
            self.sets.append(members)
        return cid

    def finish(self) -> None:
        bg = self.bg
        mask = np.zeros((len(self.sets), bg.num_blocks), dtype=bool)  # [C, K]
        for c, members in enumerate(self.sets):
            mask[c, members] = True
        self.mask = mask
        self.cost_fixed = mask @ bg.cost_fixed  # [C]
        self.cost_scaled = mask @ bg.cost_scaled
        self.params = mask @ bg.param_bytes
        self.act_fixed = mask @ bg.act_fixed
        self.act_scaled = mask @ bg.act_scaled
        src_in, dst_in = mask[:, bg.edge_src], mask[:, bg.edge_dst]  # [C, E]
        entering, leaving = ~src_in & dst_in, src_in & ~dst_in
        self.in_fixed = entering @ bg.edge_fixed
        self.in_scaled = entering @ bg.edge_scaled
        self.io_fixed = self.in_fixed + leaving @ bg.edge_fixed
        self.io_scaled = self.in_scaled + leaving @ bg.edge_scaled


def _series_children(bg: BlockGraph, node: int) -> list[int]:
    return bg.children[node] if bg.kind[node] == SERIES else [node]


def _tail_end(bg: BlockGraph, kids: list[int], i: int) -> int:
    """One past the last child of the run of leaves that follows child i."""
    j = i + 1
    while j < len(kids) and bg.kind[kids[j]] == LEAF:
        j += 1
    return j


def _enumerate(bg: BlockGraph) -> _Candidates:
    cands = _Candidates(bg)
    for v in range(len(bg.kind)):
        cands.add(("node", v), bg.members[v])
        kids = bg.children[v]
        if bg.kind[v] == SERIES:
            for i in range(len(kids)):
                for j in range(i + 2, len(kids) + 1):
                    cands.add(("range", v, i, j), np.concatenate([bg.members[c] for c in kids[i:j]]))
                if bg.kind[kids[i]] == PARALLEL:
                    for j in range(i + 2, _tail_end(bg, kids, i) + 1):
                        tail = np.concatenate([bg.members[c] for c in kids[i + 1:j]])
                        for b in bg.children[kids[i]]:
                            chain = _series_children(bg, b)
                            for k in range(len(chain)):
                                cands.add(("ext", v, i, j, b, k),
                                          np.concatenate([bg.members[c] for c in chain[k:]] + [tail]))
        elif bg.kind[v] == PARALLEL:
            for a in range(len(kids)):
                for b in range(a + 2, len(kids) + 1):
                    cands.add(("group", v, a, b), np.concatenate([bg.members[c] for c in kids[a:b]]))
    cands.finish()
    return cands


# ------------------------------------------------------------------------------------------- tables


class _Tab:
    """A DP table and how to rebuild its argmin: ``op`` in stage / series / parallel / min / shift / id."""

    __slots__ = ("op", "val", "args", "choice")

    def __init__(self, op: str, val: np.ndarray, args: tuple = (), choice: np.ndarray | None = None) -> None:
        self.op, self.val, self.args, self.choice = op, val, args, choice


def _series_tab(first: _Tab, second: _Tab) -> _Tab:
    val, split = K.series(first.val, second.val)
    return _Tab("series", val, (first, second), split)


def _parallel_tab(left: _Tab, right: _Tab) -> _Tab:
    val, split = K.parallel(left.val, right.val)
    return _Tab("parallel", val, (left, right), split)


def _min_tab(tabs: list[_Tab]) -> _Tab | None:
    tabs = [t for t in tabs if t is not None]
    if not tabs:
        return None
    if len(tabs) == 1:
        return tabs[0]
    stack = np.stack([t.val for t in tabs])
    choice = np.argmin(stack, axis=0)
    return _Tab("min", np.min(stack, axis=0), tuple(tabs), choice)


def _shift_tab(tab: _Tab) -> _Tab:
    val = np.full_like(tab.val, K.INF)
    val[:, :-1] = tab.val[:, 1:]
    return _Tab("shift", val, (tab,))


class _Solver:
    """All tables of one target: stage tables from ``omax`` [C, D+1], node tables by recursion."""

    def __init__(self, bg: BlockGraph, cands: _Candidates, omax: np.ndarray, depth_limit: int) -> None:
        self.bg, self.cands, self.omax, self.depth_limit = bg, cands, omax, depth_limit
        num = omax.shape[1]
        self.series_identity = _Tab("id", np.tile(np.arange(depth_limit + 1, dtype=np.int64), (num, 1)))
        self.parallel_identity = _Tab("id", np.zeros((num, depth_limit + 1), dtype=np.int64))
        self.stage_cache: dict[int, _Tab] = {}
        self.node_cache: dict[int, _Tab] = {}

    def stage(self, key: tuple) -> _Tab:
        cid = self.cands.key_to_id[key]
        tab = self.stage_cache.get(cid)
        if tab is None:
            tab = _Tab("stage", K.stage_table(self.omax[cid], self.depth_limit), (cid,))
            self.stage_cache[cid] = tab
        return tab

    def node(self, v: int) -> _Tab:
        tab = self.node_cache.get(v)
        if tab is None:
            kind = self.bg.kind[v]
            if kind == LEAF:
                tab = self.stage(("node", v))
            elif kind == SERIES:
                tab = self._series(v)
            else:
                tab = self._parallel_fold(v, shifted=False)[0]
            if v in self.bg.linear:
                tab = _min_tab([tab, self.node(self.bg.linear[v])])
            self.node_cache[v] = tab
        return tab

    def _chain(self, spans: list[list[tuple[int, _Tab]]], end: int) -> _Tab | None:
        """g[0] of g[i] = min over spans (i → j, tab) of series(tab, g[j]), g[end] = identity."""
        g: list[_Tab | None] = [None] * (end + 1)
        g[end] = self.series_identity
        for i in range(end - 1, -1, -1):
            g[i] = _min_tab([_series_tab(tab, g[j]) for j, tab in spans[i] if g[j] is not None])
        return g[0]

    def _series(self, v: int) -> _Tab:
        kids = self.bg.children[v]
        n = len(kids)
        spans: list[list[tuple[int, _Tab]]] = [[] for _ in range(n)]
        for i in range(n):
            spans[i].append((i + 1, self.node(kids[i])))
            for j in range(i + 2, n + 1):
                spans[i].append((j, self.stage(("range", v, i, j))))
            if self.bg.kind[kids[i]] == PARALLEL:
                for j in range(i + 2, _tail_end(self.bg, kids, i) + 1):
                    tail = ("node", kids[i + 1]) if j == i + 2 else ("range", v, i + 1, j)
                    if self.omax[self.cands.key_to_id[tail]].max() < 1:
                        break  # a longer tail is slower still
                    spans[i].append((j, self._absorbed(v, i, j)))
        return self._chain(spans, n)

    def _extended(self, v: int, i: int, j: int, branch: int) -> _Tab | None:
        """A branch of child i followed by the tail kids[i+1:j] whose last stage holds the whole tail."""
        chain = _series_children(self.bg, branch)
        n = len(chain)
        spans: list[list[tuple[int, _Tab]]] = [[] for _ in range(n + 1)]
        for k in range(n):
            if n > 1:
                spans[k].append((k + 1, self.node(chain[k])))
                for end in range(k + 2, n + 1):
                    spans[k].append((end, self.stage(("range", branch, k, end))))
            spans[k].append((n + 1, self.stage(("ext", v, i, j, branch, k))))
        return self._chain(spans, n + 1)

    def _absorbed(self, v: int, i: int, j: int) -> _Tab | None:
        parallel = self.bg.children[v][i]
        return self._parallel_fold(parallel, shifted=True, tail=(v, i, j))[1]

    def _parallel_fold(self, v: int, *, shifted: bool, tail: tuple | None = None) -> tuple[_Tab, _Tab | None]:
        """(fold without a tail, fold where one branch also holds the tail); with ``shifted`` the
        branches see in-flight o + 1 (they feed the tail's stage)."""
        kids = self.bg.children[v]
        n = len(kids)
        wrap = _shift_tab if shifted else (lambda t: t)
        plain: list[_Tab | None] = [self.parallel_identity] + [None] * n
        with_tail: list[_Tab | None] = [None] * (n + 1)
        for k in range(1, n + 1):
            options = [_parallel_tab(wrap(self.node(kids[k - 1])), plain[k - 1])]
            for a in range(k - 1):
                options.append(_parallel_tab(wrap(self.stage(("group", v, a, k) if (a, k) != (0, n)
                                                               else ("node", v))), plain[a]))
            plain[k] = _min_tab(options)
            if tail is None:
                continue
            options = []
            ext = self._extended(*tail, kids[k - 1])
            if ext is not None:
                options.append(_parallel_tab(ext, plain[k - 1]))
            if with_tail[k - 1] is not None:
                options.append(_parallel_tab(wrap(self.node(kids[k - 1])), with_tail[k - 1]))
            for a in range(k - 1):
                if with_tail[a] is not None:
                    options.append(_parallel_tab(wrap(self.stage(("group", v, a, k) if (a, k) != (0, n)
                                                                 else ("node", v))), with_tail[a]))
            with_tail[k] = _min_tab(options)
        return plain[n], with_tail[n]


def _expand(tab: _Tab, d: int, o: int, omax: np.ndarray, out: list[tuple[int, int, int]]) -> None:
    """Append (candidate id, replicas, in-flight) of every stage of ``tab``'s argmin at (d, o)."""
    stack = [(tab, d, o)]
    while stack:
        tab, d, o = stack.pop()
        if tab.op == "stage":
            cid = tab.args[0]
            replicas = next(r for r in range(1, d + 1) if o + 1 <= omax[cid, r])
            out.append((cid, replicas, o + 1))
        elif tab.op == "series":
            first, second = tab.args
            d1 = int(tab.choice[d, o])
            stack.append((second, d - d1, o))
            stack.append((first, d1, int(second.val[d - d1, o])))
        elif tab.op == "parallel":
            left, right = tab.args
            d1 = int(tab.choice[d, o])
            stack.append((right, d - d1, o))
            stack.append((left, d1, o))
        elif tab.op == "min":
            stack.append((tab.args[int(tab.choice[d, o])], d, o))
        elif tab.op == "shift":
            stack.append((tab.args[0], d, o + 1))


# ------------------------------------------------------------------------------------------- driver


@dataclass
class GraphPartition:
    """A graph of stages: which forward node goes where, devices per stage, in-flight counts."""

    forward_stage: np.ndarray  # [F] stage of each forward node; stage ids in topological order
    replicas: np.ndarray  # [S] data-parallel devices per stage
    edge_src: np.ndarray  # [E] stage DAG
    edge_dst: np.ndarray  # [E]
    inflight: np.ndarray  # [S] micro-batches in flight at the peak (DP's estimate)
    stage_time: np.ndarray  # [S] seconds per micro-batch, the partitioner's cost model
    micro_batches: int  # M
    target: float  # the binary search's bottleneck stage time, seconds per micro-batch
    device_order: list[int]  # [S] stage ids in the order devices are handed out (branch by branch)
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def num_stages(self) -> int:
        return int(self.replicas.size)

    @property
    def max_stage_time(self) -> float:
        return float(self.stage_time.max())


@dataclass
class _Tables:
    """Everything that depends on M but not on the target."""

    time: np.ndarray  # [C, D+1] seconds per micro-batch, inf where d is not allowed
    memory_limit: np.ndarray  # [C, D+1] most micro-batches in flight that fit (depth_limit when all do)
    depth_limit: int


def _tables(cands: _Candidates, num_devices: int, micro_batches: int, batch: int, capacity: float,
            bandwidth: float, max_replicas: int) -> _Tables:
    d = np.arange(num_devices + 1, dtype=np.float64)
    with np.errstate(divide="ignore"):
        fraction = np.where(d > 0, 1.0 / (micro_batches * np.maximum(d, 1)), 0.0)  # [D+1]
    comm = COMM_CROSSINGS / bandwidth if np.isfinite(bandwidth) else 0.0
    c = cands
    time_ = (c.cost_fixed[:, None] + fraction[None, :] * c.cost_scaled[:, None]
             + comm * (c.io_fixed[:, None] + fraction[None, :] * c.io_scaled[:, None]))
    if np.isfinite(bandwidth):
        allreduce = 2.0 * np.maximum(d - 1, 0) / np.maximum(d, 1) * c.params[:, None] / bandwidth
        time_ = time_ + allreduce / micro_batches
    allowed = (d >= 1) & (d <= max_replicas) & (d * micro_batches <= batch)
    time_[:, ~allowed] = np.inf
    depth_limit = num_devices
    static = ADAM_MEMORY_COPIES * c.params
    per_micro = (c.act_fixed[:, None] + fraction[None, :] * c.act_scaled[:, None]
                 + c.in_fixed[:, None] + fraction[None, :] * c.in_scaled[:, None])
    room = capacity - static[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        fits = np.where(per_micro > 0, np.floor(room / np.where(per_micro > 0, per_micro, 1.0)), np.inf)
    limit = np.where(fits >= micro_batches, depth_limit, np.minimum(fits, depth_limit))
    limit = np.where(room < 0, -1, limit).astype(np.int64)
    return _Tables(time_, limit, depth_limit)


def solve_for_target(bg: BlockGraph, cands: _Candidates, tables: _Tables, target: float
                     ) -> tuple[int, list[tuple[int, int, int]] | None]:
    """(least entry in-flight count, stages as (candidate, replicas, in-flight)) meeting ``target``
    seconds per micro-batch on all D devices; (INF, None) when nothing does."""
    omax = np.where(tables.time <= target, tables.memory_limit, -1).astype(np.int64)
    solver = _Solver(bg, cands, omax, tables.depth_limit)
    root = solver.node(bg.root)
    num_devices = omax.shape[1] - 1
    value = int(root.val[num_devices, 0])
    if value >= K.INF:
        return value, None
    out: list[tuple[int, int, int]] = []
    _expand(root, num_devices, 0, omax, out)
    return value, out


def _feasible(bg, cands, tables, target) -> bool:
    omax = np.where(tables.time <= target, tables.memory_limit, -1).astype(np.int64)
    root = _Solver(bg, cands, omax, tables.depth_limit).node(bg.root)
    return int(root.val[omax.shape[1] - 1, 0]) < K.INF


def _search_target(bg, cands, tables) -> float | None:
    """The least distinct stage time T at which the DP is feasible (binary search, Algorithm 1)."""
    values = np.unique(tables.time[np.isfinite(tables.time)])
    if values.size == 0 or not _feasible(bg, cands, tables, float(values[-1])):
        return None
    low, high = 0, values.size - 1
    while low < high:
        mid = (low + high) // 2
        if _feasible(bg, cands, tables, float(values[mid])):
            high = mid
        else:
            low = mid + 1
    return float(values[low])


def _stage_dag(bg: BlockGraph, block_stage: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rank [S] topological position of each provisional stage, edge_src, edge_dst in ranked ids)."""
    num = int(block_stage.max()) + 1
    a, b = block_stage[bg.edge_src], block_stage[bg.edge_dst]
    keep = a != b
    pairs = np.unique(a[keep] * num + b[keep])
    src, dst = pairs // num, pairs % num
    rank = _topological_position(num, src, dst)
    return rank, rank[src], rank[dst]


def _fill_idle(stages: list[list[int]], tables: _Tables, num_devices: int) -> None:
    """Give idle devices one at a time to the slowest stage that a further replica speeds up."""
    while sum(s[1] for s in stages) < num_devices:
        best, worst = None, -np.inf
        for k, (cid, replicas, _) in enumerate(stages):
            now = tables.time[cid, replicas]
            if replicas + 1 < tables.time.shape[1] and tables.time[cid, replicas + 1] < now and now > worst \
                    and tables.memory_limit[cid, replicas + 1] >= tables.memory_limit[cid, replicas]:
                best, worst = k, now
        if best is None:
            return
        stages[best][1] += 1


def partition_graphpipe(fg: ForwardGraph | BlockGraph, *, num_devices: int, micro_batches: int,
                        capacity: float = np.inf, bandwidth: float, reference_type: int = 0,
                        max_replicas: int | None = None, target: float | None = None, relax: float = 1.0,
                        fallback: str = "linearise", max_chain: int = DEFAULT_MAX_CHAIN,
                        fill_idle: bool = True) -> GraphPartition:
    """GraphPipe's stage partitioner for M = ``micro_batches`` on ``num_devices`` devices.

    The binary search finds the least bottleneck stage time T* (seconds per micro-batch, module
    docstring); with ``relax`` > 1 the plan is rebuilt at the least distinct stage time ≥ relax · T*
    (fewer stages, a shallower pipeline); ``target`` fixes T instead. ``max_replicas`` caps the
    data-parallel degree of a stage. Raises PartitionError when nothing fits.
    """
    for name, value in (("num_devices", num_devices), ("micro_batches", micro_batches)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise PartitionError(f"{name} must be a positive integer, got {value!r}")
    if not bandwidth > 0:
        raise PartitionError(f"bandwidth must be positive, got {bandwidth!r}")
    start = time.perf_counter()
    bg = fg if isinstance(fg, BlockGraph) else block_graph(fg, reference_type=reference_type, fallback=fallback,
                                                           max_chain=max_chain)
    cands = getattr(bg, "_candidates", None)
    if cands is None:
        cands = _enumerate(bg)
        bg._candidates = cands  # type: ignore[attr-defined]
    batch = bg.fg.batch_size
    cache = bg.__dict__.setdefault("_searches", {})
    key = (num_devices, micro_batches, capacity, bandwidth, max_replicas)
    if key not in cache:  # the binary search does not depend on relax: run it once per configuration
        tables = _tables(cands, num_devices, micro_batches, batch, capacity, bandwidth,
                         num_devices if max_replicas is None else max_replicas)
        cache[key] = (tables, _search_target(bg, cands, tables))
    tables, best = cache[key]
    best = best if target is None else float(target)
    if best is None:
        raise PartitionError(f"no graph of stages on {num_devices} devices with {micro_batches} micro-batches "
                             f"fits device memory ({capacity / 2**30:.3g} GiB)")
    chosen = best
    if target is None and relax > 1.0:
        values = np.unique(tables.time[np.isfinite(tables.time)])
        chosen = float(values[np.searchsorted(values, best * relax)]) if best * relax <= values[-1] else \
            float(values[-1])
    value, stages = solve_for_target(bg, cands, tables, chosen)
    if stages is None:
        raise PartitionError(f"no graph of stages meets a bottleneck of {chosen:.4g} s per micro-batch")
    stage_list = [[cid, replicas, inflight] for cid, replicas, inflight in stages]
    if fill_idle:
        _fill_idle(stage_list, tables, num_devices)
    block_stage = np.full(bg.num_blocks, -1, dtype=np.int64)
    for k, (cid, _, _) in enumerate(stage_list):
        block_stage[cands.sets[cid]] = k
    if (block_stage < 0).any():
        raise PartitionError("internal error: the stages do not cover the graph")
    rank, edge_src, edge_dst = _stage_dag(bg, block_stage)
    order = np.argsort(rank)
    replicas = np.array([stage_list[k][1] for k in order], dtype=np.int64)
    inflight = np.array([stage_list[k][2] for k in order], dtype=np.int64)
    times = np.array([tables.time[stage_list[k][0], stage_list[k][1]] for k in order])
    info = {"method": "graphpipe", "blocks": bg.num_blocks, "tree_nodes": len(bg.kind),
            "candidates": len(cands.sets), "target_s": chosen, "best_target_s": best, "entry_inflight": value,
            "sp_fallbacks": len(bg.sp_tree.fallbacks), "partition_s": time.perf_counter() - start}
    return GraphPartition(rank[block_stage[bg.group]], replicas, edge_src, edge_dst, inflight, times,
                          int(micro_batches), chosen, [int(rank[k]) for k in range(len(stage_list))], info)
