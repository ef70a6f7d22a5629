"""Atomic file writes: write a temporary file beside the target, then rename it over the target."""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from tag.errors import OutputError

__all__ = ["atomic_write_bytes", "atomic_write_text", "atomic_open", "staged_outputs"]


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """Yield a binary file whose contents replace ``path`` only if the block finishes without error."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, _mode_for(path))  # mkstemp's 0600 would hide a plan or report from the user's group
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _mode_for(path: Path) -> int:
    """The permission bits the written file gets: the replaced file's, or what ``open`` would give a new
    one (0666 less the umask)."""
    with contextlib.suppress(OSError):
        return path.stat().st_mode & 0o7777
    umask = os.umask(0)  # the only way to read it; set back at once
    os.umask(umask)
    return 0o666 & ~umask


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_open(path) as handle:
        handle.write(data)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


@contextlib.contextmanager
def staged_outputs() -> Iterator[Callable[[str | os.PathLike], Path]]:
    """All of a command's output files or none: ``stage(path)`` names a temporary file beside ``path`` to
    write in full; when the block ends without error each is renamed over its target, else all are removed
    (with the folders the writers made for them)."""
    staged: list[tuple[Path, Path]] = []
    new_folders: list[Path] = []  # missing when staged, so made by the writer; outermost first

    def stage(path: str | os.PathLike) -> Path:
        path = Path(path)
        new_folders.extend(reversed([p for p in path.parents if not p.exists() and p not in new_folders]))
        # Not created here, so that the writer gives it the mode a new file gets; the suffix stays last,
        # since some writers choose the format by it.
        temporary = path.with_name(f".{path.stem[:64]}.{secrets.token_hex(6)}.staged{path.suffix}")
        staged.append((temporary, path))
        return temporary

    committed = False
    try:
        yield stage
        for temporary, path in staged:
            with contextlib.suppress(OSError):
                os.chmod(temporary, path.stat().st_mode & 0o7777)  # a replaced file keeps its mode
            try:
                os.replace(temporary, path)
            except OSError as error:
                raise OutputError(f"cannot write {str(path)!r}: {error.strerror or error}") from None
        committed = True
    finally:
        for temporary, _ in staged:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
        if not committed:
            for folder in reversed(new_folders):
                with contextlib.suppress(OSError):
                    folder.rmdir()  # only if empty: never what someone else put there meanwhile
