"""Errors of the search."""

from __future__ import annotations

from tag.errors import TagError

__all__ = ["SearchError"]


class SearchError(TagError):
    """A search cannot run: bad candidates, an action that is not one, an evaluator's bad priors."""
