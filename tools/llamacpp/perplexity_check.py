"""llama-perplexity's mean KLD of llama-quantize's GGUFs against fideval's ``llamacpp`` and ``weights-only`` paths on
the same tokens and the same teacher (run once, by hand; CI has no llama.cpp).

    cmake -S $SRC -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
          -DLLAMA_BUILD_SERVER=OFF
    cmake --build build -j2 --target llama-perplexity llama-quantize
    python tools/llamacpp/perplexity_check.py --llama-cpp $SRC --bin build/bin

``$SRC`` is the llama.cpp that llama-cpp-python 0.3.36 vendors. For each model of :data:`MODELS` -- ``deepseek2``
(``tests/data/llamacpp/moe/deepseek_v3``'s DeepSeek-V3: MLA with the ``kv_b`` split, routed and shared experts,
hidden 256) and ``llama`` (a one-layer llama, written here, whose every linear's input width is 256, so
llama-quantize's K-quant types are K-quants, not the legacy fallbacks rows of 32/96/128 get) -- the script

1. converts the float16 reference with llama.cpp's own ``convert_hf_to_gguf.py`` model class to F32
   (:func:`convert`: placeholder tokens for the vocabulary, as ``moe_ggufs.py``, plus one merge so that llama.cpp
   loads it, no BOS added) and makes each mix of :data:`MIXES` with ``llama-quantize`` (legacy Q8_0 and Q4_0,
   K-quant Q4_K_M and Q6_K: at 6 bits the activations' format is visible beside the weights' error);
2. runs fideval's teacher (the runner on the reference folder, float32) over :data:`N_CHUNK` seeded random chunks of
   :data:`N_CTX` tokens, writes it as a store and ``fideval export-llamacpp`` makes the teacher file ``base.kld``;
   llama.cpp's own float32 logits of the F32 GGUF (``dump_logits.cpp``) are exported the same way
   (``base-llamacpp.kld``, a second teacher, to show what ggml's float32 forward adds); the build's default KV
   cache (F16) is used, as llama-perplexity uses it;
3. runs ``llama-perplexity --kl-divergence-base base.kld --kl-divergence`` on each quantized GGUF (``-c N_CTX
   -b N_CTX -t 2``, the CPU backend, flash attention as the build's default, ``auto``, and again with ``-fa off``)
   and keeps what it printed;
4. scores the same GGUF with fideval (:func:`fideval_kld`): ``GGUFCheckpoint`` read by the runner, on the
   ``llamacpp`` path (``fideval.quant.ggml_path``'s hooks, as ``fideval score --path llamacpp`` builds them) and on
   ``weights-only``, over the same chunks, scored by ``score_candidate`` against ``base.kld`` imported as a store
   (llama.cpp's positions ``N_CTX/2 .. N_CTX-2``);
5. keeps llama.cpp's own per-row KLDs of each GGUF (``dump_logits.cpp`` on the quantized file, library defaults, the
   same rows; their mean is the printed figure), so the test can tell rows where a router flipped in one engine and
   not the other from the rest.

Output, ``tests/data/llamacpp/perplexity/``: per model ``config.json`` (the llama) or ``reference.json`` (naming the
``moe/`` folder), ``base.kld``, ``base-llamacpp.kld``, ``<MIX>.gguf`` and ``llama_rows.npy`` (float32 per-row KLD, one row per
mix in ``llama_rows_order``); and ``llama_perplexity.json`` (every printed statistic, both teachers, both attention settings, with fideval's
figures beside them as measured then).
``tests/test_llamacpp_perplexity.py`` re-scores the GGUFs with fideval and compares with the printed mean KLD and the
per-row KLDs. The build here: ``-DGGML_OPENMP=OFF`` was added (threads, not bits); ``torch.set_num_threads(1)`` makes
fideval's figures reproducible to the bit (rerunning rewrites every fixture file byte for byte).
Nothing of llama.cpp is copied into the repository.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "llamacpp" / "perplexity"
MOE = ROOT / "tests" / "data" / "llamacpp" / "moe"
MIXES = ("Q8_0", "Q4_0", "Q4_K_M", "Q6_K")
MODELS = ("deepseek2", "llama")
N_CTX, N_CHUNK, SEED = 128, 8, 47  # 8 x 63 scored rows
if str(ROOT) not in sys.path:  # fideval from this checkout
    sys.path.insert(0, str(ROOT))


def llama_config():
    import transformers as tf

    return tf.LlamaConfig(vocab_size=64, hidden_size=256, intermediate_size=256, num_hidden_layers=1,
                          num_attention_heads=4, num_key_value_heads=1, head_dim=64, rms_norm_eps=1e-6,
                          max_position_embeddings=256, tie_word_embeddings=False, bos_token_id=0, eos_token_id=1)


def save_reference(name: str, folder: Path, seed: int = 0) -> None:
    """The float16 reference folder: the DeepSeek-V3 of ``moe/``, or the llama of :func:`llama_config` with
    ``mix_ggufs``' random weights (norms 1 + 0.1 N(0,1), the rest 0.1 N(0,1))."""
    if name == "deepseek2":
        shutil.copytree(MOE / "deepseek_v3", folder)
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from mix_ggufs import save_random

    save_random(llama_config(), folder, seed)


