"""Where each op group runs under a strategy: replicas, batch intervals, model-parallel pieces (TAG §4.3.1).

A group's :class:`GroupLayout` depends only on its own placement row, option and the batch split, so it
is cached per (group, row) in the :class:`ClusterContext` of the cluster, next to the other
cluster-dependent tables (effective bandwidths, ring and parameter-server parameters). A context is made
by :func:`make_context` and kept in the caller's :class:`~tag.compiler.cache.CompilerCache`.

**Batch rows as intervals.** The global batch is the interval [0, 1). The R replicas of a batch-split
group (all-reduce or PS, R ≥ 2) hold consecutive intervals in device order, of lengths equal to their
batch fractions; a duplicated, model-parallel or single-device group holds [0, 1) on each device.

**Model parallelism.** The ops of the group are divided among its devices by
:func:`tag.grouping.split_group` (METIS, ``tpwgts`` ∝ peak FLOP/s). A *piece* is the ops of one
unit on one device; if the pieces of a unit depend on each other in a cycle (ops that go back and forth
between two devices inside one role), that unit's ops become pieces of their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from tag._arrays import csr_by_key, csr_from_lists
from tag.cluster import Cluster
from tag.cost.comm import hop_bandwidths, ps_phase_latency, ring_parameters
from tag.grouping import quotients_are_dags
from tag.grouping.metis import GroupSplitter
from tag.strategy import MODEL_PARALLEL, SYNC_OPTIONS, Strategy
from tag.compiler.tables import CompilerTables

__all__ = ["GroupLayout", "Piece", "ClusterContext", "make_context", "group_layout", "group_layouts"]

_MAX_CACHED_LAYOUTS = 100_000  # group layouts kept per (grouping, cluster) before the cache is emptied


class Piece(NamedTuple):
    """Ops of one unit of a model-parallel group on one device."""

    unit: int  # the static unit the ops belong to
    device: int
    ops: np.ndarray  # op ids, topological
    duration: float  # seconds on the device, whole batch
    out_rows: float  # transient output bytes (batch-scaled part, whole batch)
    out_fixed: float  # transient output bytes that do not scale


class GroupLayout(NamedTuple):
    """One op group under one strategy row. R devices."""

    group: int
    option: int
    devices: tuple[int, ...]  # [R] ascending
    fraction: tuple[float, ...]  # [R] batch fraction each replica computes
    lo: tuple[float, ...]  # [R] batch interval [lo, hi) each replica holds, in order (lo, hi non-decreasing)
    hi: tuple[float, ...]  # [R]
    split: bool  # the batch is split among ≥ 2 replicas (all-reduce or PS)
    pieces: tuple[Piece, ...] = ()  # model-parallel only
    op_device: dict | None = None  # model-parallel only: op id -> device
    # model-parallel only: (op ids [n], index into pieces of each [n]), every op of a piece
    op_pieces: tuple[np.ndarray, np.ndarray] | None = None
    key: tuple = ()  # (group, placement row, option, batch split): equal keys, equal layouts

    @property
    def model_parallel(self) -> bool:
        return self.option == MODEL_PARALLEL and len(self.devices) > 1


@dataclass(eq=False)
class ClusterContext:
    """Cluster-dependent tables the compiler reads in its inner loops (plain Python lists for speed)."""

    cluster: Cluster
    tables: CompilerTables
    beta: list[list[float]]  # [D][D] point-to-point bandwidth, capped by the NICs between machines
    beta_matrix: np.ndarray  # [D, D] the same, as an array (the rules' kernels read it)
    alpha: list[list[float]]  # [D][D] latency
    type_index: list[int]  # [D] index into cluster.types
    type_array: np.ndarray  # [D] the same, as an array
    machine: list[int]  # [D]
    nic_out: list[int]  # [D] resource id of the device machine's NIC-out, -1 if unlimited
    nic_in: list[int]  # [D]
    nics: list[list[tuple]]  # [D][D] NIC resources a transfer from one device to another holds (sorted)
    transfer_nic_out: np.ndarray  # [D, D] the same as arrays: the NIC-out a transfer holds, -1 if none
    transfer_nic_in: np.ndarray  # [D, D] the NIC-in, -1 if none
    speed: np.ndarray  # [D] peak FLOP/s (for speed splits and model-parallel weights)
    layouts: dict = field(default_factory=dict)
    rings: dict = field(default_factory=dict)
    servers: dict = field(default_factory=dict)
    hops: dict = field(default_factory=dict)  # (src, dst) -> bandwidth of that one hop alone (hop_bandwidths)
    collective_held: dict = field(default_factory=dict)  # devices -> resources a collective over them holds
    blocks: dict = field(default_factory=dict)  # layout key -> its rows (tag.compiler.rows.replica_block)
    unit_rows: Any = None  # what the row kernels read of the units (tag.compiler.rows.UnitRows), made on first use
    placements: dict = field(default_factory=dict)  # (placement row, sync option, batch split) -> _placement
    mp_splits: dict = field(default_factory=dict)
    mp_cuts: dict = field(default_factory=dict)  # (group, device types) -> its model-parallel cut (_cut_group)
    mp_units: dict = field(default_factory=dict)  # group -> its units as model-parallel layouts cut them (_GroupUnits)
    mp_splitters: dict = field(default_factory=dict)  # (group, first device's type) -> its GroupSplitter (split_group)
    mp_op_times: dict = field(default_factory=dict)  # device type -> [N] op seconds the splitters weigh ops by
    # METIS's runs, shared by the splitters: a model-parallel layout splits every group over the same speeds, and
    # groups of repeated layers give METIS equal input (BERT-Large, 60 groups, 16 devices: 12 distinct in 51)
    mp_metis_runs: dict = field(default_factory=dict)
    plans: dict = field(default_factory=dict)  # the compiler's per-bundle plans, keyed by bundle and layouts
    skeletons: dict = field(default_factory=dict)  # bundle plans without bytes, keyed by bundle kind and layouts
    compute_resources: list = field(default_factory=list)  # [D] (device,): a compute task's resources
    _offsets: dict = field(default_factory=dict)

    def offsets(self, devices: tuple[int, ...]) -> dict:
        """{device: position} of a replica list; one shared dict per list, so equal lists compare by identity."""
        found = self._offsets.get(devices)
        if found is None:
            found = self._offsets[devices] = {d: k for k, d in enumerate(devices)}
        return found

    def collective_nics(self, devices: tuple[int, ...]) -> tuple[int, ...]:
        """The NIC resources (both directions, sorted) of the machines of a collective over ``devices`` that
        spans machines: its ring or its parameter server's traffic crosses them, as p2p transfers do."""
        if len({self.machine[d] for d in devices}) < 2:
            return ()
        return tuple(sorted({r for d in devices for r in (self.nic_out[d], self.nic_in[d]) if r >= 0}))

    def ring(self, devices: tuple[int, ...]) -> tuple[float, float]:
        """(slowest hop bandwidth, largest hop latency) of a ring over ``devices`` in order, or the cluster's
        measured collective figures (:func:`tag.cost.comm.ring_parameters`)."""
        found = self.rings.get(devices)
        if found is None:
            found = self.rings[devices] = ring_parameters(self.cluster, devices)[1:]
        return found

    def server(self, devices: tuple[int, ...], ps: int) -> tuple[float, float]:
        """(largest worker latency, Σ_w 1/β_w) of a parameter server on ``ps`` for the other ``devices``."""
        key = (devices, ps)
        found = self.servers.get(key)
        if found is None:
            workers = [w for w in devices if w != ps]
            inverse = sum(1.0 / self._hop(w, ps) for w in workers)
            latency = max((self.alpha[w][ps] for w in workers), default=0.0)
            found = (ps_phase_latency(self.cluster, len(workers) + 1, latency), inverse)
            self.servers[key] = found
        return found


    def _hop(self, src: int, dst: int) -> float:
        """Bandwidth of the one hop from ``src`` to ``dst`` (hop_bandwidths of [(src, dst)]), cached."""
        found = self.hops.get((src, dst))
        if found is None:
            found = self.hops[(src, dst)] = float(hop_bandwidths(self.cluster, [(src, dst)])[0])
        return found


