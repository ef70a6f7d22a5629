"""The insertion rules, written once: what a bundle of tensors needs moved between two group layouts.

A bundle (:class:`~tag.compiler.tables.Bundle`) carries K categories of tensors, each a (producer class,
demand) pair, from the producer's holders to the consumer's devices. Its *skeleton* between two layouts says,
without the bundle's bytes, what the table of :mod:`tag.compiler.compile` prescribes: which device sends
which fraction of which category's bytes to which (Split / Concat / Transfer, and AddN's partials to a root
then the sum on from it), which consumer devices read the producer's own copy, and which categories a
collective over the holders syncs (AllReduce or PS). A skeleton depends on the bundle only through its
categories and producer device, so bundles of one kind share it.

:func:`make_skeletons` makes S skeletons at once from flat arrays (:class:`SkeletonQueue` gathers them). Both
compilers read its output: the search's evaluator stores it for its pair-fragment kernel
(:mod:`tag.compiler.evaluate`), and ``compile_strategy`` turns it into records (transfers with their
delivery items, op names) with :func:`tag.compiler.compile.skeleton_record`. A rule changes here, once.

Transfers come in the order of their first contribution, stage 1 before stage 2 (AddN forwards); each
transfer's parts (contributions) in the order made, each with the category, the fraction of its bytes and,
for batch rows, the rows [lo, hi) it moves.
"""

from __future__ import annotations

from array import array
from typing import NamedTuple

import numpy as np

from tag._compiled import jit
from tag.compiler._inline import inline_jit
from tag.strategy import PS
from tag.compiler.layout import GroupLayout
from tag.compiler.tables import DEMAND_SUM, ROWS, SUMS, Bundle

__all__ = ["EMPTY", "MOVED", "OPENED", "RawSkeletons", "SkeletonQueue", "make_skeletons", "skeleton_key"]

EMPTY = 1e-12  # batch overlaps shorter than this move nothing
# bits of a category's flags (RawSkeletons.cat_flags): some of its bytes move; it opened a transfer of its own
MOVED, OPENED = 1, 2


def skeleton_key(b: Bundle, layout_p: GroupLayout, layout_c: GroupLayout, first_piece: int) -> tuple[tuple, tuple]:
    """(key, consumer devices) of the skeleton of bundle ``b`` between two layouts: its categories and producer
    device, P's row where the producer is replicated, C's row, and the consumer devices, which for a
    model-parallel C (whose first piece unit is ``first_piece``) are those of the pieces reading the bundle, in
    the order of its consumer units (its option and split are fixed, so they alone enter the key)."""
    if layout_c.model_parallel:
        pieces = layout_c.pieces
        targets = tuple(dict.fromkeys([pieces[u - first_piece].device for u in b.consumer_units]))
        consumer_key = None
    else:
        targets = layout_c.devices
        consumer_key = layout_c.key[1:]
    p_device = b.producer_device
    return (b.pclass, b.demand, p_device, layout_p.key[1:] if p_device < 0 else None, consumer_key, targets), targets


class RawSkeletons(NamedTuple):
    """S skeletons as :func:`make_skeletons` returns them (ids numbered from the offsets it was given)."""

    first_transfer: np.ndarray  # [S]
    transfers: np.ndarray  # [S]
    src: np.ndarray  # [transfers] one skeleton after another
    dst: np.ndarray  # [transfers]
    stage: np.ndarray  # [transfers] 1, or 2 for an AddN root forwarding the sum
    first_part: np.ndarray  # [transfers]
    parts: np.ndarray  # [transfers]
    part_category: np.ndarray  # [parts] index of the category among the bundle's
    part_fraction: np.ndarray  # [parts] fraction of the category's bytes
    part_lo: np.ndarray  # [parts] batch rows [lo, hi) it moves (0, 1 for partials, sums and whole tensors)
    part_hi: np.ndarray  # [parts]
    local: np.ndarray  # [S * D] bool: consumer device d of skeleton s reads the producer's own copy
    coll_first: np.ndarray  # [S]
    colls: np.ndarray  # [S]
    coll_category: np.ndarray  # [collectives] the category synced over the holders
    coll_ps: np.ndarray  # [collectives] bool: by PS (else a ring all-reduce)
    cat_flags: np.ndarray  # [categories of all S] MOVED | OPENED bits of each category


