"""The score loop's teacher stream (``fideval.store.feed.TeacherFeed``): in order it hands out the store's own
shards, out of order it steps aside; on a GPU, records scored with it are identical to records scored from memory maps.

No typer here: the GPU machine runs this file as it is."""

from __future__ import annotations

import threading

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from fideval.score import run as score_run
from fideval.score.candidate import Candidate, store_shards
from fideval.store import StoreReader, StoreWriter
from fideval.store.feed import TeacherFeed

VOCAB = 257
LENGTHS = {"code-000.c0": 9, "code-000.c1": 7, "prose-000.c0": 2, "prose-001.c0": 5}


def _store(root, logits, tokens, model="toy/teacher"):
    w = StoreWriter(root, {"model_id": model, "model_revision": "0" * 40, "tokenizer_sha256": "a" * 64,
                           "vocab_size": VOCAB, "kind": "logits"})
    for sid in LENGTHS:
        w.write(sid, logits[sid], tokens[sid], window_id=sid.split(".c")[0], domain=sid.split("-")[0])
    w.finish()
    return StoreReader(root)


@pytest.fixture()
def stores(tmp_path):
    rng = np.random.default_rng(3)
    tokens = {s: rng.integers(0, VOCAB, n).astype(np.int32) for s, n in LENGTHS.items()}
    ref = {s: (rng.standard_normal((n, VOCAB)) * 3).astype(np.float32) for s, n in LENGTHS.items()}
    cand = {s: x + (rng.standard_normal(x.shape) * 0.3).astype(np.float32) for s, x in ref.items()}
    return _store(tmp_path / "t", ref, tokens), _store(tmp_path / "c", cand, tokens, "toy/cand"), ref, tokens


def _prefetch_threads() -> int:
    return sum(t.name == "fideval-store-prefetch" and t.is_alive() for t in threading.enumerate())


def test_feed_in_order_then_out_of_order(stores):
    teacher, _, ref, tokens = stores
    order = teacher.seq_ids
    feed = TeacherFeed(teacher, order, torch.device("cpu"))
    for sid in order[:2]:
        x, t = feed.get(sid)
        assert x.numpy().tobytes() == ref[sid].tobytes() and np.array_equal(t, tokens[sid])
    assert feed.get(order[3]) is None  # order[2] was next: the stream stops ...
    assert feed.get(order[2]) is None and _prefetch_threads() == 0  # ... for good, its thread gone
    feed.close()


def _score(teacher, cand, out, device, order=None, ids=None):
    items = Candidate(name="c", path="store", shards=store_shards(cand, ids or teacher.seq_ids, device=device), order=order)
    return score_run.score_candidate(teacher, items, out, score_run.ScoreSettings(device=device, cpu_check_every=2))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_records_with_the_feed_equal_records_from_memory_maps(stores, tmp_path):
    teacher, cand, _, _ = stores
    with_feed = _score(teacher, cand, tmp_path / "feed", "cuda", order=teacher.seq_ids)
    mapped = _score(teacher, cand, tmp_path / "mmap", "cuda")
    shuffled = _score(teacher, cand, tmp_path / "shuf", "cuda", order=teacher.seq_ids, ids=teacher.seq_ids[::-1])
    cpu = _score(teacher, cand, tmp_path / "cpu", "cpu")
    a = pq.read_table(tmp_path / "feed" / "records.parquet")
    assert a.equals(pq.read_table(tmp_path / "mmap" / "records.parquet"))
    s = pq.read_table(tmp_path / "shuf" / "records.parquet").to_pandas().sort_values(["seq_id", "position"])
    assert a.to_pandas().sort_values(["seq_id", "position"]).reset_index(drop=True).equals(s.reset_index(drop=True))
    assert with_feed["kernel"] == "triton" and with_feed["rows"] == mapped["rows"] == shuffled["rows"] == cpu["rows"]
    assert 0 < with_feed["cpu_check"]["max_rel_diff"] <= 2e-12 and with_feed["cpu_check"]["rows_checked"] > 0
    c = pq.read_table(tmp_path / "cpu" / "records.parquet").to_pandas()
    assert np.allclose(a.column("kld").to_numpy(), c.kld.to_numpy(), rtol=2e-12, atol=2e-14)
    assert _prefetch_threads() == 0
