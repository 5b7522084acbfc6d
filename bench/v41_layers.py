"""Bench: a few DeepSeek-V4.1-Flash layers at their real sizes, through the verbs, on the reference-code path.

Run on the GPU machine: ``PYTHONPATH=. python3 bench/v41_layers.py --dir /tmp/v41-layers --json /tmp/v41-layers.json``
(``--estimate`` prints the disk / memory the run needs and exits, or refuses in one line; ``--scale small`` shrinks
every dimension, for a CPU, in about a minute). The verbs need the CLI's packages, as bench/evaluation.py says. On a
GPU the verbs run the vendored ``kernel_cpu.py`` on the device as the driver itself arranges it
(``deepseek_v41_kernels.on_device``: the path every user's run takes); ``--kernel-device DEV`` adds this bench's
earlier workaround in the verbs' processes (the vendor's code imported under ``torch.device(DEV)``), for comparison
only.

1. Writes a random checkpoint in V4.1-Flash's release layout as deepseek_v41_weights.py reads it: the vendor's
   tensor names (its ``Block``, ``ParallelEmbedding``, ``ParallelHead`` built on the meta device), routed experts
   FP4 e2m1 two per byte (stored I8) with E8M0 scales per 32 inputs, FP8 e4m3 linears with E8M0 32x32 scales,
   Engram tables as FP8 rows with E8M0 per-32 scales, the rest bf16 (fp32 where the vendor keeps it). config.json
   is the release's except ``n_layers`` (default: the shortest prefix holding an Engram layer, a compressed-KV owner
   and a reader: 4 = window, window + Engram, ratio-2 owner, ratio-2 reader) and the Engram rows: ``--engram-bucket``
   rows a (n-gram, head) bucket (the release: 16 M, 384 M rows, ~101 GB a layer) at the full row width (256 FP8 +
   8 scales). The Engram gather reads only the rows a micro-batch's hash ids name (24 a position, memory-mapped),
   so its cost does not grow with the row count (a cold page cache aside): the row count only costs disk. The
   vocabulary stays 129,280 (``--vocab``). Random values: a block per shape and kind, repeated along rows.
2. ``fideval teacher`` (model.implementation reference, ``--store hidden``) on ``--seqs`` x ``--length`` tokens,
   ``fideval score --config`` for an emulated candidate on the serving path (``--candidate``: MXFP4 routed experts,
   the seed's, whose released FP4 experts are kept as stored -- the loader's probe finds MXFP4 leaves them unchanged,
   deepseek_v41_weights.fp4_unchanged, timed in the table --, or FP8 attention), ``fideval verify``.
   Each verb runs in its own process, which records its peak device (torch allocator) and host (max RSS) memory.
3. One table (figure | measured | ceiling): tokens/s, model FLOP utilisation (fideval.model.flops on the driver's
   sizing config, and bench/evaluation.py's analytic count, over the dense bf16 peak), time per part, peak memory,
   store bytes, and the seed's compute on this path (40 layers, evaluation.py's SEED_ROWS, teacher + 2 candidate
   passes a length) from the measured per-layer seconds scaled by FLOPs. ``--json``'s ``v41_layers`` block is what
   ``bench/evaluation.py --v41-layers`` reads for its V4.1 extrapolation.
"""

from __future__ import annotations

import argparse
import dataclasses
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
sys.path.insert(0, str(ROOT / "bench"))

import evaluation as ev  # noqa: E402  (windows, the analytic V4.1 FLOPs, the table, SEED_ROWS)

V41 = ROOT.parent / "shared" / "reference-code" / "deepseek-v4.1-flash"
SMALL = dict(vocab_size=512, dim=128, moe_inter_dim=64, n_heads=4, n_routed_experts=8, n_activated_experts=2,
             q_lora_rank=64, head_dim=64, rope_head_dim=16, o_groups=4, o_lora_rank=32, window_size=8, index_n_heads=4,
             index_head_dim=32, index_topk=4, candidate_topk_blocks=2, candidate_block_size=4, original_seq_len=16,
             rope_factor=4, engram_n_heads=2, engram_head_dim=32)
ST = {torch.int8: "I8", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e8m0fnu: "F8_E8M0", torch.bfloat16: "BF16",
      torch.float32: "F32"}
