"""Real GGUF builds through the runner: files written by gguf-py's ``GGUFWriter`` from tiny HF models, with
llama.cpp's tensor names (written out here, not taken from the mapping under test) and llama.cpp's Q/K
row permutation for llama, quantized by ``gguf.quants.quantize`` (ggml's reference). Oracle: the emulated
``gguf_q8_0`` / ``gguf_q4_0`` candidate on the reference checkpoint, bit for bit -- the Q/K permutation
moves whole rows and ggml blocks run along rows, so quantizing before or after it gives the same numbers.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from model_fixtures import build, set_config, tokens
from safetensors.torch import load_file

from fideval.errors import FidevalError
from fideval.model.runner import Runner, RunnerOptions
from fideval.model.weights.gguf_checkpoint import GGUFCheckpoint
from fideval.quant.spec import compile_spec

torch.set_num_threads(1)

LLAMA_NAMES = {  # HF -> llama.cpp (convert_hf_to_gguf.py's names)
    "model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight", "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
}


def _gguf_name(hf: str) -> str:
    if hf in LLAMA_NAMES:
        return LLAMA_NAMES[hf]
    _, _, i, rest = hf.split(".", 3)
    return f"blk.{i}.{LLAMA_NAMES[rest]}"


def _permute(w: np.ndarray, n_head: int, n_kv: int | None) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute."""
    if n_kv is not None and n_head != n_kv:
        n_head = n_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_llama_gguf(ref: Path, path: Path, qtype: str = "Q8_0", *, arch: str = "llama", drop=(), extra=None,
                     reshape=None, meta=None) -> Path:
    import gguf

    cfg = json.loads((ref / "config.json").read_text())
    sd = load_file(str(ref / "model.safetensors"))
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg["num_hidden_layers"])
    if meta is not None:  # model metadata as llama.cpp's converter writes it (GGUFWriter.add_*)
        meta(w)
    for hf, t in sd.items():
        name = _gguf_name(hf)
        if name in drop:
            continue
        a = t.numpy().astype(np.float32)
        if name.endswith("attn_q.weight"):
            a = _permute(a, cfg["num_attention_heads"], cfg["num_attention_heads"])
        elif name.endswith("attn_k.weight"):
            a = _permute(a, cfg["num_attention_heads"], cfg["num_key_value_heads"])
        if reshape and name in reshape:
            a = a[: reshape[name]]
        if a.ndim == 2 and name != "token_embd.weight" and qtype != "F32":  # the emulated path never quantizes the embedding
            q = gguf.GGMLQuantizationType[qtype]
            w.add_tensor(name, gguf.quants.quantize(a, q), raw_dtype=q)
        else:
            w.add_tensor(name, a)
    for name, a in (extra or {}).items():
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _logits(ref, *, spec=None, ckpt=None):
    s = compile_spec(spec)
    opts = RunnerOptions(weight_transform=None if ckpt is not None else s.weight_transform, micro_batch=2)
    r = Runner(ckpt if ckpt is not None else ref, opts)
    return torch.stack([x for _, x in r.run(tokens(r.vocab_size, n=3, length=20), canary=False)])


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gguf")
    return build("llama", tmp / "ref"), tmp


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
def test_llama_gguf_equals_emulated_gguf(llama, qtype):
    ref, tmp = llama
    path = write_llama_gguf(ref, tmp / f"m-{qtype}.gguf", qtype)
    ckpt = GGUFCheckpoint(path, ref)
    assert ckpt.quantized_classes() == {"attention", "dense_mlp", "lm_head"}
    fmt = f"gguf_{qtype.lower()}"
    real = _logits(ref, ckpt=ckpt)
    emu = _logits(ref, spec={c: {"format": fmt} for c in ("attention", "dense_mlp", "lm_head")})
    assert torch.equal(real, emu)
    assert (real - _logits(ref)).abs().max() > 1e-4


def test_q_k_permutation_is_undone_exactly(llama):
    """F32 GGUF (no quantization): every tensor, permuted Q/K included, reads back as the HF tensor."""
    ref, tmp = llama
    path = write_llama_gguf(ref, tmp / "f32.gguf", "F32")
    ck = GGUFCheckpoint(path, ref)
    sd = load_file(str(ref / "model.safetensors"))
    assert set(ck.logical) == set(sd)
    for k, v in sd.items():
        assert torch.equal(ck.read(k), v), k
    assert torch.equal(ck.read("lm_head.weight", rows=(10, 40)), sd["lm_head.weight"][10:40])


