"""Exact planners (Parmesan, RaNNC, GraphPipe): partitioning by dynamic programming over downsets,
and provably optimal stage-to-device mapping."""

from tag.exact.clustering import ALPHAS, cluster_operators, is_convex
from tag.exact.downsets import DEFAULT_DOWNSET_LIMIT, DownsetLimitError, downsets, unique_topological_order
from tag.exact.heuristics import cs_map, p2p_map, random_map
from tag.exact.mapping import (
    MappingError,
    MappingProblem,
    MappingResult,
    choose_instantiation,
    max_stage_time,
    solve_mapping,
    stage_times,
)
from tag.exact.mappers import MAPPERS, pipeline_problem
from tag.exact.partition import (
    PartitionResult,
    dp_over_downsets,
    partition_parmesan,
    partition_pipedream,
    refine_partition,
    stage_tables,
)
from tag.exact.pipeline import (
    PARTITIONERS,
    PipelinePlan,
    Placement,
    compile_pipeline,
    consecutive_mapping,
    mapped_stage_times,
    mapping_objective,
    plan_pipeline,
    replay_pipeline,
    simulate_pipeline,
)
from tag.exact.rannc import BlockCosts, RannCSolution, form_stage, rannc_dp
from tag.exact.schedules import Action, format_grid, stage_order, stage_orders
from tag.exact.stage_graph import ForwardGraph, PartitionError, StageGraph, assign_owners, build_stage_graph

__all__ = [
    # mapping (Parmesan §V)
    "MappingProblem", "MappingResult", "MappingError", "solve_mapping", "stage_times", "max_stage_time",
    "choose_instantiation", "cs_map", "p2p_map", "random_map", "MAPPERS", "pipeline_problem",
    # partitioning (Parmesan §IV, RaNNC §III-C) and pipeline plans
    "downsets", "unique_topological_order", "DownsetLimitError", "DEFAULT_DOWNSET_LIMIT",
    "ForwardGraph", "StageGraph", "PartitionError", "assign_owners", "build_stage_graph",
    "cluster_operators", "is_convex", "ALPHAS",
    "stage_tables", "dp_over_downsets", "refine_partition", "partition_parmesan", "partition_pipedream",
    "PartitionResult", "rannc_dp", "form_stage", "BlockCosts", "RannCSolution",
    "Action", "stage_order", "stage_orders", "format_grid",
    "compile_pipeline", "simulate_pipeline", "consecutive_mapping", "Placement", "PipelinePlan", "plan_pipeline",
    "mapping_objective", "mapped_stage_times", "replay_pipeline",
    "PARTITIONERS",
]
