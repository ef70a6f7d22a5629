"""numba's ``njit`` where numba is installed, else the function itself, and the small compiled helpers that
several packages share (a min-heap of integer ids: list scheduling, Kahn's topological order; successor
lists by counting sort).

``cache=True`` keeps each function's machine code beside its module, so only a machine's first run pays the
seconds of compilation (where no cache folder is writable, every run compiles). ``TAG_NO_NUMBA`` in the environment turns numba off (the tests run the plain-Python
paths that way); ``COMPILED`` says which.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

__all__ = ["COMPILED", "jit", "id_push", "id_pop", "kahn_least_first", "successor_lists"]

try:  # numba is a dependency; the fallback keeps the package importable where it cannot be installed
    if os.environ.get("TAG_NO_NUMBA"):
        raise ImportError("TAG_NO_NUMBA is set")
    import numba

    def jit(function: Any) -> Any:
        try:
            return numba.njit(cache=True, nogil=True)(function)
        except RuntimeError:  # "no locator available": neither the package folder nor numba's user cache is
            return numba.njit(nogil=True)(function)  # writable; compile on each run rather than fail at import

    COMPILED = True
except ImportError:  # pragma: no cover - exercised only without numba

    def jit(function: Any) -> Any:
        return function

    COMPILED = False


@jit
def id_push(heap, size, task):
    """Insert ``task`` into the min-heap of ids ``heap[:size]``; returns the new size."""
    position = size
    while position > 0:
        parent = (position - 1) // 2
        if heap[parent] < task:
            break
        heap[position] = heap[parent]
        position = parent
    heap[position] = task
    return size + 1


@jit
def id_pop(heap, size):
    """(smallest id, new size) of the min-heap of ids ``heap[:size]``, which loses it."""
    top = heap[0]
    size -= 1
    task = heap[size]
    position = 0
    child = 1
    while child < size:
        if child + 1 < size and heap[child + 1] < heap[child]:
            child += 1
        if task < heap[child]:
            break
        heap[position] = heap[child]
        position = child
        child = 2 * position + 1
    heap[position] = task
    return top, size


@jit
def kahn_least_first(ptr, succ, indegree):
    """(order [K], nodes placed) of Kahn's algorithm over the successor CSR ``ptr`` [K+1] / ``succ`` [E]
    (int64), the ready node of least index first (a min-heap of node ids). ``order[:placed]`` is the
    topological order; fewer than K placed: a cycle. ``indegree`` [K] (int64, each node's predecessor
    count, parallel edges counted) is consumed: it is left with each unplaced node's in-degree from the
    other unplaced nodes, positive exactly on the unplaced ones (those on or after a cycle)."""
    num_nodes = indegree.size
    heap = np.empty(num_nodes, dtype=np.int64)
    size = 0
    for node in range(num_nodes):  # ascending: already a heap
        if indegree[node] == 0:
            heap[size] = node
            size += 1
    order = np.empty(num_nodes, dtype=np.int64)
    placed = 0
    while size > 0:
        node, size = id_pop(heap, size)
        order[placed] = node
        placed += 1
        for k in range(ptr[node], ptr[node + 1]):
            nxt = succ[k]
            indegree[nxt] -= 1
            if indegree[nxt] == 0:
                size = id_push(heap, size, nxt)
    return order, placed


@jit
def successor_lists(num_tasks, dep_task, dep_on, dep_lag):
    """(succ_ptr [T+1], succ [E], succ_lag [E], indegree [T]) of the dependencies "dep_task[k] waits for
    dep_on[k] until dep_lag[k] seconds after its start" [E]: a counting sort by dep_on, duplicates kept,
    each list in dependency order and the indegree counting each. List scheduling takes the latest release
    of a task's dependencies however often one is listed, so the evaluator skips the merge of
    :func:`tag.sim.kernels.successors_csr`; the feedback, which counts a dependency once, merges the few it
    reads (:func:`tag.sim.kernels.feedback_sums`). An empty dep_lag gives an empty succ_lag. Also the
    successor CSR of a quotient graph (:func:`tag.grouping.quotients_are_dags`)."""
    lagged = dep_lag.size > 0
    # counts one place further on (ptr[on + 2]), so that after the running sum ptr[on + 1] is the start of
    # on's list, the scatter's cursor, and ends as its end: no [T] copy of cursors
    ptr = np.zeros(num_tasks + 2, dtype=np.int64)
    indegree = np.zeros(num_tasks, dtype=dep_task.dtype)
    for k in range(dep_on.size):
        ptr[np.int64(dep_on[k]) + 2] += 1
        indegree[dep_task[k]] += 1
    for t in range(num_tasks):
        ptr[t + 2] += ptr[t + 1]
    succ = np.empty(dep_on.size, dtype=dep_task.dtype)
    lag = np.empty(dep_on.size if lagged else 0)
    for k in range(dep_on.size):
        on = np.int64(dep_on[k]) + 1
        s = ptr[on]
        succ[s] = dep_task[k]
        if lagged:
            lag[s] = dep_lag[k]
        ptr[on] = s + 1
    return ptr[:num_tasks + 1], succ, lag, indegree
