"""``fideval compare``: many builds scored against the same teacher windows, compared at once (comparison.json).

Inputs are reports (``fideval report``'s report.json): one run with several candidates, or several runs that
share the windows (every window's id, domain and token SHA-256) and the teacher (model, revision and store
manifest SHA-256 at the chosen length) -- anything else is refused in one line, as are one build only and a build
without a size. Each build's per-window sums are read back from the records folders its report names
(``provenance.inputs``), their SHA-256 checked against the report's, so the figures are the report's own.

Every build is resampled with the same window draws (one ``[B, G]`` count matrix, ``stats/clusters.py``), and
``stats/simultaneous.py`` turns them into simultaneous intervals of every pairwise ratio and difference of mean
KLD (max-t), the frontier in (size, mean KLD) with each build's bootstrap probability of being dominated, and the
homogeneous groups (builds no two of which the simultaneous ratio intervals separate).

A build's size is bits per weight: the quant spec's for an emulated build (score.json's ``candidate_info``
``bits_per_weight.total.bpw``); for a real file 8 x its bytes / the reference's parameter count, taken from an
emulated build of the same comparison (same teacher, so the same reference); ``--size NAME=BPW`` gives or
overrides it. Where every build is a real file and no parameter count is known, sizes are bytes.
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
from fideval.stats.clusters import Clusters, cluster_sums, resample_counts
from fideval.stats.intervals import VARIANT
from fideval.stats.simultaneous import dominated, homogeneous_groups, simultaneous_means, simultaneous_pairs
from fideval.stats.studentized import cluster_t_means, method_name

PLOT = "comparison.png"
METHODS = {
    "max-t-log-symmetric-expanded": "simultaneous: log ratio -+ q se, q the level's quantile over window resamples of "
    "max over every pair of |t*| (each pair's bootstrap-t on the shared resamples, se* its own linearised standard "
    "error); level expanded for few windows as the report's; back-transformed",
    "max-t-symmetric-expanded": "simultaneous: difference -+ q se, q the level's quantile of max over every pair of "
    "|t*| (identity scale)",
    "max-t-mean-log-symmetric-expanded": "simultaneous over the builds' own means: log mean -+ q se / mean, q the "
    "level's quantile of max over builds of |t*|",
    method_name("log", **VARIANT): "the report's default interval of one mean KLD (marginal, not simultaneous)",
    method_name("logit", **VARIANT): "the report's default interval of one top-1 agreement (marginal)",
    "degenerate": "no spread to resample: the interval is the estimate",
}


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


def _interval(est: float, ci, se: float | None, method: str) -> dict[str, Any]:
    def f(x):
        return float(x) if x is not None and np.isfinite(x) else None

    return {"estimate": f(est), "ci": [f(ci[0]), f(ci[1])], "se": f(se), "method": method}


def compare(
    builds: list[BuildData],
    *,
    resamples: int,
    seed: int,
    confidence: float,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The comparison (comparison.json's content less the inputs) and the arrays the plot draws."""
    builds = sorted(builds, key=lambda b: (b.size, b.name))
    pairs_wd: dict[str, str] = {}
    for b in builds:
        for rs in b.sets:
            for w, d in zip(rs.cols["window_id"].astype(str), rs.cols["domain"].astype(str)):
                if pairs_wd.setdefault(w, d) != d:
                    raise FidevalError(f"{rs.where}: window {w} is in domain {d} here and {pairs_wd[w]} elsewhere",
                                       hint="compare only builds scored on the same windows")
    clusters = Clusters.from_pairs(pairs_wd)
    counts = resample_counts(clusters, resamples, seed)
    strata = np.unique(np.asarray(clusters.strata), return_inverse=True)[1]
    g, k = clusters.size, len(builds)
    s, n, t1 = np.zeros((g, k)), np.zeros((g, k)), np.zeros((g, k))
    for j, b in enumerate(builds):
        for rs in b.sets:
            codes = clusters.codes(rs.cols["window_id"])
            s[:, j] += cluster_sums(codes, rs.cols["kld"], g)
            n[:, j] += cluster_sums(codes, np.ones(codes.size), g)
            t1[:, j] += cluster_sums(codes, rs.cols["top1"].astype(np.float64), g)
    return summarize([b.name for b in builds], np.array([b.size for b in builds]), s, n, t1, counts, strata,
                     confidence=confidence, reports=[b.report for b in builds],
                     size_units=[b.size_unit for b in builds], size_sources=[b.size_source for b in builds],
                     domains=sorted(set(clusters.strata)))


