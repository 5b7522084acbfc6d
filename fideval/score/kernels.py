"""Which scorer kernel runs where, and the one call that runs it: the fused Triton kernel on CUDA
(:mod:`fideval.score.triton_kernel`), else torch (:mod:`fideval.score.torch_kernel`, CPU and GPU).

Its own module so that the scoring driver (:mod:`fideval.score.run`) and the candidates
(:mod:`fideval.score.candidate`, which size a model run for the scoring device) import one place and not each other.
"""

from __future__ import annotations

import numpy as np
import torch

from fideval.errors import FidevalError
from fideval.score import torch_kernel


def pick(device: str = "auto", kernel: str = "auto") -> tuple[torch.device, str]:
    """Resolve ``device`` ("auto"/"cpu"/"cuda[:n]", by the one resolver) and ``kernel`` ("auto"/"triton"/"torch")."""
    from fideval.model.device import resolve_device
    from fideval.score import triton_kernel

    dev = resolve_device(device)
    if kernel == "auto":
        kernel = "triton" if dev.type == "cuda" and triton_kernel.available() else "torch"
    if kernel == "triton" and not (dev.type == "cuda" and triton_kernel.available()):
        raise FidevalError("kernel 'triton' needs a CUDA device and the triton package", hint="use --kernel torch")
    return dev, kernel


def score_tensors(ref: torch.Tensor, cand: torch.Tensor, targets: torch.Tensor, kernel: str
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Figures float64 [n, 7], flags bool [n, 4], non-finite mask [n] as numpy, with the chosen kernel.
    The torch kernel's float64 temporaries stay within half the input's size (and 256 MiB), so scoring on
    the CPU never holds more than the two shards and that much."""
    if kernel == "triton":
        from fideval.score import triton_kernel

        figs, flags, bad = triton_kernel.score_rows(ref, cand, targets)
    else:
        budget = min(1 << 28, max(ref.numel() * ref.element_size() // 2, 1 << 20))
        figs, flags, bad = torch_kernel.score_rows(ref, cand, targets, budget_bytes=budget)
    return figs.cpu().numpy(), flags.cpu().numpy(), bad.cpu().numpy()
