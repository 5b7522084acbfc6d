"""MoE GGUFs written by llama.cpp's own converter (tests/data/llamacpp/moe, tools/llamacpp/moe_ggufs.py) read as
runner candidates. Oracle: the reference checkpoint with every tensor replaced by gguf-py's dequantization of its
GGUF tensor, assembled here from llama.cpp's naming (a table written out below, not the reader's gguf-py map),
with the converter's rewrites inverted by index arithmetic and loops (not the reader's reshapes): the runner's
logits on the GGUF must equal the runner's logits on that folder bit for bit."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from model_fixtures import tokens
from safetensors.torch import load_file, save_file

from fideval.model.runner import Runner, RunnerOptions
from fideval.model.weights.gguf_checkpoint import GGUFCheckpoint

torch.set_num_threads(1)
DATA = Path(__file__).resolve().parent / "data" / "llamacpp" / "moe"
MODELS = sorted(p.name for p in DATA.iterdir())
# (reference folder, GGUF file): every model.gguf, and the files the converter wrote with --fuse-qkv
FILES = [(m, "model.gguf") for m in MODELS] + [(p.parent.name, p.name) for p in sorted(DATA.glob("*/model-qkv.gguf"))]

LAYER = {  # Hugging Face name after "model.layers.<i>." -> llama.cpp name after "blk.<i>." (convert_hf_to_gguf.py)
    "input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.bias": "attn_output.bias", "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight", "self_attn.sinks": "attn_sinks.weight",
    "self_attn.q_a_proj.weight": "attn_q_a.weight", "self_attn.q_a_layernorm.weight": "attn_q_a_norm.weight",
    "self_attn.q_b_proj.weight": "attn_q_b.weight", "self_attn.kv_a_proj_with_mqa.weight": "attn_kv_a_mqa.weight",
    "self_attn.kv_a_layernorm.weight": "attn_kv_a_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight", "block_sparse_moe.gate.weight": "ffn_gate_inp.weight",
    "mlp.router.weight": "ffn_gate_inp.weight", "mlp.router.bias": "ffn_gate_inp.bias",
    "mlp.gate.e_score_correction_bias": "exp_probs_b.bias", "mlp.moe_statics.e_score_correction_bias": "exp_probs_b.bias",
    "block_sparse_moe.e_score_correction_bias": "exp_probs_b.bias",
    "mlp.shared_experts.gate_proj.weight": "ffn_gate_shexp.weight", "mlp.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_experts.down_proj.weight": "ffn_down_shexp.weight", "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight", "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
    "self_attn.qkv_proj.weight": "attn_qkv.weight", "mlp.gate_up_proj.weight": "ffn_up.weight",  # phi3: kept fused
    "pre_feedforward_layernorm.weight": "ffn_norm.weight", "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    "feed_forward.router.weight": "ffn_gate_inp.weight", "feed_forward.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "feed_forward.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "feed_forward.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "block_sparse_moe.router.layer.weight": "ffn_gate_inp.weight", "block_sparse_moe.output_linear.weight": "ffn_down_exps.weight",
}
PERMUTED = {"llama", "granitemoe"}  # the converter's LlamaModel.permute (GraniteModel is a LlamaModel)
PLUS_ONE = {"gemma2", "gemma3"}  # norm weights stored + 1 (Gemma's RMSNorm scales by 1 + weight)
TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
       "lm_head.weight": "output.weight"}
EXPERT = {"gate_proj": "ffn_gate_exps", "w1": "ffn_gate_exps", "up_proj": "ffn_up_exps", "w3": "ffn_up_exps",
          "down_proj": "ffn_down_exps", "w2": "ffn_down_exps"}


def dequantized(path: Path) -> dict[str, torch.Tensor]:
    """Every GGUF tensor through gguf-py's dequantize, in numpy (row-major) shape."""
    out = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        shape = tuple(int(d) for d in reversed(list(t.shape)))
        out[t.name] = torch.from_numpy(np.array(gguf.quants.dequantize(t.data, t.tensor_type), np.float32).reshape(shape))
    return out


