"""``fideval export-llamacpp``: a teacher store written as a llama.cpp ``--kl-divergence-base`` file.

Oracles: the layout and encoder transcribed from perplexity.cpp in test_store_llamacpp.py (``_encode_row``,
independent of fideval's torch encoder), and fideval's importer reading the file back. llama-perplexity
itself accepting the file and giving the figures it gives with its own F32 base file is checked once by
tools/llamacpp/export_check.py (its printed numbers are in docs/formats-store.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from cli_runner import run_fideval
from test_store_llamacpp import _encode_row

from fideval.store import StoreReader, StoreWriter
from fideval.store.llamacpp import KldBase, import_llamacpp

V = 41  # odd: the pad code is written
META = {"model_id": "toy/model", "model_revision": "r1", "tokenizer_sha256": "ab" * 32, "vocab_size": V, "kind": "logits"}


def _store(root, lengths=(14, 14, 14), seed=0):
    rng = np.random.default_rng(seed)
    w = StoreWriter(root, META)
    data = {}
    for i, n in enumerate(lengths):
        lg = (rng.standard_normal((n, V)) * 4).astype(np.float32)
        lg[:, 3] -= 30  # below the 16-nat floor
        lg[2, :] = 1.5  # a flat row: scale 0, all codes 0
        tk = rng.integers(0, V, n).astype(np.int32)
        sid = f"code-{2 - i:03d}" if len(set(lengths)) == 1 else f"code-{i:03d}"  # written out of sorted order
        w.write(sid, lg, tk, window_id=sid, domain="code")
        data[sid] = (lg, tk)
    w.finish()
    return data


def _expected_bytes(data, n_ctx):
    """The whole file, built with the transcribed encoder (sorted seq_id order)."""
    first, nv = n_ctx // 2, 2 * ((V + 1) // 2) + 4
    sids = sorted(s for s in data if len(data[s][1]) == n_ctx)
    out = [b"_logits_", np.array([n_ctx, V, len(sids)], "<i4").tobytes()]
    out += [data[s][1].astype("<i4").tobytes() for s in sids]
    for s in sids:
        for j in range(first, n_ctx - 1):
            scale, mlp, codes = _encode_row(data[s][0][j])
            if scale == 0:
                codes[:] = 0
            row = np.zeros(nv, "<u2")
            row[:4] = np.array([scale, mlp], "<f4").view("<u2")
            row[4:4 + V] = codes
            out.append(row.tobytes())
    return b"".join(out)


def test_export_is_perplexity_cpps_file_byte_for_byte(tmp_path):
    data = _store(tmp_path / "st")
    r = run_fideval("export-llamacpp", str(tmp_path / "st"), str(tmp_path / "t.kld"))
    assert r.code == 0, r.stderr
    assert "3 chunks of 14 tokens (code-000 .. code-002, sorted), 6 rows each (positions 7..12)" in r.stdout
    assert "-c 14" in r.stdout
    got = (tmp_path / "t.kld").read_bytes()
    assert got == _expected_bytes(data, 14)
    base = KldBase(tmp_path / "t.kld")
    assert (base.n_ctx, base.n_vocab, base.n_chunk, base.first) == (14, V, 3, 7)
    # read back: fideval's importer gives the sorted sequences' tokens and decoded rows near the true log-softmax
    import_llamacpp(tmp_path / "t.kld", tmp_path / "imp")
    imp = StoreReader(tmp_path / "imp")
    for k, sid in enumerate(sorted(data)):
        lg, tk = data[sid]
        lp, t2 = imp.read(imp.seq_ids[k])
        assert np.array_equal(t2, tk) and imp.row_start(imp.seq_ids[k]) == 7
        ref = lg[7:13].astype(np.float64)
        ref -= ref.max(1, keepdims=True)
        ref -= np.log(np.exp(ref).sum(1, keepdims=True))
        above = ref > lp.min(1, keepdims=True) + 1e-3
        assert np.all(np.abs(lp - ref)[above] <= 16 / 65535 / 2 + 2e-5)
    # an imported store exports again (its rows start at n_ctx/2) to a file that decodes to the same rows
    r = run_fideval("export-llamacpp", str(tmp_path / "imp"), str(tmp_path / "again.kld"))
    assert r.code == 0 and "lossy" in r.stderr
    again = KldBase(tmp_path / "again.kld")
    assert np.array_equal(again.tokens, base.tokens)
    for k in range(3):
        assert np.max(np.abs(again.logprobs(k) - base.logprobs(k))) <= 16 / 65535


def test_mixed_lengths_need_n_ctx(tmp_path):
    data = _store(tmp_path / "st", lengths=(14, 10, 14))
    r = run_fideval("export-llamacpp", str(tmp_path / "st"), str(tmp_path / "t.kld"))
    assert "2 lengths (10, 14)" in r.error() and "--n-ctx" in r.error()
    assert not (tmp_path / "t.kld").exists()
    r = run_fideval("export-llamacpp", str(tmp_path / "st"), str(tmp_path / "t.kld"), "--n-ctx", "14")
    assert r.code == 0 and "1 sequences of other lengths skipped" in r.stdout
    assert (tmp_path / "t.kld").read_bytes() == _expected_bytes(data, 14)
    r = run_fideval("export-llamacpp", str(tmp_path / "st"), str(tmp_path / "u.kld"), "--n-ctx", "12")
    assert "no sequence of 12 tokens" in r.error()


def test_bad_input_is_one_line_and_writes_nothing(tmp_path):
    _store(tmp_path / "st")
    (tmp_path / "t.kld").write_bytes(b"old")
    shard = StoreReader(tmp_path / "st").path("code-001")
    raw = bytearray(shard.read_bytes())
    raw[-100] ^= 1  # a logit byte: the hash check refuses it while exporting
    shard.write_bytes(bytes(raw))
    r = run_fideval("export-llamacpp", str(tmp_path / "st"), str(tmp_path / "t.kld"))
    assert "SHA-256" in r.error()
    assert (tmp_path / "t.kld").read_bytes() == b"old"  # the earlier file is untouched, no temp left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["st", "t.kld"]
    assert "is a folder" in run_fideval("export-llamacpp", str(tmp_path / "st"), str(tmp_path)).error()
    assert "manifest" in run_fideval("export-llamacpp", str(tmp_path / "nope"), str(tmp_path / "x.kld")).error()


def test_export_of_llamacpps_own_logits_is_llama_perplexitys_file(tmp_path):
    """The real oracle: llama-perplexity's ``--kl-divergence-base`` file of a tiny llama (``kld_parity/base.kld``) and
    the float32 logits llama.cpp computed for its scored rows (``ref_logits.f32``, from ``dump_logits.cpp``; both
    written by tools/llamacpp/export_check.py). A store of those rows (row_start n_ctx/2) exports to that file,
    byte for byte: header, token ids, chunk order, row selection, encoder."""
    fix = Path(__file__).parent / "data" / "llamacpp" / "kld_parity"
    base = KldBase(fix / "base.kld")
    rows = np.fromfile(fix / "ref_logits.f32", "<f4").reshape(base.n_chunk, base.rows, base.n_vocab)
    w = StoreWriter(tmp_path / "st", {**META, "vocab_size": base.n_vocab})
    for k in range(base.n_chunk):
        w.write(f"chunk-{k:03d}", rows[k], np.array(base.tokens[k]), window_id=f"chunk-{k:03d}", domain="chunk",
                row_start=base.first)
    w.finish()
    r = run_fideval("export-llamacpp", str(tmp_path / "st"), str(tmp_path / "out.kld"))
    assert r.code == 0, r.stderr
    assert (tmp_path / "out.kld").read_bytes() == (fix / "base.kld").read_bytes()