_QUEUE = (("cat_class", "q"), ("cat_demand", "q"), ("categories", "q"), ("hold_device", "q"), ("hold_lo", "d"),
          ("hold_hi", "d"), ("holders", "q"), ("p_split", "b"), ("target_device", "q"), ("targets", "q"),
          ("c_split", "b"), ("c_device", "q"), ("c_lo", "d"), ("c_hi", "d"), ("c_devices", "q"), ("c_ps", "b"))
_QUEUE_DTYPES = tuple((name, {"q": np.int64, "d": np.float64, "b": np.bool_}[code]) for name, code in _QUEUE)


class SkeletonQueue:
    """New skeletons' inputs for :func:`make_skeletons`, gathered one at a time: flat typed buffers (int64,
    float64 or 0/1 bytes; numpy reads them without a copy), CSR columns by their lengths (``categories``,
    ``holders``, ``targets``, ``c_devices``)."""

    def __init__(self) -> None:
        self.columns = {name: array(code) for name, code in _QUEUE}
        self.holders: list[tuple[int, ...]] = []  # [S] the producer's holders of each skeleton

    def __len__(self) -> int:
        return len(self.holders)

    def add(self, b: Bundle, layout_p: GroupLayout, layout_c: GroupLayout, targets: tuple[int, ...]) -> None:
        """Queue the skeleton of bundle ``b`` between two layouts, for the consumer devices ``targets``
        (:func:`skeleton_key`). A bundle from one device (a model-parallel producer's piece) is held whole there."""
        if b.producer_device >= 0:
            holders, lo, hi, p_split = (b.producer_device,), (0.0,), (1.0,), False
        else:
            holders, lo, hi, p_split = layout_p.devices, layout_p.lo, layout_p.hi, layout_p.split
        q = self.columns
        q["cat_class"].extend(b.pclass)
        q["cat_demand"].extend(b.demand)
        q["categories"].append(len(b.pclass))
        q["hold_device"].extend(holders)
        q["hold_lo"].extend(lo)
        q["hold_hi"].extend(hi)
        q["holders"].append(len(holders))
        q["p_split"].append(p_split)
        q["target_device"].extend(targets)
        q["targets"].append(len(targets))
        q["c_split"].append(layout_c.split)
        q["c_device"].extend(layout_c.devices)
        q["c_lo"].extend(layout_c.lo)
        q["c_hi"].extend(layout_c.hi)
        q["c_devices"].append(len(layout_c.devices))
        q["c_ps"].append(layout_c.option == PS)
        self.holders.append(holders)

    def make(self, beta: np.ndarray, num_devices: int, transfer0: int = 0, part0: int = 0,
             coll0: int = 0) -> RawSkeletons:
        """:func:`make_skeletons` of the queued skeletons, in order (``beta`` [D, D]: the bandwidths that choose a
        whole copy's source; transfers, parts and collectives numbered from the offsets given)."""
        columns = self.columns
        inputs = tuple([np.frombuffer(columns[name], dtype=dtype) for name, dtype in _QUEUE_DTYPES])
        return RawSkeletons(*make_skeletons(inputs, beta, num_devices, transfer0, part0, coll0))


