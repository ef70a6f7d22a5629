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

import numpy as np

from tag._compiled import COMPILED, id_pop as _id_pop, id_push as _id_push, jit as _jit, successor_lists
from tag.sim.taskgraph import RES_LINK, RES_NIC_IN, RES_NIC_OUT, TASK_COMPUTE

if COMPILED:
    import numba

__all__ = ["COMPILED", "list_schedule", "successors_csr", "successor_lists", "tensor_lifetimes", "peak_memory",
           "feedback_sums", "feedback_tables", "merge_chunks", "int_table", "table_look_up", "table_store"]

# ------------------------------------------------------------------------------------------- int64 tables


def int_table():
    """An empty int64 -> int64 hash table that :func:`table_look_up` and :func:`table_store` read and write
    many keys of in one call (a numba typed dict; a plain dict without numba)."""
    if COMPILED:
        return numba.typed.Dict.empty(key_type=numba.types.int64, value_type=numba.types.int64)
    return {}


@_jit
def table_look_up(table, keys):
    """[n] the value of each of ``keys`` [n] in ``table``, -1 where it has none."""
    out = np.empty(keys.size, dtype=np.int64)
    for i in range(keys.size):
        out[i] = table.get(keys[i], -1)
    return out


@_jit
def table_store(table, keys, values):
    """``table[keys[i]] = values[i]`` for each i, in order."""
    for i in range(keys.size):
        table[keys[i]] = values[i]


# ------------------------------------------------------------------------------------------- the ready queue
# Ready times leave the queue in non-decreasing order (tag.sim.fast), which allows a *radix heap*: with
# ``last`` the ready time taken most recently, a task waits in bucket j > 0 when the highest bit in which its
# ready time differs from ``last``'s is bit j - 1 (the IEEE bits of non-negative floats order as integers), so
# every task of a lower bucket comes before every task of a higher one and a task goes in without comparing
# times. The tasks ready at ``last`` itself (bucket 0) sit in a binary heap of ids, which breaks the ties:
# they are most of the tasks taken (a task's finish releases its successors together), a few at a time.
# Emptying the lowest non-empty bucket makes its smallest ready time ``last`` and spreads its tasks over
# lower buckets, each task moving down a few times at most. On BERT-Large's 20 k tasks this schedules
# about 1.5 times as fast as a binary heap of (ready time, id).

if COMPILED:
    from numba.cpython.unsafe.numbers import leading_zeros, trailing_zeros

    @_jit
    def _bucket(bits, last):
        """Bucket (1..63) of a ready time whose bits differ from ``last``'s: its highest differing bit + 1."""
        return 64 - leading_zeros(np.uint64(bits ^ last))

    @_jit
    def _lowest_bucket(nonempty):
        """The lowest bucket whose bit is set in the mask ``nonempty`` (not 0)."""
        return np.int64(trailing_zeros(nonempty))
else:  # pragma: no cover - exercised only without numba

    def _bucket(bits, last):
        return int(bits ^ last).bit_length()

    def _lowest_bucket(nonempty):
        return (int(nonempty) & -int(nonempty)).bit_length() - 1


# ------------------------------------------------------------------------------------------- scheduling


