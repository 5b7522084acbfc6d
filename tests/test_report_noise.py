"""The noise floor: the reference against itself under a harmless change, scored like a build; builds whose
interval reaches it are indistinguishable from the reference (report.json and the card)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import synthetic as syn  # tests/synthetic.py
from cli_runner import run_fideval

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    root = tmp_path_factory.mktemp("noise")
    windows = syn.window_ids(["code", "chat"], 16)
    args = []
    for cand, eff in (("q4", 1.0), ("q0", 0.0105)):
        df = syn.records_frame(cand, "serving", 64, 64, windows, effect=eff, seed=1)
        args += ["--records", str(syn.write_records(root / cand, df, cand, "serving", 64))]
    df = syn.records_frame("noise-floor", "store", 64, 64, windows, effect=0.01, seed=1)
    noise = syn.write_records(root / "noise", df, "noise-floor", "store", 64)
    syn.write_eval_windows(root, windows, 64)
    res = run_fideval("report", *args, "--noise-floor", str(noise), "--windows", str(root), "--out",
                      str(root / "report"), "--resamples", "500", "--no-plots")
    assert res.code == 0, res.stderr
    return root / "report"


def test_noise_floor_in_report(out):
    rep = json.loads((out / "report.json").read_text())
    assert [r["candidate"] for r in rep["results"]] == ["q0", "q4"]  # the floor is not a result
    (f,) = rep["noise_floor"]
    assert (f["candidate"], f["path"], f["length"], f["clusters"]) == ("noise-floor", "store", 64, 32)
    m = f["mean_kld"]
    assert m["method"].startswith("cluster-bootstrap-t-log") and m["ci"][0] < m["estimate"] < m["ci"][1]
    assert f["top1"]["wilson"]["method"] == "wilson" and f["inputs"][0]["records"].endswith("noise")
    v = {b["candidate"]: b for b in f["builds"]}
    assert v["q4"]["verdict"] == "above the noise floor" and not v["q4"]["overlaps"]
    assert v["q0"]["verdict"] == "indistinguishable from the reference" and v["q0"]["overlaps"]
    assert v["q4"]["ci"] == next(r for r in rep["results"] if r["candidate"] == "q4")["overall"]["mean_kld"]["ci"]


def test_noise_floor_in_the_card(out, tmp_path):
    for cand, verdict in (("q4", "above the noise floor"), ("q0", "indistinguishable from the reference")):
        card = tmp_path / f"{cand}.md"
        code, _, err = run_fideval("card", str(out / "report.json"), "--candidate", cand, "--out", str(card))
        assert code == 0, err
        text = card.read_text()
        assert "## Noise floor" in text and "| store | 64 | " in text and f"serving: {verdict} |" in text


@pytest.mark.slow
def test_noise_floor_of_the_demo_model_on_one_domain(tmp_path):
    """The workflow's noise-floor path on a tiny config (the demo model, one domain of cuts): the teacher again
    with another micro-batch, scored against the first store, into the report and the card."""
    env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

    def fideval(*args):
        r = run_fideval(*args, env=env, cwd=ROOT, fresh_process=True, timeout=900)
        assert r.code == 0, r.stderr[-3000:]
        return r

    w, ref, other = tmp_path / "windows", tmp_path / "teacher", tmp_path / "teacher-noise"
    fideval("windows", "configs/demo.yaml", "--out", str(w))
    common = ("--config", "configs/demo.yaml", "--windows", str(w), "--kind", "cuts", "--domain", "math", "--device", "cpu")
    fideval("teacher", *common, "--out", str(ref))
    fideval("teacher", *common, "--micro-batch", "2", "--out", str(other))
    noise, build = tmp_path / "records-noise", tmp_path / "records-mxfp4"
    fideval("score", "--teacher", str(ref), "--candidate", str(other), "--name", "noise-floor", "--device", "cpu",
            "--out", str(noise))
    fideval("score", "--config", "configs/demo.yaml", "--candidate", "mxfp4", "--path", "weights-only",
            "--teacher", str(ref), "--device", "cpu", "--out", str(build))
    # one domain of the windows on purpose (a quick noise floor): a report marked partial
    fideval("report", "--records", str(build), "--noise-floor", str(noise), "--windows", str(w), "--out",
            str(tmp_path / "report"), "--resamples", "1000", "--no-plots", "--allow-partial")
    rep = json.loads((tmp_path / "report" / "report.json").read_text())
    (f,) = rep["noise_floor"]
    (r,) = rep["results"]
    assert (f["candidate"], f["path"], f["length"], f["rows"]) == ("noise-floor", "store", 512, r["rows"])
    assert 0.0 <= f["mean_kld"]["estimate"] < r["overall"]["mean_kld"]["estimate"]
    (v,) = f["builds"]
    assert v["candidate"] == "mxfp4" and v["verdict"] in ("above the noise floor", "indistinguishable from the reference")
    fideval("card", str(tmp_path / "report" / "report.json"), "--out", str(tmp_path / "README.md"))
    assert "## Noise floor" in (tmp_path / "README.md").read_text()
