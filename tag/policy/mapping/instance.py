"""The graph of one mapping problem as the learned mapper sees it (:class:`MappingInstance`).

A :class:`~tag.search.MappingEnv` decides one stage replica ("slot") after another, in the exact mapper's
connectivity order; an action is a device. The instance holds that order and everything the network and
the decoder read, with times in units of the problem's quick lower bound and bandwidths relative to the
median link, so one network serves 8 or 256 devices, a mesh or a random block topology.

**Graph.** Two node types (:data:`SLOT`, K = S·R stage replicas; :data:`DEVICE`, D single devices) and
two edge types. :data:`EXCHANGES` joins the slots that exchange data: replica r of adjacent stages (p2p,
Parmesan eq. 8) and consecutive replicas of one stage's ring (all-reduce, eq. 9), in both directions.
:data:`LINKS` joins each device to its ``DEVICE_NEIGHBOURS`` widest links. :attr:`MappingInstance.x_dict`,
:attr:`~MappingInstance.edge_index_dict` and :attr:`~MappingInstance.edge_attr_dict` give them as PyG does.

**Return costs.** The greedy decode learns of a ring's closing hop only at its last replica, so a ring
replica 1 ≤ r ≤ R−2 also sees a lower bound of the largest hop of the R − r hops from its device back to
replica 0's device through devices still free (:meth:`MappingInstance.closing_table`, a bottleneck
Bellman–Ford), and replica 0 the second cheapest hop to a free device
(:meth:`MappingInstance.opening_cost`). Those numpy methods are the reference of the compiled rows the
decoder runs (:func:`_opening_row`, :func:`_return_row`; a test holds them equal bit for bit).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from tag._compiled import jit as _jit
from tag.exact._mapping_kernel import connectivity_order
from tag.exact.mapping import ALLREDUCE, P2P, MappingProblem
from tag.policy.errors import PolicyError

__all__ = ["MappingInstance", "quick_lower_bound", "search_order", "MAPPING_FEATURE_VERSION", "SLOT_FEATURES",
           "DEVICE_FEATURES", "SLOT_EDGE_FEATURES", "DEVICE_EDGE_FEATURES", "SLOT", "DEVICE", "EXCHANGES", "LINKS",
           "METADATA", "P2P_EDGE", "RING_EDGE"]

# node and edge types (PyG's metadata)
SLOT = "slot"
DEVICE = "device"
EXCHANGES = (SLOT, "exchanges", SLOT)  # p2p and ring edges between slots, both directions
LINKS = (DEVICE, "links", DEVICE)  # each device's widest links, towards the device
METADATA = ((SLOT, DEVICE), (EXCHANGES, LINKS))

MAPPING_FEATURE_VERSION = 2
SLOT_FEATURES = 10
DEVICE_FEATURES = 8
SLOT_EDGE_FEATURES = 4
DEVICE_EDGE_FEATURES = 3
DEVICE_NEIGHBOURS = 8  # device edges: each device's widest links
NEAR_WIDEST = 0.75  # a link this close to a device's widest counts towards its crowding (the decoder)
P2P_EDGE, RING_EDGE = 0, 1  # edge_kind of a slot edge
_FAR = 1e3  # a return cost with no path (in scale units: a thousand times the lower bound)

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


def search_order(problem: MappingProblem) -> tuple[np.ndarray, np.ndarray]:
    """(slot_stage [K], slot_replica [K]) int64: the slots in the order a :class:`~tag.search.MappingEnv`
    of ``problem`` decides them (stages in the exact mapper's connectivity order, each stage's replicas
    one after another), so that an instance can be built before its environment."""
    stages, replicas = problem.num_stages, problem.num_replicas
    pairs = sorted({(min(a, b), max(a, b)) for a, b in zip(problem.edge_src.tolist(), problem.edge_dst.tolist())})
    order = connectivity_order(stages, np.asarray(pairs, dtype=np.int64).reshape(-1, 2))
    return (np.repeat(np.asarray(order, dtype=np.int64), replicas),
            np.tile(np.arange(replicas, dtype=np.int64), stages))


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
        slot_of = np.empty((stages, replicas), dtype=np.int64)  # [S, R]
        slot_of[slot_stage, slot_replica] = np.arange(len(slot_stage))
        compute = problem.compute_time()[slot_stage] / scale  # [K, D]
        ends, edge_kind, edge_coef = _slot_edges(problem, slot_of)
        mults = np.where(edge_kind == RING_EDGE, 2.0 * (replicas - 1), 1.0)
        counted = edge_kind == (P2P_EDGE if instantiation == P2P else RING_EDGE)
        ring_coef = 2.0 * (replicas - 1) / replicas * problem.param_bytes[slot_stage].astype(np.float64)  # [K]
        looks_ahead = (instantiation == ALLREDUCE) & (ring_coef > 0) & (slot_replica <= replicas - 2)
        ring_start = np.where(looks_ahead, slot_of[slot_stage, 0], -1)  # replica 0: its own slot (opening_cost)

        off = ~np.eye(devices, dtype=bool)
        inv_bandwidth = np.where(off, 1.0 / np.where(off, problem.bandwidth, 1.0), 0.0)
        reference, inverse_reference = (_median_and_reciprocal_median(problem.bandwidth[off]) if devices > 1
                                        else (1.0, 1.0))
        slot_x = _slot_features(instantiation, slot_replica, compute, ends, edge_kind,
                                edge_coef / (reference * scale), stages, replicas)
        device_x, near_share = _device_features(problem, compute, scale, reference)
        device_edge_index, device_edge_attr = _device_links(problem, scale, reference)
        # the edges' features divide by 1 / median(1 / B), not by the median B: the two differ when the
        # median is the mean of two middle links
        slot_edge_x = np.stack([edge_coef / (1.0 / inverse_reference * scale), edge_kind == P2P_EDGE,
                                edge_kind == RING_EDGE, counted], axis=1).astype(np.float64)
        return cls(problem, instantiation, scale, slot_stage, slot_replica, compute, ends[:, 0].copy(),
                   ends[:, 1].copy(), edge_kind, edge_coef, np.asarray(mults, dtype=np.float64), counted,
                   ring_start, replicas - slot_replica, ring_coef, inv_bandwidth, near_share, problem.latency.copy(),
                   slot_x, device_x, device_edge_index, device_edge_attr, slot_edge_x)

    @classmethod
    def from_env(cls, env: Any) -> MappingInstance:
        """The instance of a :class:`tag.search.MappingEnv` (its problem, order and instantiation)."""
        return cls.build(env.problem, env.instantiation, env.slot_stage, env.slot_replica)

    def slot_edge_attr(self) -> np.ndarray:
        """[E, SLOT_EDGE_FEATURES] bytes at the median link over the scale, kind one-hot, counted."""
        return self.slot_edge_x

    @property
    def x_dict(self) -> dict[str, np.ndarray]:
        """Node features by type: SLOT [K, SLOT_FEATURES], DEVICE [D, DEVICE_FEATURES]."""
        return {SLOT: self.slot_x, DEVICE: self.device_x}

    @property
    def edge_index_dict(self) -> dict[tuple[str, str, str], np.ndarray]:
        """Edges by type, int64 (source, target): EXCHANGES [2, 2E] (edge e from edge_a to edge_b, then
        each back in the same order), LINKS [2, E_dev]."""
        ends = np.stack([self.edge_a, self.edge_b])  # [2, E]
        return {EXCHANGES: np.concatenate([ends, ends[::-1]], axis=1), LINKS: self.device_edge_index}

    @property
    def edge_attr_dict(self) -> dict[tuple[str, str, str], np.ndarray]:
        """Edge features by type, in the order of :attr:`edge_index_dict`: EXCHANGES [2E,
        SLOT_EDGE_FEATURES] (both directions alike), LINKS [E_dev, DEVICE_EDGE_FEATURES]."""
        return {EXCHANGES: np.concatenate([self.slot_edge_x, self.slot_edge_x]), LINKS: self.device_edge_attr}

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


def _slot_edges(problem: MappingProblem, slot_of: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The slot edges of ``problem`` with slot ``slot_of[s, r]`` [S, R] for replica r of stage s: (ends
    [E, 2] int64, earlier slot first; kind [E] P2P_EDGE or RING_EDGE; bytes over the link per iteration
    [E]). Per stage pair one p2p edge per replica, then per stage with parameters its ring's hops."""
    replicas = problem.num_replicas
    pairs, pair_bytes = problem.stage_pairs()
    pairs = pairs.reshape(-1, 2)
    p2p_ends = np.stack([slot_of[pairs[:, 0]], slot_of[pairs[:, 1]]], axis=-1).reshape(-1, 2)  # [P·R, 2]
    hops = _ring_hops(replicas)
    rings = np.flatnonzero(problem.param_bytes > 0) if replicas >= 2 else np.zeros(0, dtype=np.int64)
    ring_ends = slot_of[rings][:, hops].reshape(-1, 2)  # [S'·H, 2]
    ends = np.sort(np.concatenate([p2p_ends, ring_ends]), axis=1)
    kind = np.repeat(np.asarray([P2P_EDGE, RING_EDGE], dtype=np.int64), [len(p2p_ends), len(ring_ends)])
    coefs = np.concatenate([np.repeat(np.asarray(pair_bytes, dtype=np.float64), replicas),
                            np.repeat(2.0 * (replicas - 1) / replicas
                                      * problem.param_bytes[rings].astype(np.float64), len(hops))])
    return ends, kind, np.asarray(coefs, dtype=np.float64)


