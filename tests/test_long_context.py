"""Long context (issue 41, item 4): windows far past the cuts, through every verb, with depth buckets to the end.

The end-to-end test runs a long-window config on the demo model, on the CPU, through `fideval validate`, `windows`,
`teacher` (both lengths), `score --config` (both lengths) and `report`. Its window is 4,096 tokens, cut into two
fresh 2,048-token sequences, not 32,768: on the CPU the runner's sdpa takes the math path for the demo's MLA
attention (q/k head dim 48, v 32) and materialises every head's L x L float32 scores, which at 32,768 tokens is
4 x 32,768^2 x 4 B = 17 GB a layer (the teacher was killed at 24 GB resident), and at 16,384 took 4 min (attention
94 s, its canary's recomputation 136 s) on the 2-core machine. 4,096 is twice the demo model's 2,048 positions, so
the run also goes through the model built for longer windows: the demo's weights with max_position_embeddings
32,768 (its default rope has no table tied to that number), which validate accepts where the demo model's own
config.json is refused. The depth buckets past 4,096 are checked on records of 32,768-token windows through
`fideval.report.build` (the records a run writes, synthetic values).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import synthetic as syn  # tests/synthetic.py
import yaml
from cli_runner import run_fideval

from fideval.report.views import depth_edges

ROOT = Path(__file__).resolve().parent.parent
DEMO_MODEL = ROOT / "fideval" / "demo" / "assets" / "model"
WINDOW, CUT = 4096, 2048


# -- the depth buckets --------------------------------------------------------------------------------------------------
def test_depth_buckets_reach_the_window_length_and_are_the_same_at_every_length():
    assert depth_edges(8192) == [0, 64, 256, 1024, 4096, 8191]  # the seed's windows: as before
    assert depth_edges(2048) == [0, 64, 256, 1024, 2047]
    assert depth_edges(32768) == [0, 64, 256, 1024, 4096, 16384, 32767]
    assert depth_edges(131072) == [0, 64, 256, 1024, 4096, 16384, 65536, 131071]
    for length in (2, 65, 128, 2048, 4097, 16385, 16386, 32768, 100_000, 1 << 20):
        edges = depth_edges(length)
        assert edges[-1] == length - 1 and edges == sorted(set(edges))
        longer = depth_edges(4 * length)
        assert longer[:len(edges) - 1] == edges[:-1]  # a longer window adds buckets past the shorter one's end


def test_a_report_on_32768_token_windows_has_depth_buckets_to_the_end(tmp_path):
    """report.json's views.depth on records of 32,768-token windows (2 domains x 3 windows, every position scored):
    six buckets, the last [16384, 32767), each bucket's mean the records' own over its rows."""
    from fideval.config import ReportConfig
    from fideval.report.build import build
    from fideval.report.inputs import load_windows

    L = 32768
    windows = syn.window_ids(["code", "legal"], 3)
    df = syn.records_frame("q4", "serving", L, L, windows, seed=3)
    folder = syn.write_records(tmp_path / "q4", df, "q4", "serving", L)
    syn.write_eval_windows(tmp_path, windows, L)
    rep = build([str(folder)], windows=load_windows(tmp_path), settings=ReportConfig(resamples=200, seed=0)).report
    (res,) = rep["results"]
    depth = res["views"]["depth"]
    assert [(d["start"], d["end"]) for d in depth] == [(0, 64), (64, 256), (256, 1024), (1024, 4096), (4096, 16384),
                                                       (16384, 32767)]
    assert sum(d["rows"] for d in depth) == df.height == 6 * (L - 1)
    for d in depth:
        part = df.filter((pl.col("position") >= d["start"]) & (pl.col("position") < d["end"]))
        assert d["rows"] == part.height
        assert d["mean_kld"]["estimate"] == pytest.approx(part["kld"].mean(), rel=1e-12)


# -- end to end on the demo model ---------------------------------------------------------------------------------------
def long_model(folder: Path) -> Path:
    """The demo model with max_position_embeddings 32,768: the same weights, tokenizer and arithmetic."""
    shutil.copytree(DEMO_MODEL, folder)
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["max_position_embeddings"] == 2048 and cfg["rope_parameters"]["rope_type"] == "default"
    cfg["max_position_embeddings"] = 32768
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return folder


def long_config(path: Path, model: Path | str) -> Path:
    """configs/long-context.yaml's shape at test size: one domain, one window of WINDOW tokens cut into CUT-token
    sequences, both lengths, the MXFP4-experts candidate on the weights-only path, the default store."""
    shipped = yaml.safe_load((ROOT / "configs" / "long-context.yaml").read_text())
    assert shipped["windows"]["cut_tokens"] == CUT and shipped["teacher"]["lengths"] == ["windows", "cuts"]
    cfg = {
        "run": "long", "model": {"path": str(model), "id": "fideval/demo-deepseek-v3-tiny"},
        "domains": [{"name": "legal", "source": {"type": "local", "path": "demo://corpus/legal.jsonl", "text_field": "text"}}],
        "windows": {"window_tokens": WINDOW, "cut_tokens": CUT, "windows_per_domain": 1, "seed": 0},
        "screen": {"calibration": []},
        "teacher": {"device": "cpu", "lengths": ["windows", "cuts"]},
        "candidates": [{**shipped["candidates"][0], "paths": ["weights-only"]}],
        "report": {"resamples": 200, "seed": 0},
    }
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def ok(*args, cwd: Path):
    r = run_fideval(*args, cwd=cwd)
    assert r.code == 0, r.stderr[-3000:]
    return r


def test_the_shipped_long_context_config_validates_where_its_model_is_not_cached(tmp_path):
    """configs/long-context.yaml (its dry run: tests/test_workflow.py, every shipped config): a note, no problem; with
    DeepSeek-V3's config.json cached it is sized (tests/test_validate_store_kind.py)."""
    env = {"HF_HUB_CACHE": str(tmp_path / "empty-hub"), "HF_HUB_OFFLINE": "1"}
    r = run_fideval("validate", ROOT / "configs" / "long-context.yaml", cwd=tmp_path, env=env, fresh_process=True)
    assert r.code == 0 and "ok (run 'long-context', 6 domains, 1 candidates)" in r.stdout, r.stderr
    assert "is not in the local Hub cache" in r.stderr
    shipped = yaml.safe_load((ROOT / "configs" / "long-context.yaml").read_text())
    assert shipped["windows"]["window_tokens"] == 32768 and shipped["teacher"]["store"] == "hidden"