def test_qwen3_moe_gguf_experts_merge_gate_up(tmp_path):
    """qwen3moe: llama.cpp's ffn_gate_exps / ffn_up_exps [E, I, H] merge into transformers' gate_up_proj."""
    import gguf

    ref = build("qwen3_moe", tmp_path / "ref")
    set_config(ref, norm_topk_prob=True)  # llama.cpp's qwen3moe graph always normalises the top-k weights
    sd = load_file(str(ref / "model.safetensors"))
    cfg = json.loads((ref / "config.json").read_text())
    names = {"self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
             "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
             "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
             "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
             "mlp.gate.weight": "ffn_gate_inp.weight"}
    w = gguf.GGUFWriter(str(tmp_path / "moe.gguf"), "qwen3moe")
    q8 = gguf.GGMLQuantizationType.Q8_0
    for hf, gn in (("model.embed_tokens.weight", "token_embd.weight"), ("model.norm.weight", "output_norm.weight")):
        w.add_tensor(gn, sd[hf].numpy())
    a = sd["lm_head.weight"].numpy()
    w.add_tensor("output.weight", gguf.quants.quantize(a, q8), raw_dtype=q8)
    for i in range(cfg["num_hidden_layers"]):
        for hf, gn in names.items():
            a = sd[f"model.layers.{i}.{hf}"].numpy()
            if a.ndim == 2 and "gate.weight" not in hf:
                w.add_tensor(f"blk.{i}.{gn}", gguf.quants.quantize(a, q8), raw_dtype=q8)
            else:
                w.add_tensor(f"blk.{i}.{gn}", a)
        for p in ("gate", "up", "down"):
            a = np.stack([sd[f"model.layers.{i}.mlp.experts.{e}.{p}_proj.weight"].numpy() for e in range(8)])
            w.add_tensor(f"blk.{i}.ffn_{p}_exps.weight", gguf.quants.quantize(a, q8), raw_dtype=q8)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ckpt = GGUFCheckpoint(tmp_path / "moe.gguf", ref)
    assert ckpt.info("model.layers.0.mlp.experts.gate_up_proj").shape == (8, 64, 64)
    spec = {c: {"format": "gguf_q8_0"} for c in ("attention", "routed_experts", "lm_head")}
    assert torch.equal(_logits(ref, ckpt=ckpt), _logits(ref, spec=spec))


# -- refusals: one line naming the tensor ------------------------------------------------------------------
def _msg(fn) -> str:
    with pytest.raises(FidevalError) as e:
        fn()
    assert "\n" not in e.value.message
    return e.value.message


def test_bad_gguf_files_are_one_line(llama):
    ref, tmp = llama
    p = write_llama_gguf(ref, tmp / "falcon.gguf", arch="falcon")
    assert "GGUF architecture 'falcon' is not supported" in _msg(lambda: GGUFCheckpoint(p, ref))
    p = write_llama_gguf(ref, tmp / "qwen2.gguf", arch="qwen2")
    assert "'qwen2' is not a build of the reference's 'LlamaForCausalLM'" in _msg(lambda: GGUFCheckpoint(p, ref))
    p = write_llama_gguf(ref, tmp / "extra.gguf", extra={"blk.0.ffn_mystery.weight": np.zeros((4, 32), np.float32)})
    assert "GGUF tensor 'blk.0.ffn_mystery.weight' does not map onto LlamaForCausalLM" in _msg(lambda: GGUFCheckpoint(p, ref))
    p = write_llama_gguf(ref, tmp / "missing.gguf", drop={"blk.1.ffn_up.weight"})
    assert "no GGUF tensor for model.layers.1.mlp.up_proj.weight (llama.cpp name 'blk.1.ffn_up.weight')" in \
        _msg(lambda: GGUFCheckpoint(p, ref))
    p = write_llama_gguf(ref, tmp / "shape.gguf", reshape={"blk.0.attn_v.weight": 16})
    assert "GGUF tensor 'blk.0.attn_v.weight' (-> model.layers.0.self_attn.v_proj.weight) has shape [16, 64], " \
           "the reference config implies [32, 64]" in _msg(lambda: GGUFCheckpoint(p, ref))
    (tmp / "junk.gguf").write_bytes(b"GGML" + bytes(40))
    assert "not a readable GGUF file" in _msg(lambda: GGUFCheckpoint(tmp / "junk.gguf", ref))
