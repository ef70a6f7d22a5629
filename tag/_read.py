"""Reading the files a user names: bounded in size and nesting, every failure a :class:`TagError`.

Every document tag reads (graphs, cluster specs, plans, PipeDream profiles, training configs) goes through
:func:`read_input` and then :func:`parse_json`, :func:`parse_yaml` or its own parser; checkpoints through
:func:`check_input_file` before ``torch.load``. So a name the OS cannot stat, a pipe, a file too large, a
gzip bomb, a document nested thousands deep or a key given twice is refused with one clear message naming
the file, before anything large is allocated.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import zlib
from typing import Any

import yaml

from tag.errors import TagError

__all__ = ["MAX_INPUT_BYTES", "MAX_NESTING", "input_is_file", "check_input_file", "read_input", "parse_json",
           "parse_yaml"]

MAX_INPUT_BYTES = 256 << 20  # the largest graph of the zoo is 4 MB of JSON; 64x that is surely a mistake
MAX_NESTING = 64  # tag's documents nest at most ~6 deep; parsers and printers recurse per level
_GZIP_MAGIC = b"\x1f\x8b"


def input_is_file(path: str | os.PathLike) -> bool:
    """``Path.is_file`` that is False, not an exception, for a name the OS refuses (too long, no permission)."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):  # ValueError: an embedded NUL
        return False


def _reason(error: OSError) -> str:
    return error.strerror or errno.errorcode.get(error.errno or 0, type(error).__name__)


def check_input_file(path: str | os.PathLike, *, what: str, error: type[TagError], missing: str | None = None,
                     limit: int | None = None) -> None:
    """``error`` naming ``path`` unless it is a regular file of at most ``limit`` bytes (default
    MAX_INPUT_BYTES) that this process may stat; ``missing`` is the message when it does not exist."""
    where = os.fspath(path)
    limit = MAX_INPUT_BYTES if limit is None else limit
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise error(missing or f"{where}: no such {what}") from None
    except (OSError, ValueError) as exc:
        reason = _reason(exc) if isinstance(exc, OSError) else "the name holds a NUL character"
        raise error(f"{where}: cannot read the {what}: {reason}") from None
    if stat.S_ISDIR(info.st_mode):
        raise error(f"{where}: is a directory, not a {what}")
    if not stat.S_ISREG(info.st_mode):  # a FIFO or a device: reading it could block forever
        raise error(f"{where}: not a regular file (a pipe or a device); tag reads a {what} only from a file")
    if info.st_size > limit:
        raise error(f"{where}: the {what} is {info.st_size:,} bytes; tag reads at most {limit:,}")


def read_input(path: str | os.PathLike, *, what: str, error: type[TagError], missing: str | None = None,
               limit: int | None = None, gunzip: bool = False) -> bytes:
    """The bytes of the ``what`` file at ``path`` (inflated when ``gunzip`` and it is gzip), at most
    ``limit`` of them (default MAX_INPUT_BYTES); ``error`` naming the path and the problem otherwise
    (``missing``: the message when the file does not exist)."""
    limit = MAX_INPUT_BYTES if limit is None else limit
    check_input_file(path, what=what, error=error, missing=missing, limit=limit)
    try:
        with open(path, "rb") as handle:
            raw = handle.read(limit + 1)
    except OSError as exc:
        raise error(f"{os.fspath(path)}: cannot read the {what}: {_reason(exc)}") from None
    if len(raw) > limit:  # it grew since stat
        raise error(f"{os.fspath(path)}: the {what} holds more than {limit:,} bytes")
    if gunzip and raw[:2] == _GZIP_MAGIC:
        raw = _gunzip(raw, limit, f"{os.fspath(path)}: the {what}", error)
    return raw


