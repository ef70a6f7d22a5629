"""Assembly: the cached fragments of one strategy laid out as ``compile_strategy`` lays out its tasks, as the
global columns the simulator's kernels read (:mod:`tag.compiler.evaluate`)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tag._compiled import jit
from tag.sim.taskgraph import RES_LINK, TASK_COMPUTE
from tag.compiler.arena import (_COMPACT, _DEP0, _DEPS, _EARLY, _IN_SEGMENT, _READ0, _READS, _REPLICAS, _RES,
                                _RES0, _SEGMENT_SHIFT, _TASK0, _TASKS, _TEN0, _TENS)
from tag.compiler.rows import _replica_rows, compute_seconds

class _Assembled(NamedTuple):
    """Global columns of one strategy's TaskGraph (T tasks, N tensors, K tensor reads, E dependencies); ids
    and counts are int32, which keeps the kernels' working set in cache."""

    duration: np.ndarray  # [T]
    kind: np.ndarray  # [T] int8
    group: np.ndarray  # [T]
    res_ptr: np.ndarray  # [T+1]
    res: np.ndarray  # resource ids, links renumbered by first use
    link_dense: np.ndarray  # [L] src * D + dst of each link resource, in resource order
    dep_task: np.ndarray  # [E] waits for dep_on
    dep_on: np.ndarray  # [E]
    dep_lag: np.ndarray  # [E] seconds after dep_on starts at which the dependency is met (lags: all empty
    #                      where no chunks are merged, every dependency and tensor then ordinary)
    tensor_device: np.ndarray  # [N]
    tensor_bytes: np.ndarray  # [N]
    tensor_producer: np.ndarray  # [N] task or -1
    alloc_lag: np.ndarray  # [N] seconds after its producer starts at which the tensor is allocated
    free_lag: np.ndarray  # [N] ... at which its producer is done with it
    tensor_persistent: np.ndarray  # [N] bool
    read_tensor: np.ndarray  # [K]
    read_task: np.ndarray  # [K]
    read_lag: np.ndarray  # [K] seconds after read_task starts at which it is done with the tensor



@jit
def _assemble(fragments, arena, compact, units, lagged, link_base, num_devices):
    """Global columns (see :class:`_Assembled`; indices int32) of one strategy's fragments, laid out as
    compile_strategy lays out its tasks: compute blocks in the groups' topological order, then the pairs'
    early tasks, then their late tasks.

    ``fragments``: (meta [F, _META] the fragment table, group_order [G], group_fragment [G] (by group),
    pair_fragment [P], pair_p [P], pair_c [P]: the pairs' groups). ``arena``: the arena's columns
    (:data:`~tag.compiler.arena._ARENA_COLUMNS`; lags read only when ``lagged``). ``compact``: (device, fraction)
    of compact fragments' replicas, whose rows are computed here as
    :func:`~tag.compiler.rows.compute_seconds` gives its durations and
    :func:`~tag.compiler.rows._replica_rows` lists its rows, from ``units``: (device_type [D],
    unit_ptr [G+1], unit_ids, unit_rank, unit_time_fixed [U, T], unit_time_scaled [U, T], unit_out_rows [U],
    unit_out_fixed [U], local_ptr [G+1], local_src, local_dst, local_dep, persistent [G])."""
    meta, group_order, group_fragment, pair_fragment, pair_p, pair_c = fragments
    used, task_base, tensor_base, tasks, tensors = _bases(meta, group_order, group_fragment, pair_fragment, pair_p,
                                                          pair_c)
    task_columns = _write_tasks(meta, used, task_base, group_order.size, group_order, pair_c, tasks, arena, compact,
                                units, link_base, num_devices)
    references = _write_references(meta, used, task_base, tensor_base, tensors, arena, compact, units, lagged)
    return task_columns + references


