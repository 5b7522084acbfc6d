"""The card's Routing section (issue 42): from report.json's ``routing`` block (fideval.report.route_section), per
path and length of the card's build, how its mixture-of-experts routing follows the teacher's (exact top-k set,
top-1 expert, Jaccard, the share of positions routed elsewhere at some MoE layer, the weights' L1 drift), and the
route-controlled decomposition of its mean KLD into the expert arithmetic's share and routing's, each with its
interval; the per-layer plot linked where it is beside the card.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


def routing_context(report: dict[str, Any], candidate: str, report_dir: Path, out_dir: Path,
                    ci: Callable[..., str], pct: Callable[..., str], notes: Any) -> dict[str, Any] | None:
    """``card.routing``: ``rows`` (routing figures), ``decomposition``, ``plots`` (links that resolve); None when the
    report has no routing block for this build."""
    block = report.get("routing")
    if not block:
        return None
    sets = [e for e in block.get("sets") or [] if e["candidate"] == candidate and not e["routes_forced"]]
    dec = [d for d in block.get("decomposition") or [] if d["candidate"] == candidate]
    if not sets and not dec:
        return None
    rows = [{"path": e["path"], "length": e["length"], "layers": len(e["layers"]), "top_k": e["top_k"],
             "n_experts": e["n_experts"],
             "exact": pct(e["overall"]["exact_agreement"], notes), "top1": pct(e["overall"]["top1"], notes),
             "jaccard": pct(e["overall"]["jaccard"], notes), "any_flip": pct(e["overall"]["any_flip"], notes),
             "l1": ci(e["overall"]["l1_drift"], notes=notes)} for e in sets]
    decomposition = [{"path": d["path"], "length": d["length"], "forced_path": d["forced_path"],
                      "free": ci(d["free_kld"], notes=notes), "arithmetic": ci(d["forced_kld"], notes=notes),
                      "routing": ci(d["routing_share"], kind="difference", notes=notes),
                      "fraction": _fraction(d["routing_fraction"])} for d in dec]
    rel = Path(os.path.relpath(report_dir.resolve(), out_dir.resolve()))
    plots = []
    for p in report.get("plots") or []:
        href = (rel / p["file"]).as_posix()
        if p["kind"] == "routing" and p["candidate"] == candidate and \
                Path(os.path.normpath(out_dir.resolve() / href)).is_file():
            plots.append({"href": href, "alt": f"routing per MoE layer, {p['path']}, {p['length']} tokens"})
    return {"rows": rows, "decomposition": decomposition, "plots": plots}


def _fraction(fig: dict[str, Any]) -> str:
    """Routing's fraction of the free mean KLD in per cent, with its interval (1 - the paired ratio's)."""
    est, ci = fig.get("estimate"), fig.get("ci")

    def p(x: float | None) -> str:
        return "—" if x is None else f"{100 * x:.1f}"

    if est is None:
        return "—"
    return f"{p(est)} %" + ("" if ci is None else f" [{p(ci[0])}, {p(ci[1])}]")
