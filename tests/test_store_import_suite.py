"""``fideval store import-hidden-suite``: a hidden-state fidelity suite (tools/fidelity.py of malaiwah/qwen38-27b-exl3,
docs/formats-store.md "Hidden-state suite import") imported as a hidden store. A fixture writes the suite, a reference
capture and the shared head exactly as the tool lays them out; the test checks the store against an independent
computation (``states.float() @ head.float().T``), scores against it, and refuses every bad input in one line."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch
from cli_runner import run_fideval
from safetensors.torch import save_file

from fideval.store import StoreReader
from fideval.store.reader import open_rows
from fideval.store.verify import verify_store

L, H, V = 17, 24, 40
STRATA = ("encyclopedic", "code", "short_form")


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _file_sha(p) -> str:
    return _sha(p.read_bytes())


def build(root, seed=0, noise=0.0, states=None):
    """Write ``suite/``, ``ref/`` and ``lm-head/weight.safetensors`` as the tool does; return what was written."""
    rng = np.random.default_rng(seed)
    suite, ref, head_dir = root / "suite", root / "ref", root / "lm-head"
    (suite / "tokens").mkdir(parents=True)
    ref.mkdir()
    head_dir.mkdir()
    contexts, ids = [], []
    for i, stratum in enumerate(STRATA):
        tk = [int(t) for t in rng.integers(0, V, L)]
        name = f"context-{i:04d}.json"
        (suite / "tokens" / name).write_text(json.dumps(tk))
        contexts.append({"index": i, "stratum": stratum, "file": f"tokens/{name}", "token_sha256": _sha(json.dumps(tk).encode()),
                         "tokens": L, "source_cluster": f"{stratum}-{i // 4}"})
        ids.append(tk)
    man = {"schema": "qwen38-distribution-fidelity/1", "model": "/models/tiny", "context_length": L,
           "scored_positions_per_context": L - 1, "contexts": len(contexts), "total_scored_positions": len(contexts) * (L - 1),
           "tokenizer_sha256": "ab" * 32, "strata": {s: 1 for s in STRATA}, "context_index": contexts}
    man["suite_token_sha256"] = _sha("".join(c["token_sha256"] for c in contexts).encode())
    (suite / "suite-manifest.json").write_text(json.dumps(man, indent=2))
    g = torch.Generator().manual_seed(seed)
    head = (torch.randn(V, H, generator=g) * 0.3).to(torch.bfloat16)
    save_file({"weight": head}, str(head_dir / "weight.safetensors"))
    if states is None:
        states = [torch.randn(L - 1, H, generator=g).to(torch.bfloat16) for _ in STRATA]
    states = [(s.float() + noise * torch.randn(s.shape, generator=g)).to(torch.bfloat16) for s in states]
    records = []
    for i, s in enumerate(states):
        p = ref / f"hidden_{i:04d}.safetensors"
        save_file({"hidden_states": s.contiguous()}, str(p))
        records.append({"index": i, "sha256": _file_sha(p), "shape": list(s.shape)})
    cap = {"schema": "qwen38-fidelity-capture/2", "model": "/models/tiny", "quantization": "auto",
           "candidate_identity": {"model_path": "/models/tiny", "model_revision": "c0ffee"},
           "suite_token_sha256": man["suite_token_sha256"], "filter": "all", "context_length": L,
           "expected_contexts": len(states), "expected_indices": list(range(len(states))),
           "contexts": len(records), "captures": records, "complete": True, "elapsed_sec": 1.0}
    (ref / "capture-manifest.json").write_text(json.dumps(cap, indent=2))
    return {"suite": suite, "ref": ref, "head": head_dir / "weight.safetensors", "head_w": head, "states": states,
            "ids": ids, "head_sha": _file_sha(head_dir / "weight.safetensors"), "manifest": man, "capture": cap}


def imp(s, out, *extra):
    return run_fideval("store", "import-hidden-suite", s["suite"], "--reference", s["ref"], "--head", s["head"],
                       "--head-sha256", s["head_sha"], "--out", out, *extra)


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    return build(tmp_path_factory.mktemp("suite"))


def test_import_replays_the_suites_logits(suite, tmp_path):
    res = imp(suite, tmp_path / "st", "--model-id", "org/tiny")
    assert res.code == 0, res.stderr
    assert verify_store(tmp_path / "st")[0] == []
    r = StoreReader(tmp_path / "st")
    assert r.kind == "hidden" and r.vocab_size == V and int(r.meta["hidden_size"]) == H
    assert r.seq_ids == sorted(f"{s}-{i:04d}" for i, s in enumerate(STRATA))
    m = r.meta
    assert m["model_id"] == "org/tiny" and m["model_revision"] == "c0ffee" and m["tokenizer_sha256"] == "ab" * 32
    assert m["source_suite_token_sha256"] == suite["manifest"]["suite_token_sha256"]
    assert m["source_capture_manifest_sha256"] == _file_sha(suite["ref"] / "capture-manifest.json")
    assert m["source_head_sha256"] == suite["head_sha"]
    rows = open_rows(tmp_path / "st")
    for i, stratum in enumerate(STRATA):
        sid = f"{stratum}-{i:04d}"
        hidden, tokens = r.read_hidden(sid)
        assert tokens.tolist() == suite["ids"][i] and r.row_start(sid) == 0
        assert r.entry(sid)["window_id"] == f"{stratum}-cluster-{stratum}-0"  # the suite's source cluster
        assert hidden.dtype == torch.bfloat16 and torch.equal(hidden, suite["states"][i])  # L-1 rows, as captured
        logits, _ = rows.read(sid)
        want = (suite["states"][i].float() @ suite["head_w"].float().T).numpy()
        assert logits.shape == (L - 1, V)
        np.testing.assert_allclose(logits, want, rtol=1e-6, atol=1e-6)
        assert r.entry(sid)["rows"] == L - 1 and r.entry(sid)["tokens"] == L
    # the scorer runs on it: the self-check (KLD 0 over every position 0..L-2) ...
    res = run_fideval("score", "--teacher", tmp_path / "st", "--out", tmp_path / "self", "--self-check", "--device", "cpu")
    assert res.code == 0, res.stderr
    s = json.loads((tmp_path / "self" / "score.json").read_text())
    assert s["self_check"]["max_kld"] == 0.0


def test_a_candidate_capture_scores_as_the_suite_computes(suite, tmp_path):
    """A candidate capture of the same suite, imported the same way, scores against the reference with the KLD an
    independent computation gives at every position 0..L-2 (float32 logits of the same states and head)."""
    import pyarrow.parquet as pq

    cand = build(tmp_path / "c", seed=0, noise=0.05, states=suite["states"])
    assert cand["head_sha"] == suite["head_sha"]
    assert imp(suite, tmp_path / "teacher").code == 0
    assert imp(cand, tmp_path / "cand").code == 0
    res = run_fideval("score", "--teacher", tmp_path / "teacher", "--candidate", tmp_path / "cand", "--out",
                      tmp_path / "rec", "--device", "cpu")
    assert res.code == 0, res.stderr
    rec = pq.read_table(tmp_path / "rec" / "records.parquet").to_pandas()
    assert len(rec) == len(STRATA) * (L - 1)
    for i, stratum in enumerate(STRATA):
        p = torch.log_softmax((suite["states"][i].double() @ suite["head_w"].double().T), -1)
        q = torch.log_softmax((cand["states"][i].double() @ cand["head_w"].double().T), -1)
        kld = (p.exp() * (p - q)).sum(-1).numpy()
        got = rec[rec["seq_id"] == f"{stratum}-{i:04d}"].sort_values("position")
        np.testing.assert_allclose(got["kld"].to_numpy(), kld, rtol=1e-4, atol=1e-7)


def _bad(tmp_path, how):
    s = build(tmp_path / "in")
    if how == "incomplete":
        cap = dict(s["capture"], complete=False)
        (s["ref"] / "capture-manifest.json").write_text(json.dumps(cap))
    elif how == "capture sha":
        p = s["ref"] / "hidden_0001.safetensors"
        b = bytearray(p.read_bytes())
        b[-1] ^= 1
        p.write_bytes(bytes(b))
    elif how == "head digest":
        s["head_sha"] = "0" * 64
    elif how == "shape":
        p = s["ref"] / "hidden_0002.safetensors"
        save_file({"hidden_states": torch.zeros(L, H, dtype=torch.bfloat16)}, str(p))
        cap = s["capture"]
        cap["captures"][2] = {"index": 2, "sha256": _file_sha(p), "shape": [L, H]}
        (s["ref"] / "capture-manifest.json").write_text(json.dumps(cap))
    elif how == "hidden size":
        save_file({"weight": torch.zeros(V, H + 1, dtype=torch.bfloat16)}, str(s["head"]))
        s["head_sha"] = _file_sha(s["head"])
    elif how == "token file":
        p = s["suite"] / "tokens" / "context-0001.json"
        ids = json.loads(p.read_text())
        ids[3] = (ids[3] + 1) % V
        p.write_text(json.dumps(ids))
    elif how == "suite digest":
        man = dict(s["manifest"], suite_token_sha256="1" * 64)
        (s["suite"] / "suite-manifest.json").write_text(json.dumps(man))
    elif how == "other suite":
        cap = dict(s["capture"], suite_token_sha256="2" * 64)
        (s["ref"] / "capture-manifest.json").write_text(json.dumps(cap))
    return s


@pytest.mark.parametrize("how,words", [
    ("incomplete", "not complete"), ("capture sha", "sha256"), ("head digest", "head file sha256"),
    ("shape", "not bfloat16"), ("hidden size", "hidden size"), ("token file", "token_sha256"),
    ("suite digest", "suite digest"), ("other suite", "captured over suite")])
def test_bad_inputs_are_refused_in_one_line_and_write_nothing(tmp_path, how, words):
    s = _bad(tmp_path, how)
    res = imp(s, tmp_path / "st")
    line = res.error()
    assert words in line, line
    assert not (tmp_path / "st").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".st.")]  # no temp folder left either


def test_an_existing_out_is_refused(suite, tmp_path):
    (tmp_path / "st").mkdir()
    assert "already exists" in imp(suite, tmp_path / "st").error()


def test_a_contexts_window_is_its_source_cluster():
    """fideval's intervals resample windows: contexts of one source cluster (4 a cluster in the v5 suite) share one, so
    they are resampled together as the suite's own bootstrap resamples them; a context without a cluster stands alone."""
    from fideval.store.suite_import import window_of

    a, b = ({"stratum": "code", "source_cluster": 7, "index": i} for i in (0, 1))
    assert window_of(a, "code-0000") == window_of(b, "code-0001") == "code-cluster-7"
    assert window_of({"stratum": "code", "source_cluster": 8}, "code-0002") != "code-cluster-7"
    assert window_of({"stratum": "code"}, "code-0003") == "code-0003"
    assert window_of({"stratum": "code", "source_cluster": ""}, "code-0004") == "code-0004"
