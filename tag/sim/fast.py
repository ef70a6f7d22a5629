"""The fast simulator that search calls thousands of times: list scheduling over flat lists.

It runs the rules of :mod:`tag.sim.reference` without events. Tasks are taken one at a time from a heap
of the tasks whose dependencies have all been scheduled, keyed ``(ready time, task id)``; each starts
at ``max(ready time, free time of each resource it holds)`` and pushes those free times to its finish.

Why this equals the event simulation:

1. Ready times leave the heap in non-decreasing order: a task enters the heap when its last dependency
   is taken, with a ready time no earlier than that dependency's finish, hence no earlier than the
   ready time just taken. So every resource sees its tasks in the order the event simulation queues
   them (by ready time, then id among the tasks known at that instant): a task that becomes ready at t
   only through a zero-duration task started at t enters the heap after the (t, ·) keys already taken,
   exactly as the event simulation queues it behind the tasks of instant t already queued.
2. Under strict FIFO a task starts when it heads every queue it is in and those resources are free,
   i.e. once its predecessor in each queue has finished and it is ready: the max above. Both paths add
   the same floats in the same order, so the times agree bit for bit.

Peak memory is a sweep over tensor lifetimes [producer start, max(producer finish, last consumer
finish)), frees before allocations at equal times, which is the reference's per-instant counting.
"""

from __future__ import annotations

import heapq

import numpy as np

from tag.sim.result import SimulationResult, make_result
from tag.sim.taskgraph import TaskGraph

__all__ = ["simulate_fast", "schedule", "peak_memory"]


def schedule(taskgraph: TaskGraph) -> tuple[np.ndarray, np.ndarray]:
    """(start [T], finish [T]) by list scheduling in (ready time, task id) order."""
    plan = taskgraph.plan
    duration, resources, successors = plan.duration, plan.resources, plan.successors
    num_tasks = len(duration)
    waiting = list(plan.indegree)  # [T] dependencies not scheduled yet
    ready = [0.0] * num_tasks  # [T] latest finish among the dependencies scheduled so far
    free = [0.0] * taskgraph.num_resources  # [R] finish of the last task scheduled on each resource
    start = [0.0] * num_tasks
    finish = [0.0] * num_tasks
    heap = [(0.0, task) for task in plan.sources]  # ascending ids: already a heap
    pop, push = heapq.heappop, heapq.heappush
    while heap:
        begin, task = pop(heap)
        held = resources[task]
        for resource in held:
            if free[resource] > begin:
                begin = free[resource]
        end = begin + duration[task]
        for resource in held:
            free[resource] = end
        start[task] = begin
        finish[task] = end
        for successor in successors[task]:
            if ready[successor] < end:
                ready[successor] = end
            waiting[successor] -= 1
            if waiting[successor] == 0:
                push(heap, (ready[successor], successor))
    return np.array(start), np.array(finish)


def peak_memory(taskgraph: TaskGraph, start: np.ndarray, finish: np.ndarray) -> np.ndarray:
    """[D] peak live bytes per device for a schedule (start/finish [T])."""
    tg = taskgraph
    num_devices = tg.num_devices
    persistent = tg.tensor_persistent
    peak = np.bincount(tg.tensor_device[persistent], weights=tg.tensor_bytes[persistent], minlength=num_devices)
    transient = np.flatnonzero(~persistent)
    if len(transient) == 0:
        return peak
    producer = tg.tensor_producer[transient]
    has_producer = producer >= 0
    alloc = np.where(has_producer, start[producer], 0.0)  # [n]
    free = np.where(has_producer, finish[producer], 0.0)  # [n]
    counts = np.diff(tg.consumer_ptr)  # [N]
    if len(tg.consumer):
        last_use = np.full(tg.num_tensors, -np.inf)  # [N] latest consumer finish
        read = counts > 0
        last_use[read] = np.maximum.reduceat(finish[tg.consumer], tg.consumer_ptr[:-1][read])
        free = np.maximum(free, last_use[transient])
    device = tg.tensor_device[transient]
    size = tg.tensor_bytes[transient]
    times = np.concatenate([free, alloc])
    delta = np.concatenate([-size, size])
    is_alloc = np.concatenate([np.zeros(len(transient), bool), np.ones(len(transient), bool)])
    devices = np.concatenate([device, device])
    order = np.lexsort((is_alloc, times, devices))
    bounds = np.searchsorted(devices[order], np.arange(num_devices + 1))
    for d in range(num_devices):
        lo, hi = bounds[d], bounds[d + 1]
        if hi > lo:
            peak[d] += max(0.0, float(np.cumsum(delta[order[lo:hi]]).max()))
    return peak


def simulate_fast(taskgraph: TaskGraph, *, raise_on_oom: bool = False, feedback: bool = True) -> SimulationResult:
    """Same result as :func:`tag.sim.reference.simulate` (iteration time, start/finish, peak memory,
    feedback), computed without events. Pass ``feedback=False`` in a search loop that reads only the
    time and memory."""
    start, finish = schedule(taskgraph)
    peak = peak_memory(taskgraph, start, finish)
    return make_result(taskgraph, start, finish, peak, feedback=feedback, raise_on_oom=raise_on_oom)
