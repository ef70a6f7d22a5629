"""Lower a compiled placement plan to one program per rank (rank = device of the plan's cluster).

The plan is compiled at op granularity (:func:`tag.compiler.compile_strategy`), so every compute task
is one op on one device and every communication task carries the :class:`~tag.compiler.Delivery`
records the checker (:mod:`tag.compiler.check`) proves complete. Lowering walks the TaskGraph in its
topological order — one global order that every rank follows, so no schedule can deadlock — and gives
each rank the instructions it takes part in:

- ``Compute(op, batch, reads)``: run op ``op`` at ``batch`` rows; ``reads[p]`` says how to assemble what
  it reads of producer ``p`` on this device, by the checker's rules: the replica's own rows (local rows
  and received row pieces, concatenated), a whole sum (an all-reduce/PS result, or the own partial plus
  received partials), a share of partials (a ``sum``-class reader in a batch-split group), or a whole
  tensor (local or received);
- ``Send`` / ``Recv``: one transfer task of the plan, every delivery it carries (rows cut at whole
  rows, a partial, an AddN root's sum, a whole tensor);
- ``Reduce``: one all-reduce or PS collective over the plan's device set (PS: reduce to the parameter
  server the compiler chose, then broadcast);
- ``Local``: a transfer whose two ends became one rank, ``Alias``: one whose tensors the rank received
  already (a pipeline's micro-batches and phases, :mod:`tag.execute.pipeline`).

Batch fractions become whole rows by rounding each interval end (``round(x * B)``), so intervals still
tile the batch; a replica left without rows is an error. An op that averages over the rows it sees (a
mean loss, its backward) is made to add up instead: a replica scales such an output by its row share, and
arithmetic whose scalar is the row count (mean's backward divides by it) keeps the global batch's scalar,
so that the replicas' partial sums add up to the single-device values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from tag.compiler.compile import CompiledPlan
from tag.compiler.tables import ROWS, SUMS
from tag.errors import TagError
from tag.execute.program import Program
from tag.graph.opgraph import SPLIT_NONE, SPLIT_SUM
from tag.sim import TASK_COLLECTIVE, TASK_COMPUTE, TASK_TRANSFER

__all__ = ["ExecutionError", "Read", "Compute", "Send", "Recv", "Local", "Alias", "Reduce", "Carry", "RankProgram",
           "lower_plan",
           "Item"]

# Ops whose output averages over the rows they see (reduction "mean"): on a replica's rows the output is
# scaled by the row share, so that the replicas' results add up to the average over the batch.
AVERAGING_OPS = ("aten.mean.default", "aten.mean.dim", "aten.nll_loss_forward", "aten.nll_loss2d_forward",
                 "aten.mse_loss.default", "aten.l1_loss", "aten.smooth_l1_loss.default", "aten.huber_loss.default",
                 "aten.binary_cross_entropy.default", "aten.binary_cross_entropy_with_logits.default",
                 "aten.kl_div.default")
# Their backward ops that divide by the rows they see (nll_loss_backward divides by the total weight,
# a partial sum the plan all-reduces first, so it needs nothing).
AVERAGING_BACKWARD_OPS = ("aten.mse_loss_backward.default", "aten.smooth_l1_loss_backward.default",
                          "aten.huber_loss_backward.default", "aten.binary_cross_entropy_backward.default")
# Arithmetic whose scalar operand a trace at fewer rows changes (mean's backward: divide by the row
# count): a replica keeps the global batch's scalar.
SCALAR_ARITHMETIC = ("aten.div.Scalar", "aten.mul.Scalar", "aten.div.Tensor", "aten.mul.Tensor")
_MEAN = 1  # torch's Reduction.MEAN


class ExecutionError(TagError):
    """A plan cannot be run as asked (rows, devices, batch-coupled ops, a failed rank)."""


class Read(NamedTuple):
    """How one op reads producer ``op``'s output on one device."""

    mode: str  # local | rows | sum | share | whole
    use: int  # the compiler's tensor use
    need: tuple[int, int] = (0, 0)  # rows mode: rows [lo, hi) the reader needs
    local: tuple[int, int] | None = None  # rows mode: rows [lo, hi) taken from the local value, if any
    held_lo: int = 0  # rows mode: first row of the local value
    dims: tuple = ()  # rows mode: ((out, dim, rows per sample), ...)
    own: bool = False  # sum / share: the local partial counts
    zeros: tuple = ()  # share: ((out, shape, dtype), ...) when nothing arrives


