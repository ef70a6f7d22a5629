"""The `tag` command: the top parser, one subcommand per module of :mod:`tag.cli`, and the dispatch.

Every command module has ``add_parser(subparsers)`` and ``run(args) -> dict``: it parses, calls the
library, renders through :mod:`tag.cli.report` unless ``--json`` was asked for, and returns the payload
that ``--json`` prints. Bad input ends in one ``tag: error: ...`` line on stderr and exit status 2,
never a traceback; the output files of a command land when it succeeds, or none do.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import Callable, NoReturn, Sequence

from tag._atomic import staged_outputs
from tag.errors import TagError

__all__ = ["main", "build_parser", "COMMANDS", "EXIT_BAD_INPUT"]

EXIT_BAD_INPUT = 2

# the modules of tag.cli, one per subcommand, in the order `tag --help` lists them
COMMANDS = ("models", "clusters", "show", "trace", "plan", "simulate", "baselines", "train", "run", "profile",
            "compare", "pipeline")


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one ``tag: error:`` line and exit status 2, like every other bad input (the
    usage is for --help); the subparsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("tag").strip()
        message = "".join(c if c.isprintable() else " " for c in message)  # an argument may hold a newline
        self.exit(EXIT_BAD_INPUT, f"tag: error: {command + ': ' if command else ''}{message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tag", description="Plan distributed DNN training on heterogeneous GPU clusters.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"tag.cli.{name}").add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from tag.cli.report import print_json

    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    command: Callable[[argparse.Namespace], dict] = args.func
    try:
        with staged_outputs() as args.stage:  # every output file lands when the command succeeds, or none
            payload = command(args)
    except TagError as error:
        # one line whatever names it quotes: newlines, carriage returns and terminal escapes become spaces
        message = "".join(c if c.isprintable() else " " for c in str(error))
        sys.stderr.write(f"tag: error: {message}\n")
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        sys.stderr.write("tag: interrupted\n")
        return 130
    if getattr(args, "json", False):
        print_json(payload)
    return 0
