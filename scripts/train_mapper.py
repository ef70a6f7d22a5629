"""Train the learned stage-to-device mapper by imitating the exact mapper (issue 8; tag.training.mapper).

Builds the instances (a progress bar per exact solve), trains with a progress bar per Adam step, writes
``OUT/checkpoint.pt`` after every epoch and ``OUT/history.json``; ``--resume`` continues an interrupted
run. ``--ship PATH`` copies the best policy (least mean validation gap; without optimizer state) to PATH,
e.g. the shipped ``checkpoints/tag-mapper.pt``. The last line of stdout is one JSON object of the run's figures.

    .venv/bin/python scripts/train_mapper.py [--out runs/mapper] [--instances 600] [--epochs 30]
        [--hidden 64] [--heads 4] [--layers 3] [--families F ...] [--resume] [--ship checkpoints/tag-mapper.pt]
        [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tag.errors import TagError
from tag.policy.mapping import MappingPolicyConfig, load_mapping_policy, save_mapping_policy
from tag.training.mapper import FAMILIES, MapperTrainConfig, train_mapper


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = MapperTrainConfig()
    parser.add_argument("--out", type=Path, default=Path("runs/mapper"))
    parser.add_argument("--instances", type=int, default=defaults.instances)
    parser.add_argument("--validation", type=int, default=defaults.validation)
    parser.add_argument("--epochs", type=int, default=defaults.epochs)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--exact-time-limit", type=float, default=defaults.exact_time_limit)
    parser.add_argument("--families", nargs="+", choices=FAMILIES, default=list(defaults.families),
                        help="topology families to train on (default: all but tag.training.mapper.HELD_OUT)")
    parser.add_argument("--hidden", type=int, default=defaults.policy.hidden, help="width of the GNN's embeddings")
    parser.add_argument("--heads", type=int, default=defaults.policy.heads, help="attention heads per GATv2 layer")
    parser.add_argument("--layers", type=int, default=defaults.policy.num_layers, help="message-passing layers")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--ship", type=Path, help="write the best policy (no optimizer state) here")
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    args = parser.parse_args()
    torch.set_num_threads(1)
    try:
        policy = MappingPolicyConfig(hidden=args.hidden, heads=args.heads, num_layers=args.layers)
    except TagError as exc:
        parser.error(str(exc))
    config = MapperTrainConfig(instances=args.instances, validation=args.validation, epochs=args.epochs,
                               seed=args.seed, exact_time_limit=args.exact_time_limit, families=tuple(args.families),
                               policy=policy)
    console = Console(stderr=True)
    start = time.perf_counter()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        tasks: dict[str, int] = {}

        def progress(phase: str, done: int, total: int, text: str) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(phase, total=total)
            bar.update(tasks[phase], completed=done, description=f"{phase}: {text}"[:90])

        try:
            summary = train_mapper(config, args.out, resume=args.resume, progress=progress)
        except TagError as exc:
            console.print(f"[red]error:[/red] {exc}")
            return 2
    summary["wall_seconds"] = time.perf_counter() - start
    if args.ship:
        saved = load_mapping_policy(summary["best"])
        save_mapping_policy(args.ship, saved.model, None, saved.step, saved.meta)
        summary["shipped"] = str(args.ship)
    if not args.json:
        table = Table(title=f"mapper training, {summary['instances']} instances "
                            f"({summary['proven_targets']} targets proven optimal)")
        for column in ("epoch", "loss", "validation median gap", "validation mean gap", "seconds"):
            table.add_column(column, justify="right")
        for row in summary["history"]:
            table.add_row(str(row["epoch"]), f"{row['loss']:.3f}", f"{100 * row['validation_median_gap']:.2f}%",
                          f"{100 * row['validation_mean_gap']:.2f}%", f"{row['epoch_seconds']:.1f}")
        Console().print(table)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
