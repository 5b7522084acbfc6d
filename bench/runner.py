"""Bench: the layer-major runner on DeepSeek-V3-shaped layers vs transformers with ``device_map`` offload.

Run on the GPU machine: ``PYTHONPATH=. python3 bench/runner.py`` (``--small`` for a CPU smoke run).

What it does, in one run:
1. CUDA checks on the tiny test checkpoints (tests/model_fixtures.py): float32 parity with transformers'
   full forward on the same device, and the same run twice bit-identical (plus the canary).
2. Writes a random bf16 checkpoint with DeepSeek-V3's real layer sizes (hidden 7168, MLA 128 heads,
   256 routed experts of 2048 + 1 shared, top-8 in 8 groups, first layer dense 18432), a few layers,
   sharded one file per layer in the Hub's per-expert layout. The vocabulary is cut to 8192 so that the
   float32 lm head does not dominate (the layers are what the figures are about).
3. Our runner over ~1 M tokens per layer (sequences of 4096) with the settings the teacher would choose on
   this GPU (fideval.model.sizing; ``--settings fixed``: attention per micro-batch of 4, MoE over blocks of
   64 k tokens, as the earlier rows of bench/RESULTS.md): tokens/s, model FLOP utilisation (analytic FLOPs,
   fideval.model.flops, / wall / the GPU's bf16 dense peak, fideval.timing.accounting), MoE FLOP utilisation
   (routed + shared expert FLOPs / time inside the MoE modules: router, routed and shared experts; the decoder
   layer's norm and residual add are timed apart / peak), the share of weight-loading time hidden behind compute
   (1 - time the compute waited / time the loader worked), and the whole run's wall split into the runner's
   timeline parts (fideval.timing.timeline), which add up to it; ``other`` (what no part claims) must be <= 5 %.
4. The same checkpoint through ``AutoModelForCausalLM.from_pretrained(device_map=...)`` with every decoder
   layer offloaded to the CPU (accelerate moves each layer's weights per forward): tokens/s of one forward.
Prints one table: figure | measured | ceiling or goal.
"""

from __future__ import annotations

import argparse
import json
import math
import struct
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

BF16_PEAK = 989e12  # H100/H200 SXM dense bf16 tensor-core peak (no sparsity): when the GPU's name is not known

FULL = dict(hidden=7168, heads=128, q_lora=1536, kv_lora=512, rope=64, nope=128, v=128, experts=256, moe_inter=2048,
            topk=8, groups=8, topk_groups=4, dense_inter=18432, vocab=8192, layers=3, seq=4096, n_seq=256, micro=4,
            mlp_tokens=65536, base_seq=2)
SMALL = dict(hidden=256, heads=4, q_lora=64, kv_lora=32, rope=16, nope=32, v=32, experts=16, moe_inter=64,
             topk=4, groups=4, topk_groups=2, dense_inter=512, vocab=512, layers=3, seq=256, n_seq=16, micro=2,
             mlp_tokens=1024, base_seq=2)


def config(s: dict) -> dict:
    return {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": s["vocab"],
            "hidden_size": s["hidden"], "intermediate_size": s["dense_inter"], "moe_intermediate_size": s["moe_inter"],
            "num_hidden_layers": s["layers"], "num_attention_heads": s["heads"], "num_key_value_heads": s["heads"],
            "n_shared_experts": 1, "n_routed_experts": s["experts"], "num_experts_per_tok": s["topk"], "n_group": s["groups"],
            "topk_group": s["topk_groups"], "first_k_dense_replace": 1, "norm_topk_prob": True, "routed_scaling_factor": 2.5,
            "q_lora_rank": s["q_lora"], "kv_lora_rank": s["kv_lora"], "qk_rope_head_dim": s["rope"], "qk_nope_head_dim": s["nope"],
            "v_head_dim": s["v"], "max_position_embeddings": 16384, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
            "hidden_act": "silu", "torch_dtype": "bfloat16", "rope_theta": 10000.0}


