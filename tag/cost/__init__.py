"""Cost model: op times per GPU type and batch fraction, communication times, training memory."""

from tag.cost.calibrate import EfficiencyFit, fit_efficiencies, profile_agreement, rankdata, spearman
from tag.cost.comm import (
    allreduce_time,
    broadcast_time,
    chain_broadcast_time,
    hop_bandwidths,
    p2p_time,
    ps_push_pull_time,
    ps_time,
    ring_allreduce_time,
    transfer_time,
)
from tag.cost.compute import DEFAULT_COMPUTE_EFFICIENCY, DEFAULT_MEMORY_EFFICIENCY, CostModel, roofline_time
from tag.cost.memory import OPTIMIZER_STATE_COPIES, fits, training_memory_breakdown, training_memory_bytes
from tag.cost.profiled import ProfiledCostModel

__all__ = [
    "CostModel", "ProfiledCostModel", "roofline_time", "DEFAULT_COMPUTE_EFFICIENCY", "DEFAULT_MEMORY_EFFICIENCY",
    "p2p_time", "ring_allreduce_time", "ps_push_pull_time", "chain_broadcast_time",
    "transfer_time", "allreduce_time", "ps_time", "broadcast_time", "hop_bandwidths",
    "training_memory_bytes", "training_memory_breakdown", "fits", "OPTIMIZER_STATE_COPIES",
    "spearman", "rankdata", "fit_efficiencies", "EfficiencyFit", "profile_agreement",
]
