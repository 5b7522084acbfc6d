"""``fideval compare``: many builds scored against the same teacher windows, compared at once (comparison.json).

Inputs are reports (``fideval report``'s report.json): one run with several candidates, or several runs that
share the windows (every window's id, domain and token SHA-256) and the teacher (model, revision and store
manifest SHA-256 at the chosen length) -- anything else is refused in one line, as are one build only and a build
without a size. Each build's per-window sums are read back from the records folders its report names
(``provenance.inputs``), their SHA-256 checked against the report's, so the figures are the report's own.

Every build is resampled with the same window draws (one ``[B, G]`` count matrix, ``stats/clusters.py``), and
``stats/simultaneous.py`` turns them into simultaneous intervals of every pairwise ratio and difference of mean
KLD (max-t), the frontier in (size, mean KLD) with each build's bootstrap probability of being dominated, and the
homogeneous groups (builds no two of which the simultaneous ratio intervals separate); and, a family of their own,
simultaneous intervals of every pairwise top-1 agreement difference. ``--unit document`` resamples documents
instead of windows where windows share them (``compare_units``); loading and its refusals: ``compare_inputs``.

A build's size is bits per weight: the quant spec's for an emulated build (score.json's ``candidate_info``
``bits_per_weight.total.bpw``); for a real file 8 x its bytes / the reference's parameter count, taken from an
emulated build of the same comparison (same teacher, so the same reference); ``--size NAME=BPW`` gives or
overrides it. Where every build is a real file and no parameter count is known, sizes are bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fideval.errors import FidevalError
from fideval.report.compare_inputs import BuildData, choose, load, read_reports, records_of  # noqa: F401 (re-exported)
from fideval.report.compare_units import UNITS, document_units, read_documents
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
    "|t*| (identity scale; mean KLD differences and top-1 differences are two families, each its own max)",
    "max-t-mean-log-symmetric-expanded": "simultaneous over the builds' own means: log mean -+ q se / mean, q the "
    "level's quantile of max over builds of |t*|",
    method_name("log", **VARIANT): "the report's default interval of one mean KLD (marginal, not simultaneous)",
    method_name("logit", **VARIANT): "the report's default interval of one top-1 agreement (marginal)",
    "degenerate": "no spread to resample: the interval is the estimate",
}


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
    unit: str = "window",
    documents: dict[str, list[Any]] | None = None,
    where: str = "eval-windows.json",
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The comparison (comparison.json's content less the inputs) and the arrays the plot draws.

    ``unit``: what is resampled, ``window`` or ``document`` (windows sharing a document drawn together,
    ``compare_units``; ``documents``: window id -> its documents' sources, read from ``where``)."""
    builds = sorted(builds, key=lambda b: (b.size, b.name))
    pairs_wd: dict[str, str] = {}
    for b in builds:
        for rs in b.sets:
            for w, d in zip(rs.cols["window_id"].astype(str), rs.cols["domain"].astype(str)):
                if pairs_wd.setdefault(w, d) != d:
                    raise FidevalError(f"{rs.where}: window {w} is in domain {d} here and {pairs_wd[w]} elsewhere",
                                       hint="compare only builds scored on the same windows")
    if unit == "document":
        unit_of, unit_strata = document_units(pairs_wd, documents or {}, where)
    else:
        unit_of, unit_strata = {w: w for w in pairs_wd}, pairs_wd
    clusters = Clusters.from_pairs(unit_strata)
    counts = resample_counts(clusters, resamples, seed)
    strata = np.unique(np.asarray(clusters.strata), return_inverse=True)[1]
    g, k = clusters.size, len(builds)
    s, n, t1 = np.zeros((g, k)), np.zeros((g, k)), np.zeros((g, k))
    for j, b in enumerate(builds):
        for rs in b.sets:
            codes = clusters.codes([unit_of[w] for w in rs.cols["window_id"].astype(str)])
            s[:, j] += cluster_sums(codes, rs.cols["kld"], g)
            n[:, j] += cluster_sums(codes, np.ones(codes.size), g)
            t1[:, j] += cluster_sums(codes, rs.cols["top1"].astype(np.float64), g)
    body, arrays = summarize([b.name for b in builds], np.array([b.size for b in builds]), s, n, t1, counts, strata,
                             confidence=confidence, reports=[b.report for b in builds],
                             size_units=[b.size_unit for b in builds], size_sources=[b.size_source for b in builds],
                             domains=sorted(set(pairs_wd.values())))
    windows_of = {}
    for b in builds:
        windows_of[b.name] = len({w for rs in b.sets for w in rs.cols["window_id"].astype(str)})
    for entry in body["builds"]:
        entry["clusters"] = windows_of[entry["name"]]  # windows with rows, whatever the unit
    body["settings"] |= {"clusters": len(pairs_wd), "unit": unit, "units": g}
    return body, arrays


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
    if t1 is not None:  # top-1 agreement's pairwise differences: their own family, on the same draws
        fam["top1_difference"] = simultaneous_pairs("difference", t1, n, counts, strata, confidence=confidence)
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
        tf = fam.get("top1_difference")
        top1 = None if tf is None else _interval(tf["estimate"][p], tf["ci"][p], tf["se"][p], "degenerate" if
                                                 tf["degenerate"][p] else "max-t-symmetric-expanded")
        pairs.append({"a": names[i], "b": names[j],
                      "ratio": _interval(ratio["estimate"][p], ratio["ci"][p], ratio["se"][p], rm),
                      "difference": _interval(d["estimate"][p], d["ci"][p], d["se"][p], dm),
                      "top1_difference": top1,
                      "separated": (i, j) in separated,
                      "top1_separated": top1 is not None and top1["method"] != "degenerate" and
                      (top1["ci"][0] > 0 or top1["ci"][1] < 0)})
    families = {}
    for name, f, t in [(kind, fam[kind], fam[kind]["stats"]["t"]) for kind in fam] + [("mean", means, None)]:
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
    the frontier as a step line through its builds, dominated builds hollow."""
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
    off = ~np.asarray(arrays["frontier"], dtype=bool)
    if off.any():  # dominated builds: hollow
        ax.scatter(x[off], y[off], s=36, facecolors="white", edgecolors="C0", zorder=3, label="dominated build")
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
    unit: str = "window",
) -> dict[str, Any]:
    """Load, compare, write comparison.json (checked against its model first) and the plot; returns the object.

    ``records`` (with ``windows``, eval-windows.json or its folder): records folders instead of reports, loaded
    and checked as ``fideval report`` does (``fideval.report.build``). ``unit``: ``window`` or ``document``
    (``compare_units``; the documents read from ``windows``, which must be the reports' windows file)."""
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
    if unit not in UNITS:
        raise FidevalError(f"--unit {unit!r} is not one of {', '.join(UNITS)}", hint="--unit window or --unit document")
    loaded = loaded if loaded is not None else read_reports(reports)
    documents, where = read_documents(windows, loaded) if unit == "document" else (None, "")
    builds, facts = load(reports, path=path, length=length, sizes=sizes, loaded=loaded)
    st = facts["settings"]
    b = resamples if resamples is not None else int(st["resamples"])
    sd = seed if seed is not None else int(st["seed"])
    conf = confidence if confidence is not None else float(st["confidence"])
    body, arrays = compare(builds, resamples=b, seed=sd, confidence=conf, unit=unit, documents=documents,
                           where=where)
    settings = {"figure": "mean_kld", "path": facts["path"], "length": facts["length"], "confidence": conf,
                "resamples": b, "seed": sd, "clusters": body["settings"]["clusters"], "unit": unit,
                "units": body["settings"]["units"],
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
             f"{len(builds)} builds, {facts['path']}, {facts['length']} tokens, {settings['clusters']} windows"
             + (f" in {settings['units']} documents" if unit == "document" else ""))
    write_json(out / FILE, obj)
    return obj


def _g(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def lines(obj: dict[str, Any]) -> list[str]:
    """What the verb prints: one line per build, then the frontier and the groups."""
    st = obj["settings"]
    fam = obj["families"]["ratio"]
    unit = f" in {st['units']} documents (the resampled unit)" if st.get("unit") == "document" else ""
    out = [f"{len(obj['builds'])} builds, {st['path']}/{st['length']}, {st['clusters']} windows{unit}, "
           f"B={st['resamples']}; "
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
    top = [p for p in obj["pairs"] if p.get("top1_difference")]
    if top:
        sep = [f"{p['a']}-{p['b']} {p['top1_difference']['estimate']:+.4f}" for p in top if p["top1_separated"]]
        out.append("top-1 agreement differs (simultaneous): " + (", ".join(sep) if sep else "no pair"))
    return out
