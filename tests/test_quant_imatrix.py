"""llama.cpp importance-matrix files (GGUF and legacy .dat), read as llama-quantize normalises them, and the
per-expert slices they give the K-quant encoders."""

import struct

import numpy as np
import pytest
import torch

from fideval.errors import FidevalError
from fideval.quant.gguf_ktypes import gguf_k_encode
from fideval.quant.imatrix import read_imatrix


def _legacy(path, entries, ncall, tail=True):
    b = struct.pack("<i", len(entries))
    for name, vals in entries.items():
        nb = name.encode()
        b += struct.pack("<i", len(nb)) + nb + struct.pack("<ii", ncall, len(vals)) + np.asarray(vals, "<f4").tobytes()
    if tail:
        b += struct.pack("<i", 7) + struct.pack("<i", 8) + b"wiki.txt"
    path.write_bytes(b)
    return path


def _gguf(path, sums, counts, meta=True):
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), "llama")
    if meta:
        w.add_array("imatrix.datasets", ["calib.txt"])
        w.add_uint32("imatrix.chunk_count", 12)
        w.add_uint32("imatrix.chunk_size", 512)
    for name in sums:
        w.add_tensor(f"{name}.in_sum2", np.asarray(sums[name], np.float32))
        w.add_tensor(f"{name}.counts", np.asarray(counts[name], np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_legacy_file_divides_by_ncall(tmp_path):
    g = np.random.default_rng(0)
    v = g.uniform(0, 5, 256).astype(np.float32)
    im = read_imatrix(_legacy(tmp_path / "i.dat", {"blk.0.attn_q.weight": v}, ncall=10))
    assert im.legacy and im.chunk_count == 7 and im.datasets == ["wiki.txt"]
    assert np.array_equal(im.for_tensor("blk.0.attn_q.weight", (64, 256)), v / np.float32(10))
    im0 = read_imatrix(_legacy(tmp_path / "j.dat", {"blk.0.attn_q.weight": v}, ncall=0, tail=False))
    assert np.array_equal(im0.entries["blk.0.attn_q.weight"], v)  # ncall 0: the values as stored


def test_gguf_file_normalises_per_expert(tmp_path):
    g = np.random.default_rng(1)
    s = g.uniform(0, 100, (3, 256)).astype(np.float32)
    c = np.array([4.0, 0.0, 2.6], np.float32)  # an expert no token reached gets weight 1; counts are lround-ed
    im = read_imatrix(_gguf(tmp_path / "i.gguf", {"blk.1.ffn_up_exps.weight": s}, {"blk.1.ffn_up_exps.weight": c}))
    assert not im.legacy and im.chunk_count == 12 and im.datasets == ["calib.txt"]
    w = im.for_tensor("blk.1.ffn_up_exps.weight", (3, 8, 256))
    assert w.shape == (3, 256)
    assert np.array_equal(w[0], s[0] / np.float32(4)) and np.all(w[1] == 1) and np.array_equal(w[2], s[2] / np.float32(3))
    # each expert's rows quantized with its own slice, as llama-quantize does
    x = torch.randn(3, 4, 256, generator=torch.Generator().manual_seed(2))
    raw = gguf_k_encode(x, "q4_k", torch.from_numpy(w))
    for e in range(3):
        assert torch.equal(raw[e], gguf_k_encode(x[e], "q4_k", torch.from_numpy(w[e])))
    assert not torch.equal(raw[0], gguf_k_encode(x[0], "q4_k"))


def test_bad_imatrix_files_are_one_line_errors(tmp_path):
    v = np.ones(256, np.float32)
    im = read_imatrix(_legacy(tmp_path / "i.dat", {"blk.0.attn_q.weight": v}, ncall=1))
    with pytest.raises(FidevalError, match="no entry for tensor 'blk.0.attn_k.weight'"):
        im.for_tensor("blk.0.attn_k.weight", (64, 256))
    with pytest.raises(FidevalError, match=r"has 256 values, tensor \[64, 512\] needs 512"):
        im.for_tensor("blk.0.attn_q.weight", (64, 512))
    full = (tmp_path / "i.dat").read_bytes()
    (tmp_path / "cut.dat").write_bytes(full[:200])
    with pytest.raises(FidevalError, match="truncated legacy imatrix file"):
        read_imatrix(tmp_path / "cut.dat")
    (tmp_path / "junk.dat").write_bytes(b"\xff\xff\xff\x7f" + b"\0" * 40)
    with pytest.raises(FidevalError, match="not an imatrix file"):
        read_imatrix(tmp_path / "junk.dat")
    with pytest.raises(FidevalError, match="not found"):
        read_imatrix(tmp_path / "missing.dat")
    nometa = _gguf(tmp_path / "n.gguf", {"a.weight": np.ones((1, 32))}, {"a.weight": [1.0]}, meta=False)
    with pytest.raises(FidevalError, match="imatrix metadata missing"):
        read_imatrix(nometa)
    bad = _legacy(tmp_path / "nan.dat", {"blk.0.attn_q.weight": np.full(256, np.nan, np.float32)}, ncall=1)
    with pytest.raises(FidevalError, match="non-finite"):
        read_imatrix(bad)


def test_lookup_maps_hugging_face_names_with_gguf_py_tables(tmp_path):
    from fideval.quant.imatrix import ImatrixLookup

    g = np.random.default_rng(3)
    entries = {"blk.0.attn_q_a.weight": g.uniform(0.1, 2, 256), "blk.1.ffn_gate_exps.weight": g.uniform(0.1, 2, 4 * 256),
               "blk.1.ffn_up_exps.weight": g.uniform(0.1, 2, 4 * 256), "blk.1.ffn_down_exps.weight": g.uniform(0.1, 2, 4 * 512),
               "blk.1.ffn_down_shexp.weight": g.uniform(0.1, 2, 512)}
    im = read_imatrix(_legacy(tmp_path / "i.dat", entries, ncall=1))
    lk = ImatrixLookup(im, "deepseek_v3", 4)
    assert lk.gguf_name("model.layers.0.self_attn.q_a_proj.weight") == "blk.0.attn_q_a.weight"
    assert lk.gguf_name("model.layers.1.mlp.experts.gate_up_proj") == "blk.1.ffn_gate_exps.weight"  # transformers 5's fused
    assert lk.gguf_name("model.layers.1.mlp.experts.down_proj") == "blk.1.ffn_down_exps.weight"
    assert lk.gguf_name("model.layers.1.mlp.experts.2.up_proj.weight") == "blk.1.ffn_up_exps.weight"  # a release's
    assert lk.gguf_name("model.layers.1.mlp.shared_experts.down_proj.weight") == "blk.1.ffn_down_shexp.weight"
    assert torch.equal(lk("model.layers.1.mlp.experts.gate_up_proj", (4, 64, 256))[2],
                       torch.from_numpy(im.entries["blk.1.ffn_gate_exps.weight"].reshape(4, 256)[2]))
    lk.check("model.layers.1.mlp.experts.3.down_proj.weight", (256, 512), 4)
    with pytest.raises(FidevalError, match="holds 4 experts, the tensor 2"):
        lk("model.layers.1.mlp.experts.down_proj", (2, 256, 512))  # a model-parallel rank's share
    with pytest.raises(FidevalError, match="no entry for tensor 'blk.2.attn_kv_b.weight'"):
        lk("model.layers.2.self_attn.kv_b_proj.weight", (128, 64))
    with pytest.raises(FidevalError, match="no llama.cpp tensor names for model type 'gpt2'"):
        ImatrixLookup(im, "gpt2", 2)


def test_spec_quantizes_each_tensor_with_its_own_importance_weights(tmp_path):
    from fideval.quant.gguf_ktypes import gguf_k_quant_dequant
    from fideval.quant.imatrix import ImatrixLookup
    from fideval.quant.spec import compile_spec

    g = np.random.default_rng(4)
    entries = {"blk.0.attn_q.weight": g.gamma(0.5, 1, 256) * 50, "blk.0.attn_k.weight": g.gamma(0.5, 1, 256) * 50}
    lk = ImatrixLookup(read_imatrix(_legacy(tmp_path / "i.dat", entries, ncall=1)), "llama", 1)
    spec = compile_spec("attention=gguf_q4_k", imatrix=lk)
    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(5))
    y = spec.weight_transform("attention", "model.layers.0.self_attn.q_proj.weight", w)
    assert torch.equal(y, gguf_k_quant_dequant(w, "q4_k", torch.from_numpy(entries["blk.0.attn_q.weight"].astype(np.float32))))
    assert not torch.equal(y, spec.weight_transform("attention", "model.layers.0.self_attn.k_proj.weight", w))
    assert not torch.equal(y, compile_spec("attention=gguf_q4_k").weight_transform("attention", "x.self_attn.q_proj.weight", w))
    from fideval.quant.gguf_legacy_imatrix import legacy_imatrix_quant_dequant

    q5 = compile_spec("attention=gguf_q5_0", imatrix=lk).weight_transform("attention", "model.layers.0.self_attn.q_proj.weight", w)
    assert torch.equal(q5, legacy_imatrix_quant_dequant(w, "q5_0", torch.from_numpy(entries["blk.0.attn_q.weight"].astype(np.float32))))
    with pytest.raises(FidevalError, match="attention use\\(s\\) a format without importance weights"):
        compile_spec("attention=gguf_q8_0", imatrix=lk)


def test_runner_applies_the_imatrix_per_tensor(tmp_path):
    from model_fixtures import build, tokens

    from fideval.model.runner import Runner, RunnerOptions
    from fideval.quant.imatrix import ImatrixLookup
    from fideval.quant.spec import compile_spec

    ref = build("llama", tmp_path / "llama")
    g = np.random.default_rng(6)
    names = [f"blk.{i}.attn_{t}.weight" for i in range(2) for t in ("q", "k", "v", "output")]
    lk = ImatrixLookup(read_imatrix(_legacy(tmp_path / "i.dat", {n: g.gamma(0.3, 1, 64) for n in names}, ncall=1)), "llama", 2)
    seen = []

    def logits(spec):
        def wt(cls, name, t):
            seen.append(name)
            return spec.weight_transform(cls, name, t)

        r = Runner(ref, RunnerOptions(weight_transform=wt, micro_batch=2))
        return torch.stack([x for _, x in r.run(tokens(r.vocab_size, n=2, length=12), canary=False)])

    with_im = logits(compile_spec("attention=gguf_iq4_nl", imatrix=lk))
    assert {lk.gguf_name(n) for n in seen if ".self_attn." in n} == set(names)  # every attention tensor found its entry
    plain = logits(compile_spec("attention=gguf_iq4_nl"))
    assert torch.isfinite(with_im).all() and not torch.equal(with_im, plain)