def make_context(cluster: Cluster, tables: CompilerTables) -> ClusterContext:
    """A new context of ``cluster`` for ``tables`` (layouts hold the tables' compute times), its caches empty."""
    d = cluster.num_devices
    machine = np.asarray(cluster.machine)
    nic = np.asarray(cluster.nic_bandwidth, dtype=np.float64)
    bandwidth = np.asarray(cluster.bandwidth, dtype=np.float64).copy()
    cross = machine[:, None] != machine[None, :]
    capped = np.minimum(bandwidth, np.minimum(nic[machine][:, None], nic[machine][None, :]))
    bandwidth = np.where(cross, capped, bandwidth)
    nic_out = [2 * d + int(m) if np.isfinite(nic[m]) else -1 for m in machine]
    nic_in = [2 * d + cluster.num_machines + int(m) if np.isfinite(nic[m]) else -1 for m in machine]
    # a transfer holds its source machine's NIC-out and its destination's NIC-in where the machines differ and
    # the NICs are finite; NIC-out ids are below NIC-in ids, so (out, in) is sorted
    transfer_nic_out = np.where(cross, np.asarray(nic_out)[:, None], -1)  # [D, D] resource id, -1: none
    transfer_nic_in = np.where(cross, np.asarray(nic_in)[None, :], -1)  # [D, D]
    nics = [[tuple(x for x in pair if x >= 0) for pair in zip(out_row, in_row)]
            for out_row, in_row in zip(transfer_nic_out.tolist(), transfer_nic_in.tolist())]
    return ClusterContext(cluster=cluster, tables=tables, beta=bandwidth.tolist(), beta_matrix=bandwidth,
                          alpha=np.asarray(cluster.latency).tolist(), type_index=np.asarray(cluster.device_type).tolist(),
                          type_array=np.asarray(cluster.device_type, dtype=np.int64),
                          machine=machine.tolist(), nic_out=nic_out, nic_in=nic_in, nics=nics,
                          transfer_nic_out=transfer_nic_out, transfer_nic_in=transfer_nic_in,
                          speed=cluster.peak_flops(), compute_resources=[(k,) for k in range(d)])


