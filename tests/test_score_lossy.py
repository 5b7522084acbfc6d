"""An exact candidate against a lossy llama.cpp teacher: the candidate goes through llama.cpp's uint16
encoding, so the teacher's own model scores exactly 0 (the biased mix does not), and score.json says so.
Oracle for the encoding: the transcription of perplexity.cpp's encoder in test_store_llamacpp.py."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import torch
from test_store_llamacpp import _write_kld_base

from fideval.score.candidate import from_store
from fideval.score.lossy import RULE_BOTH, RULE_ENCODE, llamacpp_roundtrip
from fideval.score.run import score_candidate, score_tensors
from fideval.store import StoreReader
from fideval.store.llamacpp import import_llamacpp
from fideval.store.writer import StoreWriter

N_CTX, N_VOCAB, N_CHUNK = 12, 40, 3


def _setup(tmp_path):
    src = tmp_path / "base.kld"
    tokens, logits, expected = _write_kld_base(src, N_CTX, N_VOCAB, N_CHUNK, seed=5)
    import_llamacpp(src, tmp_path / "teacher", model_id="org/base")
    w = StoreWriter(tmp_path / "exact", {"model_id": "org/base", "model_revision": "0" * 40, "tokenizer_sha256": "a" * 64,
                                         "vocab_size": N_VOCAB, "kind": "logits"})
    for k in range(N_CHUNK):  # the same model's exact FP32 logits, every position
        sid = f"llamacpp-{k:03d}"
        w.write(sid, logits[k], tokens[k], window_id=sid, domain="llamacpp")
    w.finish()
    return src, tokens, logits, expected


def test_roundtrip_is_llama_cpps_encoding_bit_for_bit(tmp_path):
    _, _, logits, expected = _setup(tmp_path)
    first = N_CTX // 2
    for k in range(N_CHUNK):
        got = llamacpp_roundtrip(torch.from_numpy(logits[k, first:N_CTX - 1])).numpy()
        assert got.tobytes() == expected[k].tobytes()


def test_exact_candidate_against_lossy_teacher_scores_zero(tmp_path):
    _setup(tmp_path)
    teacher = StoreReader(tmp_path / "teacher")
    cand = from_store(StoreReader(tmp_path / "exact"), teacher, "exact", "store")
    s = score_candidate(teacher, cand, tmp_path / "rec")
    assert s["lossy_rule"] == RULE_ENCODE and "16 nats" in s["teacher"]["lossy"]
    assert json.loads((tmp_path / "rec" / "score.json").read_text())["lossy_rule"] == RULE_ENCODE
    rec = pl.read_parquet(tmp_path / "rec" / "records.parquet")
    assert len(rec) == N_CHUNK * (N_CTX - 1 - N_CTX // 2)
    assert (rec["kld"] == 0).all()
    # the biased mix it replaces: the same rows scored raw give a positive mean KLD
    biased = []
    for sid in teacher.seq_ids:
        lp, tk = teacher.read(sid)
        ex, _ = StoreReader(tmp_path / "exact").read(sid)
        rows = ex[N_CTX // 2: N_CTX - 1]
        figs, _, _ = score_tensors(torch.from_numpy(np.array(lp)), torch.from_numpy(np.array(rows)),
                                   torch.from_numpy(np.asarray(tk[N_CTX // 2 + 1:], np.int64)), "torch")
        biased.append(figs[:, 0])
    assert np.mean(np.concatenate(biased)) > 1e-6


def test_lossy_candidate_is_scored_as_stored(tmp_path):
    src, *_ = _setup(tmp_path)
    import_llamacpp(src, tmp_path / "cand-lossy", model_id="org/base")
    teacher = StoreReader(tmp_path / "teacher")
    cand = from_store(StoreReader(tmp_path / "cand-lossy"), teacher, "lossy", "store")
    s = score_candidate(teacher, cand, tmp_path / "rec")
    assert s["lossy_rule"] == RULE_BOTH
    assert (pl.read_parquet(tmp_path / "rec" / "records.parquet")["kld"] == 0).all()


def test_exact_teacher_has_no_rule(tmp_path):
    _setup(tmp_path)
    exact = StoreReader(tmp_path / "exact")
    s = score_candidate(exact, from_store(StoreReader(tmp_path / "exact"), exact, "same", "store"), tmp_path / "rec")
    assert s["lossy_rule"] is None and s["teacher"]["lossy"] is None


def test_report_and_card_say_the_teacher_was_lossy(tmp_path):
    import synthetic as syn
    from cli_runner import run_fideval

    windows = syn.window_ids(["code", "chat"], 4)
    folder = syn.write_records(tmp_path / "q8", syn.records_frame("q8", "weights-only", 128, 128, windows), "q8",
                               "weights-only", 128)
    score = json.loads((folder / "score.json").read_text())
    score["teacher"]["lossy"] = "llama.cpp uint16 log-probs: only the top 16 nats"
    score["lossy_rule"] = RULE_ENCODE
    (folder / "score.json").write_text(json.dumps(score))
    syn.write_eval_windows(tmp_path, windows, 128)
    res = run_fideval("report", "--records", str(folder), "--windows", str(tmp_path), "--out", str(tmp_path / "report"),
                      "--resamples", "200")
    assert res.code == 0, res.stderr
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    (store,) = report["provenance"]["teacher_stores"]
    assert "16 nats" in store["lossy"] and store["lossy_rules"] == [RULE_ENCODE]
    res = run_fideval("card", str(tmp_path / "report" / "report.json"), "--out", str(tmp_path / "README.md"))
    assert res.code == 0, res.stderr
    card = (tmp_path / "README.md").read_text()
    assert "**The reference logits here are not FP32**" in card and RULE_ENCODE in card
