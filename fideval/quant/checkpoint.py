"""Decode the tensor sets of real quantized checkpoints back to float32, for scoring a real build.

A loader hands over the tensors of one layer (names as stored in the safetensors files); this module
recognises each convention by its tensor names and returns ``{weight name: float32 tensor}``, leaving
every other tensor as it is. Conventions (the first match per weight wins):

=============================  ===================================================  ================
stored tensors                 convention                                           decoded to
=============================  ===================================================  ================
``X_blocks``, ``X_scales``     gpt-oss MXFP4 (uint8 ``[..., G, 16]``, E8M0 ``[..., G]``)   ``X``
``X.weight`` (fp8),            DeepSeek-V3 FP8, 128x128 ``weight_scale_inv``         ``X.weight``
``X.weight_scale_inv``
``X.weight_packed``,           compressed-tensors NVFP4 (``weight_global_scale`` =   ``X.weight``
``X.weight_scale``,            1 / ModelOpt's ``weight_scale_2``)
``X.weight_global_scale``
``X.weight`` (uint8),          ModelOpt NVFP4                                       ``X.weight``
``X.weight_scale`` (fp8),
``X.weight_scale_2``
``X.weight`` (fp8),            compressed-tensors / ModelOpt FP8: per tensor,       ``X.weight``
``X.weight_scale`` (fp32)      per channel ``[out, 1]`` or per block
=============================  ===================================================  ================

Static activation scales (``input_scale``, ``input_global_scale``) are dropped: the serving path
re-quantizes activations dynamically (see ``activations.py``), and that choice is in the report.
"""

from __future__ import annotations

import torch

from fideval.errors import FidevalError
from fideval.quant.fp8 import fp8_block_decode
from fideval.quant.mx import decode_gpt_oss_mxfp4, unpack_fp4
from fideval.quant.nvfp4 import decode_compressed_tensors_nvfp4, nvfp4_decode

_DROP_SUFFIXES = (".input_scale", ".input_global_scale", ".k_scale", ".v_scale")


def decode_fp8_scaled(weight: torch.Tensor, weight_scale: torch.Tensor, block: tuple[int, int] | None = None) -> torch.Tensor:
    """compressed-tensors / ModelOpt FP8: ``weight`` float8_e4m3fn ``[out, in]`` times ``weight_scale`` --
    a scalar (per tensor), ``[out, 1]`` (per channel) or ``[ceil(out/b), ceil(in/b)]`` (per block)."""
    w = weight.float()
    s = weight_scale.float()
    if s.numel() == 1:
        return w * s.reshape(())
    if s.shape == (w.shape[0], 1) or s.shape == (w.shape[0],):
        return w * s.reshape(-1, 1)
    b = block or (-(-w.shape[0] // s.shape[0]), -(-w.shape[1] // s.shape[1]))
    if b[0] != b[1]:
        raise FidevalError(f"FP8 block scales {list(s.shape)} for weight {list(w.shape)}: only square blocks are supported")
    return fp8_block_decode(weight, s, b[0])


def decode_tensor_set(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Decode every quantized weight in ``tensors`` (one layer's worth, or a whole small checkpoint)."""
    out: dict[str, torch.Tensor] = {}
    used: set[str] = set()
    for name, t in tensors.items():
        if name.endswith("_blocks") and name[: -len("_blocks")] + "_scales" in tensors:
            base = name[: -len("_blocks")]
            out[base] = decode_gpt_oss_mxfp4(t, tensors[base + "_scales"])
            used |= {name, base + "_scales"}
        elif name.endswith(".weight_packed"):
            base = name[: -len("_packed")]
            need = [base + "_scale", base + "_global_scale"]
            if not all(k in tensors for k in need):
                raise FidevalError(f"{name}: NVFP4 weight without {' and '.join(k for k in need if k not in tensors)}")
            out[base] = decode_compressed_tensors_nvfp4(t, tensors[need[0]], tensors[need[1]])
            used |= {name, *need}
        elif name.endswith(".weight") and name + "_scale_inv" in tensors:
            out[name] = fp8_block_decode(t, tensors[name + "_scale_inv"])
            used |= {name, name + "_scale_inv"}
        elif name.endswith(".weight") and t.dtype == torch.uint8 and name + "_scale_2" in tensors:
            codes = unpack_fp4(t)
            out[name] = nvfp4_decode(codes, tensors[name + "_scale"], weight_scale_2=tensors[name + "_scale_2"].float().reshape(()))
            used |= {name, name + "_scale", name + "_scale_2"}
        elif name.endswith(".weight") and t.dtype == torch.float8_e4m3fn and name + "_scale" in tensors:
            out[name] = decode_fp8_scaled(t, tensors[name + "_scale"])
            used |= {name, name + "_scale"}
    for name, t in tensors.items():
        if name not in used and name not in out and not name.endswith(_DROP_SUFFIXES):
            out[name] = t
    return out
