"""The simulator held against executed steps: plans for `local:2`, simulated with this host's profile, run.

    python scripts/check_fidelity.py [--models gpt2,candle-uno] [--steps 6] [--profile host.json] [--json]

For each tiny zoo model (batch 8) the host is profiled first (every op at 2, 4 and 8 rows with one torch
thread, and gloo between two processes; or read from ``--profile``), then plans for ``local:2`` with that
profile's communication curve are made: one device, data parallel with all-reduce and with a parameter
server, a two-device split of the op groups, `tag plan`'s searched plan (no SFB, no fusion: what `tag run`
executes), and two-stage pipelines under 1F1B and GPipe with 4 micro-batches. Each plan is simulated at op
granularity with the profile's op times (:class:`tag.cost.ProfiledCostModel`) and run for ``--steps``
steps on two processes (`tag run`'s executor); measured = the median over the steps after the first of
the slowest rank. Prints a table, then one JSON line with the median and largest relative error.

The profile includes what `tag run`'s executor adds to every op (:mod:`tag.profile.executor`), so the
simulation charges it. Where the simulator misses, the table says where: the miss of a plan with
communication is spread over its transfers and collectives, that of a plan without over its busiest
rank's ops.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

import numpy as np
import torch

from tag.cluster.presets import local_cluster
from tag.compiler.compile import compile_strategy
from tag.cost import ProfiledCostModel
from tag.exact import plan_pipeline
from tag.execute import WorkerPool, run_pipeline, run_strategy, zoo_program
from tag.graph.opgraph import ROLE_INPUT, ROLE_OPTIMIZER
from tag.grouping import group_ops
from tag.planner import PlanConfig, plan_training
from tag.profile.comm import measure_comm
from tag.profile.data import DeviceProfile, Profile, load_profile, save_profile
from tag.profile.executor import executor_overhead
from tag.profile.ops import profile_program, single_thread
from tag.sim import TASK_COMPUTE
from tag.strategy import Strategy, make_pipeline_plan

BATCH = 8
GROUPS = 8


def host_profile(models: list[str], path: str | None) -> Profile:
    """The host's profile of the tiny models at batch 8: read from ``path`` where it covers them, else measured."""
    if path is not None and os.path.exists(path):
        return load_profile(path)
    times = {}
    with single_thread():
        for model in models:
            program = zoo_program(model, tiny=True, batch_size=BATCH)
            bare = profile_program(program, device=torch.device("cpu"))
            times[program.name] = dataclasses.replace(bare, executor_overhead_s=executor_overhead(program, bare))
    profile = Profile({"cpu": DeviceProfile("cpu", "this host", "cpu", "fp32", 1, "", {"repeats": 5},
                                            times, measure_comm())})
    if path is not None:
        save_profile(profile, path)
    return profile