def convert(llama_cpp: Path, folder: Path, out: Path) -> None:
    """``convert_hf_to_gguf.py folder --outtype f32`` (``moe_ggufs.convert``) with one merge (llama.cpp refuses to
    load a BPE vocabulary without merges; llama-quantize never loads it) and no BOS added (llama-perplexity then
    evaluates each chunk's own first token, as fideval's teacher does)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from moe_ggufs import convert as convert_hf

    convert_hf(llama_cpp, folder, out, outtype="f32", merges=("<t0 > <t1>",), add_bos=False)


def reference_of(folder: Path) -> Path:
    """A fixture folder's reference (its own config.json, or the folder reference.json names)."""
    link = folder / "reference.json"
    return ROOT / json.loads(link.read_text())["reference"] if link.exists() else folder


def write_store(root: Path, tokens: np.ndarray, rows: list[np.ndarray], row_start: int, model_id: str, vocab: int,
                kind: str = "logits") -> None:
    from fideval.store import StoreWriter

    w = StoreWriter(root, {"model_id": model_id, "model_revision": "local", "tokenizer_sha256": "0" * 64,
                           "vocab_size": vocab, "kind": kind})
    for k, x in enumerate(rows):
        sid = f"c-{k:03d}"
        w.write(sid, x, tokens[k].astype(np.int32), window_id=sid, domain="c", row_start=row_start)
    w.finish()


def run_logits(weights, tokens: np.ndarray, act=None) -> list[np.ndarray]:
    """The runner's float32 logits [n_ctx, vocab] per chunk (one torch thread, the bits independent of it)."""
    from fideval.model.runner import Runner, RunnerOptions

    r = Runner(weights, RunnerOptions(micro_batch=2, act_transform=act))
    return [np.asarray(x.float().numpy() if hasattr(x, "numpy") else x) for _, x in r.run(tokens, canary=False)]


