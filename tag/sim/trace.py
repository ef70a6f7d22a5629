"""Looking at a schedule: Chrome trace JSON, a Gantt chart PNG, and a text grid for debugging.

Files are written atomically (a temporary file renamed over the target).
"""

from __future__ import annotations

import io
import json
import os
from typing import Callable, NamedTuple

import numpy as np

from tag._atomic import atomic_write_bytes, atomic_write_text
from tag.sim.result import SimulationResult
from tag.sim.taskgraph import (
    RES_COMM,
    RES_COMPUTE,
    RES_LINK,
    RESOURCE_KINDS,
    TASK_COLLECTIVE,
    TASK_COMPUTE,
    TASK_KINDS,
    TASK_TRANSFER,
    TaskGraph,
)

__all__ = ["ScheduleEntry", "device_schedule", "format_schedule", "to_chrome_trace", "gantt"]

_US = 1e6  # Chrome traces count microseconds
_IDLE = "."
_COLOURS = {TASK_COMPUTE: "tab:blue", TASK_TRANSFER: "tab:orange", TASK_COLLECTIVE: "tab:green"}


class ScheduleEntry(NamedTuple):
    """One task as scheduled on a resource; ``repr`` is compact: ``2F0@1.5``."""

    task: int
    label: str
    start: float
    finish: float

    def __repr__(self) -> str:
        return f"{self.label}@{self.start:g}"


def device_schedule(result: SimulationResult, taskgraph: TaskGraph, device: int, *,
                    stream: str = "compute") -> list[ScheduleEntry]:
    """The tasks on ``device``'s ``stream`` ("compute" or "comm"), in start order."""
    resource = device if stream == "compute" else taskgraph.num_devices + device
    if stream not in ("compute", "comm"):
        raise ValueError(f"stream must be 'compute' or 'comm', got {stream!r}")
    return _on_resource(result, taskgraph, resource)


def _on_resource(result: SimulationResult, tg: TaskGraph, resource: int) -> list[ScheduleEntry]:
    holders = np.repeat(np.arange(tg.num_tasks), np.diff(tg.res_ptr))[tg.res == resource]
    holders = holders[np.lexsort((holders, result.start[holders]))]
    return [ScheduleEntry(int(t), tg.labels[t], float(result.start[t]), float(result.finish[t])) for t in holders]


def format_schedule(result: SimulationResult, taskgraph: TaskGraph, *, columns: int = 60, cell_width: int = 1,
                    symbol: Callable[[int], str] | None = None) -> str:
    """A text grid: one row per device stream (compute, then comm where used), ``columns`` time
    buckets; a cell shows the task that covers most of its bucket (``symbol(task)``, by default its
    label cut to ``cell_width``), ``.`` when idle."""
    tg = taskgraph
    makespan = result.iteration_time
    width = makespan / columns if makespan > 0 else 1.0
    symbol = symbol or (lambda task: tg.labels[task])
    lines = [f"t = 0 .. {makespan:.6g} s, {width:.3g} s per column"]
    for device in range(tg.num_devices):
        for resource, stream in ((device, "cmp"), (tg.num_devices + device, "com")):
            entries = _on_resource(result, tg, resource)
            if not entries and stream == "com":
                continue
            cells = _grid_row(entries, columns, width)
            text = "".join(_IDLE * cell_width if t < 0 else symbol(t)[:cell_width].ljust(cell_width) for t in cells)
            lines.append(f"d{device:<3d}{stream} |{text}|")
    return "\n".join(lines)


