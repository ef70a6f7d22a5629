"""What ``compile_strategy`` records besides its TaskGraph: every inserted op and what each communication task
delivers (:class:`CompiledPlan`), and the per-bundle records it keeps: a bundle's skeleton read from the rules'
kernel (:mod:`tag.compiler.rules`) with delivery items and op names, and its plan with the bundle's bytes."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from tag.cluster import Cluster
from tag.grouping import GroupGraph
from tag.sim import NO_TASK, SimulationResult, TaskGraph, simulate, simulate_fast
from tag.strategy import OPTIONS, Strategy
from tag.compiler.layout import GroupLayout
from tag.compiler.rules import MOVED, OPENED
from tag.compiler.tables import ROWS, SUMS, Bundle, CompilerTables

__all__ = ["InsertedOp", "Delivery", "CompiledPlan", "skeleton_record"]


class InsertedOp(NamedTuple):
    """One auxiliary op the compiler inserted, and why."""

    op: str  # Split, Concat, SplitConcat, Transfer, AddN, AllReduce, PS
    group: int  # the consumer group it feeds
    producer_group: int
    devices: tuple[int, ...]  # devices it involves
    nbytes: float  # bytes moved (a collective: the tensor bytes it reduces)
    tensors: int  # tensors it carries
    tasks: tuple[int, ...]  # its tasks in the TaskGraph
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {"op": self.op, "group": self.group, "producer_group": self.producer_group,
                "devices": list(self.devices), "bytes": self.nbytes, "tensors": self.tensors,
                "tasks": list(self.tasks), "reason": self.reason}


class Delivery(NamedTuple):
    """What one communication task carries for some tensor uses (read by :func:`check_compiled`).

    ``kind``: ``rows`` (batch rows [lo, hi) of each tensor from ``src`` to ``dst``), ``partial`` (the
    partial sum ``src`` holds), ``sum`` (the sum the AddN root ``src`` has gathered), ``full`` (a whole
    tensor), ``allreduce`` / ``ps`` (every member of ``devices`` ends with the sum of their partials).
    """

    task: int
    kind: str
    uses: tuple[int, ...]
    src: int
    dst: int
    lo: float = 0.0
    hi: float = 1.0
    devices: tuple[int, ...] = ()


@dataclass(eq=False)
class CompiledPlan:
    """A strategy lowered to a TaskGraph, with the mapping and every inserted op."""

    taskgraph: TaskGraph
    group_graph: GroupGraph
    strategy: Strategy
    cluster: Cluster
    granularity: str
    layouts: tuple[GroupLayout, ...]  # [G] devices, batch fractions and intervals of each group
    inserted: list[InsertedOp]
    delivery_log: list[tuple]  # Delivery fields as plain tuples (built cheaply; see ``deliveries``)
    unit_tasks: dict[int, tuple[int, dict]]  # unit or piece id -> (first task, {device: offset}): its compute tasks
    op_unit: np.ndarray  # [N] unit (or model-parallel piece) of each op, -1 for input ops
    tables: CompilerTables = field(repr=False)
    persistent_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0))  # [D]

    # ------------------------------------------------------------------ queries
    @functools.cached_property
    def deliveries(self) -> list[Delivery]:
        """What every communication task carries (for :func:`tag.compiler.check_compiled`)."""
        return [d if isinstance(d, Delivery) else Delivery._make(d) for d in self.delivery_log]

    def with_deliveries(self, deliveries: list[Delivery]) -> CompiledPlan:
        """A copy claiming other deliveries (to test the checker on broken plans)."""
        return dataclasses.replace(self, delivery_log=list(deliveries))

    def op_task(self, op: int, device: int) -> int:
        """The compute task running op ``op`` on ``device`` (NO_TASK for input ops); KeyError if it does
        not run there."""
        unit = int(self.op_unit[op])
        if unit < 0:
            return NO_TASK
        base, offset = self.unit_tasks[unit]
        return base + offset[device]

    def op_devices(self, op: int) -> tuple[int, ...]:
        """The devices that hold op ``op``'s output (run it, or hold it from the start for input ops)."""
        layout = self.layouts[int(self.group_graph.assignment[op])]
        if layout.model_parallel:
            return (layout.op_device[int(op)],)
        return layout.devices

    def replicas(self, group: int) -> list[tuple[int, float]]:
        """[(device, batch fraction)] of ``group``."""
        layout = self.layouts[group]
        return list(zip(layout.devices, layout.fraction))

    def inserted_ops(self) -> list[dict[str, Any]]:
        return [op.as_dict() for op in self.inserted]

    def simulate(self, *, fast: bool | None = None, feedback: bool = True, raise_on_oom: bool = False
                 ) -> SimulationResult:
        """Run the TaskGraph: the fast path at group and part granularity, the event-driven reference at op
        level (``fast`` overrides)."""
        use_fast = self.granularity != "op" if fast is None else fast
        run = simulate_fast if use_fast else simulate
        return run(self.taskgraph, feedback=feedback, raise_on_oom=raise_on_oom)

    # ------------------------------------------------------------------ rendering
    def summary(self) -> dict[str, Any]:
        """Counts of tasks and inserted ops, bytes moved, per-device persistent memory."""
        tg = self.taskgraph
        kinds = np.bincount(tg.kind, minlength=3)
        by_op: dict[str, list[float]] = {}
        for op in self.inserted:
            entry = by_op.setdefault(op.op, [0, 0.0, 0])
            entry[0] += 1
            entry[1] += op.nbytes
            entry[2] += len(op.tasks)
        return {
            "granularity": self.granularity, "groups": self.group_graph.num_groups,
            "devices": self.cluster.num_devices, "tasks": tg.num_tasks, "compute_tasks": int(kinds[0]),
            "transfer_tasks": int(kinds[1]), "collective_tasks": int(kinds[2]),
            "inserted": {name: {"count": c, "bytes": b, "tasks": t} for name, (c, b, t) in sorted(by_op.items())},
            "persistent_bytes": self.persistent_bytes.tolist(),
        }

    def format(self, *, max_ops: int = 40) -> str:
        """A readable report: group placements, then the inserted ops with their reasons."""
        from tag.units import format_bytes

        lines = [f"CompiledPlan: {self.taskgraph!r} [{self.granularity} granularity]", "", "groups:"]
        for g, layout in enumerate(self.layouts):
            fractions = set(np.round(layout.fraction, 4).tolist())
            shares = f"batch {fractions.pop():.3g} each" if len(fractions) == 1 else \
                "batch " + ", ".join(f"{f:.3g}" for f in layout.fraction)
            lines.append(f"  group {g:3d} {OPTIONS[layout.option]:>14s} on device(s) {_ranges(layout.devices)} "
                         f"({shares})")
        lines += ["", f"inserted ops ({len(self.inserted)}):"]
        for op in self.inserted[:max_ops]:
            lines.append(f"  {op.op:<11s} {op.producer_group:3d} -> {op.group:3d} {format_bytes(op.nbytes):>10s} "
                         f"{len(op.tasks):4d} task(s) on {_ranges(op.devices)}: {op.reason}")
        if len(self.inserted) > max_ops:
            lines.append(f"  ... {len(self.inserted) - max_ops} more")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()

    def __rich__(self):
        from rich.table import Table

        from tag.units import format_bytes

        table = Table(title=f"inserted ops ({self.granularity} granularity, {self.taskgraph.num_tasks} tasks)")
        for column in ("op", "from", "to", "bytes", "tasks", "devices", "reason"):
            table.add_column(column, justify="right" if column in ("from", "to", "bytes", "tasks") else "left")
        for op in self.inserted:
            table.add_row(op.op, str(op.producer_group), str(op.group), format_bytes(op.nbytes), str(len(op.tasks)),
                          _ranges(op.devices), op.reason)
        return table


