"""Learned against exact stage-to-device mappers, over cluster sizes and topology families (issue 8).

For each topology family (2D mesh, 2D torus, random_blk_1, random_blk_2, uniform_dist), device count D
and pipeline shape (S, D/S): cut a zoo model into S stages (PipeDream-style contiguous DP at R = D/S,
M = min(S, batch/R) micro-batches), build the Parmesan mapping problem (seconds per iteration), and place
it with every mapper: the exact solver (binary search + DFS, with a time limit), the learned mapper (the
mapping GNN's greedy decode on tag.search.MappingEnv, its greedy decodes under rising thresholds of the
stage time (tag.planners.learned_mapper.THRESHOLD_STEPS), then ``--learned-discrepancies`` one-discrepancy
leaves (default: one per stage replica) and ``--learned-iterations`` MCTS leaves with its priors and greedy
fill, stopping once a map meets the quick lower bound; the shipped checkpoints/tag-mapper.pt, trained on
other models and topology seeds), the learned mapper's fast setting ("learned fast": no discrepancy pass
and tag.planners.learned_mapper.FAST_MAPPER_ITERATIONS MCTS leaves), pure MCTS (uniform priors), CS map and p2p map. Gap =
(t − bound) / t against the exact solver's bound: the optimum when it was proven, else its best lower bound.

Writes a markdown report and two plots (median gap and median solve time against devices) and prints the
tables; the last line of stdout is one JSON object of every figure. Every mapper runs once untimed on a
small problem first, so that loading numba's compiled kernels is not part of any instance's time.

    .venv/bin/python scripts/compare_mappers.py [--devices 8 16 32 64 128 256] [--time-limit 10]
        [--mcts-iterations 1000] [--learned-iterations 32] [--learned-discrepancies N] [--policy CKPT]
        [--model bert-large]
        [--out docs/compare_mappers]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from tag._atomic import atomic_write_text
from tag.cluster import resolve_cluster
from tag.exact.heuristics import cs_map, p2p_map
from tag.exact.mapping import MappingProblem, choose_instantiation, max_stage_time, solve_mapping
from tag.planners.learned_mapper import FAST_MAPPER_DISCREPANCIES, FAST_MAPPER_ITERATIONS, learned_mapping
from tag.policy.mapping import MappingPolicy, resolve_mapping_policy
from tag.search import MappingEnv, mcts_search, uniform_mapping_evaluator
from tag.training.mapper import zoo_stage_graph

GRIDS = {8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}
FAMILIES = {
    "2d mesh": lambda d, seed: f"mesh2d:{GRIDS[d]}",  # regular: the same for every seed
    "2d torus": lambda d, seed: f"torus2d:{GRIDS[d]}",
    "random_blk_1": lambda d, seed: f"random-blk-1:{d},seed={seed}",
    "random_blk_2": lambda d, seed: f"random-blk-2:{d},seed={seed}",
    "uniform_dist": lambda d, seed: f"uniform-dist:{d},seed={seed}",
}
MAPPERS = ("exact", "learned", "learned fast", "pure MCTS", "CS", "p2p")


def run_instance(model: str, family: str, devices: int, stages: int, time_limit: float, iterations: int,
                 policy: MappingPolicy, learned_iterations: int, learned_discrepancies: int | None,
                 topology_seed: int = 0) -> dict:
    cluster = resolve_cluster(FAMILIES[family](devices, topology_seed))
    replicas = devices // stages
    problem = MappingProblem.from_stage_graph(zoo_stage_graph(model, stages, replicas), replicas, cluster)
    mode = choose_instantiation(problem)
    out = {"family": family, "devices": devices, "stages": stages, "replicas": replicas, "instantiation": mode}
    start = time.perf_counter()
    exact = solve_mapping(problem, instantiation=mode, time_limit=time_limit)
    times = {"exact": (exact.max_stage_time, time.perf_counter() - start)}
    start = time.perf_counter()
    mapping = learned_mapping(problem, policy, instantiation=mode, iterations=learned_iterations,
                              discrepancies=learned_discrepancies, time_limit_s=time_limit)
    times["learned"] = (max_stage_time(problem, mapping, mode), time.perf_counter() - start)
    start = time.perf_counter()
    mapping = learned_mapping(problem, policy, instantiation=mode, iterations=FAST_MAPPER_ITERATIONS,
                              discrepancies=FAST_MAPPER_DISCREPANCIES, time_limit_s=time_limit)
    times["learned fast"] = (max_stage_time(problem, mapping, mode), time.perf_counter() - start)
    start = time.perf_counter()
    env = MappingEnv(problem, instantiation=mode, lower_bound=exact.lower_bound)
    search = mcts_search(env, uniform_mapping_evaluator, max_iterations=iterations, time_limit_s=time_limit,
                         target_visits=None)
    times["pure MCTS"] = (search.best_time, time.perf_counter() - start)
    for name, heuristic in (("CS", cs_map), ("p2p", p2p_map)):
        start = time.perf_counter()
        mapping = heuristic(problem)
        times[name] = (max_stage_time(problem, mapping, mode), time.perf_counter() - start)
    out["proven_optimal"] = bool(exact.proven_optimal)
    out["lower_bound_s"] = float(exact.lower_bound)
    for name, (value, seconds) in times.items():
        out[name] = {"max_stage_time_s": float(value), "solve_time_s": float(seconds),
                     "gap": float(max(0.0, (value - exact.lower_bound) / value)) if value > 0 else 0.0}
    return out


def warm_up(model: str, policy: MappingPolicy, learned_iterations: int,
            learned_discrepancies: int | None) -> None:
    """Every mapper once on an 8-device problem, untimed: numba loads its compiled kernels from disk (or
    compiles them) at a process's first call, which would land in the first instance's time (0.4 s)."""
    run_instance(model, "2d mesh", 8, 4, 1.0, 10, policy, learned_iterations, learned_discrepancies)


def summarise(rows: list[dict]) -> dict[int, dict[str, dict[str, float]]]:
    """Per device count and mapper: median gap and median solve time, and how many exact runs proved."""
    by_devices: dict[int, list[dict]] = defaultdict(list)
    for row in rows:
        by_devices[row["devices"]].append(row)
    summary = {}
    for devices, group in sorted(by_devices.items()):
        summary[devices] = {name: {"median_gap": float(np.median([r[name]["gap"] for r in group])),
                                   "median_time_s": float(np.median([r[name]["solve_time_s"] for r in group]))}
                            for name in MAPPERS}
        summary[devices]["proven"] = {"count": sum(r["proven_optimal"] for r in group), "of": len(group)}
    return summary


def markdown(summary: dict, args: argparse.Namespace) -> str:
    lines = [f"# Stage-to-device mappers: {args.model}, exact time limit {args.time_limit:g} s, "
             f"learned {_discrepancies(args)} discrepancy + {args.learned_iterations} MCTS leaves, learned fast "
             f"{FAST_MAPPER_DISCREPANCIES} + {FAST_MAPPER_ITERATIONS}, "
             f"pure MCTS {args.mcts_iterations} iterations", "",
             "Median gap to the exact solver's bound (the optimum where proven), per device count, over "
             f"{len(FAMILIES)} topology families × {len(args.stages)} pipeline depths.", "",
             "| devices | proven | " + " | ".join(f"{m} gap" for m in MAPPERS) + " | "
             + " | ".join(f"{m} time" for m in MAPPERS) + " |",
             "|" + "---|" * (2 + 2 * len(MAPPERS))]
    for devices, row in summary.items():
        gaps = " | ".join(f"{100 * row[m]['median_gap']:.2f}%" for m in MAPPERS)
        seconds = " | ".join(f"{row[m]['median_time_s']:.3g} s" for m in MAPPERS)
        lines.append(f"| {devices} | {row['proven']['count']}/{row['proven']['of']} | {gaps} | {seconds} |")
    lines += ["", f"Regenerate: `.venv/bin/python scripts/compare_mappers.py {' '.join(sys.argv[1:])}`".rstrip(), ""]
    return "\n".join(lines)


def _discrepancies(args: argparse.Namespace) -> str:
    return "S·R" if args.learned_discrepancies is None else str(args.learned_discrepancies)


def plot(summary: dict, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    devices = list(summary)
    paths = []
    for key, label, name in (("median_gap", "median gap to bound", "gap"), ("median_time_s", "median time (s)", "time")):
        fig, ax = plt.subplots(figsize=(5, 3.2))
        for mapper in MAPPERS:
            values = [summary[d][mapper][key] * (100 if key == "median_gap" else 1) for d in devices]
            ax.plot(devices, values, marker="o", label=mapper)
        ax.set_xscale("log", base=2)
        if key == "median_time_s":
            ax.set_yscale("log")
        ax.set_xlabel("devices")
        ax.set_ylabel(label + (" (%)" if key == "median_gap" else ""))
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out.with_name(f"{out.name}_{name}.png")
        tmp = path.with_suffix(".tmp.png")
        fig.savefig(tmp, dpi=110)
        plt.close(fig)
        tmp.replace(path)
        paths.append(str(path))
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="bert-large")
    parser.add_argument("--devices", type=int, nargs="+", default=[8, 16, 32, 64, 128, 256], choices=sorted(GRIDS))
    parser.add_argument("--stages", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--time-limit", type=float, default=10.0, help="seconds for the exact solver and MCTS each")
    parser.add_argument("--mcts-iterations", type=int, default=1000)
    parser.add_argument("--learned-iterations", type=int, default=32,
                        help="most MCTS leaves after the discrepancy pass")
    parser.add_argument("--learned-discrepancies", type=int, help="most one-discrepancy leaves (default: one per slot)")
    parser.add_argument("--topology-seed", type=int, default=0,
                        help="seed of the random families' topologies (the mapper trained on seeds >= 1000)")
    parser.add_argument("--policy", type=Path, help="mapping GNN checkpoint (default: checkpoints/tag-mapper.pt)")
    parser.add_argument("--out", type=Path, default=Path("docs/compare_mappers"), help="report path prefix")
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    args = parser.parse_args()
    torch.set_num_threads(1)  # one core per mapper, as for the exact solver
    policy = resolve_mapping_policy(args.policy)
    cells = [(f, d, s) for d in args.devices for f in args.families for s in args.stages if s <= d]
    console = Console(stderr=True)
    warm_up(args.model, policy, args.learned_iterations, args.learned_discrepancies)
    rows = []
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("mapping", total=len(cells))
        for family, devices, stages in cells:
            progress.update(task, description=f"{family}, {devices} devices, S={stages}")
            rows.append(run_instance(args.model, family, devices, stages, args.time_limit, args.mcts_iterations,
                                     policy, args.learned_iterations, args.learned_discrepancies,
                                     args.topology_seed))
            progress.advance(task)
    summary = summarise(rows)
    report = markdown(summary, args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out.with_suffix(".md"), report)
    plots = plot(summary, args.out)
    if not args.json:
        table = Table(title="median gap to bound / median time")
        table.add_column("devices", justify="right")
        table.add_column("exact proven", justify="right")
        for mapper in MAPPERS:
            table.add_column(mapper, justify="right")
        for devices, row in summary.items():
            table.add_row(str(devices), f"{row['proven']['count']}/{row['proven']['of']}",
                          *(f"{100 * row[m]['median_gap']:.2f}% / {row[m]['median_time_s']:.3g} s" for m in MAPPERS))
        Console().print(table)
        Console().print(f"wrote {args.out.with_suffix('.md')}, {', '.join(plots)}")
    print(json.dumps({"model": args.model, "time_limit_s": args.time_limit, "mcts_iterations": args.mcts_iterations,
                      "learned_iterations": args.learned_iterations,
                      "learned_discrepancies": args.learned_discrepancies, "topology_seed": args.topology_seed,
                      "summary": {str(k): v for k, v in summary.items()}, "instances": rows}))


if __name__ == "__main__":
    main()