def group_layout(tables: CompilerTables, context: ClusterContext, strategy: Strategy, group: int) -> GroupLayout:
    """The layout of ``group`` under ``strategy`` (cached per placement row, option and batch split)."""
    return _cached_layout(tables, context, (group, strategy.placement[group].tobytes(), int(strategy.option[group]),
                                            strategy.batch_split))


def group_layouts(tables: CompilerTables, context: ClusterContext, strategy: Strategy,
                  groups: list[int]) -> list[GroupLayout]:
    """:func:`group_layout` of each of ``groups``, their rows read at once (a default fill lays out every group)."""
    m = strategy.placement.shape[1]
    rows = strategy.placement[groups].tobytes()  # each group's row as bytes, one after another
    return [_cached_layout(tables, context, (group, rows[i * m:(i + 1) * m], option, strategy.batch_split))
            for i, (group, option) in enumerate(zip(groups, strategy.option[groups].tolist()))]


def _cached_layout(tables: CompilerTables, context: ClusterContext, key: tuple) -> GroupLayout:
    """The layout of ``key`` = (group, placement row as bytes, option, batch split), made on a miss."""
    layout = context.layouts.get(key)
    if layout is None:
        if len(context.layouts) > _MAX_CACHED_LAYOUTS:
            context.layouts.clear()
            context.blocks.clear()
            context.placements.clear()
        layout = context.layouts[key] = _make_layout(tables, context, key)
    return layout


def _make_layout(tables: CompilerTables, context: ClusterContext, key: tuple) -> GroupLayout:
    """The layout of ``key`` = (group, placement row as bytes, option, batch split)."""
    group, row, option, batch_split = key
    split_option = option in SYNC_OPTIONS
    placed = context.placements.get((row, split_option, batch_split))
    if placed is None:
        mask = np.frombuffer(row, dtype=bool)
        placed = context.placements[(row, split_option, batch_split)] = _placement(context, mask, split_option,
                                                                                   batch_split)
    devices, fraction, lo, hi, split = placed
    if option == MODEL_PARALLEL and len(devices) > 1:
        pieces, op_device, op_pieces = _model_parallel_pieces(tables, context, group, devices)
        return GroupLayout(group, option, devices, fraction, lo, hi, split, pieces, op_device, op_pieces, key)
    return GroupLayout(group, option, devices, fraction, lo, hi, split, (), None, None, key)


