"""The search's evaluation path: a strategy → iteration time, peak memory and feedback, with no TaskGraph built.

MCTS evaluates thousands of strategies that differ from one another in a few groups' rows.
:func:`~tag.compiler.compile_strategy` rebuilds every task in Python each time (2–5 µs a task, 10–25 k
tasks for a large model on 16 GPUs). :class:`StrategyEvaluator` cuts the TaskGraph that
``compile_strategy`` would build into **fragments** that each depend on one or two groups' layouts:

- a *group fragment* per (group, layout): the group's compute tasks with their output tensors, the
  dependencies among them, and its persistent memory (parameters, gradients, Adam states);
- a *pair fragment* per (producer group P, consumer group C, layout of P, layout of C), for every pair of
  groups that exchange tensors: the transfers and collectives between them and the dependencies and
  tensors they add.

Each fragment is built once and stored as flat arrays in an arena, its task and tensor references relative
to the fragment (numbered [P's compute block | C's compute block | its own tasks]). A replicated group's
fragment, where chunks are not merged, is stored *compact*: only its replicas' devices and batch fractions,
from which :func:`_assemble` computes its tasks, tensors, dependencies and reads as its layout and
:func:`_replica_fragments` would (as rows they were 72 % of the arena's bytes and 91 % of its tasks after
a recorded search). A pair fragment's tasks take their group (the consumer's) from the pair at assembly,
so pairs of groups between replicated layouts whose fragments are equal share one: the pairs of a
*template* (the pair's bundles, the output ranks of its producer units, under PS its uses' parameter
servers, and the two layouts' rows; :meth:`StrategyEvaluator._new_pair_fragments`), as repeated layers
placed alike are. After a recorded search of BERT-Large on 60 groups, 6 262 pair fragments serve its 16 240
pairs of group fragments. The new pairs of an evaluation are built in one call of the compiled kernel
:func:`_pair_fragments`: each pair's transfers from bundle skeletons (which device sends which fraction of
which category to which, which consumer devices read the producer's own copy, which categories a collective
syncs; shared by every bundle of a kind), then its collectives, timed and given resources by the compiler's
formulas (:func:`~tag.compiler.compile.ring_allreduce_seconds`, :func:`~tag.compiler.compile.ps_seconds`,
:func:`~tag.compiler.compile.collective_resources`) from a plan kept with each skeleton. The skeletons are
made by the compiled :func:`_make_skeletons`, by the rules and float operations of
``_Compiler._make_skeleton`` (which ``compile_strategy`` uses, with the delivery records the evaluator does
not read), all the new ones of an evaluation in one call. The kernel reads each group fragment's block
(its replicas' or pieces' devices, its units' first output tensors), each pair's bundles (with each
category's uses, for PS) and each skeleton with its plan from stores written once, when they are made (a
model-parallel pair's bundles each time they are made), and each skeleton list's rows likewise. A model-parallel
side is one more block to it (a task per piece, its units the pieces), with bundles made per pair of layouts
by pieces; model-parallel groups (their METIS pieces) go through the compiler's own Python
(``_Compiler.group_fragment``). The new pair fragments of an evaluation are written into the arena's columns
by one more kernel call (:func:`_store_rows`); other fragments of rows (model-parallel groups', and every
fragment where chunks are merged) are queued and stored at once, one append per column; compact fragments
are stored as they come.

Inside a replicated group, where dependencies are ordinary (no merged chunks), a dependency between two of
its units that a longer path of its units implies is left out (``_local_dep``): it changes no start time
and feeds no feedback, so the results stay those of ``compile_strategy``'s TaskGraph, which lists it (for
BERT-Large a quarter of an evaluation's dependencies).

Where chunks are merged, fragments are stored with dependency and tensor lags (:class:`tag.sim.taskgraph.Lags`).
At ``"merged"`` granularity a group fragment's chunks are merged into one task per part and replica
(:func:`tag.sim.kernels.merge_chunks`, as :func:`tag.sim.merge_taskgraph` merges compile_strategy's TaskGraph),
and a pair fragment, built against the chunk tasks, is moved onto the merged ones
(:meth:`StrategyEvaluator._localize_pair`: references renumbered, lags from where each chunk lies in its task).
Merged tasks are numbered by their first chunk in both paths, so the layouts still match.

An evaluation looks up the fragments of the groups whose row changed since the previous call and of the
pairs touching them (search changes one group at a time); then :func:`_assemble` lays the fragments out as
``compile_strategy`` lays out its tasks (compute tasks group by group in topological order, every pair's
transfers, every pair's collectives; links numbered by first use) and the kernels of
:mod:`tag.sim.kernels` list-schedule them, sweep the memory and sum the feedback. The result equals
``simulate_fast(compile_strategy(...).taskgraph)`` bit for bit (times and memory; feedback up to the
order of float sums), so what the tests prove of that path — agreement with the op-level reference, the
batch-row checker — holds for this one (tests/test_compiler.py).

Cost (BERT-Large, 60 groups, tag-testbed's 16 GPUs, one core; ``scripts/bench_sim.py``): a strategy whose
fragments are all cached costs the kernels alone, about 1.0 ms at group granularity (about 12 k tasks,
24 k dependencies: list scheduling 0.35 ms, assembly 0.22, memory 0.18, feedback 0.12), 0.7 ms merged and
0.2 ms at part granularity (warm passes of the table at 6e565a8); a real search's first evaluation of a
strategy (17.6 new group fragments, 53.6 new pairs of them served by 21.0 new pair fragments, on average)
1.6–1.8 ms at group granularity; the
one all-model-parallel strategy of a recorded search 73–85 ms (METIS and the pieces' bundles, in
Python, once per group and device-type sequence).
Horovod fusion (``fusion_bytes``) merges collectives across pairs, so it is not available here.
"""

from __future__ import annotations

from itertools import chain
from typing import Any, NamedTuple

import numpy as np

from tag.cluster import Cluster
from tag.cost import CostModel
from tag.grouping import GroupGraph
from tag.grouping.acyclic import dag_order
from tag._arrays import csr_from_lists, grown
from tag._compiled import jit
from tag.sim.kernels import int_table, list_schedule, merge_chunks, peak_memory, successor_lists, table_store
from tag.sim.result import SimulationResult, feedback_from_columns, result_from_schedule
from tag.sim.taskgraph import (RES_COMM, RES_COMPUTE, RES_LINK, RES_NIC_IN, RES_NIC_OUT, TASK_COLLECTIVE,
                               TASK_COMPUTE, TASK_TRANSFER)
from tag.strategy import BATCH_SPLITS, OPTIONS, PS, Strategy, device_group_sizes
from tag.compiler.compile import ADAM_COPIES, _Compiler, collective_resources
from tag.compiler.rules import SkeletonQueue, skeleton_key
from tag.compiler.errors import CompileError
from tag.compiler.cache import CompilerCache, cluster_context, compiler_tables
from tag.compiler.layout import ClusterContext, GroupLayout, group_layouts, unit_durations
from tag.compiler.tables import GRANULARITIES, Bundle, CompilerTables

__all__ = ["StrategyEvaluator", "evaluate_strategy", "strategy_evaluator"]

# tasks the cached fragments stand for before the arena is emptied (~70 bytes each as rows, far less compact)
DEFAULT_MAX_CACHED_TASKS = 3_000_000
# Rows each arena column starts with: zeroed pages are mapped as they are first written, so a large start
# costs no memory until it is used, and spares the copies of early growths (a search's first hundred
# evaluations store about half a million tasks, over a million dependencies).
_ARENA_CAPACITY = 1 << 20

# Columns of the fragment table [F, _META]: where a fragment's rows lie in the arena, and how its references
# are numbered. Task references: [P's block | C's block | own tasks]; own tasks are "early" ones (a group's
# compute tasks, a pair's transfers) then "late" ones (a pair's collectives). Tensor references:
# [P's block | C's block | own tensors]. A group fragment has empty blocks.
# A *compact* fragment (a replicated group's, where chunks are not merged) keeps only its replicas' devices
# and batch fractions, from which :func:`_assemble` computes its rows as the layout and
# :func:`_replica_fragments` would: _COMPACT is its group (-1 for a fragment of rows), _RES0 its first
# replica in the compact store, _REPLICAS its replicas; its counts are those of the rows it stands for.
(_TASK0, _TASKS, _EARLY, _RES0, _RES, _DEP0, _DEPS, _TEN0, _TENS, _READ0, _READS,
 _BLOCK_P, _BLOCK_C, _TBLOCK_P, _TBLOCK_C, _COMPACT, _REPLICAS) = range(17)
_META = 17

# The arena stores a reference as its segment (task references: P's block, C's block, early own, late own;
# tensor references: P's block, C's block, own) in the bits from _SEGMENT_SHIFT up and its index inside the
# segment below, so that :func:`_assemble` places it with one look-up of the segment's base, no branches.
_SEGMENT_SHIFT = 29
_IN_SEGMENT = (1 << _SEGMENT_SHIFT) - 1
_ROW_BITS = 21  # a template's code: class << 2 * _ROW_BITS | P's row << _ROW_BITS | C's row
_CLASS_BITS = 63 - 2 * _ROW_BITS
_TASK_REFS = ("dep_task", "dep_on", "tensor_producer", "read_task")
_TABLES = ("task", "res", "dep", "tensor", "read")  # the arena's tables, in the order of its fragment counts
_GROUP_COLUMNS = {"task": ("duration", "kind", "nres"), "res": ("res",), "dep": ("dep_task", "dep_on"),
                  "tensor": ("tensor_device", "tensor_bytes", "tensor_producer", "tensor_persistent"),
                  "read": ("read_tensor", "read_task")}  # what _compile_replicated stores, by table
_PAIR_COLUMNS = {"task": ("duration", "kind", "nres"), "res": ("res",), "dep": ("dep_task", "dep_on"),
                 "tensor": ("tensor_device", "tensor_bytes", "tensor_producer"),
                 "read": ("read_tensor", "read_task")}  # what _pair_fragments returns, by table
# :func:`_assemble` gives a group fragment's tasks its group and a pair fragment's the consumer's (so pairs of
# one template share one fragment): fragments hold no group column.
_FIRST_COLUMN = {"task": "duration", "res": "res", "dep": "dep_task", "tensor": "tensor_device",
                 "read": "read_tensor"}  # a column of each table every fragment gives as a list or an array
