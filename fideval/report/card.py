"""``fideval card``: report.json -> a model card (README.md) for one candidate build.

The YAML front matter is the fidelity model-card format (``model-index`` + ``x_fidelity``), built by
``card_meta`` with huggingface_hub's card classes, so the Hub reads back exactly what was written. The
markdown body is a jinja2 template with StrictUndefined, so a misspelt field fails loudly instead of
printing nothing. Same report (and the same plots beside it) in, byte-identical card out.

A card never overwrites what it did not write: an existing --out file must carry the card's marker
(``x_fidelity.generator: fideval card``, :func:`refuse_overwrite`) unless --force. It links only the plots that
are there relative to it, and names the ones it leaves out; an interval it prints without a bound says why
(``card_intervals.reason``).
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

from fideval.errors import FidevalError
from fideval.report import card_meta
from fideval.report.card_intervals import Cell, Notes, beside_context, few_windows, reason
from fideval.report.card_routing import routing_context
from fideval.report.class_card import class_context
from fideval.stats.quantiles import TAIL_WINDOWS

TOOL_URL = "https://github.com/fideval/fideval"
HEADLINE_QUANTILES = (0.5, 0.9, 0.99, 0.999)
TEMPLATES = Path(__file__).resolve().parent / "templates"


def _g(x: float | None, digits: int = 4) -> str:
    return "—" if x is None else f"{x:.{digits}g}"


def _ci(fig: dict[str, Any] | None, digits: int = 4, kind: str = "kld", notes: Notes | None = None) -> str:
    """A figure and its interval, marked with the note saying why when the interval has no bound (card_intervals)."""
    if fig is None:
        return "—"
    if fig.get("estimate") is None or fig.get("ci") is None:
        return Cell("—", reason(fig, kind), notes)
    lo, hi = fig["ci"]
    return Cell(f"{_g(fig['estimate'], digits)} [{_g(lo, digits)}, {_g(hi, digits)}]", reason(fig, kind), notes)


def _pct(fig: dict[str, Any] | None, notes: Notes | None = None) -> str:
    if fig is None:
        return "—"
    shown = fig if "ci" in fig else {**fig["wilson"], "estimate": fig["estimate"]}  # a version 1 report's: Wilson
    lo, hi = shown["ci"]
    return Cell(f"{100 * fig['estimate']:.2f} % [{_p(lo)}, {_p(hi)}]", reason(shown, "agreement"), notes)


def _p(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.2f}"


MAX_CARD_BYTES = 16 << 20  # a larger file is not a card this tool wrote


def written_by_card(path: Path, *, page: bool = False) -> bool:
    """Whether the file at ``path`` carries the marker of ``fideval card``: ``x_fidelity.generator: fideval card``
    in a card's YAML front matter, the generator meta tag in a results page (``page``)."""
    import yaml

    from fideval.report.results_page import GENERATOR_TAG

    try:
        with open(path, "rb") as f:
            text = f.read(MAX_CARD_BYTES + 1).decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    if len(text) > MAX_CARD_BYTES:
        return False
    if page:
        return GENERATOR_TAG in text
    m = re.match(r"---\r?\n(.*?)\r?\n---\r?\n", text, flags=re.S)
    try:
        front = yaml.safe_load(m.group(1)) if m else None
    except yaml.YAMLError:
        return False
    xf = front.get("x_fidelity") if isinstance(front, dict) else None
    return isinstance(xf, dict) and xf.get("generator") == card_meta.GENERATOR


def refuse_overwrite(path: Path, *, force: bool = False, page: bool = False) -> None:
    """One line when ``path`` exists and is not a card (``page``: a results page) that ``fideval card`` wrote: a
    project's README.md is never replaced by a card unless ``force``. An empty file holds nothing to lose."""
    from fideval.report.results_page import GENERATOR_TAG

    path = Path(path)
    if force or not (path.exists() or path.is_symlink()):
        return
    option = "--html" if page else "--out"
    if path.is_dir():
        name = "results.html" if page else "README.md"
        raise FidevalError(f"{option} {path} is a folder", hint=f"give a file name, e.g. {path / name}")
    if path.is_file() and path.stat().st_size == 0:
        return
    if not written_by_card(path, page=page):
        what, name = ("results page", "results.html") if page else ("model card", "README.md")
        marker = (f"{GENERATOR_TAG} in its head" if page
                  else f"'x_fidelity.generator: {card_meta.GENERATOR}' in its YAML front matter")
        raise FidevalError(f"{option} {path} exists and is not a {what} fideval card wrote (no {marker})",
                           hint=f"choose another {option}, e.g. reports/RUN/{name}, or pass --force to replace it")


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


