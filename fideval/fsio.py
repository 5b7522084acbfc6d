"""Atomic, crash-safe file writes: write to a temp name in the same folder, fsync, then rename.

Every artifact fideval writes goes through here, so a SIGKILL or a full disk never leaves a file that
looks complete but is not. Paths read from manifests stay inside their root (:func:`safe_join`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from fideval.errors import FidevalError

_CHUNK = 1 << 22


def _file_mode() -> int:
    """The mode a plain open() would give a new file (mkstemp's 0600 would make outputs owner-only)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


_MODE = _file_mode()
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_REFUSED = (errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO, errno.ENOTDIR, errno.EISDIR)


def _write_error(path: Path, e: BaseException) -> BaseException:
    """A one-line error for what the disk said while writing ``path``; other exceptions pass unchanged."""
    if isinstance(e, OSError) and not isinstance(e, FidevalError):
        if e.errno in _FULL:
            return FidevalError(f"disk full while writing {path}", hint="free space and run again; nothing partial was kept")
        if e.errno in _REFUSED:
            return FidevalError(f"cannot write {path}: {os.strerror(e.errno)}",
                                hint="check permissions or choose another output folder; nothing partial was kept")
    return e


def _make_parent(path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise FidevalError(f"cannot create folder {path.parent}: {e.strerror}", hint="check the path and its permissions") from None


def _discard(tmp: str | Path, path: Path, e: BaseException) -> None:
    """Remove the temp file of a failed write and re-raise, as one line where the cause is the user's."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    err = _write_error(path, e)
    if err is not e:
        raise err from None
    raise e


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb") -> Iterator[BinaryIO]:
    """Open a temp file beside ``path``; on success fsync and rename it over ``path``.

    On any exception (including a full disk) the temp file is removed and ``path`` is untouched.
    """
    path = Path(path)
    _make_parent(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise FidevalError(f"cannot write in {path.parent}: {e.strerror}",
                           hint="check permissions or choose another output folder") from None
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fchmod(f.fileno(), _MODE)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        _discard(tmp, path, e)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path beside ``path`` for libraries that write by file name; rename it on success."""
    path = Path(path)
    _make_parent(path)
    tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fchmod(f.fileno(), _MODE)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        _discard(tmp, path, e)


def remove_temps(folder: str | os.PathLike) -> list[Path]:
    """Delete the temp files (``.*.tmp``) a killed writer left under ``folder``; return what was removed.

    Only safe while holding the folder's :func:`fideval.lock.output_lock`: then no live writer owns them.
    """
    removed = []
    root = Path(folder)
    if root.is_dir():
        for p in root.rglob(".*.tmp"):
            if p.is_file() and not p.is_symlink():
                with contextlib.suppress(OSError):
                    p.unlink()
                    removed.append(p)
    return removed


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_open(path, "wb") as f:
        f.write(data)


def write_text(path: str | os.PathLike, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Deterministic JSON (sorted keys, 2-space indent, trailing newline), written atomically."""
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n")


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def sha256_bytes(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def safe_join(root: str | os.PathLike, relative: str) -> Path:
    """Join a path read from a manifest or config onto ``root``, refusing anything that leaves it.

    Absolute paths, ``..`` components and symlinks pointing outside ``root`` raise :class:`FidevalError`.
    """
    root = Path(root).resolve()
    rel = Path(relative)
    if rel.is_absolute() or ".." in rel.parts:
        raise FidevalError(f"path {relative!r} leaves its root {root}", hint="manifests may only name files inside their own folder")
    full = (root / rel).resolve()
    if full != root and root not in full.parents:
        raise FidevalError(f"path {relative!r} resolves outside {root} (a link?)", hint="remove the link or copy the file into the folder")
    return full
