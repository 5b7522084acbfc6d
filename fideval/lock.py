"""One writer per output folder: a second fideval run writing to the same folder is refused.

An advisory ``fcntl.flock`` on ``<folder>/.fideval.lock``: the kernel releases it when the process dies,
even by SIGKILL, so a crashed run never leaves a stale lock behind (unlike a pid file).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from fideval.errors import FidevalError

LOCK_NAME = ".fideval.lock"


@contextlib.contextmanager
def output_lock(folder: str | os.PathLike, what: str = "fideval") -> Iterator[Path]:
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise FidevalError(f"cannot write in {folder}: {e.strerror}", hint="check permissions or choose another output folder") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "another process"
            raise FidevalError(f"{folder} is being written by another run ({holder})",
                               hint=f"wait for it to finish or write {what} output elsewhere") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}".encode(), 0)
        yield folder
    finally:
        os.close(fd)  # closing releases the lock
