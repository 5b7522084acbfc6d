"""NVFP4: E2M1 elements, one E4M3 scale per 16, and one float32 scale per tensor.

Two-level scaling lets the E4M3 block scale use its whole range: the tensor scale maps the tensor's
amax onto 448 * 6. Recipes (both round elements half-to-even with saturation at +-6):

* ``modelopt`` (NVIDIA TensorRT-Model-Optimizer, torchao): ``weight_scale_2 = amax_tensor / (448*6)``,
  block scale ``sb = e4m3(amax_block / 6 / weight_scale_2)``, elements ``e2m1(x / (sb * weight_scale_2))``;
  dequant ``e2m1 * sb * weight_scale_2``.
* ``compressed_tensors`` (llm-compressor / vLLM): ``global_scale = 448*6 / amax_tensor`` (the reciprocal,
  stored as ``weight_global_scale``), ``sb = e4m3(amax_block / 6 * global_scale)``, elements
  ``e2m1(x / (sb / global_scale))``. The products round differently, so codes can differ in the last ulp
  of a block scale.

Block scales are clamped to [2**-9, 448] (the smallest E4M3 subnormal: a nonzero block never gets a zero
scale) and an all-zero block gets scale 1 (ModelOpt's rule). :func:`nvfp4_decode` reads both stored
conventions: ModelOpt's multiplier ``weight_scale_2`` or compressed-tensors' ``weight_global_scale``.
"""

from __future__ import annotations

import torch

from fideval.errors import FidevalError
from fideval.quant.base import Encoded, Format
from fideval.quant.elements import E2M1, E4M3, cast, from_codes, to_codes

NVFP4_BLOCK = 16
E4M3_MIN_SUB = 2.0**-9


def tensor_scale(amax: torch.Tensor, recipe: str) -> torch.Tensor:
    """The per-matrix tensor scale from matrix amaxes (any shape, float32): ``weight_scale_2 = amax / (6 x 448)``
    (modelopt) or ``weight_global_scale = 6 x 448 / amax`` (compressed_tensors; a Python float over a tensor, which torch
    computes as reciprocal-then-multiply on every device, as the producers' torch code does); 1 for an all-zero matrix.
    The torch path and the CUDA kernel (fideval.quant.weight_kernel) both take it from here."""
    amax = amax.float()
    zero = amax == 0
    safe = torch.where(zero, torch.ones_like(amax), amax)
    if recipe == "modelopt":
        return torch.where(zero, torch.ones_like(amax), safe / (amax.new_tensor(6.0) * E4M3.max))
    return torch.where(zero, torch.ones_like(amax), (E4M3.max * 6.0) / safe)