@jit
def _bases(meta, group_order, group_fragment, pair_fragment, pair_p, pair_c):
    """Where each fragment lands: (used [groups + pairs]: the fragments in layout order, groups then pairs;
    task_base [used, 4]: the global id of the first task of each segment of a fragment's task references
    (P's block, C's block, early own, late own: :func:`~tag.compiler.arena._segmented`); tensor_base
    [used, 3]: the same for tensors (P's, C's, own); the tasks and the tensors in all)."""
    num_groups, num_pairs = group_order.size, pair_fragment.size
    used = np.empty(num_groups + num_pairs, dtype=np.int64)
    task_base = np.zeros((num_groups + num_pairs, 4), dtype=np.int64)
    tensor_base = np.zeros((num_groups + num_pairs, 3), dtype=np.int64)
    group_task = np.empty(num_groups, dtype=np.int64)  # group -> first task of its block
    group_tensor = np.empty(num_groups, dtype=np.int64)
    tasks = 0
    tensors = 0
    for k in range(num_groups):
        g = group_order[k]
        f = group_fragment[g]
        used[k] = f
        task_base[k, 2] = tasks
        task_base[k, 3] = tasks + meta[f, _EARLY]
        group_task[g] = tasks
        tasks += meta[f, _TASKS]
        tensor_base[k, 2] = tensors
        group_tensor[g] = tensors
        tensors += meta[f, _TENS]
    for k in range(num_pairs):
        f = pair_fragment[k]
        used[num_groups + k] = f
        task_base[num_groups + k, 0] = group_task[pair_p[k]]
        task_base[num_groups + k, 1] = group_task[pair_c[k]]
        task_base[num_groups + k, 2] = tasks
        tensor_base[num_groups + k, 0] = group_tensor[pair_p[k]]
        tensor_base[num_groups + k, 1] = group_tensor[pair_c[k]]
        tasks += meta[f, _EARLY]
    for k in range(num_pairs):
        f = pair_fragment[k]
        task_base[num_groups + k, 3] = tasks
        tasks += meta[f, _TASKS] - meta[f, _EARLY]
        tensor_base[num_groups + k, 2] = tensors
        tensors += meta[f, _TENS]
    return used, task_base, tensor_base, tasks, tensors


@jit
def _runs(meta, used, num_groups, group_order, pair_c, a_nres):
    """Runs of tasks in global order: every fragment's early tasks (compute blocks, then the pairs'
    transfers), then the pairs' late tasks. Returns ([runs] fragment, group of its tasks (a group fragment's
    own; a pair's tasks are its consumer's), first and end task inside the fragment, arena offset of the first
    one's resources; the number of runs; the resources in all)."""
    num_used = used.size
    run_fragment = np.empty(2 * num_used - num_groups, dtype=np.int64)
    run_group = np.empty(2 * num_used - num_groups, dtype=np.int64)
    run_begin = np.empty(2 * num_used - num_groups, dtype=np.int64)
    run_end = np.empty(2 * num_used - num_groups, dtype=np.int64)
    run_res = np.empty(2 * num_used - num_groups, dtype=np.int64)
    num_res = 0
    for k in range(num_used):
        f = used[k]
        run_fragment[k], run_begin[k], run_end[k], run_res[k] = f, 0, meta[f, _EARLY], meta[f, _RES0]
        run_group[k] = group_order[k] if k < num_groups else pair_c[k - num_groups]
        num_res += meta[f, _RES]
    runs = num_used
    for k in range(num_groups, num_used):
        f = used[k]
        if meta[f, _TASKS] > meta[f, _EARLY]:
            run_group[runs] = pair_c[k - num_groups]
            offset = meta[f, _RES0]
            for i in range(meta[f, _TASK0], meta[f, _TASK0] + meta[f, _EARLY]):
                offset += a_nres[i]
            run_fragment[runs], run_begin[runs], run_end[runs] = f, meta[f, _EARLY], meta[f, _TASKS]
            run_res[runs] = offset
            runs += 1
    return run_fragment, run_group, run_begin, run_end, run_res, runs, num_res


