"""Real quantized safetensors builds through the runner, against emulation as the oracle.

Each test encodes a tiny reference model's weights with fideval's own encoders into a real checkpoint
layout (compressed-tensors NVFP4, gpt-oss MXFP4 blocks/scales, DeepSeek FP8 ``weight_scale_inv``) with a
``quantization_config``, runs it as a real candidate (decoded layer by layer by
``fideval.model.weights.quantized``), and requires logits BIT-IDENTICAL to the emulated candidate with the same
format and recipe on the reference checkpoint. They share nothing but the encoder: the real path packs
codes into the stored layout and decodes with ``decode_tensor_set``; the emulated path quantize-dequantizes
in place (``_qdq``, no packing).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from model_fixtures import build, configs, tokens
from safetensors.torch import load_file, save_file

from fideval.errors import FidevalError
from fideval.model.runner import Runner, RunnerOptions
from fideval.model.weights.quantized import QuantizedCheckpoint
from fideval.quant import get_format
from fideval.quant.mx import pack_fp4
from fideval.quant.spec import compile_spec

torch.set_num_threads(1)


def _logits(ref: Path, *, spec=None, ckpt=None, serving=False, act=None) -> torch.Tensor:
    s = compile_spec(spec)
    r = Runner(ckpt if ckpt is not None else ref,
               RunnerOptions(weight_transform=None if ckpt is not None else s.weight_transform,
                             act_transform=(act if act is not None else s.act_transform) if serving else None, micro_batch=2))
    toks = tokens(r.vocab_size, n=3, length=20)
    return torch.stack([x for _, x in r.run(toks, canary=False)])


def _write(folder: Path, ref: Path, tensors: dict, qc: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous().clone() for k, v in tensors.items()}, str(folder / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((ref / "config.json").read_text())
    cfg["quantization_config"] = qc
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def _e4m3(codes: torch.Tensor) -> torch.Tensor:
    return codes.to(torch.uint8).view(torch.float8_e4m3fn)


# -- compressed-tensors NVFP4, Qwen3-MoE: routed experts + attention --------------------------------------
CT_NVFP4 = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
            "config_groups": {"group_0": {"format": "nvfp4-pack-quantized", "targets": ["Linear"]}}}


def _ct_nvfp4(name: str, w: torch.Tensor, out: dict) -> None:
    enc = get_format("nvfp4").encode(w, "compressed_tensors")
    base = name.removesuffix(".weight")
    out[base + ".weight_packed"] = pack_fp4(enc.codes)
    out[base + ".weight_scale"] = _e4m3(enc.scales)
    out[base + ".weight_global_scale"] = enc.extra["weight_global_scale"].reshape(1).float()
    out[base + ".input_global_scale"] = torch.ones(1)  # static activation scale: dropped by the decoder


def _qwen3_moe_nvfp4(ref: Path, dst: Path) -> Path:
    sd = load_file(str(ref / "model.safetensors"))
    out = {}
    for k, v in sd.items():
        if ".self_attn." in k and k.endswith("proj.weight"):
            _ct_nvfp4(k, v, out)
        elif ".mlp.experts." in k and k.endswith(".gate_proj.weight"):
            # llm-compressor gives gate and up one global scale (vLLM fuses them): encode the fused matrix, split rows
            up = k.replace(".gate_proj.", ".up_proj.")
            fused = torch.cat([v, sd[up]])
            enc = get_format("nvfp4").encode(fused, "compressed_tensors")
            n = v.shape[0]
            for name, sl in ((k, slice(0, n)), (up, slice(n, 2 * n))):
                base = name.removesuffix(".weight")
                out[base + ".weight_packed"] = pack_fp4(enc.codes[sl])
                out[base + ".weight_scale"] = _e4m3(enc.scales[sl])
                out[base + ".weight_global_scale"] = enc.extra["weight_global_scale"].reshape(1).float()
        elif ".mlp.experts." in k and k.endswith(".up_proj.weight"):
            continue
        elif ".mlp.experts." in k and k.endswith(".down_proj.weight"):
            _ct_nvfp4(k, v, out)
        else:
            out[k] = v
    return _write(dst, ref, out, CT_NVFP4)


@pytest.fixture(scope="module")
def qwen3_moe(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("real")
    ref = build("qwen3_moe", tmp / "ref")
    return ref, _qwen3_moe_nvfp4(ref, tmp / "nvfp4")


def test_compressed_tensors_nvfp4_equals_emulation_on_both_paths(qwen3_moe):
    ref, q = qwen3_moe
    spec = {"routed_experts": {"format": "nvfp4", "recipe": "compressed_tensors"},
            "attention": {"format": "nvfp4", "recipe": "compressed_tensors"}}
    ckpt = QuantizedCheckpoint(q, ref)
    assert ckpt.quant_method == "compressed-tensors"
    assert ckpt.quantized_classes() == {"routed_experts", "attention"}
    real = _logits(ref, ckpt=ckpt)
    emu = _logits(ref, spec=spec)
    assert torch.equal(real, emu)
    plain = _logits(ref)
    assert (real - plain).abs().max() > 1e-3  # the quantization is really there
    from fideval.score.hooks_of import checkpoint_hooks

    real_s = _logits(ref, ckpt=ckpt, serving=True, act=checkpoint_hooks(ckpt, "serving"))
    emu_s = _logits(ref, spec=spec, serving=True)
    assert torch.equal(real_s, emu_s) and not torch.equal(real_s, real)


def test_bits_per_weight_counted_from_stored_bytes(qwen3_moe):
    ref, q = qwen3_moe
    bits = QuantizedCheckpoint(q, ref).bits()["per_class"]
    c = configs()["qwen3_moe"]
    # per expert matrix: 4 bits/element + one E4M3 per 16 (0.5) + one fp32 global scale per matrix
    gate = c.moe_intermediate_size * c.hidden_size
    per_layer = c.num_experts * 3 * gate
    want = (per_layer * 4.5 + c.num_experts * 3 * 32) / per_layer
    assert bits["routed_experts"]["bpw"] == pytest.approx(want, rel=1e-12)
    assert bits["routed_experts"]["format"] == "nvfp4"
    assert bits["other"]["bpw"] == 32.0  # float32 norms and embeddings, routers


def test_fused_expert_rows_read_only_their_experts(qwen3_moe, tmp_path):
    """A model-parallel rank reads rows [lo, hi) of a fused MXFP4 tensor: equal to slicing the whole."""
    ref, _ = qwen3_moe
    sd = load_file(str(ref / "model.safetensors"))
    w = torch.stack([torch.cat([sd[f"model.layers.0.mlp.experts.{e}.gate_proj.weight"],
                                sd[f"model.layers.0.mlp.experts.{e}.up_proj.weight"]]) for e in range(8)])
    enc = get_format("mxfp4").encode(w, "rceil")
    E, R, C = w.shape
    out = {k: v for k, v in sd.items() if "layers.0.mlp.experts." not in k}
    out["model.layers.0.mlp.experts.gate_up_proj_blocks"] = pack_fp4(enc.codes).reshape(E, R, C // 32, 16)
    out["model.layers.0.mlp.experts.gate_up_proj_scales"] = enc.scales
    q = _write(tmp_path / "fused", ref, out, {"quant_method": "mxfp4"})
    ck = QuantizedCheckpoint(q, ref)
    key = "model.layers.0.mlp.experts.gate_up_proj"
    whole = ck.read(key)
    assert torch.equal(whole, get_format("mxfp4").quant_dequant(w, "rceil"))
    assert torch.equal(ck.read(key, rows=(2, 6)), whole[2:6])


# -- gpt-oss MXFP4 blocks/scales ------------------------------------------------------------------------
def test_gpt_oss_mxfp4_blocks_equal_emulation(tmp_path):
    ref = build("gpt_oss", tmp_path / "ref")
    sd = load_file(str(ref / "model.safetensors"))
    out = {}
    for k, v in sd.items():
        if k.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):
            x = v.transpose(1, 2).contiguous()  # transformers holds [E, in, out]; gpt-oss stores [E, out, in/32, 16]
            enc = get_format("mxfp4").encode(x, "rceil")
            E, R, C = x.shape
            out[k + "_blocks"] = pack_fp4(enc.codes).reshape(E, R, C // 32, 16)
            out[k + "_scales"] = enc.scales
        else:
            out[k] = v
    q = _write(tmp_path / "mxfp4", ref, out, {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]})
    ckpt = QuantizedCheckpoint(q, ref)
    assert ckpt.info("model.layers.0.mlp.experts.gate_up_proj").shape == tuple(sd["model.layers.0.mlp.experts.gate_up_proj"].shape)
    real = _logits(ref, ckpt=ckpt)
    emu = _logits(ref, spec={"routed_experts": {"format": "mxfp4", "recipe": "rceil"}})
    assert torch.equal(real, emu)
    assert not torch.equal(real, _logits(ref))


# -- DeepSeek-V3 FP8 weight_scale_inv -------------------------------------------------------------------
def _build_deepseek_128(folder: Path) -> Path:
    """The DeepSeek fixture with moe_intermediate_size 128, as in the real model a multiple of the 128 tile:
    otherwise a fused gate_up tile would straddle gate and up rows, which per-expert scales cannot express."""
    from transformers import AutoModelForCausalLM

    cfg = configs()["deepseek_v3"]
    cfg.moe_intermediate_size = 128
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if "norm" in n else 0.1 * torch.randn_like(p))
    model.save_pretrained(folder)
    return Path(folder)


def test_deepseek_fp8_scale_inv_equals_emulation(tmp_path):
    ref = _build_deepseek_128(tmp_path / "ref")
    sd = load_file(str(ref / "model.safetensors"))
    out = {}
    for k, v in sd.items():
        if k.endswith("proj.weight") or k.endswith("proj_with_mqa.weight"):
            if k.startswith("lm_head"):
                out[k] = v
                continue
            enc = get_format("fp8_block").encode(v, "fp32")
            out[k] = _e4m3(enc.codes)
            out[k + "_scale_inv"] = enc.scales.float()
        else:
            out[k] = v
    q = _write(tmp_path / "fp8", ref, out, {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
                                            "activation_scheme": "dynamic"})
    ckpt = QuantizedCheckpoint(q, ref)
    assert ckpt.quantized_classes() == {"attention", "routed_experts", "shared_experts", "dense_mlp"}
    spec = {c: {"format": "fp8_block"} for c in ("attention", "routed_experts", "shared_experts", "dense_mlp")}
    assert torch.equal(_logits(ref, ckpt=ckpt), _logits(ref, spec=spec))


# -- ModelOpt NVFP4 and compressed-tensors FP8 (float-quantized, block scales), Llama: every linear -------------
@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return build("llama", tmp_path_factory.mktemp("real-llama") / "ref")


def _linears(ref: Path, encode) -> dict:
    out = {}
    for k, v in load_file(str(ref / "model.safetensors")).items():
        if k.endswith("proj.weight"):
            out.update(encode(k, v))
        else:
            out[k] = v
    return out


def test_modelopt_nvfp4_equals_emulation(llama, tmp_path):
    def enc(k, v):
        e = get_format("nvfp4").encode(v, "modelopt")
        return {k: pack_fp4(e.codes), k + "_scale": _e4m3(e.scales), k + "_scale_2": e.extra["weight_scale_2"].reshape(()).float(),
                k.removesuffix("weight") + "input_scale": torch.ones(())}

    q = _write(tmp_path / "mo", llama, _linears(llama, enc), {"quant_method": "modelopt", "quant_algo": "NVFP4"})
    ckpt = QuantizedCheckpoint(q, llama)
    assert ckpt.quantized_classes() == {"attention", "dense_mlp"}
    spec = {c: {"format": "nvfp4", "recipe": "modelopt"} for c in ("attention", "dense_mlp")}
    assert torch.equal(_logits(llama, ckpt=ckpt), _logits(llama, spec=spec))


def test_compressed_tensors_fp8_block_equals_emulation(llama, tmp_path):
    def enc(k, v):
        e = get_format("fp8_block").encode(v, "fp32")
        return {k: _e4m3(e.codes), k + "_scale": e.scales.float()}

    qc = {"quant_method": "compressed-tensors", "format": "float-quantized",
          "config_groups": {"group_0": {"format": "float-quantized", "weights": {"strategy": "block", "block_structure": [128, 128]}}}}
    q = _write(tmp_path / "ct-fp8", llama, _linears(llama, enc), qc)
    spec = {c: {"format": "fp8_block"} for c in ("attention", "dense_mlp")}
    real = _logits(llama, ckpt=QuantizedCheckpoint(q, llama))
    assert torch.equal(real, _logits(llama, spec=spec)) and not torch.equal(real, _logits(llama))


# -- refusals ---------------------------------------------------------------------------------------------
def _one_line(exc: pytest.ExceptionInfo) -> str:
    msg = exc.value.message
    assert "\n" not in msg
    return msg


@pytest.mark.parametrize("qc, expect", [
    ({"quant_method": "awq", "bits": 4}, "quant_method 'awq' is not supported"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized"}, "compressed-tensors format 'pack-quantized' is not supported"),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {"format": "int-quantized"}}}, "format 'int-quantized'"),
])
def test_unknown_quantization_config_is_one_line(qwen3_moe, tmp_path, qc, expect):
    ref, q = qwen3_moe
    bad = tmp_path / "bad"
    shutil.copytree(q, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["quantization_config"] = qc
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FidevalError) as e:
        QuantizedCheckpoint(bad, ref)
    assert expect in _one_line(e)


def test_incomplete_or_foreign_tensor_sets_are_one_line(qwen3_moe, tmp_path):
    ref, q = qwen3_moe
    sd = load_file(str(q / "model.safetensors"))
    gone = "model.layers.1.mlp.experts.3.down_proj.weight_global_scale"
    _write(tmp_path / "a", ref, {k: v for k, v in sd.items() if k != gone}, CT_NVFP4)
    with pytest.raises(FidevalError) as e:
        QuantizedCheckpoint(tmp_path / "a", ref)
    assert repr(gone) in _one_line(e)
    # an FP8 weight with no scale at all would be read unscaled: refused
    raw = dict(sd)
    raw["model.layers.0.self_attn.extra.weight"] = torch.zeros(4, 4, dtype=torch.float8_e4m3fn)
    _write(tmp_path / "b", ref, raw, CT_NVFP4)
    with pytest.raises(FidevalError) as e:
        QuantizedCheckpoint(tmp_path / "b", ref)
    assert "'model.layers.0.self_attn.extra.weight' is stored as torch.float8_e4m3fn" in _one_line(e)
    # another architecture
    shutil.copytree(q, tmp_path / "c")
    cfg = json.loads((tmp_path / "c" / "config.json").read_text())
    cfg["architectures"] = ["LlamaForCausalLM"]
    (tmp_path / "c" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FidevalError) as e:
        QuantizedCheckpoint(tmp_path / "c", ref)
    assert "differs from the reference's 'Qwen3MoeForCausalLM'" in _one_line(e)


def test_mis_shaped_decoded_tensor_names_it(qwen3_moe, tmp_path):
    ref, q = qwen3_moe
    sd = load_file(str(q / "model.safetensors"))
    k = "model.layers.0.self_attn.o_proj"
    sd[k + ".weight_packed"] = sd[k + ".weight_packed"][:, :16].contiguous()  # half the input dim
    sd[k + ".weight_scale"] = sd[k + ".weight_scale"][:, :2].contiguous()
    _write(tmp_path / "m", ref, sd, CT_NVFP4)
    r = Runner(QuantizedCheckpoint(tmp_path / "m", ref))
    with pytest.raises(FidevalError) as e:
        list(r.run(tokens(r.vocab_size, n=1, length=8), canary=False))
    assert "'model.layers.0.self_attn.o_proj.weight' has shape [64, 32], config.json implies [64, 64]" in _one_line(e)
