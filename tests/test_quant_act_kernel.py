"""The serving path's activation quant-dequant as a Triton kernel (fideval.quant.act_kernel) gives the torch
version's bits: on the GPU for every dtype, and on the CPU under Triton's interpreter (float32 and float16: the
interpreter's own float32 -> bfloat16 conversion truncates, so bfloat16 is checked on the GPU only)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from fideval.quant.activations import act_quant_e4m3, act_quant_e4m3_torch


def _inputs(dtype: torch.dtype, device: str, rows: int = 33, cols: tuple[int, ...] = (320, 256, 7, 2048)):
    """Rows of very different ranges, an all-zero row, tiny values (sub-E4M3 after scaling), a -0.0, and widths
    that are and are not a multiple of the block."""
    g = torch.Generator().manual_seed(11)
    for c in cols:
        x = torch.randn(rows, c, generator=g) * torch.exp(torch.randn(rows, 1, generator=g) * 4)
        x[0] = 0
        x[1, :5] = 1e-7
        x[2, 3] = -0.0
        x[3, :64] *= 1e-6  # a block whose small values round to E4M3 subnormals and zeros
        yield x.clamp(-6e4, 6e4).to(dtype).to(device)  # finite in float16 too (activations are checked finite)


_INTERPRETED = """
import sys
import torch
from fideval.quant import act_kernel
from fideval.quant.activations import act_quant_e4m3_torch
sys.path.insert(0, sys.argv[1])
from test_quant_act_kernel import _inputs
bad = []
for dt in (torch.float32, torch.float16):
    for x in _inputs(dt, "cpu", rows=9):
        for scale in ("fp32", "ue8m0"):
            a, b = act_kernel.act_quant_e4m3(x, 128, scale), act_quant_e4m3_torch(x, 128, scale)
            if not torch.equal(a.view(torch.int32 if dt == torch.float32 else torch.int16),
                               b.view(torch.int32 if dt == torch.float32 else torch.int16)):
                bad.append((str(dt), x.shape[-1], scale, float((a.float() - b.float()).abs().max())))
print(bad)
sys.exit(1 if bad else 0)
"""


def test_kernel_under_triton_interpreter_gives_the_torch_bits():
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    p = subprocess.run([sys.executable, "-c", _INTERPRETED, os.path.dirname(__file__)], env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, (p.stdout + p.stderr)[-2000:]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("scale", ["fp32", "ue8m0"])
def test_kernel_on_the_gpu_gives_the_torch_bits(dtype, scale):
    from fideval.quant import act_kernel

    for x in [*_inputs(dtype, "cuda"), (torch.randn(4096, 7168, device="cuda") * 3).to(dtype)]:
        assert act_kernel.usable(x, 128)
        a, b = act_quant_e4m3(x, 128, scale), act_quant_e4m3_torch(x, 128, scale)
        bits = torch.int32 if dtype == torch.float32 else torch.int16
        assert torch.equal(a.view(bits), b.view(bits)), (x.shape, float((a.float() - b.float()).abs().max()))
    y = torch.randn(2, 5, 384, device="cuda", dtype=dtype)  # leading dims and a 3-block width: shape kept
    assert act_quant_e4m3(y, 128, scale).shape == y.shape
    assert not act_kernel.usable(y, 96)  # not a power of two: the torch version runs
    assert torch.equal(act_quant_e4m3(y, 96, scale), act_quant_e4m3_torch(y, 96, scale))
