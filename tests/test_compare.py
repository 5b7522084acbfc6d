"""``fideval compare``: simultaneous (max-t) intervals against scipy's paired bootstrap and statsmodels' Bonferroni,
agreement with the report's paired interval for two builds, the frontier, the refusals, a small coverage run."""

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import synthetic as syn
from cli_runner import run_fideval
from scipy import stats

from fideval.formats.comparison import Comparison
from fideval.formats.model import parse
from fideval.stats.clusters import Clusters, resample_counts
from fideval.stats.paired import paired_interval
from fideval.stats.simultaneous import dominated, homogeneous_groups, simultaneous_means, simultaneous_pairs
from fideval.stats.studentized import cluster_t_means, expanded_confidence

_spec = importlib.util.spec_from_file_location("coverage_many", Path(__file__).resolve().parent.parent / "bench" / "coverage_many.py")
coverage_many = sys.modules["coverage_many"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(coverage_many)


def _builds(k=4, g=30, seed=0, effects=(1.0, 1.0, 1.4, 2.5)):
    """K builds on G windows of shared difficulty; per-window sums and rows [G, K]."""
    rng = np.random.default_rng(seed)
    n = rng.integers(100, 600, g).astype(float)
    mu = rng.lognormal(-4.0, 0.8, g)
    s = np.stack([mu * n * effects[j] * rng.lognormal(0.0, 0.2, g) for j in range(k)], axis=1)
    return s, np.repeat(n[:, None], k, axis=1)


def _var(u):
    return u.size / (u.size - 1) * np.sum((u - u.mean()) ** 2)


def _pair_stat(kind, s1, n1, s2, n2):
    """One pair's figure on the interval's scale and its linearised se, window by window (paired.py's formula)."""
    t1, t2 = s1.sum() / n1.sum(), s2.sum() / n2.sum()
    if kind == "difference":
        u = (s1 - t1 * n1) / n1.sum() - (s2 - t2 * n2) / n2.sum()
        return t1 - t2, np.sqrt(_var(u))
    u = (s1 - t1 * n1) / s1.sum() - (s2 - t2 * n2) / s2.sum()
    return np.log(t1 / t2), np.sqrt(_var(u))


@pytest.mark.parametrize("kind", ["ratio", "difference"])
def test_max_t_equals_scipy_paired_bootstrap_of_the_max(kind):
    """scipy's paired bootstrap draws the same window indices as the one-stratum count matrix; its statistic here is
    max over pairs of |t*|, computed window by window (no count matrix): the quantile and every interval agree."""
    s, n = _builds()
    k, g = s.shape[1], s.shape[0]
    b, seed = 2000, 11
    pairs = [(i, j) for i in range(k) for j in range(i + 1, k)]
    hat = [_pair_stat(kind, s[:, i], n[:, i], s[:, j], n[:, j]) for i, j in pairs]

    def max_t(*cols):
        ss, nn = np.stack(cols[:k], 1), np.stack(cols[k:], 1)
        return max(abs((_pair_stat(kind, ss[:, i], nn[:, i], ss[:, j], nn[:, j])[0] - hat[p][0])
                       / _pair_stat(kind, ss[:, i], nn[:, i], ss[:, j], nn[:, j])[1]) for p, (i, j) in enumerate(pairs))

    ref = stats.bootstrap(tuple(s.T) + tuple(n.T), max_t, paired=True, vectorized=False, method="percentile",
                          n_resamples=b, rng=np.random.default_rng(seed))
    level = expanded_confidence(0.95, g, 1)
    q = np.quantile(ref.bootstrap_distribution, level)
    got = simultaneous_pairs(kind, s, n, resample_counts(g, b, seed), confidence=0.95)
    assert got["quantile"] == pytest.approx(q, rel=1e-9)
    for p, (gh, se) in enumerate(hat):
        lo, hi = gh - q * se, gh + q * se
        want = (np.exp(lo), np.exp(hi)) if kind == "ratio" else (lo, hi)
        np.testing.assert_allclose(got["ci"][p], want, rtol=1e-9)


@pytest.mark.parametrize("kind", ["ratio", "difference"])
def test_two_builds_are_the_reports_paired_interval(kind):
    """With one pair the max is |t*| itself: the report's symmetric expanded bootstrap-t of that pair, stratified."""
    s, n = _builds(k=2, g=48, effects=(1.0, 1.3))
    cl = Clusters.from_pairs({f"{'abc'[i % 3]}-{i:03d}": "abc"[i % 3] for i in range(48)})
    strata = np.unique(np.asarray(cl.strata), return_inverse=True)[1]
    counts = resample_counts(cl, 3000, 5)
    got = simultaneous_pairs(kind, s, n, counts, strata)
    want = paired_interval(kind, s[:, 0], n[:, 0], s[:, 1], n[:, 1], counts, strata, symmetric=True, expand=True)
    np.testing.assert_allclose(got["ci"][0], want["ci"], rtol=1e-12)
    # one build's simultaneous mean interval is the report's default interval of that mean
    one = simultaneous_means(s[:, :1], n[:, :1], counts, strata)
    ref = cluster_t_means(s[:, :1], n[:, :1], counts, strata, "log", symmetric=True, expand=True)[0]
    np.testing.assert_allclose(one["ci"][0], ref["ci"], rtol=1e-12)


def test_max_t_lies_between_marginal_and_bonferroni():
    """The max-t quantile is at least every pair's own (marginal) quantile and at most the largest Bonferroni one;
    by the union bound on the same draws, a pair statsmodels' Bonferroni rejects (p-values taken at the least
    favourable member, the single-step Bonferroni of a max) is separated by the max-t intervals."""
    from statsmodels.stats.multitest import multipletests

    s, n = _builds(k=5, g=40, effects=(1.0, 1.05, 1.15, 1.3, 1.6))
    counts = resample_counts(40, 4000, 3)
    f = simultaneous_pairs("ratio", s, n, counts)
    st, m = f["stats"], len(f["pairs"])
    a = np.abs(st["t"])
    marg = np.quantile(a, f["level"], axis=0)
    bonf = np.quantile(a, 1 - (1 - f["level"]) / m, axis=0)
    assert (marg <= f["quantile"] + 1e-12).all() and f["quantile"] <= bonf.max() + 1e-12
    t_obs = np.abs(st["g"] / st["se"])  # against the null ratio 1
    p_marg = (a >= t_obs[None, :]).mean(axis=0)
    p_max = (a.max(axis=1)[:, None] >= t_obs[None, :]).mean(axis=0)  # max-t's adjusted p-value
    p_worst = (a[:, :, None] >= t_obs[None, None, :]).mean(axis=0).max(axis=0)
    rejected, p_bonf, _, _ = multipletests(p_worst, alpha=1 - f["level"], method="bonferroni")
    assert (p_marg <= p_max + 1e-12).all() and (p_max <= p_bonf + 1e-12).all()
    separated = (f["ci"][:, 0] > 1) | (f["ci"][:, 1] < 1)
    assert separated[rejected].all() and rejected.any()
    assert ((p_max < 1 - f["level"]) == separated).all()  # the intervals are the max-t test inverted
    assert separated.any() and not separated.all()  # the design has both kinds of pairs


def test_frontier_and_groups_on_constructed_builds():
    assert dominated([2, 4, 4.5, 8], [0.1, 0.03, 0.05, 0.005]).tolist() == [False, False, True, False]
    assert dominated([4, 4], [0.03, 0.03]).tolist() == [False, False]  # ties dominate nothing
    assert dominated([4, 4], [0.03, 0.02]).tolist() == [True, False]
    assert dominated([4, 5], [[0.03, 0.02], [0.03, 0.04]]).tolist() == [[False, False], [False, True]]
    assert homogeneous_groups([0, 1, 2, 3], {(0, 2), (0, 3), (1, 3)}) == [[0, 1], [1, 2], [2, 3]]
    assert homogeneous_groups([0, 1, 2], {(0, 1), (1, 2), (0, 2)}) == [[0], [1], [2]]
    assert homogeneous_groups([2, 0, 1], set()) == [[2, 0, 1]]


# ---------------------------------------------------------------------------------------------- the verb
WINDOWS = syn.window_ids(["code", "prose"], 16)
BUILDS = (("q2", 3.0, 2.6), ("q4", 1.2, 4.5), ("q4b", 1.22, 4.6), ("fat", 2.0, 5.0), ("q8", 0.3, 8.5))


def _info(bpw):
    return {"source": "emulated", "bits_per_weight": {"total": {"bpw": bpw, "params": 1000, "bits": bpw * 1000}}}


def _report(root, builds, *, windows=WINDOWS, info=_info, resamples="400", path="serving", manifests=None):
    root.mkdir(parents=True, exist_ok=True)
    syn.write_eval_windows(root, windows, 128)
    args = []
    for cand, eff, bpw in builds:
        df = syn.records_frame(cand, path, 128, 128, windows, effect=eff, seed=0)
        d = syn.write_records(root / f"rec-{cand}-{path}", df, cand, path, 128, candidate_info=info(bpw))
        if manifests and cand in manifests:  # scored against another teacher store
            score = json.loads((d / "score.json").read_text())
            score["teacher"]["manifest_sha256"] = manifests[cand]
            (d / "score.json").write_text(json.dumps(score))
        args += ["--records", str(d)]
    res = run_fideval("report", *args, "--windows", str(root), "--out", str(root / "rep"), "--resamples", resamples,
                      "--no-plots")
    assert res.code == 0, res.stderr
    return root / "rep"


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    root = tmp_path_factory.mktemp("many")
    rep = _report(root, BUILDS)
    res = run_fideval("compare", str(rep), "--out", str(root / "cmp"))
    assert res.code == 0, res.stderr
    return rep, root / "cmp", res.stdout


def test_compare_writes_a_checked_comparison_and_plot(many):
    rep, out, stdout = many
    obj = json.loads((out / "comparison.json").read_text())
    parse(Comparison, obj, "comparison.json")
    assert (out / "comparison.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    names = [b["name"] for b in obj["builds"]]
    assert names == ["q2", "q4", "q4b", "fat", "q8"]  # by size
    report = json.loads((rep / "report.json").read_text())
    # each build's mean KLD and its marginal interval are the report's own (same windows, draws and method)
    for b in obj["builds"]:
        r = next(x for x in report["results"] if x["candidate"] == b["name"])
        assert b["mean_kld"]["estimate"] == pytest.approx(r["overall"]["mean_kld"]["estimate"], rel=1e-12)
        assert b["mean_kld"]["ci"] == pytest.approx(r["overall"]["mean_kld"]["ci"], rel=1e-12)
        assert b["top1"]["estimate"] == pytest.approx(r["overall"]["top1"]["estimate"], rel=1e-12)
        lo, hi = b["mean_kld_simultaneous"]["ci"]
        assert lo <= b["mean_kld"]["ci"][0] and hi >= b["mean_kld"]["ci"][1]  # simultaneous: wider
    # the estimate of every pair is the ratio of the records' own means
    means = {b["name"]: b["mean_kld"]["estimate"] for b in obj["builds"]}
    for p in obj["pairs"]:
        assert p["ratio"]["estimate"] == pytest.approx(means[p["a"]] / means[p["b"]], rel=1e-12)
        assert p["difference"]["estimate"] == pytest.approx(means[p["a"]] - means[p["b"]], rel=1e-12)
    by = {b["name"]: b for b in obj["builds"]}
    assert obj["frontier"] == ["q2", "q4", "q8"]
    assert by["fat"]["dominated_by"] == ["q4", "q4b"] and by["fat"]["p_dominated"] > 0.99
    assert "q4" in by["fat"]["certainly_dominated_by"]
    assert by["q8"]["p_dominated"] == 0.0 and by["q4"]["on_frontier"]
    assert ["q4", "q4b"] in obj["groups"]  # 2 % apart on 32 windows: not separable
    sep = {(p["a"], p["b"]): p["separated"] for p in obj["pairs"]}
    assert not sep[("q4", "q4b")] and sep[("q2", "q8")]
    fam = obj["families"]["ratio"]
    assert fam["members"] == 10 and fam["quantile"] <= fam["bonferroni_quantile"] + 1e-9
    assert "frontier: q2, q4, q8" in stdout and "{q4, q4b}" in stdout


def test_records_folders_compare_as_their_report(many, tmp_path):
    rep, out, _ = many
    args = [a for r in json.loads((rep / "report.json").read_text())["provenance"]["inputs"]
            for a in ("--records", r["records"])]
    res = run_fideval("compare", *args, "--windows", str(rep.parent), "--resamples", "400", "--out", str(tmp_path / "c"),
                      "--no-plots")
    assert res.code == 0, res.stderr
    a = json.loads((out / "comparison.json").read_text())
    b = json.loads((tmp_path / "c" / "comparison.json").read_text())
    assert [x["mean_kld_simultaneous"] for x in a["builds"]] == [x["mean_kld_simultaneous"] for x in b["builds"]]
    assert a["pairs"] == b["pairs"] and a["groups"] == b["groups"] and b["settings"]["windows_verified"]
    assert "give reports or --records, not both" in run_fideval(
        "compare", str(rep), *args, "--out", str(tmp_path / "x")).error()
    assert "no reports given" in run_fideval("compare", "--out", str(tmp_path / "x")).error()


def test_two_builds_match_the_reports_own_comparison(tmp_path):
    rep = _report(tmp_path, BUILDS[1:3])
    res = run_fideval("compare", str(rep), "--out", str(tmp_path / "cmp"), "--no-plots")
    assert res.code == 0, res.stderr
    obj = json.loads((tmp_path / "cmp" / "comparison.json").read_text())
    report = json.loads((rep / "report.json").read_text())
    (pair,) = obj["pairs"]
    want = next(c for c in report["comparisons"]["builds"] if (c["numerator"], c["denominator"]) == (pair["a"], pair["b"]))
    assert pair["ratio"]["ci"] == pytest.approx(want["ci"], rel=1e-12)
    assert obj["plot"] is None and not (tmp_path / "cmp" / "comparison.png").exists()


def test_reports_of_one_run_split_in_two_compare_as_one(tmp_path):
    a = _report(tmp_path / "a", BUILDS[:2])
    b = _report(tmp_path / "b", BUILDS[2:])
    res = run_fideval("compare", str(a), str(b / "report.json"), "--out", str(tmp_path / "cmp"), "--no-plots")
    assert res.code == 0, res.stderr
    obj = json.loads((tmp_path / "cmp" / "comparison.json").read_text())
    assert len(obj["builds"]) == 5 and obj["settings"]["windows_verified"] is True and len(obj["reports"]) == 2


def test_one_line_refusals(tmp_path, many):
    rep = many[0]
    # one build only
    one = _report(tmp_path / "one", BUILDS[:1])
    assert "one build only (q2 at serving/128)" in run_fideval("compare", str(one), "--out", str(tmp_path / "x")).error()
    # other windows: the same ids, other tokens
    other = [(w, d) for w, d in WINDOWS]
    root = tmp_path / "other"
    rep2 = _report(root, BUILDS[:1] + (("z", 1.0, 3.0),), windows=other)
    obj = json.loads((rep2 / "report.json").read_text())
    obj["provenance"]["dataset"]["windows"][0]["token_sha256"] = "0" * 64
    (rep2 / "report.json").write_text(json.dumps(obj))
    err = run_fideval("compare", str(rep), str(rep2), "--out", str(tmp_path / "x")).error()
    assert "were scored on different windows (window code-000: other tokens)" in err
    # a window only one report has (the tokens put back first)
    obj["provenance"]["dataset"]["windows"][0]["token_sha256"] = json.loads((rep / "report.json").read_text())[
        "provenance"]["dataset"]["windows"][0]["token_sha256"]
    dropped = dict(obj, provenance=dict(obj["provenance"], dataset=dict(obj["provenance"]["dataset"], windows=obj[
        "provenance"]["dataset"]["windows"][:-1])))
    (rep2 / "report.json").write_text(json.dumps(dropped))
    err = run_fideval("compare", str(rep), str(rep2), "--out", str(tmp_path / "x")).error()
    assert f"(window prose-015: only in {rep / 'report.json'})" in err
    # another teacher
    obj["provenance"]["teacher_stores"][0]["manifest_sha256"] = "b" * 64
    (rep2 / "report.json").write_text(json.dumps(obj))
    err = run_fideval("compare", str(rep), str(rep2), "--out", str(tmp_path / "x")).error()
    assert "were scored against different teachers at length 128" in err
    # one report whose builds were scored against two teacher stores
    mixed = _report(tmp_path / "mixed", BUILDS[:2], manifests={"q4": "c" * 64})
    err = run_fideval("compare", str(mixed), "--out", str(tmp_path / "x")).error()
    assert "builds q2 and q4 were scored against different teacher stores at length 128" in err
    # a build twice
    err = run_fideval("compare", str(rep), str(rep), "--out", str(tmp_path / "x")).error()
    assert "build 'fat' is in both" in err
    # a build without a size; --size gives it
    nosize = _report(tmp_path / "nosize", BUILDS[:2], info=lambda bpw: None)
    err = run_fideval("compare", str(nosize), "--out", str(tmp_path / "x")).error()
    assert "build q2 has no size" in err and "--size q2=BITS_PER_WEIGHT" in err
    res = run_fideval("compare", str(nosize), "--size", "q2=2.6", "--size", "q4=4.5", "--out", str(tmp_path / "y"),
                      "--no-plots")
    assert res.code == 0, res.stderr
    assert "--size 'q4' is not NAME=BITS_PER_WEIGHT" in run_fideval(
        "compare", str(nosize), "--size", "q4", "--out", str(tmp_path / "x")).error()
    # several paths
    both = _report(tmp_path / "paths", BUILDS[:2])
    obj = json.loads((both / "report.json").read_text())
    obj["results"].append(dict(obj["results"][0], path="weights-only"))
    (both / "report.json").write_text(json.dumps(obj))
    err = run_fideval("compare", str(both), "--out", str(tmp_path / "x")).error()
    assert "several paths and lengths (serving/128, weights-only/128)" in err and "--path" in err
    # records changed since the report
    rec = tmp_path / "one" / "rec-q2-serving" / "records.parquet"
    rec.write_bytes(rec.read_bytes() + b"x")
    one2 = _report(tmp_path / "two", BUILDS[:2])
    obj = json.loads((one2 / "report.json").read_text())
    obj["provenance"]["inputs"][0]["records"] = str(rec.parent)
    (one2 / "report.json").write_text(json.dumps(obj))
    assert "SHA-256 differs from the one" in run_fideval("compare", str(one2), "--out", str(tmp_path / "x")).error()


@pytest.mark.slow  # ~10 s of CPU
def test_family_wise_coverage_near_nominal_where_marginal_is_not():
    """A small run of bench/coverage_many.py (its full table is in docs/formats-comparison.md): 5 builds, 3 equal,
    64 windows, light tails. 60 replications: Monte Carlo sd 2.8 points at 95 %."""
    out = coverage_many.replicate(coverage_many.SHAPES["5 builds (3 equal)"], 64, 60, 500, seed=3, tail="light")
    assert out["ratio"] >= 0.88 and out["difference"] >= 0.85 and out["mean"] >= 0.85, out
    assert out["marginal"] <= out["ratio"] - 0.05, out  # ten intervals at 95 % each do not hold together


def test_a_build_equal_to_the_reference_is_degenerate_not_a_crash(tmp_path):
    """A build with zero KLD on every row (the reference itself, or a lossless build): its ratios are undefined and
    its intervals collapse to the estimate; it is left out of the max and still tops the frontier."""
    from fideval.report.compare import plot, summarize

    s, n = _builds(k=3, g=24, effects=(1.0, 1.5, 1.0))  # b: larger and worse than a
    s[:, 2] = 0.0
    cl = Clusters.from_pairs({f"a-{i:03d}": "a" for i in range(24)})
    body, arrays = summarize(["a", "b", "exact"], np.array([4.0, 6.0, 16.0]), s, n, None,
                             resample_counts(cl, 500, 0), None, confidence=0.95)
    exact = body["builds"][2]
    assert exact["mean_kld"]["method"] == "degenerate" and exact["mean_kld_simultaneous"]["ci"] == [0.0, 0.0]
    assert exact["on_frontier"] and body["frontier"] == ["a", "exact"]
    undefined = [p for p in body["pairs"] if "exact" in (p["a"], p["b"])]
    assert all(p["ratio"]["method"] == "degenerate" and not p["separated"] for p in undefined)
    assert body["families"]["ratio"]["quantile"] > 0  # the one defined pair
    plot(arrays, tmp_path / "c.png", "bits_per_weight", "t")
    assert (tmp_path / "c.png").stat().st_size > 0
