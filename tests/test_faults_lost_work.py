"""Issue 40, "nothing scored is lost; no wrong file written": the work a failure does not make wrong is kept.

* ``fideval score`` stopped by a corrupt teacher or candidate shard half-way, or by a full disk, keeps the shards it
  scored (records.partial/, keyed by their inputs' hashes) and says so in its one line; the rerun scores only the
  rest and writes the records an uninterrupted run writes. A failed CPU check, a failed self-check or non-finite
  candidate logits make the scored rows suspect: nothing is kept.
* The fused pass does the same for the records it scored against teacher shards on disk.
* SIGTERM (what SLURM and Kubernetes send) takes Ctrl-C's path: the kept shards, the resume line naming the
  signal, exit 143 (130 for SIGINT), in ``fideval`` and in the torchrun entry of the teacher.
* ``fideval report --out DIR`` writes DIR as a whole: a failure half-way leaves the previous folder byte for byte.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from cli_runner import run_fideval
from faults_fixtures import make_store, reseal, snapshot, temp_leftovers
from test_score_run import _score_config, taught  # noqa: F401  (fixture)

from fideval.errors import FidevalError, StopSignals
from fideval.score import run as score_run
from fideval.score.resume import PARTIAL

SEQS = ["code-000", "code-001", "code-002", "code-003"]
VOCAB = 32


def header_len(path: Path) -> int:
    """Where a safetensors file's data starts."""
    return 8 + int.from_bytes(path.read_bytes()[:8], "little")


@pytest.fixture()
def pair(tmp_path):
    """A teacher and a candidate store of four 16-token shards, and the records of an uninterrupted run."""
    from faults_fixtures import STORE_META, store_data

    from fideval.store import StoreWriter

    teacher = make_store(tmp_path / "teacher", n=4)
    cand, w = tmp_path / "cand", StoreWriter(tmp_path / "cand", {**STORE_META, "vocab_size": VOCAB})
    noise = np.random.default_rng(1)
    for sid, logits, tokens in store_data(4, 16, VOCAB, 0):  # the teacher's tokens, its logits a little off
        w.write(sid, logits + noise.standard_normal(logits.shape).astype(np.float32) * 0.3, tokens, window_id=sid,
                domain="code")
    w.finish()
    args = ["--teacher", teacher, "--candidate", cand, "--device", "cpu", "--name", "q"]
    res = run_fideval("score", *args, "--out", tmp_path / "whole")
    assert res.code == 0, res.stderr
    return {"tmp": tmp_path, "teacher": teacher, "cand": cand, "args": args,
            "want": (tmp_path / "whole" / "records.parquet").read_bytes()}


def _flip(shard: Path, row: int) -> bytes:
    """Flip one byte of a logit of ``row``; returns the shard's bytes before."""
    before = shard.read_bytes()
    with open(shard, "r+b") as f:
        f.seek(header_len(shard) + (row * VOCAB + 3) * 4)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0x40]))
    return before


def _kept(out: Path) -> list[str]:
    return sorted(p.stem for p in (out / PARTIAL).glob("*.json"))


@pytest.mark.parametrize("which", ["teacher", "cand"])
def test_a_corrupt_shard_half_way_keeps_the_scored_shards_and_the_rerun_scores_the_rest(pair, which):
    """A byte flipped in the third shard of the teacher (or the candidate): sizes and headers pass the check
    before scoring, the SHA-256 fails when that shard is read. The two shards scored before it are kept."""
    shard = pair[which] / "shards" / "code-002.safetensors"
    before = _flip(shard, 5)
    out = pair["tmp"] / "o"
    res = run_fideval("score", *pair["args"], "--out", out)
    line = res.error()
    assert _kept(out) == SEQS[:2]
    assert line == (f"fideval: error: shard shards/code-002.safetensors: SHA-256 differs from the manifest (corrupt or "
                    f"altered); 2 of 4 shards are scored and kept in {out / PARTIAL} (run 'fideval verify' on the store; "
                    "re-run the teacher or re-download the store; a rerun of the same command resumes: only the other 2 "
                    "are scored)")
    assert not (out / "records.parquet").exists() and not (out / "score.json").exists()
    shard.write_bytes(before)  # the store repaired (re-downloaded)
    res = run_fideval("score", *pair["args"], "--out", out)
    assert res.code == 0, res.stderr
    assert f"score q: 2 of 4 shards already scored from the same inputs ({out / PARTIAL}), scoring the other 2" in res.stderr
    assert (out / "records.parquet").read_bytes() == pair["want"]
    assert not (out / PARTIAL).exists()


