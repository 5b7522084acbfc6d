"""`fideval report` / `check` on synthetic records: values against independent computations, determinism,
the integrity checks and the one-line errors for bad inputs."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import polars as pl
import pytest
import synthetic as syn  # tests/synthetic.py
from cli_runner import run_fideval
from scipy import stats

DOMAINS = ["code", "math", "prose"]


def make_records(root, windows, *, sets=None, seed=0, **kw):
    sets = sets or [
        ("q4", "serving", 256, 1.2),
        ("q4", "weights-only", 256, 1.0),
        ("q8", "serving", 256, 0.3),
        ("q4", "serving", 64, 1.3),
    ]
    dirs = []
    for cand, path, length, eff in sets:
        df = syn.records_frame(cand, path, length, 256, windows, effect=eff, seed=seed)
        dirs.append(
            str(syn.write_records(root / f"rec-{cand}-{path}-{length}", df, cand, path, length, **kw))
        )
    return dirs


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    root = tmp_path_factory.mktemp("rep")
    windows = syn.window_ids(DOMAINS, 4)
    dirs = make_records(root, windows)
    syn.write_eval_windows(root, windows, 256)
    return root, dirs


def records_args(dirs):
    return [a for d in dirs for a in ("--records", d)]


@pytest.fixture(scope="module")
def report(demo, tmp_path_factory):
    root, dirs = demo
    out = tmp_path_factory.mktemp("out")
    from fideval.config import ReportConfig
    from fideval.report.build import build, write
    from fideval.report.inputs import load_windows

    path = write(build(dirs, windows=load_windows(root), settings=ReportConfig(resamples=1000, seed=3)), out)
    return json.loads(path.read_text()), out


def _frame(dirs, i):
    return pl.read_parquet(f"{dirs[i]}/records.parquet")


def test_figures_match_independent_computation(demo, report):
    root, dirs = demo
    rep, _ = report
    assert rep["format"] == "fideval.report" and rep["version"] == 4
    by_key = {(r["candidate"], r["path"], r["length"]): r for r in rep["results"]}
    df = _frame(dirs, 0)  # q4 serving 256
    r = by_key[("q4", "serving", 256)]
    o = r["overall"]
    assert o["mean_kld"]["estimate"] == pytest.approx(df["kld"].mean(), rel=1e-12)
    assert r["rows"] == df.height and r["clusters"] == 12 and o["mean_kld"]["resamples"] == 1000
    assert (
        o["mean_kld"]["seed"] == 3
        and o["mean_kld"]["ci"][0] < o["mean_kld"]["estimate"] < o["mean_kld"]["ci"][1]
    )
    k = int(df["top1"].sum())
    ci = stats.binomtest(k, df.height).proportion_ci(method="wilson")
    np.testing.assert_allclose(o["top1"]["wilson"]["ci"], [ci.low, ci.high], atol=1e-12)
    assert [q["estimate"] for q in o["kld_quantiles"]] == list(
        np.quantile(df["kld"].to_numpy(), [0.5, 0.9, 0.99, 0.999])
    )
    dom = df.group_by("domain").agg(pl.col("kld").mean()).sort("domain")
    for d, m in zip(dom["domain"], dom["kld"]):
        assert r["domains"][d]["mean_kld"]["estimate"] == pytest.approx(m, rel=1e-12)
    assert rep["coverage"]["complete"] is True and rep["provenance"]["dataset"]["windows_without_rows"] == []
    pos = df.filter(pl.col("position") < 16)["kld"].mean()
    assert r["positions"][0]["start"] == 0 and r["positions"][0]["mean_kld"]["estimate"] == pytest.approx(
        pos, rel=1e-12
    )
    assert r["positions"][-1]["end"] == 255
    # comparisons: ratio of builds, path difference, length ratio
    q8 = _frame(dirs, 2)["kld"].mean()
    ratio = next(
        c for c in rep["comparisons"]["builds"] if c["numerator"] == "q4" and c["denominator"] == "q8"
    )
    assert ratio["estimate"] == pytest.approx(df["kld"].mean() / q8, rel=1e-12)
    assert ratio["ci"][0] < ratio["estimate"] < ratio["ci"][1]
    diff = rep["comparisons"]["paths"][0]
    assert diff["estimate"] == pytest.approx(df["kld"].mean() - _frame(dirs, 1)["kld"].mean(), rel=1e-12)
    ln = rep["comparisons"]["lengths"][0]
    assert (ln["numerator"], ln["denominator"]) == (64, 256)
    assert ln["estimate"] == pytest.approx(_frame(dirs, 3)["kld"].mean() / df["kld"].mean(), rel=1e-12)
    sha = {w["id"]: w["token_sha256"] for w in rep["provenance"]["dataset"]["windows"]}
    assert len(sha) == 12 and all(len(s) == 64 for s in sha.values())


def test_report_interval_equals_scipy_for_one_domain(tmp_path):
    windows = syn.window_ids(["code"], 40)
    dirs = make_records(tmp_path, windows, sets=[("q4", "serving", 128, 1.0)])
    from fideval.config import ReportConfig
    from fideval.report.build import build

    rep = build(dirs, settings=ReportConfig(resamples=2000, seed=11)).report
    df = (
        _frame(dirs, 0)
        .group_by("window_id")
        .agg(pl.col("kld").sum().alias("s"), pl.len().alias("n"))
        .sort("window_id")
    )
    s, n = df["s"].to_numpy(), df["n"].to_numpy().astype(float)
    ref = stats.bootstrap(
        (s, n),
        lambda a, b, axis=-1: a.sum(axis) / b.sum(axis),
        paired=True,
        vectorized=True,
        method="BCa",
        n_resamples=2000,
        rng=np.random.default_rng(11),
    ).confidence_interval
    mean = rep["results"][0]["overall"]["mean_kld"]
    # the seed's interval, printed beside the default, is scipy's BCa on the same window draws
    np.testing.assert_allclose(mean["cluster_bca"]["ci"], [ref.low, ref.high], rtol=1e-12)
    assert mean["cluster_bca"]["method"] == "cluster-bca"
    # the default: the cluster bootstrap-t of log(mean KLD) on the same draws (tests/test_stats_studentized.py)
    from fideval.stats.clusters import resample_counts
    from fideval.stats.intervals import VARIANT
    from fideval.stats.studentized import cluster_t_means, method_name

    (bt,) = cluster_t_means(s, n, resample_counts(len(s), 2000, 11), None, "log", **VARIANT)
    assert mean["method"] == method_name("log", **VARIANT) and mean["scale"] == "log"
    np.testing.assert_allclose(mean["ci"], bt["ci"], rtol=1e-12)


def _interval_blocks(obj, where="report"):
    """Every block of report.json holding an interval ('ci'), with where it is."""
    if isinstance(obj, dict):
        if "ci" in obj:
            yield where, obj
        for k, v in obj.items():
            yield from _interval_blocks(v, f"{where}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _interval_blocks(v, f"{where}[{i}]")


def test_every_interval_says_how_it_was_made(report):
    rep, _ = report
    blocks = list(_interval_blocks(rep["results"]) ) + list(_interval_blocks(rep["comparisons"]))
    assert len(blocks) > 100
    for where, b in blocks:
        missing = {"method", "unit", "confidence", "resamples", "seed", "strata", "clusters"} - set(b)
        assert not missing, (where, missing)
        if b["unit"] == "window" and b["method"] not in ("wilson-design-effect", "pooled-t-log"):  # closed forms
            assert all(b.get(k) is not None for k in ("resamples", "seed", "strata", "clusters")), where
    o = rep["results"][0]["overall"]
    from fideval.stats.intervals import VARIANT
    from fideval.stats.studentized import method_name

    assert o["mean_kld"]["method"] == method_name("log", **VARIANT) and o["mean_kld"]["strata"] == 3
    assert o["mean_kld"]["cluster_bca"]["method"] == "cluster-bca"
    assert o["mean_delta_nll"]["method"] == method_name("identity", **VARIANT)
    t = o["top1"]
    assert t["method"] == method_name("logit", **VARIANT) and t["wilson"]["unit"] == "token"
    assert t["wilson"]["method"] == "wilson" and t["wilson_deff"]["unit"] == "window"
    # the iid Wilson interval is the narrowest: it ignores that a window's tokens agree together
    assert t["wilson"]["ci"][1] - t["wilson"]["ci"][0] < t["ci"][1] - t["ci"][0]
    st = rep["settings"]
    assert st["strata"] == "domain" and st["intervals"]["default"]["proportion (top-k agreement)"] == t["method"]
    assert all(m in st["methods"] for _, b in _interval_blocks(rep["results"]) for m in [b["method"]])


def test_summaries(demo, report):
    _, dirs = demo
    rep, out = report
    summ = json.loads((out / "summary-q4-serving.json").read_text())
    assert summ["format"] == "fideval.summary" and summ["version"] == 1
    df = pl.concat([_frame(dirs, 0), _frame(dirs, 3)])
    per = df.group_by("length", "window_id").agg(pl.col("kld").mean(), pl.col("top1").mean(), pl.len())
    got = {(w["length"], w["window_id"]): w for w in summ["windows"]}
    assert len(got) == per.height == 24
    for row in per.iter_rows(named=True):
        w = got[(row["length"], row["window_id"])]
        assert (
            w["rows"] == row["len"]
            and w["mean_kld"] == pytest.approx(row["kld"])
            and w["top1"] == pytest.approx(row["top1"])
        )
    assert len(summ["sequences"]) == 12 + 48 and {s["window_id"] for s in summ["sequences"]} == {
        w for w, _ in syn.window_ids(DOMAINS, 4)
    }


def test_deterministic_bytes(demo, tmp_path):
    root, dirs = demo
    hashes = []
    for k in range(2):
        out = tmp_path / f"o{k}"
        code, _, err = run_fideval("report", *records_args(dirs), "--windows", str(root), "--out", str(out), "--resamples", "300")
        assert code == 0, err
        hashes.append({p.relative_to(out).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                       for p in sorted(out.rglob("*")) if p.is_file()})
    assert hashes[0] == hashes[1]
    assert "report.json" in hashes[0] and sum(n.endswith(".png") for n in hashes[0]) == 12


def test_the_files_a_rule_declares_give_the_folders_report(demo, tmp_path):
    """--records/--self-check as records.parquet and --windows as eval-windows.json (the workflow's declared
    inputs) read the same data as their folders: the same report.json, byte for byte."""
    root, dirs = demo
    outs = {}
    for form, rec, win in (("folders", dirs, root), ("files", [f"{d}/records.parquet" for d in dirs], root / "eval-windows.json")):
        outs[form] = tmp_path / form
        code, _, err = run_fideval("report", *records_args(rec[:3]), "--self-check", rec[3], "--windows", str(win),
                                   "--out", str(outs[form]), "--resamples", "200", "--no-plots")
        assert code == 0, err
    rep = json.loads((outs["files"] / "report.json").read_text())
    assert {c["name"]: c["status"] for c in rep["checks"]}["windows_match"] == "pass"
    assert len(rep["results"]) == 3
    assert (outs["files"] / "report.json").read_bytes() == (outs["folders"] / "report.json").read_bytes()


def test_checks_and_gates(tmp_path):
    windows = syn.window_ids(DOMAINS, 4)
    df = syn.records_frame("q4", "serving", 128, 128, windows, seed=1)
    df = df.with_columns(
        pl.when(pl.col("window_id") == "math-001")
        .then(True)
        .otherwise(pl.col("ref_correct"))
        .alias("ref_correct")
    )
    d1 = syn.write_records(tmp_path / "a", df, "q4", "serving", 128, cpu_diff=5e-12)
    ref = syn.records_frame("teacher", "store", 128, 128, windows, seed=1)
    d2 = syn.write_records(
        tmp_path / "b", ref, "teacher", "store", 128, self_check={"max_kld": 1e-9, "top1": 1.0}
    )

    def zero(length):
        f = syn.records_frame("teacher-self", "store", length, 128, windows, seed=1)
        return f.with_columns(pl.lit(0.0).alias("kld"), pl.lit(True).alias("top1"))

    d3 = syn.write_records(tmp_path / "self-ok", zero(128), "teacher-self", "store", 128)
    d4 = syn.write_records(
        tmp_path / "self-bad",
        zero(64).with_columns(pl.when(pl.col("position") == 3).then(1e-300).otherwise(0.0).alias("kld")),
        "teacher-self",
        "store",
        64,
    )
    man = tmp_path / "manifest.json"
    man.write_text(
        json.dumps(
            {"format": "fideval.store", "version": 1, "meta": {"canary": {"identical": False}}, "shards": {}}
        )
    )
    out = tmp_path / "out"
    code, _, err = run_fideval("report", "--records", d1, "--records", d2, "--teacher-manifest", man, "--self-check", d3,
                               "--self-check", d4, "--out", out, "--resamples", "200", "--no-plots")
    assert code == 0, err
    rep = json.loads((out / "report.json").read_text())
    status = {c["name"]: c["status"] for c in rep["checks"]}
    assert status == {
        "self_score_zero": "fail",
        "canary_identical": "fail",
        "teacher_top1_range": "fail",
        "cpu_check": "fail",
        "nonfinite_rows": "pass",
        "windows_match": "not_run",
        "coverage": "not_run",  # no config and no windows: nothing was asked
    }
    top = next(c for c in rep["checks"] if c["name"] == "teacher_top1_range")
    assert "math-001@128: 1.000" in top["detail"]
    self_score = next(c for c in rep["checks"] if c["name"] == "self_score_zero")
    assert "teacher-self/store/64 records: max KLD 1e-300" in self_score["detail"]
    assert (
        "teacher/store/128" in self_score["detail"] and "teacher-self/store/128" not in self_score["detail"]
    )
    assert {r["candidate"] for r in rep["results"]} == {"q4", "teacher"}  # self-check records are not results
    code, _, err = run_fideval("check", str(out / "report.json"), "--max-mean-kld", "0.001", "--min-top1", "0.999")
    lines = err.strip().splitlines()
    # 4 failed checks, 2 not run (windows_match, coverage), then the gates' lines
    assert code == 1 and len(lines) == 4 + 2 + 2 + 2 and all(line.startswith("FAIL ") for line in lines)
    assert "FAIL check windows_match not run: no eval-windows.json given" in lines[4]
    assert any("gate mean_kld_max failed: q4/serving/128" in line for line in lines)
    code, _, _ = run_fideval("check", str(out / "report.json"), "--out", str(tmp_path / "check.txt"))
    assert code == 1 and (tmp_path / "check.txt").read_text().count("FAIL check") == 4 + 2


def test_check_passes_and_fails_on_gates(report):
    rep, out = report
    not_run = sorted(c["name"] for c in rep["checks"] if c["status"] == "not_run")
    assert not_run == ["canary_identical", "self_score_zero"]  # no self-check records, no teacher manifest
    code, _, err = run_fideval("check", str(out))
    assert code == 1 and err.count("FAIL check") == 2 and "--allow-not-run canary_identical" in err
    allow = [a for n in not_run for a in ("--allow-not-run", n)]
    code, stdout, _ = run_fideval("check", str(out), *allow)
    assert code == 0 and "ok (5 checks passed, 2 not run (allowed)" in stdout
    code, _, err = run_fideval("check", str(out), "--allow-not-run", "self_score_zero")
    assert code == 1 and err.count("FAIL") == 1 and "check canary_identical not run" in err
    code, _, err = run_fideval("check", str(out), "--allow-not-run", "canary")
    assert code == 2 and "'canary' is not a check of this report" in err and err.count("\n") == 1
    worst = max(r["overall"]["mean_kld"]["estimate"] for r in rep["results"])
    code, _, _ = run_fideval("check", str(out), "--max-mean-kld", f"{worst * 1.0001}", "--allow-not-run", "all")
    assert code == 0
    code, _, err = run_fideval("check", str(out), "--max-mean-kld", f"{worst * 0.9999}", "--allow-not-run", "all")
    assert code == 1 and err.count("FAIL gate mean_kld_max") == 1


def test_check_gates_on_interval_bounds(report):
    """A bound between a set's estimate and its upper bound passes the point gate and fails the bound gate."""
    rep, out = report
    sets = sorted(rep["results"], key=lambda r: r["overall"]["mean_kld"]["ci"][1])
    top = sets[-1]["overall"]["mean_kld"]
    bound = (top["estimate"] + top["ci"][1]) / 2
    assert all(r["overall"]["mean_kld"]["estimate"] < bound for r in rep["results"])
    over = [r for r in rep["results"] if r["overall"]["mean_kld"]["ci"][1] > bound]
    code, _, err = run_fideval("check", str(out), "--max-mean-kld", f"{bound!r}", "--allow-not-run", "all")
    assert code == 0, err
    code, _, err = run_fideval("check", str(out), "--max-mean-kld-upper", f"{bound!r}", "--allow-not-run", "all")
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == len(over) >= 1
    r = sets[-1]
    assert (f"FAIL gate mean_kld_upper_max failed: {r['candidate']}/{r['path']}/{r['length']} mean KLD 95 % upper "
            f"bound {top['ci'][1]:.6g} > {bound:g}") in err
    code, _, _ = run_fideval("check", str(out), "--max-mean-kld-upper", f"{top['ci'][1] * 1.0001!r}", "--allow-not-run", "all")
    assert code == 0
    # the interval the card prints: the report's default (version 2), Wilson in a version 1 report
    low = min((r["overall"]["top1"] if "ci" in r["overall"]["top1"] else r["overall"]["top1"]["wilson"])["ci"][0]
              for r in rep["results"])
    code, _, err = run_fideval("check", str(out), "--min-top1-lower", f"{low * 1.0001!r}", "--allow-not-run", "all")
    assert code == 1 and err.count("FAIL gate top1_lower_min failed") == 1
    code, _, _ = run_fideval("check", str(out), "--min-top1-lower", f"{low * 0.9999!r}", "--allow-not-run", "all")
    assert code == 0


