"""SFB over a strategy (TAG §4.2.3): the program of :mod:`tag.sfb.program` for every synchronised gradient
of every replicated op group, merged per group into what the compiler needs to carry it out.

**Gradients.** A group whose option is ALLREDUCE or PS on D ≥ 2 devices splits the batch among its
replicas. An op g of split class ``sum`` in it whose readers are all optimizer ops, in groups on the same
devices, produces a partial weight gradient that the compiler all-reduces (PS: pushes and pulls); its
readers are the paper's l.

**Candidates.** An op and the ``getitem`` views of its outputs are one candidate: the tracer writes an op
with several outputs (``convolution_backward``: dX, dW, db; ``native_layer_norm_backward``) as the op and
one view per output, and the edge into a view is no tensor that could be broadcast on its own. So a
gradient that is a view is solved as its base op (Conv2DBackpropFilter in TAG Table 6), once for all the
gradients that base produces. V: the root candidate and its ancestors in the group, at most ``depth``
edges upstream, breadth first, at most ``max_ops`` candidates. A candidate is admitted if its ops are
forward or backward ops of the group, its base is not of class ``none`` (it already runs on the whole batch
and holds whole tensors) and each of its ops of class ``sum`` is a gradient synchronised here (or the base,
read only by its views): a duplicated op holds its whole output on every replica, and a whole sum read by
an op that adds partials would be counted D times.

**Coefficients**, for replicas r = 1..D with batch fractions f_r:

- Tᵢ = max_r (1 − f_r) · tᵢˢ(r) / (D − 1), tᵢˢ(r) the batch-proportional part of op i's time on r's GPU
  type (:class:`tag.cost.CostModel`): (D−1)·Tᵢ is the extra time of running i on the whole batch on the
  slowest replica;
- L_ji: a tensor split along the batch (a batch-scaled edge) → its bytes / D, one replica's rows (with an
  uneven split D(D−1)·L_ji is still what the replicas receive in all); a partial sum (a producer of class
  ``sum``) → its bytes; anything else (parameters, whole tensors) → 0;
- τ: the least bandwidth between two of the D devices;
- S: ring all-reduce 2(D−1)/D · L_gl/τ; for a PS, 2(D−1) · L_gl/τ (a server on one replica, D−1 workers
  push and pull: :func:`tag.cost.ps_push_pull_time` without latency).

**Per group.** Decisions are taken per gradient (TAG: "a local decision"), then merged: an op duplicated by
any decision runs whole once, and each tensor of the union's cut is broadcast once. The cut of the union
is a subset of the union of the cuts, so the group's estimate (S saved − extra compute − broadcasts) is at
least the sum of the per-gradient savings. The estimate serialises every transfer on the bottleneck link
and ignores overlap and latency, as the program does: simulate for the real effect.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from tag.cluster import Cluster
from tag.cost import CostModel
from tag.graph.opgraph import (
    ROLE_BACKWARD,
    ROLE_FORWARD,
    ROLE_INPUT,
    ROLE_OPTIMIZER,
    SPLIT_NONE,
    SPLIT_SUM,
    OpGraph,
)
from tag.grouping import GroupGraph
from tag.sfb.errors import SFBError
from tag.sfb.program import DEFAULT_TIME_LIMIT_S, EXTERNAL, STATUSES, SFBCache, SFBDecision, solve_sfb
from tag.strategy import ALLREDUCE, OPTIONS, PS, Strategy, replicas

__all__ = ["apply_sfb", "SFBPlan", "GroupSFB", "GradientSFB", "SFBReport", "DEFAULT_DEPTH", "DEFAULT_MAX_OPS"]

DEFAULT_DEPTH = 3  # candidate ops lie at most this many edges upstream of g
DEFAULT_MAX_OPS = 24  # |V| cap; CBC solves programs of this size in milliseconds


class GradientSFB(NamedTuple):
    """The program of one gradient and its decision. V candidates, E tensors.

    A candidate is an op together with the ``getitem`` views of its outputs (the tracer's form of an op
    with several outputs, such as ``convolution_backward``): the views are one op with their base, so
    they are duplicated with it, and a gradient that is such a view (a weight gradient of a convolution or
    a normalisation) is solved as its base op, once for all the gradients the base produces.
    """

    group: int
    op: int  # base op of the root candidate: g itself, or the op g is a view of
    gradient_ops: np.ndarray  # [S] ops of the root candidate whose output is a synchronised gradient
    gradient_bytes: float  # L_gl, summed over gradient_ops
    num_replicas: int  # D
    bandwidth: float  # τ, bytes/s
    option: int  # ALLREDUCE or PS: the synchronisation SFB would replace
    sync_time: float  # S, seconds, summed over gradient_ops
    ops: np.ndarray  # [V] base op of each candidate, ops[0] == op
    members: tuple[np.ndarray, ...]  # [V] ops of each candidate (the base and its views)
    edges: np.ndarray  # [E] op-graph edge ids of the program's tensors
    edge_src: np.ndarray  # [E] index into ops, or EXTERNAL
    op_time: np.ndarray  # [V] Tᵢ seconds
    edge_bytes: np.ndarray  # [E] L_ji bytes
    decision: SFBDecision

    @property
    def duplicated_ops(self) -> np.ndarray:
        """Op ids the decision duplicates (candidates expanded to their views)."""
        chosen = [self.members[k] for k in np.flatnonzero(self.decision.duplicated).tolist()]
        return np.sort(np.concatenate(chosen)) if chosen else np.zeros(0, dtype=np.int64)

    @property
    def broadcast_edges(self) -> np.ndarray:
        return self.edges[self.decision.broadcast]


class GroupSFB(NamedTuple):
    """What SFB changes in one replicated group: exactly what the compiler needs. S gradients whose sync is
    dropped, K duplicated ops, C broadcast tensors read over C' edges."""

    group: int
    devices: tuple[int, ...]  # [D] the replicas
    option: int  # ALLREDUCE or PS: the synchronisation removed
    sync_free_ops: np.ndarray  # [S] gradient ops whose output no longer needs an AllReduce / PS
    gradient_bytes: np.ndarray  # [S] L_gl
    duplicated_ops: np.ndarray  # [K] ops every replica runs on the whole batch (sync_free_ops among them)
    broadcast_ops: np.ndarray  # [C] producers of the broadcast tensors (not duplicated)
    broadcast_bytes: np.ndarray  # [C] bytes of each whole tensor (rows) or of each partial, reference batch
    broadcast_partial: np.ndarray  # [C] bool: partial sums (every replica's to every other), else batch rows
    broadcast_edges: np.ndarray  # [C'] op-graph edges (j → i) from a broadcast tensor into a duplicated op
    extra_compute_s: float  # (D−1) Σ Tᵢ over duplicated_ops
    broadcast_time_s: float  # D(D−1) Σ L / τ over the broadcast tensors
    sync_saved_s: float  # Σ S over sync_free_ops
    allreduce_bytes_removed: float  # Σ L_gl
    broadcast_bytes_added: float  # D(D−1) Σ L: bytes the broadcasts move

    @property
    def time_saved_s(self) -> float:
        """The estimate: synchronisation saved minus extra compute and broadcasts (module docstring)."""
        return self.sync_saved_s - self.extra_compute_s - self.broadcast_time_s

    def as_dict(self) -> dict[str, Any]:
        return {"group": self.group, "devices": list(self.devices), "option": OPTIONS[self.option],
                "sync_free_ops": self.sync_free_ops.tolist(), "gradient_bytes": self.gradient_bytes.tolist(),
                "duplicated_ops": self.duplicated_ops.tolist(), "broadcast_ops": self.broadcast_ops.tolist(),
                "broadcast_bytes": self.broadcast_bytes.tolist(), "broadcast_partial": self.broadcast_partial.tolist(),
                "broadcast_edges": self.broadcast_edges.tolist(), "extra_compute_s": self.extra_compute_s,
                "broadcast_time_s": self.broadcast_time_s, "sync_saved_s": self.sync_saved_s,
                "time_saved_s": self.time_saved_s, "allreduce_bytes_removed": self.allreduce_bytes_removed,
                "broadcast_bytes_added": self.broadcast_bytes_added}


