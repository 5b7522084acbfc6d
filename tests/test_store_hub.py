"""Published stores: the real huggingface_hub code resolves ``hf://`` specs from a Hub cache laid out on disk
(blobs + snapshot symlinks + refs, as the library itself lays it out), offline."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest
from cli_runner import run_fideval

from fideval.errors import FidevalError
from fideval.store import StoreReader, StoreWriter
from fideval.store.hub import parse_spec, resolve_store
from fideval.store.verify import verify_store

COMMIT = "0123456789abcdef0123456789abcdef01234567"
V = 11


@pytest.fixture
def hub_cache(tmp_path):
    """A store published as dataset org/teachers, sub-folder demo/l16, cached at COMMIT with refs/main."""
    store = tmp_path / "made"
    w = StoreWriter(store, {"model_id": "toy", "model_revision": "r", "tokenizer_sha256": "cd" * 32,
                           "vocab_size": V, "kind": "logits"})
    rng = np.random.default_rng(1)
    data = {}
    for i in range(2):
        sid = f"prose-{i:03d}"
        data[sid] = (rng.standard_normal((16, V)).astype(np.float32), rng.integers(0, V, 16).astype(np.int32))
        w.write(sid, *data[sid], window_id=sid, domain="prose")
    w.finish()
    cache = tmp_path / "hub"
    repo = cache / "datasets--org--teachers"
    snap = repo / "snapshots" / COMMIT
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    for f in store.rglob("*"):
        if f.is_file():
            blob = repo / "blobs" / hashlib.sha256(f.read_bytes()).hexdigest()
            blob.write_bytes(f.read_bytes())
            link = snap / "demo" / "l16" / f.relative_to(store)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(blob, link.parent))
    # another sub-folder of the same dataset that must not be needed
    (snap / "other").mkdir()
    return cache, data


def test_parse_spec():
    assert parse_spec("hf://datasets/org/teachers@abc/demo/l16") == ("org/teachers", "abc", "demo/l16")
    assert parse_spec("hf://datasets/org/teachers") == ("org/teachers", "main", "")
    for bad in ("hf://models/org/x", "hf://datasets/org", "hf://datasets/org/x@r/../up"):
        with pytest.raises(FidevalError):
            parse_spec(bad)


@pytest.mark.parametrize("rev", [COMMIT, "main"])
def test_resolve_from_on_disk_cache(hub_cache, rev):
    cache, data = hub_cache
    path = resolve_store(f"hf://datasets/org/teachers@{rev}/demo/l16", cache_dir=cache, local_files_only=True)
    assert path == Path(cache).resolve() / "datasets--org--teachers" / "snapshots" / COMMIT / "demo" / "l16"
    assert (path / "shards" / "prose-000.safetensors").is_symlink()  # files are links into blobs/
    r = StoreReader(path)
    for sid, (lg, tk) in data.items():
        a, t = r.read(sid)
        assert a.tobytes() == lg.tobytes() and np.array_equal(t, tk)
    assert [s for s, _, _ in r.iter()] == sorted(data)
    assert verify_store(path)[0] == []


def test_missing_revision_offline_is_one_line(hub_cache):
    cache, _ = hub_cache
    with pytest.raises(FidevalError, match="revision 'v9' of org/teachers is not in the local Hub cache") as e:
        resolve_store("hf://datasets/org/teachers@v9/demo/l16", cache_dir=cache, local_files_only=True)
    assert "\n" not in str(e.value)
    with pytest.raises(FidevalError, match="no manifest.json under other"):
        resolve_store(f"hf://datasets/org/teachers@{COMMIT}/other", cache_dir=cache, local_files_only=True)


def test_cli_verify_hub_spec_offline_via_env(hub_cache):
    cache, _ = hub_cache
    env = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}  # read at import: a fresh process
    ok = run_fideval("verify", "hf://datasets/org/teachers@main/demo/l16", env=env, fresh_process=True)
    assert ok.code == 0 and "ok (2 shards, 32 rows" in ok.stdout, ok.stderr
    bad = run_fideval("verify", "hf://datasets/org/teachers@nope/demo/l16", env=env, fresh_process=True)
    assert bad.code == 2 and bad.stderr.count("\n") == 1 and "not in the local Hub cache" in bad.stderr


def test_link_outside_a_local_store_is_refused(hub_cache, tmp_path):
    """Outside a Hub cache a shard that is a symlink leaving the store is refused, not followed."""
    made = tmp_path / "made"
    outside = tmp_path / "outside.safetensors"
    shard = made / "shards" / "prose-000.safetensors"
    outside.write_bytes(shard.read_bytes())
    shard.unlink()
    shard.symlink_to(outside)
    with pytest.raises(FidevalError, match="resolves outside"):
        StoreReader(made).read("prose-000")