SIZE = {"I8": 1, "F8_E4M3": 1, "F8_E8M0": 1, "BF16": 2, "F32": 4}
FP4_RMS = 2.93  # rms of a uniformly random E2M1 code
BLOCK_ELEMS = 1 << 22  # random values drawn per block; longer tensors repeat it along their rows
NOT_LAYERS = ev.ONCE + ("startup", "head", "d2h", "store_write", "read_back", "self_check", "scoring", "cpu_check", "records")
FLOATS = [  # (which, kind, arg) of the vendor's float parameters other than linear weights, as tests/ref_deepseek_v41.py
    (lambda n, leaf: "norm" in n or leaf in ("q_weight", "k_weight"), "randn", (1.0, 0.1)),
    (lambda n, leaf: leaf == "attn_sink", "randn", (0.0, 0.5)), (lambda n, leaf: leaf.startswith("bias"), "randn", (0.0, 0.1)),
    (lambda n, leaf: leaf.startswith("hc_") and leaf.endswith("_fn"), "randn", (0.0, None)),  # 0.8 / sqrt(hc x dim)
    (lambda n, leaf: leaf.startswith("hc_") and leaf.endswith("_base"), "randn", (0.0, 0.5)),
    (lambda n, leaf: leaf.startswith("hc_") and leaf.endswith("_scale"), "rand", (0.5, 1.5)),
    (lambda n, leaf: n == "embed.weight", "randn", (0.0, 1.0))]
CANDIDATES = {"mxfp4-experts": "routed_experts: {format: mxfp4, recipe: rceil}",  # the seed's candidate
              "fp8-attention": "attention: {format: fp8_block, recipe: ue8m0}"}
# a verb in its own process, recording its peak memory: argv = [json out, kernel device or "", verb args...]. With a
# kernel device, the vendor's kernels (kernel_cpu.py: its accumulators and E2M1 tables are made without a device, so
# on CPU) run under torch.device(their input's device), their module's tables made on that device
CHILD = """import atexit, contextlib, functools, json, resource, sys, torch
out, kdev = sys.argv[1], sys.argv[2]
cuda = lambda: torch.cuda.is_available() and torch.cuda.is_initialized()
atexit.register(lambda: json.dump({"peak_device": torch.cuda.max_memory_allocated() if cuda() else 0,
                                   "peak_host": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}, open(out, "w")))
if kdev:
    import fideval.model.reference.runner as rr
    from fideval.model.reference.deepseek_v41 import KERNELS
    load = rr.load_vendor_code
    def scoped(fn):
        @functools.wraps(fn)
        def run(*a, **k):
            t = next((x for x in a if isinstance(x, torch.Tensor)), None)
            with torch.device(t.device) if t is not None else contextlib.nullcontext():
                return fn(*a, **k)
        return run
    def patched(*a, **k):
        with torch.device(kdev):
            code = load(*a, **k)
        for n in [k for k in KERNELS if hasattr(code.model, k)] if not hasattr(code.model, "_bench_scoped") else ():
            setattr(code.model, n, scoped(getattr(code.model, n)))
        code.model._bench_scoped = True
        return code
    rr.load_vendor_code = patched
sys.argv = ["fideval", *sys.argv[3:]]
from fideval.cli import main
main()
"""


def release_config(scale: str, layers: int | None, vocab: int | None, bucket: int | None) -> dict:
    cfg = {**json.loads((V41 / "config.json").read_text()), **(SMALL if scale == "small" else {})}
    cfg["vocab_size"], cfg["engram_vocab_size"] = vocab or cfg["vocab_size"], bucket or (50 if scale == "small" else 100_000)
    return {**cfg, "n_layers": layers or default_layers(cfg)}


def layer_kinds(cfg: dict) -> list[str]:
    """What each layer of the prefix is, by the release's layout (compress_ratios, kv/index sources, Engram)."""
    out = []
    for i in range(cfg["n_layers"]):
        r = cfg["compress_ratios"][i]
        k = ["window"] if r == 0 else [f"compressed-KV {'owner' if i in cfg['kv_source_layers'] else 'reader'} (ratio {r})"]
        k += ["index source"] * (i in cfg["index_source_layers"]) + ["engram"] * (i in cfg["engram_layer_ids"])
        out.append(", ".join(k))
    return out


def default_layers(cfg: dict) -> int:
    for n in range(1, len(cfg["compress_ratios"]) + 1):
        kinds = " ".join(layer_kinds({**cfg, "n_layers": n}))
        if all(w in kinds for w in ("engram", "owner", "reader")):
            return n
    raise SystemExit("config.json's layout has no prefix with an Engram layer, a compressed-KV owner and a reader")


