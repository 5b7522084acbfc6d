"""A real quantized build through the reference code: a compressed-tensors NVFP4 encoding of a tiny DeepSeek-V3's
routed experts (packed codes, E4M3 block scales, a global scale per tensor), decoded layer by layer by
fideval.model.weights.quantized and loaded into the vendor's Expert modules, gives logits bit-identical to the emulated
candidate (the same format and recipe quantize-dequantized in place) in the same reference path."""

from __future__ import annotations

import json

import ref_deepseek_v3 as rv3
import torch
from safetensors.torch import load_file, save_file

from fideval.model.runner import RunnerOptions, make_runner
from fideval.model.weights.quantized import open_real
from fideval.quant import get_format
from fideval.quant.mx import pack_fp4
from fideval.quant.spec import compile_spec

CT_NVFP4 = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
            "config_groups": {"group_0": {"format": "nvfp4-pack-quantized", "targets": ["Linear"]}}}


def _build(ref, dst):
    sd, out = load_file(str(ref / "model.safetensors")), {}
    for k, v in sd.items():
        if ".mlp.experts." in k and k.endswith("proj.weight"):
            enc = get_format("nvfp4").encode(v, "compressed_tensors")
            base = k.removesuffix(".weight")
            out[base + ".weight_packed"] = pack_fp4(enc.codes)
            out[base + ".weight_scale"] = enc.scales.to(torch.uint8).view(torch.float8_e4m3fn)
            out[base + ".weight_global_scale"] = enc.extra["weight_global_scale"].reshape(1).float()
        else:
            out[k] = v
    dst.mkdir()
    save_file({k: v.contiguous() for k, v in out.items()}, str(dst / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((ref / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**cfg, "quantization_config": CT_NVFP4}))
    return dst


def test_real_nvfp4_experts_equal_emulation_in_the_reference_code(tmp_path):
    rv3.need_code()
    ref = rv3.build(tmp_path / "ref")
    real = open_real(_build(ref, tmp_path / "nvfp4"), ref)
    toks = rv3.tokens(3, 16, seed=2).numpy()
    base = dict(implementation="reference", trust_remote_code=True, micro_batch=1)
    got = torch.stack([x for _, x in make_runner(real, RunnerOptions(**base)).run(toks, canary=False)])
    spec = compile_spec({"routed_experts": {"format": "nvfp4", "recipe": "compressed_tensors"}})
    emu = torch.stack([x for _, x in make_runner(ref, RunnerOptions(**base, weight_transform=spec.weight_transform))
                       .run(toks, canary=False)])
    assert torch.equal(got, emu)
    plain = torch.stack([x for _, x in make_runner(ref, RunnerOptions(**base)).run(toks, canary=False)])
    assert (got - plain).abs().max() > 1e-3
