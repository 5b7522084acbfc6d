"""A GGUF's model metadata (what llama.cpp computes) against the reference config: one-line errors naming
both values, llama.cpp's defaults where a key is absent. GGUFs are written with gguf-py's ``GGUFWriter.add_*``,
the calls llama.cpp's converter makes; the DeepSeek-V3 reference is the demo model's config."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest

from fideval.errors import FidevalError
from fideval.model.weights.gguf_checkpoint import GGUFCheckpoint

DEMO = Path(__file__).resolve().parents[1] / "fideval" / "demo" / "assets" / "model"


def _ref(tmp_path: Path, **edit) -> Path:
    folder = tmp_path / "ref"
    folder.mkdir(exist_ok=True)
    cfg = json.loads((DEMO / "config.json").read_text())
    cfg.update(edit)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def _deepseek_meta(w, **over):
    """What convert_hf_to_gguf.py's DeepseekV2Model.set_gguf_parameters writes for the demo config."""
    vals = dict(expert_count=8, expert_used_count=2, expert_shared_count=1, gating=gguf.ExpertGatingFuncType.SIGMOID,
                weights_norm=True, weights_scale=1.0, group_count=4, group_used_count=2, leading_dense=1,
                eps=1e-6, heads=4, theta=10000.0)
    vals.update(over)
    w.add_expert_count(vals["expert_count"])
    w.add_expert_used_count(vals["expert_used_count"])
    w.add_expert_shared_count(vals["expert_shared_count"])
    if vals["gating"] is not None:
        w.add_expert_gating_func(vals["gating"])
    w.add_expert_weights_norm(vals["weights_norm"])
    w.add_expert_weights_scale(vals["weights_scale"])
    w.add_expert_group_count(vals["group_count"])
    w.add_expert_group_used_count(vals["group_used_count"])
    w.add_leading_dense_block_count(vals["leading_dense"])
    w.add_layer_norm_rms_eps(vals["eps"])
    w.add_head_count(vals["heads"])
    w.add_rope_freq_base(vals["theta"])
    if "rope_type" in vals:
        w.add_rope_scaling_type(vals["rope_type"])
        w.add_rope_scaling_factor(vals["rope_factor"])


def _write(path: Path, arch: str, meta) -> Path:
    w = gguf.GGUFWriter(str(path), arch)
    meta(w)
    w.add_tensor("token_embd.weight", np.zeros((8, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _msg(path: Path, ref: Path) -> str:
    with pytest.raises(FidevalError) as e:
        GGUFCheckpoint(path, ref)
    assert "\n" not in e.value.message
    return e.value.message


def test_deepseek_build_with_the_reference_metadata_passes_the_check(tmp_path):
    p = _write(tmp_path / "ok.gguf", "deepseek2", _deepseek_meta)
    # past the metadata check, to the tensors (this file holds one placeholder)
    assert "GGUF tensor 'token_embd.weight' (-> model.embed_tokens.weight) has shape [8, 32]" in _msg(p, _ref(tmp_path))


def test_softmax_routing_of_a_sigmoid_model_is_caught(tmp_path):
    # the converter's fallback when config.json lacks scoring_func, and llama.cpp's reading of a GGUF without the key
    ref = _ref(tmp_path)
    p = _write(tmp_path / "softmax.gguf", "deepseek2", lambda w: _deepseek_meta(w, gating=gguf.ExpertGatingFuncType.SOFTMAX))
    m = _msg(p, ref)
    assert "GGUF deepseek2.expert_gating_func = softmax but the reference config's scoring_func = sigmoid " \
           "(deepseek_v3's default): the build computes another model" in m
    p = _write(tmp_path / "absent.gguf", "deepseek2", lambda w: _deepseek_meta(w, gating=None))
    assert "expert_gating_func = softmax (absent: llama.cpp's default) but the reference config's scoring_func" in _msg(p, ref)
    # a reference that says softmax accepts the softmax build
    assert "GGUF tensor 'token_embd.weight'" in _msg(p, _ref(tmp_path, scoring_func="softmax"))


@pytest.mark.parametrize("over, needle", [
    ({"expert_count": 16}, "deepseek2.expert_count = 16 but the reference config's n_routed_experts = 8"),
    ({"expert_used_count": 3}, "deepseek2.expert_used_count = 3 but the reference config's num_experts_per_tok = 2"),
    ({"expert_shared_count": 2}, "deepseek2.expert_shared_count = 2 but the reference config's n_shared_experts = 1"),
    ({"group_used_count": 4}, "deepseek2.expert_group_used_count = 4 but the reference config's topk_group = 2"),
    ({"weights_norm": False}, "deepseek2.expert_weights_norm = False but the reference config's norm_topk_prob = True"),
    ({"weights_scale": 2.5}, "deepseek2.expert_weights_scale = 2.5 but the reference config's routed_scaling_factor = 1.0"),
    ({"leading_dense": 0}, "deepseek2.leading_dense_block_count = 0 but the reference config's first_k_dense_replace = 1"),
    ({"eps": 1e-5}, "deepseek2.attention.layer_norm_rms_epsilon = 1e-05 but the reference config's rms_norm_eps = 1e-06"),
    ({"theta": 50000.0}, "deepseek2.rope.freq_base = 50000.0 but the reference config's rope_theta = 10000.0"),
    ({"rope_type": gguf.RopeScalingType.YARN, "rope_factor": 40.0},
     "deepseek2.rope.scaling.type = yarn but the reference config's rope type = none"),
])
def test_each_model_changing_key_is_a_one_line_error(tmp_path, over, needle):
    p = _write(tmp_path / "x.gguf", "deepseek2", lambda w: _deepseek_meta(w, **over))
    assert needle in _msg(p, _ref(tmp_path))


def test_rope_scaling_factor_is_compared_when_both_scale(tmp_path):
    ref = _ref(tmp_path, rope_parameters={"rope_theta": 10000.0, "rope_type": "yarn", "factor": 40.0,
                                          "original_max_position_embeddings": 4096})
    p = _write(tmp_path / "f.gguf", "deepseek2",
               lambda w: _deepseek_meta(w, rope_type=gguf.RopeScalingType.YARN, rope_factor=4.0))
    assert "deepseek2.rope.scaling.factor = 4.0 but the reference config's rope factor = 40.0" in _msg(p, ref)


def test_qwen3_moe_expert_count(tmp_path):
    from model_fixtures import build

    ref = build("qwen3_moe", tmp_path / "qwen")
    cfg = json.loads((ref / "config.json").read_text())
    n = cfg["num_local_experts"]  # transformers 5's name for Qwen3-MoE
    p = _write(tmp_path / "q.gguf", "qwen3moe", lambda w: (w.add_expert_count(n + 1), w.add_expert_used_count(cfg["num_experts_per_tok"])))
    assert f"qwen3moe.expert_count = {n + 1} but the reference config's num_local_experts = {n}" in _msg(p, ref)
    shutil.rmtree(tmp_path / "qwen")
