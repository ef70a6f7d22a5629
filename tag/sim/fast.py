"""The fast simulator that search calls thousands of times: list scheduling over flat arrays, compiled.

It runs the rules of :mod:`tag.sim.reference` without events. Tasks are taken one at a time from a
priority queue of the tasks whose dependencies have all been scheduled, keyed ``(ready time, task id)``
(a radix heap, which the order of point 1 below allows); each starts at ``max(ready time, free time of
each resource it holds)`` and pushes those free times to its finish.
A task's ready time is the latest *release* of its dependencies: the predecessor's start plus the
dependency's lag (:class:`tag.sim.taskgraph.Lags`), which is the predecessor's duration, so its finish bit
for bit, except inside merged chunk tasks (:mod:`tag.sim.merge`).

Why this equals the event simulation:

1. Ready times leave the queue in non-decreasing order: a task enters the queue when its last dependency
   is taken, with a ready time no earlier than that dependency's release, hence no earlier than its
   start (lags are never negative), hence no earlier than the ready time just taken. So every resource
   sees its tasks in the order the event simulation queues
   them (by ready time, then id among the tasks known at that instant): a task that becomes ready at t
   only through a zero-duration task started at t enters the queue after the (t, ·) keys already taken,
   exactly as the event simulation queues it behind the tasks of instant t already queued.
2. Under strict FIFO a task starts when it heads every queue it is in and those resources are free,
   i.e. once its predecessor in each queue has finished and it is ready: the max above. Both paths add
   the same floats in the same order, so the times agree bit for bit.

Peak memory is a sweep over tensor lifetimes [producer start, max(producer finish, last consumer
finish)), frees before allocations at equal times, which is the reference's per-instant counting (inside
merged tasks, the starts and ends of the chunks that produce and read the tensor: the lags).

The loops themselves are :mod:`tag.sim.kernels` (numba). Search does not build a TaskGraph at all: it
calls :func:`tag.compiler.evaluate_strategy`, which assembles the same task columns from cached
fragments and runs the same kernels.
"""

from __future__ import annotations

import numpy as np

from tag.sim import kernels
from tag.sim.kernels import list_schedule
from tag.sim.result import SimulationResult, make_result
from tag.sim.taskgraph import TaskGraph

__all__ = ["simulate_fast", "schedule", "peak_memory"]


def schedule(taskgraph: TaskGraph) -> tuple[np.ndarray, np.ndarray]:
    """(start [T], finish [T]) by list scheduling in (ready time, task id) order (compiled:
    :func:`tag.sim.kernels.list_schedule`)."""
    tg = taskgraph
    return list_schedule(tg.duration, tg.res_ptr, tg.res, tg.succ_ptr, tg.succ, tg.succ_lag, np.diff(tg.dep_ptr),
                         tg.num_resources)


def peak_memory(taskgraph: TaskGraph, start: np.ndarray, finish: np.ndarray) -> np.ndarray:
    """[D] peak live bytes per device for a schedule (start/finish [T])."""
    tg = taskgraph
    reader_tensor = np.repeat(np.arange(tg.num_tensors), np.diff(tg.consumer_ptr))  # [K] consumer pairs
    return kernels.peak_memory(tg.num_devices, tg.tensor_device, tg.tensor_bytes, tg.tensor_persistent,
                               tg.tensor_producer, tg.lags.alloc, tg.lags.free, reader_tensor, tg.consumer,
                               tg.lags.consumer, start, finish)


def simulate_fast(taskgraph: TaskGraph, *, raise_on_oom: bool = False, feedback: bool = True) -> SimulationResult:
    """Same result as :func:`tag.sim.reference.simulate` (iteration time, start/finish, peak memory,
    feedback), computed without events. Pass ``feedback=False`` in a search loop that reads only the
    time and memory."""
    start, finish = schedule(taskgraph)
    peak = peak_memory(taskgraph, start, finish)
    return make_result(taskgraph, start, finish, peak, feedback=feedback, raise_on_oom=raise_on_oom)
