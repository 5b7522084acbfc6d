"""`fideval validate` sizes the teacher stores by `teacher.store` and one sequence of each length against the GPU
(issue 41): real model configs (DeepSeek-V3's config.json in a Hub cache, DeepSeek-V4.1-Flash's released
config.json), every byte count recomputed here from the documented formulas:

  logits  lengths x rows x V x 4
  hidden  lengths x rows x H x b (b: 2 bfloat16, 4 float32) + one head file a store, V x H x h (h: 2 bfloat16-exact)

and the attention sizing of fideval.model.sizing asked at the window length: a window that cannot fit is one line
naming the longest that does.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import yaml
from cli_runner import run_fideval
from test_validate import _free, _in_cache, deepseek_cache

from fideval.validate.sizes import human

ROOT = Path(__file__).resolve().parent.parent
V41_CONFIG = ROOT.parent / "shared" / "reference-code" / "deepseek-v4.1-flash" / "config.json"
V, H_V3, H_V41 = 129_280, 7_168, 5_120
SEED_ROWS = 128 * 8192  # the seed's lengths: 128 windows x 8,192 tokens = 512 cuts x 2,048 tokens
LONG_ROWS = 6 * 8 * 32768  # configs/long-context.yaml


def shipped(tmp_path: Path, name: str, **edits) -> Path:
    data = yaml.safe_load((ROOT / "configs" / name).read_text())
    for dotted, value in edits.items():
        section, key = dotted.split(".")
        data[section][key] = value
    out = tmp_path / f"edited-{name}"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


@pytest.fixture
def v3_cached(tmp_path, monkeypatch):
    _in_cache(monkeypatch, deepseek_cache(tmp_path))
    _free(monkeypatch, 10**13)
    monkeypatch.delenv("FIDEVAL_GPU_GIB", raising=False)
    import fideval.validate.attention as attention

    monkeypatch.setattr(attention, "device_free", lambda: (attention.H100_FREE, "78.5 GiB free, an 80 GB H100"))
    return tmp_path


# -- the store's bytes by kind --------------------------------------------------------------------------------------------
def test_the_seeds_deepseek_v3_setup_hidden_against_logits(v3_cached):
    tmp_path = v3_cached
    hidden = 2 * SEED_ROWS * H_V3 * 2 + V * H_V3 * 2  # 2 lengths x 8 domains = 16 stores hard-linking one bf16 head
    logits = 2 * SEED_ROWS * V * 4
    assert (hidden, logits) == (31_918_129_152, 1_084_479_242_240)
    r = run_fideval("validate", ROOT / "configs" / "deepseek-v3-mxfp4.yaml", cwd=tmp_path)
    assert r.code == 0, r.stderr
    assert (f"teacher stores (hidden): 2 x {SEED_ROWS:,} rows x 7,168 x 2 B + the head 129,280 x 7,168 x 2 B "
            f"(config.json dtype bfloat16), one file hard-linked into every store = {human(hidden)}; as logits "
            f"{human(logits)}") in r.stdout
    assert human(hidden) == "31.9 GB" and human(logits) == "1.08 TB"  # the ceiling: 40 GB
    r = run_fideval("validate", shipped(tmp_path, "deepseek-v3-mxfp4.yaml", **{"teacher.store": "logits"}), cwd=tmp_path)
    assert r.code == 0 and f"teacher stores: 2 x {SEED_ROWS:,} rows x 129,280 x 4 B = 1.08 TB" in r.stdout, r.stderr
    # float32 layers keep float32 hidden states: twice the rows' bytes, the same bf16 head
    r = run_fideval("validate", shipped(tmp_path, "deepseek-v3-mxfp4.yaml", **{"teacher.dtype": "float32"}), cwd=tmp_path)
    assert f"= {human(2 * SEED_ROWS * H_V3 * 4 + V * H_V3 * 2)};" in r.stdout, r.stderr


def test_the_seeds_deepseek_v41_flash_setup_from_its_released_config():
    """V4.1-Flash's config.json (the vendor's keys: dim, vocab_size; dtype fp8): H = 5,120 and the head at 4 bytes,
    since nothing says it is bfloat16 (the vendor's ParallelHead is float32)."""
    if not V41_CONFIG.is_file():
        pytest.skip("the vendor's DeepSeek-V4.1-Flash config is not at ../shared/reference-code")
    from fideval.config import Config
    from fideval.validate.model import Probe
    from fideval.validate.sizes import store_bytes

    data = yaml.safe_load((ROOT / "configs" / "deepseek-v3-mxfp4.yaml").read_text())
    probe = Probe(config=json.loads(V41_CONFIG.read_text()))
    hidden, formula = store_bytes(Config.model_validate(data), probe)
    assert hidden == 2 * SEED_ROWS * H_V41 * 2 + V * H_V41 * 4 == 24_122_490_880
    assert formula.startswith(f"2 x {SEED_ROWS:,} rows x 5,120 x 2 B + the head 129,280 x 5,120 x 4 B (config.json dtype fp8)")
    data["teacher"]["store"] = "logits"
    assert store_bytes(Config.model_validate(data), probe)[0] == 2 * SEED_ROWS * V * 4


def test_the_head_bytes_follow_the_checkpoints_own_head_tensor(tmp_path):
    """With the weights local the head's safetensors dtype decides: the demo's F32 head 4 bytes a value, the same
    model with a BF16 head 2."""
    import torch
    from safetensors.torch import load_file, save_file

    from fideval.config import load_config
    from fideval.validate import model as vmodel
    from fideval.validate.findings import Findings
    from fideval.validate.sizes import head_bytes

    demo = ROOT / "fideval" / "demo" / "assets" / "model"
    cfg = load_config(ROOT / "configs" / "demo.yaml")
    assert head_bytes(vmodel.probe(cfg, Findings())) == (4, "lm_head.weight is F32")
    bf16 = tmp_path / "bf16"
    shutil.copytree(demo, bf16)
    tensors = load_file(str(demo / "model.safetensors"))
    tensors["lm_head.weight"] = tensors["lm_head.weight"].to(torch.bfloat16)
    save_file(tensors, str(bf16 / "model.safetensors"), metadata={"format": "pt"})
    cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"path": str(bf16)})})
    assert head_bytes(vmodel.probe(cfg, Findings())) == (2, "lm_head.weight is BF16")


