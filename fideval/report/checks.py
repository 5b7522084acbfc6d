"""Integrity checks recorded in report.json; ``fideval check`` fails on any with status "fail".

Each check says what was compared and against what, so a failure can be acted on:
  self_score_zero     scoring the teacher against itself gives KLD exactly 0 and top-1 exactly 1 (score.json
                      ``self_check`` blocks, and every row of the ``--self-check`` records): the scorer and
                      the store agree bit for bit;
  canary_identical    every store's and candidate run's canary (a sequence re-run and compared) was identical
                      (manifest meta, score.json);
  teacher_top1_range  per window, the teacher's top-1 matches the realised next token in [0.20, 0.995] of
                      rows: below, the window is noise or mis-tokenised; above, memorised or degenerate text;
  cpu_check           the GPU kernel's rows checked in float64 on the CPU differ by at most the tolerance;
  nonfinite_rows      the scorer met no non-finite logits;
  windows_match       every window in the records is listed in eval-windows.json (when given), and every
                      sequence's token SHA-256 in score.json equals the windows' (a mismatch is refused outright);
  coverage            the records hold every sequence the config and the windows ask for (a partial report).
A check whose input is absent has status "not_run" (not a failure). :func:`gate_failures` adds the fidelity
gates (mean KLD, top-1) to the failed checks: the verdict of ``fideval check``.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from fideval.report.inputs import RecordSet

TOP1_RANGE = (0.20, 0.995)


def _check(name: str, status: str, detail: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "status": status, "detail": detail, **extra}


def _parts(sets: list[RecordSet]) -> list[tuple[str, Any]]:
    return [(f"{rs.candidate}/{rs.path}/{rs.length} ({p.folder})", p) for rs in sets for p in rs.parts]


def self_score(sets: list[RecordSet], self_sets: list[RecordSet]) -> dict[str, Any]:
    """score.json ``self_check`` blocks, and the rows of self-check records (teacher scored against itself)."""
    runs = [
        (who, p.score["self_check"])
        for who, p in _parts(sets + self_sets)
        if isinstance(p.score.get("self_check"), dict)
    ]
    runs += [
        (
            f"{rs.candidate}/{rs.path}/{rs.length} records",
            {"max_kld": float(np.max(np.abs(rs.cols["kld"]))), "top1": float(rs.cols["top1"].mean())},
        )
        for rs in self_sets
    ]
    if not runs:
        return _check("self_score_zero", "not_run", "no self-check records and no score.json self_check")
    bad = [
        f"{who}: max KLD {sc.get('max_kld')!r}, top-1 {sc.get('top1')!r}"
        for who, sc in runs
        if not (sc.get("max_kld") == 0 and sc.get("top1") == 1)
    ]
    worst = max(abs(float(sc.get("max_kld") or 0.0)) for _, sc in runs)
    rows = sum(rs.rows for rs in self_sets)
    if bad:
        more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
        return _check("self_score_zero", "fail", "; ".join(bad[:3]) + more, max_kld=worst, rows=rows)
    return _check(
        "self_score_zero", "pass", f"{len(runs)} self-score results: KLD 0, top-1 1", max_kld=worst, rows=rows
    )


def _canaries(meta: dict[str, Any]) -> list[dict[str, Any]]:
    """A manifest's canary verdicts: one dict, a list of them (one per length), or either as JSON text."""
    c = meta.get("canary")
    if isinstance(c, str):
        try:
            c = json.loads(c)
        except ValueError:
            return []
    items = c if isinstance(c, list) else [c]
    return [x for x in items if isinstance(x, dict) and "identical" in x]


def canary(manifests: list[dict[str, Any]], sets: list[RecordSet] = ()) -> dict[str, Any]:
    """Every teacher store's canary (manifest meta) and every candidate run's (score.json
    ``candidate_info.run_settings.canary``; runs scored from a candidate store, and scores written before
    2026-12-08, have none)."""
    found = [(m["file"], c) for m in manifests for c in _canaries(m["meta"])]
    runs = [(who, c) for who, p in _parts(sets)
            for c in [((p.score.get("candidate_info") or {}).get("run_settings") or {}).get("canary")]
            if isinstance(c, dict) and "identical" in c]
    if not found and not runs:
        return _check("canary_identical", "not_run", "no teacher manifest or candidate run with a canary given")
    bad = [f for f, c in found + runs if c["identical"] is not True]
    counted = f"{len(found)} stores" + (f" and {len(runs)} candidate runs" if runs else "")
    if bad:
        more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
        return _check(
            "canary_identical",
            "fail",
            "canary re-run differs from its first run in " + ", ".join(bad[:3]) + more,
            stores=len(found),
            runs=len(runs),
        )
    return _check("canary_identical", "pass", f"canary re-run identical in {counted}", stores=len(found), runs=len(runs))


def teacher_top1(sets: list[RecordSet]) -> dict[str, Any]:
    """Per (length, window): share of rows where the teacher's argmax is the realised token.

    ``ref_correct`` depends only on the teacher and the tokens, so each (length, window) is read from the
    first records set (in sorted order) that holds it.
    """
    lo, hi = TOP1_RANGE
    rates: dict[tuple[int, str], float] = {}
    for rs in sorted(sets, key=lambda r: (r.length, r.candidate, r.path)):
        ids, inv = np.unique(rs.cols["window_id"].astype(str), return_inverse=True)
        rate = np.bincount(inv, weights=rs.cols["ref_correct"].astype(np.float64)) / np.bincount(inv)
        for w, r in zip(ids, rate):
            rates.setdefault((rs.length, str(w)), float(r))
    outside = [f"{w}@{length}: {r:.3f}" for (length, w), r in sorted(rates.items()) if not lo <= r <= hi]
    allr = np.array(list(rates.values()))
    extra = {"range": [lo, hi], "min": float(allr.min()), "max": float(allr.max()), "windows": int(allr.size)}
    if outside:
        more = f" (and {len(outside) - 5} more)" if len(outside) > 5 else ""
        return _check(
            "teacher_top1_range",
            "fail",
            "windows outside the range: " + ", ".join(outside[:5]) + more,
            **extra,
        )
    return _check(
        "teacher_top1_range", "pass", f"{allr.size} (length, window) pairs in [{lo}, {hi}]", **extra
    )


