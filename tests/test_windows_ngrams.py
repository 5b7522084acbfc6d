"""The n-gram screen against brute-force Python sets and the oracles of ``windows_oracles.py``: normalisation,
hashing, the evaluation-side index, the streamed pass, fractions, attribution."""

from __future__ import annotations

import numpy as np
import pytest
from windows_oracles import (
    CalibrationIndex,
    attribute,
    oracle_bytes_hash,
    oracle_bytes_words,
    oracle_grams,
    oracle_ngram_hash,
    oracle_word_hash,
    oracle_words,
    overlap_of,
    overlaps_of,
)

from fideval.windows.screen import Hasher, Probe, Queries, hashing, rank
from fideval.windows.screen import ngrams as ng
from fideval.windows.screen.scan import scan

SAMPLES = [
    "Hello, World! The_quick brown-fox; jumps.",
    "ﬁne Ｆｕｌｌｗｉｄｔｈ ＡＢＣ１２３ café CAFÉ naïve — «quotes» 'x' ½",
    "Здравствуй, мир! 你好，世界。 हिन्दी भाषा ٱلْعَرَبِيَّة",
    "tabs\tand\nnewlines\r\n  and   spaces__under_score 3.14 x+y=z",
    "",
    "   ...!!!   ",
]


@pytest.mark.parametrize("text", SAMPLES)
def test_normalisation_matches_oracle(text):
    assert ng.words(text) == oracle_words(text)


def _rand_docs(rng, n_docs, vocab, lo=5, hi=60):
    return [" ".join(rng.choice(vocab, size=int(rng.integers(lo, hi)))) for _ in range(n_docs)]


VOCAB = np.array("a b c d Ünï cödé, Straße STRASSE x. y! z? w ﬁ fi ß 1 2".split())


def test_word_hash_identity_and_ngram_count():
    rng = np.random.default_rng(0)
    docs = _rand_docs(rng, 40, VOCAB) + SAMPLES
    h, doc = ng.word_hashes(docs)
    words = [w for d in docs for w in oracle_words(d)]
    assert h.size == len(words)
    # equal words <=> equal hashes (no collisions on this vocabulary)
    by_word: dict[str, int] = {}
    for w, x in zip(words, h.tolist()):
        assert by_word.setdefault(w, x) == x
    assert len(set(by_word.values())) == len(by_word)
    for n in (1, 3, 13):
        g, gdoc = ng.text_ngrams(docs, n)
        assert g.size == sum(len(oracle_grams(d, n)) for d in docs)  # no n-gram straddles documents
        assert np.all(np.diff(gdoc) >= 0)


