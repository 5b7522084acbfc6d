"""Issue 43, the rest: documents as the resampling unit, simultaneous top-1 differences, the card section and results
page for a collection of builds, comparison.json v2 (v1 still read)."""

import json

import numpy as np
import polars as pl
import pytest
import synthetic as syn
from cli_runner import run_fideval
from test_compare import BUILDS, WINDOWS, _info

from fideval.formats.comparison import Comparison
from fideval.formats.model import parse
from fideval.report import card_family
from fideval.report.compare import summarize
from fideval.report.compare_units import document_key, document_units
from fideval.stats.clusters import Clusters, cluster_sums, resample_counts
from fideval.stats.paired import paired_interval
from fideval.stats.simultaneous import simultaneous_pairs

THREE = BUILDS[:2] + BUILDS[4:]  # q2 (2.6 bpw), q4 (4.5), q8 (8.5)


def _docs_paired(wid: str, k: int) -> list[dict]:
    """Windows 2j and 2j + 1 of a domain are rows of one document (one doc_id, two lines of one file)."""
    dom = wid.rsplit("-", 1)[0]
    return [{"source": {"file": f"{dom}.jsonl", "line": k + 1, "doc_id": f"{dom}-doc{k // 2}"}}]


def _docs_own(wid: str, k: int) -> list[dict]:
    return [{"source": {"file": f"{wid.rsplit('-', 1)[0]}.jsonl", "line": k + 1}}]


def _report(root, builds, documents=None, resamples="400"):
    """Like test_compare's, the windows file carrying each window's documents (``documents(wid, k)``) first."""
    root.mkdir(parents=True, exist_ok=True)
    path = syn.write_eval_windows(root, WINDOWS, 128)
    if documents is not None:
        obj = json.loads(path.read_text())
        for w in obj["windows"]:
            w["documents"] = documents(w["id"], int(w["id"].rsplit("-", 1)[1]))
        path.write_text(json.dumps(obj))
    args = []
    for cand, eff, bpw in builds:
        df = syn.records_frame(cand, "serving", 128, 128, WINDOWS, effect=eff, seed=0)
        d = syn.write_records(root / f"rec-{cand}", df, cand, "serving", 128, candidate_info=_info(bpw))
        args += ["--records", str(d)]
    res = run_fideval("report", *args, "--windows", str(root), "--out", str(root / "rep"), "--resamples", resamples,
                      "--no-plots")
    assert res.code == 0, res.stderr
    return root / "rep"


def _compare(rep, out, *extra):
    res = run_fideval("compare", str(rep), "--out", str(out), *extra)
    assert res.code == 0, res.stderr
    return json.loads((out / "comparison.json").read_text()), res.stdout


# ------------------------------------------------------------------------------------------- documents as units
def test_document_units_join_windows_through_shared_documents():
    doms = {"a-000": "a", "a-001": "a", "a-002": "a", "a-003": "a", "b-000": "b", "b-001": "b"}
    docs = {"a-000": [{"file": "f", "line": 1}, {"file": "f", "line": 2}], "a-001": [{"file": "f", "line": 2}],
            "a-002": [{"file": "f", "line": 3}, {"file": "g", "line": 9}], "a-003": [{"file": "f", "line": 4}],
            "b-000": [{"file": "g", "line": 9}], "b-001": ["a string source"]}
    unit_of, strata = document_units(doms, docs, "w.json")
    assert unit_of == {"a-000": "a-000", "a-001": "a-000", "a-002": "a-002", "b-000": "a-002", "a-003": "a-003",
                       "b-001": "b-001"}
    assert strata == {"a-000": "a", "a-002": "a+b", "a-003": "a", "b-001": "b"}  # a unit across domains: its own
    # a doc_id makes rows of one file one document; without one, each row (line) is its own
    assert document_key({"file": "f", "line": 1, "doc_id": 7}) == document_key({"file": "f", "line": 5, "doc_id": 7})
    assert document_key({"file": "f", "line": 1}) != document_key({"file": "f", "line": 5})
    assert document_key({"file": "f", "line": 1, "doc_id": 7}) != document_key({"file": "g", "line": 1, "doc_id": 7})
    with pytest.raises(Exception, match="window a-003 records no documents"):
        document_units(doms, {k: v for k, v in docs.items() if k != "a-003"}, "w.json")


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    root = tmp_path_factory.mktemp("shared")
    rep = _report(root, THREE, documents=_docs_paired)
    win, _ = _compare(rep, root / "win", "--no-plots")
    doc, stdout = _compare(rep, root / "doc", "--no-plots", "--unit", "document", "--windows", str(root))
    return root, rep, win, doc, stdout


