"""The committed demo report (reports/demo/) is what the current code produces.

Re-running the whole demo takes minutes, so the test reproduces its three layers separately: the
windows (every token SHA-256), one domain through teacher and candidate (its mean KLD and top-1 against
the committed per-domain figures), and the card (byte-identical from the committed report.json).
"""

import json
import shutil
from pathlib import Path

import pytest
from cli_runner import Result, run_fideval

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "reports" / "demo"
REPORT = json.loads((DEMO / "report.json").read_text())


def fideval(*args: str, cwd: Path = ROOT) -> Result:
    # One torch thread, as the workflow's model jobs run (threads: 1), so float sums keep their order: a fresh
    # process, since torch reads these at import.
    r = run_fideval(*args, cwd=cwd, env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}, fresh_process=True, timeout=900)
    assert r.code == 0, r.stderr[-3000:]
    return r


@pytest.fixture(scope="module")
def windows(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("demo") / "windows"
    fideval("windows", "configs/demo.yaml", "--out", str(out))
    return out


def test_card_regenerates_byte_identical(tmp_path):
    shutil.copy(DEMO / "report.json", tmp_path / "report.json")
    shutil.copytree(DEMO / "plots", tmp_path / "plots")  # the card links only the plots that are beside it
    shutil.copytree(DEMO / "family", tmp_path / "family")  # the three builds compared at once (the workflow's compare)
    fideval("card", str(tmp_path / "report.json"), "--candidate", "mxfp4", "--out", str(tmp_path / "README.md"),
            "--comparison", str(tmp_path / "family" / "comparison.json"))
    assert (tmp_path / "README.md").read_bytes() == (DEMO / "README.md").read_bytes()


def test_demo_card_is_the_fidelity_card_format(tmp_path):
    """The committed card as the Hub reads it: one EvalResult per (path, length, metric), four results that
    survive ModelCard.load + save byte for byte, and every x_fidelity field of the format."""
    import yaml
    from huggingface_hub import ModelCard

    card = ModelCard.load(DEMO / "README.md")
    card.save(tmp_path / "README.md")
    assert (tmp_path / "README.md").read_bytes() == (DEMO / "README.md").read_bytes()
    results = card.data.eval_results
    own = [r for r in REPORT["results"] if r["candidate"] == "mxfp4"]  # the card is the headline build's
    assert len(results) == len(own) * 6 and len({e.unique_identifier for e in results}) == 4
    keys = {(e.dataset_args["path"], e.dataset_args["length"], e.metric_type, e.metric_config) for e in results}
    assert len(keys) == len(results)
    fm = yaml.safe_load((DEMO / "README.md").read_text().split("---\n")[1])
    xf = fm["x_fidelity"]
    assert set(xf) >= {"spec_version", "role", "reference_model", "reference_revision", "fidelity_dataset", "registry",
                       "lane", "scope", "head_bits", "measured_by"}
    assert xf["spec_version"] == "fidelity-provenance/v1"
    assert {m["type"] for r in fm["model-index"][0]["results"] for m in r["metrics"]} == {"kl_divergence", "top1_agreement"}
    for r in fm["model-index"][0]["results"]:
        assert r["task"]["type"] == "text-generation"
        for m in r["metrics"]:
            assert m["args"]["direction"] == "reference_to_candidate" and m["args"]["estimator"] == "full_vocabulary_fp64"
            assert {"units", "higher_is_better"} <= set(m["args"])


def test_check_passes_on_the_committed_report():
    r = fideval("check", str(DEMO / "report.json"), "--config", "configs/demo.yaml")
    assert "ok" in r.stdout


def test_windows_reproduce_every_token_sha256(windows):
    built = json.loads((windows / "eval-windows.json").read_text())
    got = {w["id"]: w["sha256"] for w in built["windows"]}
    committed = {w["id"]: w["token_sha256"] for w in REPORT["provenance"]["dataset"]["windows"]}
    assert len(committed) == 36 and got == committed


@pytest.mark.slow
def test_one_domain_reproduces_its_committed_figures(windows, tmp_path):
    import polars as pl

    store, records = tmp_path / "teacher", tmp_path / "records"
    fideval("teacher", "--config", "configs/demo.yaml", "--windows", str(windows), "--kind", "cuts",
            "--domain", "math", "--device", "cpu", "--out", str(store))
    fideval("score", "--config", "configs/demo.yaml", "--candidate", "mxfp4", "--path", "weights-only",
            "--teacher", str(store), "--device", "cpu", "--out", str(records))
    df = pl.read_parquet(records / "records.parquet")
    (result,) = [r for r in REPORT["results"] if (r["candidate"], r["path"], r["length"]) == ("mxfp4", "weights-only", 512)]
    committed = result["domains"]["math"]
    assert df.height == committed["rows"]
    assert df["kld"].mean() == pytest.approx(committed["mean_kld"]["estimate"], rel=1e-6)
    assert df["top1"].mean() == pytest.approx(committed["top1"]["estimate"], abs=2 / df.height)
