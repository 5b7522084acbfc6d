"""`fideval card`: front matter parsed back by huggingface_hub's ModelCard, byte-identical regeneration,
user templates, and the tables' numbers against report.json."""

from __future__ import annotations

import hashlib
import json
import os

import pytest
import synthetic as syn  # tests/synthetic.py
import yaml
from cli_runner import run_fideval

Q4_INFO = {  # score.json's candidate_info of an emulated candidate (fideval.score.hooks_of._emulated)
    "model_id": "fideval/demo-moe", "model_revision": "0" * 40, "source": "emulated",
    "quant": {"routed_experts": {"format": "mxfp4", "recipe": "rceil"}},
    "bits_per_weight": {"per_class": {"routed_experts": {"bpw": 4.25}, "lm_head": {"bpw": 16.0}},
                        "total": {"params": 1000, "bits": 5000.0, "bpw": 5.0}},
}


def _report(root, store="store"):
    windows = syn.window_ids(["code", "chat"], 5)
    args = []
    for cand, path, eff in (("q4", "serving", 1.2), ("q4", "weights-only", 1.0), ("q8", "serving", 0.4)):
        df = syn.records_frame(cand, path, 128, 128, windows, effect=eff)
        info = {**Q4_INFO, "activations": path} if cand == "q4" else None
        d = syn.write_records(root / f"{cand}-{path}", df, cand, path, 128, store=store, candidate_info=info)
        args += ["--records", str(d)]
    syn.write_eval_windows(root, windows, 128)
    res = run_fideval("report", *args, "--windows", str(root), "--out", str(root / "report"), "--resamples", "400",
                      "--no-plots" if store != "store" else "--plots")
    assert res.code == 0, res.stderr
    return root / "report"


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory):
    return _report(tmp_path_factory.mktemp("card"))


def _tokens_hash(eval_windows):
    """The windows' content hash, from eval-windows.json directly: sorted "<id> <token sha256>" lines."""
    wins = sorted(json.loads(eval_windows.read_text())["windows"], key=lambda w: w["id"])
    return hashlib.sha256("".join(f"{w['id']} {w['token_sha256']}\n" for w in wins).encode()).hexdigest()


