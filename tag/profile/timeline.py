"""Where a rank's step time goes under `tag run`: every instruction of the step timed as it runs.

:class:`TimedProgram` wraps a :class:`~tag.execute.lower.RankProgram` for :func:`tag.execute.launch.launch`
(anything with ``make_runtime`` runs there): its runtime is `tag run`'s own interpreter, each compute,
send, receive and collective instruction timed by ``perf_counter``, and each step's result carries the
rank's timeline under :data:`TIMELINE_KEY` (the run's combining step reads only the plan's own outputs).
:func:`timelines` takes them out of the reports. The timing adds two clock reads per instruction (well
under a microsecond) to what is measured.

A timeline is an array ``[I, 4]`` of (kind, id, start, end): kind one of :data:`INSTRUCTION_KINDS`
(index), id the op of a compute instruction (``op + micro_batch · num_ops`` in a pipeline's folded
program) or the compiler's task of a transfer or collective, times in seconds from the step's start.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from tag.execute.lower import RankProgram
from tag.execute.runtime import RankRuntime

__all__ = ["TIMELINE_KEY", "INSTRUCTION_KINDS", "COMPUTE", "SEND", "RECV", "REDUCE", "LOCAL_REDUCE", "TimedProgram",
           "timelines"]

TIMELINE_KEY = "__timeline__"
INSTRUCTION_KINDS = ("compute", "send", "recv", "reduce", "local reduce")
COMPUTE, SEND, RECV, REDUCE, LOCAL_REDUCE = range(5)  # a local reduce sums a rank's own partials, no message


class _TimedRuntime(RankRuntime):
    """`tag run`'s interpreter, noting (kind, id, start, end) of every instruction it runs."""

    def step(self) -> dict[str, torch.Tensor]:
        self._timeline: list[tuple[int, int, float, float]] = []
        self._start = time.perf_counter()
        results = super().step()
        results[TIMELINE_KEY] = torch.tensor(self._timeline, dtype=torch.float64).reshape(-1, 4)
        return results

    def _timed(self, kind: int, ident: int, run, instruction) -> Any:
        start = time.perf_counter()
        out = run(instruction)
        self._timeline.append((kind, ident, start - self._start, time.perf_counter() - self._start))
        return out

    def _compute(self, c):
        return self._timed(COMPUTE, c.op, super()._compute, c)

    def _send(self, s):
        return self._timed(SEND, s.task, super()._send, s)

    def _recv(self, r):
        return self._timed(RECV, r.task, super()._recv, r)

    def _reduce(self, r):
        return self._timed(REDUCE if len(r.members) > 1 else LOCAL_REDUCE, r.task, super()._reduce, r)


class TimedProgram:
    """A rank program whose runtime times its instructions (module docstring); picklable like the program."""

    def __init__(self, program: RankProgram) -> None:
        self.program = program

    def make_runtime(self, tensors: dict, device=None) -> RankRuntime:
        return _TimedRuntime(self.program, tensors, device)


def timelines(reports: list[dict]) -> list[list[np.ndarray]]:
    """``[rank][step]`` timeline arrays [I, 4] out of :func:`~tag.execute.launch.launch`'s reports of timed
    programs (removed from the step results)."""
    return [[np.asarray(step.pop(TIMELINE_KEY).numpy()) for step in report["results"]] for report in reports]
