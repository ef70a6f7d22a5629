"""GraphPipe's pipeline stage partitioner (§5, Algorithm 1): binary search on the bottleneck stage time,
a DP over the series-parallel decomposition choosing stages, devices per stage and in-flight counts.

Three layers (STYLE item 8):

- **block graph** (:func:`block_graph`): the forward graph of :class:`tag.exact.ForwardGraph` with
  dangling sinks and constant sources contracted (:func:`tag.graphpipe.sp.contract_dangling`), its SP
  tree (:func:`tag.graphpipe.sp.sp_decompose`) and the tree coarsened so no series has more than
  ``max_chain`` children (consecutive children merged into blocks of balanced compute; a heavy parallel
  child is never merged, so branch parallelism survives);
- **kernel** (:func:`solve_for_target`): for a target stage time T, the DP of Algorithm 1, unrolled once
  per block graph into a flat program of table operations that one compiled call evaluates
  (:mod:`tag.graphpipe._kernels`; identical operations share a slot). A table
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
  head would need a device of its own. The branch prefixes this needs are solved in prefix order once
  per branch, so each tail costs a pass over the branch, not a DP over it.
- **driver** (:func:`partition_graphpipe`, :func:`depth_frontier`): the shallowest depth is
  non-increasing in T, so a binary search over the sorted distinct stage times finds the least T at
  most a given depth, and the Pareto front of (T, depth) costs a bisection per step of the front;
  every solve is kept per configuration. The argmins are rebuilt from the tables; devices left idle
  go to the slowest stages.

**Costs** match the sequential partitioners (:mod:`tag.exact.partition`) so that on a chain without
optimizer work they agree:
a stage of nodes V with d replicas and M micro-batches takes, per micro-batch,
Σ_V (fixed + f·scaled) + (2 / bandwidth)·(bytes entering + leaving V at fraction f), f = 1 / (M·d),
plus what runs once per iteration amortised over the M micro-batches: the ring all-reduce of its
parameters, 2(d − 1)/d · params / bandwidth, and its optimizer step (on every replica; in Adam-heavy
models such as DLRM's embedding tables it outweighs the passes, so a DP blind to it balances the wrong
thing). M · T is then a lower bound on the iteration time. The step really runs once, after the stage's
last backward pass, so it adds to the iteration rather than hiding in the steady state; a ``tail_share``
< 1 also holds it to that share of M · T, which the planner uses to reach plans that split heavy steps.
Memory per device: 4 × parameters (fp32 Adam) + min(i, M) × (activations kept + inputs received) per
micro-batch share.
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
           "depth_frontier", "DEFAULT_MAX_CHAIN"]

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
    optimizer_time: np.ndarray  # [K] seconds of the optimizer step, once per iteration
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
    candidates: _Candidates = field(init=False, repr=False)  # stage candidates of the coarsened tree
    program: _Program = field(init=False, repr=False)  # the DP over them, unrolled once
    # one _Search per (D, M, capacity, bandwidth, max_replicas): what the bisection, the depth frontier
    # and the plans of one configuration share
    searches: dict[tuple, _Search] = field(default_factory=dict, repr=False)

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
    bg = BlockGraph(fg, t, group, cost_fixed, cost_scaled, per_block(fg.param_bytes),
                    per_block(fg.optimizer_time[:, t]), per_block(fg.act_fixed),
                    per_block(fg.act_scaled), q_src, q_dst, q_fixed, q_scaled, tree, [], [], [], -1)
    cost = cost_fixed + cost_scaled
    bg.root = _coarsen(bg, tree, tree.root, cost, max_chain)
    if linearise:
        for v in range(len(bg.kind)):
            if bg.kind[v] == PARALLEL or (bg.kind[v] == SERIES and any(bg.kind[c] == PARALLEL
                                                                       for c in bg.children[v])):
                bg.linear[v] = _linear_twin(bg, v, cost, max_chain)
    bg.candidates = _enumerate(bg)
    bg.program = _Program(bg, bg.candidates)
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
        self.optimizer = mask @ bg.optimizer_time
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


# ------------------------------------------------------------------------------------------- program


class _Program:
    """Algorithm 1's recursion over the coarsened SP tree, unrolled once per block graph into a flat
    list of table operations (:mod:`tag.graphpipe._kernels`); identical operations share a slot, and
    every target of the binary search runs the list in one kernel call."""

    def __init__(self, bg: BlockGraph, cands: _Candidates) -> None:
        self.bg, self.cands = bg, cands
        self.kind: list[int] = []
        self.arg_a: list[int] = []
        self.arg_b: list[int] = []
        self._slot: dict[tuple[int, int, int], int] = {}
        self._node: dict[int, int] = {}
        self.series_identity = self._emit(K.SERIES_ID)
        self.parallel_identity = self._emit(K.PARALLEL_ID)
        self.root = self.node(bg.root)
        self.arrays = tuple(np.asarray(x, dtype=np.int64) for x in (self.kind, self.arg_a, self.arg_b))

    def _emit(self, kind: int, a: int = -1, b: int = -1) -> int:
        key = (kind, a, b)
        slot = self._slot.get(key)
        if slot is None:
            slot = len(self.kind)
            self._slot[key] = slot
            self.kind.append(kind)
            self.arg_a.append(a)
            self.arg_b.append(b)
        return slot

    def stage(self, key: tuple) -> int:
        return self._emit(K.STAGE, self.cands.key_to_id[key])

    def series(self, first: int, second: int) -> int:
        if first == self.series_identity:
            return second
        if second == self.series_identity:
            return first
        return self._emit(K.SERIES, first, second)

    def parallel(self, left: int, right: int) -> int:
        return left if right == self.parallel_identity else self._emit(K.PARALLEL, left, right)

    def minimum(self, slots: list[int | None]) -> int | None:
        """The elementwise least of ``slots`` (ties to the earliest); None stands for "no option"."""
        out = None
        for s in slots:
            if s is not None:
                out = s if out is None or out == s else self._emit(K.MIN, out, s)
        return out

    def node(self, v: int) -> int:
        slot = self._node.get(v)
        if slot is None:
            kind = self.bg.kind[v]
            if kind == LEAF:
                slot = self.stage(("node", v))
            elif kind == SERIES:
                slot = self._series(v)
            else:
                slot = self._parallel_fold(v, shifted=False)[0]
            if v in self.bg.linear:
                slot = self.minimum([slot, self.node(self.bg.linear[v])])
            self._node[v] = slot
        return slot

    def _series(self, v: int) -> int:
        """g[i] = min over spans i → j of series(span, g[j]); a span is a child by its own table, a range
        of children as one stage, or a parallel child whose join tail shares a branch's last stage."""
        kids = self.bg.children[v]
        n = len(kids)
        g: list[int | None] = [None] * n + [self.series_identity]
        for i in range(n - 1, -1, -1):
            options = [self.series(self.node(kids[i]), g[i + 1])]
            options += [self.series(self.stage(("range", v, i, j)), g[j]) for j in range(i + 2, n + 1)]
            if self.bg.kind[kids[i]] == PARALLEL:
                prefixes = [self._prefixes(b) for b in self.bg.children[kids[i]]]
                for j in range(i + 2, _tail_end(self.bg, kids, i) + 1):
                    options.append(self.series(self._parallel_fold(kids[i], shifted=True, tail=(v, i, j),
                                                                   prefixes=prefixes)[1], g[j]))
            g[i] = self.minimum(options)
        return g[0]

    def _prefixes(self, branch: int) -> list[int]:
        """P[k] (k < n) of a branch's chain of n children: the best stages for its first k children as a
        subgraph, P[0] the identity (prefix order, so every join tail reuses them)."""
        chain = _series_children(self.bg, branch)
        n = len(chain)
        prefix = [self.series_identity]
        for k in range(1, n):
            options = [self.series(prefix[k - 1], self.node(chain[k - 1]))]
            options += [self.series(prefix[a], self.stage(("range", branch, a, k))) for a in range(k - 1)]
            prefix.append(self.minimum(options))
        return prefix

    def _extended(self, tail: tuple, branch: int, prefix: list[int]) -> int | None:
        """A branch followed by the join tail, whose last stage holds the branch's children k.. and the tail."""
        v, i, j = tail
        return self.minimum([self.series(prefix[k], self.stage(("ext", v, i, j, branch, k)))
                             for k in range(len(prefix))])

    def _parallel_fold(self, v: int, *, shifted: bool, tail: tuple | None = None,
                       prefixes: list[list[int]] | None = None) -> tuple[int, int | None]:
        """(fold without a tail, fold where one branch also holds the tail); with ``shifted`` the
        branches see in-flight o + 1 (they feed the tail's stage). A contiguous group of branches
        (sorted by cost) may share one stage."""
        kids = self.bg.children[v]
        n = len(kids)

        def wrap(slot: int) -> int:
            return self._emit(K.SHIFT, slot) if shifted else slot

        def group(a: int, k: int) -> int:
            return wrap(self.stage(("group", v, a, k) if (a, k) != (0, n) else ("node", v)))

        plain: list[int | None] = [self.parallel_identity] + [None] * n
        with_tail: list[int | None] = [None] * (n + 1)
        for k in range(1, n + 1):
            options = [self.parallel(wrap(self.node(kids[k - 1])), plain[k - 1])]
            options += [self.parallel(group(a, k), plain[a]) for a in range(k - 1)]
            plain[k] = self.minimum(options)
            if tail is None:
                continue
            options = [self.parallel(self._extended(tail, kids[k - 1], prefixes[k - 1]), plain[k - 1])]
            if with_tail[k - 1] is not None:
                options.append(self.parallel(wrap(self.node(kids[k - 1])), with_tail[k - 1]))
            options += [self.parallel(group(a, k), with_tail[a]) for a in range(k - 1) if with_tail[a] is not None]
            with_tail[k] = self.minimum(options)
        return plain[n], with_tail[n]

    def run(self, omax: np.ndarray, depth_limit: int) -> tuple[np.ndarray, np.ndarray]:
        """(val, choice) [P, D+1, O+1] of every slot at ``omax`` [C, D+1]."""
        return K.run_program(*self.arrays, omax, depth_limit)

    def expand(self, val: np.ndarray, choice: np.ndarray, d: int, o: int,
               omax: np.ndarray) -> list[tuple[int, int, int]]:
        """(candidate id, replicas, in-flight) of every stage of the root's argmin at (d, o)."""
        kind, arg_a, arg_b = self.kind, self.arg_a, self.arg_b
        out: list[tuple[int, int, int]] = []
        stack = [(self.root, d, o)]
        while stack:
            p, d, o = stack.pop()
            op, a, b = kind[p], arg_a[p], arg_b[p]
            if op == K.STAGE:
                replicas = next(r for r in range(1, d + 1) if o + 1 <= omax[a, r])
                out.append((a, replicas, o + 1))
            elif op == K.SERIES:
                d1 = int(choice[p, d, o])
                stack.append((b, d - d1, o))
                stack.append((a, d1, int(val[b, d - d1, o])))
            elif op == K.PARALLEL:
                d1 = int(choice[p, d, o])
                stack.append((b, d - d1, o))
                stack.append((a, d1, o))
            elif op == K.MIN:
                stack.append((b if choice[p, d, o] else a, d, o))
            elif op == K.SHIFT:
                stack.append((a, d, o + 1))
        return out


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
    once_time: np.ndarray  # [S] seconds per iteration of the all-reduce and optimizer step (in stage_time / M)
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
    passes: np.ndarray  # [C, D+1] seconds per micro-batch of the passes and boundary transfers
    once: np.ndarray  # [C, D+1] seconds per iteration of the all-reduce and optimizer step
    memory_limit: np.ndarray  # [C, D+1] most micro-batches in flight that fit (depth_limit when all do)
    depth_limit: int


