"""What the commands share to parse: argument types with their ranges, the common flag sets, output paths
checked before any long work, and the staging of output files (all of a command's files land or none)."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from tag.errors import OutputError

__all__ = ["int_in", "batch_size", "positive_int", "num_groups", "micro_batches", "seed", "named",
           "positive_seconds", "add_model", "add_cluster", "add_grouping", "add_simulation", "add_profile",
           "add_views", "add_mapper_policy", "add_json", "output_path", "check_view_paths", "staged",
           "write_output", "write_views",
           "profile_cost", "shipped_policy"]


def int_in(low: int, high: int, shown: str):
    """An argparse type: an integer in low..high (``shown`` says the range in messages)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be in {shown}, got {value}")
        return value

    return parse


batch_size = int_in(1, 2**31, "1..2^31")
positive_int = int_in(1, 10**9, "1..10^9")
num_groups = int_in(1, 10_000, "1..10000")
micro_batches = int_in(1, 4096, "1..4096")  # tag.exact.stage_graph.MAX_MICRO_BATCHES
seed = int_in(0, 2**63 - 1, "0..2^63-1")  # tag._rng.MAX_SEED: METIS and torch take a signed 64-bit seed


def named(text: str) -> str:
    """An argparse type for a file or preset name: an empty one is an error, not the flag left out."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


# ------------------------------------------------------------------------------------------ flag sets
def add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true")


def add_model(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL",
                        help="zoo name, graph .json(.gz), PipeDream graph.txt, or MODULE:FUNCTION")
    parser.add_argument("--batch-size", type=batch_size, default=None, help="global batch size (default: the model's)")
    parser.add_argument("--tiny", action="store_true", help="the zoo model's tiny variant")


def add_cluster(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cluster", type=named, required=True,
                        help="preset NAME[:ARGS] or a YAML/JSON spec file (`tag clusters`)")


def add_grouping(parser: argparse.ArgumentParser, *, seed_help: str = "METIS seed") -> None:
    parser.add_argument("--num-groups", type=num_groups, default=60, help="METIS op groups (default 60, as TAG)")
    parser.add_argument("--seed", type=seed, default=0, help=seed_help)


def add_simulation(parser: argparse.ArgumentParser) -> None:
    add_grouping(parser)
    parser.add_argument("--granularity", choices=("op", "group", "part"), default="group",
                        help="task granularity of the compiled plan (op: the exact reference; default group)")


def add_profile(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", metavar="PROFILE.json",
                        help="measured op times from `tag profile` for the GPU types it covers (else the roofline)")


def add_views(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", type=named, metavar="T.json",
                        help="write a Chrome trace (chrome://tracing, Perfetto)")
    parser.add_argument("--gantt", type=named, metavar="G.png", help="draw a Gantt chart of the simulated iteration")


def add_mapper_policy(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mapper-policy", type=named, metavar="CKPT",
                        help="mapping GNN checkpoint of the learned mapper "
                             "(default: the shipped checkpoints/tag-mapper.pt)")


# --------------------------------------------------------------------------------------- output files
def output_path(text: str, *, flag: str = "--out", suffixes: tuple[str, ...] = (".json", ".json.gz"),
                what: str = "graph file") -> Path:
    """Checked before any long work: a file name with one of ``suffixes`` whose folder exists or can be made."""
    path = Path(text)
    expected = " or ".join(suffixes)
    try:
        if not text or path.is_dir():
            raise OutputError(f"{flag} {text!r}: expected a file name ending in {expected}")
        if not text.lower().endswith(suffixes):
            raise OutputError(f"{flag} {text!r}: the {what} name must end in {expected}")
        for parent in path.parents:
            if parent.exists():
                if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
                    raise OutputError(f"{flag} {text!r}: cannot write into {str(parent)!r}")
                break
    except (OSError, ValueError) as error:  # a folder name the OS refuses (too long), a NUL
        reason = error.strerror if isinstance(error, OSError) else str(error)
        raise OutputError(f"{flag} {text[:80]!r}{'…' if len(text) > 80 else ''}: {reason}") from None
    return path


def check_view_paths(args: argparse.Namespace) -> None:
    """``--trace`` and ``--gantt``, checked before any long work."""
    if getattr(args, "trace", None):
        output_path(args.trace, flag="--trace", suffixes=(".json",), what="Chrome trace")
    if getattr(args, "gantt", None):
        output_path(args.gantt, flag="--gantt", suffixes=(".png",), what="Gantt chart")


def staged(args: argparse.Namespace, path: str) -> str:
    """Where to write the output file ``path``: a staged name that `main` renames over it once the whole
    command succeeded (all of a command's outputs land or none), or ``path`` itself outside `main`."""
    stage = getattr(args, "stage", None)
    return str(stage(path)) if stage is not None else path


def write_output(args: argparse.Namespace, flag: str, path: str, write) -> None:
    """``write(staged path)``, an OS error said as one ``flag path: reason`` line."""
    try:
        write(staged(args, path))
    except OSError as error:
        raise OutputError(f"{flag} {path!r}: {error.strerror or error}") from None


def write_views(args: argparse.Namespace, result, taskgraph, title: str) -> dict:
    """The Chrome trace and Gantt chart asked for by --trace / --gantt; returns the paths written."""
    from tag.sim.trace import gantt, to_chrome_trace

    written = {}
    for flag, kind, write in (("--trace", "trace", lambda path: to_chrome_trace(result, taskgraph, path)),
                              ("--gantt", "gantt", lambda path: gantt(result, taskgraph, path, title=title))):
        path = getattr(args, kind, None)
        if path:
            write_output(args, flag, path, write)
            written[kind] = path
    return written


def plan_files(args: argparse.Namespace, result, taskgraph, title: str) -> dict:
    """A planning command's "files": the plan file of --out (the caller writes it) and the views it wrote."""
    return {**({"plan": args.out} if args.out else {}), **write_views(args, result, taskgraph, title)}


# ------------------------------------------------------------------------------------ resolved values
def profile_cost(args: argparse.Namespace):
    """The cost model of ``--profile`` (None: the roofline's default)."""
    from tag.profile.cli import profile_cost_model

    return profile_cost_model(getattr(args, "profile", None))


def shipped_policy() -> str:
    from tag.policy import shipped_policy_path

    return str(shipped_policy_path())