def layer_tensors(s: dict, i: int) -> list[tuple[str, tuple[int, ...]]]:
    H, nh = s["hidden"], s["heads"]
    p = f"model.layers.{i}."
    t = [(p + "input_layernorm.weight", (H,)), (p + "post_attention_layernorm.weight", (H,)),
         (p + "self_attn.q_a_proj.weight", (s["q_lora"], H)), (p + "self_attn.q_a_layernorm.weight", (s["q_lora"],)),
         (p + "self_attn.q_b_proj.weight", (nh * (s["nope"] + s["rope"]), s["q_lora"])),
         (p + "self_attn.kv_a_proj_with_mqa.weight", (s["kv_lora"] + s["rope"], H)),
         (p + "self_attn.kv_a_layernorm.weight", (s["kv_lora"],)),
         (p + "self_attn.kv_b_proj.weight", (nh * (s["nope"] + s["v"]), s["kv_lora"])),
         (p + "self_attn.o_proj.weight", (H, nh * s["v"]))]
    if i == 0:
        inter = s["dense_inter"]
        return t + [(p + "mlp.gate_proj.weight", (inter, H)), (p + "mlp.up_proj.weight", (inter, H)),
                    (p + "mlp.down_proj.weight", (H, inter))]
    inter, E = s["moe_inter"], s["experts"]
    t += [(p + "mlp.gate.weight", (E, H)), (p + "mlp.gate.e_score_correction_bias", (E,)),
          (p + "mlp.shared_experts.gate_proj.weight", (inter, H)), (p + "mlp.shared_experts.up_proj.weight", (inter, H)),
          (p + "mlp.shared_experts.down_proj.weight", (H, inter))]
    for e in range(E):
        t += [(p + f"mlp.experts.{e}.gate_proj.weight", (inter, H)), (p + f"mlp.experts.{e}.up_proj.weight", (inter, H)),
              (p + f"mlp.experts.{e}.down_proj.weight", (H, inter))]
    return t


def write_shard(path: Path, items: list[tuple[str, tuple[int, ...]]], pool: dict, fp32: set[str]) -> int:
    """A safetensors file written by hand: random bf16 values (a few distinct blocks per shape, reused), fp32 router."""
    header, off = {}, 0
    for name, shape in items:
        dt = "F32" if name in fp32 else "BF16"
        n = math.prod(shape) * (4 if dt == "F32" else 2)
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for k, (name, shape) in enumerate(items):
            key = (shape, name in fp32, k % 4)
            if key not in pool:
                g = torch.Generator().manual_seed(len(pool))
                if len(shape) == 1:
                    x = 1.0 + 0.02 * torch.randn(shape, generator=g) if "norm" in name else 0.01 * torch.randn(shape, generator=g)
                else:
                    x = torch.randn(shape, generator=g) / math.sqrt(shape[-1])
                pool[key] = (x.float() if name in fp32 else x.to(torch.bfloat16)).contiguous().view(torch.uint8).numpy().tobytes()
            f.write(pool[key])
    return off


def write_checkpoint(folder: Path, s: dict) -> float:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config(s)))
    weight_map, pool, total = {}, {}, 0
    fp32 = set()
    shards = [("model-embed.safetensors", [("model.embed_tokens.weight", (s["vocab"], s["hidden"]))])]
    for i in range(s["layers"]):
        items = layer_tensors(s, i)
        fp32 |= {n for n, _ in items if n.endswith(("mlp.gate.weight", "e_score_correction_bias"))}
        shards.append((f"model-layer{i:02d}.safetensors", items))
    shards.append(("model-head.safetensors", [("model.norm.weight", (s["hidden"],)), ("lm_head.weight", (s["vocab"], s["hidden"]))]))
    for fname, items in shards:
        total += write_shard(folder / fname, items, pool, fp32)
        weight_map.update({n: fname for n, _ in items})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    return total / 1e9