def _slot_features(instantiation: str, slot_replica: np.ndarray, compute: np.ndarray, ends: np.ndarray,
                   edge_kind: np.ndarray, comm: np.ndarray, stages: int, replicas: int) -> np.ndarray:
    """[K, SLOT_FEATURES]: compute over the devices (mean, min, max), p2p and ring bytes at the median
    link (``comm`` [E] per edge), replica, position in the order, 1/R, 1/S, the instantiation."""
    slot_x = np.zeros((len(slot_replica), SLOT_FEATURES))
    slot_x[:, 0] = compute.mean(axis=1)
    slot_x[:, 1] = compute.min(axis=1)
    slot_x[:, 2] = compute.max(axis=1)
    for kind, column in ((P2P_EDGE, 3), (RING_EDGE, 4)):
        chosen = edge_kind == kind
        for end in (ends[chosen, 0], ends[chosen, 1]):
            np.add.at(slot_x[:, column], end, comm[chosen])
    slot_x[:, 5] = slot_replica / replicas
    slot_x[:, 6] = np.arange(len(slot_replica)) // replicas / stages
    slot_x[:, 7] = 1.0 / replicas
    slot_x[:, 8] = 1.0 / stages
    slot_x[:, 9] = float(instantiation == ALLREDUCE)
    return slot_x


