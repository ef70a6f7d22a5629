"""The simulator held against executed steps: plans for `local:2`, simulated with this host's profile, run.

    python scripts/check_fidelity.py [--models gpt2,candle-uno] [--steps 10] [--profile host.json]
                                     [--comm profile|per-plan] [--json]

For each tiny zoo model (batch 8) the host is profiled first (every op at 2, 4 and 8 rows with one torch
thread, what `tag run`'s executor adds per op in a rank process, gloo between two rank processes; or read
from ``--profile``), then plans for ``local:2``
are made: one device, data parallel with all-reduce and with a parameter server, a two-device split of
the op groups, `tag plan`'s searched plan (no SFB, no fusion: what `tag run` executes), and two-stage
pipelines under 1F1B and GPipe with 4 micro-batches. Each plan is simulated with the profile's op times
(:class:`tag.cost.ProfiledCostModel`) and run for ``--steps`` steps on two processes by `tag run`'s own
interpreter (pipelines too: ``runtime="tag"``, whose per-op overhead the profile measured; torch's
pipelining pays another), every instruction timed (:mod:`tag.profile.timeline`); measured = the median
over the steps after the first of the slowest rank, averaged over two runs of the plan one after the
other, whose distance apart (``rerun``) is the floor the host's noise puts under any error.

Communication: the plans are simulated on ``local:2`` with the profile's point-to-point curve for
transfers and its all-reduce curve for collectives (:class:`tag.cluster.presets.LocalCluster`). On a shared
machine the time a blocked rank takes to wake up, which every transfer and collective of gloo pays, moves
with the load; ``--comm per-plan`` runs `tag profile`'s communication benchmark (a shorter one: fewer
sizes) again in the same two processes just before each plan and simulates that plan with the curves just
measured. On the loaded 2-core machine that did worse (its few rounds catch one of two modes of the
host's wake-ups), so the profile's curves are the default.

Where the simulator misses, the table says where, from the busiest rank's timeline against the simulated
tasks of its device: the miss in compute (per op, measured instruction times against the profile's) and
in everything else (per transfer or collective: receives, collectives and the waits for the other rank),
with the number of transfers and collectives the rank ran against the simulated tasks it took part in (a
pipeline's stage-level simulation moves one message per micro-batch and direction; the executed program
moves every tensor that crosses the cut, each a hand-over between the ranks), and the measured and
simulated time of one collective where the plan has any. Prints a table, then one
JSON line with the median and largest relative error.
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
from tag.compiler.check import check_compiled
from tag.compiler.compile import compile_strategy
from tag.cost import ProfiledCostModel
from tag.exact import plan_pipeline
from tag.exact.pipeline_compile import simulate_pipeline
from tag.execute import WorkerPool, zoo_program
from tag.execute.launch import launch
from tag.execute.lower import lower_plan
from tag.execute.pipeline import lower_pipeline
from tag.grouping import group_ops
from tag.planner import PlanConfig, plan_training
from tag.profile.comm import measure_comm
from tag.profile.data import DeviceProfile, Profile, load_profile, save_profile
from tag.profile.executor import executor_overhead
from tag.profile.ops import profile_program, single_thread
from tag.profile.timeline import COMPUTE, RECV, REDUCE, SEND, TimedProgram, timelines
from tag.sim import TASK_COLLECTIVE, TASK_COMPUTE
from tag.strategy import Strategy, make_pipeline_plan

BATCH = 8
GROUPS = 8
PROBE_BYTES = (1024, 16384, 262144, 1048576, 4194304)  # the per-plan communication benchmark's sizes
PROBE_REPEATS = 15  # its rounds per size (a median: the host's wake-ups are bimodal under load)


def bare_op_times(models: list[str]) -> dict:
    """program name -> (program, ModelTimes) of the tiny models at batch 8: every op timed in this process
    with one torch thread (before the ranks' pool starts: two processes importing torch would share the
    cores with the timing)."""
    out = {}
    with single_thread():
        for model in models:
            program = zoo_program(model, tiny=True, batch_size=BATCH)
            out[program.name] = (program, profile_program(program, device=torch.device("cpu")))
    return out


def host_profile(bare: dict, pool: WorkerPool, path: str | None) -> Profile:
    """The host's profile: the bare op times, what `tag run`'s executor adds per op and gloo between two
    processes, both measured in the pool's rank processes (written to ``path`` when given)."""
    times = {name: dataclasses.replace(t, executor_overhead_s=executor_overhead(program, t, pool=pool))
             for name, (program, t) in bare.items()}
    profile = Profile({"cpu": DeviceProfile("cpu", "this host", "cpu", "fp32", 1, torch.__version__, {"repeats": 5},
                                            times, measure_comm(pool=pool))})
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
    """name -> (plan file record, PipelinePlan) of two-stage pipelines."""
    out = {}
    for schedule in ("1f1b", "gpipe"):
        plan = plan_pipeline(graph, cluster, stages=2, replicas=1, micro_batches=4, schedule=schedule, cost=cost)
        sg = plan.stage_graph
        record = make_pipeline_plan(graph, cluster, partitioner=plan.partitioner, schedule=schedule,
                                    micro_batches=4, replicas=sg.replicas.tolist(),
                                    reference_gpu=sg.gpu_types[sg.reference_type].name,
                                    forward_assignment=sg.forward_assignment, mapping=plan.mapping)
        out[f"pipeline {schedule} 2x1 M4"] = (record, plan)
    return out


