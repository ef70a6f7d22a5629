"""The planners layer: every plan family behind one call, above search, policy, exact and graphpipe.

:func:`plan_fastest` asks the placement search (TAG), the data-parallel baselines, the sequential
pipeline planners (Parmesan, PipeDream-style, RaNNC) and the graph pipeline planner (GraphPipe), each
candidate simulated on the one simulator, and returns the fastest feasible plan, each family's best and
the plan's ratio to :func:`compute_bound`. ``tag plan`` runs it. No package below imports this one.
"""

from tag.planners.bounds import compute_bound
from tag.planners.families import FAMILIES, PIPELINE_PARTITIONERS, Candidate, fastest_pipeline
from tag.planners.fastest import FastestPlan, PlannerError, plan_fastest
from tag.planners.mappers import MAPPERS, make_mapper

__all__ = ["plan_fastest", "FastestPlan", "Candidate", "PlannerError", "compute_bound", "fastest_pipeline",
           "FAMILIES", "PIPELINE_PARTITIONERS", "make_mapper", "MAPPERS"]