def test_the_demo_prints_the_hidden_stores_and_refuses_only_what_the_disk_cannot_hold(tmp_path, monkeypatch):
    rows = 6 * 6 * 2048
    each = 2 * rows * 128 * 4 + 4096 * 128 * 4  # float32 layers, the demo's F32 head once (12 stores link it)
    r = run_fideval("validate", ROOT / "configs" / "demo.yaml", cwd=tmp_path)
    assert r.code == 0, r.stderr
    assert (f"teacher stores (hidden): 2 x {rows:,} rows x 128 x 4 B + the head 4,096 x 128 x 4 B (lm_head.weight is F32), "
            f"one file hard-linked into every store = {human(each)}; as logits 2.42 GB") in r.stdout
    assert f"all teacher stores {human(2 * each)}" in r.stdout  # with the noise floor's
    _free(monkeypatch, 2 * each - 1)
    line = run_fideval("validate", ROOT / "configs" / "demo.yaml", cwd=tmp_path).error()
    assert f"the teacher and noise-floor stores need {human(2 * each)} more" in line and "teacher.store" not in line
    logits = shipped(tmp_path, "demo.yaml", **{"teacher.store": "logits"})
    line = run_fideval("validate", logits, cwd=tmp_path).error()
    assert "need 4.83 GB more" in line and "or set teacher.store: hidden" in line


# -- attention at the window length ---------------------------------------------------------------------------------------
def test_the_long_context_config_validates_in_seconds_with_deepseek_v3(v3_cached):
    tmp_path = v3_cached
    t0 = time.perf_counter()
    r = run_fideval("validate", ROOT / "configs" / "long-context.yaml", cwd=tmp_path)
    assert r.code == 0, r.stderr
    assert time.perf_counter() - t0 < 60
    # one 32,768-token sequence: its largest phase is the head, 32,768 x (4 V + 4 H + 2 H + 2 H) bytes (float32 logits
    # and normed input, bf16 input and hidden state) = 17.5 GiB
    per_token = 4 * V + 4 * H_V3 + 2 * H_V3 + 2 * H_V3
    assert f"{32768 * per_token / 2**30:.3g}" == "17.5"
    assert "windows 32,768: micro-batch 1, one sequence's largest phase 17.5 GiB" in r.stdout
    hidden = 2 * LONG_ROWS * H_V3 * 2 + V * H_V3 * 2
    assert f"= {human(hidden)}; as logits {human(2 * LONG_ROWS * V * 4)}" in r.stdout
    assert (human(hidden), human(2 * LONG_ROWS * V * 4)) == ("47 GB", "1.63 TB")  # the config's header says so


