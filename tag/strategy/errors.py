"""Errors of strategies and plan files."""

from __future__ import annotations

from tag.errors import SchemaError, TagError

__all__ = ["StrategyError", "PlanError", "PlanMismatchError"]


class StrategyError(TagError):
    """A strategy is malformed: an empty placement row, a shape that does not match, an unknown option."""


class PlanError(SchemaError):
    """A plan file cannot be read: not JSON, wrong format or version, a missing or mistyped field."""


class PlanMismatchError(PlanError):
    """A plan file was made for another model, another cluster or another grouping."""
