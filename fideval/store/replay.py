"""The FP32 logits of a hidden store, replayed: the store's rows (the final norm's output) through its lm head, on the
scoring device, right before the scorer.

What replay reproduces (docs/formats-store.md, "Replay"): the head's products and sums exactly as the teacher computed
them, per sequence (one GEMM of the sequence's L rows; the teacher's own head ran one GEMM per micro-batch of m x L
rows). A float32 GEMM's row results do not depend on the other rows it is computed with once the kernel is the same;
they can where the library picks another kernel for another row count (MKL on the CPU takes a different path below a
few dozen rows; cuBLAS's heuristics look at M too). So replayed logits equal a logit store's bit for bit where the
teacher's and the replay's GEMMs take the same kernel (measured on the CPU from 512 rows a call: the demo's lengths)
and within float32 sum-order rounding elsewhere (~1e-6 relative; bench/replay.py measures both); the ``bf16`` head
(bfloat16 operands, float32 sums) likewise on the GPU. A candidate's KLD against a replayed teacher equals its KLD
against the logit store to the digits the report prints (tests/test_store_hidden.py, the demo).

:class:`HiddenStore` is the :class:`~fideval.store.rows.TeacherRows` of a hidden store (``read`` gives float32 logits
on the CPU, for the CPU check, ``verify`` and the llama.cpp export) and makes the :class:`ReplayFeed` a scorer asks
first on its device (the next shard read and hashed on a side thread while this one is scored).
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fideval.errors import FidevalError
from fideval.store import head as head_file


def configure_float32() -> None:
    """No TF32 in float32 GEMMs (the teacher's own setting, fideval.model.execution.determinism)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


class ReplayHead:
    """``hidden [rows, H] -> float32 logits [rows, V]`` with the store's head, mode and finishing step, on ``device``."""

    def __init__(self, weight: torch.Tensor, block: dict[str, Any], device: torch.device | str):
        self.device = torch.device(device)
        self.mode, self.finish = block["lm_head"], block["finish"]
        self.hidden_dtype = block["hidden_dtype"]
        if self.mode == "bf16" and self.device.type != "cuda":
            # the float32 GEMM of the same bfloat16 values: the same products, float32 sums in another order
            self.mode = "float32"
        dtype = torch.bfloat16 if self.mode == "bf16" else torch.float32
        self.weight = weight.to(self.device, dtype)
        self.vocab, self.hidden_size = self.weight.shape
        configure_float32()

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        if hidden.ndim != 2 or hidden.shape[1] != self.hidden_size:
            raise FidevalError(f"hidden states of shape {tuple(hidden.shape)} do not fit the head's [{self.vocab}, {self.hidden_size}]",
                               hint="the store's shards and head disagree: rebuild or re-download the store")
        x = hidden.to(self.device, non_blocking=True)
        if self.mode == "bf16":
            y = torch.mm(x.to(torch.bfloat16), self.weight.t(), out_dtype=torch.float32)
        else:
            y = torch.nn.functional.linear(x.to(torch.float32), self.weight)
        fin = self.finish
        if fin is not None:  # as fideval.model.adapters.Adapter.finish_logits computes it, a Python float operand
            v = float(fin["value"])
            y = torch.tanh(y / v) * v if fin["op"] == "softcap" else y / v
        return y


class HiddenStore:
    """A hidden store as the scorer sees it (:class:`~fideval.store.rows.TeacherRows`): the store's identity, its
    sequences and their replayed float32 logits, over a hidden store's
    :class:`~fideval.store.reader.StoreReader` (``reader``). ``model_head``: the head read from a model folder, used (after its
    digest check) when the store was published without ``head.safetensors``."""

    def __init__(self, reader: Any, model_head: torch.Tensor | None = None, head_origin: str | None = None):
        if reader.kind != "hidden":
            raise FidevalError(f"{reader.root} is a {reader.kind} store, not a hidden one", hint="this is a bug in the caller")
        self.reader, self.root, self.meta = reader, reader.root, reader.meta
        self.vocab_size, self.seq_ids, self.kind = reader.vocab_size, reader.seq_ids, "hidden"
        self.entries = reader.entries
        raw = self.meta.get("head")
        try:
            self.block = json.loads(raw) if raw else None
        except ValueError:
            self.block = None
        if not isinstance(self.block, dict):
            raise FidevalError(f"{self.root}: the hidden store names no head (meta 'head' missing or not JSON)",
                               hint="rebuild or re-download the store")
        head_file.check_info(self.block, str(self.root))
        if self.block["hidden_size"] != int(self.meta.get("hidden_size", -1)):
            raise FidevalError(f"{self.root}: head hidden_size {self.block['hidden_size']} differs from the store's "
                               f"{self.meta.get('hidden_size')}", hint="rebuild or re-download the store")
        self.weight = head_file.load(self.root, self.block, model_head, head_origin)
        if self.weight.shape[0] != self.vocab_size:
            raise FidevalError(f"{self.root}: the head has {self.weight.shape[0]} rows, the store's vocabulary is {self.vocab_size}",
                               hint="rebuild or re-download the store")
        self._heads: dict[str, ReplayHead] = {}

    # -- TeacherRows -------------------------------------------------------------------------------------------
    def entry(self, seq_id: str) -> dict[str, Any]:
        return self.reader.entry(seq_id)

    def row_start(self, seq_id: str) -> int:
        return self.reader.row_start(seq_id)

    def path(self, seq_id: str) -> Path:
        return self.reader.path(seq_id)

    def check_files(self, seq_ids: Any = None) -> None:
        self.reader.check_files(seq_ids)

    def token_ids(self, seq_id: str) -> np.ndarray:
        return self.reader.token_ids(seq_id)

    def head(self, device: torch.device | str) -> ReplayHead:
        key = str(torch.device(device))
        if key not in self._heads:
            self._heads[key] = ReplayHead(self.weight, self.block, device)
        return self._heads[key]

    def logits(self, seq_id: str, device: torch.device | str = "cpu") -> tuple[torch.Tensor, np.ndarray]:
        """(float32 logits [rows, V] on ``device``, token ids): the shard's hidden states through the head."""
        hidden, tokens = self.reader.read_hidden(seq_id)
        return self.head(device)(hidden), tokens

    def read(self, seq_id: str) -> tuple[np.ndarray, np.ndarray]:
        """(float32 logits [rows, V] replayed on the CPU, token ids [L]): the logit store's ``read``."""
        logits, tokens = self.logits(seq_id, "cpu")
        return logits.numpy(), tokens

    def feed(self, order: list[str], device: torch.device) -> ReplayFeed:
        return ReplayFeed(self, order, device)


class ReplayFeed:
    """A :class:`~fideval.store.rows.RowFeed`: any shard's replayed logits on the scoring device. The shards of
    ``order`` are read (and hashed, on first touch) one ahead on a side thread, so the disk overlaps the scoring."""

    def __init__(self, store: HiddenStore, order: list[str], device: torch.device):
        self.store, self.device = store, torch.device(device)
        self.head = store.head(self.device)
        self._order = list(order)
        self._next = {sid: (self._order[i + 1] if i + 1 < len(self._order) else None) for i, sid in enumerate(self._order)}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fideval-hidden-read")
        self._ahead: dict[str, Future] = {}
        self._lock = threading.Lock()
        if self._order:
            self._prefetch(self._order[0])

    def _read(self, seq_id: str) -> tuple[torch.Tensor, np.ndarray]:
        hidden, tokens = self.store.reader.read_hidden(seq_id)
        if self.device.type == "cuda":
            hidden = hidden.pin_memory()  # page-locked: the copy below the head overlaps
        else:
            hidden = hidden.clone()  # touched now, on this thread, not in the scorer's
        return hidden, tokens

    def _prefetch(self, seq_id: str | None) -> None:
        if seq_id is None or self._pool is None:
            return
        with self._lock:
            if seq_id not in self._ahead:
                self._ahead[seq_id] = self._pool.submit(self._read, seq_id)

    def get(self, seq_id: str) -> tuple[torch.Tensor, np.ndarray] | None:
        """``(float32 logits on the device, token ids)`` of any shard of the store."""
        with self._lock:
            fut = self._ahead.pop(seq_id, None)
        self._prefetch(self._next.get(seq_id))
        hidden, tokens = fut.result() if fut is not None else self._read(seq_id)
        return self.head(hidden), tokens

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
