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
from fideval.report import checks, route_section
from fideval.report.classes import class_report
from fideval.report.comparisons import comparisons
from fideval.report.coverage import coverage, refuse_partial, token_links
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
        info = candidate_identity(rs.candidate, [(p.folder, route_section.build_info(p.score.get("candidate_info")))
                                                 for p in rs.parts])
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
    allow_partial: bool = False,
) -> Built:
    """Everything of a report in memory. Folders of one (candidate, path, length) — the workflow scores each
    domain into its own — are merged; ``self_check_dirs`` hold the teacher scored against itself and feed
    only the ``self_score_zero`` check; ``noise_dirs`` the reference scored against itself under a harmless
    change (``fideval/report/noise.py``). Records that do not cover what the config and the windows ask for are
    refused unless ``allow_partial`` (fideval.report.coverage); records scored on other tokens than the windows'
    are refused always."""
    if not record_dirs:
        raise FidevalError("no records given", hint="pass --records DIR (repeatable)")
    rc = settings or (cfg.report if cfg is not None else ReportConfig())
    loaded = [[rs for d in dirs for rs in load_records(d)] for dirs in (record_dirs, self_check_dirs, noise_dirs)]
    links = token_links([rs for group in loaded for rs in group], windows)  # per folder: before they are merged
    every, self_sets, noise_sets = (merge(group) for group in loaded)
    sets, forced_sets = route_section.split(every)  # route-controlled runs: checked, but no build's results
    if not sets:
        raise FidevalError(f"only route-controlled records given ({forced_sets[0].where})",
                           hint="pass the free run's records too (--records of path P beside P+teacher-routes)")
    every = sets + forced_sets
    manifests = list(manifests)
    cov = coverage(every, cfg, windows)
    if not allow_partial:
        refuse_partial(cov)
    clusters = Clusters.from_pairs(_window_domains(every + noise_sets))
    counts = resample_counts(clusters, rc.resamples, rc.seed)
    domains = _domain_order(every, windows, cfg)
    strata = np.unique(np.asarray(clusters.strata), return_inverse=True)[1]
    figs, noise, forced = {}, {}, {}
    for into, rs in [(figs, r) for r in sets] + [(noise, r) for r in noise_sets] + [(forced, r) for r in forced_sets]:
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
        "provenance": _provenance(every, self_sets, windows, cfg, manifests, clusters),
        "results": [figs[k].result for k in sorted(figs)],
        "comparisons": comparisons(figs, counts, rc.confidence, rc.seed, strata),
        "checks": checks.run_all(every, self_sets, windows, manifests, links) + [checks.coverage_check(cov)],
        "coverage": cov,
        "gates": gates,
        "plots": [],
        "noise_floor": noise_floor(noise, figs),
        "token_classes": class_report(sets, figs, windows),  # fideval/report/classes.py
    }
    # routes recorded, or route-controlled runs given (fideval/report/route_section.py); else null
    report["routing"] = route_section.routing_block(every, figs, forced, clusters=clusters, counts=counts,
                                                    strata=strata, confidence=rc.confidence, seed=rc.seed,
                                                    manifests=manifests)
    summaries = {}
    for cand, path in sorted({(rs.candidate, rs.path) for rs in sets}):
        summaries[f"summary-{cand}-{path}.json"] = plain(
            summary([rs for rs in sets if (rs.candidate, rs.path) == (cand, path)])
        )
    return Built(report=report, summaries=summaries, figures=[figs[k] for k in sorted(figs)])


