"""A replicated group's rows, written once for ``compile_strategy`` and the search's evaluator: its compute
tasks unit-major then replica (each unit's seconds on each replica's device at its batch fraction), the output
tensor of each unit that outputs on each replica, and the dependencies and reads between its units that read
each other, replica by replica. The compiler takes them from :func:`replica_block`; the evaluator's fragments
from :func:`_replica_fragments` (or, compact, from :func:`~tag.compiler.assemble._assemble`, which lists them
with :func:`_replica_rows` and :func:`compute_seconds`)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tag._arrays import csr_from_lists
from tag._compiled import jit
from tag.compiler._inline import inline_jit
from tag.compiler.layout import ClusterContext, GroupLayout
from tag.compiler.tables import CompilerTables

__all__ = ["UnitRows", "unit_rows", "compute_seconds", "replica_block"]


class UnitRows(NamedTuple):
    """What the row kernels read of each group's units (U units, G groups, L pairs of units reading each other)."""

    unit_position: np.ndarray  # [U] index of each unit among its group's units
    unit_ptr: np.ndarray  # [G+1] each group's units in unit_ids (CSR)
    unit_ids: np.ndarray  # [units] the groups' units, group by group
    # [units, in unit_ids' order] rank of each unit among its group's units that output (a unit outputs on every
    # replica or on none: its batch-scaled or its fixed bytes are non-zero), -1 for the others
    unit_rank: np.ndarray
    local_ptr: np.ndarray  # [G+1] each group's pairs of units that read each other's outputs (CSR)
    local_src: np.ndarray  # [L] the reading pair's source, as an index among its group's units
    local_dst: np.ndarray  # [L] its reader, the same; in unit order, then the order of unit_local_succ
    times: tuple  # (device_type [D], unit_time_fixed [U, types], unit_time_scaled [U, types])


def unit_rows(tables: CompilerTables, context: ClusterContext) -> UnitRows:
    """The :class:`UnitRows` of ``tables`` on ``context``'s devices (made once per context)."""
    if context.unit_rows is not None:
        return context.unit_rows
    position = np.zeros(tables.num_units, dtype=np.int64)
    for units in tables.group_units:
        position[units] = np.arange(units.size)
    unit_ptr, unit_ids = csr_from_lists(tables.group_units)
    outputs = (tables.unit_out_rows[unit_ids] > 0) | (tables.unit_out_fixed[unit_ids] > 0)
    unit_rank = np.full(unit_ids.size, -1, dtype=np.int64)
    for begin, end in zip(unit_ptr[:-1].tolist(), unit_ptr[1:].tolist()):
        unit_rank[begin:end][outputs[begin:end]] = np.arange(int(outputs[begin:end].sum()))
    succ = tables.unit_local_succ
    local = [[(position[u], position[v]) for u in units.tolist() for v in succ[u]] for units in tables.group_units]
    local_ptr = np.zeros(len(local) + 1, dtype=np.int64)
    np.cumsum([len(pairs) for pairs in local], out=local_ptr[1:])
    local_src = np.array([a for pairs in local for a, _ in pairs], dtype=np.int64)
    local_dst = np.array([b for pairs in local for _, b in pairs], dtype=np.int64)
    times = (context.type_array, tables.unit_time_fixed, tables.unit_time_scaled)
    context.unit_rows = UnitRows(position, unit_ptr, unit_ids, unit_rank, local_ptr, local_src, local_dst, times)
    return context.unit_rows


