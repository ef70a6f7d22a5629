"""The training package's exception."""

from __future__ import annotations

from tag.errors import TagError

__all__ = ["TrainingError"]


class TrainingError(TagError):
    """A training input is malformed: a bad config file or field, a corrupt training checkpoint, or one
    written by a run whose config differs from the one resuming it."""
