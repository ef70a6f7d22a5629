"""The search's evaluation path: a strategy → iteration time, peak memory and feedback, with no TaskGraph built.

MCTS evaluates thousands of strategies that differ from one another in a few groups' rows.
:func:`~tag.compiler.compile_strategy` rebuilds every task in Python each time. :class:`StrategyEvaluator`
cuts the TaskGraph that ``compile_strategy`` would build into **fragments** that each depend on one or two
groups' layouts:

- a *group fragment* per (group, layout): the group's compute tasks with their output tensors, the
  dependencies among them, and its persistent memory (parameters, gradients, Adam states);
- a *pair fragment* per (producer group P, consumer group C, layout of P, layout of C), for every pair of
  groups that exchange tensors: the transfers and collectives between them and the dependencies and
  tensors they add.

The modules of this path, one concern each:

- :mod:`tag.compiler.rules`: the insertion rules (bundle skeletons), shared with ``compile_strategy``;
- :mod:`tag.compiler.rows`: a replicated group's rows, shared with ``compile_strategy``;
- :mod:`tag.compiler.costs`: what a transfer, an all-reduce and a PS sync cost, shared with ``compile_strategy``;
- :mod:`tag.compiler.fragments`: the kernel that builds the pairs' own tasks;
- :mod:`tag.compiler.stores`: what the pair kernel reads, stored once (skeletons, bundles, blocks);
- :mod:`tag.compiler.arena`: where fragments live, references relative to the fragment;
- :mod:`tag.compiler.lookup`: group keys, previous-call and template look-ups;
- :mod:`tag.compiler.assemble`: one strategy's fragments laid out as ``compile_strategy`` lays out its tasks.

A replicated group's fragment, where chunks are not merged, is stored *compact* (its replicas' devices and
batch fractions; assembly computes its rows). A pair fragment's tasks take their group (the consumer's) from
the pair at assembly, so pairs of groups between replicated layouts whose fragments are equal share one:
the pairs of a *template* (the pair's bundles, the output ranks of its producer units, under PS its uses'
parameter servers, and the two layouts' rows; :meth:`StrategyEvaluator._new_pair_fragments`), as repeated
layers placed alike are. The new pairs of an evaluation are built in one call of the compiled kernel
:func:`~tag.compiler.fragments._pair_fragments`: each pair's transfers from bundle skeletons, then its
collectives, timed and given resources from a plan kept with each skeleton. A model-parallel side is one
more block to it (a task per piece, its units the pieces), with bundles made per pair of layouts by pieces;
model-parallel groups (their METIS pieces) go through the compiler's own Python
(``_Compiler.group_fragment``).

Inside a replicated group, where dependencies are ordinary (no merged chunks), a dependency between two of
its units that a longer path of its units implies is left out (``_local_dep``): it changes no start time
and feeds no feedback, so the results stay those of ``compile_strategy``'s TaskGraph, which lists it.

Where chunks are merged, fragments are stored with dependency and tensor lags (:class:`tag.sim.taskgraph.Lags`).
At ``"merged"`` granularity a group fragment's chunks are merged into one task per part and replica
(:func:`tag.sim.kernels.merge_chunks`, as :func:`tag.sim.merge_taskgraph` merges compile_strategy's TaskGraph),
and a pair fragment, built against the chunk tasks, is moved onto the merged ones
(:meth:`StrategyEvaluator._localize_pair`: references renumbered, lags from where each chunk lies in its task).
Merged tasks are numbered by their first chunk in both paths, so the layouts still match.

An evaluation looks up the fragments of the groups whose row changed since the previous call and of the
pairs touching them (search changes one group at a time); then assembly lays the fragments out as
``compile_strategy`` lays out its tasks (compute tasks group by group in topological order, every pair's
transfers, every pair's collectives; links numbered by first use) and the kernels of
:mod:`tag.sim.kernels` list-schedule them, sweep the memory and sum the feedback. The result equals
``simulate_fast(compile_strategy(...).taskgraph)`` bit for bit (times and memory; feedback up to the
order of float sums), so what the tests prove of that path — agreement with the op-level reference, the
batch-row checker — holds for this one (tests/test_compiler.py). What it costs: docs/benchmarks/simulator.md.
Horovod fusion (``fusion_bytes``) merges collectives across pairs, so it is not available here.
"""

from __future__ import annotations

from itertools import chain
from typing import Any

import numpy as np

from tag.cluster import Cluster
from tag.cost import CostModel
from tag.grouping import GroupGraph
from tag._arrays import csr_from_lists, grown
from tag.sim.kernels import int_table, list_schedule, merge_chunks, peak_memory, successor_lists, table_store
from tag.sim.result import SimulationResult, feedback_from_columns, result_from_schedule
from tag.sim.taskgraph import RES_COMM, RES_COMPUTE, RES_NIC_IN, RES_NIC_OUT, TASK_COMPUTE
from tag.strategy import BATCH_SPLITS, OPTIONS, PS, Strategy, device_group_sizes
from tag.compiler.arena import _ARENA_COLUMNS, _GROUP_COLUMNS, _PAIR_COLUMNS, _Arena, _Columns, _fragment_rows
from tag.compiler.assemble import _assemble, _Assembled, _resource_columns
from tag.compiler.cache import CompilerCache, cluster_context, compiler_tables
from tag.compiler.compile import ADAM_COPIES, _Compiler
from tag.compiler.errors import CompileError
from tag.compiler.fragments import _pair_fragments
from tag.compiler.layout import ClusterContext, GroupLayout, group_layouts
from tag.compiler.rows import _replica_fragments, unit_rows
from tag.compiler.lookup import (_changed_look_up, _group_keys, _implied_edges, _interned, _pair_look_up,
                                 _template_look_up)
from tag.compiler.stores import _BlockStore, _BundleStore, _GroupBlock, _PairBundles, _Skeletons
from tag.compiler.tables import GRANULARITIES, Bundle, CompilerTables

__all__ = ["StrategyEvaluator", "evaluate_strategy", "strategy_evaluator"]

