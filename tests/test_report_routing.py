"""The routing block of report.json, the card's Routing section and the results page (issue 42).

A tiny Qwen3-MoE evaluation on the CPU through the CLI, as the workflow lays it out: one teacher store per domain
(``fideval teacher --routes``), the candidate scored per domain free (``--routes``) and route-controlled
(``--routes --teacher-routes``), one report over the four records folders. Oracles: the block's routing figures
against a direct numpy computation over the routes files, pooled over the domains, and against the token-weighted
mix of ``fideval.report.routing.routing`` per domain; the decomposition's free and forced means against the records'
means, routing's share against their difference and its interval against ``fideval.report.comparisons``'s paired
difference of the same two records sets on the same resamples; the route-controlled run out of the headline.
"""

from __future__ import annotations

import json
import shutil

import model_fixtures as mf
import numpy as np
import polars as pl
import pytest
import yaml
from cli_runner import run_fideval

from fideval.formats import routes as rf
from fideval.windows.layout import Sequences, length_dir, token_sha256, write_sequences

L, PER = 12, 4  # 4 windows of 12 tokens per domain
DOMAINS = ("code", "web")
B, SEED = 200, 3


@pytest.fixture(scope="module")
def ev(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report-routing")
    model = mf.build("qwen3_moe", tmp / "model")
    toks = mf.tokens(96, n=2 * PER, length=L, seed=11)
    cfg = {"run": "r", "model": {"path": str(model), "id": "toy/qwen3_moe", "revision": "local"},
           "domains": [{"name": d, "source": {"type": "local", "path": "x.jsonl"}} for d in DOMAINS],
           "teacher": {"device": "cpu", "micro_batch": 4, "mlp_tokens": None}, "score": {"cpu_check_every": 5},
           "candidates": [{"name": "mx", "quant": {"routed_experts": {"format": "mxfp4"}, "attention": {"format": "mxfp4"}},
                           "paths": ["weights-only"], "routing": "decompose"}]}
    (tmp / "c.yaml").write_text(yaml.safe_dump(cfg))
    entries = []
    for k, dom in enumerate(DOMAINS):
        ids = [f"{dom}-{i:03d}" for i in range(PER)]
        part = toks[k * PER:(k + 1) * PER]
        write_sequences(length_dir(tmp / f"w-{dom}", "windows", L), Sequences(ids, [dom] * PER, part))
        entries += [{"id": w, "domain": dom, "tokens": L, "token_sha256": token_sha256(t)} for w, t in zip(ids, part)]
        tokens = tmp / f"w-{dom}" / f"windows-{L}" / "tokens.safetensors"
        res = run_fideval("teacher", "--config", tmp / "c.yaml", "--windows", tokens, "--out", tmp / f"t-{dom}", "--routes")
        assert res.code == 0, res.stderr
        for tag, extra in (("free", ["--routes"]), ("forced", ["--routes", "--teacher-routes"])):
            res = run_fideval("score", "--config", tmp / "c.yaml", "--candidate", "mx", "--path", "weights-only",
                              "--device", "cpu", "--teacher", tmp / f"t-{dom}", "--out", tmp / f"{tag}-{dom}", *extra)
            assert res.code == 0, res.stderr
    (tmp / "eval-windows.json").write_text(json.dumps({"format": "fideval.eval-windows", "version": 2,
                                                       "windows_config": {"window_tokens": L}, "windows": entries}))
    out = {"tmp": tmp, "cfg": tmp / "c.yaml"}
    res = _report(out, tmp / "rep", free=True, forced=True, plots=True)
    assert res.code == 0, res.stderr
    out["rep"] = json.loads((tmp / "rep" / "report.json").read_text())
    return out


def _report(ev, dest, *, free=True, forced=False, plots=False, manifests=None, extra=()):
    tmp = ev["tmp"]
    recs = [x for dom in DOMAINS for tag, on in (("free", free), ("forced", forced)) if on
            for x in ("--records", tmp / f"{tag}-{dom}")]
    mans = manifests or [tmp / f"t-{dom}" / "manifest.json" for dom in DOMAINS]
    return run_fideval("report", *recs, *[x for m in mans for x in ("--teacher-manifest", m)], "--windows", tmp,
                       "--resamples", str(B), "--seed", str(SEED), "--out", dest,
                       "--plots" if plots else "--no-plots", *extra)


def _direct(tmp, tag):
    """Per (position, layer) over both domains, from the routes files: the figures as numpy arrays [layers, positions]."""
    rows = {f: [] for f in ("exact", "jaccard", "top1", "l1", "first")}
    for dom in DOMAINS:
        td, ti = rf.read_index(tmp / f"t-{dom}")
        cd, ci = rf.read_index(tmp / f"{tag}-{dom}")
        for s in sorted(ci["sequences"]):
            t, c = rf.read_sequence(td / f"{s}.safetensors"), rf.read_sequence(cd / f"{s}.safetensors")
            n_l, n_pos, _ = t["ids"].shape
            ex, jac, top, l1 = (np.zeros((n_l, n_pos)) for _ in range(4))
            for j in range(n_l):
                for p in range(n_pos):
                    a, b = set(t["ids"][j, p].tolist()), set(c["ids"][j, p].tolist())
                    ex[j, p], jac[j, p] = float(a == b), len(a & b) / len(a | b)
                    top[j, p] = float(t["ids"][j, p][np.argmax(t["weights"][j, p])] == c["ids"][j, p][np.argmax(c["weights"][j, p])])
                    wt = dict(zip(t["ids"][j, p].tolist(), t["weights"][j, p].astype(np.float64)))
                    wc = dict(zip(c["ids"][j, p].tolist(), c["weights"][j, p].astype(np.float64)))
                    l1[j, p] = sum(abs(wt.get(e, 0.0) - wc.get(e, 0.0)) for e in a | b)
            first = np.zeros((n_l, n_pos))
            for p in range(n_pos):
                differ = [j for j in range(n_l) if not ex[j, p]]
                if differ:
                    first[differ[0], p] = 1.0
            for f, x in zip(rows, (ex, jac, top, l1, first)):
                rows[f].append(x)
    return {f: np.concatenate(x, axis=1) for f, x in rows.items()}


def _set(rep, path):
    return next(e for e in rep["routing"]["sets"] if e["path"] == path)


def test_the_routing_figures_are_the_routes_pooled_over_the_domains(ev):
    from fideval.report.routing import routing

    rep, tmp = ev["rep"], ev["tmp"]
    block = rep["routing"]
    assert block["format"] == "fideval.report-routing" and block["version"] == 1
    assert (block["resamples"], block["seed"], block["confidence"]) == (B, SEED, 0.95)
    e = _set(rep, "weights-only")
    assert e["candidate"] == "mx" and e["length"] == L and e["routes_forced"] is False
    assert e["sequences"] == 2 * PER and e["windows"] == 2 * PER and e["tokens"] == 2 * PER * L
    d = _direct(tmp, "free")
    names = {"exact_agreement": "exact", "jaccard": "jaccard", "top1": "top1", "l1_drift": "l1"}
    for f, k in names.items():
        assert e["overall"][f]["estimate"] == pytest.approx(d[k].mean(), rel=1e-12, abs=1e-15), f
        for j, layer in enumerate(e["per_layer"]):
            assert layer[f]["estimate"] == pytest.approx(d[k][j].mean(), rel=1e-12, abs=1e-15), (f, j)
    for j, layer in enumerate(e["per_layer"]):
        assert layer["first_flip"]["estimate"] == pytest.approx(d["first"][j].mean(), abs=1e-15)
    any_flip = d["first"].sum(axis=0).mean()
    assert 0 < e["overall"]["any_flip"]["estimate"] == pytest.approx(any_flip, abs=1e-15)
    assert e["overall"]["exact_agreement"]["estimate"] < 1  # the MXFP4 build routes some positions elsewhere
    for f in ("exact_agreement", "top1", "l1_drift"):  # the report's window intervals, domains as strata
        blk = e["overall"][f]
        assert blk["resamples"] == B and blk["seed"] == SEED and blk["strata"] == 2 and blk["clusters"] == 2 * PER
        assert blk["ci"][0] <= blk["estimate"] <= blk["ci"][1]
    # per domain, fideval routes's own figures; pooled, their token-weighted mix (every domain has the same tokens)
    per = [routing(tmp / f"t-{dom}", tmp / f"free-{dom}", resamples=B, seed=SEED) for dom in DOMAINS]
    for f in names:
        assert e["overall"][f]["estimate"] == pytest.approx(np.mean([r["overall"][f]["estimate"] for r in per]), rel=1e-12)
    # the route-controlled run took the teacher's routes: its own recorded routes agree everywhere
    forced = _set(rep, "weights-only+teacher-routes")
    assert forced["routes_forced"] is True and forced["overall"]["exact_agreement"]["estimate"] == 1.0
    assert forced["overall"]["l1_drift"]["estimate"] == 0.0


def test_the_decomposition_is_the_records_means_and_the_paired_difference(ev):
    from fideval.report.comparisons import comparisons
    from fideval.report.figures import SetFigures
    from fideval.report.inputs import load_records, merge
    from fideval.stats.clusters import Clusters, resample_counts

    rep, tmp = ev["rep"], ev["tmp"]
    (dec,) = rep["routing"]["decomposition"]
    assert (dec["candidate"], dec["path"], dec["forced_path"], dec["length"]) == (
        "mx", "weights-only", "weights-only+teacher-routes", L)
    kld = {tag: pl.concat([pl.read_parquet(tmp / f"{tag}-{d}" / "records.parquet") for d in DOMAINS])["kld"].to_numpy()
           for tag in ("free", "forced")}
    assert dec["free_kld"]["estimate"] == pytest.approx(kld["free"].mean(), rel=1e-12)
    assert dec["forced_kld"]["estimate"] == pytest.approx(kld["forced"].mean(), rel=1e-12)
    assert dec["free_kld"] == next(r for r in rep["results"] if r["path"] == "weights-only")["overall"]["mean_kld"]
    share = dec["routing_share"]
    assert share["estimate"] == pytest.approx(kld["free"].mean() - kld["forced"].mean(), rel=1e-12)
    assert dec["routing_fraction"]["estimate"] == pytest.approx(1 - kld["forced"].mean() / kld["free"].mean(), rel=1e-12)
    lo, hi = dec["arithmetic_fraction"]["ci"]
    assert dec["routing_fraction"]["ci"] == pytest.approx([1 - hi, 1 - lo])
    # the same two records sets through the report's paired comparison of two builds, on the same resamples
    sets = merge([rs for tag in ("free", "forced") for d in DOMAINS for rs in load_records(tmp / f"{tag}-{d}")])
    pairs = {w: dm for rs in sets for w, dm in zip(rs.cols["window_id"].astype(str), rs.cols["domain"].astype(str))}
    clusters = Clusters.from_pairs(pairs)
    counts = resample_counts(clusters, B, SEED)
    strata = np.unique(np.asarray(clusters.strata), return_inverse=True)[1]
    figs = {}
    for rs in sets:
        name = "free" if rs.path == "weights-only" else "forced"
        rs.candidate, rs.path = name, "p"
        figs[rs.key] = SetFigures(rs, clusters.codes(rs.cols["window_id"]), clusters.size, counts, list(DOMAINS),
                                  confidence=0.95, seed=SEED, qs=[0.5], strata=strata)
    want = next(c for c in comparisons(figs, counts, 0.95, SEED, strata)["build_differences"] if c["minuend"] == "free")
    assert share["ci"] == want["ci"] and share["method"] == want["method"] and share["excludes"] == want["excludes"]
    assert share["cluster_bca"] == want["cluster_bca"]


def test_route_controlled_records_are_checked_but_not_a_build(ev):
    rep, tmp = ev["rep"], ev["tmp"]
    assert [r["path"] for r in rep["results"]] == ["weights-only"]
    assert not any("teacher-routes" in str(c) for c in rep["comparisons"].values())
    inputs = {(i["path"], i["records"]) for i in rep["provenance"]["inputs"]}
    assert {("weights-only+teacher-routes", str(tmp / f"forced-{d}")) for d in DOMAINS} <= inputs
    match = next(c for c in rep["checks"] if c["name"] == "windows_match")
    assert match["status"] == "pass" and match["sequences_checked"] == 4 * PER  # free and forced, both domains
    assert {s["path"] for s in rep["coverage"]["sets"]} == {"weights-only", "weights-only+teacher-routes"}
    plots = [p for p in rep["plots"] if p["kind"] == "routing"]
    assert [p["file"] for p in plots] == [f"plots/routing-mx-weights-only-{L}.png"]
    assert (tmp / "rep" / plots[0]["file"]).is_file()
    res = run_fideval("check", tmp / "rep", "--max-mean-kld", "1e-12", "--allow-not-run", "all")  # a gate every set fails
    gates = [line for line in res.stderr.splitlines() if line.startswith("FAIL gate")]
    assert res.code == 1 and len(gates) == 1 and f"mx/weights-only/{L} mean KLD" in gates[0], res.stderr


def test_the_card_and_the_results_page_show_routing(ev):
    tmp = ev["tmp"]
    res = run_fideval("card", tmp / "rep", "--out", tmp / "rep" / "README.md", "--html", tmp / "rep" / "results.html")
    assert res.code == 0, res.stderr
    card = (tmp / "rep" / "README.md").read_text()
    e = _set(ev["rep"], "weights-only")
    dec = ev["rep"]["routing"]["decomposition"][0]
    section = card.split("## Routing", 1)[1].split("\n## ", 1)[0]
    assert f"{100 * e['overall']['exact_agreement']['estimate']:.2f} %" in section
    assert f"{100 * e['overall']['top1']['estimate']:.2f} %" in section
    assert f"{100 * e['overall']['any_flip']['estimate']:.2f} %" in section
    assert f"{e['overall']['l1_drift']['estimate']:.4g}" in section
    assert f"{dec['forced_kld']['estimate']:.4g}" in section and f"{dec['routing_share']['estimate']:.4g}" in section
    assert f"(plots/routing-mx-weights-only-{L}.png)" in section
    assert "teacher-routes |" not in card.split("## Fidelity to the reference", 1)[1].split("\n## ", 1)[0]
    page = (tmp / "rep" / "results.html").read_text()
    assert "<h2>Routing</h2>" in page and f'src="plots/routing-mx-weights-only-{L}.png"' in page
    # a page written into another folder than the card links the plot through the card's folder
    res = run_fideval("card", tmp / "rep", "--out", tmp / "rep" / "README.md", "--html", tmp / "pages" / "r.html")
    assert res.code == 0, res.stderr
    src = f"../rep/plots/routing-mx-weights-only-{L}.png"
    assert f'src="{src}"' in (tmp / "pages" / "r.html").read_text() and (tmp / "pages" / src).is_file()


def test_records_without_routes_give_no_routing_block(ev, tmp_path):
    tmp = ev["tmp"]
    with_routes = _report(ev, tmp_path / "a")
    assert with_routes.code == 0, with_routes.stderr
    a = json.loads((tmp_path / "a" / "report.json").read_text())
    assert [e["path"] for e in a["routing"]["sets"]] == ["weights-only"] and a["routing"]["decomposition"] == []
    moved = [tmp / f"free-{d}" / "routes" for d in DOMAINS]
    try:
        for m in moved:
            m.rename(m.with_name("routes.off"))
        res = _report(ev, tmp_path / "b")
    finally:
        for m in moved:
            m.with_name("routes.off").rename(m)
    assert res.code == 0, res.stderr
    b = json.loads((tmp_path / "b" / "report.json").read_text())
    assert b["version"] == 4 and b["routing"] is None  # no block
    a["routing"] = None
    assert a == b  # otherwise the same report


def test_a_candidates_routes_without_the_teachers_are_one_line(ev, tmp_path):
    tmp = ev["tmp"]
    shutil.copytree(tmp / "t-code", tmp_path / "bare", ignore=shutil.ignore_patterns("routes"))
    res = _report(ev, tmp_path / "r", manifests=[tmp_path / "bare" / "manifest.json", tmp / "t-web" / "manifest.json"])
    assert res.code == 2 and res.stderr.count("\n") == 1, res.stderr
    assert f"{tmp / 'free-code'} has routes" in res.stderr and "has none beside it" in res.stderr
    assert "fideval teacher --routes --out" in res.stderr
    assert not (tmp_path / "r").exists()