def write(built: Built, out_dir: str | Path, *, plots: bool = True) -> Path:
    """Write report.json, the summaries and (optionally) the plots into ``out_dir`` as one folder; returns
    report.json's path.

    A report is written as a whole, so a folder never mixes two runs: everything is staged in a hidden folder
    beside ``out_dir`` (``.NAME.*.report-staging``, on the same file system), then swapped in: the old folder
    renamed aside (``.NAME.*.report-old``), the new one renamed in, the old one removed. A failure before the swap
    (a plot that cannot be drawn, a full disk, Ctrl-C) removes the staging folder and leaves ``out_dir`` as it was,
    byte for byte; a kill between the two renames leaves the old folder aside, and the next write puts it back
    before anything else.

    What the report writes (report.json, summary-*.json, plots/) is replaced as a whole: no summary or plot of an
    earlier report survives beside the new report.json. Every other entry of ``out_dir`` is kept -- the model card
    README.md and results.html of ``fideval card``, check.txt of ``fideval check`` (the workflow writes them into
    the report folder: workflow/rules/report.smk), anything of the user's -- hard-linked into the staged folder
    (copied where the file system has no hard links). They are the previous run's until their own verbs run
    again (Snakemake reruns card and check after report)."""
    import os

    from fideval.formats.model import parse
    from fideval.formats.report import Report
    from fideval.fsio import write_json

    out = Path(out_dir)
    real = Path(os.path.realpath(out))  # a linked report folder: its target is replaced, the link kept
    stage, old = _staging(out, real)
    try:
        if plots:
            from fideval.report.class_plots import write_class_plots
            from fideval.report.plots import write_plots
            from fideval.report.route_section import write_routing_plots

            built.report["plots"] = (write_plots(built.figures, stage) + write_class_plots(built.report, stage)
                                     + write_routing_plots(built.report, stage))
        for name, obj in built.summaries.items():
            write_json(stage / name, obj)
        obj = plain(built.report)
        parse(Report, obj, str(out / "report.json"))  # the contract holds before anything is written (a bug here, not bad input)
        write_json(stage / "report.json", obj)
        if old:
            for entry in sorted(real.iterdir()):
                if not _report_owns(entry.name):
                    _carry(entry, stage / entry.name)
        _swap(stage, real, old)
    except FidevalError as e:  # a write refused or the disk full: named by the report folder, not the staging one
        _discard(stage)
        kept = "the previous report folder is as it was" if old else None
        raise FidevalError(e.message.replace(str(stage), str(out)),
                           hint="; ".join(h for h in (e.hint, kept) if h) or None) from None
    except OSError as e:
        _discard(stage)
        raise FidevalError(f"cannot replace the report folder {out}: {e.strerror or e}",
                           hint="check its permissions, or choose another --out; the previous report folder is as it was"
                           if old else "check the permissions of its parent folder, or choose another --out") from None
    except BaseException:
        _discard(stage)
        raise
    return out / "report.json"


# what ``write`` replaces as a whole in a report folder; every other entry is the card's, check's or the user's
REPORT_FILES = ("report.json",)
REPORT_GLOBS = ("summary-*.json",)
REPORT_DIRS = ("plots",)


def _report_owns(name: str) -> bool:
    import fnmatch

    return name in REPORT_FILES or name in REPORT_DIRS or any(fnmatch.fnmatch(name, g) for g in REPORT_GLOBS)


def _staging(out: Path, real: Path) -> tuple[Path, bool]:
    """A fresh staging folder beside ``real`` (``out`` with links resolved), after putting back a folder a killed
    swap left aside and removing what killed writes left; whether a previous report folder is there."""
    import os
    import shutil
    import tempfile

    parent = real.parent
    if real.exists() and not real.is_dir():
        raise FidevalError(f"--out {out} exists and is not a folder", hint="choose a folder for the report")
    cwd = Path.cwd().resolve()
    if real == cwd or real in cwd.parents:
        raise FidevalError(f"--out {out} holds the working directory, and a report folder is replaced as a whole",
                           hint="write the report to a folder of its own, e.g. reports/RUN")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        aside = sorted(parent.glob(f".{real.name}.*.report-old"))
        if aside and not real.exists():
            os.rename(aside.pop(), real)  # a kill between the swap's two renames: the previous folder, put back
        for left in aside + sorted(parent.glob(f".{real.name}.*.report-staging")):
            shutil.rmtree(left, ignore_errors=True)
        stage = Path(tempfile.mkdtemp(prefix=f".{real.name}.", suffix=".report-staging", dir=parent))
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(stage, (real.stat().st_mode & 0o7777) if real.is_dir() else (0o777 & ~mask))  # mkdtemp's is 0700
    except OSError as e:
        raise FidevalError(f"cannot write in {parent}: {e.strerror or e}",
                           hint="check permissions or choose another output folder") from None
    return stage, real.is_dir()


def _carry(src: Path, dst: Path) -> None:
    """``src`` (a file, a link or a folder, recursively) into the staged folder: hard links, else copies."""
    import os
    import shutil

    if src.is_symlink():
        os.symlink(os.readlink(src), dst)
    elif src.is_dir():
        dst.mkdir()
        for child in sorted(src.iterdir()):
            _carry(child, dst / child.name)
        shutil.copystat(src, dst)
    else:
        try:
            os.link(src, dst)
        except OSError:  # no hard links here (some network and FUSE file systems), or not ours to link
            shutil.copy2(src, dst)


def _swap(stage: Path, out: Path, old: bool) -> None:
    """The staged folder in place of ``out``: the old one renamed aside, the new one in, the old one removed; if
    the second rename fails the old folder is renamed back."""
    import contextlib
    import os
    import secrets
    import shutil

    aside = stage.parent / f".{out.name}.{secrets.token_hex(4)}.report-old"
    if old:
        try:
            os.rename(out, aside)
            os.rename(stage, out)
        except BaseException:
            if aside.exists() and not out.exists():
                os.rename(aside, out)
            raise
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.rename(stage, out)
    with contextlib.suppress(OSError):  # the renames themselves on disk (best effort: the report is in place)
        fd = os.open(stage.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _discard(stage: Path) -> None:
    import shutil

    shutil.rmtree(stage, ignore_errors=True)
