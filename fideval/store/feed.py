"""Store shards as the score loop takes them: memory-mapped CPU tensors, or the teacher streamed onto the GPU
in the order a candidate will ask for its shards."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from fideval.store.reader import StoreReader


def mapped_tensor(array: np.ndarray) -> torch.Tensor:
    """A CPU tensor over a (read-only) memory map, without a copy; nothing in scoring writes to it."""
    with warnings.catch_warnings():  # torch warns that the array is not writable
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)


class TeacherFeed:
    """A :class:`~fideval.store.rows.RowFeed`: the teacher's shards in the order the candidate will ask for them,
    streamed by ``StoreReader.iter`` onto the GPU: the next shard is read from disk (into one page-locked host
    buffer, SHA-256 on the way) while this one is scored, and the scored shard holds no host memory. A shard asked
    for out of that order ends the stream (it would read shards nobody asks for); it and every later one are read
    directly."""

    def __init__(self, teacher: StoreReader, order: list[str], dev: torch.device):
        self._it = teacher.iter(order, device=dev, prefetch=1)

    def get(self, seq_id: str) -> tuple[torch.Tensor, np.ndarray] | None:
        """``(logits on the device, token ids)`` of ``seq_id`` when it is the stream's next shard, else None."""
        if self._it is None:
            return None
        item = next(self._it, None)
        if item is not None and item[0] == seq_id:
            return item[1], item[2]
        self.close()
        return None

    def close(self) -> None:
        if self._it is not None:
            self._it.close()
            self._it = None
