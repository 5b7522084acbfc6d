"""Bench: the full-size rehearsal of an evaluation on one GPU, through the real verbs.

Run on the GPU machine: ``PYTHONPATH=. python3 bench/evaluation.py`` (``--small`` for a CPU smoke run). The verbs
need the CLI's own packages (typer, click, rich, shellingham, markdown-it-py, mdurl, pygments, annotated-doc,
pydantic, pydantic-core, annotated-types, typing-inspection, typing-extensions); a GPU image without them takes
them as wheels installed with ``pip install --no-index --no-deps --target DIR`` and ``DIR`` on ``PYTHONPATH``
(the verbs' subprocesses inherit it). polars, snakemake and datasets are not needed by ``teacher`` or ``score``.

What it does, in one run:
1. Writes a random checkpoint with DeepSeek-V3's real layer shapes in the real FP8 release layout: E4M3
   weights + float32 ``weight_scale_inv`` per 128x128 block, per-expert tensors, ``quantization_config``
   ``fp8`` / ``[128, 128]``; embeddings, norms, router and lm head in bf16; vocabulary 129,280; 1 dense +
   2 MoE layers (fewer MoE layers if the disk is small; said in the table).
2. **Verbs** (``python -m fideval teacher`` then ``python -m fideval score --config`` for an MXFP4-experts
   candidate on both paths) on the largest store that fits the disk (``--verb-seqs`` cuts of 2,048): wall
   time of each verb, its own profile from the store manifest / score.json, store bytes written and read.
3. **Compute at size**: the runner with the settings the verbs pick (``fideval.model.sizing``) over
   ~1 M tokens per layer at 2,048 and 8,192 tokens a sequence, teacher and candidate (serving path), the
   logits consumed on the GPU (a 542 GB store per length cannot be written on a 64 GB disk): tokens/s,
   whole-run model FLOP utilisation, the same without the parts a run pays once whatever its tokens (the
   canary's two SHA-256 digests of one sequence's logits on the host -- 12 s at 8,192 tokens -- the chunk's
   setup, the kernels' warm-up), the parts. Each run is its own process; a failed one leaves its whole
   stderr in ``<dir>/compute-<role>-<L>.err``.
4. The extrapolation to the seed's evaluation (printed with its formula): 61 layers (DeepSeek-V3) or the
   seed model's own config (DeepSeek-V4.1-Flash, ``../shared/reference-code/deepseek-v4.1-flash/config.json``),
   1,048,064 rows at 2,048 and 1,048,448 at 8,192, teacher + 2 candidate paths at each length; the once-a-run
   parts count once per pass, the rest per token scaled by FLOPs.
Prints one table: figure | measured | ceiling or goal.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PEAK = 989e12  # H100/H200 SXM dense bf16 tensor-core peak (no sparsity)
V3 = dict(hidden=7168, heads=128, q_lora=1536, kv_lora=512, rope=64, nope=128, v=128, experts=256, moe_inter=2048,
          topk=8, groups=8, topk_groups=4, dense_inter=18432, vocab=129280, layers=3, n_layers_real=61, dense_real=3)
SMALL = dict(hidden=256, heads=4, q_lora=64, kv_lora=32, rope=16, nope=32, v=32, experts=16, moe_inter=128,
             topk=4, groups=4, topk_groups=2, dense_inter=512, vocab=1024, layers=3, n_layers_real=61, dense_real=3)
SEED_ROWS = {2048: 1_048_064, 8192: 1_048_448}  # 512 x 2,047 and 128 x 8,191 next-token rows
BLOCK = 128
V41_LAYERS = None  # --v41-layers: bench/v41_layers.py's per-token seconds of real V4.1-Flash layers (its JSON's v41_layers)
REPLAY_FLOPS = 600e12  # the bf16 head's GEMM rate on an H100 (bench/head.py: 653 TFLOP/s), replaced by the measured one


def config(s: dict) -> dict:
    return {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": s["vocab"],
            "hidden_size": s["hidden"], "intermediate_size": s["dense_inter"], "moe_intermediate_size": s["moe_inter"],
            "num_hidden_layers": s["layers"], "num_attention_heads": s["heads"], "num_key_value_heads": s["heads"],
            "n_shared_experts": 1, "n_routed_experts": s["experts"], "num_experts_per_tok": s["topk"], "n_group": s["groups"],
            "topk_group": s["topk_groups"], "first_k_dense_replace": 1, "norm_topk_prob": True, "routed_scaling_factor": 2.5,
            "q_lora_rank": s["q_lora"], "kv_lora_rank": s["kv_lora"], "qk_rope_head_dim": s["rope"], "qk_nope_head_dim": s["nope"],
            "v_head_dim": s["v"], "max_position_embeddings": 163840, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
            "hidden_act": "silu", "torch_dtype": "bfloat16", "rope_theta": 10000.0, "scoring_func": "sigmoid",
            "topk_method": "noaux_tc",
            # DeepSeek-V3's own release: E4M3 weights, one float32 scale per 128x128 block, activations dynamic
            "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                    "weight_block_size": [BLOCK, BLOCK]}}


def layer_tensors(s: dict, i: int) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, kind) of layer i; kind: fp8 (a quantized linear), bf16 or f32 (the router's bias)."""
    H, nh = s["hidden"], s["heads"]
    p = f"model.layers.{i}."
    t = [(p + "input_layernorm.weight", (H,), "bf16"), (p + "post_attention_layernorm.weight", (H,), "bf16"),
         (p + "self_attn.q_a_proj.weight", (s["q_lora"], H), "fp8"), (p + "self_attn.q_a_layernorm.weight", (s["q_lora"],), "bf16"),
         (p + "self_attn.q_b_proj.weight", (nh * (s["nope"] + s["rope"]), s["q_lora"]), "fp8"),
         (p + "self_attn.kv_a_proj_with_mqa.weight", (s["kv_lora"] + s["rope"], H), "fp8"),
         (p + "self_attn.kv_a_layernorm.weight", (s["kv_lora"],), "bf16"),
         (p + "self_attn.kv_b_proj.weight", (nh * (s["nope"] + s["v"]), s["kv_lora"]), "fp8"),
         (p + "self_attn.o_proj.weight", (H, nh * s["v"]), "fp8")]
    if i == 0:
        inter = s["dense_inter"]
        return t + [(p + "mlp.gate_proj.weight", (inter, H), "fp8"), (p + "mlp.up_proj.weight", (inter, H), "fp8"),
                    (p + "mlp.down_proj.weight", (H, inter), "fp8")]
    inter, E = s["moe_inter"], s["experts"]
    t += [(p + "mlp.gate.weight", (E, H), "bf16"), (p + "mlp.gate.e_score_correction_bias", (E,), "f32"),
          (p + "mlp.shared_experts.gate_proj.weight", (inter, H), "fp8"),
          (p + "mlp.shared_experts.up_proj.weight", (inter, H), "fp8"),
          (p + "mlp.shared_experts.down_proj.weight", (H, inter), "fp8")]
    for e in range(E):
        t += [(p + f"mlp.experts.{e}.gate_proj.weight", (inter, H), "fp8"), (p + f"mlp.experts.{e}.up_proj.weight", (inter, H), "fp8"),
              (p + f"mlp.experts.{e}.down_proj.weight", (H, inter), "fp8")]
    return t