def test_a_window_too_long_for_the_gpu_is_one_line_naming_the_longest_that_fits(v3_cached, monkeypatch):
    """131,072 tokens on an 80 GB H100: one sequence at the head is 70.1 GiB beside two 21.4 GiB MoE layers and the
    8.3 GiB reserve; 49,152 (24 cuts) is the longest multiple of the cut that fits. A 139.3 GiB GPU holds it."""
    tmp_path = v3_cached
    cfg = shipped(tmp_path, "long-context.yaml", **{"windows.window_tokens": 131072})
    line = run_fideval("validate", cfg, cwd=tmp_path).error()
    assert line.startswith(f"fideval: error: {cfg}: 'windows.window_tokens': windows of 131,072 tokens do not fit the "
                           "teacher's GPU: one sequence needs 70.1 GiB at its largest phase, the head, beside two weight "
                           "units of 21.4 GiB and the 8.3 GiB reserve"), line
    assert line.endswith("(lower windows.window_tokens to 49,152 or less, or size for a larger GPU with FIDEVAL_GPU_GIB)")
    from test_validate import DEEPSEEK_V3

    from fideval.model.flops import layer_params

    unit = max(layer_params(DEEPSEEK_V3)) * 2  # a MoE layer in bf16: 21.4 GiB
    assert f"{unit / 2**30:.1f}" == "21.4"
    free = int(78.5 * 2**30)
    A = free - 2 * unit - (2 * 2**30 + 0.08 * free)  # docs/runner.md: activations = free - weights - reserve
    per_token = 4 * V + 4 * H_V3 + 2 * H_V3 + 2 * H_V3
    assert 49152 * per_token <= A < 51200 * per_token  # the next multiple of 2,048 does not fit
    import fideval.validate.attention as attention

    monkeypatch.setattr(attention, "device_free", lambda: (int(139.3 * 2**30), "139.3 GiB free"))
    r = run_fideval("validate", cfg, cwd=tmp_path)
    assert r.code == 0 and "windows 131,072: micro-batch 1, one sequence's largest phase 70.1 GiB" in r.stdout, r.stderr


def test_the_reference_codes_materialised_scores_refuse_a_32k_window(tmp_path, monkeypatch):
    """DeepSeek's own model.py at model parallel 4 materialises 32 heads x L x L scores a rank (bf16 and their float32
    softmax: 8 B a score): 256 GiB at 32,768 tokens. The longest window that fits an H100 is 14,336 tokens."""
    import ref_deepseek_v3 as rv3

    cache = deepseek_cache(tmp_path, auto_map=None)
    snap = next((cache / "models--deepseek-ai--DeepSeek-V3" / "snapshots").iterdir())
    (snap / "inference").mkdir()
    for f in rv3.need_code().iterdir():
        if f.is_file():
            (snap / "inference" / f.name).write_bytes(f.read_bytes())
    _in_cache(monkeypatch, cache)
    _free(monkeypatch, 10**13)
    import fideval.validate.attention as attention

    monkeypatch.setattr(attention, "device_free", lambda: (attention.H100_FREE, "78.5 GiB free, an 80 GB H100"))
    assert 32 * 32768**2 * 8 == 256 * 2**30
    ok = run_fideval("validate", ROOT / "configs" / "deepseek-v3-reference.yaml", cwd=tmp_path)
    assert ok.code == 0 and "windows 8,192: micro-batch 1" in ok.stdout, ok.stderr
    cfg = shipped(tmp_path, "deepseek-v3-reference.yaml", **{"windows.window_tokens": 32768})
    line = run_fideval("validate", cfg, cwd=tmp_path).error()
    assert "'windows.window_tokens': windows of 32,768 tokens do not fit the teacher's GPU" in line
    assert "the attention (its materialised scores: 256.0 GiB)" in line
    assert "(lower windows.window_tokens to 14,336 or less, or size for a larger GPU with FIDEVAL_GPU_GIB)" in line


def test_a_given_micro_batch_that_cannot_fit_names_the_most_that_does(v3_cached):
    tmp_path = v3_cached
    cfg = shipped(tmp_path, "long-context.yaml", **{"teacher.micro_batch": 2})
    line = run_fideval("validate", cfg, cwd=tmp_path).error()
    assert line.startswith(f"fideval: error: {cfg}: 'teacher.micro_batch': 2 sequences of 32,768 tokens (windows) in one "
                           "attention call need"), line
    assert line.endswith("(set teacher.micro_batch to 1 or less, or to auto)"), line


def test_the_gpu_memory_can_be_named_and_a_bad_value_is_one_line(tmp_path, monkeypatch):
    from fideval.errors import FidevalError
    from fideval.validate.attention import device_free

    monkeypatch.setenv("FIDEVAL_GPU_GIB", "139.3")
    assert device_free() == (int(139.3 * 2**30), "139.3 GiB free (FIDEVAL_GPU_GIB)")
    for bad in ("lots", "-1", "0", "nan", "inf"):
        monkeypatch.setenv("FIDEVAL_GPU_GIB", bad)
        with pytest.raises(FidevalError, match="FIDEVAL_GPU_GIB=.* is not a positive number of GiB"):
            device_free()


def test_the_reference_code_writes_a_hidden_store_too(tmp_path):
    """teacher.store auto is hidden with model.implementation: reference as well (the vendor's head is a float32
    F.linear, replayed as such: tests/test_store_hidden.py); the shipped reference config passes without its model."""
    from fideval.model.teacher_pass import store_kind

    assert store_kind("auto", "reference") == store_kind("auto", "transformers") == "hidden"
    assert store_kind("logits", "reference") == "logits"
    ok = run_fideval("validate", ROOT / "configs" / "deepseek-v3-reference.yaml", cwd=tmp_path)
    assert ok.code == 0, ok.stderr