def test_config_gates_settings_and_provenance(demo, tmp_path):
    root, dirs = demo
    cfg = tmp_path / "c.yaml"
    text = (
        "run: unit\nmodel: {path: m, id: fideval/demo-moe, revision: '" + "0" * 40 + "'}\n"
        "domains:\n"
        + "".join(
            f"  - {{name: {d}, source: {{type: local, path: x.jsonl, text_field: t}}}}\n" for d in DOMAINS
        )
        + "candidates:\n  - {name: q4, quant: {routed_experts: {format: mxfp4}}}\n"
        "windows: {window_tokens: 256, cut_tokens: 64, windows_per_domain: 4}\nteacher: {lengths: [windows]}\n"
        "report: {resamples: 200, seed: 5, gates: {top1_min: 0.9999}}\n"
    )
    cfg.write_text(text)
    out = tmp_path / "o"
    code, _, err = run_fideval("report", *records_args(dirs[:2]), "--config", str(cfg), "--out", str(out), "--no-plots")
    assert code == 0, err
    rep = json.loads((out / "report.json").read_text())
    assert rep["settings"]["resamples"] == 200 and rep["settings"]["seed"] == 5
    assert rep["provenance"]["reference"] == {"model_id": "fideval/demo-moe", "model_revision": "0" * 40,
                                             "trust_remote_code": False, "implementation": "transformers"}
    assert len(rep["provenance"]["config_hash"]) == 64
    assert rep["provenance"]["candidates"]["q4"]["quant"] == {"routed_experts": {"format": "mxfp4"}}
    code, _, err = run_fideval("check", str(out))
    assert code == 1 and err.count("gate top1_min failed") == 2
    cfg.write_text(text.replace("fideval/demo-moe", "org/other"))
    code, _, err = run_fideval("report", *records_args(dirs[:2]), "--config", str(cfg), "--out", str(out), "--no-plots")
    assert code == 2 and "holds model_id fideval/demo-moe, the reference's is org/other" in err