def vendor_tensors(cfg: dict) -> tuple[dict, list[tuple[str, list]], dict]:
    """The vendor's own parameters (meta device, no memory): config with the Engram rows filled in, the stored
    tensors per shard [(file, [(name, st dtype, shape, kind, arg)])], and the in-memory bytes per layer."""
    from fideval.model.reference.code import load_vendor_code

    code = load_vendor_code(V41, trust=True)
    m, eng = code.model, code.module("engram")
    fields = {f.name for f in dataclasses.fields(m.ModelArgs)}
    kw = {k: tuple(v) if isinstance(v, list) else v for k, v in cfg.items() if k in fields}
    kw.update(max_batch_size=1, max_seq_len=64)
    layout = eng.EngramLayout.from_args(m.ModelArgs(**{**kw, "engram_num_embeddings": (1,) * len(cfg["engram_layer_ids"])}))
    cfg = {**cfg, "engram_num_embeddings": [int(sum(sum(p) for p in layer)) for layer in layout.primes]}
    args = m.ModelArgs(**{**kw, "engram_num_embeddings": tuple(cfg["engram_num_embeddings"])})
    layout = eng.EngramLayout.from_args(args)
    saved = (m.world_size, m.rank, m.default_dtype)
    m.world_size, m.rank, m.default_dtype = 1, 0, torch.float8_e4m3fn
    shards, mem = [], {}
    try:
        with torch.device("meta"), m.set_dtype(torch.bfloat16):
            mods = [("model-embed-head.safetensors", [(m.ParallelEmbedding(args.vocab_size, args.dim), "embed."),
                                                      (m.ParallelHead(args.vocab_size, args.dim), "head."),
                                                      (m.RMSNorm(args.dim), "norm.")])]
            mods += [(f"model-layer{i:02d}.safetensors", [(m.Block(i, args, layout), f"layers.{i}.")]) for i in range(args.n_layers)]
            for fname, parts in mods:
                items = []
                for mod, prefix in parts:
                    for name, p in mod.named_parameters():
                        items += stored(prefix + name, p)
                        if prefix.startswith("layers.") and "engram.embed." not in name:  # the table: host rows
                            mem[prefix] = mem.get(prefix, 0) + p.numel() * p.element_size()
                shards.append((fname, items))
    finally:
        m.world_size, m.rank, m.default_dtype = saved
        m.precompute_freqs_cis.cache_clear()  # it cached meta tensors
    return cfg, shards, mem


def _e8m0(target: float) -> int:
    return 127 + round(math.log2(target))


