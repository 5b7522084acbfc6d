"""The routes files (``fideval.routes`` v2, docs/formats-routes.md): per sequence, every MoE layer's routed expert ids
and weights per position, in ``routes/`` beside a teacher store or a candidate's records.

* ``routes/<seq_id>.safetensors``: ``ids`` int16 ``[n_layers, L, k]``, ``weights`` ``[n_layers, L, k]`` in the dtype
  the experts were called with (float32, bfloat16 or float16: exact, so that they can be forced back into a run;
  v1 files rounded them to float16 and are still read); header metadata ``format``, ``version``, ``seq_id``,
  ``layers`` (JSON list of the MoE layers' indices), ``n_experts``.
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

FORMAT, VERSION = "fideval.routes", 2
READ_VERSIONS = (1, 2)
WEIGHT_DTYPES = {"float32", "bfloat16", "float16"}
FOLDER, INDEX = "routes", "routes.json"
HINT = "record the routes again (fideval teacher / score with --routes)"


def folder(root: str | Path) -> Path:
    """The routes folder beside a teacher store or a records folder ``root`` (or ``root`` itself when it is one)."""
    root = Path(root)
    return root if (root / INDEX).is_file() or root.name == FOLDER and not (root / FOLDER).is_dir() else root / FOLDER


def write_sequence(root: str | Path, seq_id: str, routes: Any) -> Path:
    """``routes`` (fideval.model.routes.Routes) of ``seq_id`` written atomically into ``root``'s routes folder."""
    import torch

    from fideval.formats.safetensors import encode

    if not is_file_safe(seq_id):
        raise FidevalError(f"sequence id {seq_id!r} cannot name a routes file", hint="sequence ids come from fideval windows")
    meta = {"format": FORMAT, "version": str(VERSION), "seq_id": seq_id, "layers": json.dumps(list(routes.layers)),
            "n_experts": str(int(routes.n_experts))}
    w = torch.as_tensor(routes.weights)
    if str(w.dtype).removeprefix("torch.") not in WEIGHT_DTYPES:
        raise FidevalError(f"sequence {seq_id}: route weights of dtype {w.dtype} cannot be kept",
                           hint=f"routes keep weights as {', '.join(sorted(WEIGHT_DTYPES))}")
    data = encode({"ids": torch.as_tensor(np.ascontiguousarray(routes.ids, dtype=np.int16)), "weights": w}, meta)
    path = Path(root) / FOLDER / f"{seq_id}.safetensors"
    write_bytes(path, data)
    return path


def write_index(root: str | Path, of: str, belongs: dict[str, Any]) -> dict[str, Any]:
    """routes.json over every routes file in ``root``'s routes folder; ``belongs``: ``{"shards": {seq: sha256}}`` (a
    teacher's) or ``{"records_sha256": sha}`` (a candidate's)."""
    d = Path(root) / FOLDER
    seqs: dict[str, Any] = {}
    layers = top_k = n_experts = None
    dtypes = set()
    for p in sorted(d.glob("*.safetensors")):
        r = read_sequence(p)
        layers, top_k, n_experts = list(r["layers"]), int(r["ids"].shape[2]), r["n_experts"]
        dtypes.add(r["weights_dtype"])
        seqs[r["seq_id"]] = {"sha256": sha256_file(p), "positions": int(r["ids"].shape[1])}
    if of == "teacher":
        belongs = {"shards": {s: belongs.get("shards", {}).get(s) for s in seqs}}
    index = {"format": FORMAT, "version": VERSION, "of": of, "layers": layers, "top_k": top_k, "n_experts": n_experts,
             "weights_dtype": ",".join(sorted(dtypes)) or None, "ids_dtype": "int16", "sequences": seqs, **belongs}
    write_json(d / INDEX, index)
    return index


def read_sequence(path: str | Path) -> dict[str, Any]:
    """One routes file: ``{seq_id, layers, ids, weights, weights_dtype, n_experts}`` (``weights`` widened to float32
    numpy, exactly: narrowing them back to ``weights_dtype`` gives the recorded bits); anything else is one line."""
    from safetensors import safe_open

    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            ids_t, w_t = f.get_tensor("ids"), f.get_tensor("weights")
        ids, wdt = ids_t.numpy(), str(w_t.dtype).removeprefix("torch.")
        w = w_t.float().numpy()
    except FidevalError:
        raise
    except Exception as e:  # noqa: BLE001 - a damaged file is one line
        raise FidevalError(f"{path}: not a routes file ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})",
                           hint=HINT) from None
    if meta.get("format") != FORMAT or meta.get("version") not in {str(v) for v in READ_VERSIONS}:
        raise FidevalError(f"{path}: format {meta.get('format')!r} version {meta.get('version')!r}, expected {FORMAT} "
                           f"v{VERSION} (or v1)", hint=HINT)
    layers = json.loads(meta.get("layers", "[]"))
    ok_w = wdt == "float16" if meta.get("version") == "1" else wdt in WEIGHT_DTYPES
    if ids.dtype != np.int16 or not ok_w or ids.shape != w.shape or ids.ndim != 3 or ids.shape[0] != len(layers):
        raise FidevalError(f"{path}: ids {ids.dtype} {list(ids.shape)} and weights {wdt} {list(w.shape)} do not match "
                           f"{len(layers)} layers", hint=HINT)
    return {"seq_id": meta.get("seq_id"), "layers": tuple(layers), "ids": ids, "weights": w, "weights_dtype": wdt,
            "version": int(meta["version"]), "n_experts": int(meta.get("n_experts", "0"))}


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
    if not isinstance(index, dict) or index.get("format") != FORMAT or index.get("version") not in READ_VERSIONS:
        raise FidevalError(f"{p}: not a {FORMAT} v{VERSION} (or v1) index", hint=HINT)
    return d, index



def seal_candidate(records_dir: str | Path) -> dict[str, Any]:
    """A candidate's routes index, naming the SHA-256 of the records.parquet they belong to."""
    return write_index(records_dir, "candidate", {"records_sha256": sha256_file(Path(records_dir) / "records.parquet")})
