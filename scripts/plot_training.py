"""Training curves of a `tag train` run as one PNG, from the run's history.json (one row per round).

    .venv/bin/python scripts/plot_training.py runs/tag-policy --out docs/training-curves.png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PANELS = (  # (history keys, title, y label)
    (("loss",), "cross-entropy loss (per round)", "loss"),
    (("selfplay_speedup",), "self-play: best speed-up over DP-NCCL", "speed-up"),
    (("val_iterations_to_beat", "val_uniform_iterations_to_beat"), "validation: iterations to beat DP-NCCL",
     "iterations (miss = budget + 1)"),
    (("games_per_s", "samples_per_s"), "self-play throughput", "per second"),
)


def plot(history: list[dict], out: Path, title: str) -> None:
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    for ax, (keys, name, label) in zip(axes.flat, PANELS):
        for key in keys:
            points = [(row["step"], row[key]) for row in history if row.get(key) is not None]
            if key == "val_uniform_iterations_to_beat" and points:  # measured once: a reference line
                ax.axhline(points[0][1], color="grey", linestyle="--", label="pure MCTS (uniform priors)")
                continue
            if points:
                steps, values = zip(*points)
                ax.plot(steps, values, marker="." if len(points) < 60 else None,
                        label={"val_iterations_to_beat": "GNN-guided"}.get(key, key.replace("_", " ")))
        ax.set_title(name)
        ax.set_xlabel("gradient step")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        if len(ax.get_legend_handles_labels()[0]) > 1:
            ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="a tag train --out folder (or its history.json)")
    p.add_argument("--out", default="docs/training-curves.png")
    args = p.parse_args(argv)
    path = Path(args.run)
    path = path / "history.json" if path.is_dir() else path
    history = json.loads(path.read_text())
    last = history[-1]
    title = (f"tag train: {last['step']} steps, {last.get('games', 0)} games, "
             f"{last.get('wall_s', 0) / 60:.0f} min wall time")
    plot(history, Path(args.out), title)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
