"""The checker: proves that a compiled plan gives every consumer exactly the data it needs.

:func:`check_compiled` derives, independently of how the compiler planned it, what each replica of each
producer holds and what each consumer op needs, from the split classes and the layouts alone (TAG
§4.1.1):

- a batch-split (all-reduce or PS) replica holds the batch rows of its interval of a row tensor, and a
  *partial sum* of a tensor of split class ``sum``; any other holder has the whole tensor;
- a reader of split class ``concat`` or ``sum`` in a batch-split replica needs the rows of its own
  interval; any other reader needs every row. A reader of a partial sum needs the whole sum, except a
  ``sum``-class reader in a batch-split group, which takes a *share*: its own replica's partial when
  both groups have the same devices, otherwise the group's first replica takes every partial.

Then it walks the TaskGraph: a consumer task sees a tensor through its own device's copy (if the task
producing it is an ancestor, or is the consumer itself) and through the deliveries of the plan (transfers
into its device and collectives over it) that are its ancestors. Every delivery is checked at its source
as well: a transfer may only send rows, partials or whole tensors its source holds when it starts; an
AddN root forwards exactly the partials that reached it before; an all-reduce or PS sums the partial of
every member. For each (tensor, consumer group, device):

- rows: the union of the local rows and the received intervals covers every consumer's interval, the
  received intervals overlap neither each other nor the local rows, and none lies outside what the
  device's consumers need;
- sums: the whole sum contains every producer replica's partial exactly once (shares: across the
  consumer group's replicas, every partial exactly once);
- whole tensors: exactly one copy (local or received).

Any violation raises :class:`CompileCheckError` naming the tensor, the consumer, the device and what is
missing or doubled.
"""

from __future__ import annotations

from collections import Counter

from tag.graph.opgraph import SPLIT_NONE, SPLIT_SUM
from tag.compiler.compile import CompiledPlan, Delivery
from tag.compiler.errors import CompileCheckError
from tag.compiler.tables import ROWS, SUMS
from tag.sim import NO_TASK, TASK_COLLECTIVE, TASK_TRANSFER

__all__ = ["check_compiled"]

_EPS = 1e-9


def check_compiled(compiled: CompiledPlan) -> None:
    """Raise :class:`CompileCheckError` unless every consumer receives exactly what it needs (module
    docstring); return None otherwise."""
    _Checker(compiled).run()