class Compute(NamedTuple):
    op: int
    batch: int
    reads: dict  # producer op -> Read
    scale_out: tuple = ()  # ((out, factor), ...): an average over a replica's rows, scaled by its row share


class Item(NamedTuple):
    """One tensor use carried by a transfer: ``kind`` rows | partial | sum | full."""

    use: int
    op: int
    kind: str
    outs: tuple  # ((out, shape, dtype, dim, rows per sample), ...) what is sent of the producer's outputs
    lo: int = 0  # rows: [lo, hi) global rows
    hi: int = 0
    held_lo: int = 0  # rows at the sender: first row of its local value


class Send(NamedTuple):
    """One message to rank ``dst``: its items' tensors (several packed into one buffer by the runtime)."""

    task: int
    dst: int
    items: tuple
    tag: int = 0  # the message's tag: 0 matches messages in the order sent (tag.execute.fuse gives others)


class Recv(NamedTuple):
    task: int
    src: int
    items: tuple
    tag: int = 0


class Local(NamedTuple):
    """A transfer between two values of one rank: ``send`` items are read as a Send reads them, ``recv``
    items stored as a Recv stores them."""

    task: int
    send: tuple
    recv: tuple


class Alias(NamedTuple):
    """Tensors this rank has received already, filed again for another use (a pipeline stage's forward and
    backward ops read the same activation rows; they cross the wire once)."""

    task: int
    items: tuple  # ((use the tensors arrived for, Item to file them as), ...)


class Reduce(NamedTuple):
    task: int
    kind: str  # allreduce | ps
    members: tuple  # ranks
    server: int  # ps: the rank that sums; -1 for an all-reduce
    items: tuple  # ((uses, ops, outs), ...): the rank's partial is the sum of ``ops``; the result goes to ``uses``


class Carry(NamedTuple):
    """Between optimizer steps: input op ``op`` (a parameter, state or buffer) takes the value of ``ref``."""

    op: int
    ref: dict  # the new value: {"ref": op, "out": k} or a folded view {"expr": ...} of one
    src: int  # rank holding it (== this rank: local)
    dst: int


@dataclass
class RankProgram:
    rank: int
    world: int
    records: dict  # op -> argument record at the batch this rank runs it
    inputs: dict  # input op -> (placeholder name, rows [lo, hi) or None for the whole tensor)
    steps: list  # Compute | Send | Recv | Reduce, in the global order
    carry: list  # Carry, in the global order
    outputs: dict  # name -> (reference JSON, base op): the step results this rank reports
    groups: list = field(default_factory=list)  # member tuples of every Reduce, in one order for new_group

    def make_runtime(self, tensors: dict, device=None):
        """The interpreter that runs this program in a rank process, on ``device`` (default the CPU)."""
        from tag.execute.runtime import RankRuntime

        return RankRuntime(self, tensors, device)

    def communication(self) -> list[tuple]:
        """(task, kind, endpoints, bytes, tensors) of every transfer and collective this rank starts:
        endpoints ``(src, dst)`` for a transfer, the members for a collective."""
        out = []
        for step in self.steps:
            if isinstance(step, Send):
                tensors = sum(len(item.outs) for item in step.items)
                out.append((step.task, "transfer", (self.rank, step.dst), _item_bytes(step.items), tensors))
            elif isinstance(step, Reduce) and step.members[0] == self.rank:
                if len(step.members) > 1:
                    out.append((step.task, step.kind, step.members,
                                sum(_outs_bytes(outs) for _, _, outs in step.items),
                                sum(len(outs) for _, _, outs in step.items)))
        return out


def _outs_bytes(outs: tuple) -> int:
    return sum(int(np.prod(shape, dtype=np.int64)) * _dtype_size(dtype) for _, shape, dtype, *_ in outs)


