"""Where a DeepSeek-V3-sized routed-experts block spends its time on one GPU (bench/runner.py's MoE share).

One table: for a block of T tokens (hidden 7,168, 256 experts of 2,048, top-8, random uniform routing, bf16,
random weights), the time of each stage of transformers' ``grouped_mm_experts_forward`` -- sort + gather,
the up (gate+up) grouped GEMM, the gate, the down grouped GEMM, the weighting + un-permute + sum -- and of
the whole path, as TFLOP/s against the measured dense bf16 matmul rate of the same device (an 8,192^3
product in the same run) and the 989 TFLOP/s datasheet peak. Also: the same grouped GEMMs with the weights
stored [E, in, out] (no transpose on the fly), and a loop of one ``torch.mm`` per expert, to say which
implementation the runner should choose.

    python3 bench/moe_probe.py [--tokens 32768,65536,131072]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from cuda_timing import timed as cuda_timed  # bench/, beside this file

PEAK = 989e12


def timed(fn, reps: int = 5) -> float:
    return cuda_timed(fn, reps, warmups=1)  # one warm-up: a call is 50-200 ms of 100 GB of buffers


def gmm(x, w, offs):
    f = getattr(torch.nn.functional, "grouped_mm", None)
    return f(x, w, offs=offs) if f is not None else torch._grouped_mm(x, w, offs=offs)


def profile_module(a, dev, mm_rate: float) -> list[str]:
    """transformers' DeepseekV3MoE at full size (random bf16 weights, the router in float32 as the model keeps
    it), ``grouped_mm`` experts as fideval's adapter selects: whole-module time, FLOP rate, top kernels."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

    H, inter, E, K, T = a.hidden, a.inter, a.experts, a.topk, a.module_tokens
    cfg = DeepseekV3Config(hidden_size=H, moe_intermediate_size=inter, n_routed_experts=E, num_experts_per_tok=K,
                           n_group=8, topk_group=4, n_shared_experts=1, norm_topk_prob=True, routed_scaling_factor=2.5)
    cfg._experts_implementation = "grouped_mm"
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("meta"):
        mod = DeepseekV3MoE(cfg)
    torch.set_default_dtype(old)
    mod = mod.to_empty(device=dev).eval().requires_grad_(False)
    g = torch.Generator(device=dev).manual_seed(1)
    for name, p in mod.named_parameters():
        p.normal_(0, 0.02, generator=g)
    for name, b in mod.named_buffers():
        b.zero_()
    x = torch.randn(1, T, H, device=dev, dtype=torch.bfloat16, generator=g)
    with torch.no_grad():
        sec = timed(lambda: mod(x), 3)
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
            mod(x)
            torch.cuda.synchronize()
        want = mod(x)
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from fideval.model.execution import experts as fx

        hf_forward = mod.experts.forward
        mod.experts.forward = lambda h, i, w: fx.forward(mod.experts, h, i, w)
        got = mod(x)
        same = bool(torch.equal(got, want))
        sec_fx = timed(lambda: mod(x), 3)
        with profile(activities=[ProfilerActivity.CUDA], record_shapes=True) as prof_fx:
            mod(x)
            torch.cuda.synchronize()
        fusable = fx._fusable
        fx._fusable = lambda y, w: False  # the same path with the gather-weight, sum and cast as three torch ops
        same_unfused = bool(torch.equal(mod(x), want))
        sec_unfused = timed(lambda: mod(x), 3)
        fx._fusable = fusable
        det = getattr(torch.utils, "deterministic", None)
        sec_nofill = None
        if det is not None and torch.are_deterministic_algorithms_enabled():
            det.fill_uninitialized_memory = False  # what filling torch.empty with NaN costs in this block
            sec_nofill = timed(lambda: mod(x), 3)
            det.fill_uninitialized_memory = True
        # sustained: the runner calls the block back to back for tens of seconds; clocks may not hold
        sustained = []
        for _ in range(a.sustained):
            s0, s1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s0.record()
            mod(x)
            s1.record()
            s1.synchronize()
            sustained.append(s0.elapsed_time(s1))
        mod.experts.forward = hf_forward
        del want, got
    flops = 2 * T * 3 * H * inter * (K + 1) + 2 * T * H * E
    dtypes = sorted({str(p.dtype) for p in mod.parameters()})
    lines = ["", f"transformers DeepseekV3MoE, {T:,} tokens (router + {E} routed x top-{K} + 1 shared; params {dtypes}): "
             f"{sec * 1e3:.1f} ms, {flops / sec / 1e12:.0f} TFLOP/s = {100 * flops / sec / PEAK:.1f} % of 989 "
             f"({100 * flops / sec / mm_rate:.1f} % of the measured matmul)",
             f"same module with fideval.model.execution.experts for the routed experts: {sec_fx * 1e3:.1f} ms, "
             f"{flops / sec_fx / 1e12:.0f} TFLOP/s = {100 * flops / sec_fx / PEAK:.1f} % of 989; output bit-identical to "
             f"transformers' path: {same}",
             f"  gather-weight-sum fused (experts.gather_scale_sum) vs the same as three torch ops: {sec_fx * 1e3:.1f} "
             f"vs {sec_unfused * 1e3:.1f} ms (unfused bit-identical too: {same_unfused}); without filling "
             f"torch.empty (deterministic mode's fill_uninitialized_memory): "
             + (f"{sec_nofill * 1e3:.1f} ms" if sec_nofill else "n/a"),
             f"  sustained, {len(sustained)} blocks back to back (ms each): "
             + ", ".join(f"{v:.1f}" for v in sustained)]
    for title, pr in (("transformers' path", prof), ("with fideval.model.execution.experts", prof_fx)):
        ev = [e for e in pr.key_averages(group_by_input_shape=True) if e.self_device_time_total > 0]
        total = sum(e.self_device_time_total for e in ev) or 1.0
        lines += [f"{title}:", "| op or kernel (input shapes) | calls | CUDA ms (self) | share |", "|---|---:|---:|---:|"]
        for e in sorted(ev, key=lambda e: -e.self_device_time_total)[:22]:
            shapes = str(e.input_shapes)[:70] if e.input_shapes else ""
            lines.append(f"| {e.key[:70]} {shapes} | {e.count} | {e.self_device_time_total / 1e3:.2f} | "
                         f"{100 * e.self_device_time_total / total:.1f} % |")
    mod = x = None  # free the block before empty_cache (a del would unbind names the timed lambdas hold)
    torch.cuda.empty_cache()
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="32768,65536,131072")
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--inter", type=int, default=2048)
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--module-tokens", type=int, default=65536,
                    help="also time transformers' own DeepseekV3MoE (router + routed + shared experts) on this many "
                    "tokens and list its top CUDA kernels (0: skip)")
    ap.add_argument("--sustained", type=int, default=0,
                    help="time the module (fideval's experts) this many times back to back, one line of ms each")
    ap.add_argument("--nondeterministic", action="store_true",
                    help="skip fideval.model.execution.determinism.configure() (the runner always applies it)")
    a = ap.parse_args()
    if not a.nondeterministic:
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from fideval.model.execution import determinism

        determinism.configure()
    dev = torch.device("cuda")
    H, inter, E, K = a.hidden, a.inter, a.experts, a.topk
    g = torch.Generator(device=dev).manual_seed(0)
    x8 = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16, generator=g)
    t_mm = timed(lambda: x8 @ x8)
    mm_rate = 2 * 8192 ** 3 / t_mm
    x8 = None  # freed before the experts' weights are allocated
    w_up = torch.randn(E, 2 * inter, H, device=dev, dtype=torch.bfloat16, generator=g) * 0.02  # [E, out, in] as HF
    w_dn = torch.randn(E, H, inter, device=dev, dtype=torch.bfloat16, generator=g) * 0.02
    rows = []
    for T in [int(v) for v in a.tokens.split(",")]:
        h = torch.randn(T, H, device=dev, dtype=torch.bfloat16, generator=g)
        scores = torch.rand(T, E, device=dev, generator=g)
        topw, topi = scores.topk(K, dim=-1)
        topw = (topw / topw.sum(-1, keepdim=True)).to(torch.bfloat16)
        st = {}

        def route():
            ids, perm = torch.sort(topi.reshape(-1))
            xs = h[perm // K]
            cnt = torch.histc(ids.int(), bins=E, min=0, max=E - 1)
            offs = torch.cumsum(cnt, 0, dtype=torch.int32)
            return ids, perm, xs, offs

        def whole():
            ids, perm, xs, offs = route()
            u = gmm(xs, w_up.transpose(-2, -1), offs)
            gt, uu = u.chunk(2, dim=-1)
            act = torch.nn.functional.silu(gt) * uu
            d = gmm(act, w_dn.transpose(-2, -1), offs)
            wo = d * topw.reshape(-1)[perm].unsqueeze(-1)
            inv = torch.empty_like(perm)
            inv[perm] = torch.arange(perm.numel(), device=dev)
            return wo[inv].view(T, K, H).sum(dim=1)

        whole()
        st["whole (HF grouped_mm path)"] = timed(whole)
        torch.cuda.empty_cache()

        ids, perm, xs, offs = route()
        st["sort + gather"] = timed(route)
        up = gmm(xs, w_up.transpose(-2, -1), offs)
        st["up grouped_mm (HF layout)"] = timed(lambda: gmm(xs, w_up.transpose(-2, -1), offs))
        w_up_t = w_up.transpose(1, 2).contiguous()  # [E, in, out]
        st["up grouped_mm ([E,in,out])"] = timed(lambda: gmm(xs, w_up_t, offs))

        def gate():
            gt, u = up.chunk(2, dim=-1)
            return torch.nn.functional.silu(gt) * u

        act = gate()
        st["gate (silu * up)"] = timed(gate)
        dn = gmm(act, w_dn.transpose(-2, -1), offs)
        st["down grouped_mm (HF layout)"] = timed(lambda: gmm(act, w_dn.transpose(-2, -1), offs))
        w_dn_t = w_dn.transpose(1, 2).contiguous()
        st["down grouped_mm ([E,in,out])"] = timed(lambda: gmm(act, w_dn_t, offs))
        sw = topw.reshape(-1)[perm]

        def combine():
            wo = dn * sw.unsqueeze(-1)
            inv = torch.empty_like(perm)
            inv[perm] = torch.arange(perm.numel(), device=dev)
            return wo[inv].view(T, K, H).sum(dim=1)

        combine()
        st["weight + unpermute + sum"] = timed(combine)

        bounds = [0] + offs.tolist()

        def loop():
            out = torch.empty(T * K, H, device=dev, dtype=torch.bfloat16)
            for e in range(E):
                s, t = bounds[e], bounds[e + 1]
                if t > s:
                    u = xs[s:t] @ w_up_t[e]
                    gt, uu = u.chunk(2, dim=-1)
                    out[s:t] = (torch.nn.functional.silu(gt) * uu) @ w_dn_t[e]
            return out

        loop()
        st["per-expert torch.mm loop (GEMMs + gate only)"] = timed(loop, 3)
        gemm_flops = 2 * T * K * 3 * H * inter
        for name, sec in st.items():
            f = gemm_flops if ("whole" in name or "loop" in name) else (
                2 * T * K * 2 * inter * H if name.startswith("up") else 2 * T * K * inter * H if name.startswith("down") else 0)
            rows.append((T, name, sec, f))
        h = xs = up = act = dn = w_up_t = w_dn_t = None  # freed before the next size
        torch.cuda.empty_cache()
    w_up = w_dn = None
    torch.cuda.empty_cache()
    module_lines = profile_module(a, dev, mm_rate) if a.module_tokens else []
    print(f"MoE probe: {torch.cuda.get_device_name(dev)}, deterministic {not a.nondeterministic}, hidden {H}, "
          f"{E} experts x {inter}, top-{K}; dense bf16 "
          f"8192^3 matmul measured {mm_rate / 1e12:.0f} TFLOP/s (datasheet {PEAK / 1e12:.0f})")
    print("| tokens | stage | ms | TFLOP/s | % of measured matmul | % of 989 peak |")
    print("|---:|---|---:|---:|---:|---:|")
    for T, name, sec, f in rows:
        r = f / sec if f else 0
        cells = (f"{r / 1e12:.0f}", f"{100 * r / mm_rate:.1f} %", f"{100 * r / PEAK:.1f} %") if f else ("-", "-", "-")
        print(f"| {T:,} | {name} | {sec * 1e3:.2f} | {cells[0]} | {cells[1]} | {cells[2]} |")
    for line in module_lines:
        print(line)


if __name__ == "__main__":
    main()