def test_bad_inputs_are_one_line(demo, tmp_path):
    _, dirs = demo
    df = _frame(dirs, 0)
    bad = df.with_columns(
        pl.when(pl.col("position") == 7).then(float("nan")).otherwise(pl.col("kld")).alias("kld")
    )
    d = syn.write_records(tmp_path / "nan", bad, "q4", "serving", 256)
    code, _, err = run_fideval("report", "--records", str(d), "--out", str(tmp_path / "o"))
    assert code == 2 and err.count("\n") == 1
    assert "nan/records.parquet: column 'kld' has 12 NaN/infinite values" in err

    d = syn.write_records(tmp_path / "miss", df.drop("p1_ref"), "q4", "serving", 256)
    code, _, err = run_fideval("report", "--records", str(d), "--out", str(tmp_path / "o"))
    assert code == 2 and "missing column 'p1_ref'" in err and err.count("\n") == 1

    d = syn.write_records(tmp_path / "ver", df, "q4", "serving", 256)
    sc = json.loads((d / "score.json").read_text())
    (d / "score.json").write_text(json.dumps(sc | {"version": 2}))
    code, _, err = run_fideval("report", "--records", str(d), "--out", str(tmp_path / "o"))
    assert code == 2 and "score format version 2" in err

    code, _, err = run_fideval("report", "--records", dirs[0], "--records", dirs[0], "--out", str(tmp_path / "o"))
    assert code == 2 and "sequence code-000 of q4/serving/256 is in both" in err


