"""Executed step time against the simulator's prediction, for placement plans on 2 CPU processes (gloo).

    python scripts/bench_run.py [--steps 6] [--json]

Each plan runs ``--steps`` optimizer steps on a shared pool of 2 processes (one thread each); the measured
figure is the median over the steps after the first of the slowest rank's wall time. The prediction is the
op-level simulation of the same compiled plan for the cluster the plan names (two V100 machines over
10 Gb/s): the simulator is not calibrated to this host (that is `tag profile`'s job), so the ratio says how
far a GPU cost model is from a CPU run, not how good the simulator is. Every run is also checked against the
single-device step. Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from tag.cluster.build import Machine, build_cluster
from tag.compiler.compile import compile_strategy
from tag.execute import WorkerPool, run_strategy, zoo_program
from tag.grouping import group_ops
from tag.strategy import Strategy

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
                rows.append({"model": f"{model}-tiny", "plan": name, "measured_s": result.median_step_s,
                             "simulated_s": float(predicted), "ratio": result.median_step_s / float(predicted),
                             "check_passed": bool(result.check["passed"]),
                             "transfers": result.summary()["transfers"],
                             "collectives": result.summary()["collectives"],
                             "wall_s": time.perf_counter() - start})
    if not args.json:
        print(f"{'model':<16}{'plan':<18}{'measured':>12}{'simulated':>12}{'ratio':>9}{'comm':>10}  check")
        for r in rows:
            print(f"{r['model']:<16}{r['plan']:<18}{r['measured_s'] * 1e3:>10.2f}ms{r['simulated_s'] * 1e3:>10.3f}ms"
                  f"{r['ratio']:>9.0f}{r['transfers'] + r['collectives']:>10d}  {'ok' if r['check_passed'] else 'FAIL'}")
    ratios = [r["ratio"] for r in rows]
    print(json.dumps({"benchmark": "run", "plans": rows, "median_ratio": float(np.median(ratios)),
                      "all_checks_passed": all(r["check_passed"] for r in rows)}))


if __name__ == "__main__":
    main()