# tasks the cached fragments stand for before the arena is emptied (~70 bytes each as rows, far less compact)
DEFAULT_MAX_CACHED_TASKS = 3_000_000
_ROW_BITS = 21  # a template's code: class << 2 * _ROW_BITS | P's row << _ROW_BITS | C's row
_CLASS_BITS = 63 - 2 * _ROW_BITS


class StrategyEvaluator:
    """Evaluates strategies for one (grouping, cluster, granularity, cost model), caching fragments.

    ``evaluator(strategy)`` returns the :class:`~tag.sim.SimulationResult` of
    ``simulate_fast(compile_strategy(group_graph, strategy, cluster, granularity=...).taskgraph)``, with
    task ids equal to that TaskGraph's. ``max_cached_tasks`` bounds the arena: past it, every fragment is
    dropped and rebuilt on demand. ``cache``: where the compiler's tables and the cluster's context are
    found or kept (:class:`~tag.compiler.cache.CompilerCache`; None: made for this evaluator alone).
    """

    def __init__(self, group_graph: GroupGraph, cluster: Cluster, *, granularity: str = "group",
                 cost: CostModel | None = None, max_cached_tasks: int = DEFAULT_MAX_CACHED_TASKS,
                 cache: CompilerCache | None = None) -> None:
        if granularity not in GRANULARITIES:
            raise CompileError(f"granularity must be one of {', '.join(map(repr, GRANULARITIES))}, got {granularity!r}")
        self.group_graph = group_graph
        self.cluster = cluster
        self.granularity = granularity
        cost = cost if cost is not None else group_graph.cost
        self.tables: CompilerTables = compiler_tables(group_graph, cluster, cost, granularity, cache=cache)
        self.context: ClusterContext = cluster_context(cluster, self.tables, cache=cache)
        self.max_cached_tasks = max_cached_tasks
        self._sizes = device_group_sizes(cluster)
        self._sizes_bytes = self._sizes.astype(np.int64).tobytes()  # what _check compares a strategy's sizes to
        self._capacity = cluster.memory_bytes()  # [D], every result's memory_capacity (read-only: shared)
        self._capacity.setflags(write=False)
        m = cluster.num_device_groups
        # [M] a placement row -> its bits, where a group's key (_group_keys) fits in an int64 (None: keys interned)
        wide = (1 << m) * len(OPTIONS) * len(BATCH_SPLITS) * group_graph.num_groups >= 1 << 63
        self._bits = None if wide else np.left_shift(1, np.arange(m, dtype=np.int64))
        pairs = list(self.tables.pair_uses)
        self._pairs = pairs  # [P] (producer group, consumer group), compile_strategy's order
        self._pair_p = np.array([p for p, _ in pairs], dtype=np.int64)  # [P]
        self._pair_c = np.array([c for _, c in pairs], dtype=np.int64)  # [P]
        self._group_order = self.tables.group_order.astype(np.int64)  # [G]
        self._cluster_arrays()
        unit_part = self.tables.unit_part
        self._merging = unit_part is not None  # chunks merged into one task per part and replica: lags
        self._num_merge_keys = (int(unit_part.max()) + 1 if unit_part is not None and unit_part.size else 0) * \
            cluster.num_devices
        self._unit_arrays()
        self._skeleton_compiler = self._compiler()  # makes model-parallel pairs' bundles (_static_bundles)
        self._kind_sets: dict[tuple, int] = {}  # the kinds of a pair's bundles, in order -> an id (_bundle_arrays)
        # templates of pair fragments (_new_pair_fragments): ids of layout rows and of pair classes
        self._row_ids: dict[tuple, int] = {}  # a layout's key less its group -> its row id (_row_of)
        self._row_layout: list[GroupLayout] = []  # [rows] a layout of each
        self._row_ps = np.zeros(0, dtype=np.bool_)  # [rows] whether its option is PS
        self._pair_class = np.full(len(pairs), -1, dtype=np.int64)  # [P] _pair_class_of without PS, -1 not yet
        self._ps_class: dict[tuple[int, int], int] = {}  # (pair, R) -> _pair_class_of under a PS consumer
        self._pair_uses: dict[int, tuple] = {}  # pair -> its uses as _pair_class_of keys them under a PS consumer
        self._class_ids: dict[tuple, int] = {}  # what a class holds -> its id
        self._clear()

    def _cluster_arrays(self) -> None:
        """What the kernels read of the cluster (resources, bandwidths, latencies, NICs) and of the uses."""
        cluster = self.cluster
        d, m = cluster.num_devices, cluster.num_machines
        self._link_base = 2 * d + 2 * m
        self._fixed_resources = np.array([RES_COMPUTE] * d + [RES_COMM] * d + [RES_NIC_OUT] * m + [RES_NIC_IN] * m,
                                         dtype=np.int8)
        self._fixed_a = np.array(list(range(d)) * 2 + list(range(m)) * 2, dtype=np.int64)
        context = self.context
        self._alpha = np.array(context.alpha, dtype=np.float64)  # [D, D]
        self._beta = np.array(context.beta, dtype=np.float64)  # [D, D] NIC-capped
        self._nic_out, self._nic_in = context.transfer_nic_out, context.transfer_nic_in  # [D, D] each, -1: none
        self._use_sync_index = self.tables.use_sync_index.astype(np.int64)  # [Q] PS round robin offset of each use
        self._use_bytes = self.tables.use_bytes.astype(np.float64)  # [Q]
        # what the pair kernel reads of the cluster and the uses (_pair_fragments' costs)
        self._costs = (self._alpha, self._beta, self._nic_out, self._nic_in, self._use_sync_index, self._use_bytes,
                       self._link_base, d)

    def _unit_arrays(self) -> None:
        """What the kernels read of each group's units: their positions, output ranks, the pairs of them that
        read each other (with the dependencies a longer path implies left out) and the persistent bytes."""
        rows = self._unit_rows = unit_rows(self.tables, self.context)
        self._unit_position, self._unit_ptr, self._unit_ids, self._unit_rank = rows[:4]
        self._local_ptr, self._local_src, self._local_dst = rows.local_ptr, rows.local_src, rows.local_dst
        # [L] whether each pair's dependency is written: one that a longer path of the group's units implies
        # (a -> b -> c implies a -> c, per replica) changes no start time (c's release is the latest finish of
        # its predecessors, and b finishes no earlier than a) and feeds no feedback (compute to compute), so it
        # is left out where dependencies are ordinary; merged chunks (lags) keep every one
        self._local_dep = np.ones(self._local_src.size, dtype=np.bool_)
        if not self._merging:
            for g in range(self.group_graph.num_groups):
                begin, end = self._local_ptr[g], self._local_ptr[g + 1]
                units = int(self._unit_ptr[g + 1] - self._unit_ptr[g])
                self._local_dep[begin:end] = ~_implied_edges(units, self._local_src[begin:end],
                                                             self._local_dst[begin:end])
        self._persistent = ADAM_COPIES * np.asarray(self.tables.group_param_bytes, dtype=np.float64)  # [G]
        self._unit_columns = (self.context.type_array, self._unit_ptr, self._unit_ids, self._unit_rank,
                              self.tables.unit_time_fixed, self.tables.unit_time_scaled, self.tables.unit_out_rows,
                              self.tables.unit_out_fixed, self._local_ptr, self._local_src, self._local_dst,
                              self._local_dep, self._persistent)  # what assembly reads of the units (_assemble)

    def _clear(self) -> None:
        self._arena = _Arena(self._merging)
        self._group_table = int_table()  # a group's key (_group_keys) -> its group fragment's id
        self._num_group_fragments = 0
        self._wide_keys: dict[tuple, int] = {}  # (group, row as bytes, option, split) -> key, without _bits
        self._pair_table = int_table()  # (group fragment of P) << 32 | (of C) -> the pair fragment's id
        self._templates = int_table()  # template (class, P's row, C's row as bits) -> the pair fragment's id
        self._layout_of: list[GroupLayout | None] = []  # fragment id -> its group's layout (None: a pair fragment)
        self._merged_blocks: dict[int, _GroupBlock] = {}  # group fragment id -> its block, where chunks are merged
        self._skeletons = _Skeletons(self.cluster.num_devices)
        self._skeleton_lists: dict[tuple, list] = {}  # (kind set, P's row, C's row) -> _pair_skeletons' list
        self._new_lists: list[list] = []  # lists made since the last _store_new_lists
        # each skeleton list's rows in the skeleton store, one list after another (a list keeps its first)
        self._list_rows = _Columns({"row": (np.int64, "row")})
        self._pair_static: dict[tuple[int, int], _PairBundles] = {}  # replicated pairs' bundles (in the store)
        self._bundles = _BundleStore()  # every pair's bundles, model-parallel pairs' once per build
        self._blocks = _BlockStore(self.cluster.num_devices)  # group fragments' blocks, for pair fragments
        empty = np.zeros(0, dtype=np.int64)  # no previous call
        self._last_ids = (empty, empty)  # ([G] group, [P] pair fragments) of the previous call
        self._last_groups = (empty, empty)  # ([G] keys, [G] group fragments) of the previous call

    # ------------------------------------------------------------------ evaluation
    def __call__(self, strategy: Strategy, *, feedback: bool = True, raise_on_oom: bool = False) -> SimulationResult:
        """Simulate ``strategy`` (see the class docstring); ``feedback=False`` skips Table 1's feedback,
        ``raise_on_oom`` raises :class:`~tag.sim.OOMError` for a device over its memory."""
        self._check(strategy)
        bound = self.max_cached_tasks
        if (self._arena.cached_tasks > bound or self._skeletons.size["transfer"] > bound
                or self._bundles.size["bundle"] > bound):
            self._clear()
            self.context.plans.clear()  # the model-parallel pairs' bundles the compiler cached for these fragments
        group_ids = self._group_fragment_ids(strategy)
        pair_ids = self._pair_fragment_ids(group_ids)
        columns = self._assemble(group_ids, pair_ids)
        # duplicates kept: list scheduling does not mind them, and the feedback merges the few it reads
        succ_ptr, succ, succ_lag, indegree = successor_lists(columns.duration.size, columns.dep_task, columns.dep_on,
                                                             columns.dep_lag)
        num_resources = self._link_base + columns.link_dense.size
        start, finish = list_schedule(columns.duration, columns.res_ptr, columns.res, succ_ptr, succ, succ_lag,
                                      indegree, num_resources)
        peak = self._peak_memory(columns, start, finish)
        return result_from_schedule(
            self.cluster, start, finish, peak,
            lambda: self._feedback(columns, succ_ptr, succ, succ_lag, start, finish, peak) if feedback else None,
            raise_on_oom=raise_on_oom, capacity=self._capacity)

    def cached_fragments(self) -> tuple[int, int]:
        """(group fragments, pair fragments) the evaluator holds now, each built once (pairs of groups alike
        share a pair fragment: :meth:`_new_pair_fragments`; ``max_cached_tasks`` bounds their tasks)."""
        groups = self._num_group_fragments
        return groups, self._arena.num_fragments - groups

    def _check(self, strategy: Strategy) -> None:
        if not isinstance(strategy, Strategy):
            raise CompileError(f"expected a Strategy, got {type(strategy).__name__}")
        if strategy.num_groups != self.group_graph.num_groups:
            raise CompileError(f"the strategy has {strategy.num_groups} op groups but the grouping has "
                               f"{self.group_graph.num_groups}")
        if strategy.device_group_sizes.tobytes() != self._sizes_bytes:
            raise CompileError(f"the strategy is for device groups of {strategy.device_group_sizes.tolist()} "
                               f"devices, but cluster {self.cluster.name!r} has {self._sizes.tolist()}")

    def _group_keys(self, strategy: Strategy) -> np.ndarray:
        """[G] a key of each group's (group, placement row, option, batch split), one int64 each: the row's bits,
        option, split and group in one number where they fit, else interned."""
        split = BATCH_SPLITS.index(strategy.batch_split)
        if self._bits is not None:
            return _group_keys(strategy.placement, strategy.option, split, len(OPTIONS), len(BATCH_SPLITS))
        keys = self._wide_keys
        return np.array([keys.setdefault((k, row.tobytes(), option, split), len(keys))
                         for k, (row, option) in enumerate(zip(strategy.placement, strategy.option.tolist()))],
                        dtype=np.int64)

    def _group_fragment_ids(self, strategy: Strategy) -> np.ndarray:
        """[G] group fragment of each group under ``strategy`` (compiled on a miss); only the groups whose key
        (:meth:`_group_keys`) changed since the previous call are looked up, all at once."""
        keys = self._group_keys(strategy)
        last_keys, last_ids = self._last_groups
        ids = _changed_look_up(keys, last_keys, last_ids, self._group_table)
        missed = np.flatnonzero(ids < 0)
        if missed.size:
            replicated = []  # (group, layout) of the new replicated layouts, built at once below
            groups = missed.tolist()
            for g, layout in zip(groups, group_layouts(self.tables, self.context, strategy, groups)):
                if layout.model_parallel:
                    ids[g] = self._compile_model_parallel(layout)
                else:
                    replicated.append((g, layout))
            if replicated:
                ids[[g for g, _ in replicated]] = self._compile_replicated([layout for _, layout in replicated])
            table_store(self._group_table, keys[missed], ids[missed])
            self._num_group_fragments += missed.size
        self._last_groups = (keys, ids)
        return ids

    def _pair_fragment_ids(self, groups: np.ndarray) -> np.ndarray:
        """[P] pair fragment of each pair of groups, given the groups' fragments [G] (compiled on a miss). Only
        the pairs of groups whose fragment changed since the previous call are looked up (search changes a few
        groups at a time)."""
        last_groups, last_ids = self._last_ids
        # a pair's key: its two group fragments (P's in the high 32 bits)
        ids, codes = _pair_look_up(groups, last_groups, last_ids, self._pair_p, self._pair_c, self._pair_table)
        pairs = np.flatnonzero(ids < 0)
        if pairs.size:
            fragments = self._new_pair_fragments(pairs, groups[self._pair_p[pairs]], groups[self._pair_c[pairs]])
            ids[pairs] = fragments
            table_store(self._pair_table, codes[pairs], fragments)
        self._last_ids = (groups, ids)
        return ids

    def _new_pair_fragments(self, pairs: np.ndarray, fragments_p: np.ndarray, fragments_c: np.ndarray) -> np.ndarray:
        """[M] pair fragment of the pairs of groups ``pairs`` [M] between the group fragments ``fragments_p``
        and ``fragments_c`` [M], which the pair table does not hold. A pair between two replicated layouts
        (where chunks are not merged) has a *template*: its class (:meth:`_pair_class_of`) and the two
        layouts' rows, options and batch split (:meth:`_row_of`). Pairs of one template have equal
        fragments, task and tensor references being relative to the pair's blocks and tasks taking their
        group from the pair at assembly, so the first one built serves them all (templates are looked up
        all at once, :func:`_template_look_up`). The rest are built: the skeletons of each first, stored in one
        go, then the fragments, in pair order, by one :meth:`_compile_pairs`."""
        template = self._blocks.view("template")
        row_p, row_c = template[fragments_p], template[fragments_c]  # [M] -1: no template
        templated = (row_p >= 0) & (row_c >= 0)
        classes = np.where(templated, self._pair_class[pairs], -1)
        if templated.any():  # a pair's first replicated layouts, and every PS consumer (servers by P's replicas)
            for i in np.flatnonzero(templated & ((classes < 0) | self._row_ps[np.where(templated, row_c, 0)])).tolist():
                classes[i] = self._pair_class_of(int(pairs[i]), int(row_p[i]), int(row_c[i]))
        # past the class ids a code holds (-1): built
        out, build, leader, codes = _template_look_up(row_p, row_c, classes, self._templates, _ROW_BITS)
        if build.size == 0:
            return out
        built_p, built_c = fragments_p[build], fragments_c[build]
        self._prepare_dynamic_bundles(built_p, built_c)
        prepared = [self._pair_skeletons(p, c) for p, c in zip(built_p.tolist(), built_c.tolist())]
        self._store_new_lists()  # skeleton lists not stored yet (pairs of repeated layers share one)
        out[build] = self._compile_pairs(built_p, built_c, prepared)
        served = np.flatnonzero(leader >= 0)  # the pairs of new templates: each takes its leader's fragment
        out[served] = out[leader[served]]
        leaders = served[leader[served] == served]
        table_store(self._templates, codes[leaders], out[leaders])
        return out

    def _row_of(self, layout: GroupLayout) -> int:
        """The id of a replicated layout's row, option and batch split (its key less the group), for
        templates (:meth:`_new_pair_fragments`); -1 past the ids a template code holds."""
        row = _interned(self._row_ids, layout.key[1:], _ROW_BITS)
        if row == len(self._row_layout):  # a new row
            self._row_ps = grown(self._row_ps, row + 1, False)
            self._row_ps[row] = layout.option == PS
            self._row_layout.append(layout)
        return row

    def _pair_class_of(self, k: int, row_p: int, row_c: int) -> int:
        """The class of pair ``k`` of groups between replicated layouts of the rows ``row_p`` and ``row_c``
        (:meth:`_row_of`): equal for pairs whose fragments are equal between layouts of the same rows.
        It holds whether P is C, the bundles as :meth:`_bundle_arrays` gives them and the rank of each
        producer unit among P's units that output, which numbers the tensors the pair reads (its other
        references into the blocks do not depend on the blocks' sizes); cached per pair. Under a PS consumer
        it also holds, per use, its bytes and the index of its parameter server among P's R devices (the
        consumer group plus the use's round-robin index, modulo R: :func:`ps_seconds`); cached per pair and
        R. -1 past the ids a template code holds."""
        found = int(self._pair_class[k])
        if found < 0:
            p, c = self._pairs[k]
            static = self._static_bundles((p, c), self._row_layout[row_p], self._row_layout[row_c])
            units = static.unit  # P's units as bundle producers (-1: input ops): the ranks of their outputs
            ranks = self._unit_rank[self._unit_ptr[p] + units[units >= 0]]
            key = (p == c, ranks.tobytes(), static.kind_set,
                   *(a.tobytes() for a in (static.unit, static.category, static.consumer_ptr, static.consumer,
                                           static.nbytes, static.count, static.kind_of)))
            found = _interned(self._class_ids, key, _CLASS_BITS)
            self._pair_class[k] = found
        if found < 0 or not self._row_ps[row_c]:
            return found
        r = len(self._row_layout[row_p].devices)
        ps = self._ps_class.get((k, r))
        if ps is None:
            uses = self._pair_uses.get(k)
            if uses is None:  # [uses] server offset, then the bytes and first use of each category as bytes
                bundles = self.tables.bundles.get(self._pairs[k], [])
                ptr, flat = csr_from_lists([qs for b in bundles for qs in b.uses])  # every bundle's into C
                uses = self._pair_uses[k] = (self._pairs[k][1] + self.tables.use_sync_index[flat],
                                             self.tables.use_bytes[flat].tobytes() + ptr.tobytes())
            ps = self._ps_class[(k, r)] = _interned(self._class_ids, (found, (uses[0] % r).tobytes(), uses[1]),
                                                    _CLASS_BITS)
        return ps

    def _compiler(self) -> _Compiler:
        return _Compiler(self.tables, self.context, None, None, dense_links=True)

    def _compile_model_parallel(self, layout: GroupLayout) -> int:
        """The group fragment of a model-parallel layout (pieces by METIS): the compiler's own code."""
        compiler = self._compiler()
        block = compiler.group_fragment(layout)
        rows = self._compiler_rows(compiler)
        tasks = len(compiler.kind)
        merged, new_id, start_lag, end_lag = self._merge_group(rows, np.full(tasks, -1, dtype=np.int64))
        num_merged = len(merged["duration"])
        fragment = self._arena.add(merged, (0, 0, 0, 0), num_merged)
        first_piece = self.tables.piece_unit(layout.group, 0)
        pieces = range(first_piece, first_piece + len(layout.pieces))
        piece_device = np.array([piece.device for piece in layout.pieces], dtype=np.int64)
        tensor_first = np.array([block[1].get(unit, -1) for unit in pieces], dtype=np.int64)
        assert fragment == len(self._layout_of), "fragment ids and recorded layouts out of step"
        self._blocks.add(fragment, True, np.ones(1, dtype=np.int64), np.array([block[2]]), np.array([block[3]]),
                         piece_device, np.array([piece_device.size]), tensor_first, np.array([tensor_first.size]),
                         np.full((1, self.cluster.num_devices), -1, dtype=np.int64), -1)
        self._layout_of.append(layout)
        if self._merging:
            self._merged_blocks[fragment] = _GroupBlock(num_merged, new_id, start_lag, end_lag)
        return fragment

    def _compile_replicated(self, layouts: list[GroupLayout]) -> list[int]:
        """The group fragments of F replicated layouts, returning their ids. One call of
        :func:`_replica_fragments` counts their rows as ``_Compiler.group_fragment`` builds each (compute tasks
        unit-major then replica, their output tensors, the dependencies among them, the persistent memory).
        Where chunks are not merged they are stored compact (each replica's device and batch fraction:
        :func:`_assemble` lists the rows); where they are, their rows are built, merged and queued."""
        groups = np.array([layout.group for layout in layouts], dtype=np.int64)  # [F]
        device_ptr, device_list = csr_from_lists([layout.devices for layout in layouts])
        fractions = np.fromiter(chain.from_iterable(layout.fraction for layout in layouts), dtype=np.float64,
                                count=device_ptr[-1])
        (res, duration, dep_task, dep_on, tensor_device, tensor_bytes, tensor_producer, tensor_persistent,
         read_tensor, read_task, tensor_first, index, counts) = _replica_fragments(
            groups, device_ptr, device_list, fractions, self._unit_ptr, self._unit_ids, self._unit_rank,
            self.tables.unit_out_rows, self.tables.unit_out_fixed, self._local_ptr, self._local_src, self._local_dst,
            self._local_dep, self._persistent, self.cluster.num_devices, self._merging, self._unit_rows.times)
        ends = np.cumsum(counts[:, :5], axis=0)
        units = self._unit_ptr[groups + 1] - self._unit_ptr[groups]  # [F]
        replicas = np.diff(device_ptr)
        # the ids the arena gives next; templates only where the fragments are compact
        assert self._arena.num_fragments == len(self._layout_of), "fragment ids and recorded layouts out of step"
        if self._merging:
            template_rows = -1
        else:  # layouts of one row (a default fill lays every group out alike) asked once
            row_ids: dict[tuple, int] = {}
            template_rows = []
            for layout in layouts:
                row = row_ids.get(layout.key[1:])
                if row is None:
                    row = row_ids[layout.key[1:]] = self._row_of(layout)
                template_rows.append(row)
        self._blocks.add(self._arena.num_fragments, False, replicas, counts[:, 0], counts[:, 5],
                         device_list, replicas, tensor_first, units, index, template_rows)
        if not self._merging:  # compact: _assemble computes the rows from the layouts' devices and fractions
            first = self._arena.add_compact(groups, replicas, device_list, fractions, counts[:, :5])
            self._layout_of += layouts
            return list(range(first, first + len(layouts)))
        rows = {"duration": duration, "kind": TASK_COMPUTE, "nres": 1, "res": res,
                "dep_task": dep_task, "dep_on": dep_on, "tensor_device": tensor_device,
                "tensor_bytes": tensor_bytes, "tensor_producer": tensor_producer,
                "tensor_persistent": tensor_persistent, "read_tensor": read_tensor, "read_task": read_task}
        fragments = []
        for f, layout in enumerate(layouts):  # each fragment's chunks merged on its own
            one = _fragment_rows(rows, _GROUP_COLUMNS, counts, ends, f)
            part = self.tables.unit_part[self.tables.group_units[layout.group]]
            merge_key = (part[:, None] * self.cluster.num_devices + np.asarray(layout.devices)).reshape(-1)
            one, new_id, start_lag, end_lag = self._merge_group(one, merge_key)
            merged = len(one["duration"])
            fragments.append(self._arena.add(one, (0, 0, 0, 0), merged))
            self._layout_of.append(layout)
            self._merged_blocks[fragments[-1]] = _GroupBlock(merged, new_id, start_lag, end_lag)
        return fragments

    def _merge_group(self, rows: dict, merge_key: np.ndarray) -> tuple[dict, Any, Any, Any]:
        """A group fragment's rows with the chunks of each part merged (:func:`tag.sim.kernels.merge_chunks`,
        as compile_strategy merges the whole TaskGraph) and lags on its dependencies, tensors and reads.
        Returns (rows, merged task [T], start lag [T] and end lag [T] of each chunk task). Where no chunks are
        merged (every granularity but ``"merged"``) the tasks stay as they are and the lags, never read
        (:func:`_assemble`), are left out: (rows, None, None, None); the arena drops a dependency of a task on
        itself as it stores them."""
        if not self._merging:
            return rows, None, None, None
        duration = np.asarray(rows["duration"], dtype=np.float64)
        tasks = duration.size
        nres = np.broadcast_to(np.asarray(rows["nres"], dtype=np.int64), tasks)  # a column may be one value
        res_ptr = np.zeros(tasks + 1, dtype=np.int64)
        np.cumsum(nres, out=res_ptr[1:])
        (new_id, start_lag, end_lag, _, m_duration, kind, _, m_res_ptr, res, dep_task, dep_on, dep_lag, producer,
         alloc_lag, free_lag, read_task, read_lag) = merge_chunks(  # groups: given at assembly
            merge_key, self._num_merge_keys, duration, np.full(tasks, rows["kind"], dtype=np.int8),
            np.zeros(tasks, dtype=np.int64), res_ptr, np.asarray(rows["res"], dtype=np.int64),
            np.asarray(rows["dep_task"], dtype=np.int64), np.asarray(rows["dep_on"], dtype=np.int64),
            np.asarray(rows["tensor_producer"], dtype=np.int64), np.asarray(rows["read_tensor"], dtype=np.int64),
            np.asarray(rows["read_task"], dtype=np.int64))
        merged = {
            "duration": m_duration, "kind": kind, "nres": np.diff(m_res_ptr), "res": res,
            "dep_task": dep_task, "dep_on": dep_on, "dep_lag": dep_lag, "tensor_device": rows["tensor_device"],
            "tensor_bytes": rows["tensor_bytes"], "tensor_producer": producer, "alloc_lag": alloc_lag,
            "free_lag": free_lag, "tensor_persistent": rows["tensor_persistent"], "read_tensor": rows["read_tensor"],
            "read_task": read_task, "read_lag": read_lag,
        }
        return merged, new_id, start_lag, end_lag

    def _localize_pair(self, rows: dict, block_p: _GroupBlock, block_c: _GroupBlock, same: bool,
                       tensors: tuple[int, int]) -> tuple[dict, tuple]:
        """A pair fragment's rows, built against P's and C's chunk tasks, moved onto their merged tasks (chunks
        are merged): task references renumbered, lags computed (as :func:`tag.sim.kernels.merge_chunks`
        computes them), the dependencies inside one merged task dropped. Returns (rows, blocks for the fragment
        table: P's and C's merged tasks, then ``tensors``, the tensors they number)."""
        blocks = (block_p.merged, 0 if same else block_c.merged, *tensors)
        own = len(rows["duration"])
        duration = np.asarray(rows["duration"], dtype=np.float64)
        parts_new = [block_p.new_id]
        starts = [block_p.start_lag]
        ends = [block_p.end_lag]
        base = block_p.merged
        if not same:
            parts_new.append(base + block_c.new_id)
            starts.append(block_c.start_lag)
            ends.append(block_c.end_lag)
            base += block_c.merged
        parts_new.append(base + np.arange(own))
        starts.append(np.zeros(own))
        ends.append(duration)
        new_ref = np.concatenate(parts_new)  # [references] chunk-level reference -> merged reference
        start_lag = np.concatenate(starts)
        end_lag = np.concatenate(ends)
        dep_task = np.asarray(rows["dep_task"], dtype=np.int64)
        dep_on = np.asarray(rows["dep_on"], dtype=np.int64)
        keep = new_ref[dep_task] != new_ref[dep_on]
        dep_task, dep_on = dep_task[keep], dep_on[keep]
        producer = np.asarray(rows["tensor_producer"], dtype=np.int64)
        read_task = np.asarray(rows["read_task"], dtype=np.int64)
        rows.update(
            dep_task=new_ref[dep_task], dep_on=new_ref[dep_on],
            dep_lag=np.maximum(0.0, end_lag[dep_on] - start_lag[dep_task]),
            tensor_producer=np.where(producer >= 0, new_ref[np.maximum(producer, 0)], -1),
            alloc_lag=np.where(producer >= 0, start_lag[np.maximum(producer, 0)], 0.0),
            free_lag=np.where(producer >= 0, end_lag[np.maximum(producer, 0)], 0.0),
            read_task=new_ref[read_task], read_lag=end_lag[read_task],
        )
        return rows, blocks

    def _compile_pairs(self, fragment_p: np.ndarray, fragment_c: np.ndarray, prepared: list[tuple]) -> list[int]:
        """The pair fragments of M pairs of group fragments (P's ``fragment_p`` [M], C's ``fragment_c`` [M]), from
        their :meth:`_pair_skeletons` (skeletons stored), built by one call of :func:`_pair_fragments` and
        stored in the arena at once (queued where chunks are merged); returns their ids. The kernel reads the
        blocks, bundles, skeletons (with their collectives' plans) and skeleton lists from the evaluator's
        stores."""
        # [4, M] (rows contiguous) each pair's bundles in the bundle store, its first row in the list store, and
        # its consumer group (a PS sync's server is chosen by it; -1: no bundles)
        first_bundle, bundle_end, list_first, consumer_group = np.array(
            [(static.first, static.first + static.unit.size, found[1],
              static.bundles[0].consumer_group if static.bundles else -1) for static, found in prepared],
            dtype=np.int64).T.copy()
        tasks, tensors = self._blocks.whole(("tasks", "tensors"))
        same = fragment_p == fragment_c  # a group's pair with itself (a group fragment is of one group)
        blocks = np.empty((fragment_p.size, 4), dtype=np.int64)  # P's tasks, C's (0: P's), P's tensors, C's
        blocks[:, 0], blocks[:, 1] = tasks[fragment_p], tasks[fragment_c]
        blocks[:, 2], blocks[:, 3] = tensors[fragment_p], tensors[fragment_c]
        blocks[same, 1] = blocks[same, 3] = 0
        c_shift = np.where(same, 0, blocks[:, 0])  # where C's block starts in the pair's numbering
        first_task, first_tensor = blocks[:, 0] + blocks[:, 1], blocks[:, 2] + blocks[:, 3]
        (duration, kind, nres, res, dep_task, dep_on, tensor_device, tensor_bytes, tensor_producer, read_tensor,
         read_task, counts) = _pair_fragments(
            (fragment_p, fragment_c, c_shift, first_task, first_tensor, consumer_group, first_bundle, bundle_end,
             list_first), self._bundles.arrays(), self._list_rows.whole(("row",))[0], self._skeletons.arrays(),
            self._blocks.arrays(), self._costs)
        self._layout_of += [None] * fragment_p.size
        if not self._merging:  # stored at once: the kernel makes no dependency of a task on itself
            # contiguous columns: a strided one (M > 1) and a contiguous one (M = 1) are two numba signatures
            first = self._arena.store_many((duration, kind, nres, res, dep_task, dep_on, tensor_device, tensor_bytes,
                                            tensor_producer, read_tensor, read_task), blocks,
                                           np.ascontiguousarray(counts[:, 5]), np.ascontiguousarray(counts[:, :5]))
            return list(range(first, first + fragment_p.size))
        rows = {"duration": duration, "kind": kind, "nres": nres, "res": res, "dep_task": dep_task, "dep_on": dep_on,
                "tensor_device": tensor_device, "tensor_bytes": tensor_bytes, "tensor_producer": tensor_producer,
                "tensor_persistent": False, "read_tensor": read_tensor, "read_task": read_task}
        # merged chunks: each fragment moves onto its blocks' merged tasks on its own
        ends = np.cumsum(counts[:, :5], axis=0)
        fragments = []
        for m, (p, c) in enumerate(zip(fragment_p.tolist(), fragment_c.tolist())):
            one = _fragment_rows(rows, _PAIR_COLUMNS, counts, ends, m)
            one, merged_blocks = self._localize_pair(one, self._merged_blocks[p], self._merged_blocks[c], bool(same[m]),
                                                     (int(blocks[m, 2]), int(blocks[m, 3])))
            fragments.append(self._arena.add(one, merged_blocks, int(counts[m, 5])))
        return fragments

    def _pair_skeletons(self, fragment_p: int, fragment_c: int) -> tuple[_PairBundles, list]:
        """What a pair fragment is made from: the bundles as arrays (:meth:`_bundle_arrays`) and the skeleton
        of each kind of bundle, as [their rows in the skeleton store, the first of them in the list store (None
        until stored)]. A skeleton depends on a bundle only through its kind, so pairs with the same kinds of
        bundles (repeated layers) between layouts of the same rows share the list. New lists are kept in
        ``self._new_lists`` and new skeletons queued in the store (:meth:`_Skeletons.row`) for
        :meth:`_store_new_lists`."""
        layout_p, layout_c = self._layout_of[fragment_p], self._layout_of[fragment_c]
        static = self._static_bundles((layout_p.group, layout_c.group), layout_p, layout_c)
        key = (static.kind_set, layout_p.key[1:], layout_c.key[1:])
        found = self._skeleton_lists.get(key)
        if found is None:
            first_piece = self.tables.piece_unit(layout_c.group, 0) if layout_c.model_parallel else 0
            row = self._skeletons.row
            found = self._skeleton_lists[key] = [[row(b, layout_p, layout_c, first_piece)
                                                  for b in static.representatives], None]
            self._new_lists.append(found)
        return static, found

    def _store_new_lists(self) -> None:
        """Make the queued skeletons, then store the new lists' rows in one go."""
        new = self._new_lists
        if not new:
            return
        self._new_lists = []
        self._skeletons.build(self._beta, self.context)
        rows = np.fromiter(chain.from_iterable(found[0] for found in new), dtype=np.int64)
        start = self._list_rows.extend({"row": rows}, {"row": rows.size})["row"]
        for found in new:
            found[1] = start
            start += len(found[0])

    def _prepare_dynamic_bundles(self, fragments_p: np.ndarray, fragments_c: np.ndarray) -> None:
        """Make the bundles of the pairs of group fragments (``fragments_p`` [M], ``fragments_c`` [M]) with a
        model-parallel side in one go (``_Compiler.dynamic_bundles``), for :meth:`_static_bundles` to find
        cached."""
        mp = self._blocks.view("mp")
        chosen = np.flatnonzero(mp[fragments_p] | mp[fragments_c])
        if chosen.size == 0:
            return
        layouts = {}
        pairs = []
        for p, c in zip(fragments_p[chosen].tolist(), fragments_c[chosen].tolist()):
            layout_p, layout_c = self._layout_of[p], self._layout_of[c]
            layouts[layout_p.group], layouts[layout_c.group] = layout_p, layout_c
            pairs.append((layout_p.group, layout_c.group))
        compiler = self._skeleton_compiler
        compiler.layouts = layouts
        compiler.dynamic_bundles(pairs, None, {g: layout.model_parallel for g, layout in layouts.items()})

    def _static_bundles(self, pair: tuple[int, int], layout_p: GroupLayout, layout_c: GroupLayout) -> _PairBundles:
        """:meth:`_bundle_arrays` of the bundles of ``pair`` of groups between two layouts: cached per pair
        where both are replicated (the bundles then follow from the groups alone), made by the skeleton
        compiler by pieces where a side is model-parallel."""
        mp = layout_p.model_parallel or layout_c.model_parallel
        static = None if mp else self._pair_static.get(pair)
        if static is None:
            if mp:
                compiler = self._skeleton_compiler
                compiler.layouts = {layout_p.group: layout_p, layout_c.group: layout_c}
                bundles = compiler.dynamic_bundles([pair], None, {g: layout.model_parallel
                                                                  for g, layout in compiler.layouts.items()})[0]
                static = self._bundle_arrays(bundles, layout_p, layout_c)
            else:
                static = self._pair_static[pair] = self._bundle_arrays(self.tables.bundles.get(pair, []), layout_p,
                                                                       layout_c)
        return static

    def _bundle_arrays(self, bundles: list, layout_p: GroupLayout, layout_c: GroupLayout) -> _PairBundles:
        """Bundles of a pair of groups as arrays (:class:`_PairBundles`), stored in the bundle store for
        :func:`_pair_fragments`. Bundles of one kind
        share a skeleton (``_Compiler._skeleton``): same categories and producer device, and into a
        model-parallel consumer, the same consumer units."""
        position = self._unit_position

        def index_of(layout: GroupLayout):
            if layout.model_parallel:
                first_piece = self.tables.piece_unit(layout.group, 0)
                return lambda unit: unit - first_piece
            return position.__getitem__

        index_p, index_c = index_of(layout_p), index_of(layout_c)
        producer = np.fromiter((b.producer_unit for b in bundles), dtype=np.int64, count=len(bundles))
        unit = np.where(producer >= 0, index_p(np.maximum(producer, 0)), -1)
        category, category_count = csr_from_lists([b.count for b in bundles])
        consumer_ptr, consumer = csr_from_lists([b.consumer_units for b in bundles])
        consumer = index_c(consumer)
        category_bytes = np.array([x for b in bundles for x in b.nbytes], dtype=np.float64)
        mp_c = layout_c.model_parallel
        kinds: dict[tuple, int] = {}
        representatives: list[Bundle] = []
        kind_of = np.empty(len(bundles), dtype=np.int64)  # [B]
        for i, b in enumerate(bundles):
            key = (b.pclass, b.demand, b.producer_device, b.consumer_units if mp_c else None)
            kind = kinds.get(key)
            if kind is None:
                kind = kinds[key] = len(representatives)
                representatives.append(b)
            kind_of[i] = kind
        kind_set = self._kind_sets.setdefault(tuple(kinds), len(self._kind_sets))
        use_ptr, uses = csr_from_lists([qs for b in bundles for qs in b.uses])
        first = self._bundles.add(unit, category, consumer_ptr, consumer, category_bytes, category_count, kind_of,
                                  use_ptr, uses)
        return _PairBundles(bundles, unit, category, consumer_ptr, consumer, category_bytes, category_count, kind_of,
                            representatives, kind_set, first)

    @staticmethod
    def _compiler_rows(compiler: _Compiler) -> dict:
        """The compiler's columns (its own tasks and tensors) and its references, as fragment rows."""
        return {
            "duration": compiler.duration, "kind": compiler.kind,
            "nres": [len(r) for r in compiler.res], "res": [r for held in compiler.res for r in held],
            "dep_task": compiler.dep_task, "dep_on": compiler.dep_on, "tensor_device": compiler.tensor_device,
            "tensor_bytes": compiler.tensor_bytes, "tensor_producer": compiler.tensor_producer,
            "tensor_persistent": compiler.tensor_persistent, "read_tensor": compiler.read_tensor,
            "read_task": compiler.read_task,
        }

    # ------------------------------------------------------------------ assembly, memory, feedback
    def _assemble(self, group_ids: np.ndarray, pair_ids: np.ndarray) -> _Assembled:
        arena = self._arena
        arena.flush()
        out = _assemble((arena.meta[:arena.stored], self._group_order, group_ids, pair_ids, self._pair_p, self._pair_c),
                        arena.whole(_ARENA_COLUMNS), arena.compact.whole(("device", "fraction")), self._unit_columns,
                        self._merging, self._link_base, self.cluster.num_devices)
        return _Assembled(*out)

    def _peak_memory(self, columns: _Assembled, start: np.ndarray, finish: np.ndarray) -> np.ndarray:
        return peak_memory(self.cluster.num_devices, columns.tensor_device, columns.tensor_bytes,
                           columns.tensor_persistent, columns.tensor_producer, columns.alloc_lag, columns.free_lag,
                           columns.read_tensor, columns.read_task, columns.read_lag, start, finish)

    def _feedback(self, columns: _Assembled, succ_ptr: np.ndarray, succ: np.ndarray, succ_lag: np.ndarray,
                  start: np.ndarray, finish: np.ndarray, peak: np.ndarray):
        resource_kind, resource_a, resource_b = _resource_columns(self._fixed_resources, self._fixed_a,
                                                                  columns.link_dense, self.cluster.num_devices)
        return feedback_from_columns(self.cluster, self.group_graph.num_groups, columns.group, columns.kind,
                                     columns.duration, columns.res_ptr, columns.res, resource_kind, resource_a,
                                     resource_b, succ_ptr, succ, succ_lag, start, finish, peak, by_predecessor=True)


