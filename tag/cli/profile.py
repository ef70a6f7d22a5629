"""``tag profile MODEL --out PROFILE.json``: time a train step's ops on this device and this host's
communication, and write a profile for ``--profile`` (measured by :mod:`tag.profile`)."""

from __future__ import annotations

import argparse
import contextlib
import os

from tag.cli.args import add_json, batch_size, int_in, output_path, write_output
from tag.errors import TagError

__all__ = ["add_parser", "run"]


def _batch_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(t) for t in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated batch sizes such as 1,2,4,8, "
                                         f"got {text!r}") from None
    if not sizes or any(b < 1 or b > 2**31 for b in sizes):
        raise argparse.ArgumentTypeError(f"batch sizes must be positive integers, got {text!r}")
    return tuple(sorted(set(sizes)))


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("profile", help="time every op of a model's train step on this device (CPU or CUDA) "
                                              "and the communication between processes of this host; write a profile")
    p.add_argument("model", metavar="MODEL", help="zoo name or MODULE:FUNCTION")
    p.add_argument("--tiny", action="store_true", help="the zoo model's tiny variant")
    p.add_argument("--batch-size", type=batch_size, default=None,
                   help="the batch the step is traced at, the largest measured (default: the model's)")
    p.add_argument("--batch-sizes", type=_batch_sizes, default=None, metavar="B1,B2,...",
                   help="batch sizes to time each op at (default: a quarter, a half and all of the batch)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where to time the ops (default cpu)")
    p.add_argument("--gpu-type", metavar="TYPE", help="the GPU catalogue type of the device (default: from its name)")
    p.add_argument("--warmup", type=int_in(0, 1000, "0..1000"), default=2, help="untimed calls per op (default 2)")
    p.add_argument("--repeats", type=int_in(1, 1000, "1..1000"), default=5,
                   help="timed calls per op; the median is kept (default 5)")
    p.add_argument("--no-comm", action="store_true", help="skip the point-to-point and all-reduce measurement")
    p.add_argument("--no-executor", action="store_true",
                   help="on the CPU, skip measuring what `tag run`'s executor adds per op (the `local` cluster's use)")
    p.add_argument("--processes", type=int_in(2, 64, "2..64"), default=2,
                   help="processes for the communication measurement (default 2)")
    p.add_argument("--merge", action="store_true", help="add to the profile already at --out instead of replacing it")
    p.add_argument("--out", required=True, metavar="PROFILE.json", help="the profile file (.json or .json.gz)")
    add_json(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> dict:
    import dataclasses

    import torch

    from tag.cli.progress import interactive, status
    from tag.execute.program import resolve_program
    from tag.profile.cli import build_profile, device_type_name
    from tag.profile.data import load_profile, save_profile

    out = output_path(args.out, flag="--out", what="profile")
    previous = load_profile(out) if args.merge and os.path.exists(out) else None
    if args.device == "cuda" and not torch.cuda.is_available():
        raise TagError("--device cuda: this host has no CUDA device that torch can use")
    device_name = device_type_name(args.device, args.gpu_type)
    shown = interactive(args)
    with status(shown, "tracing the train step"):
        program = resolve_program(args.model, tiny=args.tiny, batch_size=args.batch_size)
    times = _measure_ops(args, program)
    if args.device == "cpu" and not args.no_executor:  # what `tag run` on `local:N` adds to every op
        from tag.profile.executor import executor_overhead
        from tag.profile.ops import single_thread

        with status(shown, "running the step through tag run's executor"), single_thread():
            times = dataclasses.replace(times, executor_overhead_s=executor_overhead(program, times))
    comm = {}
    if not args.no_comm:
        from tag.profile.comm import measure_comm

        with status(shown, f"timing communication between {args.processes} processes"):
            comm = measure_comm(processes=args.processes, device=args.device)
    profile, payload = build_profile(program, times, comm, device_name, backend=args.device, warmup=args.warmup,
                                     repeats=args.repeats, processes=args.processes, out=str(args.out))
    if previous is not None:
        profile = previous.merged(profile)
    write_output(args, "--out", args.out, lambda path: save_profile(profile, path))  # lands when the command succeeds
    if not args.json:
        from tag.cli.report import render_profile

        render_profile(payload)
    return payload


def _measure_ops(args: argparse.Namespace, program):
    """Every op of ``program`` timed at each batch size, with a bar on stderr."""
    import torch
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from tag.cli.progress import interactive
    from tag.profile.ops import default_batch_sizes, profile_program, single_thread

    sizes = args.batch_sizes or default_batch_sizes(program.batch_size)
    device = torch.device("cuda:0" if args.device == "cuda" else "cpu")
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True, disable=not interactive(args)) as bar:
        task = bar.add_task(f"timing {program.name} at batch {','.join(map(str, sizes))}",
                            total=program.graph.num_ops * len(sizes))
        with single_thread() if args.device == "cpu" else contextlib.nullcontext():
            return profile_program(program, sizes, device=device, warmup=args.warmup, repeats=args.repeats,
                                   progress=lambda n: bar.advance(task, n))
