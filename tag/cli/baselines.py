"""``tag baselines MODEL --cluster C``: DP-NCCL, DP-NCCL-P, Horovod, one device and METIS MP, simulated."""

from __future__ import annotations

import argparse

from tag.cli.args import add_cluster, add_json, add_model, add_profile, add_simulation, profile_cost
from tag.cli.simulate import baseline_names
from tag.errors import OutputError

__all__ = ["add_parser", "run"]


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("baselines", help="simulate the baselines (DP-NCCL, DP-NCCL-P, Horovod, one device, "
                                                "METIS MP)")
    add_model(p)
    add_cluster(p)
    add_simulation(p)
    p.add_argument("--only", metavar="A,B", help="comma-separated subset of " + ", ".join(baseline_names()))
    add_json(p)
    add_profile(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> dict:
    from tag.baselines import BASELINES, baselines_table, run_baselines
    from tag.cluster import resolve_cluster
    from tag.graph.resolve import resolve_model

    names = tuple(args.only.split(",")) if args.only else tuple(BASELINES)
    unknown = [n for n in names if n not in BASELINES]
    if unknown:
        raise OutputError(f"--only: unknown baseline {unknown[0]!r}; expected some of {', '.join(BASELINES)}")
    cluster = resolve_cluster(args.cluster)
    cost = profile_cost(args)
    graph = resolve_model(args.model, batch_size=args.batch_size, tiny=args.tiny)
    results = run_baselines(graph, cluster, num_groups=args.num_groups, names=names, seed=args.seed,
                            granularity=args.granularity, cost=cost)
    rows = [{**row, "baseline": key, "feasible": not result.oom,
             "peak_memory_bytes": [float(x) for x in result.peak_memory]}
            for key, result, row in zip(names, results, baselines_table(results))]
    payload = {"model": graph.meta.get("model", args.model), "cluster": cluster.name, "devices": cluster.num_devices,
               "batch_size": graph.batch_size, "num_groups": args.num_groups, "baselines": rows}
    if not args.json:
        from tag.cli.report import render_baselines

        render_baselines(payload)
    return payload