@_jit
def list_schedule(duration, res_ptr, res, succ_ptr, succ, succ_lag, indegree, num_resources):
    """(start [T], finish [T]) by list scheduling in (ready time, task id) order (:mod:`tag.sim.fast`).

    duration [T]; res_ptr [T+1] / res: CSR of the resources each task holds; succ_ptr [T+1] / succ: CSR of
    successors, succ_lag [E'] the seconds after its predecessor's start at which each dependency is met (the
    predecessor's duration for an ordinary dependency: then start + lag is its finish, bit for bit; empty:
    every dependency is ordinary); indegree [T] number of predecessors (as listed in the successor CSR,
    duplicates included). The ready queue is a radix heap (above).
    """
    num_tasks = duration.size
    lagged = succ_lag.size > 0
    waiting = indegree.astype(np.int32)  # int32 (counts < 2**31): half the bytes of the hot per-task arrays
    ready = np.zeros(num_tasks)  # latest release among the dependencies scheduled so far
    bits = ready.view(np.int64)  # its IEEE bits: never -0.0 (ready times only grow from +0.0)
    free = np.zeros(num_resources)  # finish of the last task scheduled on each resource
    start = np.empty(num_tasks)
    finish = np.empty(num_tasks)
    first = np.full(64, -1, dtype=np.int32)  # [64] first task of each bucket's list, -1 if empty
    next_task = np.empty(num_tasks, dtype=np.int32)  # [T] the bucket lists
    nonempty = np.uint64(0)  # bit j set: bucket j holds a task
    tied = np.empty(num_tasks, dtype=np.int32)  # bucket 0: heap of the ids ready at ``last``
    num_tied = 0
    last = np.int64(0)
    # The tasks with no dependency, all ready at 0, come in ascending ids: a sorted stream that is part of
    # bucket 0 until it runs out (``last`` stays 0 until then), merged with the heap of ids. Read straight
    # from indegree (no flatnonzero array): ``source`` is the next one, num_tasks when none is left.
    source = 0
    while source < num_tasks and indegree[source] != 0:
        source += 1
    while True:
        if source < num_tasks and (num_tied == 0 or source < tied[0]):
            task = source
            source += 1
            while source < num_tasks and indegree[source] != 0:
                source += 1
        elif num_tied > 0:
            task, num_tied = _id_pop(tied, num_tied)
        elif nonempty != 0:  # the lowest bucket: its smallest ready time is the next one
            j = _lowest_bucket(nonempty)
            nonempty &= ~(np.uint64(1) << np.uint64(j))
            t = np.int64(first[j])
            first[j] = -1
            last = bits[t]
            u = np.int64(next_task[t])
            while u >= 0:
                if bits[u] < last:
                    last = bits[u]
                u = np.int64(next_task[u])
            while t >= 0:
                u = np.int64(next_task[t])
                if bits[t] == last:
                    num_tied = _id_push(tied, num_tied, t)
                else:
                    b = _bucket(bits[t], last)
                    next_task[t] = first[b]
                    first[b] = t
                    nonempty |= np.uint64(1) << np.uint64(b)
                t = u
            continue
        else:
            break
        task = np.int64(task)
        begin = ready[task]
        k0 = np.int64(res_ptr[task])  # int64 bounds: loops bounded by int32 run slower in numba
        k1 = np.int64(res_ptr[task + 1])
        if k1 - k0 == 1:  # most tasks hold one resource: no loops
            r = np.int64(res[k0])
            if free[r] > begin:
                begin = free[r]
            end = begin + duration[task]
            free[r] = end
        else:
            for k in range(k0, k1):
                if free[res[k]] > begin:
                    begin = free[res[k]]
            end = begin + duration[task]
            for k in range(k0, k1):
                free[res[k]] = end
        start[task] = begin
        finish[task] = end
        for k in range(np.int64(succ_ptr[task]), np.int64(succ_ptr[task + 1])):
            successor = np.int64(succ[k])
            release = begin + succ_lag[k] if lagged else end
            if ready[successor] < release:
                ready[successor] = release
            waiting[successor] -= 1
            if waiting[successor] == 0:  # the insert of the bucket-emptying loop above, written out again: as
                # a helper returning (num_tied, nonempty), even inlined, it made warm evaluations 7-30% slower
                if bits[successor] == last:
                    num_tied = _id_push(tied, num_tied, successor)
                else:
                    b = _bucket(bits[successor], last)
                    next_task[successor] = first[b]
                    first[b] = successor
                    nonempty |= np.uint64(1) << np.uint64(b)
    return start, finish