_ARENA_COLUMNS = ("duration", "kind", "nres", "res", "dep_task", "dep_on", "dep_lag", "tensor_device", "tensor_bytes",
                  "tensor_producer", "alloc_lag", "free_lag", "tensor_persistent", "read_tensor", "read_task",
                  "read_lag")  # what _assemble reads of the arena, in its order


class _Columns:
    """Named column arrays that grow 4 times at a time. Each column belongs to a table whose rows it indexes."""

    def __init__(self, specs: dict[str, tuple[type, str]], capacity: int = 1024) -> None:
        self.specs = specs  # column -> (dtype, table)
        self.size = dict.fromkeys(sorted({table for _, table in specs.values()}), 0)  # table -> rows
        self.capacity = dict.fromkeys(self.size, capacity)  # table -> rows its columns hold
        self.columns = {name: np.zeros(capacity, dtype=dtype) for name, (dtype, _) in specs.items()}
        self._whole: dict[tuple[str, ...], tuple] = {}  # names -> their arrays (whole()), until one is reallocated

    def extend(self, rows: dict[str, Any], counts: dict[str, int]) -> dict[str, int]:
        """Append ``counts[table]`` rows to every table (``rows[column]``: its new values; a column absent
        from ``rows`` gets rows of no defined value, for a reader that never looks at them); returns each
        table's first new row."""
        first = dict(self.size)
        for table, count in counts.items():
            start = first[table]
            if start + count > self.capacity[table]:  # the rows in use move to columns 4 times as long (or
                # enough): their pages are mapped as they are first written, so only the rows copied cost at once
                capacity = self.capacity[table] = max(4 * self.capacity[table], start + count)
                self._whole.clear()
                for name, (dtype, column_table) in self.specs.items():
                    if column_table == table:
                        longer = np.empty(capacity, dtype=dtype)
                        longer[:start] = self.columns[name][:start]
                        self.columns[name] = longer
            self.size[table] = start + count
        for name, values in rows.items():
            if values is not None:
                table = self.specs[name][1]
                self.columns[name][first[table]:self.size[table]] = values
        return first

    def view(self, name: str) -> np.ndarray:
        """The rows in use of column ``name``."""
        column = self.column(name)
        return column[:self.size[self.specs[name][1]]] if name in self.specs else column

    def whole(self, names: tuple[str, ...]) -> tuple:
        """The columns ``names`` whole, rows past those in use included, kept until one of them moves to a
        longer array: for kernels that read rows by the offsets stored with them (no view to make per call)."""
        found = self._whole.get(names)
        if found is None:
            found = self._whole[names] = tuple(self.column(name) for name in names)
        return found

    def column(self, name: str) -> np.ndarray:
        return self.columns[name]


class _Arena(_Columns):
    """Every fragment compiled so far, as columns, and the fragment table [F, _META]. The lag columns exist
    only where chunks are merged (``lagged``); elsewhere their views are empty."""

    _LAGS = {"dep_lag": (np.float64, "dep"), "alloc_lag": (np.float64, "tensor"),
             "free_lag": (np.float64, "tensor"), "read_lag": (np.float64, "read")}

    def __init__(self, lagged: bool) -> None:
        super().__init__({
            "duration": (np.float64, "task"), "kind": (np.int8, "task"),
            "nres": (np.int32, "task"), "res": (np.int32, "res"), "dep_task": (np.int32, "dep"),
            "dep_on": (np.int32, "dep"), "tensor_device": (np.int32, "tensor"),
            "tensor_bytes": (np.float64, "tensor"), "tensor_producer": (np.int32, "tensor"),
            "tensor_persistent": (np.bool_, "tensor"), "read_tensor": (np.int32, "read"),
            "read_task": (np.int32, "read"), **(self._LAGS if lagged else {}),
        }, capacity=_ARENA_CAPACITY)
        # the replicas of compact fragments (replicated groups' at group granularity): device, batch fraction
        self.compact = _Columns({"device": (np.int32, "replica"), "fraction": (np.float64, "replica")})
        self.meta = np.zeros((256, _META), dtype=np.int64)  # [F, _META] of the fragments with an id
        self.num_fragments = 0  # fragments with an id
        self.compact_tasks = 0  # tasks the compact fragments stand for
        self.stored = 0  # every fragment below this id is stored (flush sets it; store_many stores at once)
        # queued entries of one or more fragments of rows: (rows, blocks [F, 4], early own tasks [F], rows per
        # table [F, 5], the first one's id)
        self.pending: list[tuple[dict, Any, Any, Any, int]] = []

    def column(self, name: str) -> np.ndarray:
        if name not in self.columns and name in self._LAGS:
            return np.empty(0, dtype=np.float64)
        return super().column(name)

    def add(self, rows: dict[str, Any], blocks: tuple[int, int, int, int], early: int) -> int:
        """Queue one fragment (its columns as lists or arrays, or a Python int or bool that every row of the
        column takes; references numbered as in the fragment table) and return its id; :meth:`flush` stores
        the queued ones, less any dependency of a task on itself."""
        counts = np.array([[len(rows[_FIRST_COLUMN[table]]) for table in _TABLES]], dtype=np.int64)
        return self.add_many(rows, np.array([blocks], dtype=np.int64), np.array([early], dtype=np.int64), counts)

    def add_many(self, rows: dict[str, Any], blocks: np.ndarray, early: np.ndarray, counts: np.ndarray) -> int:
        """Queue F fragments whose columns lie one after another in ``rows`` (``counts`` [F, 5]: each one's rows
        in the task, res, dep, tensor and read tables; blocks [F, 4]; early [F]); returns the first one's id."""
        if len(early):
            self.pending.append((rows, blocks, early, counts, self.num_fragments))
        self.num_fragments += len(early)
        return self.num_fragments - len(early)

    def store_many(self, columns: tuple, blocks: np.ndarray, early: np.ndarray, counts: np.ndarray) -> int:
        """Store F fragments of rows at once, as :meth:`add_many` and :meth:`flush` would, their columns
        (:data:`_PAIR_COLUMNS`' in its order, arrays) lying one after another; returns the first one's id. For
        fragments with no task depending on itself (the filter :meth:`flush` applies) and no lags."""
        first = self.extend({}, dict(zip(_TABLES, counts.sum(axis=0).tolist())))  # rows to write
        c = self.columns
        meta = _store_rows(np.array([first[table] for table in _TABLES], dtype=np.int64), counts, blocks, early,
                           *columns, c["duration"], c["kind"], c["nres"], c["res"], c["dep_task"], c["dep_on"],
                           c["tensor_device"], c["tensor_bytes"], c["tensor_producer"], c["tensor_persistent"],
                           c["read_tensor"], c["read_task"])
        ids = self.num_fragments + np.arange(len(early))
        self._set_meta(ids, meta)
        self.num_fragments += len(early)
        return self.num_fragments - len(early)

    def add_compact(self, groups: np.ndarray, replicas: np.ndarray, devices: np.ndarray, fractions: np.ndarray,
                    counts: np.ndarray) -> int:
        """Store F compact fragments at once: groups [F], replicas [F], each replica's device and batch fraction
        [sum of R], one fragment after another, and counts [F, 5] of the rows they stand for (task, res, dep,
        tensor and read tables); returns the first one's id."""
        f = len(groups)
        first = self.compact.extend({"device": devices, "fraction": fractions}, {"replica": len(devices)})
        starts = np.zeros(f, dtype=np.int64)
        np.cumsum(replicas[:-1], out=starts[1:])
        meta = np.zeros((f, _META), dtype=np.int64)
        meta[:, _TASKS] = meta[:, _EARLY] = counts[:, 0]
        meta[:, _RES0] = first["replica"] + starts
        meta[:, [_RES, _DEPS, _TENS, _READS]] = counts[:, 1:5]
        meta[:, _COMPACT] = groups
        meta[:, _REPLICAS] = replicas
        ids = self.num_fragments + np.arange(f)
        self._set_meta(ids, meta)
        self.num_fragments += f
        self.compact_tasks += int(counts[:, 0].sum())
        return int(ids[0]) if f else self.num_fragments

    def _set_meta(self, ids: np.ndarray, rows: np.ndarray) -> None:
        """The fragment table's rows of the fragments ``ids`` (ascending)."""
        self.meta = grown(self.meta, int(ids[-1]) + 1 if len(ids) else 0, 0)
        self.meta[ids] = rows

    @property
    def cached_tasks(self) -> int:
        """Tasks of every fragment held: those stored as rows and those compact fragments stand for."""
        return self.size["task"] + self.compact_tasks

    def flush(self) -> None:
        """Store the queued fragments, in order, with one append per column (an evaluation brings tens)."""
        pending = self.pending
        if not pending:
            self.stored = self.num_fragments
            return
        self.pending = []
        tables = _TABLES
        per_entry = [counts for _, _, _, counts, _ in pending]  # [fragments of it, 5] per entry
        counts = np.concatenate(per_entry)  # [F, 5]
        f = counts.shape[0]
        # [entries, 5] rows per table of each entry (an entry holds at least one fragment)
        entry_rows = counts if f == len(pending) else np.array([c.sum(axis=0) for c in per_entry], dtype=np.int64)
        blocks = np.concatenate([b for _, b, *_ in pending])  # [F, 4]
        early = np.concatenate([e for _, _, e, *_ in pending])  # [F]
        # their ids: each entry's run, in order (compact fragments may sit between entries)
        ids = np.concatenate([first + np.arange(len(c)) for c, (_, _, _, _, first) in zip(per_entry, pending)])
        # task references: [P's block | C's block | early own | late own]; tensor references: [P | C | own]
        task_ends = np.stack([blocks[:, 0], blocks[:, 0] + blocks[:, 1], blocks[:, 0] + blocks[:, 1] + early], axis=1)
        tensor_ends = np.stack([blocks[:, 2], blocks[:, 2] + blocks[:, 3],
                                np.full(f, _IN_SEGMENT + 1, dtype=np.int64)], axis=1)
        merged = {}
        for name, (dtype, table) in self.specs.items():
            given = [entry[0].get(name) for entry in pending]
            if all(value is None for value in given):
                continue
            rows_of = entry_rows[:, tables.index(table)]  # [entries]
            dtype = np.int64 if name in _TASK_REFS or name == "read_tensor" else dtype
            arrays = [k for k, value in enumerate(given) if not (value is None or isinstance(value, int))]
            if 2 * len(arrays) > len(given):
                merged[name] = np.concatenate(
                    [np.full(rows_of[k], value or 0, dtype=dtype) if value is None or isinstance(value, int) else value
                     for k, value in enumerate(given)], dtype=dtype, casting="unsafe")
                continue
            # mostly one value per entry (a bool is an int): repeated, then the few arrays written over them
            one_value = [0 if k in arrays else value or 0 for k, value in enumerate(given)]
            values = merged[name] = np.repeat(np.array(one_value, dtype=dtype), rows_of)
            if arrays:
                ends = np.cumsum(rows_of).tolist()
                for k in arrays:
                    values[ends[k] - rows_of[k]:ends[k]] = given[k]
        # a task's dependency on itself (inside a pair of one group's fragments) goes, as merging drops it
        dep = tables.index("dep")
        keep = merged["dep_task"] != merged["dep_on"]
        if not keep.all():
            fragment = np.repeat(np.arange(f), counts[:, dep])
            for name, (_, table) in self.specs.items():
                if table == "dep" and name in merged:
                    merged[name] = merged[name][keep]
            counts[:, dep] = np.bincount(fragment[keep], minlength=f)
        for name in _TASK_REFS + ("read_tensor",):
            column = tables.index(self.specs[name][1])
            merged[name] = _segmented(merged[name], counts[:, column],
                                      tensor_ends if name == "read_tensor" else task_ends)
        first = self.extend(merged, dict(zip(tables, counts.sum(axis=0).tolist())))
        starts = np.array([first[table] for table in tables], dtype=np.int64) + np.cumsum(counts, axis=0) - counts
        self._set_meta(ids, np.column_stack([
            starts[:, 0], counts[:, 0], early, starts[:, 1], counts[:, 1], starts[:, 2], counts[:, 2],
            starts[:, 3], counts[:, 3], starts[:, 4], counts[:, 4], blocks, np.full(f, -1, dtype=np.int64),
            np.zeros(f, dtype=np.int64)]))
        self.stored = self.num_fragments


