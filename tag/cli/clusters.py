"""``tag clusters``: the cluster presets and generators."""

from __future__ import annotations

import argparse

from tag.cli.args import add_json

__all__ = ["add_parser", "run"]


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("clusters", help="list cluster presets and generators")
    add_json(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> dict:
    from tag.cluster import list_presets

    payload = {"clusters": list_presets()}
    if not args.json:
        from tag.cli.report import render_clusters

        render_clusters(payload)
    return payload