def replica_block(tables: CompilerTables, context: ClusterContext, layout: GroupLayout) -> tuple:
    """The rows of a replicated layout as the compiler appends them, numbered from 0 (cached per layout):
    (duration, device, label (lists, [tasks]), dep_task, dep_on, tensor_device, tensor_bytes, tensor_producer,
    read_tensor, read_task (arrays), tensor_first [units] (each unit's first output tensor, -1)); every
    dependency between its units listed, no persistent tensors (the compiler sums those per device)."""
    found = context.blocks.get(layout.key)
    if found is not None:
        return found
    rows = unit_rows(tables, context)
    g, r = layout.group, len(layout.devices)
    local_dep = np.ones(rows.local_src.size, dtype=np.bool_)
    (res, duration, dep_task, dep_on, tensor_device, tensor_bytes, tensor_producer, _, read_tensor, read_task,
     tensor_first, _, _) = _replica_fragments(
        np.array([g], dtype=np.int64), np.array([0, r], dtype=np.int64), np.array(layout.devices, dtype=np.int64),
        np.array(layout.fraction, dtype=np.float64), rows.unit_ptr, rows.unit_ids, rows.unit_rank,
        tables.unit_out_rows, tables.unit_out_fixed, rows.local_ptr, rows.local_src, rows.local_dst, local_dep,
        np.zeros(tables.group_param_bytes.size), context.cluster.num_devices, True, rows.times)
    labels = [label for unit in tables.group_units[g].tolist() for label in [tables.unit_label[unit]] * r]
    found = context.blocks[layout.key] = (duration.tolist(), res.tolist(), labels, dep_task, dep_on,
                                          tensor_device.tolist(), tensor_bytes.tolist(), tensor_producer,
                                          read_tensor, read_task, tensor_first.tolist())
    return found


@inline_jit
def compute_seconds(unit_time_fixed, unit_time_scaled, unit, device_type, fraction):
    """Seconds of unit ``unit`` on a device of type ``device_type`` at batch fraction ``fraction``: its fixed
    time plus its batch-scaled time times the fraction."""
    return unit_time_fixed[unit, device_type] + unit_time_scaled[unit, device_type] * fraction


@jit
def _replica_rows(g, r, devices, fractions, first, unit_ptr, unit_ids, unit_rank, unit_out_rows, unit_out_fixed,
                  local_ptr, local_src, local_dst, local_dep, persistent, task_base, tensor_base, dep_task, dep_on,
                  read_tensor, read_task, tensor_device, tensor_bytes, tensor_producer, tensor_persistent, e, q, n):
    """Write the rows of group ``g`` replicated on the R = ``r`` devices ``devices[first:first + r]`` with batch
    fractions ``fractions[first:first + r]``, as ``_Compiler.group_fragment`` lists them: its tasks are
    unit-major then replica (unit u's replica j is task ``task_base + u * r + j``, on the j-th device); every
    pair of its units that read each other (``local_src -> local_dst``, CSR ``local_ptr``, unit indices) adds
    a dependency per replica where ``local_dep`` says so, at ``e``, and a read per replica where the source
    outputs, at ``q``; each unit that outputs (``unit_rank`` >= 0: its rank among them) has a tensor per
    replica, numbered in unit order from ``tensor_base`` and written at ``n``, of the layout's bytes
    (batch-scaled bytes times the fraction, plus the fixed ones); then, if the group has persistent bytes, one
    persistent tensor per device. Returns the next (e, q, n)."""
    first_unit = unit_ptr[g]
    for i in range(local_ptr[g], local_ptr[g + 1]):
        if not local_dep[i]:
            continue
        for j in range(r):
            dep_task[e] = task_base + local_dst[i] * r + j
            dep_on[e] = task_base + local_src[i] * r + j
            e += 1
    for i in range(local_ptr[g], local_ptr[g + 1]):
        rank = unit_rank[first_unit + local_src[i]]
        if rank >= 0:
            for j in range(r):
                read_tensor[q] = tensor_base + rank * r + j
                read_task[q] = task_base + local_dst[i] * r + j
                q += 1
    for u in range(unit_ptr[g + 1] - first_unit):
        if unit_rank[first_unit + u] >= 0:
            unit = unit_ids[first_unit + u]
            for j in range(r):
                tensor_device[n] = devices[first + j]
                tensor_bytes[n] = unit_out_rows[unit] * fractions[first + j] + unit_out_fixed[unit]
                tensor_producer[n] = task_base + u * r + j
                tensor_persistent[n] = False
                n += 1
    if persistent[g] > 0:
        for j in range(r):
            tensor_device[n] = devices[first + j]
            tensor_bytes[n] = persistent[g]
            tensor_producer[n] = -1
            tensor_persistent[n] = True
            n += 1
    return e, q, n