class _Skeletons(_Columns):
    """Bundle skeletons (what ``_Compiler._skeleton`` makes: which device sends which fraction of which category
    to which, which consumer devices read the producer's own copy, which categories a collective syncs) as
    arrays for :func:`_pair_fragments`, made by :func:`_make_skeletons`. S skeletons, D devices.

    A skeleton is keyed as ``_Compiler._skeleton`` keys it (the bundle's categories and producer device, the
    layouts' rows, the consumer devices); :meth:`row` gives its row, queuing it when new, and :meth:`build`
    makes the queued ones in one kernel call, in the order of their rows."""

    def __init__(self, num_devices: int) -> None:
        super().__init__({
            "first_transfer": (np.int64, "skeleton"), "transfers": (np.int64, "skeleton"),
            "src": (np.int64, "transfer"), "dst": (np.int64, "transfer"), "stage": (np.int64, "transfer"),
            "first_part": (np.int64, "transfer"), "parts": (np.int64, "transfer"),
            "part_category": (np.int64, "part"), "part_fraction": (np.float64, "part"),
            "local": (np.bool_, "local"),
            # collectives over the holders: (category, PS or all-reduce) each, and what they take whatever
            # their bytes (a plan): the holders (with each one's (latency, inverse bandwidth) as a parameter
            # server, if it syncs by PS), the resources held, the ring's (bandwidth, latency) if it all-reduces
            "coll_first": (np.int64, "skeleton"), "colls": (np.int64, "skeleton"),
            "holder_first": (np.int64, "skeleton"), "holders": (np.int64, "skeleton"),
            "held_first": (np.int64, "skeleton"), "helds": (np.int64, "skeleton"),
            "ring_bandwidth": (np.float64, "skeleton"), "ring_latency": (np.float64, "skeleton"),
            "coll_category": (np.int64, "coll"), "coll_ps": (np.bool_, "coll"),
            "holder_device": (np.int64, "holder"), "server_latency": (np.float64, "holder"),
            "server_inverse": (np.float64, "holder"), "held_res": (np.int64, "held"),
        })
        self.num_devices = num_devices
        self.rows: dict[tuple, int] = {}  # a skeleton's key -> its row (queued ones included)
        self.queue = SkeletonQueue()  # what the new skeletons are made from, in row order

    def arrays(self) -> tuple:
        """The 24 columns :func:`_pair_fragments` takes, in its order, whole (:meth:`_Columns.whole`)."""
        return self.whole(("first_transfer", "transfers", "src", "dst", "stage", "first_part", "parts",
                           "part_category", "part_fraction", "local", "coll_first", "colls", "coll_category",
                           "coll_ps", "holder_first", "holders", "holder_device", "server_latency",
                           "server_inverse", "held_first", "helds", "held_res", "ring_bandwidth", "ring_latency"))

    def row(self, b: Bundle, layout_p: GroupLayout, layout_c: GroupLayout, pieces_first: int) -> int:
        """The row of the skeleton of bundle ``b`` between these layouts (``pieces_first``: the first piece unit
        of a model-parallel consumer), queued for :meth:`build` if new. Keyed as ``_Compiler._skeleton``: a
        model-parallel consumer enters only through the devices of the pieces that read the bundle."""
        key, targets = skeleton_key(b, layout_p, layout_c, pieces_first)
        found = self.rows.get(key)
        if found is None:
            found = self.rows[key] = self.size["skeleton"] + len(self.queue)
            self.queue.add(b, layout_p, layout_c, targets)
        return found

    def build(self, beta: np.ndarray, context: ClusterContext) -> None:
        """Make the queued skeletons (:func:`~tag.compiler.rules.make_skeletons`, bandwidths ``beta`` [D, D]) and
        store them, with the plans of their collectives (``context``'s rings, parameter servers and collective
        resources)."""
        queue = self.queue
        if not len(queue):
            return
        self.queue = SkeletonQueue()
        queued = queue.holders
        size = self.size
        raw = queue.make(beta, self.num_devices, size["transfer"], size["part"], size["coll"])
        (first_transfer, transfers, src, dst, stage, first_part, parts, part_category, part_fraction, local, coll_first,
         colls, collective_category, collective_ps) = (
            raw.first_transfer, raw.transfers, raw.src, raw.dst, raw.stage, raw.first_part, raw.parts,
            raw.part_category, raw.part_fraction, raw.local, raw.coll_first, raw.colls, raw.coll_category, raw.coll_ps)
        s = len(queued)
        holders = np.zeros(s, dtype=np.int64)
        helds = np.zeros(s, dtype=np.int64)
        ring = np.zeros((2, s))  # bandwidth, latency
        holder_device, server_latency, server_inverse, held_res = [], [], [], []
        for i in np.flatnonzero(colls).tolist():  # the plans of the skeletons with collectives
            devices = queued[i]
            j = coll_first[i] - size["coll"]
            ps = collective_ps[j:j + colls[i]]
            holders[i] = len(devices)
            holder_device += devices
            if not ps.all():
                ring[:, i] = context.ring(devices)
            servers = [context.server(devices, server) for server in devices] if ps.any() else [(0.0, 0.0)] * len(
                devices)
            server_latency += [latency for latency, _ in servers]
            server_inverse += [inverse for _, inverse in servers]
            resources = collective_resources(context, devices)
            helds[i] = len(resources)
            held_res += resources
        self.extend({"first_transfer": first_transfer, "transfers": transfers, "src": src, "dst": dst, "stage": stage,
                     "first_part": first_part, "parts": parts, "part_category": part_category,
                     "part_fraction": part_fraction, "local": local, "coll_first": coll_first, "colls": colls,
                     "holder_first": size["holder"] + np.cumsum(holders) - holders, "holders": holders,
                     "held_first": size["held"] + np.cumsum(helds) - helds, "helds": helds,
                     "ring_bandwidth": ring[0], "ring_latency": ring[1], "coll_category": collective_category,
                     "coll_ps": collective_ps, "holder_device": holder_device, "server_latency": server_latency,
                     "server_inverse": server_inverse, "held_res": held_res},
                    {"skeleton": s, "transfer": src.size, "part": part_category.size, "local": local.size,
                     "coll": collective_category.size, "holder": len(holder_device), "held": len(held_res)})


class _PairBundles(NamedTuple):
    """The bundles of a pair of groups between two layouts, as :meth:`StrategyEvaluator._bundle_arrays` gives
    them. B bundles; a unit's index is its position among its group's units, or its piece's for a
    model-parallel group."""

    bundles: list  # [B] the tables' Bundle objects
    unit: np.ndarray  # [B] producer unit's index in P's block, -1: input ops
    category: np.ndarray  # [B+1] first category of each bundle (CSR into nbytes and count)
    consumer_ptr: np.ndarray  # [B+1] CSR into consumer
    consumer: np.ndarray  # consumer units' indices in C's block
    nbytes: np.ndarray  # [categories] bytes of each category
    count: np.ndarray  # [categories] tensors of each category
    kind_of: np.ndarray  # [B] kind of each bundle (bundles of a kind share a skeleton)
    representatives: list  # one bundle of each kind
    kind_set: int  # id of the kinds of the bundles, in order
    first: int  # row of the first bundle in the evaluator's bundle store (_BundleStore)


class _BundleStore(_Columns):
    """Pairs' bundles (:class:`_PairBundles`) as :func:`_pair_fragments` reads them, each set stored once:
    per bundle its producer unit, kind, first category and consumer range; per category its bytes, tensors and
    use ids (a PS sync's seconds add up its uses) (rows of this store)."""

    def __init__(self) -> None:
        super().__init__({"unit": (np.int64, "bundle"), "kind": (np.int64, "bundle"),
                          "category": (np.int64, "bundle"), "consumer_first": (np.int64, "bundle"),
                          "consumer_end": (np.int64, "bundle"), "nbytes": (np.float64, "category"),
                          "count": (np.int64, "category"), "use_first": (np.int64, "category"),
                          "use_end": (np.int64, "category"), "consumer": (np.int64, "consumer"),
                          "use": (np.int64, "use")})

    def add(self, unit: np.ndarray, category: np.ndarray, consumer_ptr: np.ndarray, consumer: np.ndarray,
            nbytes: np.ndarray, count: np.ndarray, kind_of: np.ndarray, use_ptr: np.ndarray, uses: np.ndarray) -> int:
        """Store one pair's bundles (arrays as :class:`_PairBundles`', and the use ids of each category, CSR
        ``use_ptr`` / ``uses``, which a PS sync reads); returns its first bundle's row."""
        size = self.size
        first_category, first_consumer, first_use = size["category"], size["consumer"], size["use"]
        return self.extend({"unit": unit, "kind": kind_of, "category": first_category + category[:-1],
                            "consumer_first": first_consumer + consumer_ptr[:-1],
                            "consumer_end": first_consumer + consumer_ptr[1:], "nbytes": nbytes, "count": count,
                            "use_first": first_use + use_ptr[:-1], "use_end": first_use + use_ptr[1:],
                            "consumer": consumer, "use": uses},
                           {"bundle": unit.size, "category": nbytes.size, "consumer": consumer.size,
                            "use": uses.size})["bundle"]

    def arrays(self) -> tuple:
        """The 11 columns :func:`_pair_fragments` takes, in its order, whole (:meth:`_Columns.whole`)."""
        return self.whole(("unit", "kind", "category", "consumer_first", "consumer_end", "nbytes", "count",
                           "consumer", "use_first", "use_end", "use"))


