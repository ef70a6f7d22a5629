"""Evaluations per second of the search's inner loop: compile a strategy, then run the fast simulator.

    python scripts/bench_sim.py                      # BERT-Large, 60 groups, tag-testbed, 200 strategies
    python scripts/bench_sim.py --strategies 50 --profile

Two workloads, each at the granularities asked for:

- ``random``: independent random strategies (each group on a random set of device groups with a random
  option): nothing is reused between evaluations but the strategy-independent tables;
- ``search``: what MCTS evaluates, a walk that re-decides one group at a time from data parallelism, so
  the per-group layouts and per-bundle plans the compiler caches are mostly warm.

Single process, one thread. Prints a table, optionally the cProfile hot spots, and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time

import numpy as np

from tag.cluster import resolve_cluster
from tag.compiler import compile_strategy, random_strategy
from tag.graph.resolve import resolve_model
from tag.grouping import group_ops
from tag.sim import simulate_fast
from tag.strategy import OPTIONS, Strategy


def search_walk(num_groups: int, cluster, count: int, seed: int) -> list[Strategy]:
    """``count`` strategies, each the previous one with one group re-placed at random (from data parallelism)."""
    rng = np.random.default_rng(seed)
    strategy = Strategy.data_parallel(num_groups, cluster)
    walk = []
    for _ in range(count):
        row = rng.random(cluster.num_device_groups) < 0.5
        row[rng.integers(cluster.num_device_groups)] = True
        strategy = strategy.with_group(int(rng.integers(num_groups)), row, int(rng.integers(len(OPTIONS))))
        walk.append(strategy)
    return walk


def measure(group_graph, cluster, strategies, granularity: str) -> dict:
    """Compile and simulate each strategy once; times per evaluation in ms."""
    compile_s = simulate_s = 0.0
    tasks = []
    for strategy in strategies:
        t0 = time.perf_counter()
        plan = compile_strategy(group_graph, strategy, cluster, granularity=granularity)
        t1 = time.perf_counter()
        simulate_fast(plan.taskgraph, feedback=False)
        t2 = time.perf_counter()
        compile_s += t1 - t0
        simulate_s += t2 - t1
        tasks.append(plan.taskgraph.num_tasks)
    n = len(strategies)
    return {"evals_per_s": n / (compile_s + simulate_s), "compile_ms": 1e3 * compile_s / n,
            "simulate_ms": 1e3 * simulate_s / n, "tasks": float(np.mean(tasks))}


def hot_spots(group_graph, cluster, strategies, granularity: str, top: int = 12) -> str:
    profile = cProfile.Profile()
    profile.enable()
    for strategy in strategies:
        simulate_fast(compile_strategy(group_graph, strategy, cluster, granularity=granularity).taskgraph,
                      feedback=False)
    profile.disable()
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="bert-large")
    parser.add_argument("--cluster", default="tag-testbed")
    parser.add_argument("--groups", type=int, default=60)
    parser.add_argument("--strategies", type=int, default=200)
    parser.add_argument("--granularity", nargs="+", default=["group", "part"])
    parser.add_argument("--workload", nargs="+", default=["search", "random"], choices=["search", "random"])
    parser.add_argument("--profile", action="store_true", help="print cProfile hot spots per granularity")
    args = parser.parse_args()

    cluster = resolve_cluster(args.cluster)
    graph = resolve_model(args.model)
    t0 = time.perf_counter()
    group_graph = group_ops(graph, num_groups=args.groups, gpus=cluster)
    grouping_s = time.perf_counter() - t0
    workloads = {"search": search_walk(group_graph.num_groups, cluster, args.strategies, seed=0),
                 "random": [random_strategy(group_graph.num_groups, cluster, seed=k) for k in range(args.strategies)]}
    rows = []
    for granularity in args.granularity:
        t0 = time.perf_counter()
        compile_strategy(group_graph, Strategy.data_parallel(group_graph.num_groups, cluster), cluster,
                         granularity=granularity)  # builds the strategy-independent tables once
        tables_s = time.perf_counter() - t0
        for workload in args.workload:
            row = measure(group_graph, cluster, workloads[workload], granularity)
            rows.append({"granularity": granularity, "workload": workload, "tables_s": tables_s, **row})
    print(f"{args.model}: {graph.num_ops} ops -> {group_graph.num_groups} groups ({grouping_s:.2f} s), "
          f"{cluster.name}: {cluster.num_devices} devices, {args.strategies} strategies per workload, one process")
    print(f"{'granularity':<12}{'workload':<10}{'evals/s':>9}{'compile ms':>12}{'simulate ms':>13}{'tasks':>9}"
          f"{'tables s':>10}")
    for r in rows:
        print(f"{r['granularity']:<12}{r['workload']:<10}{r['evals_per_s']:>9.1f}{r['compile_ms']:>12.1f}"
              f"{r['simulate_ms']:>13.1f}{r['tasks']:>9.0f}{r['tables_s']:>10.2f}")
    if args.profile:
        for granularity in args.granularity:
            print(f"\n--- hot spots, {granularity} granularity, random workload (first 20 strategies) ---")
            print(hot_spots(group_graph, cluster, workloads["random"][:20], granularity))
    print(json.dumps({"model": args.model, "cluster": args.cluster, "groups": group_graph.num_groups,
                      "devices": cluster.num_devices, "strategies": args.strategies,
                      "results": [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()} for r in rows]}))


if __name__ == "__main__":
    main()
