"""The learned stage-to-device mapper's GNN (DESIGN.md: Policy and search, "the learned mapper").

A :class:`~tag.search.MappingEnv` decides one stage replica ("slot") after another, in the exact
mapper's connectivity order; an action is a device. This module gives that tree its priors and its
default fill.

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
1 ≤ r ≤ R−2 also sees its *return cost* ret[d], the least largest hop of a path of at most R − r hops
from d back to replica 0's device through devices that were free when replica 0 was placed (a
bottleneck Bellman–Ford per ring, :meth:`MappingInstance.closing_table`); elsewhere A = P. Used devices
are masked. The decoder is numpy, O(degree · D) per step plus O(R · D²) per ring, so one forward pass
serves a whole search; :func:`teacher_forced_logits` computes the same logits for every step of a given
mapping at once in torch, for training (a test holds the two equal).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn import GATv2Conv

from tag._atomic import atomic_open
from tag.errors import OutputError
from tag.exact.mapping import ALLREDUCE, P2P, MappingProblem
from tag.policy.checkpoint import load_weights, read_checkpoint
from tag.policy.errors import PolicyError

__all__ = [
    "MappingPolicyConfig", "MappingPolicy", "MappingInstance", "DecoderTables", "MappingDecoder",
    "teacher_forced_logits", "numpy_tables", "imitation_loss", "quick_lower_bound", "save_mapping_policy",
    "load_mapping_policy", "MappingCheckpoint", "MAPPING_FEATURE_VERSION", "SLOT_FEATURES", "DEVICE_FEATURES",
    "learned_mapping", "resolve_mapping_policy", "shipped_mapping_checkpoint", "DEFAULT_MAPPER_ITERATIONS",
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
        if sorted(zip(slot_stage.tolist(), slot_replica.tolist())) != [(s, r) for s in range(stages)
                                                                       for r in range(replicas)]:
            raise PolicyError("slot_stage and slot_replica must list every (stage, replica) once")
        scale = quick_lower_bound(problem, instantiation)
        scale = scale if scale > 0 else 1.0
        slot_of = np.empty((stages, replicas), dtype=np.int64)
        slot_of[slot_stage, slot_replica] = np.arange(len(slot_stage))
        compute = problem.compute_time()[slot_stage] / scale  # [K, D]

        ends, kinds, coefs, mults = [], [], [], []
        pairs, pair_bytes = problem.stage_pairs()
        for (s, t), nbytes in zip(pairs.tolist(), pair_bytes.tolist()):
            for r in range(replicas):
                ends.append((slot_of[s, r], slot_of[t, r]))
                kinds.append(P2P_EDGE), coefs.append(nbytes), mults.append(1.0)
        if replicas >= 2:
            hops = {(r, (r + 1) % replicas) for r in range(replicas)}
            hops = {(min(a, b), max(a, b)) for a, b in hops}  # R = 2: one hop, not two
            for s in range(stages):
                if problem.param_bytes[s] > 0:
                    for r, q in sorted(hops):
                        ends.append((slot_of[s, r], slot_of[s, q]))
                        kinds.append(RING_EDGE)
                        coefs.append(2.0 * (replicas - 1) / replicas * float(problem.param_bytes[s]))
                        mults.append(2.0 * (replicas - 1))
        ends_arr = np.sort(np.asarray(ends, dtype=np.int64).reshape(-1, 2), axis=1)
        edge_kind = np.asarray(kinds, dtype=np.int64)
        counted = edge_kind == (P2P_EDGE if instantiation == P2P else RING_EDGE)
        ring_coef = 2.0 * (replicas - 1) / replicas * problem.param_bytes[slot_stage].astype(np.float64)  # [K]
        looks_ahead = ((instantiation == ALLREDUCE) & (ring_coef > 0) & (slot_replica >= 1)
                       & (slot_replica <= replicas - 2))
        ring_start = np.where(looks_ahead, slot_of[slot_stage, 0], -1)

        off = ~np.eye(devices, dtype=bool)
        bandwidth = problem.bandwidth
        inv_bandwidth = np.where(off, 1.0 / np.where(off, bandwidth, 1.0), 0.0)
        reference = float(np.median(bandwidth[off])) if devices > 1 else 1.0
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
        return cls(problem, instantiation, scale, slot_stage, slot_replica, compute, ends_arr[:, 0].copy(),
                   ends_arr[:, 1].copy(), edge_kind, edge_coef, np.asarray(mults, dtype=np.float64), counted,
                   ring_start, replicas - slot_replica, ring_coef, inv_bandwidth, near_share, problem.latency.copy(), slot_x,
                   device_x, device_edge_index, device_edge_attr)

    @classmethod
    def from_env(cls, env: Any) -> MappingInstance:
        """The instance of a :class:`tag.search.MappingEnv` (its problem, order and instantiation)."""
        return cls.build(env.problem, env.instantiation, env.slot_stage, env.slot_replica)

    def slot_edge_attr(self) -> np.ndarray:
        """[E, SLOT_EDGE_FEATURES] bytes at the median link over the scale, kind one-hot, counted."""
        off = self.inv_bandwidth[~np.eye(self.num_devices, dtype=bool)]
        reference = 1.0 / float(np.median(off)) if len(off) else 1.0
        return np.stack([self.edge_coef / (reference * self.scale), self.edge_kind == P2P_EDGE,
                         self.edge_kind == RING_EDGE, self.edge_counted], axis=1).astype(np.float64)

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
        row h − 1 is the least largest hop of a path of at most h hops from replica 0's device to each
        device through devices free when replica 0 was placed (a bottleneck Bellman–Ford). Row R − r − 1 is
        then the cheapest the rest of the ring can close from a device of replica r: its *return cost*."""
        first = int(self.ring_start[slot])
        hop = self.hop_cost(slot)
        inner = np.ones(self.num_devices, dtype=bool)
        inner[list(devices[:first + 1])] = False
        table = _bottleneck_paths(hop, int(devices[first]), inner, self.problem.num_replicas - 1)
        return np.minimum(table, _FAR)

    def return_costs(self, devices: Sequence[int]) -> np.ndarray:
        """[K, D] the return cost of every look-ahead slot k under the mapping ``devices`` [K] (0 for the
        other slots); row k depends on ``devices[:k]`` only."""
        out = np.zeros((self.num_slots, self.num_devices))
        for first in np.unique(self.ring_start[self.ring_start >= 0]).tolist():
            rows = np.flatnonzero(self.ring_start == first)
            table = self.closing_table(int(rows[0]), devices)
            out[rows] = table[self.hops_left[rows] - 1]
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
        for name in ("hidden", "heads", "num_layers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PolicyError(f"{name} must be a positive integer, got {value!r}")
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
    weights = {name: value.detach().numpy() for name, value in policy.state_dict().items()}

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
    hidden = (linear("pair_slot", h_slot)[:, None, :] + linear("pair_device", h_dev)[None, :, :]
              + compute[:, :, None] * weights["pair_compute"])  # [K, D, f]
    static = linear("pair_out", _elu(hidden))[..., 0]  # [K, D]
    affinity = linear("query", h_dev) @ linear("key", h_dev).T / np.float32(math.sqrt(policy.config.hidden))
    a, b = h_slot[ends[0]], h_slot[ends[1]]
    edge_hidden = _elu(linear("edge_mlp.0", np.concatenate([a + b, a * b, edge_attr], axis=1)))
    edge_weight = linear("edge_mlp.2", edge_hidden)[:, 0]  # [E]
    beta = np.logaddexp(0.0, weights["beta_raw"]) + 0.1  # softplus, as in forward
    return DecoderTables(static, affinity, edge_weight, beta, weights["crowding"])


def _elu(x: np.ndarray) -> np.ndarray:
    return np.where(x > 0, x, np.expm1(np.minimum(x, 0)))


def _gatv2(weights: dict[str, np.ndarray], name: str, heads: int, x: np.ndarray, index: np.ndarray,
           attr: np.ndarray) -> np.ndarray:
    """PyG's GATv2Conv (no self-loops, heads concatenated) on ``x`` [N, f] over ``index`` [2, E] (source,
    target) with ``attr`` [E, F]: attention softmaxed over each target's incoming edges."""
    num_nodes = len(x)
    x_l = (x @ weights[f"{name}.lin_l.weight"].T + weights[f"{name}.lin_l.bias"]).reshape(num_nodes, heads, -1)
    x_r = (x @ weights[f"{name}.lin_r.weight"].T + weights[f"{name}.lin_r.bias"]).reshape(num_nodes, heads, -1)
    source, target = index
    message = x_l[source]  # [E, H, C]
    e = message + x_r[target] + (attr @ weights[f"{name}.lin_edge.weight"].T).reshape(len(source), heads, -1)
    score = (np.where(e > 0, e, 0.2 * e) * weights[f"{name}.att"]).sum(axis=-1)  # [E, H]
    top = np.full((num_nodes, heads), -np.inf, dtype=score.dtype)
    np.maximum.at(top, target, score)
    alpha = np.exp(score - top[target])
    total = np.zeros((num_nodes, heads), dtype=score.dtype)
    np.add.at(total, target, alpha)
    out = np.zeros_like(x_l)
    np.add.at(out, target, message * (alpha / total[target])[..., None])
    return out.reshape(num_nodes, -1) + weights[f"{name}.bias"]


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
    """Priors and greedy completions for a :class:`~tag.search.MappingEnv` from one forward pass."""

    def __init__(self, policy: MappingPolicy, instance: MappingInstance) -> None:
        tables = numpy_tables(policy, instance)
        self.instance = instance
        self.static = tables.static.astype(np.float64)  # [K, D]
        self.affinity = tables.affinity.astype(np.float64)  # [D, D]
        self.edge_weight = tables.edge_weight.astype(np.float64)  # [E]
        self.beta = tables.beta.astype(np.float64)  # [NUM_BETAS]
        self.crowding = float(tables.crowding)
        earlier: list[list[tuple[int, int, bool, bool]]] = [[] for _ in range(instance.num_slots)]
        for e, (a, b) in enumerate(zip(instance.edge_a.tolist(), instance.edge_b.tolist())):
            earlier[b].append((e, a, bool(instance.edge_kind[e] == RING_EDGE), bool(instance.edge_counted[e])))
        self._earlier = earlier  # per slot: (edge, earlier slot, a ring hop, counted by the objective)
        self._before: dict[tuple[int, ...], float] = {(): 0.0}  # decided prefix -> T after it
        self._closing: dict[tuple[int, ...], np.ndarray] = {}  # prefix up to a ring's replica 0 -> its table

    def _step(self, k: int, devices: Sequence[int], before: float) -> tuple[np.ndarray, np.ndarray]:
        """(logits [D] unmasked, partial time [D]) of slot k with slots < k on ``devices``."""
        inst = self.instance
        logits = self.static[k].copy()
        added = np.zeros(inst.num_devices)  # P: one slot has counted edges of one kind only
        for e, a, is_ring, counted in self._earlier[k]:
            x = devices[a]
            logits += self.edge_weight[e] * self.affinity[x]
            if not counted:
                continue
            if is_ring:  # eq. (7): the ring's slowest hop
                np.maximum(added, inst.edge_cost(e, x), out=added)
            else:  # eq. (6): every transfer
                added += inst.edge_cost(e, x)
        partial = inst.compute[k] + added
        beta = self.beta
        logits -= beta[0] * added
        if inst.ring_start[k] < 0:  # A = P: the look-ahead terms add to the plain ones
            logits -= ((beta[1] + beta[3]) * np.maximum(partial - before, 0.0)
                       + (beta[2] + beta[4]) * np.maximum(partial - 1.0, 0.0))
        else:
            ahead = inst.compute[k] + np.maximum(added, self._return_cost(k, devices))
            logits -= (beta[1] * np.maximum(partial - before, 0.0) + beta[2] * np.maximum(partial - 1.0, 0.0)
                       + beta[3] * np.maximum(ahead - before, 0.0) + beta[4] * np.maximum(ahead - 1.0, 0.0))
        return logits, partial

    def _return_cost(self, k: int, devices: Sequence[int]) -> np.ndarray:
        """[D] look-ahead slot k's return cost; one closing table per ring start, memoised by its prefix."""
        first = int(self.instance.ring_start[k])
        key = tuple(devices[:first + 1])
        table = self._closing.get(key)
        if table is None:
            table = self._closing[key] = self.instance.closing_table(k, devices)
        return table[self.instance.hops_left[k] - 1]

    def _running_time(self, devices: Sequence[int]) -> float:
        """T after the decided slots: the largest time at placement among them. Memoised per prefix: a
        search asks for a state's priors and then its fill, and each state extends its parent by one."""
        key = tuple(devices)
        before = self._before.get(key)
        if before is None:
            before = self._running_time(key[:-1])
            _, partial = self._step(len(key) - 1, key, before)
            before = self._before[key] = max(before, float(partial[key[-1]]))
        return before

    def logits(self, devices: Sequence[int]) -> np.ndarray:
        """[D] logits of the next slot after ``devices`` (used devices masked), as in training."""
        logits, _ = self._step(len(devices), devices, self._running_time(devices))
        free = np.ones(self.instance.num_devices)
        free[list(devices)] = 0.0
        logits += self.crowding * (self.instance.near_share @ free)
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

    def complete(self, devices: Sequence[int]) -> list[int]:
        """``devices`` extended to every slot, each next slot on its highest-logit free device."""
        out = list(devices)
        free = np.ones(self.instance.num_devices, dtype=bool)
        free[out] = False
        before = self._running_time(out)
        crowd = self.instance.near_share @ free  # [D] share of each device's near links still free
        for k in range(len(out), self.instance.num_slots):
            logits, partial = self._step(k, out, before)
            score = np.round(logits + self.crowding * crowd, _TIE_DECIMALS)  # ties to the lowest device id
            choice = int(np.argmax(np.where(free, score, -np.inf)))
            out.append(choice)
            free[choice] = False
            crowd -= self.instance.near_share[:, choice]
            before = max(before, float(partial[choice]))
        return out


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

DEFAULT_MAPPER_ITERATIONS = 32  # MCTS leaves after the greedy decode (0: the greedy decode alone)


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
    if not path.is_file():
        raise PolicyError(f"no mapping policy checkpoint at {str(path)!r}"
                          + (" (train one with scripts/train_mapper.py --ship)" if policy is None else ""))
    return _cached_policy(str(path), path.stat().st_mtime)


def learned_mapping(problem: MappingProblem, policy: MappingPolicy, *, instantiation: str,
                    iterations: int = DEFAULT_MAPPER_ITERATIONS, time_limit_s: float | None = None,
                    lower_bound: float | None = None, seed: int | np.random.Generator | None = 0) -> np.ndarray:
    """[S, R] the best mapping of GNN-guided MCTS on a :class:`~tag.search.MappingEnv`: one forward pass,
    the greedy decode, then up to ``iterations`` further leaves (each completed greedily), capped by
    ``time_limit_s``. The search is skipped when the greedy decode meets ``lower_bound`` (by default
    :func:`quick_lower_bound`): it is then optimal. The CS map is among the candidates, so the result is
    never worse than it."""
    from tag.search import MappingEnv, mcts_search

    if lower_bound is None:  # the search's value is a bound over the time: the quick one costs nothing
        lower_bound = quick_lower_bound(problem, instantiation)
    env = MappingEnv(problem, instantiation=instantiation, lower_bound=lower_bound)
    decoder = MappingDecoder(policy, MappingInstance.from_env(env))
    env.fill = decoder.complete
    greedy = env.evaluate(env.root())
    if greedy.value >= 1.0 - 1e-12:  # proven optimal: no leaf can do better
        return np.asarray(greedy.candidate, dtype=np.int64)

    def evaluator(observation: Any) -> np.ndarray:
        if observation.next_slot < 0:  # terminal: no candidates
            return np.zeros(0)
        return decoder.priors(observation.assigned[:observation.next_slot].tolist())

    result = mcts_search(env, evaluator, max_iterations=max(1, iterations + 1), time_limit_s=time_limit_s,
                         target_visits=None, seed=seed)  # its first leaf, the root, is the greedy decode again
    return np.asarray(result.best, dtype=np.int64)
