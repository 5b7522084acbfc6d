"""The chain of custody (docs/formats.md): every artifact names the hashes of what it was made from, and every reader
checks them, so a wrong number cannot reach a card with every check passing.

windows (token SHA-256) -> teacher shards (settings fingerprint, token SHA-256) -> score.json (records' SHA-256, each
sequence's token and teacher-shard SHA-256, the candidate's fingerprint) -> report.json (coverage, token hashes
checked) -> card (the report's SHA-256). Each test breaks one link the way a user or a disk would and asserts the
one-line refusal, and that nothing already written is lost.
"""

from __future__ import annotations

import hashlib
import json
import shutil

import model_fixtures as mf
import numpy as np
import polars as pl
import pytest
import synthetic as syn
import yaml
from cli_runner import run_fideval
from test_model_teacher import _windows

from fideval.formats.store import settings_fingerprint
from fideval.store import StoreReader
from fideval.store.shard import read_header
from fideval.windows.layout import token_sha256

REV = "d" * 40


def _teacher(t, out, *extra, model=None, windows=None):
    return run_fideval("teacher", "--model", model or t["model"], "--windows",
                       windows or t["tmp"] / "w" / "cuts-8" / "tokens.safetensors", "--lengths", "cuts", "--device", "cpu",
                       "--model-id", "toy/dsv3", "--model-revision", REV, "--out", out, *extra)


def _shards(store):
    return {p.name: p.read_bytes() for p in sorted((store / "shards").glob("*.safetensors"))}


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """A tiny DeepSeek-V3's teacher store of 4 cuts of 8 tokens, and an emulated candidate scored against it."""
    tmp = tmp_path_factory.mktemp("chain")
    model = mf.build("deepseek_v3", tmp / "model")
    _windows(tmp / "w")
    t = dict(tmp=tmp, model=model)
    res = _teacher(t, tmp / "teacher")
    assert res.code == 0, res.stderr
    cfg = {"run": "t", "model": {"path": str(model), "id": "toy/dsv3", "revision": REV},
           "domains": [{"name": "code", "source": {"type": "local", "path": "x.jsonl"}},
                       {"name": "prose", "source": {"type": "local", "path": "x.jsonl"}}],
           "windows": {"window_tokens": 16, "cut_tokens": 8, "windows_per_domain": 1},
           "teacher": {"lengths": ["cuts"]},
           "candidates": [{"name": "mx", "quant": {"routed_experts": {"format": "mxfp4"}}, "paths": ["weights-only"]}]}
    (tmp / "c.yaml").write_text(yaml.safe_dump(cfg))
    res = run_fideval("score", "--teacher", tmp / "teacher", "--config", tmp / "c.yaml", "--candidate", "mx",
                      "--path", "weights-only", "--device", "cpu", "--out", tmp / "rec")
    assert res.code == 0, res.stderr
    return t


def test_every_shard_names_its_settings_and_its_tokens(chain):
    store = StoreReader(chain["tmp"] / "teacher")
    block = json.loads(store.meta["teacher"])
    assert store.meta["settings_sha256"] == settings_fingerprint(block)
    # the checkpoint's files by content: the tiny model is hashed whole
    files = block["checkpoint"]
    assert set(files) >= {"config.json", "model.safetensors"}
    want = hashlib.sha256((chain["model"] / "model.safetensors").read_bytes()).hexdigest()
    assert files["model.safetensors"] == "sha256:" + want
    for sid in store.seq_ids:
        meta = read_header(store.path(sid)).meta
        _, tokens = store.read(sid)
        assert meta["settings_sha256"] == store.meta["settings_sha256"]
        assert meta["token_sha256"] == token_sha256(tokens)


def test_a_resume_with_another_dtype_is_refused_and_keeps_the_shards(chain, tmp_path):
    store = shutil.copytree(chain["tmp"] / "teacher", tmp_path / "s")
    (store / "shards" / "code-000.c1.safetensors").unlink()
    before = _shards(store)
    res = _teacher(chain, store, "--dtype", "bfloat16")
    assert res.code == 2 and res.stderr.count("\n") == 1
    assert "shard code-000.c0 was computed with dtype 'float32', this run computes dtype 'bfloat16'" in res.stderr
    assert _shards(store) == before
    res = _teacher(chain, store)  # the same settings resume, bit for bit
    assert res.code == 0 and "1 sequences written, 3 already done" in res.stdout
    assert _shards(store) == _shards(chain["tmp"] / "teacher")


