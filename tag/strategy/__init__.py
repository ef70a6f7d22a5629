"""Strategies (TAG §4.2): placement masks × replication options per op group, replicas, actions, plan files."""

from tag.strategy.actions import DEFAULT_MAX_DEVICE_GROUPS, candidate_actions, count_actions, restricted_actions
from tag.strategy.errors import PlanError, PlanMismatchError, StrategyError
from tag.strategy.fingerprint import graph_fingerprint, grouping_fingerprint
from tag.strategy.plan import (
    PLAN_FORMAT,
    PLAN_SCHEMA_VERSION,
    Plan,
    check_plan,
    load_plan,
    make_plan,
    plan_from_json,
    plan_to_json,
    save_plan,
)
from tag.strategy.pipeline_plan import (
    PIPELINE_KIND,
    PipelinePlanFile,
    check_pipeline_plan,
    load_pipeline_plan,
    make_pipeline_plan,
    pipeline_plan_from_json,
    pipeline_plan_to_json,
    plan_kind,
    save_pipeline_plan,
)
from tag.strategy.strategy import (
    ALLREDUCE,
    BATCH_SPLITS,
    DUPLICATE,
    MODEL_PARALLEL,
    OPTIONS,
    PS,
    SINGLE_DEVICE_OPTION,
    SYNC_OPTIONS,
    Replicas,
    Strategy,
    device_group_sizes,
    option_code,
    replica_fractions,
    replicas,
)

__all__ = [
    # options and the strategy
    "OPTIONS", "ALLREDUCE", "PS", "DUPLICATE", "MODEL_PARALLEL", "SYNC_OPTIONS", "SINGLE_DEVICE_OPTION",
    "BATCH_SPLITS", "Strategy", "option_code", "device_group_sizes",
    # what the compiler reads
    "Replicas", "replicas", "replica_fractions",
    # search actions
    "candidate_actions", "restricted_actions", "count_actions", "DEFAULT_MAX_DEVICE_GROUPS",
    # plan files and fingerprints
    "Plan", "make_plan", "check_plan", "plan_to_json", "plan_from_json", "save_plan", "load_plan",
    "PLAN_FORMAT", "PLAN_SCHEMA_VERSION", "graph_fingerprint", "grouping_fingerprint",
    # pipeline plan files (kind "pipeline")
    "PipelinePlanFile", "make_pipeline_plan", "check_pipeline_plan", "pipeline_plan_to_json",
    "pipeline_plan_from_json", "save_pipeline_plan", "load_pipeline_plan", "plan_kind", "PIPELINE_KIND",
    # errors
    "StrategyError", "PlanError", "PlanMismatchError",
]
