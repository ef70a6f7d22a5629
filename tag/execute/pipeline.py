"""Run a pipeline plan: S stages × R_s replicas × M micro-batches, as one placement over virtual devices.

A pipeline step computes what a data-parallel step computes: micro-batch m of replica r of stage s is
the rows ``[(m·R_s + r)·B/(M·R_s), …)`` of the batch, a stage's weight gradient is the sum of its
micro-batches' and replicas' partial sums, and the optimizer runs once on that sum. So a pipeline plan is
lowered as a placement plan over *virtual devices* ``(stage, replica, micro-batch)``: every op is placed
(its own group) on the virtual devices of its stage, all-reduce replication, even split. The compiler
(:func:`tag.compiler.compile_strategy`, op granularity) then inserts exactly the communication the
pipeline needs — a micro-batch's activation rows and their gradients between the replicas of adjacent
stages whose rows overlap, the weight gradients summed over each stage's virtual replicas — and its
checker proves every read complete, as for any placement plan.

The virtual programs are then folded onto the real ranks (:func:`fold_slots`): a rank holds one replica
of one stage and runs its M micro-batches as *slots*. Values a micro-batch computes on its own rows get
one id per slot (``op + N·m``); values every micro-batch computes on the whole batch (weights, their
transposes, Adam) are computed once per rank, by the first slot that needs them. A transfer between two
slots of one rank becomes a local copy (:class:`~tag.execute.lower.Local`); a gradient all-reduce over
the stage's virtual replicas becomes a local sum over the rank's slots (gradient accumulation), then one
all-reduce over the stage's ranks.

**Order.** Every rank follows one global order of the virtual TaskGraph, so no schedule deadlocks. It is
the topological order that runs each task as early as the plan's schedule says (a priority order:
compute of micro-batch m's forward pass of stage s at the start time of action ``sFm`` in the schedule's
timing with the stages' forward and backward times; transfers and collectives as soon as their inputs
are done; the optimizer last). GPipe, 1F1B and GraphPipe's static per-stage orders all run this way;
graph pipelines and unequal replica counts need nothing else.

**Messages.** What one rank sends a peer for one micro-batch and phase (forward, backward, optimizer) goes
as one message, as the pipeline simulator's transfer tasks model it: a stage cut's activation rows with a
mask or a tied weight read beside them, an activation's gradient with a tied weight's gradient partial
(:func:`tag.execute.fuse.fuse_transfers`, which proves the fused programs deadlock-free).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from tag.cluster import Cluster
from tag.compiler.check import check_compiled
from tag.compiler.compile import CompiledPlan, compile_strategy
from tag.exact.schedules import BACKWARD, FORWARD, Action, stage_orders, unit_time_schedule
from tag.exact.pipeline import stored_stage_graph
from tag.exact.stage_graph import StageGraph
from tag.execute.fuse import fuse_transfers
from tag.execute.launch import DEFAULT_TIMEOUT_S, WorkerPool, launch
from tag.execute.lower import (Alias, Carry, Compute, ExecutionError, Item, Local, RankProgram, Recv, Reduce, Send,
                               lower_plan)
from tag.execute.program import SHAPE_ONLY_KINDS, Program, batch_statistics
from tag.execute.run import RunResult, allowed_coupling, combine_values, compare_steps, reference_steps
from tag.graph.opgraph import ROLE_BACKWARD, ROLE_FORWARD, ROLE_INPUT, ROLE_OPTIMIZER
from tag.grouping import GroupGraph
from tag.sim import TASK_COLLECTIVE
from tag.strategy import ALLREDUCE, Strategy
from tag.strategy.pipeline_plan import PipelinePlanFile

__all__ = ["Slot", "PipelineView", "pipeline_view", "virtual_placement", "stage_phase_groups", "schedule_order",
           "fold_slots", "LoweredPipeline", "lower_pipeline", "choose_runtime", "run_pipeline", "GRAPHPIPE",
           "RUNTIMES"]

RUNTIMES = ("auto", "torch", "tag")  # which runtime runs a pipeline plan (run_pipeline)
GRAPHPIPE = "graphpipe"  # the partitioner name of graph pipeline plans: stage orders from tag.graphpipe
_VIRTUAL_BANDWIDTH = 1e10  # bytes/s between virtual devices; the lowering reads no time
# A transfer's phase, from its producers' roles: a message carries one micro-batch's tensors of one phase
# (a tied weight, an input, goes with the forward activations that first need it).
_PHASE = {ROLE_INPUT: 0, ROLE_FORWARD: 0, ROLE_BACKWARD: 1, ROLE_OPTIMIZER: 2}


class Slot(NamedTuple):
    """What virtual device ``v`` stands for: replica ``replica`` of ``stage`` on ``rank``, micro-batch ``slot``."""

    rank: int
    slot: int
    stage: int
    replica: int


@dataclass
class PipelineView:
    """A pipeline plan rebuilt on a program's graph: its stage graph, mapping and each stage's order."""

    stage_graph: StageGraph
    mapping: list[list[int]]  # [S][R_s] ranks
    orders: list[list[Action]]  # [S] each stage's order of actions
    schedule: str

    @property
    def micro_batches(self) -> int:
        return int(self.stage_graph.micro_batches)


def pipeline_view(program: Program, plan: PipelinePlanFile, cluster: Cluster) -> PipelineView:
    """The stage of every op, the mapping and the stage orders of ``plan`` (a graph pipeline's static
    orders when its partitioner is GraphPipe, else the plan's GPipe / 1F1B schedule)."""
    sg = stored_stage_graph(program.graph, cluster, forward_assignment=plan.forward_assignment,
                            replicas=plan.replicas, micro_batches=plan.micro_batches,
                            reference_gpu=plan.reference_gpu, links=plan.links)
    if plan.partitioner == GRAPHPIPE:
        from tag.graphpipe.scheduler import graph_stage_orders, stage_inflight

        inflight = stage_inflight(sg.num_stages, sg.edge_src, sg.edge_dst, micro_batches=sg.micro_batches)
        orders = graph_stage_orders(inflight, sg.micro_batches)
    else:
        orders = stage_orders(sg.num_stages, sg.micro_batches, plan.schedule)
    return PipelineView(sg, [list(row) for row in plan.mapping], orders, plan.schedule)


@dataclass
class VirtualPlacement:
    """The placement over virtual devices that computes a pipeline (:func:`virtual_placement`)."""

    cluster: Cluster  # one device (and device group) per virtual device
    group_graph: GroupGraph  # one group per op
    strategy: Strategy
    slots: list[Slot]  # [V] what each virtual device stands for


def virtual_placement(program: Program, view: PipelineView) -> VirtualPlacement:
    """The placement over virtual devices that computes the pipeline (module docstring). Virtual devices
    are numbered stage by stage, micro-batch-major, so that a stage's even split gives virtual replica
    ``(m, r)`` the rows of replica r of micro-batch m."""
    sg, graph = view.stage_graph, program.graph
    slots: list[Slot] = []
    first: list[int] = []
    for s, row in enumerate(view.mapping):
        first.append(len(slots))
        slots += [Slot(rank, m, s, r) for m in range(view.micro_batches) for r, rank in enumerate(row)]
    first.append(len(slots))
    widest = max(len(row) for row in view.mapping) * view.micro_batches
    if graph.batch_size < widest:
        raise ExecutionError(f"a batch of {graph.batch_size} gives some of the {view.micro_batches} micro-batches "
                             f"× {widest // view.micro_batches} replicas no row: use a larger batch (--batch-size) "
                             "or fewer micro-batches")
    count = len(slots)
    vcluster = Cluster(name="pipeline-slots", types=(_program_gpu(sg),), device_type=np.zeros(count, np.int64),
                       machine=np.arange(count), bandwidth=np.full((count, count), _VIRTUAL_BANDWIDTH),
                       latency=np.zeros((count, count)), device_group=np.arange(count))
    stage = np.asarray(sg.assignment, dtype=np.int64)
    placement = np.zeros((graph.num_ops, count), dtype=bool)
    for s in range(sg.num_stages):
        placement[np.ix_(stage == s, np.arange(first[s], first[s + 1]))] = True
    groups = stage_phase_groups(graph, stage)
    group_graph = GroupGraph.from_assignment(graph, groups, gpus=vcluster.types,
                                             info={"method": "pipeline stages and phases"})
    first_op = np.unique(groups, return_index=True)[1]
    strategy = Strategy(placement[first_op], np.full(first_op.size, ALLREDUCE, dtype=np.int8),
                        np.ones(count, np.int64))
    return VirtualPlacement(vcluster, group_graph, strategy, slots)


def stage_phase_groups(graph, stage: np.ndarray) -> np.ndarray:
    """[N] op groups, each within one stage and one phase (forward with the inputs, backward, optimizer),
    whose quotient is a DAG: the runs of equal (stage, phase) along a topological order that takes forward
    stages first to last, then backward stages last to first, then the optimizer. Contiguous runs of one
    topological order cannot form a cycle; where the owners of backward ops interleave two stages, a
    (stage, phase) simply takes more than one run. Groups are coarse so that a tensor crossing a stage
    boundary is sent once per micro-batch, not once per reading op."""
    phase = np.where(graph.role == ROLE_BACKWARD, 1, np.where(graph.role == ROLE_OPTIMIZER, 2, 0))
    key = np.where(phase == 1, -stage, stage) + phase * (int(stage.max()) + 1) * 2
    waiting = graph.in_degree().astype(np.int64)
    ready = [(int(key[i]), i) for i in np.flatnonzero(waiting == 0).tolist()]
    heapq.heapify(ready)
    groups = np.empty(graph.num_ops, dtype=np.int64)
    current, last = -1, None
    while ready:
        _, i = heapq.heappop(ready)
        if (int(stage[i]), int(phase[i])) != last:
            current, last = current + 1, (int(stage[i]), int(phase[i]))
        groups[i] = current
        for j in graph.successors(i).tolist():
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(ready, (int(key[j]), j))
    return groups


def _program_gpu(sg: StageGraph):
    return sg.gpu_types[sg.reference_type]


def schedule_order(compiled: CompiledPlan, program: Program, view: PipelineView, slots: list[Slot]) -> np.ndarray:
    """[T] the global order of the virtual TaskGraph's tasks (module docstring, Order)."""
    sg, graph = view.stage_graph, program.graph
    ref = sg.reference_type
    times = unit_time_schedule(view.orders, forward=sg.forward_time[:, ref].tolist(),
                               backward=sg.backward_time[:, ref].tolist(),
                               edges=(sg.edge_src.tolist(), sg.edge_dst.tolist()))
    tg = compiled.taskgraph
    key = np.full(tg.num_tasks, np.nan)
    last = max((finish for _, finish in times.values()), default=0.0) + 1.0
    for op in range(graph.num_ops):
        if int(compiled.op_unit[op]) < 0:
            continue
        for v in compiled.op_devices(op):
            slot = slots[v]
            if graph.role[op] == ROLE_OPTIMIZER:
                k = last
            else:
                kind = BACKWARD if graph.role[op] == ROLE_BACKWARD else FORWARD
                k = times[Action(slot.stage, kind, slot.slot)][0]
            key[compiled.op_task(op, v)] = k
    for t in tg.topological_order.tolist():  # the rest: as soon as what they wait for is done
        if np.isnan(key[t]):
            preds = tg.dep[tg.dep_ptr[t]:tg.dep_ptr[t + 1]]
            key[t] = float(key[preds].max()) if preds.size else 0.0
    skip, extra = _shape_only_collectives(compiled, graph)
    return _priority_order(tg, key, skip, extra)


def _shape_only_collectives(compiled: CompiledPlan, graph) -> tuple[set[int], list[tuple[int, int]]]:
    """Collectives whose every use is read for its shape alone (``ones_like(loss)`` seeding the backward
    pass), and where every reader holds a partial of its own: the readers take that partial, so the
    collective need not run — and must not, since it would make every micro-batch's backward pass wait
    for every forward pass. Returns those tasks and the edges (producer on v → reader on v) that keep
    each reader after the partial it reads."""
    tables = compiled.tables
    uses: dict[int, list[int]] = {}
    for d in compiled.deliveries:
        if int(compiled.taskgraph.kind[d.task]) == TASK_COLLECTIVE:
            uses.setdefault(d.task, []).extend(d.uses)
    skip, extra = set(), []
    for t, qs in uses.items():
        edges = []
        for q in qs:
            p = int(tables.use_producer[q])
            for c in tables.use_consumers[q].tolist():
                holders = compiled.op_devices(p)
                if not graph.kinds[c].startswith(SHAPE_ONLY_KINDS) or \
                        not set(compiled.op_devices(c)) <= set(holders):
                    edges = None
                    break
                edges += [(compiled.op_task(p, v), compiled.op_task(c, v)) for v in compiled.op_devices(c)]
            if edges is None:
                break
        if edges is not None:
            skip.add(t)
            extra += edges
    return skip, extra


def _priority_order(tg, key: np.ndarray, skip: set[int] = frozenset(),
                    extra: list[tuple[int, int]] = ()) -> np.ndarray:
    """Kahn's algorithm taking the ready task of smallest (key, position in the TaskGraph's own order);
    tasks in ``skip`` are left out (and count as done), ``extra`` edges (a, b) added."""
    position = np.empty(tg.num_tasks, dtype=np.int64)
    position[tg.topological_order] = np.arange(tg.num_tasks)
    waiting = np.diff(tg.dep_ptr).astype(np.int64)
    for t in skip:
        waiting[tg.succ[tg.succ_ptr[t]:tg.succ_ptr[t + 1]]] -= 1
        waiting[t] = -1
    after: dict[int, list[int]] = {}
    for a, b in extra:
        after.setdefault(a, []).append(b)
        waiting[b] += 1
    ready = [(float(key[t]), int(position[t]), int(t)) for t in np.flatnonzero(waiting == 0)]
    heapq.heapify(ready)
    order = []
    while ready:
        _, _, t = heapq.heappop(ready)
        order.append(t)
        for u in tg.succ[tg.succ_ptr[t]:tg.succ_ptr[t + 1]].tolist() + after.get(t, []):
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, (float(key[u]), int(position[u]), u))
    if len(order) != tg.num_tasks - len(skip):
        raise ExecutionError("the pipeline's task graph has a cycle")
    return np.asarray(order, dtype=np.int64)


