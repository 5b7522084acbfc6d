"""The card's interval labels, the intervals printed beside the default, and the comparison sentences.

A version 1 report's intervals are the cluster BCa (means) and the iid Wilson (top-1); a version 2 report's
default is the cluster bootstrap-t (``fideval/stats/intervals.py``), with the BCa and both Wilson intervals
beside it. The labels come from the report, so a card never calls one interval by another's name; for a
version 1 report every field here renders exactly the text cards had before.
"""

from __future__ import annotations

from typing import Any

LABELS = {
    "cluster-bca": "BCa",
    "cluster-percentile": "percentile",
    "cluster-percentile-expanded": "percentile",
    "cluster-bootstrap-t": "bootstrap-t",
    "cluster-bootstrap-t-log": "bootstrap-t",
    "cluster-bootstrap-t-logit": "bootstrap-t",
    "wilson": "Wilson",
}


def _g(x: float | None, digits: int = 4) -> str:
    return "—" if x is None else f"{x:.{digits}g}"


def _ci(est: float | None, ci: list[float] | None, digits: int = 4) -> str:
    if est is None or ci is None:
        return "—"
    return f"{_g(est, digits)} [{_g(ci[0], digits)}, {_g(ci[1], digits)}]"


def _pct(est: float, block: dict[str, Any] | None) -> str:
    if block is None or block.get("ci") is None:
        return "—"
    lo, hi = ("—" if x is None else f"{100 * x:.2f}" for x in block["ci"])
    return f"{100 * est:.2f} % [{lo}, {hi}]"


def label(method: str) -> str:
    """A method's short name in the card: every cluster bootstrap-t variant is 'bootstrap-t'."""
    if method.startswith("mover-cluster-bootstrap-t"):
        return "MOVER bootstrap-t"
    return "bootstrap-t" if method.startswith("cluster-bootstrap-t") else LABELS.get(method, method)


def _label(methods: list[str], fallback: str) -> str:
    named = sorted({label(m) for m in methods if "cluster-bootstrap-t" in m or m in LABELS})
    return " / ".join(named) if named else fallback


def sentence(c: dict[str, Any], pct: str) -> str:
    """'lowers the mean KLD 1.33 times [1.21, 1.46] against q8 (serving, 2048 tokens); the interval excludes 1'."""
    r, ci = c["estimate"], c["ci"]
    who = f"against {c['denominator']} ({c['path']}, {c['length']} tokens)"
    if r is None or ci is None:
        return f"mean KLD ratio undefined {who}"
    def inv(x: float | None) -> float | None:
        return None if x is None or x <= 0 else 1.0 / x

    if r < 1.0:
        words = f"lowers the mean KLD {_g(1.0 / r, 3)} times [{_g(inv(ci[1]), 3)}, {_g(inv(ci[0]), 3)}]"
    else:
        words = f"raises the mean KLD {_g(r, 3)} times [{_g(ci[0], 3)}, {_g(ci[1], 3)}]"
    verdict = ("the interval excludes 1: a difference these windows resolve" if c.get("excludes")
               else "the interval includes 1: not distinguishable on these windows")
    return f"{words} {who} ({pct} % {label(c['method'])}); {verdict}"


def beside_context(report: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    pct = f"{100 * report['settings']['confidence']:g}"
    v2 = int(report["version"]) >= 2
    cand = rows[0]["candidate"] if rows else None
    means = [r["overall"]["mean_kld"]["method"] for r in rows]
    cmps = [c for c in report["comparisons"].get("builds", []) if c["numerator"] == cand]
    out: dict[str, Any] = {
        "mean_label": _label(means, "BCa"),
        "top1_label": _label([r["overall"]["top1"].get("method", "wilson") for r in rows], "Wilson"),
        "cmp_label": _label([c["method"] for c in cmps] + [c["method"] for k in ("paths", "lengths")
                                                           for c in report["comparisons"].get(k, [])
                                                           if c.get("candidate") == cand], "BCa"),
        "beside": [],
        "build_sentences": [],
        "noise": [],
    }
    if not v2:
        return out
    for r in rows:
        m, t = r["overall"]["mean_kld"], r["overall"]["top1"]
        bca = m.get("cluster_bca") or {}
        out["beside"].append({
            "path": r["path"], "length": r["length"],
            "mean_bca": _ci(m["estimate"], bca.get("ci")),
            "top1_wilson": _pct(t["estimate"], t.get("wilson")),
            "top1_deff": _pct(t["estimate"], t.get("wilson_deff")),
            "top1_bca": _pct(t["estimate"], t.get("cluster_bca")),
        })
    out["build_sentences"] = [sentence(c, pct) for c in cmps]
    out["noise"] = [
        {"name": f["candidate"], "path": f["path"], "length": f["length"],
         "floor": _ci(f["mean_kld"]["estimate"], f["mean_kld"]["ci"]),
         "label": label(f["mean_kld"]["method"]),
         "builds": [b for b in f["builds"] if b["candidate"] == cand]}
        for f in report.get("noise_floor") or []
    ]
    return out