def test_a_full_disk_half_way_keeps_the_scored_shards(pair, monkeypatch):
    """The third kept shard's parquet hits ENOSPC: the two before it stay, the partial file is gone, and the line
    says both what failed and what was kept."""
    import pyarrow.parquet as pq

    real, calls = pq.write_table, []

    def full(table, where, **kw):
        calls.append(where)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(table, where, **kw)

    out = pair["tmp"] / "full"
    with monkeypatch.context() as m:
        m.setattr(pq, "write_table", full)
        res = run_fideval("score", *pair["args"], "--out", out)
    line = res.error()
    assert line == (f"fideval: error: disk full while writing {out / PARTIAL / 'code-002.parquet'}; 2 of 4 shards are "
                    f"scored and kept in {out / PARTIAL} (free space and run again; nothing partial was kept; a rerun of "
                    "the same command resumes: only the other 2 are scored)")
    assert _kept(out) == SEQS[:2] and temp_leftovers(out) == []
    res = run_fideval("score", *pair["args"], "--out", out)
    assert res.code == 0 and "2 of 4 shards already scored" in res.stderr, res.stderr
    assert (out / "records.parquet").read_bytes() == pair["want"]


def test_a_failed_cpu_check_keeps_nothing(pair, monkeypatch):
    """The CPU check fails on the third shard: the kernel is wrong, so every row it scored is; nothing is kept."""
    real, calls = score_run.max_rel_diff, []

    def worse(*a):
        calls.append(1)
        d, where = real(*a)
        return (1.0, where) if len(calls) == 3 else (d, where)

    out = pair["tmp"] / "cpu"
    with monkeypatch.context() as m:
        m.setattr(score_run, "max_rel_diff", worse)
        res = run_fideval("score", *pair["args"], "--out", out)
    line = res.error()
    assert "CPU check failed:" in line and "in shard code-002" in line and "kept" not in line
    assert len(calls) == 3 and not (out / PARTIAL).exists() and not (out / "records.parquet").exists()


def test_non_finite_candidate_rows_keep_nothing(pair):
    """NaN in the candidate's third shard (hashes resealed: a forged store, only the numbers wrong): the candidate's
    computation is broken, its finite rows are not trusted either (fideval.score.run.rows_suspect)."""
    shard = pair["cand"] / "shards" / "code-002.safetensors"
    with open(shard, "r+b") as f:
        f.seek(header_len(shard) + (5 * VOCAB + 3) * 4)
        f.write(np.float32(np.nan).tobytes())
    reseal(pair["cand"], "code-002")
    out = pair["tmp"] / "nan"
    line = run_fideval("score", *pair["args"], "--out", out).error()
    assert line == ("fideval: error: shard code-002: row 5 (and 0 more) holds NaN/+inf or no finite logit (fix the model "
                    "run, or pass --on-nonfinite skip to drop and count such rows)")
    assert not (out / PARTIAL).exists() and not (out / "records.parquet").exists()


def test_which_failures_make_the_rows_suspect():
    """rows_suspect against the scorer's own errors (raised by the real Scorer methods, typed SuspectRows), and
    against the input and disk errors that keep the work."""
    s = score_run.Scorer.__new__(score_run.Scorer)  # only the fields self_result reads
    s.max_kld, s.top1, s.rows, s.kernel = 1e-6, 10, 10, "torch"
    with pytest.raises(FidevalError) as e:
        s.self_result()
    assert score_run.rows_suspect(e.value)
    assert score_run.rows_suspect(score_run.KernelMismatch("CPU check failed: x"))
    for kept in (FidevalError("disk full while writing x", hint="free space and run again"),
                 FidevalError("cannot write x: Read-only file system"),
                 FidevalError("shard shards/a.safetensors: SHA-256 differs from the manifest (corrupt or altered)"),
                 FidevalError("store: shard shards/a.safetensors: 8 bytes, manifest says 16 (truncated?)"),
                 FidevalError("the candidate gave no logits for 1 teacher sequences (first 'a')")):
        assert not score_run.rows_suspect(kept), kept


