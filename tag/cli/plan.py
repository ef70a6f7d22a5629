"""``tag plan MODEL --cluster C``: the fastest plan of every family (TAG placement, data parallelism,
pipelines, graph pipelines), or ``--family placement``: TAG's search alone, with its own report.

Either way the chosen plan's file is written with ``--out`` (a placement plan for the placement search
and the DP baselines, a pipeline plan for pipelines, one with partitioner "graphpipe" for graph
pipelines: the files ``tag simulate --strategy`` and ``tag run`` take).
"""

from __future__ import annotations

import argparse
import sys
import time

from tag.cli.args import (add_cluster, add_grouping, add_json, add_model, add_profile, add_views, check_view_paths,
                          named, output_path, plan_files, positive_int, positive_seconds, profile_cost, shipped_policy,
                          write_output)

__all__ = ["add_parser", "run", "FAMILY_CHOICES", "families_of"]

# what --family takes: "all", one of tag.planners.FAMILIES, or "graph" for graph-pipeline; written out so
# that building the parser imports no planner
FAMILY_CHOICES = ("all", "placement", "data-parallel", "pipeline", "graph-pipeline", "graph")


def families_of(choice: str) -> tuple[str, ...]:
    """The families a ``--family`` value asks for."""
    from tag.planners import FAMILIES

    if choice == "all":
        return FAMILIES
    return ("graph-pipeline",) if choice == "graph" else (choice,)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("plan", help="the fastest plan of every family: TAG placement, data parallelism, "
                                           "pipelines, graph pipelines")
    add_model(p)
    add_cluster(p)
    p.add_argument("--family", choices=FAMILY_CHOICES, default="all",
                   help="plan families to ask (default all; placement: TAG's search alone, with its own report)")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--budget", type=positive_int, metavar="N", help="search iterations (default 600)")
    budget.add_argument("--time", type=positive_seconds, metavar="S",
                        help="time budget in seconds (the placement search takes what the other families leave)")
    priors = p.add_mutually_exclusive_group()
    priors.add_argument("--policy", type=named, metavar="CKPT",
                        help="GNN policy checkpoint for the priors (default: the shipped checkpoints/tag-policy.pt)")
    priors.add_argument("--uniform", action="store_true", help="uniform priors: pure MCTS")
    p.add_argument("--search", choices=("mcts", "mcmc"), default="mcts", help="search method (default mcts)")
    p.add_argument("--no-sfb", action="store_true", help="skip sufficient-factor broadcasting")
    add_grouping(p, seed_help="METIS and search seed")
    p.add_argument("--out", type=named, metavar="PLAN.json", help="write the plan file (for `tag simulate --strategy`)")
    add_views(p)
    add_json(p)
    add_profile(p)
    p.set_defaults(func=run)


def _config(args: argparse.Namespace, **extra):
    from tag.planner import PlanConfig

    return PlanConfig(num_groups=args.num_groups, max_iterations=args.budget, search=args.search,
                      sfb=not args.no_sfb, seed=args.seed, **extra)


def run(args: argparse.Namespace) -> dict:
    started = time.perf_counter()  # --time counts from here: loading the model and priors come out of it
    from tag.cluster import resolve_cluster
    from tag.graph.resolve import resolve_model

    if args.out:
        output_path(args.out, flag="--out", suffixes=(".json",), what="plan file")
    check_view_paths(args)
    cluster = resolve_cluster(args.cluster)
    cost = profile_cost(args)
    graph = resolve_model(args.model, batch_size=args.batch_size, tiny=args.tiny)
    if args.family == "placement":
        return _placement(args, graph, cluster, cost, started)
    return _families(args, graph, cluster, cost, started)


def _families(args: argparse.Namespace, graph, cluster, cost, started: float) -> dict:
    """Every family asked for through :func:`tag.planners.plan_fastest`; the fastest plan is kept."""
    from tag.cli.progress import interactive, status
    from tag.planner import load_priors
    from tag.planners import plan_fastest
    from tag.planners.stored import candidate_record, candidate_simulation, save_record

    families = families_of(args.family)
    priors = None
    if "placement" in families:
        priors = load_priors(None if args.uniform else (args.policy or shipped_policy()))
    with status(interactive(args), f"planning {graph.meta.get('model', args.model)}"):
        found = plan_fastest(graph, cluster, families=families, time_limit_s=args.time, config=_config(args),
                             priors=priors, cost=cost, started=started)
    payload = found.as_dict()
    if priors is not None:
        payload["priors"] = priors.label
    result, taskgraph = candidate_simulation(found.best)
    if args.out:
        summary = {k: v for k, v in payload.items() if k not in ("families", "candidates")}
        record = candidate_record(found.best, found.graph, found.cluster, summary)
        write_output(args, "--out", args.out, lambda path: save_record(record, path))
    payload["files"] = plan_files(args, result, taskgraph,
                                  f"{payload['model']} on {cluster.name}: tag plan ({found.best.family})")
    if not args.json:
        from tag.cli.report import render_families

        render_families(payload)
    return payload


def _placement(args: argparse.Namespace, graph, cluster, cost, started: float) -> dict:
    """``--family placement``: TAG's search (GNN priors + MCTS, or MCMC), SFB, and its own report."""
    from tag.cli.progress import progress_callback, search_progress
    from tag.planner import load_priors, plan_training
    from tag.planners import compute_bound
    from tag.strategy import make_plan, save_plan

    evaluator, batch_evaluator, priors = load_priors(None if args.uniform else (args.policy or shipped_policy()))
    with search_progress(sys.stderr.isatty()) as bar:
        callback = progress_callback(bar, f"{args.search} on {graph.meta.get('model', args.model)}")
        # --time bounds the whole call (SFB selection and the final pass too), not the search alone
        deadline = None if args.time is None else started + args.time
        outcome = plan_training(graph, cluster, config=_config(args, time_limit_s=args.time, deadline=deadline),
                                evaluator=evaluator,
                                batch_evaluator=batch_evaluator, batch_size=8 if batch_evaluator is not None else 1,
                                progress=callback, cost=cost)
    payload = {**outcome.summary(), "priors": priors}
    payload["groups"] = outcome.group_rows()
    payload["compute_bound_s"] = compute_bound(graph, cluster, cost=cost)
    payload["bound_ratio"] = outcome.result.iteration_time / payload["compute_bound_s"]
    if args.out:
        plan = make_plan(outcome.strategy, graph, cluster, assignment=outcome.group_graph.assignment,
                         summary={k: v for k, v in payload.items() if k != "groups"})
        write_output(args, "--out", args.out, lambda path: save_plan(plan, path))
    payload["files"] = plan_files(args, outcome.result, outcome.compiled.taskgraph,
                                  f"{payload['model']} on {cluster.name}: tag plan")
    if not args.json:
        from tag.cli.report import render_placement

        render_placement(payload, cluster)
    return payload
