"""``fideval card``: report.json -> a model card (README.md) for one candidate build.

The YAML front matter is built as plain Python (floats via ``float()``, never numpy scalars or NaN)
and written with ``yaml.safe_dump`` so any YAML reader — the Hub's included — parses it; the markdown
body is a jinja2 template with StrictUndefined, so a misspelt field fails loudly instead of printing
nothing. ``model-index`` holds one result per (path, length) whose metrics are the card's figures,
each with its interval in ``args``; ``x_fidelity`` records what the figures were measured against.
Same report in, byte-identical card out.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import yaml

from fideval.errors import FidevalError
from fideval.report.card_intervals import beside_context

SPEC_VERSION = 1
TOOL_URL = "https://github.com/fideval/fideval"
HEADLINE_QUANTILES = (0.5, 0.9, 0.99, 0.999)
TEMPLATES = Path(__file__).resolve().parent / "templates"


def _g(x: float | None, digits: int = 4) -> str:
    return "—" if x is None else f"{x:.{digits}g}"


def _ci(fig: dict[str, Any] | None, digits: int = 4) -> str:
    if fig is None or fig.get("estimate") is None:
        return "—"
    lo, hi = fig["ci"]
    return f"{_g(fig['estimate'], digits)} [{_g(lo, digits)}, {_g(hi, digits)}]"


def _pct(fig: dict[str, Any] | None) -> str:
    if fig is None:
        return "—"
    lo, hi = (fig if "ci" in fig else fig["wilson"])["ci"]  # the default; a version 1 report's card took Wilson's
    return f"{100 * fig['estimate']:.2f} % [{_p(lo)}, {_p(hi)}]"


def _p(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.2f}"


def pick_candidate(report: dict[str, Any], candidate: str | None) -> str:
    names = sorted({r["candidate"] for r in report["results"]})
    if candidate is None:
        if len(names) != 1:
            raise FidevalError(
                f"the report holds {len(names)} candidates ({', '.join(names)})",
                hint="choose one with --candidate",
            )
        return names[0]
    if candidate not in names:
        raise FidevalError(f"candidate {candidate!r} is not in the report (it holds {', '.join(names)})")
    return candidate


def _metric(mtype: str, name: str, fig: dict[str, Any], **args: Any) -> dict[str, Any]:
    a = {
        "ci_low": None if fig["ci"][0] is None else float(fig["ci"][0]),  # null: unbounded (flagged)
        "ci_high": None if fig["ci"][1] is None else float(fig["ci"][1]),
        "confidence": float(fig["confidence"]),
        "interval": fig["method"],
        **args,
    }
    return {"type": mtype, "name": name, "value": float(fig["estimate"]), "args": a}


def front_matter(report: dict[str, Any], candidate: str, report_sha256: str) -> dict[str, Any]:
    prov, st = report["provenance"], report["settings"]
    ds = prov["dataset"]
    rows = [r for r in report["results"] if r["candidate"] == candidate]
    results = []
    for r in rows:
        o = r["overall"]
        metrics = [
            _metric(
                "mean_kld",
                "Mean KLD vs reference (nats/token)",
                o["mean_kld"],
                resamples=int(st["resamples"]),
                seed=int(st["seed"]),
                clusters=int(o["mean_kld"]["clusters"]),
            )
        ]
        for q in o["kld_quantiles"]:
            metrics.append(
                _metric(
                    f"kld_p{100 * q['q']:g}",
                    f"KLD {100 * q['q']:g}th percentile (nats)",
                    q,
                    quantile_method=q["quantile_method"],
                )
            )
        top1 = o["top1"] if "ci" in o["top1"] else {**o["top1"]["wilson"], "estimate": o["top1"]["estimate"]}
        metrics.append(_metric("top1_agreement", "Top-1 agreement with reference", top1, rows=int(o["top1"]["rows"])))
        results.append(
            {
                "task": {"type": "text-generation", "name": "Fidelity to the reference model"},
                "dataset": {
                    "type": "fideval-windows",
                    "name": str(ds["name"]),
                    "revision": ds["windows_file_sha256"] or "unknown",
                    "args": {
                        "path": r["path"],
                        "length": int(r["length"]),
                        "windows": int(r["clusters"]),
                        "rows": int(r["rows"]),
                        "domains": list(st["domains"]),
                    },
                },
                "metrics": metrics,
            }
        )
    ref = prov["reference"]
    tool = prov["tool"]
    return {
        "base_model": prov["base_model"] or ref["model_id"],
        "tags": ["fideval", "quantized", "fidelity-evaluation", "kl-divergence"],
        "model-index": [{"name": candidate, "results": results}],
        "x_fidelity": {
            "spec_version": SPEC_VERSION,
            "role": "quantized-candidate",
            "reference": {"model": ref["model_id"], "revision": ref["model_revision"]},
            "dataset": {
                "name": str(ds["name"]),
                "revision": ds["windows_file_sha256"],
                "windows": len(ds["windows"]),
                "sources": ds["sources"],
            },
            "scope": {
                "paths": sorted({r["path"] for r in rows}),
                "lengths": sorted({int(r["length"]) for r in rows}),
                "domains": list(st["domains"]),
                "rows": int(sum(r["rows"] for r in rows)),
            },
            "measured_by": {
                "tool": "fideval",
                "version": tool["version"],
                "git_commit": tool["git_commit"],
                "report_format": report["format"],
                "report_version": int(report["version"]),
                "report_sha256": report_sha256,
                "config_hash": prov["config_hash"],
                "resamples": int(st["resamples"]),
                "seed": int(st["seed"]),
            },
        },
    }


def card_context(
    report: dict[str, Any], candidate: str, report_dir: Path, out_dir: Path, report_sha256: str
) -> dict[str, Any]:
    st, prov = report["settings"], report["provenance"]
    rows = [r for r in report["results"] if r["candidate"] == candidate]
    domains = list(st["domains"])

    def qmap(r: dict[str, Any]) -> dict[float, float]:
        return {round(q["q"], 6): q["estimate"] for q in r["overall"]["kld_quantiles"]}

    headline = [
        {
            "path": r["path"],
            "length": r["length"],
            "mean": _ci(r["overall"]["mean_kld"]),
            "q": [_g(qs.get(q)) for q in HEADLINE_QUANTILES],
            "top1": _pct(r["overall"]["top1"]),
            "rows": f"{r['rows']:,}",
        }
        for r in rows
        for qs in [qmap(r)]
    ]
    domain_rows = [
        {
            "path": r["path"],
            "length": r["length"],
            "cells": [_ci(r["domains"].get(d, {}).get("mean_kld"), 3) for d in domains],
        }
        for r in rows
    ]
    dom_clusters = [f["clusters"] for r in rows for f in r["domains"].values() if f.get("mean_kld")]
    cmp = report["comparisons"]
    builds = [
        {"other": c["denominator"], "path": c["path"], "length": c["length"], "value": _ci(c)}
        for c in cmp["builds"]
        if c["numerator"] == candidate
    ]
    paths = [{"length": c["length"], "value": _ci(c)} for c in cmp["paths"] if c["candidate"] == candidate]
    lengths = [
        {"path": c["path"], "numerator": c["numerator"], "denominator": c["denominator"], "value": _ci(c)}
        for c in cmp["lengths"]
        if c["candidate"] == candidate
    ]
    rel = Path(os.path.relpath(report_dir.resolve(), out_dir.resolve()))
    plots = [
        {"href": (rel / p["file"]).as_posix(), "alt": f"{p['kind']} {p['path']} {p['length']}"}
        for p in report["plots"]
        if p["candidate"] == candidate
    ]
    checks = [
        {"name": c["name"], "status": c["status"], "detail": str(c["detail"]).replace("|", "/")}
        for c in report["checks"]
    ]
    return beside_context(report, rows) | {
        "title": f"{candidate}: fidelity to {prov['reference']['model_id']}",
        "candidate": candidate,
        "reference": prov["reference"],
        "tool_url": TOOL_URL,
        "windows": st["clusters"],
        "domains": domains,
        "confidence_pct": f"{100 * st['confidence']:g}",
        "resamples": st["resamples"],
        "seed": st["seed"],
        "quantile_method": st["quantile_method"],
        "headline": headline,
        "domain_rows": domain_rows,
        "min_domain_windows": min(dom_clusters) if dom_clusters else 0,
        "builds": builds,
        "paths": paths,
        "lengths": lengths,
        "checks": checks,
        "plots": plots,
        "dataset": {"name": prov["dataset"]["name"], "revision": prov["dataset"]["windows_file_sha256"]},
        "tool": prov["tool"],
        "config_hash": prov["config_hash"],
        "report_sha256": report_sha256,
    }


def render(
    report: dict[str, Any],
    *,
    report_path: Path,
    out_path: Path,
    candidate: str | None = None,
    template: str | Path | None = None,
) -> str:
    """The card's text: YAML front matter + the rendered markdown body."""
    import jinja2

    cand = pick_candidate(report, candidate)
    sha = hashlib.sha256(report_path.read_bytes()).hexdigest()
    fm = front_matter(report, cand, sha)
    ctx = card_context(report, cand, report_path.parent, out_path.parent, sha)
    if template is not None:
        tpath = Path(template)
        try:
            source = tpath.read_text(encoding="utf-8")
        except OSError:
            raise FidevalError(
                f"card template {tpath} not found or unreadable", hint="give a jinja2 markdown file"
            ) from None
        origin = str(tpath)
    else:
        source, origin = (TEMPLATES / "card.md.j2").read_text(encoding="utf-8"), "card.md.j2"
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)
    try:
        body = env.from_string(source).render(card=ctx, report=report, front_matter=fm)
    except jinja2.TemplateSyntaxError as e:
        raise FidevalError(
            f"{origin}: line {e.lineno}: {e.message}", hint="fix the template syntax"
        ) from None
    except jinja2.UndefinedError as e:
        raise FidevalError(
            f"{origin}: {e.message}", hint="use the fields listed in docs/formats-report.md"
        ) from None
    yml = yaml.safe_dump(json.loads(json.dumps(fm)), sort_keys=False, allow_unicode=True, width=1000)
    body = re.sub(r"\n{3,}", "\n\n", body).strip()
    return f"---\n{yml}---\n\n{body}\n"