def _values(name: str, shape: tuple[int, ...], kind: str, seed: int) -> list[tuple[str, str, tuple[int, ...], bytes]]:
    """The stored tensors of one logical tensor: random values of the right scale, as safetensors entries."""
    g = torch.Generator().manual_seed(seed)
    if kind == "fp8":  # codes ~ N(0, 2), scales ~ 1/(2 sqrt(in)) x U(0.9, 1.1): weights ~ N(0, 1/in)
        codes = (2 * torch.randn(shape, generator=g)).clamp(-448, 448).to(torch.float8_e4m3fn)
        sshape = (math.ceil(shape[0] / BLOCK), math.ceil(shape[1] / BLOCK))
        scale = (0.9 + 0.2 * torch.rand(sshape, generator=g)) / (2 * math.sqrt(shape[1]))
        return [(name, "F8_E4M3", shape, codes.view(torch.uint8).numpy().tobytes()),
                (name + "_scale_inv", "F32", sshape, scale.float().numpy().tobytes())]
    if len(shape) == 1:
        x = 1.0 + 0.02 * torch.randn(shape, generator=g) if "norm" in name else 0.01 * torch.randn(shape, generator=g)
    else:
        x = torch.randn(shape, generator=g) / math.sqrt(shape[-1])
    if kind == "f32":
        return [(name, "F32", shape, x.float().numpy().tobytes())]
    return [(name, "BF16", shape, x.to(torch.bfloat16).view(torch.uint16).numpy().tobytes())]


def write_shard(path: Path, items: list[tuple[str, tuple[int, ...], str]], pool: dict) -> tuple[int, list[str]]:
    """A safetensors file written by hand; values come from a pool of a few distinct blocks per shape (reused),
    so that writing 25 GB does not mean generating 25 GB of random numbers."""
    entries = []
    for k, (name, shape, kind) in enumerate(items):
        key = (shape, kind, k % 4, "norm" in name)
        if key not in pool:
            pool[key] = [(dt, sh, raw) for _, dt, sh, raw in _values(name, shape, kind, len(pool))]
        names = [name] if len(pool[key]) == 1 else [name, name + "_scale_inv"]
        entries += [(n, dt, sh, raw) for n, (dt, sh, raw) in zip(names, pool[key])]
    header, off = {}, 0
    for n, dt, sh, raw in entries:
        header[n] = {"dtype": dt, "shape": list(sh), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for _, _, _, raw in entries:
            f.write(raw)
    return off, [n for n, *_ in entries]


def write_checkpoint(folder: Path, s: dict) -> float:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config(s)))
    weight_map, pool, total = {}, {}, 0
    shards = [("model-embed.safetensors", [("model.embed_tokens.weight", (s["vocab"], s["hidden"]), "bf16")])]
    shards += [(f"model-layer{i:02d}.safetensors", layer_tensors(s, i)) for i in range(s["layers"])]
    shards.append(("model-head.safetensors", [("model.norm.weight", (s["hidden"],), "bf16"),
                                              ("lm_head.weight", (s["vocab"], s["hidden"]), "bf16")]))
    for fname, items in shards:
        n, names = write_shard(folder / fname, items, pool)
        total += n
        weight_map.update({k: fname for k in names})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    return total / 1e9


def checkpoint_bytes(s: dict) -> int:
    """Bytes the checkpoint will take (fp8 weights + their scales, bf16 rest), from the shapes alone."""
    n = 0
    for i in range(s["layers"]):
        for _, shape, kind in layer_tensors(s, i):
            n += math.prod(shape) * {"fp8": 1, "bf16": 2, "f32": 4}[kind]
    return n + 2 * 2 * s["vocab"] * s["hidden"]


# -- the model's arithmetic ------------------------------------------------------------------------------
def hf_config(s: dict, layers: int, dense: int = 1):
    import transformers as tf

    c = {k: v for k, v in config({**s, "layers": layers}).items() if k not in ("architectures", "model_type", "quantization_config")}
    return tf.DeepseekV3Config(**{**c, "first_k_dense_replace": dense})