# Longer than ~80 lines for a reason: the dispatch of each category to its rule, which must see the whole
# skeleton's state (holders, consumer rows, the transfers opened so far); the rules themselves are below.
@jit
def make_skeletons(inputs, beta, num_devices, transfer0, part0, coll0):
    """The skeletons of S bundles between pairs of layouts (module docstring). ``inputs``: the columns of
    :class:`SkeletonQueue` in its order: skeleton s has ``categories[s]`` categories (class, demand), then
    ``holders[s]`` producer holders (devices, rows lo and hi in order), split by rows if ``p_split[s]``,
    ``targets[s]`` consumer devices, and ``c_devices[s]`` devices of the consumer layout with their rows, split
    by rows if ``c_split[s]``, synced by PS if ``c_ps[s]``, each column one skeleton after another. ``beta``
    [D, D]: the bandwidths that choose a whole copy's source. Returns the fields of :class:`RawSkeletons`."""
    (cat_class, cat_demand, categories, hold_device, hold_lo, hold_hi, holders, p_split, target_device, targets,
     c_split, c_device, c_lo, c_hi, c_devices, c_ps) = inputs
    num = p_split.size
    d = num_devices
    cat_ptr, hold_ptr, target_ptr, c_ptr = _ptr(categories), _ptr(holders), _ptr(targets), _ptr(c_devices)
    bound = 0  # contributions of one skeleton at most (largest), and of all of them
    largest = 1
    for s in range(num):
        size = (cat_ptr[s + 1] - cat_ptr[s]) * ((target_ptr[s + 1] - target_ptr[s]) * (hold_ptr[s + 1] - hold_ptr[s])
                                                + hold_ptr[s + 1] - hold_ptr[s] + target_ptr[s + 1] - target_ptr[s])
        bound += size
        largest = max(largest, size)
    # what one skeleton makes, in order: its transfers (entries: src, dst, stage, parts, where its parts go)
    # and its contributions (made: transfer, category, fraction, lo, hi); slot: (stage, src, dst) -> entry; then
    # the parts of each entry and where they go (_write_transfers)
    work = (np.full((2, d, d), -1, dtype=np.int64), np.empty(largest, dtype=np.int64),
            np.empty(largest, dtype=np.int64), np.empty(largest, dtype=np.int64), np.empty(largest, dtype=np.int64),
            np.empty(largest, dtype=np.int64), np.empty(largest), np.empty(largest), np.empty(largest),
            np.empty(largest, dtype=np.int64), np.empty(largest, dtype=np.int64))
    count = np.zeros(2, dtype=np.int64)  # entries and contributions of the skeleton so far
    out = (np.zeros(num, dtype=np.int64), np.empty(bound, dtype=np.int64), np.empty(bound, dtype=np.int64),
           np.empty(bound, dtype=np.int64), np.empty(bound, dtype=np.int64), np.empty(bound, dtype=np.int64),
           np.empty(bound), np.empty(bound), np.empty(bound))  # transfers [S]; src, dst, stage, parts; parts'
    local = np.zeros(num * d, dtype=np.bool_)
    collective_ptr = np.zeros(num + 1, dtype=np.int64)
    collective_category = np.empty(cat_ptr[num], dtype=np.int64)
    collective_ps = np.empty(cat_ptr[num], dtype=np.bool_)
    cat_flags = np.zeros(cat_ptr[num], dtype=np.int8)
    held = np.zeros(d, dtype=np.bool_)  # the devices holding the producer's copy
    c_index = np.full(d, -1, dtype=np.int64)  # the consumer layout's index of each of its devices
    written = np.zeros(2, dtype=np.int64)  # transfers and parts written
    n_coll = 0
    for s in range(num):
        h0, h1, t0, t1, c0, c1 = hold_ptr[s], hold_ptr[s + 1], target_ptr[s], target_ptr[s + 1], c_ptr[s], c_ptr[s + 1]
        for j in range(h0, h1):
            held[hold_device[j]] = True
        for j in range(c0, c1):
            c_index[c_device[j]] = j
        same_devices = _same_devices(hold_device, h0, h1, c_device, c0, c1)  # the consumer's are the holders
        same_rows = p_split[s] and c_split[s] and same_devices and _same_starts(hold_lo, h0, c_lo, c0, c1)
        count[:] = 0
        bounds = (h0, h1, t0, t1, s * d)  # this skeleton's holders and targets, and its row of local
        for kk in range(cat_ptr[s], cat_ptr[s + 1]):
            entries, contributions = count[0], count[1]
            k = kk - cat_ptr[s]
            pclass, demand = cat_class[kk], cat_demand[kk]
            if pclass == ROWS:
                if same_rows and demand <= 1:
                    _set_targets(local, inputs, bounds)
                else:
                    _rows_rule(k, inputs, bounds, p_split[s], not (c_split[s] and demand <= 1), held, c_index, beta,
                               local, work, count)
            elif pclass == SUMS and p_split[s]:
                if demand == DEMAND_SUM and c_split[s] and same_devices:
                    _set_targets(local, inputs, bounds)
                elif not (demand == DEMAND_SUM and c_split[s]) and _same_set(held, inputs, bounds):
                    collective_category[n_coll] = k  # the consumer's devices are the holders: sync in place
                    collective_ps[n_coll] = c_ps[s]
                    n_coll += 1
                else:
                    _sums_rule(k, inputs, bounds, held, c_device[c0], demand == DEMAND_SUM and c_split[s], local, work,
                               count)
            else:
                _whole_rule(k, inputs, bounds, held, beta, local, work, count)
            cat_flags[kk] = (MOVED if count[1] > contributions else 0) | (OPENED if count[0] > entries else 0)
        collective_ptr[s + 1] = n_coll
        out[0][s] = count[0]
        _write_transfers(work, count, out, written)
        for j in range(h0, h1):
            held[hold_device[j]] = False
        for j in range(c0, c1):
            c_index[c_device[j]] = -1
    n_out, n_parts = written[0], written[1]
    first_transfer = transfer0 + np.cumsum(out[0]) - out[0]
    first_part = part0 + np.cumsum(out[4][:n_out]) - out[4][:n_out]
    return (first_transfer, out[0], out[1][:n_out].copy(), out[2][:n_out].copy(), out[3][:n_out].copy(), first_part,
            out[4][:n_out].copy(), out[5][:n_parts].copy(), out[6][:n_parts].copy(), out[7][:n_parts].copy(),
            out[8][:n_parts].copy(), local, coll0 + collective_ptr[:num], np.diff(collective_ptr),
            collective_category[:n_coll].copy(), collective_ps[:n_coll].copy(), cat_flags)


