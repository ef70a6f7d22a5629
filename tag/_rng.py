"""The one way tag turns a seed into a ``numpy.random.Generator``."""

from __future__ import annotations

import numpy as np

from tag.errors import TagError

__all__ = ["as_rng"]


def as_rng(seed: int | np.random.Generator | None) -> np.random.Generator:
    """A Generator from a non-negative integer seed (None: fresh entropy); a Generator passes through."""
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
        raise TagError(f"seed must be a non-negative integer, a numpy Generator or None, got {seed!r}")
    return np.random.default_rng(seed)
