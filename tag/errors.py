"""Exceptions raised at tag's entry points.

Every error a user can cause by bad input is a :class:`TagError`; the CLI prints its message on one
line and exits with status 2, without a traceback.
"""

from __future__ import annotations

__all__ = [
    "TagError",
    "GraphError",
    "SchemaError",
    "ClusterError",
    "SpecError",
    "UnitError",
    "ModelError",
    "ProfileError",
    "OutputError",
]


class TagError(Exception):
    """Base class of every error caused by bad input."""


class GraphError(TagError):
    """An OpGraph is malformed: a cycle, a dangling edge, a negative size."""


class SchemaError(TagError):
    """A JSON document does not follow its schema (wrong version, missing or mistyped field)."""


class ClusterError(TagError):
    """A cluster is malformed: unknown GPU type, zero bandwidth, disconnected devices."""


class SpecError(TagError):
    """A spec string or file (cluster address, MODULE:FUNCTION) cannot be resolved."""


class UnitError(TagError):
    """A quantity with a human unit cannot be parsed ("100 Gbps", "16GiB")."""


class ModelError(TagError):
    """A model cannot be built, traced or imported."""


class ProfileError(TagError):
    """A profile file (PipeDream graph.txt) is malformed."""


class OutputError(TagError):
    """An output file cannot be written where the user asked."""