def test_a_resume_with_other_weights_under_the_same_model_id_is_refused(chain, tmp_path):
    store = shutil.copytree(chain["tmp"] / "teacher", tmp_path / "s")
    (store / "shards" / "prose-000.c1.safetensors").unlink()
    other = shutil.copytree(chain["model"], tmp_path / "model")
    from safetensors.torch import load_file, save_file

    w = load_file(other / "model.safetensors")
    name = next(k for k in sorted(w) if k.endswith("o_proj.weight"))
    w[name] = w[name] * 1.01  # retrained: same names, shapes and model id
    save_file(w, other / "model.safetensors", metadata={"format": "pt"})
    before = _shards(store)
    res = _teacher(chain, store, model=other)
    assert res.code == 2 and res.stderr.count("\n") == 1
    assert "was computed with checkpoint file model.safetensors sha256:" in res.stderr and "(other weights)" in res.stderr
    assert _shards(store) == before


def test_a_resume_on_rebuilt_windows_with_the_same_ids_is_refused(chain, tmp_path):
    store = shutil.copytree(chain["tmp"] / "teacher", tmp_path / "s")
    (store / "shards" / "prose-000.c1.safetensors").unlink()
    from fideval.windows.layout import Sequences, length_dir, read_sequences, write_sequences

    seqs = read_sequences(chain["tmp"] / "w" / "cuts-8")
    tokens = seqs.tokens.copy()
    tokens[0, 3] = (tokens[0, 3] + 1) % 50  # another seed's windows: the same ids, other tokens
    write_sequences(length_dir(tmp_path / "w", "cuts", 8), Sequences(list(seqs.ids), list(seqs.domains), tokens))
    before = _shards(store)
    res = _teacher(chain, store, windows=tmp_path / "w" / "cuts-8" / "tokens.safetensors")
    assert res.code == 2 and res.stderr.count("\n") == 1
    assert "shard code-000.c0 holds other tokens than" in res.stderr and "(first difference at position 3)" in res.stderr
    assert _shards(store) == before


def test_verify_finds_a_store_that_mixes_two_teachers(chain, tmp_path):
    """A store mixed by hand (or by an older fideval): one shard's settings are another teacher's."""
    store = shutil.copytree(chain["tmp"] / "teacher", tmp_path / "s")
    from fideval.store import manifest as mfest
    from fideval.store.shard import write_shard

    reader = StoreReader(store)
    assert reader.kind == "hidden"  # the default store: its shards hold the final norm's output
    sid = reader.seq_ids[0]
    hidden, tokens = reader.read_hidden(sid)
    head = read_header(reader.path(sid))
    meta = dict(head.meta)
    block = json.loads(meta["teacher"]) | {"dtype": "bfloat16"}
    meta["teacher"], meta["settings_sha256"] = json.dumps(block, sort_keys=True), settings_fingerprint(block)
    sha, nbytes = write_shard(reader.path(sid), np.array(hidden.numpy()), np.array(tokens), meta, tensor="hidden",
                              dtype=head.dtype)
    man = json.loads((store / mfest.MANIFEST).read_text())
    man["shards"][sid] |= {"sha256": sha, "bytes": nbytes}
    (store / mfest.MANIFEST).write_text(json.dumps(man))
    res = run_fideval("verify", store)
    assert res.code == 1
    assert f"shard shards/{sid}.safetensors: computed with other settings than the store's" in res.stdout + res.stderr


def test_score_json_names_its_records_the_teacher_shards_and_the_tokens(chain):
    score = json.loads((chain["tmp"] / "rec" / "score.json").read_text())
    rec = chain["tmp"] / "rec" / "records.parquet"
    assert score["records_sha256"] == hashlib.sha256(rec.read_bytes()).hexdigest()
    store = StoreReader(chain["tmp"] / "teacher")
    assert score["teacher"]["shards"] == {sid: store.entry(sid)["sha256"] for sid in store.seq_ids}
    assert score["teacher"]["settings_sha256"] == store.meta["settings_sha256"]
    assert score["sequences"] == {sid: token_sha256(store.read(sid)[1]) for sid in store.seq_ids}
    from fideval.provenance import canonical_hash

    assert score["candidate_sha256"] == canonical_hash(score["candidate_info"])


def _eval_windows(folder, chain, *, bump=None):
    """An eval-windows.json of the chain's windows (2 windows of 16 tokens, 2 cuts each), from the token files."""
    from fideval.windows.layout import read_sequences

    win = read_sequences(chain["tmp"] / "w" / "windows-16")
    cuts = read_sequences(chain["tmp"] / "w" / "cuts-8")
    entries = []
    for k, wid in enumerate(win.ids):
        ct = [dict(id=c, start=8 * j, end=8 * j + 8, sha256=token_sha256(cuts.tokens[2 * k + j]))
              for j, c in enumerate(cuts.ids[2 * k: 2 * k + 2])]
        if bump == wid:
            ct[1]["sha256"] = "0" * 64
        entries.append(dict(id=wid, domain=win.domains[k], tokens=16, sha256=token_sha256(win.tokens[k]), cuts=ct))
    obj = {"format": "fideval.eval-windows", "version": 2, "windows_config": {"window_tokens": 16, "cut_tokens": 8,
                                                                                "separator": "eos"}, "windows": entries}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "eval-windows.json").write_text(json.dumps(obj))
    return folder


