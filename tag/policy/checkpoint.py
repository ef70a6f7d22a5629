"""Policy checkpoints: ``{model, optimizer, config, step}`` written atomically, read with ``weights_only=True``."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, NamedTuple

import torch

from tag._atomic import atomic_open
from tag._read import check_input_file
from tag.errors import OutputError, TagError
from tag.policy.errors import PolicyError
from tag.policy.features import FEATURE_VERSION
from tag.policy.gnn import HeteroPolicy, PolicyConfig

__all__ = ["PolicyCheckpoint", "save_policy", "load_policy", "shipped_policy_path", "CHECKPOINT_FORMAT",
           "CHECKPOINT_VERSION"]

MAX_CHECKPOINT_BYTES = 4 << 30  # torch.load holds the whole file: the largest policy is ~200 MB, a run's replay more
CHECKPOINT_FORMAT = "tag.policy"
CHECKPOINT_VERSION = 1
_REQUIRED = ("format", "version", "feature_version", "config", "model", "optimizer", "step")


class PolicyCheckpoint(NamedTuple):
    """What :func:`load_policy` returns."""

    model: HeteroPolicy  # weights loaded, on the CPU unless map_location says otherwise
    config: PolicyConfig
    optimizer: dict[str, Any] | None  # the optimizer's state_dict, for ``optimizer.load_state_dict``
    step: int  # training steps taken when saved


def save_policy(path: str | os.PathLike, model: HeteroPolicy, config: PolicyConfig,
                optimizer: torch.optim.Optimizer | None = None, step: int = 0) -> None:
    """Write ``{format, version, feature_version, config, model, optimizer, step}`` to ``path`` atomically
    (a crash leaves the previous file, never half of one). ``config`` must be the model's."""
    if not isinstance(model, HeteroPolicy):
        raise PolicyError(f"save_policy needs a HeteroPolicy, got {type(model).__name__}")
    if not isinstance(config, PolicyConfig) or config != model.config:
        raise PolicyError(f"config {config!r} is not the model's ({model.config!r})")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise PolicyError(f"step must be a non-negative integer, got {step!r}")
    payload = {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "feature_version": FEATURE_VERSION,
        "config": config.to_dict(),
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "step": step,
    }
    try:
        with atomic_open(path) as handle:
            torch.save(payload, handle)
    except OSError as exc:
        raise OutputError(f"cannot write policy checkpoint {str(path)!r}: {exc.strerror or exc}") from None


def shipped_policy_path() -> Path:
    """``checkpoints/tag-policy.pt`` of this checkout: the trained TAG policy, `tag plan`'s default priors."""
    return Path(__file__).resolve().parents[2] / "checkpoints" / "tag-policy.pt"


def load_policy(path: str | os.PathLike, *, map_location: str | torch.device = "cpu") -> PolicyCheckpoint:
    """Read a checkpoint written by :func:`save_policy` (``torch.load(weights_only=True)``: no code runs).

    PolicyError when the file is missing, unreadable or corrupt, of another format or feature version, or
    when its weights do not fit its config.
    """
    payload = read_checkpoint(path, CHECKPOINT_FORMAT, _REQUIRED, "policy checkpoint", map_location=map_location)
    if payload["version"] != CHECKPOINT_VERSION:
        raise PolicyError(f"policy checkpoint {str(path)!r} has version {payload['version']!r}; this tag reads "
                          f"version {CHECKPOINT_VERSION}")
    if payload["feature_version"] != FEATURE_VERSION:
        raise PolicyError(f"policy checkpoint {str(path)!r} was trained on features version "
                          f"{payload['feature_version']!r}; this tag computes version {FEATURE_VERSION}")
    step = payload["step"]
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise PolicyError(f"policy checkpoint {str(path)!r}: step must be a non-negative integer, got {step!r}")
    try:
        config = PolicyConfig.from_dict(payload["config"])
    except (PolicyError, TypeError) as exc:
        raise PolicyError(f"policy checkpoint {str(path)!r}: bad config: {exc}") from None
    model = HeteroPolicy(**config.to_dict())
    load_weights(model, payload["model"], f"policy checkpoint {str(path)!r}")
    optimizer = payload["optimizer"]
    if optimizer is not None and not isinstance(optimizer, dict):
        raise PolicyError(f"policy checkpoint {str(path)!r}: optimizer state must be a dict or None")
    return PolicyCheckpoint(model.to(map_location), config, optimizer, step)


def read_checkpoint(path: str | os.PathLike, fmt: str, required: tuple[str, ...], what: str, *,
                    map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """The payload dict of a checkpoint file of format ``fmt`` holding ``required`` keys, read with
    ``weights_only=True``; PolicyError naming ``what`` when it is missing, corrupt or of another format."""
    path = Path(path)
    payload = load_torch_file(path, what=what, error=PolicyError, map_location=map_location)
    if not isinstance(payload, dict) or payload.get("format") != fmt:
        found = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise PolicyError(f"{str(path)!r} is not a {what} (format {found!r}, expected {fmt!r})")
    missing = [key for key in required if key not in payload]
    if missing:
        raise PolicyError(f"{what} {str(path)!r} lacks {', '.join(missing)}")
    return payload


def load_torch_file(path: str | os.PathLike, *, what: str, error: type[TagError],
                    map_location: str | torch.device = "cpu") -> Any:
    """``torch.load(path, weights_only=True)``; ``error`` naming ``what`` and the reason when the file is
    missing, cannot be read, is damaged, or needs a global that weights-only loading refuses."""
    check_input_file(path, what=what, error=error, missing=f"no {what} at {str(path)!r}", limit=MAX_CHECKPOINT_BYTES)
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # torch raises pickle, zip, EOF and runtime errors for a damaged file
        raise error(f"{str(path)!r} is not a readable {what}: {_load_failure(exc)}") from None


def _load_failure(exc: Exception) -> str:
    """One line saying why torch.load failed: for a refused pickle the global it refused (torch's message
    buries it under a paragraph about the weights_only default)."""
    text = str(exc).strip()
    refused = re.search(r"GLOBAL ([\w.]+)", text)  # torch words it differently from version to version
    if refused:
        return f"Unsupported global: {refused.group(1)} (weights-only loading runs no code from a checkpoint)"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0][:300] if lines else type(exc).__name__


def load_weights(model: torch.nn.Module, state: Any, where: str) -> None:
    """``model.load_state_dict(state, strict=True)``, or PolicyError saying that ``where``'s weights do not
    fit its config."""
    try:
        model.load_state_dict(state, strict=True)
    except (RuntimeError, TypeError, AttributeError) as exc:
        first = str(exc).strip().splitlines()
        raise PolicyError(f"{where}: the weights do not fit its config "
                          f"({first[0][:200] if first else type(exc).__name__})") from None