def checks_summary(checks: list[dict[str, Any]]) -> str:
    """One sentence on the integrity checks: how many passed, and every one that failed or did not run, by
    name, so a reader sees what the numbers are not vouched for."""
    by = {k: [c["name"] for c in checks if c["status"] == k] for k in ("pass", "fail", "not_run")}
    parts = [f"{len(by['pass'])} of {len(checks)} integrity checks passed"]
    if by["fail"]:
        parts.append(f"FAILED: {', '.join(by['fail'])}")
    if by["not_run"]:
        parts.append(f"not run (their inputs were not given, so nothing is claimed for them): {', '.join(by['not_run'])}")
    return "; ".join(parts) + "."


def card_context(
    report: dict[str, Any], candidate: str, report_dir: Path, out_dir: Path, report_sha256: str
) -> dict[str, Any]:
    st, prov = report["settings"], report["provenance"]
    rows = [r for r in report["results"] if r["candidate"] == candidate]
    domains = list(st["domains"])
    notes = Notes()  # why an interval printed below has no bound, in the order the card prints them

    def qmap(r: dict[str, Any]) -> dict[float, float]:
        return {round(q["q"], 6): q["estimate"] for q in r["overall"]["kld_quantiles"]}

    headline = [
        {
            "path": r["path"],
            "length": r["length"],
            "mean": _ci(r["overall"]["mean_kld"], notes=notes),
            "q": [_g(qs.get(q)) for q in HEADLINE_QUANTILES],
            "top1": _pct(r["overall"]["top1"], notes),
            "rows": f"{r['rows']:,}",
        }
        for r in rows
        for qs in [qmap(r)]
    ]
    domain_rows = [
        {
            "path": r["path"],
            "length": r["length"],
            "cells": [_ci(r["domains"].get(d, {}).get("mean_kld"), 3, notes=notes) for d in domains],
        }
        for r in rows
    ]
    dom_clusters = [f["clusters"] for r in rows for f in r["domains"].values() if f.get("mean_kld")]
    cmp = report["comparisons"]
    builds = [
        {"other": c["denominator"], "path": c["path"], "length": c["length"], "value": _ci(c, kind="ratio", notes=notes)}
        for c in cmp["builds"]
        if c["numerator"] == candidate
    ]
    paths = [{"length": c["length"], "path": c["minuend"], "value": _ci(c, kind="difference", notes=notes)}
             for c in cmp["paths"] if c["candidate"] == candidate]
    lengths = [
        {"path": c["path"], "numerator": c["numerator"], "denominator": c["denominator"],
         "value": _ci(c, kind="ratio", notes=notes)}
        for c in cmp["lengths"]
        if c["candidate"] == candidate
    ]
    rel = Path(os.path.relpath(report_dir.resolve(), out_dir.resolve()))
    listed = [
        {"href": (rel / p["file"]).as_posix(), "alt": f"{p['kind']} {p['path']} {p['length']}"}
        for p in report["plots"]
        if p["candidate"] == candidate
    ]
    # a link is written only to a plot that is there, relative to the card (a card written away from its report
    # folder, or a report written with --no-plots, would otherwise show broken images); the rest are named
    plots = [p for p in listed if Path(os.path.normpath(out_dir.resolve() / p["href"])).is_file()]  # --out's folder may not exist yet
    plots_missing = [p["href"] for p in listed if p not in plots]
    checks = [
        {"name": c["name"], "status": c["status"], "detail": str(c["detail"]).replace("|", "/")}
        for c in report["checks"]
    ]
    by_length = [
        {"length": n, "rows": [h for h in headline if h["length"] == n]}
        for n in sorted({h["length"] for h in headline})
    ]
    domain_lines = [
        {
            "path": r["path"],
            "length": r["length"],
            "text": ", ".join(
                f"{d} {_g(r['domains'][d]['mean_kld']['estimate'], 3)}"
                for d in domains
                if (r["domains"].get(d) or {}).get("mean_kld")
            ),
        }
        for r in rows
    ]
    ds = card_meta._dataset(report)
    return beside_context(report, rows, notes) | {
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
        "tail_min": f"{TAIL_WINDOWS:g}",
        "tail_flagged": sorted({q["q"] for r in rows for q in r["overall"]["kld_quantiles"]
                                if "few_tail_windows" in q.get("flags", [])}),
        "lower_only": sorted({q["q"] for r in rows for q in r["overall"]["kld_quantiles"]  # flag `lower_bound_only`
                              if "lower_bound_only" in q.get("flags", []) and "few_tail_windows" not in q.get("flags", [])}),
        "headline": headline,
        "domain_rows": domain_rows,
        "min_domain_windows": min(dom_clusters) if dom_clusters else 0,
        "few_domain_windows": few_windows(min(dom_clusters), pooled=any(  # flag `few_windows`; a report with the
            "bootstrap_t" in f["mean_kld"] for r in rows for f in r["domains"].values() if f.get("mean_kld"))
        ) if dom_clusters else None,  # domain-pooled interval (fideval/stats/domains.py) says so
        "builds": builds,
        "paths": paths,
        "llamacpp": any(r["path"] == "llamacpp" for r in rows),
        "lengths": lengths,
        "checks": checks,
        "plots": plots,
        "plots_missing": plots_missing,
        "interval_notes": notes,
        "by_length": by_length,
        "domain_lines": domain_lines,
        "checks_summary": checks_summary(report["checks"]),
        # a report written with --allow-partial (fideval.report.coverage): said before any figure
        "partial": (report.get("coverage") or {}).get("detail") if (report.get("coverage") or {}).get("complete") is False else None,
        "measured": card_meta.measurement(report, candidate),
        "provenance": card_meta.candidate_provenance(report, candidate),
        "head_bits": card_meta.head_bits(report, candidate),
        "teacher_kind": card_meta.teacher_kind(report),
        "teacher_head": card_meta.teacher_head(report),
        "dataset": {
            "name": prov["dataset"]["name"],
            "revision": ds["revision"],
            "tokens_sha256": ds["tokens_sha256"],
            "fidelity_dataset": ds["fidelity_dataset"],
            "windows_file_sha256": prov["dataset"]["windows_file_sha256"],
        },
        "tool": prov["tool"],
        "config_hash": prov["config_hash"],
        "report_sha256": report_sha256,
        "lossy_teachers": [t for t in prov.get("teacher_stores") or [] if t.get("lossy")],
        "token_classes": class_context(report, candidate, _ci),  # fideval/report/class_card.py
        "routing": routing_context(report, candidate, report_dir, out_dir, _ci, _pct, notes),  # card_routing.py
    }


