"""Write llama-quantize's own named-mix GGUFs of tiny models, the oracle of the ``gguf_mix`` emulation (run once, by
hand; CI has no llama.cpp).

    cmake -S $SRC -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF
    cmake --build build -j2 --target llama-quantize
    python tools/llamacpp/mix_ggufs.py --llama-cpp $SRC --bin build/bin

``$SRC`` is the llama.cpp that llama-cpp-python 0.3.36 vendors. For each model a tiny random-weight Hugging Face
reference (float16 safetensors, to keep the fixtures small; the DeepSeek-V3 and gpt-oss ones are
``tests/data/llamacpp/moe/``'s) is converted by llama.cpp's ``convert_hf_to_gguf.py`` model class to **F32** (so llama-quantize's
input is exactly the reference's weights; placeholder tokens for the vocabulary, as in ``moe_ggufs.py``), then
``llama-quantize F32.gguf OUT.gguf MIX`` writes each mix of :data:`MIXES` (and, for :data:`IMATRIX`, with
``--imatrix``: a legacy ``imatrix.dat`` of seeded random positive weights for every quantized tensor but
``token_embd``, which llama-imatrix never records). Dimensions: hidden 256 (rows of whole K-quant super-blocks),
and rows of 32 (the Q5_0/Q5_1/Q8_0/IQ4_NL fallbacks) and 16 (F16) elsewhere; the llama has GQA 4 and 8 layers
(``use_more_bits``), the qwen3moe 8 experts (llama.cpp's ``n_expert == 8`` branches) and tied embeddings
(``token_embd`` as the output), the DeepSeek-V3 MLA's ``kv_b`` split into ``attn_k_b``/``attn_v_b``, gpt-oss its
experts transposed and de-interleaved by the converter (and MXFP4_MOE).
Output: ``tests/data/llamacpp/mix/<model>/`` with ``config.json`` and ``model.safetensors`` (or ``reference.json``
naming the ``moe/`` folder),
``<MIX>.gguf``, ``imatrix.dat`` and ``<MIX>-imatrix.gguf``. ``tests/test_quant_gguf_mix_spec.py`` asserts that the
emulated candidate's logits equal those of each GGUF read by ``GGUFCheckpoint``. Nothing of llama.cpp is copied.
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "llamacpp" / "mix"
MOE = ROOT / "tests" / "data" / "llamacpp" / "moe"
MIXES = {"llama": ("Q4_K_M", "Q3_K_M", "Q2_K", "IQ4_XS"), "qwen3_moe": ("Q4_K_M", "Q3_K_S"),
         "deepseek_v3": ("Q4_K_M", "Q5_K_M"), "gpt_oss": ("Q4_K_M", "MXFP4_MOE")}
IMATRIX = {"llama": ("IQ4_XS", "Q4_K_M", "Q5_K_M", "Q4_0", "Q4_1"), "deepseek_v3": ("Q4_K_M",)}


def configs() -> dict:
    import transformers as tf

    small = dict(vocab_size=64, hidden_size=256, rms_norm_eps=1e-6, max_position_embeddings=256, bos_token_id=0,
                 eos_token_id=1)
    return {
        "llama": tf.LlamaConfig(**small, intermediate_size=16, num_hidden_layers=8, num_attention_heads=4,
                                num_key_value_heads=1, head_dim=8, tie_word_embeddings=False),
        "qwen3_moe": tf.Qwen3MoeConfig(**small, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=8,
                                       num_experts_per_tok=2, norm_topk_prob=True, tie_word_embeddings=True),
    }


def save_random(config, folder: Path, seed: int) -> None:
    """A float16 model of ``config`` with random weights (norms 1 + 0.1 N(0,1), the rest 0.1 N(0,1); ``seed``), saved
    to ``folder`` without its generation config."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if "norm" in n else 0.1 * torch.randn_like(p))
    model.to(torch.float16).save_pretrained(folder)
    (folder / "generation_config.json").unlink(missing_ok=True)


def save_reference(name: str, folder: Path, seed: int) -> None:
    save_random(configs()[name], folder, seed)


def write_imatrix(path: Path, f32: Path, seed: int) -> None:
    """A legacy ``imatrix.dat``: ``int n``; per entry ``int len, name, int ncall, int nval, float[nval]``; then the
    chunk count and the dataset name. Random positive weights (ncall 1), one per column (per expert and column)."""
    import gguf

    rng = np.random.default_rng(seed)
    out = []
    for t in gguf.GGUFReader(str(f32)).tensors:
        ne = [int(d) for d in t.shape]
        if len(ne) >= 2 and ne[1] > 1 and t.name.endswith("weight") and t.name != "token_embd.weight":
            nval = ne[0] * (ne[2] if len(ne) > 2 else 1)
            vals = rng.uniform(0.05, 4.0, nval).astype("<f4")
            out.append(struct.pack("<i", len(t.name)) + t.name.encode() + struct.pack("<ii", 1, nval) + vals.tobytes())
    path.write_bytes(struct.pack("<i", len(out)) + b"".join(out) + struct.pack("<ii", 1, 6) + b"random")


def quantize(bin_dir: Path, f32: Path, out: Path, mix: str, imatrix: Path | None = None) -> None:
    cmd = [str(bin_dir / "llama-quantize"), *(["--imatrix", str(imatrix)] if imatrix else []), str(f32), str(out), mix, "1"]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{run.stderr[-2000:]}")


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from moe_ggufs import convert

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-cpp", type=Path, required=True, help="llama.cpp source tree (convert_hf_to_gguf.py, gguf-py/)")
    ap.add_argument("--bin", type=Path, required=True, help="folder holding the built llama-quantize")
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args()
    for seed, name in enumerate(MIXES):
        dest = a.out / name
        with tempfile.TemporaryDirectory() as tmp:
            ref = Path(tmp) / "ref"
            if name in configs():
                save_reference(name, ref, seed)
            else:
                shutil.copytree(MOE / name, ref)
            f32 = Path(tmp) / "f32.gguf"
            convert(a.llama_cpp.resolve(), ref, f32, "f32")
            if dest.exists():
                shutil.rmtree(dest)
            dest.mkdir(parents=True)
            if name in configs():
                for f in ("config.json", "model.safetensors"):
                    shutil.copy(ref / f, dest / f)
            else:
                (dest / "reference.json").write_text(json.dumps({"reference": f"tests/data/llamacpp/moe/{name}"}) + "\n")
            for mix in MIXES[name]:
                quantize(a.bin, f32, dest / f"{mix}.gguf", mix)
            if name in IMATRIX:
                write_imatrix(dest / "imatrix.dat", f32, seed)
            for mix in IMATRIX.get(name, ()):
                quantize(a.bin, f32, dest / f"{mix}-imatrix.gguf", mix, dest / "imatrix.dat")
        print(name, {p.name: p.stat().st_size for p in sorted(dest.iterdir())})
    return 0


if __name__ == "__main__":
    sys.exit(main())
