"""Evaluations per second of the search's inner loop: strategy → iteration time, memory, feedback.

    python scripts/bench_sim.py                      # BERT-Large, 60 groups, tag-testbed, 200 strategies
    python scripts/bench_sim.py --strategies 50 --profile

It measures :class:`tag.compiler.StrategyEvaluator` (what search calls, through
:func:`tag.compiler.evaluate_strategy`), and for comparison the plain path it reproduces bit for bit,
``simulate_fast(compile_strategy(...).taskgraph)``, on the first ``--compare`` strategies. Workloads:

- ``search``: a walk that re-decides one group at a time from data parallelism (an MCTS path deepening);
- ``uniform``: every group on one random candidate layout (MCTS's first sweep over the root's children,
  where the default fill changes every group at once);
- ``random``: independent random strategies (each group on its own random set of device groups).

Per workload: ``evals_per_s`` (and ``evals_per_cpu_s``, per second of the process's CPU time, steadier on a
shared machine) with a fresh evaluator (every new (group, layout) and (pair, layouts)
fragment is compiled on its first use, as in a search), ``warm_evals_per_s`` on a second pass (every
fragment cached: the cost of the kernels alone), both with feedback (``--no-feedback`` to skip it). The
compile path runs on a fresh Cluster object, its caches cold.
The evaluations run with the cyclic garbage collector's view of the setup frozen, as in a search
(:func:`tag.search.frozen_gc`; ``--no-gc-freeze`` to leave it on every object).
Single process, one thread. Prints a table, optionally the cProfile hot spots, and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import pstats
import time

import numpy as np

from tag.cluster import resolve_cluster
from tag.compiler import StrategyEvaluator, compile_strategy, random_strategy
from tag.graph.resolve import resolve_model
from tag.grouping import group_ops
from tag.search import frozen_gc
from tag.sim import simulate_fast
from tag.strategy import OPTIONS, Strategy, candidate_actions


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


def uniform_sweep(num_groups: int, cluster, count: int, seed: int) -> list[Strategy]:
    """``count`` strategies placing every group on one candidate layout, distinct layouts drawn at random."""
    masks, options = candidate_actions(cluster)
    rng = np.random.default_rng(seed)
    picks = rng.permutation(len(options))[:count]
    return [Strategy.from_cluster(cluster, np.repeat(masks[a][None, :], num_groups, axis=0),
                                  np.full(num_groups, options[a])) for a in picks]


def measure(evaluator: StrategyEvaluator, strategies: list[Strategy], *, feedback: bool) -> tuple[float, float]:
    """Evaluations per second over ``strategies``: per wall-clock second, and per second of this process's CPU
    time (what one core would do; the steadier figure on a loaded machine)."""
    t0, c0 = time.perf_counter(), time.process_time()
    for strategy in strategies:
        evaluator(strategy, feedback=feedback)
    return len(strategies) / (time.perf_counter() - t0), len(strategies) / max(time.process_time() - c0, 1e-9)


def measure_compile_path(group_graph, cluster_name: str, strategies, granularity: str, *, feedback: bool) -> dict:
    """The plain path: compile_strategy, then simulate_fast on its TaskGraph; times per evaluation in ms. On a
    fresh Cluster object, so that none of the compiler's per-cluster caches are warm from the evaluator."""
    cluster = resolve_cluster(cluster_name)
    compile_s = simulate_s = 0.0
    for strategy in strategies:
        t0 = time.perf_counter()
        plan = compile_strategy(group_graph, strategy, cluster, granularity=granularity)
        t1 = time.perf_counter()
        simulate_fast(plan.taskgraph, feedback=feedback)
        compile_s += t1 - t0
        simulate_s += time.perf_counter() - t1
    n = len(strategies)
    return {"compile_path_evals_per_s": n / (compile_s + simulate_s), "compile_ms": 1e3 * compile_s / n,
            "simulate_ms": 1e3 * simulate_s / n}


def load_kernels(group_graph, cluster_name: str, granularity: str, count: int = 8) -> None:
    """Evaluate ``count`` random strategies (every option) on a throwaway evaluator over a fresh Cluster
    object: numba compiles or loads each kernel at its first call, and a timed pass must not pay for that
    (after a code change, when the on-disk cache is stale, it costs seconds), while the compiler's
    per-cluster caches stay cold for the timed evaluator."""
    cluster = resolve_cluster(cluster_name)
    evaluator = StrategyEvaluator(group_graph, cluster, granularity=granularity)
    for k in range(count):
        evaluator(random_strategy(group_graph.num_groups, cluster, seed=10_000 + k))