def test_card_parses_with_modelcard_and_matches_report(report_dir, tmp_path):
    from huggingface_hub import ModelCard

    out = tmp_path / "site" / "README.md"
    code, _, err = run_fideval("card", str(report_dir / "report.json"), "--out", str(out), "--candidate", "q4",
                               "--registry", "https://example.org/fidelity", "--lane", "community")
    assert code == 0, err
    text = out.read_text()
    assert "!!python" not in text and ".nan" not in text.split("---")[1].lower()
    rep = json.loads((report_dir / "report.json").read_text())
    card = ModelCard(text)
    assert card.data.base_model == "fideval/demo-moe"
    assert "fideval" in card.data.tags
    results = card.data.eval_results
    mine = [r for r in rep["results"] if r["candidate"] == "q4"]
    assert len(results) == len(mine) * 6  # mean KLD, 4 quantiles, top-1 per (path, length)
    # each (path, length) its own model-index result, as the Hub groups them
    assert len({e.unique_identifier for e in results}) == len(mine)
    assert {e.task_type for e in results} == {"text-generation"}
    assert {e.metric_type for e in results} == {"kl_divergence", "top1_agreement"}
    revision = _tokens_hash(report_dir.parent / "eval-windows.json")
    for r in mine:
        got = {(e.metric_type, e.metric_config): e for e in results if e.dataset_args["path"] == r["path"]}
        mean, top1 = got[("kl_divergence", "mean")], got[("top1_agreement", None)]
        assert mean.dataset_config == f"{r['path']}-128" and mean.dataset_revision == revision
        assert mean.metric_value == r["overall"]["mean_kld"]["estimate"]
        assert mean.metric_args["ci_low"] == r["overall"]["mean_kld"]["ci"][0]
        assert {k: mean.metric_args[k] for k in ("units", "higher_is_better", "direction", "estimator")} == {
            "units": "nats/token", "higher_is_better": False, "direction": "reference_to_candidate",
            "estimator": "full_vocabulary_fp64"}
        assert top1.metric_args["higher_is_better"] is True and top1.metric_args["direction"] == "reference_to_candidate"
        p999, q = got[("kl_divergence", "p99.9")], r["overall"]["kld_quantiles"][3]
        assert p999.metric_value == q["estimate"] and p999.metric_args["ci_low"] == q["ci"][0]
        assert "few_tail_windows" in q["flags"] and p999.metric_args.get("ci_high") is None  # 10 windows: no upper bound
        assert top1.metric_value == r["overall"]["top1"]["estimate"]
        shown = r["overall"]["top1"] if "ci" in r["overall"]["top1"] else r["overall"]["top1"]["wilson"]
        assert top1.metric_args["ci_high"] == shown["ci"][1]  # the interval the card prints
    fm = yaml.safe_load(text.split("---\n")[1])
    xf = fm["x_fidelity"]
    assert xf["spec_version"] == "fidelity-provenance/v1" and xf["role"] == "quantized-candidate"
    assert (xf["reference_model"], xf["reference_revision"]) == ("fideval/demo-moe", "0" * 40)
    assert xf["fidelity_dataset"] == "fideval-windows (local, not published)"
    assert (xf["registry"], xf["lane"]) == ("https://example.org/fidelity", "community")
    assert xf["head_bits"] == 16.0 and xf["teacher_kind"] == "logits"
    assert xf["candidate"]["quant"] == Q4_INFO["quant"] and xf["candidate"]["bits_per_weight"] == 5.0
    assert xf["candidate"]["model_revision"] == "0" * 40
    assert xf["measured_by"]["report_sha256"] == hashlib.sha256((report_dir / "report.json").read_bytes()).hexdigest()
    assert xf["scope"]["paths"] == ["serving", "weights-only"] and xf["scope"]["windows"] == 10
    assert xf["measured_by"]["scoring_hardware"] == "cpu" and xf["measured_by"]["scoring_kernel"] == "torch"
    # tables: headline per length, per-domain line, comparison against q8; plots linked relative to the card
    m = mine[0]["overall"]["mean_kld"]
    assert "### 128 tokens" in text
    assert f"| serving | {m['estimate']:.4g} [{m['ci'][0]:.4g}, {m['ci'][1]:.4g}] |" in text
    dom = {d: mine[0]["domains"][d]["mean_kld"]["estimate"] for d in ("chat", "code")}
    assert rep["settings"]["domains"] == ["chat", "code"]
    assert f"- serving, 128 tokens: chat {dom['chat']:.3g}, code {dom['code']:.3g}\n" in text
    ratio = next(c for c in rep["comparisons"]["builds"] if c["numerator"] == "q4" and c["path"] == "serving")
    assert f"| q8 | serving | 128 | {ratio['estimate']:.4g} [" in text
    assert "| mean KLD serving - weights-only | 128 tokens |" in text
    assert ("5 of 7 integrity checks passed; not run (their inputs were not given, so nothing is claimed for them): "
            "self_score_zero, canary_identical.") in text
    assert "bits per weight 5.0; head bits 16.0" in text
    for p in (p for p in rep["plots"] if p["candidate"] == "q4"):
        href = os.path.relpath(report_dir / p["file"], out.parent)
        assert f"]({href})" in text and (out.parent / href).resolve() == (report_dir / p["file"]).resolve()
        assert (out.parent / href).exists()


def test_card_survives_huggingface_hub_round_trips(report_dir, tmp_path):
    from huggingface_hub import ModelCard
    from huggingface_hub.repocard_data import eval_results_to_model_index, model_index_to_eval_results

    out = tmp_path / "README.md"
    assert run_fideval("card", str(report_dir), "--out", str(out), "--candidate", "q4")[0] == 0
    card = ModelCard.load(out)
    card.save(tmp_path / "saved.md")
    assert (tmp_path / "saved.md").read_bytes() == out.read_bytes()
    index = yaml.safe_load(out.read_text().split("---\n")[1])["model-index"]
    name, results = model_index_to_eval_results(index)
    assert name == "q4" and len(index[0]["results"]) == 2 and len(results) == 12
    assert eval_results_to_model_index(name, results) == index


