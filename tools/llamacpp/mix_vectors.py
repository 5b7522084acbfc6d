"""Record which GGML type llama-quantize gives every tensor, for each named mix, on tiny models (run once, by hand).

    cmake -S $SRC -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF
    cmake --build build -j2 --target llama-quantize llama-perplexity
    python tools/llamacpp/mix_vectors.py --llama-cpp $SRC --bin build/bin

``$SRC`` is the llama.cpp that llama-cpp-python 0.3.36 vendors (``pip download --no-binary :all: --no-deps
llama-cpp-python==0.3.36``). The script writes tiny Hugging Face models with random weights (a llama with
GQA 4 and 16 layers, a llama with tied embeddings, a qwen3moe with 8 experts, a DeepSeek-V3 with 16 experts and
MLA), their dimensions chosen so that some rows are not a multiple of 256 (the K-quant fallbacks) and one not
even of 32 (the F16 fallback), with 8+ layers for ``use_more_bits``; converts each with llama.cpp's own
``convert_hf_to_gguf.py`` to F32 (the demo tokenizer is copied in; its BPE pre-tokenizer is unknown to the
converter, so the wrapper answers ``gpt-2`` for it -- the vocabulary does not matter to the mixes); runs
``llama-quantize`` with every mix of :data:`fideval.quant.gguf_mixes.MIXES` (and with ``--imatrix``, a legacy
file of ones, for the mixes an importance matrix changes: :data:`IMATRIX_MIXES`); and reads each output's tensor
types with gguf-py (Q2_K_S without an imatrix, which llama-quantize refuses to write, from its ``--dry-run``).
``tests/data/llamacpp/mix_vectors.json`` keeps, per model, the metadata llama-quantize reads, every tensor's name,
``ne`` and source type, and per mix the type llama.cpp gave each tensor (``mixes``, ``mixes_imatrix``).
``tests/test_quant_gguf_mixes.py`` asserts that :func:`fideval.quant.gguf_mixes.mix_types` gives the same.
Nothing of llama.cpp is copied into the repository.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "fideval" / "demo" / "assets" / "model"
OUT = ROOT / "tests" / "data" / "llamacpp" / "mix_vectors.json"
VOCAB = 4096  # the demo tokenizer's

# name -> (transformers config class, kwargs); dims: 320 = 32*10 (K-quant fallbacks), 336 (not even 32: F16)
MODELS = {
    "llama-gqa4": ("LlamaConfig", dict(hidden_size=256, intermediate_size=320, num_hidden_layers=16,
                                       num_attention_heads=4, num_key_value_heads=1, head_dim=64,
                                       tie_word_embeddings=False)),
    "llama-tied": ("LlamaConfig", dict(hidden_size=320, intermediate_size=336, num_hidden_layers=8,
                                       num_attention_heads=5, num_key_value_heads=5, head_dim=64,
                                       tie_word_embeddings=True)),
    "qwen3moe-8x": ("Qwen3MoeConfig", dict(hidden_size=256, intermediate_size=512, moe_intermediate_size=96,
                                           num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
                                           head_dim=64, num_experts=8, num_experts_per_tok=2,
                                           decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False)),
    "deepseek-v3": ("DeepseekV3Config", dict(hidden_size=256, intermediate_size=512, moe_intermediate_size=96,
                                             num_hidden_layers=10, num_attention_heads=4, num_key_value_heads=4,
                                             n_routed_experts=16, n_shared_experts=1, num_experts_per_tok=2,
                                             first_k_dense_replace=2, n_group=4, topk_group=2, kv_lora_rank=64,
                                             q_lora_rank=96, qk_nope_head_dim=32, qk_rope_head_dim=16,
                                             v_head_dim=32, head_dim=16, num_nextn_predict_layers=0,
                                             tie_word_embeddings=False)),
}

CONVERT = """
import runpy, sys
src = sys.argv.pop(1)
sys.path[:0] = [src, src + "/gguf-py"]
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"  # the demo BPE tokenizer's hash is unknown


def no_sentencepiece(self):  # no tokenizer.model: llama's set_vocab then falls back to the BPE tokenizer.json
    raise FileNotFoundError("no tokenizer.model")


