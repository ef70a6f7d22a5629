"""The simulator (TAG §4.3.2): TaskGraphs, the event-driven reference, the fast path (list scheduling in
compiled kernels, :mod:`tag.sim.kernels`), feedback and traces. Search does not build TaskGraphs: it calls
:func:`tag.compiler.evaluate_strategy`, which runs the same kernels on cached fragments."""

from tag.sim.errors import OOMError, TaskGraphError
from tag.sim.fast import peak_memory, schedule, simulate_fast
from tag.sim.generate import random_taskgraph
from tag.sim.merge import merge_taskgraph
from tag.sim.reference import simulate
from tag.sim.result import Feedback, SimulationResult, compute_feedback, oom_error
from tag.sim.taskgraph import (
    COLLECTIVES,
    NO_GROUP,
    NO_TASK,
    RES_COMM,
    RES_COMPUTE,
    RES_LINK,
    RES_NIC_IN,
    RES_NIC_OUT,
    RESOURCE_KINDS,
    TASK_COLLECTIVE,
    TASK_COMPUTE,
    TASK_KINDS,
    TASK_TRANSFER,
    Lags,
    TaskGraph,
    TaskGraphBuilder,
)
from tag.sim.trace import ScheduleEntry, device_schedule, format_schedule, gantt, to_chrome_trace

__all__ = [
    # the graph
    "TaskGraph", "TaskGraphBuilder", "TASK_KINDS", "TASK_COMPUTE", "TASK_TRANSFER", "TASK_COLLECTIVE",
    "COLLECTIVES", "RESOURCE_KINDS", "RES_COMPUTE", "RES_COMM", "RES_NIC_OUT", "RES_NIC_IN", "RES_LINK",
    "NO_GROUP", "NO_TASK", "Lags", "merge_taskgraph",
    # simulators and results
    "simulate", "simulate_fast", "schedule", "peak_memory", "SimulationResult", "Feedback", "compute_feedback",
    "oom_error",
    # errors
    "OOMError", "TaskGraphError",
    # looking at schedules
    "to_chrome_trace", "gantt", "format_schedule", "device_schedule", "ScheduleEntry",
    # random graphs
    "random_taskgraph",
]