def v41_flash_flops_per_token(cfg: dict, L: int) -> dict:
    """Analytic FLOPs per token of DeepSeek-V4.1-Flash from its released config (the shapes of its reference
    ``model.py``): q LoRA (dim -> q_lora -> heads x head_dim), one shared latent KV of head_dim, the grouped LoRA
    output projection (o_groups x o_lora), MoE with n_activated + shared experts and the router; attention over
    the sliding window, plus in compressed layers the indexer's top-k compressed positions (the indexer itself
    scores every earlier compressed position). Hyper-connections, engram lookups and norms are left out
    (elementwise or lookups); the MTP layers are not run for logits."""
    D, nh, hd = cfg["dim"], cfg["n_heads"], cfg["head_dim"]
    q = D * cfg["q_lora_rank"] + cfg["q_lora_rank"] * nh * hd
    o = nh * hd * cfg["o_lora_rank"] + cfg["o_groups"] * cfg["o_lora_rank"] * D
    proj = 2 * (q + D * hd + o)
    moe = 2 * 3 * D * cfg["moe_inter_dim"] * (cfg["n_activated_experts"] + cfg["n_shared_experts"]) + 2 * D * cfg["n_routed_experts"]
    total = 0.0
    for r in cfg["compress_ratios"][:cfg["n_layers"]]:
        keys, idx = min(cfg["window_size"], (L + 1) / 2), 0.0
        if r:
            keys += min(cfg["index_topk"], (L / r + 1) / 2)
            idx = 2 * cfg["index_n_heads"] * cfg["index_head_dim"] * (L / r + 1) / 2
        total += proj + 2 * nh * 2 * hd * keys + idx + moe
    return {"layers": total, "head": 2 * D * cfg["vocab_size"], "n_layers": cfg["n_layers"],
            "weights_gb": v41_flash_weight_bytes(cfg) / 1e9}


def v41_flash_weight_bytes(cfg: dict) -> float:
    """Bytes read per pass: routed experts FP4 (0.5 B + an E8M0 scale per 32), the rest FP8 (+ 128x128 scales),
    embedding and head bf16. Engram tables are lookups (the rows a window touches), left out."""
    D = cfg["dim"]
    experts = cfg["n_layers"] * cfg["n_routed_experts"] * 3 * D * cfg["moe_inter_dim"] * (0.5 + 1 / 32)
    q = D * cfg["q_lora_rank"] + cfg["q_lora_rank"] * cfg["n_heads"] * cfg["head_dim"]
    o = cfg["n_heads"] * cfg["head_dim"] * cfg["o_lora_rank"] + cfg["o_groups"] * cfg["o_lora_rank"] * D
    rest = cfg["n_layers"] * (q + D * cfg["head_dim"] + o + 3 * D * cfg["moe_inter_dim"] * cfg["n_shared_experts"])
    return experts + rest * (1 + 4 / 128 ** 2) + 2 * 2 * cfg["vocab_size"] * D


# -- the verbs ---------------------------------------------------------------------------------------------
def write_windows(root: Path, vocab: int, n: int, L: int, seed: int = 0) -> Path:
    from fideval.formats.ids import sequence_ids
    from fideval.windows.layout import Sequences, length_dir, write_sequences

    rng = np.random.default_rng(seed)
    ids = sequence_ids("web", n, None)
    folder = length_dir(root, "cuts", L)
    folder.mkdir(parents=True, exist_ok=True)
    write_sequences(folder, Sequences(ids=ids, domains=["web"] * n, tokens=rng.integers(0, vocab, (n, L)).astype(np.int32)))
    return folder / "tokens.safetensors"


def write_config(path: Path, model: Path, device: str, data: Path, settings: dict | None = None) -> None:
    """The rehearsal's config; ``settings``: the teacher's bit-shaping settings fixed (the fused pass's identity check)."""
    extra = "".join(f", {k}: {v if v is not None else 'null'}" for k, v in (settings or {}).items())
    data.write_text('{"text": "unused: the bench writes its token windows itself"}\n')
    path.write_text(f"""run: rehearsal
model: {{path: {model}, id: bench/deepseek-v3-shaped-fp8, revision: local}}
domains:
  - name: web
    source: {{type: local, path: {data}, text_field: text}}
teacher: {{device: {device}, dtype: bfloat16{extra}}}
candidates:
  - name: mxfp4-experts
    quant:
      routed_experts: {{format: mxfp4, recipe: rceil}}
    paths: [serving, weights-only]
""")


def verb(args: list[str], env: dict) -> tuple[float, str]:
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "fideval", *args], capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"fideval {args[0]} failed ({res.returncode}): {res.stderr[-3000:]}")
    print(f"fideval {args[0]} ({wall:.1f} s): {res.stdout.strip()[-600:]}", flush=True)
    return wall, res.stdout.strip()


