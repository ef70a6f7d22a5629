"""The grouping package's exception (belongs in :mod:`tag.errors` beside GraphError; kept here until it moves)."""

from __future__ import annotations

from tag.errors import TagError

__all__ = ["GroupingError"]


class GroupingError(TagError):
    """Grouping parameters are out of range: num_groups, ufactor, GPU types, device speeds, a group's ops."""
