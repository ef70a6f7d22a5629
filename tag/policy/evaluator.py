"""The GNN as an :data:`tag.search.base.Evaluator`: state → priors over its candidate actions."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch_geometric.data import Batch

from tag.policy.errors import PolicyError
from tag.policy.features import ACTION, FeatureCache, state_to_data
from tag.policy.gnn import HeteroPolicy, action_log_probs
from tag.search.base import PlacementState

__all__ = ["GNNEvaluator"]


class GNNEvaluator:
    """Priors G(s, ·) from a :class:`HeteroPolicy` (TAG §4.2.1), for the search.

    ``evaluator(state)`` returns priors [A] (float64, non-negative, summing to 1; empty for a state without
    candidates); ``evaluator.batch(states)`` does the same for several states with one batched forward.
    Runs under ``torch.no_grad()``; the policy has no dropout or normalisation statistics, so the output
    does not depend on train/eval mode and is deterministic for given weights. ``device``: where to run
    (default: where the model's parameters are). The static features of each (grouping, cluster) the
    evaluator sees are built once, in its own :class:`~tag.policy.features.FeatureCache`.
    """

    def __init__(self, model: HeteroPolicy, *, device: str | torch.device | None = None) -> None:
        if not isinstance(model, HeteroPolicy):
            raise PolicyError(f"GNNEvaluator needs a HeteroPolicy, got {type(model).__name__}")
        self.model = model
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.features = FeatureCache()

    def __call__(self, state: PlacementState) -> np.ndarray:
        if len(state.options) == 0:
            return np.zeros(0)
        data = state_to_data(state, self.features).to(self.device)
        with torch.no_grad():
            log_probs, _ = action_log_probs(self.model, data)
        return _priors(log_probs)

    def batch(self, states: Sequence[PlacementState]) -> list[np.ndarray]:
        """Priors of every state, in order; one forward for all states that have candidates."""
        live = [k for k, state in enumerate(states) if len(state.options)]
        out = [np.zeros(0) for _ in states]
        if not live:
            return out
        batch = Batch.from_data_list([state_to_data(states[k], self.features) for k in live]).to(self.device)
        with torch.no_grad():
            log_probs, _ = action_log_probs(self.model, batch)
        bounds = batch[ACTION].ptr.tolist()  # [S+1] first action of each state
        for position, k in enumerate(live):
            out[k] = _priors(log_probs[bounds[position]:bounds[position + 1]])
        return out

    def __repr__(self) -> str:
        return f"GNNEvaluator({self.model.config}, device={self.device})"


def _priors(log_probs: torch.Tensor) -> np.ndarray:
    """[A] float64 probabilities, renormalised so that they sum to 1 in float64."""
    probs = np.exp(log_probs.double().cpu().numpy())
    return probs / probs.sum()
