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

import os

import numpy as np
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


# The canary's digest: computed where the tensor is (no copy of 4-17 GB of logits to the host, no single-core SHA-256
# over them: measured on an H100, two host SHA-256 digests were 70 of a 32,768-token candidate run's 86 s).
DIGEST = "lin128-v1"
_BLOCK = 1 << 16  # elements a weight block holds; a tensor is [blocks, _BLOCK] and a last, shorter one
_STEP_BLOCKS = 64  # blocks a step multiplies at once: 4 M elements, 64 MiB of int64 products for both lanes
_SEEDS = (0x6A09E667F3BCC908, 0xBB67AE8584CAA73B)  # one weight stream per lane (SHA-512's first two IV words)
_WEIGHTS: dict[str, torch.Tensor] = {}


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on uint64 (numpy wraps uint64 arithmetic modulo 2**64 by definition)."""
    z = x + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def digest_weights(count: int, lane: int, stream: int) -> np.ndarray:
    """``count`` odd pseudo-random uint64 weights of ``lane`` (stream 0: within a block, 1: one per block)."""
    with np.errstate(over="ignore"):
        x = np.arange(count, dtype=np.uint64) + np.uint64((_SEEDS[lane] ^ (stream << 62)) & (2**64 - 1))
        return _splitmix64(x) | np.uint64(1)


def _within(device: torch.device) -> torch.Tensor:
    """[2, _BLOCK] int64 within-block weights on ``device`` (cached)."""
    key = str(device)
    if key not in _WEIGHTS:
        w = np.stack([digest_weights(_BLOCK, lane, 0) for lane in range(2)])
        _WEIGHTS[key] = torch.from_numpy(w.view(np.int64)).to(device)
    return _WEIGHTS[key]


def _lane_sums(rows: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``[k, m]`` int64 rows times each lane's ``[2, m]`` weights, summed along the row modulo 2**64: ``[k, 2]``."""
    if rows.is_cuda:  # CUDA has no int64 matmul; its elementwise product and sum are bandwidth-bound anyway
        return (rows.unsqueeze(1) * u).sum(dim=2)
    # the CPU's int64 matrix-vector product, a lane at a time: several times the broadcast product and sum (and the
    # [k, m] @ [m, 2] matmul), measured on 2 cores
    return torch.stack([torch.mv(rows, u[lane].contiguous()) for lane in range(u.shape[0])], dim=1)


def digest(t: torch.Tensor, device: torch.device | str | None = None) -> str:
    """The canary's digest of a tensor's float32 values (a bfloat16 or float16 tensor is widened first, exactly),
    computed on the tensor's own device: ``lin128-v1:<elements>:<32 hex digits>``.

    Two lanes, each ``sum_i b_i * w_i`` modulo 2**64, where ``b_i`` is element i's float32 bit pattern (as a signed
    int32) in row-major order and ``w_i = u_{i mod B} * v_{i div B}`` with ``u``, ``v`` odd SplitMix64 streams
    (:func:`digest_weights`; B = 65,536). Integer addition modulo 2**64 does not depend on order, so the CPU and
    any GPU give the same digest, and the sum is reduced in whatever order the device likes. What it detects: a
    single changed value always (``w_i`` is odd and ``|b_i - b'_i| < 2**32``), any other change unless it happens
    to cancel in both 64-bit lanes (a widened bfloat16's low 16 bits are zero: 48 bits a lane); it is a check against
    drift, not a cryptographic hash. torch's int64 kernels
    wrap modulo 2**64 on the CPU and CUDA; tests/test_determinism_digest.py checks the digest against a numpy
    uint64 computation of the same sum. ``device``: where to compute it (default: the tensor's own), a step of 4 M
    elements moved there at a time (a stored shard read on the host, digested on the run's GPU)."""
    x = t.detach()
    x = (x if x.dtype == torch.float32 else x.float()).contiguous().reshape(-1).view(torch.int32)
    n = x.numel()
    dev = x.device if device is None else torch.device(device)  # a step at a time there: a stored shard's rows
    u = _within(dev)
    blocks = -(-n // _BLOCK)
    v = torch.from_numpy(np.stack([digest_weights(blocks, lane, 1) for lane in range(2)]).view(np.int64)).to(dev)
    acc = torch.zeros(2, dtype=torch.int64, device=dev)
    step = _STEP_BLOCKS * _BLOCK
    for a in range(0, n, step):
        piece = x[a:a + step].to(dev).to(torch.int64)
        k, r = divmod(piece.numel(), _BLOCK)  # whole blocks, and a last one of r elements
        b0 = a // _BLOCK
        if k:
            acc += (_lane_sums(piece[:k * _BLOCK].view(k, _BLOCK), u) * v[:, b0:b0 + k].T).sum(dim=0)
        if r:
            acc += _lane_sums(piece[k * _BLOCK:].view(1, r), u[:, :r])[0] * v[:, b0 + k]
    lanes = [int(h) & (2**64 - 1) for h in acc.tolist()]
    return f"{DIGEST}:{n}:{lanes[0]:016x}{lanes[1]:016x}"
