"""The compiler (TAG §4.3.1): a strategy over op groups → a TaskGraph with the auxiliary ops it needs.

Every group runs as units (:mod:`tag.compiler.tables`) on the devices of its layout
(:mod:`tag.compiler.layout`): one compute task per unit per replica, lasting the cost model's time for the
device's GPU type at the replica's batch fraction (ops of split class ``none`` always on the whole batch).

Then, for every tensor a group reads from another group (and, inside a group, every tensor whose
readers need what other replicas hold), the compiler compares what the producer's replicas hold with what
each consumer device needs and inserts:

=========================================  ===============================================================
producer holds → consumer needs             inserted
=========================================  ===============================================================
batch rows → batch rows (other layout)      **Split / Concat**: one transfer per overlapping
                                            (producer replica, consumer replica) pair on two devices,
                                            bytes ∝ the overlap of their batch intervals
batch rows → every row (``none`` reader,    **Concat**: every remote replica's rows to each consumer
duplicate or model-parallel consumer)
partial sums → the whole sum, same devices  **AllReduce** (ring) or **PS** push+pull by the consumer
                                            group's option; the parameter server of the j-th synced
                                            tensor of group C is replica (C + j) mod R (round robin by
                                            parameter, TAG §4.2)
partial sums → the whole sum, elsewhere     **AddN**: partials sent to one root consumer device (one
                                            that holds a partial, if any), summed there, and the sum
                                            sent on to the other consumer devices
partial sums → a partial-sum reader         nothing if both groups have the same devices; otherwise
                                            **AddN** of every partial at the consumer's first replica
whole tensor → anything, on a device        **Transfer** from the holder with the best bandwidth to it
without a copy                              (ties rotate over the consumer devices)
=========================================  ===============================================================

A collective whose devices span machines holds their NICs (both directions) besides its members' comm
channels, so it queues with the p2p transfers crossing those NICs instead of overlapping them at full
bandwidth (``COLLECTIVES_HOLD_NICS``). A duplicated group's replicas compute the whole batch, so its
gradients are whole and need no synchronisation. The ops of a model-parallel group are split over its devices by
:func:`tag.grouping.split_group` and its internal edges that cross devices become transfers.

Granularity (:mod:`tag.compiler.tables`): ``"op"`` (one task per op per replica, the reference),
``"group"`` (the fast path: each group's ops of one role cut at its boundary tensors), ``"merged"`` (those
chunks merged back into one task per part and replica, their boundary instants kept as dependency lags:
:func:`tag.sim.merge_taskgraph`; the plan's task ids are the merged ones) and ``"part"`` (coarser: one task
per group, role and sync level per replica). At ``"group"`` and ``"part"`` granularity
the transfers of one bundle (the tensors from one producer unit to one
consumer group that the same consumer units read) between one pair of devices are one task lasting
k·α + S/β for k tensors of S bytes in all, the sum of the k op-level transfers, and its collectives
last the sum of the op-level collectives; compute units add their ops' times. So both granularities do
the same work on the same resources and differ only in how finely tasks are cut.

Memory (reference counting in the simulator): per device one persistent tensor of 4 × the parameter
bytes of the ops placed there (parameter, gradient buffer, Adam's two moments); the activations each
compute task outputs for other units (freed when their last reader on the device, or the transfer
sending them, finishes), and every received tensor on its destination.

A bundle's plan is its *skeleton* (which device sends which fraction of which category's bytes to which,
what stays local, what a collective syncs; cached per category kinds and pair of layouts, so all the
bundles of one kind share it) filled with the bundle's bytes. The table's rules are written once, in
:mod:`tag.compiler.rules`, whose kernel both this compiler (which keeps records of what it inserts,
:mod:`tag.compiler.records`) and the search's evaluator read. The search's evaluator
(:mod:`tag.compiler.evaluate`) compiles strategies as fragments (``_Compiler.group_fragment``, the
skeletons, the costs of :mod:`tag.compiler.costs` and :func:`collective_resources`) numbered so that
assembling them gives this module's TaskGraph task for task.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple, Sequence

import numpy as np

from tag._arrays import csr_from_lists
from tag.cluster import Cluster
from tag.cost import CostModel
from tag.graph.opgraph import ROLE_OPTIMIZER
from tag.grouping import GroupGraph
from tag.sim.merge import merge_taskgraph, pairs_csr
from tag.sim import (
    NO_TASK,
    RES_COMM,
    RES_COMPUTE,
    RES_LINK,
    RES_NIC_IN,
    RES_NIC_OUT,
    TASK_COLLECTIVE,
    TASK_COMPUTE,
    TASK_TRANSFER,
    TaskGraph,
)
from tag.strategy import OPTIONS, Strategy, device_group_sizes
from tag.compiler.errors import CompileError
from tag.compiler.cache import CompilerCache, cluster_context, compiler_tables
from tag.compiler.costs import ps_seconds, ring_allreduce_seconds, transfer_seconds
from tag.compiler.layout import ClusterContext, GroupLayout, group_layout
from tag.compiler.records import CompiledPlan, Delivery, InsertedOp, _BundlePlan, _Skeleton, _where, skeleton_record
from tag.compiler.rows import replica_block
from tag.compiler.rules import SkeletonQueue, skeleton_key
from tag.compiler.tables import (
    GRANULARITIES,
    NO_UNIT,
    Bundle,
    CompilerTables,
    make_bundles,
)

__all__ = ["compile_strategy", "CompiledPlan", "InsertedOp", "Delivery", "ADAM_COPIES", "DEFAULT_FUSION_BYTES"]

ADAM_COPIES = 4  # parameter + gradient buffer + Adam's first and second moments, fp32
DEFAULT_FUSION_BYTES = 25e6  # bucket size of the Horovod baseline (PyTorch DDP's bucket_cap_mb default is 25 MB)
_MAX_CACHED_PLANS = 500_000  # bundle plans kept per (grouping, cluster) before the cache is emptied
_COLLECTIVE_CODES = {"allreduce": 0, "ps": 1, "broadcast": 2, "allgather": 3}  # tag.sim.COLLECTIVES order
# A collective across machines holds their NICs (both directions) for its duration, so it queues with the p2p
# transfers crossing them (FIFO) instead of overlapping them at full bandwidth.
COLLECTIVES_HOLD_NICS = True


# ------------------------------------------------------------------------------------------------ compile


def compile_strategy(group_graph: GroupGraph, strategy: Strategy, cluster: Cluster, *,
                     cost: CostModel | None = None, granularity: str = "group",
                     fusion_bytes: float | None = None, cache: CompilerCache | None = None) -> CompiledPlan:
    """Lower ``strategy`` for ``group_graph`` on ``cluster`` to a :class:`CompiledPlan` (module docstring).

    ``granularity``: ``"group"`` (one task per unit per replica, units cut at boundary tensors; what search
    simulates with :func:`tag.sim.simulate_fast`, checked against the reference), ``"merged"`` (the units of
    one part run as one task, with lags; about half the tasks), ``"part"`` (coarser and about 4x fewer
    tasks, less faithful) or ``"op"`` (one task per op per replica; the reference).
    ``cost``: the cost model for op times (default: the one the grouping was made with). ``cache``: where
    everything that does not depend on the strategy is kept (tables of units, uses and bundles; per-group
    layouts; per-bundle plans for each pair of layouts), so that repeated calls given the same cache with
    strategies that share groups' placements are cheaper (None: nothing is kept past this call).
    ``fusion_bytes``: fuse the all-reduces of gradients (tensors only optimizer ops read) over one device
    set into buckets of at least this many bytes, in topological order of the units producing them
    (Horovod's tensor fusion); each bucket waits only for the tasks producing its tensors. None: one
    all-reduce per bundle of tensors.
    """
    if granularity not in GRANULARITIES:
        raise CompileError(f"granularity must be one of {', '.join(map(repr, GRANULARITIES))}, got {granularity!r}")
    if not isinstance(strategy, Strategy):
        raise CompileError(f"expected a Strategy, got {type(strategy).__name__}")
    if strategy.num_groups != group_graph.num_groups:
        raise CompileError(f"the strategy has {strategy.num_groups} op groups but the grouping has "
                           f"{group_graph.num_groups}")
    sizes = device_group_sizes(cluster)
    if not np.array_equal(sizes, strategy.device_group_sizes):
        raise CompileError(f"the strategy is for device groups of {strategy.device_group_sizes.tolist()} devices, "
                           f"but cluster {cluster.name!r} has {sizes.tolist()}")
    if fusion_bytes is not None and not fusion_bytes > 0:
        raise CompileError(f"fusion_bytes must be positive or None, got {fusion_bytes!r}")
    cost = cost if cost is not None else group_graph.cost
    tables = compiler_tables(group_graph, cluster, cost, granularity, cache=cache)
    context = cluster_context(cluster, tables, cache=cache)
    return _Compiler(tables, context, strategy, fusion_bytes).run()


class _Request(NamedTuple):
    """A collective waiting to be emitted (so that all-reduces can be fused first)."""

    op: str  # "allreduce" or "ps"
    devices: tuple[int, ...]
    nbytes: float
    count: int
    duration: float
    producers: list[tuple]  # (producer task, its output tensor or None), one per member that has one
    consumers: list[int]  # consumer tasks
    uses: tuple[int, ...]
    order: int  # producer unit: fusion order
    gradient: bool  # every reader is an optimizer op: safe to fuse (nothing it feeds leads back to a producer)
    record: tuple  # (producer group, consumer group, servers, reason)


class _Compiler:
    """The state of one compilation: task and tensor columns as Python lists."""

    def __init__(self, tables: CompilerTables, context: ClusterContext, strategy: Strategy | None,
                 fusion_bytes: float | None, *, dense_links: bool = False) -> None:
        self.tables = tables
        self.context = context
        self.strategy = strategy
        self.fusion_bytes = fusion_bytes
        self.cluster = context.cluster
        self.num_devices = self.cluster.num_devices
        # task columns
        self.kind: list[int] = []
        self.duration: list[float] = []
        self.device: list[int] = []
        self.peer: list[int] = []
        self.nbytes: list[float] = []
        self.collective: list[int] = []
        self.group: list[int] = []
        self.dep_task: list[int] = []  # dependencies as pairs: dep_task[k] waits for dep_on[k]
        self.dep_on: list[int] = []
        self.res: list[tuple[int, ...]] = []
        self.labels: list[str] = []
        self.links: dict[tuple[int, int], int] = {}
        self.link_base = 2 * self.num_devices + 2 * self.cluster.num_machines
        # Fragments compiled apart (tag.compiler.evaluate) cannot number links by first use: there the link
        # src -> dst is resource link_base + src * D + dst, renumbered once the fragments are assembled.
        self.dense_links = dense_links
        self.first_task = 0  # id of the first task this compiler creates (a pair fragment numbers after its blocks)
        self.first_tensor = 0
        self.records = True  # keep inserted ops and deliveries (compile_strategy; fragments do not)
        # tensor columns
        self.tensor_device: list[int] = []
        self.tensor_bytes: list[float] = []
        self.tensor_producer: list[int] = []
        self.tensor_persistent: list[bool] = []
        self.read_tensor: list[int] = []  # readers as pairs: read_task[k] reads read_tensor[k]
        self.read_task: list[int] = []
        self.transfer_tensor: dict[int, int] = {}  # transfer task -> the tensor it leaves on its destination
        self.unit_tensor: dict[int, int] = {}  # unit -> first of its tensors (one per replica, same offsets)
        # what the plan records
        self.unit_tasks: dict[int, tuple[int, dict]] = {}
        self.inserted: list[InsertedOp] = []
        self.deliveries: list[tuple] = []  # Delivery fields
        self.requests: list[_Request] = []

    # ------------------------------------------------------------------ driver
    def run(self) -> CompiledPlan:
        tables, strategy, context = self.tables, self.strategy, self.context
        num_groups = strategy.num_groups
        self.layouts = layouts = tuple(group_layout(tables, context, strategy, g) for g in range(num_groups))
        mp = [layout.model_parallel for layout in layouts]
        op_unit = self._op_unit(range(num_groups))
        for g in tables.group_order.tolist():
            self._compute_tasks(g)
        if len(context.plans) > _MAX_CACHED_PLANS:  # a long search: start over rather than grow without bound
            context.plans.clear()
        self.dynamic_bundles([(p, c) for p, c in tables.pair_uses if mp[p] or mp[c]], op_unit, mp)  # at once
        self._prepare_skeletons(list(tables.pair_uses), op_unit, mp)  # the new ones at once
        for pair in tables.pair_uses:
            self._pair(pair, op_unit, mp)
        self._emit_collectives()
        persistent = self._persistent_memory(range(num_groups))
        taskgraph = self._taskgraph(num_groups)
        return CompiledPlan(taskgraph=taskgraph, group_graph=tables.group_graph, strategy=strategy,
                            cluster=self.cluster, granularity=tables.granularity, layouts=layouts,
                            inserted=self.inserted, delivery_log=self.deliveries, unit_tasks=self.unit_tasks,
                            op_unit=op_unit, tables=tables, persistent_bytes=persistent)

    def group_fragment(self, layout: GroupLayout) -> tuple[dict, dict, int, int]:
        """The evaluator's fragment of one group: only its compute tasks (with their output tensors), the
        dependencies among them and its persistent memory, numbered from 0. Returns what a pair fragment
        needs to refer to them: (unit -> (first task, {device: offset}), unit -> first output tensor, compute
        tasks, output tensors)."""
        g = layout.group
        self.layouts = {g: layout}
        self._compute_tasks(g)
        blocks = (dict(self.unit_tasks), dict(self.unit_tensor), len(self.kind), len(self.tensor_device))
        self._persistent_memory([g])
        return blocks

    def _op_unit(self, groups) -> np.ndarray:
        """[N] unit of each op, with the pieces of the model-parallel groups among ``groups``."""
        op_unit = self.tables.op_unit
        for g in groups:
            layout = self.layouts[g]
            if layout.model_parallel:
                if op_unit is self.tables.op_unit:
                    op_unit = op_unit.copy()
                ops, piece = layout.op_pieces
                op_unit[ops] = self.tables.piece_unit(g, 0) + piece  # pieces are numbered consecutively
        return op_unit

    def _compute_tasks(self, g: int) -> None:
        if self.layouts[g].model_parallel:
            self._model_parallel_tasks(g)
        else:
            self._replica_tasks(g)

    def _pair(self, pair: tuple[int, int], op_unit: np.ndarray, mp) -> None:
        """Transfers, dependencies and collective requests of the bundles from group P to group C."""
        layout_p, layout_c = self.layouts[pair[0]], self.layouts[pair[1]]
        plans = self.context.plans
        for bundle in self._bundles(pair, op_unit, mp):
            key = (id(bundle), layout_p.key, layout_c.key)
            plan = plans.get(key)
            if plan is None:
                plan = plans[key] = self._plan_bundle(bundle, layout_p, layout_c)
            self._instantiate(bundle, plan)

    def _bundles(self, pair: tuple[int, int], op_unit: np.ndarray, mp) -> list[Bundle]:
        """The bundles from group P to group C: the tables' where both are replicated, else by pieces."""
        if mp[pair[0]] or mp[pair[1]]:
            return self.dynamic_bundles([pair], op_unit, mp)[0]
        return self.tables.bundles.get(pair, [])

    def dynamic_bundles(self, pairs: list[tuple[int, int]], op_unit: np.ndarray | None,
                        mp: Sequence[bool] | Mapping[int, bool]) -> list[list[Bundle]]:
        """Bundles of each pair of groups one of which is model-parallel (by its pieces), cached per layouts.
        Those not cached are made together: one :func:`make_bundles` call for the pairs from replicated groups
        and one for those from model-parallel ones (bundles never span pairs, so each pair's are those a call
        of its own would make). ``mp[g]``: whether group g is model-parallel; ``op_unit`` None: made from
        the layouts of the pairs' groups."""
        layouts, plans = self.layouts, self.context.plans
        keys = [("bundles", (p, c), layouts[p].key if mp[p] else None, layouts[c].key if mp[c] else None)
                for p, c in pairs]
        missing = list({key: i for i, key in enumerate(keys) if key not in plans}.values())  # each pair once
        if missing:
            if op_unit is None:
                op_unit = self._op_unit(sorted({g for i in missing for g in pairs[i]}))
            for from_mp in (False, True):
                batch = [i for i in missing if bool(mp[pairs[i][0]]) == from_mp]
                if not batch:
                    continue
                op_device = {}  # the producers' devices, where they are model-parallel
                if from_mp:
                    for p in {pairs[i][0] for i in batch}:
                        op_device.update(layouts[p].op_device)
                uses = np.concatenate([self.tables.pair_uses[pairs[i]] for i in batch])
                made = make_bundles(self.tables, uses, op_unit, skip_local=not from_mp, op_device=op_device)
                for i in batch:
                    plans[keys[i]] = made.get(pairs[i], [])
        return [plans[key] for key in keys]

    # ------------------------------------------------------------------ compute tasks
    def _replica_tasks(self, g: int) -> None:
        """A replicated group's compute tasks, their output tensors and the dependencies and reads among its
        units, from the rows the evaluator's fragments are made of (:func:`~tag.compiler.rows.replica_block`)."""
        layout = self.layouts[g]
        (durations, devices, labels, dep_task, dep_on, tensor_device, tensor_bytes, tensor_producer, read_tensor,
         read_task, tensor_first) = replica_block(self.tables, self.context, layout)
        base, tensor_base = len(self.kind), len(self.tensor_device)
        n = len(durations)
        self.kind.extend([TASK_COMPUTE] * n)
        self.duration.extend(durations)
        self.device.extend(devices)
        self.peer.extend([NO_TASK] * n)
        self.nbytes.extend([0.0] * n)
        self.collective.extend([-1] * n)
        self.group.extend([g] * n)
        self.res.extend(self.context.compute_resources[d] for d in devices)
        self.labels.extend(labels)
        self.tensor_device.extend(tensor_device)
        self.tensor_bytes.extend(tensor_bytes)
        self.tensor_producer.extend((tensor_producer + base).tolist())
        self.tensor_persistent.extend([False] * len(tensor_device))
        self.dep_task.extend((dep_task + base).tolist())
        self.dep_on.extend((dep_on + base).tolist())
        self.read_tensor.extend((read_tensor + tensor_base).tolist())
        self.read_task.extend((read_task + base).tolist())
        r = len(layout.devices)
        offset = self.context.offsets(layout.devices)
        for k, unit in enumerate(self.tables.group_units[g].tolist()):
            self.unit_tasks[unit] = (base + k * r, offset)
            if tensor_first[k] >= 0:
                self.unit_tensor[unit] = tensor_base + tensor_first[k]

    def _model_parallel_tasks(self, g: int) -> None:
        tables, layout = self.tables, self.layouts[g]
        for k, piece in enumerate(layout.pieces):
            label = tables.unit_label[piece.unit] + (f"p{k}" if tables.granularity != "op" else "")
            task = self._task(TASK_COMPUTE, piece.duration, piece.device, NO_TASK, 0.0, -1, g, (piece.device,), label)
            unit = self.tables.piece_unit(g, k)
            self.unit_tasks[unit] = (task, self.context.offsets((piece.device,)))
            out = piece.out_rows + piece.out_fixed
            if out > 0:
                self.unit_tensor[unit] = self._tensor(piece.device, out, task)

    # ------------------------------------------------------------------ bundles
    def _plan_bundle(self, b: Bundle, layout_p: GroupLayout, layout_c: GroupLayout) -> _BundlePlan:
        """What bundle ``b`` needs moved between these two layouts (module docstring table): its
        :meth:`_skeleton` filled with the bundle's bytes and counts; cached, so it names devices, never
        tasks."""
        skeleton = self._skeleton(b, layout_p, layout_c)
        beta, alpha = self.context.beta, self.context.alpha
        transfers = []
        for s, e, stage, contributions, counted, items in skeleton.transfers:
            (k, factor), *rest = contributions
            nbytes = b.nbytes[k] * factor  # summed in the order the table below visits them
            for k, factor in rest:
                nbytes += b.nbytes[k] * factor
            count = sum(b.count[k] for k in counted)
            duration = transfer_seconds(count, alpha[s][e], beta[s][e], nbytes)
            transfers.append((s, e, stage, nbytes, count, duration,
                              tuple((item[0], b.uses[item[1]]) + item[2:] for item in items)))
        collectives = tuple(self._collective_plan(op, b, skeleton.holders, b.nbytes[k], b.count[k], b.uses[k])
                            for k, op in skeleton.collectives)
        record = None
        if transfers:
            names = skeleton.names
            kinds = sorted({name for name in names if name is not None}) or ["Transfer"]
            devices = tuple(sorted({d for t in transfers for d in t[:2]}))
            tensors = sum(len(uses) for uses, name in zip(b.uses, names) if name is not None)
            record = ("+".join(kinds), devices, sum(t[3] for t in transfers), tensors, self._transfer_reason(b, kinds))
        return _BundlePlan(skeleton.targets, skeleton.local, tuple(transfers), collectives, record)

    def _skeleton(self, b: Bundle, layout_p: GroupLayout, layout_c: GroupLayout) -> _Skeleton:
        """The devices side of :meth:`_plan_bundle`: what a bundle with ``b``'s categories needs between
        these layouts (:mod:`tag.compiler.rules`), as records. It depends on the bundle only through its
        categories, so bundles of one kind share it (cached per kind and layouts in the context; :meth:`run`
        makes the new ones of a strategy at once)."""
        first_piece = self.tables.piece_unit(b.consumer_group, 0) if layout_c.model_parallel else 0
        key, targets = skeleton_key(b, layout_p, layout_c, first_piece)
        skeleton = self.context.skeletons.get(key)
        if skeleton is None:
            self._make_skeletons({key: (b, layout_p, layout_c, targets)})
            skeleton = self.context.skeletons[key]
        return skeleton

    def _prepare_skeletons(self, pairs: list[tuple[int, int]], op_unit: np.ndarray, mp) -> None:
        """Make, in one :func:`~tag.compiler.rules.make_skeletons` call, the skeletons that the bundles of
        ``pairs`` without a cached plan need and the context lacks."""
        layouts, plans, skeletons, tables = self.layouts, self.context.plans, self.context.skeletons, self.tables
        wanted: dict[tuple, tuple] = {}
        for pair in pairs:
            group_p, group_c = pair
            layout_p, layout_c = layouts[group_p], layouts[group_c]
            first_piece = tables.piece_unit(group_c, 0) if layout_c.model_parallel else 0
            for b in self._bundles(pair, op_unit, mp):
                if (id(b), layout_p.key, layout_c.key) not in plans:
                    key, targets = skeleton_key(b, layout_p, layout_c, first_piece)
                    if key not in skeletons and key not in wanted:
                        wanted[key] = (b, layout_p, layout_c, targets)
        if wanted:
            self._make_skeletons(wanted)

    def _make_skeletons(self, wanted: dict[tuple, tuple]) -> None:
        """The skeletons of ``wanted`` (key -> (bundle, layout of P, layout of C, consumer devices)), made by the
        rules' kernel and kept in the context as records (:func:`skeleton_record`)."""
        queue = SkeletonQueue()
        for b, layout_p, layout_c, targets in wanted.values():
            queue.add(b, layout_p, layout_c, targets)
        raw = queue.make(self.context.beta_matrix, self.num_devices)
        columns = {name: values.tolist() for name, values in raw._asdict().items()}
        category = 0  # the first of each skeleton's categories in cat_flags
        for i, (key, (b, layout_p, layout_c, targets)) in enumerate(wanted.items()):
            self.context.skeletons[key] = skeleton_record(columns, i, category, b, layout_p, layout_c, targets,
                                                          queue.holders[i], self.num_devices)
            category += len(b.pclass)

    def _instantiate(self, b: Bundle, plan: _BundlePlan) -> None:
        """Tasks, dependencies, tensors and records of one planned bundle."""
        unit_tasks, dep_task, dep_on = self.unit_tasks, self.dep_task, self.dep_on
        if b.producer_unit != NO_UNIT:
            p_base, p_offset = unit_tasks[b.producer_unit]
            p_tensor = self.unit_tensor.get(b.producer_unit)
        else:
            p_base = p_offset = p_tensor = None
        consumers = [unit_tasks[unit] for unit in b.consumer_units]  # (first task, offsets) per consumer unit
        # The common case: every consumer reads the producer's copy on its own device, replica for replica.
        local = plan.local
        if not plan.transfers and not plan.collectives and p_base is not None and len(local) == len(plan.targets):
            for c_base, c_offset in consumers:
                if c_offset is p_offset and c_base != p_base:
                    r = len(c_offset)
                    dep_task.extend(range(c_base, c_base + r))
                    dep_on.extend(range(p_base, p_base + r))
                    if p_tensor is not None:
                        self.read_tensor.extend(range(p_tensor, p_tensor + r))
                        self.read_task.extend(range(c_base, c_base + r))
                elif c_base != p_base:
                    for e, k in c_offset.items():
                        if e in local:
                            self._wait_local(c_base + k, p_base, p_offset, p_tensor, e)
            return
        inbound: dict[int, list[int]] = {}
        created = []
        if plan.transfers:
            arrived: dict[int, list[int]] = {}  # AddN root -> stage-1 transfers into it
            for s, e, stage, nbytes, count, duration, items in plan.transfers:
                task = self._transfer(s, e, nbytes, duration, b.consumer_group)
                created.append(task)
                if p_base is not None and s in p_offset:
                    self._wait_local(task, p_base, p_offset, p_tensor, s)
                if stage == 2:
                    for source in arrived.get(s, ()):
                        self._wait_transfer(task, source)
                else:
                    arrived.setdefault(e, []).append(task)
                inbound.setdefault(e, []).append(task)
                self.transfer_tensor[task] = self._tensor(e, nbytes, task)
                if not self.records:
                    continue
                for item in items:
                    if item[0] == "rows":
                        self.deliveries.append((task, "rows", item[1], s, e, item[2], item[3], ()))
                    else:
                        self.deliveries.append((task, item[0], item[1], s, e, 0.0, 1.0, ()))
        self._request_collectives(b, plan, p_base, p_offset, p_tensor, consumers)
        for c_base, c_offset in consumers:
            for e, k in c_offset.items():
                task = c_base + k
                if p_base is not None and e in local and p_base + p_offset[e] != task:
                    self._wait_local(task, p_base, p_offset, p_tensor, e)
                for transfer in inbound.get(e, ()):
                    self._wait_transfer(task, transfer)
        if plan.record is not None and self.records:
            op, devices, nbytes, tensors, reason = plan.record
            self.inserted.append(InsertedOp(op, b.consumer_group, b.producer_group, devices, nbytes, tensors,
                                            tuple(created), reason))

    def _request_collectives(self, b: Bundle, plan: _BundlePlan, p_base: int | None, p_offset: dict | None,
                             p_tensor: int | None, consumers: list[tuple[int, dict]]) -> None:
        """Queue the collectives of a planned bundle (emitted after every transfer, see _emit_collectives)."""
        for op, holders, nbytes, count, duration, uses, servers, gradient, reason in plan.collectives:
            sources = [(p_base + p_offset[s], p_tensor + p_offset[s] if p_tensor is not None else None)
                       for s in holders] if p_base is not None else []
            readers = [c_base + k for c_base, c_offset in consumers for k in c_offset.values()]
            self.requests.append(_Request(op, holders, nbytes, count, duration, sources, readers, uses,
                                          b.producer_unit, gradient, (b.producer_group, b.consumer_group, servers,
                                                                      reason)))

    def _wait_local(self, task: int, p_base: int, p_offset: dict, p_tensor: int | None, device: int) -> None:
        """``task`` waits for, and reads, the producer unit's output on ``device``."""
        k = p_offset[device]
        self.dep_task.append(task)
        self.dep_on.append(p_base + k)
        if p_tensor is not None:
            self.read_tensor.append(p_tensor + k)
            self.read_task.append(task)

    def _wait_transfer(self, task: int, transfer: int) -> None:
        self.dep_task.append(task)
        self.dep_on.append(transfer)
        self.read_tensor.append(self.transfer_tensor[transfer])
        self.read_task.append(task)

    # ------------------------------------------------------------------ collectives
    def _collective_plan(self, op: str, b: Bundle, holders: tuple, nbytes: float, count: int, uses: tuple) -> tuple:
        duration, servers = collective_duration(self.context, op, holders, b.consumer_group, nbytes, count, uses)
        gradient = self._feeds_optimizer(uses)
        return (op, holders, nbytes, count, duration, uses, servers, gradient,
                self._sync_reason(op, b, len(holders), gradient))

    def _feeds_optimizer(self, uses: tuple[int, ...]) -> bool:
        role, consumers = self.tables.op_graph.role, self.tables.use_consumers
        return all((role[consumers[q]] == ROLE_OPTIMIZER).all() for q in uses)

    def _emit_collectives(self) -> None:
        requests = self.requests
        if self.fusion_bytes is not None:
            requests = self._fuse(requests)
        for request in requests:
            group_p, group_c, servers, reason = request.record
            task = self._task(TASK_COLLECTIVE, request.duration, request.devices[0], NO_TASK, request.nbytes,
                              _COLLECTIVE_CODES[request.op], group_c,
                              collective_resources(self.context, request.devices),
                              f"{'AR' if request.op == 'allreduce' else 'PS'}{group_c}")
            for source, tensor in request.producers:
                self.dep_task.append(task)
                self.dep_on.append(source)
                if tensor is not None:
                    self.read_tensor.append(tensor)
                    self.read_task.append(task)
            self.dep_task.extend(request.consumers)
            self.dep_on.extend([task] * len(request.consumers))
            if not self.records:
                continue
            self.deliveries.append((task, request.op, request.uses, -1, -1, 0.0, 1.0, request.devices))
            name = "AllReduce" if request.op == "allreduce" else "PS"
            if servers:
                reason += f"; parameter server(s) on device(s) {list(servers)}, round robin by parameter"
            self.inserted.append(InsertedOp(name, group_c, group_p, request.devices, request.nbytes,
                                            len(request.uses), (task,), reason))

    def _fuse(self, requests: list[_Request]) -> list[_Request]:
        """Horovod's tensor fusion: consecutive all-reduces over one device set, in producer order, merged
        into buckets of at least ``fusion_bytes``."""
        fusable = [r for r in requests if r.op == "allreduce" and r.gradient]
        fused: list[_Request] = [r for r in requests if not (r.op == "allreduce" and r.gradient)]
        open_buckets: dict[tuple[int, ...], list[_Request]] = {}

        def close(devices: tuple[int, ...]) -> None:
            bucket = open_buckets.pop(devices)
            total = sum(r.nbytes for r in bucket)
            duration = ring_allreduce_seconds(len(devices), *self.context.ring(devices), total, 1)
            groups = sorted({r.record[1] for r in bucket})
            reason = (f"Horovod fusion bucket of {len(bucket)} all-reduce(s) ({sum(len(r.uses) for r in bucket)} "
                      f"tensors) for groups {groups}")
            fused.append(_Request("allreduce", devices, total, sum(r.count for r in bucket), duration,
                                  [p for r in bucket for p in r.producers], [c for r in bucket for c in r.consumers],
                                  tuple(q for r in bucket for q in r.uses), bucket[0].order, True,
                                  (bucket[0].record[0], bucket[-1].record[1], (), reason)))

        for request in sorted(fusable, key=lambda r: r.order):
            bucket = open_buckets.setdefault(request.devices, [])
            bucket.append(request)
            if sum(r.nbytes for r in bucket) >= self.fusion_bytes:
                close(request.devices)
        for devices in list(open_buckets):
            close(devices)
        return fused

    # ------------------------------------------------------------------ records
    def _transfer_reason(self, b: Bundle, kinds: list[str]) -> str:
        layout_p, layout_c = self.layouts[b.producer_group], self.layouts[b.consumer_group]
        what = f"{sum(len(u) for u in b.uses)} tensor(s) of group {b.producer_group}"
        where_p = _where(layout_p)
        where_c = _where(layout_c)
        if b.producer_group == b.consumer_group:
            if layout_c.model_parallel:
                return f"{what} cross devices inside model-parallel group {b.consumer_group} ({where_c})"
            return f"ops of group {b.consumer_group} that need whole tensors read {what} ({where_c})"
        if "AddN" in kinds:
            return f"group {b.consumer_group} ({where_c}) needs whole sums of partial {what} ({where_p})"
        return f"group {b.consumer_group} ({where_c}) reads {what} ({where_p})"

    def _sync_reason(self, op: str, b: Bundle, n: int, to_optimizer: bool) -> str:
        layout_c = self.layouts[b.consumer_group]
        option = OPTIONS[layout_c.option]
        if b.producer_group == b.consumer_group and to_optimizer:
            return f"weight gradients of group {b.consumer_group} replicated on {n} devices (option {option})"
        what = "weight gradients" if to_optimizer else "partial sums"
        return (f"{what} of group {b.producer_group} (batch split over {n} devices) needed whole by group "
                f"{b.consumer_group} on the same devices (option {option})")

    # ------------------------------------------------------------------ memory
    def _persistent_memory(self, groups) -> np.ndarray:
        """[D] parameter, gradient and optimizer-state bytes of ``groups`` per device, registered as one
        persistent tensor per device."""
        tables = self.tables
        per_device = np.zeros(self.num_devices)
        param_bytes = tables.op_graph.param_bytes
        for g in groups:
            layout = self.layouts[g]
            if layout.model_parallel:
                for op in tables.group_graph.group_members(g).tolist():
                    per_device[layout.op_device[op]] += ADAM_COPIES * param_bytes[op]
            elif tables.group_param_bytes[g] > 0:
                per_device[list(layout.devices)] += ADAM_COPIES * tables.group_param_bytes[g]
        for d in np.flatnonzero(per_device).tolist():
            self.tensor_device.append(d)
            self.tensor_bytes.append(float(per_device[d]))
            self.tensor_producer.append(NO_TASK)
            self.tensor_persistent.append(True)
        return per_device

    # ------------------------------------------------------------------ low level
    def _task(self, kind: int, duration: float, device: int, peer: int, nbytes: float, collective: int, group: int,
              resources: tuple[int, ...], label: str) -> int:
        self.kind.append(kind)
        self.duration.append(duration)
        self.device.append(device)
        self.peer.append(peer)
        self.nbytes.append(nbytes)
        self.collective.append(collective)
        self.group.append(group)
        self.res.append(resources)
        self.labels.append(label)
        return self.first_task + len(self.kind) - 1

    def _transfer(self, src: int, dst: int, nbytes: float, duration: float, group: int) -> int:
        if self.dense_links:
            link = src * self.num_devices + dst
        else:
            link = self.links.get((src, dst))
            if link is None:
                link = self.links[(src, dst)] = len(self.links)
        # NIC ids are below every link id, so the tuple stays sorted
        resources = self.context.nics[src][dst] + (self.link_base + link,)
        return self._task(TASK_TRANSFER, duration, src, dst, nbytes, -1, group, resources, f"{src}>{dst}")

    def _tensor(self, device: int, nbytes: float, producer: int) -> int:
        self.tensor_device.append(device)
        self.tensor_bytes.append(nbytes)
        self.tensor_producer.append(producer)
        self.tensor_persistent.append(False)
        return self.first_tensor + len(self.tensor_device) - 1

    def _taskgraph(self, num_groups: int) -> TaskGraph:
        d, m = self.num_devices, self.cluster.num_machines
        links = sorted(self.links.items(), key=lambda item: item[1])
        resource_kind = ([RES_COMPUTE] * d + [RES_COMM] * d + [RES_NIC_OUT] * m + [RES_NIC_IN] * m
                         + [RES_LINK] * len(links))
        resource_a = list(range(d)) * 2 + list(range(m)) * 2 + [a for (a, _), _ in links]
        resource_b = [-1] * (2 * d + 2 * m) + [b for (_, b), _ in links]
        num_tasks = len(self.kind)
        dep_ptr, dep, _ = pairs_csr(self.dep_task, self.dep_on, num_tasks, num_tasks)
        res_ptr, res = csr_from_lists(self.res)
        consumer_ptr, consumer, _ = pairs_csr(self.read_tensor, self.read_task, len(self.tensor_device), num_tasks)
        names = list(map("{}@{}#{}".format, self.labels, self.device, range(num_tasks)))
        taskgraph = TaskGraph(
            cluster=self.cluster, names=names, labels=self.labels, kind=np.array(self.kind, dtype=np.int8),
            duration=np.array(self.duration), device=np.array(self.device, dtype=np.int64),
            peer=np.array(self.peer, dtype=np.int64), nbytes=np.array(self.nbytes),
            collective=np.array(self.collective, dtype=np.int8), group=np.array(self.group, dtype=np.int64),
            dep_ptr=dep_ptr, dep=dep, res_ptr=res_ptr, res=res, resource_kind=np.array(resource_kind, dtype=np.int8),
            resource_a=np.array(resource_a, dtype=np.int64), resource_b=np.array(resource_b, dtype=np.int64),
            tensor_device=np.array(self.tensor_device, dtype=np.int64), tensor_bytes=np.array(self.tensor_bytes),
            tensor_producer=np.array(self.tensor_producer, dtype=np.int64),
            tensor_persistent=np.array(self.tensor_persistent, dtype=bool), consumer_ptr=consumer_ptr,
            consumer=consumer, tensor_names=None, num_groups=num_groups,
        )
        if self.tables.unit_part is None:
            return taskgraph
        taskgraph, new_id = merge_taskgraph(taskgraph, self._merge_keys(num_tasks))
        self._renumber(new_id)
        return taskgraph

    def _merge_keys(self, num_tasks: int) -> np.ndarray:
        """[T] merge key of each task (tag.sim.kernels.merge_chunks): part * D + device for the compute tasks
        of replicated groups, -1 for every other task (model-parallel pieces, transfers, collectives)."""
        key = np.full(num_tasks, -1, dtype=np.int64)
        unit_part, num_units = self.tables.unit_part, self.tables.num_units
        for unit, (first, offsets) in self.unit_tasks.items():
            if unit < num_units:
                part = int(unit_part[unit]) * self.num_devices
                for device, k in offsets.items():
                    key[first - self.first_task + k] = part + device
        return key

    def _renumber(self, new_id: np.ndarray) -> None:
        """Task ids in what the plan records, after merging (``new_id`` [T] of each old task)."""
        ids = new_id.tolist()
        self.unit_tasks = {unit: (ids[first], offsets) for unit, (first, offsets) in self.unit_tasks.items()}
        self.deliveries = [(ids[d[0]],) + tuple(d[1:]) for d in self.deliveries]
        self.inserted = [op._replace(tasks=tuple(ids[t] for t in op.tasks)) for op in self.inserted]


def collective_duration(context: ClusterContext, op: str, holders: tuple[int, ...], consumer_group: int, nbytes: float,
                        count: int, uses: tuple[int, ...]) -> tuple[float, tuple[int, ...]]:
    """(seconds, parameter servers) of one collective over ``holders`` syncing ``nbytes`` in ``count`` tensors
    (the uses ``uses``) for ``consumer_group``: a ring all-reduce, or PS push + pull with each parameter's
    server chosen round robin (no servers for an all-reduce)."""
    n = len(holders)
    if op == "allreduce":
        return ring_allreduce_seconds(n, *context.ring(holders), nbytes, count), ()
    sync_index = context.tables.use_sync_index
    chosen = [holders[(consumer_group + int(sync_index[q])) % n] for q in uses]
    latency, inverse = np.array([context.server(holders, ps) for ps in holders]).T.copy()
    duration = ps_seconds(latency, inverse, 0, n, consumer_group, np.array(uses, dtype=np.int64), 0, len(uses),
                          sync_index, context.tables.use_bytes)
    return duration, tuple(sorted(set(chosen)))


def collective_resources(context: ClusterContext, devices: tuple[int, ...]) -> tuple[int, ...]:
    """The resources a collective over ``devices`` holds: their comm streams, and with
    ``COLLECTIVES_HOLD_NICS`` the NICs of its machines when it spans several (cached per device tuple)."""
    found = context.collective_held.get(devices)
    if found is None:
        found = tuple(context.cluster.num_devices + d for d in devices)
        if COLLECTIVES_HOLD_NICS:
            found += context.collective_nics(devices)
        context.collective_held[devices] = found
    return found