def cuda_checks(device: str) -> dict:
    """Tiny checkpoints on the bench device: fp32 parity with transformers there, and run-twice identity."""
    import tempfile

    import model_fixtures as mf
    from transformers import AutoModelForCausalLM

    from fideval.model.execution.determinism import digest
    from fideval.model.runner import Runner, RunnerOptions

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in mf.configs():
            folder = mf.build(name, Path(tmp) / name)
            toks = mf.tokens(mf.COMMON["vocab_size"], n=3, length=32)
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(device).eval()
            with torch.no_grad():
                ref = model(torch.from_numpy(toks.astype(np.int64)).to(device)).logits.float()
            r1 = Runner(folder, RunnerOptions(device=device, micro_batch=2))
            a = {k: v for k, v in r1.run(toks)}
            b = {k: digest(v) for k, v in Runner(folder, RunnerOptions(device=device, micro_batch=2)).run(toks)}
            out[name] = {"max_abs_diff": max(float((a[k] - ref[k]).abs().max()) for k in a),
                         "twice_identical": all(digest(a[k]) == b[k] for k in a), "canary": bool(r1.canary["identical"])}
            del model
    return out


def settings(s: dict, device: str, how: str) -> dict:
    """RunnerOptions' run settings: the teacher's choice for this device (fideval.model.sizing), or the fixed ones."""
    from fideval.model import sizing

    if how == "fixed" or device != "cuda":
        return {"micro_batch": s["micro"], "mlp_tokens": s["mlp_tokens"], "host_budget_bytes": 64 << 30}
    st = sizing.choose(device, torch.bfloat16, config(s), s["seq"], n_sequences=s["n_seq"])
    return st.runner_options()


def run_ours(folder: Path, s: dict, device: str, how: str = "auto") -> dict:
    from fideval.model.runner import Runner, RunnerOptions

    rng = np.random.default_rng(0)
    toks = rng.integers(0, s["vocab"], size=(s["n_seq"], s["seq"])).astype(np.int32)
    chosen = settings(s, device, how)
    r = Runner(folder, RunnerOptions(device=device, dtype=torch.bfloat16, profile=True, lean_experts=not s.get("hf_experts", False),
                                     **chosen))
    loads: list = []  # tokens per routed expert in each MoE block: how balanced the grouped GEMMs are
    spans: list = []  # CUDA events around the routed experts alone (the rest of a MoE block: router, shared expert)
    if not s.get("hf_experts", False):
        from fideval.model.execution import experts as fx

        inner = fx.forward

        def counting(mod, h, i, w, runner=r):  # bound now: r is deleted once the run is over
            if runner.warming:  # the runner's one-off warm-up call on a few tokens: not a MoE block
                return inner(mod, h, i, w)
            loads.append(torch.bincount(i.reshape(-1), minlength=mod.num_experts))
            if h.device.type != "cuda":
                return inner(mod, h, i, w)
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            out = inner(mod, h, i, w)
            e1.record()
            spans.append((e0, e1))
            return out

        fx.forward = counting
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    check = 0.0
    for k, logits in r.run(toks):
        if k % 64 == 0:
            with r.timeline.part("check"):  # the bench's own finiteness probe (a synchronisation on a GPU)
                check += float(logits[-1, :8].sum())
    if device == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    st = r.finish_profile()
    st["wall"] = wall
    st["settings"] = {k: chosen[k] for k in ("micro_batch", "mlp_tokens", "host_budget_bytes")}
    st["tokens"] = s["n_seq"] * s["seq"]
    st["canary"] = r.canary
    st["peak_gpu_gb"] = torch.cuda.max_memory_allocated() / 1e9 if device == "cuda" else 0.0
    st["ledger_peak_gb"], st["ledger_largest_gb"] = r.ledger.peak / 1e9, r.ledger.largest / 1e9
    st["finite"] = math.isfinite(check)
    if loads:
        c = torch.stack(loads).float()
        st["expert_load"] = {"blocks": len(loads), "max_over_mean": float((c.max(1).values / c.mean(1)).mean()),
                             "empty_experts": float((c == 0).float().mean())}
    if spans:
        st["routed_experts_s"] = sum(a.elapsed_time(b) for a, b in spans) / 1e3
    del r
    return st


