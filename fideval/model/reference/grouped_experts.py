"""The vendor's MoE with its routed experts grouped: one GEMM per projection over every local expert's tokens.

The vendor's ``MoE.forward`` (DeepSeek-V3, V3.2-Exp, V4.1-Flash) loops over its experts in Python: per expert a
``torch.where`` over the routes, three small GEMMs through its ``linear`` (each with its own activation
quantization in the FP8/FP4 paths) and an indexed add. On a GPU that is 3 x 256 kernel launches of a few rows
each per layer. ``model.reference_experts: grouped`` replaces only that loop; what is the vendor's stays
the vendor's:

* routing: the vendor's ``Gate`` is called as a module (``moe.gate(x)``), so forward hooks on it (route recording,
  forcing) fire and what they return is what the experts take; the shared expert is called as a module; the
  all-reduce and the order of the final adds are the vendor's, per family;
* weights: each local expert's ``w1``/``w3``/``w2`` as the vendor's ``linear`` multiplies them, stacked once per
  loaded layer ([experts, out, in]): a float weight as loaded (its ``F.linear`` path), V3's FP8 weight with
  ``gemm_impl: bf16`` through the vendor's own ``weight_dequant``; an FP8/FP4 weight its GEMM consumes
  (V3 ``gemm_impl: fp8``, V3.2, V4.1) with power-of-two block scales dequantized in float32 (UE8M0 128x128;
  V4.1's 32x32 E8M0 FP8 blocks and its FP4 e2m1 experts with per-32 E8M0 scales,
  :func:`~.deepseek_v41_weights.dequantize`);
* activations: where the vendor's GEMM quantizes its input, the vendor's own ``act_quant`` (row-wise blocks: the
  same rows quantize alike in any batch) and the dequantized values enter the GEMM; the SwiGLU is each family's
  (V3.2's float32 product, V4.1's clamp at ``swiglu_limit`` and routing weight before ``w2``);
* the sum: each token's expert outputs are added in ascending expert order in the vendor's accumulator dtype
  (V3: the run dtype; V3.2, V4.1: float32), as its loop adds them; only this rank's experts [lo, hi).

Tokens are sorted by expert (stable: within an expert, in token order, the rows ``torch.where`` gives the
vendor). Each projection is one ``torch._grouped_mm`` where torch has it for the device and dtype (CUDA bf16;
CPU float32 and bf16), else one ``F.linear`` per expert on its slice of the sorted rows (exact: the vendor's own
call on the same rows). The GEMM dtype: the weight's own for a float weight (the vendor's F.linear); for an
FP8/FP4 weight float32 (the CPU kernels' arithmetic), bfloat16 on CUDA (power-of-two scales make both dequantized
operands exact in it), the result rounded to the default dtype as the vendor's GEMM writes it: the products are
the vendor's, its float32 sums may run in another order. Where a weight's or an activation's block scales are
not powers of two (V3's float32 scales with ``gemm_impl: fp8``) the vendor scales each block's partial sum, which
no GEMM on dequantized operands reproduces: each expert's slice of the sorted rows goes through the vendor's own
``linear`` instead (docs/runner.md, 'Grouped experts').

A layer whose experts cannot be grouped runs the vendor's loop instead, recorded in the driver's kernels: its
local experts' projections stored unalike (a quant spec re-encoding some experts exactly, others not), or
hooks the grouped path cannot honour (forward hooks on an Expert or its linears; pre-hooks on Expert modules).
Input pre-hooks on the experts' linears (a quant spec's act_transform) are applied to the sorted rows, the
first local expert's hooks for all of them: the row-wise transforms the transformers runner assumes too.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fideval.errors import FidevalError

EXPERTS = ("vendor", "grouped")
HINT = "model.reference_experts: vendor (the vendor's per-expert loop) or grouped (one GEMM per projection)"
FP8, FP4 = torch.float8_e4m3fn, torch.float4_e2m1fn_x2
VENDOR_LOOP = "vendor MoE.forward (a Python loop over experts)"
_PLAN = "_fideval_grouped_plan"


def check(value: str) -> str:
    """``value`` if it names an experts path, else a one-line error."""
    if value not in EXPERTS:
        raise FidevalError(f"reference experts {value!r} is neither vendor nor grouped", hint=HINT)
    return value


# -- how the vendor's linear computes one expert projection, per family -------------------------------------
def _v3_operand(m, lin):
    from fideval.quant.fp8 import dequant_blocks

    w = lin.weight
    if w.element_size() > 1:
        return "F.linear", lambda dt: w, None
    if m.gemm_impl == "bf16":
        return "weight_dequant + F.linear", lambda dt: m.weight_dequant(w, w.scale), None
    b, fmt = m.block_size, lin.scale_fmt
    return ("act_quant + fp8_gemm", lambda dt: dequant_blocks(w, w.scale, (b, b), dt),
            lambda x: m.act_quant(x, b, fmt))


def _v32_operand(m, lin):
    from fideval.quant.fp8 import dequant_blocks

    w = lin.weight
    if w.dtype != FP8:
        return "F.linear", lambda dt: w, None
    b, fmt = m.block_size, lin.scale_fmt
    return ("act_quant + fp8_gemm", lambda dt: dequant_blocks(w, w.scale, (128, 128), dt),
            lambda x: m.act_quant(x, b, fmt))


def _v41_operand(m, lin):
    from fideval.model.reference.deepseek_v41_weights import dequantize

    w = lin.weight
    if w.dtype not in (FP8, FP4):
        return "F.linear", lambda dt: w, None
    name = "act_quant + " + ("fp4_gemm" if w.dtype == FP4 else "fp8_gemm")
    return name, lambda dt: dequantize(w, w.scale).to(dt), lambda x: m.act_quant(x, m.fp8_block_size, m.scale_fmt, m.scale_dtype)


# -- the SwiGLU between the projections, per family (routing weight before w2: V4.1) -------------------------
def _v3_act(moe, g, u, w, dtype):
    return F.silu(g) * u


def _v32_act(moe, g, u, w, dtype):
    return (F.silu(g.float()) * u.float()).to(dtype)


def _v41_act(moe, g, u, w, dtype):
    lim = moe.experts[moe.experts_start_idx].swiglu_limit
    gate, up = g.float(), u.float()
    if lim > 0:
        up = torch.clamp(up, min=-lim, max=lim)
        gate = torch.clamp(gate, max=lim)
    return (w[:, None] * (F.silu(gate) * up)).to(dtype)


def _v3_linear(m, x, lin):
    return m.linear(x, lin.weight, None, lin.scale_fmt)


def _v41_linear(m, x, lin):
    return m.linear(x, lin.weight)


@dataclass(frozen=True)
class Family:
    operand: Callable
    act: Callable
    linear: Callable  # the vendor's own linear(x, weight, ...) as its Linear.forward calls it
    post_weight: bool  # the routing weight multiplies w2's output (V3, V3.2), not its input (V4.1)
    float_acc: bool  # the routed sum is float32 (V3.2, V4.1), not the run dtype (V3)


FAMILIES = {"deepseek-v3": Family(_v3_operand, _v3_act, _v3_linear, True, False),
            "deepseek-v3.2": Family(_v32_operand, _v32_act, _v3_linear, True, True),
            "deepseek-v4.1": Family(_v41_operand, _v41_act, _v41_linear, False, True)}


def _pow2(s: torch.Tensor) -> bool:
    """Whether every scale is a power of two (E8M0 / UE8M0): then a dequantized FP8/FP4 value is exact in bf16."""
    f = s.float()
    return s.dtype == torch.float8_e8m0fnu or bool(torch.equal(f, torch.exp2(torch.round(torch.log2(f)))))


class _Unalike(Exception):
    """The local experts' projections are not stored alike: the layer runs the vendor's loop."""


class _Proj:
    """One projection (``w1``, ``w3`` or ``w2``) of every local expert, as one grouped GEMM."""

    def __init__(self, fam: Family, m, lins: list, device: torch.device):
        ops = [fam.operand(m, lin) for lin in lins]
        if len({name for name, _, _ in ops}) != 1:
            raise _Unalike
        self.kind, self.quant, self.lin, self.lins = ops[0][0], ops[0][2], lins[0], lins
        self.vendor = lambda x, lin: fam.linear(m, x, lin)
        self.weight = None
        if self.quant is not None and not all(_pow2(lin.weight.scale) for lin in lins):
            return  # float32 block scales: the vendor's own GEMM per expert (below), nothing stacked
        first = ops[0][1](torch.float32)
        if self.quant is not None and device.type == "cuda":
            # E8M0 / UE8M0 scales: a dequantized weight is exact in bf16, so the stack is built in bf16 an expert at a
            # time (a float32 stack first would be twice its bytes at once: 15 GB a projection at DeepSeek-V3 sizes)
            w = torch.empty((len(ops), *first.shape), dtype=torch.bfloat16, device=first.device)
            for i, (_, make, _) in enumerate(ops):
                v = first if i == 0 else make(torch.float32)
                w[i] = v
                if not torch.equal(w[i].float(), v):  # not exact after all: the float32 stack below
                    del w
                    break
            else:
                self.weight = w
                return
        dtype = first.dtype if self.quant is None else torch.float32
        w = torch.empty((len(ops), *first.shape), dtype=dtype, device=first.device)
        for i, (_, make, _) in enumerate(ops):
            w[i] = first if i == 0 else make(dtype)
        self.weight = w
        if self.kind == "weight_dequant + F.linear":
            # V3 with gemm_impl bf16: the vendor's linear dequantizes the FP8 weight on every call and then takes
            # F.linear, which is what it takes for a weight already of the run's dtype: each expert's weight becomes
            # its slice of the stack (the same values), and the FP8 copy goes (a DeepSeek-V3 layer: 11.3 GB)
            for i, lin in enumerate(lins):
                lin.weight = torch.nn.Parameter(w[i], requires_grad=False)

    def __call__(self, x: torch.Tensor, counts: list[int], offs: torch.Tensor, used: set) -> torch.Tensor:
        for hook in self.lin._forward_pre_hooks.values():
            r = hook(self.lin, (x,))
            if r is not None:
                x = r[0] if isinstance(r, tuple) else r
        if self.quant is None:
            return _gemm(x, self.weight, counts, offs, used)
        q, s = (None, None) if self.weight is None else self.quant(x.contiguous())
        if s is None or not _pow2(s):
            # scales that are not powers of two: the vendor scales each block's partial sum, which a GEMM on
            # dequantized operands would not reproduce; its own linear per expert on the sorted rows does
            used.add(f"the vendor's {self.kind} per expert on the sorted rows (scales not powers of two)")
            out = x.new_empty(x.shape[0], self.lin.out_features, dtype=torch.get_default_dtype())
            lo = 0
            for lin, c in zip(self.lins, counts):
                if c:
                    out[lo:lo + c] = self.vendor(x[lo:lo + c].contiguous(), lin)
                    lo += c
            return out
        w = self.weight  # float32, or bf16 on CUDA: power-of-two scales make both operands exact in either
        a = (q.to(w.dtype).unflatten(-1, (s.shape[-1], -1)) * s.float().to(w.dtype).unsqueeze(-1)).flatten(-2)
        return _gemm(a, w, counts, offs, used).to(torch.get_default_dtype())


def _native(x: torch.Tensor, w: torch.Tensor) -> bool:
    if not hasattr(torch, "_grouped_mm") or x.dtype != w.dtype:
        return False
    if x.device.type == "cuda":
        return x.dtype == torch.bfloat16 and torch.cuda.get_device_capability(x.device) >= (8, 0)
    return x.device.type == "cpu" and x.dtype in (torch.float32, torch.bfloat16)


def _gemm(x: torch.Tensor, w: torch.Tensor, counts: list[int], offs: torch.Tensor, used: set) -> torch.Tensor:
    """``x`` [rows, in] sorted by expert (``counts`` rows each) times each expert's ``w`` [experts, out, in]^T."""
    if _native(x, w):
        used.add(f"torch._grouped_mm ({str(x.dtype).removeprefix('torch.')})")
        return torch._grouped_mm(x.contiguous(), w.transpose(-2, -1), offs=offs)
    used.add(f"F.linear per expert on the sorted rows ({str(x.dtype).removeprefix('torch.')})")
    out = x.new_empty(x.shape[0], w.shape[1])
    lo = 0
    for i, c in enumerate(counts):
        if c:
            out[lo:lo + c] = F.linear(x[lo:lo + c], w[i])
            lo += c
    return out


