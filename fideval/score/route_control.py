"""The route-controlled run (issue 42, docs/formats-routes.md): a candidate run with the teacher's routes forced
into its MoE layers -- its own expert arithmetic, the teacher's choice of experts and their weights -- whose KLD is
the arithmetic's share of the free run's, the rest being routing's share.

:func:`teacher_routes` opens the routes recorded beside a teacher store (``fideval teacher --routes``) as the
runner's route source (fideval.model.routes.FileRoutes) after checking, each in one line, that they are the
teacher's (``of``), that they cover every scored sequence, and that each was recorded with the very shard the
candidate is scored against (the index's ``shards`` against the store's manifest): routes of another run of the
teacher (other weights, tokens or dtype) are refused, not forced.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fideval.errors import FidevalError

SUFFIX = "+teacher-routes"  # the records' path of a route-controlled run: e.g. weights-only+teacher-routes
HINT = "record the routes with the teacher store the candidate is scored against (fideval teacher --routes)"


def teacher_routes(store_root: str | Path, teacher: Any, seq_ids: list[str]) -> tuple[Any, dict[str, Any]]:
    """``(route source, score.json's routes_forced block)`` for the routes beside ``store_root``."""
    from fideval.formats import routes as rf
    from fideval.fsio import sha256_file
    from fideval.model.routes import FileRoutes

    d, index = rf.read_index(store_root)
    if index.get("of") != "teacher":
        raise FidevalError(f"{d}: these routes are a {index.get('of')}'s, not a teacher's", hint=HINT)
    seqs = index.get("sequences") or {}
    missing = [s for s in seq_ids if s not in seqs]
    if missing:
        raise FidevalError(f"{d}: the teacher's routes lack {len(missing)} of the {len(seq_ids)} scored sequences "
                           f"(first: {missing[0]})", hint=HINT)
    shards = index.get("shards") or {}
    for s in seq_ids:
        want = teacher.entry(s).get("sha256")
        if shards.get(s) != want:
            raise FidevalError(f"{d}: the routes of {s} were recorded with teacher shard {str(shards.get(s))[:12]}..., "
                               f"the store scored against holds {str(want)[:12]}...", hint=HINT)
    for s in seq_ids:  # before the run: a damaged file is refused before anything is computed
        if not (d / f"{s}.safetensors").is_file() or sha256_file(d / f"{s}.safetensors") != seqs[s].get("sha256"):
            raise FidevalError(f"{d / (s + '.safetensors')}: missing, or its SHA-256 is not the one routes.json names",
                               hint="the routes were altered after they were recorded: record the teacher's routes again")
    if index.get("version", 1) < 2:
        raise FidevalError(f"{d}: routes v1 keep their weights rounded to float16, which cannot be forced exactly",
                           hint="record the teacher's routes again with this fideval (routes v2)")
    source = FileRoutes(d, seq_ids, index["layers"], index["n_experts"], index["top_k"])
    info = {"of": "teacher", "routes": str(d), "index_sha256": sha256_file(d / rf.INDEX),
            "weights_dtype": index.get("weights_dtype"), "layers": len(index["layers"]), "top_k": index["top_k"]}
    return source, info
