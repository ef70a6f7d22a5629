"""``tag trace MODEL --out GRAPH.json``: trace a model into an OpGraph file."""

from __future__ import annotations

import argparse

from tag.cli.args import add_json, add_model, named, output_path, write_output

__all__ = ["add_parser", "run"]


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("trace", help="trace a model (zoo name or MODULE:FUNCTION) into an OpGraph file")
    add_model(p)
    p.add_argument("--out", type=named, required=True, help="output graph file (.json or .json.gz)")
    add_json(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> dict:
    from tag.cli.show import model_summary
    from tag.graph.io import save_graph
    from tag.graph.resolve import resolve_model

    output_path(args.out)
    graph = resolve_model(args.model, batch_size=args.batch_size, tiny=args.tiny)
    write_output(args, "--out", args.out, lambda path: save_graph(graph, path))
    payload = {"out": str(args.out), **model_summary(graph)}
    if not args.json:
        from tag.cli.report import render_trace

        render_trace(payload)
    return payload
