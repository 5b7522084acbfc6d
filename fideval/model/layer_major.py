"""The outer loop of a layer-major run, shared by the transformers runner (:mod:`fideval.model.runner`) and the
reference-code runner (:mod:`fideval.model.reference.runner`): rows into chunks (hidden states of one chunk fit
``host_budget``) and micro-batches, skipped sequences (a resumed run computes only the chunks holding one), the
canary (the first micro-batch again at the end, bit-identical or recorded as not), and the timeline's fold.

A subclass provides ``vocab_size``, ``hidden_size``, ``dtype``, ``micro_batch``, ``host_budget``, ``stats``,
``timeline`` and ``_chunk(tokens, mbs, ci, solo, canary)``, which computes one chunk layer by layer and yields
``(micro-batch index, row, float32 logits [L, V])``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from fideval.errors import FidevalError
from fideval.model.execution import hooks
from fideval.timing.timeline import Timeline


@runtime_checkable
class ModelRunner(Protocol):
    """What the stages ask of a model run, whichever backend computes it: the transformers runner
    (:class:`fideval.model.runner.Runner`) or the vendor's reference code
    (:class:`fideval.model.reference.runner.ReferenceRunner`), both on :class:`LayerMajor`'s outer loop.
    :func:`fideval.model.runner.make_runner` gives the one ``RunnerOptions.implementation`` names."""

    options: Any  # fideval.model.runner.RunnerOptions
    device: torch.device
    dtype: torch.dtype
    micro_batch: int
    head_mode: str  # the lm head's arithmetic as it runs: float32 or bf16 (fideval.model.execution.head)
    stats: dict[str, Any]
    timeline: Timeline
    canary: dict | None  # the last run's verdict: {seq_id, digest, digest_start, digest_end, identical}
    warming: bool

    @property
    def vocab_size(self) -> int: ...

    @property
    def hidden_size(self) -> int: ...

    @property
    def weights_description(self) -> str: ...

    def iter_logits(self, sequences, *, skip: Callable[[str], bool] | None = None, canary: bool = True,
                    stored_digest: Callable[[str], str | None] | None = None) -> Iterator[tuple[str, torch.Tensor]]: ...

    def run(self, tokens: np.ndarray, rows: list[int] | None = None, canary: bool = True, emit: set[int] | None = None,
            canary_start: Callable[[], str | None] | None = None) -> Iterator[tuple[int, torch.Tensor]]: ...

    def chunk_sequences(self, length: int) -> int: ...

    def finish_profile(self) -> dict: ...


class LayerMajor:
    canary: dict | None = None

    def finish_profile(self) -> dict:
        """``stats`` with the timeline folded (one synchronisation on a GPU): ``parts`` (seconds per part of the
        timeline, fideval.timing.timeline), and as before ``attn_s``, ``moe_s``, ``mlp_s`` (dense), ``norm_s``
        (norms and residual adds), ``moe_s_each`` / ``attn_s_each`` (ms of every MoE block / attention call)."""
        tl = self.timeline
        if tl.on:
            parts = tl.fold()
            self.stats["parts"] = parts
            for key, part in (("attn_s", "attention"), ("moe_s", "moe"), ("mlp_s", "dense_mlp"), ("norm_s", "norms")):
                self.stats[key] = parts.get(part, 0.0)
            self.stats["moe_s_each"], self.stats["attn_s_each"] = list(tl.each["moe"]), list(tl.each["attention"])
        return self.stats

    def iter_logits(self, sequences, *, skip: Callable[[str], bool] | None = None, canary: bool = True,
                    stored_digest: Callable[[str], str | None] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(seq_id, float32 [L, V])`` for each sequence not skipped, in input order.

        Skipping keeps the composition: chunks, micro-batches and MLP blocks are those of a run over every
        sequence (they shape the bits), so a chunk with any sequence to yield is computed whole and a chunk
        with none is not computed. When the first chunk is skipped, the canary's first pass is the digest
        ``stored_digest(seq_id)`` gives (the stored logits of the first sequence); None leaves it unchecked."""
        emit = None if skip is None else {k for k, sid in enumerate(sequences.ids) if not skip(sid)}
        tokens = np.asarray(sequences.tokens)
        start = (lambda: stored_digest(sequences.ids[0])) if stored_digest is not None else None
        for k, logits in self.run(tokens, canary=canary, emit=emit, canary_start=start):
            yield sequences.ids[k], logits
        if self.canary is not None:
            self.canary["seq_id"] = sequences.ids[self.canary.pop("row")]

    n_models = 1  # fideval.model.lockstep: several models through each chunk together

    def run(self, tokens: np.ndarray, rows: list[int] | None = None, canary: bool = True, emit: set[int] | None = None,
            canary_start: Callable[[], str | None] | None = None) -> Iterator[tuple[int, torch.Tensor]]:
        """Layer-major forward of ``tokens[rows]`` (int [n, L]); yields ``(row, logits float32 [L, V])`` for the
        rows in ``emit`` (None: all), computing only the chunks that hold one (see :meth:`iter_logits`)."""
        for _, row, logits in self.run_models(tokens, rows, canary, emit, [canary_start]):
            yield row, logits
            del logits
        self.canary = self.canaries[0]

    def run_models(self, tokens: np.ndarray, rows: list[int] | None = None, canary: bool = True,
                   emit: set[int] | None = None, canary_start: list | None = None
                   ) -> Iterator[tuple[int, int, torch.Tensor]]:
        """:meth:`run` for every model (``n_models``): ``(model, row, logits)``; each model's canary verdict in
        ``canaries`` (``canary_start[k]``: model k's stored first pass, as :meth:`iter_logits` says)."""
        if tokens.ndim != 2:
            raise ValueError("tokens must be [n, L]")
        rows = list(range(tokens.shape[0])) if rows is None else list(rows)
        if tokens.size and (int(tokens.max()) >= self.vocab_size or int(tokens.min()) < 0):
            bad = int(tokens.max()) if int(tokens.max()) >= self.vocab_size else int(tokens.min())
            raise FidevalError(f"token id {bad} is outside the model's vocabulary of {self.vocab_size}",
                               hint="the windows were tokenized with another tokenizer than this model's")
        self.canary = None
        self.canaries = [None] * self.n_models
        if not rows:
            return
        tl = self.timeline
        tl.start()
        m, L = self.micro_batch, tokens.shape[1]
        per_chunk = self.chunk_sequences(L)
        chunks = [rows[a:a + per_chunk] for a in range(0, len(rows), per_chunk)]
        checks = [hooks.Canary(rows[:m] if canary else []) for _ in range(self.n_models)]
        todo = [ci for ci, chunk in enumerate(chunks) if emit is None or not emit.isdisjoint(chunk)]
        if checks[0].rows and todo and todo[0] != 0 and todo[-1] == len(chunks) - 1:
            for check, start in zip(checks, canary_start or []):  # the first pass is not recomputed
                check.start = start() if start is not None else None
        t0 = time.perf_counter()
        for ci in todo:
            chunk = chunks[ci]
            mbs = [chunk[a:a + m] for a in range(0, len(chunk), m)]
            extra = ci == len(chunks) - 1 and bool(checks[0].rows)
            if extra:
                mbs.append(checks[0].rows)
            # the canary's micro-batch is its own MoE block both times: block composition changes GEMM shapes, hence bits
            solo = {0, len(mbs) - 1} if extra or ci == 0 else set()
            for k, j, row, logits in self._chunk_models(tokens, mbs, ci, solo, len(mbs) - 1 if extra else None):
                if extra and j == len(mbs) - 1:
                    with tl.part("canary"):
                        checks[k].last(row, logits)
                    continue
                if ci == 0 and j == 0:
                    with tl.part("canary"):  # the digest of the first pass
                        checks[k].first(row, logits)
                if emit is not None and row not in emit:
                    continue  # computed for the composition only (a resumed run's finished sequence)
                if k == 0:
                    self.stats["tokens"] += L
                yield k, row, logits
                del logits  # a view of a micro-batch's logits: not held while the next chunk computes
        self.canaries = [c.verdict for c in checks]
        self.canary = self.canaries[0]
        self.stats["wall_s"] += time.perf_counter() - t0
        if tl.on and not tl.cuda:  # free on a CPU; on a GPU finish_profile() synchronizes once
            self.finish_profile()

    def chunk_sequences(self, length: int) -> int:
        """Sequences of ``length`` tokens a chunk holds: whole micro-batches of hidden states within ``host_budget``."""
        per_seq = length * self.hidden_size * torch.empty((), dtype=self.dtype).element_size()
        return sequences_per_chunk(self.host_budget, per_seq, self.micro_batch)

    def _chunk_models(self, tokens: np.ndarray, mbs: list[list[int]], ci: int, solo: set[int], canary: int | None
                      ) -> Iterator[tuple[int, int, int, torch.Tensor]]:
        """``(model, micro-batch, row, logits)`` of one chunk: this one model's :meth:`_chunk`."""
        for j, row, logits in self._chunk(tokens, mbs, ci, solo, canary):
            yield 0, j, row, logits


def sequences_per_chunk(budget: int, per_seq: int, micro_batch: int) -> int:
    """Sequences a chunk of ``budget`` bytes of hidden states holds (``per_seq`` bytes each): whole micro-batches,
    at least one."""
    m = max(1, int(micro_batch))
    return max(m, (int(budget) // max(per_seq, 1)) // m * m)