def run_verbs(work: Path, ckpt: Path, s: dict, n: int, device: str, fused: bool = True,
              stores: tuple[str, ...] = ("logits", "hidden")) -> dict:
    """``fideval teacher`` then ``fideval score --config`` on both paths, each in its own process as the
    workflow runs them; their own profiles read back from what they wrote; once per store kind (``stores``: the
    logit store, the baseline, and the hidden store, the default), the same records expected from both. Then
    ``fideval fused`` on the same sequences (the teacher's settings as recorded by the separate pass: the config fixes
    them) with the last kind, its store and records compared byte for byte with the separate passes'."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), "PYTHONUNBUFFERED": "1"}
    tokens = write_windows(work / "windows", s["vocab"], n, 2048)
    cfg = work / "rehearsal.yaml"
    write_config(cfg, ckpt, device, work / "unused.jsonl")
    out = {"rows": n * 2047, "tokens": n * 2048, "kinds": {}}
    for kind in stores:
        store, records = work / f"teacher-{kind}", work / f"records-{kind}"
        shutil.rmtree(store, ignore_errors=True)
        shutil.rmtree(records, ignore_errors=True)
        o = out["kinds"][kind] = {}
        o["teacher_s"], _ = verb(["teacher", "--config", str(cfg), "--windows", str(tokens), "--out", str(store),
                                  "--lengths", "cuts", "--device", device, "--store", kind], env)
        meta = json.loads((store / "manifest.json").read_text()).get("meta", {})
        o["teacher_block"] = json.loads(meta.get("teacher", "{}"))
        o["teacher_profile"] = json.loads(meta.get("profile", "{}"))
        o["store_bytes"] = sum(p.stat().st_size for p in store.rglob("*.safetensors"))
        o["head_bytes"] = (store / "head.safetensors").stat().st_size if (store / "head.safetensors").is_file() else 0
        for path in ("serving", "weights-only"):
            rec = records / path
            o[f"score_{path}_s"], _ = verb(["score", "--teacher", str(store), "--config", str(cfg), "--candidate", "mxfp4-experts",
                                            "--path", path, "--out", str(rec), "--device", device], env)
            sj = json.loads((rec / "score.json").read_text())
            o[f"score_{path}_profile"] = sj.get("profile") or {}
            o[f"score_{path}_rows"] = sj.get("rows")
            o[f"score_{path}_kld"] = _records_kld(rec / "records.parquet")
    if len(stores) == 2:  # the same candidate rows scored against either teacher: how far apart
        a, b = (work / f"records-{k}" for k in stores)
        out["records_identical"] = {p: sha256(a / p / "records.parquet") == sha256(b / p / "records.parquet")
                                    for p in ("serving", "weights-only")}
        out["kld_max_abs_diff"] = {p: _kld_diff(a / p / "records.parquet", b / p / "records.parquet")
                                   for p in ("serving", "weights-only")}
    last = out["kinds"][stores[-1]]
    out.update({k: last[k] for k in ("teacher_s", "teacher_block", "teacher_profile", "store_bytes", "score_serving_s",
                                     "score_weights-only_s", "score_serving_profile", "score_weights-only_profile",
                                     "score_serving_rows", "score_weights-only_rows")})
    if fused:  # the same work in one pass; its store and records must be the separate passes' bytes
        store, records = work / f"teacher-{stores[-1]}", work / f"records-{stores[-1]}"
        fstore, frec = work / "fused" / "teacher", work / "fused" / "records"
        shutil.rmtree(work / "fused", ignore_errors=True)
        fcfg = work / "rehearsal-fused.yaml"
        write_config(fcfg, ckpt, device, work / "unused.jsonl",
                     {k: out["teacher_block"].get(k) for k in ("micro_batch", "mlp_tokens", "chunk_bytes", "lm_head")})
        try:
            out["fused_s"], _ = verb(["fused", "--config", str(fcfg), "--windows", str(tokens), "--domain", "web", "--out",
                                      str(fstore), "--records", str(frec), "--no-self-check", "--device", device], env)
        except SystemExit as e:  # the separate passes' figures stand without it
            out["fused_failed"] = str(e)[-400:]
            return out
        fmeta = json.loads((fstore / "manifest.json").read_text()).get("meta", {})
        out["fused_profile"] = json.loads(fmeta.get("profile", "{}"))
        out["fused_block"] = json.loads(fmeta.get("teacher", "{}"))
        same = [sha256(p) == sha256(fstore / "shards" / p.name) for p in sorted((store / "shards").glob("*.safetensors"))]
        for path in ("serving", "weights-only"):
            same.append(sha256(records / path / "records.parquet") ==
                        sha256(frec / "mxfp4-experts" / path / "cuts" / "web" / "records.parquet"))
        out["fused_identical"] = f"{sum(same)} of {len(same)} files (shards, records)"
        shutil.rmtree(work / "fused", ignore_errors=True)
    return out


def measure_replay(s: dict, device: str, rows: int = 8192) -> dict:
    """The hidden store's head replay at full width (fideval.store.replay.ReplayHead, bf16 head): FLOP/s over one
    sequence of ``rows`` rows, after a warm-up; and the same rows' float32 replay."""
    from fideval.store.replay import ReplayHead

    H, V = s["hidden"], s["vocab"]
    g = torch.Generator(device="cpu").manual_seed(0)
    w = (torch.randn((V, H), generator=g) * 0.02).to(torch.bfloat16)
    x = torch.randn((rows, H), generator=g).to(torch.bfloat16)
    out = {}
    for mode in ("bf16", "float32"):
        block = {"lm_head": mode, "finish": None, "hidden_dtype": "bfloat16"}
        head = ReplayHead(w, block, device)
        xd = x.to(device)
        head(xd)
        if device == "cuda":
            torch.cuda.synchronize()
        t0, n = time.perf_counter(), 5
        for _ in range(n):
            y = head(xd)
        if device == "cuda":
            torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) / n
        out[mode] = {"s": dt, "flops_per_s": 2 * rows * H * V / dt, "finite": bool(torch.isfinite(y).all())}
        del head, y, xd
    if device == "cuda":  # the verbs run in other processes: this one must hold no cached GPU memory
        torch.cuda.empty_cache()
    return out


def sha256(path: Path) -> str:
    from fideval.fsio import sha256_file

    return sha256_file(path)


def _records_kld(path: Path) -> float:
    import pyarrow.parquet as pq

    return float(np.mean(pq.read_table(path, columns=["kld"]).column("kld").to_numpy()))


def _kld_diff(a: Path, b: Path) -> float:
    import pyarrow.parquet as pq

    x, y = (pq.read_table(p, columns=["kld"]).column("kld").to_numpy() for p in (a, b))
    return float(np.abs(x - y).max()) if x.shape == y.shape else float("nan")


def scoring_rate(profile: dict, rows: int) -> float:
    """Rows a second through the scoring loop: the teacher's rows read (and, from a hidden store, replayed through the
    head), scored, checked on the CPU; the candidate's own model run left out."""
    parts = profile.get("parts") or {}
    t = sum(parts.get(k, 0.0) for k in ("read_back", "scoring", "cpu_check"))
    return rows / t if t else float("nan")


