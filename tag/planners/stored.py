"""Plans to and from files: the record a chosen plan is saved as, and a stored plan rebuilt as it was
planned (a placement plan's grouping and SFB, a pipeline plan's simulated iteration), for ``tag
simulate --strategy`` and ``tag run``."""

from __future__ import annotations

import os
from typing import Any

from tag.cluster import Cluster
from tag.graph import OpGraph

__all__ = ["placement_group_graph", "compile_placement_plan", "replay_pipeline_plan", "pipeline_record",
           "candidate_record", "candidate_simulation", "save_record"]


def placement_group_graph(plan, graph: OpGraph, cluster: Cluster, *, seed: int = 0, where: str = "plan"):
    """The grouping a placement plan file was made with: its stored assignment, or METIS with the plan's
    group count and ``seed`` (checked against the plan's grouping fingerprint when it has one). ``where``
    names the file in errors."""
    from tag.grouping import GroupGraph, group_ops
    from tag.strategy.errors import PlanMismatchError
    from tag.strategy.fingerprint import grouping_fingerprint

    if plan.assignment is not None:
        return GroupGraph.from_assignment(graph, plan.assignment, gpus=cluster)
    group_graph = group_ops(graph, num_groups=plan.strategy.num_groups, gpus=cluster, seed=seed)
    if group_graph.num_groups != plan.strategy.num_groups:
        raise PlanMismatchError(f"{where}: METIS gives {group_graph.num_groups} groups for this model, "
                                f"the plan has {plan.strategy.num_groups} rows and no stored grouping")
    if plan.grouping_fingerprint and grouping_fingerprint(group_graph.assignment) != plan.grouping_fingerprint:
        raise PlanMismatchError(f"{where}: the plan's grouping is not stored and METIS (seed {seed}) "
                                "groups this model differently")
    return group_graph


def compile_placement_plan(plan, graph: OpGraph, cluster: Cluster, *, granularity: str = "group", seed: int = 0,
                           where: str = "plan", cost=None):
    """(CompiledPlan, GroupGraph) of a placement plan file: its grouping, the SFB it kept re-applied (the
    program is deterministic) and its fusion threshold."""
    from tag.compiler import compile_strategy

    group_graph = placement_group_graph(plan, graph, cluster, seed=seed, where=where)
    sfb_groups = plan.summary.get("sfb_groups") or []
    if sfb_groups:
        from tag.sfb import apply_sfb

        sfb = apply_sfb(group_graph, plan.strategy, cluster, cost=cost)  # the op times the plan was made with
        group_graph = sfb.restricted(sfb_groups).rewritten_group_graph()
    compiled = compile_strategy(group_graph, plan.strategy, cluster, granularity=granularity,
                                fusion_bytes=plan.summary.get("fusion_bytes"), cost=cost)
    return compiled, group_graph


def replay_pipeline_plan(record, graph: OpGraph, cluster: Cluster, *, cost=None):
    """The simulated PipelinePlan of a pipeline plan file: GraphPipe's static orders over the stage DAG
    for partitioner "graphpipe", the file's micro-batch schedule otherwise."""
    options = dict(forward_assignment=record.forward_assignment, replicas=record.replicas,
                   micro_batches=record.micro_batches, mapping=record.mapping, reference_gpu=record.reference_gpu,
                   links=record.links, cost=cost)
    if record.partitioner == "graphpipe":
        from tag.graphpipe import replay_graph_pipeline

        return replay_graph_pipeline(graph, cluster, **options)
    from tag.exact import replay_pipeline

    return replay_pipeline(graph, cluster, schedule=record.schedule, partitioner=record.partitioner, **options)


def pipeline_record(plan, graph: OpGraph, cluster: Cluster, summary: dict[str, Any]):
    """The pipeline plan file of a planned (or graph) pipeline."""
    from tag.strategy import make_pipeline_plan

    sg = plan.stage_graph
    return make_pipeline_plan(graph, cluster, partitioner=plan.partitioner, schedule=plan.schedule,
                              micro_batches=sg.micro_batches, replicas=sg.replicas.tolist(),
                              reference_gpu=sg.gpu_types[sg.reference_type].name,
                              forward_assignment=sg.forward_assignment, mapping=plan.mapping, summary=summary,
                              links=sg.info.get("links", "data"))


def candidate_record(best, graph: OpGraph, cluster: Cluster, summary: dict[str, Any]):
    """The plan file of :func:`~tag.planners.plan_fastest`'s chosen candidate: a placement plan for the
    placement search and the DP baselines, a pipeline plan for (graph) pipelines."""
    from tag.compiler import DEFAULT_FUSION_BYTES
    from tag.strategy import make_plan

    if best.family == "placement":
        outcome = best.plan
        return make_plan(outcome.strategy, graph, cluster, assignment=outcome.group_graph.assignment,
                         summary={**outcome.summary(), **summary})
    if best.family == "data-parallel":
        fusion = DEFAULT_FUSION_BYTES if best.planner == "Horovod" else None
        return make_plan(best.plan.strategy, graph, cluster, assignment=best.info["group_graph"].assignment,
                         summary={**summary, "fusion_bytes": fusion, "sfb_groups": []})
    return pipeline_record(best.plan, graph, cluster, summary)


def candidate_simulation(best):
    """(SimulationResult, TaskGraph) of a candidate's plan, for --gantt and --trace."""
    plan = best.plan
    if best.family == "placement":
        return plan.result, plan.compiled.taskgraph
    if best.family == "data-parallel":
        return plan.compiled.simulate(feedback=False), plan.compiled.taskgraph
    return plan.result, plan.taskgraph


def save_record(record, path: str | os.PathLike) -> None:
    """Write a placement or pipeline plan record to ``path``."""
    from tag.strategy import PipelinePlanFile, save_pipeline_plan, save_plan

    (save_pipeline_plan if isinstance(record, PipelinePlanFile) else save_plan)(record, path)