@pytest.mark.parametrize("version,word", [(0, "an older"), (5, "a newer")])
def test_card_and_check_refuse_other_versions(report, tmp_path, version, word):
    rep, _ = report
    p = tmp_path / "report.json"
    p.write_text(json.dumps(rep | {"version": version}))
    for verb in (["check", str(p)], ["card", str(p), "--out", str(tmp_path / "README.md")]):
        code, _, err = run_fideval(*verb)
        assert code == 2 and err.count("\n") == 1
        assert f"report format version {version} ({word} fideval); this fideval reads version 1, 2, 3, 4" in err


def test_reads_the_scorers_writer_and_splits_lengths(tmp_path):
    """Records written by the score stage's own RecordsWriter, one folder over two lengths (length: null)."""
    from fideval.config import ReportConfig
    from fideval.report.build import build
    from fideval.score.metrics import FIGURES, FLAGS
    from fideval.score.records import RecordsWriter

    rng = np.random.default_rng(0)
    kld_sum = {}
    with RecordsWriter(tmp_path) as w:
        for length in (64, 256):
            for k in range(6):
                figs = np.abs(rng.normal(size=(length - 1, len(FIGURES)))) * 0.01
                figs[:, FIGURES.index("p1_ref")] = rng.uniform(0.1, 1, length - 1)
                flags = rng.random((length - 1, len(FLAGS))) < 0.5
                kld_sum[length] = kld_sum.get(length, 0.0) + figs[:, FIGURES.index("kld")].sum()
                w.add_shard(
                    candidate="c",
                    path="weights-only",
                    length=length,
                    seq_id=f"code-{k:03d}",
                    window_id=f"code-{k:03d}",
                    domain="code",
                    positions=np.arange(length - 1),
                    tokens=np.arange(length - 1),
                    figs=figs,
                    flags=flags,
                )
    (tmp_path / "score.json").write_text(
        json.dumps(
            {
                "format": "fideval.score",
                "version": 1,
                "candidate": "c",
                "path": "weights-only",
                "length": None,
                "rows": 6 * (63 + 255),
            }
        )
    )
    rep = build([str(tmp_path)], settings=ReportConfig(resamples=200)).report
    assert [(r["length"], r["rows"]) for r in rep["results"]] == [(64, 6 * 63), (256, 6 * 255)]
    for r in rep["results"]:
        assert r["overall"]["mean_kld"]["estimate"] == pytest.approx(
            kld_sum[r["length"]] / r["rows"], rel=1e-12
        )
        assert "few_clusters" in r["overall"]["mean_kld"]["flags"]
    assert rep["comparisons"]["lengths"][0]["numerator"] == 64


