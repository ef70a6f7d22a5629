"""Compiled combinators of the stage partitioner's DP tables.

A table ``F [D+1, O+1]`` (int64) holds, for d devices and an in-flight count o of the stage that follows
a subgraph, the least in-flight count of the subgraph's entry stage(s) (``INF`` when no strategy meets
the target); every table is non-increasing in d (devices may stay idle).
"""

from __future__ import annotations

import numpy as np
from numba import njit

INF = 1 << 30


@njit(cache=True)
def stage_table(omax: np.ndarray, depth_limit: int) -> np.ndarray:
    """[D+1, O+1] the subgraph as one stage: o + 1 where o + 1 <= omax[d] (``omax`` [D+1], -1 when d
    replicas miss the target), ``depth_limit`` = O."""
    num = omax.shape[0]
    out = np.full((num, depth_limit + 1), INF, dtype=np.int64)
    for d in range(1, num):
        for o in range(depth_limit + 1):
            v = o + 1
            if v <= depth_limit and v <= omax[d]:
                out[d, o] = v
            if out[d - 1, o] < out[d, o]:
                out[d, o] = out[d - 1, o]
    return out


@njit(cache=True)
def series(first: np.ndarray, second: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(table, split): ``first`` runs before ``second``; d1 devices to ``first`` (``split`` [D+1, O+1])."""
    num, width = first.shape
    out = np.full((num, width), INF, dtype=np.int64)
    split = np.zeros((num, width), dtype=np.int64)
    for d in range(num):
        for d1 in range(d + 1):
            d2 = d - d1
            for o in range(width):
                v = second[d2, o]
                if v < width:
                    w = first[d1, v]
                    if w < out[d, o]:
                        out[d, o] = w
                        split[d, o] = d1
    return out, split


@njit(cache=True)
def parallel(left: np.ndarray, right: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(table, split): ``left`` and ``right`` side by side, d1 devices to ``left``."""
    num, width = left.shape
    out = np.full((num, width), INF, dtype=np.int64)
    split = np.zeros((num, width), dtype=np.int64)
    for d in range(num):
        for d1 in range(d + 1):
            d2 = d - d1
            for o in range(width):
                a = left[d1, o]
                b = right[d2, o]
                w = a if a > b else b
                if w < out[d, o]:
                    out[d, o] = w
                    split[d, o] = d1
    return out, split
