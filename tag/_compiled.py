"""numba's ``njit`` where numba is installed, else the function itself, and the small compiled helpers that
several packages share (a min-heap of integer ids: list scheduling, Kahn's topological order).

``cache=True`` keeps each function's machine code beside its module, so only a machine's first run pays the
seconds of compilation. ``TAG_NO_NUMBA`` in the environment turns numba off (the tests run the plain-Python
paths that way); ``COMPILED`` says which.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["COMPILED", "jit", "id_push", "id_pop"]

try:  # numba is a dependency; the fallback keeps the package importable where it cannot be installed
    if os.environ.get("TAG_NO_NUMBA"):
        raise ImportError("TAG_NO_NUMBA is set")
    import numba

    def jit(function: Any) -> Any:
        return numba.njit(cache=True, nogil=True)(function)

    COMPILED = True
except ImportError:  # pragma: no cover - exercised only without numba

    def jit(function: Any) -> Any:
        return function

    COMPILED = False


@jit
def id_push(heap, size, task):
    """Insert ``task`` into the min-heap of ids ``heap[:size]``; returns the new size."""
    position = size
    while position > 0:
        parent = (position - 1) // 2
        if heap[parent] < task:
            break
        heap[position] = heap[parent]
        position = parent
    heap[position] = task
    return size + 1


@jit
def id_pop(heap, size):
    """(smallest id, new size) of the min-heap of ids ``heap[:size]``, which loses it."""
    top = heap[0]
    size -= 1
    task = heap[size]
    position = 0
    child = 1
    while child < size:
        if child + 1 < size and heap[child + 1] < heap[child]:
            child += 1
        if task < heap[child]:
            break
        heap[position] = heap[child]
        position = child
        child = 2 * position + 1
    heap[position] = task
    return top, size
