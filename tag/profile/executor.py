"""What `tag run`'s executor adds to the bare op calls, per op, measured in this process.

:mod:`tag.profile.ops` times each recorded call alone, decoded once: the kernel and the framework's
dispatch, what an eager step pays. `tag run` pays more per op: its rank interpreter decodes the record
on every call, assembles each input from the values and messages it holds, keeps and clones what the step
returns. On a CPU, where a small op takes a few microseconds, that is most of a step. This module runs
the whole step as a one-device plan through the executor's own interpreter
(:class:`tag.execute.runtime.RankRuntime`; one device needs no process group) and spreads its excess
over the sum of the bare times evenly over the ops it ran: the constant per op that the cost model then
adds to every op of the profiled step (:attr:`tag.profile.data.ModelTimes.executor_overhead_s`).
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from tag.cluster.presets import local_cluster
from tag.compiler.compile import compile_strategy
from tag.execute.lower import lower_plan
from tag.execute.program import Program
from tag.execute.runtime import RankRuntime
from tag.graph.opgraph import ROLE_INPUT
from tag.grouping import GroupGraph
from tag.profile.data import ModelTimes
from tag.strategy import Strategy

__all__ = ["executed_step_s", "executor_overhead"]


def executed_step_s(program: Program, *, steps: int = 5) -> float:
    """Median seconds of the step at the program's batch run by the executor on one device (after one
    warm-up step)."""
    cluster = local_cluster(1)
    graph = program.graph
    group_graph = GroupGraph.from_assignment(graph, np.zeros(graph.num_ops, dtype=np.int64), gpus=cluster)
    compiled = compile_strategy(group_graph, Strategy.data_parallel(1, cluster), cluster, granularity="op")
    (rank,) = lower_plan(program, compiled)
    runtime = RankRuntime(rank, program.tensors)
    times = []
    for k in range(steps + 1):
        start = time.perf_counter()
        runtime.step()
        if k:
            times.append(time.perf_counter() - start)
        runtime.carry()
    return statistics.median(times)


def executor_overhead(program: Program, times: ModelTimes, *, steps: int = 5) -> float:
    """Seconds per op the executor adds to the profile's bare times at the program's batch (≥ 0)."""
    graph = program.graph
    ops = int((graph.role != ROLE_INPUT).sum())
    bare = float(times.predicted(program.batch_size)[graph.role != ROLE_INPUT].sum())
    return max(0.0, (executed_step_s(program, steps=steps) - bare) / max(ops, 1))