def fideval_kld(gguf_path: Path, reference: Path, base_kld: Path, path: str, work: Path) -> dict:
    """fideval's scoring of ``gguf_path`` (a real GGUF candidate) on ``path`` (``llamacpp`` or ``weights-only``) over
    ``base_kld``'s chunks against ``base_kld`` as the teacher, on llama.cpp's rows: ``{"mean_kld", "top1", "rows"}``."""
    import polars as pl

    from fideval.model.weights.gguf_checkpoint import GGUFCheckpoint
    from fideval.quant import ggml_path
    from fideval.score.candidate import from_store
    from fideval.score.run import score_candidate
    from fideval.store import StoreReader
    from fideval.store.llamacpp import KldBase, import_llamacpp

    base = KldBase(base_kld)
    teacher_dir = work / "teacher"
    if not (teacher_dir / "manifest.json").exists():
        import_llamacpp(base_kld, teacher_dir, model_id="perplexity-check", domain="c")
    teacher = StoreReader(teacher_dir)
    ckpt = GGUFCheckpoint(gguf_path, reference)
    act = ggml_path.act_transform(ggml_path.for_checkpoint(ckpt)) if path == "llamacpp" else None
    tokens = np.array(base.tokens)
    logits = run_logits(ckpt, tokens, act or None)
    cand = work / f"cand-{path}"
    write_store(cand, tokens, [x[base.first:base.n_ctx - 1] for x in logits], base.first, "perplexity-check",
                base.n_vocab)
    rec_dir = work / f"rec-{path}"
    score_candidate(teacher, from_store(StoreReader(cand), teacher, gguf_path.stem, "store"), rec_dir)
    rec = pl.read_parquet(rec_dir / "records.parquet")
    return {"mean_kld": float(rec["kld"].mean()), "top1": float(rec["top1"].mean()), "rows": len(rec)}


def row_kld(base_kld: Path, logits: np.ndarray) -> np.ndarray:
    """Per-row KLD of float32 logits ``[rows, vocab]`` (llama.cpp's, of the scored rows in chunk order) against
    ``base_kld``'s decoded log-probs, llama-perplexity's way (the base row as stored, the candidate's exact log-softmax):
    float64 [n_chunk * rows]. Its mean is llama-perplexity's printed mean KLD."""
    from fideval.store.llamacpp import KldBase

    base = KldBase(base_kld)
    p = np.concatenate([base.logprobs(k) for k in range(base.n_chunk)]).astype(np.float64)
    x = logits.reshape(-1, base.n_vocab).astype(np.float64)
    top = x.max(1, keepdims=True)
    q = x - top - np.log(np.exp(x - top).sum(1, keepdims=True))
    return (np.exp(p) * (p - q)).sum(1)


