"""BackgroundWriter: the same store bytes as the synchronous writer, errors raised in the caller's thread as one
line, no partial shard, resume semantics unchanged."""

from __future__ import annotations

import errno
import time

import numpy as np
import pytest
import torch
from test_store_roundtrip import META, _data

from fideval.errors import FidevalError
from fideval.fsio import atomic_open
from fideval.store import StoreReader, StoreWriter
from fideval.store import writer as writer_mod
from fideval.store.background import BackgroundWriter
from fideval.store.verify import verify_store


def _files(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _async(root, data, depth=2):
    w = BackgroundWriter(StoreWriter(root, META), depth=depth)
    for sid, (lg, tk) in data.items():
        assert not w.done(sid)
        w.write(sid, torch.from_numpy(lg) if sid.endswith("1") else lg, tk, sid.split(".c")[0], "code")
    w.meta["canary"] = "{}"
    w.finish()
    return w


def test_same_bytes_as_the_synchronous_writer(tmp_path):
    data = _data(n=6, L=40)
    sync = StoreWriter(tmp_path / "sync", META)
    for sid, (lg, tk) in data.items():
        sync.write(sid, torch.from_numpy(lg) if sid.endswith("1") else lg, tk, sid.split(".c")[0], "code")
    sync.meta["canary"] = "{}"
    sync.finish()
    for depth in (1, 2):
        w = _async(tmp_path / f"bg{depth}", data, depth)
        assert _files(tmp_path / f"bg{depth}") == _files(tmp_path / "sync")  # shards, manifest, index: byte for byte
        assert w.stats["shards"] == 6 and w.stats["write_s"] > 0 and 0 <= w.hidden() <= 1
    assert verify_store(tmp_path / "bg2")[0] == []


def test_a_slow_writer_makes_the_caller_wait_at_depth(tmp_path, monkeypatch):
    real = writer_mod.write_shard

    def slow(*a, **k):
        time.sleep(0.05)
        return real(*a, **k)

    monkeypatch.setattr(writer_mod, "write_shard", slow)
    data = _data(n=5)
    w = BackgroundWriter(StoreWriter(tmp_path / "s", META), depth=2)
    t0 = time.perf_counter()
    for sid, (lg, tk) in data.items():
        w.write(sid, lg, tk, "w", "code")
    queued = time.perf_counter() - t0
    t1 = time.perf_counter()
    w.finish()
    left = time.perf_counter() - t1
    assert queued >= 0.1 and left >= 0.04  # 5 shards, 2 in flight: the caller waited for 3 writes, finish for the rest
    assert w.stats["waited_s"] >= 0.1 and w.hidden() < 0.7


@pytest.mark.parametrize("failure", ["disk full", "bug"])
def test_an_error_in_the_writer_thread_is_one_line_and_leaves_no_partial_shard(tmp_path, monkeypatch, failure):
    data = _data(n=4)
    ids = list(data)
    real = writer_mod.write_shard

    def failing(path, logits, tokens, meta, **kw):
        if meta["seq_id"] != ids[1]:
            return real(path, logits, tokens, meta, **kw)
        if failure == "bug":
            raise RuntimeError("boom\nsecond line")
        with atomic_open(path, "wb") as f:  # half a shard, then the disk is full
            f.write(b"x" * 100)
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(writer_mod, "write_shard", failing)
    root = tmp_path / "s"
    w = BackgroundWriter(StoreWriter(root, META))
    with pytest.raises(FidevalError) as e:
        for sid, (lg, tk) in data.items():
            w.write(sid, lg, tk, "w", "code")
        w.flush()
    w.close()
    line = e.value.line()
    assert "\n" not in line
    assert ("disk full while writing" in line) if failure == "disk full" else (f"writing shard {ids[1]} failed: RuntimeError: boom" in line)
    shards = sorted(p.name for p in (root / "shards").iterdir())
    assert f"{ids[1]}.safetensors" not in shards and not [s for s in shards if s.endswith(".tmp")]
    assert f"{ids[0]}.safetensors" in shards  # written before the failure, with its sidecar: a resume skips it
    again = StoreWriter(root, META)
    assert again.done(ids[0]) and not again.done(ids[1])


def test_bad_logits_fail_like_the_synchronous_writer(tmp_path):
    lg, tk = _data(n=1)["code-000.c0"]
    bad = lg.copy()
    bad[2, 3] = np.inf
    w = BackgroundWriter(StoreWriter(tmp_path / "s", META))
    w.write("a", bad, tk, "a", "code")
    with pytest.raises(FidevalError, match="1 logit rows hold NaN or inf"):
        w.finish()
    w.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_tensors_through_locked_buffers(tmp_path):
    data = _data(n=5, L=64)
    w = BackgroundWriter(StoreWriter(tmp_path / "s", META), depth=2)
    for sid, (lg, tk) in data.items():
        w.write(sid, torch.from_numpy(lg).cuda() * 1.0, tk, "w", "code")
    w.finish()
    assert w._buffers is None  # unlocked at the end
    r = StoreReader(tmp_path / "s")
    for sid, (lg, _) in data.items():
        assert r.read(sid)[0].tobytes() == lg.tobytes()
