"""``fideval plan``: how many windows an evaluation needs, from a pilot report's measured between-window variance.

A figure is a token-weighted mean theta = sum_w S_w / sum_w N_w over G windows in H domains. Its stratified
linearised variance (``stats/studentized.py``) with windows as the sampling unit is

    V(theta) = sum_h G_h / (G_h - 1) sum_{w in h} (e_w - ebar_h)^2 / N^2,      e_w = S_w - theta N_w,

so with windows like the pilot's (the same tokens per window, the domains in the pilot's proportions) the
standard error scales as se(G) = se_0 sqrt(G_0 / G), se_0 the pilot's with G_0 windows. The report's default
interval is theta -+ q(G) se (on its log or logit scale; on the figure's own scale its half-width is q(G) se to
first order), q(G) = sqrt(G / (G - H)) t_(G-H)(1 - alpha/2), the report's small-sample expansion. So

    windows for a half-width h:          the least G with  q(G) se_0 sqrt(G_0 / G) <= h,
    minimum detectable difference at G:  MDD(G) = (q(G) + z_power) se_d0 sqrt(G_0 / G),
    windows to detect a difference D:    the least G with  MDD(G) <= D,

se_d0 the pilot's paired standard error of the difference of two builds (``paired.py``'s influence values,
u_w = (S1_w - theta1 N1_w) / N1 - (S2_w - theta2 N2_w) / N2, stratified the same way): a paired comparison
needs far fewer windows than its two means' intervals suggest, as the windows' shared difficulty cancels.
MDD is the true difference a two-sided test at level alpha on the paired interval detects with probability
``power``. Per domain the same with that domain's windows alone (H = 1). These are planning figures from one
pilot: its own variance estimate is uncertain (with G_0 windows, roughly +- 1/sqrt(2 G_0) relative), so a
pilot of >= 30 windows a domain is advisable.

Where windows share documents, windows are not the independent unit and their variance understates the figure's:
``--documents eval-windows.json`` plans in documents instead (windows sharing a document summed into one unit,
``compare_units``), every count (G_0, G, the needed and the ``--windows`` one) then a count of documents like the
pilot's (as many windows each).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fideval.errors import FidevalError
from fideval.stats.clusters import Clusters, cluster_sums
from fideval.stats.studentized import _strata

FIGURES = {"mean_kld": "kld", "top1": "top1"}
MAX_WINDOWS = 10_000_000


def quantile(g: float, h: int, confidence: float) -> float:
    """q(G) = sqrt(G / (G - H)) t_(G-H)(1 - alpha/2): the report's expanded interval's multiplier."""
    from scipy import stats

    if g - h < 1:
        return float("inf")
    return float(np.sqrt(g / (g - h)) * stats.t.ppf(1.0 - (1.0 - confidence) / 2.0, g - h))


def variance(s: np.ndarray, n: np.ndarray, strata: np.ndarray | None) -> float:
    """The stratified linearised variance of sum(s)/sum(n) (the module docstring's V)."""
    theta = s.sum() / n.sum()
    e = s - theta * n
    v = 0.0
    for m in _strata(strata, s.size):
        if m.size >= 2:
            v += m.size / (m.size - 1.0) * float(np.sum((e[m] - e[m].mean()) ** 2))
    return v / n.sum() ** 2


def paired_variance(s1, n1, s2, n2, strata) -> float:
    """The stratified variance of theta1 - theta2 from the influence values u_w (module docstring)."""
    t1, t2 = s1.sum() / n1.sum(), s2.sum() / n2.sum()
    u = (s1 - t1 * n1) / n1.sum() - (s2 - t2 * n2) / n2.sum()
    v = 0.0
    for m in _strata(strata, u.size):
        if m.size >= 2:
            v += m.size / (m.size - 1.0) * float(np.sum((u[m] - u[m].mean()) ** 2))
    return v


def half_width(se0: float, g0: int, g: float, h: int, confidence: float) -> float:
    """The predicted half-width at ``g`` windows: q(G) se_0 sqrt(G_0 / G)."""
    return quantile(g, h, confidence) * se0 * np.sqrt(g0 / g)


def mdd(se_d0: float, g0: int, g: float, h: int, confidence: float, power: float) -> float:
    """The minimum detectable difference at ``g`` windows: (q(G) + z_power) se_d0 sqrt(G_0 / G)."""
    from scipy import stats

    return (quantile(g, h, confidence) + float(stats.norm.ppf(power))) * se_d0 * np.sqrt(g0 / g)


def least_windows(f, target: float, h: int) -> int | None:
    """The least integer G > H with f(G) <= target (f decreasing in G), by bisection; None beyond MAX_WINDOWS."""
    lo, hi = h + 1, h + 2
    if f(lo) <= target:
        return lo
    while f(hi) > target:
        if hi > MAX_WINDOWS:
            return None
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if f(mid) <= target else (mid, hi)
    return hi


def _arrays(sets_by_build: dict[str, list], column: str) -> tuple[list[str], np.ndarray, np.ndarray, Clusters]:
    pairs: dict[str, str] = {}
    for sets in sets_by_build.values():
        for rs in sets:
            pairs.update(zip(rs.cols["window_id"].astype(str), rs.cols["domain"].astype(str)))
    cl = Clusters.from_pairs(pairs)
    names = sorted(sets_by_build)
    s, n = np.zeros((cl.size, len(names))), np.zeros((cl.size, len(names)))
    for j, name in enumerate(names):
        for rs in sets_by_build[name]:
            codes = cl.codes(rs.cols["window_id"])
            s[:, j] += cluster_sums(codes, rs.cols[column].astype(np.float64), cl.size)
            n[:, j] += cluster_sums(codes, np.ones(codes.size), cl.size)
    return names, s, n, cl


def plan_arrays(
    names: list[str],
    s: np.ndarray,
    n: np.ndarray,
    strata: list[str],
    *,
    half: float | None,
    confidence: float,
    power: float = 0.8,
    windows: int | None = None,
    detect: float | None = None,
) -> dict[str, Any]:
    """The plan from per-window sums ``[G, K]`` of K builds on G windows with their ``strata`` (domain names)."""
    lab = np.asarray(strata)
    scopes = [("overall", np.arange(lab.size))] + [(d, np.flatnonzero(lab == d)) for d in sorted(set(strata))]
    rows, pairs = [], []
    for scope, m in scopes:
        sub = lab[m] if scope == "overall" else None
        h = len(set(lab[m])) if scope == "overall" else 1
        g0 = int(m.size)
        g_at = windows * g0 / lab.size if windows is not None else None
        for j, name in enumerate(names):
            sj, nj = s[m, j], n[m, j]
            if nj.sum() <= 0 or g0 < h + 1:
                continue
            theta = float(sj.sum() / nj.sum())
            se0 = float(np.sqrt(variance(sj, nj, sub)))
            need = None if half is None else least_windows(
                lambda g, se0=se0, g0=g0, h=h: half_width(se0, g0, g, h, confidence), half, h)
            rows.append({"scope": scope, "build": name, "estimate": theta, "windows": g0, "se": se0,
                         "half_width": half_width(se0, g0, g0, h, confidence),
                         "windows_needed": need,
                         "windows_at": g_at,
                         "half_width_at": None if g_at is None else half_width(se0, g0, g_at, h, confidence)})
        for a in range(len(names)):
            for b in range(a + 1, len(names)):
                sa, na, sb, nb = s[m, a], n[m, a], s[m, b], n[m, b]
                if na.sum() <= 0 or nb.sum() <= 0 or g0 < h + 1:
                    continue
                sd = float(np.sqrt(paired_variance(sa, na, sb, nb, sub)))
                need = None if detect is None else least_windows(
                    lambda g, sd=sd, g0=g0, h=h: mdd(sd, g0, g, h, confidence, power), detect, h)
                pairs.append({"scope": scope, "a": names[a], "b": names[b],
                              "difference": float(sa.sum() / na.sum() - sb.sum() / nb.sum()), "se": sd,
                              "mdd": mdd(sd, g0, g0, h, confidence, power),
                              "windows_at": g_at,
                              "mdd_at": None if g_at is None else mdd(sd, g0, g_at, h, confidence, power),
                              "windows_to_detect": need})
    return {"confidence": confidence, "power": power, "half_width_target": half, "windows_at": windows,
            "detect": detect, "rows": rows, "pairs": pairs}


def plan(
    report: Path,
    *,
    figure: str = "mean_kld",
    half: float | None = None,
    detect: float | None = None,
    windows: int | None = None,
    path: str | None = None,
    length: int | None = None,
    power: float = 0.8,
    confidence: float | None = None,
    documents: Path | None = None,
) -> dict[str, Any]:
    """The plan of ``report``'s builds at one path and length (their records read back as ``compare`` does);
    ``documents`` (eval-windows.json or its folder): in documents, not windows (module docstring)."""
    from fideval.report.compare_inputs import choose, read_reports, records_of

    if figure not in FIGURES:
        raise FidevalError(f"unknown figure {figure!r}", hint=f"one of {', '.join(FIGURES)}")
    for name, v in (("--half-width", half), ("--detect", detect)):
        if v is not None and not v > 0:
            raise FidevalError(f"{name} {v} is not positive", hint="give a positive target")
    if not 0.5 <= power < 1:
        raise FidevalError(f"--power {power} is outside [0.5, 1)", hint="e.g. 0.8")
    (p, rep), = read_reports([report])
    path, length = choose([(p, rep)], path, length)
    cands = sorted({x["candidate"] for x in rep["results"] if (x["path"], x["length"]) == (path, length)})
    sets = {c: records_of(p, rep, c, path, length) for c in cands}
    names, s, n, cl = _arrays(sets, FIGURES[figure])
    unit = "window"
    if documents is not None:  # documents as the unit: windows sharing one summed together
        from fideval.report.compare_units import document_units, read_documents

        docs, where = read_documents(documents, [(p, rep)])
        unit_of, strata = document_units(dict(zip(cl.ids, cl.strata)), docs, where)
        ucl = Clusters.from_pairs(strata)
        codes = ucl.codes([unit_of[w] for w in cl.ids])
        s, n = (np.stack([np.bincount(codes, weights=x[:, j], minlength=ucl.size) for j in range(x.shape[1])], 1)
                for x in (s, n))
        cl, unit = ucl, "document"
    conf = confidence if confidence is not None else float(rep["settings"]["confidence"])
    out = plan_arrays(names, s, n, list(cl.strata), half=half, confidence=conf, power=power, windows=windows,
                      detect=detect)
    return out | {"report": str(p), "figure": figure, "path": path, "length": length, "unit": unit}


def lines(pl: dict[str, Any]) -> list[str]:
    """What the verb prints: per build and scope the pilot's half-width and the windows needed; per pair the MDD."""
    fig = pl["figure"]
    u = "documents" if pl.get("unit") == "document" else "windows"
    out = [f"{pl['report']}: {fig} at {pl['path']}/{pl['length']}, {pl['confidence']:.0%} intervals "
           f"(half-width = q(G) se0 sqrt(G0/G), q(G) = sqrt(G/(G-H)) t_(G-H))"]
    for r in pl["rows"]:
        need = ""
        if pl["half_width_target"] is not None:
            need = (f"; half-width {pl['half_width_target']:.4g} needs {r['windows_needed']} {u}"
                    if r["windows_needed"] is not None else "; target not reachable")
        at = f"; at {r['windows_at']:.4g} {u} {r['half_width_at']:.4g}" if r["half_width_at"] is not None else ""
        out.append(f"  {r['scope']} {r['build']}: {fig} {r['estimate']:.4g}, {r['windows']} {u}, half-width "
                   f"{r['half_width']:.4g}{at}{need}")
    for q in pl["pairs"]:
        need = ""
        if pl["detect"] is not None:
            need = (f"; detecting {pl['detect']:.4g} needs {q['windows_to_detect']} {u}"
                    if q["windows_to_detect"] is not None else "; not detectable")
        at = f"; at {q['windows_at']:.4g} {u} {q['mdd_at']:.4g}" if q["mdd_at"] is not None else ""
        out.append(f"  {q['scope']} {q['a']} - {q['b']}: difference {q['difference']:.4g}, minimum detectable "
                   f"({pl['power']:.0%} power) {q['mdd']:.4g}{at}{need}")
    return out
