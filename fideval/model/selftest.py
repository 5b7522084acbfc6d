"""``fideval selftest``: the runner against transformers' own full forward on the user's real model, before a
long run.

Why: the parity tests (tests/test_model_families.py) prove each family on tiny random configs; a real model can
still hold what they do not (a config switch, a rope scaling, a layer type of a newer transformers, a checkpoint
layout). A few short sequences through both paths, seconds to minutes, say whether the hours of the teacher
stage will compute the model transformers computes. Both see the same batch (the runner's micro-batch is the
whole batch), so in float32 they run the same kernels on the same shapes and agree to rounding; bfloat16 adds
only the lm head, which the runner computes in float32 (bounded by 4 bf16 ulps of the largest logit, as the
parity tests bound it).

Tokens are random ids from the vocabulary (seeded): no tokenizer or corpus is needed, and every embedding row
and routing path is as likely as any other. The oracle needs the whole model in memory on the device: a model
that does not fit is refused in one line, never silently run elsewhere.
"""

from __future__ import annotations

import copy
import os
import time
from pathlib import Path

import numpy as np
import torch

from fideval.errors import FidevalError


class CannotCompare(FidevalError):
    """The model cannot be compared here (too large for the device's memory, an FP8 release): not a mismatch."""


BF16_ULPS = 4  # bfloat16: the bound is this many bf16 ulps (2**-8 relative) of the largest logit
FLOAT32_MAX_DELTA = 1e-4


def tolerance(dtype: torch.dtype, max_logit: float) -> float:
    """The default bound on max |delta logit|: 1e-4 in float32 (rounding of the same kernels over deep models;
    the tiny-model tests hold 1e-5), 4 bf16 ulps of the largest logit in bfloat16 (the lm head's rounding)."""
    if dtype == torch.float32:
        return FLOAT32_MAX_DELTA
    return BF16_ULPS * 2.0**-8 * max(1.0, max_logit)


def kld_rows(ref: torch.Tensor, got: torch.Tensor) -> torch.Tensor:
    """KL(softmax(ref) || softmax(got)) per row, in float64 over the full vocabulary (as the scorer computes it)."""
    lp = torch.log_softmax(ref.double(), dim=-1)
    lq = torch.log_softmax(got.double(), dim=-1)
    return (lp.exp() * (lp - lq)).sum(-1)


def _parameters(ckpt) -> int:
    """Elements of every tensor of the checkpoint (what the oracle holds at once)."""
    return sum(int(np.prod(info.shape)) for info in getattr(ckpt, "tensors", {}).values())


def _oracle(folder: Path, config, dtype: torch.dtype, device: torch.device, tokens: np.ndarray) -> torch.Tensor:
    """transformers' own ``from_pretrained`` and forward on ``device``, float32 logits [n, L, V]."""
    from transformers import AutoModelForCausalLM

    try:
        # no device_map (it needs accelerate): loaded on the host, then moved whole
        model = AutoModelForCausalLM.from_pretrained(str(folder), config=copy.deepcopy(config), dtype=dtype).to(device)
    except Exception as e:  # transformers raises many types for a folder it cannot load
        raise FidevalError(f"{folder}: transformers' from_pretrained cannot load the model ({type(e).__name__}: "
                           f"{str(e)[:160]})", hint="the reference forward is what selftest compares against") from None
    model.eval()
    with torch.no_grad():
        out = model(torch.from_numpy(tokens.astype(np.int64)).to(device)).logits.float().cpu()
    del model
    return out


def run_selftest(model_dir: str | Path, *, device: str = "auto", dtype: str = "float32", sequences: int = 3,
                 length: int = 64, seed: int = 0, max_delta: float | None = None) -> dict:
    """The runner and transformers' forward on ``sequences`` random sequences of ``length`` tokens.

    Returns ``arch``, ``dtype``, ``device``, ``sequences``, ``length``, ``max_abs_delta``, ``max_abs_logit``,
    ``mean_kld``, ``max_kld``, ``tolerance``, ``passed``, ``runner_s``, ``oracle_s``, ``transformers``. Raises a
    one-line :class:`CannotCompare` for a model it cannot compare (too large for the device, an FP8 release)."""
    import transformers

    from fideval.model.device import resolve_device, resolve_dtype
    from fideval.model.runner import Runner, RunnerOptions

    if sequences < 1 or length < 2:
        raise FidevalError(f"selftest needs at least 1 sequence of 2 tokens (got {sequences} x {length})")
    model_dir = Path(model_dir)
    tdtype, dev = resolve_dtype(dtype), resolve_device(device)
    runner = Runner(model_dir, RunnerOptions(device=dev, dtype=tdtype, micro_batch=sequences))
    if runner.adapter.release is not None:
        raise CannotCompare(f"{model_dir}: selftest cannot check an FP8 release: transformers' own FP8 loading "
                           "mis-reads partial scale blocks (docs/runner.md, FP8 releases)",
                           hint="run selftest on a bfloat16 copy of the weights, or trust tests/test_model_fp8_release.py")
    need = _parameters(runner.ckpt) * tdtype.itemsize
    if dev.type == "cpu":
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        if need > 0.8 * free:
            raise CannotCompare(f"{model_dir}: transformers' forward needs the whole model in memory (~{need / 2**30:.1f} "
                                f"GiB in {dtype}), {free / 2**30:.1f} GiB are available",
                                hint="run selftest where the model fits (a machine with more RAM or GPU memory)")
    if dev.type == "cuda":
        free = torch.cuda.mem_get_info(dev)[0]
        if need > 0.9 * free:
            raise CannotCompare(f"{model_dir}: transformers' forward needs the whole model on {dev} (~{need / 2**30:.1f} GiB "
                               f"in {dtype}), {free / 2**30:.1f} GiB are free",
                               hint="run selftest where the model fits (--device cpu with enough RAM, more GPU memory)")
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, runner.vocab_size, size=(sequences, length)).astype(np.int32)
    t0 = time.perf_counter()
    got = torch.stack([logits.cpu() for _, logits in runner.run(tokens, canary=False)])
    runner_s = time.perf_counter() - t0
    config = runner.adapter.config
    del runner
    t0 = time.perf_counter()
    ref = _oracle(model_dir, config, tdtype, dev, tokens)
    oracle_s = time.perf_counter() - t0
    if tuple(ref.shape) != tuple(got.shape):
        raise FidevalError(f"{model_dir}: transformers' logits have shape {list(ref.shape)}, the runner's {list(got.shape)}",
                           hint="the runner does not run this model as transformers does; report it")
    finite = bool(torch.isfinite(got).all() and torch.isfinite(ref).all())
    delta = float((got - ref).abs().max()) if finite else float("inf")
    max_logit = float(ref.abs().max()) if finite else float("inf")
    kld = kld_rows(ref.reshape(-1, ref.shape[-1]), got.reshape(-1, got.shape[-1])) if finite else torch.tensor([float("inf")])
    tol = max_delta if max_delta is not None else tolerance(tdtype, max_logit)
    return {"model": str(model_dir), "arch": config.architectures[0] if getattr(config, "architectures", None) else None,
            "dtype": dtype, "device": dev.type, "sequences": sequences, "length": length, "seed": seed,
            "max_abs_delta": delta, "max_abs_logit": max_logit, "mean_kld": float(kld.mean()), "max_kld": float(kld.max()),
            "tolerance": tol, "passed": finite and delta <= tol, "runner_s": runner_s, "oracle_s": oracle_s,
            "transformers": transformers.__version__}
