"""bench/v41_layers.py --scale small end to end on a CPU: the release-layout checkpoint, ``fideval teacher`` (reference
code, hidden store), ``fideval score --config`` (MXFP4 experts, serving), its JSON and its table (the GPU run at
real layer sizes is the bench's own)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import run_fideval

ROOT = Path(__file__).resolve().parent.parent
V41 = ROOT.parent / "shared" / "reference-code" / "deepseek-v4.1-flash"

pytestmark = pytest.mark.skipif(not (V41 / "model.py").is_file(), reason="the vendor's V4.1-Flash code is not in ../shared")


def test_small_bench_runs_the_verbs_and_writes_sane_figures(tmp_path):
    out = tmp_path / "v41.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "v41_layers.py"), "--scale", "small", "--dir", str(tmp_path / "w"),
                        "--json", str(out)], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    # the layers: the release's layout prefix holding an Engram layer, a compressed-KV owner and a reader
    kinds = " | ".join(d["kind"] for d in res["layers"])
    assert res["config"]["n_layers"] == 4 and "engram" in kinds and "owner" in kinds and "reader" in kinds
    # the checkpoint in the release's storage: FP4 experts packed in I8 with E8M0 scales, FP8 linears, FP8 Engram rows
    import torch

    from fideval.model.weights.checkpoint import Checkpoint

    ck = Checkpoint(Path(res["checkpoint"]))
    d, inter = res["config"]["dim"], 64
    assert (ck.info("layers.3.ffn.experts.0.w1.weight").dtype, tuple(ck.info("layers.3.ffn.experts.0.w1.weight").shape)) == \
        (torch.int8, (inter, d // 2))
    assert ck.info("layers.3.ffn.experts.0.w1.scale").dtype == torch.float8_e8m0fnu
    assert ck.info("layers.2.attn.wq_a.weight").dtype == torch.float8_e4m3fn
    assert ck.info("layers.1.engram.embed.weight").shape[0] == res["config"]["engram_num_embeddings"][0]
    assert "layers.2.attn.compressor.wkv.weight" in ck and "layers.3.attn.compressor.wkv.weight" not in ck
    # the verbs' figures
    t, c = res["teacher"], res["candidate"]
    assert res["tokens"] == 2 * 32 and t["profile"]["tokens"] == res["tokens"] and t["profile"]["tokens_per_s"] > 0
    assert set(t["profile"]["parts"]) >= {"attention", "moe", "startup"}
    assert c["rows"] == 2 * 31 and math.isfinite(c["mean_kld"]) and 0 < c["mean_kld"] < 5
    assert t["peak_host"] > 1e8 and c["peak_host"] > 1e8
    assert 0 < t["store_bytes"] < 1e8 and res["verify"]["ok"]
    assert run_fideval("verify", res["store"]).code == 0
    for role in ("teacher", "candidate"):
        m = res["v41_layers"][role]
        assert m["layer_s_per_token"] > 0 and m["f_layers"] > 0 and m["n_layers"] == 4
    assert res["extrapolation"]["seconds"] > 0 and set(res["extrapolation"]["lengths"]) == {"2048", "8192"}
    # the seed's MXFP4 experts on the FP4 release: the loader keeps the stored experts (its probe says MXFP4 leaves
    # them unchanged) instead of decoding, transforming and re-encoding them on the host
    assert res["mxfp4_transform"]["kept"] and res["mxfp4_transform"]["probe_s"] > 0  # at --scale small both take ms
    table = [ln for ln in r.stdout.splitlines() if ln.startswith("| ")]
    assert any(ln.startswith("| teacher: time per part") for ln in table) and len(table) > 12
