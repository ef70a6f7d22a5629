"""Pipeline compilation: S stages × R replicas of a StageGraph to the shared TaskGraph, and simulation.

**Compilation** (:func:`compile_pipeline`). Stage s has replicas on the devices ``mapping[s]`` (every
device at most once in the whole mapping). Each micro-batch is split evenly over a stage's replicas;
replica i of stage s covers the batch slice [i/R_s, (i+1)/R_s), so between two stages with equal
replica counts replica i talks to replica i only, and between unequal ones each pair exchanges the
bytes of the overlap of their slices. Per replica and micro-batch m:

- compute tasks ``sFm`` and ``sBm`` timed for the device's GPU type (StageGraph.forward_time /
  backward_time), run in the stage's GPipe or 1F1B order (:mod:`tag.exact.schedules`), which the
  TaskGraph enforces by chaining each device's tasks;
- for every stage edge a → b, a transfer of the activation after ``aFm`` that ``bFm`` waits for, and a
  transfer of its gradient after ``bBm`` that ``aBm`` waits for;
- gradient synchronisation as DDP does it (when R_s > 1): the stage's last backward pass runs in the
  pieces of its gradient buckets (:mod:`tag.exact.buckets`, one per parameter node), and each bucket is
  ring all-reduced over the replicas as soon as every replica has run its piece, and updated by its
  optimizer step once that all-reduce and the backward pass are done, so communication overlaps the
  rest of that backward pass (a pure data-parallel plan,
  1 stage × R replicas, scores what the DP-NCCL baseline scores). A stage graph without buckets (built
  by hand) all-reduces once after its last backward pass, then runs the optimizer step.

Memory: parameters × 4 (fp32 Adam: weights, gradients, two moments) per device for the whole run; the
activations a micro-batch keeps for backward from ``sFm`` to the end of ``sBm``; received activations
(kept for backward) until ``sBm`` ends; received gradients until ``sBm`` ends.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

from tag.cluster.cluster import Cluster
from tag.cost.comm import allreduce_time, ring_allreduce_time, ring_parameters
from tag.exact.schedules import BACKWARD, FORWARD, Action, stage_orders
from tag.exact.stage_graph import ADAM_MEMORY_COPIES, PartitionError, StageGraph
from tag.sim import SimulationResult, TaskGraph, TaskGraphBuilder, simulate_fast

__all__ = ["Placement", "consecutive_mapping", "check_mapping", "compile_pipeline", "simulate_pipeline"]


class Placement(NamedTuple):
    """What a mapper returns: ``mapping[s][r]`` device ids, and what it can prove. Times are seconds per
    iteration (the unit of :meth:`tag.exact.mapping.MappingProblem.from_stage_graph`)."""

    mapping: list[list[int]]  # [S][R_s]
    lower_bound: float | None  # a bound on the best max stage time; None when unknown
    proven_optimal: bool
    solve_time_s: float
    max_stage_time: float | None = None  # eq. (5) objective of ``mapping``; None when not evaluated
    instantiation: str | None = None  # "p2p" or "allreduce": the objective's instantiation
    gap: float | None = None  # (max_stage_time − lower_bound) / max_stage_time


def consecutive_mapping(stage_graph: StageGraph, replicas: int | Sequence[int], cluster: Cluster,
                        devices: Sequence[int]) -> Placement:
    """Stage-major consecutive placement: stage 0's replicas on the first devices, then stage 1's…"""
    counts = stage_graph.replicas.tolist()
    if sum(counts) > len(devices):
        raise PartitionError(f"{sum(counts)} stage replicas need as many devices; {len(devices)} given")
    out, k = [], 0
    for count in counts:
        out.append([int(d) for d in devices[k:k + count]])
        k += count
    return Placement(out, None, False, 0.0)


# ------------------------------------------------------------------------------------------- compilation


def check_mapping(stage_graph: StageGraph, cluster: Cluster, mapping: Sequence[Sequence[int]]) -> list[list[int]]:
    rows = [[int(d) for d in row] for row in mapping]
    if len(rows) != stage_graph.num_stages:
        raise PartitionError(f"mapping has {len(rows)} rows for {stage_graph.num_stages} stages")
    for s, row in enumerate(rows):
        if len(row) != stage_graph.replicas[s]:
            raise PartitionError(f"mapping row {s} has {len(row)} devices for {stage_graph.replicas[s]} replicas")
        bad = [d for d in row if not 0 <= d < cluster.num_devices]
        if bad:
            raise PartitionError(f"mapping row {s}: device {bad[0]} is not in cluster {cluster.name!r} "
                                 f"(devices 0..{cluster.num_devices - 1})")
    flat = [d for row in rows for d in row]
    if len(set(flat)) != len(flat):
        seen: set[int] = set()
        twice = next(d for d in flat if d in seen or seen.add(d))
        raise PartitionError(f"mapping places two stage replicas on device {twice}")
    return rows


def _overlap(i: int, r_a: int, j: int, r_b: int) -> float:
    """Fraction of the micro-batch that replica i of r_a and replica j of r_b both cover."""
    return max(0.0, min((i + 1) / r_a, (j + 1) / r_b) - max(i / r_a, j / r_b))


def compile_pipeline(stage_graph: StageGraph, cluster: Cluster, mapping: Sequence[Sequence[int]], *,
                     schedule: str = "1f1b", orders: Sequence[Sequence[Action]] | None = None) -> TaskGraph:
    """The TaskGraph of one training iteration of the pipeline (module docstring). ``orders`` [S]: each
    stage's own order of actions (a graph pipeline's static schedule, tag.graphpipe) instead of the
    chain's ``schedule``; the stage graph may then be any DAG of stages."""
    rows = check_mapping(stage_graph, cluster, mapping)
    sg = stage_graph
    num_stages, micro_batches = sg.num_stages, sg.micro_batches
    type_of = []
    for d in range(cluster.num_devices):
        gpu = cluster.gpu(d)
        type_of.append(sg.gpu_types.index(gpu) if gpu in sg.gpu_types else -1)
    for row in rows:
        for d in row:
            if type_of[d] < 0:
                raise PartitionError(f"the stage graph has no times for {cluster.gpu(d).name} (device {d}); "
                                     "build it with the cluster's GPU types")
    builder = TaskGraphBuilder(cluster, num_groups=num_stages)
    if orders is None:
        orders = stage_orders(num_stages, micro_batches, schedule)
    task: dict[tuple[int, int, str, int], int] = {}  # (stage, replica, kind, micro-batch) -> its last task
    first: dict[tuple[int, int, str, int], int] = {}  # the same -> its first task, where it runs in pieces
    pieces: dict[tuple[int, int], list[int]] = {}  # (stage, replica) -> the last backward's piece tasks
    for s, row in enumerate(rows):
        split = _split_backward(sg, s, len(row), orders[s])
        for r, device in enumerate(row):
            previous: int | None = None
            for i, action in enumerate(orders[s]):
                name = f"s{s}r{r}{action.kind}{action.micro_batch}"
                key = (s, r, action.kind, action.micro_batch)
                if i == split:
                    ids = _backward_pieces(builder, sg, s, device, type_of[device], previous, name, repr(action))
                    pieces[s, r] = ids
                    first[key], previous = ids[0], ids[-1]
                    task[key] = previous
                    continue
                times = sg.forward_time if action.kind == FORWARD else sg.backward_time
                tid = builder.compute(device, float(times[s, type_of[device]]),
                                      deps=() if previous is None else (previous,), name=name, label=repr(action), group=s)
                task[key] = tid
                previous = tid
            builder.tensor(device, ADAM_MEMORY_COPIES * float(sg.param_bytes[s]), persistent=True,
                           name=f"s{s}r{r}.state")
            for m in range(micro_batches):
                builder.tensor(device, float(sg.activation_bytes[s]), producer=task[s, r, FORWARD, m],
                               consumers=(task[s, r, BACKWARD, m],), name=f"s{s}r{r}.act{m}")
    _add_transfers(builder, sg, rows, task, first)
    for s, row in enumerate(rows):
        if (s, 0) in pieces:
            _add_bucket_sync(builder, sg, cluster, s, row, [pieces[s, r] for r in range(len(row))], type_of)
        else:
            _add_gradient_sync(builder, sg, cluster, s, row, task, type_of, orders[s])
    return builder.build()


