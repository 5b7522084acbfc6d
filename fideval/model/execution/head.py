"""The lm head's arithmetic: ``float32`` (float32 weights and inputs, float32 GEMM, no TF32) or ``bf16`` (the same
bfloat16 values on the tensor cores: bf16 x bf16 products, float32 sums, float32 logits).

Why the second one is the same model: the head's input is the final norm's output in the layers' dtype, and a
released head is bfloat16, so in a bf16 run every operand of the float32 GEMM is a bfloat16 value; the product of
two bfloat16 values (8-bit significands) is exact in float32, so both modes form the same products and sum them in
float32, in another order. A float32 GEMM's order is cuBLAS's choice as well (it changes with the shape), so the
two differ by float32 rounding of the sums (~1e-6 relative), far below any candidate's KLD. The bf16 mode puts the
head on the tensor cores; the float32 head measured ~52 TFLOP/s on an H100, 18.5 of 32.5 s of a 3-layer pass
(bench/RESULTS.md, 2026-12-07). bench/head.py measures both: on an H100, 568 ms (53 TFLOP/s) float32 against 46.5 ms
(653 TFLOP/s) bf16 for 16,384 tokens, 12.2x; a whole bf16 run's logits 4.8e-7 from the float32 head's at |logit| 3.3.

``auto`` takes ``bf16`` exactly when it computes those products: a GPU, bfloat16 layers, no activation transform
on the head (a serving candidate that quantizes the head's inputs), weights bf16-exact after any quant transform
(a GGUF Q6_K head is not), the final norm returning bfloat16, and a torch with the bf16 -> float32 GEMM
(``torch.mm(..., out_dtype=torch.float32)``, CUDA only). The mode is recorded in the store's ``teacher`` block
(``lm_head``) and a candidate adopts the teacher's.
"""

from __future__ import annotations

import torch

MODES = ("auto", "float32", "bf16")
HINT = "use lm head auto or float32"


def setting_problem(device_type: str, dtype: torch.dtype) -> str | None:
    """Why a run on ``device_type`` with layers in ``dtype`` cannot take the bf16 head (None: the setting allows it)."""
    if device_type != "cuda":
        return "it needs a GPU (torch has no bfloat16 x bfloat16 -> float32 GEMM on the CPU)"
    if dtype != torch.bfloat16:
        return f"the layers compute in {str(dtype).removeprefix('torch.')}, not bfloat16"
    return None


def refusal(why: str) -> str:
    """The one-line refusal of an asked-for bf16 head, for the reason ``why``."""
    return f"lm head bf16 cannot run here: {why}"


def setting_refusal(implementation: str, device_type: str, dtype: torch.dtype) -> str | None:
    """What refuses an asked-for bf16 head that the run's setting alone rules out, before any weight is read
    (``fideval teacher`` before its store folder exists, ``fideval validate``); None: the runner decides. The same
    for both backends (the reference code's runner applies its driver's head rows as the transformers runner does)."""
    why = setting_problem(device_type, dtype)
    return refusal(why) if why else None


def unusable(device: torch.device, dtype: torch.dtype, act_transform: dict | None) -> str | None:
    """Why the bf16 head cannot run in this setting (None: it can, if the weights allow)."""
    why = setting_problem(device.type, dtype)
    if why:
        return why
    if act_transform and "lm_head" in act_transform:
        return "the candidate quantizes the lm head's activations (their values are not bfloat16)"
    try:
        a = torch.ones((1, 1), dtype=torch.bfloat16, device=device)
        torch.mm(a, a, out_dtype=torch.float32)
    except (RuntimeError, TypeError, NotImplementedError):
        return f"torch {torch.__version__} has no bfloat16 GEMM with float32 output"
    return None


def settle(want: str, why: str | None, device: torch.device, world: int = 1, group=None) -> str:
    """The mode a run takes, every rank alike: ``bf16`` where no rank has a reason against it (``why``: this rank's,
    None: none), else ``float32`` -- or, where ``want`` was ``bf16``, the one-line refusal naming the reason."""
    from fideval.errors import FidevalError

    if world > 1:  # one rank's rows may be exact where another's are not
        import torch.distributed as dist

        flag = torch.tensor([0 if why else 1], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
        why = why or (None if int(flag) else "another rank's lm head rows are not bfloat16 values")
    if why and want == "bf16":
        raise FidevalError(refusal(why), hint=HINT)
    return "float32" if why else "bf16"


def exact(w: torch.Tensor) -> bool:
    """Every value of ``w`` is a bfloat16 value (so casting loses nothing)."""
    return bool(torch.equal(w.to(torch.bfloat16).to(w.dtype), w))


class Bf16Head(torch.nn.Module):
    """``x [..., H] (bfloat16) -> float32 [..., V]`` with bfloat16 weights, float32 accumulation and output."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        if weight.dtype != torch.bfloat16:
            raise ValueError(f"Bf16Head takes bfloat16 weights, got {weight.dtype}")
        self.weight = torch.nn.Parameter(weight, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.bfloat16:
            raise ValueError(f"Bf16Head takes bfloat16 inputs, got {x.dtype}")
        y = torch.mm(x.reshape(-1, x.shape[-1]), self.weight.t(), out_dtype=torch.float32)
        return y.view(*x.shape[:-1], self.weight.shape[0])
