"""Heuristic stage-to-device mappings (Parmesan §VIII-A, §VIII-C): CS map, p2p map, random.

Each takes a :class:`tag.exact.mapping.MappingProblem` (read duck-typed: ``num_stages``,
``num_replicas``, ``num_devices``, ``bandwidth``, ``latency``, ``stage_pairs()``) and returns a mapping
[S, R] of device ids: row s lists the devices of stage s's replicas in all-reduce ring order, and
replica r of every stage forms replica chain r. No device appears twice.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tag._rng import as_rng
from tag.exact._mapping_kernel import connectivity_order, stage_adjacency

__all__ = ["cs_map", "p2p_map", "random_map"]


def cs_map(problem: Any) -> np.ndarray:
    """Consecutive stages on consecutive devices, stage-major: stage s takes devices s·R … s·R + R − 1.

    The usual hand mapping (Parmesan's baseline): a stage's replicas sit together, which favours its
    all-reduce ("all-reduce first").
    """
    num_stages, replicas = problem.num_stages, problem.num_replicas
    return np.arange(num_stages * replicas, dtype=np.int64).reshape(num_stages, replicas)


def p2p_map(problem: Any) -> np.ndarray:
    """p2p-sequential: one replica chain after another, each grown greedily along the widest links.

    A chain's first stage takes the lowest free device; every later stage (in connectivity order) the
    free device with the cheapest transfers (α + M/B) to the devices of its already placed neighbours
    in the same chain, ties to the lowest id. On a hierarchical cluster this fills a machine with one
    chain before the next; with R = 1 it is the CS map there.
    """
    num_stages, replicas, num_devices = problem.num_stages, problem.num_replicas, problem.num_devices
    pairs, pair_bytes = problem.stage_pairs()
    adj = stage_adjacency(num_stages, pairs)
    order = connectivity_order(num_stages, pairs)
    bandwidth, latency = problem.bandwidth, problem.latency
    free = np.ones(num_devices, dtype=bool)
    mapping = np.full((num_stages, replicas), -1, dtype=np.int64)
    for chain in range(replicas):
        for s in order:
            cost = np.zeros(num_devices)
            for k, other in adj[s]:
                y = mapping[other, chain]
                if y >= 0:
                    cost = cost + latency[:, y] + pair_bytes[k] / bandwidth[:, y]
            cost[~free] = np.inf
            device = int(np.argmin(cost))  # first minimum: the lowest id among ties
            mapping[s, chain] = device
            free[device] = False
    return mapping


def random_map(problem: Any, seed: int | np.random.Generator | None = 0) -> np.ndarray:
    """S·R distinct devices drawn uniformly, in random order."""
    rng = as_rng(seed)
    chosen = rng.permutation(problem.num_devices)[:problem.num_stages * problem.num_replicas]
    return chosen.reshape(problem.num_stages, problem.num_replicas).astype(np.int64)
