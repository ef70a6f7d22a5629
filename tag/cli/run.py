"""``tag run PLAN.json --model MODEL --cluster CLUSTER``: run a placement or pipeline plan on this host
(one process per device, on torch.distributed) and check it against the single-device step."""

from __future__ import annotations

import argparse
import sys

from tag.cli.args import add_json, int_in, positive_seconds
from tag.errors import OutputError

__all__ = ["add_parser", "run"]


def add_parser(subparsers) -> None:
    steps = int_in(1, 1000, "1..1000")
    p = subparsers.add_parser("run", help="run a plan on torch.distributed (one process per device) and check it "
                                          "against the single-device step")
    p.add_argument("plan", metavar="PLAN.json", help="a plan file from `tag plan --out` or `tag pipeline --out`")
    p.add_argument("--model", required=True, help="zoo name or MODULE:FUNCTION (the model the plan was made for)")
    p.add_argument("--tiny", action="store_true", help="the zoo model's tiny variant")
    p.add_argument("--batch-size", type=steps, default=None, help="global batch size (default: the model's)")
    p.add_argument("--cluster", required=True, help="the cluster the plan was made for (preset or spec file)")
    p.add_argument("--nproc", type=steps, help="processes to start (must be what the plan runs: its device count, "
                                               "or its stage replicas on torch.distributed.pipelining)")
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo",
                   help="torch.distributed backend: gloo (ranks on the CPU) or nccl (one GPU per rank)")
    p.add_argument("--runtime", choices=("auto", "torch", "tag"), default="auto",
                   help="pipeline plans: torch.distributed.pipelining (chains of equal replicas, GPipe/1F1B), "
                        "tag's micro-batch runtime (any pipeline), or auto: torch's where it can (default)")
    p.add_argument("--steps", type=steps, default=2, help="optimizer steps to run (default 2)")
    p.add_argument("--check", action="store_true",
                   help="compare loss, gradients and updated parameters with the single-device step")
    p.add_argument("--allow-batch-coupled", action="store_true",
                   help="run even if dropout or batch statistics make the split step differ")
    p.add_argument("--port", type=int, help="TCP port of the process group (default: a free one)")
    p.add_argument("--timeout", type=positive_seconds, default=120.0, help="seconds a rank may wait (default 120)")
    p.add_argument("--seed", type=int, default=0, help="METIS seed, when the plan stores no grouping")
    add_json(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> dict:
    from tag.cli.progress import status
    from tag.cluster import resolve_cluster
    from tag.execute.launch import check_port, torchrun_rank
    from tag.execute.lower import ExecutionError
    from tag.execute.program import resolve_program
    from tag.strategy import plan_kind

    if args.backend == "nccl":
        import torch

        if not torch.cuda.is_available():
            raise ExecutionError("--backend nccl needs CUDA devices; this host has none (use gloo)")
    if args.port is not None:
        check_port(args.port)
    cluster = resolve_cluster(args.cluster)
    with status(sys.stderr.isatty() and torchrun_rank() is None, "tracing the train step"):
        program = resolve_program(args.model, tiny=args.tiny, batch_size=args.batch_size)
    if plan_kind(args.plan) == "pipeline":
        result = _run_pipeline(args, program, cluster)
    else:
        _check_nproc(args.nproc, cluster.num_devices, f"the plan's cluster has {cluster.num_devices} devices, one "
                     "process each")
        result = _run_placement(args, program, cluster)
    if result is None:  # a torchrun rank other than 0: rank 0 reports for all
        args.json = False
        return {}
    payload = {"plan": args.plan, "model": program.name, "cluster": cluster.name, "ranks": len(result.step_times_s[0]),
               "batch_size": program.batch_size, "steps": args.steps, **result.summary()}
    if not args.json:
        from tag.cli.report import render_run

        render_run(payload)
    if args.check and result.check and result.check["applies"] and not result.check["passed"]:
        raise OutputError(f"--check failed: {_worst(result.check)}")
    return payload


def _check_nproc(nproc: int | None, processes: int, why: str) -> None:
    from tag.execute.lower import ExecutionError

    if nproc is not None and nproc != processes:
        raise ExecutionError(f"--nproc {nproc}: {why}")


def _run_placement(args: argparse.Namespace, program, cluster):
    from tag.cli.progress import step_progress
    from tag.execute.run import run_strategy
    from tag.planners.stored import placement_group_graph
    from tag.strategy import load_plan

    plan = load_plan(args.plan, graph=program.graph, cluster=cluster)
    group_graph = placement_group_graph(plan, program.graph, cluster, seed=args.seed, where=args.plan)
    with step_progress(f"{cluster.num_devices} ranks", args.steps) as progress:
        return run_strategy(program, group_graph, plan.strategy, cluster, steps=args.steps, check=args.check,
                            allow_batch_coupled=args.allow_batch_coupled, backend=args.backend, port=args.port,
                            timeout_s=args.timeout, progress=progress)


def _run_pipeline(args: argparse.Namespace, program, cluster):
    from tag.cli.progress import step_progress
    from tag.execute.pipeline import choose_runtime, run_pipeline
    from tag.strategy import load_pipeline_plan

    plan = load_pipeline_plan(args.plan, graph=program.graph, cluster=cluster)
    runtime, _ = choose_runtime(program, plan, cluster, args.runtime)
    if runtime == "torch":
        _check_nproc(args.nproc, sum(plan.replicas), f"torch.distributed.pipelining runs {sum(plan.replicas)} "
                     "processes, one per stage replica")
    else:
        _check_nproc(args.nproc, cluster.num_devices, f"tag's runtime runs one process per device of the plan's "
                     f"cluster, which has {cluster.num_devices} devices")
    what = f"{plan.num_stages} stages × {list(plan.replicas)} replicas, {plan.micro_batches} micro-batches"
    with step_progress(f"pipeline of {what}", args.steps) as progress:
        return run_pipeline(program, plan, cluster, steps=args.steps, check=args.check,
                            allow_batch_coupled=args.allow_batch_coupled, backend=args.backend, port=args.port,
                            timeout_s=args.timeout, runtime=runtime, progress=progress)


def _worst(check: dict) -> str:
    part = max(("loss", "grads", "params"), key=lambda g: check[g]["rel"])
    return f"{check[part]['worst']} differs by {check[part]['rel']:.2e} relative (tolerance {check['tolerance']:.0e})"
