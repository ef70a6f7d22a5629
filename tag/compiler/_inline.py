"""``inline_jit``: :func:`tag._compiled.jit` for the helpers of a hot kernel, compiled into each caller (numba's
``inline="always"``) so that splitting a kernel into named steps costs no call passing its arrays."""

from __future__ import annotations

from typing import Any

from tag._compiled import COMPILED, jit

__all__ = ["inline_jit"]


def inline_jit(function: Any) -> Any:
    if not COMPILED:
        return jit(function)
    import numba

    try:
        return numba.njit(cache=True, nogil=True, inline="always")(function)
    except RuntimeError:  # no writable cache folder: compile on each run, as tag._compiled.jit does
        return numba.njit(nogil=True, inline="always")(function)
