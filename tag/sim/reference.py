"""The op-level reference simulator (TAG §4.3.2): an event-driven run of a TaskGraph.

Rules, which the fast path (:mod:`tag.sim.fast`) reproduces exactly:

- A task becomes **ready** when its last dependency is met (tasks without dependencies at time 0). A
  dependency is met when its predecessor finishes, or, inside a merged chunk task (:mod:`tag.sim.merge`),
  at its lag after the predecessor starts (a ``Release`` event, ordered among the finishes of its instant).
- Each resource (a device's compute stream, a device's comm channel, a link, a NIC direction) keeps a
  **FIFO queue** of the ready tasks that need it, in the order they became ready: by ready time, then
  by task id. A task starts as soon as it is at the head of the queue of every resource it needs and all
  of them are free, and holds them all until it finishes (so a transfer waiting for a busy NIC also
  holds back the transfers queued behind it on its link: strict FIFO, as NCCL streams execute in issue
  order).
- Ties at one instant: every task finishing at time t is retired (resources released, successors made
  ready) before any task made ready at t is queued; tasks made ready at t are then queued in task-id
  order. A task made ready at t by a zero-duration task that itself started at t queues behind the tasks
  of instant t already queued (it could not be known before), and ahead of those not yet queued.
- Memory: reference counting over the TaskGraph's tensors. A tensor is allocated when its producer
  starts and freed once its producer has finished and its last consumer has finished. Peak memory is the
  live bytes after all the frees and allocations of an instant, maximised over instants (frees of an
  instant come before its allocations, so a tensor whose last use ends at t and one whose producer
  starts at t are never counted together). In a graph with lags the allocations and the ends of the
  producer's and readers' use fall at their lags inside those tasks (``Memory`` events).

The event heap holds ``(time, seq, event)`` with a monotonic ``seq`` so that ties are deterministic;
tasks made ready wait in a second heap keyed ``(time, task id)``.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from typing import NamedTuple

import numpy as np

from tag.sim.result import SimulationResult, make_result
from tag.sim.taskgraph import NO_TASK, TaskGraph

__all__ = ["simulate", "Finish"]


class Finish(NamedTuple):
    """A task's finish event."""

    task: int

    def __repr__(self) -> str:
        return f"Finish({self.task})"


class Release(NamedTuple):
    """A dependency met before its predecessor finishes (a merged chunk's output, :mod:`tag.sim.kernels`)."""

    task: int  # the dependent task

    def __repr__(self) -> str:
        return f"Release({self.task})"


class Memory(NamedTuple):
    """A tensor event inside a task (graphs with lags): allocated, or done with by its producer or a reader."""

    tensor: int
    what: int  # _ALLOC, _PRODUCED or _READ

    def __repr__(self) -> str:
        return f"Memory({self.tensor}, {('alloc', 'produced', 'read')[self.what]})"


_ALLOC, _PRODUCED, _READ = range(3)


class _Memory:
    """Reference-counted live bytes per device. D devices, N tensors."""

    def __init__(self, tg: TaskGraph) -> None:
        self.tensor_device = tg.tensor_device.tolist()
        self.tensor_bytes = tg.tensor_bytes.tolist()
        self.refcount = np.diff(tg.consumer_ptr).tolist()  # [N] consumers still to finish
        self.produced_by: list[list[int]] = [[] for _ in range(tg.num_tasks)]  # task -> tensors it produces
        self.consumed_by: list[list[int]] = [[] for _ in range(tg.num_tasks)]  # task -> tensors it reads
        self.producer_done = [True] * tg.num_tensors  # [N]
        self.live = [0.0] * tg.num_devices  # [D]
        consumer = tg.consumer.tolist()
        ptr = tg.consumer_ptr.tolist()
        for tensor, (producer, persistent) in enumerate(zip(tg.tensor_producer.tolist(), tg.tensor_persistent.tolist())):
            for task in consumer[ptr[tensor]:ptr[tensor + 1]]:
                if not persistent:
                    self.consumed_by[task].append(tensor)
            if persistent or producer == NO_TASK:
                self.live[self.tensor_device[tensor]] += self.tensor_bytes[tensor]  # from time 0
            else:
                self.produced_by[producer].append(tensor)
                self.producer_done[tensor] = False
        self.peak = [0.0] * tg.num_devices  # [D] sampled at the end of each instant
        self.lagged = tg.plan.lagged
        if self.lagged:  # where in its producer's and readers' runs each tensor event falls
            self.alloc_lag = tg.lags.alloc.tolist()  # [N]
            self.free_lag = tg.lags.free.tolist()  # [N]
            self.read_lag: list[list[float]] = [[] for _ in range(tg.num_tasks)]  # task -> lag per consumed_by
            lags = tg.lags.consumer.tolist()
            persistent = tg.tensor_persistent.tolist()
            for tensor in range(tg.num_tensors):
                if not persistent[tensor]:
                    for k in range(ptr[tensor], ptr[tensor + 1]):
                        self.read_lag[consumer[k]].append(lags[k])

    def events(self, task: int) -> list[tuple[float, Memory]]:
        """(lag, event) of the tensor events inside ``task`` (graphs with lags)."""
        out = []
        for tensor in self.produced_by[task]:
            out.append((self.alloc_lag[tensor], Memory(tensor, _ALLOC)))
            out.append((self.free_lag[tensor], Memory(tensor, _PRODUCED)))
        for tensor, lag in zip(self.consumed_by[task], self.read_lag[task]):
            out.append((lag, Memory(tensor, _READ)))
        return out

    def apply(self, event: Memory) -> None:
        tensor = event.tensor
        if event.what == _ALLOC:
            self.live[self.tensor_device[tensor]] += self.tensor_bytes[tensor]
        elif event.what == _PRODUCED:
            self.producer_done[tensor] = True
            if self.refcount[tensor] == 0:
                self._free(tensor)
        else:
            self.refcount[tensor] -= 1
            if self.refcount[tensor] == 0 and self.producer_done[tensor]:
                self._free(tensor)

    def start(self, task: int) -> None:
        for tensor in self.produced_by[task]:
            self.live[self.tensor_device[tensor]] += self.tensor_bytes[tensor]

    def finish(self, task: int) -> None:
        for tensor in self.produced_by[task]:
            self.producer_done[tensor] = True
            if self.refcount[tensor] == 0:
                self._free(tensor)
        for tensor in self.consumed_by[task]:
            self.refcount[tensor] -= 1
            if self.refcount[tensor] == 0 and self.producer_done[tensor]:
                self._free(tensor)

    def _free(self, tensor: int) -> None:
        self.live[self.tensor_device[tensor]] -= self.tensor_bytes[tensor]

    def end_of_instant(self) -> None:
        self.peak = [max(p, x) for p, x in zip(self.peak, self.live)]


