"""``fideval report``: records folders -> report.json, summary-<candidate>-<path>.json and plots.

One ``[B, G]`` window-count matrix is drawn from the seed for the whole report (``stats/clusters.py``),
so per-domain tables, path differences and build-vs-build ratios are computed on the very same
resamples and are jointly consistent. Comparisons pair records sets by window id: a ratio of two builds
resamples the same windows for both, which cancels the windows' shared difficulty.

Deterministic: no timestamps; inputs are sorted by (candidate, path, length); JSON keys sorted. The same
inputs and settings give a byte-identical report.json.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fideval.config import Config, ReportConfig
from fideval.errors import FidevalError
from fideval.provenance import canonical_hash, tool_block
from fideval.report import checks
from fideval.report.comparisons import comparisons
from fideval.report.figures import SetFigures, summary
from fideval.report.identity import candidate_identity
from fideval.report.inputs import RecordSet, load_records, merge
from fideval.report.noise import noise_floor
from fideval.report.schema import FORMAT, VERSION, plain
from fideval.report.views import views
from fideval.stats import intervals
from fideval.stats.clusters import Clusters, resample_counts
from fideval.stats.quantiles import QUANTILE_METHOD


@dataclass
class Built:
    report: dict[str, Any]
    summaries: dict[str, dict[str, Any]]
    figures: list[SetFigures]


def _settings(rc: ReportConfig) -> dict[str, Any]:
    return {
        "resamples": rc.resamples,
        "seed": rc.seed,
        "confidence": rc.confidence,
        "quantiles": list(rc.quantiles),
        "quantile_method": QUANTILE_METHOD,
        "cluster": "window_id",
        "resampling": "windows with replacement within their domain; one [B, G] count matrix from "
        "numpy.random.default_rng(seed) shared by every figure",
        "methods": {
            "cluster-bca": "BCa over window resamples; z0 ties counted half; acceleration from the "
            "leave-one-window-out jackknife (Efron & Tibshirani 14.3, 15.4)",
            "cluster-percentile": "percentile interval over window resamples",
            "cluster-percentile-expanded": "percentile interval over window resamples at the expanded level (the "
            "quantiles' default: `level` in each block; `tail_windows` and `few_tail_windows` say when the rows "
            "beyond a quantile come from too few windows for any window resample to cover it, and the upper bound "
            "is then null)",
            "wilson": "Wilson score interval, tokens as independent trials",
            "wilson-design-effect": "Wilson at n_eff = rows / Deff, Deff = cluster (ratio-estimator) variance / binomial variance",
            **intervals.METHODS,
        },
        "mean": "token-weighted: sum over rows / rows",
        "card_template": rc.card_template,
        **intervals.settings(),
    }


def _window_domains(sets: list[RecordSet]) -> dict[str, str]:
    out: dict[str, str] = {}
    for rs in sets:
        pairs = set(zip(rs.cols["window_id"].astype(str), rs.cols["domain"].astype(str)))
        for w, d in pairs:
            if out.setdefault(w, d) != d:
                raise FidevalError(
                    f"{rs.where}: window {w} is in domain {d} here and {out[w]} elsewhere",
                    hint="records of one report must come from the same windows",
                )
    return out


def _domain_order(sets: list[RecordSet], windows: dict[str, Any] | None, cfg: Config | None) -> list[str]:
    names = [d.name for d in cfg.domains] if cfg is not None else []
    extra = {str(d) for rs in sets for d in np.unique(rs.cols["domain"].astype(str))}
    if windows is not None:
        extra |= {w["domain"] for w in windows["windows"].values()}
    return names + sorted(extra - set(names))


def _reference_code(manifest: dict[str, Any]) -> dict[str, Any] | None:
    """The ``reference_code`` of a teacher manifest's ``teacher`` block (a reference-code teacher), else None."""
    try:
        return json.loads((manifest.get("meta") or {}).get("teacher") or "{}").get("reference_code")
    except (TypeError, ValueError, AttributeError):
        return None


