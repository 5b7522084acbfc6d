"""Import a llama.cpp ``--kl-divergence-base`` file as a (lossy) teacher store of kind ``logprobs``.

The layout, as ``tools/perplexity/perplexity.cpp`` writes it (``perplexity()`` with ``--kl-divergence-base``
and read back by ``kl_divergence()``), all little-endian:

* 8 bytes magic ``_logits_``; int32 ``n_ctx``; int32 ``n_vocab``; int32 ``n_chunk``;
* ``n_chunk * n_ctx`` int32 token ids (the tokenized text, chunk k = tokens[k*n_ctx:(k+1)*n_ctx]; when the
  vocab adds BOS, llama.cpp evaluates position 0 of every chunk as BOS but writes the original token);
* per chunk, ``n_ctx - 1 - n_ctx/2`` scored rows (positions ``first = n_ctx/2`` .. ``n_ctx - 2``, row i
  predicting chunk token ``first + i + 1``), each ``nv = 2*((n_vocab + 1)/2) + 4`` uint16: two float32
  (``scale``, ``min_log_prob``), ``n_vocab`` uint16 codes, one pad code when ``n_vocab`` is odd.

Encoding (``log_softmax(..., uint16_t * log_prob, ...)``): ``min_logit = max(min(logits), max_logit - 16)``,
``scale = (max_logit - min_logit)/65535``, ``code = nearest_int((logit - min_logit)/scale)`` for logits above
``min_logit``, else 0; ``min_log_prob = min_logit - max_logit - log(sum exp(logit - max_logit))``. Decoding
(what ``kl_divergence`` uses): ``log_prob = scale*code + min_log_prob`` in float32. So the store is lossy:
only the top 16 nats of each distribution are resolved, in steps of at most 16/65535 = 2.44e-4 nats
(everything below is floored at ``min_log_prob``), and only the second half of each chunk has rows. The
store says so in its meta (``lossy``) and in its shards' ``row_start`` (= ``n_ctx/2``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from fideval.errors import FidevalError
from fideval.fsio import sha256_file

MAGIC = b"_logits_"
HEADER = 8 + 3 * 4
LOSSY = ("llama.cpp uint16 log-probs: only the top 16 nats of each row are resolved, in steps of at most "
         "16/65535 = 2.44e-4 nats (lower log-probs floored at the row's minimum), and only the second half "
         "of each chunk has rows (row_start = n_ctx/2)")


def encode_rows(logits: Any) -> tuple[Any, Any, Any]:
    """perplexity.cpp's ``log_softmax(n_vocab, logits, uint16_t * log_prob, tok)`` for rows of logits (a torch
    tensor ``[rows, V]``): ``(scale, min_log_prob, codes)``, the first two float32 ``[rows, 1]``, codes float32
    ``[rows, V]`` holding integers (0..65535; cast to uint16 to store them).

    As the C code: float32 throughout except the sum of ``exp(logit - max)``, which is float64;
    ``nearest_int`` rounds half to even (as ``torch.round``); every code is 0 when ``scale`` is 0."""
    import torch

    x = logits.float()
    mx = x.amax(-1, keepdim=True)
    mn = torch.maximum(x.amin(-1, keepdim=True), mx - 16)
    lse = torch.log(torch.exp(x - mx).double().sum(-1, keepdim=True)).float()
    min_lp = (mn - mx) - lse
    scale = (mx - mn) / 65535.0
    inv = torch.where(scale != 0, 1 / scale, torch.zeros_like(scale))
    code = torch.round(inv * (x - mn))
    code = torch.where((x > mn) & (scale != 0), code, torch.zeros_like(code))
    return scale, min_lp, code


def row_words(n_vocab: int) -> int:
    """uint16 words per stored row: 2 float32 + n_vocab codes, padded to an even count of codes."""
    return 2 * ((n_vocab + 1) // 2) + 4


class KldBase:
    """A parsed, size-checked ``--kl-divergence-base`` file; arrays are memory-mapped, nothing is loaded."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            size = os.path.getsize(self.path)
            with open(self.path, "rb") as f:
                head = f.read(HEADER)
        except OSError as e:
            raise FidevalError(f"cannot read {self.path} ({e.strerror})", hint="check the path") from None
        if len(head) < HEADER or head[:8] != MAGIC:
            raise FidevalError(f"{self.path} is not a llama.cpp --kl-divergence-base file (no '_logits_' magic)",
                               hint="pass the file written by llama-perplexity --kl-divergence-base FILE")
        n_ctx, n_vocab, n_chunk = (int(x) for x in np.frombuffer(head, "<i4", 3, 8))
        if n_ctx < 4 or n_vocab < 1 or n_chunk < 1:
            raise FidevalError(f"{self.path}: header n_ctx={n_ctx}, n_vocab={n_vocab}, n_chunk={n_chunk} is impossible",
                               hint="the file is damaged; re-run llama-perplexity --kl-divergence-base")
        self.n_ctx, self.n_vocab, self.n_chunk = n_ctx, n_vocab, n_chunk
        self.first = n_ctx // 2
        self.rows = n_ctx - 1 - self.first
        self.nv = row_words(n_vocab)
        tok_bytes = 4 * n_chunk * n_ctx
        need = HEADER + tok_bytes + 2 * n_chunk * self.rows * self.nv  # Python ints: no overflow
        if need != size:
            what = "truncated" if need > size else "has trailing bytes"
            raise FidevalError(f"{self.path}: header (n_ctx={n_ctx}, n_vocab={n_vocab}, n_chunk={n_chunk}) implies "
                               f"{need} bytes, the file has {size} ({what})",
                               hint="re-run llama-perplexity to completion; a killed run leaves a short file")
        self.tokens = np.memmap(self.path, "<i4", "r", offset=HEADER, shape=(n_chunk, n_ctx))
        self._rows = np.memmap(self.path, "<u2", "r", offset=HEADER + tok_bytes, shape=(n_chunk, self.rows, self.nv))

    def logprobs(self, chunk: int) -> np.ndarray:
        """Decoded float32 log-probs [rows, n_vocab] of one chunk: ``scale*code + min_log_prob``."""
        raw = np.ascontiguousarray(self._rows[chunk])
        scale_min = raw[:, :4].copy().view("<f4")  # [rows, 2]: scale, min_log_prob
        codes = raw[:, 4:4 + self.n_vocab].astype(np.float32)
        out = codes * scale_min[:, :1]
        out += scale_min[:, 1:2]
        return out


