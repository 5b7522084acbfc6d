"""Logit store: write -> verify -> read is bit-identical; corruption, truncation, hostile headers and resume."""

from __future__ import annotations

import json
import os
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_runner import run_fideval
from faults_fixtures import flip_byte
from safetensors import safe_open

from fideval.errors import FidevalError
from fideval.fsio import sha256_file
from fideval.store import StoreReader, StoreWriter
from fideval.store.verify import verify_store

V = 37
META = {"model_id": "toy/model", "model_revision": "r1", "tokenizer_sha256": "ab" * 32, "vocab_size": V, "kind": "logits"}


def _data(n=4, L=12, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(n):
        lg = (rng.standard_normal((L, V)) * 5).astype(np.float32)
        lg[0, 0] = np.float32(-0.0)  # signed zero and tiny values must survive bit-exactly
        lg[1, 1] = np.float32(1e-42)
        out[f"code-{i:03d}.c{i % 2}"] = (lg, rng.integers(0, V, L).astype(np.int32))
    return out


def _write(root: Path, data, finish=True) -> StoreWriter:
    w = StoreWriter(root, META)
    for sid, (lg, tk) in data.items():
        assert not w.done(sid)
        w.write(sid, torch.from_numpy(lg) if sid.endswith("1") else lg, tk, window_id=sid.split(".c")[0], domain="code")
        assert w.done(sid)
    if finish:
        w.finish()
    return w


def test_roundtrip_bit_identical(tmp_path):
    data = _data()
    _write(tmp_path / "s", data)
    problems, totals = verify_store(tmp_path / "s")
    assert problems == [] and totals["shards"] == 4 and totals["rows"] == 4 * 12
    r = StoreReader(tmp_path / "s")
    assert r.seq_ids == sorted(data) and r.vocab_size == V and r.meta["model_id"] == "toy/model"
    for sid, (lg, tk) in data.items():
        a, t = r.read(sid)
        assert isinstance(a, np.memmap) and a.dtype == np.float32 and t.dtype == np.int32
        assert a.tobytes() == lg.tobytes() and np.array_equal(t, tk)
        # independent oracle: the safetensors library reads our hand-written file
        with safe_open(str(r.path(sid)), framework="numpy") as f:
            assert f.get_tensor("logits").tobytes() == lg.tobytes()
            assert np.array_equal(f.get_tensor("token_ids"), tk)
            meta = f.metadata()
            assert meta["format"] == "fideval.logits" and meta["version"] == "1" and meta["seq_id"] == sid
            assert meta["tokenizer_sha256"] == "ab" * 32 and meta["vocab_size"] == str(V)
    seen = [(sid, x, t) for sid, x, t in r.iter(prefetch=1)]
    assert [s for s, _, _ in seen] == sorted(data)
    for sid, x, t in seen:  # CPU tensors are the caller's to keep
        assert x.dtype == torch.float32 and x.numpy().tobytes() == data[sid][0].tobytes()
        assert np.array_equal(t, data[sid][1])
    it = r.iter(seq_ids=sorted(data)[::-1], prefetch=2)  # any order; leaving early stops the thread
    assert next(it)[0] == max(data)
    it.close()
    assert not any(t.name == "fideval-store-prefetch" and t.is_alive() for t in __import__("threading").enumerate())
    m = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert m["format"] == "fideval.store" and m["version"] == "2"
    for sid, e in m["shards"].items():
        p = tmp_path / "s" / e["file"]
        assert e["sha256"] == sha256_file(p) and e["bytes"] == p.stat().st_size and e["rows"] == 12
    assert not list((tmp_path / "s" / "shards").glob("*.entry.json"))  # sidecars folded into the manifest
    import pyarrow.parquet as pq

    idx = pq.read_table(tmp_path / "s" / "index.parquet").to_pydict()
    assert idx["seq_id"] == sorted(data) and idx["sha256"] == [m["shards"][s]["sha256"] for s in sorted(data)]
    out = run_fideval("verify", str(tmp_path / "s"))
    assert out.code == 0 and "ok (4 shards, 48 rows" in out.stdout


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_corruption_caught_by_verify_and_read(tmp_path, damage):
    data = _data()
    _write(tmp_path / "s", data)
    sid = sorted(data)[2]
    path = tmp_path / "s" / "shards" / f"{sid}.safetensors"
    if damage == "flip":
        flip_byte(path, path.stat().st_size - 100)  # inside the logits
    else:
        os.truncate(path, path.stat().st_size - 7)
    out = run_fideval("verify", str(tmp_path / "s"))
    assert out.code == 1
    lines = [ln for ln in out.stderr.splitlines() if sid in ln]
    assert lines and all("\n" not in ln for ln in lines)
    assert ("SHA-256 differs" if damage == "flip" else "truncated") in lines[0]
    r = StoreReader(tmp_path / "s")
    with pytest.raises(FidevalError, match=f"shard shards/{sid}.safetensors: ") as e:
        r.read(sid)
    assert "\n" not in str(e.value)
    with pytest.raises(FidevalError, match=sid):
        for _ in StoreReader(tmp_path / "s").iter():
            pass
    good = min(data)
    assert r.read(good)[0].tobytes() == data[good][0].tobytes()  # the others still read


def test_hostile_header_refused_before_allocating(tmp_path):
    """A header claiming 10^12 rows (4 TB) on a tiny file: refused by the bounded parser, not a MemoryError."""
    _write(tmp_path / "s", _data(n=1))
    r0 = StoreReader(tmp_path / "s")
    sid = r0.seq_ids[0]
    path = r0.path(sid)
    rows = 10**12
    header = {"__metadata__": {"format": "fideval.logits", "version": "1", "seq_id": sid, "window_id": "code-000",
                               "domain": "code", "model_id": "toy/model", "model_revision": "r1",
                               "tokenizer_sha256": "ab" * 32, "vocab_size": str(V), "kind": "logits", "row_start": "0"},
              "logits": {"dtype": "F32", "shape": [rows, V], "data_offsets": [0, rows * V * 4]},
              "token_ids": {"dtype": "I32", "shape": [rows], "data_offsets": [rows * V * 4, rows * V * 4 + rows * 4]}}
    raw = json.dumps(header).encode()
    raw += b" " * (-(8 + len(raw)) % 8)
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + b"\0" * 64)
    m = json.loads((tmp_path / "s" / "manifest.json").read_text())  # make the hash agree, so the header is what is tested
    m["shards"][sid].update(sha256=sha256_file(path), bytes=path.stat().st_size)
    (tmp_path / "s" / "manifest.json").write_text(json.dumps(m))
    tracemalloc.start()
    with pytest.raises(FidevalError, match="byte range .* outside the .* data bytes") as e:
        StoreReader(tmp_path / "s").read(sid)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 64 << 20 and sid in str(e.value)
    with pytest.raises(FidevalError, match="outside"):
        next(StoreReader(tmp_path / "s").iter())
    problems, _ = verify_store(tmp_path / "s")
    assert any("outside" in p for p in problems)
    # a header length larger than the file
    path.write_bytes((10**12).to_bytes(8, "little") + b"{}")
    with pytest.raises(FidevalError, match="header length"):
        from fideval.store.shard import read_header
        read_header(path)