def _provenance(
    sets: list[RecordSet],
    self_sets: list[RecordSet],
    windows: dict[str, Any] | None,
    cfg: Config | None,
    manifests: list[dict[str, Any]],
    clusters: Clusters,
) -> dict[str, Any]:
    teachers = {}
    for rs in sets + self_sets:
        for p in rs.parts:
            t = p.score.get("teacher") or {}
            entry = teachers.setdefault((rs.length, str(t.get("store"))), {
                "length": rs.length,
                "store": t.get("store"),
                "model_id": t.get("model_id"),
                "model_revision": t.get("model_revision"),
                "manifest_sha256": t.get("manifest_sha256"),
                "kind": t.get("kind"),
            })
            if t.get("lossy"):  # a llama.cpp import: which kind, and how each candidate met it (fideval.score.lossy)
                entry["lossy"] = t["lossy"]
                rule = p.score.get("lossy_rule")
                entry["lossy_rules"] = sorted(set(entry.get("lossy_rules", [])) | ({rule} if rule else set()))
    first = sets[0].parts[0].score.get("teacher") or {}
    ref = {"model_id": first.get("model_id"), "model_revision": first.get("model_revision")}
    if cfg is not None:
        ref = {"model_id": cfg.model.id, "model_revision": cfg.model.revision or ref["model_revision"]}
    for t in teachers.values():
        for k in ("model_id", "model_revision"):
            if t[k] is not None and ref[k] is not None and t[k] != ref[k]:
                raise FidevalError(
                    f"teacher store {t['store']} holds {k} {t[k]}, the reference's is {ref[k]}",
                    hint="records of one report must be scored against one reference model and revision",
                )
    cand = {}
    for rs in sets:
        entry = {"scoring": []}
        if cfg is not None:
            c = next((c for c in cfg.candidates if c.name == rs.candidate), None)
            if c is not None:
                entry |= {
                    "quant": c.quant.model_dump(mode="json", exclude_none=True) if c.quant else None,
                    "checkpoint": c.checkpoint,
                }
        runs = {
            json.dumps(
                {
                    "device": p.score.get("device"),
                    "kernel": p.score.get("kernel"),
                    "tool": p.score.get("tool"),
                },
                sort_keys=True,
            )
            for p in rs.parts
        }
        info = candidate_identity(rs.candidate, [(p.folder, p.score.get("candidate_info")) for p in rs.parts])
        mine = cand.setdefault(rs.candidate, entry)  # one build on every path and length:
        mine["info"] = candidate_identity(rs.candidate, [("its other records", mine.get("info")), (rs.where, info)])
        cand[rs.candidate]["scoring"].append(
            {"path": rs.path, "length": rs.length, "runs": [json.loads(r) for r in sorted(runs)]}
        )
    dataset: dict[str, Any] = {
        "name": cfg.run if cfg is not None else "fideval-windows",
        "windows_file_sha256": None,
        "sources": None,
        "windows": [],
        "windows_without_rows": [],
    }
    if cfg is not None:
        dataset["sources"] = {
            d.name: d.source.model_dump(mode="json", exclude_none=True) for d in cfg.domains
        }
    if windows is not None:
        dataset["windows_file_sha256"] = windows["sha256"]
        dataset["sources"] = windows["sources"] or dataset["sources"]
        dataset["windows"] = [
            {"id": w, "domain": v["domain"], "token_sha256": v["token_sha256"]}
            for w, v in sorted(windows["windows"].items())
        ]
        dataset["windows_without_rows"] = sorted(set(windows["windows"]) - set(clusters.ids))
    else:
        dataset["windows"] = [
            {"id": w, "domain": d, "token_sha256": None} for w, d in zip(clusters.ids, clusters.strata)
        ]
    base = (cfg.report.base_model or cfg.model.id) if cfg is not None else ref["model_id"]
    if cfg is not None:  # running a checkpoint's own Python code is a provenance fact, not a detail
        ref = {**ref, "trust_remote_code": cfg.model.trust_remote_code, "implementation": cfg.model.implementation}
    codes = [c for c in (_reference_code(m) for m in manifests) if c is not None]
    if codes:  # the vendor's code the teacher ran (the store's teacher block): SHA-256 per file, kernels
        ref["reference_code"] = codes[0] if all(c == codes[0] for c in codes) else codes
    return {
        "reference": ref,
        "base_model": base,
        "teacher_stores": [teachers[k] for k in sorted(teachers)],
        "teacher_manifests": [
            {"file": m["file"], "sha256": m["sha256"], "meta": m["meta"]} for m in manifests
        ],
        "candidates": cand,
        "dataset": dataset,
        "tool": tool_block(),
        "config_hash": canonical_hash(cfg.as_plain()) if cfg is not None else None,
        "inputs": [
            {"candidate": rs.candidate, "path": rs.path, "length": rs.length, **p.record()}
            for rs in sets
            for p in rs.parts
        ],
        "self_check_inputs": [
            {"candidate": rs.candidate, "path": rs.path, "length": rs.length, **p.record()}
            for rs in self_sets
            for p in rs.parts
        ],
    }