def placement_plans(graph, cluster, cost) -> dict:
    """name -> (group graph, strategy) of the placement plans."""
    gg = group_ops(graph, num_groups=GROUPS, gpus=cluster, cost=cost)
    g = gg.num_groups
    one, split = np.zeros((g, 2), dtype=int), np.zeros((g, 2), dtype=int)
    one[:, 0] = 1
    split[: g // 2, 0], split[g // 2:, 1] = 1, 1
    plans = {"one device": (gg, Strategy.from_cluster(cluster, one, ["duplicate"] * g)),
             "dp all-reduce": (gg, Strategy.data_parallel(g, cluster)),
             "dp ps": (gg, Strategy.data_parallel(g, cluster, option="ps")),
             "two-device split": (gg, Strategy.from_cluster(cluster, split, ["duplicate"] * g))}
    config = PlanConfig(num_groups=GROUPS, max_iterations=60, sfb=False, fusion=False)
    outcome = plan_training(graph, cluster, config=config, cost=cost)
    plans["tag plan"] = (outcome.group_graph, outcome.strategy)
    return plans


def pipeline_plans(graph, cluster, cost) -> dict:
    """name -> (plan file record, simulated seconds, task graph) of two-stage pipelines."""
    out = {}
    for schedule in ("1f1b", "gpipe"):
        plan = plan_pipeline(graph, cluster, stages=2, replicas=1, micro_batches=4, schedule=schedule, cost=cost)
        sg = plan.stage_graph
        record = make_pipeline_plan(graph, cluster, partitioner=plan.partitioner, schedule=schedule,
                                    micro_batches=4, replicas=sg.replicas.tolist(),
                                    reference_gpu=sg.gpu_types[sg.reference_type].name,
                                    forward_assignment=sg.forward_assignment, mapping=plan.mapping)
        out[f"pipeline {schedule} 2x1 M4"] = (record, plan.iteration_time, plan.taskgraph,
                                              _pipeline_ops(graph, sg, plan.mapping))
    return out


def _pipeline_ops(graph, sg, mapping) -> int:
    """Op calls on the busiest device of a pipeline: each stage's forward and backward ops once per
    micro-batch, its optimizer ops once (the stage tasks of its task graph are coarser than ops)."""
    per_device: dict[int, int] = {}
    optimizer = graph.role == ROLE_OPTIMIZER
    for stage, devices in enumerate(mapping):
        ops = (sg.assignment == stage) & (graph.role != ROLE_INPUT)
        calls = int((ops & ~optimizer).sum()) * sg.micro_batches + int((ops & optimizer).sum())
        for device in devices:
            per_device[device] = per_device.get(device, 0) + calls
    return max(per_device.values())


def shape(taskgraph) -> dict:
    """Compute tasks on the busiest device and communication tasks of a simulated plan."""
    compute = taskgraph.kind == TASK_COMPUTE
    per_device = np.bincount(taskgraph.device[compute], minlength=2)
    return {"ops_busiest": int(per_device.max()), "comm_tasks": int((~compute).sum())}


def run_model(model: str, profile: Profile, cluster, pool: WorkerPool, steps: int) -> list[dict]:
    cost = ProfiledCostModel(profile=profile)
    program = zoo_program(model, tiny=True, batch_size=BATCH)
    graph = program.graph
    if not cost.covers(graph, "cpu"):
        raise SystemExit(f"the profile does not cover {program.name} at this structure; profile it again")
    rows = []
    for name, (gg, strategy) in placement_plans(graph, cluster, cost).items():
        compiled = compile_strategy(gg, strategy, cluster, granularity="op", cost=cost)
        simulated = compiled.simulate(feedback=False).iteration_time
        result = run_strategy(program, gg, strategy, cluster, steps=steps, pool=pool)
        rows.append({"model": program.name, "plan": name, "simulated_s": simulated,
                     "measured_s": result.median_step_s, **shape(compiled.taskgraph)})
    for name, (record, simulated, taskgraph, calls) in pipeline_plans(graph, cluster, cost).items():
        result = run_pipeline(program, record, cluster, steps=steps, pool=pool)
        rows.append({"model": program.name, "plan": name, "simulated_s": simulated,
                     "measured_s": result.median_step_s, **shape(taskgraph), "ops_busiest": calls})
    return rows


def diagnose(rows: list[dict]) -> None:
    """Relative error per plan, and where the miss lies: spread over the communication tasks of a plan that
    has some, else over the ops of its busiest rank."""
    for r in rows:
        miss = r["measured_s"] - r["simulated_s"]
        r["error"] = abs(miss) / r["measured_s"]
        r["miss_per_comm_task_s"] = miss / r["comm_tasks"] if r["comm_tasks"] else None
        r["miss_per_op_s"] = None if r["comm_tasks"] else miss / max(r["ops_busiest"], 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt2,candle-uno", help="comma-separated tiny zoo models")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--profile", default=None, help="read the host's profile here (measured and written if absent)")
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    args = parser.parse_args()
    started = time.perf_counter()
    models = args.models.split(",")
    profile = host_profile(models, args.profile)
    cluster = local_cluster(2, profile=profile)
    rows = []
    with WorkerPool(2) as pool:
        for model in models:
            rows += run_model(model, profile, cluster, pool, args.steps)
    diagnose(rows)
    if not args.json:
        print_table(rows, cluster)
    errors = [r["error"] for r in rows]
    overhead = {name: t.executor_overhead_s for name, t in profile.device("cpu").models.items()}
    p2p = profile.device("cpu").comm["p2p"]
    print(json.dumps({"benchmark": "fidelity", "cluster": "local:2", "plans": len(rows),
                      "median_error": float(np.median(errors)), "max_error": float(np.max(errors)),
                      "executor_overhead_s": overhead, "p2p_latency_s": p2p.latency_s, "p2p_bandwidth": p2p.bandwidth,
                      "seconds": round(time.perf_counter() - started, 1), "rows": rows}, default=float))


def print_table(rows: list[dict], cluster) -> None:
    print(f"local:2: gloo {cluster.latency[0, 1] * 1e6:.0f} us + S / {cluster.bandwidth[0, 1] / 1e9:.2f} GB/s")
    print(f"{'model':<16}{'plan':<22}{'simulated':>11}{'measured':>11}{'error':>8}{'comm':>6}  miss")
    for r in rows:
        if r["miss_per_comm_task_s"] is not None:
            miss = f"{r['miss_per_comm_task_s'] * 1e6:+.0f} us per transfer or collective"
        else:
            miss = f"{r['miss_per_op_s'] * 1e6:+.1f} us per op"
        print(f"{r['model']:<16}{r['plan']:<22}{r['simulated_s'] * 1e3:>9.2f}ms{r['measured_s'] * 1e3:>9.2f}ms"
              f"{r['error']:>8.0%}{r['comm_tasks']:>6d}  {miss}")
    errors = np.array([r["error"] for r in rows])
    print(f"relative error: median {np.median(errors):.0%}, largest {errors.max():.0%} over {len(rows)} plans")


if __name__ == "__main__":
    main()
