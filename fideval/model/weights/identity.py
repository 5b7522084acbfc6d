"""What identifies a checkpoint's bytes: the teacher store records it in its settings fingerprint, so a store is
never resumed with other weights under the same model id and revision (retrained, re-quantized, re-downloaded
from another revision), and every shard names the weights it came from.

A file of at most :data:`FULL_BYTES` is hashed whole (SHA-256: every test and demo model, a config, an index).
A larger one (a 4-5 GB shard of a 671 B release: hashing 1.3 TB would take an hour per run) is *sampled*: the
SHA-256 of its size, its first :data:`HEAD_BYTES` (a safetensors header with every tensor's name, dtype, shape
and offsets) and :data:`SAMPLES` blocks of :data:`SAMPLE_BYTES` at evenly spaced offsets. A whole retrained,
re-quantized or re-released file changes every sampled block; a change confined to a few tensors of such a file
is seen only where a sampled block falls in them, and a flipped bit between two samples not at all -- which is
why the digest says which of the two it is (``sha256:`` or ``sampled-sha256:``). Corruption of the teacher's own
shards is the store's SHA-256's job.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from fideval.errors import FidevalError

FULL_BYTES = 256 << 20
HEAD_BYTES = 1 << 20
SAMPLES = 16
SAMPLE_BYTES = 1 << 16
# what a teacher reads of a checkpoint folder besides the tokenizer (recorded apart: tokenizer_sha256)
PATTERNS = ("config.json", "model.safetensors.index.json", "*.safetensors")


def file_digest(path: Path) -> str:
    """``sha256:<hex>`` of the whole file, or ``sampled-sha256:<hex>`` of a file over :data:`FULL_BYTES`."""
    try:
        size = path.stat().st_size
        if size <= FULL_BYTES:
            from fideval.fsio import sha256_file

            return "sha256:" + sha256_file(path)
        h = hashlib.sha256(f"{size}\n".encode())
        with open(path, "rb") as f:
            h.update(f.read(HEAD_BYTES))
            for k in range(SAMPLES):
                f.seek((size - SAMPLE_BYTES) * k // (SAMPLES - 1))
                h.update(f.read(SAMPLE_BYTES))
        return "sampled-sha256:" + h.hexdigest()
    except OSError as e:
        raise FidevalError(f"{path}: cannot read it to fingerprint the checkpoint ({e.strerror or type(e).__name__})",
                           hint="check the model folder's files and permissions") from None


def checkpoint_identity(folder: str | Path) -> dict[str, str]:
    """``{file name: digest}`` of the files of a checkpoint folder that shape a teacher's logits (sorted)."""
    folder = Path(folder)
    files = sorted({p for pat in PATTERNS for p in folder.glob(pat) if p.is_file()})
    return {p.name: file_digest(p) for p in files}