# ------------------------------------------------------------------------------------------- folding
class _Ids:
    """Value ids of one rank: per-slot ops get ``op + N·m``, whole-batch ops keep ``op``; inbox ids
    ``use + Q·m``."""

    def __init__(self, num_ops: int, num_uses: int, per_slot: set[int]) -> None:
        self.n, self.q, self.per_slot = num_ops, num_uses, per_slot

    def op(self, op: int, m: int) -> int:
        return op + self.n * m if op in self.per_slot else op

    def use(self, q: int, m: int) -> int:
        return q + self.q * m

    def ref(self, value: Any, m: int) -> Any:
        """A record's arguments with every reference renamed to slot ``m``'s ids."""
        if isinstance(value, list):
            return [self.ref(v, m) for v in value]
        if isinstance(value, dict):
            if "ref" in value:
                return {**value, "ref": self.op(int(value["ref"]), m)}
            return {k: self.ref(v, m) for k, v in value.items()}
        return value

    def item(self, item: Item, m: int) -> Item:
        return item._replace(use=self.use(item.use, m), op=self.op(item.op, m))


def _per_slot(programs: list[RankProgram], batch: int) -> set[int]:
    """Ops that some virtual device computes (or takes as input) on part of the batch."""
    found = set()
    for p in programs:
        found.update(step.op for step in p.steps if isinstance(step, Compute) and step.batch < batch)
        found.update(op for op, (_, rows) in p.inputs.items() if rows is not None)
    return found


