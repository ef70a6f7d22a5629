"""Checkpoints of the learned mapper's network: ``{format, version, feature_version, config, model,
optimizer, step, meta}``, written atomically and read with ``weights_only=True``; the shipped one is
``checkpoints/tag-mapper.pt``."""

from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path
from typing import Any, NamedTuple

import torch

from tag._atomic import atomic_open
from tag._read import check_input_file
from tag.errors import OutputError
from tag.policy.checkpoint import MAX_CHECKPOINT_BYTES, load_weights, read_checkpoint
from tag.policy.errors import PolicyError
from tag.policy.mapping.instance import MAPPING_FEATURE_VERSION
from tag.policy.mapping.model import MappingPolicy, MappingPolicyConfig

__all__ = ["MappingCheckpoint", "save_mapping_policy", "load_mapping_policy", "shipped_mapping_checkpoint",
           "resolve_mapping_policy", "CHECKPOINT_FORMAT", "CHECKPOINT_VERSION"]

CHECKPOINT_FORMAT = "tag.mapping-policy"
CHECKPOINT_VERSION = 1
_REQUIRED = ("format", "version", "feature_version", "config", "model", "optimizer", "step")


class MappingCheckpoint(NamedTuple):
    model: MappingPolicy
    config: MappingPolicyConfig
    optimizer: dict[str, Any] | None
    step: int
    meta: dict[str, Any]  # what the trainer recorded (data, wall time, figures)


def save_mapping_policy(path: str | os.PathLike, model: MappingPolicy, optimizer: torch.optim.Optimizer | None = None,
                        step: int = 0, meta: dict[str, Any] | None = None) -> None:
    """Write ``{format, version, feature_version, config, model, optimizer, step, meta}`` atomically."""
    if not isinstance(model, MappingPolicy):
        raise PolicyError(f"save_mapping_policy needs a MappingPolicy, got {type(model).__name__}")
    payload = {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION,
               "feature_version": MAPPING_FEATURE_VERSION, "config": dataclasses.asdict(model.config),
               "model": model.state_dict(), "optimizer": optimizer.state_dict() if optimizer is not None else None,
               "step": int(step), "meta": dict(meta or {})}
    try:
        with atomic_open(path) as handle:
            torch.save(payload, handle)
    except OSError as exc:
        raise OutputError(f"cannot write mapping policy {str(path)!r}: {exc.strerror or exc}") from None


def load_mapping_policy(path: str | os.PathLike) -> MappingCheckpoint:
    """Read a checkpoint of :func:`save_mapping_policy` with ``weights_only=True``; PolicyError when it is
    missing, corrupt, of another format or feature version, or its weights do not fit its config."""
    payload = read_checkpoint(path, CHECKPOINT_FORMAT, _REQUIRED, "mapping policy checkpoint")
    for key, expected in (("version", CHECKPOINT_VERSION), ("feature_version", MAPPING_FEATURE_VERSION)):
        if payload[key] != expected:
            raise PolicyError(f"mapping policy checkpoint {str(path)!r} has {key} {payload[key]!r}; "
                              f"this tag reads {expected}")
    config = MappingPolicyConfig.from_dict(payload["config"])
    model = MappingPolicy(config)
    load_weights(model, payload["model"], f"mapping policy checkpoint {str(path)!r}")
    model.eval()
    step = payload["step"]
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise PolicyError(f"mapping policy checkpoint {str(path)!r}: step must be a non-negative integer")
    meta = payload.get("meta") or {}
    return MappingCheckpoint(model, config, payload["optimizer"], step, meta if isinstance(meta, dict) else {})



def shipped_mapping_checkpoint() -> Path:
    """``checkpoints/tag-mapper.pt`` of this checkout: the trained mapping policy that ships with tag."""
    return Path(__file__).resolve().parents[3] / "checkpoints" / "tag-mapper.pt"


@functools.lru_cache(maxsize=4)
def _cached_policy(path: str, stamp: float) -> MappingPolicy:
    return load_mapping_policy(path).model


def resolve_mapping_policy(policy: MappingPolicy | str | os.PathLike | None) -> MappingPolicy:
    """A MappingPolicy as given, or loaded (and cached) from a checkpoint path; None: the shipped one."""
    if isinstance(policy, MappingPolicy):
        return policy
    path = Path(shipped_mapping_checkpoint() if policy is None else policy)
    check_input_file(path, what="mapping policy checkpoint", error=PolicyError, limit=MAX_CHECKPOINT_BYTES,
                     missing=f"no mapping policy checkpoint at {str(path)!r}"
                     + (" (train one with scripts/train_mapper.py --ship)" if policy is None else ""))
    return _cached_policy(str(path), path.stat().st_mtime)

