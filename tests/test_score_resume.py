"""Resumable ``fideval score``: Ctrl-C keeps every scored shard and says how to resume; a rerun scores only the
rest and writes the very records an uninterrupted run writes; kept shards are hash-checked; input shards'
sizes and headers are checked before the first is scored."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from cli_runner import run_fideval
from test_score_run import _make, _score_config, stores, taught  # noqa: F401  (fixtures)

from fideval.score import run as score_run
from fideval.score.resume import PARTIAL

SEQS = ["code-000.c0", "code-000.c1", "prose-000.c0", "prose-000.c1"]  # the taught teacher's, in order


def _interrupt_after(monkeypatch, n):
    """Ctrl-C (KeyboardInterrupt, as Python raises it on SIGINT) while the scorer takes shard n + 1."""
    real, calls = score_run.Scorer.shard, []

    def shard(self, item):
        calls.append(item.seq_id)
        if len(calls) > n:
            raise KeyboardInterrupt
        return real(self, item)

    monkeypatch.setattr(score_run.Scorer, "shard", shard)


def _yielded(monkeypatch):
    """The seq ids the model runner computes and hands to the scorer."""
    import fideval.model.runner as runner

    seen, real = [], runner.Runner.iter_logits

    def iter_logits(self, *a, **kw):
        for sid, x in real(self, *a, **kw):
            seen.append(sid)
            yield sid, x

    monkeypatch.setattr(runner.Runner, "iter_logits", iter_logits)
    return seen


def test_interrupted_model_run_resumes_with_only_the_rest(taught, monkeypatch):  # noqa: F811
    whole = _score_config(taught, "whole")
    assert whole.code == 0, whole.stderr
    want = (taught["tmp"] / "whole" / "records.parquet").read_bytes()
    out = taught["tmp"] / "cut"
    with monkeypatch.context() as m:
        _interrupt_after(m, 2)
        res = _score_config(taught, "cut")
    assert res.code == 130 and "Traceback" not in res.stderr
    line = res.stderr.strip().splitlines()[-1]
    assert line == (f"fideval: score interrupted: 2 of 4 shards are scored and kept in {out / PARTIAL} "
                    "(run the same command again to resume: only the other 2 are scored)")
    assert not (out / "records.parquet").exists() and not (out / "score.json").exists()
    assert sorted(p.name for p in (out / PARTIAL).glob("*.json")) == [f"{s}.json" for s in SEQS[:2]]
    with monkeypatch.context() as m:
        ran = _yielded(m)
        res = _score_config(taught, "cut")
    assert res.code == 0, res.stderr
    assert ran == SEQS[2:]  # the runner computed and yielded only the unscored shards
    assert f"2 of 4 shards already scored from the same inputs ({out / PARTIAL}), scoring the other 2" in res.stderr
    assert (out / "records.parquet").read_bytes() == want  # identical records
    a, b = (json.loads((taught["tmp"] / d / "score.json").read_text()) for d in ("whole", "cut"))
    for k in ("rows", "cpu_check", "nonfinite_rows", "candidate_info", "teacher"):
        assert a[k] == b[k], k
    assert not (out / PARTIAL).exists()


def test_kept_shards_are_hash_checked_and_keyed_by_their_inputs(stores, monkeypatch):  # noqa: F811
    args = ["--teacher", stores["teacher"], "--candidate", stores["candidate"], "--device", "cpu", "--name", "q4"]
    assert run_fideval("score", *args, "--out", stores["tmp"] / "ref").code == 0
    want = (stores["tmp"] / "ref" / "records.parquet").read_bytes()
    out = stores["tmp"] / "o"
    with monkeypatch.context() as m:
        _interrupt_after(m, 2)
        assert run_fideval("score", *args, "--out", out).code == 130
    # a kept shard altered on disk is scored again, not trusted
    (out / PARTIAL / "code-000.c0.parquet").write_bytes(b"not parquet")
    res = run_fideval("score", *args, "--out", out)
    assert res.code == 0 and "1 of 3 shards already scored" in res.stderr
    assert (out / "records.parquet").read_bytes() == want
    # kept shards from other settings (another CPU-check stride) are not reused: the key covers them
    with monkeypatch.context() as m:
        _interrupt_after(m, 2)
        assert run_fideval("score", *args, "--out", out, "--cpu-check-every", "2").code == 130
    res = run_fideval("score", *args, "--out", out)
    assert res.code == 0 and "already scored" not in res.stderr
    assert (out / "records.parquet").read_bytes() == want


def test_a_truncated_shard_is_found_before_scoring(stores):  # noqa: F811
    cand = _make(stores["tmp"] / "short", stores["cand"], stores["tokens"])
    shard = next((cand / "shards").glob("prose-000.c0*"))
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size - 8)
    out = stores["tmp"] / "t"
    res = run_fideval("score", "--teacher", stores["teacher"], "--candidate", cand, "--device", "cpu", "--out", out)
    assert f"shard shards/{shard.name}: {shard.stat().st_size} bytes, manifest says {shard.stat().st_size + 8} (truncated?)" \
        in res.error()
    assert not (out / PARTIAL).exists()  # nothing was scored: the last shard was checked before the first was


DRIVE = """
import sys, time
from fideval.score import run
real = run.Scorer.shard
def slow(self, item):  # a long model run, shard by shard
    out = real(self, item)
    time.sleep(1.0)
    return out
