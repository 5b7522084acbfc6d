"""The routes files (``fideval.routes`` v1, docs/formats-routes.md): per sequence, every MoE layer's routed expert ids
and weights per position, in ``routes/`` beside a teacher store or a candidate's records.

* ``routes/<seq_id>.safetensors``: ``ids`` int16 ``[n_layers, L, k]``, ``weights`` float16 ``[n_layers, L, k]``;
  header metadata ``format``, ``version``, ``seq_id``, ``layers`` (JSON list of the MoE layers' indices), ``n_experts``.
* ``routes/routes.json``: the index, written when the run ends: ``of`` (``teacher`` | ``candidate``), ``layers``,
  ``top_k``, ``n_experts``, per sequence the routes file's SHA-256 and positions, and what the routes belong to:
  a teacher's ``shards`` (each shard's SHA-256 from the store's manifest) or a candidate's ``records_sha256``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from fideval.errors import FidevalError
from fideval.formats.ids import is_file_safe
from fideval.fsio import sha256_file, write_bytes, write_json

FORMAT, VERSION = "fideval.routes", 1
FOLDER, INDEX = "routes", "routes.json"
HINT = "record the routes again (fideval teacher / score with --routes)"


def folder(root: str | Path) -> Path:
    """The routes folder beside a teacher store or a records folder ``root`` (or ``root`` itself when it is one)."""
    root = Path(root)
    return root if (root / INDEX).is_file() or root.name == FOLDER and not (root / FOLDER).is_dir() else root / FOLDER


def write_sequence(root: str | Path, seq_id: str, routes: Any) -> Path:
    """``routes`` (fideval.model.routes.Routes) of ``seq_id`` written atomically into ``root``'s routes folder."""
    from safetensors.numpy import save

    if not is_file_safe(seq_id):
        raise FidevalError(f"sequence id {seq_id!r} cannot name a routes file", hint="sequence ids come from fideval windows")
    meta = {"format": FORMAT, "version": str(VERSION), "seq_id": seq_id, "layers": json.dumps(list(routes.layers)),
            "n_experts": str(int(routes.n_experts))}
    data = save({"ids": np.ascontiguousarray(routes.ids, dtype=np.int16),
                 "weights": np.ascontiguousarray(routes.weights, dtype=np.float16)}, metadata=meta)
    path = Path(root) / FOLDER / f"{seq_id}.safetensors"
    write_bytes(path, data)
    return path


def write_index(root: str | Path, of: str, belongs: dict[str, Any]) -> dict[str, Any]:
    """routes.json over every routes file in ``root``'s routes folder; ``belongs``: ``{"shards": {seq: sha256}}`` (a
    teacher's) or ``{"records_sha256": sha}`` (a candidate's)."""
    d = Path(root) / FOLDER
    seqs: dict[str, Any] = {}
    layers = top_k = n_experts = None
    for p in sorted(d.glob("*.safetensors")):
        r = read_sequence(p)
        layers, top_k, n_experts = list(r["layers"]), int(r["ids"].shape[2]), r["n_experts"]
        seqs[r["seq_id"]] = {"sha256": sha256_file(p), "positions": int(r["ids"].shape[1])}
    if of == "teacher":
        belongs = {"shards": {s: belongs.get("shards", {}).get(s) for s in seqs}}
    index = {"format": FORMAT, "version": VERSION, "of": of, "layers": layers, "top_k": top_k, "n_experts": n_experts,
             "weights_dtype": "float16", "ids_dtype": "int16", "sequences": seqs, **belongs}
    write_json(d / INDEX, index)
    return index


def read_sequence(path: str | Path) -> dict[str, Any]:
    """One routes file: ``{seq_id, layers, ids, weights}``; anything else is one line."""
    from safetensors import safe_open

    path = Path(path)
    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
            ids, w = f.get_tensor("ids"), f.get_tensor("weights")
    except FidevalError:
        raise
    except Exception as e:  # noqa: BLE001 - a damaged file is one line
        raise FidevalError(f"{path}: not a routes file ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})",
                           hint=HINT) from None
    if meta.get("format") != FORMAT or meta.get("version") != str(VERSION):
        raise FidevalError(f"{path}: format {meta.get('format')!r} version {meta.get('version')!r}, expected {FORMAT} v{VERSION}",
                           hint=HINT)
    layers = json.loads(meta.get("layers", "[]"))
    if ids.dtype != np.int16 or w.dtype != np.float16 or ids.shape != w.shape or ids.ndim != 3 or ids.shape[0] != len(layers):
        raise FidevalError(f"{path}: ids {ids.dtype} {list(ids.shape)} and weights {w.dtype} {list(w.shape)} do not match "
                           f"{len(layers)} layers", hint=HINT)
    return {"seq_id": meta.get("seq_id"), "layers": tuple(layers), "ids": ids, "weights": w,
            "n_experts": int(meta.get("n_experts", "0"))}


def read_index(root: str | Path) -> tuple[Path, dict[str, Any]]:
    """``(routes folder, routes.json)`` of a teacher store or records folder ``root``."""
    d = folder(root)
    p = d / INDEX
    if not p.is_file():
        raise FidevalError(f"{root}: no routes ({p} does not exist)", hint=HINT)
    try:
        index = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise FidevalError(f"{p}: not readable JSON ({e})", hint=HINT) from None
    if not isinstance(index, dict) or index.get("format") != FORMAT or index.get("version") != VERSION:
        raise FidevalError(f"{p}: not a {FORMAT} v{VERSION} index", hint=HINT)
    return d, index



def seal_candidate(records_dir: str | Path) -> dict[str, Any]:
    """A candidate's routes index, naming the SHA-256 of the records.parquet they belong to."""
    return write_index(records_dir, "candidate", {"records_sha256": sha256_file(Path(records_dir) / "records.parquet")})