def test_published_windows_and_stable_revision(tmp_path):
    """Teacher logits from one Hub dataset at one revision: the card names it and takes its commit; the
    windows' content hash does not move when eval-windows.json changes in what it records about fideval."""
    rev = "c0ffee" + "0" * 34
    rep_dir = _report(tmp_path, store=f"hf://datasets/org/fidelity-logits@{rev}/cuts")
    out = tmp_path / "README.md"
    assert run_fideval("card", str(rep_dir), "--out", str(out), "--candidate", "q8")[0] == 0
    fm = yaml.safe_load(out.read_text().split("---\n")[1])
    assert fm["x_fidelity"]["fidelity_dataset"] == f"org/fidelity-logits@{rev} (cuts-128)"
    ds = fm["model-index"][0]["results"][0]["dataset"]
    assert (ds["type"], ds["revision"]) == ("org/fidelity-logits", rev)
    assert fm["x_fidelity"]["head_bits"] is None and fm["x_fidelity"]["candidate"]["bits_per_weight"] is None
    tokens = fm["x_fidelity"]["dataset"]["tokens_sha256"]
    assert tokens == _tokens_hash(tmp_path / "eval-windows.json")
    # the same windows listed by another fideval release: another file hash, the same content hash
    ew = json.loads((tmp_path / "eval-windows.json").read_text())
    (tmp_path / "eval-windows.json").write_text(json.dumps({**ew, "provenance": {"git_commit": "f" * 40}}))
    rep2 = json.loads((rep_dir / "report.json").read_text())
    res = run_fideval("report", *[a for p in rep2["provenance"]["inputs"] for a in ("--records", p["records"])],
                      "--windows", str(tmp_path), "--out", str(tmp_path / "r2"), "--resamples", "100", "--no-plots")
    assert res.code == 0, res.stderr
    rep3 = json.loads((tmp_path / "r2" / "report.json").read_text())
    assert rep3["provenance"]["dataset"]["windows_file_sha256"] != rep2["provenance"]["dataset"]["windows_file_sha256"]
    assert run_fideval("card", str(tmp_path / "r2"), "--out", str(out), "--candidate", "q8")[0] == 0
    assert yaml.safe_load(out.read_text().split("---\n")[1])["x_fidelity"]["dataset"]["tokens_sha256"] == tokens


def test_card_is_byte_identical(report_dir, tmp_path):
    outs = []
    for k in range(2):
        out = tmp_path / f"R{k}.md"
        assert run_fideval("card", str(report_dir), "--out", str(out), "--candidate", "q8")[0] == 0
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]


def test_results_page_holds_the_card_tables(report_dir, tmp_path):
    """`--html`: the card's tables as HTML (snakemake --report's results page), no YAML, no plots, stable."""
    pages = []
    for k in range(2):
        code, _, err = run_fideval("card", str(report_dir), "--out", str(tmp_path / "README.md"), "--candidate", "q4",
                                   "--html", str(tmp_path / f"results{k}.html"))
        assert code == 0, err
        pages.append((tmp_path / f"results{k}.html").read_text())
    page = pages[0]
    assert pages[0] == pages[1] and page.startswith("<!DOCTYPE html>")
    rep = json.loads((report_dir / "report.json").read_text())
    for r in (r for r in rep["results"] if r["candidate"] == "q4"):
        m = r["overall"]["mean_kld"]
        assert f"<td>{r['path']}</td>\n<td>{m['estimate']:.4g} [{m['ci'][0]:.4g}, {m['ci'][1]:.4g}]</td>" in page
    assert "<h3>128 tokens</h3>" in page and "<h2>Integrity checks</h2>" in page
    assert "model-index" not in page and "<img" not in page and "Plots" not in page


def test_user_template_replaces_body(report_dir, tmp_path):
    t = tmp_path / "body.md.j2"
    t.write_text("# {{ card.candidate }}\n\nmean KLD {{ card.headline[0].mean }}\n")
    out = tmp_path / "README.md"
    code, _, err = run_fideval("card", str(report_dir), "--out", str(out), "--candidate", "q8", "--template", str(t))
    assert code == 0, err
    text = out.read_text()
    fm, body = text.split("---\n")[1], text.split("---\n", 2)[2]
    assert "model-index" in fm
    rep = json.loads((report_dir / "report.json").read_text())
    m = next(r for r in rep["results"] if r["candidate"] == "q8")["overall"]["mean_kld"]
    assert body == f"\n# q8\n\nmean KLD {m['estimate']:.4g} [{m['ci'][0]:.4g}, {m['ci'][1]:.4g}]\n"
    t.write_text("{{ card.no_such_field }}\n")
    code, _, err = run_fideval("card", str(report_dir), "--out", str(out), "--candidate", "q8", "--template", str(t))
    assert code == 2 and err.count("\n") == 1 and "no_such_field" in err


def test_card_needs_candidate_when_several(report_dir, tmp_path):
    code, _, err = run_fideval("card", str(report_dir), "--out", str(tmp_path / "R.md"))
    assert code == 2 and "holds 2 candidates (q4, q8)" in err and "--candidate" in err
    code, _, err = run_fideval("card", str(report_dir), "--out", str(tmp_path / "R.md"), "--candidate", "q2")
    assert code == 2 and "'q2' is not in the report" in err


