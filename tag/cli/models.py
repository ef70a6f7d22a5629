"""``tag models``: the model zoo."""

from __future__ import annotations

import argparse

from tag.cli.args import add_json

__all__ = ["add_parser", "run"]


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("models", help="list the model zoo")
    add_json(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> dict:
    from tag.models import list_models

    rows = [{"name": spec.name, "description": spec.description, "batch_size": spec.batch_size,
             "paper_parameters": spec.paper_parameters, "paper_source": spec.paper_source}
            for spec in list_models()]
    payload = {"models": rows}
    if not args.json:
        from tag.cli.report import render_models

        render_models(payload)
    return payload