class Plan:
    """A loaded MoE's stacked expert weights (built as the layer loads, kept while the layer is)."""

    def __init__(self, fam: Family, m, moe, device: torch.device):
        experts = [moe.experts[i] for i in range(moe.experts_start_idx, moe.experts_end_idx)]
        self.w1, self.w3, self.w2 = (_Proj(fam, m, [getattr(e, n) for e in experts], device) for n in ("w1", "w3", "w2"))
        self.experts = experts


def _hooked(moe) -> bool:
    """Hooks the grouped path would not call: on a local Expert, or forward (post) hooks on its linears, global
    module hooks (but the llamacpp path's tracking, fideval.quant.ggml_path._track); or input pre-hooks that differ
    in number between experts (one expert's serve every row)."""
    experts = [moe.experts[i] for i in range(moe.experts_start_idx, moe.experts_end_idx)]
    for e in experts:
        if e._forward_pre_hooks or e._forward_hooks or e._forward_pre_hooks_with_kwargs:
            return True
        for n in ("w1", "w3", "w2"):
            lin, first = getattr(e, n), getattr(experts[0], n)
            if lin._forward_hooks or lin._forward_pre_hooks_with_kwargs or \
                    len(lin._forward_pre_hooks) != len(first._forward_pre_hooks):
                return True
    mod = torch.nn.modules.module
    return any(not getattr(h, "fideval_tracking", False)  # the llamacpp path's module tracking: a no-op here
               for h in (*mod._global_forward_hooks.values(), *mod._global_forward_pre_hooks.values()))