def _grid_row(entries: list[ScheduleEntry], columns: int, width: float) -> list[int]:
    best = [-1] * columns
    cover = [0.0] * columns
    for entry in entries:
        if entry.finish <= entry.start:
            continue  # zero-duration tasks cover no bucket
        last = min(int(np.ceil(entry.finish / width)), columns)
        for column in range(min(int(entry.start // width), columns - 1), last):
            overlap = min(entry.finish, (column + 1) * width) - max(entry.start, column * width)
            if overlap > cover[column]:
                cover[column], best[column] = overlap, entry.task
    return best


# ----------------------------------------------------------------------------------------- Chrome trace


def _rows(tg: TaskGraph) -> dict[int, tuple[int, int]]:
    """resource id -> (pid, tid): one process per device (compute, comm threads), one for the network."""
    rows = {}
    network = tg.num_devices
    for resource in range(tg.num_resources):
        kind = int(tg.resource_kind[resource])
        if kind == RES_COMPUTE:
            rows[resource] = (int(tg.resource_a[resource]), 0)
        elif kind == RES_COMM:
            rows[resource] = (int(tg.resource_a[resource]), 1)
        else:
            rows[resource] = (network, resource)
    return rows


def to_chrome_trace(result: SimulationResult, taskgraph: TaskGraph, path: str | os.PathLike) -> None:
    """Write a Chrome trace (``chrome://tracing``, Perfetto): one row per device compute stream, per device
    comm channel and per used link or NIC. Each task is one complete event (category = its kind) on its
    main row (compute stream, link, first member's comm channel); its other resources (NICs, other
    members' channels) carry ``<kind>.occupancy`` events."""
    tg = taskgraph
    rows = _rows(tg)
    used = set(tg.res.tolist())
    events: list[dict] = []
    cluster = tg.cluster
    for device in range(tg.num_devices):
        events.append(_meta("process_name", device, 0, name=f"device {device} ({cluster.gpu(device).name}, "
                                                             f"machine {int(cluster.machine[device])})"))
        events.append(_meta("process_sort_index", device, 0, sort_index=device))
    events.append(_meta("process_name", tg.num_devices, 0, name="network"))
    events.append(_meta("process_sort_index", tg.num_devices, 0, sort_index=tg.num_devices))
    for resource in sorted(used):
        pid, tid = rows[resource]
        name = RESOURCE_KINDS[int(tg.resource_kind[resource])] if pid < tg.num_devices else tg.resource_name(resource)
        events.append(_meta("thread_name", pid, tid, name=name))
        events.append(_meta("thread_sort_index", pid, tid, sort_index=tid))
    for task in range(tg.num_tasks):
        kind = TASK_KINDS[int(tg.kind[task])]
        held = tg.resources(task).tolist()
        main = _main_resource(tg, task, held)
        args = {"task": task, "name": tg.names[task], "group": int(tg.group[task])}
        if tg.kind[task] != TASK_COMPUTE:
            args["nbytes"] = float(tg.nbytes[task])
        for resource in [main] + [r for r in held if r != main]:
            pid, tid = rows[resource]
            events.append({
                "name": tg.labels[task], "cat": kind if resource == main else f"{kind}.occupancy", "ph": "X",
                "ts": float(result.start[task]) * _US, "dur": float(result.finish[task] - result.start[task]) * _US,
                "pid": pid, "tid": tid, "args": args,
            })
    document = {"traceEvents": events, "displayTimeUnit": "ms",
                "otherData": {"cluster": cluster.name, "iteration_time_s": result.iteration_time}}
    atomic_write_text(path, json.dumps(document))


def _main_resource(tg: TaskGraph, task: int, held: list[int]) -> int:
    if tg.kind[task] == TASK_TRANSFER:
        return next(r for r in held if tg.resource_kind[r] == RES_LINK)
    if tg.kind[task] == TASK_COLLECTIVE:
        return tg.num_devices + int(tg.device[task])
    return held[0]


def _meta(what: str, pid: int, tid: int, **args) -> dict:
    return {"name": what, "ph": "M", "pid": pid, "tid": tid, "args": args}


# ----------------------------------------------------------------------------------------- Gantt chart


def gantt(result: SimulationResult, taskgraph: TaskGraph, path: str | os.PathLike, *, title: str | None = None) -> None:
    """Write a Gantt chart PNG: one lane per device, compute in the upper half (blue), communication in
    the lower half (transfers orange on both ends, collectives green on every member)."""
    from matplotlib.figure import Figure  # no pyplot: no global state, renders with Agg
    from matplotlib.patches import Patch

    tg = taskgraph
    bars: dict[tuple[int, int, bool], list[tuple[float, float]]] = {}  # (device, kind, upper half) -> spans
    for task in range(tg.num_tasks):
        kind = int(tg.kind[task])
        span = (float(result.start[task]), float(result.finish[task] - result.start[task]))
        for device in tg.members(task).tolist():
            bars.setdefault((device, kind, kind == TASK_COMPUTE), []).append(span)
    height = max(2.5, 0.45 * tg.num_devices + 1.2)
    figure = Figure(figsize=(11, height))
    axes = figure.add_subplot()
    for (device, kind, upper), spans in bars.items():
        lane = tg.num_devices - 1 - device
        axes.broken_barh(spans, (lane + (0.5 if upper else 0.08), 0.42), facecolors=_COLOURS[kind],
                         edgecolor="black", linewidth=0.2)
    axes.set_yticks([tg.num_devices - 1 - d + 0.5 for d in range(tg.num_devices)])
    axes.set_yticklabels([f"d{d} {tg.cluster.gpu(d).name}" for d in range(tg.num_devices)])
    axes.set_ylim(0, tg.num_devices)
    axes.set_xlim(0, max(result.iteration_time, 1e-12))
    axes.set_xlabel("time (s)")
    axes.set_title(title or f"{tg.cluster.name}: iteration {result.iteration_time:.6g} s")
    axes.legend(handles=[Patch(color=_COLOURS[k], label=TASK_KINDS[k]) for k in _COLOURS],
                loc="upper right", fontsize="small")
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    atomic_write_bytes(path, buffer.getvalue())
