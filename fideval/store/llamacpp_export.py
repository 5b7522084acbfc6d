"""Export a fideval teacher store as a llama.cpp ``--kl-divergence-base`` file, so a llama.cpp user can score a
GGUF build with ``llama-perplexity --kl-divergence`` against fideval's exact teacher.

The file is the one :mod:`fideval.store.llamacpp` reads (and ``perplexity()`` in llama.cpp's
``tools/perplexity/perplexity.cpp`` writes): header ``_logits_``, int32 ``n_ctx``, ``n_vocab``, ``n_chunk``; the
token ids of every chunk; then per chunk the rows of positions ``first = n_ctx/2`` .. ``n_ctx - 2`` in
llama.cpp's uint16 encoding (:func:`~fideval.store.llamacpp.encode_rows`). Chunk k is the store's k-th
sequence in sorted ``seq_id`` order (the order ``StoreReader.seq_ids`` and ``fideval score`` use), its
``token_ids`` written as they are; ``n_ctx`` is the sequences' common length. Only those rows are written
because llama.cpp's KLD scores only the second half of each context: positions 0 .. n_ctx/2 - 1 of a
fideval store (and its last row, predicting past the end) have no place in the file.

Why nothing else is adapted: llama.cpp replaces token 0 of each chunk by BOS when the GGUF's tokenizer adds
one (``tokenizer.ggml.add_bos_token``); a fideval window does not start with BOS unless its separator put one
there, so the candidate then sees another context than the teacher did. That is for the llama.cpp command
line to settle (``--override-kv tokenizer.ggml.add_bos_token=bool:false``), not for the file: the file holds
exactly what the teacher saw.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fideval.errors import FidevalError
from fideval.store.llamacpp import MAGIC, encode_rows, row_words

_PIECE = 1 << 24  # elements encoded at a time: a 2,048 x 152k shard is encoded in ~20 pieces of 64 MB


def plan_export(reader: Any, n_ctx: int | None = None) -> tuple[list[str], int]:
    """The sequences to export (sorted ``seq_id`` order) and their common length ``n_ctx``; one-line errors for
    a store llama.cpp cannot take: mixed lengths (unless ``n_ctx`` picks one), sequences too short, rows missing
    from the second half."""
    lengths = {sid: int(reader.entries[sid]["tokens"]) for sid in reader.seq_ids}
    if n_ctx is None:
        found = sorted(set(lengths.values()))
        if len(found) != 1:
            raise FidevalError(f"{reader.root}: sequences of {len(found)} lengths ({', '.join(map(str, found[:6]))}); "
                               "a llama.cpp base file has one n_ctx",
                               hint="pick one with --n-ctx")
        n_ctx = found[0]
    seq_ids = [sid for sid in reader.seq_ids if lengths[sid] == n_ctx]
    if not seq_ids:
        raise FidevalError(f"{reader.root}: no sequence of {n_ctx} tokens",
                           hint=f"lengths in the store: {', '.join(map(str, sorted(set(lengths.values()))[:6]))}")
    if n_ctx < 4:
        raise FidevalError(f"{reader.root}: sequences of {n_ctx} tokens are too short for llama-perplexity",
                           hint="export sequences of at least 4 tokens (llama.cpp scores the second half)")
    first = n_ctx // 2
    for sid in seq_ids:
        e = reader.entries[sid]
        start, rows = int(e["row_start"]), int(e["rows"])
        if start > first or start + rows < n_ctx - 1:
            raise FidevalError(f"{reader.root}: sequence {sid} has rows for positions {start}..{start + rows - 1}, "
                               f"llama.cpp needs {first}..{n_ctx - 2}",
                               hint="export a store written by 'fideval teacher' (every position has a row)")
    return seq_ids, n_ctx


def encode_chunk(logits: np.ndarray) -> np.ndarray:
    """Rows of logits (or log-probs) ``[rows, V]`` -> the file's uint16 rows ``[rows, row_words(V)]``: float32
    ``scale`` and ``min_log_prob`` in the first four words, the codes, one zero pad code when V is odd."""
    import torch

    n, v = logits.shape
    out = np.zeros((n, row_words(v)), "<u2")
    step = max(1, _PIECE // max(v, 1))
    for i in range(0, n, step):
        scale, min_lp, code = encode_rows(torch.from_numpy(np.array(logits[i:i + step], np.float32)))  # a copy: memmaps are read-only
        head = torch.cat([scale, min_lp], 1).numpy().astype("<f4")
        out[i:i + step, :4] = head.view("<u2")
        out[i:i + step, 4:4 + v] = code.to(torch.int32).numpy().astype("<u2")  # wraps as C's uint16 store would
    return out


def export_llamacpp(store: str | Path, out: str | Path, *, n_ctx: int | None = None) -> dict[str, Any]:
    """Write ``out`` (through a temp name, renamed when complete) from the store at ``store``; return a summary."""
    from fideval.fsio import atomic_open
    from fideval.progress import progress
    from fideval.store import StoreReader

    reader = StoreReader(store)
    seq_ids, n_ctx = plan_export(reader, n_ctx)
    reader.check_files(seq_ids)  # a missing or truncated shard is refused before the file is begun
    first, v = n_ctx // 2, reader.vocab_size
    if len(seq_ids) >= 1 << 31 or v >= 1 << 31:
        raise FidevalError(f"{reader.root}: {len(seq_ids)} sequences of vocab {v} do not fit llama.cpp's int32 header",
                           hint="export fewer sequences with --n-ctx")
    tokens = np.stack([reader.token_ids(sid) for sid in seq_ids]).astype("<i4")
    if tokens.min() < 0 or tokens.max() >= v:
        raise FidevalError(f"{reader.root}: token ids outside the vocabulary of {v}", hint="run 'fideval verify' on the store")
    with atomic_open(out) as f, progress("export-llamacpp", total=len(seq_ids), unit="chunks") as bar:
        f.write(MAGIC)
        f.write(np.array([n_ctx, v, len(seq_ids)], "<i4").tobytes())
        f.write(tokens.tobytes())
        for sid in seq_ids:
            logits, _ = reader.read(sid)  # hash checked on this first read
            lo = first - reader.row_start(sid)
            f.write(encode_chunk(logits[lo:lo + n_ctx - 1 - first]).tobytes())
            bar.advance(1)
    return {"chunks": len(seq_ids), "n_ctx": n_ctx, "n_vocab": v, "rows_per_chunk": n_ctx - 1 - first,
            "skipped": len(reader.seq_ids) - len(seq_ids), "first": seq_ids[0], "last": seq_ids[-1],
            "lossy": reader.meta.get("lossy"), "kind": reader.kind}