class SFBReport(NamedTuple):
    """Figures of one :class:`SFBPlan` (``as_dict`` for ``--json``, ``format`` / rich for people)."""

    model: str
    cluster: str
    gradients: int  # synchronised gradients examined
    applied: int  # gradients whose synchronisation SFB removes
    ops_duplicated: int
    allreduce_bytes_removed: float  # tensor bytes no longer all-reduced (Fig. 4: H₂×H₁)
    broadcast_bytes_added: float  # bytes the broadcasts move (Fig. 4: 2(H₂×B + B×H₁))
    estimated_time_saved_s: float  # Σ over groups, serialised (module docstring): not a simulation
    programs: int  # programs solved (one per base op producing gradients)
    statuses: dict[str, int]  # programs by how their decision was reached (tag.sfb.program.STATUSES)
    cache_hits: int
    solve_time_s: float
    duplicated_kinds: list[tuple[str, int]]  # op kinds duplicated, most frequent first (TAG Table 6)
    groups: list[dict[str, Any]]  # one row per replicated group with synchronised gradients

    def as_dict(self) -> dict[str, Any]:
        out = self._asdict()
        out["duplicated_kinds"] = [{"kind": k, "count": c} for k, c in self.duplicated_kinds]
        return out

    def format(self, *, max_groups: int = 20) -> str:
        from tag.units import format_bytes, format_time

        lines = [f"SFB for {self.model} on {self.cluster}: {self.applied} of {self.gradients} synchronised "
                 f"gradients replaced by broadcasts, {self.ops_duplicated} ops duplicated",
                 f"  all-reduce bytes removed {format_bytes(self.allreduce_bytes_removed)}, broadcast bytes added "
                 f"{format_bytes(self.broadcast_bytes_added)}, estimated time saved "
                 f"{format_time(self.estimated_time_saved_s)} (SFB estimate, not a simulation)",
                 f"  decisions: {', '.join(f'{k} {v}' for k, v in self.statuses.items() if v)}; cache hits "
                 f"{self.cache_hits}; solve time {format_time(self.solve_time_s)}"]
        if self.duplicated_kinds:
            lines.append("  duplicated op kinds: " + ", ".join(f"{k} {c}" for k, c in self.duplicated_kinds[:5]))
        for row in self.groups[:max_groups]:
            lines.append(f"  group {row['group']:3d} {row['option']:>9s} on {row['replicas']} devices: "
                         f"{row['applied']}/{row['gradients']} gradients, {row['ops_duplicated']} ops, "
                         f"-{format_bytes(row['allreduce_bytes_removed'])} all-reduce, "
                         f"+{format_bytes(row['broadcast_bytes_added'])} broadcast, "
                         f"saves {format_time(row['time_saved_s'])}")
        if len(self.groups) > max_groups:
            lines.append(f"  ... {len(self.groups) - max_groups} more groups")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()

    def __rich__(self):
        from rich.table import Table

        from tag.units import format_bytes, format_time

        table = Table(title=f"SFB: {self.applied}/{self.gradients} gradients, {self.ops_duplicated} ops duplicated, "
                            f"est. {format_time(self.estimated_time_saved_s)} saved (estimate, not simulated)")
        for column in ("group", "option", "replicas", "gradients", "ops", "all-reduce removed",
                       "broadcast added", "est. saved"):
            table.add_column(column, justify="left" if column == "option" else "right")
        for row in self.groups:
            table.add_row(str(row["group"]), row["option"], str(row["replicas"]),
                          f"{row['applied']}/{row['gradients']}", str(row["ops_duplicated"]),
                          format_bytes(row["allreduce_bytes_removed"]), format_bytes(row["broadcast_bytes_added"]),
                          format_time(row["time_saved_s"]))
        return table