class _BlockStore(_Columns):
    """The compute blocks of group fragments as :func:`_pair_fragments` reads them, by fragment id (the rows of
    pair fragments' ids are unused): replicas R, whether model-parallel, the tasks and tensors it numbers, its
    first device and unit (devices: a replicated block's R replicas, a model-parallel one's pieces; units: each
    unit's or piece's first output tensor, -1), its row of ``index`` ([blocks, D] replica of each device, -1:
    one row per block, not per fragment id), and its layout's row for templates (-1: none)."""

    def __init__(self, num_devices: int) -> None:
        super().__init__({"replicas": (np.int64, "fragment"), "mp": (np.bool_, "fragment"),
                          "tasks": (np.int64, "fragment"), "tensors": (np.int64, "fragment"),
                          "device0": (np.int64, "fragment"), "unit0": (np.int64, "fragment"),
                          "row": (np.int64, "fragment"), "template": (np.int64, "fragment"),
                          "device": (np.int64, "device"), "tensor_first": (np.int64, "unit")})
        self.index = np.zeros((256, num_devices), dtype=np.int64)
        self.num_blocks = 0

    def add(self, first: int, model_parallel: bool, replicas: np.ndarray, tasks: np.ndarray, tensors: np.ndarray,
            devices: np.ndarray, device_counts: np.ndarray, tensor_first: np.ndarray, unit_counts: np.ndarray,
            index: np.ndarray, template_rows: Any) -> None:
        """Record the blocks of the group fragments ``first``, ``first + 1``, ... (F of them, all model-parallel
        or all replicated): replicas, tasks and tensors [F], each one's devices (``device_counts`` [F] of them,
        one after another) and its units' first output tensors (``unit_counts``), index [F, D] and template
        rows (one value or [F])."""
        f = len(replicas)
        gap = first - self.size["fragment"]  # the pair fragments numbered since the last block
        if gap:
            self.extend({}, {"fragment": gap, "device": 0, "unit": 0})
        rows = self.num_blocks + np.arange(f)
        self.num_blocks += f
        self.index = grown(self.index, self.num_blocks, 0)
        self.index[rows] = index
        size = self.size
        self.extend({"replicas": replicas, "mp": model_parallel, "tasks": tasks, "tensors": tensors,
                     "device0": size["device"] + np.cumsum(device_counts) - device_counts,
                     "unit0": size["unit"] + np.cumsum(unit_counts) - unit_counts, "row": rows,
                     "template": template_rows, "device": devices, "tensor_first": tensor_first},
                    {"fragment": f, "device": devices.size, "unit": tensor_first.size})

    def arrays(self) -> tuple:
        """The block arrays :func:`_pair_fragments` takes, in its order: the columns whole
        (:meth:`_Columns.whole`), and the index."""
        replicas, mp, row, device0, unit0, device, tensor_first = self.whole(
            ("replicas", "mp", "row", "device0", "unit0", "device", "tensor_first"))
        return replicas, mp, row, self.index, device0, unit0, device, tensor_first


class _Assembled(NamedTuple):
    """Global columns of one strategy's TaskGraph (T tasks, N tensors, K tensor reads, E dependencies); ids
    and counts are int32, which keeps the kernels' working set in cache."""

    duration: np.ndarray  # [T]
    kind: np.ndarray  # [T] int8
    group: np.ndarray  # [T]
    res_ptr: np.ndarray  # [T+1]
    res: np.ndarray  # resource ids, links renumbered by first use
    link_dense: np.ndarray  # [L] src * D + dst of each link resource, in resource order
    dep_task: np.ndarray  # [E] waits for dep_on
    dep_on: np.ndarray  # [E]
    dep_lag: np.ndarray  # [E] seconds after dep_on starts at which the dependency is met (lags: all empty
    #                      where no chunks are merged, every dependency and tensor then ordinary)
    tensor_device: np.ndarray  # [N]
    tensor_bytes: np.ndarray  # [N]
    tensor_producer: np.ndarray  # [N] task or -1
    alloc_lag: np.ndarray  # [N] seconds after its producer starts at which the tensor is allocated
    free_lag: np.ndarray  # [N] ... at which its producer is done with it
    tensor_persistent: np.ndarray  # [N] bool
    read_tensor: np.ndarray  # [K]
    read_task: np.ndarray  # [K]
    read_lag: np.ndarray  # [K] seconds after read_task starts at which it is done with the tensor


class _GroupBlock(NamedTuple):
    """A group fragment's compute block where chunks are merged, as :meth:`StrategyEvaluator._localize_pair`
    reads it (how merged chunks move a pair's references); what the kernel reads is in :class:`_BlockStore`."""

    merged: int  # its tasks once the chunks of each part are merged (what the arena stores)
    new_id: np.ndarray  # [tasks] merged task of each chunk task
    start_lag: np.ndarray  # [tasks] where each chunk task starts inside its merged task (seconds)
    end_lag: np.ndarray  # [tasks] where it ends


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
        d, m = cluster.num_devices, cluster.num_machines
        self._link_base = 2 * d + 2 * m
        self._fixed_resources = np.array([RES_COMPUTE] * d + [RES_COMM] * d + [RES_NIC_OUT] * m + [RES_NIC_IN] * m,
                                         dtype=np.int8)
        self._fixed_a = np.array(list(range(d)) * 2 + list(range(m)) * 2, dtype=np.int64)
        context = self.context
        self._alpha = np.array(context.alpha, dtype=np.float64)  # [D, D]
        self._beta = np.array(context.beta, dtype=np.float64)  # [D, D] NIC-capped
        # the NICs a transfer holds (context.nics): its machines' when they differ and the NICs are finite
        machine = np.asarray(context.machine)
        cross = machine[:, None] != machine[None, :]  # [D, D]
        self._nic_out = np.where(cross, np.asarray(context.nic_out)[:, None], -1)  # [D, D] resource id, -1 if none
        self._nic_in = np.where(cross, np.asarray(context.nic_in)[None, :], -1)  # [D, D]
        self._use_sync_index = self.tables.use_sync_index.astype(np.int64)  # [Q] PS round robin offset of each use
        self._use_bytes = self.tables.use_bytes.astype(np.float64)  # [Q]
        self._unit_position = np.zeros(self.tables.num_units, dtype=np.int64)  # [U] index among its group's units
        for units in self.tables.group_units:
            self._unit_position[units] = np.arange(units.size)
        unit_part = self.tables.unit_part
        self._merging = unit_part is not None  # chunks merged into one task per part and replica: lags
        self._num_merge_keys = (int(unit_part.max()) + 1 if unit_part is not None and unit_part.size else 0) * d
        # per group, for _replica_fragments: its units (CSR), the pairs of its units that read each other's
        # outputs (CSR of src -> dst unit indices, _local_pairs' order), its persistent bytes on each replica
        self._unit_ptr, self._unit_ids = csr_from_lists(self.tables.group_units)  # [G+1], [units]
        # [units, in _unit_ids' order] rank of each unit among its group's units that output (a unit outputs on
        # every replica or on none: its batch-scaled or its fixed bytes are non-zero), -1 for the others
        outputs = (self.tables.unit_out_rows[self._unit_ids] > 0) | (self.tables.unit_out_fixed[self._unit_ids] > 0)
        self._unit_rank = np.full(self._unit_ids.size, -1, dtype=np.int64)
        for begin, end in zip(self._unit_ptr[:-1].tolist(), self._unit_ptr[1:].tolist()):
            self._unit_rank[begin:end][outputs[begin:end]] = np.arange(int(outputs[begin:end].sum()))
        local = [self._local_pairs(g) for g in range(group_graph.num_groups)]
        self._local_ptr = np.zeros(group_graph.num_groups + 1, dtype=np.int64)  # [G+1]
        np.cumsum([src.size for src, _ in local], out=self._local_ptr[1:])
        self._local_src = np.concatenate([src for src, _ in local] + [np.zeros(0, dtype=np.int64)])
        self._local_dst = np.concatenate([dst for _, dst in local] + [np.zeros(0, dtype=np.int64)])
        # [L] whether each pair's dependency is written: one that a longer path of the group's units implies
        # (a -> b -> c implies a -> c, per replica) changes no start time (c's release is the latest finish of
        # its predecessors, and b finishes no earlier than a) and feeds no feedback (compute to compute), so it
        # is left out where dependencies are ordinary; merged chunks (lags) keep every one
        self._local_dep = np.ones(self._local_src.size, dtype=np.bool_)
        if not self._merging:
            for g, (src, dst) in enumerate(local):
                begin = self._local_ptr[g]
                units = int(self._unit_ptr[g + 1] - self._unit_ptr[g])
                self._local_dep[begin:begin + src.size] = ~_implied_edges(units, src, dst)
        self._persistent = ADAM_COPIES * np.asarray(self.tables.group_param_bytes, dtype=np.float64)  # [G]
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
        (res, dep_task, dep_on, tensor_device, tensor_bytes, tensor_producer, tensor_persistent, read_tensor,
         read_task, tensor_first, index, counts) = _replica_fragments(
            groups, device_ptr, device_list, fractions, self._unit_ptr, self._unit_ids, self._unit_rank,
            self.tables.unit_out_rows, self.tables.unit_out_fixed, self._local_ptr, self._local_src, self._local_dst,
            self._local_dep, self._persistent, self.cluster.num_devices, self._merging)
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
        rows = {"duration": np.concatenate([unit_durations(self.tables, self.context, layout).reshape(-1)
                                            for layout in layouts]),
                "kind": TASK_COMPUTE, "nres": 1, "res": res,
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

    def _local_pairs(self, group: int) -> tuple[np.ndarray, np.ndarray]:
        """(src [L], dst [L]) indices among the group's units of units reading each other's outputs (read once,
        into the CSR that _replica_fragments takes)."""
        position, succ = self._unit_position, self.tables.unit_local_succ
        pairs = [(position[u], position[v]) for u in self.tables.group_units[group].tolist() for v in succ[u]]
        return np.array([a for a, _ in pairs], dtype=np.int64), np.array([b for _, b in pairs], dtype=np.int64)

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
            first_bundle, bundle_end, list_first, *self._bundles.arrays(), *self._list_rows.whole(("row",)),
            *self._skeletons.arrays(), self.cluster.num_devices, fragment_p, fragment_c, *self._blocks.arrays(),
            c_shift, first_task, first_tensor, consumer_group, self._use_sync_index, self._use_bytes, self._alpha,
            self._beta, self._nic_out, self._nic_in, self._link_base)
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
        out = _assemble(arena.meta[:arena.stored], self._group_order, group_ids, pair_ids, self._pair_p,
                        self._pair_c, *arena.whole(_ARENA_COLUMNS), self._merging, self._link_base,
                        self.cluster.num_devices, *arena.compact.whole(("device", "fraction")),
                        self.context.type_array, self._unit_ptr, self._unit_ids, self._unit_rank,
                        self.tables.unit_time_fixed, self.tables.unit_time_scaled, self.tables.unit_out_rows,
                        self.tables.unit_out_fixed, self._local_ptr, self._local_src, self._local_dst, self._local_dep,
                        self._persistent)
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


