"""The learned mapper's training objective: the decoder's logits at every step of a given mapping at once,
in torch (:func:`teacher_forced_logits`), and the imitation loss over them. The same formula as
:class:`~tag.policy.mapping.decoder.MappingDecoder`'s reference path, batched over the steps and
differentiable (a test holds the two equal up to float32)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from tag.policy.mapping.decoder import MASKED_LOGIT
from tag.policy.mapping.instance import RING_EDGE, MappingInstance
from tag.policy.mapping.model import DecoderTables

__all__ = ["teacher_forced_logits", "imitation_loss"]


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
    return (logits + tables.crowding * crowd.float()).masked_fill(used, MASKED_LOGIT)


def imitation_loss(tables: DecoderTables, instance: MappingInstance, devices: Sequence[int]) -> Tensor:
    """Mean cross-entropy of choosing ``devices[k]`` at step k under teacher forcing."""
    logits = teacher_forced_logits(tables, instance, devices)
    return F.cross_entropy(logits, torch.as_tensor(np.asarray(devices, dtype=np.int64)))
