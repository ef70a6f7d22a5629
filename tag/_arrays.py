"""Small array helpers shared by the packages."""

from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np

__all__ = ["csr_from_lists"]


def csr_from_lists(lists: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """(ptr [len(lists)+1], values [sum of lengths]) of a list of int lists, in the given order."""
    ptr = np.zeros(len(lists) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, lists), dtype=np.int64, count=len(lists)), out=ptr[1:])
    values = np.fromiter(itertools.chain.from_iterable(lists), dtype=np.int64, count=int(ptr[-1]))
    return ptr, values
