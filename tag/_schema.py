"""The header every versioned tag document starts with: a format name and a schema version."""

from __future__ import annotations

from typing import Any

from tag.errors import SchemaError

__all__ = ["check_header"]


def check_header(doc: Any, *, fmt: str, version: int, where: str, error: type[SchemaError] = SchemaError,
                 version_key: str = "schema_version") -> dict:
    """``doc`` as a dict after checking its format and version; ``error`` names the field otherwise."""
    if not isinstance(doc, dict):
        raise error(f"{where}: expected a JSON object at the top level")
    if doc.get("format") != fmt:
        raise error(f"{where}: field 'format' must be {fmt!r}, got {doc.get('format')!r}")
    if doc.get(version_key) != version:
        raise error(f"{where}: unsupported {version_key} {doc.get(version_key)!r} (this tag reads version {version})")
    return doc