def test_document_unit_resamples_documents_as_an_independent_aggregation_does(shared):
    """The windows of one document summed by hand from records.parquet (polars), documents drawn within domain
    with the report's seed: the same intervals as the verb's."""
    root, rep, win, doc, stdout = shared
    st = doc["settings"]
    assert (st["unit"], st["units"], st["clusters"]) == ("document", 16, 32)
    assert (win["settings"]["unit"], win["settings"]["units"]) == ("window", 32)
    assert "32 windows in 16 documents (the resampled unit)" in stdout
    names = [b["name"] for b in doc["builds"]]
    units = {f"{d}-doc{k}": d for d in ("code", "prose") for k in range(8)}
    cl = Clusters.from_pairs(units)
    s, n, t1 = (np.zeros((16, 3)) for _ in range(3))
    for j, name in enumerate(names):
        df = pl.read_parquet(root / f"rec-{name}" / "records.parquet")
        key = [f"{w.rsplit('-', 1)[0]}-doc{int(w.rsplit('-', 1)[1]) // 2}" for w in df["window_id"].to_list()]
        codes = cl.codes(key)
        s[:, j], n[:, j] = cluster_sums(codes, df["kld"].to_numpy(), 16), np.bincount(codes, minlength=16)
        t1[:, j] = cluster_sums(codes, df["top1"].to_numpy().astype(float), 16)
    strata = np.unique(np.asarray(cl.strata), return_inverse=True)[1]
    body, _ = summarize(names, np.array([b["size"] for b in doc["builds"]]), s, n, t1,
                        resample_counts(cl, st["resamples"], st["seed"]), strata, confidence=st["confidence"])
    for got, want in zip(doc["pairs"], body["pairs"]):
        for k in ("ratio", "difference", "top1_difference"):
            assert got[k]["ci"] == pytest.approx(want[k]["ci"], rel=1e-12)
    # the estimates are the same rows' whatever the unit; the intervals are not the window unit's
    for a, b in zip(doc["builds"], win["builds"]):
        assert a["mean_kld"]["estimate"] == pytest.approx(b["mean_kld"]["estimate"], rel=1e-12)
        assert a["clusters"] == b["clusters"] == 32
    assert doc["pairs"][0]["ratio"]["ci"] != pytest.approx(win["pairs"][0]["ratio"]["ci"], rel=1e-6)
    assert doc["families"]["ratio"]["level"] > win["families"]["ratio"]["level"]  # 16 units: the level expands more


def test_document_unit_equals_window_unit_where_no_document_is_shared(tmp_path):
    rep = _report(tmp_path, THREE, documents=_docs_own)
    win, _ = _compare(rep, tmp_path / "win", "--no-plots")
    doc, _ = _compare(rep, tmp_path / "doc", "--no-plots", "--unit", "document", "--windows", str(tmp_path))
    assert doc["settings"]["units"] == 32 and doc["pairs"] == win["pairs"] and doc["builds"] == win["builds"]


