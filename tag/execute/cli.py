"""`tag run PLAN.json --model MODEL --cluster CLUSTER`: run a placement or pipeline plan on this host and check it."""

from __future__ import annotations

import argparse
import contextlib
import sys

from tag.errors import OutputError

__all__ = ["add_run_parser", "cmd_run"]


def add_run_parser(sub) -> None:
    from tag.cli import _int_in, _positive_seconds

    steps = _int_in(1, 1000, "1..1000")
    p = sub.add_parser("run", help="run a plan on torch.distributed (one process per device) and check it "
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
    p.add_argument("--timeout", type=_positive_seconds, default=120.0, help="seconds a rank may wait (default 120)")
    p.add_argument("--seed", type=int, default=0, help="METIS seed, when the plan stores no grouping")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> dict:
    from tag.cli import _plan_kind, _status
    from tag.cluster import resolve_cluster
    from tag.execute.launch import check_port, torchrun_rank
    from tag.execute.lower import ExecutionError
    from tag.execute.program import resolve_program

    if args.backend == "nccl":
        import torch

        if not torch.cuda.is_available():
            raise ExecutionError("--backend nccl needs CUDA devices; this host has none (use gloo)")
    if args.port is not None:
        check_port(args.port)
    cluster = resolve_cluster(args.cluster)
    with _status(sys.stderr.isatty() and torchrun_rank() is None, "tracing the train step"):
        program = resolve_program(args.model, tiny=args.tiny, batch_size=args.batch_size)
    if _plan_kind(args.plan) == "pipeline":
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
        _print_run(payload)
    if args.check and result.check and result.check["applies"] and not result.check["passed"]:
        raise OutputError(f"--check failed: {_worst(result.check)}")
    return payload


def _check_nproc(nproc: int | None, processes: int, why: str) -> None:
    from tag.execute.lower import ExecutionError

    if nproc is not None and nproc != processes:
        raise ExecutionError(f"--nproc {nproc}: {why}")


def _run_placement(args: argparse.Namespace, program, cluster):
    from tag.cli import _plan_group_graph
    from tag.execute.run import run_strategy
    from tag.strategy import load_plan

    plan = load_plan(args.plan, graph=program.graph, cluster=cluster)
    group_graph = _plan_group_graph(plan, program.graph, cluster, argparse.Namespace(seed=args.seed,
                                                                                     strategy=args.plan))
    with _step_progress(f"{cluster.num_devices} ranks", args.steps) as progress:
        return run_strategy(program, group_graph, plan.strategy, cluster, steps=args.steps, check=args.check,
                            allow_batch_coupled=args.allow_batch_coupled, backend=args.backend, port=args.port,
                            timeout_s=args.timeout, progress=progress)


def _run_pipeline(args: argparse.Namespace, program, cluster):
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
    with _step_progress(f"pipeline of {what}", args.steps) as progress:
        return run_pipeline(program, plan, cluster, steps=args.steps, check=args.check,
                            allow_batch_coupled=args.allow_batch_coupled, backend=args.backend, port=args.port,
                            timeout_s=args.timeout, runtime=runtime, progress=progress)


@contextlib.contextmanager
def _step_progress(what: str, steps: int):
    """A bar of the optimizer steps rank 0 has finished, on stderr when it is a terminal; yields the
    callback (None when there is no terminal)."""
    from tag.execute.launch import torchrun_rank

    if not sys.stderr.isatty() or (torchrun_rank() or (0, 1))[0] != 0:  # one bar: rank 0's
        yield None
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn(f"running {escape(what)}: steps"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("steps", total=steps)
        yield lambda done, total: bar.update(task, completed=done)


def _worst(check: dict) -> str:
    part = max(("loss", "grads", "params"), key=lambda g: check[g]["rel"])
    return f"{check[part]['worst']} differs by {check[part]['rel']:.2e} relative (tolerance {check['tolerance']:.0e})"


def _print_run(payload: dict) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from tag.units import format_bytes, format_time

    console = Console()
    table = Table(title=f"{payload['model']} on {payload['cluster']}: {payload['ranks']} ranks, batch "
                        f"{payload['batch_size']}")
    for column in ("step", "loss", "step time"):
        table.add_column(column, justify="right")
    for k, (loss, seconds) in enumerate(zip(payload["losses"], payload["step_times_s"])):
        table.add_row(str(k + 1), f"{loss:.6g}", format_time(seconds))
    console.print(table)
    console.print(f"{payload['transfers']} transfers and {payload['collectives']} collectives per step, "
                  f"{format_bytes(payload['bytes_moved'])} moved; median step {format_time(payload['median_step_s'])}")
    schedule = payload.get("schedule")
    if schedule:
        console.print(f"pipeline runtime: {schedule['runtime']}")
    if schedule and not schedule["followed"] and schedule["waits_on"]:
        console.print(f"[yellow]the ranks could not follow the plan's schedule: every backward pass waits for "
                      f"{', '.join(map(escape, schedule['waits_on'][:3]))}, summed over all micro-batches[/]")
    elif schedule and not schedule["followed"]:
        console.print("[yellow]the ranks ran another order than the plan's schedule[/]")
    if schedule and schedule.get("per_micro_batch"):
        console.print(f"[yellow]torch's schedule normalised {', '.join(map(escape, schedule['per_micro_batch'][:3]))} "
                      "per micro-batch: --check says whether that changes the step[/]")
    check = payload.get("check")
    if check is None:
        return
    if not check["applies"]:
        console.print(f"[yellow]check: {check['reason']}[/]")
    rows = ", ".join(f"{g} {check[g]['rel']:.1e}" for g in ("loss", "grads", "params"))
    verdict = "[green]equal to one device[/]" if check["passed"] else "[red]differs from one device[/]"
    console.print(f"check against the single-device step (largest relative difference): {rows}: {verdict}")
