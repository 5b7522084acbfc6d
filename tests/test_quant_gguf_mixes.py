"""llama-quantize's named mixes: fideval's rule gives every tensor the type llama.cpp gave it.

Oracle: ``tests/data/llamacpp/mix_vectors.json``, written by ``tools/llamacpp/mix_vectors.py`` from llama-quantize
runs (llama-cpp-python 0.3.36's vendored llama.cpp) on four tiny converted models: a llama with GQA 4 and 16
layers, a llama with tied embeddings and rows of 320 and 336, a qwen3moe with 8 experts, a DeepSeek-V3 (MLA,
16 experts, 2 dense layers), every mix without and the mixes an importance matrix changes with ``--imatrix``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fideval.errors import FidevalError
from fideval.quant.gguf_mixes import MIXES, MixModel, matching_mixes, mix_types

DATA = json.loads((Path(__file__).parent / "data" / "llamacpp" / "mix_vectors.json").read_text())
CASES = [(m, mix) for m, rec in DATA["models"].items() for mix in rec["mixes"]]


@pytest.mark.parametrize("model", sorted(DATA["models"]))
def test_every_tensor_of_every_mix_as_llama_quantize(model):
    rec = DATA["models"][model]
    assert sorted(rec["mixes"]) == sorted(MIXES)
    bad = []
    for mix, want in rec["mixes"].items():
        got = mix_types(mix, MixModel(**rec["model"]), rec["tensors"])
        bad += [f"{mix} {n}: llama.cpp {w}, fideval {got[n]}" for (n, _, _), w in zip(rec["tensors"], want) if got[n] != w]
    for mix, want in rec["mixes_imatrix"].items():  # llama-quantize --imatrix: Q4_0/Q5_0/IQ4 ffn_down change
        got = mix_types(mix, MixModel(**rec["model"]), rec["tensors"], has_imatrix=True)
        bad += [f"{mix}+imatrix {n}: llama.cpp {w}, fideval {got[n]}"
                for (n, _, _), w in zip(rec["tensors"], want) if got[n] != w]
    assert not bad, f"{len(bad)} differences, first: {bad[:8]}"


def _types(model, mix):
    rec = DATA["models"][model]
    return {n: t for (n, _, _), t in zip(rec["tensors"], rec["mixes"][mix])}


def test_the_vectors_exercise_the_rules():
    """The fixture is worth something only if llama.cpp's own outputs show each rule firing."""
    t = _types("llama-gqa4", "Q4_K_M")  # use_more_bits over 16 layers: 0,1 | 4,7,10,13 | 14,15 get Q6_K (fallback Q8_0)
    downs = [t[f"blk.{i}.ffn_down.weight"] for i in range(16)]  # rows of 320: Q6_K -> Q8_0, Q4_K -> Q5_0
    assert [i for i, x in enumerate(downs) if x == "Q8_0"] == [0, 1, 4, 7, 10, 13, 14, 15]
    assert set(downs) == {"Q8_0", "Q5_0"}
    assert {t[f"blk.{i}.attn_v.weight"] for i in range(16)} == {"Q6_K", "Q4_K"}
    assert t["output.weight"] == "Q6_K" and t["token_embd.weight"] == "Q4_K"
    assert _types("llama-gqa4", "Q2_K")["blk.3.attn_v.weight"] == "Q4_K"  # n_gqa 4
    tied = _types("llama-tied", "Q4_K_M")  # no output.weight: token_embd is the output (rows of 320: Q8_0)
    assert tied["token_embd.weight"] == "Q8_0" and tied["blk.0.ffn_down.weight"] == "F16"  # 336 % 32 != 0
    assert tied["blk.2.attn_q.weight"] == "Q5_0"
    moe = _types("qwen3moe-8x", "Q4_K_M")  # 8 experts: attn_v and attn_k to Q8_0, attn_output to Q5_K
    assert moe["blk.5.attn_v.weight"] == moe["blk.5.attn_k.weight"] == "Q8_0" and moe["blk.5.attn_output.weight"] == "Q5_K"
    assert moe["blk.0.ffn_down_exps.weight"] == "Q8_0" and moe["blk.2.ffn_down_exps.weight"] == "Q5_0"  # rows of 96
    ds = _types("deepseek-v3", "Q4_K_M")  # 10 layers: use_more_bits at 0, 3, 6, 8, 9 -- from the name in an MoE
    assert [ds[f"blk.{i}.ffn_down.weight"] for i in (0, 1)] == ["Q6_K", "Q4_K"]  # (dense layers, rows of 512)
    assert [ds[f"blk.{i}.ffn_down_exps.weight"] for i in range(2, 10)] == ["Q5_0", "Q8_0", "Q5_0", "Q5_0", "Q8_0",
                                                                          "Q5_0", "Q8_0", "Q8_0"]  # rows of 96
    assert _types("deepseek-v3", "MXFP4_MOE")["blk.4.ffn_up_exps.weight"] == "MXFP4"
    assert _types("deepseek-v3", "F16")["blk.4.ffn_norm.weight"] == "F32"
    gqa = DATA["models"]["llama-gqa4"]  # with an imatrix, Q4_0's first eighth of ffn_down (layers 0, 1) is Q4_1
    im = {n: t for (n, _, _), t in zip(gqa["tensors"], gqa["mixes_imatrix"]["Q4_0"])}
    assert [im[f"blk.{i}.ffn_down.weight"] for i in (0, 1, 2)] == ["Q4_1", "Q4_1", "Q4_0"]
    assert _types("llama-gqa4", "Q4_0")["blk.0.ffn_down.weight"] == "Q4_0"