def test_document_unit_refusals(shared, tmp_path):
    root, rep, *_ = shared
    out = str(tmp_path / "x")
    err = run_fideval("compare", str(rep), "--unit", "document", "--out", out).error()
    assert "--unit document needs the windows' documents" in err and "--windows" in err
    assert "--unit 'doc' is not one of window, document" in run_fideval(
        "compare", str(rep), "--unit", "doc", "--out", out).error()
    other = tmp_path / "other"  # a windows file the reports were not made with
    other.mkdir()
    obj = json.loads((root / "eval-windows.json").read_text())
    obj["windows"][0]["documents"] = obj["windows"][1]["documents"]
    (other / "eval-windows.json").write_text(json.dumps(obj))
    err = run_fideval("compare", str(rep), "--unit", "document", "--windows", str(other), "--out", out).error()
    assert "is not the eval-windows.json" in err and "SHA-256 differs" in err
    bare = _report(tmp_path / "bare", THREE[:2])  # the windows file records no documents
    err = run_fideval("compare", str(bare), "--unit", "document", "--windows", str(tmp_path / "bare"),
                      "--out", out).error()
    assert "window code-000 records no documents" in err


# ------------------------------------------------------------------------------------------- top-1 differences
def test_top1_differences_for_two_builds_are_the_paired_bootstrap_t():
    """One pair: the family's interval is the paired symmetric expanded bootstrap-t of the top-1 difference
    (``paired.py``, mover off), and its se the cluster-robust se statsmodels gives a regression of the rows'
    agreement on a build indicator, clustered by window (less statsmodels' small-sample factor (N - 1) / (N - 2))."""
    import statsmodels.api as sm

    rng = np.random.default_rng(4)
    g = 40
    rows = rng.integers(20, 60, g)
    p = rng.uniform(0.8, 0.99, g)
    a = rng.binomial(rows, p).astype(float)
    b = rng.binomial(rows, np.clip(p - 0.03, 0, 1)).astype(float)
    n = np.stack([rows, rows], 1).astype(float)
    counts = resample_counts(g, 3000, 2)
    got = simultaneous_pairs("difference", np.stack([a, b], 1), n, counts)
    want = paired_interval("difference", a, n[:, 0], b, n[:, 1], counts, None, symmetric=True, expand=True,
                           mover=False)
    np.testing.assert_allclose(got["ci"][0], want["ci"], rtol=1e-12)
    # statsmodels on the rows themselves: y = agreement, x = [1, build is b], clusters = windows
    y = np.concatenate([np.repeat([1.0, 0.0], [int(k), int(r - k)]) for x in (a, b) for k, r in zip(x, rows)])
    build = np.concatenate([np.full(rows.sum(), 0.0), np.full(rows.sum(), 1.0)])
    wid = np.concatenate([np.repeat(np.arange(g), rows)] * 2)
    fit = sm.OLS(y, np.stack([np.ones_like(build), build], 1)).fit(cov_type="cluster", cov_kwds={"groups": wid})
    big_n = y.size
    assert -fit.params[1] == pytest.approx(got["estimate"][0], rel=1e-12)
    assert got["se"][0] == pytest.approx(fit.bse[1] / np.sqrt((big_n - 1) / (big_n - 2)), rel=1e-10)


# ------------------------------------------------------------------------------------------- card and results page
@pytest.fixture(scope="module")
def three(tmp_path_factory):
    root = tmp_path_factory.mktemp("three")
    rep = _report(root, THREE)
    obj, stdout = _compare(rep, root / "cmp", "--html", str(root / "cmp" / "results.html"))
    return root, rep, obj, stdout


def test_comparison_v2_records_top1_family_and_unit(three):
    root, rep, obj, stdout = three
    parse(Comparison, obj, "comparison.json")
    assert obj["version"] == 2 and obj["settings"]["unit"] == "window" and obj["settings"]["units"] == 32
    report = json.loads((rep / "report.json").read_text())
    top = {r["candidate"]: r["overall"]["top1"]["estimate"] for r in report["results"]}
    fam = obj["families"]["top1_difference"]
    assert fam["members"] == 3 and fam["quantile"] <= fam["bonferroni_quantile"] + 1e-9
    for p in obj["pairs"]:
        d = p["top1_difference"]
        assert d["estimate"] == pytest.approx(top[p["a"]] - top[p["b"]], rel=1e-9)
        assert p["top1_separated"] == (d["ci"][0] > 0 or d["ci"][1] < 0)
    # q2 (KLD 3x) agrees less often than q8 (0.3x): the one pair the synthetic top-1 surely separates
    assert next(p for p in obj["pairs"] if (p["a"], p["b"]) == ("q2", "q8"))["top1_separated"]
    sep = [f"{p['a']}-{p['b']} {p['top1_difference']['estimate']:+.4f}" for p in obj["pairs"] if p["top1_separated"]]
    assert "top-1 agreement differs (simultaneous): " + ", ".join(sep) in stdout and "q2-q8" in stdout