class NVFP4(Format):
    name = "nvfp4"
    recipes = ("modelopt", "compressed_tensors")
    default_recipe = "modelopt"
    groups = (NVFP4_BLOCK,)
    default_group = NVFP4_BLOCK
    element_bits = 4
    description = "NVFP4: E2M1, E4M3 scale per 16, float32 tensor scale"

    def scale_bits(self, recipe=None) -> float:
        return 8.0

    def storage_bits(self, shape, group=None, recipe=None) -> int:
        return super().storage_bits(shape, group, recipe) + 32  # + the tensor scale

    def _qdq_kernel(self, x, recipe, group, out) -> bool:
        """CUDA + Triton: an amax kernel, the ``[M]`` tensor scales in torch, one kernel for the blocks; the torch
        path's bits (:mod:`fideval.quant.weight_kernel`)."""
        from fideval.quant import weight_kernel

        return (group == NVFP4_BLOCK and weight_kernel.usable(x, out)
                and weight_kernel.nvfp4_qdq(x, out, recipe, self.name, tensor_scale))

    def matrix_context(self, mat: torch.Tensor) -> dict:
        return {"tensor_amax": mat.abs().amax().float()}

    def _values(self, x2, recipe, group, shape, tensor_amax=None):
        """The tensor scale is per matrix: a fused ``[E, out, in]`` tensor gets one per expert, as each
        expert's weight has its own ``weight_scale_2`` in a real checkpoint."""
        rows, cols = (shape[-2], shape[-1]) if len(shape) >= 2 else (1, x2.shape[-1])
        mats = x2.reshape(-1, rows * cols)
        amax_t = mats.abs().amax(-1, keepdim=True) if tensor_amax is None else tensor_amax.reshape(1, 1).float()
        amax_t = amax_t.expand(mats.shape[0], 1)
        blocks = mats.reshape(mats.shape[0], -1, group)  # [M, nblocks, 16]
        amax_b = blocks.abs().amax(-1)  # [M, nblocks]
        # divisors as tensors: torch's CUDA kernel multiplies by the reciprocal of a Python scalar divisor (an ulp off,
        # often); the CPU and the producers divide (fideval.quant.weight_kernel's docstring has the measurement)
        six = amax_b.new_tensor(6.0, dtype=torch.float32)
        ts = gs = tensor_scale(amax_t, recipe)  # weight_scale_2 (modelopt) or weight_global_scale (compressed_tensors)
        sb = (amax_b / six) / ts if recipe == "modelopt" else (amax_b / six) * gs
        sb = cast(sb.clamp(E4M3_MIN_SUB, E4M3.max), E4M3)
        sb = torch.where(amax_b > 0, sb, torch.ones_like(sb))
        total = sb * ts if recipe == "modelopt" else sb / gs
        q = cast((blocks / total.unsqueeze(-1)).clamp(-E2M1.max, E2M1.max), E2M1)
        return q, sb, total, (ts if recipe == "modelopt" else gs)

    def _encode(self, x2, recipe, group, shape, dtype, tensor_amax=None) -> Encoded:
        q, sb, _, t = self._values(x2, recipe, group, shape, tensor_amax)
        lead = tuple(shape[:-2]) if len(shape) >= 3 else ()
        if recipe == "modelopt":
            extra = {"weight_scale_2": t.reshape(lead)}
        else:
            extra = {"weight_global_scale": t.reshape(lead)}
        return Encoded(self.name, recipe, group, shape, dtype, to_codes(q, E2M1).reshape(shape),
                       to_codes(sb, E4M3).reshape(*shape[:-1], shape[-1] // group), extra)

    def _qdq(self, x2, recipe, group, shape, dtype, tensor_amax=None):
        q, _, total, _ = self._values(x2, recipe, group, shape, tensor_amax)
        return (q * total.unsqueeze(-1)).reshape(shape).to(dtype)

    def decode(self, enc: Encoded) -> torch.Tensor:
        out = nvfp4_decode(enc.codes, enc.scales, weight_scale_2=enc.extra.get("weight_scale_2"),
                           weight_global_scale=enc.extra.get("weight_global_scale"), group=enc.group)
        return out.reshape(enc.shape).to(enc.dtype)


def nvfp4_decode(codes: torch.Tensor, block_scales: torch.Tensor, *, weight_scale_2=None,
                 weight_global_scale=None, group: int = NVFP4_BLOCK) -> torch.Tensor:
    """float32 values from E2M1 codes ``[..., n]`` (uint8, one code per byte), E4M3 block scales
    ``[..., n/16]`` (uint8 codes or float8_e4m3fn) and exactly one of the two tensor-scale conventions."""
    if (weight_scale_2 is None) == (weight_global_scale is None):
        raise FidevalError("NVFP4 decode needs exactly one of weight_scale_2 (ModelOpt) or weight_global_scale (compressed-tensors)")
    if block_scales.dtype == torch.float8_e4m3fn:
        block_scales = block_scales.view(torch.uint8)
    sb = from_codes(block_scales, E4M3)
    # tensor scales: a scalar, or one per leading index (per expert) broadcast over [out, in/16]
    if weight_scale_2 is not None:
        t = torch.as_tensor(weight_scale_2, dtype=torch.float32, device=sb.device)
        scale = sb * t.reshape(*t.shape, *([1] * (sb.dim() - t.dim()))) if t.dim() else sb * t
    else:
        t = torch.as_tensor(weight_global_scale, dtype=torch.float32, device=sb.device)
        scale = sb / t.reshape(*t.shape, *([1] * (sb.dim() - t.dim()))) if t.dim() else sb / t
    vals = from_codes(codes, E2M1).reshape(*block_scales.shape, group)
    return (vals * scale.unsqueeze(-1)).reshape(codes.shape)


def decode_compressed_tensors_nvfp4(weight_packed: torch.Tensor, weight_scale: torch.Tensor,
                                    weight_global_scale: torch.Tensor) -> torch.Tensor:
    """Decode a compressed-tensors NVFP4 tensor set: ``weight_packed`` uint8 ``[out, in/2]`` (two E2M1
    codes per byte, low nibble first), ``weight_scale`` float8_e4m3fn ``[out, in/16]`` and the scalar
    ``weight_global_scale`` (the reciprocal of ModelOpt's ``weight_scale_2``). Returns float32 ``[out, in]``."""
    from fideval.quant.mx import unpack_fp4

    codes = unpack_fp4(weight_packed)
    if codes.shape[-1] != weight_scale.shape[-1] * NVFP4_BLOCK:
        raise FidevalError(
            f"NVFP4 weight_packed {list(weight_packed.shape)} does not match weight_scale {list(weight_scale.shape)}",
            hint="expected weight_packed [out, in/2] and weight_scale [out, in/16]",
        )
    return nvfp4_decode(codes, weight_scale, weight_global_scale=weight_global_scale.float().reshape(()))


NVFP4_FORMAT = NVFP4()

DEFINES = (NVFP4_FORMAT,)  # fideval.quant.base.FORMATS names this module for them
