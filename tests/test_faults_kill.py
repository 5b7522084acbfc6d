"""SIGKILL at random points of each landed stage that writes files, then resume and compare.

Each test first makes an uninterrupted reference output. Then, for kill points drawn with a fixed seed, a
child process runs the real CLI and is SIGKILLed -- by itself at an exact byte or rename (the kill driver in
faults_fixtures: mid-shard, mid-manifest, between a file's rename and its sidecar...) or by the test at a
random moment. After each kill: every visible file is byte-identical to the reference (a file is complete or
absent, never partial). Then the same command runs again and the final output must equal the reference bit
for bit, with no temp file left.
"""

from __future__ import annotations

import random
import signal
import time

import pytest
from cli_runner import run_fideval, start_fideval
from faults_fixtures import assert_no_partial_files, results_only, run_killed, snapshot, temp_leftovers, write_kld_base
from windows_fixtures import make_tokenizer, text_docs, write_config, write_jsonl

KILLED = -signal.SIGKILL


def _import_args(src, out):
    return ["import-llamacpp", src, "--out", out, "--model-id", "org/base", "--model-revision", "0" * 40]


def test_import_llamacpp_killed_at_exact_points_resumes_bit_identical(tmp_path):
    """The store writer (teacher stores are written the same way) killed mid-shard, between a shard and its
    sidecar, mid-manifest and mid-index; the resumed store equals an uninterrupted one."""
    src = write_kld_base(tmp_path / "base.kld", n_ctx=64, n_vocab=512, n_chunk=6, seed=3)
    ref = tmp_path / "ref"
    p, events = run_killed(tmp_path, _import_args(src, ref), -1)
    assert p.returncode == 0 and events > 0, p.stderr
    want = results_only(snapshot(ref))
    assert "manifest.json" in want and sum(k.startswith("shards/") for k in want) == 6
    rng = random.Random(20261202)
    points = sorted(rng.randrange(events) for _ in range(5)) + [events - 1]  # the last: the final rename
    for i, k in enumerate(points):
        out = tmp_path / f"run{i}"
        p, _ = run_killed(tmp_path, _import_args(src, out), k)
        assert p.returncode == KILLED, (k, p.stderr[-2000:])
        assert_no_partial_files(out, ref)
        code, _, err = run_fideval(*_import_args(src, out))  # resume
        assert code == 0, err
        assert results_only(snapshot(out)) == want, f"kill at event {k} of {events}: resumed store differs"
        assert temp_leftovers(out) == [], k
        assert not list(out.glob("shards/*.entry.json"))


def test_import_llamacpp_killed_at_random_times_resumes_bit_identical(tmp_path):
    """The same with an external SIGKILL at random moments (no instrumentation in the child at all)."""
    src = write_kld_base(tmp_path / "base.kld", n_ctx=256, n_vocab=2048, n_chunk=16, seed=4)
    ref = tmp_path / "ref"
    t0 = time.monotonic()
    code, _, err = run_fideval(*_import_args(src, ref))
    assert code == 0, err
    writing = time.monotonic() - t0  # the whole run in-process: about the child's time after its imports
    want = results_only(snapshot(ref))
    rng = random.Random(7)
    killed_midway = 0
    for i in range(3):
        out = tmp_path / f"run{i}"
        proc = start_fideval(*_import_args(src, out))
        while not (out / "shards").exists() and proc.poll() is None:  # past the imports: now it writes
            time.sleep(0.002)
        time.sleep(rng.uniform(0, writing / 2))
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
        killed_midway += proc.returncode == KILLED and not (out / "manifest.json").exists()
        assert_no_partial_files(out, ref)
        code, _, err = run_fideval(*_import_args(src, out))
        assert code == 0, err
        assert results_only(snapshot(out)) == want
        assert temp_leftovers(out) == []
    assert killed_midway >= 2, "the kills came too late to interrupt the writes"


@pytest.fixture(scope="module")
def windows_case(tmp_path_factory):
    t = tmp_path_factory.mktemp("kill-windows")
    tok = make_tokenizer(t / "tok")
    docs = write_jsonl(t / "a.jsonl", text_docs(5, 80))
    cal = write_jsonl(t / "cal.jsonl", text_docs(6, 20))
    cfg = write_config(t / "c.yaml", tok, [{"name": "a", "source": {"type": "local", "path": str(docs)}},
                                             {"name": "b", "source": {"type": "local", "path": str(docs)}}],
                       screen={"calibration": [{"type": "local", "path": str(cal)}]})
    return t, cfg


