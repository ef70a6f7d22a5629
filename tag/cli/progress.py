"""What the commands show on stderr while they work: a spinner, the search's bar, `tag run`'s step bar.
Each is a no-op when stderr is not a terminal, so that pipes and ``--json`` get only the result."""

from __future__ import annotations

import contextlib
import sys

__all__ = ["status", "search_progress", "progress_callback", "step_progress", "interactive"]


def interactive(args) -> bool:
    """Whether to draw on stderr: a terminal, and no ``--json`` asked for."""
    return sys.stderr.isatty() and not getattr(args, "json", False)


def status(enabled: bool, message: str):
    """A spinner on stderr while a long step runs; a no-op context when disabled."""
    if not enabled:
        return contextlib.nullcontext(None)
    from rich.console import Console

    from tag.cli.report import shown

    return Console(stderr=True).status(shown(message))


def search_progress(enabled: bool):
    """A rich progress bar on stderr with the best speed-up so far; a no-op context when disabled."""
    if not enabled:
        return contextlib.nullcontext(None)
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                    TextColumn("{task.fields[status]}"), TimeElapsedColumn(),
                    console=Console(stderr=True), transient=True)


def progress_callback(bar, description: str):
    """The search's progress hook drawing on ``bar`` (None: no hook)."""
    if bar is None:
        return None
    from tag.cli.report import shown

    task = bar.add_task(shown(description), total=1.0, status="")

    def callback(p) -> None:
        best = f"best {p.best_speedup:.3f}x" if p.best_speedup > 0 else "no feasible plan yet"
        bar.update(task, completed=p.fraction(), status=f"{p.iteration} it, {p.num_simulations} sims, {best}")

    return callback


@contextlib.contextmanager
def step_progress(what: str, steps: int):
    """A bar of the optimizer steps rank 0 has finished, on stderr when it is a terminal; yields the
    callback (None when there is no terminal)."""
    from tag.execute.launch import torchrun_rank

    if not sys.stderr.isatty() or (torchrun_rank() or (0, 1))[0] != 0:  # one bar: rank 0's
        yield None
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn(f"running {escape(what)}: steps"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("steps", total=steps)
        yield lambda done, total: bar.update(task, completed=done)
