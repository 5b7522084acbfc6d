"""The on-disk contract for token sequences (``windows-<W>/`` and ``cuts-<C>/``), format ``fideval.sequences`` v1.

One ``tokens.safetensors`` per length folder: tensor ``tokens`` int32 [n_sequences, length]; metadata
(strings, as safetensors requires) ``format``, ``version``, ``length``, ``ids`` (JSON list of sequence
ids) and ``domains`` (JSON list, aligned with ``ids``). A window id is ``<domain>-<k:03d>``; its cuts are
``<window id>.c<j>``. Every sequence runs as a fresh sequence from position 0. Imports only numpy and
safetensors so the GPU machine can read it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fideval.formats.ids import window_of

FORMAT = "fideval.sequences"
VERSION = "1"
FILE = "tokens.safetensors"


@dataclass(frozen=True)
class Sequences:
    ids: list[str]
    domains: list[str]
    tokens: np.ndarray  # int32 [n, length]

    @property
    def length(self) -> int:
        return int(self.tokens.shape[1])

    def window_of(self, seq_id: str) -> str:
        return window_of(seq_id)

    def select_domains(self, domains: list[str] | tuple[str, ...] | None) -> "Sequences":
        """The sequences of the given domains, in their original order (all of them for ``None``)."""
        if not domains:
            return self
        keep = [k for k, d in enumerate(self.domains) if d in set(domains)]
        return Sequences(ids=[self.ids[k] for k in keep], domains=[self.domains[k] for k in keep],
                         tokens=self.tokens[keep])


def length_dir(root: str | Path, kind: str, length: int) -> Path:
    """``kind`` is ``windows`` or ``cuts``."""
    return Path(root) / f"{kind}-{length}"


def _safetensors_bytes(tokens: np.ndarray, meta: dict[str, str]) -> bytes:
    """The safetensors file for one int32 tensor, with a canonical header (sorted keys, 8-byte padded).

    ``safetensors.numpy.save`` orders ``__metadata__`` keys by a hash map, so two identical runs wrote
    different bytes; a sorted header makes the file a pure function of its content (re-runs compare bit for
    bit, and the file's SHA-256 means something)."""
    arr = np.ascontiguousarray(tokens, dtype="<i4")
    header = {"__metadata__": meta, "tokens": {"dtype": "I32", "shape": list(arr.shape), "data_offsets": [0, arr.nbytes]}}
    raw = json.dumps(header, separators=(",", ":"), sort_keys=True).encode("utf-8")
    raw += b" " * (-(8 + len(raw)) % 8)
    return len(raw).to_bytes(8, "little") + raw + arr.tobytes()


def write_sequences(folder: str | Path, seqs: Sequences) -> None:
    from fideval.fsio import write_bytes

    if seqs.tokens.dtype != np.int32 or seqs.tokens.ndim != 2:
        raise ValueError("tokens must be int32 [n, length]")
    if not (len(seqs.ids) == len(seqs.domains) == seqs.tokens.shape[0]):
        raise ValueError("ids, domains and tokens disagree in count")
    meta = {"format": FORMAT, "version": VERSION, "length": str(seqs.length),
            "ids": json.dumps(seqs.ids), "domains": json.dumps(seqs.domains)}
    write_bytes(Path(folder) / FILE, _safetensors_bytes(seqs.tokens, meta))


def read_sequences(folder: str | Path) -> Sequences:
    from safetensors import safe_open

    from fideval.errors import FidevalError

    path = Path(folder) / FILE
    if not path.exists():
        raise FidevalError(f"no token sequences at {path}", hint="run 'fideval windows' first")
    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
            if meta.get("format") != FORMAT:
                raise FidevalError(f"{path} is not a fideval sequences file (format {meta.get('format')!r})")
            if meta.get("version") != VERSION:
                raise FidevalError(f"{path} has sequences format version {meta.get('version')}, this fideval reads {VERSION}",
                                   hint="rebuild the windows with this version")
            tokens = f.get_tensor("tokens")
    except FidevalError:
        raise
    except Exception as e:  # safetensors raises its own error types for corrupt headers
        raise FidevalError(f"{path} is unreadable ({type(e).__name__})", hint="rebuild the windows") from None
    ids, domains = json.loads(meta["ids"]), json.loads(meta["domains"])
    if tokens.dtype != np.int32 or tokens.ndim != 2 or len(ids) != tokens.shape[0] or len(domains) != len(ids):
        raise FidevalError(f"{path} is inconsistent (shape {tuple(tokens.shape)}, {len(ids)} ids)", hint="rebuild the windows")
    return Sequences(ids=ids, domains=domains, tokens=tokens)


def token_sha256(tokens: np.ndarray) -> str:
    """SHA-256 of the little-endian int32 bytes of a 1-D token array (what eval-windows.json records)."""
    import hashlib

    return hashlib.sha256(np.ascontiguousarray(tokens, dtype="<i4").tobytes()).hexdigest()
