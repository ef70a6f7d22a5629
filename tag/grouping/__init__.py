"""Op grouping: METIS groups with an acyclic repair (TAG §4.1.1), the GroupGraph the planners read, and
METIS model-parallel splits of one group across devices (TAG §4.2)."""

from tag.grouping.acyclic import (
    RepairStats,
    edge_cut,
    quotient_is_dag,
    quotients_are_dags,
    refine_acyclic,
    repair_acyclic,
    topological_chunks,
)
from tag.grouping.errors import GroupingError
from tag.grouping.group_graph import DEFAULT_GPUS, BoundaryTensors, GroupGraph, resolve_gpus
from tag.grouping.metis import (
    DEFAULT_NUM_GROUPS,
    DEFAULT_SPLIT_UFACTOR,
    DEFAULT_UFACTOR,
    group_ops,
    naive_groups,
    op_atoms,
    split_group,
)

__all__ = [
    "group_ops", "split_group", "naive_groups", "op_atoms", "GroupGraph", "BoundaryTensors", "GroupingError",
    "repair_acyclic", "refine_acyclic", "RepairStats", "topological_chunks", "edge_cut", "quotient_is_dag",
    "quotients_are_dags", "resolve_gpus",
    "DEFAULT_NUM_GROUPS", "DEFAULT_UFACTOR", "DEFAULT_SPLIT_UFACTOR", "DEFAULT_GPUS",
]