def import_llamacpp(path: str | Path, out: str | Path, *, model_id: str = "unknown", model_revision: str = "unknown",
                    tokenizer_sha256: str = "unknown", domain: str = "llamacpp", bos_id: int | None = None) -> dict[str, Any]:
    """Write a store at ``out`` with one shard per chunk (``<domain>-<k:03d>``); resumable like any store."""
    from fideval.progress import progress
    from fideval.store.writer import StoreWriter

    base = KldBase(path)
    if bos_id is not None and not 0 <= bos_id < base.n_vocab:
        raise FidevalError(f"--bos-id {bos_id} is outside the vocabulary of {base.n_vocab} in {base.path}",
                           hint="give the BOS id of the model's tokenizer")
    meta = {"model_id": model_id, "model_revision": model_revision, "tokenizer_sha256": tokenizer_sha256,
            "vocab_size": base.n_vocab, "kind": "logprobs", "lossy": LOSSY,
            "source": "llama.cpp --kl-divergence-base", "source_file": base.path.name,
            "source_sha256": sha256_file(base.path), "n_ctx": base.n_ctx,
            "bos_at_chunk_start": "replaced by --bos-id" if bos_id is not None else
            "as in the file (llama.cpp evaluates position 0 as BOS when the vocab adds BOS)"}
    writer = StoreWriter(out, meta)
    width = max(3, len(str(base.n_chunk - 1)))
    written = 0
    with progress("import-llamacpp", total=base.n_chunk, unit="chunks") as bar:
        for k in range(base.n_chunk):
            sid = f"{domain}-{k:0{width}d}"
            if not writer.done(sid):
                tokens = np.array(base.tokens[k], dtype=np.int32)
                if bos_id is not None:
                    tokens[0] = bos_id
                writer.write(sid, base.logprobs(k), tokens, window_id=sid, domain=domain, row_start=base.first)
                written += 1
            bar.advance(1)
    manifest = writer.finish()
    from fideval.store import card

    card.write(Path(out))  # the dataset card beside the store
    return {"chunks": base.n_chunk, "written": written, "n_ctx": base.n_ctx, "n_vocab": base.n_vocab,
            "rows_per_chunk": base.rows, "shards": len(manifest["shards"])}
