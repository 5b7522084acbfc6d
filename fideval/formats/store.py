"""A teacher store's ``manifest.json`` (format ``fideval.store`` v2, v1 read) and its per-shard entries.

v2 (this round) adds the store kind ``hidden``: shards of the final norm's output (``fideval.hidden``), the lm head as
the run used it in ``head.safetensors`` beside them, named in the meta's ``head`` block by the SHA-256 of its file and
of its tensor's content. A v1 store is a logit store and reads as one.

The entry model serves three files: the manifest's ``shards``, the sidecars ``shards/<seq_id>.entry.json``
written while a teacher run is in progress (an entry plus ``mtime_ns``), and the rows of ``index.parquet``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from fideval.formats.model import Model, key

MANIFEST = "manifest.json"

# The teacher block's keys that shape the logits' bits: every shard of a store must agree on all of them (a resumed run
# that differs in one is refused, naming it), and their canonical hash is the store's ``settings_sha256``.
BIT_SHAPING = ("runner", "implementation", "arch", "dtype", "device", "device_name", "model_parallel", "torch_threads",
               "weights", "checkpoint", "micro_batch", "mlp_tokens", "chunk_bytes", "lm_head", "reference_code")


def settings_fingerprint(block: dict[str, Any]) -> str:
    """SHA-256 of a teacher block's bit-shaping settings (:data:`BIT_SHAPING`, canonical JSON): the store's
    ``settings_sha256``, the same in every shard of a store (``fideval verify`` checks)."""
    from fideval.provenance import canonical_hash

    return canonical_hash({k: block.get(k) for k in BIT_SHAPING})

_HEX64 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, kw_only=True)
class ShardEntry(Model):
    HINT = "rebuild or re-download the store"

    file: str = key("the shard's path relative to the store, `shards/<seq_id>.safetensors`")
    sha256: str = key("SHA-256 of the shard file (64 lower-case hex digits)")
    bytes: int = key("the shard file's size")
    rows: int = key("logit rows (hidden-state rows in a hidden store) in the shard")
    tokens: int = key("token ids in the shard (the sequence's length L)")
    row_start: int = key("the position row 0 predicts from: 0 for a fideval teacher, n_ctx/2 for a llama.cpp import")
    window_id: str = key("the window the sequence belongs to")
    domain: str = key("the window's domain")

    def problem(self) -> str | None:
        for name in ("bytes", "rows", "tokens", "row_start"):
            if getattr(self, name) < 0:
                return f"'{name}' is negative ({getattr(self, name)})"
        if not _HEX64.fullmatch(self.sha256):
            return "'sha256' is not 64 lower-case hex digits"
        return None


@dataclass(frozen=True, kw_only=True)
class StoreManifest(Model):
    FORMAT = "fideval.store"
    VERSION = "2"
    READABLE = ("1", "2")
    KIND = "store"
    HINT = "rebuild or re-download the store"

    format: str = key("`fideval.store`", default=FORMAT)
    version: str = key("`\"2\"` (a string; `\"1\"`, a logit store's, is read)", default=VERSION)
    meta: dict[str, Any] = key("the store's identity, every value a string: `model_id`, `model_revision`, "
                               "`tokenizer_sha256`, `vocab_size`, `kind` and more (below)")
    shards: dict[str, ShardEntry] = key("one entry per shard, keyed by sequence id (sorted)")