@_jit
def successors_csr(num_tasks, dep_task, dep_on, dep_lag):
    """(succ_ptr [T+1], succ [E'], succ_lag [E'], indegree [T]) of the dependencies "dep_task[k] waits for
    dep_on[k] until dep_lag[k] seconds after its start" [E], duplicates merged (each at its first place in
    its list, the largest lag kept): :func:`successor_lists`, then one merging pass. An empty dep_lag
    (ordinary dependencies) gives an empty succ_lag."""
    lagged = dep_lag.size > 0
    listed_ptr, succ, lag, _ = successor_lists(num_tasks, dep_task, dep_on, dep_lag)
    # merge duplicates inside each task's list, compacting in place (kept never passes k)
    stamp = np.full(num_tasks, -1, dtype=np.int64)
    where = np.empty(num_tasks if lagged else 0, dtype=np.int64)  # slot kept for each successor (lags only)
    indegree = np.zeros(num_tasks, dtype=dep_task.dtype)
    succ_ptr = np.zeros(num_tasks + 1, dtype=np.int64)  # int64: loops bounded by int32 run slower in numba
    kept = 0
    for t in range(num_tasks):
        for k in range(listed_ptr[t], listed_ptr[t + 1]):
            successor = succ[k]
            if stamp[successor] != t:
                stamp[successor] = t
                if lagged:
                    where[successor] = kept
                    lag[kept] = lag[k]
                succ[kept] = successor
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
    alloc = np.zeros(producer.size)
    free = np.zeros(producer.size)
    _lifetimes_into(alloc, free, producer, alloc_lag, free_lag, reader_tensor, reader_task, reader_lag, start,
                    finish)
    return alloc, free


@_jit
def _lifetimes_into(alloc, free, producer, alloc_lag, free_lag, reader_tensor, reader_task, reader_lag, start,
                    finish):
    """:func:`tensor_lifetimes` written into ``alloc`` and ``free`` [N] (zeros), which may be views."""
    lagged = alloc_lag.size > 0
    for i in range(producer.size):
        if producer[i] >= 0:
            alloc[i] = start[producer[i]] + alloc_lag[i] if lagged else start[producer[i]]
            free[i] = start[producer[i]] + free_lag[i] if lagged else finish[producer[i]]
    for k in range(reader_tensor.size):
        t = start[reader_task[k]] + reader_lag[k] if lagged else finish[reader_task[k]]
        if t > free[reader_tensor[k]]:
            free[reader_tensor[k]] = t


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
    spare_keys = np.empty(n, dtype=np.uint32)
    for step in range(3):
        if n == 0 or counts[step].max() == n:
            continue
        shift = np.uint32(11 * step)
        total = 0
        for b in range(2048):
            c = counts[step, b]
            counts[step, b] = total
            total += c
        for i in range(n):  # the keys move with the order, so that each pass reads them in sequence
            key = keys[i]
            b = np.int64((key >> shift) & mask)
            slot = counts[step, b]
            spare[slot] = order[i]
            spare_keys[slot] = key
            counts[step, b] = slot + 1
        order, spare = spare, order
        keys, spare_keys = spare_keys, keys
    ordered = times[order]  # [n] the times in that order
    _insertion_pass(ordered, order, np.int64(1) << np.int64(62))  # within a run of equal keys, by exact time
    return order


@_jit
def _insertion_pass(ordered, order, budget):
    """Finish ordering ``ordered`` [n] by insertion (``order`` moving with it), strictly greater times moving,
    so equal times keep their order; gives up, returning False, once it has moved more than ``budget`` times."""
    for i in range(1, ordered.size):
        t = ordered[i]
        if ordered[i - 1] > t:
            j = order[i]
            k = i - 1
            while k >= 0 and ordered[k] > t:
                ordered[k + 1] = ordered[k]
                order[k + 1] = order[k]
                k -= 1
            ordered[k + 1] = t
            order[k + 1] = j
            budget -= i - k
            if budget < 0:
                return False
    return True


@_jit
def _radix_fallback(times, ordered):
    """:func:`_radix_order` of ``times``, with ``ordered`` filled with the times in that order."""
    order = _radix_order(times)
    for i in range(times.size):
        ordered[i] = times[order[i]]
    return order