def _split_backward(sg: StageGraph, stage: int, replicas: int, order: Sequence[Action]) -> int:
    """Index in ``order`` of the backward pass that runs in gradient buckets (its last: the gradients
    are final there, and all-reduced as they come, as DDP does), or -1: a stage without replicas or
    without buckets syncs after that pass in one piece."""
    if replicas < 2 or sg.buckets is None or sg.param_bytes[stage] <= 0:
        return -1
    if len(sg.buckets.of_stage(stage)) < 2:
        return -1
    return max(i for i, action in enumerate(order) if action.kind == BACKWARD)


def _backward_pieces(builder: TaskGraphBuilder, sg: StageGraph, stage: int, device: int, gpu: int,
                     previous: int | None, name: str, label: str) -> list[int]:
    """The pieces of one backward pass, chained after ``previous``; the last keeps the pass's name."""
    ids: list[int] = []
    piece_ids = sg.buckets.of_stage(stage)
    for j, k in enumerate(piece_ids.tolist()):
        after = previous if not ids else ids[-1]
        ids.append(builder.compute(device, float(sg.buckets.backward_time[k, gpu]),
                                   deps=() if after is None else (after,),
                                   name=name if j == len(piece_ids) - 1 else f"{name}.{j}", label=label, group=stage))
    return ids


