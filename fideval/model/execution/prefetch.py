"""Weights on their way in: a background thread that materialises the next unit (embedding, layer i, head)
while the current one computes, and a ledger of the weight bytes resident at any moment.

Why a thread and not a pool: units are needed strictly in order and at most ``1 + depth`` may exist at
once (the current one and those prefetched), so one thread and a semaphore bound both the memory and the
order; the thread itself fans a unit's tensors out over the checkpoint's reader pool.
"""

from __future__ import annotations

import queue
import threading
import time
import weakref
from collections.abc import Callable

import torch


class Ledger:
    """Bytes of weights resident now and at peak, per unit (embedding, layer i, head).

    A unit's bytes are counted from the moment its tensors are materialised until each of its tensors is
    garbage collected (a ``weakref.finalize`` on every parameter and buffer, not on the module): a leaked
    reference -- a closure that keeps a submodule alive in a reference cycle after its layer is dropped --
    shows up as a unit that is never released rather than as memory we merely believe is free.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self.now = self.peak = self.largest = 0
        self.units: dict[int, list] = {}  # each tracking (a unit key may come again, in a later run): [unit, bytes, tensors] alive
        self.added = self.released = 0

    def track(self, unit: object, module: torch.nn.Module) -> None:
        tensors = {id(t): t for t in list(module.parameters()) + list(module.buffers())}
        sizes = {i: t.numel() * t.element_size() for i, t in tensors.items()}
        nbytes = sum(sizes.values())
        with self._lock:
            self.added += 1
            serial = self.added
            self.units[serial] = [unit, nbytes, max(1, len(tensors))]
            self.now += nbytes
            self.peak = max(self.peak, self.now)
            self.largest = max(self.largest, nbytes)
        if not tensors:
            weakref.finalize(module, self._drop, serial, 0)
        for i, t in tensors.items():
            weakref.finalize(t, self._drop, serial, sizes[i])

    def _drop(self, serial: int, nbytes: int) -> None:
        with self._lock:
            self.now -= nbytes
            entry = self.units[serial]
            entry[1] -= nbytes
            entry[2] -= 1
            if entry[2] == 0:
                del self.units[serial]
                self.released += 1


class Prefetch:
    """Loads units in order on one thread; at most ``1 + depth`` units exist at once (current + prefetched).

    ``stats`` gains ``load_s`` (time spent loading, hidden or not) and ``wait_s`` (time the consumer waited:
    the part not hidden behind compute), with their per-unit lists."""

    def __init__(self, units: list, load: Callable, depth: int, stats: dict):
        self._q: queue.Queue = queue.Queue()
        self._sem = threading.Semaphore(1 + depth)
        self._stop = False
        self._units, self._load, self._stats = units, load, stats
        self._thread = threading.Thread(target=self._run, name="fideval-prefetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        torch.set_grad_enabled(False)
        for u in self._units:
            self._sem.acquire()
            if self._stop:
                return
            t0 = time.perf_counter()
            try:
                obj = self._load(u)
            except BaseException as e:  # handed to the consumer, which re-raises it
                self._q.put(e)
                return
            dt = time.perf_counter() - t0
            self._stats["load_s"] += dt
            self._stats.setdefault("unit_load_s", []).append(dt)
            self._q.put(obj)
            del obj

    def get(self):
        t0 = time.perf_counter()
        obj = self._q.get()
        dt = time.perf_counter() - t0
        self._stats["wait_s"] += dt
        self._stats.setdefault("unit_wait_s", []).append(dt)
        if isinstance(obj, BaseException):
            raise obj
        return obj

    def release(self) -> None:
        self._sem.release()

    def close(self) -> None:
        self._stop = True
        self._sem.release()
        self._sem.release()
        self._thread.join(timeout=60)
        while not self._q.empty():
            self._q.get_nowait()