# -- compute at size ---------------------------------------------------------------------------------------
def run_compute(ckpt: Path, s: dict, L: int, tokens: int, device: str, candidate: bool | str) -> dict:
    """The teacher's own path (fideval.model.teacher: sizing, runner options, timeline, accounting) over ``tokens``
    tokens per layer, the logits consumed on the device instead of written (see the module docstring).
    ``candidate``: the MXFP4 serving candidate; ``"fused"``: the fused pass (teacher + serving + weights-only, each
    candidate row scored against the teacher's on the device; ``tokens`` counts one model's)."""
    from fideval.model import sizing
    from fideval.model.adapters import Adapter
    from fideval.model.flops import flops_per_token
    from fideval.model.runner import Runner, RunnerOptions
    from fideval.model.weights.checkpoint import open_weights
    from fideval.timing import accounting
    from fideval.timing.timeline import Timeline

    dev = torch.device(device)
    n = max(1, tokens // L)
    toks = np.random.default_rng(1).integers(0, s["vocab"], size=(n, L)).astype(np.int32)
    hooks = {}
    if candidate:
        from fideval.quant.spec import compile_spec

        spec = compile_spec({"routed_experts": {"format": "mxfp4", "recipe": "rceil"}})
        hooks = {"weight_transform": spec.weight_transform, "act_transform": spec.act_transform}
    w = open_weights(ckpt)
    adapter = Adapter.load(w)
    fused = candidate == "fused"
    st = sizing.choose(dev, torch.bfloat16, adapter.config, L, n_sequences=n, models=3 if fused else 1,
                       stored_bytes=1 if adapter.release is not None else None)
    timeline = Timeline(dev)
    base = dict(device=dev, dtype=torch.bfloat16, profile=True, **st.runner_options())
    if fused:  # fideval fused's pass: the teacher, the serving and the weights-only candidate, each layer read once
        from fideval.model.lockstep import Lockstep
        from fideval.score.kernels import pick, score_tensors

        runners = [Runner(w, RunnerOptions(**base, **h), timeline=timeline)
                   for h in ({}, hooks, {"weight_transform": hooks["weight_transform"]})]
        r, lock, kernel = runners[0], Lockstep(runners), pick(device)[1]
    else:
        r = Runner(w, RunnerOptions(**base, **hooks), timeline=timeline)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.reset_accumulated_memory_stats()
    t0 = time.perf_counter()
    timeline.start()
    acc = torch.zeros((), device=dev)
    if fused:  # each candidate row scored against the teacher's on the device, as the verb does (the store: the verbs)
        rows = {}
        for k, row, logits in lock.run_models(toks):
            if k == 0:
                rows[row] = logits
                continue
            with timeline.part("scoring"):
                figs, _, _ = score_tensors(rows[row][:-1], logits[:-1], torch.from_numpy(toks[row, 1:].astype(np.int64)).to(dev), kernel)
            acc += float(figs[:, 0].mean())
            del logits
            if k == 2:
                del rows[row]
        r.canary = {"identical": all(c and c.get("identical") for c in lock.canaries)}
    else:
        for _, logits in r.run(toks):
            acc += logits[-1, :8].sum()  # consumed on the device: no host copy, no store (measured by the verbs)
    stats = r.finish_profile()
    wall = time.perf_counter() - t0
    f = flops_per_token(adapter.config, L)
    k = 3 if fused else 1
    prof = accounting.summary(wall, stats.get("parts", {}), device=accounting.device_name(dev), tokens=n * L,
                              model_flops=k * f["total"] * n * L, peak=accounting.peak_tflops(accounting.device_name(dev), "bfloat16"),
                              hidden={"load": accounting.hidden_share(stats.get("load_s", 0.0), stats.get("wait_s", 0.0))})
    out = {"L": L, "seqs": n, "tokens": n * L, "settings": {**st.recorded(), "lm_head": r.head_mode},
           "finite": math.isfinite(float(acc)), "profile": prof,
           "flops": f, "canary": bool(r.canary and r.canary.get("identical")),
           "peak_gpu_gb": torch.cuda.max_memory_allocated() / 1e9 if device == "cuda" else 0.0,
           # the allocator's retries (each frees every cached block after a device-wide sync: GPU idle inside
           # whatever part is open) -- a lead for attention parts that differ 2-4x between runs (bench/RESULTS.md)
           "alloc_retries": torch.cuda.memory_stats().get("num_alloc_retries", 0) if device == "cuda" else 0,
           "peak_reserved_gb": torch.cuda.max_memory_reserved() / 1e9 if device == "cuda" else 0.0}
    del r, w
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def run_compute_child(work: Path, L: int, tokens: int, role: str) -> dict:
    """:func:`run_compute` in a fresh process (``--one``): a run starts with the GPU memory a verb would have."""
    out = work / f"compute-{role}-{L}.json"
    out.unlink(missing_ok=True)
    res = subprocess.run([sys.executable, __file__, "--dir", str(work), "--tokens", str(tokens), "--one", f"{role}:{L}",
                          "--result", str(out)], capture_output=True, text=True)
    if res.returncode != 0 or not out.is_file():
        err = work / f"compute-{role}-{L}.err"  # the whole traceback: the table keeps one line
        err.write_text(res.stderr)
        lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip()] or [f"exit status {res.returncode}"]
        raise RuntimeError(f"{lines[-1]} (whole stderr: {err})")
    return json.loads(out.read_text())


# -- disk and the extrapolation ------------------------------------------------------------------------------
def disk_rates(work: Path, gb: int = 4) -> dict:
    """Sequential write and read of the results disk with O_DIRECT (dd), the page cache out of the way."""
    f = work / "dd.bin"
    out = {}
    for what, args in (("write", [f"of={f}", "if=/dev/zero", "oflag=direct"]), ("read", [f"if={f}", "of=/dev/null", "iflag=direct"])):
        t0 = time.perf_counter()
        res = subprocess.run(["dd", "bs=16M", f"count={gb * 64}", *args], capture_output=True, text=True)
        out[what] = gb * (1 << 30) / (time.perf_counter() - t0) / 1e9 if res.returncode == 0 else None
    f.unlink(missing_ok=True)
    return out


# parts a run pays once, whatever its tokens: the canary's two digests of a sequence's logits (SHA-256 of
# L x vocab x 4 B on the host), the chunk's setup, the experts' kernel warm-up
ONCE = ("canary", "setup", "warmup")


def fixed_s(profile: dict) -> float:
    return sum(profile["parts"].get(k, 0.0) for k in ONCE)


