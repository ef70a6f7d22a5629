"""`tag profile MODEL --out PROFILE.json`: measure a train step's ops and this host's communication.

Also the one place the planning commands turn ``--profile PROFILE.json`` into a cost model
(:func:`profile_cost_model`).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from tag.errors import ModelError, OutputError, TagError

__all__ = ["add_profile_parser", "cmd_profile", "profile_cost_model", "device_type_name"]

# What torch calls a device -> the GPU catalogue's name (tag.cluster.gpus); first match wins.
_DEVICE_NAMES = (("h200", "h200"), ("h100", "h100"), ("a100-sxm4-80gb", "a100-80gb"), ("a100 80gb", "a100-80gb"),
                 ("a100", "a100-40gb"), ("v100-sxm2-32gb", "v100-32gb"), ("v100", "v100-16gb"), ("t4", "t4"),
                 ("p100", "p100"), ("titan v", "titan-v"), ("1080 ti", "1080ti"))


def profile_cost_model(path: str | None):
    """A :class:`~tag.cost.ProfiledCostModel` over the profile at ``path``, or None for no ``--profile``."""
    if path is None:
        return None
    from tag.cost import ProfiledCostModel
    from tag.profile.data import load_profile

    return ProfiledCostModel(profile=load_profile(path))


def device_type_name(device: str, gpu_type_name: str | None) -> str:
    """The catalogue name the profile keys this device by: ``--gpu-type``, else ``cpu`` or read from the
    CUDA device's name."""
    from tag.cluster.gpus import gpu_type

    if gpu_type_name is not None:
        return gpu_type(gpu_type_name).name
    if device == "cpu":
        return "cpu"
    import torch

    name = torch.cuda.get_device_name(0).lower()
    for fragment, key in _DEVICE_NAMES:
        if fragment in name:
            return key
    raise ModelError(f"the CUDA device {torch.cuda.get_device_name(0)!r} is not in tag's GPU catalogue; "
                     "say which type it is with --gpu-type")


def _batch_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(t) for t in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated batch sizes such as 1,2,4,8, got {text!r}") from None
    if not sizes or any(b < 1 or b > 2**31 for b in sizes):
        raise argparse.ArgumentTypeError(f"batch sizes must be positive integers, got {text!r}")
    return tuple(sorted(set(sizes)))


def add_profile_parser(sub) -> None:
    from tag.cli import _int_in

    count = _int_in(1, 1000, "1..1000")
    p = sub.add_parser("profile", help="time every op of a model's train step on this device (CPU or CUDA) and "
                                       "the communication between processes of this host; write a profile")
    p.add_argument("model", metavar="MODEL", help="zoo name or MODULE:FUNCTION")
    p.add_argument("--tiny", action="store_true", help="the zoo model's tiny variant")
    p.add_argument("--batch-size", type=_int_in(1, 2**31, "1..2^31"), default=None,
                   help="the batch the step is traced at, the largest measured (default: the model's)")
    p.add_argument("--batch-sizes", type=_batch_sizes, default=None, metavar="B1,B2,...",
                   help="batch sizes to time each op at (default: a quarter, a half and all of the batch)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where to time the ops (default cpu)")
    p.add_argument("--gpu-type", metavar="TYPE", help="the GPU catalogue type of the device (default: from its name)")
    p.add_argument("--warmup", type=_int_in(0, 1000, "0..1000"), default=2, help="untimed calls per op (default 2)")
    p.add_argument("--repeats", type=count, default=5, help="timed calls per op; the median is kept (default 5)")
    p.add_argument("--no-comm", action="store_true", help="skip the point-to-point and all-reduce measurement")
    p.add_argument("--no-executor", action="store_true",
                   help="on the CPU, skip measuring what `tag run`'s executor adds per op (the `local` cluster's use)")
    p.add_argument("--processes", type=_int_in(2, 64, "2..64"), default=2,
                   help="processes for the communication measurement (default 2)")
    p.add_argument("--merge", action="store_true", help="add to the profile already at --out instead of replacing it")
    p.add_argument("--out", required=True, metavar="PROFILE.json", help="the profile file (.json or .json.gz)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_profile)


def cmd_profile(args: argparse.Namespace) -> dict:
    import dataclasses

    import torch

    from tag.cli import _output_path, _staged, _status
    from tag.execute.program import resolve_program
    from tag.profile.data import load_profile, save_profile

    out = _output_path(args.out, flag="--out", what="profile")
    previous = load_profile(out) if args.merge and os.path.exists(out) else None
    if args.device == "cuda" and not torch.cuda.is_available():
        raise TagError("--device cuda: this host has no CUDA device that torch can use")
    device_name = device_type_name(args.device, args.gpu_type)
    shown = sys.stderr.isatty() and not args.json
    with _status(shown, "tracing the train step"):
        program = resolve_program(args.model, tiny=args.tiny, batch_size=args.batch_size)
    times = _measure_ops(args, program)
    if args.device == "cpu" and not args.no_executor:  # what `tag run` on `local:N` adds to every op
        from tag.profile.executor import executor_overhead
        from tag.profile.ops import single_thread

        with _status(shown, "running the step through tag run's executor"), single_thread():
            times = dataclasses.replace(times, executor_overhead_s=executor_overhead(program, times))
    comm = {}
    if not args.no_comm:
        from tag.profile.comm import measure_comm

        with _status(shown, f"timing communication between {args.processes} processes"):
            comm = measure_comm(processes=args.processes, device=args.device)
    profile, payload = _assemble(args, program, times, comm, device_name)
    if previous is not None:
        profile = previous.merged(profile)
    try:
        save_profile(profile, _staged(args, str(out)))  # lands when the command succeeds
    except OSError as error:
        raise OutputError(f"--out {args.out!r}: {error.strerror or error}") from None
    if not args.json:
        _print_profile(payload)
    return payload


def _measure_ops(args: argparse.Namespace, program) -> Any:
    import torch
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from tag.profile.ops import default_batch_sizes, profile_program, single_thread

    sizes = args.batch_sizes or default_batch_sizes(program.batch_size)
    device = torch.device("cuda:0" if args.device == "cuda" else "cpu")
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    shown = sys.stderr.isatty() and not args.json
    with Progress(*columns, console=Console(stderr=True), transient=True, disable=not shown) as bar:
        task = bar.add_task(f"timing {program.name} at batch {','.join(map(str, sizes))}",
                            total=program.graph.num_ops * len(sizes))
        with single_thread() if args.device == "cpu" else _nothing():
            return profile_program(program, sizes, device=device, warmup=args.warmup, repeats=args.repeats,
                                   progress=lambda n: bar.advance(task, n))


def _nothing():
    import contextlib

    return contextlib.nullcontext()


def _describe(device: str) -> str:
    import platform

    import torch

    if device == "cuda":
        return torch.cuda.get_device_name(0)
    try:
        with open("/proc/cpuinfo") as handle:
            model = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), "")
    except OSError:
        model = ""
    return model or platform.processor() or platform.machine()


