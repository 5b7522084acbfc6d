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


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb") -> Iterator[BinaryIO]:
    """Open a temp file beside ``path``; on success fsync and rename it over ``path``.

    On any exception (including a full disk) the temp file is removed and ``path`` is untouched.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise FidevalError(f"cannot create folder {path.parent}: {e.strerror}", hint="check the path and its permissions") from None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise FidevalError(f"cannot write in {path.parent}: {e.strerror}", hint="check permissions or choose another output folder") from None
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fchmod(f.fileno(), _MODE)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            raise FidevalError(f"disk full while writing {path}", hint="free space and run again; nothing partial was kept") from None
        raise


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path beside ``path`` for libraries that write by file name; rename it on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fchmod(f.fileno(), _MODE)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            raise FidevalError(f"disk full while writing {path}", hint="free space and run again; nothing partial was kept") from None
        raise


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