def _item_bytes(items: tuple) -> int:
    return sum(_outs_bytes(item.outs) for item in items)


def _dtype_size(dtype: str) -> int:
    import torch

    return torch.empty((), dtype=getattr(torch, dtype.split(".")[-1])).element_size()


def to_rows(x: float, batch: int) -> int:
    return int(round(x * batch))


class _Lowering:
    def __init__(self, program: Program, compiled: CompiledPlan) -> None:
        self.program = program
        self.plan = compiled
        self.graph = compiled.group_graph.op_graph  # the program's ops; split classes as planned (SFB rewrites)
        self.tables = compiled.tables
        self.batch = program.batch_size
        self.assignment = compiled.group_graph.assignment
        self.use_of: dict[tuple[int, int], int] = {}
        self._outs: dict[int, tuple[int, ...]] = {}  # use -> outputs read (see outs)
        tables = self.tables
        for q in range(tables.use_producer.size):
            p = int(tables.use_producer[q])
            for c in tables.use_consumers[q].tolist():
                self.use_of[(p, int(c))] = q

    # ------------------------------------------------------------------ rows
    def layout(self, op: int):
        return self.plan.layouts[int(self.assignment[op])]

    def replica_rows(self, layout, device: int) -> tuple[int, int]:
        r = layout.devices.index(device)
        return to_rows(layout.lo[r], self.batch), to_rows(layout.hi[r], self.batch)

    def runs_split(self, op: int) -> bool:
        return self.layout(op).split and self.graph.split[op] != SPLIT_NONE

    def run_rows(self, op: int, device: int) -> tuple[int, int]:
        """Rows op ``op`` computes on ``device`` (the whole batch unless a batch-split replica runs it)."""
        return self.replica_rows(self.layout(op), device) if self.runs_split(op) else (0, self.batch)

    def declared_rows(self, op: int, device: int) -> tuple[int, int]:
        """Rows the plan counts as held by ``device`` (the checker's holders)."""
        layout = self.layout(op)
        return self.replica_rows(layout, device) if layout.split else (0, self.batch)

    def share(self, op: int, device: int) -> float:
        lo, hi = self.run_rows(op, device)
        return (hi - lo) / self.batch

    def outs(self, q: int) -> tuple[int, ...]:
        """Outputs of the use's producer that its consumers read."""
        found = self._outs.get(q)
        if found is None:
            p = int(self.tables.use_producer[q])
            args = [self.graph.args[c] for c in self.tables.use_consumers[q].tolist()]
            found = tuple(sorted({out for op, out in _references([[a.get("args", []), a.get("kwargs", {})]
                                                                  for a in args]) if op == p})) or (0,)
            self._outs[q] = found
        return found

    def moves_rows(self, q: int) -> bool:
        """Whether the use's tensors are batch rows; not when a consumer's folded view broadcasts a tensor
        without a batch over it (``expand(ones_like(loss), [B, 1])``): then the whole tensor is read."""
        p = int(self.tables.use_producer[q])
        return all(self.program.batch_dim(p, k) is not None for k in self.outs(q))

    def out_specs(self, q: int, batch: int, rows: bool) -> tuple:
        p = int(self.tables.use_producer[q])
        specs = []
        for k in self.outs(q):
            shape, dtype = self.program.spec(p, k, self.batch if rows else batch)
            dim, per = self.program.batch_dim(p, k) if rows else (0, 0)
            specs.append((k, tuple(shape), dtype, dim, per))
        return tuple(specs)

    # ------------------------------------------------------------------ reads
    def read(self, p: int, c: int, e: int) -> Read:
        q = self.use_of[(p, c)]
        plan, tables = self.plan, self.tables
        holder = e in plan.op_devices(p)
        layout_p, layout_c = self.layout(p), self.layout(c)
        pclass = int(tables.use_pclass[q])
        if pclass == ROWS and self.moves_rows(q):
            need = self.run_rows(c, e) if (layout_c.split and self.graph.split[c] != SPLIT_NONE) else (0, self.batch)
            if holder and self.run_rows(p, e) == need:
                return Read("local", q)
            local = None
            if holder:
                dlo, dhi = self.declared_rows(p, e)
                lo, hi = max(dlo, need[0]), min(dhi, need[1])
                local = (lo, hi) if hi > lo else None
            dims = tuple((k, *self.program.batch_dim(p, k)) for k in self.outs(q))
            return Read("rows", q, need, local, self.run_rows(p, e)[0] if holder else 0, dims)
        if holder and pclass != SUMS and self.moves_rows(q):
            # a whole-batch value read by a replica's rows (an op SFB duplicates feeding one that stays split)
            need = self.run_rows(c, e) if self.runs_split(c) else (0, self.batch)
            have = self.run_rows(p, e)
            if have != need and have[0] <= need[0] and need[1] <= have[1]:
                dims = tuple((k, *self.program.batch_dim(p, k)) for k in self.outs(q))
                return Read("rows", q, need, need, have[0], dims)
        partial = pclass == SUMS and layout_p.split
        if partial:
            consumers = tables.use_consumers[q].tolist()
            if layout_c.split and all(self.graph.split[x] == SPLIT_SUM for x in consumers):
                aligned = layout_p.devices == layout_c.devices
                own = holder and (aligned or e == layout_c.devices[0])
                lo, hi = self.run_rows(p, layout_p.devices[0])
                zeros = tuple((k, tuple(shape), dtype) for k in self.outs(q)
                              for shape, dtype in [self.program.spec(p, k, hi - lo)])
                return Read("share", q, own=own, zeros=zeros)
            return Read("sum", q, own=holder)
        if pclass == SUMS and layout_c.split and self.graph.split[c] == SPLIT_SUM and e != layout_c.devices[0]:
            # A whole addend of a replica's partial sum is added once, by the first replica (as a partial
            # is); the other replicas add zeros. (The plan sends it to every replica all the same.)
            zeros = tuple((k, tuple(self.program.spec(p, k, self.batch)[0]), self.program.spec(p, k, self.batch)[1])
                          for k in self.outs(q))
            return Read("share", q, own=False, zeros=zeros)
        return Read("local" if holder else "whole", q)