def fold_slots(virtual: list[RankProgram], compiled: CompiledPlan, slots: list[Slot], order: np.ndarray,
               world: int, batch: int, *, fuse: bool = True) -> list[RankProgram]:
    """One program per real rank from the virtual devices' programs (module docstring). ``fuse``: what one
    rank sends a peer for one micro-batch and phase (forward, backward, optimizer) travels as one message
    (:func:`tag.execute.fuse.fuse_transfers`)."""
    ids = _Ids(len(compiled.op_unit),
               int(compiled.tables.use_producer.size), _per_slot(virtual, batch))
    position = np.full(compiled.taskgraph.num_tasks, -1, dtype=np.int64)
    position[order] = np.arange(order.size)
    ranks = [RankProgram(r, world, {}, {}, [], [], {}) for r in range(world)]
    timeline = []
    for v, program in enumerate(virtual):
        rank, m = slots[v].rank, slots[v].slot
        for op, (name, rows) in program.inputs.items():
            ranks[rank].inputs[ids.op(op, m)] = (name, rows)
            ranks[rank].records[ids.op(op, m)] = program.records[op]
        for k, step in enumerate(program.steps):
            task = compiled.op_task(step.op, v) if isinstance(step, Compute) else step.task
            timeline.append((int(position[task]), v, k, step))
        for name, (ref, base) in program.outputs.items():
            ranks[rank].outputs[f"{name}@{v}"] = (ids.ref(ref, m), ids.op(base, m))
    timeline.sort(key=lambda x: x[:3])
    computed: set[tuple[int, int]] = set()
    reduced: set[tuple[int, int]] = set()
    delivered: dict[tuple, int] = {}
    keys: dict[int, tuple] = {}  # transfer task -> (src, dst, phase, micro-batch): its message (fuse_transfers)
    role = compiled.group_graph.op_graph.role
    for _, v, _, step in timeline:
        rank, m = slots[v].rank, slots[v].slot
        if isinstance(step, Compute):
            vop = ids.op(step.op, m)
            if (rank, vop) in computed:
                continue  # a whole-batch op another slot of this rank has computed
            computed.add((rank, vop))
            ranks[rank].records[vop] = {**virtual[v].records[step.op],
                                        "args": ids.ref(virtual[v].records[step.op]["args"], m),
                                        "kwargs": ids.ref(virtual[v].records[step.op].get("kwargs", {}), m)}
            reads = {ids.op(p, m): read._replace(use=ids.use(read.use, m)) for p, read in step.reads.items()}
            ranks[rank].steps.append(Compute(vop, step.batch, reads, step.scale_out))
        elif isinstance(step, Send):  # both ends at once: the Recv of the same task is left out below
            _fold_transfer(step, rank, m, slots[step.dst], ids, ranks, delivered)
            per_slot = any(item.op in ids.per_slot for item in step.items)
            keys[step.task] = (rank, slots[step.dst].rank, max(_PHASE[int(role[item.op])] for item in step.items),
                               m if per_slot else None)
        elif isinstance(step, Reduce) and (step.task, rank) not in reduced:
            reduced.add((step.task, rank))
            ranks[rank].steps.append(_fold_reduce(step, rank, slots, ids))
    _fold_carry(virtual, slots, ids, ranks)
    groups = sorted({s.members for r in ranks for s in r.steps if isinstance(s, Reduce) and len(s.members) > 1})
    for r in ranks:
        r.groups = groups
    return fuse_transfers(ranks, _whole_batch_keys(keys)) if fuse else ranks


