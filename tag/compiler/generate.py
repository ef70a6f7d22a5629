"""Random strategies, for testing the compiler and for benchmarks (the strategy space MCTS searches)."""

from __future__ import annotations

import numpy as np

from tag._rng import as_rng
from tag.cluster import Cluster
from tag.strategy import OPTIONS, Strategy

__all__ = ["random_strategy"]


def random_strategy(num_groups: int, cluster: Cluster, *, seed: int | np.random.Generator | None = 0,
                    p_place: float = 0.5, options: tuple[int, ...] = tuple(range(len(OPTIONS))),
                    batch_split: str | None = None) -> Strategy:
    """A strategy placing each op group on a random non-empty set of device groups (each with probability
    ``p_place``) with an option drawn uniformly from ``options``; ``batch_split`` even or speed (None:
    drawn)."""
    rng = as_rng(seed)
    m = cluster.num_device_groups
    placement = rng.random((num_groups, m)) < p_place
    empty = ~placement.any(axis=1)
    placement[np.flatnonzero(empty), rng.integers(0, m, size=int(empty.sum()))] = True
    option = rng.choice(np.asarray(options), size=num_groups)
    split = batch_split if batch_split is not None else ("even", "speed")[int(rng.integers(2))]
    return Strategy.from_cluster(cluster, placement, option, batch_split=split)
