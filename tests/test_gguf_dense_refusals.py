"""Metadata of the dense, GraniteMoe and Llama4 converter fixtures (tests/data/llamacpp/moe: mistral, phi3, gemma2,
gemma3, granitemoe, llama4) that makes llama.cpp compute another model than the reference: one GGUF key changed (gguf-py's
reader/writer, tests/gguf_rewrite.py) or one reference config key changed. Each is one line naming both values."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import pytest
from gguf_rewrite import rewrite_gguf

from fideval.errors import FidevalError
from fideval.model.weights.gguf_checkpoint import GGUFCheckpoint

DATA = Path(__file__).resolve().parent / "data" / "llamacpp" / "moe"
U32, F32 = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32


def _msg(path: Path, ref: Path) -> str:
    with pytest.raises(FidevalError) as e:
        GGUFCheckpoint(path, ref)
    assert "\n" not in e.value.message
    return e.value.message


GGUF_CASES = [  # fixture, GGUF key changes (None: removed), the error's words
    ("gemma2", {"gemma2.attn_logit_softcapping": (40.0, F32)},
     "GGUF gemma2.attn_logit_softcapping = 40.0 but the reference config's attn_logit_softcapping = 50.0"),
    ("gemma2", {"gemma2.final_logit_softcapping": (20.0, F32)},
     "GGUF gemma2.final_logit_softcapping = 20.0 but the reference config's final_logit_softcapping = 30.0"),
    ("gemma2", {"gemma2.attention.sliding_window_pattern": (3, U32)},
     "GGUF gemma2 sliding layers = [0, 1] but the reference config's layer_types' sliding layers = [0]"),
    ("gemma2", {"gemma2.attention.sliding_window": (16, U32)},
     "GGUF gemma2.attention.sliding_window = 16 but the reference config's sliding_window = 8"),
    ("gemma2", {"gemma2.attention.sliding_window": None},
     "GGUF gemma2.attention.sliding_window = 4096 (absent: llama.cpp's default) but the reference config's "
     "sliding_window = 8"),
    ("gemma3", {"gemma3.final_logit_softcapping": (30.0, F32)},
     "GGUF gemma3.final_logit_softcapping = 30.0 but the reference config's final_logit_softcapping = None"),
    ("gemma3", {"gemma3.rope.freq_base": (10000.0, F32)},
     "GGUF gemma3.rope.freq_base = 10000.0 but the reference config's rope_theta = 1e+06"),
    ("gemma3", {"gemma3.attention.layer_norm_rms_epsilon": (1e-5, F32)},
     "GGUF gemma3.attention.layer_norm_rms_epsilon = 1e-05 but the reference config's rms_norm_eps = 1e-06"),
    ("granitemoe", {"granitemoe.embedding_scale": (1.0, F32)},
     "GGUF granitemoe.embedding_scale = 1.0 but the reference config's embedding_multiplier = 12.0"),
    ("granitemoe", {"granitemoe.residual_scale": None},
     "GGUF granitemoe.residual_scale = 1.0 (absent: llama.cpp's default) but the reference config's "
     "residual_multiplier = 0.22"),
    ("granitemoe", {"granitemoe.attention.scale": None},
     "GGUF granitemoe.attention.scale = 0.25 (absent: llama.cpp's default) but the reference config's "
     "attention_multiplier = 0.0078125"),
    ("granitemoe", {"granitemoe.logit_scale": (1.0, F32)},
     "GGUF granitemoe.logit_scale = 1.0 but the reference config's logits_scaling = 6.0"),
    ("granitemoe", {"granitemoe.expert_used_count": (1, U32)},
     "GGUF granitemoe.expert_used_count = 1 but the reference config's num_experts_per_tok = 2"),
    ("phi3", {"phi3.rope.dimension_count": (16, U32)},
     "GGUF phi3.rope.dimension_count = 16 but the reference config's rotary dimensions = 8"),
    ("llama4", {"llama4.interleave_moe_layer_step": (2, U32)},
     "GGUF llama4.interleave_moe_layer_step = 2 but the reference config's interleave_moe_layer_step = 1"),
    ("llama4", {"llama4.expert_used_count": (2, U32)},
     "GGUF llama4.expert_used_count = 2 but the reference config's num_experts_per_tok = 1"),
    ("llama4", {"llama4.attention.sliding_window": (0, U32)},  # llama.cpp: no chunking, and rope on every layer
     "GGUF llama4 attention_chunk_size = None (fixed in llama.cpp's graph) but the reference config's "
     "attention_chunk_size = 8192"),
    ("mistral", {"llama.rope.freq_base": (50000.0, F32)},
     "GGUF llama.rope.freq_base = 50000.0 but the reference config's rope_theta = 10000.0"),
]


@pytest.mark.parametrize("name, change, needle", GGUF_CASES)
def test_gguf_metadata_that_changes_the_model_is_one_line(tmp_path, name, change, needle):
    p = rewrite_gguf(DATA / name / "model.gguf", tmp_path / f"{name}-edited.gguf",
                     kv={k: v for k, v in change.items() if v is not None},
                     drop_kv=tuple(k for k, v in change.items() if v is None))
    assert needle in _msg(p, DATA / name)


REF_CASES = [  # fixture, reference config.json changes, the error's words
    ("gemma2", {"query_pre_attn_scalar": 64},
     "GGUF gemma2 query scale = 1/sqrt(16) (llama.cpp's graph for 2 layers) but the reference config's "
     "query_pre_attn_scalar = 64"),
    ("gemma2", {"attn_logit_softcapping": None},
     "GGUF gemma2.attn_logit_softcapping = 50.0 but the reference config's attn_logit_softcapping = None"),
    ("gemma2", {"layer_types": ["full_attention", "sliding_attention"]},
     "GGUF gemma2 sliding layers = [0] (absent: llama.cpp's default) but the reference config's layer_types' "
     "sliding layers = [1]"),
    ("gemma3", {"attn_logit_softcapping": 50.0},
     "GGUF gemma3 attention softcapping = none (llama.cpp's gemma3 graph has none) but the reference config's "
     "attn_logit_softcapping = 50.0"),
    ("gemma3", {"rope_parameters": {"full_attention": {"rope_theta": 1e6, "rope_type": "default"},
                                    "sliding_attention": {"rope_theta": 5e4, "rope_type": "default"}}},
     "GGUF gemma3.rope.freq_base_swa = 10000.0 but the reference config's sliding layers' rope_theta = 50000.0"),
    ("phi3", {"sliding_window": 2047},
     "GGUF phi3 sliding window = none (llama.cpp's phi3 graph disables it) but the reference config's "
     "sliding_window = 2047"),
    ("phi3", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 4,
                                  "long_factor": [2.0] * 4, "original_max_position_embeddings": 64}},
     "GGUF phi3 rope = longrope factors chosen once by llama.cpp's context size but the reference config's rope type = "
     "longrope (factors chosen per sequence length)"),
    ("mistral", {"sliding_window": 4096},
     "GGUF llama.attention.sliding_window = none (absent: llama.cpp's default) but the reference config's "
     "sliding_window = 4096"),
    ("llama4", {"attention_chunk_size": 16},
     "GGUF llama4 attention_chunk_size = 8192 (fixed in llama.cpp's graph) but the reference config's "
     "attention_chunk_size = 16"),
    ("llama4", {"no_rope_layers": [1, 0]},
     "GGUF llama4 no_rope_layers = [1, 1] (fixed in llama.cpp's graph) but the reference config's no_rope_layers = [1, 0]"),
    ("llama4", {"use_qk_norm": False},
     "GGUF llama4 use_qk_norm = True (fixed in llama.cpp's graph) but the reference config's use_qk_norm = False"),
    ("llama4", {"attn_scale": 0.2},
     "GGUF llama4 attn_scale = 0.1 (fixed in llama.cpp's graph) but the reference config's attn_scale = 0.2"),
    ("granitemoe", {"residual_multiplier": 1.0},
     "GGUF granitemoe.residual_scale = 0.22 but the reference config's residual_multiplier = 1.0"),
]


@pytest.mark.parametrize("name, edit, needle", REF_CASES)
def test_reference_config_that_the_build_contradicts(tmp_path, name, edit, needle):
    ref = tmp_path / f"ref-{name}"
    shutil.copytree(DATA / name, ref, ignore=shutil.ignore_patterns("*.gguf"))
    cfg = json.loads((ref / "config.json").read_text())
    cfg.update(edit)
    (ref / "config.json").write_text(json.dumps(cfg))
    assert needle in _msg(DATA / name / "model.gguf", ref)


def test_gemma3_local_rope_base_absent_is_llama_cpps_10000(tmp_path):
    p = rewrite_gguf(DATA / "gemma3" / "model.gguf", tmp_path / "g.gguf", drop_kv=("gemma3.rope.freq_base_swa",))
    GGUFCheckpoint(p, DATA / "gemma3")  # the reference's sliding layers use 10000 too
    ref = tmp_path / "ref"
    shutil.copytree(DATA / "gemma3", ref, ignore=shutil.ignore_patterns("*.gguf"))
    cfg = json.loads((ref / "config.json").read_text())
    cfg["rope_parameters"]["sliding_attention"]["rope_theta"] = 5e4
    (ref / "config.json").write_text(json.dumps(cfg))
    assert "GGUF gemma3.rope.freq_base_swa = 10000.0 (absent: llama.cpp's default) but the reference config's " \
           "sliding layers' rope_theta = 50000.0" in _msg(p, ref)


def test_mistral_is_a_llama_gguf_and_gemma_norms_are_stored_plus_one():
    """What the converter did that the reader undoes: Mistral written as ``llama`` (Q/K permuted), Gemma's norm
    weights + 1 (the GGUF value minus one is the reference's within the float16 source's rounding)."""
    from safetensors.torch import load_file

    ck = GGUFCheckpoint(DATA / "mistral" / "model.gguf", DATA / "mistral")
    assert ck.arch == "llama" and ck.info("model.layers.0.self_attn.q_proj.weight").source.op == "permute"
    for name in ("gemma2", "gemma3"):
        ck = GGUFCheckpoint(DATA / name / "model.gguf", DATA / name)
        ref = load_file(str(DATA / name / "model.safetensors"))
        key = "model.layers.1.post_feedforward_layernorm.weight"
        assert ck.info(key).source.op == "minus_one"
        raw = next(t for t in gguf.GGUFReader(str(DATA / name / "model.gguf")).tensors if t.name == "blk.1.post_ffw_norm.weight")
        assert (abs(raw.data - 1 - ref[key].float().numpy()) < 1e-3).all()
        assert (ck.read(key) - ref[key].float()).abs().max() < 1e-3
        assert "lm_head.weight" not in ck  # tied: no output tensor, the runner ties it


def test_an_architecture_the_installed_gguf_package_has_no_table_for(tmp_path):
    """DeepSeek-V3.2's ``deepseek32`` is in the vendored llama.cpp's gguf-py but not in gguf 0.19 from PyPI: were it
    listed in GGUF_ARCHS, the missing name table would be one line naming the file, not a StopIteration."""
    from fideval.quant import gguf_names

    p = tmp_path / "v32.gguf"
    with pytest.raises(FidevalError) as e:
        gguf_names.plan_sources("deepseek32", {}, set(), {"num_hidden_layers": 2}, p)
    assert f"{p}: the installed gguf package (" in e.value.message
    assert "has no name table for GGUF architecture 'deepseek32'" in e.value.message
    assert "deepseek32" not in gguf_names.GGUF_ARCHS  # refused earlier, as not supported
