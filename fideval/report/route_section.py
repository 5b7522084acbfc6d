"""report.json ``routing`` (``fideval.report-routing`` v1, issue 42): how a mixture-of-experts build's routing
follows the teacher's, and how much of its KLD routing accounts for.

* ``sets``: per (candidate, path, length) whose records folders have routes beside them (``<records>/routes/``,
  ``fideval score --routes``), the figures of ``fideval.report.routing`` against the teacher's routes beside the
  store each folder was scored against (``<store>/routes/``, ``fideval teacher --routes``), pooled over the folders
  (the workflow scores each domain into its own): every sequence once, the report's windows as clusters, domains as
  strata, the report's one resample matrix, seed and confidence. Overall and per MoE layer.
* ``decomposition``: per (candidate, path, length) with records of both path P and P+teacher-routes (the
  route-controlled run: the teacher's routes forced into the candidate's MoE layers): the free run's mean KLD, the
  forced run's (the expert arithmetic's share), routing's share = free - forced (the report's paired difference of
  two means on windows shared by id, as ``comparisons``'), the arithmetic's fraction forced / free (paired ratio)
  and routing's fraction 1 - forced / free.

Route-controlled records are diagnostics, not builds: they are read and checked as any records (checks, coverage,
provenance) but have no ``results`` entry, so no headline, gate or comparison counts them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fideval.errors import FidevalError
from fideval.formats import routes as rf
from fideval.report.figures import SetFigures
from fideval.report.inputs import Part, RecordSet
from fideval.score.route_control import SUFFIX
from fideval.stats.intervals import VARIANT
from fideval.stats.paired import paired_interval

FORMAT, VERSION = "fideval.report-routing", 1
PLOT_KIND = "routing"


def is_forced(path: str) -> bool:
    return path.endswith(SUFFIX)


def split(sets: list[RecordSet]) -> tuple[list[RecordSet], list[RecordSet]]:
    """(the builds' records sets, the route-controlled ones)."""
    return [rs for rs in sets if not is_forced(rs.path)], [rs for rs in sets if is_forced(rs.path)]


def build_info(info: dict[str, Any] | None) -> dict[str, Any] | None:
    """A folder's candidate_info as the build's identity (fideval.report.identity): a route-controlled run's
    ``routes_forced`` (which teacher routes it took) is the run's, not the build's."""
    return {k: v for k, v in info.items() if k != "routes_forced"} if isinstance(info, dict) else info


def _has_routes(folder: str | Path) -> bool:
    return (Path(folder) / rf.FOLDER / rf.INDEX).is_file()


def _teacher_store(part: Part, manifests: list[dict[str, Any]]) -> Path:
    """The teacher store ``part`` was scored against: a ``--teacher-manifest`` of the manifest SHA-256 its
    score.json names (one with routes first), else the store as score.json names it, where it is a folder here."""
    t = part.score.get("teacher") or {}
    want, spec = t.get("manifest_sha256"), t.get("store")
    stores = [Path(m["file"]).parent for m in manifests if want is not None and m.get("sha256") == want]
    if stores:
        return next((s for s in stores if _has_routes(s)), stores[0])
    if isinstance(spec, str) and "://" not in spec and Path(spec).is_dir():
        return Path(spec)
    raise FidevalError(f"{part.folder} has routes, and the teacher store it was scored against ({spec}) is not here "
                       "to hold the teacher's", hint=f"pass --teacher-manifest {spec}/manifest.json (the store's, "
                       "recorded with fideval teacher --routes)")


def pairs_of(rs: RecordSet, manifests: list[dict[str, Any]]) -> list[tuple[Path, Path, dict[str, Any]]] | None:
    """Per records folder of ``rs``: (teacher routes, candidate routes, the input's entry), each checked to belong to
    the records and to the shards they were scored against; None when no folder has routes."""
    with_routes = [p for p in rs.parts if _has_routes(p.folder)]
    if not with_routes:
        return None
    if len(with_routes) < len(rs.parts):
        bare = next(p.folder for p in rs.parts if p not in with_routes)
        raise FidevalError(f"{rs.candidate}/{rs.path}/{rs.length}: {with_routes[0].folder} has routes and {bare} has none, "
                           "so routing figures would leave out its sequences",
                           hint="score every folder of the set with --routes, or remove their routes/ folders")
    out = []
    for p in with_routes:
        cd, ci = rf.read_index(p.folder)
        if ci.get("of") != "candidate" or ci.get("records_sha256") != p.records_sha256:
            raise FidevalError(f"{cd}: these routes are not the ones of the records beside them ({ci.get('of')}'s, "
                               f"records SHA-256 {str(ci.get('records_sha256'))[:12]}...)",
                               hint="score the folder again with --routes; routes and records come from one run")
        store = _teacher_store(p, manifests)
        if not _has_routes(store):
            raise FidevalError(f"{p.folder} has routes, and the teacher store it was scored against ({store}) has none "
                               "beside it", hint=f"record them: fideval teacher --routes --out {store} (the same "
                               "config and windows), then score again; or remove routes/ from the records folder")
        td, ti = rf.read_index(store)
        shards = (p.score.get("teacher") or {}).get("shards") or {}
        if ti.get("of") != "teacher":
            raise FidevalError(f"{td}: these routes are a {ti.get('of')}'s, not a teacher's", hint=rf.HINT)
        for s in sorted(ci.get("sequences") or {}):
            have = (ti.get("shards") or {}).get(s)
            if s in shards and have is not None and have != shards[s]:
                raise FidevalError(f"{td}: the routes of {s} were recorded with teacher shard {have[:12]}..., "
                                   f"{p.folder} was scored against {str(shards[s])[:12]}...",
                                   hint="record the teacher's routes with the store the records were scored against")
        out.append((td, cd, {"records": p.folder, "routes": str(cd), "teacher_store": str(store),
                             "teacher_routes": str(td), "index_sha256": _sha(cd / rf.INDEX),
                             "teacher_index_sha256": _sha(td / rf.INDEX)}))
    return out


def _sha(path: Path) -> str:
    from fideval.fsio import sha256_file

    return sha256_file(path)


def _fraction(ratio: dict[str, Any]) -> dict[str, Any]:
    """1 - a ratio block: routing's fraction of the free KLD from the arithmetic's (forced / free)."""
    est, ci = ratio.get("estimate"), ratio.get("ci")
    keep = {k: ratio.get(k) for k in ("unit", "confidence", "resamples", "seed", "strata", "clusters", "flags")}
    out = {"estimate": None if est is None else 1.0 - est, "method": f"1 - ({ratio.get('method')})",
           "ci": None if ci is None else [None if ci[1] is None else 1.0 - ci[1], None if ci[0] is None else 1.0 - ci[0]],
           **keep}
    return out


def decomposition(figs: dict[tuple[str, str, int], SetFigures], forced: dict[tuple[str, str, int], SetFigures],
                  counts: np.ndarray, confidence: float, seed: int, strata: np.ndarray | None) -> list[dict[str, Any]]:
    out = []
    for key in sorted(forced):
        cand, path, length = key
        free_key = (cand, path[: -len(SUFFIX)], length)
        if free_key not in figs:
            continue
        fa, fb = figs[free_key], forced[key]

        def pair(kind: str, a: SetFigures, b: SetFigures) -> dict[str, Any]:
            return paired_interval(kind, a.s_kld, a.n_all, b.s_kld, b.n_all, counts, strata, confidence=confidence,
                                   seed=seed, mover=kind == "difference", **VARIANT)

        ratio = pair("ratio", fb, fa)
        out.append({"candidate": cand, "path": free_key[1], "forced_path": path, "length": length,
                    "free_kld": fa.result["overall"]["mean_kld"], "forced_kld": fb.result["overall"]["mean_kld"],
                    "routing_share": {"figure": "mean_kld_difference", "minuend": free_key[1], "subtrahend": path,
                                      **pair("difference", fa, fb)},
                    "arithmetic_fraction": {"figure": "mean_kld_ratio", "numerator": path, "denominator": free_key[1],
                                            **ratio},
                    "routing_fraction": _fraction(ratio),
                    "routes_forced": [(p.score.get("candidate_info") or {}).get("routes_forced") for p in fb.rs.parts],
                    "inputs": [p.folder for p in fb.rs.parts]})
    return out


def routing_block(sets: list[RecordSet], figs: dict[tuple[str, str, int], SetFigures],
                  forced: dict[tuple[str, str, int], SetFigures], *, clusters: Any, counts: np.ndarray,
                  strata: np.ndarray, confidence: float, seed: int,
                  manifests: list[dict[str, Any]]) -> dict[str, Any] | None:
    """report.json's ``routing`` block, or None when no records have routes and none are route-controlled.
    ``sets``: every records set (builds and route-controlled); ``figs``/``forced``: their figures."""
    from fideval.report.routing import figures

    entries = []
    for rs in sorted(sets, key=lambda r: r.key):
        pairs = pairs_of(rs, manifests)
        if pairs is None:
            continue
        fig = figures([(t, c) for t, c, _ in pairs], confidence=confidence, seed=seed, clusters=clusters,
                      counts=counts, strata=strata)
        entries.append({"candidate": rs.candidate, "path": rs.path, "length": rs.length,
                        "routes_forced": is_forced(rs.path), "inputs": [x for _, _, x in pairs],
                        **{k: v for k, v in fig.items() if k not in ("confidence", "resamples", "seed")}})
    dec = decomposition(figs, forced, counts, confidence, seed, strata)
    if not entries and not dec:
        return None
    return {"format": FORMAT, "version": VERSION, "confidence": confidence, "resamples": int(counts.shape[0]),
            "seed": seed, "sets": entries, "decomposition": dec}


def plot_name(e: dict[str, Any]) -> str:
    from fideval.report.plots import PLOTS_DIR

    return f"{PLOTS_DIR}/{PLOT_KIND}-{e['candidate']}-{e['path']}-{e['length']}.png"


def write_routing_plots(report: dict[str, Any], out_dir: str | Path) -> list[dict[str, Any]]:
    """The per-layer routing plot of each build's routing figures (not of a route-controlled run's, which takes the
    teacher's routes); report.json ``plots`` entries of kind ``routing``."""
    from fideval.report.routing import plot

    block = report.get("routing") or {}
    listed = []
    for e in block.get("sets") or []:
        if e["routes_forced"]:
            continue
        name = plot_name(e)
        (Path(out_dir) / name).parent.mkdir(parents=True, exist_ok=True)
        plot({**e, "confidence": block["confidence"]}, Path(out_dir) / name)
        listed.append({"file": name, "kind": PLOT_KIND, "candidate": e["candidate"], "path": e["path"],
                       "length": e["length"]})
    return listed
