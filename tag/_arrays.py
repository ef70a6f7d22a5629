"""Small array helpers shared by the packages."""

from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np

__all__ = ["csr_from_lists", "edge_arrays"]


def csr_from_lists(lists: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """(ptr [len(lists)+1], values [sum of lengths]) of a list of int lists, in the given order."""
    ptr = np.zeros(len(lists) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, lists), dtype=np.int64, count=len(lists)), out=ptr[1:])
    values = np.fromiter(itertools.chain.from_iterable(lists), dtype=np.int64, count=int(ptr[-1]))
    return ptr, values


def edge_arrays(num_nodes: int, src: Sequence[int], dst: Sequence[int], error: type[Exception],
                what: str = "node") -> tuple[np.ndarray, np.ndarray]:
    """(src [E], dst [E]) int64 of an edge list over ``num_nodes`` ``what``s; ``error`` when the lists differ
    in length or an edge names a ``what`` outside 0..num_nodes-1."""
    src = np.asarray(src, dtype=np.int64).reshape(-1)
    dst = np.asarray(dst, dtype=np.int64).reshape(-1)
    if src.shape != dst.shape:
        raise error(f"edge lists differ in length: {src.size} sources, {dst.size} targets")
    if src.size and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= num_nodes):
        raise error(f"an edge names a {what} outside 0..{num_nodes - 1}")
    return src, dst
