"""One planner over every family: each family's best plan, the chosen one, its distance to the compute bound.

    python scripts/bench_families.py                       # the TAG models on tag-testbed, tag-cloud, dgx1x4
    python scripts/bench_families.py --cells resnet101-pd:v100-4x4 bert-large:tag-cloud --time 60
    python scripts/bench_families.py --pipedream-cases     # resnet101: DP as a pipeline, S=R=4 cuts
    python scripts/bench_families.py --memory-cases        # DP as a pipeline: time and peak memory

A cell is MODEL:CLUSTER; MODEL is a zoo name or ``resnet101-pd`` (PipeDream's resnet101 profile at batch
1024, ``../shared/data/pipedream-profiles``), ``resnet101-pd64`` (the same at batch 64); CLUSTER is a
preset or ``v100-4x4`` / ``v100-16x1`` (``examples/``). Per cell :func:`tag.planners.plan_fastest` with
``--time`` seconds of budget (the placement search, with the shipped GNN policy, takes what the other
families leave) prints each family's best simulated iteration, the chosen plan, its ratio to the compute
bound and the wall time of the whole call. Single process; prints a table and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from tag.cluster import resolve_cluster
from tag.graph.pipedream import load_pipedream
from tag.graph.resolve import resolve_model
from tag.planner import TAG_MODELS, PlanConfig, load_priors
from tag.planners import FAMILIES, plan_fastest

ROOT = Path(__file__).resolve().parents[1]
PROFILES = ROOT.parent / "shared" / "data" / "pipedream-profiles"
CLUSTERS = ("tag-testbed", "tag-cloud", "dgx1x4")
EXAMPLES = {"v100-4x4": ROOT / "examples" / "v100-4x4.yaml", "v100-16x1": ROOT / "examples" / "v100-16x1.yaml"}
PIPEDREAM = {"resnet101-pd": 1024, "resnet101-pd64": 64}  # PipeDream's resnet101 profile at these batches


def model_of(name: str):
    if name in PIPEDREAM:
        return load_pipedream(PROFILES / "resnet101.graph.txt").with_batch_size(PIPEDREAM[name])
    return resolve_model(name)


def run_cell(model: str, cluster_name: str, seconds: float, priors) -> dict:
    graph = model_of(model)
    cluster = resolve_cluster(str(EXAMPLES.get(cluster_name, cluster_name)))
    start = time.perf_counter()
    found = plan_fastest(graph, cluster, time_limit_s=seconds, priors=priors, config=PlanConfig())
    wall = time.perf_counter() - start
    return {"model": model, "cluster": cluster_name, "wall_s": wall, "bound_s": found.compute_bound_s,
            "chosen": found.best.family, "planner": found.best.planner, "shape": found.best.shape,
            "iteration_time_s": found.iteration_time_s, "bound_ratio": found.bound_ratio,
            "families": {f: {"planner": c.planner, "iteration_time_s": c.iteration_time_s if c.ok else None,
                             "feasible": c.feasible, "shape": c.shape, "planning_time_s": c.planning_time_s}
                         for f, c in found.families.items()}}


def table(rows: list[dict]) -> Table:
    out = Table(title="Each family's best (ms per iteration), the chosen plan and its ratio to the compute bound")
    for column in ("model", "cluster", *FAMILIES, "chosen", "x bound", "wall"):
        out.add_column(column, justify="left" if column in ("model", "cluster", "chosen") else "right")
    for row in rows:
        cells = []
        for family in FAMILIES:
            best = row["families"].get(family)
            time_s = None if best is None else best["iteration_time_s"]
            cells.append("-" if time_s is None else f"{time_s * 1e3:.1f}" + ("" if best["feasible"] else " OOM"))
        out.add_row(row["model"], row["cluster"], *cells, f"{row['chosen']} ({row['shape']})",
                    f"{row['bound_ratio']:.2f}", f"{row['wall_s']:.0f} s")
    return out


def pipedream_cases() -> list[dict]:
    """resnet101 (PipeDream's profile, batch 1024) on v100-4x4: the pure data-parallel plan as a 1-stage
    pipeline against DP-NCCL, and each partitioner at S = R = 4, M = 32 on PipeDream's mapping (stage s
    on GPU s of every machine) against the compute-balanced cut PipeDream's optimizer makes."""
    from tag.baselines import dp_nccl
    from tag.exact import plan_pipeline, simulate_pipeline
    from tag.exact.partition import partition_pipedream
    from tag.exact.stage_graph import ForwardGraph, build_stage_graph
    from tag.grouping import group_ops

    graph, cluster = model_of("resnet101-pd"), resolve_cluster(str(EXAMPLES["v100-4x4"]))
    fg = ForwardGraph.from_graph(graph, cluster.types)
    sg = build_stage_graph(fg, [0] * fg.num_nodes, replicas=16, micro_batches=1)
    rows = [{"case": "1 stage x 16 (pipeline simulator)", "iteration_time_s": simulate_pipeline(
        sg, cluster, [list(range(16))])[1].iteration_time},
            {"case": "DP-NCCL baseline", "iteration_time_s": dp_nccl(group_ops(graph, gpus=cluster), cluster).iteration_time_s}]
    mapping = [[s + 4 * i for i in range(4)] for s in range(4)]
    balanced = partition_pipedream(fg, stages=4, replicas=4, micro_batches=32, bandwidth=float("inf"))
    sg = build_stage_graph(fg, balanced.forward_stage, replicas=4, micro_batches=32)
    rows.append({"case": "S=R=4, M=32: compute-balanced cut (PipeDream's)",
                 "iteration_time_s": simulate_pipeline(sg, cluster, mapping)[1].iteration_time})
    for partitioner in ("pipedream", "parmesan"):
        plan = plan_pipeline(graph, cluster, stages=4, replicas=4, micro_batches=32, partitioner=partitioner)
        rows.append({"case": f"S=R=4, M=32: tag {partitioner} ({plan.info.get('placement')})",
                     "iteration_time_s": plan.iteration_time})
    return rows