@jit
def _write_tasks(meta, used, task_base, num_groups, group_order, pair_c, tasks, arena, compact, units, link_base,
                 num_devices):
    """(duration, kind, group, res_ptr, res, link_dense) of the assembly's ``tasks`` tasks (:func:`_assemble`),
    run by run; links renumbered by first use (link_dense: src * D + dst of each, in resource order)."""
    a_duration, a_kind, a_nres, a_res = arena[0], arena[1], arena[2], arena[3]
    c_device, c_fraction = compact
    device_type, unit_ptr, unit_ids, unit_time_fixed, unit_time_scaled = units[0], units[1], units[2], units[4], \
        units[5]
    run_fragment, run_group, run_begin, run_end, run_res, runs, num_res = _runs(meta, used, num_groups, group_order,
                                                                                pair_c, a_nres)
    duration = np.empty(tasks)
    kind = np.empty(tasks, dtype=np.int8)
    group = np.empty(tasks, dtype=np.int32)
    res_ptr = np.empty(tasks + 1, dtype=np.int32)
    res = np.empty(num_res, dtype=np.int32)
    rank = np.full(num_devices * num_devices, -1, dtype=np.int64)  # dense link -> its rank by first use
    link_dense = np.empty(num_devices * num_devices, dtype=np.int64)
    links = 0
    t = 0
    h = 0
    for run in range(runs):
        f = run_fragment[run]
        g = meta[f, _COMPACT]
        if g >= 0:  # compact: unit-major then replica, each task on its replica's device
            first_replica, r = meta[f, _RES0], meta[f, _REPLICAS]
            for i in range(unit_ptr[g], unit_ptr[g + 1]):
                unit = unit_ids[i]
                for k in range(first_replica, first_replica + r):
                    device = c_device[k]
                    duration[t] = compute_seconds(unit_time_fixed, unit_time_scaled, unit, device_type[device],
                                                  c_fraction[k])
                    kind[t] = TASK_COMPUTE
                    group[t] = g
                    res_ptr[t] = h
                    res[h] = device
                    h += 1
                    t += 1
            continue
        offset = run_res[run]
        g = run_group[run]
        for i in range(meta[f, _TASK0] + run_begin[run], meta[f, _TASK0] + run_end[run]):
            duration[t] = a_duration[i]
            kind[t] = a_kind[i]
            group[t] = g
            res_ptr[t] = h
            for j in range(offset, offset + a_nres[i]):
                r = np.int64(a_res[j])
                if r >= link_base:
                    dense = r - link_base
                    if rank[dense] < 0:
                        rank[dense] = links
                        link_dense[links] = dense
                        links += 1
                    r = link_base + rank[dense]
                res[h] = r
                h += 1
            offset += a_nres[i]
            t += 1
    res_ptr[tasks] = h
    return duration, kind, group, res_ptr, res, link_dense[:links].copy()


