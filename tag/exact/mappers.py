"""The mapping problem of a pipeline's stage graph, and the names of the mappers that place it.

The mappers themselves (exact, heuristics, pure MCTS, learned) are made in the planners layer,
:func:`tag.planners.mappers.make_mapper`: the search and the learned policy sit above this package.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from tag.cluster.cluster import Cluster
from tag.exact.mapping import MappingError, MappingProblem
from tag.exact.stage_graph import StageGraph

__all__ = ["MAPPERS", "pipeline_problem"]

MAPPERS = ("exact", "cs", "p2p", "random", "mcts", "learned", "learned-fast")  # tag.planners.mappers.make_mapper


def pipeline_problem(stage_graph: StageGraph, cluster: Cluster, devices: Sequence[int]) -> MappingProblem:
    """The mapping problem of ``stage_graph`` on ``devices`` of ``cluster`` (device i of the problem is
    ``devices[i]``); per iteration, :meth:`MappingProblem.from_stage_graph`."""
    counts = np.asarray(stage_graph.replicas).tolist()
    if len(set(counts)) != 1:
        raise MappingError(f"the stage-to-device mappers need one replica count for every stage, got {counts}")
    sub = cluster if list(devices) == list(range(cluster.num_devices)) else cluster.subset(devices)
    return MappingProblem.from_stage_graph(stage_graph, int(counts[0]), sub)
