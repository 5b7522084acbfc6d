"""Reading and checking the report's inputs: records folders, eval-windows.json, the teacher manifest.

Every problem is one :class:`FidevalError` line naming the file and the column or key. Non-finite values
in a float column are an error (the scorer's contract is ``nonfinite_rows: 0``; a NaN would silently
poison every mean and interval), as are nulls and records that disagree with their score.json.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fideval.errors import FidevalError
from fideval.formats import nesting
from fideval.formats import records as rec_format
from fideval.formats.model import parse
from fideval.formats.score import FILE as SCORE_FILE
from fideval.formats.score import ScoreSummary
from fideval.formats.windows import FILE as WINDOWS_FILE
from fideval.formats.windows import listing
from fideval.fsio import sha256_file

FLOAT_COLUMNS = rec_format.of_kind("float64")
BOOL_COLUMNS = rec_format.of_kind("bool")
COLUMNS = rec_format.NAMES


@dataclass(frozen=True)
class Part:
    """One records folder: where it is, its score.json and both files' SHA-256."""

    folder: str
    score: dict[str, Any]
    records_sha256: str
    score_sha256: str

    def record(self) -> dict[str, str]:
        return {
            "records": self.folder,
            "records_sha256": self.records_sha256,
            "score_sha256": self.score_sha256,
        }


@dataclass
class RecordSet:
    """A (candidate, path, length) scored on the windows, as numpy columns, from one or more folders
    (the workflow scores each domain into its own folder; :func:`merge` joins them)."""

    candidate: str
    path: str
    length: int
    parts: list[Part]
    cols: dict[str, np.ndarray] = field(repr=False)

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.candidate, self.path, self.length)

    @property
    def rows(self) -> int:
        return int(self.cols["kld"].size)

    @property
    def where(self) -> str:
        return self.parts[0].folder + (
            f" (and {len(self.parts) - 1} more folders)" if len(self.parts) > 1 else ""
        )


def merge(sets: list[RecordSet]) -> list[RecordSet]:
    """Join the records sets of one (candidate, path, length), sorted by key; a sequence in two folders is an error."""
    groups: dict[tuple[str, str, int], list[RecordSet]] = {}
    for rs in sets:
        groups.setdefault(rs.key, []).append(rs)
    out = []
    for key in sorted(groups):
        grp = sorted(groups[key], key=lambda r: r.parts[0].folder)
        if len(grp) == 1:
            out.append(grp[0])
            continue
        seen: dict[str, str] = {}
        for rs in grp:
            for sid in np.unique(rs.cols["seq_id"].astype(str)):
                if sid in seen:
                    raise FidevalError(
                        f"sequence {sid} of {'/'.join(map(str, key))} is in both {seen[sid]} and "
                        f"{rs.parts[0].folder}",
                        hint="give each scored sequence once",
                    )
                seen[sid] = rs.parts[0].folder
        cols = {c: np.concatenate([rs.cols[c] for rs in grp]) for c in grp[0].cols}
        out.append(RecordSet(*key, parts=[p for rs in grp for p in rs.parts], cols=cols))
    return out


def read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        obj = nesting.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FidevalError(f"{path} not found", hint=f"give the folder that holds {what}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FidevalError(
            f"{path} is not readable JSON ({type(e).__name__})", hint=f"regenerate {what}"
        ) from None
    if not isinstance(obj, dict):
        raise FidevalError(f"{path}: expected a JSON object at the top level")
    return obj


