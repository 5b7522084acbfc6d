"""A config selecting the reference code (``model.implementation: reference``) through the snakemake workflow end
to end on a CPU: the demo model (a trained tiny DeepSeek-V3) with ``inference/`` linked to DeepSeek's own code,
one domain, three 256-token windows, the demo's MXFP4-experts candidate on both paths and the noise floor. The
oracle is what the run must record: every teacher store was computed by the vendor's code (its model.py's
SHA-256, the driver's kernels), report.json carries that provenance and the implementation, and every figure
is a real number."""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import ref_deepseek_v3 as rv3
import yaml
from test_reference_validate import demo_with_code

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


def test_reference_config_runs_the_workflow_end_to_end(tmp_path):
    model = demo_with_code(tmp_path / "demo-v3")
    cfg = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    cfg["run"] = "demo-reference"
    cfg["model"].update(path=str(model), implementation="reference", trust_remote_code=True)
    cfg["domains"] = [d for d in cfg["domains"] if d["name"] == "prose"]
    cfg["windows"].update(window_tokens=256, cut_tokens=128, windows_per_domain=3)
    cfg["teacher"].update(device="cpu")
    cfg["report"]["resamples"] = 200
    path = tmp_path / "reference.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    work = tmp_path / "work"
    work.mkdir()
    args = [sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"), "--directory", str(work),
            "--configfile", str(path), "--cores", "2"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]

    report = json.loads((work / "reports" / cfg["run"] / "report.json").read_text())
    sha = hashlib.sha256((rv3.V3_CODE / "model.py").read_bytes()).hexdigest()
    teachers = [json.loads(m["meta"]["teacher"]) for m in report["provenance"]["teacher_manifests"]]
    assert teachers and all(t["implementation"] == "reference" for t in teachers)
    assert all(t["reference_code"]["files"]["model.py"] == sha for t in teachers)
    ref = report["provenance"]["reference"]
    assert ref["implementation"] == "reference" and ref["trust_remote_code"] is True
    assert ref["reference_code"]["files"]["model.py"] == sha
    assert ref["reference_code"]["modules"] == {"kernel": "fideval.model.reference.deepseek_v3_kernels"}
    results = {(x["path"], x["length"]): x["overall"] for x in report["results"]}
    assert {p for p, _ in results} == {"serving", "weights-only"} and len({n for _, n in results}) == 2
    for overall in results.values():
        kld = overall["mean_kld"]
        assert math.isfinite(kld["estimate"]) and 0 < kld["estimate"] < 5
        assert 0.3 < overall["top1"]["estimate"] <= 1