def _placement(context: ClusterContext, mask: np.ndarray, split_option: bool, batch_split: str) -> tuple:
    """What a layout takes from its placement row, whatever its group: its (devices, fraction, lo, hi, split)
    fields."""
    devices = np.flatnonzero(mask[context.cluster.device_group])
    r = devices.size
    split = split_option and r >= 2
    if split:
        weight = context.speed[devices] if batch_split == "speed" else np.ones(r)
        fraction = weight / weight.sum()
        hi = np.cumsum(fraction)
        hi[-1] = 1.0
        lo = np.concatenate([[0.0], hi[:-1]])
    else:
        fraction, lo, hi = np.ones(r), np.zeros(r), np.ones(r)
    return tuple(devices.tolist()), tuple(fraction.tolist()), tuple(lo.tolist()), tuple(hi.tolist()), split


def _model_parallel_pieces(tables: CompilerTables, context: ClusterContext, group: int, devices: tuple[int, ...]):
    """(pieces, op → device, (op ids, piece of each)) of a model-parallel group: split_group's op → device
    map, cut by units (module docstring)."""
    key = (group, devices)
    cached = context.mp_splits.get(key)
    if cached is not None:
        return cached
    # split_group sees the devices only through their types (speeds, the first one's GPU), and the cut into
    # pieces only through their order and types: device sets of one type sequence share the cut
    types = tuple(context.type_index[d] for d in devices)
    cut = context.mp_cuts.get((group, types))
    if cut is None:
        cut = context.mp_cuts[(group, types)] = _cut_group(tables, context, group, devices)
    device_array = np.asarray(devices)
    pieces = tuple(map(Piece, cut.unit, device_array[cut.slot].tolist(), cut.ops, cut.duration, cut.out_rows,
                       cut.out_fixed))
    op_device = dict(zip(tables.group_graph.group_members(group).tolist(), device_array[cut.where].tolist()))
    result = context.mp_splits[key] = pieces, op_device, cut.op_pieces
    return result


class _Cut(NamedTuple):
    """A model-parallel group cut into pieces on a sequence of device types, devices by their index."""

    where: np.ndarray  # [ops of the group, ascending ids] index of each op's device (split_group)
    slot: np.ndarray  # [pieces] index of each piece's device
    unit: list[int]  # [pieces] each piece's unit
    ops: list[np.ndarray]  # [pieces] each piece's ops, topological
    duration: list[float]  # [pieces] seconds on its device (Piece)
    out_rows: list[float]  # [pieces]
    out_fixed: list[float]  # [pieces]
    op_pieces: tuple[np.ndarray, np.ndarray]  # (op ids, index of each one's piece)


def _cut_group(tables: CompilerTables, context: ClusterContext, group: int, devices: tuple[int, ...]) -> _Cut:
    """The pieces of a model-parallel group on ``devices``: each unit's ops on one device, in ascending
    device index; a unit whose device pieces depend on each other in a cycle gives one piece per op. A piece's
    sums are np.add.reduceat's over its ops (within a few ulp of np.sum's: reduceat adds in its own order)."""
    gg = tables.group_graph
    graph = gg.op_graph
    key = (group, context.type_index[devices[0]])
    splitter = context.mp_splitters.get(key)
    if splitter is None:
        op_times = context.mp_op_times.get(key[1])
        if op_times is None:  # every group's splitter weighs its ops by these: computed once per type
            op_times = context.mp_op_times[key[1]] = gg.cost.op_times(graph, context.cluster.gpu(devices[0]))
        splitter = context.mp_splitters[key] = GroupSplitter(graph, gg.group_members(group), op_times=op_times,
                                                             runs=context.mp_metis_runs)
    where = splitter.split(context.speed[list(devices)])  # [len(ops)] index into devices (split_group)
    units = _group_units(tables, context, group)
    slot = where[units.position]  # [n] device index of each op, unit by unit
    first = units.ptr[:-1]
    # a piece per (unit, device index), or per (unit, op) where the unit's device pieces form a cycle:
    # sorted (stably, so each piece's ops stay topological) by unit, then device index or op
    span = len(devices) + slot.size
    piece_key = units.unit_index * span + slot
    split = np.flatnonzero(np.minimum.reduceat(slot, first) != np.maximum.reduceat(slot, first))
    if split.size:
        cyclic = split[~quotients_are_dags(units.ptr, units.edge_ptr, units.edge_src, units.edge_dst, slot, split)]
        for i in cyclic.tolist():
            a, b = units.ptr[i], units.ptr[i + 1]
            piece_key[a:b] = i * span + len(devices) + np.arange(b - a)
    order = np.argsort(piece_key, kind="stable")
    piece_key = piece_key[order]
    starts = np.flatnonzero(np.diff(piece_key, prepend=-1))  # keys are >= 0; none for a group without units
    ends = np.append(starts[1:], piece_key.size)[:starts.size]
    ops, slot = units.ops[order], slot[order]
    op_type = context.type_array[np.asarray(devices)][slot]

    def sums(values: np.ndarray) -> np.ndarray:  # [pieces]
        return np.add.reduceat(values, starts) if starts.size else np.zeros(0)

    duration = sums(tables.op_time_fixed[ops, op_type]) + sums(tables.op_time_scaled[ops, op_type])
    return _Cut(where, slot[starts], units.units[units.unit_index[order[starts]]].tolist(),
                [ops[a:b] for a, b in zip(starts.tolist(), ends.tolist())], duration.tolist(),
                sums(tables.op_out_rows[ops]).tolist(), sums(tables.op_out_fixed[ops]).tolist(),
                (ops, np.repeat(np.arange(starts.size), ends - starts)))


