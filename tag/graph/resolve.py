"""Turn the MODEL argument of every command into an OpGraph.

MODEL is a zoo name (prebuilt graph from datasets/ when present, else traced on the fly), a graph
file (.json / .json.gz), a PipeDream profile (graph.txt), or MODULE:FUNCTION / path.py:FUNCTION.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from tag._read import check_input_file, input_is_file
from tag.errors import ModelError
from tag.graph.io import load_graph
from tag.graph.opgraph import OpGraph

__all__ = ["resolve_model", "datasets_dir", "prebuilt_path"]


def datasets_dir() -> Path:
    """Where prebuilt graphs live: $TAG_DATASETS, else datasets/ beside the package."""
    override = os.environ.get("TAG_DATASETS")
    if override:
        return Path(override)
    return Path(__file__).resolve().parents[2] / "datasets"


def prebuilt_path(name: str, *, tiny: bool = False) -> Path:
    return datasets_dir() / f"{name}{'-tiny' if tiny else ''}.json.gz"


def _is_graph_file(text: str) -> bool:
    return text.lower().endswith((".json", ".json.gz"))


def resolve_model(text: str, *, batch_size: int | None = None, tiny: bool = False, progress=None) -> OpGraph:
    """The OpGraph named by ``text``; ModelError with the accepted forms when nothing matches."""
    if not isinstance(text, str) or not text.strip():
        raise ModelError("MODEL is empty; give a zoo name (see `tag models`), a graph file, a graph.txt or MODULE:FUNCTION")
    text = text.strip()
    graph: OpGraph | None = None
    if _is_graph_file(text):
        graph = load_graph(text)
    elif text.lower().endswith(".txt"):
        from tag.graph.pipedream import load_pipedream

        if not input_is_file(text):
            check_input_file(text, what="PipeDream profile", error=ModelError)  # says why not
        graph = load_pipedream(text)
    elif input_is_file(prebuilt_path(text, tiny=tiny)):
        graph = load_graph(prebuilt_path(text, tiny=tiny))  # no torch import needed
        if batch_size is not None and batch_size != graph.batch_size:
            from tag.graph.tracer import trace_zoo

            # Traced at the new batch rather than rescaled, so the executor records stay valid.
            graph = trace_zoo(text, tiny=tiny, batch_size=batch_size)
    else:
        from tag.models import MODELS

        if text in MODELS:
            from tag.graph.tracer import trace_zoo

            graph = trace_zoo(text, tiny=tiny, batch_size=batch_size)
        elif ":" in text:
            from tag.graph.tracer import trace
            from tag.graph.user_code import load_user_step

            model, inputs, loss_fn, targets = load_user_step(text)
            with contextlib.redirect_stdout(sys.stderr):  # the user's forward may print; stdout is for --json
                graph = trace(model, inputs, loss_fn, name=text.rsplit(":", 1)[-1], progress=progress,
                              targets=targets)
        else:
            raise ModelError(
                f"unknown model {text!r}: not a zoo model ({', '.join(MODELS)}), "
                "not a .json/.json.gz graph, not a graph.txt profile, not MODULE:FUNCTION"
            )
    if batch_size is not None and batch_size != graph.batch_size:
        graph = graph.with_batch_size(batch_size)
    return graph