def _implied_edges(num_nodes: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """[E] whether each edge a -> c of a DAG is implied by a longer path (a -> b -> ... -> c, b not c): the
    edges its transitive reduction drops (a repeated direct edge is not implied by its twin)."""
    succ: list[list[int]] = [[] for _ in range(num_nodes)]
    for a, c in zip(src.tolist(), dst.tolist()):
        succ[a].append(c)
    reach = [0] * num_nodes  # bit set of the nodes each one reaches by a path of one edge or more
    for v in dag_order(num_nodes, src, dst)[::-1].tolist():
        bits = 0
        for c in succ[v]:
            bits |= reach[c] | (1 << c)
        reach[v] = bits
    return np.array([any(b != c and reach[b] >> c & 1 for b in succ[a]) for a, c in zip(src.tolist(), dst.tolist())],
                    dtype=np.bool_)


def _interned(ids: dict, key: Any, bits: int) -> int:
    """The id of ``key`` in ``ids`` (the next one, stored, if it is new); -1 if new past ``bits`` bits."""
    found = ids.get(key)
    if found is None:
        found = len(ids)
        if found >= 1 << bits:
            return -1
        ids[key] = found
    return found


def _fragment_rows(rows: dict, columns: dict, counts: np.ndarray, ends: np.ndarray, f: int) -> dict:
    """Fragment f's rows out of a batch's ``rows`` (``columns``: its column names by table; counts [F, 5+]:
    each fragment's rows per table, ``ends`` their running sums [F, 5]); a one-value column stays one value."""
    start, end = ends[f] - counts[f, :5], ends[f]
    return {name: rows[name] if np.isscalar(rows[name]) else rows[name][start[k]:end[k]]
            for k, table in enumerate(_TABLES) for name in columns[table]}


@jit
def _segmented(refs, counts, ends):
    """References [n] of F fragments (the first ``counts[0]`` the first fragment's, and so on) numbered
    across consecutive segments (fragment f's first segment ending before ``ends[f, 0]``, the next before
    ``ends[f, 1]``, then ``ends[f, 2]``, the last open-ended; an empty one is skipped) as
    (segment << _SEGMENT_SHIFT) | index in it, int32; a negative reference (none) stays -1."""
    out = np.empty(refs.size, dtype=np.int32)
    i = 0
    for f in range(counts.size):
        for _ in range(counts[f]):
            out[i] = _segment(refs[i], ends[f, 0], ends[f, 1], ends[f, 2])
            i += 1
    return out


@jit
def _segment(ref, end_0, end_1, end_2):
    """One reference of :func:`_segmented`, its fragment's segments ending before end_0, end_1 and end_2."""
    if ref < 0:
        return np.int32(-1)
    # the ends never decrease, so the segment is the number of ends at or below the reference
    segment = np.int64(ref >= end_0) + np.int64(ref >= end_1) + np.int64(ref >= end_2)
    base = 0 if segment == 0 else (end_0 if segment == 1 else (end_1 if segment == 2 else end_2))
    return np.int32((segment << _SEGMENT_SHIFT) | (ref - base))


@jit
def _store_rows(first, counts, blocks, early, duration, kind, nres, res, dep_task, dep_on, tensor_device,
                tensor_bytes, tensor_producer, read_tensor, read_task, a_duration, a_kind, a_nres, a_res, a_dep_task,
                a_dep_on, a_tensor_device, a_tensor_bytes, a_tensor_producer, a_tensor_persistent, a_read_tensor,
                a_read_task):
    """Write F fragments of rows (one after another, counts [F, 5] of each one's rows in the task, res, dep,
    tensor and read tables; references numbered as :meth:`_Arena.add` takes them, blocks [F, 4], early own
    tasks early [F]) into the arena's columns ``a_*`` from row ``first[table]`` of each table on, references
    segmented as :meth:`_Arena.flush` segments them, no tensor persistent; returns their rows of the fragment
    table [F, _META]."""
    t0, h0, e0, n0, q0 = first[0], first[1], first[2], first[3], first[4]
    # the columns without references, as they are
    a_duration[t0:t0 + duration.size] = duration
    a_kind[t0:t0 + kind.size] = kind
    a_nres[t0:t0 + nres.size] = nres
    a_res[h0:h0 + res.size] = res
    a_tensor_device[n0:n0 + tensor_device.size] = tensor_device
    a_tensor_bytes[n0:n0 + tensor_bytes.size] = tensor_bytes
    a_tensor_persistent[n0:n0 + tensor_bytes.size] = False
    # references, fragment by fragment: tasks [P's block | C's block | early own | late own], tensors [P | C | own]
    meta = np.zeros((counts.shape[0], _META), dtype=np.int64)
    t = h = e = n = q = 0  # each table's rows of the fragments before
    for f in range(counts.shape[0]):
        meta[f, _TASK0], meta[f, _TASKS], meta[f, _EARLY] = t0 + t, counts[f, 0], early[f]
        meta[f, _RES0], meta[f, _RES], meta[f, _DEP0], meta[f, _DEPS] = h0 + h, counts[f, 1], e0 + e, counts[f, 2]
        meta[f, _TEN0], meta[f, _TENS], meta[f, _READ0], meta[f, _READS] = n0 + n, counts[f, 3], q0 + q, counts[f, 4]
        for j in range(4):
            meta[f, _BLOCK_P + j] = blocks[f, j]
        meta[f, _COMPACT] = -1
        end_0 = blocks[f, 0]
        end_1 = end_0 + blocks[f, 1]
        end_2 = end_1 + early[f]
        tensor_0 = blocks[f, 2]
        tensor_1 = tensor_0 + blocks[f, 3]
        for i in range(e, e + counts[f, 2]):
            a_dep_task[e0 + i] = _segment(dep_task[i], end_0, end_1, end_2)
            a_dep_on[e0 + i] = _segment(dep_on[i], end_0, end_1, end_2)
        for i in range(n, n + counts[f, 3]):
            a_tensor_producer[n0 + i] = _segment(tensor_producer[i], end_0, end_1, end_2)
        for i in range(q, q + counts[f, 4]):
            a_read_tensor[q0 + i] = _segment(read_tensor[i], tensor_0, tensor_1, _IN_SEGMENT + 1)
            a_read_task[q0 + i] = _segment(read_task[i], end_0, end_1, end_2)
        t += counts[f, 0]
        h += counts[f, 1]
        e += counts[f, 2]
        n += counts[f, 3]
        q += counts[f, 4]
    return meta


# ------------------------------------------------------------------------------------------------ the kernel


@jit
def _assemble(meta, group_order, group_fragment, pair_fragment, pair_p, pair_c, a_duration, a_kind,
              a_nres, a_res, a_dep_task, a_dep_on, a_dep_lag, a_tensor_device, a_tensor_bytes, a_tensor_producer,
              a_alloc_lag, a_free_lag, a_tensor_persistent, a_read_tensor, a_read_task, a_read_lag, lagged, link_base,
              num_devices, c_device, c_fraction, device_type, unit_ptr, unit_ids, unit_rank, unit_time_fixed,
              unit_time_scaled, unit_out_rows, unit_out_fixed, local_ptr, local_src, local_dst, local_dep, persistent):
    """Global columns (see :class:`_Assembled`; indices int32) of the fragments ``group_fragment`` [G]
    (indexed by group) and ``pair_fragment`` [P] (pairs pair_p [P] -> pair_c [P]), laid out as
    compile_strategy lays out its tasks: compute blocks in ``group_order``, then the pairs' early tasks, then
    their late tasks. A compact fragment's rows are computed from its replicas' devices (``c_device``, of GPU
    type ``device_type``) and batch fractions (``c_fraction``), as :func:`~tag.compiler.layout.unit_durations`
    computes its durations and the compiler its output bytes, and :func:`_replica_rows` lists its rows for
    :func:`_replica_fragments`: its group's units (``unit_ids``, CSR ``unit_ptr``, ``unit_rank``) with their
    times (``unit_time_*``) and output bytes (``unit_out_*``), the pairs of them that read each other
    (``local_*``) and its persistent bytes."""
    num_groups = group_order.size
    num_pairs = pair_fragment.size
    num_used = num_groups + num_pairs
    used = np.empty(num_used, dtype=np.int64)  # fragments in layout order: groups, then pairs
    # [used, 4] global id of the first task of each segment of a fragment's task references (_segmented):
    # P's block, C's block, early own, late own; [used, 3] the same for tensors: P's, C's, own
    task_base = np.zeros((num_used, 4), dtype=np.int64)
    tensor_base = np.zeros((num_used, 3), dtype=np.int64)
    group_task = np.empty(num_groups, dtype=np.int64)  # group -> first task of its block
    group_tensor = np.empty(num_groups, dtype=np.int64)
    tasks = 0
    tensors = 0
    for k in range(num_groups):
        g = group_order[k]
        f = group_fragment[g]
        used[k] = f
        task_base[k, 2] = tasks
        task_base[k, 3] = tasks + meta[f, _EARLY]
        group_task[g] = tasks
        tasks += meta[f, _TASKS]
        tensor_base[k, 2] = tensors
        group_tensor[g] = tensors
        tensors += meta[f, _TENS]
    for k in range(num_pairs):
        f = pair_fragment[k]
        used[num_groups + k] = f
        task_base[num_groups + k, 0] = group_task[pair_p[k]]
        task_base[num_groups + k, 1] = group_task[pair_c[k]]
        task_base[num_groups + k, 2] = tasks
        tensor_base[num_groups + k, 0] = group_tensor[pair_p[k]]
        tensor_base[num_groups + k, 1] = group_tensor[pair_c[k]]
        tasks += meta[f, _EARLY]
    for k in range(num_pairs):
        f = pair_fragment[k]
        task_base[num_groups + k, 3] = tasks
        tasks += meta[f, _TASKS] - meta[f, _EARLY]
        tensor_base[num_groups + k, 2] = tensors
        tensors += meta[f, _TENS]
    num_deps = 0
    num_reads = 0
    for k in range(num_used):
        num_deps += meta[used[k], _DEPS]
        num_reads += meta[used[k], _READS]

    # Runs of tasks in global order: every fragment's early tasks (compute blocks, then the pairs'
    # transfers), then the pairs' late tasks. [runs] fragment, first and end task inside it, arena offset of
    # the first one's resources, group of its tasks (a group fragment's own; a pair's tasks are its consumer's).
    run_fragment = np.empty(num_used + num_pairs, dtype=np.int64)
    run_group = np.empty(num_used + num_pairs, dtype=np.int64)
    run_begin = np.empty(num_used + num_pairs, dtype=np.int64)
    run_end = np.empty(num_used + num_pairs, dtype=np.int64)
    run_res = np.empty(num_used + num_pairs, dtype=np.int64)
    num_res = 0
    for k in range(num_used):
        f = used[k]
        run_fragment[k], run_begin[k], run_end[k], run_res[k] = f, 0, meta[f, _EARLY], meta[f, _RES0]
        run_group[k] = group_order[k] if k < num_groups else pair_c[k - num_groups]
        num_res += meta[f, _RES]
    runs = num_used
    for k in range(num_groups, num_used):
        f = used[k]
        if meta[f, _TASKS] > meta[f, _EARLY]:
            run_group[runs] = pair_c[k - num_groups]
            offset = meta[f, _RES0]
            for i in range(meta[f, _TASK0], meta[f, _TASK0] + meta[f, _EARLY]):
                offset += a_nres[i]
            run_fragment[runs], run_begin[runs], run_end[runs] = f, meta[f, _EARLY], meta[f, _TASKS]
            run_res[runs] = offset
            runs += 1
    duration = np.empty(tasks)
    kind = np.empty(tasks, dtype=np.int8)
    group = np.empty(tasks, dtype=np.int32)
    res_ptr = np.empty(tasks + 1, dtype=np.int32)
    res = np.empty(num_res, dtype=np.int32)
    compact = np.full(num_devices * num_devices, -1, dtype=np.int64)  # dense link -> its rank by first use
    link_dense = np.empty(num_devices * num_devices, dtype=np.int64)
    links = 0
    t = 0
    h = 0
    for run in range(runs):
        f = run_fragment[run]
        g = meta[f, _COMPACT]
        if g >= 0:  # compact: unit-major then replica, each task on its replica's device
            first_replica, r = meta[f, _RES0], meta[f, _REPLICAS]
            for i in range(unit_ptr[g], unit_ptr[g + 1]):
                unit = unit_ids[i]
                for k in range(first_replica, first_replica + r):
                    device = c_device[k]
                    duration[t] = (unit_time_fixed[unit, device_type[device]]
                                   + unit_time_scaled[unit, device_type[device]] * c_fraction[k])
                    kind[t] = TASK_COMPUTE
                    group[t] = g
                    res_ptr[t] = h
                    res[h] = device
                    h += 1
                    t += 1
            continue
        first = meta[f, _TASK0]
        offset = run_res[run]
        g = run_group[run]
        for i in range(first + run_begin[run], first + run_end[run]):
            duration[t] = a_duration[i]
            kind[t] = a_kind[i]
            group[t] = g
            res_ptr[t] = h
            for j in range(offset, offset + a_nres[i]):
                r = np.int64(a_res[j])
                if r >= link_base:
                    dense = r - link_base
                    if compact[dense] < 0:
                        compact[dense] = links
                        link_dense[links] = dense
                        links += 1
                    r = link_base + compact[dense]
                res[h] = r
                h += 1
            offset += a_nres[i]
            t += 1
    res_ptr[tasks] = h

    dep_task = np.empty(num_deps, dtype=np.int32)
    dep_on = np.empty(num_deps, dtype=np.int32)
    # lags only where chunks are merged (otherwise empty: every dependency and tensor is ordinary)
    dep_lag = np.empty(num_deps if lagged else 0)
    read_lag = np.empty(num_reads if lagged else 0)
    alloc_lag = np.empty(tensors if lagged else 0)
    free_lag = np.empty(tensors if lagged else 0)
    read_tensor = np.empty(num_reads, dtype=np.int32)
    read_task = np.empty(num_reads, dtype=np.int32)
    tensor_device = np.empty(tensors, dtype=np.int32)
    tensor_bytes = np.empty(tensors)
    tensor_producer = np.empty(tensors, dtype=np.int32)
    tensor_persistent = np.empty(tensors, dtype=np.bool_)
    e = 0
    q = 0
    for k in range(num_used):
        f = used[k]
        bases = task_base[k]
        tbases = tensor_base[k]
        g = meta[f, _COMPACT]
        if g >= 0:  # compact (never lagged)
            e, q, _ = _replica_rows(g, meta[f, _REPLICAS], c_device, c_fraction, meta[f, _RES0], unit_ptr, unit_ids,
                                    unit_rank, unit_out_rows, unit_out_fixed, local_ptr, local_src, local_dst,
                                    local_dep, persistent, bases[2], tbases[2], dep_task, dep_on, read_tensor,
                                    read_task, tensor_device, tensor_bytes, tensor_producer, tensor_persistent, e, q,
                                    tbases[2])
            continue
        for i in range(meta[f, _DEP0], meta[f, _DEP0] + meta[f, _DEPS]):
            ref = a_dep_task[i]
            dep_task[e] = bases[ref >> _SEGMENT_SHIFT] + (ref & _IN_SEGMENT)
            ref = a_dep_on[i]
            dep_on[e] = bases[ref >> _SEGMENT_SHIFT] + (ref & _IN_SEGMENT)
            if lagged:
                dep_lag[e] = a_dep_lag[i]
            e += 1
        for i in range(meta[f, _READ0], meta[f, _READ0] + meta[f, _READS]):
            ref = a_read_task[i]
            read_task[q] = bases[ref >> _SEGMENT_SHIFT] + (ref & _IN_SEGMENT)
            ref = a_read_tensor[i]
            read_tensor[q] = tbases[ref >> _SEGMENT_SHIFT] + (ref & _IN_SEGMENT)
            if lagged:
                read_lag[q] = a_read_lag[i]
            q += 1
        n = tbases[2]
        for a in range(meta[f, _TEN0], meta[f, _TEN0] + meta[f, _TENS]):
            tensor_device[n] = a_tensor_device[a]
            tensor_bytes[n] = a_tensor_bytes[a]
            tensor_persistent[n] = a_tensor_persistent[a]
            if lagged:
                alloc_lag[n] = a_alloc_lag[a]
                free_lag[n] = a_free_lag[a]
            ref = a_tensor_producer[a]
            tensor_producer[n] = -1 if ref < 0 else bases[ref >> _SEGMENT_SHIFT] + (ref & _IN_SEGMENT)
            n += 1
    return (duration, kind, group, res_ptr, res, link_dense[:links].copy(), dep_task, dep_on, dep_lag, tensor_device,
            tensor_bytes, tensor_producer, alloc_lag, free_lag, tensor_persistent, read_tensor, read_task, read_lag)


@jit
def _replica_rows(g, r, devices, fractions, first, unit_ptr, unit_ids, unit_rank, unit_out_rows, unit_out_fixed,
                  local_ptr, local_src, local_dst, local_dep, persistent, task_base, tensor_base, dep_task, dep_on,
                  read_tensor, read_task, tensor_device, tensor_bytes, tensor_producer, tensor_persistent, e, q, n):
    """Write the rows of group ``g`` replicated on the R = ``r`` devices ``devices[first:first + r]`` with batch
    fractions ``fractions[first:first + r]``, as ``_Compiler.group_fragment`` lists them: its tasks are
    unit-major then replica (unit u's replica j is task ``task_base + u * r + j``, on the j-th device); every
    pair of its units that read each other (``local_src -> local_dst``, CSR ``local_ptr``, unit indices) adds
    a dependency per replica where ``local_dep`` says so, at ``e``, and a read per replica where the source
    outputs, at ``q``; each unit that outputs (``unit_rank`` >= 0: its rank among them) has a tensor per
    replica, numbered in unit order from ``tensor_base`` and written at ``n``, of the layout's bytes
    (batch-scaled bytes times the fraction, plus the fixed ones); then, if the group has persistent bytes, one
    persistent tensor per device. Returns the next (e, q, n)."""
    first_unit = unit_ptr[g]
    for i in range(local_ptr[g], local_ptr[g + 1]):
        if not local_dep[i]:
            continue
        for j in range(r):
            dep_task[e] = task_base + local_dst[i] * r + j
            dep_on[e] = task_base + local_src[i] * r + j
            e += 1
    for i in range(local_ptr[g], local_ptr[g + 1]):
        rank = unit_rank[first_unit + local_src[i]]
        if rank >= 0:
            for j in range(r):
                read_tensor[q] = tensor_base + rank * r + j
                read_task[q] = task_base + local_dst[i] * r + j
                q += 1
    for u in range(unit_ptr[g + 1] - first_unit):
        if unit_rank[first_unit + u] >= 0:
            unit = unit_ids[first_unit + u]
            for j in range(r):
                tensor_device[n] = devices[first + j]
                tensor_bytes[n] = unit_out_rows[unit] * fractions[first + j] + unit_out_fixed[unit]
                tensor_producer[n] = task_base + u * r + j
                tensor_persistent[n] = False
                n += 1
    if persistent[g] > 0:
        for j in range(r):
            tensor_device[n] = devices[first + j]
            tensor_bytes[n] = persistent[g]
            tensor_producer[n] = -1
            tensor_persistent[n] = True
            n += 1
    return e, q, n


@jit
def _replica_fragments(groups, device_ptr, devices, fractions, unit_ptr, unit_ids, unit_rank, unit_out_rows,
                       unit_out_fixed, local_ptr, local_src, local_dst, local_dep, persistent, num_devices, rows):
    """The group fragments of F replicated layouts, one after another: layout f is group ``groups[f]`` on the
    R devices ``devices[device_ptr[f]:device_ptr[f + 1]]`` with batch fractions ``fractions`` (the same
    slice), its rows as :func:`_replica_rows` writes them, references relative to the fragment. Returns
    (res [tasks]: each task's device, dep_task, dep_on, tensor_device, tensor_bytes, tensor_producer,
    tensor_persistent, read_tensor, read_task, tensor_first (each unit's first output tensor, -1; units of
    layout f after the earlier layouts'), index [F, D] (replica of each device, -1), counts [F, 6]: tasks,
    resources, dependencies, tensors, reads and output tensors of each fragment). Without ``rows`` (compact
    fragments: :func:`_assemble` writes them) the resource, dependency, tensor and read columns are empty and
    only the counts, the units' first output tensors and the index are taken."""
    f_count = groups.size
    counts = np.zeros((f_count, 6), dtype=np.int64)
    units_total = 0
    for f in range(f_count):
        g = groups[f]
        r = device_ptr[f + 1] - device_ptr[f]
        units = unit_ptr[g + 1] - unit_ptr[g]
        outputs = 0
        for u in range(unit_ptr[g], unit_ptr[g + 1]):
            outputs += unit_rank[u] >= 0
        reads = 0
        deps = 0
        for i in range(local_ptr[g], local_ptr[g + 1]):
            reads += unit_rank[unit_ptr[g] + local_src[i]] >= 0
            deps += local_dep[i]
        counts[f, 0] = counts[f, 1] = units * r
        counts[f, 2] = deps * r
        counts[f, 3] = (outputs + (persistent[g] > 0)) * r
        counts[f, 4] = reads * r
        counts[f, 5] = outputs * r
        units_total += units
    totals = counts.sum(axis=0) if rows else np.zeros(6, dtype=np.int64)
    res = np.empty(totals[0], dtype=np.int64)
    dep_task = np.empty(totals[2], dtype=np.int64)
    dep_on = np.empty(totals[2], dtype=np.int64)
    tensor_device = np.empty(totals[3], dtype=np.int64)
    tensor_bytes = np.empty(totals[3])
    tensor_producer = np.empty(totals[3], dtype=np.int64)
    tensor_persistent = np.zeros(totals[3], dtype=np.bool_)
    read_tensor = np.empty(totals[4], dtype=np.int64)
    read_task = np.empty(totals[4], dtype=np.int64)
    tensor_first = np.empty(units_total, dtype=np.int64)
    index = np.full((f_count, num_devices), -1, dtype=np.int64)
    t = 0
    w = 0  # into tensor_first
    e = q = n = 0
    for f in range(f_count):
        g = groups[f]
        first = device_ptr[f]
        r = device_ptr[f + 1] - first
        units = unit_ptr[g + 1] - unit_ptr[g]
        for k in range(r):
            index[f, devices[first + k]] = k
        for u in range(units):
            if rows:
                for k in range(r):
                    res[t + u * r + k] = devices[first + k]
            rank = unit_rank[unit_ptr[g] + u]
            tensor_first[w + u] = rank * r if rank >= 0 else -1
        if rows:
            e, q, n = _replica_rows(g, r, devices, fractions, first, unit_ptr, unit_ids, unit_rank, unit_out_rows,
                                    unit_out_fixed, local_ptr, local_src, local_dst, local_dep, persistent, 0, 0,
                                    dep_task, dep_on, read_tensor, read_task, tensor_device, tensor_bytes,
                                    tensor_producer, tensor_persistent, e, q, n)
        t += units * r
        w += units
    return (res, dep_task, dep_on, tensor_device, tensor_bytes, tensor_producer, tensor_persistent, read_tensor,
            read_task, tensor_first, index, counts)


@jit
def _pair_fragments(first_bundle, bundle_end, list_first, bundle_unit, bundle_kind, bundle_category,
                    consumer_first, consumer_end, category_bytes, category_count, bundle_consumer, category_use_first,
                    category_use_end, category_use, list_rows, sk_first_transfer, sk_transfers, tr_src, tr_dst,
                    tr_stage, tr_first_part, tr_parts, part_category, part_fraction, sk_local, sk_coll_first,
                    sk_colls, coll_category, coll_ps, sk_holder_first, sk_holders, holder_device, server_latency,
                    server_inverse, sk_held_first, sk_helds, held_res, sk_ring_bandwidth, sk_ring_latency,
                    num_devices, fragment_p, fragment_c, block_replicas, block_mp, block_row, block_index,
                    block_device0, block_unit0, block_device, block_tensor_first, c_shift, first_task, first_tensor,
                    consumer_group, use_sync_index, use_bytes, alpha, beta, nic_out, nic_in, link_base):
    """The own tasks of M pair fragments, with their dependencies, tensors and reads, one fragment after
    another: each fragment's transfers (``_Compiler._instantiate`` for its bundles), then its collectives
    (``_Compiler._emit_collectives``, in its order: bundle by bundle, category by category), numbered as the
    compiler numbers one pair (P's block from 0, C's from ``c_shift[m]``, own tasks from ``first_task[m]``, own
    tensors from ``first_tensor[m]``).

    Bundles (the rows of :class:`_BundleStore`): pair m's are ``first_bundle[m]:bundle_end[m]``; their
    producer unit's index in P (-1: input ops), kind (its skeleton's row in the skeleton store:
    ``list_rows[list_first[m] + kind]``), first category (into category_bytes / category_count and the
    category's use ids ``category_use[category_use_first[c]:category_use_end[c]]``) and consumer units' indices
    in C (``bundle_consumer[consumer_first[b]:consumer_end[b]]``). Skeletons: see :class:`_Skeletons`; a
    collective's seconds are :func:`~tag.compiler.compile.ring_allreduce_seconds` over its skeleton's ring, or
    :func:`~tag.compiler.compile.ps_seconds` over its parameter servers (chosen round robin from the pair's
    ``consumer_group[m]`` by each use's ``use_sync_index``, its bytes ``use_bytes``), and it holds its
    skeleton's resources. Blocks, by group fragment id (P's is ``fragment_p[m]``, C's ``fragment_c[m]``): R
    (``block_replicas``) tasks per unit (unit u's replica r is task u * R + r), a replicated block's on its
    R devices (``block_device`` from ``block_device0``); a model-parallel group's (``block_mp``) units are
    its pieces, R = 1, piece u on the u-th of its devices; ``block_index`` [blocks, D] (replica of each
    device, -1; read when R > 1) at row ``block_row``; the first output tensor of each unit (-1) in
    ``block_tensor_first`` from ``block_unit0``. Returns (duration, kind, nres, res, dep_task, dep_on,
    tensor_device, tensor_bytes, tensor_producer, read_tensor, read_task, counts [M, 6]: tasks, resources,
    dependencies, tensors, reads and transfers of each fragment).
    """
    m_pairs = fragment_p.size
    # sizes first (bounds for dependencies, reads and resources), so that every column is allocated once
    transfers = 0
    collectives = 0
    deps = 0
    resources = 0
    for m in range(m_pairs):
        r_c = block_replicas[fragment_c[m]]
        for b in range(first_bundle[m], bundle_end[m]):
            sk = list_rows[list_first[m] + bundle_kind[b]]
            n = sk_transfers[sk]
            transfers += n
            consumers = consumer_end[b] - consumer_first[b]
            # each transfer waits for its source, and an AddN forward for stage-1 transfers; each consumer
            # replica waits for its local copy and for the transfers into its device; each collective waits
            # for every holder, and every consumer replica for it
            deps += n * (1 + n) + consumers * (r_c + n)
            resources += 3 * n
            c = sk_colls[sk]
            collectives += c
            deps += c * (sk_holders[sk] + consumers * r_c)
            resources += c * sk_helds[sk]
    tasks = transfers + collectives
    duration = np.empty(tasks)
    kind = np.empty(tasks, dtype=np.int8)
    nres = np.empty(tasks, dtype=np.int64)
    res = np.empty(resources, dtype=np.int64)
    dep_task = np.empty(deps, dtype=np.int64)
    dep_on = np.empty(deps, dtype=np.int64)
    read_tensor = np.empty(deps, dtype=np.int64)
    read_task = np.empty(deps, dtype=np.int64)
    tensor_device = np.empty(transfers, dtype=np.int64)
    tensor_bytes = np.empty(transfers)
    tensor_producer = np.empty(transfers, dtype=np.int64)
    counts = np.zeros((m_pairs, 6), dtype=np.int64)
    t = 0  # tasks so far (all fragments)
    n_tensors = 0
    h = 0  # resources
    e = 0  # dependencies
    q = 0  # reads
    for m in range(m_pairs):
        t_pair, h_pair, e_pair, q_pair = t, h, e, q
        fp, fc = fragment_p[m], fragment_c[m]
        r_c = block_replicas[fc]
        p_r = block_replicas[fp]
        index = block_index[block_row[fp]]
        p_mp, c_mp = block_mp[fp], block_mp[fc]
        p_devices = block_device[block_device0[fp]:]
        c_devices = block_device[block_device0[fc]:]
        p_first_tensor = block_tensor_first[block_unit0[fp]:]
        own_task, own_tensor = first_task[m] - t_pair, first_tensor[m] - t_pair  # + t: task t's id, tensor's
        for b in range(first_bundle[m], bundle_end[m]):
            sk = list_rows[list_first[m] + bundle_kind[b]]
            first = sk_first_transfer[sk]
            n = sk_transfers[sk]
            unit = bundle_unit[b]
            p_base = unit * p_r if unit >= 0 else -1
            p_first = p_first_tensor[unit] if unit >= 0 else -1
            c0 = bundle_category[b]
            t0 = t
            for i in range(first, first + n):
                src, dst = tr_src[i], tr_dst[i]
                k = tr_first_part[i]
                nbytes = category_bytes[c0 + part_category[k]] * part_fraction[k]
                for k in range(tr_first_part[i] + 1, tr_first_part[i] + tr_parts[i]):
                    nbytes += category_bytes[c0 + part_category[k]] * part_fraction[k]
                count = 0  # a message per tensor of each category counted (the parts')
                for k in range(tr_first_part[i], tr_first_part[i] + tr_parts[i]):
                    count += category_count[c0 + part_category[k]]
                duration[t] = count * alpha[src, dst] + nbytes / beta[src, dst] if nbytes > 0 else 0.0
                kind[t] = TASK_TRANSFER
                nres[t] = 1
                if nic_out[src, dst] >= 0:
                    res[h] = nic_out[src, dst]
                    h += 1
                    nres[t] += 1
                if nic_in[src, dst] >= 0:
                    res[h] = nic_in[src, dst]
                    h += 1
                    nres[t] += 1
                res[h] = link_base + src * num_devices + dst
                h += 1
                task = own_task + t
                replica = _replica(unit, src, p_r, index, p_devices, p_mp)
                if replica >= 0:  # it sends the producer's copy on its source
                    dep_task[e] = task
                    dep_on[e] = p_base + replica
                    e += 1
                    if p_first >= 0:
                        read_tensor[q] = p_first + replica
                        read_task[q] = task
                        q += 1
                if tr_stage[i] == 2:  # an AddN root forwards what reached it in stage 1
                    for j in range(first, first + n):
                        if tr_stage[j] == 1 and tr_dst[j] == src:
                            dep_task[e] = task
                            dep_on[e] = own_task + t0 + j - first
                            e += 1
                            read_tensor[q] = own_tensor + t0 + j - first
                            read_task[q] = task
                            q += 1
                tensor_device[n_tensors] = dst
                tensor_bytes[n_tensors] = nbytes
                tensor_producer[n_tensors] = task
                n_tensors += 1
                t += 1
            for c in range(consumer_first[b], consumer_end[b]):
                c_first = bundle_consumer[c] * r_c
                for r in range(r_c):
                    device = c_devices[bundle_consumer[c]] if c_mp else c_devices[r]
                    task = c_shift[m] + c_first + r
                    replica = _replica(unit, device, p_r, index, p_devices, p_mp)
                    if sk_local[sk * num_devices + device] and replica >= 0 and p_base + replica != task:
                        dep_task[e] = task
                        dep_on[e] = p_base + replica
                        e += 1
                        if p_first >= 0:
                            read_tensor[q] = p_first + replica
                            read_task[q] = task
                            q += 1
                    for j in range(first, first + n):
                        if tr_dst[j] == device:
                            dep_task[e] = task
                            dep_on[e] = own_task + t0 + j - first
                            e += 1
                            read_tensor[q] = own_tensor + t0 + j - first
                            read_task[q] = task
                            q += 1
        counts[m, 5] = t - t_pair
        # the collectives: each waits for the producer unit's replica on each of its devices and reads its
        # output there; every replica of every consumer unit waits for it
        for b in range(first_bundle[m], bundle_end[m]):
            sk = list_rows[list_first[m] + bundle_kind[b]]
            holders = sk_holders[sk]
            h0 = sk_holder_first[sk]
            for j in range(sk_coll_first[sk], sk_coll_first[sk] + sk_colls[sk]):
                category = bundle_category[b] + coll_category[j]
                task = own_task + t
                if coll_ps[j]:  # ps_seconds: each use's push and pull at its server
                    seconds = 0.0
                    for u in range(category_use_first[category], category_use_end[category]):
                        use = category_use[u]
                        server = h0 + (consumer_group[m] + use_sync_index[use]) % holders
                        size = use_bytes[use]
                        if size > 0:
                            seconds += 2.0 * (server_latency[server] + size * server_inverse[server])
                    duration[t] = seconds
                else:  # ring_allreduce_seconds
                    nbytes = category_bytes[category]
                    duration[t] = (2.0 * (holders - 1) / holders * nbytes / sk_ring_bandwidth[sk]
                                   + category_count[category] * 2.0 * (holders - 1) * sk_ring_latency[sk]
                                   if nbytes > 0 else 0.0)
                kind[t] = TASK_COLLECTIVE
                nres[t] = sk_helds[sk]
                for k in range(sk_held_first[sk], sk_held_first[sk] + sk_helds[sk]):
                    res[h] = held_res[k]
                    h += 1
                unit = bundle_unit[b]
                if unit >= 0:
                    p_first = p_first_tensor[unit]
                    for k in range(h0, h0 + holders):
                        replica = _replica(unit, holder_device[k], p_r, index, p_devices, p_mp)
                        dep_task[e] = task
                        dep_on[e] = unit * p_r + replica
                        e += 1
                        if p_first >= 0:
                            read_tensor[q] = p_first + replica
                            read_task[q] = task
                            q += 1
                for c in range(consumer_first[b], consumer_end[b]):
                    c_first = c_shift[m] + bundle_consumer[c] * r_c
                    for r in range(r_c):
                        dep_task[e] = c_first + r
                        dep_on[e] = task
                        e += 1
                t += 1
        counts[m, 0] = t - t_pair
        counts[m, 1] = h - h_pair
        counts[m, 2] = e - e_pair
        counts[m, 3] = counts[m, 5]
        counts[m, 4] = q - q_pair
    return (duration, kind, nres, res[:h].copy(), dep_task[:e].copy(), dep_on[:e].copy(), tensor_device,
            tensor_bytes, tensor_producer, read_tensor[:q].copy(), read_task[:q].copy(), counts)


@jit
def _resource_columns(fixed_kind, fixed_a, link_dense, num_devices):
    """(kind [R], a [R], b [R]) of an assembly's resources: the fixed ones (``fixed_kind``, ``fixed_a``; b -1),
    then its links in order (``link_dense``: src * D + dst; a and b their devices)."""
    fixed = fixed_kind.size
    kind = np.empty(fixed + link_dense.size, dtype=np.int8)
    a = np.empty(fixed + link_dense.size, dtype=np.int64)
    b = np.full(fixed + link_dense.size, -1, dtype=np.int64)
    kind[:fixed] = fixed_kind
    a[:fixed] = fixed_a
    for k in range(link_dense.size):
        kind[fixed + k] = RES_LINK
        a[fixed + k] = link_dense[k] // num_devices
        b[fixed + k] = link_dense[k] % num_devices
    return kind, a, b


@jit
def _group_keys(placement, option, split, num_options, num_splits):
    """[G] :meth:`StrategyEvaluator._group_keys` where they fit in an int64: each group's placement row [G, M]
    (bool) as bits, its option and the batch split ``split``, and the group, in one number."""
    g = option.size
    keys = np.empty(g, dtype=np.int64)
    for k in range(g):
        code = np.int64(0)
        for j in range(placement.shape[1]):
            if placement[k, j]:
                code |= np.int64(1) << np.int64(j)
        keys[k] = ((code * num_options + option[k]) * num_splits + split) * g + k
    return keys


@jit
def _changed_look_up(keys, last_keys, last_ids, table):
    """[n] the value of each of ``keys`` [n]: the previous call's (``last_ids``) where its key
    (``last_keys``; empty: none) is the same, else ``table``'s, -1 where it has none."""
    ids = np.empty(keys.size, dtype=np.int64)
    same = last_keys.size == keys.size
    for i in range(keys.size):
        if same and keys[i] == last_keys[i]:
            ids[i] = last_ids[i]
        else:
            ids[i] = table.get(keys[i], -1)
    return ids


@jit
def _pair_look_up(groups, last_groups, last_ids, pair_p, pair_c, table):
    """([P] pair fragment of each pair of groups pair_p -> pair_c, -1 where ``table`` has none; [P] its key,
    the two group fragments ``groups`` [G], P's in the high 32 bits). A pair both of whose group fragments
    are those of the previous call (``last_groups``; empty: none) keeps its fragment there (``last_ids``)."""
    ids = np.empty(pair_p.size, dtype=np.int64)
    codes = np.empty(pair_p.size, dtype=np.int64)
    same = last_groups.size == groups.size
    for k in range(pair_p.size):
        fp, fc = groups[pair_p[k]], groups[pair_c[k]]
        codes[k] = (fp << 32) | fc
        if same and fp == last_groups[pair_p[k]] and fc == last_groups[pair_c[k]]:
            ids[k] = last_ids[k]
        else:
            ids[k] = table.get(codes[k], -1)
    return ids, codes


@jit
def _template_look_up(row_p, row_c, classes, templates, row_bits):
    """The templates of M new pairs of group fragments, given their layouts' rows (``row_p``, ``row_c`` [M], -1:
    none) and their classes ([M], -1: none): (fragment [M] of each pair whose template ``templates`` holds, -1
    for the others; the positions of the pairs to build, ascending: those without a template and the first
    pair of each new one, its *leader*; leader [M], the leader of each pair of a new template, -1 for the
    others; code [M] of each template, -1 without)."""
    m = row_p.size
    out = np.full(m, -1, dtype=np.int64)
    leader = np.full(m, -1, dtype=np.int64)
    codes = np.full(m, -1, dtype=np.int64)
    new = np.empty(m, dtype=np.int64)  # the pairs of new templates, ascending
    num_new = 0
    for i in range(m):
        if row_p[i] >= 0 and row_c[i] >= 0 and classes[i] >= 0:
            codes[i] = (classes[i] << (2 * row_bits)) | (row_p[i] << row_bits) | row_c[i]
            out[i] = templates.get(codes[i], -1)
            if out[i] < 0:
                new[num_new] = i
                num_new += 1
    order = np.argsort(codes[new[:num_new]], kind="mergesort")  # stable: a run of one code starts at its leader
    for k in range(num_new):
        i = new[order[k]]
        if k == 0 or codes[i] != codes[new[order[k - 1]]]:
            first = i
        leader[i] = first
    build = np.empty(m, dtype=np.int64)
    num_build = 0
    for i in range(m):
        if codes[i] < 0 or leader[i] == i:
            build[num_build] = i
            num_build += 1
    return out, build[:num_build].copy(), leader, codes


@jit
def _replica(unit, device, replicas, index, devices, model_parallel):
    """The replica of producer unit ``unit`` (-1: input ops, none) on ``device``, -1 if it has none there; the
    producer's block has R = ``replicas`` replicas, ``index`` [D] (replica of each device), ``devices`` (its
    replicas', or a model-parallel block's pieces')."""
    if unit < 0:
        return -1
    if replicas > 1:
        return index[device]
    return 0 if (devices[unit] if model_parallel else devices[0]) == device else -1


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