@inline_jit
def _rows_rule(k, inputs, bounds, p_split, whole_rows, held, c_index, beta, local, work, count):
    """Batch rows → batch rows: each consumer device needs its own rows (or every row, ``whole_rows``); from a
    split producer, **Split / Concat**: one contribution per overlapping holder on another device, the overlap's
    fraction (an overlap of EMPTY or less moves nothing); from a whole copy, the best holder sends them
    (**Transfer**) unless the device holds one. ``bounds``: the skeleton's (first holder, end, first target,
    end, first of its row of ``local``) in the columns of ``inputs``."""
    hold_device, hold_lo, hold_hi, target_device, c_lo, c_hi = (inputs[3], inputs[4], inputs[5], inputs[8],
                                                                inputs[12], inputs[13])
    h0, h1, t0, t1, row = bounds
    for ti in range(t0, t1):
        e = target_device[ti]
        need_lo, need_hi = (0.0, 1.0) if whole_rows else (c_lo[c_index[e]], c_hi[c_index[e]])
        if p_split:
            # the holders' rows are in order: from the first ending after need_lo, until one starts at need_hi
            j = h0
            while j < h1 and hold_hi[j] <= need_lo:
                j += 1
            while j < h1 and hold_lo[j] < need_hi:
                lo, hi = max(hold_lo[j], need_lo), min(hold_hi[j], need_hi)
                if hi - lo > EMPTY:
                    if hold_device[j] == e:
                        local[row + e] = True
                    else:
                        _contribute(work, count, hold_device[j], e, 1, k, hi - lo, lo, hi)
                j += 1
        elif held[e]:
            local[row + e] = True
        else:
            source = _source(hold_device, h0, h1, e, ti - t0, beta)
            _contribute(work, count, source, e, 1, k, need_hi - need_lo, need_lo, need_hi)


@inline_jit
def _sums_rule(k, inputs, bounds, held, c_first, to_split_consumer, local, work, count):
    """Partial sums → elsewhere, **AddN**: every partial to one root, whose own partial stays; the root is the
    consumer's first device for a partial-sum reader of a split consumer (which then reads the sum there),
    else the first consumer device holding a partial (or the first consumer device), which sends the sum on
    to the other consumer devices (stage 2)."""
    hold_device, target_device = inputs[3], inputs[8]
    h0, h1, t0, t1, row = bounds
    if to_split_consumer:
        root = c_first
    else:
        root = target_device[t0]
        for j in range(t0, t1):
            if held[target_device[j]]:
                root = target_device[j]
                break
    for j in range(h0, h1):
        if hold_device[j] == root:
            local[row + root] = True
        else:
            _contribute(work, count, hold_device[j], root, 1, k, 1.0, 0.0, 1.0)
    if not to_split_consumer:
        for j in range(t0, t1):
            if target_device[j] != root:
                _contribute(work, count, root, target_device[j], 2, k, 1.0, 0.0, 1.0)


@inline_jit
def _whole_rule(k, inputs, bounds, held, beta, local, work, count):
    """A whole tensor on every holder → each consumer device without a copy gets one from the best holder
    (**Transfer**)."""
    hold_device, target_device = inputs[3], inputs[8]
    h0, h1, t0, t1, row = bounds
    for ti in range(t0, t1):
        e = target_device[ti]
        if held[e]:
            local[row + e] = True
        else:
            _contribute(work, count, _source(hold_device, h0, h1, e, ti - t0, beta), e, 1, k, 1.0, 0.0, 1.0)


