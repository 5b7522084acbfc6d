"""Where a run's time goes: a timeline cut into named parts that add up to the whole, on when profiling.

Why a timeline and not timers around regions: timers leave gaps (whatever runs between two timed regions is
never seen: embeddings, masks, host<->device moves, synchronisations, the canary), and a timer around a
region that contains a host wait counts the wait as compute. Here every *mark* closes the interval since the
previous mark and gives it to the innermost part open at that moment (``"other"`` when none is), so the parts
tile the run: they sum to its span exactly, and what no part claims is visible as ``other``.

On a GPU a mark is a CUDA event recorded on the compute stream, never waited on (the stream is not
serialised); intervals are the stream's own time between marks, so a part's figure is the GPU time it took,
and a host wait bracketed as a part (``load_wait``, ``store_write``) counts only the time the GPU idled
because of it (a wait hidden behind queued GPU work costs nothing). Completed events are folded while the run
goes (``query()``, no synchronisation), so a long run keeps a bounded number. On a CPU a mark is
``perf_counter``.

A *sticky* part (the canary's micro-batch) claims everything inside it, whatever nested parts say.
"""

from __future__ import annotations

import time
from collections import defaultdict

import torch

EACH = ("attention", "moe")  # parts whose every interval is also kept (ms, run order): blocks slowing down show
_FOLD_AT = 4096


class Timeline:
    """Marks on one device's compute stream; :meth:`fold` gives seconds per part. Off: every call is a no-op."""

    def __init__(self, device: torch.device | str = "cpu", on: bool = True):
        self.device = torch.device(device)
        self.on = on
        self.cuda = self.device.type == "cuda"
        self._stack: list[tuple[str, bool]] = []
        self._pending: list[tuple[str, object]] = []  # (part of the interval ending at this mark, mark)
        self._last: object = None  # the latest folded mark
        self.parts: dict[str, float] = defaultdict(float)
        self.each: dict[str, list[float]] = {k: [] for k in EACH}
        self.marks = 0

    # -- marking -----------------------------------------------------------------------------------------
    def current(self) -> str:
        """The part the time running now belongs to."""
        for name, sticky in self._stack:
            if sticky:
                return name
        return self._stack[-1][0] if self._stack else "other"

    def _mark(self) -> None:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(torch.cuda.current_stream(self.device))
        else:
            ev = time.perf_counter()
        self.marks += 1
        if self._last is None and not self._pending:
            self._last = ev
            return
        self._pending.append((self.current(), ev))
        if len(self._pending) >= _FOLD_AT:
            self._fold_ready()

    def start(self) -> None:
        """The first mark: time before it belongs to no part."""
        if self.on and self._last is None and not self._pending:
            self._mark()

    def enter(self, name: str, sticky: bool = False) -> None:
        if self.on:
            self.start()
            self._mark()
            self._stack.append((name, sticky))

    def exit(self) -> None:
        if self.on:
            self._mark()
            self._stack.pop()

    def part(self, name: str, sticky: bool = False) -> _Part:
        """``with timeline.part("attention"): ...``: the region's time is the part's."""
        return _Part(self, name, sticky)

    # -- folding -----------------------------------------------------------------------------------------
    def _add(self, name: str, a: object, b: object) -> None:
        s = a.elapsed_time(b) / 1000 if self.cuda else b - a
        self.parts[name] += s
        if name in self.each:
            self.each[name].append(round(s * 1000, 2))

    def _fold_ready(self) -> None:
        """Fold the events the GPU has already passed (no synchronisation)."""
        k = 0
        for name, ev in self._pending:
            if self.cuda and not ev.query():
                break
            self._add(name, self._last, ev)
            self._last = ev
            k += 1
        del self._pending[:k]

    def fold(self) -> dict[str, float]:
        """Seconds per part so far (synchronizes once on a GPU); marking may go on afterwards."""
        if self.on and self._pending:
            if self.cuda:
                self._pending[-1][1].synchronize()
            self._fold_ready()
        return dict(self.parts)

    def span(self) -> float:
        """Seconds from the first mark to the last folded one: the sum of the parts."""
        return sum(self.fold().values())


class _Part:
    __slots__ = ("t", "name", "sticky")

    def __init__(self, t: Timeline, name: str, sticky: bool):
        self.t, self.name, self.sticky = t, name, sticky

    def __enter__(self):
        self.t.enter(self.name, self.sticky)
        return self

    def __exit__(self, *exc):
        self.t.exit()
        return False


def module_parts(module: torch.nn.Module, timeline: Timeline, name: str) -> None:
    """Make every call of ``module`` a part ``name`` of ``timeline`` (forward hooks; the computation is untouched)."""
    module.register_forward_pre_hook(lambda m, args: timeline.enter(name))
    module.register_forward_hook(lambda m, args, out: timeline.exit())