@_jit
def _bucket_order(times, ordered):
    """Stable ascending order [n] of ``times`` (the same order as :func:`_radix_order`: by time, ties in input
    order), with ``ordered`` [n] filled with the times in that order. One counting pass and one scatter into
    about n buckets of the key floor(t * nb / max) (monotone in t: rounding and truncation are), then one
    insertion pass by exact time, which moves nothing across buckets (a lower key means a smaller time).
    Falls back on :func:`_radix_order` where a key cannot be formed (a negative, NaN or infinite time, a scale
    that overflows) or the insertion pass would move more than 16 n times (its cost stays O(n))."""
    n = times.size
    hi = 0.0
    bad = False
    for i in range(n):
        t = times[i]
        if t > hi:
            hi = t
        bad |= not (t >= 0.0)  # NaN or negative
    nb = 1
    while nb < n:
        nb *= 2
    scale = nb / hi if hi > 0.0 else 0.0
    if bad or n < 2 or not (scale < np.inf) or not (hi < np.inf):
        return _radix_fallback(times, ordered)
    top = nb - 1
    keys = np.empty(n, dtype=np.int32)
    counts = np.zeros(nb + 1, dtype=np.int32)
    for i in range(n):
        key = min(np.int64(times[i] * scale), top)
        keys[i] = key
        counts[key + 1] += 1
    for b in range(nb):  # counted one place on: counts[b] becomes the start of bucket b
        counts[b + 1] += counts[b]
    order = np.empty(n, dtype=np.int64)
    for i in range(n):
        key = keys[i]
        slot = counts[key]
        counts[key] = slot + 1
        order[slot] = i
        ordered[slot] = times[i]
    # within a bucket: insertion by exact time, as _radix_order, unless the times crowd into few buckets
    if not _insertion_pass(ordered, order, 16 * n):
        return _radix_fallback(times, ordered)
    return order


@_jit
def peak_memory(num_devices, tensor_device, tensor_bytes, tensor_persistent, producer, alloc_lag, free_lag,
                reader_tensor, reader_task, reader_lag, start, finish):
    """[D] peak live bytes per device: the persistent tensors' bytes (summed in tensor order) plus the peak of
    the transient ones, whose lifetimes are :func:`tensor_lifetimes` (tensors [N] and reads [K] as there),
    frees before allocations at equal times (the reference's per-instant counting): a sweep of their frees,
    then their allocations, in a stable order of time."""
    n = producer.size
    # [2n] every tensor's free, then its allocation (the lifetimes written in place); persistent tensors
    # stay in at time 0 and are skipped by the sweep: a stable order of a superset orders the transient
    # events as one of them alone would, so the order is the original one
    times = np.zeros(2 * n)
    _lifetimes_into(times[n:], times[:n], producer, alloc_lag, free_lag, reader_tensor, reader_task, reader_lag,
                    start, finish)
    persistent = np.zeros(num_devices)
    for i in range(n):
        if tensor_persistent[i]:
            persistent[tensor_device[i]] += tensor_bytes[i]
            times[i] = 0.0
            times[n + i] = 0.0
    # Runs of equal consecutive times (tensors of replicas run in lockstep: about 4 in 5 times equal the one
    # before): a stable order of the runs by time, each run expanded in index order, is the stable order of
    # the events, with a quarter as many keys to sort; runs end at n (frees, then allocations).
    run_first = np.empty(2 * n + 1, dtype=np.int64)
    run_time = np.empty(2 * n)
    runs = 0
    for i in range(2 * n):
        if i == 0 or i == n or times[i] != times[i - 1]:
            run_first[runs] = i
            run_time[runs] = times[i]
            runs += 1
    run_first[runs] = 2 * n
    ordered = np.empty(runs)
    order = _bucket_order(run_time[:runs], ordered)
    live = np.zeros(num_devices)
    peak = np.zeros(num_devices)
    for k in range(runs):
        r = order[k]
        i0 = run_first[r]
        allocations = i0 >= n
        base = n if allocations else 0
        sign = 1.0 if allocations else -1.0
        for f in range(i0 - base, run_first[r + 1] - base):
            if tensor_persistent[f]:
                continue
            d = tensor_device[f]
            live[d] += sign * tensor_bytes[f]
            if live[d] > peak[d]:
                peak[d] = live[d]
    return persistent + peak


