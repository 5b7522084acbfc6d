"""Import a hidden-state fidelity suite's BF16 reference (``tools/fidelity.py capture`` of malaiwah/qwen38-27b-exl3, as
published in ``malaiwah/qwen38-27b-fidelity-suite-v5``) as a fideval hidden store (v2).

The format (docs/formats-store.md, "Hidden-state suite import", read from the tool's source; no code of it is used):

* ``SUITE/suite-manifest.json``: ``context_length`` L, ``context_index`` (per context ``index``, ``stratum``, ``file``
  ``tokens/context-NNNN.json`` relative to the suite folder, ``token_sha256`` = SHA-256 of ``json.dumps(ids)``,
  ``tokens``, ``source_cluster``), ``suite_token_sha256`` = SHA-256 of the contexts' ``token_sha256`` strings
  concatenated in ``context_index`` order, ``tokenizer_sha256`` (of ``tokenizer.json``);
* ``REF/capture-manifest.json``: ``complete``, ``suite_token_sha256``, ``contexts``, ``captures`` (``index``,
  ``sha256`` of the file, ``shape``), optionally ``context_length``, ``expected_indices``, ``candidate_identity``;
* ``REF/hidden_NNNN.safetensors`` (NNNN = the context's ``index``, 4 digits at least): one tensor ``hidden_states``
  [L-1, H], the final norm's output at positions 0 .. L-2 (row i predicts token i+1), bfloat16;
* the shared head: a safetensors file with ``weight`` [V, H] bfloat16 (the tool takes ``weight``, else the file's
  first tensor), identified by the SHA-256 of the file.

Mapping: a context becomes one shard, ``seq_id`` ``<stratum>-<index:04d>`` (window: its ``source_cluster``, so that
fideval's cluster bootstrap resamples the suite's clusters; domain = stratum), token
ids the context's L ids, ``row_start`` 0 and L-1 rows: row r is the suite's row r, the state at position r that
predicts token r+1. A fideval shard may lack its last row (the one predicting past the end), so the store holds
exactly what was captured and every position fideval scores (0 .. L-2) is one the suite defines: nothing is
dropped, padded or invented. The head is applied in float32 (``lm_head`` float32: the bfloat16 values' exact products,
float32 sums), so the replayed logits are ``states.float() @ weight.float().T``; the tool's own replay rounds the
logits to bfloat16 (a bfloat16 GEMM on the GPU), which this store does not.

Everything is checked before it is trusted and written into a temp folder beside OUT, renamed onto OUT when complete:
on any failure nothing is left at OUT.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from pathlib import Path, PurePosixPath
from typing import Any

import torch

from fideval.errors import FidevalError
from fideval.formats import ids
from fideval.fsio import sha256_file
from fideval.progress import progress

SOURCE = ("hidden-state fidelity suite: tools/fidelity.py capture (malaiwah/qwen38-27b-exl3), e.g. "
          "malaiwah/qwen38-27b-fidelity-suite-v5 reference/hidden-bf16")
SPEC = "malaiwah/qwen38-27b-exl3 tools/fidelity.py @ a5397469389891e66bc11e6f42c8f9010c81d062"
KEY = "hidden_states"
MAX_JSON = 64 << 20
ROWS_NOTE = ("row r = the suite's row r: the final norm's output at position r, predicting token r+1; L-1 rows a "
             "context (positions 0 .. L-2, all a scorer scores); no row predicts past the end")


def window_of(context: dict[str, Any], seq_id: str) -> str:
    """The window a context's shard belongs to: its ``source_cluster`` (the suite's contexts from one source, which its
    own intervals resample together; fideval's cluster bootstrap resamples windows), within its stratum; a context
    without one is its own window."""
    cluster = context.get("source_cluster")
    if cluster is None or str(cluster) == "":
        return seq_id
    return f"{context['stratum']}-cluster-{cluster}"


def _fail(what: str, hint: str) -> FidevalError:
    return FidevalError(what, hint=hint)


def _json(path: Path, what: str) -> Any:
    try:
        if path.stat().st_size > MAX_JSON:
            raise _fail(f"{path}: {what} is over {MAX_JSON >> 20} MiB", "this is not the suite's file")
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise _fail(f"{path}: {what} is missing", "pass the folder that holds it") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise _fail(f"{path}: {what} is not readable JSON ({str(e)[:80]})", "re-download it") from None


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _int(v: Any) -> bool:
    return type(v) is int


def read_suite(suite: Path) -> dict[str, Any]:
    """The suite manifest with every context's token ids, each checked against its ``token_sha256`` and the whole
    against ``suite_token_sha256`` as the tool derives it."""
    path = suite / "suite-manifest.json"
    man = _json(path, "suite manifest")
    hint = "re-download the suite folder (suite-manifest.json and tokens/)"
    index, length, digest = (man.get(k) if isinstance(man, dict) else None
                             for k in ("context_index", "context_length", "suite_token_sha256"))
    if not isinstance(index, list) or not index or not _int(length) or length < 2 or not isinstance(digest, str):
        raise _fail(f"{path}: lacks a context_index list, an integer context_length >= 2 or suite_token_sha256", hint)
    contexts: dict[int, dict[str, Any]] = {}
    for c in index:
        i = c.get("index") if isinstance(c, dict) else None
        if not _int(i) or i < 0 or i in contexts or not isinstance(c.get("file"), str) \
                or not isinstance(c.get("token_sha256"), str):
            raise _fail(f"{path}: context entry {str(c)[:80]} lacks a unique integer index, file or token_sha256", hint)
        rel = PurePosixPath(c["file"])
        if rel.is_absolute() or ".." in rel.parts:
            raise _fail(f"{path}: context {i} names token file {c['file']!r} outside the suite folder", hint)
        stratum = str(c.get("stratum") or "suite")
        if not ids.is_file_safe(stratum) or ids.CUT_SEP in stratum:
            raise _fail(f"{path}: context {i} has stratum {stratum!r}, which cannot name a fideval domain", hint)
        tok_path = suite / rel
        try:
            raw = tok_path.read_bytes()
        except OSError as e:
            raise _fail(f"{tok_path}: token file of context {i} cannot be read ({e.strerror})",
                        "re-download the suite's tokens/ (a shard view needs its tokens/ linked to the parent's)") from None
        try:
            tokens = json.loads(raw)
        except ValueError:
            tokens = None
        if not isinstance(tokens, list) or not all(_int(t) and t >= 0 for t in tokens):
            raise _fail(f"{tok_path}: token file of context {i} is not a JSON list of token ids", hint)
        if _sha(json.dumps(tokens).encode()) != c["token_sha256"]:
            raise _fail(f"{tok_path}: token ids of context {i} do not match its token_sha256 {c['token_sha256'][:12]}…", hint)
        if len(tokens) != length or c.get("tokens", length) != length:
            raise _fail(f"{tok_path}: context {i} has {len(tokens)} tokens, the suite's context_length is {length}", hint)
        contexts[i] = {**c, "stratum": stratum, "ids": tokens}
    got = _sha("".join(c["token_sha256"] for c in index).encode())
    if got != digest:
        raise _fail(f"{path}: the contexts' token digests give suite digest {got[:12]}…, the manifest says {digest[:12]}…", hint)
    return {"manifest": man, "length": length, "digest": digest, "contexts": contexts,
            "sha256": sha256_file(path)}


def read_capture_manifest(ref: Path, suite: dict[str, Any]) -> dict[str, Any]:
    """The capture manifest, complete and of this suite, with one record per captured context of the suite."""
    path = ref / "capture-manifest.json"
    man = _json(path, "capture manifest")
    hint = "re-download the reference folder, or finish the capture (tools/fidelity.py capture resumes)"
    if not isinstance(man, dict) or man.get("complete") is not True:
        raise _fail(f"{path}: the capture is not complete (complete is not true)", hint)
    if man.get("suite_token_sha256") != suite["digest"]:
        raise _fail(f"{path}: captured over suite {str(man.get('suite_token_sha256'))[:12]}…, the suite given is "
                    f"{suite['digest'][:12]}…", "pass the suite folder (or shard view) the reference was captured over")
    if man.get("context_length", suite["length"]) != suite["length"]:
        raise _fail(f"{path}: context_length {man.get('context_length')} differs from the suite's {suite['length']}", hint)
    records = man.get("captures")
    if not isinstance(records, list) or not records:
        raise _fail(f"{path}: no captures list", hint)
    by: dict[int, dict[str, Any]] = {}
    for r in records:
        i = r.get("index") if isinstance(r, dict) else None
        if not _int(i) or i in by or not isinstance(r.get("sha256"), str):
            raise _fail(f"{path}: capture record {str(r)[:80]} lacks a unique integer index or a sha256", hint)
        if i not in suite["contexts"]:
            raise _fail(f"{path}: captures context {i}, which the suite does not have", "pass the suite it was captured over")
        by[i] = r
    if man.get("contexts", len(by)) != len(by):
        raise _fail(f"{path}: says {man.get('contexts')} contexts but holds {len(by)} capture records", hint)
    expected = man.get("expected_indices")
    if expected is not None and (not isinstance(expected, list) or sorted(map(str, expected)) != sorted(map(str, by))):
        raise _fail(f"{path}: expected_indices and the capture records differ", hint)
    return {"manifest": man, "records": by, "sha256": sha256_file(path)}


def read_head(path: Path, want_sha256: str) -> tuple[torch.Tensor, str]:
    """The shared head ``[V, H]`` bfloat16 and its tensor name, from a file whose SHA-256 is ``want_sha256``."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    want = want_sha256.strip().lower()
    try:
        got = sha256_file(path)
    except OSError as e:
        raise _fail(f"{path}: the head file cannot be read ({e.strerror})", "pass the shared head's weight.safetensors") from None
    if got != want:
        raise _fail(f"{path}: head file sha256 {got[:16]}… is not the named {want[:16]}…",
                    "pass the head the suite names (lm-head/weight.safetensors) or the digest it publishes")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise _fail(f"{path}: not a readable safetensors head ({str(e)[:80]})", "re-download the head") from None
    key = "weight" if "weight" in tensors else next(iter(tensors), None) if len(tensors) == 1 else None
    if key is None:
        raise _fail(f"{path}: holds {sorted(tensors)[:4]}, not a 'weight' tensor or a single tensor", "pass the head file itself")
    w = tensors[key]
    if w.dtype != torch.bfloat16 or w.ndim != 2 or min(w.shape) < 1:
        raise _fail(f"{path}: head {key!r} is {str(w.dtype).removeprefix('torch.')} {list(w.shape)}, not bfloat16 [V, H]",
                    "pass the suite's shared BF16 head")
    return w.contiguous(), key