def test_per_domain_folders_merge_into_the_same_figures(demo, tmp_path):
    """The workflow scores each domain into its own folder: the merged report equals the one-folder one."""
    from fideval.config import ReportConfig
    from fideval.report.build import build

    _, dirs = demo
    df = _frame(dirs, 0)
    split = [
        str(syn.write_records(tmp_path / d, df.filter(pl.col("domain") == d), "q4", "serving", 256))
        for d in DOMAINS
    ]
    rc = ReportConfig(resamples=500, seed=2)
    one = build(dirs[:1], settings=rc).report["results"][0]
    many = build(split, settings=rc).report["results"][0]
    assert len(many["inputs"]) == 3 and many["rows"] == one["rows"]
    for k in ("overall", "domains", "positions"):
        assert many[k] == one[k]


def test_truncated_report_is_one_line(report, tmp_path):
    rep, _ = report
    p = tmp_path / "report.json"
    p.write_text(json.dumps(rep | {"settings": {k: v for k, v in rep["settings"].items() if k != "domains"}}))
    code, _, err = run_fideval("card", str(p), "--out", str(tmp_path / "R.md"), "--candidate", "q4")
    assert code == 2 and "missing key 'settings.domains'" in err and err.count("\n") == 1
    p.write_text("{not json")
    code, _, err = run_fideval("check", str(p))
    assert code == 2 and "is not readable JSON" in err


