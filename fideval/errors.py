"""One exception type for problems the user can fix.

The CLI prints a :class:`FidevalError` as a single line (``fideval: error: ...``) and exits 2; anything
else is a bug in fideval and keeps its traceback. Messages name the file or key at fault and what to do.
"""

from __future__ import annotations

import signal
import threading
from typing import Any


class FidevalError(Exception):
    """A problem with the user's input or environment, reported as one line without a traceback."""

    def __init__(self, message: str, *, hint: str | None = None):
        self.message = message.strip().replace("\n", " ")
        self.hint = hint
        super().__init__(self.line())

    def line(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class Interrupted(FidevalError):
    """The user pressed Ctrl-C (or a scheduler sent SIGTERM): one line saying what was kept and how to resume;
    the CLI exits 130 (SIGINT) or 143 (SIGTERM)."""


class StopSignals:
    """SIGTERM handled as SIGINT is, for the span of a ``with`` block in the main thread.

    A scheduler stops a job with SIGTERM (SLURM at its time limit or on ``scancel``, Kubernetes when a pod is
    evicted, torchrun's agent when a rank fails), then SIGKILL after a grace period. Python's default for SIGTERM
    is to die at once, silently, with status 143 and nothing kept that a verb keeps on Ctrl-C. Inside the block a
    SIGTERM raises KeyboardInterrupt in the main thread (Python runs signal handlers there), so every verb's
    interrupt path runs (the scored shards kept, the resume line); :attr:`signum` then says which signal stopped
    the run, for the exit status (:meth:`status`: 128 + the signal) and the line (:meth:`named`). A second SIGTERM
    while the first is being handled is ignored: the run is already stopping and the scheduler's SIGKILL follows.
    The previous handler is restored on leaving the block.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: Any = None

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGTERM, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)
            self._old = None

    def _handler(self, signum: int, frame: object) -> None:
        if self.signum is not None:
            return
        self.signum = signum
        raise KeyboardInterrupt

    def status(self) -> int:
        """The exit status of an interrupted run: 143 after SIGTERM, else 130 (Ctrl-C), as a shell reports them."""
        return 128 + int(self.signum or signal.SIGINT)

    def named(self, line: str) -> str:
        """``line`` naming the signal when it was not Ctrl-C: 'score interrupted: ...' becomes 'score interrupted by
        SIGTERM: ...' (a Ctrl-C line stays as it was: 'interrupted' has always meant Ctrl-C)."""
        if self.signum is None or self.signum == signal.SIGINT:
            return line
        name = signal.Signals(self.signum).name
        head, sep, tail = line.partition(" interrupted")
        return f"{head} interrupted by {name}{tail}" if sep else f"{line} ({name})"