class Grouped:
    """The grouped routed-experts path of one driver: ``family`` (a :data:`FAMILIES` key), the vendor module ``m``
    (its globals: ``world_size``, ``act_quant``, ...), ``kernels``: the driver's record, where this writes what ran."""

    def __init__(self, family: str, m, kernels: dict):
        self.fam, self.m, self.kernels, self.used = FAMILIES[family], m, kernels, set()
        self.family = family
        kernels["routed_experts"] = "grouped (fideval.model.reference.grouped_experts; what ran, once it has)"

    def install(self, block: torch.nn.Module) -> torch.nn.Module:
        """The grouped forward on ``block``'s MoE (a dense block is left alone), its stacked weights built now: on the
        runner's prefetch thread (and, on a GPU, its load stream) while the previous layer computes, not on the first
        call. Their bytes are within what sizing keeps for two loaded layers (fideval.model.sizing counts a unit in
        the compute dtype, twice, and one stack: a stored FP8/FP4 layer is at most half its bf16 size). Returns
        ``block``."""
        moe = getattr(block, "ffn", None)
        if moe is None or not isinstance(moe, self.m.MoE):
            return block
        ref, fwd = weakref.ref(moe), _FORWARDS[self.family]
        moe.forward = lambda *a, **kw: fwd(self, ref(), *a, **kw)  # a weak reference: no cycle keeps the layer alive
        first = moe.experts[moe.experts_start_idx]
        if first is not None and not _hooked(moe):
            self.plan(moe, first.w1.weight.device)
        return block

    def plan(self, moe, device: torch.device) -> Plan | None:
        """``moe``'s stacked weights (built when the layer loads, :meth:`install`, or else on its first call); None:
        this call takes the vendor's loop."""
        plan = False if _hooked(moe) else getattr(moe, _PLAN, None)
        if plan is None:
            try:
                plan = Plan(self.fam, self.m, moe, device)
            except _Unalike:
                plan = False
            setattr(moe, _PLAN, plan)
        if not plan:
            self._record(VENDOR_LOOP + " where the grouped path cannot run the layer")
            return None
        return plan

    def routed(self, moe, plan: Plan, x: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        """This rank's routed sum, as the vendor's loop leaves its ``y``."""
        lo, hi, k = moe.experts_start_idx, moe.experts_end_idx, indices.size(-1)
        y = torch.zeros_like(x, dtype=torch.float32 if self.fam.float_acc else x.dtype)
        flat = indices.reshape(-1)
        pos = ((flat >= lo) & (flat < hi)).nonzero().squeeze(1)
        if pos.numel():
            ex, order = torch.sort(flat[pos], stable=True)  # by expert; within one, in token order
            pos = pos[order]
            tok = pos // k
            n = torch.bincount(ex - lo, minlength=hi - lo)
            counts, offs = n.tolist(), torch.cumsum(n, 0).to(torch.int32)
            w = weights.reshape(-1)[pos]
            xs = x[tok]
            used: set = set()
            h = self.fam.act(moe, plan.w1(xs, counts, offs, used), plan.w3(xs, counts, offs, used), w, x.dtype)
            del xs
            out = plan.w2(h, counts, offs, used)
            _accumulate(y, out, w if self.fam.post_weight else None, tok)
            self._record("grouped: " + ", ".join(sorted(used)) + f"; weights: {plan.w1.kind} / {plan.w2.kind}")
        return y

    def _record(self, what: str) -> None:
        self.used.add(what)
        self.kernels["routed_experts"] = "; ".join(sorted(self.used))


def _accumulate(y: torch.Tensor, out: torch.Tensor, w: torch.Tensor | None, tok: torch.Tensor) -> None:
    """``y[t] += out * w`` for every (token, expert) pair, each token's pairs added in ascending expert order (the
    vendor's loop order; ``out`` is sorted by expert): round j adds every token's j-th pair (unique rows)."""
    p = tok.numel()
    per_tok = torch.bincount(tok, minlength=y.size(0))
    by_tok = torch.sort(tok, stable=True)[1]
    j = torch.empty_like(tok)
    j[by_tok] = torch.arange(p, device=tok.device) - (torch.cumsum(per_tok, 0) - per_tok)[tok[by_tok]]
    rounds = torch.sort(j, stable=True)[1]
    lo = 0
    for c in torch.bincount(j).tolist():
        sel = rounds[lo:lo + c]
        lo += c
        y[tok[sel]] += out[sel] if w is None else out[sel] * w[sel, None]


# -- the vendor's MoE.forward per family, its loop replaced --------------------------------------------------
def _v3_forward(g: Grouped, moe, x: torch.Tensor) -> torch.Tensor:
    plan = g.plan(moe, x.device)
    if plan is None:
        return type(moe).forward(moe, x)
    shape = x.size()
    x = x.view(-1, moe.dim)
    weights, indices = moe.gate(x)
    y = g.routed(moe, plan, x, weights, indices)
    z = moe.shared_experts(x)
    if g.m.world_size > 1:
        torch.distributed.all_reduce(y)
    return (y + z).view(shape)


def _v32_forward(g: Grouped, moe, x: torch.Tensor) -> torch.Tensor:
    plan = g.plan(moe, x.device)
    if plan is None:
        return type(moe).forward(moe, x)
    shape = x.size()
    x = x.view(-1, moe.dim)
    weights, indices = moe.gate(x)
    y = g.routed(moe, plan, x, weights, indices)
    y += moe.shared_experts(x)
    if g.m.world_size > 1:
        torch.distributed.all_reduce(y)
    return y.type_as(x).view(shape)


def _v41_forward(g: Grouped, moe, x: torch.Tensor, image_mask: torch.Tensor | None = None) -> torch.Tensor:
    plan = g.plan(moe, x.device)
    if plan is None:
        return type(moe).forward(moe, x, image_mask)
    shape = x.size()
    x = x.view(-1, moe.dim)
    weights, indices = moe.gate(x, None if image_mask is None else image_mask.flatten())
    y = g.routed(moe, plan, x, weights, indices)
    if g.m.world_size > 1:
        torch.distributed.all_reduce(y)
    y += moe.shared_experts(x)
    return y.type_as(x).view(shape)


_FORWARDS = {"deepseek-v3": _v3_forward, "deepseek-v3.2": _v32_forward, "deepseek-v4.1": _v41_forward}


def vendor_loop(block: torch.nn.Module) -> torch.nn.Module:
    """``block`` with its MoE's own ``forward`` back (the vendor's loop); returns ``block``."""
    moe = getattr(block, "ffn", None)
    if moe is not None and "forward" in vars(moe):
        del moe.forward
    return block