def load_records(folder: str | Path) -> list[RecordSet]:
    """Read ``records.parquet`` + ``score.json`` of one folder and check them against the contract.

    One records set per length: a folder scored over several lengths (``score.json`` ``length: null``)
    is split by the ``length`` column.
    """
    import polars as pl

    folder = Path(folder)
    if not folder.is_dir():
        raise FidevalError(
            f"records folder {folder} does not exist", hint="pass the folder 'fideval score' wrote"
        )
    score_path, rec_path = folder / SCORE_FILE, folder / rec_format.FILE
    score = read_json(score_path, SCORE_FILE)
    summary = parse(ScoreSummary, score, str(score_path))
    if not rec_path.exists():
        raise FidevalError(
            f"{rec_path} not found", hint="the scorer writes records.parquet beside score.json"
        )
    try:
        schema = pl.read_parquet_schema(rec_path)
        missing = [c for c in COLUMNS if c not in schema]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise FidevalError(
                f"{rec_path}: missing column '{missing[0]}'{more}",
                hint="see the per-token records contract in docs/formats-records.md",
            )
        df = pl.read_parquet(rec_path, columns=list(COLUMNS))
    except FidevalError:
        raise
    except Exception as e:  # corrupt parquet: polars raises its own error types
        raise FidevalError(
            f"{rec_path} is unreadable ({type(e).__name__})", hint="re-run 'fideval score'"
        ) from None
    if df.height == 0:
        raise FidevalError(f"{rec_path} has no rows", hint="re-run 'fideval score'")
    for c in COLUMNS:
        nulls = df[c].null_count()
        if nulls:
            raise FidevalError(
                f"{rec_path}: column '{c}' has {nulls} null values", hint="re-run 'fideval score'"
            )
    for c in FLOAT_COLUMNS:
        if not df[c].dtype.is_float():
            raise FidevalError(f"{rec_path}: column '{c}' has type {df[c].dtype}, expected float64")
        bad = ~df[c].is_finite()
        n_bad = int(bad.sum())
        if n_bad:
            first = df.filter(bad).row(0, named=True)
            raise FidevalError(
                f"{rec_path}: column '{c}' has {n_bad} NaN/infinite values (first at seq_id "
                f"{first['seq_id']} position {first['position']})",
                hint="re-score (the records contract has no non-finite rows)",
            )
    checks = [("candidate", summary.candidate), ("path", summary.path)]
    if summary.length is not None:
        checks.append(("length", summary.length))
    for c, want in checks:
        vals = df[c].unique().to_list()
        if vals != [want]:
            raise FidevalError(
                f"{rec_path}: column '{c}' holds {sorted(map(str, vals))[:3]}, score.json says {want!r}",
                hint="one records folder holds one candidate and path",
            )
    if summary.rows is not None and summary.rows != df.height:
        raise FidevalError(
            f"{rec_path}: {df.height} rows, score.json says {summary.rows}", hint="re-run 'fideval score'"
        )
    rec_sha, score_sha = sha256_file(rec_path), sha256_file(score_path)
    if summary.records_sha256 is not None and rec_sha != summary.records_sha256:
        raise FidevalError(
            f"{rec_path}: its SHA-256 differs from the records_sha256 its score.json names (altered after scoring)",
            hint="re-run 'fideval score'; records are never edited by hand",
        )
    _impossible(df, rec_path)
    out = []
    for length in sorted(df["length"].unique().to_list()):
        part = df.filter(pl.col("length") == length)
        cols = {c: part[c].to_numpy() for c in ("seq_id", "window_id", "domain")}
        cols |= {c: part[c].to_numpy().astype(np.int64) for c in ("position", "token")}
        cols |= {c: part[c].to_numpy().astype(np.float64) for c in FLOAT_COLUMNS}
        cols |= {c: part[c].to_numpy().astype(bool) for c in BOOL_COLUMNS}
        part = Part(folder=str(folder), score=score, records_sha256=rec_sha, score_sha256=score_sha)
        out.append(
            RecordSet(
                candidate=summary.candidate,
                path=summary.path,
                length=int(length),
                parts=[part],
                cols=cols,
            )
        )
    return out


# Rounding of a float64 sum over a full vocabulary leaves KLD a few ulps below 0 (the demo's smallest: -1.2e-15
# nats); anything below this is not rounding but a broken file or scorer.
ROUNDING = 1e-9
# column -> (lowest, highest) a true value can take; None: unbounded on that side
_RANGES = {"kld": (0.0, None), "rkld": (0.0, None), "nll_ref": (0.0, None), "nll_cand": (0.0, None),
           "entropy_ref": (0.0, None), "p1_ref": (0.0, 1.0), "dp": (-1.0, 1.0)}


def _impossible(df: Any, rec_path: Path) -> None:
    """Values no full-vocabulary computation can give (a negative KLD or NLL, a probability outside [0, 1], a position
    outside its sequence, a negative token id) are refused where the records are read: a mean over them would pass
    every check and gate."""
    import polars as pl

    for c, (lo, hi) in _RANGES.items():
        bad = pl.lit(False)
        if lo is not None:
            bad = bad | (pl.col(c) < lo - ROUNDING)
        if hi is not None:
            bad = bad | (pl.col(c) > hi + ROUNDING)
        rows = df.filter(bad)
        if rows.height:
            first = rows.row(0, named=True)
            span = f"[{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}]"
            raise FidevalError(
                f"{rec_path}: column '{c}' has {rows.height} values outside {span}, impossible for it (first {first[c]!r} "
                f"at seq_id {first['seq_id']} position {first['position']})",
                hint="the records are corrupt or from a broken scorer; re-run 'fideval score'",
            )
    rows = df.filter((pl.col("position") < 0) | (pl.col("position") > pl.col("length") - 2) | (pl.col("token") < 0))
    if rows.height:
        first = rows.row(0, named=True)
        raise FidevalError(
            f"{rec_path}: {rows.height} rows with a position outside [0, length - 2] or a negative token (first at "
            f"seq_id {first['seq_id']} position {first['position']})", hint="re-run 'fideval score'")


