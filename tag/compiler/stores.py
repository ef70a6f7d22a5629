"""What the pair-fragment kernel reads, stored once when made: bundle skeletons with their collectives'
plans, pairs' bundles, and group fragments' compute blocks (:mod:`tag.compiler.evaluate`)."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from tag._arrays import grown
from tag.compiler.arena import _Columns
from tag.compiler.compile import collective_resources
from tag.compiler.layout import ClusterContext, GroupLayout
from tag.compiler.rules import SkeletonQueue, skeleton_key
from tag.compiler.tables import Bundle

class _Skeletons(_Columns):
    """Bundle skeletons (what ``_Compiler._skeleton`` makes: which device sends which fraction of which category
    to which, which consumer devices read the producer's own copy, which categories a collective syncs) as
    arrays for :func:`_pair_fragments`, made by :func:`~tag.compiler.rules.make_skeletons`. S skeletons, D devices.

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
            found = self.rows[key] = self.size["skeleton"] + len(self.queue.holders)
            self.queue.add(b, layout_p, layout_c, targets)
        return found

    def build(self, beta: np.ndarray, context: ClusterContext) -> None:
        """Make the queued skeletons (:func:`~tag.compiler.rules.make_skeletons`, bandwidths ``beta`` [D, D]) and
        store them, with the plans of their collectives (``context``'s rings, parameter servers and collective
        resources)."""
        queue = self.queue
        if not queue.holders:
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


class _GroupBlock(NamedTuple):
    """A group fragment's compute block where chunks are merged, as :meth:`StrategyEvaluator._localize_pair`
    reads it (how merged chunks move a pair's references); what the kernel reads is in :class:`_BlockStore`."""

    merged: int  # its tasks once the chunks of each part are merged (what the arena stores)
    new_id: np.ndarray  # [tasks] merged task of each chunk task
    start_lag: np.ndarray  # [tasks] where each chunk task starts inside its merged task (seconds)
    end_lag: np.ndarray  # [tasks] where it ends