class _BundlePlan(NamedTuple):
    """What one bundle needs between two layouts, in devices (cached per bundle and pair of layouts)."""

    targets: tuple[int, ...]  # consumer devices
    local: frozenset  # consumer devices that read the producer's own copy
    transfers: tuple  # (src, dst, stage, bytes, count, duration, delivery items), stage 1 before stage 2
    collectives: tuple  # (op, devices, bytes, count, duration, uses, servers, gradient, reason)
    record: tuple | None  # (op name, devices, bytes, tensors, reason) of the transfers


class _Skeleton(NamedTuple):
    """A bundle plan without the bundle's bytes (cached per category kinds and layouts). K categories."""

    targets: tuple[int, ...]  # consumer devices
    local: frozenset  # consumer devices that read the producer's own copy
    holders: tuple[int, ...]  # producer devices
    transfers: tuple  # (src, dst, stage, ((category, fraction of its bytes), ...), (categories counted, ...),
    #                   (delivery item with the category in place of its uses, ...)), stage 1 before stage 2
    collectives: tuple  # (category, "allreduce" | "ps") synced by a collective over the holders
    names: tuple  # [K] inserted op kind per category (None: nothing moved), for the records


def skeleton_record(columns: dict[str, list], i: int, category: int, b: Bundle, layout_p: GroupLayout,
                    layout_c: GroupLayout, targets: tuple[int, ...], holders: tuple[int, ...],
                    num_devices: int) -> _Skeleton:
    """Skeleton ``i`` of :func:`~tag.compiler.rules.make_skeletons`' output (``columns``: its fields as lists;
    ``category``: the first of its categories in ``cat_flags``) as the records the compiler keeps: each
    transfer's contributions, counted categories and delivery items (``rows`` with the rows it moves,
    ``partial`` from its source, ``sum`` from the AddN root, ``full``), and the inserted op's name per category
    (the bundle ``b`` is one of the skeleton's kind, between these layouts)."""
    p_split = b.producer_device < 0 and layout_p.split
    part_category, part_fraction = columns["part_category"], columns["part_fraction"]
    transfers = []
    first = columns["first_transfer"][i]
    for t in range(first, first + columns["transfers"][i]):
        s, e, stage = columns["src"][t], columns["dst"][t], columns["stage"][t]
        parts = range(columns["first_part"][t], columns["first_part"][t] + columns["parts"][t])
        items = []
        for x in parts:
            k = part_category[x]
            if b.pclass[k] == ROWS:
                items.append(("rows", k, columns["part_lo"][x], columns["part_hi"][x]))
            elif b.pclass[k] == SUMS and p_split:
                items.append(("partial" if stage == 1 else "sum", k, s))
            else:
                items.append(("full", k))
        transfers.append((s, e, stage, tuple((part_category[x], part_fraction[x]) for x in parts),
                          tuple(part_category[x] for x in parts), tuple(items)))
    local = frozenset(e for e in range(num_devices) if columns["local"][i * num_devices + e])
    colls = range(columns["coll_first"][i], columns["coll_first"][i] + columns["colls"][i])
    collectives = tuple((columns["coll_category"][j], "ps" if columns["coll_ps"][j] else "allreduce") for j in colls)
    names = tuple(_op_name(b, layout_c, p_split, k, columns["cat_flags"][category + k]) for k in range(len(b.pclass)))
    return _Skeleton(tuple(targets), local, holders, tuple(transfers), collectives, names)