@inline_jit
def _contribute(work, count, s, e, stage, k, fraction, lo, hi):
    """Category ``k`` sends ``fraction`` of its bytes (rows [lo, hi); one message per tensor) from ``s`` to ``e``
    at ``stage``: a contribution to that transfer, opened if new (``work``: the skeleton's entries and
    contributions, ``count`` [2] how many of each)."""
    slot, entry_src, entry_dst, entry_stage, made, made_category, made_fraction, made_lo, made_hi = work[:9]
    entry = slot[stage - 1, s, e]
    if entry < 0:
        entry = slot[stage - 1, s, e] = count[0]
        entry_src[entry], entry_dst[entry], entry_stage[entry] = s, e, stage
        count[0] += 1
    n = count[1]
    made[n], made_category[n], made_fraction[n], made_lo[n], made_hi[n] = entry, k, fraction, lo, hi
    count[1] += 1


@inline_jit
def _write_transfers(work, count, out, written):
    """Write one skeleton's transfers (in order of first contribution, stage 1 then stage 2) and their parts
    into ``out`` from ``written`` [2] (transfers, parts) on, and reset ``work``'s slots."""
    slot, entry_src, entry_dst, entry_stage, made, made_category, made_fraction, made_lo, made_hi, entry_parts, \
        entry_at = work
    _, src, dst, stage, parts, part_category, part_fraction, part_lo, part_hi = out
    entries, n_made = count[0], count[1]
    for i in range(entries):
        slot[entry_stage[i] - 1, entry_src[i], entry_dst[i]] = -1
        entry_parts[i] = 0
    for i in range(n_made):
        entry_parts[made[i]] += 1
    n_out, at = written[0], written[1]
    for wanted in range(1, 3):
        for i in range(entries):
            if entry_stage[i] == wanted:
                entry_at[i] = at
                at += entry_parts[i]
                src[n_out], dst[n_out], stage[n_out], parts[n_out] = entry_src[i], entry_dst[i], wanted, entry_parts[i]
                n_out += 1
    for i in range(n_made):
        p = entry_at[made[i]]
        part_category[p], part_fraction[p], part_lo[p], part_hi[p] = made_category[i], made_fraction[i], made_lo[i], \
            made_hi[i]
        entry_at[made[i]] += 1
    written[0], written[1] = n_out, at


@inline_jit
def _set_targets(local, inputs, bounds):
    """Every consumer device of the skeleton (``bounds``) reads the producer's own copy."""
    target_device = inputs[8]
    _, _, t0, t1, row = bounds
    for j in range(t0, t1):
        local[row + target_device[j]] = True


@jit
def _ptr(counts):
    """[n+1] CSR bounds of ``counts`` [n] rows one after another."""
    ptr = np.zeros(counts.size + 1, dtype=np.int64)
    for i in range(counts.size):
        ptr[i + 1] = ptr[i] + counts[i]
    return ptr


@inline_jit
def _source(hold_device, h0, h1, e, position, beta):
    """The holder (of ``hold_device[h0:h1]``) sending a whole copy to ``e``: best bandwidth, ties (within 1e-9)
    rotating over the consumer devices by ``e``'s ``position`` among them."""
    if h1 - h0 == 1:
        return hold_device[h0]
    best = beta[hold_device[h0], e]
    for j in range(h0 + 1, h1):
        if beta[hold_device[j], e] > best:
            best = beta[hold_device[j], e]
    tied = 0
    for j in range(h0, h1):
        if beta[hold_device[j], e] >= best * (1 - 1e-9):
            tied += 1
    pick = position % tied
    for j in range(h0, h1):
        if beta[hold_device[j], e] >= best * (1 - 1e-9):
            if pick == 0:
                return hold_device[j]
            pick -= 1
    return -1


@inline_jit
def _same_devices(hold_device, h0, h1, c_device, c0, c1):
    """Whether the consumer layout's devices are the holders, in order."""
    if c1 - c0 != h1 - h0:
        return False
    for j in range(c1 - c0):
        if c_device[c0 + j] != hold_device[h0 + j]:
            return False
    return True


@inline_jit
def _same_starts(hold_lo, h0, c_lo, c0, c1):
    """Whether the consumer layout's rows start where the holders' do (same devices: same rows)."""
    for j in range(c1 - c0):
        if c_lo[c0 + j] != hold_lo[h0 + j]:
            return False
    return True


@inline_jit
def _same_set(held, inputs, bounds):
    """Whether the skeleton's consumer devices (distinct) are its holders (``held``)."""
    target_device = inputs[8]
    h0, h1, t0, t1, _ = bounds
    if t1 - t0 != h1 - h0:
        return False
    for j in range(t0, t1):
        if not held[target_device[j]]:
            return False
    return True