def _whole_batch_keys(keys: dict[int, tuple]) -> dict[int, tuple]:
    """Message keys (src, dst, phase, micro-batch) in which a value computed once for the whole batch (a
    tied weight, a mask, an optimizer state) goes with the next micro-batch's message of its phase that
    its rank sends that peer (it is ready before it), or the last one where none follows."""
    out = dict(keys)
    runs: dict[tuple, list[int]] = {}
    for task, key in keys.items():  # tasks in the global order
        runs.setdefault(key[:3], []).append(task)
    for run in runs.values():
        for k, task in enumerate(run):
            if keys[task][3] is None:
                later = [keys[t] for t in run[k:] if keys[t][3] is not None]
                earlier = [keys[t] for t in run[:k] if keys[t][3] is not None]
                out[task] = later[0] if later else earlier[-1] if earlier else keys[task]
    return out


def _fold_transfer(step: Send, rank: int, m: int, to: Slot, ids: _Ids, ranks: list[RankProgram],
                   delivered: dict[tuple, int]) -> None:
    """A virtual transfer between ranks: a Send and a Recv, less what the receiver got already (then an
    Alias); between two slots of one rank: a Local copy."""
    sent = tuple(ids.item(item, m) for item in step.items)
    kept = tuple(ids.item(item, to.slot) for item in step.items)
    if to.rank == rank:
        ranks[rank].steps.append(Local(step.task, sent, kept))
        return
    fresh, again = [], []
    for a, b in zip(sent, kept):
        key = (to.rank, a.kind, a.op, a.lo, a.hi, tuple(k for k, *_ in a.outs))
        if a.kind in ("rows", "full") and key in delivered:
            again.append((delivered[key], b))
            continue
        if a.kind in ("rows", "full"):
            delivered[key] = b.use
        fresh.append((a, b))
    if fresh:
        ranks[rank].steps.append(Send(step.task, to.rank, tuple(a for a, _ in fresh)))
        ranks[to.rank].steps.append(Recv(step.task, rank, tuple(b for _, b in fresh)))
    if again:
        ranks[to.rank].steps.append(Alias(step.task, tuple(again)))