def _unpermute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Invert llama.cpp's LlamaModel.permute by where it sends each row index."""
    n = w.shape[0]
    idx = torch.arange(n).reshape(heads, 2, n // heads // 2).swapaxes(1, 2).reshape(n)  # GGUF row j = HF row idx[j]
    out = torch.empty_like(w)
    out[idx] = w
    return out


def oracle_folder(name: str, dst: Path, file: str = "model.gguf") -> Path:
    """The reference folder with each tensor replaced by its dequantized GGUF counterpart (on-disk layout)."""
    src = DATA / name
    cfg = json.loads((src / "config.json").read_text())
    ref, deq = load_file(str(src / "model.safetensors")), dequantized(src / file)
    arch = gguf.GGUFReader(str(src / file)).fields["general.architecture"].contents()
    out = {}
    for key, v in ref.items():
        if key in TOP:
            t = deq[TOP[key]]
        elif m := re.fullmatch(r"model\.layers\.(\d+)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)\.weight", key):
            t = deq[f"blk.{m[1]}.{EXPERT[m[3]]}.weight"][int(m[2])]
        elif m := re.fullmatch(r"model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)(_bias)?", key):  # gpt-oss
            i, sfx = m[1], "bias" if m[3] else "weight"
            if m[2] == "down_proj":
                t = deq[f"blk.{i}.ffn_down_exps.{sfx}"]
                t = t if m[3] else t.transpose(1, 2)
            else:
                g, u = deq[f"blk.{i}.ffn_gate_exps.{sfx}"], deq[f"blk.{i}.ffn_up_exps.{sfx}"]
                if not m[3]:
                    g, u = g.transpose(1, 2), u.transpose(1, 2)  # [E, H, I]
                t = torch.empty(v.shape)
                t[..., 0::2], t[..., 1::2] = g, u
        elif m := re.fullmatch(r"model\.layers\.(\d+)\.feed_forward\.experts\.(gate_up_proj|down_proj)", key):  # llama4
            t = torch.empty(v.shape)  # gate_up [E, H, 2I], down [E, I, H]; the GGUF's [E, I, H] / [E, H, I]
            parts = ["down"] if m[2] == "down_proj" else ["gate", "up"]
            for j, part in enumerate(parts):
                d = deq[f"blk.{m[1]}.ffn_{part}_exps.weight"]
                for e, a, b in np.ndindex(*d.shape):
                    t[e, b, a + j * d.shape[1]] = d[e, a, b]
        elif m := re.fullmatch(r"model\.layers\.(\d+)\.block_sparse_moe\.input_linear\.weight", key):  # granitemoe
            g, u = deq[f"blk.{m[1]}.ffn_gate_exps.weight"], deq[f"blk.{m[1]}.ffn_up_exps.weight"]  # [E, I, H]
            t = torch.empty(v.shape)
            for e in range(v.shape[0]):
                t[e, : g.shape[1]], t[e, g.shape[1]:] = g[e], u[e]
        elif m := re.fullmatch(r"model\.layers\.(\d+)\.self_attn\.kv_b_proj\.weight", key):
            k_b, v_b = deq[f"blk.{m[1]}.attn_k_b.weight"], deq[f"blk.{m[1]}.attn_v_b.weight"]  # [H, r, nope], [H, v, r]
            t = torch.cat([torch.cat([k_b[h].T, v_b[h]]) for h in range(k_b.shape[0])])
        else:
            i, rest = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", key).groups()
            if rest == "post_attention_layernorm.weight":  # llama.cpp's name depends on where the norm sits
                g = ("ffn_norm.weight" if f"blk.{i}.ffn_norm.weight" in deq and arch not in PLUS_ONE
                     else "post_attention_norm.weight")
            else:
                g = LAYER[rest]
            if f"blk.{i}.{g}" not in deq and g in ("attn_q.weight", "attn_k.weight", "attn_v.weight"):  # --fuse-qkv
                n = [ref[f"model.layers.{i}.self_attn.{p}_proj.weight"].shape[0] for p in "qkv"]
                at = {"attn_q.weight": 0, "attn_k.weight": n[0], "attn_v.weight": n[0] + n[1]}[g]
                t = deq[f"blk.{i}.attn_qkv.weight"][at:at + v.shape[0]]
            else:
                t = deq[f"blk.{i}.{g}"]
            if arch in PERMUTED and rest in ("self_attn.q_proj.weight", "self_attn.k_proj.weight"):
                heads = cfg["num_attention_heads"] if "q_proj" in rest else cfg["num_key_value_heads"]
                t = _unpermute(t, heads)
        if arch in PLUS_ONE and key.endswith("norm.weight"):
            t = t - 1
        out[key] = t.reshape(v.shape).float().contiguous()
    dst.mkdir(parents=True, exist_ok=True)
    cfg["dtype"] = "float32"
    (dst / "config.json").write_text(json.dumps(cfg))
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def logits(weights) -> torch.Tensor:
    r = Runner(weights, RunnerOptions(micro_batch=2))
    return torch.stack([x for _, x in r.run(tokens(r.vocab_size, n=2, length=12), canary=False)])


@pytest.mark.parametrize("name, file", FILES)
def test_converter_gguf_equals_the_dequantized_weights_emulation(name, file, tmp_path):
    ckpt = GGUFCheckpoint(DATA / name / file, DATA / name)
    real = logits(ckpt)
    emu = logits(oracle_folder(name, tmp_path / "emu", file))
    assert torch.equal(real, emu), (real - emu).abs().max()
    # the oracle itself: each of its tensors is the reference's within the GGUF type's rounding (a tensor put in the
    # wrong place, or a layout inverted wrongly, is off by the weights' own size, ~0.1-0.4), and not all exact
    ref, emu_w = load_file(str(DATA / name / "model.safetensors")), load_file(str(tmp_path / "emu" / "model.safetensors"))
    err = {k: (emu_w[k] - v.float()).abs().max().item() for k, v in ref.items()}
    assert max(err.values()) < (0.03 if name == "deepseek_v3" else 0.002), max(err.items(), key=lambda kv: kv[1])
    assert max(err.values()) > 0


def test_deepseek_fixture_is_q8_0_and_q4_k_in_llama_cpps_mla_layout():
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(DATA / "deepseek_v3" / "model.gguf")).tensors}
    assert {"Q8_0", "Q4_K"} <= set(types.values())
    assert types["blk.1.ffn_gate_exps.weight"] == "Q4_K" and types["blk.1.attn_k_b.weight"] == "Q8_0"
    assert not any("attn_kv_b" in n for n in types)  # kv_b split into k_b / v_b by the converter