def _report(chain, out, *extra, records=None):
    return run_fideval("report", "--records", records or chain["tmp"] / "rec", "--config", chain["tmp"] / "c.yaml",
                       "--resamples", "200", "--no-plots", "--out", out, *extra)


def test_the_report_checks_every_sequence_s_tokens_against_the_windows(chain, tmp_path):
    res = _report(chain, tmp_path / "ok", "--windows", _eval_windows(tmp_path / "w", chain))
    assert res.code == 0, res.stderr
    rep = json.loads((tmp_path / "ok" / "report.json").read_text())
    match = next(c for c in rep["checks"] if c["name"] == "windows_match")
    assert match["status"] == "pass" and match["sequences_checked"] == 4
    assert rep["coverage"]["complete"] is True and rep["coverage"]["sets"][0]["asked"] == 4
    # windows built under another seed: the same ids, other tokens
    res = _report(chain, tmp_path / "bad", "--windows", _eval_windows(tmp_path / "w2", chain, bump="prose-000"))
    assert res.code == 2 and res.stderr.count("\n") == 1
    assert "sequence prose-000.c1 was scored on tokens" in res.stderr and "the records come from other windows" in res.stderr
    assert not (tmp_path / "bad").exists()


def test_altered_records_are_refused(chain, tmp_path):
    rec = shutil.copytree(chain["tmp"] / "rec", tmp_path / "rec")
    df = pl.read_parquet(rec / "records.parquet")
    df.with_columns(pl.col("kld") * 1.5).write_parquet(rec / "records.parquet")  # same rows, moved mean
    res = _report(chain, tmp_path / "o", records=rec)
    assert res.code == 2 and res.stderr.count("\n") == 1
    assert "its SHA-256 differs from the records_sha256 its score.json names (altered after scoring)" in res.stderr


@pytest.mark.parametrize("column,value,want", [
    ("kld", -0.5, "column 'kld' has 1 values outside [0.0, inf], impossible for it (first -0.5"),
    ("p1_ref", 1.25, "column 'p1_ref' has 1 values outside [0.0, 1.0]"),
    ("nll_cand", -1e-6, "column 'nll_cand' has 1 values outside [0.0, inf]"),
])
def test_impossible_values_are_refused_where_records_are_read(tmp_path, column, value, want):
    """A negative KLD (impossible over a full vocabulary) would give a negative mean that passes every gate."""
    windows = syn.window_ids(["code"], 3)
    df = syn.records_frame("q4", "store", 64, 64, windows, effect=1.0)
    df = df.with_columns(pl.when(pl.int_range(pl.len()) == 5).then(value).otherwise(pl.col(column)).alias(column))
    d = syn.write_records(tmp_path / "r", df, "q4", "store", 64)
    res = run_fideval("report", "--records", d, "--out", tmp_path / "o", "--resamples", "200", "--no-plots")
    assert res.code == 2 and res.stderr.count("\n") == 1 and want in res.stderr


def test_rounding_below_zero_is_not_refused(tmp_path):
    windows = syn.window_ids(["code"], 3)
    df = syn.records_frame("q4", "store", 64, 64, windows, effect=1.0)
    df = df.with_columns(pl.when(pl.int_range(pl.len()) == 5).then(-1.2e-15).otherwise(pl.col("kld")).alias("kld"))
    d = syn.write_records(tmp_path / "r", df, "q4", "store", 64)
    res = run_fideval("report", "--records", d, "--out", tmp_path / "o", "--resamples", "200", "--no-plots")
    assert res.code == 0, res.stderr