def memory_cases() -> list[dict]:
    """The pure data-parallel plan (1 stage x 16) in the pipeline simulator against the DP-NCCL baseline
    on v100-4x4: time and the largest device's peak memory in each."""
    from tag.baselines import dp_nccl
    from tag.exact import simulate_pipeline
    from tag.exact.stage_graph import ForwardGraph, build_stage_graph
    from tag.grouping import group_ops

    cluster = resolve_cluster(str(EXAMPLES["v100-4x4"]))
    rows = []
    for name, batch in (("inception-v3", 2048), ("resnet101", 256), ("resnet50-pd", 256)):
        graph = load_pipedream(PROFILES / "resnet50.graph.txt").with_batch_size(batch) if name == "resnet50-pd" \
            else resolve_model(name, batch_size=batch)
        fg = ForwardGraph.from_graph(graph, cluster.types)
        sg = build_stage_graph(fg, [0] * fg.num_nodes, replicas=cluster.num_devices, micro_batches=1)
        _, pipe = simulate_pipeline(sg, cluster, [list(range(cluster.num_devices))])
        dp = dp_nccl(group_ops(graph, gpus=cluster), cluster)
        rows.append({"model": name, "batch_size": batch, "pipeline_s": pipe.iteration_time,
                     "pipeline_peak_bytes": float(pipe.peak_memory.max()), "dp_nccl_s": dp.iteration_time_s,
                     "dp_nccl_peak_bytes": float(dp.peak_memory.max())})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", nargs="+", metavar="MODEL:CLUSTER",
                        help="cells to plan (default: the six TAG models on tag-testbed, tag-cloud and dgx1x4)")
    parser.add_argument("--time", type=float, default=60.0, help="budget per cell in seconds (default 60)")
    parser.add_argument("--uniform", action="store_true", help="uniform priors for the placement search")
    parser.add_argument("--pipedream-cases", action="store_true",
                        help="only the resnet101 cases of PipeDream's profile (DP as a pipeline, S=R=4 cuts)")
    parser.add_argument("--memory-cases", action="store_true",
                        help="only the pure data-parallel plan's time and peak memory in both simulator paths")
    args = parser.parse_args()
    if args.memory_cases:
        rows = memory_cases()
        for row in rows:
            print(f"{row['model']:<13} batch {row['batch_size']:>5}: pipeline {row['pipeline_s'] * 1e3:.1f} ms, "
                  f"{row['pipeline_peak_bytes'] / 2**30:.2f} GiB; DP-NCCL {row['dp_nccl_s'] * 1e3:.1f} ms, "
                  f"{row['dp_nccl_peak_bytes'] / 2**30:.2f} GiB")
        print(json.dumps({"bench": "families-memory", "rows": rows}))
        return
    if args.pipedream_cases:
        rows = pipedream_cases()
        for row in rows:
            print(f"{row['case']:<55} {row['iteration_time_s'] * 1e3:8.1f} ms")
        print(json.dumps({"bench": "families-pipedream", "rows": rows}))
        return
    cells = [tuple(c.split(":", 1)) for c in args.cells] if args.cells else \
        [(m, c) for m in TAG_MODELS for c in CLUSTERS]
    priors = load_priors(None if args.uniform else str(ROOT / "checkpoints" / "tag-policy.pt"))
    rows = []
    for model, cluster in cells:  # one line per cell as it finishes, so a long run shows its progress
        rows.append(run_cell(model, cluster, args.time, priors))
        row = rows[-1]
        print(f"{model} on {cluster}: {row['chosen']} {row['iteration_time_s'] * 1e3:.1f} ms, "
              f"{row['bound_ratio']:.2f}x the bound, {row['wall_s']:.0f} s", flush=True)
    Console(width=160).print(table(rows))
    print(json.dumps({"bench": "families", "time_s": args.time, "rows": rows}))


if __name__ == "__main__":
    main()