def test_expert_rows_dequantize_only_those_experts():
    ck = GGUFCheckpoint(DATA / "deepseek_v3" / "model.gguf", DATA / "deepseek_v3")
    key = "model.layers.1.mlp.experts.gate_up_proj"
    whole = ck.read(key)
    assert whole.shape == (4, 64, 256)
    assert torch.equal(ck.read(key, rows=(1, 3)), whole[1:3])
    deq = dequantized(DATA / "deepseek_v3" / "model.gguf")
    assert torch.equal(whole[2, :32], deq["blk.1.ffn_gate_exps.weight"][2])
    assert torch.equal(whole[2, 32:], deq["blk.1.ffn_up_exps.weight"][2])


def test_older_kv_b_layout_reads_the_same(tmp_path):
    """Converters before MLA absorption wrote ``attn_kv_b`` whole; the same values read the same way."""
    src = DATA / "deepseek_v3"
    deq = dequantized(src / "model.gguf")
    ck = GGUFCheckpoint(src / "model.gguf", src)
    r = gguf.GGUFReader(str(src / "model.gguf"))
    w = gguf.GGUFWriter(str(tmp_path / "old.gguf"), "deepseek2")
    for f in r.fields.values():
        if not f.name.startswith("GGUF.") and f.name != "general.architecture":
            w.add_key_value(f.name, f.contents(), f.types[0], sub_type=f.types[-1] if len(f.types) > 1 else None)
    for t in r.tensors:
        if t.name.endswith("attn_v_b.weight"):
            continue
        if t.name.endswith("attn_k_b.weight"):
            i = t.name.split(".")[1]
            kv = ck.read(f"model.layers.{i}.self_attn.kv_b_proj.weight").numpy()
            w.add_tensor(f"blk.{i}.attn_kv_b.weight", kv)
            continue
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    old = GGUFCheckpoint(tmp_path / "old.gguf", src)
    for i in (0, 1):
        key = f"model.layers.{i}.self_attn.kv_b_proj.weight"
        assert torch.equal(old.read(key), ck.read(key))
        k_b = deq[f"blk.{i}.attn_k_b.weight"]
        assert torch.equal(old.read(key)[: k_b.shape[2]], k_b[0].T)  # head 0's nope rows
    assert torch.equal(logits(old), logits(ck))
    shutil.rmtree(tmp_path)


def test_fused_gate_up_experts_read_as_the_stacked_pair(tmp_path):
    """``ffn_gate_up_exps`` (the converter's --fuse-gate-up-exps, for the architectures gguf-py lists it for):
    the pair's Q8_0 rows concatenated per expert (ggml blocks run along rows) read as the stacked pair does."""
    from gguf_rewrite import rewrite_gguf

    src = DATA / "qwen3_moe"
    tensors = {t.name: t for t in gguf.GGUFReader(str(src / "model.gguf")).tensors}
    fused = {}
    for i in (0, 1):
        g, u = tensors[f"blk.{i}.ffn_gate_exps.weight"], tensors[f"blk.{i}.ffn_up_exps.weight"]
        fused[f"blk.{i}.ffn_gate_up_exps.weight"] = (np.concatenate([g.data, u.data], axis=1), g.tensor_type)
    p = rewrite_gguf(src / "model.gguf", tmp_path / "fused.gguf", tensors=fused,
                     drop=tuple(f"blk.{i}.ffn_{w}_exps.weight" for i in (0, 1) for w in ("gate", "up")))
    a, b = GGUFCheckpoint(src / "model.gguf", src), GGUFCheckpoint(p, src)
    assert b.info("model.layers.1.mlp.experts.gate_up_proj").parts == ("blk.1.ffn_gate_up_exps.weight",)
    for key in a.logical:
        assert torch.equal(a.read(key), b.read(key)), key
