"""``tag train --config TOML``: self-play training of the policy. Its flags, progress bar and summary are
:mod:`tag.training.cli`'s (the training package owns them); this module registers them."""

from __future__ import annotations

import argparse

__all__ = ["add_parser", "run"]


def add_parser(subparsers) -> None:
    from tag.training.cli import add_train_parser  # torch is imported only when `tag train` runs

    add_train_parser(subparsers).set_defaults(func=run)


def run(args: argparse.Namespace) -> dict:
    from tag.training.cli import cmd_train

    return cmd_train(args)
