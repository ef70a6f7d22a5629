"""The one way tag turns a seed into a ``numpy.random.Generator``."""

from __future__ import annotations

import numpy as np

from tag.errors import TagError

__all__ = ["as_rng", "MAX_SEED"]

MAX_SEED = 2**63 - 1  # METIS and torch take a signed 64-bit seed


def as_rng(seed: int | np.random.Generator | None) -> np.random.Generator:
    """A Generator from an integer seed in 0..MAX_SEED (None: fresh entropy); a Generator passes through."""
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))
                             or not 0 <= seed <= MAX_SEED):
        raise TagError(f"seed must be an integer in 0..2^63-1, a numpy Generator or None, got {seed!r}")
    return np.random.default_rng(seed)
