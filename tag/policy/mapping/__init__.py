"""The learned stage-to-device mapper's network (DESIGN.md: Policy and search, "the learned mapper").

A :class:`~tag.search.MappingEnv` decides one stage replica ("slot") after another, in the exact
mapper's connectivity order; an action is a device. This package gives that tree its priors and its
greedy fill; the driver that searches with them is :mod:`tag.planners.learned_mapper`.

- :mod:`~tag.policy.mapping.instance`: the graph of one mapping problem (slots and devices, their
  features and edges, return costs), :class:`MappingInstance`;
- :mod:`~tag.policy.mapping.model`: the heterogeneous GATv2 network over it, :class:`MappingPolicy`, and
  its numpy copy for inference, :func:`numpy_tables`;
- :mod:`~tag.policy.mapping.decoder`: the decoder's logits, priors and greedy completions,
  :class:`MappingDecoder`, with a reference and a compiled fast path;
- :mod:`~tag.policy.mapping.backtrack`: searches under a bound of the stage time that back up where the
  decoder's greedy decode gets stuck (depth-first and limited-discrepancy, with a ring-region check);
- :mod:`~tag.policy.mapping.loss`: the same logits batched in torch for training, :func:`imitation_loss`;
- :mod:`~tag.policy.mapping.checkpoint`: saving, loading and the shipped checkpoint.
"""

from tag.policy.mapping.checkpoint import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_VERSION,
    MappingCheckpoint,
    load_mapping_policy,
    resolve_mapping_policy,
    save_mapping_policy,
    shipped_mapping_checkpoint,
)
from tag.policy.mapping.decoder import MASKED_LOGIT, MappingDecoder
from tag.policy.mapping.instance import (
    DEVICE,
    DEVICE_FEATURES,
    EXCHANGES,
    LINKS,
    MAPPING_FEATURE_VERSION,
    METADATA,
    SLOT,
    SLOT_FEATURES,
    MappingInstance,
    quick_lower_bound,
    search_order,
)
from tag.policy.mapping.loss import imitation_loss, teacher_forced_logits
from tag.policy.mapping.model import DecoderTables, MappingPolicy, MappingPolicyConfig, numpy_tables

__all__ = [
    "MappingInstance", "quick_lower_bound", "search_order", "MappingPolicyConfig", "MappingPolicy", "DecoderTables",
    "numpy_tables", "MappingDecoder", "MASKED_LOGIT", "teacher_forced_logits", "imitation_loss",
    "save_mapping_policy", "load_mapping_policy", "resolve_mapping_policy", "shipped_mapping_checkpoint",
    "MappingCheckpoint", "CHECKPOINT_FORMAT", "CHECKPOINT_VERSION", "MAPPING_FEATURE_VERSION",
    "SLOT_FEATURES", "DEVICE_FEATURES", "SLOT", "DEVICE", "EXCHANGES", "LINKS", "METADATA",
]
