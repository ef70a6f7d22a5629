"""Candidate actions for one op group: the (mask, option) pairs the search chooses among (TAG §4.2.2).

An action is one row of a strategy: a non-empty mask over the M device groups and an option. Meaningless
pairs are left out, so that no two actions are the same plan:

- a mask that covers **one device** (a single device group of one device) gets one action, with
  :data:`~tag.strategy.strategy.SINGLE_DEVICE_OPTION` (every option means the same there);
- every other mask gets all four options. (MODEL_PARALLEL, ALLREDUCE and PS need ≥ 2 devices, and every
  such mask has them.)

So with ``s`` masks covering one device, ``A = s + 4 · (2^M − 1 − s)``.

Both generators return ``(masks [A, M] bool, options [A] int8)``: masks grouped together, options ascending
within a mask. Every action is already canonical: ``Strategy.with_group(g, masks[a], options[a])`` keeps
``options[a]``.

:func:`candidate_actions` enumerates every non-empty mask, bit j of the mask number being device group j
(masks in order 1, 2, 3, ..., 2^M − 1). It refuses more than ``max_device_groups`` device groups, where
the count explodes (M = 10: 4092 actions; M = 16: 262 140). :func:`restricted_actions` builds a set of
O(M + pairs) masks that stays small on big clusters.
"""

from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np

from tag.cluster import Cluster
from tag.strategy.errors import StrategyError
from tag.strategy.strategy import OPTIONS, SINGLE_DEVICE_OPTION, device_group_sizes

__all__ = ["candidate_actions", "restricted_actions", "count_actions", "DEFAULT_MAX_DEVICE_GROUPS"]

# 2^10 − 1 masks, at most 4092 actions: about the most a GNN decoder scores comfortably per step.
DEFAULT_MAX_DEVICE_GROUPS = 10


def candidate_actions(device_groups: Cluster | Sequence[int] | np.ndarray, *,
                      max_device_groups: int = DEFAULT_MAX_DEVICE_GROUPS) -> tuple[np.ndarray, np.ndarray]:
    """Every canonical action over the device groups of a cluster (or of ``[M]`` devices-per-group sizes).

    Returns ``(masks [A, M] bool, options [A] int8)``. StrategyError when M > ``max_device_groups``.
    """
    sizes = _sizes(device_groups)
    num_device_groups = len(sizes)
    if num_device_groups > max_device_groups:
        raise StrategyError(
            f"{num_device_groups} device groups give 2^{num_device_groups} - 1 = {2 ** num_device_groups - 1} "
            f"placement masks, more than max_device_groups={max_device_groups} allows; raise the cap or use "
            "restricted_actions")
    codes = np.arange(1, 1 << num_device_groups, dtype=np.int64)
    masks = ((codes[:, None] >> np.arange(num_device_groups)) & 1).astype(bool)  # [2^M - 1, M]
    return _expand(masks, sizes)


def restricted_actions(cluster: Cluster, *, num_fastest: int | None = None,
                       dtype: str = "fp32") -> tuple[np.ndarray, np.ndarray]:
    """Canonical actions over a small set of masks, for clusters with many device groups.

    Masks, in this order, duplicates dropped (first kept):

    1. each device group alone (M masks);
    2. the unions of the k fastest device groups, k = 2 .. ``num_fastest`` (default M; k = M is
       data parallelism). "Fastest" orders device groups by per-device peak FLOP/s for ``dtype``, then
       by size (more devices first), then by index: under an even batch split the slowest replica sets
       the pace, so faster generations are added before slower ones;
    3. all device groups of one machine, for each machine with two or more;
    4. each pair of device groups on the same machine.

    At most ``M + (num_fastest − 1) + machines + Σ pairs`` masks, four options each.
    """
    groups = cluster.device_groups()
    num_device_groups = len(groups)
    if num_fastest is None:
        num_fastest = num_device_groups
    if isinstance(num_fastest, bool) or not isinstance(num_fastest, (int, np.integer)) or num_fastest < 1:
        raise StrategyError(f"num_fastest must be a positive integer, got {num_fastest!r}")
    first = np.array([g[0] for g in groups])
    speed = cluster.peak_flops(dtype)[first]  # [M] per-device peak of each group
    size = np.array([len(g) for g in groups])
    machine = cluster.machine[first]  # [M]

    eye = np.eye(num_device_groups, dtype=bool)
    masks: list[np.ndarray] = list(eye)
    order = np.lexsort((np.arange(num_device_groups), -size, -speed))
    for k in range(2, min(num_fastest, num_device_groups) + 1):
        masks.append(eye[order[:k]].any(axis=0))
    on_machine = [np.flatnonzero(machine == m) for m in np.unique(machine)]
    masks += [eye[members].any(axis=0) for members in on_machine if len(members) > 1]
    masks += [eye[a] | eye[b] for members in on_machine for a, b in itertools.combinations(members, 2)]

    unique: dict[bytes, np.ndarray] = {}
    for mask in masks:
        unique.setdefault(mask.tobytes(), mask)
    return _expand(np.array(list(unique.values())), device_group_sizes(cluster))


def count_actions(device_groups: Cluster | Sequence[int] | np.ndarray) -> int:
    """Number of actions :func:`candidate_actions` returns, by the closed form in the module docstring."""
    sizes = _sizes(device_groups)
    single = int((sizes == 1).sum())
    return single + len(OPTIONS) * (2 ** len(sizes) - 1 - single)


def _sizes(device_groups: Cluster | Sequence[int] | np.ndarray) -> np.ndarray:
    if isinstance(device_groups, Cluster):
        return device_group_sizes(device_groups)
    sizes = np.asarray(device_groups)
    if sizes.ndim != 1 or sizes.size == 0 or not np.issubdtype(sizes.dtype, np.integer) or (sizes < 1).any():
        raise StrategyError(f"expected a cluster or a vector [M] of positive device counts, got {device_groups!r}")
    return sizes.astype(np.int64)


def _expand(masks: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """masks [K, M] → (masks [A, M], options [A]): one action for a one-device mask, else every option."""
    single = masks.astype(np.int64) @ sizes == 1  # [K]
    counts = np.where(single, 1, len(OPTIONS))
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    within = np.arange(int(counts.sum())) - starts  # 0..3 within each mask
    options = np.where(np.repeat(single, counts), SINGLE_DEVICE_OPTION, within).astype(np.int8)
    return np.repeat(masks, counts, axis=0), options
