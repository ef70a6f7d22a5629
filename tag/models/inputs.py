"""Example-input factories. On ``meta`` they only carry shapes; elsewhere they draw from a generator."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["token_ids", "features", "images"]


def token_ids(shape: tuple[int, ...], vocab_size: int, device: torch.device,
              generator: torch.Generator | None) -> Tensor:
    """Integer ids in ``[0, vocab_size)``, dtype long, of ``shape`` (e.g. ``[batch, seq]``)."""
    if device.type == "meta":
        return torch.zeros(shape, dtype=torch.long, device=device)
    return torch.randint(0, vocab_size, shape, generator=generator).to(device)


def features(shape: tuple[int, ...], device: torch.device, generator: torch.Generator | None) -> Tensor:
    """Standard-normal float32 features of ``shape`` (e.g. ``[batch, dim]``)."""
    if device.type == "meta":
        return torch.empty(shape, device=device)
    return torch.randn(shape, generator=generator).to(device)


def images(batch_size: int, image_size: int, device: torch.device,
           generator: torch.Generator | None, *, channels: int = 3) -> Tensor:
    """A batch of images ``[batch, channels, image_size, image_size]``."""
    return features((batch_size, channels, image_size, image_size), device, generator)