run.Scorer.shard = slow
sys.argv = ["fideval", *sys.argv[1:]]
from fideval.cli import main
main()
"""


@pytest.mark.slow
def test_ctrl_c_on_a_terminal_keeps_the_scored_shards(taught, tmp_path):  # noqa: F811
    """A real SIGINT to a real process on a pseudo-terminal: the bar renders, Ctrl-C prints one line (no
    traceback) and exits 130; the rerun finishes with the records of an uninterrupted run."""
    import yaml

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(taught["cfg"]))
    out = tmp_path / "out"
    args = ["score", "--teacher", str(taught["tmp"] / "teacher"), "--config", str(cfg), "--candidate", "mx", "--path",
            "weights-only", "--device", "cpu", "--out", str(out)]
    leader, follower = os.openpty()
    proc = subprocess.Popen([sys.executable, "-c", DRIVE, *args], stdin=follower, stdout=follower, stderr=follower,
                            env={**os.environ, "COLUMNS": "120", "TERM": "xterm"}, start_new_session=True)
    os.close(follower)
    os.set_blocking(leader, False)
    text, sent, t0 = b"", False, time.monotonic()
    while proc.poll() is None and time.monotonic() - t0 < 240:
        try:
            text += os.read(leader, 65536)
        except (BlockingIOError, OSError):
            time.sleep(0.05)
        if not sent and len(list((out / PARTIAL).glob("*.json"))) >= 1:
            os.kill(proc.pid, signal.SIGINT)
            sent = True
    try:
        while chunk := os.read(leader, 65536):
            text += chunk
    except OSError:
        pass
    os.close(leader)
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text.decode(errors="replace"))  # the terminal's escapes
    assert sent and proc.wait(timeout=60) == 130, shown
    assert "Traceback" not in shown and "score mx" in shown and "rows/s" in shown, shown
    last = [ln for ln in shown.replace("\r", "\n").splitlines() if ln.strip()][-1]
    assert last.startswith("fideval: score interrupted: ") and "run the same command again to resume" in last, shown
    kept = len(list((out / PARTIAL).glob("*.json")))
    assert 1 <= kept < 4 and f"{kept} of 4 shards are scored and kept" in last
    res = run_fideval(*args)
    assert res.code == 0 and f"{kept} of 4 shards already scored" in res.stderr
    whole = _score_config(taught, "whole-pty")
    assert whole.code == 0
    assert (out / "records.parquet").read_bytes() == (taught["tmp"] / "whole-pty" / "records.parquet").read_bytes()


@pytest.mark.parametrize(("verb", "patch", "line"), [
    (["check", "reports/demo/report.json"], "fideval.report.verdict.failures",
     "fideval: check interrupted: nothing partial was kept, earlier output is as it was (run the same command again)"),
    (["teacher", "--model", "m", "--windows", "w", "--out", "o"], "fideval.model.teacher_pass.sequence_folders",
     "fideval: teacher interrupted: the finished shards are kept, the partial one was discarded "
     "(run the same command again to resume: finished shards are skipped)"),
])
def test_ctrl_c_in_any_verb_is_one_line(verb, patch, line, monkeypatch):
    """Typer turns Ctrl-C into a silent exit 130; every verb says instead what was kept, in one line."""
    from pathlib import Path

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(patch, interrupted)
    res = run_fideval(*verb, cwd=Path(__file__).resolve().parent.parent)
    assert res.code == 130 and res.stderr == line + "\n"


def test_other_torchrun_ranks_run_the_same_shards_and_write_nothing(stores, monkeypatch):  # noqa: F811
    """Under torchrun every rank runs the model (its collectives) but rank 0 alone scores, writes and locks;
    the others skip exactly the shards rank 0 kept, so both compute the same chunks."""
    from fideval.score.candidate import from_store
    from fideval.store import StoreReader

    out = stores["tmp"] / "ranks"
    args = ["--teacher", stores["teacher"], "--candidate", stores["candidate"], "--device", "cpu", "--out", out]
    with monkeypatch.context() as m:
        _interrupt_after(m, 1)
        assert run_fideval("score", *args).code == 130
    before = sorted(p.name for p in out.rglob("*"))
    teacher = StoreReader(stores["teacher"])
    cand = from_store(StoreReader(stores["candidate"]), teacher, "cand", spec=str(stores["candidate"]))  # as the CLI names it
    seen, inner = [], cand.shards
    cand.shards = (seen.append(s.seq_id) or s for s in inner)
    monkeypatch.setenv("RANK", "1")
    assert score_run.score_candidate(teacher, cand, out, score_run.ScoreSettings(device="cpu")) == {}
    assert seen == teacher.seq_ids[1:]  # rank 0 kept the first shard: this rank skips it too
    assert sorted(p.name for p in out.rglob("*")) == before  # and writes nothing
    res = run_fideval("score", *args)  # rank 1 of a CLI run: no lock taken, no line printed, nothing written
    assert res.code == 0 and res.stdout == "" and sorted(p.name for p in out.rglob("*")) == before