def _references(value: Any):
    """(op, out) of every reference in a record's arguments, folded views included."""
    if isinstance(value, list):
        for v in value:
            yield from _references(v)
    elif isinstance(value, dict):
        if "ref" in value:
            yield int(value["ref"]), int(value["out"])
        elif "expr" in value:
            yield from _references(value["expr"]["args"])
            yield from _references(value["expr"]["kwargs"])
        else:
            for v in value.values():
                yield from _references(v)


def _input_refs(record: dict) -> list[int]:
    """The ops a record reads, in first-read order."""
    refs = _references([record.get("args", []), record.get("kwargs", {})])
    return list(dict.fromkeys(op for op, _ in refs))


def lower_plan(program: Program, compiled: CompiledPlan, order=None) -> list[RankProgram]:
    """One :class:`RankProgram` per device of ``compiled``'s cluster (module docstring). ``order``: the
    global order of the TaskGraph's tasks (any topological order; default the TaskGraph's own)."""
    if compiled.granularity != "op":
        raise ExecutionError("a plan runs from its op-granularity compilation "
                             "(compile_strategy(..., granularity='op'))")
    low = _Lowering(program, compiled)
    world = compiled.cluster.num_devices
    _check_rows(low)
    ranks = [RankProgram(r, world, {}, {}, [], [], {}) for r in range(world)]
    _place_inputs(low, ranks)
    task_op = _task_ops(low)
    by_task: dict[int, list] = {}
    for d in compiled.deliveries:
        by_task.setdefault(d.task, []).append(d)
    tg = compiled.taskgraph
    for t in (tg.topological_order if order is None else order).tolist():
        kind = int(tg.kind[t])
        if kind == TASK_COMPUTE:
            _lower_compute(low, ranks, task_op[t], int(tg.device[t]))
        elif kind == TASK_TRANSFER:
            _lower_transfer(low, ranks, t, int(tg.device[t]), int(tg.peer[t]), by_task.get(t, []))
        elif kind == TASK_COLLECTIVE:
            _lower_collective(low, ranks, t, by_task.get(t, []))
    _lower_carry(low, ranks)
    _lower_outputs(low, ranks)
    groups = sorted({step.members for rank in ranks for step in rank.steps
                     if isinstance(step, Reduce) and len(step.members) > 1})
    for rank in ranks:
        rank.groups = groups
    return ranks