def test_unknown_mix_is_one_line():
    with pytest.raises(FidevalError, match="unknown gguf mix 'Q4_K_X'"):
        mix_types("Q4_K_X", MixModel("llama", 8), [])


@pytest.mark.parametrize("model", sorted(DATA["models"]))
def test_each_build_is_recognised_as_its_mix(model):
    """matching_mixes on llama-quantize's own outputs: each build is recognised as the mix that made it; on the
    llama with rows of 256, the common K mixes are told apart from each other."""
    rec = DATA["models"][model]
    m = MixModel(**rec["model"])
    found = {mix: matching_mixes(m, [(n, ne, t) for (n, ne, _), t in zip(rec["tensors"], types)])
             for mix, types in rec["mixes"].items()}
    assert all(mix in got for mix, got in found.items())
    if model == "llama-gqa4":
        for mix in ("Q4_K_M", "Q5_K_M", "Q3_K_M", "Q4_K_S", "Q6_K", "IQ4_XS"):
            assert found[mix] == [mix]
        assert found["Q8_0"] == ["Q8_0", "MXFP4_MOE"]  # a dense model: MXFP4_MOE has no experts, so all Q8_0


def test_quant_inspect_names_the_mix_of_a_gguf(tmp_path):
    """A GGUF with llama-quantize's Q4_K_M types (zero-filled data: only names, shapes, types and metadata are read)."""
    import numpy as np
    from cli_runner import run_fideval
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter

    rec = DATA["models"]["llama-gqa4"]
    w = GGUFWriter(str(tmp_path / "b.gguf"), "llama")
    w.add_block_count(16)
    w.add_head_count(4)
    w.add_head_count_kv(1)
    for (name, ne, _), t in zip(rec["tensors"], rec["mixes"]["Q4_K_M"]):
        if t == "F32":
            w.add_tensor(name, np.zeros(tuple(reversed(ne)), np.float32))
            continue
        qt = GGMLQuantizationType[t]
        block, size = GGML_QUANT_SIZES[qt]
        w.add_tensor(name, np.zeros((*reversed(ne[1:]), ne[0] // block * size), np.uint8), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    r = run_fideval("quant", "inspect", "--model", str(tmp_path / "b.gguf"))
    assert r.code == 0, r.stderr
    assert "llama-quantize mix: Q4_K_M (every tensor's type as that mix gives it)" in r.stdout
