"""Graph pipeline parallelism (GraphPipe): series-parallel decomposition, the stage partitioner of its
§5, the static micro-batch scheduler of its §6, and graph-pipeline plans compiled to the shared
TaskGraph and simulated."""

from tag.graphpipe.partition import (
    DEFAULT_MAX_CHAIN,
    BlockGraph,
    GraphPartition,
    block_graph,
    depth_frontier,
    partition_graphpipe,
    solve_for_target,
)
from tag.graphpipe.pipeline import (
    DEFAULT_SLACK,
    SEQUENTIAL,
    SEQUENTIAL_LINKS,
    TAIL_SHARES,
    GraphPipelinePlan,
    compile_graph_pipeline,
    graph_stage_graph,
    plan_graph_pipeline,
    replay_graph_pipeline,
    simulate_graph_pipeline,
)
from tag.graphpipe.scheduler import (
    ScheduleError,
    check_schedule,
    format_grid_dag,
    graph_stage_orders,
    inflight_samples,
    stage_depths,
    stage_inflight,
    unit_time_schedule_dag,
)
from tag.graphpipe.sp import (
    FALLBACKS,
    LEAF,
    PARALLEL,
    SERIES,
    SPError,
    SPNode,
    SPTree,
    contract_dangling,
    quotient_dag,
    reachability,
    sp_decompose,
)

__all__ = [
    # series-parallel decomposition
    "sp_decompose", "SPTree", "SPNode", "SPError", "LEAF", "SERIES", "PARALLEL", "FALLBACKS", "reachability",
    "contract_dangling", "quotient_dag",
    # stage partitioner (§5)
    "block_graph", "BlockGraph", "partition_graphpipe", "solve_for_target", "depth_frontier", "GraphPartition", "DEFAULT_MAX_CHAIN",
    # micro-batch scheduler (§6)
    "inflight_samples", "stage_inflight", "stage_depths", "graph_stage_orders", "check_schedule",
    "unit_time_schedule_dag", "format_grid_dag", "ScheduleError",
    # plans
    "compile_graph_pipeline", "simulate_graph_pipeline", "graph_stage_graph", "GraphPipelinePlan",
    "plan_graph_pipeline", "replay_graph_pipeline", "DEFAULT_SLACK", "TAIL_SHARES", "SEQUENTIAL",
    "SEQUENTIAL_LINKS",
]
