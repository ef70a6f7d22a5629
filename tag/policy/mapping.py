"""The learned stage-to-device mapper's GNN (DESIGN.md: Policy and search, "the learned mapper").

A :class:`~tag.search.MappingEnv` decides one stage replica ("slot") after another, in the exact
mapper's connectivity order; an action is a device. This module gives that tree its priors and its
default fill, and :func:`learned_mapping` searches it: the greedy decode, greedy decodes under rising
thresholds of the stage time, one pass of limited discrepancy search (the runner-up device at each slot
in turn), then MCTS.

**Graph.** Two node types: slots (stage replicas, K = S·R) and single devices (D). Slot edges join the
replicas that exchange data: replica r of adjacent stages (p2p, Parmesan eq. 8) and consecutive replicas
of one stage's ring (all-reduce, eq. 9). Device edges join each device to its ``DEVICE_NEIGHBOURS``
widest links. Times are in units of the problem's assignment lower bound and bandwidths relative to the
median link, so one network serves 8 or 256 devices, a mesh or a random block topology.

**Network** (:class:`MappingPolicy`): one Linear encoder per node type, then ``num_layers`` residual
GATv2 layers per edge type (``h ← h + ELU(GAT(h))``). It runs once per problem and returns
:class:`DecoderTables`:

- ``static`` [K, D]: a dense layer, ELU and a dense layer over E_slot[k] + E_dev[d] + w·compute(k, d);
- ``affinity`` [D, D]: (Q E_dev[x]) · (K E_dev[d]) / √f, "d suits a slot whose neighbour sits on x";
- ``edge_weight`` [E]: how much each slot edge's affinity counts (a small MLP of both ends and the edge);
- ``beta`` [5]: positive weights of the physical terms below.

**Decoder.** Slot k's logits over the devices, given the devices of the slots decided before it:

    logit[d] = static[k, d] + Σ_{e=(j,k), j<k} w_e · affinity[dev_j, d]
               − β₀ · P[d] − β₁ · relu(c[k, d] + P[d] − T) − β₂ · relu(c[k, d] + P[d] − 1)
               − β₃ · relu(c[k, d] + A[d] − T) − β₄ · relu(c[k, d] + A[d] − 1)

where P[d] is what the decided neighbours' links would add to slot k's stage time under the objective's
instantiation (eq. 6: the sum of the transfers; eq. 7: the ring's slowest hop so far), c its compute and
T the largest such "time at placement" among the earlier slots: the network learns where to go, the
physical terms keep a bottleneck objective in view. A[d] = max(P[d], ret[d]) looks ahead along an
all-reduce ring: the greedy decode learns of a ring's closing hop only at its last replica, so replica
1 ≤ r ≤ R−2 also sees its *return cost* ret[d], a lower bound of the largest hop of the R − r hops from
d back to replica 0's device through devices still free (a bottleneck Bellman–Ford,
:meth:`MappingInstance.closing_table`), and replica 0 the second cheapest hop from d to a free device
(its ring leaves it and comes back, :meth:`MappingInstance.opening_cost`); elsewhere A = P. Since
c + A[d] never exceeds the stage's time in the finished map, a completion under a bound masks the
devices past it (:meth:`MappingDecoder.complete`). Used devices are masked. The decoder is numpy (its
greedy completion a numba kernel that agrees with it bit for bit), O(degree · D) per step plus
O(R · D²) per ring replica, so one forward pass serves a whole search
(memoised per prefix, :class:`MappingDecoder`); :func:`teacher_forced_logits`
computes the same logits for every step of a given mapping at once in torch, for training (a test holds
the two equal).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn import GATv2Conv

from tag._arrays import csr_by_key
from tag._atomic import atomic_open
from tag._compiled import jit as _jit
from tag._read import check_input_file
from tag.errors import OutputError
from tag.exact.mapping import ALLREDUCE, P2P, MappingProblem
from tag.policy.checkpoint import MAX_CHECKPOINT_BYTES, load_weights, read_checkpoint
from tag.policy.errors import PolicyError
from tag.policy.gnn import MAX_HEADS, MAX_LAYERS, MAX_WIDTH

__all__ = [
    "MappingPolicyConfig", "MappingPolicy", "MappingInstance", "DecoderTables", "MappingDecoder",
    "teacher_forced_logits", "numpy_tables", "imitation_loss", "quick_lower_bound", "save_mapping_policy",
    "load_mapping_policy", "MappingCheckpoint", "MAPPING_FEATURE_VERSION", "SLOT_FEATURES", "DEVICE_FEATURES",
    "learned_mapping", "resolve_mapping_policy", "shipped_mapping_checkpoint", "DEFAULT_MAPPER_ITERATIONS",
    "DEFAULT_MAPPER_DISCREPANCIES", "FAST_MAPPER_ITERATIONS", "FAST_MAPPER_DISCREPANCIES", "RING_START_WIDTH",
]

MAPPING_FEATURE_VERSION = 2
SLOT_FEATURES = 10
DEVICE_FEATURES = 8
SLOT_EDGE_FEATURES = 4
DEVICE_EDGE_FEATURES = 3
DEVICE_NEIGHBOURS = 8  # device edges: each device's widest links
NEAR_WIDEST = 0.75  # a link this close to a device's widest counts towards its crowding (module docstring)
P2P_EDGE, RING_EDGE = 0, 1
NUM_BETAS = 5  # weights of the decoder's physical terms (module docstring)
_FAR = 1e3  # a return cost with no path (in scale units: a thousand times the lower bound)
_TIE_DECIMALS = 6  # greedy logits equal to this many decimals are a tie: symmetric devices (a mesh's mirror
# images) score equal up to float rounding, which would otherwise pick among them by the order of additions
_TIE_SCALE = 10.0 ** _TIE_DECIMALS  # what np.round multiplies by and divides by again (the greedy kernel)
_BOUND_RTOL = 1e-9  # MappingDecoder.complete gives up on a running time only this far above its bound (rounding)
_MASKED = -1e9  # logit of a used device (finite, so that training never sees inf − inf)

CHECKPOINT_FORMAT = "tag.mapping-policy"
CHECKPOINT_VERSION = 1
_REQUIRED = ("format", "version", "feature_version", "config", "model", "optimizer", "step")


# --------------------------------------------------------------------------------------- the instance


def quick_lower_bound(problem: MappingProblem, instantiation: str) -> float:
    """Seconds: a lower bound of the objective in O(S·D + D²), the unit of every time the network sees.

    Each stage runs on its fastest device and talks over the cluster's widest link with its least
    latency: eq. (6) or (7) with every link at its best. Weaker than
    :func:`~tag.exact.assignment_lower_bound` but ~100× cheaper at 256 devices, and the same at
    training and planning time, which is what a normalisation needs."""
    off = ~np.eye(problem.num_devices, dtype=bool)
    widest = float(problem.bandwidth[off].max()) if off.any() else math.inf
    nearest = float(problem.latency[off].min()) if off.any() else 0.0
    best = problem.compute_time().min(axis=1)  # [S]
    replicas = problem.num_replicas
    if instantiation == P2P:
        pairs, pair_bytes = problem.stage_pairs()
        for (s, t), nbytes in zip(pairs.tolist(), pair_bytes.tolist()):
            best[s] += nearest + nbytes / widest
            best[t] += nearest + nbytes / widest
    elif replicas >= 2:
        best = best + np.where(problem.param_bytes > 0, 2.0 * (replicas - 1) * nearest
                               + 2.0 * (replicas - 1) / replicas * problem.param_bytes / widest, 0.0)
    return float(best.max())


def _ring_hops(replicas: int) -> np.ndarray:
    """[H, 2] the hops (r, r') of a ring of ``replicas``, r < r', in ascending order: (0, 1), (0, R − 1),
    (1, 2), …, (R − 2, R − 1); one hop for R = 2, none for R < 2."""
    if replicas < 2:
        return np.zeros((0, 2), dtype=np.int64)
    inner = np.arange(1, replicas - 1, dtype=np.int64)
    first = [[0, 1]] + ([[0, replicas - 1]] if replicas > 2 else [])
    return np.concatenate([np.asarray(first, dtype=np.int64), np.stack([inner, inner + 1], axis=1)])


def _median_and_reciprocal_median(values: np.ndarray) -> tuple[float, float]:
    """(np.median(values), np.median(1 / values)) bit for bit from one partition: 1 / x reverses the
    order, so the middle elements of the reciprocals are the reciprocals of the middle elements."""
    count = len(values)
    half = count // 2
    if count % 2:
        middle = float(np.partition(values, half)[half])
        return middle, 1.0 / middle
    low, high = np.partition(values, [half - 1, half])[half - 1:half + 1].tolist()
    return (low + high) / 2.0, (1.0 / low + 1.0 / high) / 2.0


@dataclass(frozen=True, eq=False)
class MappingInstance:
    """A mapping problem seen from the tree: slots in the search's order, times over ``scale``."""

    problem: MappingProblem
    instantiation: str  # "p2p" or "allreduce": which edges the objective counts
    scale: float  # seconds: quick_lower_bound (1 when it is 0)
    slot_stage: np.ndarray  # [K] int64
    slot_replica: np.ndarray  # [K] int64
    compute: np.ndarray  # [K, D] compute seconds of the slot's stage on each device / scale
    edge_a: np.ndarray  # [E] int64 the earlier slot of each edge (a < b in the search's order)
    edge_b: np.ndarray  # [E] int64 the later slot
    edge_kind: np.ndarray  # [E] int64 P2P_EDGE or RING_EDGE
    edge_coef: np.ndarray  # [E] bytes over the link per iteration: M(s, s') or 2(R−1)/R · P(s)
    edge_latency_mult: np.ndarray  # [E] latencies the edge pays: 1, or 2(R−1) for a ring hop
    edge_counted: np.ndarray  # [E] bool: the objective's instantiation counts it
    ring_start: np.ndarray  # [K] int64 slot of the same stage's replica 0 where the look-ahead applies, else -1
    hops_left: np.ndarray  # [K] int64 R − r: the ring hops from slot k's device back to replica 0
    ring_coef: np.ndarray  # [K] bytes of one ring hop of the slot's stage, 2(R−1)/R · P(s) (0: no ring)
    inv_bandwidth: np.ndarray  # [D, D] 1 / bytes/s, 0 on the diagonal
    near_share: np.ndarray  # [D, D] row d: 1 / n_d on d's n_d near-widest links (≥ NEAR_WIDEST of its widest)
    latency: np.ndarray  # [D, D] seconds
    slot_x: np.ndarray  # [K, SLOT_FEATURES]
    device_x: np.ndarray  # [D, DEVICE_FEATURES]
    device_edge_index: np.ndarray  # [2, E_dev] int64 (source, target)
    device_edge_attr: np.ndarray  # [E_dev, DEVICE_EDGE_FEATURES]
    slot_edge_x: np.ndarray  # [E, SLOT_EDGE_FEATURES] bytes at the median link over the scale, kind one-hot, counted

    @property
    def num_slots(self) -> int:
        return len(self.slot_stage)

    @property
    def num_devices(self) -> int:
        return self.compute.shape[1]

    @classmethod
    def build(cls, problem: MappingProblem, instantiation: str, slot_stage: Sequence[int],
              slot_replica: Sequence[int]) -> MappingInstance:
        """The instance of ``problem`` with slots in the order (``slot_stage``, ``slot_replica``) [K]."""
        if instantiation not in (P2P, ALLREDUCE):
            raise PolicyError(f"instantiation must be {P2P!r} or {ALLREDUCE!r}, got {instantiation!r}")
        slot_stage = np.asarray(slot_stage, dtype=np.int64)
        slot_replica = np.asarray(slot_replica, dtype=np.int64)
        stages, replicas, devices = problem.num_stages, problem.num_replicas, problem.num_devices
        keys = slot_stage * replicas + slot_replica
        if (slot_stage.shape != (stages * replicas,) or slot_replica.shape != slot_stage.shape
                or ((slot_stage < 0) | (slot_stage >= stages) | (slot_replica < 0) | (slot_replica >= replicas)).any()
                or np.bincount(keys, minlength=len(keys)).max(initial=0) > 1):
            raise PolicyError("slot_stage and slot_replica must list every (stage, replica) once")
        scale = quick_lower_bound(problem, instantiation)
        scale = scale if scale > 0 else 1.0
        slot_of = np.empty((stages, replicas), dtype=np.int64)
        slot_of[slot_stage, slot_replica] = np.arange(len(slot_stage))
        compute = problem.compute_time()[slot_stage] / scale  # [K, D]

        # edges: per stage pair, one p2p edge per replica; then per stage with parameters its ring's hops
        pairs, pair_bytes = problem.stage_pairs()
        pairs = pairs.reshape(-1, 2)
        p2p_ends = np.stack([slot_of[pairs[:, 0]], slot_of[pairs[:, 1]]], axis=-1).reshape(-1, 2)  # [P·R, 2]
        hops = _ring_hops(replicas)
        rings = np.flatnonzero(problem.param_bytes > 0) if replicas >= 2 else np.zeros(0, dtype=np.int64)
        ring_ends = slot_of[rings][:, hops].reshape(-1, 2)  # [S'·H, 2]
        ends_arr = np.sort(np.concatenate([p2p_ends, ring_ends]), axis=1)
        edge_kind = np.repeat(np.asarray([P2P_EDGE, RING_EDGE], dtype=np.int64), [len(p2p_ends), len(ring_ends)])
        coefs = np.concatenate([np.repeat(np.asarray(pair_bytes, dtype=np.float64), replicas),
                                np.repeat(2.0 * (replicas - 1) / replicas
                                          * problem.param_bytes[rings].astype(np.float64), len(hops))])
        mults = np.where(edge_kind == RING_EDGE, 2.0 * (replicas - 1), 1.0)
        counted = edge_kind == (P2P_EDGE if instantiation == P2P else RING_EDGE)
        ring_coef = 2.0 * (replicas - 1) / replicas * problem.param_bytes[slot_stage].astype(np.float64)  # [K]
        looks_ahead = (instantiation == ALLREDUCE) & (ring_coef > 0) & (slot_replica <= replicas - 2)
        ring_start = np.where(looks_ahead, slot_of[slot_stage, 0], -1)  # replica 0: its own slot (opening_cost)

        off = ~np.eye(devices, dtype=bool)
        bandwidth = problem.bandwidth
        inv_bandwidth = np.where(off, 1.0 / np.where(off, bandwidth, 1.0), 0.0)
        reference, inverse_reference = _median_and_reciprocal_median(bandwidth[off]) if devices > 1 else (1.0, 1.0)
        edge_coef = np.asarray(coefs, dtype=np.float64)

        slot_x = np.zeros((len(slot_stage), SLOT_FEATURES))
        slot_x[:, 0] = compute.mean(axis=1)
        slot_x[:, 1] = compute.min(axis=1)
        slot_x[:, 2] = compute.max(axis=1)
        comm = edge_coef / (reference * scale)
        for kind, column in ((P2P_EDGE, 3), (RING_EDGE, 4)):
            chosen = edge_kind == kind
            for end in (ends_arr[chosen, 0], ends_arr[chosen, 1]):
                np.add.at(slot_x[:, column], end, comm[chosen])
        slot_x[:, 5] = slot_replica / replicas
        slot_x[:, 6] = np.arange(len(slot_stage)) // replicas / stages
        slot_x[:, 7] = 1.0 / replicas
        slot_x[:, 8] = 1.0 / stages
        slot_x[:, 9] = float(instantiation == ALLREDUCE)

        widths = np.sort(np.where(off, bandwidth, 0.0), axis=1)[:, ::-1][:, :max(devices - 1, 1)]  # [D, D-1]
        widths = np.maximum(widths, 1e-30)
        device_x = np.zeros((devices, DEVICE_FEATURES))
        mean_compute = compute.mean()
        device_x[:, 0] = compute.mean(axis=0) / mean_compute if mean_compute > 0 else 1.0
        if devices > 1:
            device_x[:, 1] = np.log(widths[:, 0] / reference)
            device_x[:, 2] = np.log(widths[:, :4].mean(axis=1) / reference)
            device_x[:, 3] = np.log(widths.mean(axis=1) / reference)
            device_x[:, 4] = np.log(widths[:, -1] / reference)
            device_x[:, 5] = np.where(off, problem.latency, 0.0).sum(axis=1) / (devices - 1) / scale
            device_x[:, 7] = (widths >= 0.5 * widths[:, :1]).mean(axis=1)
        device_x[:, 6] = math.log2(devices) / 8.0
        near = off & (bandwidth >= NEAR_WIDEST * widths[:, :1])  # [D, D]
        near_share = near / np.maximum(near.sum(axis=1, keepdims=True), 1)

        neighbours = min(DEVICE_NEIGHBOURS, devices - 1)
        if neighbours > 0:
            order = np.argsort(-np.where(off, bandwidth, -np.inf), axis=1, kind="stable")[:, :neighbours]
            source = order.reshape(-1)
            target = np.repeat(np.arange(devices), neighbours)
            link = bandwidth[source, target]
            device_edge_index = np.stack([source, target]).astype(np.int64)
            device_edge_attr = np.stack([np.log(link / reference), reference / link,
                                         problem.latency[source, target] / scale], axis=1)
        else:
            device_edge_index = np.zeros((2, 0), dtype=np.int64)
            device_edge_attr = np.zeros((0, DEVICE_EDGE_FEATURES))
        # the edges' features divide by 1 / median(1 / B), not by the median B: the two differ when the
        # median is the mean of two middle links
        slot_edge_x = np.stack([edge_coef / (1.0 / inverse_reference * scale), edge_kind == P2P_EDGE,
                                edge_kind == RING_EDGE, counted], axis=1).astype(np.float64)
        return cls(problem, instantiation, scale, slot_stage, slot_replica, compute, ends_arr[:, 0].copy(),
                   ends_arr[:, 1].copy(), edge_kind, edge_coef, np.asarray(mults, dtype=np.float64), counted,
                   ring_start, replicas - slot_replica, ring_coef, inv_bandwidth, near_share, problem.latency.copy(), slot_x,
                   device_x, device_edge_index, device_edge_attr, slot_edge_x)

    @classmethod
    def from_env(cls, env: Any) -> MappingInstance:
        """The instance of a :class:`tag.search.MappingEnv` (its problem, order and instantiation)."""
        return cls.build(env.problem, env.instantiation, env.slot_stage, env.slot_replica)

    def slot_edge_attr(self) -> np.ndarray:
        """[E, SLOT_EDGE_FEATURES] bytes at the median link over the scale, kind one-hot, counted."""
        return self.slot_edge_x

    def edge_cost(self, edge: int, device: int) -> np.ndarray:
        """[D] what edge ``edge`` adds to its later slot's time when its earlier slot is on ``device`` and
        the later one on each device (0 when the objective does not count the edge), over the scale."""
        if not self.edge_counted[edge]:
            return np.zeros(self.num_devices)
        return (self.edge_latency_mult[edge] * self.latency[device]
                + self.edge_coef[edge] * self.inv_bandwidth[device]) / self.scale

    def hop_cost(self, slot: int) -> np.ndarray:
        """[D, D] what one ring hop between two devices adds to slot ``slot``'s stage, over the scale; ∞ on
        the diagonal (a hop joins two devices)."""
        replicas = self.problem.num_replicas
        cost = (2.0 * (replicas - 1) * self.latency + self.ring_coef[slot] * self.inv_bandwidth) / self.scale
        np.fill_diagonal(cost, np.inf)
        return cost

    def closing_table(self, slot: int, devices: Sequence[int]) -> np.ndarray:
        """[R − 1, D] for the ring of look-ahead slot ``slot``, its replica 0 on ``devices[ring_start]``:
        row h − 1 bounds from below the least largest hop of a path of h hops from replica 0's device to
        each device through devices still free before ``slot``; row R − r − 1 is then the cheapest the
        rest of the ring can close from a device of replica r: its *return cost*. Three bounds, each
        the ring's closing path must meet (a bottleneck Bellman–Ford gives the first two):

        - at most h − 1 hops to a free device, then one hop from it (not "at most h hops": the direct
          link priced a last look-ahead replica's way back though two hops were left);
        - the closing hop: the last replica, on a free device other than the one priced, joins replica
          0's device (a ring that took the last free device next to its replica 0 saw a cheap way back);
        - through the devices free *now*: the ring's own replicas 1..r − 1 are not on the way back (a
          ring walking a line of a mesh saw a one-hop way back over what it had just taken).

        Each of the three, missing, let the greedy decode build 2D-mesh rings that had to close over a
        long link at their last replica. Row 0 is the direct hop."""
        first = int(self.ring_start[slot])
        hop = self.hop_cost(slot)
        inner = np.ones(self.num_devices, dtype=bool)
        inner[list(devices[:slot])] = False
        start = int(devices[first])
        at_most = _bottleneck_paths(hop, start, inner, self.problem.num_replicas - 1)  # [R − 1, D]
        table = at_most.copy()
        # h ≥ 2 hops: the last one comes from another free device (a path of h hops, not at most h)
        table[1:] = np.maximum(at_most[:-1, inner][:, :, None], hop[inner][None]).min(axis=1, initial=np.inf)
        closing = np.where(inner, hop[start], np.inf)  # [D] the closing hop from each free device
        nearest = int(np.argmin(closing))
        floor = np.full(self.num_devices, closing[nearest])  # [D] the cheapest closing hop from another device
        floor[nearest] = np.delete(closing, nearest).min(initial=np.inf)
        table[1:] = np.maximum(table[1:], floor)
        return np.minimum(table, _FAR)

    def opening_cost(self, slot: int, devices: Sequence[int]) -> np.ndarray:
        """[D] the return cost of a ring's replica 0 (look-ahead slot ``slot`` that starts its ring) on
        each device: its ring leaves it for replica 1 and comes back from replica R − 1, two devices free
        before ``slot`` (one when R = 2), so it pays at least the second cheapest hop to a free device.
        Without it a ring started in a corner of a 2D mesh with one free neighbour left, and had to
        close over a long link."""
        free = np.ones(self.num_devices, dtype=bool)
        free[list(devices[:slot])] = False
        needed = min(2, self.problem.num_replicas - 1)
        links = np.sort(np.where(free[None, :], self.hop_cost(slot), np.inf), axis=1)  # [D, D]
        return np.minimum(links[:, needed - 1], _FAR)

    def return_cost(self, slot: int, devices: Sequence[int], hop: np.ndarray | None = None) -> np.ndarray:
        """[D] look-ahead slot ``slot``'s return cost with the slots before it on ``devices``:
        :meth:`opening_cost` at a ring's replica 0, else row R − r − 1 of :meth:`closing_table`, computed
        by the compiled kernels the greedy decode runs (:func:`_opening_row`, :func:`_return_row`: the same
        rows bit for bit, a tenth of the time; the numpy methods are their reference). ``hop``: the
        slot's :meth:`hop_cost`, when the caller has it."""
        hop = self.hop_cost(slot) if hop is None else hop
        first, hops = int(self.ring_start[slot]), int(self.hops_left[slot])
        prefix = np.asarray(devices[:slot], dtype=np.int64)
        row = np.empty(self.num_devices)
        if first == slot:  # replica 0
            _opening_row(hop, prefix, slot, min(2, hops - 1), row)
        else:
            _return_row(hop, prefix, first, slot, hops, np.empty((max(hops - 1, 1), self.num_devices)), row)
        return row

    def return_costs(self, devices: Sequence[int]) -> np.ndarray:
        """[K, D] the return cost of every look-ahead slot k under the mapping ``devices`` [K] (0 for the
        other slots); row k depends on ``devices[:k]`` only."""
        out = np.zeros((self.num_slots, self.num_devices))
        hops: dict[int, np.ndarray] = {}  # stage -> its ring's hop costs
        for k in np.flatnonzero(self.ring_start >= 0).tolist():
            stage = int(self.slot_stage[k])
            if stage not in hops:
                hops[stage] = self.hop_cost(k)
            out[k] = self.return_cost(k, devices, hops[stage])
        return out


def _bottleneck_paths(hop: np.ndarray, start: int, inner: np.ndarray, hops: int) -> np.ndarray:
    """[hops, D] row h − 1: min over paths of at most h hops from ``start`` to each device, with inner
    devices where ``inner`` [D] is True, of the path's largest ``hop`` [D, D] cost."""
    best = hop[start].copy()  # [D]
    table = np.empty((hops, len(best)))
    table[0] = best
    via = hop[inner]  # [A, D]
    for h in range(1, hops):
        longer = np.minimum(best, np.maximum(best[inner][:, None], via).min(axis=0, initial=np.inf))
        if np.array_equal(longer, best):  # converged: more hops find nothing cheaper
            table[h:] = best
            break
        best = table[h] = longer
    return table


# --------------------------------------------------------------------------------------- the network


@dataclass(frozen=True)
class MappingPolicyConfig:
    """The mapping GNN's hyper-parameters, for the entry points (training, checkpoints)."""

    hidden: int = 64  # f: width of every embedding
    heads: int = 4  # attention heads per GATv2 layer; must divide hidden
    num_layers: int = 3  # message-passing layers per edge type

    def __post_init__(self) -> None:
        for name, most in (("hidden", MAX_WIDTH), ("heads", MAX_HEADS), ("num_layers", MAX_LAYERS)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
                raise PolicyError(f"{name} must be an integer in 1..{most}, got {value!r}")
        if self.hidden % self.heads:
            raise PolicyError(f"heads ({self.heads}) must divide hidden ({self.hidden})")

    @classmethod
    def from_dict(cls, values: Any) -> MappingPolicyConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(values, dict) or set(values) != names:
            raise PolicyError(f"mapping policy config must be a dict with fields {sorted(names)}, got {values!r}")
        return cls(**values)


class DecoderTables(NamedTuple):
    """What one forward pass gives the decoder: torch tensors from :meth:`MappingPolicy.forward`, numpy
    arrays from :func:`numpy_tables`."""

    static: Tensor  # [K, D]
    affinity: Tensor  # [D, D]
    edge_weight: Tensor  # [E]
    beta: Tensor  # [NUM_BETAS] positive
    crowding: Tensor  # [] weight of the share of a device's near links still free


class MappingPolicy(nn.Module):
    """The mapping GNN (module docstring)."""

    def __init__(self, config: MappingPolicyConfig = MappingPolicyConfig()) -> None:
        super().__init__()
        self.config = config
        f, heads = config.hidden, config.heads
        self.slot_in = nn.Linear(SLOT_FEATURES, f)
        self.device_in = nn.Linear(DEVICE_FEATURES, f)
        self.slot_layers = nn.ModuleList(GATv2Conv(f, f // heads, heads=heads, edge_dim=SLOT_EDGE_FEATURES,
                                                   add_self_loops=False) for _ in range(config.num_layers))
        self.device_layers = nn.ModuleList(GATv2Conv(f, f // heads, heads=heads, edge_dim=DEVICE_EDGE_FEATURES,
                                                     add_self_loops=False) for _ in range(config.num_layers))
        self.pair_slot = nn.Linear(f, f)
        self.pair_device = nn.Linear(f, f, bias=False)
        self.pair_compute = nn.Parameter(torch.zeros(f))
        self.pair_out = nn.Linear(f, 1)
        self.query = nn.Linear(f, f, bias=False)
        self.key = nn.Linear(f, f, bias=False)
        self.edge_mlp = nn.Sequential(nn.Linear(2 * f + SLOT_EDGE_FEATURES, f), nn.ELU(), nn.Linear(f, 1))
        self.beta_raw = nn.Parameter(torch.zeros(NUM_BETAS))
        self.crowding = nn.Parameter(torch.zeros(()))

    def forward(self, instance: MappingInstance) -> DecoderTables:
        slot_x = torch.as_tensor(instance.slot_x, dtype=torch.float32)
        device_x = torch.as_tensor(instance.device_x, dtype=torch.float32)
        ends = torch.as_tensor(np.stack([instance.edge_a, instance.edge_b]), dtype=torch.long)  # [2, E]
        slot_index = torch.cat([ends, ends.flip(0)], dim=1)  # both directions
        edge_attr = torch.as_tensor(instance.slot_edge_attr(), dtype=torch.float32)  # [E, 4]
        slot_attr = torch.cat([edge_attr, edge_attr], dim=0)
        device_index = torch.as_tensor(instance.device_edge_index, dtype=torch.long)
        device_attr = torch.as_tensor(instance.device_edge_attr, dtype=torch.float32)

        h_slot = F.elu(self.slot_in(slot_x))  # [K, f]
        h_dev = F.elu(self.device_in(device_x))  # [D, f]
        for slot_layer, device_layer in zip(self.slot_layers, self.device_layers):
            if slot_index.shape[1]:
                h_slot = h_slot + F.elu(slot_layer(h_slot, slot_index, slot_attr))
            if device_index.shape[1]:
                h_dev = h_dev + F.elu(device_layer(h_dev, device_index, device_attr))

        compute = torch.as_tensor(instance.compute, dtype=torch.float32)  # [K, D]
        hidden = (self.pair_slot(h_slot)[:, None, :] + self.pair_device(h_dev)[None, :, :]
                  + compute[:, :, None] * self.pair_compute)  # [K, D, f]
        static = self.pair_out(F.elu(hidden)).squeeze(-1)  # [K, D]
        affinity = self.query(h_dev) @ self.key(h_dev).T / math.sqrt(self.config.hidden)  # [D, D]
        a, b = h_slot[ends[0]], h_slot[ends[1]]
        edge_weight = self.edge_mlp(torch.cat([a + b, a * b, edge_attr], dim=1)).squeeze(-1)  # [E]
        beta = F.softplus(self.beta_raw) + 0.1  # bounded away from 0: the physical terms always count
        return DecoderTables(static, affinity, edge_weight, beta, self.crowding)


def numpy_tables(policy: MappingPolicy, instance: MappingInstance) -> DecoderTables:
    """:meth:`MappingPolicy.forward` in numpy (float32), for inference: the same tables as numpy arrays
    without torch's and PyG's per-call overhead, which dominates at the sizes a mapper sees (a test holds
    the two equal)."""
    weights = _numpy_weights(policy)

    def linear(name: str, x: np.ndarray) -> np.ndarray:
        out = x @ weights[f"{name}.weight"].T
        bias = weights.get(f"{name}.bias")
        return out if bias is None else out + bias

    ends = np.stack([instance.edge_a, instance.edge_b])  # [2, E]
    slot_index = np.concatenate([ends, ends[::-1]], axis=1)
    edge_attr = instance.slot_edge_attr().astype(np.float32)  # [E, 4]
    slot_attr = np.concatenate([edge_attr, edge_attr])
    device_attr = instance.device_edge_attr.astype(np.float32)
    h_slot = _elu(linear("slot_in", instance.slot_x.astype(np.float32)))  # [K, f]
    h_dev = _elu(linear("device_in", instance.device_x.astype(np.float32)))  # [D, f]
    for layer in range(policy.config.num_layers):
        if slot_index.shape[1]:
            h_slot = h_slot + _elu(_gatv2(weights, f"slot_layers.{layer}", policy.config.heads, h_slot, slot_index,
                                          slot_attr))
        if instance.device_edge_index.shape[1]:
            h_dev = h_dev + _elu(_gatv2(weights, f"device_layers.{layer}", policy.config.heads, h_dev,
                                        instance.device_edge_index, device_attr))
    compute = instance.compute.astype(np.float32)  # [K, D]
    # the [K, D, f] pair layer dominates at 256 devices: built and ELU'd in place, two buffers in all
    hidden = np.add(linear("pair_slot", h_slot)[:, None, :], linear("pair_device", h_dev)[None, :, :])  # [K, D, f]
    buffer = np.multiply(compute[:, :, None], weights["pair_compute"])  # [K, D, f]
    hidden += buffer
    np.minimum(hidden, 0.0, out=buffer)  # ELU(x) = max(x, 0) + expm1(min(x, 0)), as _elu
    np.expm1(buffer, out=buffer)
    np.maximum(hidden, 0.0, out=hidden)
    hidden += buffer
    static = linear("pair_out", hidden)[..., 0]  # [K, D]
    affinity = linear("query", h_dev) @ linear("key", h_dev).T / np.float32(math.sqrt(policy.config.hidden))
    a, b = h_slot[ends[0]], h_slot[ends[1]]
    edge_hidden = _elu(linear("edge_mlp.0", np.concatenate([a + b, a * b, edge_attr], axis=1)))
    edge_weight = linear("edge_mlp.2", edge_hidden)[:, 0]  # [E]
    beta = np.logaddexp(0.0, weights["beta_raw"]) + 0.1  # softplus, as in forward
    return DecoderTables(static, affinity, edge_weight, beta, weights["crowding"])


def _elu(x: np.ndarray) -> np.ndarray:
    return np.where(x > 0, x, np.expm1(np.minimum(x, 0)))


_WEIGHTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # policy -> (_Holders, numpy views)


class _Holders(NamedTuple):
    """Where a policy's parameters sat when their numpy views were taken: each (container dict, key,
    object) of every module's ``_modules`` and ``_parameters``, and each parameter's data pointer."""

    slots: list[tuple[dict, str, Any]]
    parameters: list[Tensor]
    pointers: list[int]

    @classmethod
    def of(cls, policy: nn.Module) -> _Holders:
        slots: list[tuple[dict, str, Any]] = []
        for module in policy.modules():
            slots += [(module._modules, name, child) for name, child in module._modules.items()]
            slots += [(module._parameters, name, value) for name, value in module._parameters.items()]
        parameters = list(policy.parameters())
        return cls(slots, parameters, [p.data_ptr() for p in parameters])

    def hold(self) -> bool:
        """Whether every module and parameter is still where it was, on the same memory."""
        return (all(container.get(name) is value for container, name, value in self.slots)
                and [p.data_ptr() for p in self.parameters] == self.pointers)


def _numpy_weights(policy: MappingPolicy) -> dict[str, np.ndarray]:
    """The policy's parameters by name as numpy arrays, memoised per policy: a mapper maps many problems
    with one policy, and building them from ``state_dict`` each time cost a fifth of the forward pass at
    64 devices. The arrays share the parameters' memory, so in-place updates (an optimizer step,
    ``load_state_dict``) show through; a module or parameter replaced by another object, or a parameter
    given other memory (``param.data = ...``), rebuilds them. The check walks recorded dicts, not
    ``policy.parameters()``, whose generators cost 40 µs a call."""
    cached = _WEIGHTS.get(policy)
    if cached is None or not cached[0].hold():
        cached = _WEIGHTS[policy] = (_Holders.of(policy), {name: value.detach().numpy()
                                                          for name, value in policy.named_parameters()})
    return cached[1]


def _gatv2(weights: dict[str, np.ndarray], name: str, heads: int, x: np.ndarray, index: np.ndarray,
           attr: np.ndarray) -> np.ndarray:
    """PyG's GATv2Conv (no self-loops, heads concatenated) on ``x`` [N, f] over ``index`` [2, E] (source,
    target) with ``attr`` [E, F]: attention softmaxed over each target's incoming edges."""
    num_nodes = len(x)
    x_l = (x @ weights[f"{name}.lin_l.weight"].T + weights[f"{name}.lin_l.bias"]).reshape(num_nodes, heads, -1)
    x_r = (x @ weights[f"{name}.lin_r.weight"].T + weights[f"{name}.lin_r.bias"]).reshape(num_nodes, heads, -1)
    source, target = index
    message = x_l[source]  # [E, H, C]
    e = message + x_r[target]
    e += (attr @ weights[f"{name}.lin_edge.weight"].T).reshape(len(source), heads, -1)
    np.maximum(e, np.multiply(e, np.float32(0.2)), out=e)  # leaky ReLU, slope 0.2, in place
    e *= weights[f"{name}.att"]
    score = e.sum(axis=-1)  # [E, H]
    target = np.ascontiguousarray(target)
    alpha = np.exp(score - _segment_max(score, target, num_nodes)[target])  # numpy's exp: as before, bit for bit
    return _attend(message, alpha, target, num_nodes).reshape(num_nodes, -1) + weights[f"{name}.bias"]


def teacher_forced_logits(tables: DecoderTables, instance: MappingInstance, devices: Sequence[int]) -> Tensor:
    """[K, D] the decoder's logits at every step of the mapping that puts slot k on ``devices[k]`` [K]:
    step k sees slots 0..k−1 decided as ``devices`` says (used devices get a large negative logit)."""
    num_slots, num_devices = instance.num_slots, instance.num_devices
    dev = torch.as_tensor(np.asarray(devices, dtype=np.int64))
    a = torch.as_tensor(instance.edge_a)
    b = torch.as_tensor(instance.edge_b)
    src = dev[a]  # [E] device of each edge's earlier slot
    counted = torch.as_tensor(instance.edge_counted, dtype=torch.float64)
    cost = ((torch.as_tensor(instance.edge_latency_mult)[:, None] * torch.as_tensor(instance.latency)[src]
             + torch.as_tensor(instance.edge_coef)[:, None] * torch.as_tensor(instance.inv_bandwidth)[src])
            * (counted / instance.scale)[:, None])  # [E, D]
    ring = torch.as_tensor(instance.edge_kind == RING_EDGE)
    added = (torch.zeros(num_slots, num_devices, dtype=torch.float64).index_add(0, b[~ring], cost[~ring])
              + torch.zeros(num_slots, num_devices, dtype=torch.float64).scatter_reduce(
                 0, b[ring][:, None].expand(-1, num_devices), cost[ring], "amax"))  # P [K, D]
    pull = torch.zeros(num_slots, num_devices, dtype=tables.affinity.dtype).index_add(
        0, b, tables.edge_weight[:, None] * tables.affinity[src])  # [K, D]
    compute = torch.as_tensor(instance.compute)
    partial = compute + added  # [K, D]
    ahead = compute + torch.maximum(added, torch.as_tensor(instance.return_costs(devices)))  # [K, D]
    placed = partial[torch.arange(num_slots), dev]  # [K] time of each slot when it was placed
    running = torch.cummax(placed, dim=0).values
    before = torch.cat([torch.zeros(1, dtype=running.dtype), running[:-1]])[:, None]  # T of step k
    beta = tables.beta
    logits = (tables.static + pull - beta[0] * added.float()
              - beta[1] * F.relu(partial - before).float() - beta[2] * F.relu(partial - 1.0).float()
              - beta[3] * F.relu(ahead - before).float() - beta[4] * F.relu(ahead - 1.0).float())
    position = torch.full((num_devices,), num_slots, dtype=torch.long)
    position[dev] = torch.arange(num_slots)
    used = position[None, :] < torch.arange(num_slots)[:, None]  # [K, D] device taken before step k
    crowd = (~used).double() @ torch.as_tensor(instance.near_share).T  # [K, D]
    return (logits + tables.crowding * crowd.float()).masked_fill(used, _MASKED)


def imitation_loss(tables: DecoderTables, instance: MappingInstance, devices: Sequence[int]) -> Tensor:
    """Mean cross-entropy of choosing ``devices[k]`` at step k under teacher forcing."""
    logits = teacher_forced_logits(tables, instance, devices)
    return F.cross_entropy(logits, torch.as_tensor(np.asarray(devices, dtype=np.int64)))


# --------------------------------------------------------------------------------------- the decoder


class MappingDecoder:
    """Priors and greedy completions for a :class:`~tag.search.MappingEnv` from one forward pass.

    A step's logits are a pure function of the decided prefix, so a search's states share work: the
    running time T is memoised per prefix; a greedy completion under its start, and under each state
    whose parent's completion passes through it (the greedy decode is Markov: the completion of
    ``out[:j]`` is ``out``, which MCTS asks for whenever it takes the greedy child); and, for the
    priors, a look-ahead slot's return cost under its replica 0's device and the *set* of devices used
    before it (prefixes that differ only in order share it). The priors and :func:`_greedy_kernel`, which
    computes the return costs of the rings it places itself, run the same compiled kernels for them
    (:func:`_opening_row`, :func:`_return_row`; MappingInstance's numpy versions are the reference)."""

    def __init__(self, policy: MappingPolicy, instance: MappingInstance) -> None:
        tables = numpy_tables(policy, instance)
        self.instance = instance
        self.static = tables.static.astype(np.float64)  # [K, D]
        self.affinity = tables.affinity.astype(np.float64)  # [D, D]
        self.edge_weight = tables.edge_weight.astype(np.float64)  # [E]
        self.beta = tables.beta.astype(np.float64)  # [NUM_BETAS]
        self.crowding = float(tables.crowding)
        self._flat = self._build_flat_tables()  # the kernels' view of the decoder (_build_flat_tables)
        _, src, edges, cost, ring, costs = self._flat[:6]
        by_index = list(costs) + [None]  # index -1: the objective does not count the edge
        earlier: list[list[tuple[int, int, bool, np.ndarray | None]]] = [[] for _ in range(instance.num_slots)]
        for b, e, a, r, c in zip(instance.edge_b[edges].tolist(), edges.tolist(), src.tolist(), ring.tolist(),
                                 cost.tolist()):  # the same tables, per slot, for the Python steps
            earlier[b].append((e, a, r, by_index[c]))
        self._earlier = earlier  # per slot: (edge, earlier slot, a ring hop, [D, D] cost if the objective counts it)
        near = instance.near_share > 0  # [D, D]
        self._near = near.astype(np.int64)  # integer counts keep the crowding exact, whatever the order of updates
        self._near_columns = np.ascontiguousarray(self._near.T)  # row x: column x of _near
        self._near_count = near.sum(axis=1).astype(np.int64)  # [D] near links per device
        self._near_total = np.maximum(self._near_count, 1).astype(np.float64)  # [D] n_d
        self._before: dict[tuple[int, ...], float] = {(): 0.0}  # decided prefix -> T after it
        self._completions: dict[tuple[int, ...], tuple[int, ...]] = {}  # prefix -> its greedy completion
        self._reaches: dict[tuple[int, ...], tuple[int, np.ndarray]] = {}  # greedy completion -> (k0, [K] reach
        #     of each slot's device, set from slot k0 on)
        self._closing: dict[tuple[int, int, int, frozenset[int]], np.ndarray] = {}  # (ring start, its device,
        #     hops back, used set) -> return cost [D]

    def _step(self, k: int, devices: Sequence[int], before: float) -> tuple[np.ndarray, np.ndarray]:
        """(logits [D] unmasked, partial time [D]) of slot k with slots < k on ``devices``."""
        inst = self.instance
        logits = self.static[k].copy()
        added = None  # P [D]: one slot has counted edges of one kind only; None for no counted edge (P = 0)
        for e, a, is_ring, cost in self._earlier[k]:
            x = devices[a]
            logits += self.edge_weight[e] * self.affinity[x]
            if cost is None:
                continue
            if added is None:
                added = cost[x].copy()
            elif is_ring:  # eq. (7): the ring's slowest hop
                np.maximum(added, cost[x], out=added)
            else:  # eq. (6): every transfer
                added += cost[x]
        beta = self.beta
        if added is None:
            partial = inst.compute[k]  # a view: callers only read it
        else:
            partial = inst.compute[k] + added
            logits -= beta[0] * added
        if inst.ring_start[k] < 0:  # A = P: the look-ahead terms add to the plain ones
            logits -= ((beta[1] + beta[3]) * np.maximum(partial - before, 0.0)
                       + (beta[2] + beta[4]) * np.maximum(partial - 1.0, 0.0))
        else:
            ret = self._return_cost(k, devices)
            ahead = inst.compute[k] + (ret if added is None else np.maximum(added, ret))
            logits -= (beta[1] * np.maximum(partial - before, 0.0) + beta[2] * np.maximum(partial - 1.0, 0.0)
                       + beta[3] * np.maximum(ahead - before, 0.0) + beta[4] * np.maximum(ahead - 1.0, 0.0))
        return logits, partial

    def _return_cost(self, k: int, devices: Sequence[int]) -> np.ndarray:
        """[D] look-ahead slot k's return cost (:meth:`MappingInstance.return_cost`, memoised: class
        docstring)."""
        inst = self.instance
        first = int(inst.ring_start[k])
        key = (first, int(devices[first]) if first < k else -1, int(inst.hops_left[k]), frozenset(devices[:k]))
        row = self._closing.get(key)
        if row is None:
            *_, slot_hop, hops = self._flat
            row = self._closing[key] = inst.return_cost(k, devices, hops[slot_hop[k]])
        return row

    def _running_time(self, devices: Sequence[int]) -> float:
        """T after the decided slots: the largest time at placement among them. Memoised per prefix: a
        search asks for a state's priors and then its fill, and each state extends its parent by one."""
        key = tuple(devices)
        before = self._before.get(key)
        if before is None:
            before = self._running_time(key[:-1])
            before = self._before[key] = max(before, self._placement_time(len(key) - 1, key))
        return before

    def _placement_time(self, k: int, devices: Sequence[int]) -> float:
        """Slot k's time at placement on ``devices[k]``: :meth:`_step`'s partial time of that one device,
        by the same float operations in the same order (bit for bit), without the logits and their
        closing table, which T does not need."""
        d = devices[k]
        added = None
        for _, a, is_ring, cost in self._earlier[k]:
            if cost is None:
                continue
            link = cost[devices[a], d]
            added = link if added is None else (max(added, link) if is_ring else added + link)
        compute = self.instance.compute[k, d]
        return float(compute if added is None else compute + added)

    def _crowd(self, free: np.ndarray) -> np.ndarray:
        """[D] the share of each device's near links whose far end is ``free`` ([D] 1, else 0)."""
        return (self._near @ free) / self._near_total

    def logits(self, devices: Sequence[int]) -> np.ndarray:
        """[D] logits of the next slot after ``devices`` (used devices masked), as in training: the
        compiled :func:`_next_logits`, bit for bit :meth:`reference_logits`."""
        inst = self.instance
        if len(devices) >= inst.num_slots:
            raise PolicyError(f"every one of the {inst.num_slots} slots is decided: no next slot has logits")
        ptr, src, edges, cost, ring, costs, slot_hop, hops = self._flat
        return _next_logits(np.asarray(devices, dtype=np.int64), self._running_time(devices), self.static,
                            self.affinity, inst.compute, ptr, src, self.edge_weight[edges], cost, ring, costs,
                            inst.ring_start, inst.hops_left, slot_hop, hops, self.beta, self.crowding,
                            self._near_columns, self._near_count, self._near_total)

    def reference_logits(self, devices: Sequence[int]) -> np.ndarray:
        """:meth:`logits` in numpy, step by step (:meth:`_step`): the reference the compiled decoder is
        held to."""
        logits, _ = self._step(len(devices), devices, self._running_time(devices))
        free = np.ones(self.instance.num_devices, dtype=np.int64)
        free[list(devices)] = 0
        logits += self.crowding * self._crowd(free)
        logits[list(devices)] = _MASKED
        return logits

    def priors(self, devices: Sequence[int]) -> np.ndarray:
        """[D] softmax of :meth:`logits`, 0 on used devices."""
        logits = self.logits(devices)
        free = np.ones(len(logits), dtype=bool)
        free[list(devices)] = False
        out = np.zeros(len(logits))
        if free.any():
            z = logits[free] - logits[free].max()
            out[free] = np.exp(z) / np.exp(z).sum()
        return out

    def complete(self, devices: Sequence[int], *, bound: float | None = None) -> list[int] | None:
        """``devices`` extended to every slot, each next slot on its highest-logit free device. With
        ``bound`` (seconds), on its highest-logit free device whose *reach* stays within the bound, None
        when the prefix's running time T passes it or no free device is left within it. The reach,
        max(P, ret) + c (P + c off a ring's look-ahead), never exceeds the stage's time in the finished
        map (P counts a subset of the transfers or ring hops the objective counts; ret is the least a
        closing path through free devices can cost), so a device past the bound cannot give a faster
        map: the bound prunes where the plain greedy decode would give up, and the completion goes on
        along the decoder's next choice (a greedy decode under a threshold, as the exact mapper's
        Algorithm 1 runs its search under one). Without it the decode is the plain greedy one.

        A bounded decode takes the greedy decode's device wherever that one's reach is within the bound
        (the best device overall is the best within the bound), so it starts from the memoised greedy
        completion's longest prefix that stays within it (the threshold pass's decodes, bit for bit)."""
        start = tuple(devices)
        limit = math.inf if bound is None else bound / self.instance.scale * (1.0 + _BOUND_RTOL)
        if start and self._running_time(start) > limit:
            return None
        if len(start) == self.instance.num_slots:
            return list(start)
        known = self._known_completion(start)
        if known is not None:
            if bound is None:
                return list(known)
            valid_from, reaches = self._reaches.get(known, (math.inf, None))
            if valid_from <= len(start):
                over = np.flatnonzero(reaches[len(start):] > limit)
                if not len(over):
                    return list(known)
                start = known[:len(start) + int(over[0])]
        used = list(start)
        taken = np.zeros(self.instance.num_devices)
        taken[used] = -np.inf
        ptr, src, edges, cost, ring, costs, slot_hop, hops = self._flat
        inst = self.instance
        out, stopped, reaches = _greedy_kernel(
            np.asarray(start, dtype=np.int64), self._running_time(start), limit, self.static, self.affinity,
            inst.compute, ptr, src, self.edge_weight[edges], cost, ring, costs, inst.ring_start, inst.hops_left,
            slot_hop, hops, self.beta, self.crowding, self._near_columns, self._near_total,
            self._near_count - self._near_columns[used].sum(axis=0), taken)  # near links to free devices, as _next_logits
        if stopped >= 0:
            return None
        full = tuple(out.tolist())
        if bound is None:  # a bounded completion is not the greedy decode the memo holds
            self._completions[start] = full
            if self._reaches.get(full, (math.inf,))[0] > len(start):  # reach of slot k: a function of full[:k]
                self._reaches[full] = (len(start), reaches)
        return list(full)

    def _build_flat_tables(self) -> tuple[np.ndarray, ...]:
        """_greedy_kernel's view of the decoder: each slot's earlier edges as CSR in edge order (earlier
        slot, edge id, index of its link-cost table or -1 when the objective does not count the edge, ring
        hop), the link-cost tables [C, D, D] (one per (latencies, bytes) of counted edges: row x of a table
        is :meth:`MappingInstance.edge_cost` from device x), and each look-ahead slot's index into its
        ring's hop costs [H, D, D] (MappingInstance.hop_cost)."""
        inst, devices = self.instance, self.instance.num_devices
        ptr, order = csr_by_key(inst.num_slots, inst.edge_b)  # [E] edges by later slot, each slot's in edge order
        index = np.full(len(order), -1, dtype=np.int64)  # [E] link-cost table of each edge
        keys: dict[tuple[float, float], int] = {}
        counted = np.flatnonzero(inst.edge_counted)
        for e, key in zip(counted.tolist(), zip(inst.edge_latency_mult[counted].tolist(),
                                                  inst.edge_coef[counted].tolist())):
            index[e] = keys.setdefault(key, len(keys))
        if keys:
            mult, coef = np.asarray(list(keys), dtype=np.float64).T  # [C]
            costs = (mult[:, None, None] * inst.latency + coef[:, None, None] * inst.inv_bandwidth) / inst.scale
        else:
            costs = np.zeros((1, devices, devices))
        looks = np.flatnonzero(inst.ring_start >= 0)  # [L] look-ahead slots
        _, first, which = np.unique(inst.slot_stage[looks], return_index=True, return_inverse=True)
        slot_hop = np.zeros(inst.num_slots, dtype=np.int64)
        slot_hop[looks] = which
        if len(first):
            ring_coef = inst.ring_coef[looks[first]]  # [H] one per stage with a look-ahead
            hops = (2.0 * (inst.problem.num_replicas - 1) * inst.latency
                    + ring_coef[:, None, None] * inst.inv_bandwidth) / inst.scale  # [H, D, D] as hop_cost
            hops[:, np.arange(devices), np.arange(devices)] = np.inf
        else:
            hops = np.zeros((1, devices, devices))
        return (ptr, inst.edge_a[order], order.astype(np.int64), index[order], inst.edge_kind[order] == RING_EDGE,
                costs, slot_hop, hops)

    def _known_completion(self, start: tuple[int, ...]) -> tuple[int, ...] | None:
        """The memoised completion of ``start``, or its parent's when that passes through ``start`` (the
        greedy decode is Markov: MCTS's greedy child completes as its parent did)."""
        known = self._completions.get(start)
        if known is None and start:
            parent = self._completions.get(start[:-1])
            if parent is not None and parent[len(start) - 1] == start[-1]:
                known = self._completions[start] = parent
        return known


# --------------------------------------------------------------------------------------- the greedy kernel

@_jit
def _segment_max(score, target, num_nodes):  # pragma: no cover - compiled
    """[N, H] the largest ``score`` [E, H] over each node's incoming edges (``target`` [E]), −∞ for none:
    ``np.maximum.at`` without its per-element dispatch."""
    top = np.full((num_nodes, score.shape[1]), -np.inf, dtype=score.dtype)
    for e in range(score.shape[0]):
        for h in range(score.shape[1]):
            top[target[e], h] = max(top[target[e], h], score[e, h])
    return top


@_jit
def _attend(message, alpha, target, num_nodes):  # pragma: no cover - compiled
    """[N, H, C] GATv2's aggregation: per target node and head, the ``message`` [E, H, C] of its incoming
    edges (``target`` [E]) weighted by ``alpha`` [E, H] over their sum (the softmax); 0 for a node with
    none. The same float32 operations in edge order as the ``np.add.at`` calls it replaces, which were a
    third of the forward pass at 64 devices."""
    num_edges, heads, width = message.shape
    total = np.zeros((num_nodes, heads), dtype=alpha.dtype)
    for e in range(num_edges):
        for h in range(heads):
            total[target[e], h] += alpha[e, h]
    out = np.zeros((num_nodes, heads, width), dtype=message.dtype)
    for e in range(num_edges):
        t = target[e]
        for h in range(heads):
            weight = alpha[e, h] / total[t, h]
            for c in range(width):
                out[t, h, c] += message[e, h, c] * weight
    return out


@_jit
def _greedy_kernel(prefix, before, limit, static, affinity, compute, edge_ptr, edge_src, edge_weight,
                   edge_cost, edge_ring, costs, ring_start, hops_left, slot_hop, hops, beta, crowding,
                   near_columns, near_total, free_near, taken):  # pragma: no cover - compiled
    """:meth:`MappingDecoder.complete`'s loop over flat arrays (K slots, D devices), from the decided
    ``prefix`` with running time ``before`` (and ``free_near`` [D], ``taken`` [D] 0 or −∞, updated in
    place): each slot's :func:`_slot_step` (the float operations of :meth:`MappingDecoder._step`, in the
    same order), its crowding and rounding, so the decode agrees bit for bit with the numpy decoder's
    logits. Slot k takes the best free device whose reach (time at placement, or its ring's look-ahead
    max(P, ret) + c) is at most ``limit`` (MappingDecoder.complete). Returns (devices [K], -1, reaches
    [K]), or (devices, k, reaches) when no free device keeps slot k within ``limit``; ``reaches[k]`` is the
    reach of the device slot k took (entries before the prefix's end and from a stop on are not set).

    ``edge_ptr`` [K + 1] CSR over each slot's earlier edges: ``edge_src`` (earlier slot), ``edge_weight``,
    ``edge_cost`` (index into ``costs`` [C, D, D], -1 when not counted), ``edge_ring``; ``slot_hop`` [K]
    index into ``hops`` [H, D, D] (MappingInstance.hop_cost) of a look-ahead slot's ring."""
    num_slots, num_devices = static.shape
    out = np.empty(num_slots, dtype=np.int64)
    out[:len(prefix)] = prefix
    reaches = np.empty(num_slots)
    table = np.empty((max(int(hops_left.max()) - 1, 1), num_devices))  # [R − 1, D] _return_row's scratch
    ret_row = np.empty(num_devices)  # [D] a look-ahead slot's return cost
    logits = np.empty(num_devices)
    added = np.empty(num_devices)
    partial = np.empty(num_devices)
    reach = np.empty(num_devices)  # [D] a lower bound of slot k's final stage time on each device
    for k in range(len(prefix), num_slots):
        _slot_step(k, out, before, static, affinity, compute, edge_ptr, edge_src, edge_weight, edge_cost,
                   edge_ring, costs, ring_start, hops_left, slot_hop, hops, beta, table, ret_row, logits, added,
                   partial, reach)
        choice = -1
        top = -np.inf
        for d in range(num_devices):
            if taken[d] < 0.0 or reach[d] > limit:
                continue
            score = logits[d] + crowding * (free_near[d] / near_total[d])
            score = np.rint(score * _TIE_SCALE) / _TIE_SCALE  # np.round(·, _TIE_DECIMALS): ties to the lowest id
            if choice < 0 or score > top:
                choice, top = d, score
        if choice < 0:
            return out, k, reaches
        out[k] = choice
        reaches[k] = reach[choice]
        taken[choice] = -np.inf
        for d in range(num_devices):
            free_near[d] -= near_columns[choice, d]
        before = max(before, partial[choice])
    return out, -1, reaches


@_jit
def _slot_step(k, out, before, static, affinity, compute, edge_ptr, edge_src, edge_weight, edge_cost, edge_ring,
               costs, ring_start, hops_left, slot_hop, hops, beta, table, ret_row, logits, added, partial,
               reach):  # pragma: no cover - compiled
    """Slot k with slots < k on ``out``: its logits before crowding, partial times and reaches [D] into
    ``logits``, ``partial`` and ``reach`` (``added``, ``ret_row`` [D] and ``table`` are scratch); the
    float operations of :meth:`MappingDecoder._step` in the same order (arguments as
    :func:`_greedy_kernel`'s)."""
    num_devices = static.shape[1]
    c13, c24 = beta[1] + beta[3], beta[2] + beta[4]
    logits[:] = static[k]
    counted = False
    for q in range(edge_ptr[k], edge_ptr[k + 1]):
        x = out[edge_src[q]]
        w = edge_weight[q]
        for d in range(num_devices):
            logits[d] += w * affinity[x, d]
        c = edge_cost[q]
        if c < 0:
            continue
        if not counted:
            added[:] = costs[c, x]
            counted = True
        elif edge_ring[q]:
            for d in range(num_devices):
                added[d] = max(added[d], costs[c, x, d])
        else:
            for d in range(num_devices):
                added[d] += costs[c, x, d]
    for d in range(num_devices):
        partial[d] = compute[k, d] + added[d] if counted else compute[k, d]
        if counted:
            logits[d] -= beta[0] * added[d]
    first = ring_start[k]
    if first < 0:
        for d in range(num_devices):
            logits[d] -= c13 * max(partial[d] - before, 0.0) + c24 * max(partial[d] - 1.0, 0.0)
            reach[d] = partial[d]
        return
    if first == k:
        _opening_row(hops[slot_hop[k]], out, k, min(2, hops_left[k] - 1), ret_row)
    else:
        _return_row(hops[slot_hop[k]], out, first, k, hops_left[k], table, ret_row)
    for d in range(num_devices):
        ret = ret_row[d]
        ahead = compute[k, d] + (max(added[d], ret) if counted else ret)
        logits[d] -= (beta[1] * max(partial[d] - before, 0.0) + beta[2] * max(partial[d] - 1.0, 0.0)
                      + beta[3] * max(ahead - before, 0.0) + beta[4] * max(ahead - 1.0, 0.0))
        reach[d] = max(partial[d], ahead)


@_jit
def _next_logits(prefix, before, static, affinity, compute, edge_ptr, edge_src, edge_weight, edge_cost,
                 edge_ring, costs, ring_start, hops_left, slot_hop, hops, beta, crowding, near_columns,
                 near_count, near_total):  # pragma: no cover - compiled
    """[D] :meth:`MappingDecoder.logits` of slot len(``prefix``) (arguments as :func:`_greedy_kernel`'s;
    ``near_count`` [D] int64 near links per device): :func:`_slot_step`, the crowding (the near links of
    each device whose far end is still free, counted exactly in integers), used devices masked."""
    num_slots, num_devices = static.shape
    k = len(prefix)
    table = np.empty((max(int(hops_left.max()) - 1, 1), num_devices))
    scratch = np.empty((5, num_devices))  # ret_row, logits, added, partial, reach
    _slot_step(k, prefix, before, static, affinity, compute, edge_ptr, edge_src, edge_weight, edge_cost,
               edge_ring, costs, ring_start, hops_left, slot_hop, hops, beta, table, scratch[0], scratch[1],
               scratch[2], scratch[3], scratch[4])
    free_near = near_count.copy()
    for i in range(k):
        for d in range(num_devices):
            free_near[d] -= near_columns[prefix[i], d]
    logits = scratch[1].copy()
    for d in range(num_devices):
        logits[d] += crowding * (free_near[d] / near_total[d])
    for i in range(k):
        logits[prefix[i]] = _MASKED
    return logits


@_jit
def _opening_row(hop, devices, slot, needed, ret):  # pragma: no cover - compiled
    """:meth:`MappingInstance.opening_cost` for ``slot`` into ``ret`` [D]: per device, the ``needed``-th
    (1 or 2) cheapest ``hop`` [D, D] to a device free before ``slot`` (min is exact: bit for bit)."""
    num_devices = hop.shape[0]
    free = np.ones(num_devices, dtype=np.bool_)
    for i in range(slot):
        free[devices[i]] = False
    for d in range(num_devices):
        low, second = np.inf, np.inf
        for x in range(num_devices):
            if free[x]:
                value = hop[d, x]
                if value < low:
                    low, second = value, low
                elif value < second:
                    second = value
        ret[d] = min(low if needed == 1 else second, _FAR)


@_jit
def _return_row(hop, devices, first, slot, hops, table, ret):  # pragma: no cover - compiled
    """Row ``hops`` − 1 of :meth:`MappingInstance.closing_table` for ``slot`` into ``ret`` [D], with
    ``table`` [R − 1, D] as scratch for the at-most rows 0 … ``hops`` − 2: the same Bellman–Ford rounds,
    each relaxing only through the inner devices whose value the round before lowered (the others
    cannot lower anything again; min and max are exact, so the row is the same bit for bit)."""
    num_devices = hop.shape[0]
    rows = hops - 1
    inner = np.ones(num_devices, dtype=np.bool_)
    for i in range(slot):
        inner[devices[i]] = False
    best = hop[devices[first]].copy()
    fresh = inner & (best < np.inf)  # [D] inner devices whose value is new since the last round
    longer = np.empty(num_devices)
    table[0] = best
    for h in range(1, rows):
        longer[:] = best
        for a in range(num_devices):
            if fresh[a]:
                through, row = best[a], hop[a]
                for d in range(num_devices):  # branch-free: the compiler vectorises it
                    longer[d] = min(longer[d], max(through, row[d]))
        changed = False
        for d in range(num_devices):
            fresh[d] = inner[d] and longer[d] < best[d]
            changed = changed or longer[d] < best[d]
        if not changed:  # converged: more hops find nothing cheaper
            for g in range(h, rows):
                table[g] = best
            break
        best[:] = longer
        table[h] = best
    ret[:] = np.inf  # the last hop into each device from another free one
    for a in range(num_devices):
        if inner[a]:
            through, row = table[rows - 1, a], hop[a]
            for d in range(num_devices):
                ret[d] = min(ret[d], max(through, row[d]))
    nearest, low, second = -1, np.inf, np.inf  # the two cheapest closing hops from free devices
    start = hop[devices[first]]
    for d in range(num_devices):
        if inner[d] and (nearest < 0 or start[d] < low):
            nearest, low, second = d, start[d], low
        elif inner[d] and start[d] < second:
            second = start[d]
    for d in range(num_devices):
        ret[d] = min(max(ret[d], second if d == nearest else low), _FAR)


# --------------------------------------------------------------------------------------- checkpoints


class MappingCheckpoint(NamedTuple):
    model: MappingPolicy
    config: MappingPolicyConfig
    optimizer: dict[str, Any] | None
    step: int
    meta: dict[str, Any]  # what the trainer recorded (data, wall time, figures)


def save_mapping_policy(path: str | os.PathLike, model: MappingPolicy, optimizer: torch.optim.Optimizer | None = None,
                        step: int = 0, meta: dict[str, Any] | None = None) -> None:
    """Write ``{format, version, feature_version, config, model, optimizer, step, meta}`` atomically."""
    if not isinstance(model, MappingPolicy):
        raise PolicyError(f"save_mapping_policy needs a MappingPolicy, got {type(model).__name__}")
    payload = {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION,
               "feature_version": MAPPING_FEATURE_VERSION, "config": dataclasses.asdict(model.config),
               "model": model.state_dict(), "optimizer": optimizer.state_dict() if optimizer is not None else None,
               "step": int(step), "meta": dict(meta or {})}
    try:
        with atomic_open(path) as handle:
            torch.save(payload, handle)
    except OSError as exc:
        raise OutputError(f"cannot write mapping policy {str(path)!r}: {exc.strerror or exc}") from None


def load_mapping_policy(path: str | os.PathLike) -> MappingCheckpoint:
    """Read a checkpoint of :func:`save_mapping_policy` with ``weights_only=True``; PolicyError when it is
    missing, corrupt, of another format or feature version, or its weights do not fit its config."""
    payload = read_checkpoint(path, CHECKPOINT_FORMAT, _REQUIRED, "mapping policy checkpoint")
    for key, expected in (("version", CHECKPOINT_VERSION), ("feature_version", MAPPING_FEATURE_VERSION)):
        if payload[key] != expected:
            raise PolicyError(f"mapping policy checkpoint {str(path)!r} has {key} {payload[key]!r}; "
                              f"this tag reads {expected}")
    config = MappingPolicyConfig.from_dict(payload["config"])
    model = MappingPolicy(config)
    load_weights(model, payload["model"], f"mapping policy checkpoint {str(path)!r}")
    model.eval()
    step = payload["step"]
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise PolicyError(f"mapping policy checkpoint {str(path)!r}: step must be a non-negative integer")
    meta = payload.get("meta") or {}
    return MappingCheckpoint(model, config, payload["optimizer"], step, meta if isinstance(meta, dict) else {})


# --------------------------------------------------------------------------------------- the mapper

DEFAULT_MAPPER_ITERATIONS = 32  # MCTS leaves after the greedy decode and the discrepancy pass
DEFAULT_MAPPER_DISCREPANCIES: int | None = None  # one-discrepancy leaves after the greedy decode (None: a pass)
# runners-up the discrepancy pass tries at a stage's replica 0, where no neighbour constrains the decoder yet
# and a ring's region is chosen: 4 against 1 lowered the mean validation gap from 8.4% to 7.9% and the
# median gap to the better heuristic at 128-256 devices from -37% to -47% (held-out problems, seeds 5000+)
RING_START_WIDTH = 4
THRESHOLD_STEPS = 8  # greedy decodes under thresholds from the lower bound up to the greedy decode's time
# the fast setting (scripts/compare_mappers.py's "learned fast"): the greedy and threshold decodes and a few
# MCTS leaves, no discrepancy pass; gaps within 5% at 16-64 devices at a tenth of the exact mapper's time.
# 2 leaves against 4: the same median gaps at 16, 32 and 64 devices (0.00%, 0.00%, 0.84%; means 4.69/8.96/
# 16.97% against 4.65/8.50/16.77%) on held-out topology seeds 100-104, 0.8 ms less at 64 devices; 0 leaves
# left 4.50% at 64 devices
FAST_MAPPER_ITERATIONS = 2
FAST_MAPPER_DISCREPANCIES = 0
_PROVEN = 1.0 - 1e-12  # a map's value (quick lower bound / its time) at which it is optimal


def shipped_mapping_checkpoint() -> Path:
    """``checkpoints/tag-mapper.pt`` of this checkout: the trained mapping policy that ships with tag."""
    return Path(__file__).resolve().parents[2] / "checkpoints" / "tag-mapper.pt"


@functools.lru_cache(maxsize=4)
def _cached_policy(path: str, stamp: float) -> MappingPolicy:
    return load_mapping_policy(path).model


def resolve_mapping_policy(policy: MappingPolicy | str | os.PathLike | None) -> MappingPolicy:
    """A MappingPolicy as given, or loaded (and cached) from a checkpoint path; None: the shipped one."""
    if isinstance(policy, MappingPolicy):
        return policy
    path = Path(shipped_mapping_checkpoint() if policy is None else policy)
    check_input_file(path, what="mapping policy checkpoint", error=PolicyError, limit=MAX_CHECKPOINT_BYTES,
                     missing=f"no mapping policy checkpoint at {str(path)!r}"
                     + (" (train one with scripts/train_mapper.py --ship)" if policy is None else ""))
    return _cached_policy(str(path), path.stat().st_mtime)


def learned_mapping(problem: MappingProblem, policy: MappingPolicy, *, instantiation: str,
                    iterations: int = DEFAULT_MAPPER_ITERATIONS,
                    discrepancies: int | None = DEFAULT_MAPPER_DISCREPANCIES, time_limit_s: float | None = None,
                    lower_bound: float | None = None, seed: int | np.random.Generator | None = 0,
                    patience: int | None = None) -> np.ndarray:
    """[S, R] the best mapping of the mapping GNN's decoder on a :class:`~tag.search.MappingEnv`: one
    forward pass and the greedy decode; then up to THRESHOLD_STEPS greedy decodes under thresholds
    from the lower bound up (:func:`_threshold_pass`); then up to ``discrepancies`` one-discrepancy
    leaves (None: a whole pass, S·(R − 1 + RING_START_WIDTH) leaves at most; :func:`_discrepancy_pass`:
    a runner-up device at one slot of the best map, the rest greedy under the best map's time); then up
    to ``iterations`` leaves of MCTS with the decoder's priors and greedy fill. ``time_limit_s`` caps
    all four steps; each stops once a map meets ``lower_bound`` (by default :func:`quick_lower_bound`:
    the map is then optimal, and the search is skipped when the greedy decode does), and MCTS after
    ``patience`` leaves in a row that did not improve its best (None: no such stop). The CS map is among
    the candidates, so the result is never worse than it."""
    from tag.search import MappingEnv, mcts_search

    start = time.perf_counter()
    if lower_bound is None:  # the search's value is a bound over the time: the quick one costs nothing
        lower_bound = quick_lower_bound(problem, instantiation)
    env = MappingEnv(problem, instantiation=instantiation, lower_bound=lower_bound)
    decoder = MappingDecoder(policy, MappingInstance.from_env(env))
    env.fill = decoder.complete
    best = max((env.baseline(), env.evaluate(env.root())), key=lambda leaf: -leaf.time)
    deadline = math.inf if time_limit_s is None else start + time_limit_s
    budget = math.inf if discrepancies is None else discrepancies
    if best.value < _PROVEN:
        best = _threshold_pass(env, decoder, best, lower_bound, deadline)
    if best.value < _PROVEN and budget > 0:
        best = _discrepancy_pass(env, decoder, best, budget, deadline)
    if best.value >= _PROVEN or iterations <= 0 or time.perf_counter() >= deadline:
        return np.asarray(best.candidate, dtype=np.int64)

    def evaluator(observation: Any) -> np.ndarray:
        if observation.next_slot < 0:  # terminal: no candidates
            return np.zeros(0)
        return decoder.priors(observation.assigned[:observation.next_slot].tolist())

    result = mcts_search(env, evaluator, max_iterations=iterations + 1, target_visits=None, seed=seed,
                         time_limit_s=None if time_limit_s is None else max(deadline - time.perf_counter(), 1e-9),
                         stop_value=_PROVEN, patience=patience)  # its first leaf, the root, is the greedy decode
    return np.asarray(result.best if result.best_time < best.time else best.candidate, dtype=np.int64)


def _threshold_pass(env: Any, decoder: MappingDecoder, best: Any, lower_bound: float, deadline: float, *,
                    steps: int = THRESHOLD_STEPS) -> Any:
    """The best leaf of greedy decodes under the thresholds τ_i = LB · (t / LB)^(i / steps), i = 0, 1, …,
    from the lower bound ``lower_bound`` up to the time t of ``best`` (:meth:`MappingDecoder.complete`
    with ``bound=τ_i``: each slot on the decoder's best device that keeps its reach within τ_i); the first
    leaf faster than ``best`` ends the pass. Stops at ``deadline`` or once a leaf is optimal.

    The decoder's physical terms weigh a slow link against its learned scores by a few tenths of a
    logit per lower bound of time, which its learned terms outweigh: a ring on a mesh takes a two-hop
    link or runs into a corner it cannot close from, and one discrepancy per slot cannot undo several
    such choices at once. Under a threshold those devices are masked (like the exact mapper's Algorithm
    1, which searches under one), and the decoder chooses among the rest. The lowest thresholds fail
    most often, so they come first: a decode that fits τ_i is what higher thresholds would find at best."""
    start = best.time
    if lower_bound <= 0 or start <= lower_bound:
        return best
    for i in range(steps):
        if time.perf_counter() >= deadline:
            break
        full = decoder.complete([], bound=lower_bound * (start / lower_bound) ** (i / steps))
        if full is None:
            continue
        leaf = env.evaluate(tuple(full))
        if leaf.time < best.time:
            return leaf
    return best


def _discrepancy_pass(env: Any, decoder: MappingDecoder, best: Any, budget: float, deadline: float, *,
                      start_width: int = RING_START_WIDTH) -> Any:
    """The best leaf of one pass of limited discrepancy search from ``best`` (a LeafEvaluation of the
    greedy decode or better): for slot k = 0, 1, …, the runner-up device of the decoder's logits at k
    after the best map's first k slots (the ``start_width`` runners-up at a stage's replica 0), completed
    greedily under the best map's time (each slot within it, :meth:`MappingDecoder.complete`), replaces
    the best when it is faster. Up to ``budget`` leaves; stops at ``deadline``
    (perf_counter seconds) or once a leaf is optimal. MCTS's leaves deviate near the root; these deviate
    at every depth, where the greedy decode's mistakes on 32-64 devices are (a ring placed across a slow
    link, the last rings once earlier ones took the good regions)."""
    slots = env.slot_stage, env.slot_replica
    devices = np.asarray(best.candidate)[slots].tolist()  # [K] the best map in the search's slot order
    for k in range(len(devices)):
        if budget <= 0 or best.value >= _PROVEN or time.perf_counter() >= deadline:
            break
        logits = decoder.logits(devices[:k])
        logits[devices[k]] = _MASKED
        width = start_width if env.slot_replica[k] == 0 else 1
        for runner_up in np.argsort(-logits, kind="stable")[:width].tolist():
            if logits[runner_up] <= _MASKED or budget <= 0:  # no other free device, or no budget left
                break
            budget -= 1
            full = decoder.complete(devices[:k] + [runner_up], bound=best.time)
            if full is None:  # provably no faster: its running time passed the best map's
                continue
            leaf = env.evaluate(tuple(full))
            if leaf.time < best.time:
                best, devices = leaf, full
                break
    return best
