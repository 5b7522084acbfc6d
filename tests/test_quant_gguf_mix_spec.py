"""``gguf_mix`` candidates against llama-quantize itself: the emulated candidate (the reference with every weight,
embedding and lm head included, quantized as the mix's rule says, in llama.cpp's layout) gives logits EQUAL to
those of the GGUF llama-quantize wrote from the reference's F32 conversion, read by fideval's GGUFCheckpoint
(gguf-py's dequantization). Fixtures: tests/data/llamacpp/mix, written by tools/llamacpp/mix_ggufs.py."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest
import torch
from model_fixtures import tokens
from safetensors.torch import load_file

from fideval.errors import FidevalError
from fideval.model.runner import Runner, RunnerOptions
from fideval.model.weights.gguf_checkpoint import GGUFCheckpoint
from fideval.quant.gguf_mix_spec import _NOT_EMULATED, MixSpec, mix_name
from fideval.quant.imatrix import read_imatrix

torch.set_num_threads(1)
DATA = Path(__file__).resolve().parent / "data" / "llamacpp" / "mix"
ROOT = Path(__file__).resolve().parents[1]
CASES = sorted((m.name, g.name) for m in DATA.iterdir() for g in m.glob("*.gguf"))


def reference(model: str) -> Path:
    link = DATA / model / "reference.json"
    return ROOT / json.loads(link.read_text())["reference"] if link.exists() else DATA / model


def logits(weights, transform=None) -> torch.Tensor:
    r = Runner(weights, RunnerOptions(micro_batch=2, weight_transform=transform))
    return torch.stack([x for _, x in r.run(tokens(r.vocab_size, n=2, length=12), canary=False)])


@pytest.mark.parametrize(("model", "file"), CASES)
def test_emulated_mix_equals_llama_quantizes_gguf(model, file):
    ref = reference(model)
    mix = file.removesuffix(".gguf").removesuffix("-imatrix")
    im = read_imatrix(DATA / model / "imatrix.dat") if file.endswith("-imatrix.gguf") else None
    spec = MixSpec(mix, ref, im)
    written = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(DATA / model / file)).tensors}
    planned = {n: t for _, parts in spec.plan.values() for n, _, t in parts}
    assert planned == {n: t for n, t in written.items() if n in planned}  # the rule, on the derived GGUF
    assert set(written) - set(planned) <= {"rope_freqs.weight"}
    ckpt = GGUFCheckpoint(DATA / model / file, ref)
    real = logits(ckpt)
    emulated = logits(ref, spec.weight_transform)
    assert torch.equal(real, emulated)
    assert not torch.equal(emulated, logits(ref))  # the mix changed the model
    if im is not None:  # and the importance matrix changed the mix (one tensor, quantized without it)
        o = "model.layers.0.self_attn.o_proj.weight"
        w = load_file(ref / "model.safetensors")[o].float()
        assert not torch.equal(ckpt.read(o), MixSpec(mix, ref).weight_transform("attention", o, w))


def test_fixtures_exercise_the_rules_branches():
    """Types the fixtures hold: K-quants, their fallbacks (rows of 32 and 16), the tied output, the MLA split."""
    def types(model, file):
        return {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(DATA / model / file)).tensors}

    llama = types("llama", "Q4_K_M.gguf")
    assert llama["token_embd.weight"] == "Q4_K" and llama["output.weight"] == "Q6_K"
    assert llama["blk.0.attn_v.weight"] == "Q6_K" and llama["blk.1.attn_v.weight"] == "Q4_K"  # use_more_bits
    assert llama["blk.0.attn_output.weight"] == "Q5_0" and llama["blk.0.ffn_down.weight"] == "F16"  # rows 32, 16
    qwen = types("qwen3_moe", "Q4_K_M.gguf")
    assert "output.weight" not in qwen and qwen["token_embd.weight"] == "Q6_K"  # tied: the embedding is the output
    assert qwen["blk.0.attn_v.weight"] == "Q8_0"  # 8 experts
    ds = types("deepseek_v3", "Q4_K_M.gguf")
    assert "blk.0.attn_kv_b.weight" not in ds and ds["blk.0.attn_k_b.weight"] == "Q5_0"  # rows of qk_nope_head_dim
    oss = types("gpt_oss", "MXFP4_MOE.gguf")  # experts stored transposed and interleaved: quantized on llama.cpp's rows
    assert oss["blk.0.ffn_gate_exps.weight"] == "MXFP4" and oss["blk.0.attn_q.weight"] == "Q8_0"
    assert {t for m, f in CASES for t in types(m, f).values()} >= {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "MXFP4",
                                                                 "IQ4_NL", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "F16"}
    with_im = {t for m, f in CASES if f.endswith("-imatrix.gguf") for t in types(m, f).values()}
    assert with_im >= {"Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "IQ4_NL", "Q4_0", "Q4_1", "Q5_0", "Q5_1"}  # weighted searches


def test_spec_errors_are_one_line(tmp_path):
    with pytest.raises(FidevalError, match="unknown gguf mix 'Q4_K_X'"):
        MixSpec("Q4_K_X", DATA / "llama")
    with pytest.raises(FidevalError, match="no module classes beside it"):
        mix_name({"gguf_mix": "Q4_K_M", "attention": {"format": "mxfp4"}})
    assert mix_name("gguf_mix=q4_k_m") == "q4_k_m" and mix_name({"attention": {"format": "mxfp4"}}) is None
    other = read_imatrix(DATA / "llama" / "imatrix.dat")
    other.entries.pop("blk.3.attn_q.weight")
    with pytest.raises(FidevalError, match="no entry for tensor 'blk.3.attn_q.weight'"):
        MixSpec("IQ4_XS", DATA / "llama", other)


def test_bits_count_every_gguf_tensor_at_its_type():
    spec = MixSpec("Q4_K_M", DATA / "llama")
    table = spec.bits()
    emb = table["per_class"]["embedding"]
    assert emb["types"] == {"Q4_K": 1} and emb["bpw"] == 4.5
    assert table["per_class"]["lm_head"]["types"] == {"Q6_K": 1} and table["per_class"]["lm_head"]["bpw"] == 6.5625
    assert table["per_class"]["other"]["bpw"] == 16.0  # norms at the base precision
    size = sum(t.n_bytes for t in gguf.GGUFReader(str(DATA / "llama" / "Q4_K_M.gguf")).tensors if t.tensor_type.name != "F32")
    quantized = sum(r["bits"] for k, r in table["per_class"].items() if k != "other")
    assert quantized == size * 8  # the stored bytes of every quantized tensor


def test_constant_over_tensor_is_rounded_once_as_in_c():
    """torch's ``scalar / tensor`` is reciprocal * scalar (two roundings): the IQ4_NL imatrix search picked another
    trial scale for one block of the llama's IQ4_XS-imatrix GGUF until the encoders divided as C does."""
    import numpy as np

    from fideval.quant.gguf_kquants import cdiv

    x = torch.rand(4096, generator=torch.Generator().manual_seed(0)) + 0.01
    want = np.float32(63.0) / x.numpy()
    assert np.array_equal(cdiv(63.0, x).numpy(), want) and not np.array_equal((63.0 / x).numpy(), want)
    assert cdiv(-126.0, torch.tensor([0.22412109375])).item() == np.float32(-126.0) / np.float32(0.22412109375)


