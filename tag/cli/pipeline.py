"""``tag pipeline MODEL --cluster C``: exact pipeline planning (partition into stages, map them onto
devices, simulate), or GraphPipe's graph pipeline with ``--partitioner graphpipe``."""

from __future__ import annotations

import argparse

from tag.cli.args import (add_cluster, add_json, add_mapper_policy, add_model, add_profile, add_views,
                          check_view_paths, micro_batches, named, output_path, positive_int, positive_seconds,
                          plan_files, profile_cost, seed, write_output)
from tag.errors import OutputError

__all__ = ["add_parser", "run"]


def _choices(name: str) -> tuple[str, ...]:
    """tag.exact.PARTITIONERS or tag.exact.MAPPERS, imported only when the parser is built."""
    import tag.exact

    return tuple(getattr(tag.exact, name))


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("pipeline", help="exact pipeline planning: partition into stages, map them onto "
                                               "devices, simulate")
    add_model(p)
    add_cluster(p)
    p.add_argument("--stages", type=positive_int, metavar="S", help="pipeline stages (with --auto: only this S)")
    p.add_argument("--replicas", type=positive_int, metavar="R", help="replicas per stage (with --auto: only this R)")
    p.add_argument("--auto", action="store_true", help="search (S, R, micro-batches) by simulation (the default "
                                                       "when neither --stages nor --replicas is given)")
    p.add_argument("--micro-batches", type=micro_batches, metavar="M", help="micro-batches (default: searched)")
    p.add_argument("--partitioner", choices=(*_choices("PARTITIONERS"), "best", "graphpipe"),
                   default="parmesan", help="stage partitioner (default parmesan; best: each of parmesan, pipedream "
                                            "and rannc, the fastest plan; graphpipe: stages that form a graph)")
    p.add_argument("--mapper", choices=_choices("MAPPERS"), default="exact",
                   help="stage-to-device mapper (default exact: provably optimal or its gap; learned: GNN + MCTS; "
                        "learned-fast: its fast setting, about a tenth of exact's time at 64 devices)")
    add_mapper_policy(p)
    p.add_argument("--time-limit", type=positive_seconds, default=60.0, metavar="S",
                   help="seconds for the exact mapper (default 60)")
    p.add_argument("--schedule", choices=("1f1b", "gpipe"), default="1f1b", help="micro-batch order (default 1f1b)")
    p.add_argument("--links", choices=("data", "chain"), default="data",
                   help="stage edges: data (activations sent directly, the default) or chain (a sequential "
                        "runtime: stage s sends to s+1 only, passing the rest through)")
    p.add_argument("--seed", type=seed, default=0, help="seed of the random mappings")
    p.add_argument("--out", type=named, metavar="PLAN.json",
                   help="write the pipeline plan (for `tag simulate --strategy`)")
    add_views(p)
    add_json(p)
    add_profile(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> dict:
    from tag.cluster import resolve_cluster
    from tag.graph.resolve import resolve_model

    if args.partitioner == "graphpipe" and (args.stages or args.replicas or args.links != "data"):
        raise OutputError("--partitioner graphpipe chooses its own stages, replicas and stage edges: leave out "
                          "--stages, --replicas and --links")
    if args.out:
        output_path(args.out, flag="--out", suffixes=(".json",), what="plan file")
    check_view_paths(args)
    cluster = resolve_cluster(args.cluster)
    cost = profile_cost(args)
    graph = resolve_model(args.model, batch_size=args.batch_size, tiny=args.tiny)
    if args.partitioner == "graphpipe":
        return _graph_pipeline(args, graph, cluster, cost)
    return _pipeline(args, graph, cluster, cost)


def _plan(args: argparse.Namespace, graph, cluster, cost):
    """The pipeline plan of the flags: one partitioner's, or with ``best`` the fastest of them."""
    from tag.cli.progress import interactive, status
    from tag.exact import plan_pipeline
    from tag.planners.mappers import make_mapper

    mapper = make_mapper(args.mapper, time_limit=args.time_limit, policy=args.mapper_policy)
    with status(interactive(args), f"planning a pipeline of {graph.meta.get('model', args.model)}"):
        options = dict(stages=args.stages, replicas=args.replicas, auto=args.auto, mapper=mapper,
                       micro_batches=args.micro_batches, schedule=args.schedule, seed=args.seed, links=args.links,
                       cost=cost)
        if args.partitioner == "best":
            from tag.planners import fastest_pipeline

            return fastest_pipeline(graph, cluster, **options)
        return plan_pipeline(graph, cluster, partitioner=args.partitioner, **options)


def _stage_rows(plan, cluster) -> list[dict]:
    import numpy as np

    from tag.exact import mapped_stage_times

    sg = plan.stage_graph
    per_stage, _ = mapped_stage_times(sg, cluster, plan.mapping, plan.instantiation)
    ops = np.bincount(sg.assignment if sg.assignment.size else sg.forward_assignment, minlength=sg.num_stages)
    return [{"stage": s, "ops": int(ops[s]), "compute_per_micro_batch_s": float(sg.stage_time[s]),
             "time_per_iteration_s": None if per_stage is None else float(per_stage[s]),
             "param_bytes": float(sg.param_bytes[s]), "devices": plan.mapping[s]}
            for s in range(sg.num_stages)]


def _pipeline(args: argparse.Namespace, graph, cluster, cost) -> dict:
    plan = _plan(args, graph, cluster, cost)
    payload = {"model": graph.meta.get("model", args.model), "cluster": cluster.name, "devices": cluster.num_devices,
               "batch_size": graph.batch_size, "mapper": args.mapper, **plan.as_dict()}
    payload["samples_per_s"] = graph.batch_size / plan.iteration_time if plan.iteration_time > 0 else None
    payload["stage_rows"] = _stage_rows(plan, cluster)
    _save(args, plan, graph, cluster, {k: v for k, v in payload.items() if k not in ("stage_rows", "mapping")})
    title = f"{payload['model']} on {cluster.name}: pipeline {plan.stage_graph.num_stages} stages"
    payload["files"] = plan_files(args, plan.result, plan.taskgraph, title)
    if not args.json:
        from tag.cli.report import render_pipeline

        render_pipeline(payload)
    return payload


def _graph_pipeline(args: argparse.Namespace, graph, cluster, cost) -> dict:
    """``--partitioner graphpipe``: GraphPipe's series-parallel stage graph and its schedule."""
    from tag.cli.progress import interactive, status
    from tag.graphpipe import plan_graph_pipeline

    with status(interactive(args), f"planning a graph pipeline of {graph.meta.get('model', args.model)}"):
        plan = plan_graph_pipeline(graph, cluster, micro_batches=args.micro_batches, cost=cost)
    payload = {"model": graph.meta.get("model", args.model), "cluster": cluster.name, "devices": cluster.num_devices,
               "batch_size": graph.batch_size, **plan.as_dict()}
    payload["samples_per_s"] = graph.batch_size / plan.iteration_time if plan.iteration_time > 0 else None
    _save(args, plan, graph, cluster, {k: v for k, v in payload.items() if k != "mapping"})
    payload["files"] = plan_files(args, plan.result, plan.taskgraph,
                                  f"{payload['model']} on {cluster.name}: graph pipeline {plan.num_stages} stages")
    if not args.json:
        from tag.cli.report import render_graph_pipeline

        render_graph_pipeline(payload)
    return payload


def _save(args: argparse.Namespace, plan, graph, cluster, summary: dict) -> None:
    """``--out``: the pipeline plan file."""
    if not args.out:
        return
    from tag.planners.stored import pipeline_record
    from tag.strategy import save_pipeline_plan

    record = pipeline_record(plan, graph, cluster, summary)
    write_output(args, "--out", args.out, lambda path: save_pipeline_plan(record, path))