def test_resume_skips_verified_and_rewrites_corrupt(tmp_path):
    data = _data(n=3)
    root = tmp_path / "s"
    _write(root, data, finish=False)  # a killed run: shards + sidecars, no manifest
    assert not (root / "manifest.json").exists()
    ids = sorted(data)
    mtimes = {s: (root / "shards" / f"{s}.safetensors").stat().st_mtime_ns for s in ids}
    flip_byte(root / "shards" / f"{ids[1]}.safetensors", 200)  # damaged after it was written
    (root / "shards" / f".{ids[2]}.safetensors.x1y2.tmp").write_bytes(b"partial")  # a write that was killed
    w = StoreWriter(root, META)
    assert not list((root / "shards").glob("*.tmp"))
    assert w.done(ids[0]) and w.done(ids[2]) and not w.done(ids[1])
    w.write(ids[1], data[ids[1]][0], data[ids[1]][1], window_id="code-001", domain="code")
    w.finish()
    assert (root / "shards" / f"{ids[0]}.safetensors").stat().st_mtime_ns == mtimes[ids[0]]  # not rewritten
    assert verify_store(root)[0] == []
    r = StoreReader(root)
    for sid in ids:
        assert r.read(sid)[0].tobytes() == data[sid][0].tobytes()
    # resuming a finished store (no sidecars) re-hashes against the manifest and still catches a bad shard
    flip_byte(root / "shards" / f"{ids[0]}.safetensors", 300)
    w2 = StoreWriter(root, META)
    assert not w2.done(ids[0]) and w2.done(ids[1])
    # another teacher may not be mixed in
    with pytest.raises(FidevalError, match="model_id"):
        StoreWriter(root, {**META, "model_id": "other"})


