"""The `tag` command (:func:`main`): :mod:`tag.cli.main` parses and dispatches, one module per subcommand
parses its flags and calls the library, :mod:`tag.cli.args` holds the flags the commands share and
:mod:`tag.cli.report` every human-readable report."""

from tag.cli.main import build_parser, main

__all__ = ["main", "build_parser"]
