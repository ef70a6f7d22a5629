"""Training checkpoints: ``{model, optimizer, config, step}`` plus what a resume needs, written atomically
and read with ``torch.load(weights_only=True)``.

Besides the model, the Adam state, the config and the step, a training checkpoint holds the round and
game counters, the replay buffer (states as plain dicts of tensors, see
:class:`tag.training.selfplay.Sample`) and the history of logged scalars. Nothing else is needed to
continue: every random choice derives from ``(seed, stream, index)`` (games, minibatches), so no rng
state is saved. The replay buffer is saved, not rebuilt: rebuilding it would mean replaying every game.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NamedTuple

import torch

from tag._atomic import atomic_open
from tag.errors import OutputError
from tag.policy import FEATURE_VERSION, HeteroPolicy
from tag.policy.checkpoint import load_torch_file
from tag.training.config import RUNTIME_FIELDS, TrainConfig
from tag.training.errors import TrainingError
from tag.training.selfplay import Sample

__all__ = ["TrainState", "save_train_state", "load_train_state", "TRAIN_FORMAT", "TRAIN_VERSION"]

TRAIN_FORMAT = "tag.training"
TRAIN_VERSION = 1
_REQUIRED = ("format", "version", "feature_version", "config", "model", "optimizer", "step", "round", "games",
             "replay", "history")


class TrainState(NamedTuple):
    """A training run between two rounds."""

    model: HeteroPolicy
    optimizer: dict[str, Any]  # Adam's state_dict
    config: TrainConfig
    step: int  # gradient steps taken
    round: int  # rounds finished
    games: int  # self-play games played (the next game's index)
    replay: list[Sample]  # oldest first
    history: list[dict[str, float]]  # one row of scalars per logged round


def save_train_state(path: str | os.PathLike, state: TrainState) -> None:
    payload = {
        "format": TRAIN_FORMAT, "version": TRAIN_VERSION, "feature_version": FEATURE_VERSION,
        "config": state.config.to_dict(), "model": state.model.state_dict(), "optimizer": state.optimizer,
        "step": state.step, "round": state.round, "games": state.games,
        "replay": [{"data": s.data, "target": s.target} for s in state.replay],
        "history": state.history,
    }
    try:
        with atomic_open(path) as handle:
            torch.save(payload, handle)
    except OSError as exc:
        raise OutputError(f"cannot write training checkpoint {str(path)!r}: {exc.strerror or exc}") from None


def load_train_state(path: str | os.PathLike, expected: TrainConfig | None = None) -> TrainState:
    """Read a training checkpoint. With ``expected``, the checkpoint's config must equal it except in the
    fields that only say how long or how the run executes (RUNTIME_FIELDS), which ``expected`` overrides.
    TrainingError when the file is missing, corrupt, of another format, or mismatched."""
    path = Path(path)
    payload = load_torch_file(path, what="training checkpoint", error=TrainingError)
    where = f"training checkpoint {str(path)!r}"
    if not isinstance(payload, dict) or payload.get("format") != TRAIN_FORMAT:
        raise TrainingError(f"{str(path)!r} is not a training checkpoint (expected format {TRAIN_FORMAT!r})")
    missing = [key for key in _REQUIRED if key not in payload]
    if missing:
        raise TrainingError(f"{where} lacks {', '.join(missing)}")
    if payload["version"] != TRAIN_VERSION or payload["feature_version"] != FEATURE_VERSION:
        raise TrainingError(f"{where} has version {payload['version']!r} / features {payload['feature_version']!r};"
                            f" this tag reads {TRAIN_VERSION} / {FEATURE_VERSION}")
    config = TrainConfig.from_dict(payload["config"], where=where)
    if expected is not None:
        config = _reconcile(config, expected, where)
    for key in ("step", "round", "games"):
        value = payload[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise TrainingError(f"{where}: {key} must be a non-negative integer, got {value!r}")
    model = HeteroPolicy(**config.policy.to_dict())
    try:
        model.load_state_dict(payload["model"], strict=True)
    except (RuntimeError, TypeError, AttributeError) as exc:
        first = str(exc).strip().splitlines()
        raise TrainingError(f"{where}: the weights do not fit its config "
                            f"({first[0][:200] if first else type(exc).__name__})") from None
    replay = _replay(payload["replay"], where)
    if not isinstance(payload["optimizer"], dict) or not isinstance(payload["history"], list):
        raise TrainingError(f"{where}: optimizer must be a dict and history a list")
    return TrainState(model, payload["optimizer"], config, payload["step"], payload["round"], payload["games"],
                      replay, payload["history"])


def _reconcile(saved: TrainConfig, expected: TrainConfig, where: str) -> TrainConfig:
    saved_fields, expected_fields = saved.to_dict(), expected.to_dict()
    differing = sorted(k for k in saved_fields if k not in RUNTIME_FIELDS and saved_fields[k] != expected_fields[k])
    if differing:
        shown = "; ".join(f"{k}: checkpoint {saved_fields[k]!r}, config {expected_fields[k]!r}" for k in differing)
        raise TrainingError(f"{where} was written by a run with another config ({shown}); "
                            "use a fresh --out or the config it was trained with")
    return saved.replace(**{k: getattr(expected, k) for k in RUNTIME_FIELDS})


def _replay(rows: Any, where: str) -> list[Sample]:
    if not isinstance(rows, list):
        raise TrainingError(f"{where}: replay must be a list")
    out = []
    for k, row in enumerate(rows):
        if not isinstance(row, dict) or not isinstance(row.get("data"), dict) or not isinstance(
                row.get("target"), torch.Tensor):
            raise TrainingError(f"{where}: replay[{k}] is not a (data, target) pair")
        out.append(Sample(row["data"], row["target"]))
    return out