def extrapolate(compute: dict, verbs: dict | None, disk: dict, s: dict, store: str = "logits") -> list[tuple[str, str, str]]:
    """Seed evaluation time on this GPU, from the measured rates (formula printed with the figures). ``store``: the
    teacher store's kind: ``logits`` (rows x vocab x 4 B) or ``hidden`` (rows x hidden x 2 B in bf16, and the head,
    replayed by each candidate pass at the measured replay rate)."""
    rows = []
    wr, rd = (disk.get("write") or 1.0) * 1e9, (disk.get("read") or 1.0) * 1e9  # bytes/s
    v41 = json.loads((ROOT.parent / "shared" / "reference-code" / "deepseek-v4.1-flash" / "config.json").read_text()) \
        if (ROOT.parent / "shared").is_dir() else None
    from fideval.model.flops import flops_per_token

    store_kind = store
    for model in ("DeepSeek-V3", "DeepSeek-V4.1-Flash"):
        if model == "DeepSeek-V4.1-Flash" and v41 is None:
            continue
        total = {"separate": 0.0, "fused": 0.0}
        terms = []
        for L, rows_L in SEED_ROWS.items():
            T = rows_L // (L - 1) * L
            if model == "DeepSeek-V3":
                f = flops_per_token(hf_config(V3, V3["n_layers_real"], V3["dense_real"]), L)
                f_layers, f_head = f["total"] - f["head"], f["head"]
                wbytes = 671e9 + 2 * 2 * s["vocab"] * s["hidden"]  # FP8 release: ~1 B a parameter, bf16 ends
            else:
                f = v41_flash_flops_per_token(v41, L)
                f_layers, f_head, wbytes = f["layers"], f["head"], f["weights_gb"] * 1e9
            vocab = V3["vocab"] if model == "DeepSeek-V3" else v41["vocab_size"]
            passes = {}
            for role in ("teacher", "candidate", "fused"):
                measured = [k for k in SEED_ROWS if f"{role}-{k}" in compute]  # this length, else the longest run
                c = compute.get(f"{role}-{L}") or (compute[f"{role}-{max(measured)}"] if measured else None)
                if c is None:
                    continue
                p = c["profile"]
                fixed = fixed_s(p)
                head_s = p["parts"].get("head", 0.0) / c["tokens"]
                layer_s = (p["wall_s"] - p["parts"].get("head", 0.0) - fixed) / c["tokens"]
                # the rehearsal's layers and head, per token, scaled by the model's FLOPs per token against the
                # rehearsal's (its 3 layers: 1 dense + 2 MoE at DeepSeek-V3 sizes); the once-a-run parts as they are
                fr = c["flops"]
                layer_scale = f_layers / (fr["total"] - fr["head"])
                passes[role] = fixed + T * (layer_s * layer_scale + head_s * f_head / fr["head"])
            if model == "DeepSeek-V4.1-Flash" and V41_LAYERS:  # measured V4.1 layers (bench/v41_layers.py), by FLOPs
                for role in ("teacher", "candidate"):
                    m = V41_LAYERS[role]
                    passes[role] = m["fixed_s"] + v41["n_layers"] * m.get("load_s_per_layer", 0.0) + T * (
                        m["layer_s_per_token"] * f_layers / m["f_layers"] +
                                                       m["head_s_per_token"] * f_head / m["f_head"])
                passes.pop("fused", None)
            if "teacher" not in passes or "candidate" not in passes:
                continue
            H = V3["hidden"] if model == "DeepSeek-V3" else v41["dim"]
            store = rows_L * vocab * 4 if store_kind == "logits" else rows_L * H * 2 + vocab * H * 2
            weights_s = wbytes / (rd if wbytes > 100e9 else 10e9)  # > 100 GB cannot stay in 128 GB of page cache
            # a hidden store's head replay: the bf16 head GEMM over every row, at the measured rate
            replay_s = rows_L * f_head / REPLAY_FLOPS if store_kind == "hidden" else 0.0
            write_s, read_s = store / wr, store / rd + replay_s
            sep = max(passes["teacher"], weights_s, write_s) + 2 * (max(passes["candidate"], weights_s) + read_s)
            fused = max(passes["teacher"] + 2 * passes["candidate"], weights_s, write_s)
            total["separate"] += sep
            total["fused"] += fused
            if "fused" in passes:  # the measured fused pass (its scoring included) in place of teacher + 2 candidates
                total["fused_measured"] = total.get("fused_measured", 0.0) + max(passes["fused"], weights_s, write_s)
            terms.append(f"L={L}: teacher {passes['teacher']:.0f} s, candidate {passes['candidate']:.0f} s, weights {weights_s:.0f} s, "
                         f"store write {write_s:.0f} s, read-back {read_s:.0f} s" +
                         (" (measured V4.1 layers)" if model == "DeepSeek-V4.1-Flash" and V41_LAYERS else ""))
        if not terms:
            continue
        goal = "<= 20 min" if store_kind == "hidden" else "<= 45 min"
        rows.append((f"extrapolation {model}, {store_kind} store: separate passes (teacher, then 2 candidate passes reading "
                     "the store back)", f"{total['separate'] / 60:.0f} min ({'; '.join(terms)})", goal))
        rows.append((f"extrapolation {model}, {store_kind} store: fused from the separate runs' rates (teacher + 2 "
                     "candidates, no read-back)", f"{total['fused'] / 60:.0f} min", goal))
        if "fused_measured" in total:
            rows.append((f"extrapolation {model}, {store_kind} store: fused from the measured fused pass",
                         f"{total['fused_measured'] / 60:.0f} min", goal))
        rows.append((f"extrapolation {model}, {store_kind} store: teacher stores of both lengths",
                     f"{sum(r * (vocab * 4 if store_kind == 'logits' else H * 2) for r in SEED_ROWS.values()) / 1e9:,.1f} GB",
                     "<= 40 GB" if store_kind == "hidden" else ""))
    rows.append(("extrapolation formula", "per length L: T = rows/(L-1) x L tokens; pass = once-a-run parts (" + ", ".join(ONCE) +
                 ") + T x (layer s/token x F_layers/F_layers,bench + head s/token x F_head/F_head,bench), layer s/token = (wall - "
                 "head - once-a-run parts) / tokens; separate = max(teacher, W/disk_read, S/disk_write) + 2 x (max(candidate, "
                 "W/disk_read) + S/disk_read + replay); fused = max(teacher + 2 candidate, W/disk_read, S/disk_write); S = rows x "
                 "vocab x 4 B (logit store) or rows x hidden x 2 B + the bf16 head (hidden store), replay = rows x head FLOPs / "
                 "the measured bf16 head rate (hidden store; 0 for logits), W = checkpoint bytes (from page cache at ~10 GB/s "
                 "when < 100 GB)",
                 f"disk write {wr / 1e9:.2f} GB/s, read {rd / 1e9:.2f} GB/s"))
    return rows