def _document_sources(raw: dict[str, Any]) -> dict[str, list[Any]]:
    """Window id -> the ``source`` of each document packed into it (the stage's own file has them)."""
    ws = raw.get("windows")
    items = ws.items() if isinstance(ws, dict) else ((w.get("id"), w) for w in ws or [] if isinstance(w, dict))
    return {wid: [d.get("source") for d in w["documents"] if isinstance(d, dict)]
            for wid, w in items if isinstance(w, dict) and isinstance(w.get("documents"), list)}


def _sequences(raw: dict[str, Any], windows: dict[str, Any]) -> tuple[dict[str, str], dict[int, dict[str, str]]]:
    """Every window and cut of eval-windows.json with its token SHA-256, and the ids of each length (a window's
    ``tokens`` or ``windows_config.window_tokens``; a cut's ``end - start``), as far as the file says them."""
    conf = raw.get("windows_config") if isinstance(raw.get("windows_config"), dict) else {}
    ws = raw.get("windows")
    items = [({"id": k, **v} if isinstance(v, dict) else v) for k, v in ws.items()] if isinstance(ws, dict) else ws or []
    shas: dict[str, str] = {wid: w["token_sha256"] for wid, w in windows.items() if w.get("token_sha256")}
    by_length: dict[int, dict[str, str]] = {}
    for w in items:
        if not isinstance(w, dict):
            continue
        wid = w.get("id", w.get("window_id"))
        if wid not in windows:
            continue
        dom = windows[wid]["domain"]
        n = w.get("tokens") if isinstance(w.get("tokens"), int) else conf.get("window_tokens")
        if isinstance(n, int):
            by_length.setdefault(n, {})[wid] = dom
        for c in w.get("cuts") or []:
            if isinstance(c, dict) and isinstance(c.get("id"), str):
                if isinstance(c.get("sha256"), str):
                    shas[c["id"]] = c["sha256"]
                if isinstance(c.get("start"), int) and isinstance(c.get("end"), int):
                    by_length.setdefault(c["end"] - c["start"], {})[c["id"]] = dom
    return shas, by_length


def load_windows(folder: str | Path) -> dict[str, Any]:
    """eval-windows.json (the windows stage's record): file hash, per-window token SHA-256, domain sources.

    Read as a :class:`fideval.formats.windows.Listing`: the stage's own file or a thinner one, ``windows``
    as a list of objects with ``id`` (or ``window_id``), ``domain`` and a token hash (``token_sha256``,
    ``tokens_sha256`` or ``sha256``), or as an object keyed by window id.
    """
    folder = Path(folder)
    path = folder / WINDOWS_FILE if folder.is_dir() else folder
    raw = read_json(path, WINDOWS_FILE)
    lst = listing(raw, str(path))
    windows = {w.id: {"domain": w.domain or w.id.rsplit("-", 1)[0], "token_sha256": w.sha256}
               for w in lst.windows}
    sources = {name: d.get("source") for name, d in (lst.domains or {}).items() if isinstance(d, dict)}
    sequences, by_length = _sequences(raw, windows)
    return {
        "file": str(path),
        "sha256": sha256_file(path),
        "sequences": sequences,  # seq id (window or cut) -> its tokens' SHA-256
        "by_length": by_length,  # length -> {seq id: domain}, where the file says the length
        "format": lst.format,
        "version": lst.version,
        "windows": windows,
        "sources": sources,
        "provenance": lst.provenance,
        "document_sources": _document_sources(raw),  # window id -> its documents' sources (the stage's own file; else empty)
    }


def load_teacher_manifest(path: str | Path) -> dict[str, Any]:
    """The logit store's manifest.json: its meta (model, canary) and its hash."""
    path = Path(path)
    if path.is_dir():
        path = path / "manifest.json"
    obj = read_json(path, "the store's manifest.json")
    meta = obj.get("meta")
    if not isinstance(meta, dict):
        raise FidevalError(f"{path}: missing key 'meta'", hint="pass the teacher store's manifest.json")
    return {"file": str(path), "sha256": sha256_file(path), "meta": meta}