@jit
def _write_references(meta, used, task_base, tensor_base, tensors, arena, compact, units, lagged):
    """(dep_task, dep_on, dep_lag, tensor_device, tensor_bytes, tensor_producer, alloc_lag, free_lag,
    tensor_persistent, read_tensor, read_task, read_lag) of the assembly (:func:`_assemble`): each fragment's
    references placed by their segment's base; a compact fragment's rows listed by
    :func:`~tag.compiler.rows._replica_rows`. Lags only where chunks are merged (``lagged``; otherwise
    empty: every dependency and tensor is ordinary)."""
    (_, _, _, _, a_dep_task, a_dep_on, a_dep_lag, a_tensor_device, a_tensor_bytes, a_tensor_producer, a_alloc_lag,
     a_free_lag, a_tensor_persistent, a_read_tensor, a_read_task, a_read_lag) = arena
    c_device, c_fraction = compact
    (_, unit_ptr, unit_ids, unit_rank, _, _, unit_out_rows, unit_out_fixed, local_ptr, local_src, local_dst,
     local_dep, persistent) = units
    num_deps = 0
    num_reads = 0
    for k in range(used.size):
        num_deps += meta[used[k], _DEPS]
        num_reads += meta[used[k], _READS]
    dep_task = np.empty(num_deps, dtype=np.int32)
    dep_on = np.empty(num_deps, dtype=np.int32)
    dep_lag = np.empty(num_deps if lagged else 0)
    read_lag = np.empty(num_reads if lagged else 0)
    alloc_lag = np.empty(tensors if lagged else 0)
    free_lag = np.empty(tensors if lagged else 0)
    read_tensor = np.empty(num_reads, dtype=np.int32)
    read_task = np.empty(num_reads, dtype=np.int32)
    tensor_device = np.empty(tensors, dtype=np.int32)
    tensor_bytes = np.empty(tensors)
    tensor_producer = np.empty(tensors, dtype=np.int32)
    tensor_persistent = np.empty(tensors, dtype=np.bool_)
    e = 0
    q = 0
    for k in range(used.size):
        f = used[k]
        bases = task_base[k]
        tbases = tensor_base[k]
        g = meta[f, _COMPACT]
        if g >= 0:  # compact (never lagged)
            e, q, _ = _replica_rows(g, meta[f, _REPLICAS], c_device, c_fraction, meta[f, _RES0], unit_ptr, unit_ids,
                                    unit_rank, unit_out_rows, unit_out_fixed, local_ptr, local_src, local_dst,
                                    local_dep, persistent, bases[2], tbases[2], dep_task, dep_on, read_tensor,
                                    read_task, tensor_device, tensor_bytes, tensor_producer, tensor_persistent, e, q,
                                    tbases[2])
            continue
        for i in range(meta[f, _DEP0], meta[f, _DEP0] + meta[f, _DEPS]):
            ref = a_dep_task[i]
            dep_task[e] = bases[ref >> _SEGMENT_SHIFT] + (ref & _IN_SEGMENT)
            ref = a_dep_on[i]
            dep_on[e] = bases[ref >> _SEGMENT_SHIFT] + (ref & _IN_SEGMENT)
            if lagged:
                dep_lag[e] = a_dep_lag[i]
            e += 1
        for i in range(meta[f, _READ0], meta[f, _READ0] + meta[f, _READS]):
            ref = a_read_task[i]
            read_task[q] = bases[ref >> _SEGMENT_SHIFT] + (ref & _IN_SEGMENT)
            ref = a_read_tensor[i]
            read_tensor[q] = tbases[ref >> _SEGMENT_SHIFT] + (ref & _IN_SEGMENT)
            if lagged:
                read_lag[q] = a_read_lag[i]
            q += 1
        n = tbases[2]
        for a in range(meta[f, _TEN0], meta[f, _TEN0] + meta[f, _TENS]):
            tensor_device[n] = a_tensor_device[a]
            tensor_bytes[n] = a_tensor_bytes[a]
            tensor_persistent[n] = a_tensor_persistent[a]
            if lagged:
                alloc_lag[n] = a_alloc_lag[a]
                free_lag[n] = a_free_lag[a]
            ref = a_tensor_producer[a]
            tensor_producer[n] = -1 if ref < 0 else bases[ref >> _SEGMENT_SHIFT] + (ref & _IN_SEGMENT)
            n += 1
    return (dep_task, dep_on, dep_lag, tensor_device, tensor_bytes, tensor_producer, alloc_lag, free_lag,
            tensor_persistent, read_tensor, read_task, read_lag)


@jit
def _resource_columns(fixed_kind, fixed_a, link_dense, num_devices):
    """(kind [R], a [R], b [R]) of an assembly's resources: the fixed ones (``fixed_kind``, ``fixed_a``; b -1),
    then its links in order (``link_dense``: src * D + dst; a and b their devices)."""
    fixed = fixed_kind.size
    kind = np.empty(fixed + link_dense.size, dtype=np.int8)
    a = np.empty(fixed + link_dense.size, dtype=np.int64)
    b = np.full(fixed + link_dense.size, -1, dtype=np.int64)
    kind[:fixed] = fixed_kind
    a[:fixed] = fixed_a
    for k in range(link_dense.size):
        kind[fixed + k] = RES_LINK
        a[fixed + k] = link_dense[k] // num_devices
        b[fixed + k] = link_dense[k] % num_devices
    return kind, a, b