def _assemble(args: argparse.Namespace, program, times, comm: dict, device_name: str):
    """The profile of this run and the command's report."""
    import dataclasses

    import numpy as np
    import torch

    from tag.cluster.gpus import gpu_type
    from tag.graph.opgraph import ROLE_INPUT
    from tag.profile.data import DeviceProfile, Profile
    from tag.profile.report import agreement_by_kind, agreement_by_role, roofline_fit

    gpu = gpu_type(device_name)
    graph = program.graph
    fit = roofline_fit([(graph, times)], gpu)
    device = DeviceProfile(device_name, _describe(args.device), args.device, "fp32",
                           1 if args.device == "cpu" else torch.get_num_threads(), torch.__version__,
                           {"warmup": args.warmup, "repeats": args.repeats, "statistic": "median",
                            "timer": "cuda events" if args.device == "cuda" else "perf_counter"},
                           {times.name: times}, comm, fit)
    bare = dataclasses.replace(times, executor_overhead_s=0.0)
    steps = [{"batch": b, "measured_s": float(np.nansum(times.measured_s[:, k])),
              "fit_s": float(bare.predicted(b)[program.graph.role != ROLE_INPUT].sum())}
             for k, b in enumerate(times.batch_sizes)]
    payload = {"out": str(args.out), "device": device_name, "description": device.description,
               "backend": args.device, "model": times.name, "ops": times.num_ops,
               "timed_ops": int(np.isfinite(times.measured_s).any(axis=1).sum()),
               "batch_size": times.batch_size, "batch_sizes": list(times.batch_sizes), "steps": steps,
               "executor_overhead_s": times.executor_overhead_s,
               "roofline": {"by_kind": agreement_by_kind(graph, times, gpu),
                            "by_role": agreement_by_role(graph, times, gpu), "fit": fit},
               "comm": {kind: {"backend": c.backend, "processes": c.processes, "latency_s": c.latency_s,
                               "bandwidth": c.bandwidth, "bytes": list(c.bytes), "seconds": list(c.seconds)}
                        for kind, c in comm.items()},
               "cluster": f"local:{args.processes},profile={args.out}" if comm else None}
    return Profile({device_name: device}), payload


def _print_profile(payload: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    from tag.units import format_bytes, format_time

    console = Console(highlight=False)
    steps = ", ".join(f"batch {s['batch']}: {format_time(s['measured_s'])} (fit {format_time(s['fit_s'])})"
                      for s in payload["steps"])
    console.print(f"{payload['model']} on {payload['device']} ({payload['description']}): {payload['timed_ops']} of "
                  f"{payload['ops']} ops timed; summed op time per step: {steps}")
    if payload["executor_overhead_s"]:
        console.print(f"tag run's executor adds {format_time(payload['executor_overhead_s'])} per op")
    table = Table(title="Roofline against measured, per op kind (at the traced batch)")
    for column in ("op kind", "ops", "measured", "roofline", "Spearman", "median roofline/measured"):
        table.add_column(column, justify="left" if column == "op kind" else "right")
    for row in payload["roofline"]["by_kind"]:
        rho = "-" if row["spearman"] != row["spearman"] else f"{row['spearman']:.2f}"
        table.add_row(row["kind"], str(row["ops"]), format_time(row["measured_s"]), format_time(row["roofline_s"]),
                      rho, f"{row['median_ratio']:.2f}")
    console.print(table)
    fit = payload["roofline"]["fit"]
    if fit is not None:
        console.print(f"roofline calibrated to these times (for steps the profile did not measure): launch "
                      f"{format_time(fit['launch_overhead_s'])}, compute efficiency {fit['compute_efficiency']:.3g}, "
                      f"memory {fit['memory_efficiency']:.3g} (rms log error {fit['rms_log_error']:.2f})")
    for kind, c in payload["comm"].items():
        console.print(f"{kind} ({c['backend']}, {c['processes']} processes): latency {format_time(c['latency_s'])}, "
                      f"bandwidth {format_bytes(c['bandwidth'])}/s")
    console.print(f"wrote {payload['out']}")
    if payload["cluster"]:
        console.print(f"plan for this host with --cluster {payload['cluster']} --profile {payload['out']}")
