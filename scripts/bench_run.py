"""Executed step time against the simulator's prediction, for placement and pipeline plans on 2 CPU processes.

    python scripts/bench_run.py [--steps 6] [--json]

Each plan runs ``--steps`` optimizer steps on a shared pool of 2 processes (one thread each); the measured
figure is the median over the steps after the first of the slowest rank's wall time. The prediction is the
op-level simulation of the same compiled plan for the cluster the plan names (two V100 machines over
10 Gb/s): the simulator is not calibrated to this host (that is `tag profile`'s job), so the ratio says how
far a GPU cost model is from a CPU run, not how good the simulator is. Every run is also checked against the
single-device step. Pipeline plans are Parmesan's two stages with 4 micro-batches under 1F1B and GPipe,
predicted by the pipeline simulator, each run on tag's micro-batch runtime and on torch.distributed.pipelining;
"order" says whether the ranks ran the schedule's order (on tag's runtime a loss normalised over the whole
batch, cross-entropy's, makes every backward pass wait for every forward pass).
Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from tag.cluster.build import Machine, build_cluster
from tag.compiler.compile import compile_strategy
from tag.exact import plan_pipeline
from tag.execute import WorkerPool, run_pipeline, run_strategy, zoo_program
from tag.grouping import group_ops
from tag.strategy import Strategy, make_pipeline_plan

MODELS = ("gpt2", "candle-uno", "dlrm")
BATCH = 8


def plans(num_groups: int, cluster) -> dict[str, Strategy]:
    """Data parallel (all-reduce and PS), and a two-stage model split (first half of the groups on device 0)."""
    split = np.zeros((num_groups, 2), dtype=int)
    split[: num_groups // 2, 0] = 1
    split[num_groups // 2:, 1] = 1
    return {"dp-allreduce": Strategy.data_parallel(num_groups, cluster),
            "dp-ps": Strategy.data_parallel(num_groups, cluster, option="ps"),
            "two-device split": Strategy.from_cluster(cluster, split, ["duplicate"] * num_groups)}


def pipeline_plans(program, cluster) -> dict:
    """Two stages, one replica each, 4 micro-batches: (plan file record, simulated iteration) per schedule."""
    out = {}
    for schedule in ("1f1b", "gpipe"):
        plan = plan_pipeline(program.graph, cluster, stages=2, replicas=1, micro_batches=4, schedule=schedule)
        sg = plan.stage_graph
        record = make_pipeline_plan(program.graph, cluster, partitioner=plan.partitioner, schedule=schedule,
                                    micro_batches=4, replicas=sg.replicas.tolist(),
                                    reference_gpu=sg.gpu_types[sg.reference_type].name,
                                    forward_assignment=sg.forward_assignment, mapping=plan.mapping)
        out[f"{schedule} 2x1 M4"] = (record, plan.iteration_time)
    return out


def row(model: str, name: str, result, predicted: float, start: float) -> dict:
    summary = result.summary()
    return {"model": f"{model}-tiny", "plan": name, "measured_s": result.median_step_s,
            "simulated_s": float(predicted), "ratio": result.median_step_s / float(predicted),
            "check_passed": bool(result.check["passed"]), "transfers": summary["transfers"],
            "collectives": summary["collectives"],
            "schedule_followed": None if result.schedule is None else result.schedule["followed"],
            "wall_s": time.perf_counter() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    args = parser.parse_args()
    cluster = build_cluster("2xV100", [Machine("v100-16gb", 1)] * 2, network_bandwidth=10e9 / 8)
    rows = []
    with WorkerPool(2) as pool:
        for model in MODELS:
            program = zoo_program(model, tiny=True, batch_size=BATCH)
            gg = group_ops(program.graph, num_groups=8, gpus=cluster)
            for name, strategy in plans(gg.num_groups, cluster).items():
                predicted = compile_strategy(gg, strategy, cluster, granularity="op").simulate().iteration_time
                start = time.perf_counter()
                result = run_strategy(program, gg, strategy, cluster, steps=args.steps, check=True, pool=pool)
                rows.append(row(model, name, result, predicted, start))
            for name, (record, predicted) in pipeline_plans(program, cluster).items():
                for runtime in ("tag", "torch"):
                    start = time.perf_counter()
                    result = run_pipeline(program, record, cluster, steps=args.steps, check=True, pool=pool,
                                          runtime=runtime)
                    rows.append(row(model, f"{name} {runtime}", result, predicted, start))
    if not args.json:
        print(f"{'model':<16}{'plan':<24}{'measured':>12}{'simulated':>12}{'ratio':>9}{'comm':>7}  check  order")
        for r in rows:
            order = {None: "-", True: "plan", False: "gpipe"}[r["schedule_followed"]]
            print(f"{r['model']:<16}{r['plan']:<24}{r['measured_s'] * 1e3:>10.2f}ms{r['simulated_s'] * 1e3:>10.3f}ms"
                  f"{r['ratio']:>9.0f}{r['transfers'] + r['collectives']:>7d}  "
                  f"{'ok' if r['check_passed'] else 'FAIL':<5}"
                  f"  {order}")
    ratios = [r["ratio"] for r in rows]
    print(json.dumps({"benchmark": "run", "plans": rows, "median_ratio": float(np.median(ratios)),
                      "all_checks_passed": all(r["check_passed"] for r in rows)}))


if __name__ == "__main__":
    main()