def test_the_demo_models_own_positions_refuse_the_long_window(tmp_path):
    cfg = long_config(tmp_path / "c.yaml", "demo://model")
    line = run_fideval("validate", cfg, cwd=tmp_path).error()
    assert f"'windows.window_tokens': windows of {WINDOW:,} tokens are longer than the model's 2,048 positions" in line


def test_a_cpu_teacher_whose_scores_cannot_fit_is_refused_with_the_longest_window_that_fits(tmp_path, monkeypatch):
    """The demo's MLA (q/k head dim 48, v 32) takes sdpa's math path on the CPU: a 32,768-token window holds 4 heads x
    32,768^2 scores at 12 B (float32 scores and softmax: sizing's 2 b + 4), 48 GiB, on a 24 GiB machine; 22,528 tokens
    (11 cuts) is the longest that fits. The 16,384-token window the teacher ran (11.2 GB peak) passes."""
    import fideval.validate.attention as attention

    monkeypatch.setattr(attention, "host_memory", lambda: 24 << 30)
    model = long_model(tmp_path / "model")
    data = yaml.safe_load(long_config(tmp_path / "c.yaml", model).read_text())
    data["windows"]["window_tokens"] = 32768
    cfg = tmp_path / "c32k.yaml"
    cfg.write_text(yaml.safe_dump(data))
    assert 4 * 22528**2 * 12 < 24 << 30 < 4 * 24576**2 * 12
    line = run_fideval("validate", cfg, cwd=tmp_path).error()
    assert line.startswith(f"fideval: error: {cfg}: 'windows.window_tokens': windows of 32,768 tokens do not fit the CPU "
                           "teacher: its attention materialises the scores (sdpa's math path), one sequence's 48.2 GiB, "
                           "and this machine has 24.0 GiB"), line
    assert line.endswith("(lower windows.window_tokens to 22,528 or less, or run the teacher on a GPU with teacher.device: "
                         "cuda)"), line
    data["windows"]["window_tokens"] = 16384
    cfg.write_text(yaml.safe_dump(data))
    assert run_fideval("validate", cfg, cwd=tmp_path).code == 0
    # equal head dims take the CPU flash kernel: no scores, nothing to refuse
    from fideval.config import load_config

    same = {"kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 48}
    assert attention._cpu_math(load_config(cfg), same) is False
    assert attention._cpu_math(load_config(cfg), {**same, "v_head_dim": 32}) is True


@pytest.mark.slow
def test_a_long_window_config_runs_end_to_end_on_the_demo_model(tmp_path):
    t0, c0 = time.perf_counter(), time.process_time()
    model = long_model(tmp_path / "model")
    cfg = long_config(tmp_path / "long.yaml", model)
    r = ok("validate", cfg, cwd=tmp_path)
    assert f"{r.stdout}".count("teacher stores (hidden): 2 x 4,096 rows x 128 x 4 B + the head 4,096 x 128 x 4 B") == 1
    res = tmp_path / "results" / "long"
    ok("windows", cfg, "--out", res / "windows", cwd=tmp_path)
    lengths = {"windows": f"windows-{WINDOW}", "cuts": f"cuts-{CUT}"}
    for length, folder in lengths.items():
        ok("teacher", "--config", cfg, "--windows", res / "windows" / folder / "tokens.safetensors", "--domain", "legal",
           "--device", "cpu", "--out", res / "teacher" / length / "{domain}", cwd=tmp_path)
        ok("score", "--config", cfg, "--candidate", "mxfp4-experts", "--path", "weights-only", "--teacher",
           res / "teacher" / length / "{domain}", "--device", "cpu", "--domain", "legal",
           "--out", res / "records" / length / "{domain}", cwd=tmp_path)
    records = [res / "records" / length / "legal" / "records.parquet" for length in lengths]
    manifests = [res / "teacher" / length / "legal" / "manifest.json" for length in lengths]
    ok("report", "--config", cfg, "--windows", res / "windows" / "eval-windows.json",
       *[a for f in records for a in ("--records", f)], *[a for m in manifests for a in ("--teacher-manifest", m)],
       "--out", tmp_path / "reports" / "long", cwd=tmp_path)
    took, cpu = time.perf_counter() - t0, time.process_time() - c0
    rep = json.loads((tmp_path / "reports" / "long" / "report.json").read_text())
    by_length = {x["length"]: x for x in rep["results"]}
    assert set(by_length) == {WINDOW, CUT}
    window_rows = pl.read_parquet(records[0])
    assert window_rows.height == WINDOW - 1 and window_rows["position"].max() == WINDOW - 2
    assert pl.read_parquet(records[1]).height == (WINDOW // CUT) * (CUT - 1)  # each cut a fresh sequence
    for length, result in by_length.items():
        depth = result["views"]["depth"]
        assert [d["start"] for d in depth] + [depth[-1]["end"]] == depth_edges(length)
        assert depth[-1]["end"] == length - 1 and sum(d["rows"] for d in depth) == result["rows"]
        kld = result["overall"]["mean_kld"]["estimate"]
        assert np.isfinite(kld) and kld > 0
    # the window's last bucket holds the positions a cut never sees: [1024, 4095) past every cut's 2,047
    assert depth_edges(WINDOW)[-2:] == [1024, WINDOW - 1] and depth_edges(CUT)[-1] == CUT - 1
    print(f"long-window run: {took:.1f} s wall, {cpu:.1f} s CPU")