def test_a_candidate_scored_on_one_of_two_domains_is_a_partial_report(chain, tmp_path):
    """The candidate's records hold one domain of the two the config asks for (a teacher manifest missing entries
    gives the same): refused; with --allow-partial the report, the coverage check, `fideval check` and the card say
    partial."""
    rec = shutil.copytree(chain["tmp"] / "rec", tmp_path / "rec")
    df = pl.read_parquet(rec / "records.parquet").filter(pl.col("domain") == "code")
    df.write_parquet(rec / "records.parquet")
    score = json.loads((rec / "score.json").read_text())
    score |= {"rows": df.height, "records_sha256": hashlib.sha256((rec / "records.parquet").read_bytes()).hexdigest()}
    (rec / "score.json").write_text(json.dumps(score))
    res = _report(chain, tmp_path / "o", records=rec)
    assert res.code == 2 and res.stderr.count("\n") == 1
    assert "the records do not cover what was asked: mx/weights-only/8 lacks 2 of 4 sequences (domains prose)" in res.stderr
    res = _report(chain, tmp_path / "o", "--allow-partial", records=rec)
    assert res.code == 0, res.stderr
    rep = json.loads((tmp_path / "o" / "report.json").read_text())
    assert rep["coverage"]["complete"] is False
    assert next(c for c in rep["checks"] if c["name"] == "coverage")["status"] == "fail"
    res = run_fideval("check", tmp_path / "o" / "report.json", "--allow-not-run", "all")
    assert res.code == 1 and "FAIL check coverage failed: mx/weights-only/8 lacks 2 of 4 sequences" in res.stderr
    res = run_fideval("card", tmp_path / "o" / "report.json", "--out", tmp_path / "card" / "README.md")
    assert res.code == 0, res.stderr
    card = (tmp_path / "card" / "README.md").read_text()
    assert "**Partial evaluation: these figures do not cover what was asked.** mx/weights-only/8 lacks 2 of 4 sequences" in card
    assert "coverage" in card.split("FAILED: ", 1)[1].split(";")[0].split(".")[0]


def test_check_and_card_refuse_impossible_figures_in_report_json(chain, tmp_path):
    res = _report(chain, tmp_path / "o", "--windows", _eval_windows(tmp_path / "w", chain))
    assert res.code == 0, res.stderr
    path = tmp_path / "o" / "report.json"
    rep = json.loads(path.read_text())
    rep["results"][0]["overall"]["mean_kld"]["estimate"] = -0.01
    path.write_text(json.dumps(rep))
    for verb in (["check", path], ["card", path, "--out", tmp_path / "README.md"]):
        res = run_fideval(*verb)
        assert res.code == 2 and res.stderr.count("\n") == 1
        assert "results mx/weights-only/8: mean_kld -0.01 is impossible" in res.stderr


def test_token_hashes_are_checked_per_folder_when_a_set_is_scored_in_domain_folders(chain, tmp_path):
    """The workflow scores each domain into its own folder; the report merges them into one records set, and each
    folder's score.json names only its own sequences."""
    rec = pl.read_parquet(chain["tmp"] / "rec" / "records.parquet")
    score = json.loads((chain["tmp"] / "rec" / "score.json").read_text())
    args = []
    for dom in ("code", "prose"):
        d = tmp_path / dom
        d.mkdir()
        part = rec.filter(pl.col("domain") == dom)
        part.write_parquet(d / "records.parquet")
        mine = {k: v for k, v in score["sequences"].items() if k.startswith(dom)}
        sha = hashlib.sha256((d / "records.parquet").read_bytes()).hexdigest()
        (d / "score.json").write_text(json.dumps(score | {"rows": part.height, "sequences": mine, "records_sha256": sha}))
        args += ["--records", d]
    res = run_fideval("report", *args, "--config", chain["tmp"] / "c.yaml", "--windows", _eval_windows(tmp_path / "w", chain),
                      "--resamples", "200", "--no-plots", "--out", tmp_path / "o")
    assert res.code == 0, res.stderr
    rep = json.loads((tmp_path / "o" / "report.json").read_text())
    assert next(c for c in rep["checks"] if c["name"] == "windows_match")["sequences_checked"] == 4


def test_a_large_checkpoint_file_is_fingerprinted_by_samples(tmp_path, monkeypatch):
    """Above the full-hash size a file is fingerprinted by its size, its head and 16 spaced blocks: other weights change
    every block; the digest says which of the two methods made it."""
    from fideval.model.weights import identity

    monkeypatch.setattr(identity, "FULL_BYTES", 1 << 16)
    path = tmp_path / "model.safetensors"
    data = np.random.default_rng(0).integers(0, 256, size=3 << 20, dtype=np.uint8)
    path.write_bytes(data.tobytes())
    first = identity.file_digest(path)
    assert first.startswith("sampled-sha256:") and first == identity.file_digest(path)
    sample_at = (path.stat().st_size - identity.SAMPLE_BYTES) * 7 // (identity.SAMPLES - 1)
    data[sample_at + 5] ^= 1  # a byte inside the 8th sampled block
    path.write_bytes(data.tobytes())
    assert identity.file_digest(path) != first
    small = tmp_path / "config.json"
    small.write_text("{}")
    assert identity.file_digest(small) == "sha256:" + hashlib.sha256(b"{}").hexdigest()
