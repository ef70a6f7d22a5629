"""TAG Table 5: per-iteration time with and without sufficient factor broadcasting (SFB).

    python scripts/sfb_table.py                          # the six models of Table 5, 10 Gbps
    python scripts/sfb_table.py --network 100Gbps --models vgg19 transformer
    python scripts/sfb_table.py --json                   # only the JSON line

TAG §5.6: two machines with one GTX 1080Ti each, batch 4 (2 per replica). For each model:

- **DP-NCCL**: data parallelism with a ring all-reduce per bundle of gradients, compiled and simulated;
- **tag**: the placement of :func:`tag.planner.plan_training` (MCTS, ``--budget`` iterations, uniform
  priors) without its SFB and fusion passes;
- each **with SFB** twice: the *estimate* of :class:`tag.sfb.SFBPlan` (time without SFB minus the plan's
  serialised saving; the program's model, which ignores overlap and queueing) and a *simulation* of the
  plan written into the graph (:meth:`SFBPlan.rewritten_group_graph`, compiled with the same strategy by
  the present compiler: a prototype of the compiler integration, not the integration itself). As TAG
  scores every strategy with its simulator, the simulated column keeps SFB only in the groups where the
  simulator finds it helps (whole plan first; then each group toggled once, least estimated saving
  first); the JSON also holds the whole plan's simulated time. The broadcasts are small transfers in both
  directions that queue FIFO behind the placement's other transfers, which the estimate cannot see.

Graphs are the prebuilt zoo graphs rescaled to the batch (:meth:`OpGraph.with_batch_size`); ``--retrace``
traces them at the batch instead (slower, needs torch). The paper does not give the network of this
experiment; its DP-NCCL times imply that communication dominates, so the default is 10 Gbps. At the TAG
testbed's 100 Gbps these two-GPU runs are compute-bound and SFB has little to remove.

Prints a table and ends with one JSON line of its figures.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from tag.cluster.build import Machine, build_cluster
from tag.compiler import compile_strategy
from tag.graph.io import load_graph
from tag.graph.resolve import prebuilt_path, resolve_model
from tag.grouping import DEFAULT_NUM_GROUPS
from tag.planner import TAG_MODELS, PlanConfig, plan_training
from tag.sfb import SFBCache, select_sfb
from tag.strategy import OPTIONS, Strategy
from tag.units import parse_bandwidth



def simulate(group_graph, strategy, cluster) -> float:
    """Simulated seconds per iteration; inf when the plan does not fit in memory."""
    result = compile_strategy(group_graph, strategy, cluster).simulate(feedback=False)
    return result.iteration_time if result.feasible else float("inf")


def with_sfb(group_graph, strategy, cluster, base_time: float, cache: SFBCache) -> dict:
    """SFB on ``strategy``: the estimate, the simulation of the whole plan, and of the plan kept only in the
    groups where the simulator finds it helps (:func:`tag.sfb.select_sfb`)."""
    selection = select_sfb(group_graph, strategy, cluster, cache=cache, time_without_s=base_time)
    report = selection.proposed
    return {"estimate_s": base_time - report.estimated_time_saved_s, "simulated_whole_plan_s": selection.time_all_s,
            "simulated_s": selection.time_s, "groups_with_sfb": len(report.groups),
            "groups_kept": len(selection.plan.groups), "gradients": report.gradients, "applied": report.applied,
            "applied_kept": int(selection.plan.sync_free_ops.size), "ops_duplicated": report.ops_duplicated,
            "allreduce_bytes_removed": report.allreduce_bytes_removed,
            "broadcast_bytes_added": report.broadcast_bytes_added, "statuses": report.statuses,
            "solve_time_s": report.solve_time_s, "top_kinds": report.duplicated_kinds[:5]}


def run_model(name: str, cluster, args, cache: SFBCache) -> dict:
    started = time.perf_counter()
    if args.retrace:
        graph = resolve_model(name, batch_size=args.batch)
    else:
        graph = load_graph(prebuilt_path(name)).with_batch_size(args.batch)
    outcome = plan_training(graph, cluster, config=PlanConfig(num_groups=args.groups, max_iterations=args.budget,
                                                              sfb=False, fusion=False))
    group_graph = outcome.group_graph
    dp = Strategy.data_parallel(group_graph.num_groups, cluster)
    dp_time = simulate(group_graph, dp, cluster)
    tag_strategy, tag_time = outcome.strategy, outcome.iteration_time_s
    options = dict(zip(*np.unique([OPTIONS[o] for o in tag_strategy.option], return_counts=True)))
    return {"model": name, "ops": graph.num_ops, "groups": group_graph.num_groups,
            "dp_nccl_s": dp_time, "dp_sfb": with_sfb(group_graph, dp, cluster, dp_time, cache),
            "tag_s": tag_time, "tag_sfb": with_sfb(group_graph, tag_strategy, cluster, tag_time, cache),
            "tag_options": {k: int(v) for k, v in options.items()}, "tag_simulations": outcome.search.num_simulations,
            "seconds": time.perf_counter() - started}


def speedup(before: float, after: float) -> str:
    return f"{(before / after - 1) * 100:+.1f}%" if after > 0 and np.isfinite(after) else "-"


def print_table(rows: list[dict], network: str) -> None:
    header = ("model", "DP-NCCL", "+SFB est.", "+SFB sim.", "speed-up", "tag", "+SFB est.", "+SFB sim.", "speed-up",
              "SFB grads DP", "SFB grads tag")
    lines = [header]
    for r in rows:
        dp, tag = r["dp_sfb"], r["tag_sfb"]
        lines.append((r["model"], f"{r['dp_nccl_s']:.4f}", f"{dp['estimate_s']:.4f}", f"{dp['simulated_s']:.4f}",
                      speedup(r["dp_nccl_s"], dp["simulated_s"]), f"{r['tag_s']:.4f}", f"{tag['estimate_s']:.4f}",
                      f"{tag['simulated_s']:.4f}", speedup(r["tag_s"], tag["simulated_s"]),
                      f"{dp['applied_kept']}/{dp['gradients']}", f"{tag['applied_kept']}/{tag['gradients']}"))
    widths = [max(len(line[k]) for line in lines) for k in range(len(header))]
    print(f"Per-iteration time (s), 2 machines x 1 GTX 1080Ti, {network}, batch {rows[0]['batch'] if rows else '?'}")
    for k, line in enumerate(lines):
        print("  ".join(cell.rjust(w) if j else cell.ljust(w) for j, (cell, w) in enumerate(zip(line, widths))))
        if k == 0:
            print("  ".join("-" * w for w in widths))
    print("est. = the SFB estimate (time without SFB minus the SFBPlan's serialised saving), NOT a simulation;")
    print("sim. = the SFB plan written into the graph and simulated (prototype of the compiler integration),")
    print("       kept only in the groups where the simulator finds it helps (JSON: whole plan too);")
    print("speed-up = without / with SFB (sim.) - 1, as in TAG Table 5; tag = the MCTS placement of tag plan.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(TAG_MODELS))
    parser.add_argument("--network", default="10Gbps", help="bandwidth between the two machines (default 10Gbps)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--groups", type=int, default=DEFAULT_NUM_GROUPS, help="op groups (METIS)")
    parser.add_argument("--budget", type=int, default=200, help="MCTS iterations of the tag placement")
    parser.add_argument("--retrace", action="store_true", help="trace at --batch instead of rescaling")
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    args = parser.parse_args()
    bandwidth = parse_bandwidth(args.network, what="--network")
    cluster = build_cluster("2x1080ti", [Machine("1080ti", 1), Machine("1080ti", 1)], network_bandwidth=bandwidth)
    cache = SFBCache()
    rows = []
    for name in args.models:
        row = run_model(name, cluster, args, cache)
        row["batch"] = args.batch
        rows.append(row)
    if not args.json:
        print_table(rows, args.network)
    print(json.dumps({"table": "tag-table5-sfb", "cluster": cluster.name, "network_bandwidth": bandwidth,
                      "batch": args.batch, "with_sfb_estimate_is_not_a_simulation": True, "rows": rows}))


if __name__ == "__main__":
    main()