def stored(name: str, p: torch.Tensor) -> list[tuple]:
    """The release's tensors for one vendor parameter (its scale comes with the weight), values' kind and scale."""
    if name.endswith(".scale"):
        return []
    leaf, shape = name.rsplit(".", 1)[-1], tuple(p.shape)
    if p.dtype == torch.float4_e2m1fn_x2:  # [out, in/2] bytes, [out, in/32] E8M0: weights ~ N(0, 1/in)
        k = 2 * shape[1]
        return [(name, "I8", shape, "bytes", 0), (name[:-6] + "scale", "F8_E8M0", (shape[0], k // 32), "const",
                                                  _e8m0(1 / (FP4_RMS * math.sqrt(k))))]
    if p.dtype == torch.float8_e4m3fn and ".engram.embed." in name:  # rows ~ N(0, 1): codes ~ N(0, 32), scale 2^-5
        return [(name, "F8_E4M3", shape, "fp8", 32.0), (name[:-6] + "scale", "F8_E8M0", (shape[0], shape[1] // 32), "const", 122)]
    if p.dtype == torch.float8_e4m3fn:  # codes ~ N(0, 2) x a power of two near 1 / (2 sqrt(in))
        return [(name, "F8_E4M3", shape, "fp8", 2.0), (name[:-6] + "scale", "F8_E8M0", (-(-shape[0] // 32), -(-shape[1] // 32)),
                                                       "const", _e8m0(1 / (2 * math.sqrt(shape[1]))))]
    rule = next((r for test, *r in FLOATS if test(name, leaf)), None)
    if rule is None:  # linear weights kept in float (the head, wo_a, the router...): bf16 in the release
        return [(name, "BF16", shape, "randn", (0.0, shape[-1] ** -0.5))]
    kind, arg = rule  # the hyper-connection mixes ~ N(0, 0.64) at any width, as the tiny fixture's at its width
    return [(name, ST[p.dtype], shape, kind, arg if arg[1] is not None else (0.0, 0.8 / math.sqrt(shape[-1])))]


def _block(st: str, shape: tuple, kind: str, arg, seed: int) -> bytes:
    """One block of rows (<= BLOCK_ELEMS values) of a tensor's stored bytes."""
    width = math.prod(shape[1:])
    rows = max(1, min(shape[0], BLOCK_ELEMS // max(width, 1)))
    g = torch.Generator().manual_seed(seed)
    n = (rows, *shape[1:])
    if kind == "bytes":
        return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()
    if kind == "const":
        return np.full(n, arg, dtype=np.uint8).tobytes()
    if kind == "fp8":
        return (torch.randn(n, generator=g) * arg).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8).numpy().tobytes()
    x = arg[0] + arg[1] * torch.randn(n, generator=g) if kind == "randn" else arg[0] + (arg[1] - arg[0]) * torch.rand(n, generator=g)
    if st == "BF16":
        return x.to(torch.bfloat16).view(torch.int16).numpy().tobytes()
    return x.float().numpy().tobytes()


def nbytes(item: tuple) -> int:
    return math.prod(item[2]) * SIZE[item[1]]


def write_checkpoint(folder: Path, cfg: dict, shards: list) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    pool, seen, weight_map, total = {}, {}, {}, 0
    for fname, items in shards:
        header, off = {}, 0
        for name, st, shape, *_ in items:
            n = nbytes((name, st, shape))
            header[name] = {"dtype": st, "shape": list(shape), "data_offsets": [off, off + n]}
            off += n
        h = json.dumps(header).encode()
        h += b" " * (-len(h) % 8)
        with open(folder / fname, "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h)
            for k, (name, st, shape, kind, arg) in enumerate(items):
                key = (st, shape[1:], kind, str(arg))  # tiled along rows: any length; 4 variants a key
                seen[key] = seen.get(key, -1) + 1
                key += (seen[key] % 4,)
                if key not in pool:
                    pool[key] = _block(st, shape, kind, arg, len(pool))
                blk, left = pool[key], nbytes((name, st, shape))
                while left > 0:
                    f.write(blk[:left])
                    left -= min(left, len(blk))
        total += off
        weight_map.update({name: fname for name, *_ in items})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    # a WordLevel tokenizer: ids 2k and 2k+1 are w<k> and W<k>, which Engram's normaliser merges; the compressed
    # vocabulary its hash is built over, as the vendor computes it
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from fideval.model.reference.code import load_vendor_code

    tok = Tokenizer(models.WordLevel({("w" if i % 2 == 0 else "W") + str(i // 2): i for i in range(cfg["vocab_size"])}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))
    tok = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    cfg["engram_compressed_vocab_size"] = load_vendor_code(V41, trust=True).module("engram").build_compressed_token_map(tok)[1]
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))
    if not (folder / "inference").exists():
        (folder / "inference").symlink_to(V41, target_is_directory=True)
    return total


def estimate(cfg: dict, shards: list, mem: dict, seqs: int, length: int) -> dict:
    """Bytes the run needs: the checkpoint (exact, from the tensor list), the hidden store (bf16 states + the bf16
    head), host memory (two layers built on the host at once -- the prefetch thread's and the computing one's --
    the embedding and the float32 head, 6 GB for the interpreter, torch and CUDA), device memory (two layers, the
    head and embedding, the activations of one sequence: the vendor's float32 GEMM accumulators and attention)."""
    ckpt = sum(nbytes(it) for _, items in shards for it in items)
    V, D = cfg["vocab_size"], cfg["dim"]
    layer = max(mem.values())
    store = seqs * length * D * 2 + V * D * 2
    act = length * (cfg["hc_mult"] * D * 8 + cfg["n_heads"] * cfg["head_dim"] * 8 + max(D, cfg["q_lora_rank"]) * 64)
    return {"checkpoint": ckpt, "store": store, "disk": ckpt + store + (2 << 30), "layer_mem": layer,
            "experts_per_layer": cfg["n_routed_experts"] * 3 * cfg["moe_inter_dim"] * D * (0.5 + 1 / 32),
            "host": 2 * layer + V * D * 6 + (6 << 30), "device": 2 * layer + V * D * 6 + act + (2 << 30)}


def refuse_if_small(est: dict, ckpt: Path, written: bool, device: str) -> list[str]:
    """One line (SystemExit) when the disk, the host memory or the GPU cannot hold the run; else what each has. The
    checkpoint is not counted when written already; a stale one (another config) is counted free (it is replaced)."""
    stale = sum(p.stat().st_size for p in ckpt.glob("*.safetensors")) if not written else 0
    free, work = shutil.disk_usage(ckpt.parent).free + stale, ckpt.parent
    need = est["disk"] - (est["checkpoint"] if written else 0)
    info = Path("/proc/meminfo").read_text().splitlines() if Path("/proc/meminfo").is_file() else []
    avail = next((int(ln.split()[1]) * 1024 for ln in info if ln.startswith("MemAvailable:")), None)
    gpu = torch.cuda.get_device_properties(0).total_memory if device == "cuda" else None
    for what, have, want in (("disk", free, need), ("host memory", avail, est["host"]), ("GPU memory", gpu, est["device"])):
        if have is not None and have < want:
            raise SystemExit(f"refused: the run needs {want / 1e9:.1f} GB of {what}, {have / 1e9:.1f} GB available "
                             f"({work if what == 'disk' else device}); use fewer --layers, --seqs or a smaller --engram-bucket")
    return [f"disk {free / 1e9:.0f} GB free", f"host {avail / 1e9:.0f} GB available" if avail else "host ?",
            f"GPU {gpu / 1e9:.0f} GB" if gpu else "no GPU"]


def run_verb(args: list[str], work: Path, name: str, kernel_device: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), "PYTHONUNBUFFERED": "1"}
    peak = work / f"peak-{name}.json"
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-c", CHILD, str(peak), kernel_device, *args], capture_output=True, text=True,
                         env=env, cwd=ROOT)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"fideval {args[0]} failed ({res.returncode}): {res.stderr[-3000:]}")
    print(f"fideval {args[0]} ({wall:.1f} s): {res.stdout.strip()[-400:]}", flush=True)
    out = json.loads(peak.read_text()) if peak.is_file() else {}
    return {"process_s": wall, "stdout": res.stdout.strip()[-2000:], **out}


def write_run_config(path: Path, model: Path, device: str, candidate: str) -> None:
    (path.parent / "unused.jsonl").write_text('{"text": "unused: the bench writes its token windows itself"}\n')
    path.write_text(f"""run: v41-layers
model: {{path: {model}, id: bench/deepseek-v4.1-flash-layers, revision: local, implementation: reference, trust_remote_code: true}}
domains:
  - name: web
    source: {{type: local, path: {path.parent / 'unused.jsonl'}, text_field: text}}
teacher: {{device: {device}, dtype: bfloat16}}
candidates:
  - name: {candidate}
    quant: {{{CANDIDATES[candidate]}}}
    paths: [serving]
""")


def per_token(p: dict, tokens: int, n_layers: int) -> dict:
    """A verb's profile as per-token seconds: the layers (wall less the head, the load wait, startup, once-a-run and
    store / scoring parts) and the head; the once-a-run seconds; the load wait a layer (once a pass and chunk)."""
    parts = p.get("parts") or {}
    layers = p["wall_s"] - sum(parts.get(k, 0.0) for k in NOT_LAYERS + ("load_wait",))
    return {"layer_s_per_token": layers / tokens, "head_s_per_token": parts.get("head", 0.0) / tokens,
            "fixed_s": sum(parts.get(k, 0.0) for k in ev.ONCE + ("startup",)),
            "load_s_per_layer": parts.get("load_wait", 0.0) / n_layers,
            "layer_s_per_token_per_layer": layers / tokens / n_layers}


def extrapolate(cfg: dict, real: dict, measured: dict, length: int, peak: float) -> dict:
    """The seed's compute on this path: per length, pass = once-a-run + 40 x load wait a layer + T x (layer s/token
    x F_layers(40 layers, L) / F_layers(bench, L_bench) + head s/token x F_head / F_head,bench); seed = sum over
    lengths of teacher + 2 candidate passes; its ceiling the same FLOPs at the dense bf16 peak."""
    fb = ev.v41_flash_flops_per_token(cfg, length)
    out = {"lengths": {}, "seconds": 0.0, "ceiling_s": 0.0}
    for L, rows in ev.SEED_ROWS.items():
        T = rows // (L - 1) * L
        f = ev.v41_flash_flops_per_token(real, L)
        passes = {role: m["fixed_s"] + 40 * m["load_s_per_layer"] + T * (m["layer_s_per_token"] * f["layers"] / fb["layers"] +
                                            m["head_s_per_token"] * f["head"] / fb["head"]) for role, m in measured.items()}
        out["lengths"][L] = passes
        out["seconds"] += passes["teacher"] + 2 * passes["candidate"]
        out["ceiling_s"] += 3 * T * (f["layers"] + f["head"]) / peak
    return out


def transform_probe(cfg: dict) -> dict:
    """The MXFP4 candidate's host-side load of one routed expert tensor at this config's size, timed once: the
    loader's probe (deepseek_v41_weights.fp4_unchanged: the stored FP4 kept), and for comparison what it replaces
    (dequantize, the quant transform, re-encode into FP4, all float32 on the host)."""
    from fideval.model.execution.transforms import transform_weight
    from fideval.model.reference.deepseek_v41_weights import dequantize, fp4_unchanged, reencode
    from fideval.quant.spec import compile_spec

    spec = compile_spec({"routed_experts": {"format": "mxfp4", "recipe": "rceil"}})
    n, k = cfg["moe_inter_dim"], cfg["dim"]
    q = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    sc = torch.full((n, k // 32), 119, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    name = "layers.0.ffn.experts.0.w1.weight"
    t0 = time.perf_counter()
    kept = fp4_unchanged(spec.weight_transform, "routed_experts", name, q, sc)
    probe = time.perf_counter() - t0
    t0 = time.perf_counter()
    reencode(transform_weight(spec.weight_transform, "routed_experts", name, dequantize(q, sc)), torch.float4_e2m1fn_x2)
    s = time.perf_counter() - t0
    per_layer = (probe if kept else s) * 3 * cfg["n_routed_experts"]
    return {"kept": kept, "probe_s": probe, "s_per_tensor": s, "s_per_layer": per_layer, "seed_h": per_layer * 40 / 3600,
            "threads": torch.get_num_threads()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", choices=["real", "small"], default="real")
    ap.add_argument("--dir", default="/tmp/fideval-v41-layers")
    ap.add_argument("--json", default=None, help="write the figures here (bench/evaluation.py --v41-layers reads it)")
    ap.add_argument("--layers", type=int, default=None, help="n_layers (default: the shortest prefix with Engram, owner, reader)")
    ap.add_argument("--seqs", type=int, default=2, help="sequences")
    ap.add_argument("--length", type=int, default=None, help="tokens a sequence (default 2,048; small 32)")
    ap.add_argument("--vocab", type=int, default=None, help="vocabulary (default the release's 129,280; small 512)")
    ap.add_argument("--engram-bucket", type=int, default=None, help="Engram rows per (n-gram, head) bucket (100,000; small 50)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--kernel-device", default="off", help="off (default): the verbs as users run them (the driver puts "
                    "the vendored kernel_cpu.py on the device itself); DEV or auto: this bench's earlier workaround as well "
                    "(the vendor's code imported under torch.device(DEV) in the verbs' processes), for comparison only")
    ap.add_argument("--candidate", choices=sorted(CANDIDATES), default="mxfp4-experts",
                    help="mxfp4-experts (the seed's: the released FP4 experts kept as stored), or fp8-attention")
    ap.add_argument("--estimate", action="store_true", help="print what the run needs and exit")
    a = ap.parse_args()
    small, device, t_all = a.scale == "small", a.device, time.perf_counter()
    kdev = {"off": "", "auto": "" if device == "cpu" else device}.get(a.kernel_device, a.kernel_device)
    seqs, length = a.seqs, a.length or (32 if small else 2048)
    cand = a.candidate
    work = Path(a.dir)
    work.mkdir(parents=True, exist_ok=True)
    ckpt = work / f"ckpt-{a.scale}"
    cfg, shards, mem = vendor_tensors(release_config(a.scale, a.layers, a.vocab, a.engram_bucket))
    kinds, est = layer_kinds(cfg), estimate(cfg, shards, mem, seqs, length)
    old = json.loads((ckpt / "config.json").read_text()) if (ckpt / "config.json").is_file() else {}
    written = {**old, "engram_compressed_vocab_size": 0} == {**cfg, "engram_compressed_vocab_size": 0}
    print(f"{cfg['n_layers']} layers ({'; '.join(f'{i}: {k}' for i, k in enumerate(kinds))}); needs: disk "
          f"{est['disk'] / 1e9:.1f} GB (checkpoint {est['checkpoint'] / 1e9:.1f}, store {est['store'] / 1e9:.2f}), host "
          f"{est['host'] / 1e9:.1f} GB, GPU {est['device'] / 1e9:.1f} GB; per layer {est['layer_mem'] / 1e9:.2f} GB "
          f"(experts {est['experts_per_layer'] / 1e9:.2f} GB FP4 + scales)", flush=True)
    have = refuse_if_small(est, ckpt, written, device)
    if a.estimate:
        return print("fits: " + ", ".join(have))
    if not written:
        shutil.rmtree(ckpt, ignore_errors=True)
        t0 = time.perf_counter()
        write_checkpoint(ckpt, cfg, shards)
        print(f"wrote {est['checkpoint'] / 1e9:.1f} GB in {time.perf_counter() - t0:.1f} s", flush=True)
    cfg = json.loads((ckpt / "config.json").read_text())
    tokens = ev.write_windows(work / "windows", cfg["vocab_size"], seqs, length)
    run_cfg, store, rec = work / "run.yaml", work / "teacher", work / "records"
    write_run_config(run_cfg, ckpt, device, cand)
    for p in (store, rec):
        shutil.rmtree(p, ignore_errors=True)
    t = run_verb(["teacher", "--config", str(run_cfg), "--windows", str(tokens), "--out", str(store), "--lengths", "cuts",
                  "--device", device, "--store", "hidden"], work, "teacher", kdev)
    meta = json.loads((store / "manifest.json").read_text()).get("meta", {})
    t["profile"], t["settings"] = json.loads(meta.get("profile", "{}")), json.loads(meta.get("teacher", "{}"))
    t["store_bytes"] = sum(p.stat().st_size for p in store.rglob("*") if p.is_file())
    c = run_verb(["score", "--teacher", str(store), "--config", str(run_cfg), "--candidate", cand, "--path", "serving",
                  "--out", str(rec), "--device", device], work, "candidate", kdev)
    sj = json.loads((rec / "score.json").read_text())
    c.update(profile=sj.get("profile") or {}, rows=sj.get("rows"), mean_kld=ev._records_kld(rec / "records.parquet"),
             kernels=((sj.get("candidate_info") or {}).get("run_settings") or {}).get("reference_code", {}).get("kernels"))
    ver = subprocess.run([sys.executable, "-m", "fideval", "verify", str(store)], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    fb = ev.v41_flash_flops_per_token(cfg, length)
    measured = {role: {**per_token(v["profile"], v["profile"].get("tokens") or seqs * length, cfg["n_layers"]), "L": length,
                       "n_layers": cfg["n_layers"], "f_layers": fb["layers"], "f_head": fb["head"]}
                for role, v in (("teacher", t), ("candidate", c))}
    result = {"scale": a.scale, "device": torch.cuda.get_device_name() if device == "cuda" else device, "seqs": seqs,
              "length": length, "tokens": seqs * length, "candidate_name": cand, "kernel_device": kdev or None,
              "config": {k: cfg[k] for k in ("n_layers", "dim", "vocab_size", "n_routed_experts", "moe_inter_dim",
                                             "engram_num_embeddings")},
              "layers": [{"index": i, "kind": k} for i, k in enumerate(kinds)], "estimate": est, "checkpoint": str(ckpt),
              "store": str(store), "verify": {"ok": ver.returncode == 0, "out": (ver.stdout + ver.stderr)[-500:]}, "teacher": t,
              "candidate": c, "v41_layers": measured, "mxfp4_transform": transform_probe(cfg),
              "extrapolation": extrapolate(cfg, json.loads((V41 / "config.json").read_text()), measured, length, ev.PEAK)}
    result["wall_s"] = time.perf_counter() - t_all
    for f in filter(None, (a.json, work / "result.json")):
        Path(f).write_text(json.dumps(result, indent=1, default=str))
    print_table(result, fb["layers"] + fb["head"], have, device == "cuda")


def print_table(r: dict, f_tok: float, have: list[str], gpu: bool) -> None:
    t, c, est, x, mx, gb = r["teacher"], r["candidate"], r["estimate"], r["extrapolation"], r["mxfp4_transform"], 1e9

    def mfu(p):
        ours = f"{p['flop_utilisation']:.2%} (fideval.model.flops)" if p.get("flop_utilisation") is not None else "n/a"
        return f"{ours}; {p['tokens_per_s'] * f_tok / ev.PEAK:.2%} (analytic, bench/evaluation.py)" if gpu else "n/a (CPU)"

    rows = [("checkpoint (V4.1-Flash release layout: FP4 experts + E8M0, FP8 linears + 32x32 E8M0, Engram FP8 rows)",
             f"{est['checkpoint'] / gb:.2f} GB, {r['config']['n_layers']} layers: " + "; ".join(f"{d['index']} {d['kind']}" for d in
                                                                                         r["layers"]) +
             f"; Engram rows {r['config']['engram_num_embeddings']}", f"estimate: disk {est['disk'] / gb:.1f} GB, host "
             f"{est['host'] / gb:.1f} GB, GPU {est['device'] / gb:.1f} GB ({', '.join(have)})")]
    for role, v, what in (("teacher", t, "fideval teacher, reference, hidden store"),
                          ("candidate", c, f"fideval score --config, {r['candidate_name']}, serving")):
        p = v["profile"]
        rows += [(f"{role} ({what}): tokens/s over {r['seqs']} x {r['length']}",
                  f"{p.get('tokens_per_s') or 0:,.1f} ({p['wall_s']:.1f} s run, {v['process_s']:.1f} s process)" +
                  (f", {v['rows']:,} rows, mean KLD {v['mean_kld']:.4g}" if role == "candidate" else ""),
                  f"{ev.PEAK / f_tok:,.0f} (dense bf16 peak / analytic FLOPs a token)"),
                 (f"{role}: model FLOP utilisation", mfu(p), "100 % of 989 TFLOP/s"),
                 (f"{role}: time per part", ev.parts_line(p), "parts sum to the wall"),
                 (f"{role}: per layer and token (wall less head, load wait, once-a-run, store and scoring parts)",
                  f"{r['v41_layers'][role]['layer_s_per_token_per_layer'] * 1e6:,.1f} us; load wait "
                  f"{r['v41_layers'][role]['load_s_per_layer']:.1f} s a layer", "")]
    rows += [("peak device memory (torch allocator): teacher / candidate",
              f"{t.get('peak_device', 0) / gb:.2f} / {c.get('peak_device', 0) / gb:.2f} GB", f"estimate {est['device'] / gb:.1f} GB"),
             ("peak host memory (max RSS): teacher / candidate", f"{t.get('peak_host', 0) / gb:.2f} / {c.get('peak_host', 0) / gb:.2f} GB",
              f"estimate {est['host'] / gb:.1f} GB"),
             ("teacher store on disk (hidden states bf16 + head)", f"{t['store_bytes'] / gb:.3f} GB; fideval verify: "
              f"{'passes' if r['verify']['ok'] else 'FAILED'}", f"estimate {est['store'] / gb:.3f} GB"),
             ("MXFP4 experts candidate: host-side load of one expert tensor (the loader's probe; what it replaces: "
              "dequantize, MXFP4, re-encode)", f"{'kept as stored' if mx['kept'] else 'transformed'}, probe "
              f"{mx['probe_s'] * 1e3:.1f} ms ({mx['threads']} threads), against {mx['s_per_tensor']:.2f} s; "
              f"{mx['s_per_layer'] / 60:,.2f} min a layer, {mx['seed_h']:,.2f} h for 40 layers a candidate pass",
              "hidden behind a layer's compute (prefetch)")]
    rows += [(f"extrapolation, seed L={L} (40 layers): teacher / candidate pass",
              f"{p['teacher'] / 60:,.1f} / {p['candidate'] / 60:,.1f} min", "") for L, p in x["lengths"].items()]
    rows.append(("extrapolation: seed compute on the reference path (teacher + 2 candidate passes a length)",
                 f"{x['seconds'] / 3600:,.2f} h" + (" (from small-scale layers: not a real figure)" if r["scale"] == "small" else ""),
                 f"{x['ceiling_s'] / 60:,.1f} min at 100 % of the bf16 peak"))
    ev.print_table(rows, f"bench/v41_layers.py ({r['scale']}) on {r['device']} ({r['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