def build(
    record_dirs: list[str | Path],
    *,
    self_check_dirs: list[str | Path] = (),
    noise_dirs: list[str | Path] = (),
    windows: dict[str, Any] | None = None,
    cfg: Config | None = None,
    manifests: list[dict[str, Any]] = (),
    settings: ReportConfig | None = None,
) -> Built:
    """Everything of a report in memory. Folders of one (candidate, path, length) — the workflow scores each
    domain into its own — are merged; ``self_check_dirs`` hold the teacher scored against itself and feed
    only the ``self_score_zero`` check; ``noise_dirs`` the reference scored against itself under a harmless
    change (``fideval/report/noise.py``)."""
    if not record_dirs:
        raise FidevalError("no records given", hint="pass --records DIR (repeatable)")
    rc = settings or (cfg.report if cfg is not None else ReportConfig())
    sets = merge([rs for d in record_dirs for rs in load_records(d)])
    self_sets = merge([rs for d in self_check_dirs for rs in load_records(d)])
    noise_sets = merge([rs for d in noise_dirs for rs in load_records(d)])
    manifests = list(manifests)
    clusters = Clusters.from_pairs(_window_domains(sets + noise_sets))
    counts = resample_counts(clusters, rc.resamples, rc.seed)
    domains = _domain_order(sets, windows, cfg)
    strata = np.unique(np.asarray(clusters.strata), return_inverse=True)[1]
    figs, noise = {}, {}
    for into, rs in [(figs, r) for r in sets] + [(noise, r) for r in noise_sets]:
        codes = clusters.codes(rs.cols["window_id"])
        into[rs.key] = SetFigures(
            rs,
            codes,
            clusters.size,
            counts,
            domains,
            confidence=rc.confidence,
            seed=rc.seed,
            qs=list(rc.quantiles),
            strata=strata,
        )
    sources = windows.get("document_sources") if windows is not None else None
    for rs in sets:
        figs[rs.key].result["views"] = views(rs, figs[rs.key].codes, clusters.size, counts, strata,
                                             confidence=rc.confidence, seed=rc.seed, window_sources=sources,
                                             window_ids=clusters.ids)
    gates = rc.gates.model_dump(mode="json")
    report = {
        "format": FORMAT,
        "version": VERSION,
        "settings": _settings(rc) | {"clusters": clusters.size, "domains": domains},
        "provenance": _provenance(sets, self_sets, windows, cfg, manifests, clusters),
        "results": [figs[k].result for k in sorted(figs)],
        "comparisons": comparisons(figs, counts, rc.confidence, rc.seed, strata),
        "checks": checks.run_all(sets, self_sets, windows, manifests),
        "gates": gates,
        "plots": [],
        "noise_floor": noise_floor(noise, figs),
    }
    summaries = {}
    for cand, path in sorted({(rs.candidate, rs.path) for rs in sets}):
        summaries[f"summary-{cand}-{path}.json"] = plain(
            summary([rs for rs in sets if (rs.candidate, rs.path) == (cand, path)])
        )
    return Built(report=report, summaries=summaries, figures=[figs[k] for k in sorted(figs)])


def write(built: Built, out_dir: str | Path, *, plots: bool = True) -> Path:
    """Write report.json, the summaries and (optionally) the plots into ``out_dir``; returns report.json's path."""
    from fideval.formats.model import parse
    from fideval.formats.report import Report
    from fideval.fsio import write_json

    out = Path(out_dir)
    if plots:
        from fideval.report.plots import write_plots

        built.report["plots"] = write_plots(built.figures, out)
    for name, obj in built.summaries.items():
        write_json(out / name, obj)
    path = out / "report.json"
    obj = plain(built.report)
    parse(Report, obj, str(path))  # the contract holds before anything is written (a bug here, not bad input)
    write_json(path, obj)
    return path
