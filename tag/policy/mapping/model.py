"""The learned mapper's network (:class:`MappingPolicy`) in torch, for training, and in numpy, for
inference (:func:`numpy_tables`: the same tables without torch's and PyG's per-call overhead, which
dominates at the sizes a mapper sees; a test holds the two equal).

One Linear encoder per node type, then ``num_layers`` residual GATv2 layers per edge type
(``h ← h + ELU(GAT(h))``) over an instance's ``x_dict``, ``edge_index_dict`` and ``edge_attr_dict``
(:mod:`tag.policy.mapping.instance`). It runs once per problem and returns :class:`DecoderTables`:

- ``static`` [K, D]: a dense layer, ELU and a dense layer over E_slot[k] + E_dev[d] + w·compute(k, d);
- ``affinity`` [D, D]: (Q E_dev[x]) · (K E_dev[d]) / √f, "d suits a slot whose neighbour sits on x";
- ``edge_weight`` [E]: how much each slot edge's affinity counts (a small MLP of both ends and the edge);
- ``beta`` [NUM_BETAS]: positive weights of the decoder's physical terms (:mod:`tag.policy.mapping.decoder`);
- ``crowding`` []: the weight of the share of a device's near links still free.
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn import GATv2Conv

from tag._compiled import jit as _jit
from tag.policy.errors import PolicyError
from tag.policy.gnn import MAX_HEADS, MAX_LAYERS, MAX_WIDTH
from tag.policy.mapping.instance import (
    DEVICE,
    DEVICE_EDGE_FEATURES,
    DEVICE_FEATURES,
    EXCHANGES,
    LINKS,
    SLOT,
    SLOT_EDGE_FEATURES,
    SLOT_FEATURES,
    MappingInstance,
)

__all__ = ["MappingPolicyConfig", "MappingPolicy", "DecoderTables", "numpy_tables", "NUM_BETAS"]

NUM_BETAS = 5  # weights of the decoder's physical terms


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
    """The mapping GNN (module docstring); its layers' names are the checkpoints' state-dict keys."""

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

    def embed(self, x_dict: dict[str, Tensor], edge_index_dict: dict[tuple[str, str, str], Tensor],
              edge_attr_dict: dict[tuple[str, str, str], Tensor]) -> dict[str, Tensor]:
        """Node embeddings by type: the encoders, then the residual GATv2 layers of each edge type.

        Shapes:
            x_dict: {SLOT: [K, SLOT_FEATURES], DEVICE: [D, DEVICE_FEATURES]} float32;
            edge_index_dict: {EXCHANGES: [2, 2E], LINKS: [2, E_dev]} int64;
            edge_attr_dict: {EXCHANGES: [2E, SLOT_EDGE_FEATURES], LINKS: [E_dev, DEVICE_EDGE_FEATURES]};
            returns {SLOT: [K, f], DEVICE: [D, f]}.
        """
        h_dict = {SLOT: F.elu(self.slot_in(x_dict[SLOT])), DEVICE: F.elu(self.device_in(x_dict[DEVICE]))}
        for slot_layer, device_layer in zip(self.slot_layers, self.device_layers):
            for node_type, edge_type, layer in ((SLOT, EXCHANGES, slot_layer), (DEVICE, LINKS, device_layer)):
                edge_index = edge_index_dict[edge_type]
                if edge_index.shape[1]:  # a graph without edges of this type keeps its embeddings
                    h = h_dict[node_type]
                    h_dict[node_type] = h + F.elu(layer(h, edge_index, edge_attr_dict[edge_type]))
        return h_dict

    def forward(self, instance: MappingInstance) -> DecoderTables:
        """The decoder's tables of ``instance`` (module docstring).

        Shapes:
            ``instance.x_dict``, ``edge_index_dict``, ``edge_attr_dict``: as :meth:`embed` takes them;
            ``instance.compute``: [K, D];
            returns static [K, D], affinity [D, D], edge_weight [E], beta [NUM_BETAS], crowding [].
        """
        x_dict = {key: torch.as_tensor(x, dtype=torch.float32) for key, x in instance.x_dict.items()}
        edge_index_dict = {key: torch.as_tensor(index, dtype=torch.long)
                           for key, index in instance.edge_index_dict.items()}
        edge_attr_dict = {key: torch.as_tensor(attr, dtype=torch.float32)
                          for key, attr in instance.edge_attr_dict.items()}
        h_dict = self.embed(x_dict, edge_index_dict, edge_attr_dict)
        h_slot, h_dev = h_dict[SLOT], h_dict[DEVICE]  # [K, f], [D, f]
        num_edges = len(instance.edge_a)
        ends = edge_index_dict[EXCHANGES][:, :num_edges]  # [2, E] (earlier slot, later slot)
        edge_attr = edge_attr_dict[EXCHANGES][:num_edges]  # [E, SLOT_EDGE_FEATURES]

        compute = torch.as_tensor(instance.compute, dtype=torch.float32)  # [K, D]
        hidden = (self.pair_slot(h_slot)[:, None, :] + self.pair_device(h_dev)[None, :, :]
                  + compute[:, :, None] * self.pair_compute)  # [K, D, f]
        static = self.pair_out(F.elu(hidden)).squeeze(-1)  # [K, D]
        affinity = self.query(h_dev) @ self.key(h_dev).T / math.sqrt(self.config.hidden)  # [D, D]
        a, b = h_slot[ends[0]], h_slot[ends[1]]
        edge_weight = self.edge_mlp(torch.cat([a + b, a * b, edge_attr], dim=1)).squeeze(-1)  # [E]
        beta = F.softplus(self.beta_raw) + 0.1  # bounded away from 0: the physical terms always count
        return DecoderTables(static, affinity, edge_weight, beta, self.crowding)


# --------------------------------------------------------------------------------------- the numpy copy


def numpy_tables(policy: MappingPolicy, instance: MappingInstance) -> DecoderTables:
    """:meth:`MappingPolicy.forward` in numpy (float32), for inference: the same tables as numpy arrays
    (a test holds the two equal). Shapes as :meth:`MappingPolicy.forward`'s."""
    weights = _numpy_weights(policy)

    def linear(name: str, x: np.ndarray) -> np.ndarray:
        out = x @ weights[f"{name}.weight"].T
        bias = weights.get(f"{name}.bias")
        return out if bias is None else out + bias

    x_dict = {key: x.astype(np.float32) for key, x in instance.x_dict.items()}
    edge_index_dict = instance.edge_index_dict
    edge_attr_dict = {key: attr.astype(np.float32) for key, attr in instance.edge_attr_dict.items()}
    h_dict = {SLOT: _elu(linear("slot_in", x_dict[SLOT])), DEVICE: _elu(linear("device_in", x_dict[DEVICE]))}
    for layer in range(policy.config.num_layers):
        for node_type, edge_type, name in ((SLOT, EXCHANGES, "slot_layers"), (DEVICE, LINKS, "device_layers")):
            edge_index = edge_index_dict[edge_type]
            if edge_index.shape[1]:
                h = h_dict[node_type]
                h_dict[node_type] = h + _elu(_gatv2(weights, f"{name}.{layer}", policy.config.heads, h, edge_index,
                                                    edge_attr_dict[edge_type]))
    h_slot, h_dev = h_dict[SLOT], h_dict[DEVICE]  # [K, f], [D, f]
    num_edges = len(instance.edge_a)
    ends = edge_index_dict[EXCHANGES][:, :num_edges]  # [2, E]
    edge_attr = edge_attr_dict[EXCHANGES][:num_edges]  # [E, SLOT_EDGE_FEATURES]
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