def _check_rows(low: _Lowering) -> None:
    for layout in low.plan.layouts:
        if not layout.split:
            continue
        for d in layout.devices:
            lo, hi = low.replica_rows(layout, d)
            if hi <= lo:
                raise ExecutionError(f"group {layout.group} gives device {d} no whole row of the batch of "
                                     f"{low.batch}: use a larger batch (--batch-size) or fewer replicas")


def _task_ops(low: _Lowering) -> dict[int, int]:
    plan = low.plan
    out: dict[int, int] = {}
    for op in range(low.graph.num_ops):
        if int(plan.op_unit[op]) < 0:
            continue
        for d in plan.op_devices(op):
            out[plan.op_task(op, d)] = op
    return out


def _place_inputs(low: _Lowering, ranks: list[RankProgram]) -> None:
    graph = low.graph
    for op in range(graph.num_ops):
        record = graph.args[op]
        if record.get("target") not in ("placeholder", "get_attr"):
            continue
        for d in low.plan.op_devices(op):
            rows = low.run_rows(op, d) if graph.batch_scaled[op] else None
            if rows == (0, low.batch):
                rows = None
            ranks[d].inputs[op] = (record.get("name"), rows)
            ranks[d].records[op] = record


def _lower_compute(low: _Lowering, ranks: list[RankProgram], op: int, device: int) -> None:
    lo, hi = low.run_rows(op, device)
    record = low.program.at(hi - lo)[op]
    scale_out = ()
    if hi - lo < low.batch and low.runs_split(op):
        record, scale_out = _replica_record(low, op, record, (hi - lo) / low.batch)
    reads = {p: low.read(p, op, device) for p in _input_refs(record)}
    ranks[device].records[op] = record
    ranks[device].steps.append(Compute(op, hi - lo, reads, scale_out))


def _replica_record(low: _Lowering, op: int, record: dict, share: float) -> tuple[dict, tuple]:
    """An op on a replica's rows that averages over them: its record, and the output scaling that makes
    the replicas' results sum to the batch's (module docstring)."""
    kind = low.graph.kinds[op]
    if kind.startswith(AVERAGING_OPS) and low.graph.split[op] == SPLIT_SUM and _reduction(record) == _MEAN:
        return record, ((0, share),)
    if kind.startswith(AVERAGING_BACKWARD_OPS) and _reduction(record) == _MEAN:
        return record, ((0, share),)
    if kind.startswith(SCALAR_ARITHMETIC):
        full = low.graph.args[op]
        args = [f if _is_number(a) and _is_number(f) and a != f else a for a, f in zip(record["args"], full["args"])]
        return {**record, "args": args}, ()
    return record, ()


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _reduction(record: dict) -> int:
    """The ``reduction`` argument of a loss record (mean when it has none: ``mean`` itself)."""
    target = record.get("target", "")
    if target.startswith("aten.mean."):
        return _MEAN
    if "reduction" in record.get("kwargs", {}):
        return int(record["kwargs"]["reduction"])
    positions = {"aten.nll_loss_forward": 3, "aten.nll_loss2d_forward": 3, "aten.mse_loss.default": 2,
                 "aten.mse_loss_backward.default": 3, "aten.binary_cross_entropy_with_logits.default": 4,
                 "aten.binary_cross_entropy.default": 3, "aten.binary_cross_entropy_backward.default": 4}
    at = next((k for name, k in positions.items() if target.startswith(name)), None)
    args = record.get("args", [])
    if at is not None and at < len(args) and isinstance(args[at], int):
        return int(args[at])
    return _MEAN  # torch's default