def render(
    report: dict[str, Any],
    *,
    report_path: Path,
    out_path: Path,
    candidate: str | None = None,
    template: str | Path | None = None,
    registry: str | None = None,
    lane: str | None = None,
    comparison: Path | None = None,
) -> str:
    """The card's text: YAML front matter + the rendered markdown body. ``comparison``: a comparison.json of this
    build among others (``card_family``): the card gains that section (``card.family``, else None)."""
    import jinja2

    cand = pick_candidate(report, candidate)
    sha = hashlib.sha256(report_path.read_bytes()).hexdigest()
    data = card_meta.card_data(report, cand, sha, registry=registry, lane=lane)
    fm = data.to_dict()
    ctx = card_context(report, cand, report_path.parent, out_path.parent, sha)
    ctx["family"] = None
    if comparison is not None:  # many builds at once (issue 43): this build's place among them
        from fideval.report import card_family

        cmp = card_family.load(comparison)
        card_family.check(cmp, report, cand, str(comparison))
        ctx["family"] = card_family.context(cmp, Path(comparison), cand, out_path.parent)
        if ctx["family"]["plot"] is not None:
            ctx["plots"] = [*ctx["plots"], ctx["family"]["plot"]]
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
    from huggingface_hub import ModelCard

    body = re.sub(r"\n{3,}", "\n\n", body).strip()
    # through ModelCard, as the Hub would write it: what ModelCard.load + save reproduce byte for byte
    return str(ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body}\n"))