class _Reference:
    """The simulation state of one run. T tasks, R resources."""

    def __init__(self, tg: TaskGraph) -> None:
        plan = tg.plan
        self.duration = plan.duration  # [T]
        self.resources = plan.resources  # [T] resource ids each task holds
        self.successors = plan.successors  # [T] dependencies met at the task's finish
        self.early = plan.early  # [T] (lag, successor): dependencies met that long after the task's start
        self.waiting_deps = list(plan.indegree)  # [T] dependencies not finished yet
        self.queue = [deque() for _ in range(tg.num_resources)]  # [R] FIFO of ready tasks
        self.busy = [False] * tg.num_resources  # [R]
        self.start = np.full(tg.num_tasks, np.nan)  # [T]
        self.finish = np.full(tg.num_tasks, np.nan)  # [T]
        self.memory = _Memory(tg)
        self.events: list[tuple[float, int, Finish]] = []  # heap of (time, seq, event)
        self.ready: list[tuple[float, int]] = [(0.0, task) for task in plan.sources]  # heap of (time, task)
        self.seq = itertools.count()
        self.now = 0.0

    def run(self) -> None:
        events, ready = self.events, self.ready
        while events or ready:
            # Finishes at an instant come before the queueing of tasks made ready at that instant.
            if events and (not ready or events[0][0] <= ready[0][0]):
                time, _, event = heapq.heappop(events)
                self._advance(time)
                if isinstance(event, Finish):
                    self._retire(event.task)
                elif isinstance(event, Release):
                    self._release(event.task)
                else:
                    self.memory.apply(event)
            else:
                time, task = heapq.heappop(ready)
                self._advance(time)
                self._enqueue(task)
        self.memory.end_of_instant()
        if np.isnan(self.finish).any():  # unreachable for a validated (acyclic) graph
            raise RuntimeError("reference simulator: some tasks never ran")

    def _advance(self, time: float) -> None:
        if time > self.now:
            self.memory.end_of_instant()
            self.now = time

    def _enqueue(self, task: int) -> None:
        for resource in self.resources[task]:
            self.queue[resource].append(task)
        self._try_start(task)

    def _try_start(self, task: int) -> None:
        resources = self.resources[task]
        if any(self.busy[r] or self.queue[r][0] != task for r in resources):
            return
        for resource in resources:
            self.queue[resource].popleft()
            self.busy[resource] = True
        self.start[task] = self.now
        if self.memory.lagged:
            for lag, event in self.memory.events(task):
                heapq.heappush(self.events, (self.now + lag, next(self.seq), event))
        else:
            self.memory.start(task)
        heapq.heappush(self.events, (self.now + self.duration[task], next(self.seq), Finish(task)))
        for lag, successor in self.early[task]:
            heapq.heappush(self.events, (self.now + lag, next(self.seq), Release(successor)))

    def _release(self, task: int) -> None:
        self.waiting_deps[task] -= 1
        if self.waiting_deps[task] == 0:
            heapq.heappush(self.ready, (self.now, task))

    def _retire(self, task: int) -> None:
        self.finish[task] = self.now
        if not self.memory.lagged:
            self.memory.finish(task)
        for resource in self.resources[task]:
            self.busy[resource] = False
        for successor in self.successors[task]:
            self._release(successor)
        for resource in self.resources[task]:
            if self.queue[resource]:
                self._try_start(self.queue[resource][0])


def simulate(taskgraph: TaskGraph, *, raise_on_oom: bool = False, feedback: bool = True) -> SimulationResult:
    """Run ``taskgraph`` event by event; see the module docstring for the rules.

    ``raise_on_oom`` raises :class:`~tag.sim.errors.OOMError` when a device's peak memory exceeds its
    capacity (otherwise the result says so: ``feasible`` False, ``oom_device``). ``feedback=False`` skips
    the Table 1 feedback.
    """
    state = _Reference(taskgraph)
    state.run()
    peak = np.array(state.memory.peak, dtype=np.float64)
    return make_result(taskgraph, state.start, state.finish, peak, feedback=feedback, raise_on_oom=raise_on_oom)