def _gunzip(raw: bytes, limit: int, where: str, error: type[TagError]) -> bytes:
    """Inflate gzip members one by one, never more than ``limit`` bytes in all."""
    out = bytearray()
    try:
        while raw:
            inflater = zlib.decompressobj(wbits=31)
            out += inflater.decompress(raw, limit + 1 - len(out))
            if len(out) > limit:
                raise error(f"{where} inflates to more than {limit:,} bytes")
            if not inflater.eof:
                if inflater.unconsumed_tail:  # stopped by the bound exactly at limit + 1 - len(out) == 0
                    raise error(f"{where} inflates to more than {limit:,} bytes")
                raise error(f"{where} is a truncated gzip stream")
            raw = inflater.unused_data.lstrip(b"\x00")
    except zlib.error as exc:
        raise error(f"{where} is not valid gzip ({exc})") from None
    return bytes(out)


def _check_nesting(doc: Any, where: str, error: type[TagError]) -> None:
    """``error`` when lists and mappings nest deeper than MAX_NESTING or contain themselves. Walked without
    recursion, each container once: YAML aliases share them, so a walk of every path could take 2^levels."""
    too_deep = f"{where}: lists and mappings nest more than {MAX_NESTING} deep"
    height: dict[int, int] = {}  # id(container) -> levels of nesting at and below it, once known
    entered: set[int] = set()
    stack: list[tuple[Any, bool]] = [(doc, False)]
    while stack:
        node, children_done = stack.pop()
        children = [c for c in (node.values() if isinstance(node, dict) else node) if isinstance(c, (list, dict))]
        if children_done:
            height[id(node)] = 1 + max((height[id(c)] for c in children), default=0)
            if height[id(node)] > MAX_NESTING:
                raise error(too_deep)
        elif id(node) not in height:
            if id(node) in entered:  # reached again before it was done: it holds itself
                raise error(f"{where}: a list or mapping contains itself (a YAML alias to its own anchor)")
            entered.add(id(node))
            stack.append((node, True))
            stack.extend((child, False) for child in children)


def _unique_keys(where: str, error: type[TagError]):
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                raise error(f"{where}: key {key!r} is given twice in one object")
            out[key] = value
        return out

    return pairs


def parse_json(raw: bytes | str, *, where: str, error: type[TagError], malformed: str = "not valid JSON") -> Any:
    """The decoded JSON document; ``error`` for malformed (``"{where}: {malformed}: ..."``), deeply nested
    or duplicate-key input."""
    try:
        doc = json.loads(raw, object_pairs_hook=_unique_keys(where, error))
    except RecursionError:
        raise error(f"{where}: lists and mappings nest more than {MAX_NESTING} deep") from None
    except json.JSONDecodeError as exc:
        raise error(f"{where}: {malformed}: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None
    except (UnicodeDecodeError, ValueError) as exc:  # bad UTF-8; an integer of more than 4300 digits
        raise error(f"{where}: {malformed} ({exc})") from None
    if isinstance(doc, (list, dict)):
        _check_nesting(doc, where, error)
    return doc


def parse_yaml(text: str, *, where: str, error: type[TagError]) -> Any:
    """The document of a YAML text (safe loader); ``error`` for malformed, deeply nested or duplicate-key input."""
    loader = _BoundedLoader(text)
    try:
        doc = loader.get_single_data()
    except (_TooDeep, RecursionError):
        raise error(f"{where}: lists and mappings nest more than {MAX_NESTING} deep") from None
    except _DuplicateKey as exc:
        raise error(f"{where}: key {exc.args[0]!r} is given twice in one mapping (line {exc.args[1]})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise error(f"{where}: malformed YAML: {problem}{at}") from None
    finally:
        loader.dispose()
    if isinstance(doc, (list, dict)):
        _check_nesting(doc, where, error)  # aliases nest without nesting the text
    return doc


class _TooDeep(Exception):
    pass


class _DuplicateKey(Exception):
    pass


class _BoundedLoader(yaml.SafeLoader):
    """yaml.SafeLoader that counts nesting while composing (before the parser's recursion gets deep) and
    refuses a key given twice (PyYAML keeps the last silently)."""

    depth = 0

    def compose_node(self, parent, index):
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise _TooDeep
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (str, int, float, bool)) or key is None:
                if key in seen:
                    raise _DuplicateKey(key, key_node.start_mark.line + 1)
                seen.add(key)
        return super().construct_mapping(node, deep=deep)