def _tables(cands: _Candidates, num_devices: int, micro_batches: int, batch: int, capacity: float,
            bandwidth: float, max_replicas: int, tail_share: float) -> _Tables:
    d = np.arange(num_devices + 1, dtype=np.float64)
    with np.errstate(divide="ignore"):
        fraction = np.where(d > 0, 1.0 / (micro_batches * np.maximum(d, 1)), 0.0)  # [D+1]
    comm = COMM_CROSSINGS / bandwidth if np.isfinite(bandwidth) else 0.0
    c = cands
    time_ = (c.cost_fixed[:, None] + fraction[None, :] * c.cost_scaled[:, None]
             + comm * (c.io_fixed[:, None] + fraction[None, :] * c.io_scaled[:, None]))
    once = np.broadcast_to(c.optimizer[:, None], time_.shape)  # [C, D+1] per iteration, every replica
    if np.isfinite(bandwidth):
        once = once + 2.0 * np.maximum(d - 1, 0) / np.maximum(d, 1) * c.params[:, None] / bandwidth
    passes = time_
    time_ = passes + once / micro_batches
    if tail_share < 1.0:  # the step runs after the last backward pass: cap it at a share of M·T
        time_ = np.maximum(time_, once / (tail_share * micro_batches))
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
    return _Tables(time_, passes, np.array(once), limit, depth_limit)


