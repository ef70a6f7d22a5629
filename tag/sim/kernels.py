"""Compiled kernels of the fast simulator: list scheduling, dependency CSR, tensor lifetimes, memory peaks,
merging chunk tasks.

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

__all__ = ["COMPILED", "list_schedule", "successors_csr", "tensor_lifetimes", "peak_memory", "feedback_sums",
           "merge_chunks"]

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
    _sift_up(keys, ids, size, key, task)
    return size + 1


@_jit
def _sift_up(keys, ids, position, key, task):
    """Put (key, task) in the hole at ``position``, moving it up past every larger parent."""
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


@_jit
def _heap_pop_root(keys, ids, size):
    """Remove the root of the heap of ``size`` entries (read it first); returns the new size. Slots from
    ``size`` on hold the sentinel (inf, -1), which no entry follows, so that a node's second child can be
    read without a bounds test. The hole left by the root goes down to a leaf along the smaller child, picked
    without a branch (the picks of a heap are unpredictable), and the last entry rises from there: it
    belongs near the bottom, so this does about one comparison a level instead of two."""
    size -= 1
    key, task = keys[size], ids[size]
    keys[size] = np.inf
    ids[size] = -1
    if size == 0:
        return 0
    _heap_replace_root(keys, ids, size, key, task)  # the last entry refills the root's place
    return size


@_jit
def _heap_replace_root(keys, ids, size, key, task):
    """Put (key, task) in place of the root of the heap of ``size`` entries: the root's hole goes down to a
    leaf along the smaller child, as in :func:`_heap_pop_root`, and (key, task) rises from there. One descent
    where a pop and a push would take two."""
    position = 0
    child = 1
    while child < size:
        right_key, left_key = keys[child + 1], keys[child]
        child += np.int64((right_key < left_key) | ((right_key == left_key) & (ids[child + 1] < ids[child])))
        keys[position] = keys[child]
        ids[position] = ids[child]
        position = child
        child = 2 * position + 1
    _sift_up(keys, ids, position, key, task)


# ------------------------------------------------------------------------------------------- scheduling


@_jit
def list_schedule(duration, res_ptr, res, succ_ptr, succ, succ_lag, indegree, num_resources):
    """(start [T], finish [T]) by list scheduling in (ready time, task id) order (:mod:`tag.sim.fast`).

    duration [T]; res_ptr [T+1] / res: CSR of the resources each task holds; succ_ptr [T+1] / succ: CSR of
    successors, succ_lag [E'] the seconds after its predecessor's start at which each dependency is met (the
    predecessor's duration for an ordinary dependency: then start + lag is its finish, bit for bit; empty:
    every dependency is ordinary); indegree [T] number of predecessors (as listed in the successor CSR,
    duplicates included).
    """
    num_tasks = duration.size
    lagged = succ_lag.size > 0
    waiting = indegree.copy()
    ready = np.zeros(num_tasks)  # latest release among the dependencies scheduled so far
    free = np.zeros(num_resources)  # finish of the last task scheduled on each resource
    start = np.empty(num_tasks)
    finish = np.empty(num_tasks)
    keys = np.full(num_tasks + 1, np.inf)  # the heap, sentinels past its end (_heap_pop_root)
    ids = np.full(num_tasks + 1, -1, dtype=np.int64)
    # The tasks with no dependency, all keyed 0, come in ascending ids: a sorted stream merged with the heap
    # rather than thousands of entries in it. Keys are never below 0, so the heap's root goes first only when
    # it is keyed 0 with a smaller id.
    # A task taken from the heap stays at its root until it is scheduled: the first successor it makes ready
    # takes its place (_heap_replace_root), and only a task that makes none ready is popped.
    sources = np.flatnonzero(waiting == 0)
    head = 0
    size = 0
    while head < sources.size or size > 0:
        at_root = size > 0 and (head == sources.size or (keys[0] == 0.0 and ids[0] < sources[head]))
        if at_root:
            begin = keys[0]
            task = ids[0]
        else:
            begin = 0.0
            task = sources[head]
            head += 1
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
            release = begin + succ_lag[k] if lagged else end
            if ready[successor] < release:
                ready[successor] = release
            waiting[successor] -= 1
            if waiting[successor] == 0:
                if at_root:
                    _heap_replace_root(keys, ids, size, ready[successor], successor)
                    at_root = False
                else:
                    size = _heap_push(keys, ids, size, ready[successor], successor)
        if at_root:
            size = _heap_pop_root(keys, ids, size)
    return start, finish


@_jit
def successors_csr(num_tasks, dep_task, dep_on, dep_lag):
    """(succ_ptr [T+1], succ [E'], succ_lag [E'], indegree [T]) of the dependencies "dep_task[k] waits for
    dep_on[k] until dep_lag[k] seconds after its start" [E], duplicates merged (the largest lag kept; a
    counting sort by dep_on). An empty dep_lag (ordinary dependencies) gives an empty succ_lag."""
    lagged = dep_lag.size > 0
    count = np.zeros(num_tasks + 1, dtype=np.int64)
    for k in range(dep_on.size):
        count[dep_on[k] + 1] += 1
    for t in range(num_tasks):
        count[t + 1] += count[t]
    slot = count[:-1].copy()
    succ = np.empty(dep_on.size, dtype=np.int64)
    lag = np.empty(dep_on.size if lagged else 0)
    for k in range(dep_on.size):
        succ[slot[dep_on[k]]] = dep_task[k]
        if lagged:
            lag[slot[dep_on[k]]] = dep_lag[k]
        slot[dep_on[k]] += 1
    # merge duplicates inside each task's list, compacting in place
    stamp = np.full(num_tasks, -1, dtype=np.int64)
    where = np.zeros(num_tasks, dtype=np.int64)
    indegree = np.zeros(num_tasks, dtype=np.int64)
    succ_ptr = np.zeros(num_tasks + 1, dtype=np.int64)
    kept = 0
    for t in range(num_tasks):
        for k in range(count[t], count[t + 1]):
            successor = succ[k]
            if stamp[successor] != t:
                stamp[successor] = t
                where[successor] = kept
                succ[kept] = successor
                if lagged:
                    lag[kept] = lag[k]
                kept += 1
                indegree[successor] += 1
            elif lagged and lag[k] > lag[where[successor]]:
                lag[where[successor]] = lag[k]
        succ_ptr[t + 1] = kept
    return succ_ptr, succ[:kept], lag[:kept] if lagged else lag, indegree


# ------------------------------------------------------------------------------------------- memory


@_jit
def tensor_lifetimes(producer, alloc_lag, free_lag, reader_tensor, reader_task, reader_lag, start, finish):
    """(alloc [N], free [N]) of tensors: alloc ``alloc_lag`` after the producer's start (0 without one), free
    at the later of ``free_lag`` after the producer's start and each reader's end (``reader_lag`` after its
    start). producer [N] task or -1; readers as pairs (reader_tensor [K], reader_task [K]). With lags 0,
    the producer's duration and the reader's duration these are the start and finish times, bit for bit;
    empty lags mean exactly that (start and finish [T] are read instead)."""
    n = producer.size
    lagged = alloc_lag.size > 0
    alloc = np.zeros(n)
    free = np.zeros(n)
    for i in range(n):
        if producer[i] >= 0:
            alloc[i] = start[producer[i]] + alloc_lag[i] if lagged else start[producer[i]]
            free[i] = start[producer[i]] + free_lag[i] if lagged else finish[producer[i]]
    for k in range(reader_tensor.size):
        t = start[reader_task[k]] + reader_lag[k] if lagged else finish[reader_task[k]]
        if t > free[reader_tensor[k]]:
            free[reader_tensor[k]] = t
    return alloc, free


@_jit
def _radix_order(times):
    """Stable ascending order [n] of non-negative float times. An LSD radix sort (11 bits a pass, so the
    counts stay in L1) on the IEEE bits of the times rounded to float32 (rounding is monotone, and the
    integer order of the bits of non-negative floats is their numeric order) puts them in order up to runs
    of times that round alike; one insertion pass over the exact times then orders those runs, keeping equal
    times in their input order. The three digits are counted in one read of the keys, and a digit that every
    key shares is skipped (times of one iteration share their top bits)."""
    n = times.size
    keys = (times.astype(np.float32) + np.float32(0.0)).view(np.uint32)  # + 0.0 turns a -0.0 into 0.0
    counts = np.zeros((3, 2048), dtype=np.int64)
    mask = np.uint32(0x7FF)
    for i in range(n):
        key = keys[i]
        counts[0, np.int64(key & mask)] += 1
        counts[1, np.int64((key >> np.uint32(11)) & mask)] += 1
        counts[2, np.int64((key >> np.uint32(22)) & mask)] += 1
    order = np.arange(n)
    spare = np.empty(n, dtype=np.int64)
    for step in range(3):
        if n == 0 or counts[step].max() == n:
            continue
        shift = np.uint32(11 * step)
        total = 0
        for b in range(2048):
            c = counts[step, b]
            counts[step, b] = total
            total += c
        for i in range(n):
            j = order[i]
            b = np.int64((keys[j] >> shift) & mask)
            spare[counts[step, b]] = j
            counts[step, b] += 1
        order, spare = spare, order
    for i in range(1, n):  # within a run of equal keys: insertion by exact time (strictly greater moves)
        j = order[i]
        t = times[j]
        k = i - 1
        while k >= 0 and times[order[k]] > t:
            order[k + 1] = order[k]
            k -= 1
        order[k + 1] = j
    return order


@_jit
def peak_memory(num_devices, tensor_device, tensor_bytes, tensor_persistent, producer, alloc_lag, free_lag,
                reader_tensor, reader_task, reader_lag, start, finish):
    """[D] peak live bytes per device: the persistent tensors' bytes (summed in tensor order) plus the peak of
    the transient ones, whose lifetimes are :func:`tensor_lifetimes` (tensors [N] and reads [K] as there),
    frees before allocations at equal times (the reference's per-instant counting): a sweep of their frees,
    then their allocations, in a stable order of time."""
    alloc, free = tensor_lifetimes(producer, alloc_lag, free_lag, reader_tensor, reader_task, reader_lag, start,
                                   finish)
    persistent = np.zeros(num_devices)
    transient = 0
    for i in range(tensor_device.size):
        if tensor_persistent[i]:
            persistent[tensor_device[i]] += tensor_bytes[i]
        else:
            transient += 1
    tensor = np.empty(transient, dtype=np.int64)  # [n] the transient tensors
    times = np.empty(2 * transient)  # [2n] their frees, then their allocations (a stable sort keeps frees first)
    j = 0
    for i in range(tensor_device.size):
        if not tensor_persistent[i]:
            tensor[j] = i
            times[j] = free[i]
            times[transient + j] = alloc[i]
            j += 1
    order = _radix_order(times)
    live = np.zeros(num_devices)
    peak = np.zeros(num_devices)
    for k in range(order.size):
        i = order[k]
        t = tensor[i if i < transient else i - transient]
        d = tensor_device[t]
        live[d] += -tensor_bytes[t] if i < transient else tensor_bytes[t]
        if live[d] > peak[d]:
            peak[d] = live[d]
    return persistent + peak


# ------------------------------------------------------------------------------------------- feedback


@_jit
def feedback_sums(num_groups, num_resources, group, kind, duration, res_ptr, res, edge_ptr, edge_end, edge_lag,
                  by_predecessor, start, finish):
    """The sums behind Table 1's feedback, in one pass over tasks, resources and dependencies:
    (first start [G], last finish [G], total wait [G] and count [G] from a compute task's finish to the start
    of a transfer or collective depending on it, busy seconds [R] of each resource). Dependencies as a CSR
    edge_ptr [T+1] / edge_end [E] over the predecessors (``by_predecessor``: task a's list holds the tasks
    that wait for it, a successor CSR) or over the dependent tasks (task a's list holds what it waits for),
    met edge_lag [E] seconds after the predecessor's start (empty: at its finish); summed in CSR order."""
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
    for a in range(edge_ptr.size - 1):
        for k in range(edge_ptr[a], edge_ptr[a + 1]):
            p, t = (a, edge_end[k]) if by_predecessor else (edge_end[k], a)
            if kind[p] == TASK_COMPUTE and kind[t] != TASK_COMPUTE and group[p] >= 0:
                wait[group[p]] += start[t] - (start[p] + edge_lag[k] if edge_lag.size > 0 else finish[p])
                count[group[p]] += 1
    busy = np.zeros(num_resources)
    for t in range(group.size):
        for k in range(res_ptr[t], res_ptr[t + 1]):
            busy[res[k]] += duration[t]
    return first, last, wait, count, busy


# ------------------------------------------------------------------------------------------- chunk merging


@_jit
def merge_chunks(merge_key, num_keys, duration, kind, group, res_ptr, res, dep_task, dep_on, tensor_producer,
                 read_tensor, read_task):
    """Merge the compute tasks that share a ``merge_key`` [T] (>= 0, < num_keys; -1: a task of its own) into
    one task each, running its chunks back to back in task order on their one resource; every other task is
    kept. Dependencies then carry *lags*: a chunk's output is released when the chunk ends inside the merged
    task, and a chunk that reads something starts that far into its task, so "t waits for p" becomes "T may
    start ``max(0, end of p - start of t)`` after P starts" (dependencies inside one merged task vanish: the
    chunks of a key are listed in a topological order). Tensors keep the lifetimes of their chunks.

    Returns (new_id [T], start_off [T] and end_off [T] where each old task runs inside its new one, first [T']
    the first task merged into each new one, duration [T'], kind [T'],
    group [T'], res_ptr [T'+1], res, dep_task [E'], dep_on [E'], dep_lag [E'], tensor_producer [N],
    alloc_lag [N], free_lag [N], read_task [K], read_lag [K]); new tasks are numbered in the order of their
    first chunk.
    """
    num_tasks = duration.size
    slot = np.full(num_keys, -1, dtype=np.int64)  # key -> its new task
    new_id = np.empty(num_tasks, dtype=np.int64)
    start_off = np.zeros(num_tasks)
    end_off = np.empty(num_tasks)
    first = np.empty(num_tasks, dtype=np.int64)
    new_duration = np.empty(num_tasks)
    count = 0
    for t in range(num_tasks):
        key = merge_key[t]
        if key >= 0 and slot[key] >= 0:
            m = slot[key]
            start_off[t] = new_duration[m]
            new_duration[m] = new_duration[m] + duration[t]
            end_off[t] = new_duration[m]
            new_id[t] = m
            continue
        if key >= 0:
            slot[key] = count
        new_id[t] = count
        first[count] = t
        new_duration[count] = duration[t]
        end_off[t] = duration[t]
        count += 1
    new_kind = np.empty(count, dtype=np.int8)
    new_group = np.empty(count, dtype=np.int64)
    new_res_ptr = np.zeros(count + 1, dtype=np.int64)
    for m in range(count):
        t = first[m]
        new_kind[m] = kind[t]
        new_group[m] = group[t]
        new_res_ptr[m + 1] = new_res_ptr[m] + res_ptr[t + 1] - res_ptr[t]
    new_res = np.empty(new_res_ptr[count], dtype=np.int64)
    for m in range(count):
        t = first[m]
        for j in range(res_ptr[t + 1] - res_ptr[t]):
            new_res[new_res_ptr[m] + j] = res[res_ptr[t] + j]
    new_task = np.empty(dep_task.size, dtype=np.int64)
    new_on = np.empty(dep_task.size, dtype=np.int64)
    lag = np.empty(dep_task.size)
    e = 0
    for k in range(dep_task.size):
        t, p = dep_task[k], dep_on[k]
        if new_id[t] == new_id[p]:
            continue
        new_task[e] = new_id[t]
        new_on[e] = new_id[p]
        lag[e] = max(0.0, end_off[p] - start_off[t])
        e += 1
    n = tensor_producer.size
    producer = np.full(n, -1, dtype=np.int64)
    alloc_lag = np.zeros(n)
    free_lag = np.zeros(n)
    for i in range(n):
        p = tensor_producer[i]
        if p >= 0:
            producer[i] = new_id[p]
            alloc_lag[i] = start_off[p]
            free_lag[i] = end_off[p]
    reader = np.empty(read_task.size, dtype=np.int64)
    read_lag = np.empty(read_task.size)
    for k in range(read_task.size):
        reader[k] = new_id[read_task[k]]
        read_lag[k] = end_off[read_task[k]]
    return (new_id, start_off, end_off, first[:count].copy(), new_duration[:count].copy(), new_kind, new_group,
            new_res_ptr, new_res,
            new_task[:e].copy(), new_on[:e].copy(), lag[:e].copy(), producer, alloc_lag, free_lag, reader, read_lag)

