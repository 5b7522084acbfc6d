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