class _Checker:
    def __init__(self, plan: CompiledPlan) -> None:
        self.plan = plan
        self.tg = plan.taskgraph
        self.tables = plan.tables
        self.graph = plan.group_graph.op_graph
        self.assignment = plan.group_graph.assignment
        self.ancestors = _ancestor_sets(self.tg)
        self.by_use: dict[int, list[Delivery]] = {}
        for delivery in plan.deliveries:
            self._check_delivery_task(delivery)
            for q in delivery.uses:
                self.by_use.setdefault(q, []).append(delivery)

    # ------------------------------------------------------------------ driver
    def run(self) -> None:
        tables = self.tables
        for q in range(tables.use_producer.size):
            self._check_use(q)

    def _is_ancestor(self, task: int, of: int) -> bool:
        return task == NO_TASK or task == of or (self.ancestors[of] >> task) & 1 == 1

    def _name(self, op: int) -> str:
        return repr(self.graph.names[op])

    def _fail(self, q: int, message: str) -> None:
        p = int(self.tables.use_producer[q])
        raise CompileCheckError(f"tensor {self._name(p)} (group {int(self.assignment[p])} -> group "
                                f"{int(self.tables.use_group[q])}): {message}")

    # ------------------------------------------------------------------ what producers hold
    def _holders(self, p: int) -> list[tuple[int, float, float, int]]:
        """[(device, lo, hi, producer task)] of producer op ``p``; rows [lo, hi) (or a partial when the
        group splits the batch and p is of class sum)."""
        plan = self.plan
        layout = plan.layouts[int(self.assignment[p])]
        out = []
        for s in plan.op_devices(p):
            r = layout.devices.index(s)
            lo, hi = (layout.lo[r], layout.hi[r]) if layout.split else (0.0, 1.0)
            out.append((s, lo, hi, plan.op_task(p, s)))
        return out

    def _check_delivery_task(self, d: Delivery) -> None:
        tg = self.tg
        if not 0 <= d.task < tg.num_tasks:
            raise CompileCheckError(f"delivery names task {d.task}, which does not exist")
        if d.kind in ("allreduce", "ps"):
            if tg.kind[d.task] != TASK_COLLECTIVE or sorted(tg.members(d.task).tolist()) != sorted(d.devices):
                raise CompileCheckError(f"task {tg.names[d.task]!r} is not a collective over {list(d.devices)}")
        elif tg.kind[d.task] != TASK_TRANSFER or int(tg.device[d.task]) != d.src or int(tg.peer[d.task]) != d.dst:
            raise CompileCheckError(f"task {tg.names[d.task]!r} is not a transfer from device {d.src} to {d.dst}")

    # ------------------------------------------------------------------ one use
    def _check_use(self, q: int) -> None:
        tables, plan = self.tables, self.plan
        p = int(tables.use_producer[q])
        group_p, group_c = int(self.assignment[p]), int(tables.use_group[q])
        layout_p, layout_c = plan.layouts[group_p], plan.layouts[group_c]
        holders = self._holders(p)
        holder_of = {h[0]: h for h in holders}
        pclass = int(tables.use_pclass[q])
        partial = pclass == SUMS and layout_p.split
        deliveries = self.by_use.get(q, [])
        self._check_sources(q, deliveries, holder_of, pclass, partial)
        split_of = self.graph.split
        # per device: the consumer tasks and what each needs
        readers: dict[int, list[tuple[int, int]]] = {}  # device -> [(consumer op, task)]
        for c in tables.use_consumers[q].tolist():
            for e in plan.op_devices(c):
                readers.setdefault(e, []).append((c, plan.op_task(c, e)))
        if partial and layout_c.split and all(split_of[c] == SPLIT_SUM for c in tables.use_consumers[q].tolist()):
            self._check_shares(q, readers, holders, deliveries, layout_p, layout_c)
            return
        for e, consumers in readers.items():
            received = [d for d in deliveries if d.dst == e or (d.dst == -1 and e in d.devices)]
            if pclass == ROWS:
                self._check_rows(q, e, consumers, holder_of.get(e), received, layout_c)
            elif partial:
                for c, task in consumers:
                    value = self._sum_at(q, e, task, holder_of.get(e), received)
                    self._expect_all_partials(q, value, [h[0] for h in holders],
                                              f"device {e} (op {self._name(c)})")
            else:
                self._check_whole(q, e, consumers, holder_of.get(e), received)

    def _check_sources(self, q: int, deliveries: list[Delivery], holder_of: dict, pclass: int, partial: bool) -> None:
        """Every transfer sends what its source holds when it starts; collectives sum members' partials."""
        for d in deliveries:
            if d.kind in ("allreduce", "ps"):
                if not partial:
                    self._fail(q, f"collective {self.tg.names[d.task]!r} reduces a tensor that is not partial")
                for member in d.devices:
                    h = holder_of.get(member)
                    if h is None or not self._is_ancestor(h[3], d.task):
                        self._fail(q, f"collective {self.tg.names[d.task]!r}: device {member} has no partial "
                                      "of it ready")
                continue
            if d.kind == "sum":
                continue  # checked where it is received (its content depends on what reached the root)
            h = holder_of.get(d.src)
            if h is None or not self._is_ancestor(h[3], d.task):
                self._fail(q, f"transfer {self.tg.names[d.task]!r} sends from device {d.src}, which does not hold "
                              "it (or has not produced it yet)")
            if d.kind == "rows":
                if pclass != ROWS:
                    self._fail(q, f"transfer {self.tg.names[d.task]!r} sends batch rows of a tensor without rows")
                if d.lo < h[1] - _EPS or d.hi > h[2] + _EPS or d.hi - d.lo <= _EPS:
                    self._fail(q, f"transfer {self.tg.names[d.task]!r} sends rows [{d.lo:.6g}, {d.hi:.6g}) but device "
                                  f"{d.src} holds [{h[1]:.6g}, {h[2]:.6g})")
            elif d.kind == "partial" and not partial:
                self._fail(q, f"transfer {self.tg.names[d.task]!r} sends a partial sum of a tensor that is not partial")
            elif d.kind == "full" and (pclass == ROWS and (h[1] > _EPS or h[2] < 1 - _EPS) or partial):
                self._fail(q, f"transfer {self.tg.names[d.task]!r} sends the whole tensor from device {d.src}, "
                              "which holds only part of it")

    # ------------------------------------------------------------------ rows
    def _check_rows(self, q: int, e: int, consumers: list, holder, received: list[Delivery], layout_c) -> None:
        split_of = self.graph.split
        needs = []
        for c, task in consumers:
            if layout_c.split and split_of[c] != SPLIT_NONE:
                r = layout_c.devices.index(e)
                needs.append((c, task, layout_c.lo[r], layout_c.hi[r]))
            else:
                needs.append((c, task, 0.0, 1.0))
        union = _union([(lo, hi) for _, _, lo, hi in needs])
        pieces = [(d.lo, d.hi, d) for d in received if d.kind == "rows"]
        other = [d for d in received if d.kind != "rows"]
        if other:
            self._fail(q, f"device {e} receives {other[0].kind} data of a row tensor (task {self.tg.names[other[0].task]!r})")
        local = (holder[1], holder[2]) if holder is not None else None
        spans = sorted([(lo, hi, d.task) for lo, hi, d in pieces]
                       + ([(max(local[0], u[0]), min(local[1], u[1]), -1) for u in union
                           if min(local[1], u[1]) - max(local[0], u[0]) > _EPS] if local else []))
        for (lo_a, hi_a, ta), (lo_b, hi_b, tb) in zip(spans, spans[1:]):
            if lo_b < hi_a - _EPS:
                what = "local copy" if -1 in (ta, tb) else "two transfers"
                self._fail(q, f"device {e} gets rows [{lo_b:.6g}, {min(hi_a, hi_b):.6g}) twice ({what}: "
                              f"{', '.join(self.tg.names[t] if t >= 0 else 'local' for t in (ta, tb))})")
        for lo, hi, d in pieces:
            if not _covered((lo, hi), union):
                self._fail(q, f"device {e} receives rows [{lo:.6g}, {hi:.6g}) that none of its readers needs "
                              f"(task {self.tg.names[d.task]!r})")
        for c, task, lo, hi in needs:
            have = [(a, b) for a, b, d in pieces if self._is_ancestor(d.task, task)]
            if local is not None and self._is_ancestor(holder[3], task):
                have.append(local)
            gap = _first_gap((lo, hi), have)
            if gap is not None:
                self._fail(q, f"op {self._name(c)} on device {e} (task {self.tg.names[task]!r}) misses rows "
                              f"[{gap[0]:.6g}, {gap[1]:.6g}) of its [{lo:.6g}, {hi:.6g})")

    # ------------------------------------------------------------------ sums
    def _sum_at(self, q: int, e: int, task: int, holder, received: list[Delivery]) -> Counter:
        """The multiset of partials the tensor on device ``e`` sums, as seen by ``task``."""
        # A collective's result or an AddN result replaces the device's own partial; partials add to it.
        results = [d for d in received if d.kind in ("allreduce", "ps", "sum") and self._is_ancestor(d.task, task)]
        partials = [d for d in received if d.kind == "partial" and self._is_ancestor(d.task, task)]
        if len(results) > 1 or (results and partials):
            self._fail(q, f"device {e} reduces it more than once (tasks "
                          f"{', '.join(self.tg.names[d.task] for d in results + partials)})")
        if results:
            d = results[0]
            return Counter(d.devices) if d.kind != "sum" else self._carried(q, d)
        value: Counter = Counter()
        if holder is not None and self._is_ancestor(holder[3], task):
            value[e] += 1
        for d in partials:
            value.update(self._carried(q, d))
        return value

    def _carried(self, q: int, d: Delivery) -> Counter:
        if d.kind == "partial":
            return Counter([d.src])
        # an AddN result: the root's own partial and every partial that reached the root before it left
        arrived = [x for x in self.by_use.get(q, []) if x.dst == d.src and x.kind == "partial"
                   and self._is_ancestor(x.task, d.task)]
        value = Counter(x.src for x in arrived)
        holder = next((h for h in self._holders(int(self.tables.use_producer[q])) if h[0] == d.src), None)
        if holder is not None and self._is_ancestor(holder[3], d.task):
            value[d.src] += 1
        return value

    def _expect_all_partials(self, q: int, value: Counter, holders: list[int], where: str) -> None:
        missing = [s for s in holders if value[s] == 0]
        doubled = [s for s in holders if value[s] > 1]
        foreign = [s for s in value if s not in holders]
        if missing:
            self._fail(q, f"{where} misses the partial sum(s) of device(s) {missing}")
        if doubled:
            self._fail(q, f"{where} counts the partial sum(s) of device(s) {doubled} more than once")
        if foreign:
            self._fail(q, f"{where} sums partials from device(s) {foreign} that hold none")

    def _check_shares(self, q: int, readers: dict, holders: list, deliveries: list[Delivery], layout_p, layout_c) -> None:
        """A sum-class reader of partial sums: the replicas' shares together hold every partial once."""
        for c in self.tables.use_consumers[q].tolist():
            total: Counter = Counter()
            aligned = layout_p.devices == layout_c.devices
            for e, consumers in readers.items():
                task = next(t for op, t in consumers if op == c)
                received = [d for d in deliveries if d.dst == e]
                holder = next((h for h in holders if h[0] == e), None)
                share: Counter = Counter()
                if holder is not None and (aligned or e == layout_c.devices[0]) and self._is_ancestor(holder[3], task):
                    share[e] += 1
                for d in received:
                    if d.kind != "partial":
                        self._fail(q, f"device {e} receives {d.kind} data of a partial sum read as a share")
                    if self._is_ancestor(d.task, task):
                        share.update([d.src])
                total.update(share)
            self._expect_all_partials(q, total, [h[0] for h in holders], f"the replicas of op {self._name(c)}")

    # ------------------------------------------------------------------ whole tensors
    def _check_whole(self, q: int, e: int, consumers: list, holder, received: list[Delivery]) -> None:
        copies = [d for d in received if d.kind == "full"]
        wrong = [d for d in received if d.kind != "full"]
        if wrong:
            self._fail(q, f"device {e} receives {wrong[0].kind} data of a whole tensor "
                          f"(task {self.tg.names[wrong[0].task]!r})")
        if len(copies) + (holder is not None) > 1:
            self._fail(q, f"device {e} gets it {len(copies) + (holder is not None)} times "
                          f"({'local, ' if holder is not None else ''}"
                          f"{', '.join(self.tg.names[d.task] for d in copies)})")
        for c, task in consumers:
            ready = (holder is not None and self._is_ancestor(holder[3], task)) or \
                any(self._is_ancestor(d.task, task) for d in copies)
            if not ready:
                self._fail(q, f"op {self._name(c)} on device {e} (task {self.tg.names[task]!r}) never receives it")