def test_candidate_provenance_in_report_and_one_build_per_name(tmp_path):
    """score.json's candidate_info reaches report.json (less what differs by path); two builds under one
    name are refused in one line."""
    windows = syn.window_ids(["code", "math"], 3)
    info = {"source": "store", "store": "cand-store", "manifest_sha256": "b" * 64, "model_id": "org/q",
            "model_revision": "1" * 40, "kind": "logits"}
    dirs = []
    for path, extra in (("serving", {"activations": "e4m3 per 1x128"}), ("weights-only", {"activations": "none"})):
        df = syn.records_frame("q", path, 64, 64, windows)
        dirs.append(syn.write_records(tmp_path / path, df, "q", path, 64, candidate_info={**info, **extra}))
    out = tmp_path / "out"
    code, _, err = run_fideval("report", *records_args(dirs), "--out", str(out), "--resamples", "100", "--no-plots")
    assert code == 0, err
    prov = json.loads((out / "report.json").read_text())["provenance"]
    assert prov["candidates"]["q"]["info"] == info
    assert {t["kind"] for t in prov["teacher_stores"]} == {"logits"}
    df = syn.records_frame("q", "weights-only", 64, 64, windows)
    syn.write_records(tmp_path / "weights-only", df, "q", "weights-only", 64,
                      candidate_info={**info, "manifest_sha256": "c" * 64})
    code, _, err = run_fideval("report", *records_args(dirs), "--out", str(out), "--resamples", "100", "--no-plots")
    assert code == 2 and err.count("\n") == 1
    assert "candidate 'q':" in err and "were scored from different builds (they differ in manifest_sha256)" in err