def measured_breakdown(lines: list[list[np.ndarray]], step_times: list[list[float]]) -> dict:
    """What the slowest rank did in its median step (steps after the first): step, compute and
    communication seconds, ops, communication instructions, and the median seconds of one collective.
    ``lines`` [rank][step] timelines, ``step_times`` [step][rank]."""
    per_step = np.array(step_times)[1:] if len(step_times) > 1 else np.array(step_times)  # [steps, ranks]
    rank = int(np.argmax(np.median(per_step, axis=0)))
    own = lines[rank][1:] if len(lines[rank]) > 1 else lines[rank]
    compute = [float((t[:, 3] - t[:, 2])[t[:, 0] == COMPUTE].sum()) for t in own]
    reduce = np.concatenate([(t[:, 3] - t[:, 2])[t[:, 0] == REDUCE] for t in own])
    first = own[0]
    return {"rank": rank, "measured_s": float(np.median(per_step.max(axis=1))),
            "compute_s": float(np.median(compute)), "ops": int((first[:, 0] == COMPUTE).sum()),
            "comm_instructions": int(np.isin(first[:, 0], (SEND, RECV, REDUCE)).sum()),
            "collective_s": float(np.median(reduce)) if reduce.size else None}


def measure_twice(programs, tensors: dict, steps: int, pool: WorkerPool) -> dict:
    """:func:`measured_breakdown` of two runs of the plan, one after the other: the mean of their figures
    (the slowest rank of the first), and ``repeat_spread``, how far the two measured steps are apart
    (|a − b| / max): what the host's noise alone makes of the same plan."""
    runs = []
    for _ in range(2):
        reports = launch([TimedProgram(p) for p in programs], tensors, steps=steps, pool=pool)
        runs.append(measured_breakdown(timelines(reports), [[r["times"][k] for r in reports] for k in range(steps)]))
    first, second = runs
    out = dict(first)
    for key in ("measured_s", "compute_s", "collective_s"):
        if first[key] is not None and second[key] is not None:
            out[key] = (first[key] + second[key]) / 2
    a, b = first["measured_s"], second["measured_s"]
    out["repeat_spread"] = abs(a - b) / max(a, b)
    return out


def simulated_breakdown(taskgraph, iteration_time: float, device: int) -> dict:
    """The simulated counterpart on ``device``: compute seconds, communication tasks it takes part in, and
    the mean seconds of one collective (a pipeline's tasks are whole stages, so its ops are not counted)."""
    compute = (taskgraph.kind == TASK_COMPUTE) & (taskgraph.device == device)
    comm = (taskgraph.kind != TASK_COMPUTE) & ((taskgraph.device == device) | (taskgraph.peer == device)
                                              | (taskgraph.kind == TASK_COLLECTIVE))
    collective = taskgraph.kind == TASK_COLLECTIVE
    return {"simulated_s": iteration_time, "sim_compute_s": float(taskgraph.duration[compute].sum()),
            "sim_comm_tasks": int(comm.sum()),
            "sim_collective_s": float(taskgraph.duration[collective].mean()) if collective.any() else None}


def run_plans(program, profile: Profile, pool: WorkerPool, steps: int, per_plan_comm: bool) -> list[dict]:
    """One row per plan of ``program``: simulated, measured twice, and both broken down (module docstring)."""
    cost = ProfiledCostModel(profile=profile)
    planning = local_cluster(2, profile=profile)
    graph = program.graph
    if not cost.covers(graph, "cpu"):
        raise SystemExit(f"the profile does not cover {program.name} at this structure; profile it again")
    jobs = [(name, "placement", plan) for name, plan in placement_plans(graph, planning, cost).items()]
    jobs += [(name, "pipeline", plan) for name, plan in pipeline_plans(graph, planning, cost).items()]
    rows = []
    for name, kind, plan in jobs:
        load = os.getloadavg()[0]
        comm = (measure_comm(pool=pool, sizes=PROBE_BYTES, repeats=PROBE_REPEATS) if per_plan_comm
                else profile.device("cpu").comm)
        p2p, allreduce = comm["p2p"], comm["allreduce"]
        cluster = local_cluster(2, latency=p2p.latency_s, bandwidth=p2p.bandwidth,
                                collective_latency=allreduce.latency_s, collective_bandwidth=allreduce.bandwidth)
        if kind == "placement":
            gg, strategy = plan
            compiled = compile_strategy(gg, strategy, cluster, granularity="op", cost=cost)
            check_compiled(compiled)
            taskgraph, simulated = compiled.taskgraph, compiled.simulate(feedback=False).iteration_time
            programs = lower_plan(program, compiled)
        else:
            record, planned = plan
            taskgraph, result = simulate_pipeline(planned.stage_graph, cluster, planned.mapping,
                                                  schedule=planned.schedule)
            simulated = result.iteration_time
            programs = lower_pipeline(program, record, cluster).programs
        measured = measure_twice(programs, program.tensors, steps, pool)
        sim = simulated_breakdown(taskgraph, simulated, measured["rank"])
        rows.append({"model": program.name, "plan": name, "kind": kind, **measured, **sim,
                     "p2p_latency_s": p2p.latency_s, "p2p_bandwidth": p2p.bandwidth,
                     # a whole all-reduce over the two processes: 2(n - 1) ring hops
                     "collective_latency_s": 2 * allreduce.latency_s, "collective_bandwidth": allreduce.bandwidth,
                     "load": round((load + os.getloadavg()[0]) / 2, 1)})
    return rows