class _Search:
    """One configuration (D, M, memory, bandwidth, replica cap): its tables, the distinct stage times
    the binary search runs over, and the shallowest depth found at each, kept across bisection steps,
    frontier points and plans."""

    def __init__(self, program: _Program, tables: _Tables) -> None:
        self.program, self.tables = program, tables
        self.values = np.unique(tables.time[np.isfinite(tables.time)])  # [V] candidate targets, ascending
        self._depth: dict[int, int] = {}

    def solve(self, index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(val, choice, omax) of the DP at target ``values[index]``."""
        t = self.tables
        omax = np.where(t.time <= self.values[index], t.memory_limit, -1).astype(np.int64)
        val, choice = self.program.run(omax, t.depth_limit)
        self._depth[index] = int(val[self.program.root, -1, 0])
        return val, choice, omax

    def depth(self, index: int) -> int:
        """The shallowest pipeline (entry in-flight count) meeting ``values[index]``; INF when none."""
        if index not in self._depth:
            self.solve(index)
        return self._depth[index]

    def least(self, max_depth: int) -> int | None:
        """The least target index whose shallowest plan is at most ``max_depth`` deep (binary search,
        Algorithm 1: the depth is non-increasing in the target)."""
        if not self.values.size or self.depth(self.values.size - 1) > max_depth:
            return None
        low, high = 0, self.values.size - 1
        while low < high:
            mid = (low + high) // 2
            if self.depth(mid) <= max_depth:
                high = mid
            else:
                low = mid + 1
        return low

    def frontier(self, deadline: float = np.inf) -> list[int]:
        """Target indices of the Pareto front of (bottleneck, depth): the least feasible target, then
        every target at which the shallowest depth drops. Between two targets of equal depth none
        drops (monotone), so the front costs a bisection per step, not a solve per target. After
        ``deadline`` (``time.perf_counter()`` seconds) the bisection stops with the points it has (the
        least feasible target always)."""
        first = self.least(K.INF - 1)
        if first is None:
            return []
        points = [first]

        def split(low: int, high: int) -> None:  # depth(low) > depth(high)
            if high == low + 1:
                points.append(high)
                return
            if time.perf_counter() >= deadline:
                return
            mid = (low + high) // 2
            if self.depth(mid) < self.depth(low):
                split(low, mid)
            if self.depth(high) < self.depth(mid):
                split(mid, high)

        last = self.values.size - 1
        if self.depth(last) < self.depth(first):
            split(first, last)
        return sorted(points)


def _search(bg: BlockGraph, num_devices: int, micro_batches: int, capacity: float, bandwidth: float,
            max_replicas: int | None, tail_share: float) -> _Search:
    if not 0 < tail_share <= 1:
        raise PartitionError(f"tail_share must be in (0, 1], got {tail_share!r}")
    key = (num_devices, micro_batches, capacity, bandwidth, max_replicas, tail_share)
    search = bg.searches.get(key)
    if search is None:
        tables = _tables(bg.candidates, num_devices, micro_batches, bg.fg.batch_size, capacity, bandwidth,
                         num_devices if max_replicas is None else max_replicas, tail_share)
        search = _Search(bg.program, tables)
        bg.searches[key] = search
    return search


def solve_for_target(bg: BlockGraph, tables: _Tables, target: float) -> tuple[int, list[tuple[int, int, int]] | None]:
    """(least entry in-flight count, stages as (candidate, replicas, in-flight)) meeting ``target``
    seconds per micro-batch on all D devices; (INF, None) when nothing does."""
    omax = np.where(tables.time <= target, tables.memory_limit, -1).astype(np.int64)
    val, choice = bg.program.run(omax, tables.depth_limit)
    num_devices = omax.shape[1] - 1
    value = int(val[bg.program.root, num_devices, 0])
    if value >= K.INF:
        return value, None
    return value, bg.program.expand(val, choice, num_devices, 0, omax)


def depth_frontier(fg: ForwardGraph | BlockGraph, *, num_devices: int, micro_batches: int,
                   capacity: float = np.inf, bandwidth: float, max_replicas: int | None = None,
                   tail_share: float = 1.0, deadline: float = np.inf, **block_options: Any) -> list[tuple[float, int]]:
    """(bottleneck seconds per micro-batch, shallowest depth) at every point of the Pareto front the
    DP reaches, least bottleneck first: every sequential or graph pipeline it can express is dominated
    by one of them. ``tail_share`` as in :func:`partition_graphpipe`; ``block_options`` go to
    :func:`block_graph` when ``fg`` is not one yet; ``deadline`` (``time.perf_counter()`` seconds) cuts the
    front short (:meth:`_Search.frontier`)."""
    bg = fg if isinstance(fg, BlockGraph) else block_graph(fg, **block_options)
    search = _search(bg, num_devices, micro_batches, capacity, bandwidth, max_replicas, tail_share)
    return [(float(search.values[i]), search.depth(i)) for i in search.frontier(deadline)]


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
                        max_replicas: int | None = None, tail_share: float = 1.0, target: float | None = None,
                        max_depth: int | None = None, fallback: str = "linearise",
                        max_chain: int = DEFAULT_MAX_CHAIN, fill_idle: bool = True) -> GraphPartition:
    """GraphPipe's stage partitioner for M = ``micro_batches`` on ``num_devices`` devices.

    The binary search finds the least bottleneck stage time T (seconds per micro-batch, module
    docstring) whose shallowest plan is at most ``max_depth`` stages deep (default: any depth, T*);
    the plan at T is the shallowest one. ``target`` fixes T instead. ``max_replicas`` caps the
    data-parallel degree of a stage. ``tail_share`` < 1 also holds each stage's all-reduce and optimizer
    step to that share of M·T: the step runs once after the stage's last backward pass, so it adds to
    the iteration instead of hiding in the steady state as the amortised cost assumes; a lower share
    trades a deeper or wider plan for a shorter tail. Raises PartitionError when nothing fits.
    """
    for name, value in (("num_devices", num_devices), ("micro_batches", micro_batches)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise PartitionError(f"{name} must be a positive integer, got {value!r}")
    if not bandwidth > 0:
        raise PartitionError(f"bandwidth must be positive, got {bandwidth!r}")
    if max_depth is not None and (isinstance(max_depth, bool) or max_depth < 1):
        raise PartitionError(f"max_depth must be a positive integer, got {max_depth!r}")
    start = time.perf_counter()
    bg = fg if isinstance(fg, BlockGraph) else block_graph(fg, reference_type=reference_type, fallback=fallback,
                                                           max_chain=max_chain)
    search = _search(bg, num_devices, micro_batches, capacity, bandwidth, max_replicas, tail_share)
    best_index = search.least(K.INF - 1)
    if best_index is None:
        raise PartitionError(f"no graph of stages on {num_devices} devices with {micro_batches} micro-batches "
                             f"fits device memory ({capacity / 2**30:.3g} GiB)")
    if target is not None:
        chosen = float(target)
    else:
        index = search.least(K.INF - 1 if max_depth is None else max_depth)
        if index is None:
            raise PartitionError(f"no graph of stages is at most {max_depth} stages deep")
        chosen = float(search.values[index])
    value, stages = solve_for_target(bg, search.tables, chosen)
    if stages is None:
        raise PartitionError(f"no graph of stages meets a bottleneck of {chosen:.4g} s per micro-batch")
    tables = search.tables
    stage_list = [[cid, replicas, inflight] for cid, replicas, inflight in stages]
    if fill_idle:
        _fill_idle(stage_list, tables, num_devices)
    block_stage = np.full(bg.num_blocks, -1, dtype=np.int64)
    for k, (cid, _, _) in enumerate(stage_list):
        block_stage[bg.candidates.sets[cid]] = k
    if (block_stage < 0).any():
        raise PartitionError("internal error: the stages do not cover the graph")
    rank, edge_src, edge_dst = _stage_dag(bg, block_stage)
    order = np.argsort(rank)
    replicas = np.array([stage_list[k][1] for k in order], dtype=np.int64)
    inflight = np.array([stage_list[k][2] for k in order], dtype=np.int64)
    once = np.array([tables.once[stage_list[k][0], stage_list[k][1]] for k in order])
    times = np.array([tables.passes[stage_list[k][0], stage_list[k][1]] for k in order]) + once / micro_batches
    info = {"method": "graphpipe", "tail_share": tail_share, "blocks": bg.num_blocks, "tree_nodes": len(bg.kind),
            "candidates": len(bg.candidates.sets), "program_ops": len(bg.program.kind), "target_s": chosen,
            "best_target_s": float(search.values[best_index]), "entry_inflight": value,
            "sp_fallbacks": len(bg.sp_tree.fallbacks), "partition_s": time.perf_counter() - start}
    return GraphPartition(rank[block_stage[bg.group]], replicas, edge_src, edge_dst, inflight, times, once,
                          int(micro_batches), chosen, [int(rank[k]) for k in range(len(stage_list))], info)