@dataclass(eq=False)
class SFBPlan:
    """SFB decisions for one strategy: per gradient (``gradients``) and merged per group (``groups``).

    The compiler's view is ``groups`` (one :class:`GroupSFB` per replicated group where SFB applies) or the
    flat arrays ``sync_free_ops``, ``duplicated_ops``, ``broadcast_edges``; :meth:`rewrite_graph` expresses
    the same plan as an OpGraph the present compiler runs unchanged.
    """

    group_graph: GroupGraph
    strategy: Strategy
    cluster: Cluster
    gradients: list[GradientSFB]  # one program per base op producing synchronised gradients, by group
    groups: list[GroupSFB]  # groups where SFB applies
    group_gradients: dict[int, np.ndarray] = field(default_factory=dict)  # replicated group -> its synced gradient ops
    group_devices: dict[int, tuple[int, ...]] = field(default_factory=dict)  # replicated group -> its replicas
    cache_hits: int = 0
    solve_time_s: float = 0.0

    @property
    def sync_free_ops(self) -> np.ndarray:
        """[S] gradient ops, over all groups, whose AllReduce / PS is dropped."""
        return _concat([g.sync_free_ops for g in self.groups])

    @property
    def duplicated_ops(self) -> np.ndarray:
        """[K] ops, over all groups, that every replica of their group runs on the whole batch."""
        return _concat([g.duplicated_ops for g in self.groups])

    @property
    def broadcast_edges(self) -> np.ndarray:
        """[C'] op-graph edges whose tensor is broadcast to the replicas of the consumer's group."""
        return _concat([g.broadcast_edges for g in self.groups])

    @property
    def estimated_time_saved_s(self) -> float:
        return float(sum(g.time_saved_s for g in self.groups))

    def restricted(self, groups: Any) -> SFBPlan:
        """The same plan applied to ``groups`` only (op group ids; others keep their synchronisation), e.g.
        to keep SFB only where a simulation says it helps. Programs and their decisions are kept."""
        keep = {int(g) for g in groups}
        return dataclasses.replace(self, groups=[g for g in self.groups if g.group in keep])

    def report(self) -> SFBReport:
        graph = self.group_graph.op_graph
        statuses = dict.fromkeys(STATUSES, 0)
        for program in self.gradients:
            statuses[program.decision.status] += 1
        kinds = collections.Counter(_short_kind(graph.kinds[op]) for op in self.duplicated_ops.tolist())
        rows = []
        for group, ops in sorted(self.group_gradients.items()):
            if not len(ops):
                continue
            applied = next((g for g in self.groups if g.group == group), None)
            rows.append({"group": group, "option": OPTIONS[int(self.strategy.option[group])],
                         "replicas": len(self.group_devices[group]), "gradients": len(ops),
                         "applied": len(applied.sync_free_ops) if applied else 0,
                         "ops_duplicated": len(applied.duplicated_ops) if applied else 0,
                         "allreduce_bytes_removed": applied.allreduce_bytes_removed if applied else 0.0,
                         "broadcast_bytes_added": applied.broadcast_bytes_added if applied else 0.0,
                         "time_saved_s": applied.time_saved_s if applied else 0.0})
        return SFBReport(
            model=str(graph.meta.get("model", "?")), cluster=self.cluster.name,
            gradients=sum(len(ops) for ops in self.group_gradients.values()),
            applied=int(self.sync_free_ops.size), ops_duplicated=int(self.duplicated_ops.size),
            allreduce_bytes_removed=float(sum(g.allreduce_bytes_removed for g in self.groups)),
            broadcast_bytes_added=float(sum(g.broadcast_bytes_added for g in self.groups)),
            estimated_time_saved_s=self.estimated_time_saved_s, programs=len(self.gradients), statuses=statuses,
            cache_hits=self.cache_hits, solve_time_s=self.solve_time_s, duplicated_kinds=kinds.most_common(),
            groups=rows)

    def rewrite_graph(self) -> OpGraph:
        """The op graph with the plan written in, for the compiler as it is (a prototype of its integration).

        Each duplicated op becomes split class ``none`` (the compiler runs it on the whole batch in every
        replica and gathers every row of what it reads: the broadcasts) and its output edges stop being
        batch-scaled (every replica holds the whole tensor, so its readers find it locally and the gradient
        it may be needs no all-reduce). For compiling at this batch size only: the rewritten edges no
        longer rescale with :meth:`OpGraph.with_batch_size`.
        """
        graph = self.group_graph.op_graph
        duplicated = self.duplicated_ops
        split = graph.split.copy()
        split[duplicated] = SPLIT_NONE
        edge_batch_scaled = graph.edge_batch_scaled & ~np.isin(graph.edge_src, duplicated)
        meta = {**graph.meta, "sfb": {"duplicated_ops": int(duplicated.size),
                                      "sync_free_ops": int(self.sync_free_ops.size)}}
        return dataclasses.replace(graph, split=split, edge_batch_scaled=edge_batch_scaled, meta=meta)

    def rewritten_group_graph(self) -> GroupGraph:
        """:meth:`rewrite_graph` grouped as before (same assignment, group ids and GPU types): compile it with
        the same strategy to simulate the plan."""
        gg = self.group_graph
        return GroupGraph.from_assignment(self.rewrite_graph(), gg.assignment, gpus=gg.gpu_types, cost=gg.cost,
                                          info={**gg.info, "sfb": True})