@jit
def _replica_fragments(groups, device_ptr, devices, fractions, unit_ptr, unit_ids, unit_rank, unit_out_rows,
                       unit_out_fixed, local_ptr, local_src, local_dst, local_dep, persistent, num_devices, rows, times):
    """The group fragments of F replicated layouts, one after another: layout f is group ``groups[f]`` on the
    R devices ``devices[device_ptr[f]:device_ptr[f + 1]]`` with batch fractions ``fractions`` (the same
    slice), its rows as :func:`_replica_rows` writes them, references relative to the fragment. Returns
    (res [tasks]: each task's device, duration [tasks] (:func:`compute_seconds` of ``times``: device_type [D],
    unit_time_fixed [U, types], unit_time_scaled [U, types]), dep_task, dep_on, tensor_device, tensor_bytes, tensor_producer,
    tensor_persistent, read_tensor, read_task, tensor_first (each unit's first output tensor, -1; units of
    layout f after the earlier layouts'), index [F, D] (replica of each device, -1), counts [F, 6]: tasks,
    resources, dependencies, tensors, reads and output tensors of each fragment). Without ``rows`` (compact
    fragments: :func:`~tag.compiler.assemble._assemble` writes them) the resource, duration, dependency, tensor
    and read columns are empty and only the counts, the units' first output tensors and the index are taken."""
    device_type, unit_time_fixed, unit_time_scaled = times
    f_count = groups.size
    counts = np.zeros((f_count, 6), dtype=np.int64)
    units_total = 0
    for f in range(f_count):
        g = groups[f]
        r = device_ptr[f + 1] - device_ptr[f]
        units = unit_ptr[g + 1] - unit_ptr[g]
        outputs = 0
        for u in range(unit_ptr[g], unit_ptr[g + 1]):
            outputs += unit_rank[u] >= 0
        reads = 0
        deps = 0
        for i in range(local_ptr[g], local_ptr[g + 1]):
            reads += unit_rank[unit_ptr[g] + local_src[i]] >= 0
            deps += local_dep[i]
        counts[f, 0] = counts[f, 1] = units * r
        counts[f, 2] = deps * r
        counts[f, 3] = (outputs + (persistent[g] > 0)) * r
        counts[f, 4] = reads * r
        counts[f, 5] = outputs * r
        units_total += units
    totals = counts.sum(axis=0) if rows else np.zeros(6, dtype=np.int64)
    res = np.empty(totals[0], dtype=np.int64)
    duration = np.empty(totals[0])
    dep_task = np.empty(totals[2], dtype=np.int64)
    dep_on = np.empty(totals[2], dtype=np.int64)
    tensor_device = np.empty(totals[3], dtype=np.int64)
    tensor_bytes = np.empty(totals[3])
    tensor_producer = np.empty(totals[3], dtype=np.int64)
    tensor_persistent = np.zeros(totals[3], dtype=np.bool_)
    read_tensor = np.empty(totals[4], dtype=np.int64)
    read_task = np.empty(totals[4], dtype=np.int64)
    tensor_first = np.empty(units_total, dtype=np.int64)
    index = np.full((f_count, num_devices), -1, dtype=np.int64)
    t = 0
    w = 0  # into tensor_first
    e = q = n = 0
    for f in range(f_count):
        g = groups[f]
        first = device_ptr[f]
        r = device_ptr[f + 1] - first
        units = unit_ptr[g + 1] - unit_ptr[g]
        for k in range(r):
            index[f, devices[first + k]] = k
        for u in range(units):
            if rows:
                unit = unit_ids[unit_ptr[g] + u]
                for k in range(r):
                    res[t + u * r + k] = devices[first + k]
                    duration[t + u * r + k] = compute_seconds(unit_time_fixed, unit_time_scaled, unit,
                                                              device_type[devices[first + k]], fractions[first + k])
            rank = unit_rank[unit_ptr[g] + u]
            tensor_first[w + u] = rank * r if rank >= 0 else -1
        if rows:
            e, q, n = _replica_rows(g, r, devices, fractions, first, unit_ptr, unit_ids, unit_rank, unit_out_rows,
                                    unit_out_fixed, local_ptr, local_src, local_dst, local_dep, persistent, 0, 0,
                                    dep_task, dep_on, read_tensor, read_task, tensor_device, tensor_bytes,
                                    tensor_producer, tensor_persistent, e, q, n)
        t += units * r
        w += units
    return (res, duration, dep_task, dep_on, tensor_device, tensor_bytes, tensor_producer, tensor_persistent, read_tensor,
            read_task, tensor_first, index, counts)
