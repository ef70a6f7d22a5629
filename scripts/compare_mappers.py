"""Learned against exact stage-to-device mappers, over cluster sizes and topology families.

For each topology family of :mod:`tag.cluster.families` (TAG's random clusters, NVLink islands, mixed GPU
generations, 2D mesh, 2D torus, random_blk_1, random_blk_2, uniform_dist; each drawn at exactly D devices,
``family_cluster(family, seed, devices=D)``), device count D, topology seed and pipeline shape (S, D/S):
cut a zoo model into S stages (PipeDream-style contiguous DP at R = D/S, M = min(S, batch/R)
micro-batches), build the Parmesan mapping problem (seconds per iteration), and place it with every
mapper: the exact solver (binary search + DFS, with a time limit), the learned mapper (the mapping GNN's
greedy decode on tag.search.MappingEnv, its greedy decodes under rising thresholds of the stage time,
``--backtrack-dives`` dives of the backtracking search under a bisection of targets, then
``--learned-discrepancies`` one-discrepancy leaves (default: one per stage replica) and
``--learned-iterations`` MCTS leaves with its priors and greedy fill, stopping once a map meets the quick
lower bound; the shipped checkpoints/tag-mapper.pt, trained on other models and topology seeds ≥ 1000),
its fast setting ("learned fast": the threshold decodes and FAST_MAPPER_ITERATIONS MCTS leaves), pure
MCTS (uniform priors), CS map and p2p map. ``--candidate CKPT`` adds both learned settings with another
checkpoint ("candidate", "candidate fast") on the same instances. Gap = (t − bound) / t against the exact
solver's bound: the optimum when it was proven, else its best lower bound.

Reports the median gap per device count over every family (with the median times), the learned
settings' median gap per family and device count (families the mapper was not trained on,
tag.training.mapper.HELD_OUT, marked), and the exact mapper's median time over each learned setting's at
64 devices, pooled over families and topology seeds (``--ratio-seeds`` adds seeds run at 64 devices
only; their rows join the 64-device rows of the gap tables too). Writes a markdown report and two plots (median gap and median time against devices) and prints
the tables; the last line of stdout is one JSON object of every figure. Every mapper runs once untimed
on a small problem first, so that loading numba's compiled kernels is not part of any instance's time.

    .venv/bin/python scripts/compare_mappers.py [--devices 16 32 64 128 256] [--stages 4 8] [--time-limit 10]
        [--mcts-iterations 1000] [--learned-iterations 32] [--learned-discrepancies N] [--backtrack-dives N]
        [--policy CKPT] [--candidate CKPT] [--topology-seeds 0] [--ratio-seeds 1 2 3] [--families F ...]
        [--model bert-large] [--out docs/compare_mappers] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
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
from tag.cluster.families import FAMILIES, family_cluster
from tag.exact.heuristics import cs_map, p2p_map
from tag.exact.mapping import MappingProblem, choose_instantiation, max_stage_time, solve_mapping
from tag.planners.learned_mapper import (DEFAULT_BACKTRACK_DIVES, FAST_BACKTRACK_DIVES, FAST_MAPPER_DISCREPANCIES,
                                         FAST_MAPPER_ITERATIONS, learned_mapping)
from tag.policy.mapping import MappingPolicy, load_mapping_policy, resolve_mapping_policy, shipped_mapping_checkpoint
from tag.search import MappingEnv, mcts_search, uniform_mapping_evaluator
from tag.training.mapper import stage_gpus, trained_families, zoo_stage_graph

# tag.training.mapper's name of each family (its FAMILIES), to tell which ones a checkpoint was trained on
TRAINING_NAMES = {"tag-random": "hierarchical", "nvlink": "nvlink", "mixed-gen": "mixed-gen", "mesh": "2d mesh",
                  "torus": "2d torus", "random-blk-1": "random_blk_1", "random-blk-2": "random_blk_2",
                  "uniform-dist": "uniform_dist"}
MAPPERS = ("exact", "learned", "learned fast", "pure MCTS", "CS", "p2p")
CANDIDATES = ("candidate", "candidate fast")  # the learned settings with --candidate's checkpoint
LEARNED = ("learned", "learned fast") + CANDIDATES
RATIO_DEVICES = 64  # where the fast setting should take a tenth of the exact mapper's time


def untrained(checkpoint: Path | None) -> list[str]:
    """The families (tag.cluster.families' names) the checkpoint's policy was not trained on."""
    meta = load_mapping_policy(checkpoint or shipped_mapping_checkpoint()).meta
    return [f for f in FAMILIES if TRAINING_NAMES[f] not in trained_families(meta)]


def problem_of(model: str, family: str, devices: int, stages: int, topology_seed: int) -> MappingProblem:
    """``model`` in ``stages`` stages of ``devices // stages`` replicas on the family's cluster of ``devices``."""
    cluster = family_cluster(family, topology_seed, devices=devices)
    replicas = devices // stages
    graph = zoo_stage_graph(model, stages, replicas, stage_gpus(cluster))
    return MappingProblem.from_stage_graph(graph, replicas, cluster)


def run_instance(model: str, family: str, devices: int, stages: int, time_limit: float, iterations: int,
                 policy: MappingPolicy, learned_iterations: int, learned_discrepancies: int | None,
                 topology_seed: int = 0, *, candidate: MappingPolicy | None = None,
                 backtrack_dives: int = DEFAULT_BACKTRACK_DIVES) -> dict:
    """One problem through every mapper: each one's max stage time, time and gap to the exact bound."""
    problem = problem_of(model, family, devices, stages, topology_seed)
    mode = choose_instantiation(problem)
    out = {"family": family, "devices": devices, "stages": stages, "replicas": devices // stages,
           "topology_seed": topology_seed, "instantiation": mode}
    start = time.perf_counter()
    exact = solve_mapping(problem, instantiation=mode, time_limit=time_limit)
    times = {"exact": (exact.max_stage_time, time.perf_counter() - start)}
    policies = {"learned": policy} if candidate is None else {"learned": policy, "candidate": candidate}
    for name, weights in policies.items():
        for suffix, leaves, discrepancies, dives in (
                ("", learned_iterations, learned_discrepancies, backtrack_dives),
                (" fast", FAST_MAPPER_ITERATIONS, FAST_MAPPER_DISCREPANCIES, FAST_BACKTRACK_DIVES)):
            start = time.perf_counter()
            mapping = learned_mapping(problem, weights, instantiation=mode, iterations=leaves,
                                      discrepancies=discrepancies, time_limit_s=time_limit, backtrack_dives=dives)
            times[name + suffix] = (max_stage_time(problem, mapping, mode), time.perf_counter() - start)
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


def warm_up(model: str, policy: MappingPolicy, candidate: MappingPolicy | None) -> None:
    """Every mapper once on a 16-device problem, untimed: numba loads its compiled kernels from disk (or
    compiles them) at a process's first call, which would land in the first instance's time (0.4 s)."""
    run_instance(model, "mesh", 16, 4, 1.0, 10, policy, 2, None, candidate=candidate, backtrack_dives=4)


def mappers_of(rows: list[dict]) -> tuple[str, ...]:
    return MAPPERS + (CANDIDATES if rows and "candidate" in rows[0] else ())


def summarise(rows: list[dict]) -> dict[int, dict[str, dict[str, float]]]:
    """Per device count and mapper: median gap and median solve time, and how many exact runs proved."""
    by_devices: dict[int, list[dict]] = defaultdict(list)
    for row in rows:
        by_devices[row["devices"]].append(row)
    summary = {}
    for devices, group in sorted(by_devices.items()):
        summary[devices] = {name: {"median_gap": float(np.median([r[name]["gap"] for r in group])),
                                   "median_time_s": float(np.median([r[name]["solve_time_s"] for r in group]))}
                            for name in mappers_of(rows)}
        summary[devices]["proven"] = {"count": sum(r["proven_optimal"] for r in group), "of": len(group)}
    return summary


def by_family(rows: list[dict]) -> dict[str, dict[int, dict[str, float]]]:
    """Per family (in FAMILIES' order) and device count: each mapper's median gap over depths and
    topology seeds, and how many exact runs proved (``proven`` of ``of``)."""
    groups: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for row in rows:
        groups[row["family"], row["devices"]].append(row)
    out: dict[str, dict[int, dict[str, float]]] = {}
    for family, devices in sorted(groups, key=lambda key: (list(FAMILIES).index(key[0]), key[1])):
        group = groups[family, devices]
        cell = {name: float(np.median([r[name]["gap"] for r in group])) for name in mappers_of(rows)}
        cell.update(proven=sum(r["proven_optimal"] for r in group), of=len(group))
        out.setdefault(family, {})[devices] = cell
    return out


def time_ratio(rows: list[dict], devices: int = RATIO_DEVICES) -> dict:
    """The exact mapper's median time over each learned setting's at ``devices``, pooled over families,
    depths and topology seeds, with the setting's median gap there (empty without such rows)."""
    group = [r for r in rows if r["devices"] == devices]
    if not group:
        return {}
    exact = float(np.median([r["exact"]["solve_time_s"] for r in group]))
    out: dict = {"devices": devices, "instances": len(group), "seeds": sorted({r["topology_seed"] for r in group}),
                 "exact_median_time_s": exact}
    for name in [m for m in mappers_of(rows) if m in LEARNED]:
        seconds = float(np.median([r[name]["solve_time_s"] for r in group]))
        out[name] = {"median_time_s": seconds, "ratio": exact / seconds if seconds > 0 else float("inf"),
                     "median_gap": float(np.median([r[name]["gap"] for r in group]))}
    return out


def markdown(rows: list[dict], args: argparse.Namespace, held_out: list[str]) -> str:
    summary, families, ratio = summarise(rows), by_family(rows), time_ratio(rows)
    mappers = mappers_of(rows)
    learned = [m for m in mappers if m in LEARNED]
    seeds = ", ".join(map(str, args.topology_seeds))
    extra = (f" (and seeds {', '.join(map(str, args.ratio_seeds))} at {RATIO_DEVICES} devices)"
             if args.ratio_seeds else "")
    lines = [f"# Stage-to-device mappers: {args.model}, exact time limit {args.time_limit:g} s, learned "
             f"{args.backtrack_dives} backtracking dives + {_discrepancies(args)} discrepancy + "
             f"{args.learned_iterations} MCTS leaves, learned fast {FAST_BACKTRACK_DIVES} + "
             f"{FAST_MAPPER_DISCREPANCIES} + {FAST_MAPPER_ITERATIONS}, pure MCTS {args.mcts_iterations} iterations", "",
             f"Median gap to the exact solver's bound (the optimum where proven), per device count, over "
             f"{len(args.families)} topology families × {len(args.stages)} pipeline depths × topology seeds "
             f"{seeds}{extra}.", "",
             "| devices | proven | " + " | ".join(f"{m} gap" for m in mappers) + " | "
             + " | ".join(f"{m} time" for m in mappers) + " |",
             "|" + "---|" * (2 + 2 * len(mappers))]
    for devices, row in summary.items():
        gaps = " | ".join(f"{100 * row[m]['median_gap']:.2f}%" for m in mappers)
        seconds = " | ".join(f"{row[m]['median_time_s']:.3g} s" for m in mappers)
        lines.append(f"| {devices} | {row['proven']['count']}/{row['proven']['of']} | {gaps} | {seconds} |")
    counts = sorted({d for cells in families.values() for d in cells})
    lines += ["", f"Median gap per family and device count, over depths and topology seeds: "
              f"{' / '.join(learned)} / exact (exact runs proven); * = a family the learned mapper's checkpoint "
              "was not trained on.", "",
              "| family | " + " | ".join(str(d) for d in counts) + " |", "|" + "---|" * (1 + len(counts))]
    for family, cells in families.items():
        text = [" / ".join(f"{100 * cells[d][m]:.1f}%" for m in learned + ["exact"])
                + f" ({cells[d]['proven']}/{cells[d]['of']})" if d in cells else "" for d in counts]
        lines.append(f"| {family}{' *' if family in held_out else ''} | " + " | ".join(text) + " |")
    if ratio:
        lines += ["", f"At {ratio['devices']} devices, pooled over {ratio['instances']} problems (topology seeds "
                  f"{', '.join(map(str, ratio['seeds']))}): exact median {1000 * ratio['exact_median_time_s']:.3g} ms; "
                  + "; ".join(f"{m} {1000 * ratio[m]['median_time_s']:.3g} ms ({ratio[m]['ratio']:.1f}× less, "
                              f"median gap {100 * ratio[m]['median_gap']:.2f}%)" for m in learned) + "."]
    lines += ["", f"Regenerate: `.venv/bin/python scripts/compare_mappers.py {' '.join(sys.argv[1:])}`".rstrip(), ""]
    return "\n".join(lines)


def _discrepancies(args: argparse.Namespace) -> str:
    return "S·R" if args.learned_discrepancies is None else str(args.learned_discrepancies)


def plot(summary: dict, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    devices = list(summary)
    mappers = [m for m in summary[devices[0]] if m != "proven"]
    paths = []
    for key, label, name in (("median_gap", "median gap to bound", "gap"),
                             ("median_time_s", "median time (s)", "time")):
        fig, ax = plt.subplots(figsize=(5, 3.2))
        for mapper in mappers:
            values = [summary[d][mapper][key] * (100 if key == "median_gap" else 1) for d in devices]
            ax.plot(devices, values, marker="o", label=mapper)
        ax.set_xscale("log", base=2)
        if key == "median_time_s":
            ax.set_yscale("log")
        ax.set_xlabel("devices")
        ax.set_ylabel(label + (" (%)" if key == "median_gap" else ""))
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out.with_name(f"{out.name}_{name}.png")
        tmp = path.with_suffix(".tmp.png")
        fig.savefig(tmp, dpi=110)
        plt.close(fig)
        tmp.replace(path)
        paths.append(str(path))
    return paths


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="bert-large")
    parser.add_argument("--devices", type=int, nargs="+", default=[16, 32, 64, 128, 256])
    parser.add_argument("--stages", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--time-limit", type=float, default=10.0, help="seconds for the exact solver and MCTS each")
    parser.add_argument("--mcts-iterations", type=int, default=1000)
    parser.add_argument("--learned-iterations", type=int, default=32,
                        help="most MCTS leaves after the discrepancy pass")
    parser.add_argument("--learned-discrepancies", type=int, help="most one-discrepancy leaves (default: one per slot)")
    parser.add_argument("--backtrack-dives", type=int, default=DEFAULT_BACKTRACK_DIVES,
                        help="greedy dives of the learned mapper's backtracking search")
    parser.add_argument("--topology-seeds", type=int, nargs="+", default=[0],
                        help="seeds of the families' topologies (the mapper trained on seeds >= 1000)")
    parser.add_argument("--ratio-seeds", type=int, nargs="*", default=[],
                        help=f"further topology seeds run at {RATIO_DEVICES} devices only: their rows join the "
                             f"{RATIO_DEVICES}-device rows of the gap tables and the time ratio")
    parser.add_argument("--policy", type=Path, help="mapping GNN checkpoint (default: checkpoints/tag-mapper.pt)")
    parser.add_argument("--candidate", type=Path, help="a second checkpoint, compared on the same instances")
    parser.add_argument("--out", type=Path, default=Path("docs/compare_mappers"), help="report path prefix")
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    return parser


def _argument_error(args: argparse.Namespace) -> str | None:
    """What is wrong with the command line's numbers, None when nothing is."""
    if min(args.stages) < 1:
        return f"every depth (--stages) must be at least 1, got {min(args.stages)}"
    bad = [d for d in args.devices if d < 2 or any(s > d for s in args.stages)]
    if bad:
        return f"every device count must be at least 2 and at least every depth ({args.stages}), got {bad[0]}"
    if not (math.isfinite(args.time_limit) and args.time_limit > 0):
        return f"--time-limit must be a positive number of seconds, got {args.time_limit}"
    if args.mcts_iterations < 1:
        return f"--mcts-iterations must be at least 1, got {args.mcts_iterations}"
    for flag, value in (("--learned-iterations", args.learned_iterations),
                        ("--learned-discrepancies", args.learned_discrepancies),
                        ("--backtrack-dives", args.backtrack_dives)):
        if value is not None and value < 0:
            return f"{flag} must be non-negative, got {value}"
    seeds = [s for s in args.topology_seeds + args.ratio_seeds if s < 0]
    if seeds:
        return f"topology seeds must be non-negative, got {seeds[0]}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    problem = _argument_error(args)
    if problem:
        print(f"tag: error: {problem}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)  # one core per mapper, as for the exact solver
    policy = resolve_mapping_policy(args.policy)
    candidate = resolve_mapping_policy(args.candidate) if args.candidate else None
    cells = [(f, d, s, seed) for seed in args.topology_seeds for d in args.devices for f in args.families
             for s in args.stages]
    cells += [(f, RATIO_DEVICES, s, seed) for seed in args.ratio_seeds for f in args.families for s in args.stages]
    console = Console(stderr=True)
    warm_up(args.model, policy, candidate)
    rows = []
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("mapping", total=len(cells))
        for family, devices, stages, seed in cells:
            progress.update(task, description=f"{family}, {devices} devices, S={stages}, seed {seed}")
            rows.append(run_instance(args.model, family, devices, stages, args.time_limit, args.mcts_iterations,
                                     policy, args.learned_iterations, args.learned_discrepancies, seed,
                                     candidate=candidate, backtrack_dives=args.backtrack_dives))
            progress.advance(task)
    summary = summarise(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    held_out = untrained(args.policy)
    atomic_write_text(args.out.with_suffix(".md"), markdown(rows, args, held_out))
    plots = plot(summary, args.out)
    if not args.json:
        mappers = mappers_of(rows)
        table = Table(title="median gap to bound / median time")
        table.add_column("devices", justify="right")
        table.add_column("exact proven", justify="right")
        for mapper in mappers:
            table.add_column(mapper, justify="right")
        for devices, row in summary.items():
            table.add_row(str(devices), f"{row['proven']['count']}/{row['proven']['of']}",
                          *(f"{100 * row[m]['median_gap']:.2f}% / {row[m]['median_time_s']:.3g} s" for m in mappers))
        Console().print(table)
        Console().print("\n\n".join(markdown(rows, args, held_out).split("\n\n")[3:-1]), markup=False)
        Console().print(f"wrote {args.out.with_suffix('.md')}, {', '.join(plots)}")
    print(json.dumps({"model": args.model, "time_limit_s": args.time_limit, "mcts_iterations": args.mcts_iterations,
                      "learned_iterations": args.learned_iterations,
                      "learned_discrepancies": args.learned_discrepancies, "backtrack_dives": args.backtrack_dives,
                      "topology_seeds": args.topology_seeds, "ratio_seeds": args.ratio_seeds,
                      "summary": {str(k): v for k, v in summary.items()},
                      "by_family": by_family(rows), "held_out": held_out, "time_ratio": time_ratio(rows),
                      "instances": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
