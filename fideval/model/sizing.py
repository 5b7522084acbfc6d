"""The run settings the verbs choose: attention micro-batch, MLP token block and chunk, sized from GPU memory.

Why here and not in the runner: three of them shape the bits (a micro-batch is one attention call's GEMM
shapes; with ``mlp_tokens`` the blocks' composition is the MoE GEMMs' shapes, and blocks never span chunks),
so they are chosen once, by the teacher, written into the store's ``teacher`` meta, and every candidate runs
with the numbers recorded there instead of choosing its own. On a CPU nothing is chosen: micro-batch 1,
whole layers per micro-batch, the runner's default chunk (the demo's and the tests' figures stay as they were).

On a GPU with ``F`` bytes free (``torch.cuda.mem_get_info``), ``b`` bytes per element of the compute dtype,
sequence length ``L``, hidden size ``H`` (docs/runner.md, "Run settings and accounting", has a worked example):

* weights ``W = 2 x`` the largest unit (a decoder layer as this rank holds it, the embedding, or the float32
  lm head): the current unit and the one being prefetched; with the vendor's code and ``model.reference_experts:
  grouped``, plus the grouped path's stacked copy of a MoE layer's local routed experts (``experts / world x 3 x H x
  I x b``, fideval.model.reference.grouped_experts: built as the layer loads, kept while it is loaded);
* reserve ``R = 2 GiB + 8 % of F`` (CUDA context growth, cuBLAS workspaces, allocator fragmentation);
* activations ``A = F - W - R``, shared by the chunk's hidden states and the largest phase of a layer;
* per token: attention ``b (2 (q + k + v) + v + 4 H)`` (q, k, v widths of all heads: projections and their
  rotated / transposed copies, the attention output, the residual stream), plus ``heads L (2 b + 4)`` when the
  scores are materialised (eager attention: gpt-oss; the vendor's reference code, whose scores are summed in the
  compute dtype, softmaxed in float32 and cast back, a rank's share of the heads under model parallel; sdpa is
  assumed to take a fused kernel -- cuDNN, flash or memory-efficient -- which holds no L x L scores); a MoE block
  ``b k (2 H + 3 I) + 3 b I_shared + 12 E + 6 b H`` (each of the top-k copies of the token: gathered input,
  gate/up and gated product, expert output; the shared experts; router logits, scores and choice in float32;
  the block's input, norm, output, residual and copies); a dense block ``b (3 I + 6 H)``; the head
  ``4 V + 4 H + b H`` (the float32 logits of a micro-batch -- 517 kB a token at vocab 129,280 -- and the
  float32 normed input);
* ``micro_batch`` = 16,384 tokens per attention call (``max(1, 16384 // L)``; the bench's 4 x 4,096), at most
  a quarter of the sequences (the canary recomputes one micro-batch), lowered until one call's attention or
  head activations take at most ``A / 4``;
* ``mlp_tokens`` = 65,536 (the bench's block, 46 % MoE FLOP utilisation on an H200) or what ``0.4 A`` holds,
  rounded down to whole micro-batches;
* ``chunk_bytes`` = what is left, ``A`` minus the largest phase, as hidden states (``H b`` a token) of whole
  blocks, at most 2^22 tokens: each chunk reads every layer's weights once, so the bigger the better, and the
  states stay on the GPU (``device_budget_bytes``, which moves no bits).

The fused pass (``models`` = K, fideval.model.lockstep) shares the chunk's state budget among its K models,
counts K float32 heads against ``W``, three micro-batches of logits at the head, and the next unit's stored copy
(FP8: a byte a weight) beside the two materialised units.

An explicit number (config or CLI) replaces its ``auto`` and the others are sized around it; ``None`` for
``mlp_tokens`` is "no throughput mode", for ``chunk_bytes`` the runner's default (4 GiB).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from fideval.errors import FidevalError
from fideval.model.flops import ModelConfig, dims, layer_params

AUTO = "auto"
ATTN_TOKENS = 16_384
MLP_TOKENS = 65_536
MAX_CHUNK_TOKENS = 1 << 22
RESERVE_BYTES = 2 << 30
RESERVE_FRACTION = 0.08
GiB = float(1 << 30)
RECORDED = ("micro_batch", "mlp_tokens", "chunk_bytes")  # the settings that shape the bits


@dataclass(frozen=True)
class Footprint:
    """Device bytes of a run: the largest weight unit, and per token of each phase."""

    unit_bytes: int
    state: int  # a token's hidden state between layers
    attention: float  # a token of an attention call
    scores: float  # ... and its materialised scores, when the math path runs
    mlp: float  # a token of an MLP block (the larger of MoE and dense layers)
    head: float  # a token at the lm head
    head_unit: int = 0  # the lm head's weights (float32) and final norm


@dataclass(frozen=True)
class Settings:
    """What a run computes with: ``micro_batch``, ``mlp_tokens`` and ``chunk_bytes`` shape the bits (recorded in
    the store); ``device_budget_bytes`` (hidden states kept on the GPU) does not. ``plan``: the sizing's figures."""

    micro_batch: int
    mlp_tokens: int | None
    chunk_bytes: int | None
    device_budget_bytes: int | None = None
    plan: dict[str, Any] = field(default_factory=dict, compare=False)

    def recorded(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in RECORDED}

    def runner_options(self) -> dict[str, Any]:
        """The RunnerOptions fields these settings set."""
        return {"micro_batch": self.micro_batch, "mlp_tokens": self.mlp_tokens, "host_budget_bytes": self.chunk_bytes,
                "device_budget_bytes": self.device_budget_bytes}


