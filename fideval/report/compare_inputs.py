"""Loading for ``fideval compare``: the reports' builds at one path and length, checked to share windows and teacher.

Each build's per-window rows are read back from the records folders its report names (``provenance.inputs``), their
SHA-256 checked against the report's, so the figures are the report's own. Refused in one line: reports on other
windows or teachers, one build only, a build without a size, a build in two reports. Sizes: see
``fideval.report.compare``'s docstring.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fideval.errors import FidevalError
from fideval.fsio import sha256_file
from fideval.report.inputs import RecordSet, load_records, merge
from fideval.report.schema import load_report


@dataclass
class BuildData:
    """One build's per-window sums on the comparison's windows, and its size."""

    name: str
    report: str
    size: float
    size_unit: str
    size_source: str
    sets: list[RecordSet] = field(repr=False)


def _locate(folder: str, report: Path) -> Path:
    """A records folder as a report names it: as given (relative to the working directory), else relative to the
    report's folder or one of its parents (a report moved together with its results)."""
    p = Path(folder)
    if p.is_dir() or p.is_absolute():
        return p
    for base in [report.parent, *report.parent.parents]:
        if (base / p).is_dir():
            return base / p
    return p


def _windows(rep: dict[str, Any]) -> dict[str, tuple[str, str | None]]:
    return {w["id"]: (w["domain"], w.get("token_sha256")) for w in rep["provenance"]["dataset"]["windows"]}


def _teacher(rep: dict[str, Any], length: int) -> set[tuple[Any, ...]]:
    return {(t.get("model_id"), t.get("model_revision"), t.get("manifest_sha256"))
            for t in rep["provenance"].get("teacher_stores") or [] if t.get("length") == length}


def _size(name: str, info: dict[str, Any] | None) -> tuple[float | None, str | None, int | None]:
    """(bits per weight, or bytes of a real file; its source; the reference's parameter count where known)."""
    info = info or {}
    total = ((info.get("bits_per_weight") or {}).get("total") or {})
    if isinstance(total.get("bpw"), (int, float)):
        return float(total["bpw"]), "quant spec", total.get("params")
    ck = info.get("checkpoint") or {}
    if isinstance(ck.get("bytes"), int):
        return float(ck["bytes"]), "file bytes", None
    return None, None, None


def read_reports(reports: list[Path]) -> list[tuple[Path, dict[str, Any]]]:
    """Each report.json (a folder: its report.json), loaded by its model."""
    if not reports:
        raise FidevalError("no reports given", hint="pass report.json files (or their folders), or --records folders")
    return [(p, load_report(p)) for p in (r / "report.json" if r.is_dir() else r for r in reports)]


def choose(loaded: list[tuple[Path, dict[str, Any]]], path: str | None, length: int | None) -> tuple[str, int]:
    """The one (path, length) the reports' results hold after ``--path`` / ``--length``; one line otherwise."""
    combos = sorted({(x["path"], x["length"]) for _, rep in loaded for x in rep["results"]
                     if (path is None or x["path"] == path) and (length is None or x["length"] == length)})
    if not combos:
        raise FidevalError(f"no result at path {path or 'any'} and length {length or 'any'} in the reports",
                           hint="choose a path and length the reports hold (see their results)")
    if len(combos) > 1:
        raise FidevalError(f"the reports hold several paths and lengths ({', '.join(f'{a}/{b}' for a, b in combos)})",
                           hint="choose one with --path and --length")
    return combos[0]


def records_of(p: Path, rep: dict[str, Any], cand: str, path: str, length: int) -> list[RecordSet]:
    """The records sets of one build as report ``p`` names them (provenance.inputs), their SHA-256 checked."""
    parts = [i for i in rep["provenance"].get("inputs") or []
             if (i["candidate"], i["path"], i["length"]) == (cand, path, length)]
    if not parts:
        raise FidevalError(f"{p}: no records folder of {cand}/{path}/{length} in provenance.inputs",
                           hint="regenerate the report with this fideval")
    sets = []
    for part in parts:
        folder = _locate(part["records"], p)
        rec = folder / "records.parquet"
        if not rec.exists():
            raise FidevalError(f"{p}: records folder {part['records']} of {cand} not found",
                               hint="run where the report's records are (the folder it was made in)")
        if sha256_file(rec) != part["records_sha256"]:
            raise FidevalError(f"{rec}: its SHA-256 differs from the one {p} recorded (records changed since "
                               "the report)", hint="re-run 'fideval report' on these records")
        sets += [rs for rs in load_records(folder) if rs.length == length]
    return merge(sets)