def export(store: Path, out: Path, *more: str) -> None:
    subprocess.run([sys.executable, "-m", "fideval", "export-llamacpp", str(store), str(out), *more], check=True,
                   capture_output=True)


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from export_check import parse_stats, perplexity
    from mix_ggufs import quantize

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-cpp", type=Path, required=True, help="llama.cpp source tree (convert_hf_to_gguf.py, gguf-py/)")
    ap.add_argument("--bin", type=Path, required=True, help="folder holding llama-perplexity, llama-quantize, libllama")
    ap.add_argument("--only", nargs="*", default=list(MODELS))
    ap.add_argument("--work", type=Path, default=None)
    a = ap.parse_args()
    import torch

    torch.set_num_threads(1)  # the runner's float32 bits depend on the thread count (CPU GEMM blocking)
    src = a.llama_cpp.resolve()
    work = a.work or Path(tempfile.mkdtemp(prefix="perplexity-check-"))
    work.mkdir(parents=True, exist_ok=True)
    dump = work / "dump_logits"
    if not dump.exists():
        subprocess.run(["g++", "-O2", "-std=c++17", f"-I{src / 'include'}", f"-I{src / 'ggml' / 'include'}",
                        str(Path(__file__).parent / "dump_logits.cpp"), f"-L{a.bin}", "-lllama",
                        f"-Wl,-rpath,{a.bin.resolve()}", "-o", str(dump)], check=True)
    record_path = OUT / "llama_perplexity.json"
    record = json.loads(record_path.read_text()) if record_path.exists() else {}
    record.update({"source": "tools/llamacpp/perplexity_check.py: llama-perplexity (llama-cpp-python 0.3.36's llama.cpp, "
                   f"CPU, AVX2 build) -c {N_CTX} -b {N_CTX} -t 2 --kl-divergence of each GGUF against base.kld "
                   "(fideval's float32 teacher, exported) and base-llamacpp.kld (llama.cpp's own F32 GGUF logits, "
                   "exported); 'fa_off': the same with -fa off", "n_ctx": N_CTX, "n_chunk": N_CHUNK})
    models = record.setdefault("models", {})
    for seed, name in enumerate(MODELS):
        if name not in a.only:
            continue
        w = work / name
        w.mkdir(parents=True, exist_ok=True)
        ref, f32, dest = w / "ref", w / "f32.gguf", OUT / name
        if not (ref / "config.json").exists():
            save_reference(name, ref, seed)
        if not f32.exists():
            convert(src, ref, f32)
        dest.mkdir(parents=True, exist_ok=True)
        if name == "deepseek2":
            (dest / "reference.json").write_text(json.dumps({"reference": "tests/data/llamacpp/moe/deepseek_v3"}) + "\n")
        else:
            shutil.copy(ref / "config.json", dest / "config.json")
        cfg = json.loads((ref / "config.json").read_text())
        vocab = int(cfg["vocab_size"])
        tokens = np.random.default_rng(SEED + seed).integers(0, vocab, size=(N_CHUNK, N_CTX)).astype(np.int32)
        # fideval's teacher: the runner on the float16 reference, float32
        write_store(w / "teacher", tokens, run_logits(ref, tokens), 0, name, vocab)
        export(w / "teacher", dest / "base.kld")
        # llama.cpp's own float32 logits of the F32 GGUF on the same chunks
        subprocess.run([str(dump), str(f32), str(dest / "base.kld"), str(w / "ref.f32"), "2"], check=True,
                       capture_output=True)
        first = N_CTX // 2
        rows = np.fromfile(w / "ref.f32", "<f4").reshape(N_CHUNK, N_CTX - 1 - first, vocab)
        write_store(w / "llama-rows", tokens, list(rows), first, name, vocab)
        export(w / "llama-rows", dest / "base-llamacpp.kld")
        out = models.setdefault(name, {})
        rows_of = {}
        for mix in MIXES:
            cand = dest / f"{mix}.gguf"
            quantize(a.bin, f32, cand, mix)
            # llama.cpp's own logits of the build on the scored rows (library defaults, as llama-perplexity's): the
            # per-row KLDs whose mean llama-perplexity prints, kept so the test can tell flipped rows from the rest
            subprocess.run([str(dump), str(cand), str(dest / "base.kld"), str(w / f"{mix}.f32"), "2"], check=True,
                           capture_output=True)
            rows_of[mix] = row_kld(dest / "base.kld", np.fromfile(w / f"{mix}.f32", "<f4"))
            printed = {}
            for base in ("base.kld", "base-llamacpp.kld"):
                for fa in ("auto", "off"):
                    log = perplexity(a.bin, "-m", str(cand), "-fa", fa, "--kl-divergence-base", str(dest / base),
                                     "--kl-divergence", n_ctx=N_CTX)
                    printed[f"{base}{'' if fa == 'auto' else ' fa_off'}"] = parse_stats(log)
            fid = {}
            for path in ("llamacpp", "weights-only"):
                sub = w / f"score-{mix}-{path}"
                shutil.rmtree(sub, ignore_errors=True)
                sub.mkdir()
                fid[path] = fideval_kld(cand, ref, dest / "base.kld", path, sub)
            lp = printed["base.kld"]["mean"]
            out[mix] = {"llama_perplexity": printed, "fideval_at_write": fid, "bytes": cand.stat().st_size,
                        "llama_rows_mean": float(rows_of[mix].mean())}
            print(f"{name} {mix}: llama-perplexity mean KLD {lp:.6f} (fa off {printed['base.kld fa_off']['mean']:.6f}; "
                  f"own F32 base {printed['base-llamacpp.kld']['mean']:.6f}), fideval llamacpp "
                  f"{fid['llamacpp']['mean_kld']:.6f} ({fid['llamacpp']['mean_kld'] / lp - 1:+.2%}), weights-only "
                  f"{fid['weights-only']['mean_kld']:.6f} ({fid['weights-only']['mean_kld'] / lp - 1:+.2%})", flush=True)
        np.save(dest / "llama_rows.npy", np.stack([rows_of[mix] for mix in MIXES]).astype(np.float32))
        record.setdefault("llama_rows_order", list(MIXES))
        record_path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
