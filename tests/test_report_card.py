"""`fideval card`: front matter parsed back by huggingface_hub's ModelCard, byte-identical regeneration,
user templates, and the tables' numbers against report.json."""

from __future__ import annotations

import json
import os

import pytest
import synthetic as syn  # tests/synthetic.py
import yaml
from cli_runner import run_fideval


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("card")
    windows = syn.window_ids(["code", "chat"], 5)
    args = []
    for cand, path, eff in (("q4", "serving", 1.2), ("q4", "weights-only", 1.0), ("q8", "serving", 0.4)):
        df = syn.records_frame(cand, path, 128, 128, windows, effect=eff)
        args += ["--records", str(syn.write_records(root / f"{cand}-{path}", df, cand, path, 128))]
    syn.write_eval_windows(root, windows, 128)
    res = run_fideval("report", *args, "--windows", str(root), "--out", str(root / "report"), "--resamples", "400")
    assert res.code == 0, res.stderr
    return root / "report"


def test_card_parses_with_modelcard_and_matches_report(report_dir, tmp_path):
    from huggingface_hub import ModelCard

    out = tmp_path / "site" / "README.md"
    code, _, err = run_fideval("card", str(report_dir / "report.json"), "--out", str(out), "--candidate", "q4")
    assert code == 0, err
    text = out.read_text()
    assert "!!python" not in text and "nan" not in text.split("---")[1].lower()
    rep = json.loads((report_dir / "report.json").read_text())
    card = ModelCard(text)
    assert card.data.base_model == "fideval/demo-moe"
    assert "fideval" in card.data.tags
    results = card.data.eval_results
    mine = [r for r in rep["results"] if r["candidate"] == "q4"]
    assert len(results) == len(mine) * 6  # mean KLD, 4 quantiles, top-1 per (path, length)
    for r in mine:
        got = {e.metric_type: e for e in results if e.dataset_args["path"] == r["path"]}
        assert got["mean_kld"].metric_value == r["overall"]["mean_kld"]["estimate"]
        assert got["mean_kld"].metric_args["ci_low"] == r["overall"]["mean_kld"]["ci"][0]
        assert got["kld_p99.9"].metric_value == r["overall"]["kld_quantiles"][3]["estimate"]
        assert got["top1_agreement"].metric_value == r["overall"]["top1"]["estimate"]
        assert got["mean_kld"].dataset_revision == rep["provenance"]["dataset"]["windows_file_sha256"]
    fm = yaml.safe_load(text.split("---\n")[1])
    xf = fm["x_fidelity"]
    assert xf["reference"] == {"model": "fideval/demo-moe", "revision": "0" * 40}
    assert xf["role"] == "quantized-candidate" and xf["spec_version"] == 1
    assert xf["measured_by"]["report_sha256"] and xf["scope"]["paths"] == ["serving", "weights-only"]
    # tables: headline, per-domain, comparison against q8; plots linked relative to the card
    m = mine[0]["overall"]["mean_kld"]
    assert f"| serving | 128 | {m['estimate']:.4g} [{m['ci'][0]:.4g}, {m['ci'][1]:.4g}] |" in text
    ratio = next(c for c in rep["comparisons"]["builds"] if c["numerator"] == "q4" and c["path"] == "serving")
    assert f"| q8 | serving | 128 | {ratio['estimate']:.4g} [" in text
    assert "| mean KLD serving - weights-only | 128 tokens |" in text
    for p in (p for p in rep["plots"] if p["candidate"] == "q4"):
        href = os.path.relpath(report_dir / p["file"], out.parent)
        assert f"]({href})" in text and (out.parent / href).resolve() == (report_dir / p["file"]).resolve()
        assert (out.parent / href).exists()


def test_card_is_byte_identical(report_dir, tmp_path):
    outs = []
    for k in range(2):
        out = tmp_path / f"R{k}.md"
        assert run_fideval("card", str(report_dir), "--out", str(out), "--candidate", "q8")[0] == 0
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]


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
    assert "mean KLD [bootstrap-t 95 %]" in text and "top-1 agreement [bootstrap-t 95 %]" in text
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
    assert "mean KLD [BCa 95 %]" in text and "top-1 agreement [Wilson 95 %]" in text
    assert "beside the default" not in text and "This build" not in text
    assert run_fideval("check", str(p))[0] == 0
