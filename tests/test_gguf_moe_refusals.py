"""What a converter-written MoE GGUF (tests/data/llamacpp/moe) must not get past: metadata that makes llama.cpp
compute another model than the reference (one key changed with gguf-py's reader/writer, tests/gguf_rewrite.py),
from the reader and from ``fideval validate``; a truncated file and an unknown tensor type. Each is one line naming
the key or file and both values."""

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


def _ref(tmp: Path, name: str, **edit) -> Path:
    """A copy of fixture ``name``'s reference folder with config.json keys changed."""
    dst = tmp / f"ref-{name}"
    shutil.copytree(DATA / name, dst, ignore=shutil.ignore_patterns("*.gguf"))
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(edit)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


CASES = [  # fixture, GGUF key changes (None: removed), the error's words
    ("deepseek_v3", {"deepseek2.expert_gating_func": None},
     "GGUF deepseek2.expert_gating_func = softmax (absent: llama.cpp's default) but the reference config's "
     "scoring_func = sigmoid: the build computes another model"),
    ("deepseek_v3", {"deepseek2.expert_gating_func": (1, U32)},
     "GGUF deepseek2.expert_gating_func = softmax but the reference config's scoring_func = sigmoid"),
    ("deepseek_v3", {"deepseek2.expert_count": (8, U32)},
     "GGUF deepseek2.expert_count = 8 but the reference config's n_routed_experts = 4"),
    ("deepseek_v3", {"deepseek2.expert_used_count": (3, U32)},
     "GGUF deepseek2.expert_used_count = 3 but the reference config's num_experts_per_tok = 2"),
    ("deepseek_v3", {"deepseek2.rope.freq_base": (50000.0, F32)},
     "GGUF deepseek2.rope.freq_base = 50000.0 but the reference config's rope_theta = 10000.0"),
    ("deepseek_v3", {"deepseek2.attention.layer_norm_rms_epsilon": (1e-6, F32)},
     "GGUF deepseek2.attention.layer_norm_rms_epsilon = 1e-06 but the reference config's rms_norm_eps = 1e-05"),
    ("deepseek_v3", {"deepseek2.rope.dimension_count": (32, U32)},
     "GGUF deepseek2.rope.dimension_count = 32 but the reference config's rotary dimensions = 16"),
    ("deepseek_v2", {"deepseek2.expert_gating_func": (2, U32)},
     "GGUF deepseek2.expert_gating_func = sigmoid but the reference config's scoring_func = softmax (deepseek_v2's default)"),
    ("glm4_moe", {"glm4moe.expert_gating_func": (1, U32)},
     "GGUF glm4moe.expert_gating_func = softmax but the reference config's scoring_func = sigmoid"),
    ("glm4_moe_lite", {"deepseek2.expert_gating_func": None},
     "GGUF deepseek2.expert_gating_func = softmax (absent: llama.cpp's default) but the reference config's "
     "scoring_func = sigmoid"),
    ("dots1", {"dots1.expert_gating_func": None},
     "GGUF dots1.expert_gating_func = none (llama.cpp aborts) (absent: llama.cpp's default) but the reference "
     "config's scoring_func = sigmoid"),
    ("minimax_m2", {"minimax-m2.expert_gating_func": (1, U32)},
     "GGUF minimax-m2.expert_gating_func = softmax but the reference config's scoring_func = sigmoid"),
    ("glm4_moe", {"glm4moe.block_count": (2, U32)},
     "GGUF glm4moe.block_count = 2 but the reference config's num_hidden_layers + 1 MTP = 3"),
    ("olmoe", {"olmoe.attention.layer_norm_rms_epsilon": (1e-6, F32)},
     "GGUF olmoe.attention.layer_norm_rms_epsilon = 1e-06 but the reference config's rms_norm_eps = 1e-05"),
    ("glm4_moe", {"glm4moe.rope.dimension_count": (16, U32)},
     "GGUF glm4moe.rope.dimension_count = 16 but the reference config's rotary dimensions = 8"),
    ("qwen3_moe", {"qwen3moe.expert_used_count": (1, U32)},
     "GGUF qwen3moe.expert_used_count = 1 but the reference config's num_experts_per_tok = 2"),
    ("qwen2_moe", {"qwen2moe.expert_count": (2, U32)},
     "GGUF qwen2moe.expert_count = 2 but the reference config's num_experts = 4"),
    ("mixtral", {"llama.rope.freq_base": (10000.0, F32)},
     "GGUF llama.rope.freq_base = 10000.0 but the reference config's rope_theta = 1e+06"),
    ("gpt_oss", {"gpt-oss.attention.sliding_window": (16, U32)},
     "GGUF gpt-oss.attention.sliding_window = 16 but the reference config's sliding_window = 8"),
    ("gpt_oss", {"gpt-oss.attention.sliding_window": None},
     "GGUF gpt-oss.attention.sliding_window = none (absent: llama.cpp's default) but the reference config's sliding_window = 8"),
    ("gpt_oss", {"gpt-oss.rope.scaling.factor": (4.0, F32)},
     "GGUF gpt-oss.rope.scaling.factor = 4.0 but the reference config's rope factor = 32.0"),
]


