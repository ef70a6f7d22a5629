"""The `tag` command.

Every command that reports results takes ``--json``; bad input ends in one ``tag: error: ...`` line
on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from tag.errors import OutputError, TagError

__all__ = ["main", "build_parser"]

EXIT_BAD_INPUT = 2


def _console():
    from rich.console import Console

    return Console(highlight=False)


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def _print_json(payload: Any) -> None:
    text = json.dumps(_finite(payload), separators=(", ", ": "), default=float, allow_nan=False)
    sys.stdout.write(text + "\n")


def _batch_size(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not 1 <= value <= 2**31:
        raise argparse.ArgumentTypeError(f"must be in 1..2^31, got {value}")
    return value


def _output_path(text: str) -> Path:
    """Checked before any long work: a graph file name whose folder exists or can be made."""
    path = Path(text)
    if not text or path.is_dir():
        raise OutputError(f"--out {text!r}: expected a file name ending in .json or .json.gz")
    if not text.lower().endswith((".json", ".json.gz")):
        raise OutputError(f"--out {text!r}: the graph file name must end in .json or .json.gz")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir() or not os.access(parent, os.W_OK):
                raise OutputError(f"--out {text!r}: cannot write into {str(parent)!r}")
            break
    return path


# ---------------------------------------------------------------------------------------------- models
def cmd_models(args: argparse.Namespace) -> dict:
    from tag.models import list_models

    rows = []
    for spec in list_models():
        rows.append(
            {
                "name": spec.name,
                "description": spec.description,
                "batch_size": spec.batch_size,
                "paper_parameters": spec.paper_parameters,
                "paper_source": spec.paper_source,
            }
        )
    if args.json:
        return {"models": rows}
    from rich.table import Table

    table = Table(title="Model zoo (tag.models)")
    for column in ("name", "batch", "paper params", "source", "description"):
        table.add_column(column)
    for row in rows:
        params = f"{row['paper_parameters'] / 1e6:.1f}M" if row["paper_parameters"] else "-"
        table.add_row(row["name"], str(row["batch_size"]), params, row["paper_source"], row["description"])
    _console().print(table)
    return {"models": rows}


# -------------------------------------------------------------------------------------------- clusters
def cmd_clusters(args: argparse.Namespace) -> dict:
    from tag.cluster import list_presets

    rows = list_presets()
    if args.json:
        return {"clusters": rows}
    from rich.table import Table

    table = Table(title="Cluster presets (--cluster NAME[:ARGS] or a YAML/JSON spec file)")
    for column in ("name", "example", "devices", "description"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["name"], row.get("address", row["name"]), str(row["devices"]), row.get("description", ""))
    _console().print(table)
    return {"clusters": rows}


# ------------------------------------------------------------------------------------------------ show
def _model_summary(graph) -> dict:
    from tag.cost import training_memory_bytes

    return {
        "model": graph.meta.get("model", ""),
        "source": graph.meta.get("source", ""),
        "batch_size": graph.batch_size,
        "parameters": graph.parameters,
        "parameter_bytes": graph.total_param_bytes(),
        "ops": {role: n for role, n in graph.count_by_role().items()},
        "edges": graph.num_edges,
        "flops_per_iteration": graph.total_flops(),
        "training_memory_bytes": float(training_memory_bytes(graph)),
    }


def _fit_rows(graph, cluster, memory_bytes: float) -> list[dict]:
    import numpy as np

    from tag.cost import CostModel

    cost = CostModel()
    rows = []
    for t, gpu in enumerate(cluster.types):
        count = int(np.sum(cluster.device_type == t))
        rows.append(
            {
                "gpu": gpu.name,
                "count": count,
                "memory_bytes": gpu.memory_bytes,
                "fits": bool(memory_bytes <= gpu.memory_bytes),
                "single_device_iteration_s": float(cost.op_times(graph, gpu).sum()),
            }
        )
    return rows


def cmd_show(args: argparse.Namespace) -> dict:
    from tag.graph.resolve import resolve_model
    from tag.units import format_bytes, format_time

    cluster = None
    if args.cluster:  # resolved first: it is cheap and a bad one should fail before a long trace
        from tag.cluster import resolve_cluster

        cluster = resolve_cluster(args.cluster)
    graph = resolve_model(args.model, batch_size=args.batch_size, tiny=args.tiny)
    payload = _model_summary(graph)
    if cluster is not None:
        payload["cluster"] = {"name": cluster.name, "devices": cluster.num_devices}
        payload["fits_on"] = _fit_rows(graph, cluster, payload["training_memory_bytes"])
    if args.json:
        return payload
    from rich.table import Table

    console = _console()
    table = Table(title=f"{payload['model']} (batch {payload['batch_size']}, from {payload['source']})", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("parameters", f"{payload['parameters']:,} ({format_bytes(payload['parameter_bytes'])})")
    for role, n in payload["ops"].items():
        table.add_row(f"{role} ops", f"{n:,}")
    table.add_row("edges", f"{payload['edges']:,}")
    table.add_row("FLOPs per iteration", f"{payload['flops_per_iteration']:.3e}")
    table.add_row("training memory (Adam)", format_bytes(payload["training_memory_bytes"]))
    console.print(table)
    if cluster is not None:
        fit = Table(title=f"Fit on {cluster.name} ({cluster.num_devices} devices)")
        for column in ("GPU", "count", "memory", "fits whole model", "one-device iteration"):
            fit.add_column(column)
        for row in payload["fits_on"]:
            fit.add_row(
                row["gpu"], str(row["count"]), format_bytes(row["memory_bytes"]),
                "[green]yes[/]" if row["fits"] else "[red]no[/]", format_time(row["single_device_iteration_s"]),
            )
        console.print(fit)
    return payload


# ----------------------------------------------------------------------------------------------- trace
def cmd_trace(args: argparse.Namespace) -> dict:
    from tag.graph.io import save_graph
    from tag.graph.resolve import resolve_model

    out = _output_path(args.out)
    graph = resolve_model(args.model, batch_size=args.batch_size, tiny=args.tiny)
    try:
        save_graph(graph, out)
    except OSError as error:
        raise OutputError(f"--out {args.out!r}: {error.strerror or error}") from None
    payload = {"out": str(args.out), **_model_summary(graph)}
    if not args.json:
        roles = ", ".join(f"{n} {role}" for role, n in payload["ops"].items())
        _console().print(f"wrote {args.out}: {graph.num_ops} ops ({roles}), {graph.num_edges} edges, {graph.parameters:,} parameters")
    return payload


# ---------------------------------------------------------------------------------------------- parser
def _add_model(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="zoo name, graph .json(.gz), PipeDream graph.txt, or MODULE:FUNCTION")
    parser.add_argument("--batch-size", type=_batch_size, default=None, help="global batch size (default: the model's)")
    parser.add_argument("--tiny", action="store_true", help="the zoo model's tiny variant")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tag", description="Plan distributed DNN training on heterogeneous GPU clusters.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("models", help="list the model zoo")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("clusters", help="list cluster presets and generators")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_clusters)

    p = sub.add_parser("show", help="summarise a model: ops by role, parameters, FLOPs, memory, where it fits")
    _add_model(p)
    p.add_argument("--cluster", help="preset NAME[:ARGS] or a YAML/JSON spec file")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("trace", help="trace a model (zoo name or MODULE:FUNCTION) into an OpGraph file")
    _add_model(p)
    p.add_argument("--out", required=True, help="output graph file (.json or .json.gz)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_trace)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    command: Callable[[argparse.Namespace], dict] = args.func
    try:
        payload = command(args)
    except TagError as error:
        message = " ".join(str(error).split("\n"))
        sys.stderr.write(f"tag: error: {message}\n")
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        sys.stderr.write("tag: interrupted\n")
        return 130
    if getattr(args, "json", False):
        _print_json(payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