def _fold_reduce(step: Reduce, rank: int, slots: list[Slot], ids: _Ids) -> Reduce:
    """A collective over virtual devices as this rank runs it: the sum of its slots' partials, then the
    collective over the distinct ranks."""
    mine = [slots[u].slot for u in step.members if slots[u].rank == rank]
    members = tuple(sorted({slots[u].rank for u in step.members}))
    items = tuple((tuple(ids.use(q, m) for (q,) in [uses] for m in mine),
                   tuple(ids.op(p, m) for (p,) in [ops] for m in mine), outs) for uses, ops, outs in step.items)
    server = slots[step.server].rank if step.server >= 0 else -1
    return Reduce(step.task, step.kind, members, server, items)


def _fold_carry(virtual: list[RankProgram], slots: list[Slot], ids: _Ids, ranks: list[RankProgram]) -> None:
    """Carries between steps, once per (value, source rank, destination rank), in one order for all."""
    seen = set()
    for program in virtual:
        for c in program.carry:
            src, dst = slots[c.src], slots[c.dst]
            carry = Carry(ids.op(c.op, dst.slot), ids.ref(c.ref, src.slot), src.rank, dst.rank)
            key = (carry.op, carry.src, carry.dst)
            if key in seen:
                continue
            seen.add(key)
            ranks[dst.rank].carry.append(carry)
            if src.rank != dst.rank:
                ranks[src.rank].carry.append(carry)


