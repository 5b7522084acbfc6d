"""``fideval teacher`` end to end, resume, and its one-line errors on bad inputs."""

from __future__ import annotations

import json

import model_fixtures as mf
import numpy as np
import pytest
from cli_runner import run_fideval

from fideval.windows.layout import Sequences, length_dir, write_sequences

V = mf.COMMON["vocab_size"]


def _windows(root, vocab=V, tokenizer_sha=None):
    rng = np.random.default_rng(3)
    win = rng.integers(0, vocab, size=(2, 16)).astype(np.int32)
    write_sequences(length_dir(root, "windows", 16), Sequences(["code-000", "prose-000"], ["code", "prose"], win))
    cuts = win.reshape(4, 8)
    write_sequences(length_dir(root, "cuts", 8), Sequences(["code-000.c0", "code-000.c1", "prose-000.c0", "prose-000.c1"],
                                                           ["code", "code", "prose", "prose"], cuts))
    if tokenizer_sha:
        (root / "eval-windows.json").write_text(json.dumps({"provenance": {"tokenizer_sha256": tokenizer_sha}}))
    return win


def _invoke(*args):
    return run_fideval("teacher", *args)


def test_teacher_writes_every_position_and_resumes(tmp_path):
    from fideval.store import StoreReader

    model = mf.build("qwen3_moe", tmp_path / "model")
    win = _windows(tmp_path / "w")
    out = tmp_path / "store"
    res = _invoke("--model", model, "--windows", tmp_path / "w", "--out", out, "--device", "cpu", "--model-id", "tiny/qwen3moe")
    assert res.code == 0, res.stderr
    assert "6 sequences written" in res.stdout
    store = StoreReader(out)
    assert sorted(store.seq_ids) == ["code-000", "code-000.c0", "code-000.c1", "prose-000", "prose-000.c0", "prose-000.c1"]
    assert store.meta["model_id"] == "tiny/qwen3moe" and int(store.vocab_size) == V
    canary = json.loads(store.meta["canary"])
    assert all(c["identical"] for c in canary) and {c["folder"] for c in canary} == {"windows-16", "cuts-8"}
    ref = mf.reference_logits(model, win)
    ref_cut = mf.reference_logits(model, win.reshape(4, 8))
    logits, ids = store.read("prose-000")
    assert ids.tolist() == win[1].tolist() and logits.shape == (16, V)
    assert float(np.abs(logits - ref[1].numpy()).max()) <= 1e-5
    logits, _ = store.read("code-000.c1")
    assert float(np.abs(logits - ref_cut[1].numpy()).max()) <= 1e-5
    # resume: nothing left to do, nothing rewritten
    res = _invoke("--model", model, "--windows", tmp_path / "w", "--out", out, "--device", "cpu", "--model-id", "tiny/qwen3moe")
    assert res.code == 0 and "0 sequences written, 6 already done" in res.stdout


def _one_line_error(res, *needles):
    msg = res.error()  # exit status 2, one line, no traceback
    assert all(n in msg for n in needles), msg


def test_missing_tensor(tmp_path):
    model = mf.build("llama", tmp_path / "m")
    mf.rewrite(model, lambda sd: {k: v for k, v in sd.items() if k != "model.layers.1.self_attn.k_proj.weight"})
    _windows(tmp_path / "w")
    _one_line_error(_invoke("--model", model, "--windows", tmp_path / "w", "--out", tmp_path / "s"),
                    "model.layers.1.self_attn.k_proj.weight", "missing")


def test_misshaped_tensor(tmp_path):
    model = mf.build("deepseek_v3", tmp_path / "m")
    key = "model.layers.2.mlp.experts.3.up_proj.weight"
    mf.rewrite(model, lambda sd: {**sd, key: sd[key][:-1].contiguous()})
    _windows(tmp_path / "w")
    _one_line_error(_invoke("--model", model, "--windows", tmp_path / "w", "--out", tmp_path / "s"), key, "shape")


def test_truncated_safetensors(tmp_path):
    model = mf.build("llama", tmp_path / "m")
    p = model / "model.safetensors"
    p.write_bytes(p.read_bytes()[:-100])
    _windows(tmp_path / "w")
    _one_line_error(_invoke("--model", model, "--windows", tmp_path / "w", "--out", tmp_path / "s"), "model.safetensors")


def test_unsupported_architecture(tmp_path):
    model = mf.build("llama", tmp_path / "m")
    mf.set_config(model, architectures=["FooForCausalLM"])
    _windows(tmp_path / "w")
    _one_line_error(_invoke("--model", model, "--windows", tmp_path / "w", "--out", tmp_path / "s"), "FooForCausalLM", "not supported")


def test_token_ids_beyond_the_vocabulary(tmp_path):
    model = mf.build("llama", tmp_path / "m")
    _windows(tmp_path / "w", vocab=V + 50)
    _one_line_error(_invoke("--model", model, "--windows", tmp_path / "w", "--out", tmp_path / "s"), "vocabulary", str(V))


def test_tokenizer_fingerprint_mismatch(tmp_path):
    model = mf.build("llama", tmp_path / "m")
    (model / "tokenizer.json").write_text('{"model": "not the windows tokenizer"}')
    _windows(tmp_path / "w", tokenizer_sha="0" * 64)
    _one_line_error(_invoke("--model", model, "--windows", tmp_path / "w", "--out", tmp_path / "s"), "tokeniz", "eval-windows.json")


def test_model_parallel_must_divide_the_experts(tmp_path):
    from fideval.errors import FidevalError
    from fideval.model.runner import Runner

    model = mf.build("qwen3_moe", tmp_path / "m")  # 8 experts
    with pytest.raises(FidevalError, match=r"N=3 does not divide the 8 routed experts") as e:
        Runner(model, rank=0, world=3)
    assert "\n" not in str(e.value)


def test_cli_prints_one_line(tmp_path):
    """Through the real entry point: one line on stderr, exit status 2, no traceback."""
    model = mf.build("llama", tmp_path / "m")
    mf.set_config(model, architectures=["FooForCausalLM"])
    _windows(tmp_path / "w")
    res = run_fideval("teacher", "--model", model, "--windows", tmp_path / "w", "--out", tmp_path / "s", fresh_process=True,
                      timeout=120)
    assert res.code == 2
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("fideval: error:") and "FooForCausalLM" in lines[0], res.stderr


def test_a_token_file_runs_exactly_its_folder(tmp_path):
    """Given the token file a rule declares, the teacher runs that folder alone: a stale sibling of the same
    kind (cuts-4/ from an earlier config) is not globbed into the store."""
    from fideval.store import StoreReader

    model = mf.build("llama", tmp_path / "model")
    win = _windows(tmp_path / "w")
    write_sequences(length_dir(tmp_path / "w", "cuts", 4), Sequences(["stale-000.c0"], ["code"], win[0, :4][None]))
    res = _invoke("--model", model, "--windows", tmp_path / "w" / "cuts-8" / "tokens.safetensors", "--out", tmp_path / "s",
                  "--device", "cpu")
    assert res.code == 0, res.stderr
    assert sorted(StoreReader(tmp_path / "s").seq_ids) == ["code-000.c0", "code-000.c1", "prose-000.c0", "prose-000.c1"]
    other = tmp_path / "w" / "cuts-8" / "other.safetensors"
    other.write_bytes(b"")
    assert "not a tokens.safetensors in a windows-<W>/ or cuts-<C>/ folder" in _invoke(
        "--model", model, "--windows", other, "--out", tmp_path / "s2").error()
