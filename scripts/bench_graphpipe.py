"""Graph pipelines against sequential pipelines (GraphPipe Fig. 6 / Table 1, Fig. 7 left).

    python scripts/bench_graphpipe.py                              # MMT, DLRM, CANDLE-Uno on 4..32 GPUs
    python scripts/bench_graphpipe.py --models candle-uno --devices 4 8 --branches 4 8 16

Cluster: Summit-like nodes of 4 V100-16GB (NVLink, 50 GB/s), 100 Gbps between nodes (GraphPipe §7).
Mini-batch: ``--batch-per-device`` × D samples (GraphPipe App. A.2 scales MMT the same way).
For each (model, D): GraphPipe's planner (:func:`tag.graphpipe.plan_graph_pipeline`) against the best
sequential pipeline (SPP, GraphPipe §2) of :func:`tag.exact.plan_pipeline` with the PipeDream-style
linear DP and with Parmesan's DP (``--sequential``), run as sequential pipelines do (``links="chain"``:
stage s sends to s + 1 only, passing other activations through), each scored by the same simulator;
throughput = batch / simulated iteration time; search = planning wall time. For reference, the
Parmesan plan with direct stage edges (``links="data"``: a stage DAG, though cut as a chain) is its
own column. The graph planner also simulates the sequential plans (PipeDream-style, Parmesan and RaNNC,
with chain and with data stage edges) as they are and their stages as graphs; the kind column says
which won: a graph of stages from GraphPipe's DP ("graphpipe"), a sequential plan as it is
("<partitioner>:<links>") or its stages run as a graph ("<partitioner>:<links>-graph"). The branch sweep traces CANDLE-Uno with k
branches on k GPUs (GraphPipe Fig. 7 left: 4, 8, 16 GPUs), or on ``--branch-devices`` GPUs.
Single process. Prints tables and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time

from rich.console import Console
from rich.table import Table

from tag.cluster.build import Machine, build_cluster
from tag.exact import plan_pipeline
from tag.graph.resolve import resolve_model
from tag.graphpipe import plan_graph_pipeline

_GB = 1e9


def summit(num_devices: int):
    nodes = max(1, num_devices // 4)
    return build_cluster(f"summit-{num_devices}", [Machine("v100-16gb", min(4, num_devices), 50 * _GB)] * nodes,
                         network_bandwidth=100 * _GB / 8)


def run_one(graph, cluster, sequential: list[str], dag_baseline: bool = True) -> dict:
    batch = graph.batch_size
    row = {}
    start = time.perf_counter()
    plan = plan_graph_pipeline(graph, cluster)
    row["graphpipe"] = {"throughput": batch / plan.iteration_time, "search_s": time.perf_counter() - start,
                        "stages": plan.num_stages, "depth": plan.depth, "micro_batches": plan.stage_graph.micro_batches,
                        "feasible": bool(plan.result.feasible), "chosen": plan.info["chosen"]}
    baselines = [(name, name, "chain") for name in sequential]
    if dag_baseline:
        baselines.append(("parmesan-dag", "parmesan", "data"))
    for name, partitioner, links in baselines:
        start = time.perf_counter()
        try:
            seq = plan_pipeline(graph, cluster, partitioner=partitioner, auto=True, links=links)
        except Exception as error:  # a baseline that finds nothing is reported, not fatal
            row[name] = {"throughput": 0.0, "search_s": time.perf_counter() - start, "error": str(error)[:80]}
            continue
        row[name] = {"throughput": batch / seq.iteration_time, "search_s": time.perf_counter() - start,
                     "stages": seq.num_stages, "depth": seq.num_stages, "micro_batches": seq.stage_graph.micro_batches,
                     "feasible": bool(seq.result.feasible), "links": links}
    best_seq = max((row[n]["throughput"] for n in sequential), default=0.0)
    row["speedup"] = row["graphpipe"]["throughput"] / best_seq if best_seq else float("inf")
    if row.get("parmesan-dag", {}).get("throughput"):
        row["speedup_vs_parmesan_dag"] = row["graphpipe"]["throughput"] / row["parmesan-dag"]["throughput"]
    return row


def uno_graph(branches: int, batch: int):
    from tag.graph.tracer import trace
    from tag.models.multibranch import CandleUno, UnoConfig
    from tag.models.zoo import _uno_inputs
    from tag.models.losses import regression_loss
    import torch

    config = UnoConfig(num_branches=branches)
    with torch.device("meta"):
        model = CandleUno(config)
    inputs = _uno_inputs(config, batch, torch.device("meta"), None)
    return trace(model, inputs, regression_loss, name=f"candle-uno-{branches}b")


def table(title: str, rows: list[dict], key: str, sequential: list[str]) -> Table:
    out = Table(title=title)
    out.add_column(key)
    out.add_column("GraphPipe samples/s")
    for name in sequential:
        out.add_column(f"{name} SPP samples/s")
    extra = [n for n in ("parmesan-dag",) if n in rows[0]] if rows else []
    for name in extra:
        out.add_column("parmesan, DAG edges")
    out.add_column("speed-up over best SPP")
    out.add_column("GraphPipe S/depth/M (kind)")
    out.add_column("search s (GP / " + " / ".join(sequential) + ")")
    for r in rows:
        gp = r["graphpipe"]
        out.add_row(str(r[key]), f"{gp['throughput']:.1f}", *[f"{r[n]['throughput']:.1f}" for n in sequential],
                    *[f"{r[n]['throughput']:.1f}" for n in extra],
                    f"{r['speedup']:.3f}", f"{gp['stages']}/{gp['depth']}/{gp['micro_batches']} ({gp['chosen']})",
                    " / ".join(f"{r[n]['search_s']:.2f}" for n in ["graphpipe", *sequential]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mmt", "dlrm", "candle-uno"])
    parser.add_argument("--devices", type=int, nargs="+", default=[4, 8, 16, 32])
    parser.add_argument("--sequential", nargs="+", default=["pipedream", "parmesan"])
    parser.add_argument("--batch-per-device", type=int, default=16)
    parser.add_argument("--branches", type=int, nargs="*", default=[4, 8, 16])
    parser.add_argument("--branch-devices", type=int, default=None,
                        help="GPUs of the branch sweep (default: as many as branches, GraphPipe Fig. 7)")
    parser.add_argument("--no-dag-baseline", action="store_true",
                        help="leave out the Parmesan plan with direct stage edges")
    args = parser.parse_args()
    console = Console()
    rows = []
    for model in args.models:
        base = resolve_model(model)
        for d in args.devices:
            graph = base.with_batch_size(args.batch_per_device * d)
            row = {"model": model, "devices": d, "batch": graph.batch_size,
                   **run_one(graph, summit(d), args.sequential, not args.no_dag_baseline)}
            rows.append(row)
            console.print(f"{model} D={d}: speed-up {row['speedup']:.3f}")
    for model in args.models:
        console.print(table(f"{model}: throughput (Fig. 6) and search time (Table 1)",
                            [r for r in rows if r["model"] == model], "devices", args.sequential))
    sweep = []
    for k in args.branches:
        d = args.branch_devices or k
        graph = uno_graph(k, args.batch_per_device * d)
        row = {"branches": k, "devices": d, **run_one(graph, summit(d), args.sequential, not args.no_dag_baseline)}
        sweep.append(row)
        console.print(f"candle-uno {k} branches: speed-up {row['speedup']:.3f}")
    if sweep:
        where = f"{args.branch_devices} GPUs" if args.branch_devices else "k GPUs for k branches"
        console.print(table(f"CANDLE-Uno on {where} vs branches (Fig. 7 left)", sweep, "branches", args.sequential))
    print(json.dumps({"results": rows, "branch_sweep": sweep,
                      "never_worse": all(r["speedup"] >= 1.0 for r in rows + sweep)}))


if __name__ == "__main__":
    main()
