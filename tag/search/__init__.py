"""Search over strategies (TAG §4.2.2): MCTS with PUCT over per-group placements, and an MCMC baseline.

The search knows nothing of the GNN: it takes an :data:`Evaluator` (priors over the candidate actions of
a :class:`PlacementState`). A search environment (:class:`SearchEnv`) defines the tree; the placement
environment decides op group by op group, and the MCTS core drives any environment of the same shape.
"""

from tag.search.base import (
    BatchEvaluator,
    Evaluator,
    PlacementState,
    frozen_gc,
    uniform_batch_evaluator,
    uniform_evaluator,
)
from tag.search.env import LeafEvaluation, SearchEnv
from tag.search.errors import SearchError
from tag.search.mcmc import DEFAULT_ALPHA, acceptance_probability, mcmc_search, metropolis_step, propose
from tag.search.mcts import (
    DEFAULT_C_PUCT,
    DEFAULT_FPU_REDUCTION,
    DEFAULT_TARGET_VISITS,
    backup,
    evaluate,
    expand,
    mcts_search,
    puct_scores,
    select,
    select_action,
    visit_targets,
)
from tag.search.placement import (
    DP_NCCL,
    OOM_REWARD,
    SINGLE_DEVICE_COMPUTE,
    Placement,
    PlacementEnv,
    Simulated,
    placement_candidates,
)
from tag.search.mapping_env import MappingEnv, MappingObservation, uniform_mapping_evaluator
from tag.search.staged import layer_positions, staged_strategy
from tag.search.result import (BEAT_RTOL, HistoryPoint, ProgressCallback, SearchProgress, SearchResult, TrainingTarget,
                               beats_reference)
from tag.search.tree import NO_PARENT, ROOT, UNEXPANDED, UNVISITED, Tree

__all__ = [
    # evaluators and the state they see
    "PlacementState", "Evaluator", "BatchEvaluator", "uniform_evaluator", "uniform_batch_evaluator",
    # environments
    "SearchEnv", "LeafEvaluation", "PlacementEnv", "Placement", "Simulated", "placement_candidates",
    "OOM_REWARD", "DP_NCCL", "SINGLE_DEVICE_COMPUTE", "staged_strategy", "layer_positions",
    "MappingEnv", "MappingObservation", "uniform_mapping_evaluator",
    # MCTS
    "mcts_search", "puct_scores", "select_action", "select", "evaluate", "expand", "backup", "visit_targets",
    "DEFAULT_C_PUCT", "DEFAULT_FPU_REDUCTION", "DEFAULT_TARGET_VISITS",
    "Tree", "ROOT", "UNVISITED", "NO_PARENT", "UNEXPANDED",
    # MCMC
    "mcmc_search", "acceptance_probability", "metropolis_step", "propose", "DEFAULT_ALPHA",
    # results
    "SearchResult", "HistoryPoint", "TrainingTarget", "SearchProgress", "ProgressCallback",
    "BEAT_RTOL", "beats_reference", "SearchError", "frozen_gc",
]