class _GroupUnits(NamedTuple):
    """A group's units as :func:`_cut_group` cuts them (the same for every model-parallel layout)."""

    units: np.ndarray  # [U] unit ids (tables.group_units)
    ptr: np.ndarray  # [U+1] CSR of their ops in ``ops``
    ops: np.ndarray  # [n] op ids, unit by unit, each unit's topological (tables.unit_ops)
    unit_index: np.ndarray  # [n] index into ``units`` of each op's unit
    position: np.ndarray  # [n] index of each op among the group's ops (ascending ids, as split_group's map)
    edge_ptr: np.ndarray  # [U+1] CSR of the op graph's edges inside each unit
    edge_src: np.ndarray  # [e] their ends, as indices among the unit's ops
    edge_dst: np.ndarray  # [e]


def _group_units(tables: CompilerTables, context: ClusterContext, group: int) -> _GroupUnits:
    """The units of ``group`` with their ops and the edges inside them; made for every group at once, on the
    first cut (cached in the context)."""
    found = context.mp_units.get(group)
    if found is not None:
        return found
    gg = tables.group_graph
    graph = gg.op_graph
    units_by_group = [tables.group_units[g] for g in range(gg.num_groups)]
    units = np.concatenate(units_by_group)
    ptr, ops = csr_from_lists([tables.unit_ops[u] for u in units.tolist()])
    unit_index = np.repeat(np.arange(units.size), np.diff(ptr))
    local = np.arange(ops.size) - ptr[unit_index]  # index of each op among its unit's
    op_position = np.full(graph.num_ops, -1, dtype=np.int64)  # [N] index into ``ops``, -1: in no unit
    op_position[ops] = np.arange(ops.size)
    a, b = op_position[graph.edge_src], op_position[graph.edge_dst]
    inside = (a >= 0) & (b >= 0)
    a, b = a[inside], b[inside]
    inside = unit_index[a] == unit_index[b]
    a, b = a[inside], b[inside]
    edge_ptr, by_unit = csr_by_key(units.size, unit_index[a])
    a, b = a[by_unit], b[by_unit]
    unit_bound = np.zeros(gg.num_groups + 1, dtype=np.int64)
    np.cumsum([u.size for u in units_by_group], out=unit_bound[1:])
    for g in range(gg.num_groups):
        u0, u1 = unit_bound[g], unit_bound[g + 1]
        o0, o1, e0, e1 = ptr[u0], ptr[u1], edge_ptr[u0], edge_ptr[u1]
        group_ops = ops[o0:o1]
        context.mp_units[g] = _GroupUnits(units[u0:u1], ptr[u0:u1 + 1] - o0, group_ops, unit_index[o0:o1] - u0,
                                          np.searchsorted(gg.group_members(g), group_ops), edge_ptr[u0:u1 + 1] - e0,
                                          local[a[e0:e1]], local[b[e0:e1]])
    return context.mp_units[group]