def _op_name(b: Bundle, layout_c: GroupLayout, p_split: bool, k: int, flags: int) -> str | None:
    """The inserted op category ``k`` of bundle ``b`` makes (its ``flags``: MOVED, OPENED), None if it adds no
    transfer of its own: Split / Concat / SplitConcat for batch rows (Transfer or Concat / Split where a side is
    one device of a model-parallel group), AddN for partial sums, Transfer for whole tensors."""
    if b.pclass[k] == SUMS and p_split:
        return "AddN" if flags & MOVED else None
    if not flags & OPENED:
        return None
    if b.pclass[k] != ROWS:
        return "Transfer"
    c_split = layout_c.split and b.demand[k] <= 1
    if b.producer_device >= 0 or layout_c.model_parallel:
        return "Transfer" if not (p_split or c_split) else ("Concat" if p_split else "Split")
    return {(True, True): "SplitConcat", (True, False): "Concat", (False, True): "Split"}.get((p_split, c_split),
                                                                                          "Transfer")


def _where(layout: GroupLayout) -> str:
    n = len(layout.devices)
    if n == 1:
        return f"on device {layout.devices[0]}"
    return f"{OPTIONS[layout.option]} on {n} devices"


def _ranges(devices) -> str:
    """"0-3,6,8-9" for [0, 1, 2, 3, 6, 8, 9]."""
    out: list[str] = []
    ids = sorted(int(d) for d in devices)
    start = prev = None
    for d in ids + [None]:
        if d is not None and prev is not None and d == prev + 1:
            prev = d
            continue
        if start is not None:
            out.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = d
    return ",".join(out)