def summarize(
    names: list[str],
    size: np.ndarray,
    s: np.ndarray,
    n: np.ndarray,
    t1: np.ndarray | None,
    counts: np.ndarray,
    strata: np.ndarray | None,
    *,
    confidence: float,
    reports: list[str] | None = None,
    size_units: list[str] | None = None,
    size_sources: list[str] | None = None,
    domains: list[str] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every figure of comparison.json from the builds' per-window sums ``[G, K]`` (the arrays the tests and
    the bench call directly)."""
    k = len(names)
    marg = cluster_t_means(s, n, counts, strata, "log", confidence, **VARIANT)
    top = cluster_t_means(t1, n, counts, strata, "logit", confidence, **VARIANT) if t1 is not None else [None] * k
    means = simultaneous_means(s, n, counts, strata, confidence=confidence)
    fam = {kind: simultaneous_pairs(kind, s, n, counts, strata, confidence=confidence) for kind in ("ratio",
                                                                                                     "difference")}
    theta = means["estimate"]
    ratio = fam["ratio"]
    separated = {pq for p, pq in enumerate(ratio["pairs"]) if not ratio["degenerate"][p]
                 and (ratio["ci"][p, 0] > 1.0 or ratio["ci"][p, 1] < 1.0)}
    below = {}  # (j, i): build j's mean KLD certainly below build i's
    for p, (i, j) in enumerate(ratio["pairs"]):
        if ratio["degenerate"][p]:
            continue
        if ratio["ci"][p, 0] > 1.0:
            below[(j, i)] = True
        elif ratio["ci"][p, 1] < 1.0:
            below[(i, j)] = True
    dom_est = dominated(size, theta)
    star = means["theta_star"]
    ok = np.isfinite(star).all(axis=1)
    p_dom = dominated(size, star[ok]).mean(axis=0) if ok.any() else np.zeros(k)
    out_builds = []
    for i, name in enumerate(names):
        by = [names[j] for j in range(k) if j != i and size[j] <= size[i] and theta[j] <= theta[i]
              and (size[j] < size[i] or theta[j] < theta[i])]
        sure = [names[j] for j in range(k) if j != i and size[j] <= size[i] and below.get((j, i))]
        m = marg[i]
        out_builds.append({
            "name": name, "report": (reports or [""] * k)[i], "size": float(size[i]),
            "size_unit": (size_units or ["bits_per_weight"] * k)[i],
            "size_source": (size_sources or ["quant spec"] * k)[i],
            "rows": int(round(n[:, i].sum())), "clusters": int((n[:, i] > 0).sum()),
            "mean_kld": _interval(m["estimate"], m["ci"], m["se"], m["method"]),
            "mean_kld_simultaneous": _interval(theta[i], means["ci"][i], means["se"][i],
                                               "max-t-mean-log-symmetric-expanded"),
            "top1": None if top[i] is None else _interval(top[i]["estimate"], top[i]["ci"], top[i]["se"],
                                                          top[i]["method"]),
            "on_frontier": bool(not dom_est[i]), "p_dominated": float(p_dom[i]),
            "dominated_by": by, "certainly_dominated_by": sure,
        })
    pairs = []
    for p, (i, j) in enumerate(ratio["pairs"]):
        d = fam["difference"]
        rm = "degenerate" if ratio["degenerate"][p] else "max-t-log-symmetric-expanded"
        dm = "degenerate" if d["degenerate"][p] else "max-t-symmetric-expanded"
        pairs.append({"a": names[i], "b": names[j],
                      "ratio": _interval(ratio["estimate"][p], ratio["ci"][p], ratio["se"][p], rm),
                      "difference": _interval(d["estimate"][p], d["ci"][p], d["se"][p], dm),
                      "separated": (i, j) in separated})
    families = {}
    for name, f, t in (("ratio", fam["ratio"], fam["ratio"]["stats"]["t"]),
                       ("difference", fam["difference"], fam["difference"]["stats"]["t"]), ("mean", means, None)):
        members = len(f["estimate"]) if name != "mean" else k
        bonf = None
        if t is not None:
            valid = ~f["degenerate"]
            if valid.any():
                a = np.abs(t[:, valid])
                a = a[np.isfinite(a).all(axis=1)]
                bonf = float(np.max(np.quantile(a, 1.0 - (1.0 - f["level"]) / valid.sum(), axis=0)))
        q = f["quantile"]
        families[name] = {"members": members, "level": float(f["level"]),
                          "quantile": float(q) if np.isfinite(q) else None,
                          "resamples_used": int(f["resamples_used"]), "bonferroni_quantile": bonf}
    order = sorted(range(k), key=lambda i: (theta[i], names[i]))
    groups = [[names[i] for i in run] for run in homogeneous_groups(order, separated)]
    frontier = [names[i] for i in sorted(range(k), key=lambda i: (size[i], names[i])) if not dom_est[i]]
    body = {"builds": out_builds, "pairs": pairs, "families": families, "frontier": frontier, "groups": groups,
            "settings": {"confidence": confidence, "resamples": int(counts.shape[0]), "clusters": int(s.shape[0]),
                         "domains": domains or [], "methods": METHODS}}
    return body, {"names": names, "size": size, "theta": theta, "marginal": np.array([b["mean_kld"]["ci"] for b in
                                                                                      out_builds], dtype=float),
                  "simultaneous": means["ci"], "frontier": ~dom_est}


def plot(arrays: dict[str, Any], path: Path, unit: str, title: str) -> None:
    """Size against mean KLD: each build's simultaneous interval (thin, capped) over its marginal one (thick),
    the frontier as a step line through its builds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fideval.fsio import atomic_path

    x, y = arrays["size"], arrays["theta"]
    sim, mar = arrays["simultaneous"], arrays["marginal"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.errorbar(x, y, yerr=[np.maximum(y - sim[:, 0], 0), np.maximum(sim[:, 1] - y, 0)], fmt="none", ecolor="0.55",
                elinewidth=1, capsize=4, label="simultaneous interval (all builds together)")
    ax.errorbar(x, y, yerr=[np.maximum(y - np.nan_to_num(mar[:, 0], nan=y), 0),
                            np.maximum(np.nan_to_num(mar[:, 1], nan=y) - y, 0)],
                fmt="o", color="C0", elinewidth=3, label="mean KLD, marginal interval")
    f = np.flatnonzero(arrays["frontier"])
    f = f[np.argsort(x[f])]
    ax.step(x[f], y[f], where="post", color="C3", lw=1.5, label="frontier")
    for xi, yi, name in zip(x, y, arrays["names"]):
        ax.annotate(name, (xi, yi), textcoords="offset points", xytext=(6, 4), fontsize=8)
    if (y > 0).all():
        ax.set_yscale("log")
    ax.set_xlabel("bits per weight" if unit == "bits_per_weight" else "bytes")
    ax.set_ylabel("mean KLD (nats per token)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110, metadata={"Software": None})
    plt.close(fig)


def run(
    reports: list[Path],
    out: Path,
    *,
    path: str | None = None,
    length: int | None = None,
    sizes: dict[str, float] | None = None,
    resamples: int | None = None,
    seed: int | None = None,
    confidence: float | None = None,
    plots: bool = True,
    records: list[Path] | None = None,
    windows: Path | None = None,
) -> dict[str, Any]:
    """Load, compare, write comparison.json (checked against its model first) and the plot; returns the object.

    ``records`` (with ``windows``, eval-windows.json or its folder): records folders instead of reports, loaded
    and checked as ``fideval report`` does (``fideval.report.build``)."""
    from fideval.formats.comparison import FILE, Comparison
    from fideval.formats.model import dump, parse
    from fideval.fsio import write_json
    from fideval.report.schema import plain

    loaded = None
    if records:  # records folders: the report's loading and checks, in memory (its own figures on few resamples)
        from fideval.config import ReportConfig
        from fideval.report.build import build
        from fideval.report.inputs import load_windows

        if reports:
            raise FidevalError("give reports or --records, not both", hint="make a report of the records first")
        rc = ReportConfig()
        rc = rc.model_copy(update={"resamples": 100, "seed": seed if seed is not None else rc.seed})
        built = build(records, windows=load_windows(windows) if windows is not None else None, settings=rc)
        built.report["settings"]["resamples"] = resamples if resamples is not None else ReportConfig().resamples
        loaded = [(Path(records[0]), built.report)]
    builds, facts = load(reports, path=path, length=length, sizes=sizes, loaded=loaded)
    st = facts["settings"]
    b = resamples if resamples is not None else int(st["resamples"])
    sd = seed if seed is not None else int(st["seed"])
    conf = confidence if confidence is not None else float(st["confidence"])
    body, arrays = compare(builds, resamples=b, seed=sd, confidence=conf)
    settings = {"figure": "mean_kld", "path": facts["path"], "length": facts["length"], "confidence": conf,
                "resamples": b, "seed": sd, "clusters": body["settings"]["clusters"],
                "domains": body["settings"]["domains"], "windows_verified": facts["windows_verified"],
                "methods": METHODS}
    obj = {"format": Comparison.FORMAT, "version": Comparison.VERSION, "settings": settings,
           "reports": facts["reports"], "teacher": facts["teacher"], "builds": body["builds"],
           "pairs": body["pairs"], "families": body["families"], "frontier": body["frontier"],
           "groups": body["groups"], "plot": PLOT if plots else None}
    obj = dump(parse(Comparison, plain(obj, "comparison"), str(out / FILE)))
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise FidevalError(f"cannot create {out}: {e.strerror or e}", hint="choose another --out") from None
    if plots:
        plot(arrays, out / PLOT, builds[0].size_unit,
             f"{len(builds)} builds, {facts['path']}, {facts['length']} tokens, {settings['clusters']} windows")
    write_json(out / FILE, obj)
    return obj


def _g(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def lines(obj: dict[str, Any]) -> list[str]:
    """What the verb prints: one line per build, then the frontier and the groups."""
    st = obj["settings"]
    fam = obj["families"]["ratio"]
    out = [f"{len(obj['builds'])} builds, {st['path']}/{st['length']}, {st['clusters']} windows, B={st['resamples']}; "
           f"simultaneous {st['confidence']:.0%} intervals over {fam['members']} pairs (max-t q={_g(fam['quantile'])}, "
           f"Bonferroni q={_g(fam['bonferroni_quantile'])})"]
    for b in obj["builds"]:
        m, s = b["mean_kld"], b["mean_kld_simultaneous"]
        unit = "bpw" if b["size_unit"] == "bits_per_weight" else "B"
        top = f"  top-1 {b['top1']['estimate']:.4f}" if b["top1"] else ""
        fr = "frontier" if b["on_frontier"] else f"dominated by {', '.join(b['dominated_by'])}"
        ci = "[" + ", ".join("-" if v is None else f"{v:.4g}" for v in m["ci"]) + "]"
        sim = "[" + ", ".join("-" if v is None else f"{v:.4g}" for v in s["ci"]) + "]"
        out.append(f"  {b['name']}: {b['size']:.3g} {unit}  mean KLD {m['estimate']:.4g} {ci} (simultaneous "
                   f"{sim}){top}  {fr}; P(dominated) {b['p_dominated']:.2f}")
    out.append(f"frontier: {', '.join(obj['frontier'])}")
    out.append("cannot be separated: " + "; ".join("{" + ", ".join(g) + "}" for g in obj["groups"]))
    return out