def diagnose(rows: list[dict]) -> None:
    """Relative error per plan, and where the miss lies on the slowest rank: compute (per op) and the rest,
    communication and waits (per transfer or collective)."""
    for r in rows:
        r["error"] = abs(r["measured_s"] - r["simulated_s"]) / r["measured_s"]
        compute_miss = r["compute_s"] - r["sim_compute_s"]
        r["compute_miss_per_op_s"] = compute_miss / max(r["ops"], 1)
        comm_miss = (r["measured_s"] - r["compute_s"]) - (r["simulated_s"] - r["sim_compute_s"])
        r["comm_miss_s"] = comm_miss
        r["comm_miss_per_task_s"] = comm_miss / r["comm_instructions"] if r["comm_instructions"] else None
        r["blame"] = "compute" if abs(compute_miss) >= abs(comm_miss) else "communication"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt2,candle-uno", help="comma-separated tiny zoo models")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--profile", default=None, help="read the host's profile here (measured and written if absent)")
    parser.add_argument("--comm", choices=("profile", "per-plan"), default="profile",
                        help="the point-to-point curve each plan is simulated with (module docstring)")
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    args = parser.parse_args()
    started = time.perf_counter()
    models = args.models.split(",")
    rows = []
    reuse = args.profile is not None and os.path.exists(args.profile)
    bare = {} if reuse else bare_op_times(models)
    with WorkerPool(2) as pool:
        profile = load_profile(args.profile) if reuse else host_profile(bare, pool, args.profile)
        for model in models:
            rows += run_plans(zoo_program(model, tiny=True, batch_size=BATCH), profile, pool, args.steps,
                              args.comm == "per-plan")
    diagnose(rows)
    if not args.json:
        print_table(rows)
    errors = [r["error"] for r in rows]
    device = profile.device("cpu")
    print(json.dumps({"benchmark": "fidelity", "cluster": "local:2", "plans": len(rows), "comm": args.comm,
                      "median_error": float(np.median(errors)), "max_error": float(np.max(errors)),
                      "median_repeat_spread": float(np.median([r["repeat_spread"] for r in rows])),
                      "load": [min(r["load"] for r in rows), max(r["load"] for r in rows)],
                      "executor_overhead_s": {name: t.executor_overhead_s for name, t in device.models.items()},
                      "profile_p2p": {"latency_s": device.comm["p2p"].latency_s,
                                      "bandwidth": device.comm["p2p"].bandwidth},
                      "profile_allreduce": {"latency_s": device.comm["allreduce"].latency_s,
                                            "bandwidth": device.comm["allreduce"].bandwidth},
                      "seconds": round(time.perf_counter() - started, 1), "rows": rows}, default=float))


def print_table(rows: list[dict]) -> None:
    print(f"{'model':<16}{'plan':<22}{'sim':>9}{'measured':>10}{'error':>7}{'rerun':>7}{'load':>6}{'p2p':>8}"
          f"{'coll.':>8}  "
          f"{'compute miss':>14}  {'comm miss (sim tasks)':>24}  collective sim/measured")
    for r in rows:
        comm = (f"{r['comm_miss_per_task_s'] * 1e6:+7.0f} us x{r['comm_instructions']} ({r['sim_comm_tasks']})"
                if r["comm_miss_per_task_s"] is not None else "")
        collective = (f"{r['sim_collective_s'] * 1e3:.2f}/{r['collective_s'] * 1e3:.2f} ms"
                      if r["sim_collective_s"] is not None and r["collective_s"] is not None else "")
        print(f"{r['model']:<16}{r['plan']:<22}{r['simulated_s'] * 1e3:>7.2f}ms{r['measured_s'] * 1e3:>8.2f}ms"
              f"{r['error']:>7.0%}{r['repeat_spread']:>7.0%}{r['load']:>6.1f}{r['p2p_latency_s'] * 1e6:>6.0f}us"
              f"{r['collective_latency_s'] * 1e6:>6.0f}us  "
              f"{r['compute_miss_per_op_s'] * 1e6:+7.1f} us/op  {comm:>24}  {collective}")
    errors = np.array([r["error"] for r in rows])
    spread = np.array([r["repeat_spread"] for r in rows])
    print(f"relative error: median {np.median(errors):.0%}, largest {errors.max():.0%} over {len(rows)} plans; "
          f"the same plan run twice: median {np.median(spread):.0%}, largest {spread.max():.0%} apart")


if __name__ == "__main__":
    main()
