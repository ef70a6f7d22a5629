"""Evaluations per second of the search's inner loop: strategy → iteration time, memory, feedback.

    python scripts/bench_sim.py                      # BERT-Large, 60 groups, tag-testbed, 200 strategies
    python scripts/bench_sim.py --strategies 50 --profile
    python scripts/bench_sim.py --granularity group --workload mcts   # what a real MCTS search evaluates
    git worktree add /tmp/tag-old COMMIT && python scripts/bench_sim.py --granularity group --workload mcts \
        --against /tmp/tag-old                       # this compiler and COMMIT's side by side, in one process

It measures :class:`tag.compiler.StrategyEvaluator` (what search calls, through
:func:`tag.compiler.evaluate_strategy`), and for comparison the plain path it reproduces bit for bit,
``simulate_fast(compile_strategy(...).taskgraph)``, on the first ``--compare`` strategies. Workloads:

- ``search``: a walk that re-decides one group at a time from data parallelism (an MCTS path deepening);
- ``uniform``: every group on one random candidate layout (MCTS's first sweep over the root's children,
  where the default fill changes every group at once);
- ``random``: independent random strategies (each group on its own random set of device groups);
- ``mcts``: the strategies a real search simulates, in its order, recorded by running it once before the
  timing: ``tag plan``'s MCTS (:func:`tag.planner.plan_training`'s settings, its first default fill, where
  every new first action re-lays out all groups) with the shipped GNN policy's priors (``--mcts-priors
  uniform``: pure MCTS), seed ``--mcts-seed``, until ``--mcts-simulations`` distinct strategies are
  simulated (default 300; ``tag plan``'s default budget gives that fill 300 iterations, some of which revisit
  a strategy already simulated). The search runs once, before the timing, on its own Cluster object; it takes
  about as long as a cold pass at group granularity.

Per workload: ``evals_per_s`` (and ``evals_per_cpu_s``, per second of the process's CPU time, steadier on a
shared machine) with a fresh evaluator (every new (group, layout) and (pair, layouts)
fragment is compiled on its first use, as in a search), ``warm_evals_per_s`` on a second pass (every
fragment cached: the cost of the kernels alone), both with feedback (``--no-feedback`` to skip it);
``new_group_fragments`` and ``new_pair_fragments``, the fragments the first pass compiled per evaluation. The
workloads of one granularity share one :class:`tag.compiler.CompilerCache` (layouts, bundle plans), in the
order given; the compile path runs with a fresh one, its caches cold.
The evaluations run with the cyclic garbage collector's view of the setup frozen, as in a search
(:func:`tag.search.frozen_gc`; ``--no-gc-freeze`` to leave it on every object).
``--against DIR``: the tag.compiler of another checkout (a git worktree at an older commit) imported beside
this one, each evaluator on its own cluster and grouping, every strategy of each workload evaluated by both in
alternating order (which one goes first alternates between ``--against-reps`` repetitions), cold then warm,
with the results checked equal: two processes measured one after the other disagree by far more than a
change is worth on a shared machine. Only the compiler comes from DIR; the rest of tag is this checkout's.
Single process, one thread. Prints a table, optionally the cProfile hot spots, and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import importlib
import io
import json
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tag.cluster import resolve_cluster
from tag.compiler import CompilerCache, StrategyEvaluator, compile_strategy, random_strategy
from tag.graph.resolve import resolve_model
from tag.grouping import group_ops
from tag.planner import PlanConfig, load_priors
from tag.search import PlacementEnv, Simulated, frozen_gc, mcts_search
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


class _RecordingEnv(PlacementEnv):
    """A PlacementEnv that keeps, in order, every strategy it simulates: its cache misses, the calls that reach
    the evaluator. The DP-NCCL reference its constructor simulates is left out (no part of a search's budget)."""

    def __init__(self, *args, **kwargs) -> None:
        self.simulated: list[Strategy] = []
        super().__init__(*args, **kwargs)
        self.simulated.clear()

    def simulate(self, strategy: Strategy) -> Simulated:
        before = self.num_simulations
        simulated = super().simulate(strategy)
        if self.num_simulations > before:
            self.simulated.append(strategy)
        return simulated


def mcts_trace(group_graph, cluster_name: str, count: int, *, seed: int = 0,
               policy: str | None = None) -> list[Strategy]:
    """The first ``count`` strategies ``tag plan``'s MCTS simulates, in its order: its environment and search
    settings (:class:`tag.planner.PlanConfig`'s defaults, first default fill) with ``policy``'s priors (a
    checkpoint; None: uniform), search seed ``seed``, until ``count`` distinct strategies are simulated. On a
    fresh Cluster object with the environment's own compiler cache, so that nothing of it is warm for the timed
    evaluator."""
    config = PlanConfig()
    env = _RecordingEnv(group_graph, resolve_cluster(cluster_name), granularity=config.granularity,
                        order=config.order, fill=config.fills[0], batch_split=config.batch_split, graded_oom=True)
    evaluator, batch_evaluator, _ = load_priors(policy)
    mcts_search(env, evaluator, batch_evaluator=batch_evaluator,
                batch_size=1 if batch_evaluator is None else 8,  # tag plan's leaf batch with a GNN
                c_puct=config.c_puct, max_simulations=count, target_visits=None, seed=seed)
    return env.simulated[:count]  # a batch of leaves can overshoot the budget by a few


def measure(evaluator: StrategyEvaluator, strategies: list[Strategy], *, feedback: bool) -> tuple[float, float]:
    """Evaluations per second over ``strategies``: per wall-clock second, and per second of this process's CPU
    time (what one core would do; the steadier figure on a loaded machine)."""
    t0, c0 = time.perf_counter(), time.process_time()
    for strategy in strategies:
        evaluator(strategy, feedback=feedback)
    return len(strategies) / (time.perf_counter() - t0), len(strategies) / max(time.process_time() - c0, 1e-9)


def measure_compile_path(group_graph, cluster_name: str, strategies, granularity: str, *, feedback: bool) -> dict:
    """The plain path: compile_strategy, then simulate_fast on its TaskGraph; times per evaluation in ms. With a
    fresh compiler cache (shared by these strategies), so that nothing is warm from the evaluator."""
    cluster = resolve_cluster(cluster_name)
    cache = CompilerCache()
    compile_s = simulate_s = 0.0
    for strategy in strategies:
        t0 = time.perf_counter()
        plan = compile_strategy(group_graph, strategy, cluster, granularity=granularity, cache=cache)
        t1 = time.perf_counter()
        simulate_fast(plan.taskgraph, feedback=feedback)
        compile_s += t1 - t0
        simulate_s += time.perf_counter() - t1
    n = len(strategies)
    if n == 0:  # --compare 0: the plain path is not measured
        return {"compile_path_evals_per_s": None, "compile_ms": None, "simulate_ms": None}
    return {"compile_path_evals_per_s": n / (compile_s + simulate_s), "compile_ms": 1e3 * compile_s / n,
            "simulate_ms": 1e3 * simulate_s / n}


def load_kernels(group_graph, cluster_name: str, granularity: str, count: int = 8) -> None:
    """Evaluate ``count`` random strategies (every option) on a throwaway evaluator with its own compiler cache:
    numba compiles or loads each kernel at its first call, and a timed pass must not pay for that (after a code
    change, when the on-disk cache is stale, it costs seconds), while the timed evaluator's caches stay cold."""
    cluster = resolve_cluster(cluster_name)
    evaluator = StrategyEvaluator(group_graph, cluster, granularity=granularity)
    for k in range(count):
        evaluator(random_strategy(group_graph.num_groups, cluster, seed=10_000 + k))


def load_against(root: str):
    """tag.compiler of the checkout at ``root``, imported beside this one as package ``tag_compiler_against``
    (a copy whose imports of tag.compiler are rewritten; numba compiles its kernels on first use)."""
    source = Path(root) / "tag" / "compiler"
    if not (source / "__init__.py").is_file():
        raise SystemExit(f"bench_sim.py: error: --against {root!r} holds no tag/compiler package")
    target = Path(tempfile.mkdtemp(prefix="bench_sim_")) / "tag_compiler_against"
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    for path in target.glob("*.py"):
        text = path.read_text().replace("from tag.compiler import", "from tag_compiler_against import")
        path.write_text(text.replace("tag.compiler.", "tag_compiler_against."))
    sys.path.insert(0, str(target.parent))
    return importlib.import_module("tag_compiler_against")


def side_by_side(graph, num_groups: int, cluster_name: str, strategies: list[Strategy], granularity: str, against,
                 reps: int) -> dict:
    """Evaluations per CPU-second and per second, cold (fresh evaluators) then warm, of this compiler and
    ``against``'s, each on its own cluster and grouping, strategy by strategy in alternating order (who goes
    first alternates between the ``reps`` repetitions); raises if their results differ."""
    def make(module):
        cluster = resolve_cluster(cluster_name)
        evaluator = module.StrategyEvaluator(group_ops(graph, num_groups=num_groups, gpus=cluster), cluster,
                                             granularity=granularity, max_cached_tasks=30_000_000)
        evaluator(Strategy.data_parallel(num_groups, cluster))  # the evaluator's tables, as the timed setup
        return evaluator

    modules = {"this": sys.modules["tag.compiler"], "against": against}
    for module in modules.values():  # numba compiles or loads every kernel before any timing
        warm_up = make(module)
        for k in range(8):
            warm_up(random_strategy(num_groups, warm_up.cluster, seed=10_000 + k))
    spent = {(name, phase, clock): 0.0 for name in modules for phase in ("cold", "warm") for clock in ("wall", "cpu")}
    for rep in range(reps):
        order = list(modules) if rep % 2 == 0 else list(modules)[::-1]
        evaluators = {name: make(modules[name]) for name in order}
        with frozen_gc():
            for phase in ("cold", "warm"):
                for strategy in strategies:
                    for name in order:
                        t0, c0 = time.perf_counter(), time.process_time()
                        evaluators[name](strategy)
                        spent[(name, phase, "wall")] += time.perf_counter() - t0
                        spent[(name, phase, "cpu")] += time.process_time() - c0
        for strategy in strategies[:50]:
            this, other = (evaluators[name](strategy, feedback=False) for name in modules)
            if this.iteration_time != other.iteration_time or not np.array_equal(this.peak_memory, other.peak_memory):
                raise SystemExit("bench_sim.py: error: --against gives other results than this compiler")
    n = reps * len(strategies)
    return {f"{name}_{phase}_evals_per_{'cpu_s' if clock == 'cpu' else 's'}": n / seconds
            for (name, phase, clock), seconds in spent.items()}


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
    parser.add_argument("--workload", nargs="+", default=["search", "uniform", "random", "mcts"],
                        choices=["search", "uniform", "random", "mcts"])
    parser.add_argument("--mcts-simulations", type=int, default=300,
                        help="distinct strategies the recorded search simulates (the mcts workload's length)")
    parser.add_argument("--mcts-seed", type=int, default=0, help="seed of the recorded search")
    parser.add_argument("--mcts-priors", choices=["policy", "uniform"], default="policy",
                        help="priors of the recorded search: the shipped GNN policy (tag plan's) or uniform")
    parser.add_argument("--no-feedback", dest="feedback", action="store_false", help="skip Table 1 feedback")
    parser.add_argument("--profile", action="store_true", help="print cProfile hot spots per granularity")
    parser.add_argument("--no-gc-freeze", dest="gc_freeze", action="store_false",
                        help="let the garbage collector scan the setup's objects during the runs")
    parser.add_argument("--against", metavar="DIR", help="a checkout whose compiler runs side by side with this one")
    parser.add_argument("--against-reps", type=int, default=4, help="repetitions of the side-by-side comparison")
    args = parser.parse_args()
    for name in ("groups", "strategies", "mcts_simulations", "against_reps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.compare < 0:
        parser.error(f"--compare must be 0 (skip the plain path) or more, got {args.compare}")

    against = load_against(args.against) if args.against else None
    cluster = resolve_cluster(args.cluster)
    graph = resolve_model(args.model)
    t0 = time.perf_counter()
    group_graph = group_ops(graph, num_groups=args.groups, gpus=cluster)
    grouping_s = time.perf_counter() - t0
    g = group_graph.num_groups
    workloads = {"search": search_walk(g, cluster, args.strategies, seed=0),
                 "uniform": uniform_sweep(g, cluster, args.strategies, seed=0),
                 "random": [random_strategy(g, cluster, seed=k) for k in range(args.strategies)]}
    if "mcts" in args.workload:
        t0 = time.perf_counter()
        policy = None
        if args.mcts_priors == "policy":
            from tag.policy import shipped_policy_path  # imports torch: only for this workload

            policy = str(shipped_policy_path())
        workloads["mcts"] = mcts_trace(group_graph, args.cluster, args.mcts_simulations, seed=args.mcts_seed,
                                       policy=policy)
        recording_s = time.perf_counter() - t0
    rows = []
    for granularity in args.granularity:
        load_kernels(group_graph, args.cluster, granularity)
        cache = CompilerCache()  # the workloads' layouts and bundle plans, shared in the order given
        for workload in args.workload:
            strategies = workloads[workload]
            t0 = time.perf_counter()
            # room for every fragment of the workload, so that the second pass measures the kernels alone
            evaluator = StrategyEvaluator(group_graph, cluster, granularity=granularity, max_cached_tasks=30_000_000,
                                          cache=cache)
            result = evaluator(Strategy.data_parallel(g, cluster))  # the evaluator's tables
            setup_s = time.perf_counter() - t0
            before = evaluator.cached_fragments()
            with frozen_gc() if args.gc_freeze else contextlib.nullcontext():
                cold, cold_cpu = measure(evaluator, strategies, feedback=args.feedback)
                built = np.subtract(evaluator.cached_fragments(), before) / len(strategies)  # [2] group, pair
                warm, warm_cpu = measure(evaluator, strategies, feedback=args.feedback)
            row = {"granularity": granularity, "workload": workload, "evaluations": len(strategies),
                   "setup_s": setup_s, "evals_per_s": cold, "warm_evals_per_s": warm, "evals_per_cpu_s": cold_cpu,
                   "warm_evals_per_cpu_s": warm_cpu, "new_group_fragments": float(built[0]),
                   "new_pair_fragments": float(built[1]),
                   "tasks": float(np.mean([evaluator(s, feedback=False).start.size for s in strategies[:20]])),
                   "dp_time_s": result.iteration_time}
            row.update(measure_compile_path(group_graph, args.cluster, strategies[:args.compare], granularity,
                                            feedback=args.feedback))
            if against is not None:
                row.update(side_by_side(graph, args.groups, args.cluster, strategies, granularity, against,
                                        args.against_reps))
            rows.append(row)
    print(f"{args.model}: {graph.num_ops} ops -> {g} groups ({grouping_s:.2f} s), {cluster.name}: "
          f"{cluster.num_devices} devices, {args.strategies} strategies per synthetic workload, one process, "
          f"feedback {'on' if args.feedback else 'off'}, setup {'frozen' if args.gc_freeze else 'not frozen'} for the "
          f"garbage collector")
    if "mcts" in workloads:
        print(f"mcts: {len(workloads['mcts'])} strategies of one tag plan MCTS search ({args.mcts_priors} priors, "
              f"seed {args.mcts_seed}), recorded in {recording_s:.1f} s")
    print(f"{'granularity':<12}{'workload':<9}{'evals/s':>9}{'warm/s':>9}{'/cpu-s':>9}{'warm':>9}{'tasks':>8}"
          f"{'new g/p':>12}   {'compile_strategy+simulate_fast: evals/s':>40}")
    for r in rows:
        print(f"{r['granularity']:<12}{r['workload']:<9}{r['evals_per_s']:>9.1f}{r['warm_evals_per_s']:>9.1f}"
              f"{r['evals_per_cpu_s']:>9.1f}{r['warm_evals_per_cpu_s']:>9.1f}{r['tasks']:>8.0f}"
              f"{r['new_group_fragments']:>6.1f}/{r['new_pair_fragments']:<5.1f}   "
              + (f"{r['compile_path_evals_per_s']:>40.1f}" if r["compile_path_evals_per_s"] is not None
                 else f"{'-':>40}"))
    if against is not None:
        print(f"\nside by side with {args.against}, {args.against_reps} repetitions, evaluations per CPU-second "
              "(per second):")
        print(f"{'granularity':<12}{'workload':<9}{'this cold':>20}{'against cold':>20}{'this warm':>20}"
              f"{'against warm':>20}")
        for r in rows:
            cells = [f"{r[f'{who}_{phase}_evals_per_cpu_s']:.1f} ({r[f'{who}_{phase}_evals_per_s']:.1f})"
                     for phase in ("cold", "warm") for who in ("this", "against")]
            print(f"{r['granularity']:<12}{r['workload']:<9}" + "".join(f"{c:>20}" for c in cells))
    if args.profile:
        for granularity in args.granularity:
            print(f"\n--- hot spots, {granularity} granularity, search workload (first 100 strategies) ---")
            print(hot_spots(group_graph, cluster, workloads["search"][:100], granularity))
    results = [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()} for r in rows]
    mcts = {"mcts_simulations": len(workloads["mcts"]), "mcts_seed": args.mcts_seed, "mcts_priors": args.mcts_priors,
            "mcts_recording_s": round(recording_s, 3)} if "mcts" in workloads else {}
    print(json.dumps({"model": args.model, "cluster": args.cluster, "groups": g, "devices": cluster.num_devices,
                      "strategies": args.strategies, "feedback": args.feedback, "gc_freeze": args.gc_freeze,
                      "against": args.against,
                      **mcts, "results": results}))


if __name__ == "__main__":
    main()