def _add_transfers(builder: TaskGraphBuilder, sg: StageGraph, rows: list[list[int]],
                   task: dict[tuple[int, int, str, int], int], first: dict[tuple[int, int, str, int], int]) -> None:
    for a, b, nbytes in zip(sg.edge_src.tolist(), sg.edge_dst.tolist(), sg.edge_bytes.tolist()):
        r_a, r_b = len(rows[a]), len(rows[b])
        total = nbytes * r_a  # one micro-batch over all replicas of the sender
        for i in range(r_a):
            for j in range(r_b):
                overlap = _overlap(i, r_a, j, r_b)
                if overlap <= 0:
                    continue
                share = total * overlap
                src, dst = rows[a][i], rows[b][j]
                for m in range(sg.micro_batches):
                    if share <= 0:  # nothing to move: the order still holds
                        builder.add_deps(task[b, j, FORWARD, m], (task[a, i, FORWARD, m],))
                        builder.add_deps(first.get((a, i, BACKWARD, m), task[a, i, BACKWARD, m]),
                                         (task[b, j, BACKWARD, m],))
                        continue
                    fwd = builder.transfer(src, dst, share, deps=(task[a, i, FORWARD, m],),
                                           name=f"s{a}r{i}>s{b}r{j}F{m}", label=f"{a}>{b}F{m}", group=a)
                    builder.add_deps(task[b, j, FORWARD, m], (fwd,))
                    builder.tensor(dst, share, producer=fwd,
                                   consumers=(task[b, j, FORWARD, m], task[b, j, BACKWARD, m]),
                                   name=f"s{a}r{i}>s{b}r{j}.act{m}")
                    bwd = builder.transfer(dst, src, share, deps=(task[b, j, BACKWARD, m],),
                                           name=f"s{b}r{j}>s{a}r{i}B{m}", label=f"{b}>{a}B{m}", group=b)
                    builder.add_deps(first.get((a, i, BACKWARD, m), task[a, i, BACKWARD, m]), (bwd,))
                    builder.tensor(src, share, producer=bwd, consumers=(task[a, i, BACKWARD, m],),
                                   name=f"s{b}r{j}>s{a}r{i}.grad{m}")


def _add_gradient_sync(builder: TaskGraphBuilder, sg: StageGraph, cluster: Cluster, s: int, row: list[int],
                       task: dict[tuple[int, int, str, int], int], type_of: list[int], order) -> None:
    """One all-reduce of the stage's gradients after its last action, then the optimizer step."""
    last = order[-1]
    finals = [task[s, r, last.kind, last.micro_batch] for r in range(len(row))]
    if len(row) > 1 and sg.param_bytes[s] > 0:
        duration = allreduce_time(cluster, row, float(sg.param_bytes[s]))
        sync = [builder.collective(row, duration, op="allreduce", nbytes=float(sg.param_bytes[s]), deps=finals,
                                   name=f"s{s}.allreduce", label=f"{s}AR", group=s)] * len(row)
    else:
        sync = finals
    for r, device in enumerate(row):
        builder.compute(device, float(sg.optimizer_time[s, type_of[device]]), deps=(sync[r], finals[r]),
                        name=f"s{s}r{r}.optimizer", label=f"{s}O", group=s)


def _add_bucket_sync(builder: TaskGraphBuilder, sg: StageGraph, cluster: Cluster, s: int, row: list[int],
                     pieces: list[list[int]], type_of: list[int]) -> None:
    """An all-reduce of each bucket once every replica has run its piece; the bucket's update once its
    all-reduce and the whole backward pass are done (an update never delays the backward pieces, whose
    end the previous stage waits for)."""
    buckets = sg.buckets
    ring = ring_parameters(cluster, row)  # priced once: every bucket goes round the same ring
    for j, k in enumerate(buckets.of_stage(s).tolist()):
        ready = [pieces[r][j] for r in range(len(row))]
        nbytes = float(buckets.nbytes[k])
        sync = None
        if nbytes > 0:
            sync = builder.collective(row, ring_allreduce_time(nbytes, *ring), op="allreduce", nbytes=nbytes,
                                      deps=ready, name=f"s{s}.allreduce.{j}", label=f"{s}AR", group=s)
        for r, device in enumerate(row):
            seconds = float(buckets.optimizer_time[k, type_of[device]])
            if sync is not None or seconds > 0:
                deps = (pieces[r][-1],) if sync is None else (sync, pieces[r][-1])
                builder.compute(device, seconds, deps=deps, name=f"s{s}r{r}.optimizer.{j}", label=f"{s}O", group=s)


def simulate_pipeline(stage_graph: StageGraph, cluster: Cluster, mapping: Sequence[Sequence[int]], *,
                      schedule: str = "1f1b", feedback: bool = False) -> tuple[TaskGraph, SimulationResult]:
    taskgraph = compile_pipeline(stage_graph, cluster, mapping, schedule=schedule)
    return taskgraph, simulate_fast(taskgraph, feedback=feedback)