def _lower_transfer(low: _Lowering, ranks: list[RankProgram], task: int, src: int, dst: int, deliveries: list) -> None:
    items = []
    for d in deliveries:
        for q in d.uses:
            p = int(low.tables.use_producer[q])
            if d.kind == "rows" and not low.moves_rows(q):
                if any(item.use == q and item.kind == "full" for item in items):
                    continue  # the whole tensor goes once, whatever rows the plan cut it into
                items.append(Item(q, p, "full", low.out_specs(q, low.batch, rows=False)))
            elif d.kind == "rows":
                lo, hi = to_rows(d.lo, low.batch), to_rows(d.hi, low.batch)
                if hi <= lo:
                    continue
                outs = low.out_specs(q, low.batch, rows=True)
                outs = tuple((k, _rows_shape(shape, dim, per, hi - lo), dtype, dim, per)
                             for k, shape, dtype, dim, per in outs)
                items.append(Item(q, p, "rows", outs, lo, hi, low.run_rows(p, src)[0]))
            else:
                root = src
                lo, hi = low.run_rows(p, root) if root in low.plan.op_devices(p) else (0, low.batch)
                items.append(Item(q, p, d.kind, low.out_specs(q, hi - lo, rows=False)))
    items = tuple(items)
    if items:
        ranks[src].steps.append(Send(task, dst, items))
        ranks[dst].steps.append(Recv(task, src, items))


def _rows_shape(shape: tuple, dim: int, per: int, rows: int) -> tuple:
    out = list(shape)
    out[dim] = rows * per
    return tuple(out)


def _lower_collective(low: _Lowering, ranks: list[RankProgram], task: int, deliveries: list) -> None:
    for d in deliveries:
        members = tuple(d.devices)
        items = []
        server = -1
        for q in d.uses:
            p = int(low.tables.use_producer[q])
            lo, hi = low.run_rows(p, members[0])
            items.append(((q,), (p,), low.out_specs(q, hi - lo, rows=False)))
            if d.kind == "ps":
                group_c = int(low.tables.use_group[q])
                server = members[(group_c + int(low.tables.use_sync_index[q])) % len(members)]
        step = Reduce(task, d.kind, members, server, tuple(items))
        for m in members:
            ranks[m].steps.append(step)


def _output_refs(low: _Lowering):
    """(group, key, reference JSON, base op) of every step output: a reference, or a folded view of one."""
    for group, entries in low.graph.meta["outputs"].items():
        named = {"loss": entries} if group == "loss" else entries
        for key, ref in named.items():
            if ref is None:
                continue
            found: list[int] = _input_refs({"args": [ref]})
            if found:
                yield group, key, ref, found[0]


def _lower_carry(low: _Lowering, ranks: list[RankProgram]) -> None:
    prefix = {"params": "parameter", "exp_avg": "exp_avg", "exp_avg_sq": "exp_avg_sq", "buffers": "buffer"}
    placeholders = {r.get("name"): op for op, r in enumerate(low.graph.args) if r.get("target") == "placeholder"}
    for group, key, ref, base in _output_refs(low):
        op = placeholders.get(f"{prefix.get(group)}:{key}")
        if op is None or op == base:
            continue
        holders = low.plan.op_devices(base)
        for d in low.plan.op_devices(op):
            src = d if d in holders else holders[0]
            carry = Carry(op, ref, src, d)
            ranks[d].carry.append(carry)
            if src != d:
                ranks[src].carry.append(carry)


def _lower_outputs(low: _Lowering, ranks: list[RankProgram]) -> None:
    for group, key, ref, base in _output_refs(low):
        for d in low.plan.op_devices(base):
            ranks[d].outputs[f"{group}:{key}"] = (ref, base)


def combine_rule(low_program: Program, compiled: CompiledPlan, op: int) -> str:
    """How the ranks' values of ``op`` make the single-device value: sum | rows | first."""
    layout = compiled.layouts[int(compiled.group_graph.assignment[op])]
    split = compiled.group_graph.op_graph.split
    if layout.split and split[op] == SPLIT_SUM:
        return "sum"
    if layout.split and split[op] != SPLIT_NONE:
        return "rows"
    return "first"
