"""TAG Table 8's shape: the planner against the baselines, pure MCTS, and MCMC at the same simulator budget.

    python scripts/bench_placement.py                              # six TAG models × tag-testbed, tag-cloud
    python scripts/bench_placement.py --models vgg19 --clusters tag-testbed --budget 100

For every (model, cluster): the plan of `tag plan` (MCTS with the shipped policy's priors unless --policy or
--uniform, then SFB and fusion), its speed-up over DP-NCCL, DP-NCCL-P and Horovod, over pure MCTS (the same
planner with uniform priors and the same budget) and over the MCMC baseline run on the same simulator with
the same number of simulations (every search's best strategy gets the same SFB and fusion pass, so the
searches are compared on equal terms); the searches alone (before SFB and fusion) against DP-NCCL and
against MCMC's; the iteration at which each MCTS first beat DP-NCCL; search times. A markdown table, then
one JSON line.
"""

from __future__ import annotations

import argparse
import json

from rich.progress import Progress

from tag.cluster import resolve_cluster
from tag.graph.resolve import resolve_model
from tag.planner import TAG_CLUSTERS, TAG_MODELS, PlanConfig, load_priors, plan_training
from tag.policy import shipped_policy_path



def run(model: str, cluster_name: str, args, priors) -> dict:
    graph = resolve_model(model)
    cluster = resolve_cluster(cluster_name)
    config = PlanConfig(num_groups=args.num_groups, max_iterations=args.budget, seed=args.seed)
    tag = plan_training(graph, cluster, config=config, evaluator=priors.evaluator,
                        batch_evaluator=priors.batch_evaluator, batch_size=8 if priors.batch_evaluator else 1)
    pure = plan_training(graph, cluster, config=config) if priors.batch_evaluator else tag
    # MCMC gets as many simulations as MCTS used (each MCMC iteration is at most one simulation).
    mcmc_config = PlanConfig(num_groups=args.num_groups, max_iterations=max(1, tag.search.num_simulations),
                             search="mcmc", seed=args.seed)
    mcmc = plan_training(graph, cluster, config=mcmc_config)
    speedups = tag.speedup_over()
    return {
        "model": model, "cluster": cluster_name, "batch_size": graph.batch_size,
        "iteration_time_s": tag.iteration_time_s, "feasible": bool(tag.result.feasible),
        "speedup_over": {**speedups,
                         "mcmc": mcmc.iteration_time_s / tag.iteration_time_s if tag.result.feasible else None,
                         "pure-mcts": pure.iteration_time_s / tag.iteration_time_s if tag.result.feasible else None},
        "search_speedup_over_dp_nccl": tag.search.best_speedup,
        "search_speedup_over_mcmc_search": (mcmc.search.best_time / tag.search.best_time
                                            if tag.search.best_feasible else None),
        "origin": tag.origin,
        "mcmc_iteration_time_s": mcmc.iteration_time_s, "mcmc_simulations": mcmc.search.num_simulations,
        "simulations": tag.search.num_simulations, "search_time_s": tag.search.search_time_s,
        "mcmc_search_time_s": mcmc.search.search_time_s, "first_beat_iteration": tag.search.first_beat_iteration,
        "pure_mcts_iteration_time_s": pure.iteration_time_s, "pure_mcts_search_time_s": pure.search.search_time_s,
        "pure_mcts_first_beat_iteration": pure.search.first_beat_iteration,
        "sfb_groups": len(tag.sfb.plan.groups) if tag.sfb is not None else 0, "fusion": tag.fusion_bytes is not None,
        "baselines": {b["name"]: b["iteration_time_s"] for b in tag.summary()["baselines"]},
    }


def ratio(value) -> str:
    return f"{value:.2f}x" if value else "-"


def first(value) -> str:
    return "-" if value is None else str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(TAG_MODELS))
    parser.add_argument("--clusters", nargs="+", default=list(TAG_CLUSTERS))
    parser.add_argument("--budget", type=int, default=600, help="MCTS iterations per plan (default 600, as tag plan)")
    parser.add_argument("--num-groups", type=int, default=60)
    priors_flag = parser.add_mutually_exclusive_group()
    priors_flag.add_argument("--policy", help="GNN checkpoint for the priors (default: the shipped one)")
    priors_flag.add_argument("--uniform", action="store_true", help="uniform priors (pure MCTS) for the tag row")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    priors = load_priors(None if args.uniform else args.policy or str(shipped_policy_path()))
    rows = []
    with Progress(transient=True) as progress:
        task = progress.add_task("planning", total=len(args.models) * len(args.clusters))
        for cluster_name in args.clusters:
            for model in args.models:
                progress.update(task, description=f"{model} on {cluster_name}")
                rows.append(run(model, cluster_name, args, priors))
                progress.advance(task)
    print(f"priors: {priors.label}; {args.budget} MCTS iterations; MCMC with the same number of simulations\n")
    print("| cluster | model | tag iteration | vs DP-NCCL | vs DP-NCCL-P | vs Horovod | vs pure MCTS | vs MCMC "
          "| search alone vs DP-NCCL | search alone vs MCMC's | beats DP-NCCL at it. (tag / pure) | search (s) "
          "| pure MCTS (s) | MCMC (s) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        s = r["speedup_over"]
        print(f"| {r['cluster']} | {r['model']} | {r['iteration_time_s'] * 1e3:.1f} ms | {ratio(s['dp-nccl'])} | "
              f"{ratio(s['dp-nccl-p'])} | {ratio(s['horovod'])} | {ratio(s['pure-mcts'])} | {ratio(s['mcmc'])} | "
              f"{ratio(r['search_speedup_over_dp_nccl'])} | {ratio(r['search_speedup_over_mcmc_search'])} | "
              f"{first(r['first_beat_iteration'])} / {first(r['pure_mcts_first_beat_iteration'])} | "
              f"{r['search_time_s']:.1f} | {r['pure_mcts_search_time_s']:.1f} | {r['mcmc_search_time_s']:.1f} |")
    print(json.dumps({"benchmark": "plan", "priors": priors.label, "budget": args.budget, "rows": rows}))


if __name__ == "__main__":
    main()
