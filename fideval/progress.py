"""Progress for long work: a rich bar (rate, ETA) on a terminal, plain periodic lines in a log file.

Snakemake sends each rule's stderr to its log, so a bar there would be noise; we detect that and print
one line every ``every_s`` seconds instead.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager


class _Plain:
    def __init__(self, desc: str, total: float | None, unit: str, every_s: float):
        self.desc, self.total, self.unit, self.every_s = desc, total, unit, every_s
        self.done = 0.0
        self.t0 = self.last = time.monotonic()

    def advance(self, n: float = 1) -> None:
        self.done += n
        now = time.monotonic()
        if now - self.last >= self.every_s:
            self.last = now
            self._line(now)

    def _line(self, now: float) -> None:
        dt = max(now - self.t0, 1e-9)
        rate = self.done / dt
        if self.total:
            eta = (self.total - self.done) / rate if rate > 0 else float("inf")
            print(f"{self.desc}: {self.done:,.0f}/{self.total:,.0f} {self.unit} ({rate:,.0f} {self.unit}/s, ETA {eta:,.0f} s)",
                  file=sys.stderr, flush=True)
        else:
            print(f"{self.desc}: {self.done:,.0f} {self.unit} ({rate:,.0f} {self.unit}/s)", file=sys.stderr, flush=True)

    def close(self) -> None:
        self._line(time.monotonic())


def rate_column(unit: str):
    """A rich column: the task's rate in ``unit``/s, or ``-`` before rich has measured one (``task.speed`` is
    None until the first advance, which a format string column cannot print)."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class Rate(ProgressColumn):
        def render(self, task) -> Text:
            speed = task.finished_speed or task.speed
            return Text(f"{'-' if speed is None else f'{speed:,.0f}':>10} {unit}/s")

    return Rate()


class _Rich:
    def __init__(self, desc: str, total: float | None, unit: str):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.p = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                          rate_column(unit), TimeRemainingColumn(), transient=False)
        self.p.start()
        self.task = self.p.add_task(desc, total=total)

    def advance(self, n: float = 1) -> None:
        self.p.advance(self.task, n)

    def close(self) -> None:
        self.p.stop()


@contextmanager
def progress(desc: str, total: float | None = None, unit: str = "it", every_s: float = 10.0) -> Iterator[_Plain | _Rich]:
    """``with progress("teacher", total=rows, unit="rows") as bar: bar.advance(n)``."""
    bar: _Plain | _Rich
    if sys.stderr.isatty():
        try:
            bar = _Rich(desc, total, unit)
        except Exception:  # a terminal rich cannot drive: fall back to plain lines
            bar = _Plain(desc, total, unit, every_s)
    else:
        bar = _Plain(desc, total, unit, every_s)
    try:
        yield bar
    finally:
        bar.close()