def test_card_gains_the_collection_section_and_the_results_page_shows_it(three, tmp_path):
    root, rep, obj, _ = three
    card, page = root / "README.md", root / "results.html"
    res = run_fideval("card", str(rep), "--candidate", "q4", "--out", str(card), "--html", str(page),
                      "--comparison", str(root / "cmp"))
    assert res.code == 0, res.stderr
    text = card.read_text()
    sec = text[text.index("## Among 3 builds compared at once"):]
    sec = sec[:sec.index("\n## ", 5)]
    by = {b["name"]: b for b in obj["builds"]}
    for name in ("q2", "q8"):
        lo, hi = by[name]["mean_kld_simultaneous"]["ci"]
        assert f"| {name} | {by[name]['size']:.3g} | {by[name]['mean_kld']['estimate']:.4g} [{lo:.4g}, {hi:.4g}]" in sec
    assert "| **q4** (this build) | 4.5 |" in sec and "This build is on the frontier" in sec
    assert "![size against mean KLD, 3 builds](cmp/comparison.png)" in text  # with the card's plots
    html = page.read_text()
    assert "Among 3 builds compared at once" in html and "<strong>q4</strong> (this build)" in html
    assert "comparison.png" not in html  # the results page leaves plots to snakemake's report
    # the standalone page of `fideval compare --html`: every build, no highlighted one, the plot beside it
    alone = (root / "cmp" / "results.html").read_text()
    assert "Frontier: q2, q4, q8." in alone and "(this build)" not in alone and 'src="comparison.png"' in alone


def test_card_section_for_a_dominated_build(tmp_path):
    rep = _report(tmp_path, BUILDS[1:4])  # q4, q4b (4.6 bpw, about q4's KLD), fat (5 bpw, worse): fat dominated
    _compare(rep, tmp_path / "cmp", "--no-plots")
    card = tmp_path / "README.md"
    assert run_fideval("card", str(rep), "--candidate", "fat", "--out", str(card), "--comparison",
                       str(tmp_path / "cmp" / "comparison.json")).code == 0
    text = card.read_text()
    assert "This build is dominated by q4, q4b at the estimates" in text
    assert "q4 is no larger with a mean KLD below it by the simultaneous intervals" in text or \
        "q4, q4b are no larger with a mean KLD below it" in text
    assert "comparison.png" not in text  # no plot written: none linked


def test_card_refuses_a_comparison_of_other_builds_or_rows(three, tmp_path):
    root, rep, obj, _ = three
    other = _report(tmp_path / "o", BUILDS[2:4])
    out = str(tmp_path / "README.md")
    err = run_fideval("card", str(other), "--candidate", "q4b", "--out", out, "--comparison", str(root / "cmp")).error()
    assert "does not compare q4b (it compares q2, q4, q8)" in err
    changed = dict(obj, builds=[dict(b, mean_kld=dict(b["mean_kld"], estimate=0.5)) for b in obj["builds"]])
    (tmp_path / "c.json").write_text(json.dumps(changed))
    err = run_fideval("card", str(rep), "--candidate", "q4", "--out", out, "--comparison", str(tmp_path / "c.json")).error()
    assert "the mean KLD of q4 there (0.5) is not the report's" in err
    err = run_fideval("card", str(rep), "--candidate", "q4", "--out", out, "--comparison", str(tmp_path / "no")).error()
    assert "not found" in err


