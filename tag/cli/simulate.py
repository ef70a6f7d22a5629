"""``tag simulate MODEL --cluster C --strategy PLAN.json | --baseline NAME``: one simulated iteration.

``tag simulate PARTITIONED.txt --cluster C`` (a PipeDream graph.txt whose node lines carry
`` -- stage_id=N``, the PipeDream optimizer's output) scores PipeDream's partition as a pipeline plan:
its stages in order, R = devices // S replicas each unless ``--replicas``, M micro-batches
(``--micro-batches``, default the smallest power of two >= S, at most batch / R), placed stage-major
(stage 0's replicas on the first devices…), 1F1B; beside it tag's own pipeline (Parmesan's partitioner)
for the same S, R and M, placed the same way, so that the two differ by the partition only.
"""

from __future__ import annotations

import argparse

from tag.cli.args import (add_cluster, add_json, add_model, add_profile, add_simulation, add_views,
                          check_view_paths, micro_batches, named, positive_int, profile_cost, write_views)
from tag.errors import OutputError, ProfileError, TagError

__all__ = ["add_parser", "run", "baseline_names", "simulation_payload"]


def baseline_names() -> list[str]:
    from tag.baselines import BASELINES

    return list(BASELINES)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("simulate", help="simulate one training iteration of a plan file or a baseline")
    add_model(p)
    add_cluster(p)
    what = p.add_mutually_exclusive_group()
    what.add_argument("--strategy", type=named, metavar="PLAN.json",
                      help="a plan file (from `tag plan --out` or `tag pipeline --out`)")
    what.add_argument("--baseline", choices=baseline_names(), help="a baseline strategy")
    p.add_argument("--replicas", type=positive_int, default=None,
                   help="a PipeDream partitioned graph.txt: replicas per stage (default devices // stages)")
    p.add_argument("--micro-batches", type=micro_batches, default=None,
                   help="a PipeDream partitioned graph.txt: micro-batches (default the power of two >= stages)")
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

    stages = _pipedream_stages(args) if args.strategy is None and args.baseline is None else None
    if stages is None and (args.strategy is None) == (args.baseline is None):
        raise OutputError("give exactly one of --strategy PLAN.json and --baseline NAME "
                          "(or a PipeDream graph.txt with stage_id fields, simulated as its partition)")
    if stages is None and (args.replicas is not None or args.micro_batches is not None):
        raise TagError("--replicas and --micro-batches apply to a PipeDream partitioned graph.txt only")
    check_view_paths(args)
    cluster = resolve_cluster(args.cluster)
    cost = profile_cost(args)
    graph = resolve_model(args.model, batch_size=args.batch_size, tiny=args.tiny)
    if stages is not None:
        return _pipedream_partition(args, graph, cluster, cost, stages)
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


def _pipedream_stages(args: argparse.Namespace) -> dict[str, int] | None:
    """The layer -> stage map of a PipeDream partitioned graph.txt MODEL; None for any other MODEL."""
    from tag._read import input_is_file
    from tag.graph.pipedream import pipedream_stages

    model = args.model.strip()
    if not model.lower().endswith(".txt") or not input_is_file(model):
        return None
    return pipedream_stages(model)


def _pipedream_partition(args: argparse.Namespace, graph, cluster, cost, stages: dict[str, int]) -> dict:
    """PipeDream's partition of a graph.txt simulated as a pipeline plan, beside tag's own for the same
    S, R and M (module docstring)."""
    from tag.exact import ForwardGraph, plan_pipeline, replay_pipeline

    fg = ForwardGraph.from_graph(graph, cluster.types, cost=cost)
    layer_of = [graph.args[int(op)]["layer"] for op in fg.forward_ops]
    forward_stage = [stages[layer] for layer in layer_of]
    num_stages = max(stages.values()) + 1
    empty = sorted(set(range(num_stages)) - set(forward_stage))
    if empty:
        raise ProfileError(f"{args.model}: stage {empty[0]} holds only input layers; every stage needs a layer that computes")
    replicas = args.replicas or cluster.num_devices // num_stages
    if replicas < 1 or num_stages * replicas > cluster.num_devices:
        raise TagError(f"{args.model}: {num_stages} stages x {max(replicas, 1)} replicas need "
                         f"{num_stages * max(replicas, 1)} devices; {cluster.name} has {cluster.num_devices}")
    micro_batches = args.micro_batches or min(1 << (num_stages - 1).bit_length(), max(graph.batch_size // replicas, 1))
    mapping = [list(range(s * replicas, (s + 1) * replicas)) for s in range(num_stages)]
    theirs = replay_pipeline(graph, cluster, forward_assignment=forward_stage, replicas=[replicas] * num_stages,
                             micro_batches=micro_batches, mapping=mapping, partitioner="pipedream", cost=cost)
    ours = plan_pipeline(graph, cluster, stages=num_stages, replicas=replicas, micro_batches=micro_batches, cost=cost)
    label = f"PipeDream partition {args.model}"
    payload = {"model": graph.meta.get("model", args.model), "cluster": cluster.name, "what": label,
               "kind": "pipeline", "stages": num_stages, "replicas": [replicas] * num_stages,
               "micro_batches": micro_batches, "schedule": theirs.schedule, "mapping": mapping,
               "forward_assignment": [int(s) for s in forward_stage], "max_stage_time_s": theirs.max_stage_time,
               **simulation_payload(theirs.result, theirs.taskgraph, cluster, graph.batch_size)}
    payload["tag_pipeline"] = {
        "partitioner": ours.partitioner, "stages": ours.num_stages, "replicas": ours.stage_graph.replicas.tolist(),
        "micro_batches": int(ours.stage_graph.micro_batches), "mapping": [list(row) for row in ours.mapping],
        "forward_assignment": ours.stage_graph.forward_assignment.tolist(),
        **simulation_payload(ours.result, ours.taskgraph, cluster, graph.batch_size)}
    payload["speedup_of_tag"] = (theirs.iteration_time / ours.iteration_time
                                 if ours.iteration_time > 0 and theirs.result.feasible and ours.result.feasible else None)
    payload["files"] = write_views(args, theirs.result, theirs.taskgraph, f"{payload['model']} on {cluster.name}: {label}")
    if not args.json:
        from tag.cli.report import console, render_pipeline_simulation, shown
        from tag.units import format_time

        render_pipeline_simulation(payload)
        row = payload["tag_pipeline"]
        speedup = f", {payload['speedup_of_tag']:.2f}x the speed of PipeDream's partition" if payload["speedup_of_tag"] else ""
        console().print(f"tag's own pipeline ({shown(row['partitioner'])}, same stages, replicas and "
                        f"micro-batches): iteration {format_time(row['iteration_time_s'])}, "
                        f"{row['samples_per_s']:.1f} samples/s{speedup}"
                        f"{'' if row['feasible'] else ', out of memory'} (`tag pipeline` searches S, R and M too)")
    return payload