def test_card_labels_each_interval_and_prints_the_others_beside(report_dir, tmp_path):
    out = tmp_path / "README.md"
    assert run_fideval("card", str(report_dir), "--out", str(out), "--candidate", "q4")[0] == 0
    text = out.read_text()
    rep = json.loads((report_dir / "report.json").read_text())
    r = next(r for r in rep["results"] if (r["candidate"], r["path"]) == ("q4", "serving"))
    m, t = r["overall"]["mean_kld"], r["overall"]["top1"]
    assert "Mean KLD [bootstrap-t 95 %]" in text and "Top-1 [bootstrap-t 95 %]" in text
    assert "[BCa 95 %]" not in text and "[Wilson 95 %]" not in text  # no interval under another's name
    bca, wil = m["cluster_bca"]["ci"], t["wilson"]["ci"]
    assert (f"| serving | 128 | {m['estimate']:.4g} [{bca[0]:.4g}, {bca[1]:.4g}] | "
            f"{100 * t['estimate']:.2f} % [{100 * wil[0]:.2f}, {100 * wil[1]:.2f}] |") in text
    # the comparison sentence comes with its interval and says whether it excludes 1
    c = next(c for c in rep["comparisons"]["builds"] if c["numerator"] == "q4" and c["path"] == "serving")
    assert c["estimate"] > 1 and c["excludes"]
    assert (f"- This build raises the mean KLD {c['estimate']:.3g} times [{c['ci'][0]:.3g}, {c['ci'][1]:.3g}] "
            f"against q8 (serving, 128 tokens) (95 % bootstrap-t); the interval excludes 1") in text
    fm = yaml.safe_load(text.split("---\n")[1])
    top1 = next(m for m in fm["model-index"][0]["results"][0]["metrics"] if m["type"] == "top1_agreement")
    assert top1["args"]["interval"] == t["method"] and t["method"].startswith("cluster-bootstrap-t-logit")


def test_a_version_1_report_keeps_its_card(report_dir, tmp_path):
    """An older report (BCa means, iid Wilson top-1, no views) is read and its card labels them as such."""
    rep = json.loads((report_dir / "report.json").read_text())
    old = json.loads(json.dumps(rep))
    old["version"] = 1
    for k in ("noise_floor",):
        old.pop(k)
    for k in ("strata", "intervals"):
        old["settings"].pop(k)
    for r in old["results"]:
        r.pop("views")
        for name in ("mean_kld", "mean_rkld", "mean_delta_nll"):
            f = r["overall"][name]
            r["overall"][name] = {**{k: v for k, v in f.items() if k != "cluster_bca"}, **f["cluster_bca"]}
        for name in ("top1", "top5", "top10"):
            f = r["overall"][name]
            r["overall"][name] = {k: f[k] for k in ("estimate", "rows", "clusters", "wilson", "wilson_deff",
                                                    "cluster_bca")}
    p = tmp_path / "report.json"
    p.write_text(json.dumps(old))
    out = tmp_path / "README.md"
    code, _, err = run_fideval("card", str(p), "--out", str(out), "--candidate", "q4")
    assert code == 0, err
    text = out.read_text()
    assert "Mean KLD [BCa 95 %]" in text and "Top-1 [Wilson 95 %]" in text
    assert "beside the default" not in text and "This build" not in text
    assert run_fideval("check", str(p), "--allow-not-run", "all")[0] == 0  # read and gated as before


def test_the_llamacpp_path_is_paired_with_weights_only_and_named_in_the_card(tmp_path):
    """A GGUF build scored on the llamacpp path (ggml's activation rounding) and on weights-only: the report pairs the
    two as it pairs serving with weights-only, and the card says what the llamacpp path measures."""
    windows = syn.window_ids(["code", "chat"], 5)
    args = []
    for path, eff in (("llamacpp", 1.3), ("weights-only", 1.0)):
        df = syn.records_frame("q4", path, 128, 128, windows, effect=eff)
        args += ["--records", str(syn.write_records(tmp_path / path, df, "q4", path, 128, candidate_info=Q4_INFO))]
    res = run_fideval("report", *args, "--out", str(tmp_path / "report"), "--resamples", "200", "--no-plots")
    assert res.code == 0, res.stderr
    rep = json.loads((tmp_path / "report" / "report.json").read_text())
    (c,) = rep["comparisons"]["paths"]
    assert (c["minuend"], c["subtrahend"], c["candidate"]) == ("llamacpp", "weights-only", "q4")
    res = run_fideval("card", str(tmp_path / "report" / "report.json"), "--out", str(tmp_path / "card" / "README.md"))
    assert res.code == 0, res.stderr
    text = (tmp_path / "card" / "README.md").read_text()
    assert "| mean KLD llamacpp - weights-only | 128 tokens |" in text
    assert "*llamacpp*: the GGUF's weights as stored, each quantized matmul's input rounded as llama.cpp's CPU backend" in text