def test_a_version_1_comparison_is_still_read(three):
    """v1 had no unit, no top-1 differences: read as the window unit, its card section without top-1 lines."""
    root, rep, obj, _ = three
    v1 = dict(obj, version=1, settings={k: v for k, v in obj["settings"].items() if k not in ("unit", "units")},
              pairs=[{k: v for k, v in p.items() if not k.startswith("top1")} for p in obj["pairs"]],
              families={k: v for k, v in obj["families"].items() if k != "top1_difference"})
    (root / "v1.json").write_text(json.dumps(v1))
    got = card_family.load(root / "v1.json")
    assert got == v1  # read and dumped again: its own keys, nothing added
    sec = card_family.section(got, "q4")
    assert "top-1 agreement differs" not in sec and "32 windows" in sec
    v3 = dict(obj, version=3)
    (root / "v3.json").write_text(json.dumps(v3))
    with pytest.raises(Exception, match="comparison format version 3 .a newer fideval.; this fideval reads version 1, 2"):
        card_family.load(root / "v3.json")


def test_records_folders_with_document_unit_compare_as_their_report(shared, tmp_path):
    root, rep, win, doc, _ = shared
    args = [a for r in json.loads((rep / "report.json").read_text())["provenance"]["inputs"]
            for a in ("--records", r["records"])]
    res = run_fideval("compare", *args, "--windows", str(root), "--unit", "document", "--resamples", "400",
                      "--out", str(tmp_path / "c"), "--no-plots")
    assert res.code == 0, res.stderr
    got = json.loads((tmp_path / "c" / "comparison.json").read_text())
    assert got["pairs"] == doc["pairs"] and got["settings"]["units"] == 16


@pytest.mark.slow  # ~10 s of CPU
def test_shared_documents_need_the_document_unit():
    """A small run of bench/coverage_many.py's shared-document shape (its table: docs/formats-comparison.md): 64
    windows, 4 a document. Resampling windows, the builds' simultaneous means hold together far below 95 %;
    resampling documents, near it. 60 replications: Monte Carlo sd about 3 points at 95 %, 6 at 65 %."""
    from test_compare import coverage_many

    out = coverage_many.replicate(coverage_many.SHAPES["3 builds (2 equal)"], 64, 60, 300, seed=5, per_doc=4)
    assert out["doc mean"] >= 0.88 and out["doc difference"] >= 0.88 and out["doc top1"] >= 0.88, out
    assert out["mean"] <= out["doc mean"] - 0.15 and out["difference"] <= out["doc difference"] - 0.05, out


def test_plan_in_documents(shared, tmp_path):
    """``fideval plan --documents``: the pilot's standard error over documents (pairs of windows summed by hand),
    counts of documents; with no document shared, the plan in windows exactly."""
    from fideval.report import plan as planner

    root, rep, *_ = shared
    got = planner.plan(rep, half=0.002, documents=root)
    row = next(r for r in got["rows"] if r["scope"] == "overall" and r["build"] == "q4")
    assert got["unit"] == "document" and row["windows"] == 16
    df = pl.read_parquet(root / "rec-q4" / "records.parquet")
    doc = [f"{w.rsplit('-', 1)[0]}-{int(w.rsplit('-', 1)[1]) // 2}" for w in df["window_id"].to_list()]
    g = df.with_columns(pl.Series("doc", doc)).group_by("doc").agg(pl.col("kld").sum(), pl.len()).sort("doc")
    strata = [d.split("-")[0] for d in g["doc"].to_list()]
    want = np.sqrt(planner.variance(g["kld"].to_numpy(), g["len"].to_numpy().astype(float), np.unique(
        strata, return_inverse=True)[1]))
    assert row["se"] == pytest.approx(want, rel=1e-10)
    res = run_fideval("plan", str(rep), "--documents", str(root / "eval-windows.json"), "--half-width", "0.002")
    assert res.code == 0, res.stderr
    assert "overall q4: mean_kld" in res.stdout and "16 documents" in res.stdout and "needs" in res.stdout
    own = _report(tmp_path, THREE[:2], documents=_docs_own)
    a, b = planner.plan(own, half=0.002), planner.plan(own, half=0.002, documents=tmp_path)
    assert a["rows"] == b["rows"] and a["pairs"] == b["pairs"] and (a["unit"], b["unit"]) == ("window", "document")
