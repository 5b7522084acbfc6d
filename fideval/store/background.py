"""``BackgroundWriter``: a :class:`~fideval.store.writer.StoreWriter` on one background thread, so that the teacher
computes the next sequences while a shard is checked (no NaN/inf), hashed and written.

Why: a DeepSeek-V3 shard of 2,048 rows x 129,280 is 1.06 GB; checking, hashing (~2 GB/s on one core) and writing
it synchronously idles the GPU for about a second per sequence. Here at most ``depth`` shards are in flight
(queued or being written); :meth:`write` waits only when all are, and that wait is the run's ``store_write``
part. A GPU tensor is copied into a page-locked buffer on the compute stream (asynchronous, the ``d2h`` part);
the thread waits for the copy's event before touching the bytes. A CPU tensor is handed over as it is (the
runner never writes into logits it has yielded).

What is written is exactly what :meth:`StoreWriter.write` writes (the same call, in the same order): shards
are renamed into place atomically, sidecars follow, ``done()`` and ``finish()`` mean what they meant. An error
in the thread (a full disk, NaN logits) stops it; the next :meth:`write`, :meth:`flush` or :meth:`finish` raises
it in the caller's thread as one :class:`FidevalError` line, and the failed shard leaves no file behind.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

from fideval.errors import FidevalError
from fideval.store.writer import StoreWriter

_STOP = object()


class BackgroundWriter:
    """``w = BackgroundWriter(StoreWriter(root, meta))``; ``w.write(...)`` per sequence; ``w.finish()``."""

    def __init__(self, writer: StoreWriter, *, depth: int = 2, timeline: Any = None):
        from fideval.timing.timeline import Timeline

        self.writer = writer
        self.timeline = timeline if timeline is not None else Timeline(on=False)
        self._slots = threading.Semaphore(max(1, int(depth)))
        self._q: queue.Queue = queue.Queue()
        self._free: list[Any] = []  # page-locked buffers no shard uses
        self._buffers = None
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._failed_on = ""
        self.stats = {"write_s": 0.0, "copy_wait_s": 0.0, "waited_s": 0.0, "shards": 0}
        self._thread = threading.Thread(target=self._run, name="fideval-store-writer", daemon=True)
        self._thread.start()

    @property
    def meta(self) -> dict[str, str]:
        """The store's meta, after every queued shard is written: each shard carries the meta of its write, so an
        edit (the canary's verdict, the profile) must not reach shards queued before it."""
        self.flush()
        return self.writer.meta

    def done(self, seq_id: str) -> bool:
        """:meth:`StoreWriter.done` (call it before the first write)."""
        return self.writer.done(seq_id)

    # -- the caller's side -------------------------------------------------------------------------------
    def write(self, seq_id: str, logits: Any, token_ids: Any, window_id: str, domain: str) -> None:
        """Queue one shard (``logits`` float32 [rows, V], or a hidden store's states in their own dtype; numpy or torch on
        any device). A CUDA tensor is copied into a page-locked buffer in its own dtype (a bfloat16 state stays 2 bytes
        a value: the writer keeps what the run computed)."""
        self._raise()
        tl = self.timeline
        t0 = time.perf_counter()
        with tl.part("store_write"):  # on a GPU: only the time the stream idled while the writer caught up
            self._slots.acquire()
        self.stats["waited_s"] += time.perf_counter() - t0
        if self._error is not None:
            self._slots.release()
            self._raise()
        event = buf = None
        if getattr(logits, "is_cuda", False):
            import torch

            with tl.part("d2h"):
                nbytes = logits.numel() * logits.element_size()
                buf = self._buffer(nbytes)
                host = buf[:nbytes].view(logits.dtype).view(logits.shape)
                host.copy_(logits, non_blocking=True)
                event = torch.cuda.Event()
                event.record(torch.cuda.current_stream(logits.device))
            logits = host
        self._q.put((seq_id, logits, token_ids, window_id, domain, event, buf))

    def flush(self) -> None:
        """Wait until every queued shard is written; raise the thread's error, if any."""
        t0 = time.perf_counter()
        self._q.join()
        self.stats["waited_s"] += time.perf_counter() - t0
        self._raise()

    def finish(self) -> dict[str, Any]:
        """:meth:`flush`, stop the thread, then :meth:`StoreWriter.finish` (manifest and index)."""
        self.flush()
        self.close()
        return self.writer.finish()

    def close(self) -> None:
        """Stop the thread (after what is queued); unlock the buffers. Safe to call twice."""
        if self._thread.is_alive():
            self._q.put(_STOP)
            self._thread.join()
        if self._buffers is not None:
            self._buffers.close()
            self._buffers = None

    def hidden(self) -> float:
        """The share of the writer's work the caller did not wait for (1 - waited / worked)."""
        from fideval.timing.accounting import hidden_share

        return hidden_share(self.stats["write_s"] + self.stats["copy_wait_s"], self.stats["waited_s"])

    def _buffer(self, nbytes: int):
        with self._lock:
            while self._free:
                buf = self._free.pop()
                if buf.numel() >= nbytes:
                    return buf
                self._buffers.drop(buf)
        if self._buffers is None:
            from fideval.store.pinned import HostBuffers

            self._buffers = HostBuffers(pin=True)
        return self._buffers.new(nbytes)

    def _raise(self) -> None:
        e = self._error
        if e is None:
            return
        if isinstance(e, FidevalError):
            raise e
        raise FidevalError(f"writing shard {self._failed_on} failed: {type(e).__name__}: {e}",
                           hint="nothing partial was kept; fix the cause and run again to resume") from e

    # -- the thread --------------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is _STOP:
                self._q.task_done()
                return
            seq_id, logits, tokens, window_id, domain, event, buf = item
            try:
                if self._error is None:
                    t0 = time.perf_counter()
                    if event is not None:
                        event.synchronize()
                    t1 = time.perf_counter()
                    self.writer.write(seq_id, logits, tokens, window_id, domain)
                    self.stats["copy_wait_s"] += t1 - t0
                    self.stats["write_s"] += time.perf_counter() - t1
                    self.stats["shards"] += 1
            except BaseException as e:  # noqa: BLE001 -- raised in the caller's thread (_raise)
                self._error, self._failed_on = e, seq_id
            finally:
                del logits
                if buf is not None:
                    with self._lock:
                        self._free.append(buf)
                self._slots.release()
                self._q.task_done()
