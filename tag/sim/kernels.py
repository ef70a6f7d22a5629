"""Compiled kernels of the fast simulator: list scheduling, dependency CSR, tensor lifetimes, memory peaks.

Plain functions over flat numpy arrays (T tasks, E dependencies, R resources, N tensors, D devices). They
are compiled with numba when it is installed (``cache=True``: the machine code is kept beside this file,
so only the first run on a machine pays the seconds of compilation) and otherwise run as ordinary
Python, with the same results, slowly. ``COMPILED`` says which.

The rules they implement are those of :mod:`tag.sim.fast` (which proves them equal to the event-driven
reference); the float operations are the same, in the same order, so the results agree bit for bit with
the pure-Python loops they replace.
"""

from __future__ import annotations

import os

import numpy as np

from tag.sim.taskgraph import TASK_COMPUTE

__all__ = ["COMPILED", "list_schedule", "successors_csr", "tensor_lifetimes", "transient_peaks", "feedback_sums"]

try:  # numba is a dependency; the fallback keeps the package importable where it cannot be installed
    if os.environ.get("TAG_NO_NUMBA"):
        raise ImportError("TAG_NO_NUMBA is set")
    import numba

    def _jit(function):
        return numba.njit(cache=True, nogil=True)(function)

    COMPILED = True
except ImportError:  # pragma: no cover - exercised only without numba

    def _jit(function):
        return function

    COMPILED = False


# ------------------------------------------------------------------------------------------- the ready heap
# A binary min-heap of (ready time, task id) kept in two parallel arrays; ids are unique, so the order in
# which tasks leave it does not depend on the order they entered it.


@_jit
def _heap_push(keys, ids, size, key, task):
    """Insert (key, task) into the heap of ``size`` entries; returns the new size."""
    position = size
    while position > 0:
        parent = (position - 1) // 2
        if keys[parent] > key or (keys[parent] == key and ids[parent] > task):
            keys[position] = keys[parent]
            ids[position] = ids[parent]
            position = parent
        else:
            break
    keys[position] = key
    ids[position] = task
    return size + 1


@_jit
def _heap_pop_root(keys, ids, size):
    """Remove the root of the heap of ``size`` entries (read it first); returns the new size."""
    size -= 1
    if size == 0:
        return 0
    key, task = keys[size], ids[size]
    position = 0
    while True:
        child = 2 * position + 1
        if child >= size:
            break
        right = child + 1
        if right < size and (keys[right] < keys[child] or (keys[right] == keys[child] and ids[right] < ids[child])):
            child = right
        if keys[child] < key or (keys[child] == key and ids[child] < task):
            keys[position] = keys[child]
            ids[position] = ids[child]
            position = child
        else:
            break
    keys[position] = key
    ids[position] = task
    return size


# ------------------------------------------------------------------------------------------- scheduling


@_jit
def list_schedule(duration, res_ptr, res, succ_ptr, succ, indegree, num_resources):
    """(start [T], finish [T]) by list scheduling in (ready time, task id) order (:mod:`tag.sim.fast`).

    duration [T]; res_ptr [T+1] / res: CSR of the resources each task holds; succ_ptr [T+1] / succ: CSR of
    successors; indegree [T] number of predecessors (as listed in the successor CSR, duplicates included).
    """
    num_tasks = duration.size
    waiting = indegree.copy()
    ready = np.zeros(num_tasks)  # latest finish among the dependencies scheduled so far
    free = np.zeros(num_resources)  # finish of the last task scheduled on each resource
    start = np.empty(num_tasks)
    finish = np.empty(num_tasks)
    keys = np.empty(num_tasks)
    ids = np.empty(num_tasks, dtype=np.int64)
    size = 0
    for task in range(num_tasks):  # ascending ids, all keyed 0: already a heap
        if waiting[task] == 0:
            keys[size] = 0.0
            ids[size] = task
            size += 1
    while size > 0:
        begin = keys[0]
        task = ids[0]
        size = _heap_pop_root(keys, ids, size)
        for k in range(res_ptr[task], res_ptr[task + 1]):
            if free[res[k]] > begin:
                begin = free[res[k]]
        end = begin + duration[task]
        for k in range(res_ptr[task], res_ptr[task + 1]):
            free[res[k]] = end
        start[task] = begin
        finish[task] = end
        for k in range(succ_ptr[task], succ_ptr[task + 1]):
            successor = succ[k]
            if ready[successor] < end:
                ready[successor] = end
            waiting[successor] -= 1
            if waiting[successor] == 0:
                size = _heap_push(keys, ids, size, ready[successor], successor)
    return start, finish