def print_table(rows, title):
    print(f"\n{title}")
    w = max(len(r[0]) for r in rows)
    print(f"| {'figure'.ljust(w)} | measured | ceiling / goal |\n|{'-' * (w + 2)}|---|---|")
    for r in rows:
        print(f"| {r[0].ljust(w)} | {r[1]} | {r[2]} |", flush=True)


def parts_line(p: dict) -> str:
    wall = p.get("wall_s") or 0.0
    return ", ".join(f"{k} {v:.1f} s" for k, v in p.get("parts", {}).items() if v >= 0.05 or k == "other") + \
        f" (other {p.get('other_fraction', 0):.1%} of {wall:.1f} s)"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true", help="CPU-sized smoke run")
    ap.add_argument("--dir", default="/tmp/fideval-evaluation")
    ap.add_argument("--part", default="all", choices=["all", "verbs", "compute"])
    ap.add_argument("--verb-seqs", type=int, default=16, help="cuts of 2,048 the verbs run on (store: n x 2,047 x vocab x 4 B)")
    ap.add_argument("--tokens", type=int, default=1 << 20, help="tokens per layer of each compute run")
    ap.add_argument("--lengths", default="2048,8192")
    ap.add_argument("--runs", default=None, help="only these compute runs, e.g. candidate-2048,teacher-8192 (default: "
                                                 "teacher and candidate at every length)")
    ap.add_argument("--deadline", type=float, default=0.0, help="seconds after which no further compute run starts (0: none)")
    ap.add_argument("--result", default=None, help="also write the results as JSON here")
    ap.add_argument("--reuse", action="store_true", help="take the compute runs an earlier call left in --dir (not rerun)")
    ap.add_argument("--v41-layers", default=None, help="bench/v41_layers.py --json output: the V4.1-Flash extrapolation from "
                                                       "those measured V4.1 layers instead of this run's V3-shaped ones")
    ap.add_argument("--one", default=None, metavar="ROLE:L", help=argparse.SUPPRESS)  # one compute run (a child process)
    a = ap.parse_args()
    if a.one:  # each compute run in its own process on a GPU, as each verb is: no run inherits another's memory
        role, L = a.one.split(":")
        ckpt = Path(a.dir) / "ckpt"
        s = dict(SMALL if a.small else V3)  # --small: the child path tried on a CPU
        s["layers"] = json.loads((ckpt / "config.json").read_text())["num_hidden_layers"]
        c = run_compute(ckpt, s, int(L), a.tokens, "cuda" if torch.cuda.is_available() else "cpu",
                        "fused" if role == "fused" else role == "candidate")
        Path(a.result).write_text(json.dumps(c, default=str))
        return
    s = dict(SMALL if a.small else V3)
    device = "cuda" if torch.cuda.is_available() and not a.small else "cpu"
    if a.small:
        a.verb_seqs, a.tokens = min(a.verb_seqs, 2), min(a.tokens, 1024)
    work = Path(a.dir)
    ckpt = work / "ckpt"
    work.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    if not (ckpt / "model.safetensors.index.json").is_file():
        moe_layer = checkpoint_bytes({**s, "layers": 2}) - checkpoint_bytes({**s, "layers": 1})
        free = shutil.disk_usage(work).free
        fit = int((free - a.verb_seqs * 2047 * s["vocab"] * 4 - checkpoint_bytes({**s, "layers": 1}) - 4e9) // moe_layer)
        if fit < s["layers"] - 1:
            if fit < 1:
                raise SystemExit(f"{free / 1e9:.0f} GB free: not one MoE layer ({moe_layer / 1e9:.0f} GB) beside the store fits")
            s["layers"] = 1 + fit
        t0 = time.perf_counter()
        gb = write_checkpoint(ckpt, s)
        print(f"wrote {gb:.1f} GB in {time.perf_counter() - t0:.1f} s", flush=True)
    s["layers"] = json.loads((ckpt / "config.json").read_text())["num_hidden_layers"]
    gb = sum(p.stat().st_size for p in ckpt.glob("*.safetensors")) / 1e9
    rows = [("checkpoint", f"{gb:.1f} GB, FP8 E4M3 + 128x128 scales, {s['layers']} layers (1 dense + {s['layers'] - 1} MoE), "
             f"{s['experts']} x {s['moe_inter']} experts, hidden {s['hidden']}, vocab {s['vocab']:,}", "DeepSeek-V3 release layout")]
    result = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "layers": s["layers"]}
    result["disk"] = disk = disk_rates(work, 1 if a.small else 4)
    print("disk", json.dumps(disk), flush=True)
    global REPLAY_FLOPS, V41_LAYERS
    if a.v41_layers:
        V41_LAYERS = json.loads(Path(a.v41_layers).read_text())["v41_layers"]
    result["replay"] = rp = measure_replay(s, device, 1024 if a.small else 8192)
    REPLAY_FLOPS = rp["bf16"]["flops_per_s"] if device == "cuda" else rp["float32"]["flops_per_s"]
    rows.append((f"head replay (hidden store), one sequence of {1024 if a.small else 8192:,} rows at full width",
                 f"bf16 head {rp['bf16']['s'] * 1e3:.1f} ms ({rp['bf16']['flops_per_s'] / 1e12:.0f} TFLOP/s, "
                 f"{(1024 if a.small else 8192) / rp['bf16']['s']:,.0f} rows/s), float32 head {rp['float32']['s'] * 1e3:.1f} ms "
                 f"({rp['float32']['flops_per_s'] / 1e12:.0f} TFLOP/s)", "what every read of a hidden store adds"))
    v = None
    if a.part in ("all", "verbs"):
        try:
            result["verbs"] = v = run_verbs(work, ckpt, s, a.verb_seqs, device)
        except (SystemExit, Exception) as e:  # a failed verb leaves the compute runs to measure
            print(e, flush=True)
            rows.append(("verbs", f"FAILED: {str(e).strip().splitlines()[-1][:300] if str(e).strip() else type(e).__name__}", ""))
    if v is not None:
        for kind, o in v["kinds"].items():
            tp, gbs = o["teacher_profile"], o["store_bytes"] / 1e9
            rows += [(f"verbs ({kind} store): fideval teacher", f"{o['teacher_s']:.1f} s in its process ({tp.get('wall_s', 0):.1f} s "
                      f"run), {v['rows']:,} rows, store {gbs:.2f} GB ({o['head_bytes'] / 1e9:.2f} GB of it the head); settings "
                      f"{o['teacher_block'].get('micro_batch')} / {o['teacher_block'].get('mlp_tokens')} / "
                      f"{o['teacher_block'].get('chunk_bytes')}", "micro-batch / MoE block / chunk"),
                     (f"verbs ({kind} store): teacher parts", parts_line(tp), "parts sum to the wall; other <= 5 %"),
                     (f"verbs ({kind} store): teacher store writes hidden behind compute",
                      f"{(tp.get('hidden') or {}).get('write', float('nan')):.1%}", ">= 90 %")]
            for path in ("serving", "weights-only"):
                sp, n_rows = o[f"score_{path}_profile"], o[f"score_{path}_rows"]
                rows += [(f"verbs ({kind} store): fideval score --config, {path}",
                          f"{o[f'score_{path}_s']:.1f} s, {n_rows:,} rows, mean KLD {o[f'score_{path}_kld']:.6g}; scoring loop "
                          f"{scoring_rate(sp, n_rows):,.0f} rows/s (read back{' + head replay' if kind == 'hidden' else ''}, "
                          f"scoring, CPU check); " + parts_line(sp), "")]
        if "records_identical" in v:
            rows += [("verbs: candidate records against the hidden store vs the logit store",
                      ", ".join(f"{p}: {'byte-identical' if v['records_identical'][p] else 'differ'} (max |delta KLD| "
                                f"{v['kld_max_abs_diff'][p]:.3g})" for p in ("serving", "weights-only")),
                      "equal to the digits the report prints")]
        rows += [("verbs: teacher weights", v["teacher_block"].get("weights", "?"), "as released")]
    if v is not None and "fused_s" in v:
        fp, sep = v["fused_profile"], v["teacher_s"] + v["score_serving_s"] + v["score_weights-only_s"]
        rows += [("verbs: fideval fused (teacher + both paths, one pass)",
                  f"{v['fused_s']:.1f} s against {sep:.1f} s separate ({sep / v['fused_s']:.2f}x); bytes equal: "
                  f"{v['fused_identical']}", "the separate passes' bytes"),
                 ("verbs: fused parts", parts_line(fp) + f"; store writes hidden {(fp.get('hidden') or {}).get('write', float('nan')):.1%}",
                  "parts sum to the wall")]
    compute = {}
    if a.reuse:  # compute runs of an earlier call on this machine (each child wrote its own JSON)
        for f in sorted(work.glob("compute-*-*.json")):
            role, L = f.stem.split("-")[1:3]
            compute[f"{role}-{L}"] = json.loads(f.read_text())
    if a.part in ("all", "compute"):
        for L in [int(x) for x in a.lengths.split(",") if x]:
            for role in ("teacher", "candidate", "fused"):
                if a.runs and f"{role}-{L}" not in a.runs.split(","):
                    continue
                if a.deadline and time.perf_counter() - t_all > a.deadline:
                    rows.append((f"compute {role} L={L}", f"not run: past --deadline {a.deadline:.0f} s", ""))
                    continue
                try:
                    c = (run_compute_child(work, L, a.tokens, role) if device == "cuda" else
                         run_compute(ckpt, s, min(L, 256) if a.small else L, a.tokens, device,
                                     "fused" if role == "fused" else role == "candidate"))
                except Exception as e:  # out of memory at one length still leaves the others
                    rows.append((f"compute {role} L={L}", f"FAILED: {type(e).__name__}: {str(e).splitlines()[0][:300]}", ""))
                    if device == "cuda":
                        torch.cuda.empty_cache()
                    continue
                compute[f"{role}-{L}"] = c
                print(role, L, json.dumps(c, default=str), flush=True)
                p = c["profile"]
                util = p.get("flop_utilisation")
                steady = (p["model_flops"] / (p["wall_s"] - fixed_s(p)) / (p["peak_tflops"] * 1e12)
                          if util is not None and p["wall_s"] > fixed_s(p) else None)
                rows += [(f"compute {role} L={L}: tokens/s, model FLOP utilisation",
                          f"{p['tokens_per_s']:,.0f}, {util:.1%}" if util is not None else f"{p['tokens_per_s']:,.0f}",
                          ">= 35 % of 989 TFLOP/s"),
                         (f"compute {role} L={L}: model FLOP utilisation without the once-a-run parts",
                          f"{steady:.1%} ({fixed_s(p):.1f} s of {', '.join(ONCE)} left out)" if steady is not None else "n/a",
                          "what a pass over many more tokens tends to"),
                         (f"compute {role} L={L}: parts", parts_line(p) + f"; settings {c['settings']}; "
                          f"peak GPU {c['peak_gpu_gb']:.0f} GB (reserved {c.get('peak_reserved_gb', 0):.0f} GB, allocator retries "
                          f"{c.get('alloc_retries', 0)}); canary {c['canary']}", "other <= 5 %")]
        result["compute"] = compute
        (work / "result.json").write_text(json.dumps(result, default=str, indent=1))  # kept should the table fail
        if a.result:
            Path(a.result).write_text(json.dumps(result, default=str, indent=1))
        for kind in ("logits", "hidden"):
            try:
                rows += extrapolate(compute, result.get("verbs"), disk, s, kind)
            except Exception as e:  # noqa: BLE001 -- the measured figures above stand without it
                rows.append((f"extrapolation, {kind} store", f"FAILED: {type(e).__name__}: {e}", ""))
    text = json.dumps(result, default=str, indent=1)
    (work / "result.json").write_text(text)
    if a.result:
        Path(a.result).write_text(text)
    print_table(rows, f"bench/evaluation.py on {result['device']} ({time.perf_counter() - t_all:.0f} s)")


if __name__ == "__main__":
    main()
