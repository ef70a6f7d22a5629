"""``tag train --config training/configs/X.toml [--out DIR] [--resume] [--steps N] [--workers N] [--json]``."""

from __future__ import annotations

import argparse
import logging
import os
import signal
from pathlib import Path
from typing import Any

__all__ = ["add_train_parser", "cmd_train"]

log = logging.getLogger(__name__)
DEFAULT_RUNS = Path("runs")  # runs/<config name>/ unless --out says otherwise (gitignored)


def add_train_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``train`` on the ``tag`` command's subparsers."""
    p = subparsers.add_parser("train", help="train the TAG policy by self-play on random topologies")
    p.add_argument("--config", required=True, metavar="TOML", help="training config (training/configs/*.toml)")
    p.add_argument("--out", metavar="DIR", help="run folder: checkpoint.pt, policy.pt, history.json, "
                                                "tensorboard/ (default: runs/<config name>)")
    p.add_argument("--resume", action="store_true", help="continue the run whose checkpoint is in --out")
    from tag.cli.args import int_in as _int_in  # the argument types of every command, with their ranges

    p.add_argument("--steps", type=_int_in(1, 10**9, "1..10^9"), metavar="N",
                   help="total gradient steps (overrides the config's)")
    p.add_argument("--workers", type=_int_in(0, 1024, "0..1024"), metavar="N",
                   help="self-play processes (overrides the config's; 0: in this process)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.set_defaults(func=cmd_train)
    return p


def cmd_train(args: argparse.Namespace) -> dict[str, Any]:
    from tag.training.config import load_config
    from tag.training.loop import train

    default = args.out is None  # runs/<config name>: checked as well, named as the run folder
    out = _run_folder(str(DEFAULT_RUNS / Path(args.config).name.removesuffix(".toml")) if default else args.out,
                      flag="run folder" if default else "--out")
    config = load_config(args.config)
    overrides = {k: v for k, v in (("total_steps", args.steps), ("workers", args.workers)) if v is not None}
    config = config.replace(**overrides)
    previous = signal.signal(signal.SIGTERM, _interrupt)  # `kill`: stop like Ctrl-C, workers shut down
    try:
        with _progress(config.total_steps, quiet=args.json) as on_round:
            summary = train(config, out, resume=args.resume, on_round=on_round)
    finally:
        signal.signal(signal.SIGTERM, previous)
    payload = summary.as_dict()
    if not args.json:
        _print_summary(payload)
    return payload


class _progress:
    """A rich progress bar over gradient steps (on stderr, so that --json output stays clean); each round
    is also logged (``tag -v``)."""

    def __init__(self, total: int, *, quiet: bool) -> None:
        self.total = total
        self.quiet = quiet
        self.bar = None

    def __enter__(self):
        if not self.quiet:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("training"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                TextColumn("{task.fields[status]}"), console=Console(stderr=True), transient=True)
            self.bar.start()
            self.task = self.bar.add_task("train", total=self.total, status="")
        return self.on_round

    def on_round(self, row: dict[str, Any]) -> None:
        status = (f"games {row['games']}  loss {row['loss']:.3f}" if row.get("loss") is not None
                  else f"games {row['games']}")
        status += f"  speed-up {row['selfplay_speedup']:.2f}"
        log.info("round %d step %d: %s", row["round"], row["step"],
                 {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()})
        if self.bar is not None:
            self.bar.update(self.task, completed=min(row["step"], self.total), status=status)

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.stop()


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _print_summary(payload: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="tag train", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    loss = payload["final_loss"]
    for what, value in (("steps", payload["step"]), ("rounds", payload["rounds"]), ("games", payload["games"]),
                        ("replay states", payload["replay_size"]),
                        ("final loss", "-" if loss is None else f"{loss:.4f}"),
                        ("wall time", f"{payload['wall_s']:.0f} s"), ("checkpoint", payload["checkpoint"]),
                        ("policy", payload["policy"])):
        table.add_row(what, escape(str(value)))  # run folders are the user's names: "[/]" prints as written
    Console(highlight=False).print(table)


def _run_folder(text: str, *, flag: str = "--out") -> Path:
    """The --out run folder, checked before any work: a folder, or a name whose nearest existing parent is
    a folder this process may write into."""
    from tag.errors import OutputError

    shown = f"{flag} {text[:80]!r}{'…' if len(text) > 80 else ''}"
    if not text:
        raise OutputError("--out '': expected a run folder")
    path = Path(text)
    try:
        if path.exists() and not path.is_dir():
            raise OutputError(f"{shown}: exists and is not a folder")
        existing = next(p for p in (path, *path.parents) if p.exists())
        if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
            raise OutputError(f"{shown}: cannot write into {str(existing)!r}")
    except OSError as error:  # a name the OS refuses (too long)
        raise OutputError(f"{shown}: {error.strerror or error}") from None
    return path
