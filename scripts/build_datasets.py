"""Trace every zoo model (full size and tiny) into datasets/NAME.json.gz.

    python scripts/build_datasets.py                 # all models
    python scripts/build_datasets.py bert-large vgg19 --json

Prints a table (ops, parameters, trace time, file size) and ends with one JSON line of the figures.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tag.graph.io import load_graph, save_graph
from tag.graph.resolve import datasets_dir
from tag.graph.tracer import trace_zoo
from tag.models import MODELS


def build(name: str, tiny: bool, out_dir: Path) -> dict:
    start = time.perf_counter()
    graph = trace_zoo(name, tiny=tiny)
    trace_s = time.perf_counter() - start
    path = out_dir / f"{name}{'-tiny' if tiny else ''}.json.gz"
    save_graph(graph, path)
    start = time.perf_counter()
    load_graph(path)
    load_s = time.perf_counter() - start
    return {
        "model": name, "tiny": tiny, "ops": graph.num_ops, "edges": graph.num_edges, "parameters": graph.parameters,
        "trace_s": round(trace_s, 3), "load_s": round(load_s, 3), "bytes": path.stat().st_size, "path": str(path),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", default=list(MODELS), help="zoo names (default: all)")
    parser.add_argument("--out", type=Path, default=datasets_dir())
    parser.add_argument("--no-tiny", action="store_true", help="skip the tiny variants")
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    args = parser.parse_args()
    jobs = [(name, tiny) for name in args.models for tiny in ((False,) if args.no_tiny else (False, True))]
    console = Console(stderr=args.json)
    rows = []
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console, transient=args.json) as progress:
        task = progress.add_task("tracing", total=len(jobs))
        for name, tiny in jobs:
            progress.update(task, description=f"tracing {name}{' (tiny)' if tiny else ''}")
            rows.append(build(name, tiny, args.out))
            progress.advance(task)
    if not args.json:
        table = Table(title=f"Prebuilt graphs in {args.out}")
        for column in ("model", "ops", "edges", "parameters", "trace s", "load s", "size"):
            table.add_column(column, justify="right" if column != "model" else "left")
        for r in rows:
            label = r["model"] + (" (tiny)" if r["tiny"] else "")
            table.add_row(label, f"{r['ops']:,}", f"{r['edges']:,}", f"{r['parameters']:,}", f"{r['trace_s']:.2f}",
                          f"{r['load_s']:.3f}", f"{r['bytes'] / 2**20:.2f} MiB")
        console.print(table)
    print(json.dumps({"datasets": rows}))


if __name__ == "__main__":
    main()