def edited(tmp: Path, name: str, change: dict) -> Path:
    return rewrite_gguf(DATA / name / "model.gguf", tmp / f"{name}-edited.gguf",
                        kv={k: v for k, v in change.items() if v is not None},
                        drop_kv=tuple(k for k, v in change.items() if v is None))


@pytest.mark.parametrize("name, change, needle", CASES)
def test_metadata_that_changes_the_model_is_one_line(tmp_path, name, change, needle):
    assert needle in _msg(edited(tmp_path, name, change), DATA / name)


def test_the_unedited_copy_passes(tmp_path):
    """The rewrite itself changes nothing the check sees (so each case above is its one key)."""
    GGUFCheckpoint(edited(tmp_path, "deepseek_v3", {}), DATA / "deepseek_v3")


def test_deepseek_reference_without_interleaved_rope(tmp_path):
    ref = _ref(tmp_path, "deepseek_v3", rope_interleave=False)
    assert "GGUF deepseek2 rope = interleaved pairs (llama.cpp's rope type NORM) but the reference config's " \
           "rope_interleave = False" in _msg(DATA / "deepseek_v3" / "model.gguf", ref)


def test_deepseek_reference_without_scoring_func_is_sigmoid_by_default(tmp_path):
    """A DeepSeek-V3 config.json without scoring_func is sigmoid routing in transformers; the fixture's GGUF says
    sigmoid, so it passes; the converter's fallback (key absent) is caught against that default."""
    cfg = json.loads((DATA / "deepseek_v3" / "config.json").read_text())
    ref = _ref(tmp_path, "deepseek_v3")
    cfg.pop("scoring_func")
    (ref / "config.json").write_text(json.dumps(cfg))
    GGUFCheckpoint(DATA / "deepseek_v3" / "model.gguf", ref)
    p = edited(tmp_path, "deepseek_v3", {"deepseek2.expert_gating_func": None})
    assert "scoring_func = sigmoid (deepseek_v3's default)" in _msg(p, ref)


@pytest.mark.parametrize("name, norm, fixed", [("qwen3_moe", False, True), ("qwen2_moe", True, False),
                                              ("olmoe", True, False)])
def test_top_k_normalisation_fixed_in_llama_cpps_graph(tmp_path, name, norm, fixed):
    ref = _ref(tmp_path, name, norm_topk_prob=norm)
    assert f"top-k weights normalised = {fixed} (fixed in llama.cpp's graph) but the reference config's " \
           f"norm_topk_prob = {norm}" in _msg(DATA / name / "model.gguf", ref)


