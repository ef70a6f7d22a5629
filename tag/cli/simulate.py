"""``tag simulate MODEL --cluster C --strategy PLAN.json | --baseline NAME``: one simulated iteration."""

from __future__ import annotations

import argparse

from tag.cli.args import (add_cluster, add_json, add_model, add_profile, add_simulation, add_views,
                          check_view_paths, named, profile_cost, write_views)
from tag.errors import OutputError

__all__ = ["add_parser", "run", "baseline_names", "simulation_payload"]


def baseline_names() -> list[str]:
    from tag.baselines import BASELINES

    return list(BASELINES)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("simulate", help="simulate one training iteration of a plan file or a baseline")
    add_model(p)
    add_cluster(p)
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--strategy", type=named, metavar="PLAN.json",
                      help="a plan file (from `tag plan --out` or `tag pipeline --out`)")
    what.add_argument("--baseline", choices=baseline_names(), help="a baseline strategy")
    add_simulation(p)
    add_views(p)
    add_json(p)
    add_profile(p)
    p.set_defaults(func=run)


def simulation_payload(result, taskgraph, cluster, batch_size: int) -> dict:
    """What every simulated iteration reports: time, rate, memory per device against capacity."""
    capacity = cluster.memory_bytes()
    return {
        "iteration_time_s": float(result.iteration_time),
        "samples_per_s": batch_size / result.iteration_time if result.iteration_time > 0 else None,
        "feasible": bool(result.feasible),
        "oom": not result.feasible,
        "oom_device": int(result.oom_device) if result.oom_device >= 0 else None,
        "peak_memory_bytes": [float(x) for x in result.peak_memory],
        "memory_capacity_bytes": [float(x) for x in capacity],
        "tasks": int(taskgraph.num_tasks),
    }


def run(args: argparse.Namespace) -> dict:
    from tag.cluster import resolve_cluster
    from tag.graph.resolve import resolve_model
    from tag.strategy import plan_kind

    if (args.strategy is None) == (args.baseline is None):
        raise OutputError("give exactly one of --strategy PLAN.json and --baseline NAME")
    check_view_paths(args)
    cluster = resolve_cluster(args.cluster)
    cost = profile_cost(args)
    graph = resolve_model(args.model, batch_size=args.batch_size, tiny=args.tiny)
    if args.strategy is not None and plan_kind(args.strategy) == "pipeline":
        return _pipeline_plan(args, graph, cluster, cost)
    if args.strategy is not None:
        from tag.planners.stored import compile_placement_plan
        from tag.strategy import load_plan

        plan = load_plan(args.strategy, graph=graph, cluster=cluster)
        compiled, group_graph = compile_placement_plan(plan, graph, cluster, granularity=args.granularity,
                                                       seed=args.seed, where=args.strategy, cost=cost)
        plan_cluster, label = cluster, f"plan {args.strategy}"
    else:
        from tag.baselines import BASELINES
        from tag.grouping import group_ops

        group_graph = group_ops(graph, num_groups=args.num_groups, gpus=cluster, seed=args.seed, cost=cost)
        baseline = BASELINES[args.baseline](group_graph, cluster, granularity=args.granularity)
        compiled, plan_cluster, label = baseline.compiled, baseline.plan_cluster, baseline.name
    result = compiled.simulate(feedback=False)
    payload = {"model": graph.meta.get("model", args.model), "cluster": cluster.name, "what": label,
               "granularity": args.granularity, "num_groups": group_graph.num_groups,
               **simulation_payload(result, compiled.taskgraph, plan_cluster, graph.batch_size)}
    if plan_cluster is not cluster:
        payload["devices_used"] = plan_cluster.name
    payload["files"] = write_views(args, result, compiled.taskgraph, f"{payload['model']} on {cluster.name}: {label}")
    if not args.json:
        from tag.cli.report import render_simulation

        render_simulation(payload, [plan_cluster.gpu(d).name for d in range(len(result.peak_memory))])
    return payload


def _pipeline_plan(args: argparse.Namespace, graph, cluster, cost) -> dict:
    """``tag simulate --strategy`` of a pipeline plan file (from ``tag pipeline --out`` or ``tag plan --out``)."""
    from tag.planners.stored import replay_pipeline_plan
    from tag.strategy import load_pipeline_plan

    record = load_pipeline_plan(args.strategy, graph=graph, cluster=cluster)
    plan = replay_pipeline_plan(record, graph, cluster, cost=cost)
    label = f"pipeline plan {args.strategy}"
    payload = {"model": graph.meta.get("model", args.model), "cluster": cluster.name, "what": label,
               "kind": "pipeline", "stages": plan.num_stages, "replicas": list(record.replicas),
               "micro_batches": record.micro_batches, "schedule": record.schedule,
               "mapping": [list(row) for row in record.mapping], "max_stage_time_s": plan.max_stage_time,
               **simulation_payload(plan.result, plan.taskgraph, cluster, graph.batch_size)}
    payload["files"] = write_views(args, plan.result, plan.taskgraph, f"{payload['model']} on {cluster.name}: {label}")
    if not args.json:
        from tag.cli.report import render_pipeline_simulation

        render_pipeline_simulation(payload)
    return payload