# ------------------------------------------------------------------------------------------------ driver


class _Units(NamedTuple):
    """Ops joined with the ``getitem`` views of their outputs. N ops; a unit is named by its base op."""

    base: np.ndarray  # [N] int64 base op of each op's unit (itself unless it is a view)
    ptr: np.ndarray  # [N+1] members of the unit of base op u: ops[ptr[u]:ptr[u+1]] (empty if u is a view)
    ops: np.ndarray  # [N] op ids ordered by unit, ascending within one

    def members(self, unit: int) -> np.ndarray:
        return self.ops[self.ptr[unit]:self.ptr[unit + 1]]


class _GroupContext(NamedTuple):
    """What every program of one replicated group shares."""

    group: int
    devices: tuple[int, ...]  # [D]
    bandwidth: float  # τ
    op_time: np.ndarray  # [N] Tᵢ of each op for these replicas
    piece_bytes: np.ndarray  # [E] L_ji of each edge for these replicas
    sync: dict[int, tuple[float, int, float]]  # synchronised gradient op -> (L_gl, option, S)


class _GraphTables(NamedTuple):
    """What does not depend on the strategy, memoised per grouping in the SFBCache. N ops, T GPU types."""

    units: _Units
    gradient_of: np.ndarray  # [N] bool
    scaled: np.ndarray  # [N, T] batch-proportional time of each op on each type of the cluster, whole batch


