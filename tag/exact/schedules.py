"""Pipeline schedules: the order of forward and backward micro-batch actions on each stage.

An :class:`Action` is one stage's forward or backward pass of one micro-batch; its ``repr`` is compact,
``2F0`` = stage 2, forward, micro-batch 0 (STYLE item 10). Orders are per stage (every replica of a
stage runs its stage's order):

- **GPipe**: all M forwards, then all M backwards (ascending micro-batch), so a stage holds the
  activations of all M micro-batches at its peak;
- **1F1B** (PipeDream-Flush): stage s (0-based of S) runs min(S − s − 1, M) warm-up forwards, then
  alternates one forward and one backward, then drains the remaining backwards; it holds at most
  min(S − s, M) micro-batches.

:func:`format_grid` runs the orders with unit (or given) durations and draws a text grid, one row per
stage, for debugging a schedule by eye.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

from tag.exact.stage_graph import SCHEDULES, PartitionError

__all__ = ["Action", "FORWARD", "BACKWARD", "stage_order", "stage_orders", "unit_time_schedule", "format_grid"]

FORWARD, BACKWARD = "F", "B"


class Action(NamedTuple):
    """Stage ``stage`` runs pass ``kind`` ("F" or "B") of micro-batch ``micro_batch``."""

    stage: int
    kind: str
    micro_batch: int

    def __repr__(self) -> str:
        return f"{self.stage}{self.kind}{self.micro_batch}"


def stage_order(stage: int, num_stages: int, micro_batches: int, schedule: str = "1f1b") -> list[Action]:
    """The 2·M actions of ``stage`` in the order it runs them."""
    if schedule not in SCHEDULES:
        raise PartitionError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if not 0 <= stage < num_stages or micro_batches < 1:
        raise PartitionError(f"stage {stage} of {num_stages} with {micro_batches} micro-batches is not a schedule")
    forward = [Action(stage, FORWARD, m) for m in range(micro_batches)]
    backward = [Action(stage, BACKWARD, m) for m in range(micro_batches)]
    if schedule == "gpipe":
        return forward + backward
    warmup = min(num_stages - stage - 1, micro_batches)
    order = forward[:warmup]
    for m in range(micro_batches - warmup):
        order += [forward[warmup + m], backward[m]]
    return order + backward[micro_batches - warmup:]


def stage_orders(num_stages: int, micro_batches: int, schedule: str = "1f1b") -> list[list[Action]]:
    """[S] the order of every stage."""
    return [stage_order(s, num_stages, micro_batches, schedule) for s in range(num_stages)]


def unit_time_schedule(orders: Sequence[Sequence[Action]], *, forward: Sequence[float] | float = 1.0,
                       backward: Sequence[float] | float = 1.0,
                       edges: tuple[Sequence[int], Sequence[int]] | None = None) -> dict[Action, tuple[float, float]]:
    """(start, finish) of every action when stage s's passes take forward[s] / backward[s] and no time
    is spent communicating. ``edges`` (src, dst) is the stage graph, default the chain 0 → 1 → … → S−1:
    F(y, m) waits for F(x, m) of every edge x → y; B(x, m) waits for F(x, m) and B(y, m) of every edge
    x → y. PartitionError names the stuck actions when the orders deadlock."""
    num_stages = len(orders)
    src, dst = edges if edges is not None else (range(num_stages - 1), range(1, num_stages))
    preds: list[list[int]] = [[] for _ in range(num_stages)]
    succs: list[list[int]] = [[] for _ in range(num_stages)]
    for a, b in zip(src, dst):
        preds[int(b)].append(int(a))
        succs[int(a)].append(int(b))
    fwd = [float(forward)] * num_stages if np.isscalar(forward) else [float(x) for x in forward]
    bwd = [float(backward)] * num_stages if np.isscalar(backward) else [float(x) for x in backward]
    times: dict[Action, tuple[float, float]] = {}
    position = [0] * num_stages
    clock = [0.0] * num_stages
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s, order in enumerate(orders):
            while position[s] < len(order):
                action = order[position[s]]
                m = action.micro_batch
                if action.kind == FORWARD:
                    deps = [Action(p, FORWARD, m) for p in preds[s]]
                else:
                    deps = [Action(s, FORWARD, m)] + [Action(c, BACKWARD, m) for c in succs[s]]
                if any(d not in times for d in deps):
                    break
                start = max([clock[s]] + [times[d][1] for d in deps])
                finish = start + (fwd[s] if action.kind == FORWARD else bwd[s])
                times[action] = (start, finish)
                clock[s] = finish
                position[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = [repr(orders[s][position[s]]) for s in range(num_stages) if position[s] < len(orders[s])]
            raise PartitionError(f"the stage orders deadlock: {', '.join(stuck)} wait on actions that never run")
    return times


def format_grid(orders: Sequence[Sequence[Action]], *, forward: Sequence[float] | float = 1.0,
                backward: Sequence[float] | float = 1.0, slot: float | None = None,
                edges: tuple[Sequence[int], Sequence[int]] | None = None) -> str:
    """A text grid of :func:`unit_time_schedule`: one row per stage, one column per ``slot`` of time
    (default the shortest pass), ``.`` where the stage idles."""
    times = unit_time_schedule(orders, forward=forward, backward=backward, edges=edges)
    durations = [finish - start for start, finish in times.values() if finish > start]
    slot = slot or (min(durations) if durations else 1.0)
    makespan = max((finish for _, finish in times.values()), default=0.0)
    columns = int(round(makespan / slot))
    width = max((len(repr(a)) for a in times), default=3)
    lines = []
    for s, order in enumerate(orders):
        cells = ["." * width] * columns
        for action in order:
            start, finish = times[action]
            for c in range(int(round(start / slot)), int(round(finish / slot))):
                cells[c] = repr(action).ljust(width)
        lines.append(f"stage {s:<2d}|" + " ".join(cells) + "|")
    return "\n".join(lines)