def _device_features(problem: MappingProblem, compute: np.ndarray, scale: float,
                     reference: float) -> tuple[np.ndarray, np.ndarray]:
    """(device_x [D, DEVICE_FEATURES], near_share [D, D]): each device's relative compute time, its link
    widths over the median link (widest, top four, mean, narrowest), mean latency, log2 D / 8 and the
    share of links at least half its widest; row d of near_share is 1 / n_d on d's n_d links of at
    least NEAR_WIDEST of its widest."""
    devices, bandwidth = problem.num_devices, problem.bandwidth
    off = ~np.eye(devices, dtype=bool)
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
    return device_x, near / np.maximum(near.sum(axis=1, keepdims=True), 1)


def _device_links(problem: MappingProblem, scale: float, reference: float) -> tuple[np.ndarray, np.ndarray]:
    """(edge_index [2, D·n] int64 (source, target), edge_attr [D·n, DEVICE_EDGE_FEATURES]): each device's
    n = min(DEVICE_NEIGHBOURS, D − 1) widest links into it, with log and inverse width over the median
    link and latency over the scale."""
    devices, bandwidth = problem.num_devices, problem.bandwidth
    neighbours = min(DEVICE_NEIGHBOURS, devices - 1)
    if neighbours <= 0:
        return np.zeros((2, 0), dtype=np.int64), np.zeros((0, DEVICE_EDGE_FEATURES))
    off = ~np.eye(devices, dtype=bool)
    order = np.argsort(-np.where(off, bandwidth, -np.inf), axis=1, kind="stable")[:, :neighbours]
    source = order.reshape(-1)
    target = np.repeat(np.arange(devices), neighbours)
    link = bandwidth[source, target]
    edge_attr = np.stack([np.log(link / reference), reference / link, problem.latency[source, target] / scale], axis=1)
    return np.stack([source, target]).astype(np.int64), edge_attr


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


# --------------------------------------------------------------------------------------- compiled rows

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

