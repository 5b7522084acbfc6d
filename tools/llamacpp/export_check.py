"""Check ``fideval export-llamacpp`` against llama-perplexity once, and write the llama.cpp parity fixture (by hand).

    python tools/llamacpp/export_check.py --llama-cpp $SRC --bin build/bin      # see mix_vectors.py for the build

On a tiny llama (random weights, a 320-token byte-level BPE trained on the demo corpus, so the files stay small):

1. llama.cpp's converter writes it as an F32 GGUF (the reference) and ``llama-quantize`` makes the candidate
   (``--mix``: Q8_0 and Q4_K_M by default);
2. ``llama-perplexity --kl-divergence-base`` on the demo text writes llama.cpp's own teacher file (``base.kld``)
   and each candidate's (``cand-<mix>.kld``); ``--kl-divergence`` scores the candidate against ``base.kld``;
3. fideval's teacher: the same model in transformers (float32) on ``base.kld``'s token ids, written as a fideval
   store and exported with ``fideval export-llamacpp``; llama-perplexity scores the candidate against it;
4. fideval's own figures for the same candidate: its GGUF loader (``fideval.model.weights.gguf_checkpoint.GGUFCheckpoint``)
   decodes the candidate into the transformers model, ``fideval score`` scores it against fideval's store
   (all positions, and llama.cpp's positions n_ctx/2 .. n_ctx-2 alone).

5. llama.cpp's own float32 logits of the reference's scored rows (``dump_logits.cpp``, compiled against the built
   ``libllama``) exported by fideval must be llama-perplexity's ``base.kld`` byte for byte.

It prints the four columns side by side (docs/formats-store.md keeps the output) and writes the fixture
``tests/data/llamacpp/kld_parity/``: ``base.kld``, ``cand-<mix>.kld`` and ``llama_perplexity.json`` (what
llama-perplexity printed for step 2), read by ``tests/test_score_llamacpp_parity.py``, and ``ref_logits.f32``
(step 5's logits, float32 [chunk, row, vocab]), read by ``tests/test_store_llamacpp_export.py``.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).parent))
from mix_vectors import convert  # noqa: E402  (the converter wrapper)

FIXTURE = ROOT / "tests" / "data" / "llamacpp" / "kld_parity"
N_CTX, N_CHUNK = 64, 4  # 4 x 31 scored rows: llama-perplexity prints its statistics from 100 rows on
STATS = {"mean": r"Mean\s+KLD:\s+(-?[\d.]+)", "max": r"Maximum KLD:\s+(-?[\d.]+)", "p99.9": r"99\.9%\s+KLD:\s+(-?[\d.]+)",
         "p99": r"99\.0%\s+KLD:\s+(-?[\d.]+)", "p95": r"95\.0%\s+KLD:\s+(-?[\d.]+)", "p90": r"90\.0%\s+KLD:\s+(-?[\d.]+)",
         "median": r"Median\s+KLD:\s+(-?[\d.]+)", "p10": r"10\.0%\s+KLD:\s+(-?[\d.]+)", "p5": r" 5\.0%\s+KLD:\s+(-?[\d.]+)",
         "p1": r" 1\.0%\s+KLD:\s+(-?[\d.]+)", "min": r"Minimum KLD:\s+(-?[\d.]+)",
         "same_top_p_percent": r"Same top p:\s+(-?[\d.]+)"}
FRACTIONS = {"p99.9": 0.999, "p99": 0.99, "p95": 0.95, "p90": 0.90, "p10": 0.10, "p5": 0.05, "p1": 0.01}


def tiny_model(folder: Path, seed: int = 0) -> None:
    """A byte-level BPE of 320 tokens trained on the demo corpus, and a 4-layer llama with random weights whose
    logits spread a few nats (initializer 0.1), so that a quantized build is measurably apart."""
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<|bos|>", "<|eos|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(demo_text(200_000).splitlines(), trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>")
    fast.save_pretrained(folder)
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["add_bos_token"] = False  # llama.cpp then evaluates the chunks' own first tokens, as fideval's windows do
    cfg_path.write_text(json.dumps(cfg, indent=1))
    config = transformers.LlamaConfig(vocab_size=len(fast), hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                      max_position_embeddings=256, initializer_range=0.1, tie_word_embeddings=False,
                                      bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(folder, safe_serialization=True)


def demo_text(n_chars: int) -> str:
    lines = []
    for line in (ROOT / "fideval" / "demo" / "assets" / "corpus" / "prose.jsonl").read_text().splitlines():
        lines.append(json.loads(line)["text"])
        if sum(map(len, lines)) > n_chars:
            break
    return "\n".join(lines)[:n_chars]


def perplexity(bin_dir: Path, *args: str, n_ctx: int = N_CTX) -> str:
    """``llama-perplexity`` with contexts (and batches) of ``n_ctx`` on 2 threads, no warm-up; its whole log."""
    cmd = [str(bin_dir / "llama-perplexity"), "-c", str(n_ctx), "-b", str(n_ctx), "-t", "2", "--no-warmup", *args]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{run.stderr[-3000:]}")
    return run.stdout + run.stderr


def parse_stats(log: str) -> dict[str, float]:
    out = {}
    for k, pat in STATS.items():
        m = re.search(pat, log)
        if not m:
            raise SystemExit(f"llama-perplexity printed no {k!r}:\n{log[-3000:]}")
        out[k] = float(m.group(1))
    return out


def hf_logits(model, tokens: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.from_numpy(tokens.astype(np.int64))).logits.float().numpy()


def write_store(root: Path, tokens: np.ndarray, logits: np.ndarray, model_id: str, vocab: int) -> None:
    from fideval.store import StoreWriter

    w = StoreWriter(root, {"model_id": model_id, "model_revision": "local", "tokenizer_sha256": "0" * 64,
                           "vocab_size": vocab, "kind": "logits"})
    for k in range(tokens.shape[0]):
        sid = f"check-{k:03d}"
        w.write(sid, logits[k], tokens[k].astype(np.int32), window_id=sid, domain="check")
    w.finish()


def fideval_figures(records: Path, first: int | None) -> dict[str, float]:
    """llama-perplexity's statistics, computed its way (median of an even count: mean of the two middle values;
    percentiles interpolated at f*(n-1)), from fideval's records; ``first``: only rows from that position on."""
    import polars as pl

    rec = pl.read_parquet(records / "records.parquet")
    if first is not None:
        rec = rec.filter(pl.col("position") >= first)
    return llamacpp_stats(rec["kld"].to_numpy(), rec["top1"].to_numpy())