def cpu_check(sets: list[RecordSet]) -> dict[str, Any]:
    blocks = [
        (who, p.score["cpu_check"]) for who, p in _parts(sets) if isinstance(p.score.get("cpu_check"), dict)
    ]
    if not blocks:
        return _check("cpu_check", "not_run", "no score.json carries a cpu_check")
    _, worst = max(blocks, key=lambda b: float(b[1].get("max_rel_diff") or 0.0))
    rows = sum(int(b.get("rows_checked") or 0) for _, b in blocks)
    bad = [
        f"{who}: {b['max_rel_diff']:.3g} > {b['tolerance']:.3g}"
        for who, b in blocks
        if float(b.get("max_rel_diff") or 0.0) > float(b.get("tolerance") or 0.0)
    ]
    extra = {
        "max_rel_diff": float(worst.get("max_rel_diff") or 0.0),
        "rows_checked": rows,
        "tolerance": float(worst.get("tolerance") or 0.0),
    }
    if bad:
        return _check(
            "cpu_check", "fail", "GPU-vs-CPU difference above tolerance: " + "; ".join(bad), **extra
        )
    return _check(
        "cpu_check",
        "pass",
        f"largest GPU-vs-CPU relative difference {extra['max_rel_diff']:.3g} " f"over {rows} rows",
        **extra,
    )


def nonfinite(sets: list[RecordSet]) -> dict[str, Any]:
    bad = [
        f"{who}: {p.score.get('nonfinite_rows')}"
        for who, p in _parts(sets)
        if p.score.get("nonfinite_rows", 0) not in (0, None)
    ]
    if bad:
        return _check("nonfinite_rows", "fail", "scorer skipped non-finite rows: " + "; ".join(bad))
    return _check("nonfinite_rows", "pass", "no non-finite rows")


def windows_match(sets: list[RecordSet], windows: dict[str, Any] | None, links: dict[str, int] | None = None) -> dict[str, Any]:
    """Every window of the records is in eval-windows.json, and (``links``, fideval.report.coverage.token_links,
    which refuses a mismatch outright) how many sequences' token SHA-256 were found equal to the windows'."""
    if windows is None:
        return _check("windows_match", "not_run", "no eval-windows.json given")
    known = windows["windows"]
    seen = sorted({str(w) for rs in sets for w in np.unique(rs.cols["window_id"].astype(str))})
    unknown = [w for w in seen if w not in known]
    if unknown:
        return _check(
            "windows_match",
            "fail",
            f"{len(unknown)} windows not in eval-windows.json: " + ", ".join(unknown[:5]),
        )
    links = links or {"checked": 0, "unchecked_folders": 0}
    tokens = f"; the token SHA-256 of {links['checked']} sequences equal eval-windows.json's"
    if links["unchecked_folders"]:
        tokens += f" ({links['unchecked_folders']} records folders name no token hashes: written before they existed)"
    return _check("windows_match", "pass", f"{len(seen)} windows, all in eval-windows.json{tokens}",
                  sequences_checked=links["checked"], folders_unchecked=links["unchecked_folders"])


def coverage_check(cov: dict[str, Any]) -> dict[str, Any]:
    """The records against what was asked (fideval.report.coverage): a partial report fails ``fideval check``."""
    return _check("coverage", cov["status"], cov["detail"])


def run_all(
    sets: list[RecordSet],
    self_sets: list[RecordSet],
    windows: dict[str, Any] | None,
    manifests: list[dict[str, Any]],
    links: dict[str, int] | None = None,
) -> list[dict[str, Any]]:
    """``sets``: merged records sets of the candidates; ``self_sets``: teacher-vs-teacher records; ``links``: the
    token SHA-256 comparison's counts (fideval.report.coverage.token_links)."""
    return [
        self_score(sets, self_sets),
        canary(manifests, sets),
        teacher_top1(sets + self_sets),
        cpu_check(sets + self_sets),
        nonfinite(sets + self_sets),
        windows_match(sets + self_sets, windows, links),
    ]


def gate_failures(report: dict[str, Any], max_mean_kld: float | None, min_top1: float | None) -> list[str]:
    """One line per failed integrity check or fidelity gate (the arguments override the report's gates)."""
    lines = [f"check {c['name']} failed: {c['detail']}" for c in report["checks"] if c["status"] == "fail"]
    gates = report.get("gates") or {}
    kld_max = max_mean_kld if max_mean_kld is not None else gates.get("mean_kld_max")
    top1_min = min_top1 if min_top1 is not None else gates.get("top1_min")
    for r in report["results"]:
        who = f"{r['candidate']}/{r['path']}/{r['length']}"
        m = r["overall"]["mean_kld"]["estimate"]
        if kld_max is not None and m > kld_max:
            lines.append(f"gate mean_kld_max failed: {who} mean KLD {m:.6g} > {kld_max:g}")
        t = r["overall"]["top1"]["estimate"]
        if top1_min is not None and t < top1_min:
            lines.append(f"gate top1_min failed: {who} top-1 agreement {t:.6g} < {top1_min:g}")
    return lines