# ------------------------------------------------------------------------------------------------ entry points


def strategy_evaluator(group_graph: GroupGraph, cluster: Cluster, *, granularity: str = "group",
                       cost: CostModel | None = None, cache: CompilerCache | None = None) -> StrategyEvaluator:
    """The :class:`StrategyEvaluator` of (grouping, cluster, granularity, cost model): ``cache``'s, made and kept
    there on a miss (None: a new one, kept nowhere)."""
    key = (id(group_graph), id(cluster), granularity, cost)
    evaluator = None if cache is None else cache.evaluators.get(key)
    if evaluator is None:
        evaluator = StrategyEvaluator(group_graph, cluster, granularity=granularity, cost=cost, cache=cache)
        if cache is not None:
            cache.evaluators[key] = evaluator  # the evaluator holds the grouping and the cluster
    return evaluator


def evaluate_strategy(group_graph: GroupGraph, strategy: Strategy, cluster: Cluster, *, granularity: str = "group",
                      cost: CostModel | None = None, feedback: bool = True, raise_on_oom: bool = False,
                      cache: CompilerCache | None = None) -> SimulationResult:
    """``simulate_fast(compile_strategy(group_graph, strategy, cluster, granularity=...).taskgraph)``, from
    cached fragments (module docstring): what search calls, with the :class:`~tag.compiler.cache.CompilerCache`
    its owner keeps for the run (None: every fragment built for this call). Same SimulationResult, bit for
    bit."""
    return strategy_evaluator(group_graph, cluster, granularity=granularity, cost=cost, cache=cache)(
        strategy, feedback=feedback, raise_on_oom=raise_on_oom)