def test_verify_finds_stray_missing_and_index_problems(tmp_path):
    data = _data(n=3)
    root = tmp_path / "s"
    _write(root, data)
    ids = sorted(data)
    (root / "shards" / "extra.safetensors").write_bytes(b"x")
    (root / "shards" / f"{ids[0]}.safetensors").unlink()
    problems, _ = verify_store(root)
    assert any("extra.safetensors: stray file" in p for p in problems)
    assert any(f"{ids[0]}.safetensors: missing" in p for p in problems)
    (root / "index.parquet").unlink()
    assert any("index.parquet: missing" in p for p in verify_store(root)[0])
    m = json.loads((root / "manifest.json").read_text())
    m["shards"][ids[1]]["file"] = "../../etc/passwd"
    (root / "manifest.json").write_text(json.dumps(m))
    assert any("leaves its root" in p for p in verify_store(root)[0])
    out = run_fideval("verify", str(tmp_path / "nope"))
    assert out.code == 2 and out.stderr.count("\n") == 1 and "is not a folder" in out.stderr


def test_writer_refuses_bad_input(tmp_path):
    w = StoreWriter(tmp_path / "s", META)
    lg, tk = _data(n=1)["code-000.c0"]
    with pytest.raises(FidevalError, match=r"not \[rows, 37\]"):
        w.write("a", lg[:, :5], tk, "a", "code")
    bad = lg.copy()
    bad[3, 4] = np.nan
    with pytest.raises(FidevalError, match="1 logit rows hold NaN"):
        w.write("a", bad, tk, "a", "code")
    with pytest.raises(FidevalError, match="cannot be a shard name"):
        w.write("../evil", lg, tk, "a", "code")
    with pytest.raises(FidevalError, match="float32"):
        w.write("a", lg.astype(np.float16), tk, "a", "code")
    with pytest.raises(FidevalError, match="float32"):
        w.write("a", torch.from_numpy(lg).bfloat16(), tk, "a", "code")
    with pytest.raises(FidevalError, match="kind"):
        StoreWriter(tmp_path / "t", {**META, "kind": "probs"})
    with pytest.raises(FidevalError, match="no shard for sequence"):
        _write(tmp_path / "u", _data(n=1))
        StoreReader(tmp_path / "u").read("missing-000")


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@CUDA
def test_host_buffers_exact_size_locked_then_unlocked():
    from fideval.store.pinned import HostBuffers

    hb = HostBuffers(pin=True)
    a, b = hb.new(134_217_729), hb.new(5)  # not a power of two; tiny sizes get 8 bytes
    assert a.numel() == 134_217_729 and b.numel() == 8 and a.is_pinned() and b.is_pinned() and hb.locked == 2
    x = torch.arange(a.numel() // 4, dtype=torch.int32)
    a[: x.numel() * 4].copy_(x.view(torch.uint8))
    g = a[: x.numel() * 4].view(torch.int32).to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(g.cpu(), x)
    hb.drop(a)
    assert not a.is_pinned() and hb.locked == 1
    hb.close()
    assert not b.is_pinned() and hb.locked == 0
    assert not hb.new(16).is_pinned()  # after close: plain memory (a straggling reader thread)


@CUDA
def test_iter_cuda_bit_identical_and_unlocks_its_buffers(tmp_path, monkeypatch):
    import fideval.store.reader as reader_mod

    made = []

    class Watched(reader_mod.HostBuffers):
        def __init__(self, pin):
            super().__init__(pin)
            self.sizes = []
            made.append(self)

        def new(self, nbytes):
            buf = super().new(nbytes)
            self.sizes.append(buf.numel())
            return buf

    monkeypatch.setattr(reader_mod, "HostBuffers", Watched)
    data = _data(n=6)
    _write(tmp_path / "s", data)
    r = StoreReader(tmp_path / "s")
    sizes = {sid: (tmp_path / "s" / r.entry(sid)["file"]).stat().st_size for sid in data}
    for prefetch in (1, 2):
        seen = []
        for sid, x, t in r.iter(device="cuda", prefetch=prefetch):
            assert x.is_cuda and made[-1].locked <= prefetch  # the caller's shard holds no host buffer
            seen.append((sid, x, t))
        # kept to the end: a buffer reused for later shards must not have changed an earlier shard's GPU copy
        assert [sid for sid, _, _ in seen] == sorted(data)
        for sid, x, t in seen:
            assert x.cpu().numpy().tobytes() == data[sid][0].tobytes() and np.array_equal(t, data[sid][1])
        hb = made[-1]
        assert hb.pin and hb.locked == 0  # every buffer unlocked at the end
        assert 1 <= len(hb.sizes) <= prefetch and set(hb.sizes) <= set(sizes.values())  # exact shard sizes
    it = r.iter(device="cuda", prefetch=2)  # leaving early unlocks too
    next(it)
    assert made[-1].locked >= 1
    it.close()
    assert made[-1].locked == 0