@pytest.mark.slow
def test_windows_killed_at_random_points_rebuilds_bit_identical(windows_case, tmp_path):
    t, cfg = windows_case
    ref = tmp_path / "ref"
    p, events = run_killed(tmp_path, ["windows", cfg, "--out", ref], -1)
    assert p.returncode == 0 and events > 0, p.stderr
    want = results_only(snapshot(ref))
    assert {"eval-windows.json", "index.parquet", "windows-256/tokens.safetensors", "cuts-64/tokens.safetensors"} <= set(want)
    rng = random.Random(99)
    for i, k in enumerate([rng.randrange(events // 2), rng.randrange(events // 2, events)]):
        out = tmp_path / f"run{i}"
        old = {}
        if i == 1:  # the second kill hits a folder that already holds a complete older run
            assert run_fideval("windows", cfg, "--out", out, "--seed", "5")[0] == 0
            old = results_only(snapshot(out))
            assert old["eval-windows.json"] != want["eval-windows.json"]
        p, _ = run_killed(tmp_path, ["windows", cfg, "--out", out], k)
        assert p.returncode == KILLED, (k, p.stderr[-2000:])
        seen = results_only(snapshot(out))
        if "eval-windows.json" in seen:  # present means complete: all old (killed while staging) or all new
            assert seen in (old, want), f"kill at event {k}: a complete-looking output mixes runs"
        else:  # killed between renames: each file is whole, from one run or the other
            assert all(v in (old.get(f), want.get(f)) for f, v in seen.items())
        if i == 1:
            assert seen == old, "writes are staged: a kill while writing leaves the previous output intact"
        code, _, err = run_fideval("windows", cfg, "--out", out)
        assert code == 0, err
        assert results_only(snapshot(out)) == want, f"kill at event {k} of {events}: rebuilt windows differ"
        assert temp_leftovers(out) == []


@pytest.mark.slow
def test_teacher_killed_at_a_random_point_resumes_bit_identical(tmp_path):
    """The teacher (layer-by-layer runner into a store) on a tiny llama: killed mid-shard, resumed."""
    pytest.importorskip("fideval.model.teacher")
    import json

    import model_fixtures

    from fideval.windows.layout import Sequences, write_sequences

    model = model_fixtures.build("llama", tmp_path / "m")
    toks = model_fixtures.tokens(96, n=5, length=32)
    write_sequences(tmp_path / "w" / "windows-32", Sequences(ids=[f"a-{i:03d}" for i in range(5)], domains=["a"] * 5,
                                                             tokens=toks))

    def args(out):
        return ["teacher", "--model", model, "--windows", tmp_path / "w", "--out", out, "--lengths", "windows",
                "--device", "cpu"]

    # the reference run far from the killed one's folder: a store hard-links a sibling store's identical head
    # (fideval.store.head), which would change the killed run's write events
    ref = tmp_path / "reference" / "one" / "store"
    p, events = run_killed(tmp_path, args(ref), -1)
    assert p.returncode == 0 and events > 0, p.stderr[-3000:]
    want = results_only(snapshot(ref))
    k = random.Random(5).randrange(events // 5, 4 * events // 5)  # somewhere in the shards
    out = tmp_path / "run"
    p, _ = run_killed(tmp_path, args(out), k)
    assert p.returncode == KILLED, p.stderr[-3000:]
    assert_no_partial_files(out, ref)
    # Resume in a fresh process like the reference run: in-process, another test may have changed torch's
    # thread count, and CPU float sums change order with it (the store records torch_threads).
    p, _ = run_killed(tmp_path, args(out), -1)
    assert p.returncode == 0, p.stderr[-3000:]
    got = results_only(snapshot(out))
    # the manifest (and the dataset card that names its SHA-256) carry the run's timings; everything else is bytes
    derived = ("manifest.json", "README.md")
    assert {f: v for f, v in got.items() if f not in derived} == {f: v for f, v in want.items() if f not in derived}
    m_got, m_want = (json.loads((d / "manifest.json").read_text()) for d in (out, ref))
    assert m_got["shards"] == m_want["shards"]
    assert temp_leftovers(out) == []
