"""What a scorer reads the teacher's rows from, declared: a store on disk (:class:`~fideval.store.reader.StoreReader`)
or rows still on the device (the fused pass's :class:`~fideval.score.fused.LiveTeacher`, which the lockstep fills
with each micro-batch's logits as it computes them).

The scorer (:class:`fideval.score.run.Scorer`) asks a :class:`RowFeed` first (the shard as a device tensor, when it
is there) and reads the :class:`TeacherRows` otherwise (memory-mapped, only the rows it scores); either way the
entry's ``row_start`` says which sequence position the first row predicts from.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    import torch


@runtime_checkable
class TeacherRows(Protocol):
    """The teacher as every scorer and candidate sees it: its identity (``meta``, ``root``, ``vocab_size``), its
    sequences (``seq_ids``, each one's manifest ``entry``: tokens, rows, row_start, window_id, domain, and for a
    store on disk its file and SHA-256) and its rows."""

    root: Path
    meta: dict[str, Any]
    vocab_size: int
    seq_ids: list[str]

    def entry(self, seq_id: str) -> dict[str, Any]: ...

    def row_start(self, seq_id: str) -> int: ...

    def read(self, seq_id: str) -> tuple[np.ndarray, np.ndarray]:
        """(float32 logits [rows, V], int32 token ids [L]) of one sequence."""
        ...


@runtime_checkable
class RowFeed(Protocol):
    """Rows already on the scoring device, handed over without a read: ``(logits [rows, V], token ids)`` of
    ``seq_id`` when the feed holds them, else None (the scorer then reads :class:`TeacherRows`)."""

    def get(self, seq_id: str) -> tuple[torch.Tensor, np.ndarray] | None: ...
