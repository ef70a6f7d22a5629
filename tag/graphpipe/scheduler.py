"""GraphPipe's static micro-batch scheduler (§6, App. A.1): in-flight counts over a DAG of stages and the
generalised 1F1B order they induce.

**In-flight counts** (ComputeInFlight, App. A.1 Table 2). A stage x under a k_x F k_x B schedule with
micro-batch size b_x keeps activations of i_x samples at its peak. A sink stage holds k_x·b_x; any
other stage holds the maximum over its successors y of Table 2's entry for (k_x, b_x, k_y, b_y, i_y).
The table is transcribed in :func:`inflight_samples`. With GraphPipe's default configuration (1F1B,
one micro-batch size b everywhere) every entry is i_y + b, so in micro-batches
i_x = 1 + max over successors i_y, sinks 1: the number of stages on the longest path from x to the
end of the pipeline. On a chain of S stages that is S − s, PipeDream-Flush's count. Counts are capped
at the number of micro-batches M.

**Orders** (ScheduleTask: greedy, backward first). Stage s runs its first min(i_s, M) forwards, then,
each time it holds i_s micro-batches, the backward of the oldest one as soon as possible followed by the
next forward, and drains the remaining backwards: 1F1B with the warm-up length i_s read off the stage
graph instead of S − s. Every order satisfies GraphPipe's C4 (F_k before F_{k+1}, B_k before B_{k+1},
F_k before B_k) by construction; :func:`check_schedule` verifies C4 and the stage-graph dependencies,
and :func:`unit_time_schedule_dag` runs the orders to show they cannot deadlock.

Actions are :class:`tag.exact.schedules.Action` (``2F0`` = stage 2, forward, micro-batch 0).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from tag._arrays import edge_arrays, kahn_order
from tag.errors import TagError
from tag.exact.schedules import BACKWARD, FORWARD, Action, format_grid, unit_time_schedule
from tag.exact.stage_graph import PartitionError

__all__ = [
    "ScheduleError",
    "inflight_samples",
    "stage_inflight",
    "graph_stage_orders",
    "check_schedule",
    "unit_time_schedule_dag",
    "format_grid_dag",
    "stage_depths",
]


class ScheduleError(TagError):
    """A schedule request is malformed: a cyclic stage graph, a bad count, a deadlocking order."""


def inflight_samples(kx: int, bx: int, ky: int, by: int, iy: int) -> int:
    """Samples in flight at stage x from its successor y (GraphPipe App. A.1, Table 2).

    ``kx``/``ky``: the k of each stage's kFkB schedule; ``bx``/``by``: micro-batch sizes; ``iy``: samples
    in flight at y. Outside the table's conditions (k_x·b_x below max{b_x, b_y}) the largest form of the
    table, i_y + 2·max{b_x, b_y}, is taken.
    """
    for name, value in (("kx", kx), ("bx", bx), ("ky", ky), ("by", by)):
        if value < 1:
            raise ScheduleError(f"{name} must be a positive integer, got {value!r}")
    top = max(bx, by)
    gx, gy = kx * bx, ky * by  # samples per group of k passes
    if gx < gy:
        return iy + (top if gx == top else 2 * top)  # rows 1-2 (row 1 also covers gx < top)
    if gy < gx:
        if bx <= by:
            return iy + (gx if by == gy else gx - gy + 2 * by)  # rows 3-4
        return iy + (gx if bx == gy else gx - gy + 2 * bx)  # rows 5-6
    return iy + (gy if top == gy else 2 * top)  # rows 7-8


def _topological(num_stages: int, edge_src: np.ndarray, edge_dst: np.ndarray) -> list[int]:
    order, _ = kahn_order(num_stages, edge_src, edge_dst)
    if len(order) != num_stages:
        raise ScheduleError("the stage graph has a cycle")
    return order


def stage_inflight(num_stages: int, edge_src: Sequence[int], edge_dst: Sequence[int], *,
                   micro_batches: int | None = None, micro_batch_sizes: Sequence[int] | None = None,
                   ks: Sequence[int] | None = None) -> np.ndarray:
    """[S] peak in-flight micro-batches of each stage of a stage DAG (ComputeInFlight, module docstring).

    ``micro_batch_sizes`` [S] and ``ks`` [S] default to 1 (one size everywhere, 1F1B); with them the
    count is in samples / b_s, rounded up. ``micro_batches`` (M) caps the counts.
    """
    if num_stages < 1:
        raise ScheduleError("the stage graph has no stages")
    src, dst = edge_arrays(num_stages, edge_src, edge_dst, ScheduleError, "stage")
    b = np.ones(num_stages, dtype=np.int64) if micro_batch_sizes is None else np.asarray(micro_batch_sizes)
    k = np.ones(num_stages, dtype=np.int64) if ks is None else np.asarray(ks)
    if b.shape != (num_stages,) or k.shape != (num_stages,):
        raise ScheduleError(f"micro_batch_sizes and ks need one entry per stage ({num_stages})")
    succ: list[list[int]] = [[] for _ in range(num_stages)]
    for a, c in zip(src.tolist(), dst.tolist()):
        succ[a].append(c)
    samples = np.zeros(num_stages, dtype=np.int64)
    for x in reversed(_topological(num_stages, src, dst)):
        if not succ[x]:
            samples[x] = int(k[x] * b[x])
        else:
            samples[x] = max(inflight_samples(int(k[x]), int(b[x]), int(k[y]), int(b[y]), int(samples[y]))
                             for y in succ[x])
    counts = -(-samples // b)
    if micro_batches is not None:
        if micro_batches < 1:
            raise ScheduleError(f"micro_batches must be a positive integer, got {micro_batches!r}")
        counts = np.minimum(counts, micro_batches)
    return counts.astype(np.int64)


def stage_depths(num_stages: int, edge_src: Sequence[int], edge_dst: Sequence[int]) -> np.ndarray:
    """[S] stages on the longest path from each stage to a sink (itself included): the uncapped 1F1B
    in-flight count; its maximum is the pipeline depth (GraphPipe §2)."""
    return stage_inflight(num_stages, edge_src, edge_dst)


def graph_stage_orders(inflight: Sequence[int], micro_batches: int) -> list[list[Action]]:
    """[S] the order of each stage: min(i_s, M) warm-up forwards, then backward-first alternation, then
    the remaining backwards (module docstring)."""
    if micro_batches < 1:
        raise ScheduleError(f"micro_batches must be a positive integer, got {micro_batches!r}")
    orders = []
    for s, count in enumerate(inflight):
        if count < 1:
            raise ScheduleError(f"stage {s} has in-flight count {count}; every stage holds at least one")
        warmup = min(int(count), micro_batches)
        order = [Action(s, FORWARD, m) for m in range(warmup)]
        for m in range(micro_batches - warmup):
            order += [Action(s, BACKWARD, m), Action(s, FORWARD, warmup + m)]
        order += [Action(s, BACKWARD, m) for m in range(micro_batches - warmup, micro_batches)]
        orders.append(order)
    return orders


def check_schedule(orders: Sequence[Sequence[Action]], edge_src: Sequence[int], edge_dst: Sequence[int],
                   micro_batches: int) -> list[str]:
    """Violations of C4 (per stage: F_k before F_{k+1}, B_k before B_{k+1}, F_k before B_k; every
    micro-batch passed once each way) and of deadlock freedom over the stage DAG; empty when valid."""
    problems = []
    for s, order in enumerate(orders):
        fwd = [a.micro_batch for a in order if a.kind == FORWARD]
        bwd = [a.micro_batch for a in order if a.kind == BACKWARD]
        if fwd != list(range(micro_batches)):
            problems.append(f"stage {s}: forwards {fwd} are not 0..{micro_batches - 1} in order")
        if bwd != list(range(micro_batches)):
            problems.append(f"stage {s}: backwards {bwd} are not 0..{micro_batches - 1} in order")
        position = {(a.kind, a.micro_batch): p for p, a in enumerate(order)}
        for m in range(micro_batches):
            if (FORWARD, m) in position and (BACKWARD, m) in position and \
                    position[FORWARD, m] > position[BACKWARD, m]:
                problems.append(f"stage {s}: B{m} runs before F{m}")
    if not problems:
        try:
            unit_time_schedule_dag(orders, edge_src, edge_dst)
        except ScheduleError as error:
            problems.append(str(error))
    return problems


def unit_time_schedule_dag(orders: Sequence[Sequence[Action]], edge_src: Sequence[int], edge_dst: Sequence[int],
                           *, forward: Sequence[float] | float = 1.0,
                           backward: Sequence[float] | float = 1.0) -> dict[Action, tuple[float, float]]:
    """(start, finish) of every action when stage s's passes take forward[s] / backward[s], with no
    communication time: F(y, m) waits for F(x, m) of every edge x → y; B(x, m) waits for F(x, m) and
    B(y, m) of every edge x → y (:func:`tag.exact.schedules.unit_time_schedule` over the stage DAG).
    Raises ScheduleError when the orders deadlock."""
    src, dst = edge_arrays(len(orders), edge_src, edge_dst, ScheduleError, "stage")
    try:
        return unit_time_schedule(orders, forward=forward, backward=backward, edges=(src.tolist(), dst.tolist()))
    except PartitionError as error:
        raise ScheduleError(str(error)) from None


def format_grid_dag(orders: Sequence[Sequence[Action]], edge_src: Sequence[int], edge_dst: Sequence[int], *,
                    forward: Sequence[float] | float = 1.0, backward: Sequence[float] | float = 1.0) -> str:
    """A text grid of :func:`unit_time_schedule_dag`, one row per stage, ``.`` where it idles."""
    src, dst = edge_arrays(len(orders), edge_src, edge_dst, ScheduleError, "stage")
    return format_grid(orders, forward=forward, backward=backward, edges=(src.tolist(), dst.tolist()))