# ------------------------------------------------------------------------------------------- feedback


@_jit
def feedback_sums(num_groups, num_resources, group, kind, duration, res_ptr, res, edge_ptr, edge_end, edge_lag,
                  by_predecessor, start, finish):
    """The sums behind Table 1's feedback, from one pass over tasks and resources and one over dependencies
    (without lags and by predecessor, a flat pass finds the dependencies into non-compute tasks first):
    (first start [G], last finish [G], total wait [G] and count [G] from a compute task's finish to the start
    of a transfer or collective depending on it, busy seconds [R] of each resource). Dependencies as a CSR
    edge_ptr [T+1] / edge_end [E] over the predecessors (``by_predecessor``: task a's list holds the tasks
    that wait for it, a successor CSR) or over the dependent tasks (task a's list holds what it waits for),
    met edge_lag [E] seconds after the predecessor's start (empty: at its finish); summed in CSR order. A
    dependency listed more than once (:func:`successor_lists`) counts once, as :func:`successors_csr` merges
    it: at its first place in the list, with its largest lag."""
    first = np.full(num_groups, np.inf)
    last = np.full(num_groups, -np.inf)
    busy = np.zeros(num_resources)
    for t in range(group.size):
        g = group[t]
        if g >= 0:
            if start[t] < first[g]:
                first[g] = start[t]
            if finish[t] > last[g]:
                last[g] = finish[t]
        for k in range(np.int64(res_ptr[t]), np.int64(res_ptr[t + 1])):  # int64 bounds: faster loops in numba
            busy[res[k]] += duration[t]
    wait = np.zeros(num_groups)
    count = np.zeros(num_groups, dtype=np.int64)
    lagged = edge_lag.size > 0
    # [T] the list in which each task was last met: a while finding its largest lag there, -2 - a once summed
    seen = np.full(group.size, -1, dtype=np.int32)
    largest = np.empty(group.size if lagged else 0)  # [T] the largest lag of its dependency in that list
    if by_predecessor and not lagged and edge_ptr.size > 1 and edge_ptr[edge_ptr.size - 1] < 2**31:
        # only dependencies into a non-compute task feed a wait: find them in one flat pass over the edges
        # (branch-free compaction: a loop per list mispredicts its exit once per task), then their lists
        # (with lags, where a dependency's largest lag in its list is wanted, the two passes below)
        lo = np.int64(edge_ptr[0])
        hi = np.int64(edge_ptr[edge_ptr.size - 1])
        hits = np.empty(max(hi - lo, 0), dtype=np.int32)  # int32 (edges < 2**31): half the bytes written
        num_hits = 0
        for k in range(lo, hi):
            hits[num_hits] = k
            num_hits += np.int64(kind[np.uint32(edge_end[k])] != TASK_COMPUTE)  # unsigned: no wraparound test
        a = 0
        for h in range(num_hits):
            k = np.int64(hits[h])
            while edge_ptr[a + 1] <= k:
                a += 1
            if kind[a] != TASK_COMPUTE or group[a] < 0:
                continue
            other = edge_end[k]
            if seen[other] == -2 - a:
                continue  # listed before in a's list: counted once, at its first place
            seen[other] = -2 - a
            wait[group[a]] += start[other] - finish[a]
            count[group[a]] += 1
        return first, last, wait, count, busy
    for a in range(edge_ptr.size - 1):
        if by_predecessor and (kind[a] != TASK_COMPUTE or group[a] < 0):
            continue  # a feeds no wait: its whole list is skipped
        if lagged:
            for k in range(edge_ptr[a], edge_ptr[a + 1]):
                other = edge_end[k]
                if seen[other] != a or edge_lag[k] > largest[other]:
                    seen[other] = a
                    largest[other] = edge_lag[k]
        for k in range(edge_ptr[a], edge_ptr[a + 1]):
            other = edge_end[k]
            p, t = (a, other) if by_predecessor else (other, a)
            if kind[p] == TASK_COMPUTE and kind[t] != TASK_COMPUTE and group[p] >= 0 and seen[other] != -2 - a:
                seen[other] = -2 - a
                wait[group[p]] += start[t] - (start[p] + largest[other] if lagged else finish[p])
                count[group[p]] += 1
    return first, last, wait, count, busy


