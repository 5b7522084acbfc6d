"""Issue 48, thin evidence: the concentration diagnostic beside each mean KLD interval, the ``concentrated`` and
``few_windows`` flags, and the card's words for them (docs/formats-report.md, "Thin evidence")."""

from __future__ import annotations

import heapq
import json
import math

import numpy as np
import polars as pl
import pytest
import synthetic as syn  # tests/synthetic.py
from cli_runner import run_fideval

from fideval.report.card_intervals import Cell, Notes, few_windows, reason
from fideval.report.figures import few_windows as flag_few_windows
from fideval.stats.clusters import Clusters, resample_counts
from fideval.stats.concentration import DOMAIN_MIN_WINDOWS, EFFECTIVE_SHARE_FLAG, concentrated, concentration
from fideval.stats.intervals import mean_intervals


def _oracle(s: list[float]) -> dict[str, float]:
    """The diagnostic by hand: python floats, heapq for the top windows, math.fsum for the sums."""
    g = len(s)
    k = -(-g // 100)  # ceil(g / 100)
    total = math.fsum(s)
    eff = total * total / math.fsum(x * x for x in s)
    return {"top_share": math.fsum(heapq.nlargest(k, s)) / total, "top_windows": k, "effective_windows": eff,
            "effective_share": eff / g, "windows": g}


@pytest.mark.parametrize("g", [3, 64, 100, 101, 250])
def test_diagnostic_matches_a_direct_computation(g):
    rng = np.random.default_rng(g)
    s = rng.lognormal(0.0, 1.5, g) * rng.integers(10, 200, g)
    n = rng.integers(1, 300, g).astype(float)
    s[::7], n[::7] = 0.0, 0.0  # windows without rows of this figure do not count
    got = concentration(s, n)
    want = _oracle([float(x) for x, m in zip(s, n) if m > 0])
    assert got["top_windows"] == want["top_windows"] and got["windows"] == want["windows"]
    for key in ("top_share", "effective_windows", "effective_share"):
        assert got[key] == pytest.approx(want[key], rel=1e-12), key


def test_diagnostic_edges():
    assert concentration(np.zeros(5)) is None  # nothing to share
    assert concentration(np.array([]), np.array([])) is None
    one = concentration(np.array([0.0, 0.0, 3.0, 0.0, 0.0]))  # one window of five carries all of it
    assert one["top_share"] == 1.0 and one["effective_windows"] == 1.0 and one["effective_share"] == 0.2 and concentrated(one)
    even = concentration(np.full(40, 2.5))
    assert even["effective_share"] == pytest.approx(1.0) and even["top_share"] == pytest.approx(1 / 40)
    assert not concentrated(even)


def _design(s: np.ndarray, n: np.ndarray, dom: np.ndarray, seed: int = 3):
    cl = Clusters.from_pairs({f"{k:03d}": f"d{d}" for k, d in enumerate(dom)})
    counts = resample_counts(cl, 400, seed)
    two = np.stack([s, s * 0.5 - 0.2 * n], axis=1)  # a KLD (log scale) and a signed mean (identity scale)
    return mean_intervals(two, np.stack([n, n], axis=1), counts, dom, ["log", "identity"], confidence=0.95, seed=seed)


def test_flag_on_a_concentrated_design_not_on_a_spread_one():
    rng = np.random.default_rng(0)
    g = 96
    dom = np.repeat(np.arange(4), g // 4)
    n = rng.integers(128, 257, g).astype(float)
    spread = n * 0.02 * rng.lognormal(-0.045, 0.3, g)  # heavy-low's window means
    heavy = spread.copy()
    heavy[[5, 40]] *= 120.0  # two windows carry most of the KLD
    fig, signed = _design(spread, n, dom)
    c = fig["concentration"]
    assert "concentrated" not in fig["flags"] and c["effective_share"] > 0.8 and c["flag_below"] == EFFECTIVE_SHARE_FLAG
    assert c == pytest.approx(concentration(spread, n) | {"flag_below": EFFECTIVE_SHARE_FLAG})
    assert "concentration" not in signed  # a signed mean has no share to concentrate
    fig, _ = _design(heavy, n, dom)
    c = fig["concentration"]
    want = _oracle(list(heavy))
    assert c["effective_windows"] == pytest.approx(want["effective_windows"], rel=1e-12)
    assert c["effective_share"] < EFFECTIVE_SHARE_FLAG and "concentrated" in fig["flags"]
    assert fig["ci"][0] < fig["estimate"] < fig["ci"][1]  # the interval itself is the default's, unchanged


def test_no_flag_on_a_degenerate_interval():
    # every window at the same mean (zero variance: degenerate), one window holding almost all rows: the diagnostic
    # says concentrated, but a degenerate interval claims nothing and is not flagged
    n = np.array([1.0, 1.0, 1.0, 1.0, 1000.0])
    s = 0.1 * n
    dom = np.zeros(5, dtype=int)
    cl = Clusters.from_pairs({f"{k:03d}": "d0" for k in range(5)})
    fig = mean_intervals(s[:, None], n[:, None], resample_counts(cl, 200, 1), dom, ["log"], confidence=0.95, seed=1)[0]
    assert fig["method"] == "degenerate" and concentrated(fig["concentration"])
    assert "concentrated" not in fig["flags"]


def test_few_windows_flag_below_the_measured_floor():
    def fig(g, method="cluster-bootstrap-t-log-symmetric-expanded"):
        return {"estimate": 0.1, "ci": [0.05, 0.2], "method": method, "clusters": g, "flags": []}

    assert flag_few_windows(fig(DOMAIN_MIN_WINDOWS - 1))["flags"] == ["few_windows"]
    assert flag_few_windows(fig(12))["flags"] == ["few_windows"]
    assert flag_few_windows(fig(DOMAIN_MIN_WINDOWS))["flags"] == []
    assert flag_few_windows(fig(1, "degenerate"))["flags"] == []
    assert flag_few_windows(None) is None
    words = few_windows(12)
    assert words.startswith("Per-domain figures rest on as few as 12 windows: a per-domain mean on fewer than 64 windows")
    assert "`few_windows`" in words and "0.91-0.93 with 24-32 windows of one domain" in words
    assert "were not measured" not in words and "fewer than 8 were not measured" in few_windows(6)
    assert few_windows(DOMAIN_MIN_WINDOWS) is None
    # a report whose per-domain means under 64 windows print the union with the domain-pooled interval
    words = few_windows(12, pooled=True)
    assert "borrows strength across the domains" in words and "covers 0.949-0.976 with 8-128 windows a domain" in words
    assert "too_few_windows" not in words and "below 8 windows a domain gets no interval" in few_windows(5, pooled=True)
    assert few_windows(DOMAIN_MIN_WINDOWS, pooled=True) is None


def test_card_words_for_a_concentrated_interval():
    fig = {"estimate": 0.02, "ci": [0.015, 0.03], "method": "cluster-bootstrap-t-log-symmetric-expanded",
           "flags": ["concentrated"], "clusters": 128, "strata": 6, "se": 0.003,
           "concentration": {"effective_share": 0.12, "flag_below": 0.25}}
    why = reason(fig)
    assert why.startswith("may undercover: a few windows carry much of this mean's KLD")
    assert "under 25 % of its windows (flag `concentrated`" in why
    assert "covers 0.87-0.94" in why and "misses above the upper bound" in why and "the lower bound holds" in why
    assert reason(fig | {"flags": []}) is None  # an ordinary interval gets no note
    notes = Notes()
    cell = Cell("0.02 [0.015, 0.03]", why, notes)
    assert str(cell) == "0.02 [0.015, 0.03]¹" and list(notes) == [{"mark": "¹", "reason": why}]
    assert notes.undercover and not Notes().undercover
    # a bound-less interval keeps its own reason first
    assert reason(fig | {"ci": [0.015, None], "flags": ["concentrated", "unbounded"]}).startswith("no upper bound")


@pytest.fixture(scope="module")
def heavy_report(tmp_path_factory):
    """Two domains of 16 windows; one window's KLD 400 times the rest: concentrated, and few windows a domain."""
    root = tmp_path_factory.mktemp("thin")
    windows = syn.window_ids(["code", "chat"], 16)
    heavy = windows[3][0]
    df = syn.records_frame("q4", "serving", 64, 64, windows, effect=1.0)
    df = df.with_columns(pl.when(pl.col("window_id") == heavy).then(pl.col("kld") * 400.0).otherwise(pl.col("kld"))
                         .alias("kld"))
    rec = syn.write_records(root / "q4", df, "q4", "serving", 64)
    syn.write_eval_windows(root, windows, 64)
    res = run_fideval("report", "--records", str(rec), "--windows", str(root), "--out", str(root / "report"),
                      "--resamples", "400", "--no-plots")
    assert res.code == 0, res.stderr
    res = run_fideval("card", str(root / "report"), "--candidate", "q4", "--out", str(root / "report" / "README.md"))
    assert res.code == 0, res.stderr
    return {"df": df, "rep": json.loads((root / "report" / "report.json").read_text()),
            "card": (root / "report" / "README.md").read_text()}


def test_report_and_card_on_a_concentrated_design(heavy_report):
    df, rep, card = heavy_report["df"], heavy_report["rep"], heavy_report["card"]
    res = rep["results"][0]
    m = res["overall"]["mean_kld"]
    sums = df.group_by("window_id").agg(pl.col("kld").sum())["kld"].to_list()
    want = _oracle(sums)
    assert m["concentration"]["effective_windows"] == pytest.approx(want["effective_windows"], rel=1e-9)
    assert m["concentration"]["top_share"] == pytest.approx(want["top_share"], rel=1e-9)
    assert "concentrated" in m["flags"] and "concentration" not in res["overall"]["mean_delta_nll"]
    assert "concentrated" in res["domains"]["code"]["mean_kld"]["flags"]  # the heavy window is code's
    for d in ("code", "chat"):
        dm = res["domains"][d]["mean_kld"]
        assert "few_windows" in dm["flags"] and res["domains"][d]["clusters"] == 16
        # 16 windows a domain: the union of the domain's own bootstrap-t and the domain-pooled t-interval
        assert dm["method"] == "union-bootstrap-t-pooled-t-log" and dm["pooled_t"]["df"] == 30
        assert dm["ci"] == [min(dm["bootstrap_t"]["ci"][0], dm["pooled_t"]["ci"][0]),
                            max(dm["bootstrap_t"]["ci"][1], dm["pooled_t"]["ci"][1])]
    assert "may undercover: a few windows carry much of this mean's KLD" in card
    assert ("An interval marked above has no bound (—) or is its estimate alone, or may cover less than its stated "
            "level; why, from report.json:") in card
    assert few_windows(16, pooled=True) in card


def test_card_words_for_an_interval_withheld_by_design():
    p99 = {"q": 0.99, "estimate": 1.2, "ci": [0.9, None], "flags": ["lower_bound_only"], "tail_windows": 40.0}
    assert reason(p99).startswith("no upper bound: a two-sided interval this far in the tail covered as little as")
    assert "(flag `lower_bound_only`)" in reason(p99)
    # too few tail windows says the more specific reason
    assert reason(p99 | {"flags": ["few_tail_windows", "lower_bound_only"], "tail_windows": 3.0}).startswith(
        "no upper bound: the rows beyond this quantile come from 3.0 effective windows")
    dom = {"estimate": 0.1, "ci": [None, None], "method": "cluster-bootstrap-t-log-symmetric-expanded", "clusters": 5,
           "strata": 1, "flags": ["few_windows", "too_few_windows"]}
    assert reason(dom).startswith("no interval: this domain's mean rests on 5 windows, fewer than 8")


def test_report_and_card_withhold_a_domain_interval_on_too_few_windows(tmp_path):
    """Six windows a domain: no per-domain interval (flag `too_few_windows`), the card says why; the p99 keeps its
    lower bound alone."""
    windows = syn.window_ids(["code", "chat"], 6)
    df = syn.records_frame("q4", "serving", 64, 64, windows, effect=1.0)
    rec = syn.write_records(tmp_path / "q4", df, "q4", "serving", 64)
    syn.write_eval_windows(tmp_path, windows, 64)
    res = run_fideval("report", "--records", str(rec), "--windows", str(tmp_path), "--out", str(tmp_path / "report"),
                      "--resamples", "200", "--no-plots")
    assert res.code == 0, res.stderr
    res = run_fideval("card", str(tmp_path / "report"), "--candidate", "q4", "--out", str(tmp_path / "README.md"))
    assert res.code == 0, res.stderr
    rep = json.loads((tmp_path / "report" / "report.json").read_text())["results"][0]
    for d in ("code", "chat"):
        dm = rep["domains"][d]["mean_kld"]
        assert dm["ci"] == [None, None] and {"few_windows", "too_few_windows"} <= set(dm["flags"])
        assert dm["bootstrap_t"]["ci"][0] is not None and dm["pooled_t"] is None
    p99 = next(q for q in rep["overall"]["kld_quantiles"] if q["q"] == 0.99)
    assert p99["ci"][1] is None and "lower_bound_only" in p99["flags"]
    assert reason(dm).startswith("no interval: this domain's mean rests on 6 windows, fewer than 8")
    card = (tmp_path / "README.md").read_text()  # the card prints per-domain estimates, and says why no interval
    assert few_windows(6, pooled=True) in card and "`too_few_windows`" in card
    # a p99 withheld by the rule alone (its tail windows enough): the card says why in its own sentence
    path = tmp_path / "report" / "report.json"
    full = json.loads(path.read_text())
    for q in full["results"][0]["overall"]["kld_quantiles"]:
        if q["q"] >= 0.99:
            q["flags"], q["tail_windows"] = ["lower_bound_only"], 30.0
    path.write_text(json.dumps(full))
    res = run_fideval("card", str(tmp_path / "report"), "--candidate", "q4", "--out", str(tmp_path / "R2.md"))
    assert res.code == 0, res.stderr
    card = (tmp_path / "R2.md").read_text()
    assert ("The intervals of the 99th, 99.9th percentiles above have a lower bound only (`lower_bound_only` in "
            "report.json)") in card