@pytest.mark.parametrize("n,merge_every", [(2, 30), (5, 100), (13, 64_000_000)])
def test_fraction_equals_bruteforce_set(n, merge_every):
    rng = np.random.default_rng(n)
    vocab = np.array([f"w{i}" for i in range(6)] + ["Ab,", "ab", "É", "é"])
    cal = _rand_docs(rng, 30, vocab, 10, 80)
    ev = _rand_docs(rng, 12, vocab, 10, 80) + [cal[3], cal[7][: len(cal[7]) // 2]]
    hasher = Hasher("words", n)
    index = CalibrationIndex.build(cal, hasher, batch_chars=300, merge_every=merge_every)  # small: many merges, batches > buffer
    cal_set = {g for d in cal for g in oracle_grams(d, n)}
    assert index.hashes.size == len(cal_set)
    assert np.all(index.hashes[1:] > index.hashes[:-1])  # sorted, unique
    for d in ev:
        grams = oracle_grams(d, n)
        ov = overlap_of(hasher.of_texts([d])[0], index)
        assert ov.total == len(grams)
        assert ov.matched == sum(g in cal_set for g in grams)
        assert ov.fraction == (sum(g in cal_set for g in grams) / len(grams) if grams else 0.0)


def test_token_ngrams_equal_bruteforce():
    rng = np.random.default_rng(5)
    cal = [rng.integers(0, 4, size=int(rng.integers(0, 40))) for _ in range(50)]
    ev = [rng.integers(0, 4, size=30) for _ in range(20)] + [cal[1]]
    n = 6
    h, doc = ng.token_ngrams(cal, n)
    cal_set = {tuple(s[i:i + n].tolist()) for s in cal for i in range(len(s) - n + 1)}
    assert np.unique(h).size == len(cal_set)
    index = CalibrationIndex(hashes=np.unique(h))
    for s in ev:
        grams = [tuple(s[i:i + n].tolist()) for i in range(len(s) - n + 1)]
        ov = overlap_of(ng.token_ngrams([s], n)[0], index)
        assert (ov.total, ov.matched) == (len(grams), sum(g in cal_set for g in grams))


def test_attribution_ranks_calibration_documents_by_shared_ngrams():
    rng = np.random.default_rng(9)
    vocab = np.array([f"v{i}" for i in range(50)])
    cal = _rand_docs(rng, 20, vocab, 30, 60)
    hasher = Hasher("words", 4)
    index = CalibrationIndex.build(cal, hasher)
    target = cal[4] + " " + " ".join(cal[11].split()[:12])
    ov = overlap_of(hasher.of_texts([target])[0], index)
    top = attribute(((i, d) for i, d in enumerate(cal)), {"w": ov.matched_hashes}, hasher, top_k=3)["w"]
    tg = set(oracle_grams(target, 4))
    expect = sorted(((len(tg & set(oracle_grams(d, 4))), -i) for i, d in enumerate(cal)), reverse=True)
    expect = [(c, -j) for c, j in expect if c][:3]
    assert [(t["shared_ngrams"], t["document"]) for t in top] == expect
    assert top[0]["document"] == 4


def test_batched_overlaps_equal_per_document():
    rng = np.random.default_rng(3)
    vocab = np.array([f"t{i}" for i in range(5)])
    cal = _rand_docs(rng, 20, vocab, 10, 60)
    ev = _rand_docs(rng, 15, vocab, 0, 60)
    hasher = Hasher("words", 5)
    index = CalibrationIndex.build(cal, hasher)
    h, doc = hasher.of_texts(ev)
    total, matched = overlaps_of(h, doc, len(ev), index)
    cal_set = {g for d in cal for g in oracle_grams(d, 5)}
    assert total.tolist() == [len(oracle_grams(d, 5)) for d in ev]
    assert matched.tolist() == [sum(g in cal_set for g in oracle_grams(d, 5)) for d in ev]


def test_compiled_hashes_equal_the_documented_definition():
    rng = np.random.default_rng(11)
    long = ["x" * k for k in range(1, 40)] + ["Ünïcödé" * 3, "ﬁ" * 9, "a1b2c3d4e5f6g7h8i9"]
    docs = _rand_docs(rng, 30, VOCAB) + SAMPLES + [" ".join(long), "  ".join(long[::-1]) + " !"]
    h, doc = ng.word_hashes(docs)
    words = [w for d in docs for w in oracle_words(d)]
    assert h.tolist() == [oracle_word_hash(w) for w in words]
    assert doc.tolist() == [i for i, d in enumerate(docs) for _ in oracle_words(d)]
    for n in (1, 4, 13):
        g, gdoc = ng.text_ngrams(docs, n)
        want = [(oracle_ngram_hash([oracle_word_hash(w) for w in ws[i:i + n]]), k)
                for k, ws in enumerate(oracle_words(d) for d in docs) for i in range(len(ws) - n + 1)]
        assert list(zip(g.tolist(), gdoc.tolist())) == want


@pytest.mark.parametrize("unit", ["words", "tokens"])
def test_queries_pass_equals_bruteforce_and_full_index(unit):
    """The windows stage's path (evaluation side indexed, calibration streamed in small batches on two
    threads, queued over two passes) against brute-force sets and the full index."""
    rng = np.random.default_rng(21)
    vocab = np.array([f"q{i}" for i in range(5)] + ["Zz,", "zz"])
    cal = _rand_docs(rng, 40, vocab, 10, 80)
    ev = _rand_docs(rng, 10, vocab, 5, 60) + [cal[5], cal[9][: len(cal[9]) // 3]]
    n = 4
    ids = {w: i for i, w in enumerate(sorted({w for d in cal + ev for w in oracle_words(d)}))}
    if unit == "words":
        hasher = Hasher("words", n)
    else:
        hasher = Hasher("tokens", n, encode=lambda t: np.array([ids[w] for w in oracle_words(t)], np.int64))

    def grams(d):
        return oracle_grams(d, n) if unit == "words" else [tuple(ids[w] for w in g) for g in oracle_grams(d, n)]

    cal_set = {g for d in cal for g in grams(d)}
    full = CalibrationIndex.build(cal, hasher)
    q = Queries(hasher)
    first, second = ev[:6], ev[6:]
    assert all(q.overlap(hasher.of_texts([d])[0]) is None or not grams(d) for d in first)
    q.resolve(((i, d) for i, d in enumerate(cal)), batch_chars=200, threads=2)
    assert q.documents == len(cal) and q.ngrams == sum(len(grams(d)) for d in cal)
    for d in second:  # a second round: queued after the first pass
        q.overlap(hasher.of_texts([d])[0])
    q.resolve(((i, d) for i, d in enumerate(cal)), batch_chars=200, threads=2)
    for d in ev:
        h = hasher.of_texts([d])[0]
        ov = q.overlap(h)
        assert ov is not None
        assert (ov.total, ov.matched) == (len(grams(d)), sum(g in cal_set for g in grams(d)))
        assert ov.matched == overlap_of(h, full).matched
        assert np.array_equal(ov.matched_hashes, overlap_of(h, full).matched_hashes)
    # attribution from the same passes equals a pass of its own
    targets = {str(i): q.overlap(hasher.of_texts([d])[0]).matched_hashes for i, d in enumerate(ev)}
    assert rank(q.pair_doc, q.pair_hash, q.origins, targets) == attribute(enumerate(cal), targets, hasher)


@pytest.mark.parametrize("alphabet", ["all", "dense"])
def test_byte_kernels_equal_the_byte_table(alphabet):
    """The compiled word loop (64-byte vector masks, edge extraction, unaligned loads) against the byte
    table byte by byte: every byte value, documents at every alignment, empty documents, blocks dense with
    one-letter words (more than 16 edges in 64 bytes), words longer than 16 bytes, unpadded buffers."""
    rng = np.random.default_rng(17)
    pool = np.arange(256, dtype=np.uint8) if alphabet == "all" else np.frombuffer(b"aZ9 .\x80\xff_", np.uint8)
    for trial in range(60):
        lens = rng.integers(0, 300 if trial % 4 else 4, size=int(rng.integers(1, 9 if trial % 4 else 200)))
        lens[rng.random(lens.size) < 0.2] = 0
        raw = rng.choice(pool, size=int(lens.sum()))
        if trial % 3 == 0:  # long words: runs of letters up to 70 bytes
            for s in rng.integers(0, max(1, raw.size - 70), size=4):
                raw[s:s + int(rng.integers(17, 70))] = rng.choice(np.frombuffer(b"aBc9\xc3", np.uint8))
        bounds = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        buf = bytes(raw)
        want = oracle_bytes_words(buf, bounds.tolist())
        h, doc = hashing.word_hashes(np.frombuffer(buf, np.uint8), bounds)  # unpadded: the kernel pads a copy
        assert list(zip(h.tolist(), doc.tolist())) == [(oracle_bytes_hash(w), d) for w, d in want]
        # the calibration pass over the same bytes: every n-gram probed, hits exactly the queried ones
        n = 1 + trial % 3
        g, gd = hashing.ngram_hashes(h, doc, n)
        chosen = g[rng.random(g.size) < 0.3]
        p = Probe.of(np.concatenate([chosen, rng.integers(0, 2**63, size=50, dtype=np.uint64)]))
        sc = hashing.Scratch()
        grams, hd, hq = hashing.scan_words(np.frombuffer(buf, np.uint8), bounds, n, p.bitmap, p.bits, p.hashes,
                                           p.starts, p.bucket_bits, sc)
        found = p.find(g)
        assert grams == g.size
        assert hd.tolist() == gd[found >= 0].tolist() and hq.tolist() == found[found >= 0].tolist()


def test_scan_results_do_not_depend_on_which_thread_hashed_a_batch(monkeypatch):
    """The calibration pass hashes a batch on the calling thread when the workers are behind; a slow
    worker forces that path, and the counts, pairs and origins must equal a pass on the calling thread."""
    import threading
    import time

    import fideval.windows.screen.scan as scan_module

    rng = np.random.default_rng(4)
    vocab = np.array([f"s{i}" for i in range(4)])
    cal = _rand_docs(rng, 60, vocab, 5, 40)
    where: list[str] = []
    fast = scan_module.probe_batch

    def slow_workers(hasher, prepared, p):
        on_main = threading.current_thread() is threading.main_thread()
        where.append("main" if on_main else "worker")
        if not on_main:
            time.sleep(0.02)
        return fast(hasher, prepared, p)

    hasher = Hasher("words", 3)
    probe = Probe.of(hasher.of_texts(cal[::7])[0])
    monkeypatch.setattr(scan_module, "probe_batch", slow_workers)
    res = scan(enumerate(cal), hasher, probe, batch_chars=50, threads=1)
    monkeypatch.undo()
    assert {"main", "worker"} <= set(where)
    ref = scan(enumerate(cal), Hasher("words", 3), probe, batch_chars=10**9, threads=1)  # one batch, one worker
    assert (res.documents, res.ngrams) == (ref.documents, ref.ngrams) == (len(cal), sum(len(oracle_grams(d, 3)) for d in cal))
    assert np.array_equal(res.seen, ref.seen)
    assert np.array_equal(res.pair_doc, ref.pair_doc) and np.array_equal(res.pair_hash, ref.pair_hash)
    assert res.origins == ref.origins


def test_queries_locate_equals_a_binary_search():
    """Queries finds resolved hashes by hash probe; the answer is a binary search's, over two passes, for
    hashes resolved, hashes never queued, and no hashes at all."""
    rng = np.random.default_rng(9)
    hasher = Hasher("words", 2)
    cal = _rand_docs(rng, 30, VOCAB)
    q = Queries(hasher)
    assert q._locate(np.zeros(0, np.uint64))[1].size == 0
    for k in range(2):
        q.overlap(hasher.of_texts(_rand_docs(rng, 10, VOCAB))[0])
        q.resolve(enumerate(cal))
        h = np.concatenate([q.known[rng.integers(0, q.known.size, 500)], rng.integers(0, 2**64, 500, dtype=np.uint64)])
        i, found = q._locate(h)
        j = np.minimum(np.searchsorted(q.known, h), q.known.size - 1)
        assert np.array_equal(found, q.known[j] == h) and found[:500].all() and not found[500:].any()
        assert np.array_equal(i[found], j[found])
        with pytest.raises(ValueError, match="never resolved"):
            q.contains(h)
        assert np.array_equal(q.contains(h[:500]), q.seen[j[:500]])