def read_capture(ref: Path, index: int, record: dict[str, Any], length: int) -> torch.Tensor:
    """One context's states ``[L-1, H]``, from bytes whose SHA-256 is the record's (read once: what is hashed is what
    is imported)."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    path = ref / f"hidden_{index:04d}.safetensors"
    hint = "re-download the reference folder"
    try:
        data = path.read_bytes()
    except OSError as e:
        raise _fail(f"{path}: capture of context {index} cannot be read ({e.strerror})", hint) from None
    if _sha(data) != record["sha256"]:
        raise _fail(f"{path}: sha256 {_sha(data)[:16]}… is not the capture manifest's {record['sha256'][:16]}…", hint)
    try:
        tensors = load(data)
    except (SafetensorError, ValueError) as e:
        raise _fail(f"{path}: not a readable safetensors file ({str(e)[:80]})", hint) from None
    if set(tensors) != {KEY}:
        raise _fail(f"{path}: holds {sorted(tensors)[:4]}, not exactly {KEY!r}", hint)
    h = tensors[KEY]
    if h.dtype != torch.bfloat16 or h.ndim != 2 or h.shape[0] != length - 1 or \
            ("shape" in record and record["shape"] != list(h.shape)):
        raise _fail(f"{path}: {KEY} is {str(h.dtype).removeprefix('torch.')} {list(h.shape)}, not bfloat16 "
                    f"[{length - 1}, H] (context_length - 1 rows) as the manifests say", hint)
    return h


def import_suite(suite_dir: str | Path, reference: str | Path, head: str | Path, head_sha256: str, out: str | Path, *,
                 model_id: str | None = None, model_revision: str | None = None) -> dict[str, Any]:
    """Check the suite, the capture and the head, and write the hidden store at ``out`` (a new folder)."""
    from fideval.store import card
    from fideval.store.writer import StoreWriter

    suite_dir, reference, head, out = Path(suite_dir), Path(reference), Path(head), Path(out)
    if out.exists():
        raise _fail(f"--out {out} already exists", "choose a new folder (the import writes a whole store or nothing)")
    suite = read_suite(suite_dir)
    cap = read_capture_manifest(reference, suite)
    weight, key = read_head(head, head_sha256)
    vocab, width = weight.shape
    sm = suite["manifest"]
    for k, v in (("vocab_size", vocab), ("hidden_size", width)):
        if k in sm and sm[k] != v:
            raise _fail(f"{suite_dir / 'suite-manifest.json'}: {k} {sm[k]} differs from the head's {v}",
                        "pass the head of the suite's model")
    for i in cap["records"]:
        top = max(suite["contexts"][i]["ids"])
        if top >= vocab:
            raise _fail(f"context {i} holds token id {top}, outside the head's vocabulary of {vocab}",
                        "pass the head of the suite's model")
    ident = cap["manifest"].get("candidate_identity") or {}
    meta = {"model_id": model_id or "unknown", "kind": "hidden", "vocab_size": vocab, "hidden_size": width,
            "model_revision": model_revision or ident.get("model_revision") or "unknown",
            "tokenizer_sha256": str(sm.get("tokenizer_sha256") or "unknown"),
            "source": SOURCE, "source_spec": SPEC, "source_rows": ROWS_NOTE,
            "source_capture_manifest_sha256": cap["sha256"], "source_capture_schema": str(cap["manifest"].get("schema", "")),
            "source_suite_manifest_sha256": suite["sha256"], "source_suite_token_sha256": suite["digest"],
            "source_suite_schema": str(sm.get("schema", "")), "source_head_sha256": head_sha256.strip().lower(),
            "source_head_tensor": key, "source_model": str(ident.get("model_path") or cap["manifest"].get("model") or ""),
            "source_tool": "tools/fidelity.py capture",
            "source_tool_commit": str(cap["manifest"].get("tool_commit") or "not recorded by the capture manifest")}
    tmp = out.parent / f".{out.name}.import-{os.getpid()}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    ok = False
    try:
        w = StoreWriter(tmp, meta)
        w.set_head(weight, {"lm_head": "float32", "finish": None, "source": f"{head.name}:{key}", "tied": None,
                            "hidden_dtype": "bfloat16", "hidden_size": width})
        with progress("import", total=len(cap["records"]), unit="contexts") as bar:  # 512 x 21 MB in the v5 suite
            for i in sorted(cap["records"]):
                c = suite["contexts"][i]
                h = read_capture(reference, i, cap["records"][i], suite["length"])
                if h.shape[1] != width:
                    raise _fail(f"{reference / f'hidden_{i:04d}.safetensors'}: hidden size {h.shape[1]} is not the head's "
                                f"{width}", "pass the head of the model the reference was captured from")
                sid = f"{c['stratum']}-{i:04d}"
                w.write(sid, h, torch.tensor(c["ids"], dtype=torch.int32), window_id=window_of(c, sid),
                        domain=c["stratum"], row_start=0,
                        extra_meta={"source_index": str(i), "source_cluster": str(c.get("source_cluster", "")),
                                    "source_token_sha256": c["token_sha256"],
                                    "source_capture_sha256": cap["records"][i]["sha256"]})
                bar.advance()
        manifest = w.finish()
        card.write(tmp)
        os.rename(tmp, out)
        ok = True
    finally:
        if not ok:
            with contextlib.suppress(OSError):
                shutil.rmtree(tmp)
    return {"contexts": len(manifest["shards"]), "length": suite["length"], "rows": suite["length"] - 1,
            "vocab": vocab, "hidden_size": width, "suite_token_sha256": suite["digest"]}