base.TextModel._set_vocab_sentencepiece = no_sentencepiece
sys.argv[0] = src + "/convert_hf_to_gguf.py"
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def write_hf(name: str, folder: Path, seed: int) -> None:
    import torch
    import transformers

    cls, kw = MODELS[name]
    cfg = getattr(transformers, cls)(vocab_size=VOCAB, max_position_embeddings=2048, bos_token_id=0,
                                     eos_token_id=1, **kw)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32)
    model.save_pretrained(folder, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(DEMO / f, folder / f)


def convert(src: Path, hf: Path, out: Path, outtype: str = "f32") -> None:
    cmd = [sys.executable, "-c", CONVERT, str(src), str(hf), "--outfile", str(out), "--outtype", outtype]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def read_gguf(path: Path, src: Path) -> tuple[dict, list]:
    sys.path.insert(0, str(src / "gguf-py"))
    from gguf import GGUFReader

    r = GGUFReader(str(path))

    def field(key, default=None):
        f = r.fields.get(key)
        return default if f is None else f.contents()

    arch = field("general.architecture")
    n_head = field(f"{arch}.attention.head_count")
    n_head_kv = field(f"{arch}.attention.head_count_kv", n_head)

    def first(v):  # per-layer arrays: layer 0's value, as llama-quantize's n_gqa() reads it
        return int(v[0]) if isinstance(v, list) else int(v)

    model = {"arch": arch, "n_layer": int(field(f"{arch}.block_count")), "n_expert": int(field(f"{arch}.expert_count", 0)),
             "n_head": first(n_head), "n_head_kv": first(n_head_kv)}
    tensors = [[t.name, [int(d) for d in t.shape], t.tensor_type.name] for t in r.tensors]
    return model, tensors


def dry_run(bin_dir: Path, f32: Path, mix: str, source: dict[str, str]) -> dict[str, str]:
    """The types ``llama-quantize --dry-run`` prints (``... size = A MiB -> B MiB (q2_K)``; no arrow: kept), for a
    mix it refuses to write without an importance matrix (the choice of types is made before that check)."""
    run = subprocess.run([str(bin_dir / "llama-quantize"), "--dry-run", str(f32), mix, "2"], capture_output=True,
                         text=True, check=True)
    got = {}
    for m in re.finditer(r"^\[\s*\d+/\s*\d+\] (\S+)\s+- \[.*?\], type =\s*(\S+), size = .*?(?:-> .*?\((\S+)\))?$",
                         run.stdout + run.stderr, re.M):
        got[m.group(1)] = m.group(3).upper() if m.group(3) else source[m.group(1)]
    if set(got) != set(source):
        raise SystemExit(f"llama-quantize --dry-run {mix}: {len(got)} tensors parsed, {len(source)} expected")
    return got


IMATRIX_MIXES = ("Q4_0", "Q5_0", "Q2_K_S", "Q4_K_M", "IQ4_NL", "IQ4_XS")  # has_imatrix changes Q4_0/Q5_0/IQ4 ffn_down


def write_imatrix(path: Path, tensors: list) -> None:
    """A legacy ``imatrix.dat`` (the layout llama-imatrix wrote before GGUF) of ones for every 2-D+ weight but
    ``token_embd``: ``int n``; per entry ``int len, name, int ncall, int nval, float[nval]``; then the chunk count and
    the dataset name. Only its presence matters to the choice of types (``has_imatrix``)."""
    import struct

    out = []
    for name, ne, _ in tensors:
        if len(ne) >= 2 and name.endswith("weight") and name != "token_embd.weight":
            nval = ne[0] * (ne[2] if len(ne) > 2 else 1)
            out.append(struct.pack("<i", len(name)) + name.encode() + struct.pack("<ii", 1, nval) + b"\x00\x00\x80\x3f" * nval)
    path.write_bytes(struct.pack("<i", len(out)) + b"".join(out) + struct.pack("<ii", 1, 4) + b"ones")


def main() -> None:
    from fideval.quant.gguf_mixes import MIXES

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-cpp", type=Path, required=True, help="llama.cpp source folder (vendored by llama-cpp-python)")
    ap.add_argument("--bin", type=Path, required=True, help="folder holding the built llama-quantize")
    ap.add_argument("--work", type=Path, help="keep the models here (default: a temp folder)")
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args()
    work = a.work or Path(tempfile.mkdtemp(prefix="mix-vectors-"))
    work.mkdir(parents=True, exist_ok=True)
    record = {"source": f"llama-quantize built from {a.llama_cpp} (llama-cpp-python 0.3.36 vendored llama.cpp)",
              "models": {}, "dry_run": []}
    for seed, name in enumerate(MODELS):
        hf, f32 = work / name, work / f"{name}-f32.gguf"
        if not f32.exists():
            write_hf(name, hf, seed)
            convert(a.llama_cpp, hf, f32)
        model, tensors = read_gguf(f32, a.llama_cpp)
        mixes = {}
        for mix in MIXES:
            q = work / f"{name}-{mix}.gguf"
            run = subprocess.run([str(a.bin / "llama-quantize"), str(f32), str(q), mix, "2"], capture_output=True, text=True)
            if run.returncode == 0:
                _, out = read_gguf(q, a.llama_cpp)
                got = {n: t for n, _, t in out}
                q.unlink()
            elif "requires an imatrix" in run.stdout + run.stderr:  # Q2_K_S: llama-quantize's own --dry-run choice
                got = dry_run(a.bin, f32, mix, {n: t for n, _, t in tensors})
                record["dry_run"].append(f"{name} {mix}")
            else:
                raise SystemExit(f"llama-quantize {name} {mix} failed:\n{run.stderr[-2000:]}")
            mixes[mix] = [got[n] for n, _, _ in tensors]
            print(f"{name:12s} {mix:9s} " + " ".join(f"{t}:{mixes[mix].count(t)}" for t in sorted(set(mixes[mix]))))
        write_imatrix(work / f"{name}.imatrix.dat", tensors)
        with_imatrix = {}
        for mix in IMATRIX_MIXES:
            q = work / f"{name}-{mix}-imatrix.gguf"
            subprocess.run([str(a.bin / "llama-quantize"), "--imatrix", str(work / f"{name}.imatrix.dat"), str(f32),
                            str(q), mix, "2"], capture_output=True, text=True, check=True)
            got = {n: t for n, _, t in read_gguf(q, a.llama_cpp)[1]}
            q.unlink()
            with_imatrix[mix] = [got[n] for n, _, _ in tensors]
            print(f"{name:12s} {mix:9s} imatrix " + " ".join(f"{t}:{with_imatrix[mix].count(t)}" for t in sorted(set(with_imatrix[mix]))))
        record["models"][name] = {"model": model, "tensors": tensors, "mixes": mixes, "mixes_imatrix": with_imatrix}
    a.out.write_text(json.dumps(record, separators=(",", ":")) + "\n")
    print(f"wrote {a.out} ({a.out.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
