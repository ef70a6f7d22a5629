"""What the compiler knows before it sees a strategy: units, tensor uses, bundles, time coefficients.

Everything here depends only on the grouping, the cluster's GPU types, the cost model and the
granularity, so :func:`build_tables` runs once per planning run: :func:`tag.compiler.cache.compiler_tables`
keeps its tables in the caller's :class:`~tag.compiler.cache.CompilerCache`.

**Units.** The compute tasks of one device are units of ops:

- ``"op"`` granularity: every non-input op is a unit (the exact reference);
- ``"part"`` granularity: the ops of one group with one role (forward, backward, optimizer), one
  *sync level* and one *readiness*. The sync level of an op is the number of *sync edges* on the
  longest path to it inside its (group, role): an edge whose reader needs data that the other replicas
  of the same group hold (a partial sum read by an op that needs the whole sum, batch rows read by an
  op that needs every row). Without levels such an edge would run from a unit through an all-reduce
  back into the same unit, a cycle. Readiness separates the ops whose inputs are all input ops (ready
  at time 0: Adam's decay of its moments, an embedding lookup) from the rest: the simulator's FIFO
  runs them at the start, while inside a larger unit they would wait for the unit's other inputs;
- ``"merged"`` granularity: the chunks of ``"group"`` granularity (below), run back to back as one task per
  part and replica (:mod:`tag.sim.merge`): a boundary tensor still leaves when the op producing it ends and
  a chunk still waits for what its first op reads (dependency lags), but nothing else runs on the device
  between the chunks of one part. About half the tasks of ``"group"`` on BERT-Large; its FIFO queues
  differ, so it agrees with the reference a little less often (``scripts/bench_sim.py``, the report of
  issue 3);
- ``"group"`` granularity (the default): each part cut, along a topological order of its ops, right
  after every op whose output another group reads and right before every op that reads a tensor of
  another group (*boundary chunks*). A unit then starts when the boundary tensor its first op reads
  has arrived, and a boundary tensor leaves when the op producing it ends, as at op level; only the
  runs of ops between boundary events are fused. Two refinements keep tasks that mark no event out:

  - after an emitting op, the chunk ends before the next op that takes time: ops of no time in between
    (views, ``getitem``) stay in the emitter's chunk, which ends when they do;
  - an optimizer op reading an input tensor of another group (its parameter, which joins the group of
    its first forward reader) starts a chunk only once the chunk so far runs for
    :data:`OPTIMIZER_CHUNK_S` (by the mean time over the GPU types). The parameter exists from time 0
    and reaches the update's devices long before the weight gradient that the update also waits for, so
    the read is no event; a cut gives other tasks a point to run between two parameters' updates, as
    they do at op level, and the cap keeps such a point wherever the updates before it ran a millisecond.

  On BERT-Large, 60 groups, tag-testbed: 931 units instead of 1 385 (486 optimizer units became 136,
  395 forward units 294); against the reference the mean error went down and one more strategy of 207 fell
  outside 3 % (README, "Simulator speed").

  With whole parts the fast path ran 5-14 % slower than the reference on tiny graphs (a part waits for
  all its inputs and sends all its outputs at its end, which starves the FIFO queues of the NICs); with
  boundary chunks it agrees within 3 % on most strategies (tests/test_compiler.py,
  ``test_fast_path_agrees_with_reference``).

Units are numbered in (group topological position, role, level, readiness, chunk) order, and every op
edge goes from a unit to the same or a later one, so any placement gives a DAG of tasks.

Input ops (parameters, optimizer states, the batch) are in no unit: they cost nothing and their
outputs exist from time 0 on every device holding them.

**Tensor uses.** One *use* per (producer op p, consumer group C): the tensor p outputs, read by ops of
C (a partial-sum tensor read by ``sum``-class ops, which add partials, and by other ops makes two
uses; so do the batch-scaled reads of a multi-output op and the reads of its parts that do not scale,
batch norm's saved statistics next to its output). Its producer class (the tensor as the producer's
replicas hold it):

- ``ROWS`` — split along the batch (the edges of the use are batch-scaled): a replica holds the rows
  of its batch interval;
- ``SUMS`` — p is of split class ``sum``: a replica of a batch-split group holds a partial sum;
  otherwise the whole tensor;
- ``FULL`` — anything else: every holder has the whole tensor.

Its *demand* is the most demanding split class among its consumers in C: 0 (``sum``: partial inputs
are fine), 1 (``concat``: the replica's own rows), 2 (``none``: everything).

**Bundles.** Uses with the same producer unit, consumer group and set of consumer units travel
together; inside a bundle they are summed by category (producer class, demand). At op granularity a
bundle is one use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from tag._arrays import csr_by_key
from tag.cost import CostModel
from tag.graph.opgraph import (
    ROLE_INPUT,
    ROLE_OPTIMIZER,
    SPLIT_CONCAT,
    SPLIT_NONE,
    SPLIT_SUM,
    OpGraph,
)
from tag.grouping import GroupGraph

__all__ = [
    "GRANULARITIES",
    "ROWS",
    "SUMS",
    "FULL",
    "PRODUCER_CLASSES",
    "DEMAND_SUM",
    "DEMAND_ROWS",
    "DEMAND_ALL",
    "NO_UNIT",
    "CompilerTables",
    "Bundle",
    "build_tables",
    "op_demand",
    "make_bundles",
    "always_local",
]

GRANULARITIES = ("group", "merged", "part", "op")
PRODUCER_CLASSES = ("rows", "sums", "full")
ROWS, SUMS, FULL = range(3)
DEMAND_SUM, DEMAND_ROWS, DEMAND_ALL = range(3)
NO_UNIT = -1
# A chunk of optimizer ops is cut before a parameter read only once it runs this long (module docstring)
OPTIMIZER_CHUNK_S = 1e-3


def op_demand(split: np.ndarray) -> np.ndarray:
    """[N] demand of each op as a consumer: sum → 0, concat → 1, none → 2."""
    demand = np.full(split.shape, DEMAND_ROWS, dtype=np.int8)
    demand[split == SPLIT_SUM] = DEMAND_SUM
    demand[split == SPLIT_NONE] = DEMAND_ALL
    return demand


class Bundle(NamedTuple):
    """Uses from one producer unit (or the input ops of group P) to one consumer group, by category.

    K categories: each a (producer class, demand) pair with the bytes (reference batch) and the count of
    the tensors in it, and the ids of those uses.
    """

    producer_group: int
    producer_unit: int  # NO_UNIT: the input ops of producer_group (available at time 0)
    producer_device: int  # -1: wherever the producer group's replicas are; else the one device (model-parallel)
    consumer_group: int
    consumer_units: tuple[int, ...]  # units of consumer_group that read some tensor of the bundle
    pclass: tuple[int, ...]  # [K]
    demand: tuple[int, ...]  # [K]
    nbytes: tuple[float, ...]  # [K] summed bytes at the reference batch
    count: tuple[int, ...]  # [K] tensors of non-zero size (each pays a message latency)
    uses: tuple[tuple[int, ...], ...]  # [K] use ids


@dataclass(eq=False)
class CompilerTables:
    """Strategy-independent arrays for one (grouping, GPU types, cost model, granularity).

    U units, N ops, Q uses, T GPU types (the cluster's ``types``).
    """

    granularity: str
    group_graph: GroupGraph
    types: tuple  # [T] GPU types the time coefficients are for
    op_unit: np.ndarray  # [N] int64 unit of each op, NO_UNIT for input ops
    op_level: np.ndarray  # [N] int64 sync level of each op (0 for input ops)
    unit_group: np.ndarray  # [U] int64
    unit_role: np.ndarray  # [U] int8
    unit_ops: list[np.ndarray]  # [U] op ids of each unit, in a topological order
    group_units: list[np.ndarray]  # [G] unit ids of each group, ascending
    group_inputs: list[np.ndarray]  # [G] input op ids of each group
    group_order: np.ndarray  # [G] group ids in a topological order
    op_time_fixed: np.ndarray  # [N, T] seconds that do not scale with the batch fraction
    op_time_scaled: np.ndarray  # [N, T] seconds at the full batch that scale with it
    unit_time_fixed: np.ndarray  # [U, T]
    unit_time_scaled: np.ndarray  # [U, T]
    # uses
    use_producer: np.ndarray  # [Q] int64 producer op
    use_group: np.ndarray  # [Q] int64 consumer group
    use_pclass: np.ndarray  # [Q] int8
    use_demand: np.ndarray  # [Q] int8
    use_bytes: np.ndarray  # [Q] float64 at the reference batch
    use_consumers: list[np.ndarray]  # [Q] consumer op ids in the consumer group
    use_consumer_ptr: np.ndarray  # [Q+1] the same as CSR (into use_consumer_ops)
    use_consumer_ops: np.ndarray  # [sum of consumers]
    use_sync_index: np.ndarray  # [Q] int64 rank among the SUMS uses into the same group (PS round robin)
    use_producer_group: np.ndarray  # [Q] int64
    op_demand: np.ndarray  # [N] int8 demand of each op as a reader
    group_uses: list[np.ndarray]  # [G] ids of the uses produced by each group
    unit_label: list[str]  # [U] short name of each unit's tasks ("G12B0c3": group 12, backward, level 0, chunk 3)
    # bundles of static units, for groups that are not model-parallel
    bundles: dict[tuple[int, int], list[Bundle]]  # (P, C) -> bundles (P == C: only potentially non-local)
    pair_uses: dict[tuple[int, int], np.ndarray]  # (P, C) -> ids of every use from group P into group C
    piece_stride: int  # unit ids of model-parallel pieces: num_units + group * piece_stride + piece
    unit_local_succ: list[tuple[int, ...]]  # [U] later units of the same group reading the unit's outputs
    # memory
    op_kept: np.ndarray  # [N] bool: output counted as a transient tensor (activations, not weight gradients)
    op_out_rows: np.ndarray  # [N] kept output bytes read outside the op's unit, scaling with the batch fraction
    op_out_fixed: np.ndarray  # [N] the same, not scaling
    unit_out_rows: np.ndarray  # [U] sums of op_out_rows over each unit
    unit_out_fixed: np.ndarray  # [U]
    group_param_bytes: np.ndarray  # [G] parameter bytes owned by each group's ops
    # merging: at "merged" granularity the chunks of one part run as one task per replica (their outputs
    # released, their inputs awaited, at their offsets inside it: tag.sim.kernels.merge_chunks)
    unit_part: np.ndarray | None = None  # [U] int64 part of each unit; None: units are not merged

    @property
    def num_units(self) -> int:
        return len(self.unit_group)

    def piece_unit(self, group: int, piece: int) -> int:
        """The unit id of piece ``piece`` of ``group`` when it is model-parallel (after every static unit)."""
        return self.num_units + group * self.piece_stride + piece

    @property
    def op_graph(self) -> OpGraph:
        return self.group_graph.op_graph


# --------------------------------------------------------------------------------------------- construction


def build_tables(gg: GroupGraph, types: tuple, cost: CostModel, granularity: str) -> CompilerTables:
    """The tables of grouping ``gg`` for the GPU types ``types`` under ``cost`` at ``granularity`` (module
    docstring)."""
    graph = gg.op_graph
    n = graph.num_ops
    assignment = gg.assignment
    topo = graph.topological_order()
    position = np.empty(n, dtype=np.int64)
    position[topo] = np.arange(n)
    demand = op_demand(graph.split)
    is_input = graph.role == ROLE_INPUT
    level = _sync_levels(graph, assignment, demand, position)
    fixed, scaled = _time_coefficients(graph, types, cost)
    group_order = gg.graph.topological_order()
    worker = np.flatnonzero(~is_input)
    op_unit, unit_first, part, whole_part = _op_units(graph, assignment, group_order, worker, level, position,
                                                      (fixed + scaled).mean(axis=1), granularity)
    num_units = unit_first.size
    unit_group = assignment[unit_first]
    unit_role = graph.role[unit_first]
    members = np.flatnonzero(op_unit >= 0)
    members = members[np.lexsort((position[members], op_unit[members]))]
    bounds = np.searchsorted(op_unit[members], np.arange(num_units + 1))
    unit_ops = [members[bounds[u]:bounds[u + 1]] for u in range(num_units)]
    group_units = _split_by(unit_group, np.arange(num_units), gg.num_groups)
    inputs = np.flatnonzero(is_input)
    group_inputs = _split_by(assignment[inputs], inputs, gg.num_groups)

    unit_fixed = np.zeros((num_units, len(types)))
    unit_scaled = np.zeros((num_units, len(types)))
    np.add.at(unit_fixed, op_unit[worker], fixed[worker])
    np.add.at(unit_scaled, op_unit[worker], scaled[worker])

    uses = _uses(graph, assignment, demand)
    use_producer, use_group, use_pclass, use_demand, use_bytes, use_consumer_ptr, use_consumer_ops = uses
    consumer_bounds = use_consumer_ptr.tolist()  # use_consumers: views of the CSR, one copy of the data
    use_consumers = [use_consumer_ops[a:b] for a, b in zip(consumer_bounds[:-1], consumer_bounds[1:])]
    sums = use_pclass == SUMS
    use_sync_index = np.zeros(use_producer.size, dtype=np.int64)
    for c in np.unique(use_group[sums]).tolist():
        ids = np.flatnonzero(sums & (use_group == c))
        use_sync_index[ids[np.argsort(use_producer[ids], kind="stable")]] = np.arange(ids.size)
    group_uses = _split_by(assignment[use_producer], np.arange(use_producer.size), gg.num_groups)

    tables = CompilerTables(
        granularity=granularity, group_graph=gg, types=types, op_unit=op_unit, op_level=level,
        unit_group=unit_group, unit_role=unit_role, unit_ops=unit_ops, group_units=group_units,
        group_inputs=group_inputs, group_order=group_order, op_time_fixed=fixed, op_time_scaled=scaled,
        unit_time_fixed=unit_fixed, unit_time_scaled=unit_scaled, use_producer=use_producer, use_group=use_group,
        use_pclass=use_pclass, use_demand=use_demand, use_bytes=use_bytes, use_consumers=use_consumers,
        use_consumer_ptr=use_consumer_ptr, use_consumer_ops=use_consumer_ops,
        use_sync_index=use_sync_index, use_producer_group=assignment[use_producer], op_demand=demand,
        group_uses=group_uses, unit_label=_unit_labels(graph, granularity, unit_ops, unit_group, unit_role, level),
        bundles={}, pair_uses=_pair_uses(assignment[use_producer], use_group), piece_stride=int(gg.group_sizes().max()),
        unit_local_succ=[],
        op_kept=np.zeros(n, bool), op_out_rows=np.zeros(n), op_out_fixed=np.zeros(n),
        unit_out_rows=np.zeros(num_units), unit_out_fixed=np.zeros(num_units),
        group_param_bytes=np.bincount(assignment, weights=graph.param_bytes, minlength=gg.num_groups),
    )
    if granularity == "merged":
        tables.unit_part = np.zeros(num_units, dtype=np.int64)
        tables.unit_part[part] = whole_part
    tables.bundles = make_bundles(tables, np.arange(use_producer.size), op_unit, skip_local=True)
    tables.unit_local_succ = _local_successors(graph, assignment, op_unit, num_units)
    tables.op_kept, tables.op_out_rows, tables.op_out_fixed = _memory_columns(graph, op_unit)
    tables.unit_out_rows = np.bincount(op_unit[worker], weights=tables.op_out_rows[worker], minlength=num_units)
    tables.unit_out_fixed = np.bincount(op_unit[worker], weights=tables.op_out_fixed[worker], minlength=num_units)
    return tables


def _sync_levels(graph: OpGraph, assignment: np.ndarray, demand: np.ndarray, position: np.ndarray) -> np.ndarray:
    """[N] sync level of each op: the longest path over sync edges inside its (group, role) (module
    docstring); 0 for input ops. ``position`` [N]: each op's place in a topological order."""
    is_input = graph.role == ROLE_INPUT
    src, dst = graph.edge_src, graph.edge_dst
    same_part = (assignment[src] == assignment[dst]) & (graph.role[src] == graph.role[dst]) & ~is_input[src]
    sync = same_part & (((graph.split[src] == SPLIT_SUM) & (demand[dst] >= DEMAND_ROWS))
                        | (graph.edge_batch_scaled & (demand[dst] == DEMAND_ALL)))
    level = np.zeros(graph.num_ops, dtype=np.int64)
    if sync.any():
        part_edges = np.flatnonzero(same_part)
        order = part_edges[np.argsort(position[src[part_edges]], kind="stable")]
        for k in order.tolist():  # producers in topological order: their level is final when read
            candidate = level[src[k]] + int(sync[k])
            if candidate > level[dst[k]]:
                level[dst[k]] = candidate
    level[is_input] = 0
    return level


def _time_coefficients(graph: OpGraph, types: tuple, cost: CostModel) -> tuple[np.ndarray, np.ndarray]:
    """([N, T] fixed, [N, T] scaled) seconds of each op on each GPU type: t(f) = fixed + f · scaled, exact for
    the cost model's linear batch scaling. An op that needs its whole input (split class none) runs on the
    whole batch in every replica."""
    fixed = np.zeros((graph.num_ops, len(types)))
    scaled = np.zeros((graph.num_ops, len(types)))
    whole = graph.split == SPLIT_NONE
    for k, gpu in enumerate(types):
        at_zero = cost.op_times(graph, gpu, 0.0)
        at_one = cost.op_times(graph, gpu, 1.0)
        fixed[:, k] = np.where(whole, at_one, at_zero)
        scaled[:, k] = np.where(whole, 0.0, at_one - at_zero)
    return fixed, scaled


def _op_units(graph: OpGraph, assignment: np.ndarray, group_order: np.ndarray, worker: np.ndarray,
              level: np.ndarray, position: np.ndarray, op_time: np.ndarray, granularity: str) -> tuple:
    """(op_unit [N] (NO_UNIT for input ops), unit_first [U] (an op of each unit), part [W] and whole_part [W]:
    each worker op's unit and its part before boundary chunks, None at op granularity) at ``granularity``
    (module docstring); units numbered in (group topological position, role, level, readiness, chunk) order."""
    n = graph.num_ops
    group_rank = np.empty(group_order.size, dtype=np.int64)
    group_rank[group_order] = np.arange(group_order.size)
    op_unit = np.full(n, NO_UNIT, dtype=np.int64)
    if granularity == "op":
        order = worker[np.lexsort((position[worker], group_rank[assignment[worker]]))]
        op_unit[order] = np.arange(order.size)
        return op_unit, order, None, None
    # Readiness: ops whose inputs are all input ops are ready at time 0 (Adam's decay of its moments, embedding
    # lookups); at op level the device runs them first.
    late = np.zeros(n, dtype=np.int64)
    late[graph.edge_dst[graph.role[graph.edge_src] != ROLE_INPUT]] = 1
    key = ((group_rank[assignment[worker]] * 4 + graph.role[worker]) * (int(level.max()) + 1)
           + level[worker]) * 2 + late[worker]
    _, part = np.unique(key, return_inverse=True)
    whole_part = part
    if granularity in ("group", "merged"):
        part = _boundary_chunks(graph, assignment, worker, part, position, op_time)
    op_unit[worker] = part
    unit_first = np.zeros(int(part.max()) + 1 if part.size else 0, dtype=np.int64)
    unit_first[part] = worker
    return op_unit, unit_first, part, whole_part


def _split_by(keys: np.ndarray, values: np.ndarray, size: int) -> list[np.ndarray]:
    ptr, order = csr_by_key(size, keys)
    return [values[order[ptr[k]:ptr[k + 1]]] for k in range(size)]


def _uses(graph: OpGraph, assignment: np.ndarray, demand: np.ndarray):
    """One use per (producer op, consumer group) over every op edge; the readers of class ``sum`` of a tensor
    of class ``sum`` (which can add partials) form a use of their own, and so do the readers of a part of the
    output that does not scale with the batch (a multi-output op: batch norm's saved mean next to its
    batch-sized output), which need no rows of the others."""
    src, dst = graph.edge_src, graph.edge_dst
    group = assignment[dst]
    num_groups = int(assignment.max()) + 1
    # A multi-output op's class is its first output's; a getitem of one of its other outputs has that
    # output's class (layer norm backward: grad input concat, weight gradient sum), so a sum-class getitem
    # reads a partial sum however its producer is classed.
    getitem = np.fromiter((k == "getitem" for k in graph.kinds), dtype=bool, count=graph.num_ops)
    partial = (graph.split[src] == SPLIT_SUM) | (getitem[dst] & (graph.split[dst] == SPLIT_SUM))
    adds_partials = partial & (graph.split[dst] == SPLIT_SUM)
    key = (((src * num_groups + group) * 2 + adds_partials) * 2 + graph.edge_batch_scaled) * 2 + partial
    unique_keys, inverse = np.unique(key, return_inverse=True)
    q = unique_keys.size
    producer = unique_keys // (8 * num_groups)
    consumer_group = (unique_keys // 8) % num_groups
    nbytes = np.zeros(q)
    np.maximum.at(nbytes, inverse, graph.edge_bytes)
    rows = np.zeros(q, dtype=bool)
    np.logical_or.at(rows, inverse, graph.edge_batch_scaled)
    need = np.zeros(q, dtype=np.int8)
    np.maximum.at(need, inverse, demand[dst])
    pclass = np.where(rows, ROWS, np.where(unique_keys % 2 == 1, SUMS, FULL)).astype(np.int8)
    # each use's consumer ops, ascending, as CSR: (use, consumer) pairs sorted and deduplicated
    pairs = np.unique(inverse * graph.num_ops + dst)
    consumer_ptr = np.searchsorted(pairs // graph.num_ops, np.arange(q + 1))
    return producer, consumer_group, pclass, need, nbytes, consumer_ptr, pairs % graph.num_ops


def always_local(pclass, demand):
    """A use inside one group that is not model-parallel never moves data: every replica holds what it reads
    (its own rows, its own partial for a partial-sum consumer, or a whole tensor). Ints give a bool, arrays an
    array of them."""
    return (pclass == FULL) | ((pclass == ROWS) & (demand <= DEMAND_ROWS)) | ((pclass == SUMS) & (demand == DEMAND_SUM))


def make_bundles(tables: CompilerTables, use_ids: np.ndarray, op_unit: np.ndarray, *, skip_local: bool,
                 op_device: dict | None = None) -> dict[tuple[int, int], list[Bundle]]:
    """Bundles of the given uses under the op → unit map ``op_unit`` [N] (static, or with the pieces of
    model-parallel groups), keyed by (producer group, consumer group).

    ``op_device`` maps the ops of model-parallel groups to their device (a bundle then comes from one
    device). With ``skip_local``, uses inside one group that never move data there are left out.

    A bundle gathers the uses of one (producer group, producer unit, device, consumer group, consumer units);
    bundles come in the order of their first use, categories by (class, demand), each category's bytes
    summed and its uses listed in use order. The uses are sorted into bundles by array operations: the
    bundles of a model-parallel pair are made per pair of layouts, so this runs in the search.
    """
    use_ids = np.asarray(use_ids, dtype=np.int64).reshape(-1)
    if use_ids.size == 0:
        return {}
    producer = tables.use_producer[use_ids]  # [Q]
    group_p, group_c = tables.group_graph.assignment[producer], tables.use_group[use_ids]
    pclass = tables.use_pclass[use_ids].astype(np.int64)
    unit_p = op_unit[producer]  # [Q]
    keep, demand, set_unit, bounds = _consumer_units(tables, use_ids, op_unit, unit_p, group_p == group_c,
                                                     pclass, skip_local)
    uses = np.flatnonzero(keep)
    kept_ids = use_ids[uses]
    # input ops' tensors (parameters, the batch) exist from time 0 and all queue at once: each moves on its
    # own, in op order, as at op level (one merged transfer would take the NICs in another order)
    unit_key = np.where(unit_p != NO_UNIT, unit_p, NO_UNIT - 1 - producer)[uses].tolist()
    if op_device is None:
        devices = [-1] * uses.size
    else:
        devices = [op_device.get(p, -1) for p in producer[uses].tolist()]
    index: dict[tuple, int] = {}  # bundle key -> its index, in order of first use
    bundle_of = []
    for i, gp, unit, device, gc in zip(uses.tolist(), group_p[uses].tolist(), unit_key, devices,
                                       group_c[uses].tolist()):
        bundle_of.append(index.setdefault((gp, unit, device, gc, tuple(set_unit[bounds[i]:bounds[i + 1]])),
                                          len(index)))
    bundle_of = np.array(bundle_of, dtype=np.int64)
    # categories: (bundle, class, demand), ascending; bytes summed in use order from 0.0 (bincount)
    width = int(max(pclass.max(), demand.max())) + 1
    codes, category = np.unique((bundle_of * width + pclass[uses]) * width + demand[uses], return_inverse=True)
    nbytes = tables.use_bytes[kept_ids]
    category_bytes = np.bincount(category, weights=nbytes, minlength=codes.size).tolist()
    category_count = np.bincount(category, weights=nbytes > 0, minlength=codes.size).astype(np.int64).tolist()
    use_ptr, by_category = csr_by_key(codes.size, category)
    by_category, use_ptr = kept_ids[by_category].tolist(), use_ptr.tolist()
    category_uses = [tuple(by_category[a:b]) for a, b in zip(use_ptr[:-1], use_ptr[1:])]
    category_pclass, category_demand = ((codes // width) % width).tolist(), (codes % width).tolist()
    category_bounds = np.searchsorted(codes // (width * width), np.arange(len(index) + 1)).tolist()
    bundles: dict[tuple[int, int], list[Bundle]] = {}
    for (gp, unit, device, gc, consumer_units), k0, k1 in zip(index, category_bounds[:-1], category_bounds[1:]):
        bundle = Bundle(gp, max(unit, NO_UNIT), device, gc, consumer_units, tuple(category_pclass[k0:k1]),
                        tuple(category_demand[k0:k1]), tuple(category_bytes[k0:k1]), tuple(category_count[k0:k1]),
                        tuple(category_uses[k0:k1]))
        bundles.setdefault((gp, gc), []).append(bundle)
    return bundles


def _consumer_units(tables: CompilerTables, use_ids: np.ndarray, op_unit: np.ndarray, unit_p: np.ndarray,
                    local: np.ndarray, pclass: np.ndarray, skip_local: bool) -> tuple:
    """For :func:`make_bundles`: (kept [Q] bool, demand [Q], consumer units, bounds [Q+1]), the units reading
    use ``use_ids[i]`` being ``units[bounds[i]:bounds[i + 1]]`` (ascending; lists). ``unit_p`` [Q]: each use's
    producer unit; ``local`` [Q]: the use stays inside one group; with ``skip_local`` such a use loses its
    readers in the producer's unit, takes their demand, and is not kept where it never moves data
    (:func:`always_local`)."""
    demand = tables.use_demand[use_ids].astype(np.int64)
    # every (use, consumer op) pair: the use's index into use_ids and the consumer's unit
    ptr = tables.use_consumer_ptr
    first, counts = ptr[use_ids], ptr[use_ids + 1] - ptr[use_ids]
    use_of = np.repeat(np.arange(use_ids.size), counts)
    consumer = tables.use_consumer_ops[np.arange(use_of.size) - np.repeat(np.cumsum(counts) - counts - first, counts)]
    consumer_unit = op_unit[consumer]
    keep = np.ones(use_ids.size, dtype=bool)
    if skip_local:
        # readers in the producer's own unit read it inside the task (no sync edge lies inside a unit)
        outside = ~(local[use_of] & (consumer_unit == unit_p[use_of]))
        use_of, consumer, consumer_unit = use_of[outside], consumer[outside], consumer_unit[outside]
        local_demand = np.full(use_ids.size, -1, dtype=np.int64)  # -1: no reader left
        np.maximum.at(local_demand, use_of, tables.op_demand[consumer].astype(np.int64))
        demand = np.where(local, local_demand, demand)
        keep = ~local | ((local_demand >= 0) & ~always_local(pclass, demand))
        kept = keep[use_of]
        use_of, consumer_unit = use_of[kept], consumer_unit[kept]
    span = int(consumer_unit.max()) + 2 if consumer_unit.size else 1  # units are >= NO_UNIT = -1
    unit_sets = np.unique(use_of * span + consumer_unit + 1)
    bounds = np.searchsorted(unit_sets // span, np.arange(use_ids.size + 1)).tolist()
    return keep, demand, (unit_sets % span - 1).tolist(), bounds


def _local_successors(graph: OpGraph, assignment: np.ndarray, op_unit: np.ndarray, num_units: int) -> list[tuple]:
    """[U] units of the same group that read an output of the unit (a dependency on the same device)."""
    src_unit, dst_unit = op_unit[graph.edge_src], op_unit[graph.edge_dst]
    keep = (src_unit >= 0) & (src_unit != dst_unit) & (assignment[graph.edge_src] == assignment[graph.edge_dst])
    pairs = np.unique(src_unit[keep] * num_units + dst_unit[keep])
    succ: list[list[int]] = [[] for _ in range(num_units)]
    for a, b in zip((pairs // num_units).tolist(), (pairs % num_units).tolist()):
        succ[a].append(b)
    return [tuple(s) for s in succ]


def _memory_columns(graph: OpGraph, op_unit: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Which op outputs are transient tensors, and the bytes of those read outside their unit, split into
    batch-scaled and fixed parts.

    Kept: outputs of forward and backward ops, except weight gradients (outputs read only by optimizer
    ops), which live in the persistent gradient buffer counted with the parameters. Optimizer updates
    are in place; input ops' outputs are persistent (parameters, states) or the batch. A kept output
    read only inside its own unit lives and dies within the unit's task and is not counted (at op
    granularity every read is outside the unit).
    """
    n = graph.num_ops
    src, dst = graph.edge_src, graph.edge_dst
    read_by_other = np.zeros(n, dtype=bool)
    read_by_other[src[graph.role[dst] != ROLE_OPTIMIZER]] = True
    worker = (graph.role != ROLE_INPUT) & (graph.role != ROLE_OPTIMIZER)
    kept = worker & (read_by_other | (graph.out_degree() == 0))
    external = graph.out_degree() == 0
    external[src[op_unit[src] != op_unit[dst]]] = True
    rows = graph.batch_scaled & (graph.split == SPLIT_CONCAT)
    out_rows = np.where(kept & external & rows, graph.output_bytes, 0.0)
    out_fixed = np.where(kept & external & ~rows, graph.output_bytes, 0.0)
    return kept, out_rows, out_fixed



def _boundary_chunks(graph: OpGraph, assignment: np.ndarray, worker: np.ndarray, part: np.ndarray,
                     position: np.ndarray, op_time: np.ndarray) -> np.ndarray:
    """[W] chunk of each worker op: each part (array ``part`` [W], numbered in a topological order of parts)
    cut, along a topological order of its ops, right after every op whose output another group reads and
    right before every op that reads a tensor of another group; ops of no time by ``op_time`` [N] right
    after an emitting op stay in its chunk, and an optimizer op whose reads from other groups are all of
    input tensors starts a chunk only once the chunk so far runs for OPTIMIZER_CHUNK_S (module docstring).
    Chunks are numbered part by part, in order, so the numbering stays topological."""
    src, dst = graph.edge_src, graph.edge_dst
    cross = assignment[src] != assignment[dst]
    emits = np.zeros(graph.num_ops, dtype=bool)
    emits[src[cross]] = True
    parameter_read = cross & (graph.role[src] == ROLE_INPUT) & (graph.role[dst] == ROLE_OPTIMIZER)
    reads = np.zeros(graph.num_ops, dtype=bool)
    reads[dst[cross & ~parameter_read]] = True
    order = np.lexsort((position[worker], part))  # by part, then topologically
    ops, parts = worker[order], part[order]
    part_start = np.ones(ops.size, dtype=bool)
    part_start[1:] = parts[1:] != parts[:-1]
    cut = reads[ops]  # cut[i]: a chunk starts at ops[i] (besides the first op of a part)
    # after an emitting op, the next op that takes time starts a chunk: ops of no time between them (views,
    # getitem) stay in the emitter's chunk, which ends when they do, so their outputs leave with its own
    index = np.arange(ops.size)
    timed = op_time[ops] > 0
    since = np.maximum.accumulate(np.where(timed | part_start | cut, index, 0))  # last timed op, start or cut
    since = np.r_[0, since[:-1]]  # ... before each op
    emitted = np.r_[0, np.cumsum(emits[ops])]  # emitted[i]: emitting ops before ops[i]
    cut |= timed & (emitted[:-1] > emitted[since])
    reader = np.zeros(graph.num_ops, dtype=bool)
    reader[dst[parameter_read]] = True
    reader = reader[ops] & ~cut  # may start a chunk: reads only parameters of other groups
    if reader.any():  # a scan with resets over the optimizer parts (a few thousand ops)
        run = 0.0  # seconds of the chunk so far
        for i in np.flatnonzero(graph.role[ops] == ROLE_OPTIMIZER).tolist():
            if cut[i] or part_start[i] or (reader[i] and run >= OPTIMIZER_CHUNK_S):
                cut[i] = True
                run = 0.0
            run += op_time[ops[i]]
    starts = cut | part_start
    chunk = np.empty(worker.size, dtype=np.int64)
    chunk[order] = np.cumsum(starts) - 1
    return chunk


def _pair_uses(producer_group: np.ndarray, consumer_group: np.ndarray) -> dict[tuple[int, int], np.ndarray]:
    """(P, C) -> use ids, pairs in order of their first use."""
    out: dict[tuple[int, int], list[int]] = {}
    for q, key in enumerate(zip(producer_group.tolist(), consumer_group.tolist())):
        out.setdefault(key, []).append(q)
    return {key: np.array(ids, dtype=np.int64) for key, ids in out.items()}


def _unit_labels(graph: OpGraph, granularity: str, unit_ops: list, unit_group: np.ndarray, unit_role: np.ndarray,
                 level: np.ndarray) -> list[str]:
    if granularity == "op":
        return [graph.names[int(ops[0])] for ops in unit_ops]
    labels, seen = [], {}
    for u, ops in enumerate(unit_ops):
        stem = f"G{int(unit_group[u])}{'IFBO'[int(unit_role[u])]}{int(level[ops[0]])}"
        chunk = seen.get(stem, 0)
        seen[stem] = chunk + 1
        labels.append(f"{stem}c{chunk}")
    return labels