def probe_attention() -> None:
    """Which sdpa backends take MLA's shapes (q/k head dim 192, v 128) in bf16, and how fast (diagnostic line)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(4, 128, 4096, 192, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(4, 128, 4096, 128, device="cuda", dtype=torch.bfloat16)
    out = {}
    for b in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH):
        try:
            with sdpa_kernel([b]):
                torch.nn.functional.scaled_dot_product_attention(q, q, v, is_causal=True)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                torch.nn.functional.scaled_dot_product_attention(q, q, v, is_causal=True)
                torch.cuda.synchronize()
            out[b.name] = f"{(time.perf_counter() - t0) * 1e3:.1f} ms"
        except RuntimeError as e:
            out[b.name] = f"unavailable ({str(e)[:60]})"
    print("sdpa probe (4x4096 tokens, 128 heads):", json.dumps(out), flush=True)
    del q, v
    torch.cuda.empty_cache()


def run_baseline(folder: Path, s: dict) -> dict:
    from transformers import AutoModelForCausalLM

    dm = {"model.embed_tokens": 0, "model.norm": 0, "model.rotary_emb": 0, "lm_head": 0}
    n_layers = json.loads((folder / "config.json").read_text())["num_hidden_layers"]
    dm.update({f"model.layers.{i}": "cpu" for i in range(n_layers)})
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16, device_map=dm).eval()
    load = time.perf_counter() - t0
    rng = np.random.default_rng(1)
    ids = torch.from_numpy(rng.integers(0, s["vocab"], size=(s["base_seq"], s["seq"])).astype(np.int64)).to("cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.no_grad():
        model(ids, logits_to_keep=1)
    torch.cuda.synchronize()
    fwd = time.perf_counter() - t0
    return {"load_s": load, "forward_s": fwd, "tokens": ids.numel(), "impl": model.config._experts_implementation}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true", help="CPU-sized smoke run")
    ap.add_argument("--dir", default="/tmp/fideval-bench-ckpt")
    ap.add_argument("--skip-checks", action="store_true")
    ap.add_argument("--skip-baseline", action="store_true")
    ap.add_argument("--baseline-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ours-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--budget-s", type=float, default=560, help="wall-clock budget; the baseline gets what is left")
    ap.add_argument("--hf-experts", action="store_true",
                    help="routed experts through transformers' own grouped_mm forward instead of fideval.model.execution.experts")
    ap.add_argument("--settings", choices=("auto", "fixed"), default="auto",
                    help="auto: what fideval teacher would choose on this GPU (fideval.model.sizing); fixed: micro-batch 4, "
                         "MoE blocks of 65,536, chunk 64 GiB (the earlier RESULTS rows)")
    a = ap.parse_args()
    if a.baseline_only:
        print(json.dumps(run_baseline(Path(a.dir), FULL)))
        return
    if a.ours_only:
        n_layers = json.loads((Path(a.dir) / "config.json").read_text())["num_hidden_layers"]
        print(json.dumps(run_ours(Path(a.dir), {**FULL, "layers": n_layers, "hf_experts": a.hf_experts}, "cuda", a.settings),
                         default=str))
        return
    s = SMALL if a.small else FULL
    device = "cuda" if torch.cuda.is_available() and not a.small else "cpu"
    rows = []
    t_all = time.perf_counter()
    if not a.skip_checks:
        t0 = time.perf_counter()
        checks = cuda_checks(device)
        worst = max(c["max_abs_diff"] for c in checks.values())
        rows.append((f"fp32 parity vs transformers on {device} (7 archs)", f"max |Δlogit| {worst:.2e}", "<= 1e-5"))
        rows.append(("same run twice bit-identical / canary", f"{sum(c['twice_identical'] for c in checks.values())}/7, "
                     f"{sum(c['canary'] for c in checks.values())}/7", "7/7"))
        print(f"checks {time.perf_counter() - t0:.1f}s {json.dumps(checks)}", flush=True)
    import shutil

    Path(a.dir).parent.mkdir(parents=True, exist_ok=True)
    moe_bytes = 3 * s["experts"] * s["moe_inter"] * s["hidden"] * 2
    free = shutil.disk_usage(Path(a.dir).parent).free
    fit = int((free - 6e9) // moe_bytes)
    if fit < s["layers"] - 1:  # fewer MoE layers when the disk is small; said in the table
        if fit < 1:
            raise SystemExit(f"{free / 1e9:.0f} GB free on disk: not even one MoE layer ({moe_bytes / 1e9:.0f} GB) fits")
        s = {**s, "layers": 1 + fit}
    t0 = time.perf_counter()
    gb = write_checkpoint(Path(a.dir), s)
    print(f"wrote {gb:.1f} GB in {time.perf_counter() - t0:.1f}s", flush=True)
    if device == "cuda":  # its own process, so that all its GPU memory is gone before the baseline starts
        import subprocess

        probe_attention()
        res = subprocess.run([sys.executable, __file__, "--ours-only", "--dir", a.dir, "--settings", a.settings]
                             + (["--hf-experts"] if a.hf_experts else []), capture_output=True, text=True)
        if res.returncode != 0:
            raise SystemExit(f"our run failed: {res.stderr[-3000:]}")
        st = json.loads(res.stdout.strip().splitlines()[-1])
    else:
        st = run_ours(Path(a.dir), s, device, a.settings)
    attn_each = st.pop("attn_s_each", [])  # one per micro-batch and layer: summarised, not printed whole
    print(json.dumps({k: v for k, v in st.items() if k != "canary"}, default=str), flush=True)
    from fideval.model.flops import flops_per_token
    from fideval.timing import accounting

    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    peak = (accounting.peak_tflops(name, "bfloat16") or BF16_PEAK / 1e12) * 1e12
    f = flops_per_token(config(s), s["seq"])  # per token, summed over the layers
    T, n_moe = st["tokens"], s["layers"] - 1
    total_flops = T * f["total"]
    tps = T / st["wall"]
    moe_util = T * f["moe"] / max(st.get("moe_s", 0.0), 1e-9) / peak
    # the decoder layer's norm + residual around its MLP are timed apart (norm_s, dense layer included): earlier
    # runs counted them inside the MoE blocks; the dense layer's share is taken out by its token fraction
    norm_moe = st.get("norm_s", 0.0) * n_moe / s["layers"]
    moe_util_norm = T * f["moe"] / max(st.get("moe_s", 0.0) + norm_moe, 1e-9) / peak
    prof = accounting.summary(st["wall"], st.get("parts", {}), device=name, tokens=T, model_flops=total_flops,
                              peak=peak / 1e12 if device == "cuda" else None)
    hidden = 1 - st["wait_s"] / max(st["load_s"], 1e-9)
    first = st["unit_load_s"][0] + st["unit_load_s"][1]  # embedding + layer 0: nothing runs before them
    steady = 1 - (st["wait_s"] - st["unit_wait_s"][0] - st["unit_wait_s"][1]) / max(st["load_s"] - first, 1e-9)
    rows += [
        ("checkpoint", f"{gb:.1f} GB bf16, {s['layers']} layers (1 dense + {n_moe} MoE), {s['experts']} experts x {s['moe_inter']}, "
                       f"hidden {s['hidden']}", "DeepSeek-V3 layer sizes"),
        ("ours: tokens/s (bf16, whole run incl. loads)", f"{tps:,.0f}", f"{T:,} tokens/layer"),
        ("ours: settings (micro-batch / MLP tokens / chunk)", f"{st['settings']['micro_batch']} / {st['settings']['mlp_tokens']} / "
         f"{(st['settings']['host_budget_bytes'] or 4 << 30) / 2**30:.1f} GiB",
         f"--settings {a.settings if device == 'cuda' else 'fixed (CPU)'}"),
        ("ours: model FLOP utilisation", f"{total_flops / st['wall'] / peak:.1%}", f"of {peak / 1e12:g} TFLOP/s bf16"),
        ("ours: whole-run accounting (parts of the wall, fideval.timing.timeline)",
         ", ".join(f"{k} {v:.2f} s" for k, v in prof["parts"].items()), f"sum = wall {st['wall']:.2f} s"),
        ("ours: what no part claims (other)", f"{prof['other_fraction']:.1%} of the wall", "<= 5 %"),
        ("ours: MoE FLOP utilisation (inside MoE blocks)", f"{moe_util:.1%} (routed experts: "
         f"{'transformers grouped_mm' if a.hf_experts else 'fideval.model.execution.experts'}; {moe_util_norm:.1%} with the "
         f"layers' post-attention norms and residual adds counted as MoE time too)", f">= 40 % of {peak / 1e12:g} TFLOP/s"),
        ("ours: attention time / MoE time / dense MLP time",
         f"{st.get('attn_s', 0):.1f} / {st.get('moe_s', 0):.1f} / {st.get('mlp_s', 0):.1f} s", ""),
        ("ours: routed experts alone (part of MoE time) / norms + residual adds (outside it)",
         f"{st.get('routed_experts_s', 0):.2f} / {st.get('norm_s', 0):.2f} s", ""),
        ("ours: MoE block ms, first / median / max (full blocks of the same size)", _spread(st.get("moe_s_each", [])), ""),
        ("ours: attention ms per micro-batch, first / median / max", _spread(attn_each), ""),
        ("ours: warm-up (Triton compile before the first layer, each MLP kind once on 64 tokens; in the wall time)",
         f"{st.get('warmup_s', 0.0):.2f} s", ""),
        ("ours: weight-load time hidden behind compute", f"{hidden:.1%} (load {st['load_s']:.1f} s, waited {st['wait_s']:.1f} s)",
         ">= 90 %"),
        ("ours: hidden share after the first layer", f"{steady:.1%}", "(layer 0 can never overlap)"),
        ("ours: peak GPU memory / ledger peak weights", f"{st['peak_gpu_gb']:.1f} GB / {st['ledger_peak_gb']:.1f} GB "
                                                       f"(largest layer {st['ledger_largest_gb']:.1f} GB)", "<= 2.5 layers"),
        ("ours: canary identical", str(bool(st["canary"] and st["canary"]["identical"])), "True"),
    ]
    print_table(rows, f"bench/runner.py on {name} (ours done at {time.perf_counter() - t_all:.0f} s)")
    if device == "cuda" and not a.skip_baseline:
        import subprocess

        left = a.budget_s - (time.perf_counter() - t_all)
        try:  # its own process: its 45 GB of CPU weights and its hooks must not share our memory or our clock
            res = subprocess.run([sys.executable, __file__, "--baseline-only", "--dir", a.dir], capture_output=True,
                                 text=True, timeout=max(left, 10))
            b = json.loads(res.stdout.strip().splitlines()[-1]) if res.returncode == 0 else {"error": res.stderr[-300:]}
        except subprocess.TimeoutExpired:
            b = {"error": f"did not finish within the {left:.0f} s left of the bench budget"}
        except (ValueError, IndexError):
            b = {"error": "no result line"}
        if "error" in b:
            rows.append(("transformers device_map offload baseline", f"failed: {b['error']}".replace("\n", " "), "baseline"))
        else:
            btps = b["tokens"] / b["forward_s"]
            rows += [("transformers device_map CPU offload: tokens/s", f"{btps:,.0f} ({b['tokens']:,} tokens in one forward; "
                      f"load {b['load_s']:.0f} s; experts {b['impl']})", "baseline"),
                     ("speed-up over the offload baseline", f"{tps / btps:.1f}x", ">= 10x")]
    print_table(rows, f"bench/runner.py on {name} ({time.perf_counter() - t_all:.0f} s)")


def _spread(ms: list) -> str:
    if not ms:
        return "n/a (CPU)"
    full = [v for v in ms if v >= 0.5 * float(np.median(ms))]  # a layer's last, partial blocks are smaller
    return f"{ms[0]:.1f} / {float(np.median(full)):.1f} / {max(full[1:] or full):.1f}"


def print_table(rows, title):
    print(f"\n{title}")
    w = max(len(r[0]) for r in rows)
    print(f"| {'figure'.ljust(w)} | measured | ceiling / goal |\n|{'-' * (w + 2)}|---|---|")
    for r in rows:
        print(f"| {r[0].ljust(w)} | {r[1]} | {r[2]} |", flush=True)


if __name__ == "__main__":
    main()
