"""The SFB package's exception."""

from __future__ import annotations

from tag.errors import TagError

__all__ = ["SFBError"]


class SFBError(TagError):
    """An SFB problem is malformed: a negative time or size, an edge to no op, fewer than two replicas."""