def llamacpp_stats(kld: np.ndarray, top1: np.ndarray) -> dict[str, float]:
    v = np.sort(kld)
    n = len(v)

    def pct(f: float) -> float:
        p = np.float32(f) * (n - 1)  # perplexity.cpp: float fraction*(size-1)
        i = int(p)
        return (1 - (p - i)) * v[i] + (p - i) * v[min(i + 1, n - 1)]

    out = {"mean": float(kld.mean()), "max": float(v[-1]), "median": float(0.5 * (v[n // 2] + v[n // 2 - 1]) if n % 2 == 0
                                                                            else v[n // 2]),
           "min": float(v[0]), "same_top_p_percent": 100.0 * float(np.mean(top1))}
    out.update({k: float(pct(f)) for k, f in FRACTIONS.items()})
    return out


def main() -> None:
    import torch
    import transformers

    from fideval.model.weights.gguf_checkpoint import GGUFCheckpoint
    from fideval.store.llamacpp import KldBase

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-cpp", type=Path, required=True)
    ap.add_argument("--bin", type=Path, required=True)
    ap.add_argument("--mix", nargs="+", default=["Q8_0", "Q4_K_M"], help="candidates (llama-quantize mixes)")
    ap.add_argument("--work", type=Path)
    a = ap.parse_args()
    w = a.work or Path(tempfile.mkdtemp(prefix="export-check-"))
    w.mkdir(parents=True, exist_ok=True)
    hf, f32 = w / "hf", w / "ref-f32.gguf"
    if not (hf / "config.json").exists():
        tiny_model(hf)
    if not f32.exists():
        convert(a.llama_cpp, hf, f32)
    (w / "text.txt").write_text(demo_text(6_000))
    text = ["-f", str(w / "text.txt"), "--chunks", str(N_CHUNK)]
    perplexity(a.bin, "-m", str(f32), *text, "--kl-divergence-base", str(w / "base.kld"))
    base = KldBase(w / "base.kld")
    tokens = np.array(base.tokens)
    model = transformers.LlamaForCausalLM.from_pretrained(hf, torch_dtype=torch.float32).eval()
    write_store(w / "teacher", tokens, hf_logits(model, tokens), "tiny-llama", base.n_vocab)
    subprocess.run([sys.executable, "-m", "fideval", "export-llamacpp", str(w / "teacher"), str(w / "fideval.kld")], check=True)
    assert np.array_equal(KldBase(w / "fideval.kld").tokens, base.tokens)

    printed = {}
    FIXTURE.mkdir(parents=True, exist_ok=True)
    (FIXTURE / "base.kld").write_bytes((w / "base.kld").read_bytes())
    # llama.cpp's own float32 logits of the scored rows (dump_logits.cpp, against llama.h), exported by fideval,
    # must give llama-perplexity's base.kld byte for byte
    dump = w / "dump_logits"
    subprocess.run(["g++", "-O2", "-std=c++17", f"-I{a.llama_cpp / 'include'}", f"-I{a.llama_cpp / 'ggml' / 'include'}",
                    str(Path(__file__).parent / "dump_logits.cpp"), f"-L{a.bin}", "-lllama", f"-Wl,-rpath,{a.bin}",
                    "-o", str(dump)], check=True)
    subprocess.run([str(dump), str(f32), str(w / "base.kld"), str(w / "ref.f32"), "2"], check=True, capture_output=True)
    from fideval.store import StoreWriter

    rows = np.fromfile(w / "ref.f32", "<f4").reshape(base.n_chunk, base.rows, base.n_vocab)
    sw = StoreWriter(w / "llama-rows", {"model_id": "tiny-llama", "model_revision": "local", "tokenizer_sha256": "0" * 64,
                                        "vocab_size": base.n_vocab, "kind": "logits"})
    for k in range(base.n_chunk):
        sw.write(f"c-{k:03d}", rows[k], tokens[k].astype(np.int32), window_id=f"c-{k:03d}", domain="c", row_start=base.first)
    sw.finish()
    subprocess.run([sys.executable, "-m", "fideval", "export-llamacpp", str(w / "llama-rows"), str(w / "again.kld")], check=True)
    same = (w / "again.kld").read_bytes() == (w / "base.kld").read_bytes()
    print(f"fideval's export of llama.cpp's own logits {'is' if same else 'IS NOT'} llama-perplexity's base.kld, byte for byte")
    (FIXTURE / "ref_logits.f32").write_bytes((w / "ref.f32").read_bytes())
    for mix in a.mix:
        cand = w / f"cand-{mix}.gguf"
        if not cand.exists():
            subprocess.run([str(a.bin / "llama-quantize"), str(f32), str(cand), mix, "2"], check=True, capture_output=True)
        perplexity(a.bin, "-m", str(cand), *text, "--kl-divergence-base", str(w / f"cand-{mix}.kld"))
        llama_own = parse_stats(perplexity(a.bin, "-m", str(cand), "--kl-divergence-base", str(w / "base.kld"),
                                           "--kl-divergence"))
        llama_fid = parse_stats(perplexity(a.bin, "-m", str(cand), "--kl-divergence-base", str(w / "fideval.kld"),
                                           "--kl-divergence"))
        ck = GGUFCheckpoint(cand, hf)
        model.load_state_dict({k: ck.read(k) for k in ck.keys_with_prefix("")}, strict=True)
        write_store(w / f"candidate-{mix}", tokens, hf_logits(model, tokens), "tiny-llama", base.n_vocab)
        subprocess.run([sys.executable, "-m", "fideval", "score", "--teacher", str(w / "teacher"), "--candidate",
                        str(w / f"candidate-{mix}"), "--out", str(w / f"rec-{mix}"), "--device", "cpu"], check=True)
        fid_half, fid_all = fideval_figures(w / f"rec-{mix}", N_CTX // 2), fideval_figures(w / f"rec-{mix}", None)
        cols = {"llama.cpp, own F32 base": llama_own, "llama.cpp, fideval export": llama_fid,
                f"fideval, pos {N_CTX // 2}..{N_CTX - 2}": fid_half, "fideval, all positions": fid_all}
        print(f"\ntiny llama ({base.n_vocab} tokens, 4 layers), candidate {mix}, {N_CHUNK} chunks of {N_CTX} tokens")
        print(f"{'':19s}" + "".join(f"{c:>27s}" for c in cols))
        for k in STATS:
            print(f"{k:19s}" + "".join(f"{v[k]:27.6f}" for v in cols.values()))
        (FIXTURE / f"cand-{mix}.kld").write_bytes((w / f"cand-{mix}.kld").read_bytes())
        printed[mix] = llama_own
    (FIXTURE / "llama_perplexity.json").write_text(json.dumps(
        {"source": f"llama-perplexity (llama-cpp-python 0.3.36's llama.cpp) -c {N_CTX} -b {N_CTX}: --kl-divergence of "
                   "each candidate against base.kld (the tiny llama in F32); cand-<mix>.kld is each candidate's own "
                   "--kl-divergence-base file", "printed": printed}, indent=1) + "\n")
    print(f"wrote {FIXTURE}")


if __name__ == "__main__":
    main()
