"""Errors of the compiler and of its checker."""

from __future__ import annotations

from tag.errors import TagError

__all__ = ["CompileError", "CompileCheckError"]


class CompileError(TagError):
    """A strategy cannot be compiled: it does not match the grouping or the cluster, or a bad option."""


class CompileCheckError(TagError):
    """A compiled plan does not deliver to some consumer exactly the data it needs (see check_compiled)."""
