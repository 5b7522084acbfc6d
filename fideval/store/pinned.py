"""Host buffers for the store's streaming reader: exact-size, page-locked for CUDA, unlocked together.

Why not ``torch.empty(n, pin_memory=True)``: torch's caching host allocator rounds every request up to a
power of two and keeps the block for the life of the process, so a 134 MB shard buffer locks 268 MB. On an
H200 machine (bench/score_stream.py, 2026-12-04) the reader's pool of ``prefetch + 1`` buffers then held
4.06 shards of memory above its baseline where the design allows 3. Here a plain CPU tensor of the exact size
is page-locked with ``cudaHostRegister`` (the asynchronous host-to-device copy needs locked pages), and
:meth:`HostBuffers.close` unlocks every buffer once no copy from it can be in flight. Where registering
fails, the buffer comes from torch's pinned allocator instead, with one warning.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any


class HostBuffers:
    """Byte buffers (``torch.uint8`` CPU tensors) of exactly the size asked for; page-locked when ``pin``.

    The caller keeps at most a few alive; :meth:`drop` lets one go (unlocking it first) and :meth:`close`
    unlocks the rest. A locked buffer must not be unlocked while a copy from it runs: the caller synchronizes
    the copies' stream first."""

    def __init__(self, pin: bool):
        import torch

        self._torch = torch  # kept: close() may run from a generator's finalizer while Python shuts down
        self.pin = pin
        self._locked: dict[int, Any] = {}  # data_ptr -> tensor, registered with cudaHostRegister
        self._lock = threading.Lock()
        self._fallback = False
        self._closed = False

    def new(self, nbytes: int) -> Any:
        torch = self._torch
        nbytes = max(int(nbytes), 8)
        if not self.pin or self._closed:  # closed: a straggling reader thread gets plain memory
            return torch.empty(nbytes, dtype=torch.uint8)
        if not self._fallback:
            buf = torch.empty(nbytes, dtype=torch.uint8)
            rc = int(torch.cuda.cudart().cudaHostRegister(buf.data_ptr(), nbytes, 0))
            if rc == 0:
                with self._lock:
                    self._locked[buf.data_ptr()] = buf
                return buf
            self._fallback = True
            warnings.warn(f"cudaHostRegister failed (cudaError {rc}); the store reader's host buffers come from "
                          "torch's pinned allocator, which rounds each up to a power of two", RuntimeWarning,
                          stacklevel=2)
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def drop(self, buf: Any) -> None:
        """Let ``buf`` go (after every copy from it has finished)."""
        with self._lock:
            locked = self._locked.pop(buf.data_ptr(), None) is not None
        if locked:
            _unregister(self._torch, buf)

    def close(self) -> None:
        """Unlock every buffer still locked (after every copy from them has finished)."""
        with self._lock:
            bufs, self._locked, self._closed = list(self._locked.values()), {}, True
        for buf in bufs:
            _unregister(self._torch, buf)

    @property
    def locked(self) -> int:
        """Buffers page-locked by this object right now."""
        with self._lock:
            return len(self._locked)


def _unregister(torch: Any, buf: Any) -> None:
    rc = int(torch.cuda.cudart().cudaHostUnregister(buf.data_ptr()))
    if rc != 0:  # the memory stays valid either way (the tensor owns it); only its page lock may outlive it
        warnings.warn(f"cudaHostUnregister failed (cudaError {rc})", RuntimeWarning, stacklevel=3)
