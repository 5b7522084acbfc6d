"""Bit-reproducible execution: the same run twice gives the same logit bytes.

What can change the bits of a forward pass, and what we do about it:
* TF32 (10-bit mantissa) for fp32 matmuls/convolutions on Ampere+ — turned off, matmul precision "highest".
* kernels with atomics (index_add_, scatter-add) or split-K reductions picked by cuBLAS heuristics —
  ``torch.use_deterministic_algorithms(True)`` plus ``CUBLAS_WORKSPACE_CONFIG`` (cuBLAS needs a fixed
  workspace to be deterministic; it must be set before the first cuBLAS handle exists, hence at import).
* batch composition: a row's result may depend on which rows share its GEMM (tile shapes, padding).
  The runner forms micro-batches from consecutive sequences in input order, always the same size.
* cuDNN autotuning — benchmark off.
The canary (:func:`digest`) turns "should be" into a measured fact per run.
"""

from __future__ import annotations

import hashlib
import os

import torch

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def configure() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.set_float32_matmul_precision("highest")
    # warn_only: an op without a deterministic kernel warns (and the canary tells us) rather than aborting a long run
    torch.use_deterministic_algorithms(True, warn_only=True)


def digest(t: torch.Tensor) -> str:
    """SHA-256 of a tensor's float32 little-endian bytes (row-major)."""
    a = t.detach().to("cpu", torch.float32).contiguous().numpy()
    return hashlib.sha256(a.astype("<f4", copy=False).tobytes()).hexdigest()
