"""Downsets ("fronted subgraphs", Parmesan Def. 2) of a small DAG, as Python int bitmasks.

A downset F of a DAG G is a set of nodes closed under predecessors: v ∈ F and u → v imply u ∈ F.
Partitioning G into S pipeline stages whose edges all run from a stage to the same or a later one is
the same as choosing a chain of downsets ∅ = F_0 ⊂ F_1 ⊂ … ⊂ F_S = V (stage s = F_s − F_{s−1}), which
is what the DP of :mod:`tag.exact.partition` enumerates.

Node k is bit ``1 << k``. The number of downsets is K + 1 for a chain (Parmesan Thm. 2, counting the
empty set) and up to 2^K for K unrelated nodes: enumeration stops with :class:`DownsetLimitError`
once it passes a ``limit``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from tag._arrays import edge_arrays, kahn_order
from tag.errors import TagError

__all__ = [
    "DownsetLimitError",
    "DEFAULT_DOWNSET_LIMIT",
    "downsets",
    "unique_topological_order",
    "predecessor_masks",
    "is_downset",
    "membership",
    "subset_matrix",
    "popcount",
]

# The DP builds [D, D] tables over downsets; 2,048 of them is 32 MiB per float table.
DEFAULT_DOWNSET_LIMIT = 2048


class DownsetLimitError(TagError):
    """The DAG has more downsets than the caller allowed (the DP tables would be too large)."""

    def __init__(self, num_nodes: int, reached: int, limit: int) -> None:
        self.num_nodes, self.reached, self.limit = num_nodes, reached, limit
        super().__init__(
            f"the DAG of {num_nodes} nodes has more than {limit} downsets (enumeration reached {reached} "
            f"before stopping); cluster to fewer hyper-ops (smaller K) or raise the downset limit")


def predecessor_masks(num_nodes: int, src: Sequence[int], dst: Sequence[int]) -> list[int]:
    """[K] bitmask of each node's direct predecessors."""
    src, dst = edge_arrays(num_nodes, src, dst, TagError)
    masks = [0] * num_nodes
    for a, b in zip(src.tolist(), dst.tolist()):
        masks[b] |= 1 << a
    return masks


def is_downset(mask: int, pred_masks: Sequence[int]) -> bool:
    """Whether every member's predecessors are members too."""
    k = 0
    rest = mask
    while rest:
        if rest & 1 and pred_masks[k] & ~mask:
            return False
        rest >>= 1
        k += 1
    return True


def unique_topological_order(num_nodes: int, src: Sequence[int], dst: Sequence[int]) -> np.ndarray | None:
    """[K] the topological order if it is the only one (a Hamiltonian path), else None.

    Raises TagError on a cycle.
    """
    src, dst = edge_arrays(num_nodes, src, dst, TagError)
    order, unique = kahn_order(num_nodes, src, dst)
    if len(order) != num_nodes:
        raise TagError("the graph has a cycle: it has no downset chain")
    return np.array(order, dtype=np.int64) if unique else None


def downsets(num_nodes: int, src: Sequence[int], dst: Sequence[int], *,
             limit: int = DEFAULT_DOWNSET_LIMIT) -> list[int]:
    """Every downset of the DAG as a bitmask, the empty set first, ordered by size then value.

    A subset relation F' ⊂ F therefore always has F' earlier in the list. A DAG with a unique
    topological order gives its K + 1 prefixes without a search (Parmesan Thm. 2); otherwise downsets
    are grown one addable node at a time, layer by size. Raises :class:`DownsetLimitError` once more
    than ``limit`` are found.
    """
    if num_nodes < 0:
        raise TagError(f"num_nodes must be non-negative, got {num_nodes}")
    order = unique_topological_order(num_nodes, src, dst)
    if order is not None:
        if num_nodes + 1 > limit:
            raise DownsetLimitError(num_nodes, num_nodes + 1, limit)
        out = [0]
        for node in order.tolist():
            out.append(out[-1] | (1 << node))
        return out
    preds = predecessor_masks(num_nodes, src, dst)
    found = [0]
    layer = [0]
    for _ in range(num_nodes):
        grown: set[int] = set()
        for current in layer:
            for k in range(num_nodes):
                bit = 1 << k
                if not current & bit and not preds[k] & ~current:
                    grown.add(current | bit)
            if len(found) + len(grown) > limit:
                raise DownsetLimitError(num_nodes, len(found) + len(grown), limit)
        layer = sorted(grown)
        found.extend(layer)
    return found


def popcount(mask: int) -> int:
    return bin(mask).count("1")


def _words(masks: Sequence[int], num_nodes: int) -> np.ndarray:
    """[D, W] uint64 words of each mask, W = ceil(K / 64) (at least 1)."""
    num_words = max(1, -(-num_nodes // 64))
    out = np.zeros((len(masks), num_words), dtype=np.uint64)
    low = (1 << 64) - 1
    for w in range(num_words):
        out[:, w] = np.fromiter(((m >> (64 * w)) & low for m in masks), dtype=np.uint64, count=len(masks))
    return out


def membership(masks: Sequence[int], num_nodes: int) -> np.ndarray:
    """[D, K] bool: node k is in downset d."""
    words = _words(masks, num_nodes)
    k = np.arange(num_nodes)
    bits = (words[:, k // 64] >> (k % 64).astype(np.uint64)) & np.uint64(1)
    return bits.astype(bool)


def subset_matrix(masks: Sequence[int], num_nodes: int) -> np.ndarray:
    """[D, D] bool: ``out[i, j]`` is true when downset j is a proper subset of downset i."""
    words = _words(masks, num_nodes)
    inside = np.ones((len(masks), len(masks)), dtype=bool)
    for w in range(words.shape[1]):
        column = words[:, w]
        inside &= (column[None, :] & ~column[:, None]) == 0
    np.fill_diagonal(inside, False)
    return inside
