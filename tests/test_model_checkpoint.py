"""The bounded safetensors reader: byte-exact reads (whole, row ranges, split across threads) and bad headers."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors.torch import save_file

import fideval.model.weights.checkpoint as ck
from fideval.errors import FidevalError


def _folder(tmp_path, tensors):
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text("{}")
    return tmp_path


def test_reads_match_safetensors(tmp_path, monkeypatch):
    monkeypatch.setattr(ck, "PIECE", 1000)  # force the multi-threaded split path
    t = torch.randn(300, 77)
    b = torch.randn(5, 3).to(torch.bfloat16)
    c = ck.Checkpoint(_folder(tmp_path, {"a": t, "b": b, "i": torch.arange(10)}))
    assert torch.equal(c.read("a"), t) and torch.equal(c.read("a", rows=(5, 200)), t[5:200])
    assert torch.equal(c.read("b"), b) and torch.equal(c.read("i"), torch.arange(10))
    out = torch.empty(300, 77)
    assert c.read("a", out=out) is out and torch.equal(out, t)
    with pytest.raises(FidevalError, match="'a'.*does not fit"):
        c.read("a", out=torch.empty(3, 77))


def _raw(tmp_path, header: dict, payload: bytes, claimed: int | None = None):
    h = json.dumps(header).encode()
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", claimed if claimed is not None else len(h)) + h + payload)
    return tmp_path


def test_header_longer_than_the_file(tmp_path):
    with pytest.raises(FidevalError, match="header length .* impossible"):
        ck.Checkpoint(_raw(tmp_path, {}, b"", claimed=1 << 40))


def test_offsets_inconsistent_with_shape(tmp_path):
    hdr = {"w": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 60]}}
    with pytest.raises(FidevalError, match="'w'.*inconsistent"):
        ck.Checkpoint(_raw(tmp_path, hdr, bytes(64)))


def test_tensor_past_the_end_of_the_file(tmp_path):
    hdr = {"w": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 64]}}
    with pytest.raises(FidevalError, match="'w'.*inconsistent"):
        ck.Checkpoint(_raw(tmp_path, hdr, bytes(32)))


def test_index_names_a_missing_shard(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "model-00001.safetensors"}}))
    with pytest.raises(FidevalError, match="model-00001.safetensors.*missing"):
        ck.Checkpoint(tmp_path)


def test_index_shard_outside_the_folder(tmp_path):
    (tmp_path / "m").mkdir()
    save_file({"w": torch.zeros(2)}, str(tmp_path / "evil.safetensors"))
    (tmp_path / "m" / "config.json").write_text("{}")
    (tmp_path / "m" / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "../evil.safetensors"}}))
    with pytest.raises(FidevalError, match="outside the folder"):
        ck.Checkpoint(tmp_path / "m")