def load(
    reports: list[Path],
    *,
    path: str | None = None,
    length: int | None = None,
    sizes: dict[str, float] | None = None,
    loaded: list[tuple[Path, dict[str, Any]]] | None = None,
) -> tuple[list[BuildData], dict[str, Any]]:
    """The builds of ``reports`` (or of reports already ``loaded``: (label, report)) at one path and length, checked
    to share windows and teacher; and the facts comparison.json records (``reports``, ``teacher``,
    ``windows_verified``, the first report's settings)."""
    sizes = dict(sizes or {})
    loaded = loaded if loaded is not None else read_reports(reports)
    path, length = choose(loaded, path, length)
    first_p, first = loaded[0]
    win0, teach0 = _windows(first), _teacher(first, length)
    verified = all(sha is not None for _, sha in win0.values())
    for p, rep in loaded[1:]:
        win = _windows(rep)
        for wid in sorted(set(win0) | set(win)):
            a, b = win0.get(wid), win.get(wid)
            if a is None or b is None or a[0] != b[0] or (a[1] is not None and b[1] is not None and a[1] != b[1]):
                why = (f"only in {first_p if b is None else p}" if a is None or b is None else
                       f"domain {b[0]} against {a[0]}" if a[0] != b[0] else "other tokens")
                raise FidevalError(f"{p} and {first_p} were scored on different windows (window {wid}: {why})",
                                   hint="compare only builds scored on the same eval-windows.json")
            verified = verified and b[1] is not None
        if _teacher(rep, length) != teach0:
            raise FidevalError(f"{p} and {first_p} were scored against different teachers at length {length} "
                               f"({sorted(map(str, _teacher(rep, length)))[:1]} against {sorted(map(str, teach0))[:1]})",
                               hint="compare only builds scored against the same teacher store")
    names = sorted({x["candidate"] for _, rep in loaded for x in rep["results"] if (x["path"], x["length"]) == (path, length)})
    if len(names) < 2:
        raise FidevalError(f"one build only ({names[0]} at {path}/{length}): nothing to compare",
                           hint="give reports with two or more candidates at this path and length")
    builds: list[BuildData] = []
    seen: dict[str, Path] = {}
    params = None
    for p, rep in loaded:
        for cand in sorted({x["candidate"] for x in rep["results"] if (x["path"], x["length"]) == (path, length)}):
            if cand in seen:
                raise FidevalError(f"build {cand!r} is in both {seen[cand]} and {p}",
                                   hint="give each build its own candidate name")
            seen[cand] = p
            sets = records_of(p, rep, cand, path, length)
            info = ((rep["provenance"].get("candidates") or {}).get(cand) or {}).get("info")
            size, source, n_params = _size(cand, info)
            params = params or n_params
            builds.append(BuildData(cand, str(p), size if size is not None else float("nan"),
                                    "bits_per_weight" if source == "quant spec" else "bytes", source or "", sets))
    teachers = {b.name: sorted({json.dumps([(part.score.get("teacher") or {}).get(k) for k in
                                            ("model_id", "model_revision", "manifest_sha256")])
                                for rs in b.sets for part in rs.parts}) for b in builds}
    for b in builds[1:]:
        if teachers[b.name] != teachers[builds[0].name]:
            raise FidevalError(f"builds {builds[0].name} and {b.name} were scored against different teacher stores at "
                               f"length {length} (their score.json teacher blocks differ)",
                               hint="compare only builds scored against the same teacher store")
    unknown = sorted(set(sizes) - {b.name for b in builds})
    if unknown:
        raise FidevalError(f"--size names {unknown[0]}, which is not a build here",
                           hint=f"builds: {', '.join(b.name for b in builds)}")
    for b in builds:
        if b.name in sizes:
            b.size, b.size_unit, b.size_source = float(sizes[b.name]), "bits_per_weight", "--size"
        elif b.size_source == "file bytes" and params:
            b.size, b.size_unit = 8.0 * b.size / params, "bits_per_weight"
    for b in builds:
        if not np.isfinite(b.size) or b.size <= 0:
            raise FidevalError(f"build {b.name} has no size (no bits per weight in its score.json, no file bytes)",
                               hint=f"give it with --size {b.name}=BITS_PER_WEIGHT")
    units = {b.size_unit for b in builds}
    if len(units) > 1:
        odd = next(b for b in builds if b.size_unit == "bytes")
        raise FidevalError(f"build {odd.name} is sized in bytes and the others in bits per weight (no parameter count "
                           "to convert with)", hint=f"give it with --size {odd.name}=BITS_PER_WEIGHT")
    facts = {"reports": [{"file": str(p), "sha256": sha256_file(p)} for p, _ in loaded if p.is_file()],
             "teacher": [t for t in first["provenance"].get("teacher_stores") or [] if t.get("length") == length],
             "windows_verified": verified, "settings": first["settings"], "path": path, "length": length}
    return builds, facts