_MAX_MEMO_ENTRIES = 100_000  # per-group results kept per grouping before its memo is emptied


def apply_sfb(group_graph: GroupGraph, strategy: Strategy, cluster: Cluster, *, cost: CostModel | None = None,
              depth: int = DEFAULT_DEPTH, max_ops: int = DEFAULT_MAX_OPS, method: str = "auto",
              time_limit: float = DEFAULT_TIME_LIMIT_S, cache: SFBCache | None = None, solver: Any = None,
              deadline: float | None = None) -> SFBPlan:
    """Solve the SFB program for every synchronised gradient of ``strategy`` (module docstring).

    ``cost``: op times (default: the grouping's cost model). ``depth``, ``max_ops``: the candidate subgraph
    (``max_ops`` counts candidates: an op with its views). ``method``, ``time_limit``, ``solver``: as
    :func:`tag.sfb.solve_sfb`. ``cache``: programs by signature, kept across calls (by default a fresh one).
    Besides, ``cache`` memoises each group's result by everything it depends on (the group's
    replicas and batch fractions, τ, its synchronised gradients, the parameters; not with a ``solver``), so
    a search that re-decides one group at a time pays only for the groups it changes.
    ``deadline``: a ``time.perf_counter()`` instant; each group's solves are limited to the time left
    before it as well (a group so cut short is not memoised), and once it has passed only memoised groups
    get SFB: the others are left as they are.
    """
    for name, value, least in (("depth", depth, 0), ("max_ops", max_ops, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
            raise SFBError(f"{name} must be an integer ≥ {least}, got {value!r}")
    if strategy.num_groups != group_graph.num_groups:
        raise SFBError(f"the strategy has {strategy.num_groups} op groups but the grouping has "
                       f"{group_graph.num_groups}")
    cost = cost if cost is not None else group_graph.cost
    cache = cache if cache is not None else SFBCache()
    hits_before = cache.hits
    started = time.perf_counter()
    graph = group_graph.op_graph
    memo = cache.graph_memo(group_graph)
    tables = _graph_tables(memo, group_graph, cluster, cost)
    if len(memo) > _MAX_MEMO_ENTRIES:
        memo.clear()
    layouts = [replicas(strategy, cluster, g) for g in range(group_graph.num_groups)]
    devices = [tuple(r.devices.tolist()) for r in layouts]
    memo_hits = 0
    gradients: list[GradientSFB] = []
    groups: list[GroupSFB] = []
    group_gradients: dict[int, np.ndarray] = {}
    for g, layout in enumerate(layouts):
        if not (layout.synchronised and len(layout.devices) > 1):
            continue
        d = len(layout.devices)
        tau = _bottleneck_bandwidth(cluster, layout.devices)
        sync = _synchronised(graph, group_graph.group_members(g), tables.gradient_of, group_graph.assignment,
                             devices, strategy, g, d, tau)
        group_gradients[g] = np.array(sorted(sync), dtype=np.int64)
        key = ("group", g, devices[g], tuple(layout.batch_fraction.tolist()), tau,
               tuple(cluster.device_type[layout.devices].tolist()), tuple((op, s[1]) for op, s in sorted(sync.items())),
               depth, max_ops, method, time_limit, cost)
        found = memo.get(key) if solver is None else None
        left = None if deadline is None else deadline - time.perf_counter()
        if found is None and left is not None and left <= 0:
            continue  # out of time: this group keeps its synchronisation
        if found is None:
            limit = time_limit if left is None else min(time_limit, left)
            context = _GroupContext(g, devices[g], tau,
                                    _extra_time(graph, tables.scaled, cluster, layout.devices, layout.batch_fraction),
                                    _broadcast_bytes(graph, d), sync)
            programs = _group_programs(graph, tables.units, context, group_graph.assignment, depth=depth,
                                       max_ops=max_ops, method=method, time_limit=limit, cache=cache,
                                       solver=solver)
            found = (programs, _merge(graph, context, programs, tables.gradient_of))
            if solver is None and limit == time_limit:
                memo[key] = found
        else:
            memo_hits += len(found[0])
        gradients.extend(found[0])
        if found[1] is not None:
            groups.append(found[1])
    return SFBPlan(group_graph, strategy, cluster, gradients, groups, group_gradients,
                   {g: devices[g] for g in group_gradients}, cache.hits - hits_before + memo_hits,
                   time.perf_counter() - started)


def _graph_tables(memo: dict, group_graph: GroupGraph, cluster: Cluster, cost: CostModel) -> _GraphTables:
    key = ("tables", tuple(t.name for t in cluster.types), cost)
    tables = memo.get(key)
    if tables is None:
        graph = group_graph.op_graph
        tables = memo[key] = _GraphTables(_units(graph), _gradient_ops(graph), _scaled_times(graph, cluster, cost))
    return tables


def _group_programs(graph: OpGraph, units: _Units, context: _GroupContext, assignment: np.ndarray, *, depth: int,
                    max_ops: int, method: str, time_limit: float, cache: SFBCache, solver: Any) -> list[GradientSFB]:
    """One program per base op producing synchronised gradients of the group, in gradient order."""
    eligible: dict[int, bool] = {}

    def admissible(unit: int) -> bool:
        if unit not in eligible:
            eligible[unit] = _unit_ok(graph, units, unit, assignment, context.group, context.sync)
        return eligible[unit]

    programs: list[GradientSFB] = []
    solved: set[int] = set()
    for op in sorted(context.sync):
        root = int(units.base[op])
        if root in solved or not admissible(root):
            continue
        solved.add(root)
        programs.append(_program(graph, units, root, context, admissible, depth=depth, max_ops=max_ops,
                                 method=method, time_limit=time_limit, cache=cache, solver=solver))
    return programs


def _program(graph: OpGraph, units: _Units, root: int, context: _GroupContext, admissible, *, depth: int,
             max_ops: int, method: str, time_limit: float, cache: SFBCache, solver: Any) -> GradientSFB:
    """Build and solve the program of the candidate ``root`` (a base op producing synchronised gradients)."""
    candidates = _candidates(graph, units, root, admissible, depth, max_ops)
    index = {u: k for k, u in enumerate(candidates)}
    members = tuple(units.members(u) for u in candidates)
    edges, src, dst = [], [], []
    for k, ops in enumerate(members):
        for x in ops.tolist():
            for e in graph.pred_edge[graph.pred_ptr[x]:graph.pred_ptr[x + 1]].tolist():
                producer = int(units.base[graph.edge_src[e]])
                if producer == candidates[k]:
                    continue  # a view reading its base: inside the candidate
                j = index.get(producer, EXTERNAL)
                if j == EXTERNAL and context.piece_bytes[e] == 0:
                    continue  # a whole tensor every replica holds: never broadcast
                edges.append(e)
                src.append(j)
                dst.append(k)
    edges_arr = np.array(edges, dtype=np.int64)
    src_arr = np.array(src, dtype=np.int64)
    times = np.array([context.op_time[ops].sum() for ops in members])
    lengths = context.piece_bytes[edges_arr]
    gradient_ops = np.array([x for x in members[0].tolist() if x in context.sync], dtype=np.int64)
    gradient_bytes = float(sum(context.sync[x][0] for x in gradient_ops.tolist()))
    sync_time = float(sum(context.sync[x][2] for x in gradient_ops.tolist()))
    option = context.sync[int(gradient_ops[0])][1]
    d = len(context.devices)
    decision = solve_sfb(times, src_arr, np.array(dst, dtype=np.int64), lengths, gradient_bytes, d, context.bandwidth,
                         root=0, sync_time=sync_time, method=method, time_limit=time_limit, cache=cache, solver=solver)
    return GradientSFB(context.group, root, gradient_ops, gradient_bytes, d, context.bandwidth, option, sync_time,
                       np.array(candidates, dtype=np.int64), members, edges_arr, src_arr, times, lengths, decision)


def _candidates(graph: OpGraph, units: _Units, root: int, admissible, depth: int, max_ops: int) -> list[int]:
    """``root``, then admissible ancestor candidates breadth first up to ``depth`` edges upstream, at most
    ``max_ops`` in all."""
    found, seen, frontier = [root], {root}, [root]
    for _ in range(depth):
        following = []
        for unit in frontier:
            for x in units.members(unit).tolist():
                for j in units.base[graph.predecessors(x)].tolist():
                    if j in seen or not admissible(j):
                        continue
                    if len(found) >= max_ops:
                        return found
                    seen.add(j)
                    found.append(j)
                    following.append(j)
        frontier = following
    return found


def _merge(graph: OpGraph, context: _GroupContext, programs: list[GradientSFB], gradient_of: np.ndarray
           ) -> GroupSFB | None:
    """The union of one group's decisions (module docstring), or None if none changes anything."""
    changed = [x for x in programs if x.decision.changed]
    if not changed:
        return None
    d, tau, piece_bytes = len(context.devices), context.bandwidth, context.piece_bytes
    duplicated = np.unique(np.concatenate([x.duplicated_ops for x in changed]))
    is_duplicated = np.zeros(graph.num_ops, dtype=bool)
    is_duplicated[duplicated] = True
    into = np.concatenate([graph.pred_edge[graph.pred_ptr[i]:graph.pred_ptr[i + 1]] for i in duplicated.tolist()])
    cut = np.sort(into[~is_duplicated[graph.edge_src[into]] & (piece_bytes[into] > 0)])
    producers, first = np.unique(graph.edge_src[cut], return_index=True)
    pieces = np.array([piece_bytes[cut[graph.edge_src[cut] == j]].max() for j in producers.tolist()])  # [C] L_ji
    partial = ~graph.edge_batch_scaled[cut[first]]
    # Every gradient a duplicated candidate produces is whole on every replica: its sync goes, whichever
    # program duplicated it (candidates are admitted only if all their gradients are synchronised here).
    sync_free = duplicated[gradient_of[duplicated]]
    sync = [context.sync[x] for x in sync_free.tolist()]
    gradient_bytes = np.array([s[0] for s in sync])
    return GroupSFB(group=context.group, devices=context.devices, option=changed[0].option, sync_free_ops=sync_free,
                    gradient_bytes=gradient_bytes, duplicated_ops=duplicated, broadcast_ops=producers.astype(np.int64),
                    broadcast_bytes=np.where(partial, pieces, pieces * d), broadcast_partial=partial,
                    broadcast_edges=cut,
                    extra_compute_s=float((d - 1) * context.op_time[duplicated].sum()),
                    broadcast_time_s=float(d * (d - 1) * pieces.sum() / tau),
                    sync_saved_s=float(sum(s[2] for s in sync)),
                    allreduce_bytes_removed=float(gradient_bytes.sum()),
                    broadcast_bytes_added=float(d * (d - 1) * pieces.sum()))


# ------------------------------------------------------------------------------------------------ structure


def _units(graph: OpGraph) -> _Units:
    """Join every ``getitem`` with one input to the op whose output it selects."""
    base = np.arange(graph.num_ops, dtype=np.int64)
    view = np.array([kind == "getitem" for kind in graph.kinds], dtype=bool) & (graph.in_degree() == 1)
    view_ops = np.flatnonzero(view)
    base[view_ops] = graph.pred[graph.pred_ptr[view_ops]]
    while True:  # views of views
        again = base[base]
        if np.array_equal(again, base):
            break
        base = again
    ops = np.argsort(base, kind="stable")
    ptr = np.zeros(graph.num_ops + 1, dtype=np.int64)
    np.cumsum(np.bincount(base, minlength=graph.num_ops), out=ptr[1:])
    return _Units(base, ptr, ops.astype(np.int64))


def _gradient_ops(graph: OpGraph) -> np.ndarray:
    """[N] bool: ops of class ``sum`` (forward or backward) all of whose readers are optimizer ops."""
    readers = graph.out_degree()
    to_optimizer = np.bincount(graph.edge_src[graph.role[graph.edge_dst] == ROLE_OPTIMIZER], minlength=graph.num_ops)
    worker = np.isin(graph.role, (ROLE_FORWARD, ROLE_BACKWARD))
    return worker & (graph.split == SPLIT_SUM) & (readers > 0) & (to_optimizer == readers)


def _synchronised(graph: OpGraph, members: np.ndarray, gradient_of: np.ndarray, assignment: np.ndarray,
                  devices: list[tuple[int, ...]], strategy: Strategy, group: int, d: int, tau: float
                  ) -> dict[int, tuple[float, int, float]]:
    """Gradient ops of ``group`` that the compiler synchronises among its replicas -> (L_gl, option, S).

    Their readers must be in groups on the same devices (elsewhere the compiler gathers partials with an
    AddN instead); the collective is chosen by the readers' group, as the compiler does.
    """
    out = {}
    for op in members[gradient_of[members]].tolist():
        readers = graph.successors(op)
        if any(devices[int(assignment[r])] != devices[group] for r in readers.tolist()):
            continue
        option = PS if int(strategy.option[int(assignment[readers[0]])]) == PS else ALLREDUCE
        nbytes = float(graph.edge_bytes[graph.succ_edge[graph.succ_ptr[op]:graph.succ_ptr[op + 1]]].max())
        sync_time = 2.0 * (d - 1) * nbytes / tau if option == PS else 2.0 * (d - 1) / d * nbytes / tau
        out[op] = (nbytes, option, sync_time)
    return out


def _unit_ok(graph: OpGraph, units: _Units, unit: int, assignment: np.ndarray, group: int, sync: dict) -> bool:
    """The candidate of base op ``unit`` may be duplicated in ``group``: its ops are forward or backward ops
    of the group, its base is not of class ``none`` (it already runs whole), and each op of class ``sum`` in
    it is a gradient synchronised here, or the base read only by its views (a whole sum must never reach an
    op that adds partials: it would be counted D times)."""
    members = units.members(unit)
    if graph.split[unit] == SPLIT_NONE or (assignment[members] != group).any():
        return False
    if not np.isin(graph.role[members], (ROLE_FORWARD, ROLE_BACKWARD)).all():
        return False
    for x in members[graph.split[members] == SPLIT_SUM].tolist():
        if x in sync:
            continue
        if x != unit or not np.isin(graph.successors(x), members).all():
            return False
    return True


# ------------------------------------------------------------------------------------------------ coefficients


def _scaled_times(graph: OpGraph, cluster: Cluster, cost: CostModel) -> np.ndarray:
    """[N, T] the batch-proportional part of each op's time on each GPU type of ``cluster``, whole batch."""
    return np.stack([cost.op_times(graph, gpu, 1.0) - cost.op_times(graph, gpu, 0.0) for gpu in cluster.types], axis=1)


def _extra_time(graph: OpGraph, scaled: np.ndarray, cluster: Cluster, devices: np.ndarray, fractions: np.ndarray
                ) -> np.ndarray:
    """[N] Tᵢ: max over the replicas of (1 − f_r) · scaled time on r's type, per additional copy; 0 for ops of
    class ``none``, which every replica already runs on the whole batch."""
    types = cluster.device_type[devices]
    extra = scaled[:, types] * (1.0 - fractions)[None, :]  # [N, D]
    return np.where(graph.split == SPLIT_NONE, 0.0, extra.max(axis=1) / (len(devices) - 1))


def _broadcast_bytes(graph: OpGraph, d: int) -> np.ndarray:
    """[E] L_ji of every edge for D = ``d`` replicas: one replica's rows, a whole partial, or 0.

    A tensor of class ``sum`` counts as partial wherever its producer is (when the producer's group does not
    split the batch it is in fact whole: the program then overrates its broadcast, on the safe side), so
    that a group's programs depend on no other group's placement.
    """
    src = graph.edge_src
    partial = ~graph.edge_batch_scaled & (graph.split[src] == SPLIT_SUM) & (graph.role[src] != ROLE_INPUT)
    return np.where(graph.edge_batch_scaled, graph.edge_bytes / d, np.where(partial, graph.edge_bytes, 0.0))


def _bottleneck_bandwidth(cluster: Cluster, devices: np.ndarray) -> float:
    """τ: the least bandwidth between two of ``devices``."""
    block = cluster.bandwidth[np.ix_(devices, devices)]
    return float(block[~np.eye(len(devices), dtype=bool)].min())


def _concat(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(arrays).astype(np.int64) if arrays else np.zeros(0, dtype=np.int64)


def _short_kind(kind: str) -> str:
    """"aten.mm.default" → "mm"."""
    parts = kind.split(".")
    return parts[1] if len(parts) >= 2 and parts[0] == "aten" else kind