def test_a_ranks_share_quantizes_as_the_whole_tensor():
    """Model parallel: a rank's experts [lo, hi) and its lm head rows get the rows the whole tensor would."""
    spec = MixSpec("Q4_K_M", DATA / "qwen3_moe")
    sd = load_file(DATA / "qwen3_moe" / "model.safetensors")
    gate_up = "model.layers.1.mlp.experts.gate_up_proj"
    w = torch.randn(spec.shapes[gate_up], generator=torch.Generator().manual_seed(0)) * 0.1
    whole = spec.weight_transform("routed_experts", gate_up, w)
    assert torch.equal(spec.weight_transform("routed_experts", gate_up, w[2:5]), whole[2:5])
    emb = sd["model.embed_tokens.weight"].float()  # tied: the head is token_embd, Q6_K
    assert torch.equal(spec.weight_transform("lm_head", "lm_head.weight", emb[16:48]),
                       spec.weight_transform("embedding", "model.embed_tokens.weight", emb)[16:48])
    q = "model.layers.0.self_attn.q_proj.weight"  # llama: rows permuted per head by the converter
    with pytest.raises(FidevalError, match="arrives as a slice"):
        MixSpec("Q4_K_M", DATA / "llama").weight_transform("attention", q, torch.zeros(8, 256))


@pytest.mark.parametrize("name", sorted(p.name for p in (DATA.parent / "moe").iterdir()))
def test_the_plan_is_the_gguf_the_converter_writes(name):
    """Every converter-written GGUF of tests/data/llamacpp/moe (12 architectures): the plan derived from the
    reference alone has its tensors' names and shapes, and its metadata as llama-quantize reads it (GLM-4.5's
    block count includes its MTP block, which this checkpoint, like the converter's output, does not hold)."""
    from fideval.quant.gguf_mixes import gguf_mix_inputs

    ref = DATA.parent / "moe" / name
    hf_arch = json.loads((ref / "config.json").read_text())["architectures"][0]
    if hf_arch in _NOT_EMULATED:  # readable as candidates, not yet emulated as mixes: refused in one line
        with pytest.raises(FidevalError, match="emulation of llama.cpp's .* layout is not built"):
            MixSpec("Q4_K_M", ref)
        return
    model, tensors = gguf_mix_inputs(ref / "model.gguf")
    written = {n: ne for n, ne, _ in tensors if not n.startswith("rope_freqs")}
    spec = MixSpec("Q4_K_M", ref)
    assert {n: ne for _, parts in spec.plan.values() for n, ne, _ in parts} == written
    assert spec.model == model


def test_glm_mtp_weights_in_the_checkpoint_are_refused(tmp_path):
    """A GLM-4.5 checkpoint holding its MTP block: the converter would write it, and it counts in the walk."""
    import shutil

    from safetensors.torch import save_file

    ref = Path(shutil.copytree(DATA.parent / "moe" / "glm4_moe", tmp_path / "glm", ignore=shutil.ignore_patterns("*.gguf")))
    sd = load_file(ref / "model.safetensors")
    sd["model.layers.2.eh_proj.weight"] = torch.zeros(64, 128, dtype=torch.float16)
    save_file(sd, ref / "model.safetensors")
    with pytest.raises(FidevalError, match="GLM's MTP blocks"):
        MixSpec("Q4_K_M", ref)


def test_a_folder_without_config_is_one_line(tmp_path):
    with pytest.raises(FidevalError, match="has no config.json"):
        MixSpec("Q4_K_M", tmp_path)