def test_a_window_without_rows_is_a_partial_report(demo, tmp_path):
    """eval-windows.json lists a window (a whole domain) that no records set holds: the report is refused in one line;
    with --allow-partial it is written, the domain kept with null figures and flagged, report.json's coverage says
    partial, the coverage check fails and with it `fideval check`."""
    root, dirs = demo
    windows = syn.window_ids(DOMAINS, 4) + [("legal-000", "legal")]
    syn.write_eval_windows(tmp_path, windows, 256)
    args = ["report", *records_args(dirs), "--windows", str(tmp_path), "--resamples", "200", "--no-plots"]
    code, _, err = run_fideval(*args, "--out", str(tmp_path / "refused"))
    assert code == 2 and err.count("\n") == 1
    assert "the records do not cover what was asked: q4/serving/256 lacks 1 of 13 sequences (domains legal; first legal-000)" in err
    assert not (tmp_path / "refused" / "report.json").exists()
    code, _, err = run_fideval(*args, "--allow-partial", "--out", str(tmp_path / "partial"))
    assert code == 0, err
    rep = json.loads((tmp_path / "partial" / "report.json").read_text())
    r = next(r for r in rep["results"] if (r["candidate"], r["path"], r["length"]) == ("q4", "serving", 256))
    assert r["domains"]["legal"] == {"rows": 0, "clusters": 0, "mean_kld": None, "top1": None, "kld_quantiles": None,
                                     "flags": ["no_rows"]}
    assert rep["provenance"]["dataset"]["windows_without_rows"] == ["legal-000"]
    q4 = next(e for e in rep["coverage"]["sets"] if (e["candidate"], e["path"], e["length"]) == ("q4", "serving", 256))
    assert rep["coverage"]["complete"] is False and q4 == {
        "candidate": "q4", "path": "serving", "length": 256, "found": 12, "asked": 13, "missing": 1,
        "missing_domains": ["legal"], "first_missing": "legal-000"}
    check = next(c for c in rep["checks"] if c["name"] == "coverage")
    assert check["status"] == "fail" and "lacks 1 of 13" in check["detail"]
    code, _, err = run_fideval("check", str(tmp_path / "partial" / "report.json"), "--allow-not-run", "all")
    assert code == 1 and "FAIL check coverage failed: q4/serving/256 lacks 1 of 13 sequences" in err