# ------------------------------------------------------------------------------------------- running
class _SlotView(NamedTuple):
    rank: int  # the virtual device
    outputs: dict


@dataclass
class LoweredPipeline:
    """A pipeline plan ready to run: the rank programs and what they were folded from."""

    view: PipelineView
    placed: VirtualPlacement
    compiled: CompiledPlan  # the virtual placement, op granularity
    virtual: list[RankProgram]  # [V] one per virtual device
    programs: list[RankProgram]  # [D] one per rank
    coupled: dict[str, str]  # batch-coupled ops the plan changes: name -> why

    per_slot: set = field(default_factory=set)  # ops a micro-batch computes on its own rows (fold_slots)

    def actions(self, rank: int, graph) -> list[str]:
        """The rank's compute steps as schedule actions in the order it runs them ("F0", "B0", ...),
        consecutive repeats merged; the optimizer and, with several micro-batches, the ops each computes on
        the whole batch (once per rank) are left out."""
        n = graph.num_ops
        out: list[str] = []
        for step in self.programs[rank].steps:
            op, m = step.op % n if isinstance(step, Compute) else -1, step.op // n if isinstance(step, Compute) else 0
            if op < 0 or graph.role[op] == ROLE_OPTIMIZER or (self.view.micro_batches > 1 and op not in self.per_slot):
                continue
            label = f"{BACKWARD if graph.role[op] == ROLE_BACKWARD else FORWARD}{m}"
            if not out or out[-1] != label:
                out.append(label)
        return out


    def schedule_report(self, graph) -> dict[str, Any]:
        """Whether every rank runs its stage's actions in the plan's order, and if not, the forward values
        summed over every micro-batch that the backward pass waits for (cross-entropy's count of counted
        targets normalises the loss over the whole batch, so no backward pass can start before every
        forward pass has ended: the ranks then run GPipe's order whatever the plan says)."""
        followed = all(self.actions(rank, graph) == [f"{a.kind}{a.micro_batch}" for a in self.view.orders[s]]
                       for s, row in enumerate(self.view.mapping) for rank in row)
        waits = sorted({_describe(graph, p % graph.num_ops) for program in self.programs for step in program.steps
                        if isinstance(step, Reduce) for _, ops, _ in step.items for p in ops
                        if graph.role[p % graph.num_ops] != ROLE_BACKWARD})
        return {"followed": followed, "waits_on": [] if followed else waits}


def _describe(graph, op: int) -> str:
    """An op for a user: its call (the producer's call and output for a getitem) and its name."""
    record = graph.args[op] if graph.args else {}
    if record.get("target") == "getitem" and record.get("args") and isinstance(record["args"][0], dict) \
            and "ref" in record["args"][0]:
        source = int(record["args"][0]["ref"])
        return f"{graph.kinds[source]} output {record['args'][0].get('out', 0)} ({graph.names[op]})"
    return f"{graph.kinds[op]} ({graph.names[op]})"


