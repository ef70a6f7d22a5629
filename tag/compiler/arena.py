"""Where the search's evaluator keeps its fragments: named columns that grow, and the arena of fragments.

Each fragment (:mod:`tag.compiler.evaluate`) is stored once as flat arrays in an :class:`_Arena`, its task
and tensor references relative to the fragment (numbered [P's compute block | C's compute block | its own
tasks]) and kept *segmented*: a reference's segment (task references: P's block, C's block, early own, late
own; tensor references: P's block, C's block, own) in the bits from ``_SEGMENT_SHIFT`` up, its index inside
the segment below, so that assembly (:func:`tag.compiler.assemble._assemble`) places it with one look-up of
the segment's base, no branches. A replicated group's fragment, where chunks are not merged, is stored
*compact*: only its replicas' devices and batch fractions, from which assembly computes its rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tag._arrays import grown
from tag._compiled import jit

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