@_jit
def feedback_tables(first, last, wait, count, busy, makespan, resource_kind, resource_a, resource_b, device_group,
                    num_device_groups, peak_memory):
    """Table 1's feedback arrays from :func:`feedback_sums` (first [G], last [G], wait [G], count [G], busy [R])
    and the makespan, each element computed as numpy computes it in the same order (np.add.at and np.bincount
    sum in index order), so that the figures are bit for bit the vectorised ones. Resources: kind [R] and the
    two devices resource_a [R] / resource_b [R] of a link; device_group [D] and peak_memory [D].

    Returns (group_makespan [G], group_output_idle [G], resource_idle [R], link_idle [L], nic_out_idle [M],
    nic_in_idle [M], device_group_peak_memory [Gd], device_group_idle [Gd], device_group_link_idle [Gd, Gd]),
    the links in resource order; device idle is resource_idle's first D entries."""
    num_groups = first.size
    group_makespan = np.zeros(num_groups)
    group_output_idle = np.zeros(num_groups)
    for g in range(num_groups):
        if np.isfinite(first[g]):
            group_makespan[g] = last[g] - first[g]
        if count[g] > 0:
            group_output_idle[g] = wait[g] / count[g]
    num_resources = busy.size
    resource_idle = np.empty(num_resources)
    for r in range(num_resources):
        resource_idle[r] = 1.0 if makespan <= 0 else 1.0 - busy[r] / makespan
    links = nic_out = nic_in = 0
    for r in range(num_resources):
        if resource_kind[r] == RES_LINK:
            links += 1
        elif resource_kind[r] == RES_NIC_OUT:
            nic_out += 1
        elif resource_kind[r] == RES_NIC_IN:
            nic_in += 1
    link_idle = np.empty(links)
    nic_out_idle = np.empty(nic_out)
    nic_in_idle = np.empty(nic_in)
    pair_count = np.zeros((num_device_groups, num_device_groups))
    pair_idle = np.zeros((num_device_groups, num_device_groups))
    links = nic_out = nic_in = 0
    for r in range(num_resources):
        if resource_kind[r] == RES_LINK:
            link_idle[links] = resource_idle[r]
            links += 1
            a, b = device_group[resource_a[r]], device_group[resource_b[r]]
            pair_count[a, b] += 1.0
            pair_idle[a, b] += resource_idle[r]
        elif resource_kind[r] == RES_NIC_OUT:
            nic_out_idle[nic_out] = resource_idle[r]
            nic_out += 1
        elif resource_kind[r] == RES_NIC_IN:
            nic_in_idle[nic_in] = resource_idle[r]
            nic_in += 1
    link_group_idle = np.ones((num_device_groups, num_device_groups))
    for a in range(num_device_groups):
        for b in range(num_device_groups):
            if pair_count[a, b] > 0:
                link_group_idle[a, b] = pair_idle[a, b] / pair_count[a, b]
    group_peak = np.zeros(num_device_groups)
    idle_sum = np.zeros(num_device_groups)
    members = np.zeros(num_device_groups, dtype=np.int64)
    for d in range(device_group.size):
        k = device_group[d]
        if peak_memory[d] > group_peak[k] or peak_memory[d] != peak_memory[d]:  # np.maximum keeps a NaN
            group_peak[k] = peak_memory[d]
        idle_sum[k] += resource_idle[d]
        members[k] += 1
    group_idle = np.empty(num_device_groups)
    for k in range(num_device_groups):
        group_idle[k] = idle_sum[k] / members[k] if members[k] > 0 else np.nan
    return (group_makespan, group_output_idle, resource_idle, link_idle, nic_out_idle, nic_in_idle, group_peak,
            group_idle, link_group_idle)


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

