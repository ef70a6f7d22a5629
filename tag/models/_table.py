"""Print the zoo's table for ``docs/models.md`` with parameter counts computed on the meta device.

Run ``python -m tag.models._table`` and paste its rows; the remarks column is written by hand.
"""

from __future__ import annotations

import dataclasses
import sys

from tag.models.spec import ModelSpec
from tag.models.zoo import list_models

_INPUT_FIELDS = {"image_size", "seq_len", "src_len", "tgt_len"}  # shown in the input column instead
HEADER = ("| model | architecture (full size) | batch | input per sample | our parameters | fp32 MiB "
          "| paper's figure | source | remarks |")


def count_parameters(spec: ModelSpec, *, tiny: bool = False) -> int:
    """Parameters of the model built on ``meta`` (shared tensors counted once)."""
    model, _, _ = spec.build(tiny=tiny)
    return sum(p.numel() for p in model.parameters())


def _architecture(config: object) -> str:
    return ", ".join(f"{field.name} {getattr(config, field.name)}" for field in dataclasses.fields(config)
                     if field.name not in _INPUT_FIELDS)


def table_row(spec: ModelSpec) -> str:
    count = count_parameters(spec)
    paper = "—" if spec.paper_parameters is None else f"{spec.paper_parameters / 1e6:.1f}M"
    cells = (f"`{spec.name}`", _architecture(spec.full.config), str(spec.batch_size), spec.full.input_size,
             f"{count:,}", f"{count * 4 / 2**20:,.0f}", paper, spec.paper_source, "")
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    sys.stdout.write(HEADER + "\n" + "|---" * HEADER.count(" | ") + "|---|\n")
    for spec in list_models():
        sys.stdout.write(table_row(spec) + "\n")


if __name__ == "__main__":
    main()
