"""The policy package's exception."""

from __future__ import annotations

from tag.errors import TagError

__all__ = ["PolicyError"]


class PolicyError(TagError):
    """A policy input is malformed: a state whose arrays disagree, a bad hyper-parameter, a corrupt or
    mismatched checkpoint."""
