"""Small array helpers shared by the packages."""

from __future__ import annotations

import itertools
from typing import Any, Callable, Sequence

import numpy as np

from tag._compiled import kahn_least_first

__all__ = ["csr_by_key", "csr_from_lists", "edge_arrays", "grown", "kahn_order", "least_first_order"]


def csr_from_lists(lists: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """(ptr [len(lists)+1], values [sum of lengths]) of a list of int lists, in the given order."""
    ptr = np.zeros(len(lists) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, lists), dtype=np.int64, count=len(lists)), out=ptr[1:])
    values = np.fromiter(itertools.chain.from_iterable(lists), dtype=np.int64, count=int(ptr[-1]))
    return ptr, values


def csr_by_key(num_keys: int, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ptr [num_keys+1], order [E]) int64 grouping the items of ``keys`` [E] (each in 0..num_keys-1) by key:
    the items of key k are ``order[ptr[k]:ptr[k+1]]``, in their input order. With ``keys`` an edge list's
    sources, ``dst[order]`` is the successor CSR."""
    order = np.argsort(keys, kind="stable").astype(np.int64, copy=False)
    ptr = np.zeros(num_keys + 1, dtype=np.int64)
    np.cumsum(np.bincount(keys, minlength=num_keys), out=ptr[1:])
    return ptr, order


def grown(array: np.ndarray, size: int, fill: Any) -> np.ndarray:
    """``array`` if it holds ``size`` rows, else a copy into doubled capacity (at least ``size`` rows, the
    shape past the first axis kept), new rows set to ``fill``."""
    capacity = len(array)
    if size <= capacity:
        return array
    capacity = max(capacity, 1)
    while capacity < size:
        capacity *= 2
    out = np.full((capacity,) + array.shape[1:], fill, dtype=array.dtype)
    out[:len(array)] = array
    return out


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


def kahn_order(num_nodes: int, src: np.ndarray, dst: np.ndarray,
               pick: Callable[[list[int]], int] | None = None) -> tuple[list[int], bool]:
    """(order, unique) of Kahn's algorithm over the edges src → dst: ``pick(ready)`` is the index in the
    ready list (ascending ids at first, then in the order nodes become ready) of the next node, by default
    the last; ``unique`` is whether the ready list never held two nodes (the only topological order).
    On a cycle the order stops short of ``num_nodes``: the caller raises its own error."""
    indegree = np.bincount(dst, minlength=num_nodes).tolist()
    succ: list[list[int]] = [[] for _ in range(num_nodes)]
    for a, b in zip(src.tolist(), dst.tolist()):
        succ[a].append(b)
    ready = [v for v in range(num_nodes) if indegree[v] == 0]
    order: list[int] = []
    unique = True
    while ready:
        unique &= len(ready) == 1
        node = ready.pop() if pick is None else ready.pop(pick(ready))
        order.append(node)
        for nxt in succ[node]:
            indegree[nxt] -= 1
            if indegree[nxt] == 0:
                ready.append(nxt)
    return order, unique


def least_first_order(num_nodes: int, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, int]:
    """(order, placed) of Kahn's algorithm over the int64 edges src → dst, ties by least node index
    (:func:`tag._compiled.kahn_least_first`); on a cycle ``placed`` < ``num_nodes`` and the caller raises its
    own error."""
    ptr, by_source = csr_by_key(num_nodes, src)
    return kahn_least_first(ptr, dst[by_source], np.bincount(dst, minlength=num_nodes))