# ---------------------------------------------------------------------------------------------- helpers


def _ancestor_sets(tg) -> list[int]:
    """[T] bitset (Python int) of every task's ancestors."""
    ancestors = [0] * tg.num_tasks
    dep_ptr, dep = tg.dep_ptr.tolist(), tg.dep.tolist()
    for task in tg.topological_order.tolist():
        bits = 0
        for pred in dep[dep_ptr[task]:dep_ptr[task + 1]]:
            bits |= ancestors[pred] | (1 << pred)
        ancestors[task] = bits
    return ancestors


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for lo, hi in sorted(intervals):
        if out and lo <= out[-1][1] + _EPS:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi) for lo, hi in out]


def _covered(span: tuple[float, float], union: list[tuple[float, float]]) -> bool:
    return any(lo - _EPS <= span[0] and span[1] <= hi + _EPS for lo, hi in union)


def _first_gap(need: tuple[float, float], have: list[tuple[float, float]]) -> tuple[float, float] | None:
    """The first part of ``need`` that ``have`` does not cover, or None."""
    at = need[0]
    for lo, hi in sorted(have):
        if lo > at + _EPS:
            return at, min(lo, need[1])
        at = max(at, hi)
        if at >= need[1] - _EPS:
            return None
    return None if at >= need[1] - _EPS else (at, need[1])
