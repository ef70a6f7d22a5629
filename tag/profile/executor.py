"""What `tag run`'s executor adds to the bare op calls, per op, measured in a rank process of `tag run`.

:mod:`tag.profile.ops` times each recorded call alone, decoded once: the kernel and the framework's
dispatch, what an eager step pays. `tag run` pays more per op: its rank interpreter decodes the record
on every call, assembles each input from the values and messages it holds, keeps and clones what the step
returns. On a CPU, where a small op takes a few microseconds, that is most of a step. This module runs
the whole step as a one-device plan through the executor's own interpreter
(:class:`tag.execute.runtime.RankRuntime`) in a rank process started by `tag run`'s own launcher
(:func:`tag.execute.launch.launch`, or a caller's pool): the same step run in the process that traced the
model takes two to three times as long on the CPU, which is not what `tag run` pays. The excess over the
sum of the bare times is spread evenly over the ops it ran: the constant per op that the cost model then
adds to every op of the profiled step (:attr:`tag.profile.data.ModelTimes.executor_overhead_s`).
"""

from __future__ import annotations

import statistics

import numpy as np

from tag.cluster.presets import local_cluster
from tag.compiler.compile import compile_strategy
from tag.execute.lower import lower_plan
from tag.execute.program import Program
from tag.graph.opgraph import ROLE_INPUT
from tag.grouping import GroupGraph
from tag.profile.data import ModelTimes
from tag.strategy import Strategy

__all__ = ["executed_step_s", "executor_overhead"]


def executed_step_s(program: Program, *, steps: int = 5, pool=None) -> float:
    """Median seconds of the step at the program's batch run by the executor on one device in a rank process
    (after one warm-up step); ``pool``: a :class:`~tag.execute.launch.WorkerPool` to run it in, else a
    process is spawned."""
    from tag.execute.launch import launch

    cluster = local_cluster(1)
    graph = program.graph
    group_graph = GroupGraph.from_assignment(graph, np.zeros(graph.num_ops, dtype=np.int64), gpus=cluster)
    compiled = compile_strategy(group_graph, Strategy.data_parallel(1, cluster), cluster, granularity="op")
    (report,) = launch(lower_plan(program, compiled), program.tensors, steps=steps + 1, pool=pool)
    return statistics.median(report["times"][1:])


def executor_overhead(program: Program, times: ModelTimes, *, steps: int = 5, pool=None) -> float:
    """Seconds per op the executor adds to the profile's bare times at the program's batch (≥ 0)."""
    graph = program.graph
    ops = int((graph.role != ROLE_INPUT).sum())
    bare = float(times.predicted(program.batch_size)[graph.role != ROLE_INPUT].sum())
    return max(0.0, (executed_step_s(program, steps=steps, pool=pool) - bare) / max(ops, 1))
