"""What every weight source shares: the process's reader pool, and a tensor handed over (pinned, or copied into
the fused slot it fills).

Its own module so that the sources (:mod:`.checkpoint`, :mod:`.fp8_release`, :mod:`.quantized`,
:mod:`.gguf_checkpoint`) and the model code that reads through them import one place and not each other.
"""

from __future__ import annotations

import os

import torch

from fideval.errors import FidevalError

_POOL: tuple[int, object] | None = None


def reader_pool():
    """One reader pool per process (a forked child inherits the pool object but not its threads)."""
    global _POOL
    if _POOL is None or _POOL[0] != os.getpid():
        from concurrent.futures import ThreadPoolExecutor

        _POOL = (os.getpid(), ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1), thread_name_prefix="fideval-read"))
    return _POOL[1]


def deliver(t: torch.Tensor, key: str, where, pin: bool, out: torch.Tensor | None) -> torch.Tensor:
    """Return ``t`` (contiguous, optionally pinned) or copy it into ``out`` (a fused expert slot)."""
    if out is not None:
        if out.dtype != t.dtype or out.numel() != t.numel() or not out.is_contiguous():
            raise FidevalError(f"{where}: tensor {key!r} ({t.dtype}, shape {list(t.shape)}) does not fit its slot "
                               f"({out.dtype}, shape {list(out.shape)})", hint="the checkpoint does not match config.json")
        out.copy_(t.reshape(out.shape))
        return out
    t = t.contiguous()
    return t.pin_memory() if pin and torch.cuda.is_available() else t