def lower_pipeline(program: Program, plan: PipelinePlanFile, cluster: Cluster, *,
                   allow_batch_coupled: bool = False, fuse: bool = True) -> LoweredPipeline:
    """Pipeline plan ``plan`` as one program per device of ``cluster`` (module docstring); ``fuse``: one
    message per micro-batch, phase and pair of ranks (:func:`fold_slots`)."""
    view = pipeline_view(program, plan, cluster)
    placed = virtual_placement(program, view)
    compiled = compile_strategy(placed.group_graph, placed.strategy, placed.cluster, granularity="op")
    check_compiled(compiled)
    coupled = allowed_coupling(program, compiled, allow_batch_coupled)
    order = schedule_order(compiled, program, view, placed.slots)
    virtual = lower_plan(program, compiled, order)
    programs = fold_slots(virtual, compiled, placed.slots, order, cluster.num_devices, program.batch_size, fuse=fuse)
    return LoweredPipeline(view, placed, compiled, virtual, programs, coupled, _per_slot(virtual, program.batch_size))


def choose_runtime(program: Program, plan: PipelinePlanFile, cluster: Cluster, runtime: str = "auto"
                   ) -> tuple[str, PipelineView]:
    """("torch" or "tag", the plan's view): which runtime runs ``plan`` when ``runtime`` is asked. ``auto``
    takes torch's pipelining only where it computes the plan's step exactly: a chain of equal replicas
    under GPipe / 1F1B with equal micro-batches, no batch-coupled op, and no value summed over the batch
    that the step reads (a micro-batch there normalises by its own rows)."""
    from tag.execute.torch_pipeline import torch_pipeline_reason

    if runtime not in RUNTIMES:
        raise ExecutionError(f"runtime must be one of {', '.join(RUNTIMES)}, got {runtime!r}")
    view = pipeline_view(program, plan, cluster)
    if runtime == "tag":
        return "tag", view
    reason = torch_pipeline_reason(program, view, plan.partitioner)
    if reason is not None and runtime == "torch":
        raise ExecutionError(f"torch.distributed.pipelining cannot run this plan: {reason}; use --runtime tag")
    exact = not program.coupled and not batch_statistics(program.graph)
    return ("torch" if reason is None and (exact or runtime == "torch") else "tag"), view


def run_pipeline(program: Program, plan: PipelinePlanFile, cluster: Cluster, *, steps: int = 2,
                 check: bool = False, allow_batch_coupled: bool = False, backend: str = "gloo",
                 timeout_s: float = DEFAULT_TIMEOUT_S, pool: WorkerPool | None = None,
                 port: int | None = None, runtime: str = "auto", progress=None) -> RunResult | None:
    """Run pipeline plan ``plan`` for ``steps`` optimizer steps. ``runtime``: ``"tag"`` (this module: one
    process per device of ``cluster``, any pipeline), ``"torch"`` (``torch.distributed.pipelining``, one
    process per stage replica: chains of equal replicas under GPipe / 1F1B, :mod:`tag.execute.torch_pipeline`)
    or ``"auto"`` (:func:`choose_runtime`)."""
    chosen, view = choose_runtime(program, plan, cluster, runtime)
    if chosen == "torch":
        from tag.execute.torch_pipeline import run_torch_pipeline

        return run_torch_pipeline(program, view, steps=steps, check=check, backend=backend, timeout_s=timeout_s,
                                  pool=pool, port=port, progress=progress)
    lowered = lower_pipeline(program, plan, cluster, allow_batch_coupled=allow_batch_coupled)
    programs, virtual, slots = lowered.programs, lowered.virtual, lowered.placed.slots
    reports = launch(programs, program.tensors, steps=steps, backend=backend, port=port, timeout_s=timeout_s,
                     pool=pool, progress=progress)
    if reports is None:
        return None  # a torchrun rank other than 0: rank 0 reports
    views = [_SlotView(v, p.outputs) for v, p in enumerate(virtual)]
    values = []
    for k in range(steps):  # each virtual device's outputs, as if it had been a rank
        slot_reports = [{"results": [{name: reports[slots[v].rank]["results"][k][f"{name}@{v}"]
                                      for name in p.outputs}]} for v, p in enumerate(virtual)]
        values.append(combine_values(program, lowered.compiled, views, slot_reports, 0))
    result = RunResult(losses=[float(v["loss:loss"]) for v in values],
                       step_times_s=[[r["times"][k] for r in reports] for k in range(steps)],
                       communication=[c for p in programs for c in p.communication()], coupled=lowered.coupled,
                       values=values)
    result.schedule = {**lowered.schedule_report(program.graph), "runtime": "tag"}
    if check:
        result.check = compare_steps(values, reference_steps(program, steps), lowered.coupled)
    return result
