"""``tag compare MODEL --cluster C``: every planner on one model and cluster through one simulator."""

from __future__ import annotations

import argparse

from tag.cli.args import (add_cluster, add_grouping, add_json, add_mapper_policy, add_model, add_profile, named,
                          positive_int, positive_seconds, profile_cost, shipped_policy)

__all__ = ["add_parser", "run"]


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("compare", help="every planner on one model and cluster through one simulator")
    add_model(p)
    add_cluster(p)
    p.add_argument("--budget", type=positive_int, default=300, metavar="N",
                   help="search iterations of MCMC, pure MCTS and tag (default 300)")
    p.add_argument("--policy", type=named, metavar="CKPT",
                   help="GNN policy checkpoint for the tag (GNN+MCTS) row (default: the shipped one)")
    p.add_argument("--time-limit", type=positive_seconds, default=60.0, metavar="S",
                   help="seconds for the exact mapper (default 60)")
    p.add_argument("--no-graphpipe", action="store_true", help="leave GraphPipe's graph pipeline out")
    add_mapper_policy(p)
    add_grouping(p, seed_help="METIS, search and mapper seed")
    add_json(p)
    add_profile(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> dict:
    from tag.cli.progress import interactive, status
    from tag.cluster import resolve_cluster
    from tag.compare import CompareConfig, compare_planners
    from tag.graph.resolve import resolve_model

    cluster = resolve_cluster(args.cluster)
    cost = profile_cost(args)
    graph = resolve_model(args.model, batch_size=args.batch_size, tiny=args.tiny)
    config = CompareConfig(budget=args.budget, num_groups=args.num_groups, policy=args.policy,
                           mapping_time_limit=args.time_limit, graphpipe=not args.no_graphpipe, seed=args.seed,
                           mapper_policy=args.mapper_policy)
    with status(interactive(args), "comparing planners") as spinner:
        report = (lambda message: spinner.update(f"comparing planners: {message}")) if spinner is not None else None
        rows = compare_planners(graph, cluster, config=config, progress=report, cost=cost)
    payload = {"model": graph.meta.get("model", args.model), "cluster": cluster.name, "devices": cluster.num_devices,
               "batch_size": graph.batch_size, "budget": args.budget, "policy": config.policy or shipped_policy(),
               "planners": rows}
    if not args.json:
        from tag.cli.report import render_compare

        render_compare(payload)
    return payload
