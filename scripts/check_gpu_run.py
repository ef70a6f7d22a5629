"""Run plans on this host's GPUs (NCCL, one GPU per rank) and hold each against the single-device CPU step.

    python scripts/check_gpu_run.py [--backend nccl|gloo] [--models gpt2,candle-uno] [--json]

For every model: data parallelism over as many ranks as the host has GPUs (one rank on a one-GPU host),
and a pipeline of those ranks run on ``torch.distributed.pipelining``. Each runs 2 optimizer steps with
``--check`` (≤ 1e-5 relative; TF32 is switched off so the GPU's fp32 matmuls are fp32). Prints a table,
then one JSON line. ``--backend gloo`` runs the same on the CPU (where no GPU is at hand).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from tag.cluster.build import Machine, build_cluster
from tag.exact.stage_graph import ForwardGraph
from tag.execute import run_pipeline, run_strategy, zoo_program
from tag.grouping import GroupGraph
from tag.strategy import Strategy, make_pipeline_plan


def placement(program, cluster, backend: str):
    graph = program.graph
    group_graph = GroupGraph.from_assignment(graph, np.zeros(graph.num_ops, dtype=np.int64), gpus=cluster.types)
    return run_strategy(program, group_graph, Strategy.data_parallel(1, cluster), cluster, steps=2, check=True,
                        backend=backend)


def pipeline(program, cluster, backend: str):
    """Stages cut by forward-op count, one replica each, 2 micro-batches per rank."""
    ranks = cluster.num_devices
    forward = ForwardGraph.from_graph(program.graph, cluster.types)
    assignment = np.minimum(np.arange(forward.num_nodes) * ranks // forward.num_nodes, ranks - 1)
    record = make_pipeline_plan(program.graph, cluster, partitioner="parmesan", schedule="1f1b", micro_batches=2,
                                replicas=[1] * ranks, reference_gpu=cluster.types[0].name,
                                forward_assignment=assignment, mapping=[[d] for d in range(ranks)])
    return run_pipeline(program, record, cluster, steps=2, check=True, backend=backend, runtime="torch")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    parser.add_argument("--models", default="gpt2,candle-uno")
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    ranks = max(1, torch.cuda.device_count()) if args.backend == "nccl" else 2
    cluster = build_cluster("this-host", [Machine("v100-16gb", 1)] * ranks, network_bandwidth=1e9)
    rows = []
    for model in args.models.split(","):
        program = zoo_program(model, tiny=True, batch_size=8)
        for kind, run in (("data parallel", placement), ("pipeline (torch)", pipeline)):
            if kind == "data parallel" and ranks > 1:
                continue  # one group on every rank: the single-GPU placement check needs one rank
            start = time.perf_counter()
            result = run(program, cluster, args.backend)
            check = result.check
            rows.append({"model": f"{model}-tiny", "plan": kind, "ranks": ranks, "backend": args.backend,
                         "median_step_s": result.median_step_s, "passed": bool(check["passed"]),
                         "grads_rel": check["grads"]["rel"], "params_rel": check["params"]["rel"],
                         "wall_s": time.perf_counter() - start})
    if not args.json:
        print(f"{'model':<16}{'plan':<18}{'ranks':>6}{'step':>12}{'grads rel':>11}{'params rel':>11}  check")
        for r in rows:
            print(f"{r['model']:<16}{r['plan']:<18}{r['ranks']:>6}{r['median_step_s'] * 1e3:>10.2f}ms"
                  f"{r['grads_rel']:>11.1e}{r['params_rel']:>11.1e}  {'ok' if r['passed'] else 'FAIL'}")
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    print(json.dumps({"benchmark": "gpu_run", "device": device, "torch": torch.__version__, "rows": rows,
                      "all_passed": all(r["passed"] for r in rows)}))


if __name__ == "__main__":
    main()