def test_glm_4_7_lite_shape_defaults_to_sigmoid(tmp_path):
    """llama.cpp's deepseek2 reads a GGUF without the gating key as sigmoid for GLM-4.7-Lite's shape (47 or 48
    blocks, 154,880 tokens), softmax otherwise."""
    from fideval.model.weights.gguf_meta import _default_gating

    def default(**kv):
        p = rewrite_gguf(DATA / "glm4_moe_lite" / "model.gguf", tmp_path / "g.gguf", kv=kv,
                         drop_kv=("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "deepseek2.expert_gating_func"))
        return _default_gating(gguf.GGUFReader(str(p)), "deepseek2")

    assert default(**{"deepseek2.block_count": (47, U32), "deepseek2.vocab_size": (154880, U32)}) == "sigmoid"
    assert default(**{"deepseek2.block_count": (48, U32), "deepseek2.vocab_size": (154880, U32)}) == "sigmoid"
    assert default(**{"deepseek2.block_count": (47, U32), "deepseek2.vocab_size": (154879, U32)}) == "softmax"
    assert default() == "softmax"


def test_mixtral_reference_with_a_sliding_window(tmp_path):
    """llama.cpp's llama graph has no sliding window: a Mixtral reference that uses one is another model."""
    ref = _ref(tmp_path, "mixtral", sliding_window=16)
    assert "GGUF llama.attention.sliding_window = none (absent: llama.cpp's default) but the reference config's " \
           "sliding_window = 16" in _msg(DATA / "mixtral" / "model.gguf", ref)


def test_wrong_reference_architecture(tmp_path):
    assert "GGUF architecture 'qwen3moe' is not a build of the reference's 'Qwen2MoeForCausalLM'" in \
        _msg(DATA / "qwen3_moe" / "model.gguf", DATA / "qwen2_moe")


def test_truncated_gguf(tmp_path):
    raw = (DATA / "deepseek_v3" / "model.gguf").read_bytes()
    for cut in (len(raw) // 2, len(raw) - 100, 5000):
        p = tmp_path / f"cut{cut}.gguf"
        p.write_bytes(raw[:cut])
        assert f"{p}: not a readable GGUF file" in _msg(p, DATA / "deepseek_v3")


def test_unknown_tensor_type(tmp_path):
    """A type id gguf-py does not know (a newer llama.cpp's): refused when the file is opened."""
    r = gguf.GGUFReader(str(DATA / "qwen3_moe" / "model.gguf"))
    t = next(t for t in r.tensors if t.name == "blk.0.attn_q.weight")
    raw = bytearray((DATA / "qwen3_moe" / "model.gguf").read_bytes())
    # the tensor info: name length (u64), name, n_dims (u32), dims (u64 each), type (u32), offset (u64)
    name = t.name.encode()
    at = raw.index(len(name).to_bytes(8, "little") + name) + 8 + len(name)
    n_dims = int.from_bytes(raw[at:at + 4], "little")
    type_at = at + 4 + 8 * n_dims
    assert int.from_bytes(raw[type_at:type_at + 4], "little") == t.tensor_type.value
    raw[type_at:type_at + 4] = (250).to_bytes(4, "little")
    p = tmp_path / "unknown.gguf"
    p.write_bytes(bytes(raw))
    assert f"{p}: a tensor has an unknown GGML type" in _msg(p, DATA / "qwen3_moe")


def test_missing_and_extra_tensors(tmp_path):
    import numpy as np

    src, ref = DATA / "qwen3_moe" / "model.gguf", DATA / "qwen3_moe"
    p = rewrite_gguf(src, tmp_path / "missing.gguf", drop=("blk.1.ffn_up_exps.weight",))
    assert "no GGUF tensor for model.layers.1.mlp.experts.gate_up_proj (llama.cpp name " \
           "'blk.1.ffn_gate_exps.weight+blk.1.ffn_up_exps.weight')" in _msg(p, ref)
    extra = {"blk.0.ffn_mystery.weight": (np.zeros((4, 32), np.float32), gguf.GGMLQuantizationType.F32)}
    p = rewrite_gguf(src, tmp_path / "extra.gguf", tensors=extra)
    assert "GGUF tensor 'blk.0.ffn_mystery.weight' does not map onto Qwen3MoeForCausalLM" in _msg(p, ref)
    short = {"blk.1.ffn_down_exps.weight": (np.zeros((4, 64, 16), np.float32), gguf.GGMLQuantizationType.F32)}
    p = rewrite_gguf(src, tmp_path / "short.gguf", tensors=short)
    assert "GGUF tensor 'blk.1.ffn_down_exps.weight' (-> model.layers.1.mlp.experts.down_proj) has shape [4, 64, 16], " \
           "the reference config implies [4, 64, 32]" in _msg(p, ref)


def test_fused_qkv_of_the_wrong_size(tmp_path):
    import numpy as np

    src, ref = DATA / "qwen3_moe" / "model-qkv.gguf", DATA / "qwen3_moe"
    short = {"blk.1.attn_qkv.weight": (np.zeros((120, 64), np.float32), gguf.GGMLQuantizationType.F32)}
    p = rewrite_gguf(src, tmp_path / "qkv.gguf", tensors=short)
    assert "GGUF tensor 'blk.1.attn_qkv.weight' (-> model.layers.1.self_attn.q_proj.weight) has shape [120, 64], " \
           "the reference config implies [64, 64]" in _msg(p, ref)


def test_a_type_gguf_py_cannot_dequantize(tmp_path):
    """Q8_1 (an activation type: ggml never stores weights in it) is refused when the file is opened."""
    import numpy as np

    q81 = {"blk.0.attn_q.weight": (np.zeros((64, 2 * 40), np.uint8), gguf.GGMLQuantizationType.Q8_1)}
    p = rewrite_gguf(DATA / "qwen3_moe" / "model.gguf", tmp_path / "q81.gguf", tensors=q81)
    assert "GGUF tensor 'blk.0.attn_q.weight' has type Q8_1, which gguf-py cannot dequantize" in \
        _msg(p, DATA / "qwen3_moe")