def test_a_failed_self_check_leaves_no_records(pair, monkeypatch):
    """The teacher scored against itself is not exactly 0: the kernel is broken, and the records.parquet the run
    had just assembled from its rows is removed with the kept shards."""
    from fideval.score import kernels

    real = kernels.score_tensors

    def off(ref, cand, targets, kernel):
        figs, flags, bad = real(ref, cand, targets, kernel)
        figs[:, 0] += 1e-3  # every KLD off by a little: the self-check's exact 0 fails
        return figs, flags, bad

    out = pair["tmp"] / "self"
    with monkeypatch.context() as m:
        m.setattr(score_run, "score_tensors", off)
        m.setattr(score_run, "max_rel_diff", lambda *a: (0.0, ""))  # the CPU check passes: the self-check must catch it
        res = run_fideval("score", "--self-check", "--teacher", pair["teacher"], "--out", out, "--device", "cpu")
    assert "self-check failed: the teacher scored against itself gives max |KLD| 0.001" in res.error()
    assert not (out / "records.parquet").exists() and not (out / PARTIAL).exists()


# -- SIGTERM -----------------------------------------------------------------------------------------------------

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


def test_sigterm_mid_score_keeps_the_shards_names_the_signal_and_exits_143(taught, tmp_path):  # noqa: F811
    """A real SIGTERM to a real ``fideval score`` of a tiny model: one line naming SIGTERM, exit 143, the shards
    scored kept; the rerun scores only the rest and writes the records of an uninterrupted run byte for byte."""
    import yaml

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(taught["cfg"]))
    out = tmp_path / "out"
    args = ["score", "--teacher", str(taught["tmp"] / "teacher"), "--config", str(cfg), "--candidate", "mx", "--path",
            "weights-only", "--device", "cpu", "--out", str(out)]
    proc = subprocess.Popen([sys.executable, "-c", DRIVE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    while proc.poll() is None and not list((out / PARTIAL).glob("*.json")) and time.monotonic() - t0 < 240:
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143 and "Traceback" not in err, err
    kept = len(list((out / PARTIAL).glob("*.json")))
    assert 1 <= kept < 4
    assert err.strip().splitlines()[-1] == (
        f"fideval: score interrupted by SIGTERM: {kept} of 4 shards are scored and kept in {out / PARTIAL} "
        f"(run the same command again to resume: only the other {4 - kept} are scored)")
    res = run_fideval(*args)
    assert res.code == 0, res.stderr
    assert f"score mx: {kept} of 4 shards already scored from the same inputs ({out / PARTIAL}), scoring the other " \
           f"{4 - kept}" in res.stderr
    whole = _score_config(taught, "whole-sigterm")
    assert whole.code == 0, whole.stderr
    assert (out / "records.parquet").read_bytes() == (taught["tmp"] / "whole-sigterm" / "records.parquet").read_bytes()
    assert not (out / PARTIAL).exists()


SLOW_CHECK = """
import sys, time
import fideval.report.verdict as v
real = v.failures
def slow(*a, **k):
    print("checking", file=sys.stderr, flush=True)
    time.sleep(30)
    return real(*a, **k)
v.failures = slow
sys.argv = ["fideval", *sys.argv[1:]]
from fideval.cli import main
main()
"""

SLOW_TEACHER = """
import sys, time
import fideval.model.teacher as t
def slow(*a, **k):
    print("computing", file=sys.stderr, flush=True)
    time.sleep(30)
t.run_teacher = slow
sys.exit(t.main(sys.argv[1:]))
"""


def _signalled(script: str, args: list[str], sig: int) -> tuple[int, str]:
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=root)
    first = proc.stderr.readline()  # the verb is running
    assert first.strip() in ("checking", "computing"), first + proc.communicate()[1]
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


@pytest.mark.parametrize(("sig", "code", "by"), [(signal.SIGTERM, 143, " by SIGTERM"), (signal.SIGINT, 130, "")])
def test_any_verb_stopped_by_a_signal_says_which_in_one_line(sig, code, by):
    got, err = _signalled(SLOW_CHECK, ["check", "reports/demo/report.json"], sig)
    assert (got, err) == (code, f"fideval: check interrupted{by}: nothing partial was kept, earlier output is as it was "
                                "(run the same command again)\n")


def test_the_torchrun_teacher_entry_handles_sigterm(tmp_path):
    """``torchrun -m fideval.model.teacher``: the agent stops its ranks with SIGTERM; each says so and exits 143."""
    got, err = _signalled(SLOW_TEACHER, ["--model", "m", "--windows", "w", "--out", str(tmp_path / "o")], signal.SIGTERM)
    assert (got, err) == (143, "fideval: teacher interrupted by SIGTERM: the finished shards are kept, the partial one "
                               "was discarded (run the same command again to resume: finished shards are skipped)\n")


def test_stop_signals_restores_the_previous_handler_and_ignores_a_second_sigterm():
    before = signal.getsignal(signal.SIGTERM)
    with StopSignals() as stop:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler runs at the next bytecode; never reached
        os.kill(os.getpid(), signal.SIGTERM)  # already stopping: ignored, no second KeyboardInterrupt
        time.sleep(0.01)
        assert (stop.signum, stop.status()) == (signal.SIGTERM, 143)
        assert stop.named("score interrupted: 2 kept") == "score interrupted by SIGTERM: 2 kept"
    assert signal.getsignal(signal.SIGTERM) is before
    quiet = StopSignals()
    assert (quiet.status(), quiet.named("check interrupted: x")) == (130, "check interrupted: x")


# -- the fused pass ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fused_setup(tmp_path_factory):
    """The tiny FP8 DeepSeek-V3 release of tests/test_fused_pass.py, five 12-token cuts, and an uninterrupted
    fused pass (its teacher shards and every records.parquet)."""
    import fp8_fixtures as f8
    import yaml

    from fideval.windows.layout import Sequences, length_dir, write_sequences

    tmp = tmp_path_factory.mktemp("fusedlost")
    model = f8.build("deepseek_v3", "aligned", tmp / "fp8")
    toks = np.random.default_rng(5).integers(0, f8.V, size=(5, 12)).astype(np.int32)
    write_sequences(length_dir(tmp / "w", "cuts", 12), Sequences([f"code-{i:03d}.c0" for i in range(5)], ["code"] * 5, toks))
    cfg = {"run": "f", "model": {"path": str(model), "id": "toy/dsv3-fp8", "revision": "local"},
           "domains": [{"name": "code", "source": {"type": "local", "path": "x.jsonl"}}],
           "teacher": {"device": "cpu", "micro_batch": 2, "mlp_tokens": 24, "fused": True},
           "score": {"cpu_check_every": 7},
           "candidates": [{"name": "mx", "quant": {"routed_experts": {"format": "mxfp4"}}, "paths": ["weights-only"]}]}
    (tmp / "c.yaml").write_text(yaml.safe_dump(cfg))
    s = {"tmp": tmp, "cfg": tmp / "c.yaml", "tokens": tmp / "w" / "cuts-12" / "tokens.safetensors"}
    res = _fused(s, tmp / "whole")
    assert res.code == 0, res.stderr
    return s


def _fused(s, where):
    return run_fideval("fused", "--config", s["cfg"], "--windows", s["tokens"], "--domain", "code",
                       "--out", where / "teacher", "--records", where / "records")


def _outputs(where: Path) -> dict[str, bytes]:
    files = sorted((where / "teacher" / "shards").glob("*.safetensors")) + sorted(where.glob("records/**/records.parquet"))
    return {str(f.relative_to(where)): f.read_bytes() for f in files}


def test_a_full_disk_in_the_fused_pass_keeps_the_shards_and_records_on_disk(fused_setup, monkeypatch):
    import pyarrow.parquet as pq

    real, calls = pq.write_table, []

    def full(table, where, **kw):
        if PARTIAL in str(where):
            calls.append(where)
            if len(calls) >= 4:  # full from the fourth kept parquet on
                raise OSError(errno.ENOSPC, "No space left on device")
        return real(table, where, **kw)

    where = fused_setup["tmp"] / "full"
    with monkeypatch.context() as m:
        m.setattr(pq, "write_table", full)
        line = _fused(fused_setup, where).error()
    kept = list(where.glob(f"records/**/{PARTIAL}/*.json"))
    shards = len(list((where / "teacher" / "shards").glob("*.safetensors")))
    assert len(kept) == 3 and shards >= 2
    assert line.startswith("fideval: error: disk full while writing ") and (
        f"; {shards} of 5 teacher shards and the records of 3 shards scored against them are kept (free space and run "
        "again; nothing partial was kept; a rerun of the same command resumes: only what is missing is computed)"
    ) in line, line
    res = _fused(fused_setup, where)
    assert res.code == 0, res.stderr
    assert _outputs(where) == _outputs(fused_setup["tmp"] / "whole")
    assert not list(where.glob(f"records/**/{PARTIAL}"))


def test_a_failed_cpu_check_in_the_fused_pass_keeps_no_records(fused_setup, monkeypatch):
    real, calls = score_run.max_rel_diff, []

    def worse(*a):
        calls.append(1)
        d, where = real(*a)
        return (1.0, where) if len(calls) == 3 else (d, where)

    where = fused_setup["tmp"] / "cpu"
    with monkeypatch.context() as m:
        m.setattr(score_run, "max_rel_diff", worse)
        line = _fused(fused_setup, where).error()
    assert "CPU check failed:" in line and "kept" not in line
    assert not list(where.glob(f"records/**/{PARTIAL}/*"))  # the teacher's shards stay: they were checked apart


# -- fideval report --out DIR as a whole -------------------------------------------------------------------------

@pytest.fixture()
def reported(tmp_path):
    """A report folder of two builds as the workflow leaves it: report.json, summaries, plots, and beside them the
    card (README.md, results.html) and check.txt, and a file of the user's."""
    import synthetic as syn

    windows = syn.window_ids(["code", "chat"], 4)
    dirs = []
    for cand, eff in (("q4", 1.2), ("q8", 0.4)):
        df = syn.records_frame(cand, "serving", 64, 64, windows, effect=eff)
        dirs.append(syn.write_records(tmp_path / cand, df, cand, "serving", 64))
    syn.write_eval_windows(tmp_path, windows, 64)
    out = tmp_path / "reports" / "run"
    args = [a for d in dirs for a in ("--records", str(d))] + ["--windows", str(tmp_path), "--out", str(out),
                                                               "--resamples", "200"]
    res = run_fideval("report", *args)
    assert res.code == 0, res.stderr
    res = run_fideval("card", str(out / "report.json"), "--candidate", "q4", "--out", str(out / "README.md"), "--html",
                      str(out / "results.html"))
    assert res.code == 0, res.stderr
    (out / "check.txt").write_text("ok\n")
    (out / "notes").mkdir()
    (out / "notes" / "mine.txt").write_text("the user's\n")
    return {"tmp": tmp_path, "out": out, "args": args, "dirs": dirs}


def _plot_fails(monkeypatch, exc: BaseException) -> None:
    """The second plot kind raises ``exc`` when it is drawn (after the first kind's PNG is written)."""
    from fideval.report import plots

    def broken(f, path):
        raise exc

    monkeypatch.setattr(plots, "PLOTS", tuple((k, broken if k == "kld-position" else fn) for k, fn in plots.PLOTS))


def test_a_report_failing_half_way_leaves_the_previous_folder_byte_identical(reported, monkeypatch):
    out = reported["out"]
    before = snapshot(out.parent)
    assert {"report.json", "README.md", "results.html", "check.txt", "notes/mine.txt"} <= set(
        k.removeprefix("run/") for k in before)
    from fideval.fsio import atomic_path
    from fideval.report import plots

    real_save = plots._save

    def save_full(fig, path):  # the disk fills while the second plot kind's first PNG is written
        if "kld-position" not in path.name:
            return real_save(fig, path)
        import matplotlib.pyplot as plt

        plt.close(fig)
        with atomic_path(path) as tmp:
            tmp.write_bytes(b"half a png")
            raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(plots, "_save", save_full)
        res = run_fideval("report", *reported["args"])
    line = res.error()
    assert line.startswith(f"fideval: error: disk full while writing {out / 'plots' / 'kld-position-'}")
    assert line.endswith("(free space and run again; nothing partial was kept; the previous report folder is as it was)")
    assert snapshot(out.parent) == before
    assert temp_leftovers(out.parent) == []


def test_a_plot_writer_raising_leaves_the_previous_folder_byte_identical(reported, monkeypatch):
    """The brief's fault: a plot writer that raises (a bug, not bad input) half-way through the plots."""
    from fideval.config import ReportConfig
    from fideval.report.build import build, write

    out = reported["out"]
    before = snapshot(out.parent)
    built = build([str(d) for d in reported["dirs"]], self_check_dirs=[], noise_dirs=[], windows=None, cfg=None,
                  manifests=[], settings=ReportConfig(resamples=200))
    with monkeypatch.context() as m:
        _plot_fails(m, RuntimeError("the plot writer broke"))
        with pytest.raises(RuntimeError, match="the plot writer broke"):
            write(built, out)
    assert snapshot(out.parent) == before
    assert temp_leftovers(out.parent) == []


def test_a_rerun_report_replaces_its_own_files_and_keeps_the_others(reported):
    """The report's files are replaced as a whole (an older summary or plot does not survive); the card, check.txt
    and the user's files are kept byte for byte, and so is the folder's mode."""
    out = reported["out"]
    os.chmod(out, 0o750)
    kept = {k: v for k, v in snapshot(out).items() if k in ("README.md", "results.html", "check.txt", "notes/mine.txt")}
    (out / "summary-old-serving.json").write_text("{}")
    (out / "plots" / "kld-cdf-old-serving-64.png").write_bytes(b"old")
    res = run_fideval("report", *reported["args"][:2], "--windows", str(reported["tmp"]), "--out", str(out),
                      "--resamples", "200")  # q4 alone now
    assert res.code == 0, res.stderr
    after = snapshot(out)
    assert {k: after[k] for k in kept} == kept
    assert sorted(k for k in after if k.startswith("summary-")) == ["summary-q4-serving.json"]
    assert sorted(p.name for p in (out / "plots").iterdir()) == sorted(
        p["file"].removeprefix("plots/") for p in json.loads((out / "report.json").read_text())["plots"])
    assert (os.stat(out).st_mode & 0o777) == 0o750
    assert temp_leftovers(out.parent) == []


def test_a_folder_left_aside_by_a_killed_swap_is_put_back(reported):
    """Killed between the swap's two renames: the folder is aside under a hidden name and --out is gone; the next
    report puts it back first, so the card and the user's files survive the kill too."""
    out = reported["out"]
    kept = snapshot(out)["README.md"]
    aside = out.parent / f".{out.name}.0badc0de.report-old"
    os.rename(out, aside)
    (out.parent / f".{out.name}.abc.report-staging").mkdir()
    res = run_fideval("report", *reported["args"])
    assert res.code == 0, res.stderr
    assert snapshot(out)["README.md"] == kept and (out / "notes" / "mine.txt").exists()
    assert temp_leftovers(out.parent) == []


def test_a_report_into_the_working_directory_is_refused(reported):
    out = reported["out"]
    before = snapshot(out)
    args = [a for a in reported["args"] if a != str(out)]
    i = args.index("--out")
    args.insert(i + 1, ".")
    line = run_fideval("report", *args, cwd=out).error()
    assert line == ("fideval: error: --out . holds the working directory, and a report folder is replaced as a whole "
                    "(write the report to a folder of its own, e.g. reports/RUN)")
    assert snapshot(out) == before
