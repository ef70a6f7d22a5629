"""The learned policy of TAG §4.2.1: state features as a HeteroData, the heterogeneous GNN, the search's
evaluator and checkpoints; :mod:`tag.policy.mapping` holds the learned mapper's network. The search itself
never imports this package (DESIGN.md: Policy and search)."""

from tag.policy.checkpoint import (CHECKPOINT_FORMAT, CHECKPOINT_VERSION, PolicyCheckpoint, load_policy, save_policy,
                                   shipped_policy_path)
from tag.policy.errors import PolicyError
from tag.policy.evaluator import GNNEvaluator
from tag.policy.features import (
    ACTION,
    DECIDES,
    DEVICE,
    DEVICE_FEATURES,
    FEATURE_VERSION,
    FED_BY,
    FEEDS,
    GNN_RELATIONS,
    HOSTS,
    IN_MASK,
    LINK,
    LINK_FEATURES,
    NODE_FEATURES,
    OP,
    OP_FEATURES,
    PLACED_ON,
    PLACEMENT_FEATURES,
    RELATION_FEATURES,
    TENSOR_FEATURES,
    FeatureCache,
    state_to_data,
)
from tag.policy.gnn import (
    HeteroPolicy,
    PolicyConfig,
    action_log_probs,
    action_logits,
    build_policy,
    policy_loss,
    segment_log_softmax,
)

__all__ = [
    "state_to_data", "FeatureCache", "HeteroPolicy", "PolicyConfig", "build_policy", "GNNEvaluator",
    "action_logits", "action_log_probs", "policy_loss", "segment_log_softmax",
    "save_policy", "load_policy", "shipped_policy_path", "PolicyCheckpoint", "PolicyError", "CHECKPOINT_FORMAT", "CHECKPOINT_VERSION",
    "OP", "DEVICE", "ACTION", "FEEDS", "FED_BY", "LINK", "PLACED_ON", "HOSTS", "IN_MASK", "DECIDES", "GNN_RELATIONS",
    "OP_FEATURES", "DEVICE_FEATURES", "TENSOR_FEATURES", "LINK_FEATURES", "PLACEMENT_FEATURES", "NODE_FEATURES",
    "RELATION_FEATURES", "FEATURE_VERSION",
]
