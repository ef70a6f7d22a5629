"""What a simulation returns: times, memory, feasibility and the runtime feedback of TAG Table 1.

Both simulators (reference and fast) fill :class:`SimulationResult` from their start/finish times and
peak memory; the feedback is a pure function of those (:func:`compute_feedback`), so the two paths agree
on it whenever they agree on the schedule.

Idle figures are fractions in [0, 1] (multiply by 100 for a percentage); with a makespan of 0 every
resource counts as fully idle.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

from tag.sim.errors import OOMError
from tag.sim.kernels import feedback_sums, feedback_tables
from tag.cluster import Cluster
from tag.sim.taskgraph import TaskGraph

__all__ = ["SimulationResult", "Feedback", "compute_feedback", "feedback_from_columns", "make_result",
           "result_from_schedule", "oom_error"]


class Feedback(NamedTuple):
    """Runtime feedback (TAG Table 1). G op groups, D devices, Gd device groups, M machines, L links, R
    resources."""

    group_makespan: np.ndarray  # [G] first start to last finish of the group's tasks; 0 for an empty group
    group_output_idle: np.ndarray  # [G] mean wait from a compute task's finish to the start of a transfer or
    #                                collective depending on it; 0 where the group sends nothing
    device_idle: np.ndarray  # [D] 1 - busy compute time / makespan
    comm_idle: np.ndarray  # [D] 1 - busy time of the device's comm channel (collectives) / makespan
    device_group_peak_memory: np.ndarray  # [Gd] largest peak memory of a member device
    device_group_idle: np.ndarray  # [Gd] mean device_idle of the members
    resource_busy: np.ndarray  # [R] seconds each resource is held
    resource_idle: np.ndarray  # [R] 1 - resource_busy / makespan
    link_idle: np.ndarray  # [L] idle of each used link resource, in the order of TaskGraph.link_resources()
    nic_out_idle: np.ndarray  # [M] 1.0 where the machine has no shared NIC or sends nothing off-machine
    nic_in_idle: np.ndarray  # [M]
    device_group_link_idle: np.ndarray  # [Gd, Gd] mean idle of the used links from group a to group b; 1.0
    #                                     where no transfer goes from a to b


class SimulationResult(NamedTuple):
    """One simulated iteration. T tasks, D devices."""

    iteration_time: float  # makespan, seconds
    start: np.ndarray  # [T] seconds
    finish: np.ndarray  # [T] seconds
    peak_memory: np.ndarray  # [D] bytes: max over time of the live tensor bytes on each device
    feasible: bool  # no device exceeds its memory
    oom_device: int  # the device most over its capacity (largest peak / capacity), -1 if feasible
    memory_capacity: np.ndarray  # [D] bytes
    feedback: Feedback | None  # None when the caller asked for none


def make_result(taskgraph: TaskGraph, start: np.ndarray, finish: np.ndarray, peak_memory: np.ndarray, *,
                feedback: bool, raise_on_oom: bool) -> SimulationResult:
    """Fill a SimulationResult; raise OOMError first when asked to and a device overflows."""
    return result_from_schedule(taskgraph.cluster, start, finish, peak_memory,
                                lambda: compute_feedback(taskgraph, start, finish, peak_memory) if feedback else None,
                                raise_on_oom=raise_on_oom)


def result_from_schedule(cluster: Cluster, start: np.ndarray, finish: np.ndarray, peak_memory: np.ndarray,
                         feedback: Callable[[], Feedback | None], *, raise_on_oom: bool,
                         capacity: np.ndarray | None = None) -> SimulationResult:
    """A SimulationResult from a schedule on ``cluster``; ``feedback`` computes the feedback (or returns
    None), and is not called when OOMError is raised. ``capacity``: ``cluster.memory_bytes()``, if the caller
    keeps it."""
    capacity = cluster.memory_bytes() if capacity is None else capacity
    over = peak_memory > capacity
    oom_device = int(np.argmax(np.where(over, peak_memory / capacity, -np.inf))) if over.any() else -1
    iteration_time = float(finish.max()) if len(finish) else 0.0
    if raise_on_oom and oom_device >= 0:
        raise _oom_error(cluster, oom_device, peak_memory, capacity)
    return SimulationResult(
        iteration_time=iteration_time,
        start=start,
        finish=finish,
        peak_memory=peak_memory,
        feasible=oom_device < 0,
        oom_device=oom_device,
        memory_capacity=capacity,
        feedback=feedback(),
    )


def oom_error(result: SimulationResult, taskgraph: TaskGraph | Cluster) -> OOMError:
    """The OOMError for an infeasible result (its device, peak and capacity in human units)."""
    if result.oom_device < 0:
        raise ValueError("oom_error: the result is feasible")
    cluster = taskgraph if isinstance(taskgraph, Cluster) else taskgraph.cluster
    return _oom_error(cluster, result.oom_device, result.peak_memory, result.memory_capacity)


def _oom_error(cluster: Cluster, device: int, peak_memory: np.ndarray, capacity: np.ndarray) -> OOMError:
    detail = f"{cluster.gpu(device).name} on machine {int(cluster.machine[device])}"
    return OOMError(device, peak_memory[device], capacity[device], detail=detail)


def compute_feedback(taskgraph: TaskGraph, start: np.ndarray, finish: np.ndarray,
                     peak_memory: np.ndarray) -> Feedback:
    """Table 1 feedback from a schedule: start/finish [T], peak_memory [D]."""
    tg = taskgraph
    return feedback_from_columns(tg.cluster, tg.num_groups, tg.group, tg.kind, tg.duration, tg.res_ptr, tg.res,
                                 tg.resource_kind, tg.resource_a, tg.resource_b, tg.dep_ptr, tg.dep, tg.lags.dep, start,
                                 finish, peak_memory, by_predecessor=False)


def feedback_from_columns(cluster: Cluster, num_groups: int, group: np.ndarray, kind: np.ndarray,
                          duration: np.ndarray, res_ptr: np.ndarray, res: np.ndarray, resource_kind: np.ndarray,
                          resource_a: np.ndarray, resource_b: np.ndarray, edge_ptr: np.ndarray, edge_end: np.ndarray,
                          edge_lag: np.ndarray, start: np.ndarray, finish: np.ndarray, peak_memory: np.ndarray, *,
                          by_predecessor: bool) -> Feedback:
    """Table 1 feedback from the columns of a TaskGraph (see :class:`~tag.sim.taskgraph.TaskGraph`; T
    tasks, R resources) and a schedule; the dependencies as a CSR edge_ptr [T+1] / edge_end [E] of each
    task's successors (``by_predecessor``) or predecessors, met edge_lag [E] after the predecessor's start
    (empty: at its finish); a dependency listed twice counts once. The fast evaluator, which builds no
    TaskGraph, calls it directly with its successor lists (:func:`~tag.sim.kernels.successor_lists`)."""
    d = cluster.num_devices
    makespan = float(finish.max()) if len(finish) else 0.0
    first, last, total, count, resource_busy = feedback_sums(num_groups, len(resource_kind), group, kind, duration,
                                                             res_ptr, res, edge_ptr, edge_end, edge_lag,
                                                             by_predecessor, start, finish)
    (group_makespan, group_output_idle, resource_idle, link_idle, nic_out_idle, nic_in_idle, group_peak,
     device_group_idle, device_group_link_idle) = feedback_tables(
        first, last, total, count, resource_busy, makespan, resource_kind, resource_a, resource_b,
        cluster.device_group, cluster.num_device_groups, peak_memory)
    return Feedback(
        group_makespan=group_makespan,
        group_output_idle=group_output_idle,
        device_idle=resource_idle[:d],
        comm_idle=resource_idle[d:2 * d],
        device_group_peak_memory=group_peak,
        device_group_idle=device_group_idle,
        resource_busy=resource_busy,
        resource_idle=resource_idle,
        link_idle=link_idle,
        nic_out_idle=nic_out_idle,
        nic_in_idle=nic_in_idle,
        device_group_link_idle=device_group_link_idle,
    )