def parse(text: Any, name: str, *, off: bool = True) -> int | str | None:
    """A setting as the CLI or config gives it: a positive integer, ``auto``, or (when ``off``) ``off``/``none``/None."""
    if text is None or (isinstance(text, str) and text.lower() in ("off", "none", "null")):
        if off:
            return None
        raise FidevalError(f"{name}: must be a positive integer or auto")
    if isinstance(text, str) and text.lower() == AUTO:
        return AUTO
    try:
        n = int(text)
    except (TypeError, ValueError):
        raise FidevalError(f"{name} {text!r}: expected a positive integer, auto" + (" or off" if off else ""),
                           hint="e.g. 65536") from None
    if n < 1 or str(n) != str(text).strip():
        raise FidevalError(f"{name} {text!r}: expected a positive integer, auto" + (" or off" if off else ""))
    return n


def footprint(cfg: ModelConfig, dtype: torch.dtype, seq_len: int, world: int = 1, math_attention: bool = False,
              split_heads: bool = False) -> Footprint:
    """The documented per-token estimates (module docstring) for ``cfg`` (a transformers config or config dict);
    ``split_heads``: a rank computes 1/world of the attention heads (the vendor's code; fideval.model.execution.parallel
    replicates transformers' attention)."""
    d = dims(cfg)
    b = torch.empty((), dtype=dtype).element_size()
    H, V = d.hidden, d.vocab
    heads = d.q_dim // max(1, _head_dim(cfg, d))
    attention = b * (2 * (d.q_dim + d.k_dim + d.v_dim) + d.v_dim + 4 * H)
    rank_heads = -(-heads // world) if split_heads and world > 1 else heads
    scores = rank_heads * seq_len * (2 * b + 4) if math_attention else 0
    shared_i, dense_i = d.shared // (3 * H), d.dense // (3 * H)  # intermediate sizes
    moe = (b * d.top_k * (2 * H + 3 * d.moe_intermediate) + 3 * b * shared_i + 12 * d.experts + 6 * b * H
           if any(d.moe_layers) else 0)
    if world > 1 and moe:  # transformers' expert-parallel path: sentinel masks over [T k, H]
        moe += 2 * b * d.top_k * H
    dense = b * (3 * dense_i + 6 * H) if not all(d.moe_layers) else 0
    units = [p * b for p in layer_params(cfg, world)] + [V * H * b, V * H * 4 + H * b]
    head = 4 * V + 4 * H + b * H + (8 * V if world > 1 else 0)
    return Footprint(unit_bytes=max(units), state=H * b, attention=attention, scores=scores, mlp=max(moe, dense), head=head,
                     head_unit=units[-1])


def stacked_experts_bytes(cfg: ModelConfig, dtype: torch.dtype, world: int = 1) -> int:
    """The grouped experts' stacked weights of one MoE layer on one rank: its local routed experts' three projections
    in the compute dtype (an FP8/FP4 release's dequantized to bfloat16 on CUDA: no more bytes than that); 0 for a
    dense model."""
    d = dims(cfg)
    if not any(d.moe_layers):
        return 0
    b = torch.empty((), dtype=dtype).element_size()
    return -(-d.experts // max(1, world)) * 3 * d.hidden * d.moe_intermediate * b


def _head_dim(cfg: ModelConfig, d) -> int:
    get = cfg.get if isinstance(cfg, dict) else lambda k, v=None: getattr(cfg, k, v)
    if get("kv_lora_rank"):
        return int(get("qk_nope_head_dim")) + int(get("qk_rope_head_dim"))
    return int(get("head_dim") or d.hidden // int(get("num_attention_heads")))


def choose(device: torch.device | str, dtype: torch.dtype, cfg: ModelConfig, seq_len: int, *, n_sequences: int | None = None,
           world: int = 1, micro_batch: int | str = AUTO, mlp_tokens: int | str | None = AUTO,
           chunk_bytes: int | str | None = AUTO, free_bytes: int | None = None, math_attention: bool | None = None,
           split_heads: bool = False, models: int = 1, stored_bytes: int | None = None,
           grouped_experts: bool = False) -> Settings:
    """The settings for one run on ``device`` (module docstring); explicit values are kept as given. ``models``:
    the fused pass's teacher and candidates (fideval.model.lockstep), whose hidden states share the chunk's
    budget, whose heads are all resident at the end of a chunk, and at whose head a micro-batch's teacher and
    candidate logits are on the device together; ``stored_bytes``: bytes a weight as the checkpoint stores it (1 for
    an FP8 release; None: the compute dtype's), for the fused pass's stored copy of the next unit; ``grouped_experts``:
    the vendor's code with its routed experts grouped (:func:`stacked_experts_bytes` more a model)."""
    dev = torch.device(device)
    if dev.type != "cuda":  # CPU: today's defaults for whatever is auto
        return Settings(micro_batch=1 if micro_batch == AUTO else int(micro_batch),
                        mlp_tokens=None if mlp_tokens == AUTO else mlp_tokens,
                        chunk_bytes=None if chunk_bytes == AUTO else chunk_bytes)
    L = int(seq_len)
    if math_attention is None:
        impl = cfg.get("_attn_implementation") if isinstance(cfg, dict) else getattr(cfg, "_attn_implementation", None)
        math_attention = impl == "eager"
    fp = footprint(cfg, dtype, L, world, math_attention, split_heads)
    F = int(free_bytes if free_bytes is not None else torch.cuda.mem_get_info(dev)[0])
    models = max(1, int(models))
    W = max(2 * fp.unit_bytes, models * fp.head_unit)
    if models > 1:  # the next unit's stored copy on the device while it materialises (docs/runner.md, 'The fused pass')
        b = torch.empty((), dtype=dtype).element_size()
        W += fp.unit_bytes // b * (stored_bytes or b)
    if grouped_experts:
        W += models * stacked_experts_bytes(cfg, dtype, world)
    R = RESERVE_BYTES + RESERVE_FRACTION * F
    A = F - W - R
    one = L * (max(fp.attention + fp.scores, fp.mlp, fp.head) + fp.state)
    if A < one:
        raise FidevalError(f"{dev}: {F / GiB:.1f} GiB free holds neither two of the model's largest units ({2} x "
                           f"{fp.unit_bytes / GiB:.1f} GiB) and one sequence of {L} tokens ({one / GiB:.2f} GiB) beside "
                           f"the {R / GiB:.1f} GiB reserve", hint="use model parallel (torchrun), bfloat16, or a larger GPU")
    call = max(fp.attention + fp.scores, fp.head * (3 if models > 1 else 1))  # teacher, candidate, the last one's rows
    if micro_batch == AUTO:
        m = max(1, ATTN_TOKENS // L)
        if n_sequences:
            m = min(m, max(1, int(n_sequences) // 4))
        while m > 1 and m * L * call > A / 4:
            m -= 1
    else:
        m = int(micro_batch)
    mbt = m * L
    if mlp_tokens == AUTO:
        T = max(mbt, min(MLP_TOKENS, int(0.4 * A / max(fp.mlp, 1))) // mbt * mbt)
    else:
        T = mlp_tokens
    phase = max(mbt * call, (T or mbt) * fp.mlp)
    S = int(A - phase)  # for the chunk's hidden states
    if chunk_bytes == AUTO:
        block = max(1, (T or mbt) // L)
        seqs = max(block, min(MAX_CHUNK_TOKENS, max(S, 0) // models // fp.state) // L // block * block)
        chunk = seqs * L * fp.state
    else:
        chunk = chunk_bytes
    plan = {"free_bytes": F, "weights_bytes": W, "reserve_bytes": int(R), "activation_bytes": int(A),
            "phase_bytes": int(phase), "state_bytes": S, "math_attention": math_attention, "models": models,
            "per_token": {"attention": fp.attention, "scores": fp.scores, "mlp": fp.mlp, "head": fp.head, "state": fp.state}}
    return Settings(micro_batch=m, mlp_tokens=T, chunk_bytes=chunk, device_budget_bytes=max(S, 0) // models, plan=plan)


def adopt(requested: dict[str, Any], recorded: dict[str, Any] | None, where: str) -> dict[str, Any]:
    """``requested`` settings with a store's recorded ones filling every ``auto`` (a resumed run computes what the
    first computed); a requested number that differs from the recorded one is a one-line error."""
    if not recorded:
        return dict(requested)
    out = dict(requested)
    for k in RECORDED:
        ran = recorded.get(k)
        if requested.get(k, AUTO) == AUTO:
            out[k] = ran
        elif requested[k] != ran:
            raise FidevalError(f"{where} was written with {k} {ran!r}, this run asks for {requested[k]!r}",
                               hint=f"resume with the same {k} (or auto), or write a new store")
    return out
