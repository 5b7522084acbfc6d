"""report.json's views (micro/macro, depth buckets, top-1 flips, worst windows) and paired comparisons,
against polars computations on the records and the stats functions on the same count matrix."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
import synthetic as syn  # tests/synthetic.py

from fideval.config import ReportConfig
from fideval.report.build import build
from fideval.report.inputs import load_windows
from fideval.stats.clusters import Clusters, resample_counts
from fideval.stats.intervals import VARIANT
from fideval.stats.paired import paired_interval

DOMAINS = ["code", "math", "prose"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("views")
    windows = syn.window_ids(DOMAINS, 5)
    dirs = []
    for cand, path, eff in (("q4", "serving", 1.3), ("q4", "weights-only", 1.0), ("q8", "serving", 0.4)):
        df = syn.records_frame(cand, path, 128, 128, windows, effect=eff, seed=2)
        dirs.append(str(syn.write_records(root / f"{cand}-{path}", df, cand, path, 128)))
    wpath = syn.write_eval_windows(root, windows, 128)
    obj = json.loads(wpath.read_text())
    for w in obj["windows"]:  # the stage's own file lists each window's documents and their sources
        w["documents"] = [{"source": {"file": f"{w['domain']}.jsonl", "line": k}} for k in (3, 9)]
    wpath.write_text(json.dumps(obj))
    rep = build(dirs, windows=load_windows(root), settings=ReportConfig(resamples=600, seed=5)).report
    frames = {(d.split("/")[-1]): pl.read_parquet(f"{d}/records.parquet") for d in dirs}
    return rep, frames, windows


def _result(rep, cand, path):
    return next(r for r in rep["results"] if (r["candidate"], r["path"]) == (cand, path))


def test_micro_macro_depth_flips(setup):
    rep, frames, _ = setup
    df = frames["q4-serving"]
    v = _result(rep, "q4", "serving")["views"]
    mm = v["micro_macro"]
    assert mm["mean_kld"]["micro"]["estimate"] == pytest.approx(df["kld"].mean(), rel=1e-12)
    per_window = df.group_by("window_id").agg(pl.col("kld").mean(), pl.col("top1").mean())
    assert mm["mean_kld"]["macro"]["estimate"] == pytest.approx(per_window["kld"].mean(), rel=1e-12)
    assert mm["top1"]["macro"]["estimate"] == pytest.approx(per_window["top1"].mean(), rel=1e-12)
    for fig in (mm["mean_kld"]["micro"], mm["mean_kld"]["macro"], mm["top1"]["macro"]):
        assert fig["ci"][0] < fig["estimate"] < fig["ci"][1] and fig["cluster_bca"]["method"] == "cluster-bca"
    assert mm["mean_kld"]["macro"]["clusters"] == 15 and mm["mean_kld"]["macro"]["strata"] == 3
    # depth buckets: the same edges at every length, [0, 64) and [64, 127) at 128
    assert [(d["start"], d["end"]) for d in v["depth"]] == [(0, 64), (64, 127)]
    for d in v["depth"]:
        part = df.filter((pl.col("position") >= d["start"]) & (pl.col("position") < d["end"]))
        assert d["rows"] == part.height
        assert d["mean_kld"]["estimate"] == pytest.approx(part["kld"].mean(), rel=1e-12)
        assert d["top1_flips"]["estimate"] == pytest.approx(1 - part["top1"].mean(), rel=1e-12)
    f = v["top1_flips"]
    assert f["share"]["estimate"] == pytest.approx(1 - df["top1"].mean(), rel=1e-12)
    conf = df.filter(pl.col("p1_ref") >= 0.9)
    assert f["confident_rows"] == conf.height
    if conf.height:
        assert f["confident"]["estimate"] == pytest.approx(1 - conf["top1"].mean(), rel=1e-12)


def test_worst_windows_with_their_sources(setup):
    rep, frames, _ = setup
    df = frames["q4-serving"]
    worst = _result(rep, "q4", "serving")["views"]["worst_windows"]
    per = df.group_by("window_id").agg(pl.col("kld").mean(), pl.col("kld").max().alias("mx"),
                                       pl.col("kld").sum().alias("s"), pl.len()).sort("kld", descending=True)
    assert [w["window_id"] for w in worst] == per["window_id"].to_list()  # 15 windows: all, worst first
    top = worst[0]
    assert top["mean_kld"] == pytest.approx(per["kld"][0]) and top["max_kld"] == per["mx"][0]
    assert top["share_of_kld"] == pytest.approx(per["s"][0] / df["kld"].sum())
    dom = top["window_id"].rsplit("-", 1)[0]
    assert top["domain"] == dom and top["sources"] == [{"file": f"{dom}.jsonl", "line": 3},
                                                       {"file": f"{dom}.jsonl", "line": 9}]


def test_paired_comparisons_on_the_reports_resamples(setup):
    rep, frames, windows = setup
    cl = Clusters.from_pairs(dict(windows))
    counts = resample_counts(cl, 600, 5)
    strata = np.unique(np.asarray(cl.strata), return_inverse=True)[1]

    def sums(df):
        g = df.group_by("window_id").agg(pl.col("kld").sum().alias("s"), pl.len().alias("n"))
        d = dict(zip(g["window_id"], zip(g["s"], g["n"])))
        return (np.array([d[w][0] for w in cl.ids]), np.array([float(d[w][1]) for w in cl.ids]))

    q4, q8, q4w = sums(frames["q4-serving"]), sums(frames["q8-serving"]), sums(frames["q4-weights-only"])
    cmp = rep["comparisons"]
    diff = next(c for c in cmp["build_differences"] if (c["minuend"], c["subtrahend"]) == ("q4", "q8"))
    want = paired_interval("difference", *q4, *q8, counts, strata, confidence=0.95, seed=5, mover=True, **VARIANT)
    assert diff["ci"] == pytest.approx(want["ci"], rel=1e-12) and diff["excludes"] is True
    assert diff["estimate"] == pytest.approx(frames["q4-serving"]["kld"].mean() - frames["q8-serving"]["kld"].mean())
    ratio = next(c for c in cmp["builds"] if (c["numerator"], c["denominator"]) == ("q8", "q4"))
    want = paired_interval("ratio", *q8, *q4, counts, strata, confidence=0.95, seed=5, **VARIANT)
    assert ratio["ci"] == pytest.approx(want["ci"], rel=1e-12) and ratio["ci"][1] < 1 and ratio["excludes"]
    assert ratio["cluster_bca"]["ci"] == pytest.approx(want["cluster_bca"]["ci"], rel=1e-12)
    pr = cmp["path_ratios"][0]
    assert (pr["candidate"], pr["numerator"], pr["denominator"]) == ("q4", "serving", "weights-only")
    want = paired_interval("ratio", *q4, *q4w, counts, strata, confidence=0.95, seed=5, **VARIANT)
    assert pr["ci"] == pytest.approx(want["ci"], rel=1e-12)
    assert diff["method"] == "mover-cluster-bootstrap-t-log-symmetric-expanded" and -1 < diff["rho"] <= 1
    for c in (diff, ratio, pr):
        assert "cluster-bootstrap-t" in c["method"] and (c["resamples"], c["seed"], c["strata"]) == (600, 5, 3)


def test_confidence_buckets_are_cluster_intervals_with_wilson_beside(setup):
    """Top-1 by reference confidence: the default is the cluster bootstrap-t of logit(agreement) on the bucket's
    per-window sums and the report's window draws (the iid Wilson interval covers 0.2-0.7 on bucket-like data,
    docs/formats-report.md); Wilson stays beside it, equal to scipy's."""
    from scipy import stats

    from fideval.report.figures import CONFIDENCE_EDGES
    from fideval.stats.studentized import cluster_t_means, method_name

    rep, frames, windows = setup
    df = frames["q4-serving"]
    cl = Clusters.from_pairs(dict(windows))
    counts = resample_counts(cl, 600, 5)
    strata = np.unique(np.asarray(cl.strata), return_inverse=True)[1]
    buckets = _result(rep, "q4", "serving")["confidence_buckets"]
    assert [b["p1_low"] for b in buckets] == list(CONFIDENCE_EDGES[:-1]) and sum(b["rows"] for b in buckets) == df.height
    checked = 0
    for i, b in enumerate(buckets):
        hi = pl.col("p1_ref") <= b["p1_high"] if i == len(buckets) - 1 else pl.col("p1_ref") < b["p1_high"]
        sub = df.filter((pl.col("p1_ref") >= b["p1_low"]) & hi)
        assert b["rows"] == sub.height
        if not sub.height:
            assert b["top1"] is None
            continue
        k = int(sub["top1"].sum())
        t = b["top1"]
        assert t["estimate"] == pytest.approx(k / sub.height, rel=1e-12)
        ci = stats.binomtest(k, sub.height).proportion_ci(method="wilson")
        np.testing.assert_allclose(t["wilson"]["ci"], [ci.low, ci.high], atol=1e-12)
        if t["method"] == "degenerate":  # all or none agree: no logit scale
            continue
        g = sub.group_by("window_id").agg(pl.col("top1").cast(pl.Float64).sum().alias("y"), pl.len().alias("n"))
        d = dict(zip(g["window_id"], zip(g["y"], g["n"])))
        y = np.array([d.get(w, (0.0, 0))[0] for w in cl.ids])
        n = np.array([float(d.get(w, (0.0, 0))[1]) for w in cl.ids])
        (want,) = cluster_t_means(y, n, counts, strata, "logit", 0.95, **VARIANT)
        assert t["method"] == method_name("logit", **VARIANT) and t["clusters"] == int((n > 0).sum())
        assert t["ci"] == pytest.approx(want["ci"], rel=1e-12)
        checked += 1
    assert checked >= 3