@_jit
def successors_csr(num_tasks, dep_task, dep_on):
    """(succ_ptr [T+1], succ [E'], indegree [T]) of the dependencies "dep_task[k] waits for dep_on[k]"
    [E], duplicates dropped (a counting sort by dep_on)."""
    count = np.zeros(num_tasks + 1, dtype=np.int64)
    for k in range(dep_on.size):
        count[dep_on[k] + 1] += 1
    for t in range(num_tasks):
        count[t + 1] += count[t]
    slot = count[:-1].copy()
    succ = np.empty(dep_on.size, dtype=np.int64)
    for k in range(dep_on.size):
        succ[slot[dep_on[k]]] = dep_task[k]
        slot[dep_on[k]] += 1
    # drop duplicates inside each task's list, compacting in place
    stamp = np.full(num_tasks, -1, dtype=np.int64)
    indegree = np.zeros(num_tasks, dtype=np.int64)
    succ_ptr = np.zeros(num_tasks + 1, dtype=np.int64)
    kept = 0
    for t in range(num_tasks):
        for k in range(count[t], count[t + 1]):
            successor = succ[k]
            if stamp[successor] != t:
                stamp[successor] = t
                succ[kept] = successor
                kept += 1
                indegree[successor] += 1
        succ_ptr[t + 1] = kept
    return succ_ptr, succ[:kept], indegree


# ------------------------------------------------------------------------------------------- memory


@_jit
def tensor_lifetimes(producer, reader_tensor, reader_task, start, finish):
    """(alloc [N], free [N]) of tensors: alloc at the producer's start (0 without one), free at the later of
    the producer's finish and the last reader's finish. producer [N] task or -1; readers as pairs
    (reader_tensor [K], reader_task [K])."""
    n = producer.size
    alloc = np.zeros(n)
    free = np.zeros(n)
    for i in range(n):
        if producer[i] >= 0:
            alloc[i] = start[producer[i]]
            free[i] = finish[producer[i]]
    for k in range(reader_tensor.size):
        t = finish[reader_task[k]]
        if t > free[reader_tensor[k]]:
            free[reader_tensor[k]] = t
    return alloc, free


@_jit
def _radix_order(times):
    """Stable ascending order [n] of non-negative float times: LSD radix sort on their IEEE bits (whose
    integer order is the numeric order for non-negative floats), 16 bits a pass; passes in which every key
    has the same digit are skipped."""
    n = times.size
    keys = (times + 0.0).view(np.uint64)  # + 0.0 turns a -0.0 into 0.0
    order = np.arange(n)
    spare = np.empty(n, dtype=np.int64)
    counts = np.empty(65536, dtype=np.int64)
    mask = np.uint64(0xFFFF)
    for step in range(4):
        shift = np.uint64(16 * step)
        counts[:] = 0
        for i in range(n):
            counts[np.int64((keys[i] >> shift) & mask)] += 1
        if n == 0 or counts.max() == n:
            continue
        total = 0
        for b in range(65536):
            c = counts[b]
            counts[b] = total
            total += c
        for i in range(n):
            j = order[i]
            b = np.int64((keys[j] >> shift) & mask)
            spare[counts[b]] = j
            counts[b] += 1
        order, spare = spare, order
    return order


@_jit
def _sweep(num_devices, device, delta, order):
    """[D] largest running sum of delta [2n] per device, in ``order`` (never below 0)."""
    live = np.zeros(num_devices)
    peak = np.zeros(num_devices)
    for k in range(order.size):
        i = order[k]
        d = device[i]
        live[d] += delta[i]
        if live[d] > peak[d]:
            peak[d] = live[d]
    return peak


def transient_peaks(num_devices: int, device: np.ndarray, nbytes: np.ndarray, alloc: np.ndarray,
                    free: np.ndarray) -> np.ndarray:
    """[D] peak live bytes of transient tensors (device, nbytes, alloc, free [n]), frees before allocations
    at equal times (the reference's per-instant counting)."""
    times = np.concatenate([free, alloc])  # frees first: a stable sort keeps them ahead of equal allocations
    delta = np.concatenate([-nbytes, nbytes])
    devices = np.concatenate([device, device])
    order = _radix_order(times) if COMPILED else np.argsort(times, kind="stable")
    return _sweep(num_devices, devices, delta, order)


# ------------------------------------------------------------------------------------------- feedback


@_jit
def feedback_sums(num_groups, num_resources, group, kind, duration, res_ptr, res, edge_task, edge_pred, start,
                  finish):
    """The sums behind Table 1's feedback, in one pass over tasks, resources and dependencies:
    (first start [G], last finish [G], total wait [G] and count [G] from a compute task's finish to the start
    of a transfer or collective depending on it, busy seconds [R] of each resource). Dependencies as pairs
    "edge_task [E] waits for edge_pred [E]"."""
    first = np.full(num_groups, np.inf)
    last = np.full(num_groups, -np.inf)
    for t in range(group.size):
        g = group[t]
        if g >= 0:
            if start[t] < first[g]:
                first[g] = start[t]
            if finish[t] > last[g]:
                last[g] = finish[t]
    wait = np.zeros(num_groups)
    count = np.zeros(num_groups, dtype=np.int64)
    for k in range(edge_task.size):
        p, t = edge_pred[k], edge_task[k]
        if kind[p] == TASK_COMPUTE and kind[t] != TASK_COMPUTE and group[p] >= 0:
            wait[group[p]] += start[t] - finish[p]
            count[group[p]] += 1
    busy = np.zeros(num_resources)
    for t in range(group.size):
        for k in range(res_ptr[t], res_ptr[t + 1]):
            busy[res[k]] += duration[t]
    return first, last, wait, count, busy
