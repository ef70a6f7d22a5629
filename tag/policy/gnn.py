"""The heterogeneous GNN policy of TAG §4.2.1: encoders, GATv2 layers over the relations, action decoder.

Encoders: one Linear per node type maps the features of :mod:`tag.policy.features` to the width f
(``hidden``). Edge features enter each layer raw: GATv2Conv's own edge projection (``lin_edge``) is the
fully-connected transform of the paper, so a separate encoder would only compose two linear maps.

Layers (``num_layers``, four in TAG): a ``HeteroConv`` whose relation r is a multi-head
``GATv2Conv(edge_dim=…, add_self_loops=False)``, its output multiplied by γ_r (1 when r joins nodes of
one type, 0.1 across types: TAG's γ_etype) before HeteroConv sums the relations into each node type;
then ``h ← h + ELU(Σ_r γ_r · GAT_r(h))``. GAT attention averages over neighbours, so magnitudes do not
grow with degree and the model takes any number of op groups and device groups.

Decoder. For candidate action a = (mask P_a [M], option O_a) of next op group i, TAG scores the
concatenation [Σ_j P_aj·E_dev[j] ; E_op[i] ; onehot(O_a)] with one dense layer. A linear score of a
concatenation is a sum of one term per part, and the E_op[i] term is the same for every candidate, so
the softmax would drop it: the op group could not influence its own placement. We therefore use the
close variant of a dense layer, ELU and a dense layer to one score:

    score_a = w · ELU(W_dev Σ_j P_aj E_dev[j] + W_op E_op[i] + W_opt onehot(O_a) + b) + c

(the first layer is TAG's dense layer on the concatenation, written block by block so that W_dev is
applied to the M device embeddings once rather than to A sums). Softmax over the candidates of each
state gives the priors.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.data import Batch, HeteroData
from torch_geometric.nn import GATv2Conv, HeteroConv
from torch_geometric.utils import scatter

from tag.policy.errors import PolicyError
from tag.policy.features import (
    ACTION,
    DECIDES,
    DEVICE,
    GNN_RELATIONS,
    IN_MASK,
    NODE_FEATURES,
    OP,
    RELATION_FEATURES,
)
from tag.strategy import OPTIONS

__all__ = ["PolicyConfig", "HeteroPolicy", "build_policy", "action_logits", "action_log_probs", "policy_loss",
           "segment_log_softmax"]


# Upper bounds of the hyper-parameters, 8x and 4x the shipped ones: a checkpoint or config cannot make tag
# allocate more than ~200 MB of weights.
MAX_WIDTH = 512  # hidden, decoder_hidden
MAX_HEADS = 64
MAX_LAYERS = 16


@dataclass(frozen=True)
class PolicyConfig:
    """The GNN's hyper-parameters, for the entry points (training, CLI, checkpoints)."""

    hidden: int = 64  # f: width of every node embedding (TAG §4.2.1)
    heads: int = 4  # attention heads per GATv2 relation; must divide hidden
    num_layers: int = 4  # TAG: 4 layers; deeper GNNs over-smooth
    gamma_same: float = 1.0  # γ of relations between nodes of one type (op→op, device→device)
    gamma_cross: float = 0.1  # γ of relations across types (op↔device)
    decoder_hidden: int = 64  # width of the decoder's hidden layer

    def __post_init__(self) -> None:
        _check_hyper_parameters(**dataclasses.asdict(self))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Any) -> PolicyConfig:
        """The config of a plain dict (a checkpoint's); PolicyError on unknown or missing fields."""
        if not isinstance(values, dict):
            raise PolicyError(f"policy config must be a dict, got {type(values).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise PolicyError(f"policy config has unknown field(s) {', '.join(map(str, unknown))}")
        return cls(**values)


class _Weighted(nn.Module):
    """One relation's convolution with its output scaled by γ (HeteroConv then sums the relations)."""

    def __init__(self, conv: nn.Module, gamma: float) -> None:
        super().__init__()
        self.conv = conv
        self.gamma = gamma

    def forward(self, x: Tensor | tuple[Tensor, Tensor], edge_index: Tensor, edge_attr: Tensor) -> Tensor:
        return self.gamma * self.conv(x, edge_index, edge_attr=edge_attr)

    def extra_repr(self) -> str:
        return f"gamma={self.gamma}"


class HeteroPolicy(nn.Module):
    """Op-group and device-group embeddings, then a score per candidate action (module docstring)."""

    def __init__(self, *, hidden: int = 64, heads: int = 4, num_layers: int = 4, gamma_same: float = 1.0,
                 gamma_cross: float = 0.1, decoder_hidden: int = 64) -> None:
        super().__init__()
        self.config = PolicyConfig(hidden=hidden, heads=heads, num_layers=num_layers, gamma_same=gamma_same,
                                   gamma_cross=gamma_cross, decoder_hidden=decoder_hidden)  # validates them
        self.encoders = nn.ModuleDict({node: nn.Linear(len(columns), hidden)
                                       for node, columns in NODE_FEATURES.items()})
        self.layers = nn.ModuleList(_layer(hidden, heads, gamma_same, gamma_cross) for _ in range(num_layers))
        self.decode_device = nn.Linear(hidden, decoder_hidden, bias=False)
        self.decode_op = nn.Linear(hidden, decoder_hidden)
        self.decode_option = nn.Embedding(len(OPTIONS), decoder_hidden)
        self.score = nn.Linear(decoder_hidden, 1)

    def embed(self, x_dict: dict[str, Tensor], edge_index_dict: dict[tuple, Tensor],
              edge_attr_dict: dict[tuple, Tensor]) -> dict[str, Tensor]:
        """Node embeddings {OP: E_op [G, f], DEVICE: E_dev [M, f]} after every layer."""
        h = {node: encoder(x_dict[node]) for node, encoder in self.encoders.items()}
        for layer in self.layers:
            messages = layer(h, edge_index_dict, edge_attr_dict)
            h = {node: h[node] + F.elu(messages[node]) if node in messages else h[node] for node in h}
        return h

    def forward(self, data: HeteroData | Batch) -> Tensor:
        """Scores [ΣA] of the candidate actions of every state in ``data`` (one state or a Batch), in the
        order of ``data[ACTION]``."""
        h = self.embed(data.x_dict, data.edge_index_dict, data.edge_attr_dict)
        num_actions = data[ACTION].num_nodes
        width = self.decode_op.out_features
        device, mask_action = data[IN_MASK].edge_index
        op, op_action = data[DECIDES].edge_index
        zeros = h[OP].new_zeros(num_actions, width)
        # [A, d] W_dev Σ_j P_aj E_dev[j], projecting the M device embeddings once rather than A sums
        placed = zeros.index_add(0, mask_action, self.decode_device(h[DEVICE])[device])
        next_op = zeros.index_add(0, op_action, self.decode_op(h[OP])[op])  # [A, d] W_op E_op[i] + b
        hidden = F.elu(placed + next_op + self.decode_option(data[ACTION].option))
        return self.score(hidden).squeeze(-1)


def _layer(hidden: int, heads: int, gamma_same: float, gamma_cross: float) -> HeteroConv:
    """One GNN layer: a multi-head GATv2 per relation, scaled by its γ, summed per node type."""
    convs = {}
    for relation in GNN_RELATIONS:
        conv = GATv2Conv(hidden, hidden // heads, heads=heads, edge_dim=len(RELATION_FEATURES[relation]),
                         add_self_loops=False)
        convs[relation] = _Weighted(conv, gamma_same if relation[0] == relation[-1] else gamma_cross)
    return HeteroConv(convs, aggr="sum")


def build_policy(config: PolicyConfig | None = None, *, seed: int = 0) -> HeteroPolicy:
    """A freshly initialised policy; the same seed gives the same weights (torch's global RNG is left as is)."""
    config = config if config is not None else PolicyConfig()
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise PolicyError(f"seed must be a non-negative integer, got {seed!r}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        return HeteroPolicy(**config.to_dict())


# --------------------------------------------------------------------------------------------- outputs


def action_logits(model: HeteroPolicy, data: HeteroData | Batch) -> tuple[Tensor, Tensor, int]:
    """``(logits [ΣA], state [ΣA] int64, number of states)`` for one state's data or a Batch."""
    logits = model(data)
    if isinstance(data, Batch):
        return logits, data[ACTION].batch, data.num_graphs
    return logits, torch.zeros(len(logits), dtype=torch.long, device=logits.device), 1


def action_log_probs(model: HeteroPolicy, data: HeteroData | Batch) -> tuple[Tensor, Tensor]:
    """``(log G(s, a) [ΣA], state [ΣA])``: log-softmax of the scores over each state's candidates."""
    logits, state, num_states = action_logits(model, data)
    return segment_log_softmax(logits, state, num_states), state


def segment_log_softmax(values: Tensor, segment: Tensor, num_segments: int) -> Tensor:
    """Log-softmax of ``values`` [K] within each segment (``segment`` [K] in 0..num_segments-1)."""
    if values.numel() == 0:
        return values
    top = scatter(values.detach(), segment, dim=0, dim_size=num_segments, reduce="max")  # [S]
    shifted = values - top[segment]
    total = scatter(shifted.exp(), segment, dim=0, dim_size=num_segments, reduce="sum")  # [S]
    return shifted - total.log()[segment]


def policy_loss(model: HeteroPolicy, data_list: Sequence[HeteroData], targets: Sequence[Any]) -> Tensor:
    """Mean over states of the cross-entropy −Σ_a π(s, a) log G(s, a) (TAG §4.2.2).

    ``data_list``: states' features (:func:`tag.policy.state_to_data`); ``targets``: for each, π [A]
    (MCTS visit-count distribution) over its candidates. One batched forward.
    """
    if len(data_list) == 0 or len(data_list) != len(targets):
        raise PolicyError(f"policy_loss needs one target per state and at least one state; got "
                          f"{len(data_list)} states and {len(targets)} targets")
    device = next(model.parameters()).device
    target_rows = []
    for k, (data, target) in enumerate(zip(data_list, targets)):
        row = target.detach().float() if isinstance(target, Tensor) else torch.from_numpy(
            np.asarray(target, dtype=np.float32))
        if row.shape != (data[ACTION].num_nodes,) or row.numel() == 0:
            raise PolicyError(f"targets[{k}] has shape {tuple(row.shape)}; state {k} has "
                              f"{data[ACTION].num_nodes} candidate actions (at least one needed)")
        target_rows.append(row)
    batch = Batch.from_data_list(list(data_list)).to(device)
    log_probs, state = action_log_probs(model, batch)
    target = torch.cat(target_rows).to(device)
    per_state = -scatter(target * log_probs, state, dim=0, dim_size=len(data_list), reduce="sum")
    return per_state.mean()


# --------------------------------------------------------------------------------------------- validation


def _check_hyper_parameters(*, hidden: Any, heads: Any, num_layers: Any, gamma_same: Any, gamma_cross: Any,
                            decoder_hidden: Any) -> None:
    for name, value, least, most in (("hidden", hidden, 1, MAX_WIDTH), ("heads", heads, 1, MAX_HEADS),
                                     ("num_layers", num_layers, 0, MAX_LAYERS),
                                     ("decoder_hidden", decoder_hidden, 1, MAX_WIDTH)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not least <= value <= most:
            raise PolicyError(f"{name} must be an integer in {least}..{most}, got {value!r}")
    if hidden % heads:
        raise PolicyError(f"heads ({heads}) must divide hidden ({hidden})")
    for name, value in (("gamma_same", gamma_same), ("gamma_cross", gamma_cross)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise PolicyError(f"{name} must be a finite non-negative number, got {value!r}")
