"""The learned mapper's decoder: slot k's logits over the devices, given the devices of the slots decided
before it, from one forward pass of the network (:class:`~tag.policy.mapping.model.DecoderTables`).

    logit[d] = static[k, d] + Σ_{e=(j,k), j<k} w_e · affinity[dev_j, d]
               − β₀ · P[d] − β₁ · relu(c[k, d] + P[d] − T) − β₂ · relu(c[k, d] + P[d] − 1)
               − β₃ · relu(c[k, d] + A[d] − T) − β₄ · relu(c[k, d] + A[d] − 1)
               + crowding · (share of d's near links whose far end is free)

where P[d] is what the decided neighbours' links would add to slot k's stage time under the objective's
instantiation (eq. 6: the sum of the transfers; eq. 7: the ring's slowest hop so far), c its compute and
T the largest such "time at placement" among the earlier slots: the network learns where to go, the
physical terms keep a bottleneck objective in view. A[d] = max(P[d], ret[d]) on a ring's look-ahead slot,
with ret its return cost (:meth:`~tag.policy.mapping.instance.MappingInstance.return_cost`); elsewhere
A = P. Since c + A[d] never exceeds the stage's time in the finished map, a completion under a bound masks
the devices past it (:meth:`MappingDecoder.complete`). Used devices are masked.

Two paths compute the same logits bit for bit (tests hold them equal on random instances):

- the **reference**, :meth:`MappingDecoder.reference_logits` and :meth:`MappingDecoder.reference_complete`:
  numpy, one slot at a time, as the formula reads;
- the **fast path**, :meth:`MappingDecoder.logits`, :meth:`MappingDecoder.priors` and
  :meth:`MappingDecoder.complete`: compiled kernels over flat arrays (:func:`_next_logits`,
  :func:`_greedy_kernel`), memoised per prefix, so one forward pass serves a whole search. O(degree · D)
  per step plus O(R · D²) per ring replica.

:func:`tag.policy.mapping.loss.teacher_forced_logits` computes the same logits for every step of a given
mapping at once in torch, for training.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from tag._arrays import csr_by_key
from tag._compiled import jit as _jit
from tag.policy.errors import PolicyError
from tag.policy.mapping.instance import RING_EDGE, MappingInstance, _opening_row, _return_row
from tag.policy.mapping.model import MappingPolicy, numpy_tables

__all__ = ["MappingDecoder", "MASKED_LOGIT"]

MASKED_LOGIT = -1e9  # logit of a used device (finite, so that training never sees inf − inf)
_MASKED = MASKED_LOGIT  # the kernels' name for it
_TIE_DECIMALS = 6  # greedy logits equal to this many decimals are a tie: symmetric devices (a mesh's mirror
# images) score equal up to float rounding, which would otherwise pick among them by the order of additions
_TIE_SCALE = 10.0 ** _TIE_DECIMALS  # what np.round multiplies by and divides by again (the greedy kernel)
_BOUND_RTOL = 1e-9  # MappingDecoder.complete gives up on a running time only this far above its bound (rounding)


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
        return self._next(devices)[0]

    def _next(self, devices: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(logits [D], reach [D]) of the next slot after ``devices``: the compiled :func:`_next_logits`."""
        inst = self.instance
        ptr, src, edges, cost, ring, costs, slot_hop, hops = self._flat
        return _next_logits(np.asarray(devices, dtype=np.int64), self._running_time(devices), self.static,
                            self.affinity, inst.compute, ptr, src, self.edge_weight[edges], cost, ring, costs,
                            inst.ring_start, inst.hops_left, slot_hop, hops, self.beta, self.crowding,
                            self._near_columns, self._near_count, self._near_total)

    def ranked(self, devices: Sequence[int], *, bound: float | None = None) -> list[int]:
        """The free devices of the next slot after ``devices``, best first, in the greedy decode's order
        (highest logit rounded to _TIE_DECIMALS decimals, ties to the lowest id: the first is the device
        :meth:`complete` takes); with ``bound`` (seconds), only those whose reach is within it (none when
        the prefix's running time passes it), the choices a search under that bound can make."""
        inst = self.instance
        if len(devices) >= inst.num_slots:
            raise PolicyError(f"every one of the {inst.num_slots} slots is decided: no next slot to rank")
        limit = math.inf if bound is None else bound / inst.scale * (1.0 + _BOUND_RTOL)
        if devices and self._running_time(devices) > limit:
            return []
        logits, reach = self._next(devices)
        score = np.round(logits, _TIE_DECIMALS)
        order = np.argsort(-score, kind="stable")
        keep = (logits[order] > _MASKED) & (reach[order] <= limit)
        return order[keep].tolist()

    def dive(self, devices: Sequence[int], *, bound: float) -> tuple[list[int], int]:
        """The greedy decode under ``bound`` (seconds) from ``devices``, as :meth:`complete` takes it, and
        where it stopped: (every slot's device, -1) when it completes; else (the devices of the slots before
        the stop, the slot k at which no free device keeps its reach within the bound). Nothing memoised:
        a backtracking search dives from a new prefix each time."""
        inst = self.instance
        start = tuple(devices)
        limit = bound / inst.scale * (1.0 + _BOUND_RTOL)
        if start and self._running_time(start) > limit:
            return list(start[:-1]), len(start) - 1
        if len(start) == inst.num_slots:
            return list(start), -1
        out, stopped, _ = self._greedy(start, limit)
        return (out.tolist(), -1) if stopped < 0 else (out[:stopped].tolist(), int(stopped))

    def _greedy(self, start: tuple[int, ...], limit: float) -> tuple[np.ndarray, int, np.ndarray]:
        """:func:`_greedy_kernel` from ``start`` under ``limit`` (the instance's time unit)."""
        inst = self.instance
        used = list(start)
        taken = np.zeros(inst.num_devices)
        taken[used] = -np.inf
        ptr, src, edges, cost, ring, costs, slot_hop, hops = self._flat
        return _greedy_kernel(
            np.asarray(start, dtype=np.int64), self._running_time(start), limit, self.static, self.affinity,
            inst.compute, ptr, src, self.edge_weight[edges], cost, ring, costs, inst.ring_start, inst.hops_left,
            slot_hop, hops, self.beta, self.crowding, self._near_columns, self._near_total,
            self._near_count - self._near_columns[used].sum(axis=0), taken)  # near links to free devices

    def reference_logits(self, devices: Sequence[int]) -> np.ndarray:
        """:meth:`logits` in numpy, step by step (:meth:`_step`): the reference the compiled decoder is
        held to."""
        logits, _ = self._step(len(devices), devices, self._running_time(devices))
        free = np.ones(self.instance.num_devices, dtype=np.int64)
        free[list(devices)] = 0
        logits += self.crowding * self._crowd(free)
        logits[list(devices)] = _MASKED
        return logits

    def reference_complete(self, devices: Sequence[int]) -> list[int]:
        """:meth:`complete` without a bound, in numpy: slot after slot the free device of highest
        :meth:`reference_logits` rounded to _TIE_DECIMALS decimals (ties to the lowest id), as the
        compiled greedy decode takes it. The reference it is held to; nothing memoised."""
        out = [int(d) for d in devices]
        while len(out) < self.instance.num_slots:
            out.append(int(np.argmax(np.round(self.reference_logits(out), _TIE_DECIMALS))))
        return out

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
        out, stopped, reaches = self._greedy(start, limit)
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


# --------------------------------------------------------------------------------------- the compiled decoder

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
    """([D] :meth:`MappingDecoder.logits`, [D] reach) of slot len(``prefix``) (arguments as
    :func:`_greedy_kernel`'s; ``near_count`` [D] int64 near links per device): :func:`_slot_step`, the
    crowding (the near links of each device whose far end is still free, counted exactly in integers),
    used devices masked; the reach as the greedy kernel bounds it."""
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
    return logits, scratch[4].copy()