def hot_spots(group_graph, cluster, strategies, granularity: str, top: int = 14) -> str:
    evaluator = StrategyEvaluator(group_graph, cluster, granularity=granularity)
    evaluator(strategies[0])
    profile = cProfile.Profile()
    profile.enable()
    for strategy in strategies:
        evaluator(strategy)
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
    parser.add_argument("--compare", type=int, default=10, help="strategies run through compile_strategy too")
    parser.add_argument("--granularity", nargs="+", default=["group", "merged", "part"])
    parser.add_argument("--workload", nargs="+", default=["search", "uniform", "random"],
                        choices=["search", "uniform", "random"])
    parser.add_argument("--no-feedback", dest="feedback", action="store_false", help="skip Table 1 feedback")
    parser.add_argument("--profile", action="store_true", help="print cProfile hot spots per granularity")
    parser.add_argument("--no-gc-freeze", dest="gc_freeze", action="store_false",
                        help="let the garbage collector scan the setup's objects during the runs")
    args = parser.parse_args()

    cluster = resolve_cluster(args.cluster)
    graph = resolve_model(args.model)
    t0 = time.perf_counter()
    group_graph = group_ops(graph, num_groups=args.groups, gpus=cluster)
    grouping_s = time.perf_counter() - t0
    g = group_graph.num_groups
    workloads = {"search": search_walk(g, cluster, args.strategies, seed=0),
                 "uniform": uniform_sweep(g, cluster, args.strategies, seed=0),
                 "random": [random_strategy(g, cluster, seed=k) for k in range(args.strategies)]}
    rows = []
    for granularity in args.granularity:
        load_kernels(group_graph, args.cluster, granularity)
        for workload in args.workload:
            strategies = workloads[workload]
            t0 = time.perf_counter()
            # room for every fragment of the workload, so that the second pass measures the kernels alone
            evaluator = StrategyEvaluator(group_graph, cluster, granularity=granularity, max_cached_tasks=30_000_000)
            result = evaluator(Strategy.data_parallel(g, cluster))  # the evaluator's tables
            setup_s = time.perf_counter() - t0
            with frozen_gc() if args.gc_freeze else contextlib.nullcontext():
                cold, cold_cpu = measure(evaluator, strategies, feedback=args.feedback)
                warm, warm_cpu = measure(evaluator, strategies, feedback=args.feedback)
            row = {"granularity": granularity, "workload": workload, "setup_s": setup_s,
                   "evals_per_s": cold, "warm_evals_per_s": warm, "evals_per_cpu_s": cold_cpu,
                   "warm_evals_per_cpu_s": warm_cpu,
                   "tasks": float(np.mean([evaluator(s, feedback=False).start.size for s in strategies[:20]])),
                   "dp_time_s": result.iteration_time}
            row.update(measure_compile_path(group_graph, args.cluster, strategies[:args.compare], granularity,
                                            feedback=args.feedback))
            rows.append(row)
    print(f"{args.model}: {graph.num_ops} ops -> {g} groups ({grouping_s:.2f} s), {cluster.name}: "
          f"{cluster.num_devices} devices, {args.strategies} strategies per workload, one process, "
          f"feedback {'on' if args.feedback else 'off'}, setup {'frozen' if args.gc_freeze else 'not frozen'} for the "
          f"garbage collector")
    print(f"{'granularity':<12}{'workload':<9}{'evals/s':>9}{'warm/s':>9}{'/cpu-s':>9}{'warm':>9}{'tasks':>8}   "
          f"{'compile_strategy+simulate_fast: evals/s':>40}")
    for r in rows:
        print(f"{r['granularity']:<12}{r['workload']:<9}{r['evals_per_s']:>9.1f}{r['warm_evals_per_s']:>9.1f}"
              f"{r['evals_per_cpu_s']:>9.1f}{r['warm_evals_per_cpu_s']:>9.1f}"
              f"{r['tasks']:>8.0f}   {r['compile_path_evals_per_s']:>40.1f}")
    if args.profile:
        for granularity in args.granularity:
            print(f"\n--- hot spots, {granularity} granularity, search workload (first 100 strategies) ---")
            print(hot_spots(group_graph, cluster, workloads["search"][:100], granularity))
    results = [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()} for r in rows]
    print(json.dumps({"model": args.model, "cluster": args.cluster, "groups": g, "devices": cluster.num_devices,
                      "strategies": args.strategies, "feedback": args.feedback, "gc_freeze": args.gc_freeze,
                      "results": results}))


if __name__ == "__main__":
    main()
