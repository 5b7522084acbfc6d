"""A full disk, an unwritable folder, and two runs on one output folder.

Full disk two ways: a real 1 MiB tmpfs (when this machine lets the test mount one; CI runs as root) and a
patched writer that raises ENOSPC after N bytes (everywhere). Either way the user sees one line naming the
file being written, nothing partial is kept, a previous output in the same folder is untouched, and after
space is freed the resumed run equals an uninterrupted one bit for bit.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time

import pytest
from cli_runner import run_fideval, start_fideval
from faults_fixtures import assert_no_partial_files, error_line, remount, results_only, snapshot, temp_leftovers, tmpfs, write_kld_base
from windows_fixtures import make_tokenizer, text_docs, write_config, write_jsonl


def _import(src, out):
    return ["import-llamacpp", src, "--out", out, "--model-id", "org/base"]


@pytest.fixture(scope="module")
def kld(tmp_path_factory):
    """A llama.cpp file whose store is about 2 MB (8 shards of 258 KB) and that store, made on a roomy disk."""
    t = tmp_path_factory.mktemp("disk-kld")
    src = write_kld_base(t / "base.kld", n_ctx=128, n_vocab=1024, n_chunk=8, seed=1)
    r = run_fideval(*_import(src, t / "ref"))
    assert r.code == 0, r.stderr
    return src, t / "ref"


@pytest.fixture(scope="module")
def win(tmp_path_factory):
    t = tmp_path_factory.mktemp("disk-win")
    tok = make_tokenizer(t / "tok")
    docs = write_jsonl(t / "a.jsonl", text_docs(3, 60))
    cfg = write_config(t / "c.yaml", tok, [{"name": "a", "source": {"type": "local", "path": str(docs)}}])
    return cfg


# -- full disk: real tmpfs -----------------------------------------------------------------------------------
def test_disk_full_mid_shard_on_tmpfs_then_resume(kld, tmp_path):
    src, ref = kld
    with tmpfs(tmp_path / "mnt", "1m") as mnt:
        (mnt / "precious.txt").write_text("written before the run")
        before = snapshot(mnt)
        code, _, err = run_fideval(*_import(src, mnt / "st"))
        line = error_line(code, err, "disk full while writing", str(mnt / "st"))
        assert ".safetensors" in line or "manifest" in line or ".entry.json" in line or "index" in line
        assert snapshot(mnt)["precious.txt"] == before["precious.txt"]
        assert_no_partial_files(mnt / "st", ref)
        assert temp_leftovers(mnt / "st") == []
        written = len(list((mnt / "st" / "shards").glob("*.safetensors")))
        assert 0 < written < 8  # it stopped mid-way, keeping the finished shards
        remount(mnt, "size=16m")
        code, out, err = run_fideval(*_import(src, mnt / "st"))
        assert code == 0, err
        assert f"({8 - written} written)" in out  # the finished shards were not redone
        assert results_only(snapshot(mnt / "st")) == results_only(snapshot(ref))


def test_windows_disk_full_on_tmpfs_keeps_the_previous_output(win, tmp_path):
    with tmpfs(tmp_path / "mnt", "1m") as mnt:
        out = mnt / "w"
        assert run_fideval("windows", win, "--out", out, "--seed", "5")[0] == 0
        old = snapshot(out)
        free = os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize
        with open(mnt / "filler", "wb") as f:  # leave about two pages: the new run cannot fit
            f.write(b"\0" * (free - 8192))
        code, _, err = run_fideval("windows", win, "--out", out)
        error_line(code, err, "disk full while writing", str(out))
        assert snapshot(out) == old, "a failed rewrite must leave the previous windows untouched"
        assert temp_leftovers(out) == []
        (mnt / "filler").unlink()
        assert run_fideval("windows", win, "--out", out)[0] == 0
        assert results_only(snapshot(out)) != results_only(old)  # the seed-0 windows, now complete
        assert (out / "eval-windows.json").is_file()


# -- full disk: patched writer (no mount needed) -------------------------------------------------------------
class _Full:
    """os.fdopen replacement whose files raise ENOSPC once ``budget`` bytes have been written in total."""

    def __init__(self, budget: int):
        self.budget = budget
        self.real = os.fdopen

    def __call__(self, fd, *a, **kw):
        f = self.real(fd, *a, **kw)
        outer = self

        class F:
            def write(self, b):
                n = len(memoryview(b).cast("B"))
                if n > outer.budget:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                outer.budget -= n
                return f.write(b)

            def __getattr__(self, k):
                return getattr(f, k)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return f.__exit__(*exc)

        return F()


@pytest.mark.parametrize("budget", [0, 100_000, 700_000, 1_500_000])
def test_disk_full_patched_writer_then_resume(kld, tmp_path, monkeypatch, budget):
    import fideval.fsio

    src, ref = kld
    out = tmp_path / "st"
    with monkeypatch.context() as m:
        m.setattr(fideval.fsio.os, "fdopen", _Full(budget))
        code, _, err = run_fideval(*_import(src, out))
    error_line(code, err, "disk full while writing", str(out))
    assert_no_partial_files(out, ref)
    assert temp_leftovers(out) == []
    assert run_fideval(*_import(src, out))[0] == 0
    assert results_only(snapshot(out)) == results_only(snapshot(ref))


def test_windows_disk_full_patched_writer_keeps_the_previous_output(win, tmp_path, monkeypatch):
    import fideval.fsio

    out = tmp_path / "w"
    assert run_fideval("windows", win, "--out", out, "--seed", "5")[0] == 0
    old = snapshot(out)
    with monkeypatch.context() as m:
        m.setattr(fideval.fsio.os, "fdopen", _Full(4000))
        code, _, err = run_fideval("windows", win, "--out", out)
    error_line(code, err, "disk full while writing", str(out))
    assert snapshot(out) == old and temp_leftovers(out) == []


# -- unwritable folders --------------------------------------------------------------------------------------
def test_read_only_file_system(win, kld, tmp_path):
    with tmpfs(tmp_path / "ro", "1m", read_only=True) as ro:
        code, _, err = run_fideval("windows", win, "--out", ro / "w")
        error_line(code, err, str(ro / "w"), "Read-only file system")
        code, _, err = run_fideval(*_import(kld[0], ro / "st"))
        error_line(code, err, str(ro / "st"), "Read-only file system")


def test_read_only_store_folder_for_import(kld, tmp_path):
    """A folder the run may not write in, made so for root too: an existing store remounted read-only."""
    src, ref = kld
    with tmpfs(tmp_path / "mnt", "4m") as mnt:
        code, _, err = run_fideval(*_import(src, mnt / "st"))
        assert code == 0, err
        before = snapshot(mnt)
        remount(mnt, "ro")  # the store is complete, but a re-import still takes the lock: one line, no change
        code, _, err = run_fideval(*_import(src, mnt / "st"))
        error_line(code, err, str(mnt / "st"), "Read-only file system")
        assert snapshot(mnt) == before


# -- two runs, one output folder -----------------------------------------------------------------------------
HOLD = "import sys, time\nfrom fideval.lock import output_lock\nwith output_lock(sys.argv[1]):\n" \
       "    print('held', flush=True)\n    time.sleep(60)\n"


@pytest.mark.parametrize("verb", ["windows", "import-llamacpp"])
def test_second_run_on_a_locked_folder_is_refused(verb, win, kld, tmp_path):
    out = tmp_path / "out"
    args = ["windows", win, "--out", out] if verb == "windows" else _import(kld[0], out)
    assert run_fideval(*args)[0] == 0
    before = results_only(snapshot(out))
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        code, _, err = run_fideval(*args)
        error_line(code, err, str(out), "being written by another run", f"pid {holder.pid}")
        assert results_only(snapshot(out)) == before and temp_leftovers(out) == []
    finally:
        holder.kill()
        holder.wait()
    assert run_fideval(*args)[0] == 0  # the lock died with its holder (SIGKILL): no stale lock


@pytest.mark.slow
def test_two_concurrent_windows_runs(win, tmp_path):
    """Two real processes on one --out: each one either finishes or is refused with the lock line, and the
    output is the one a single run makes."""
    ref = tmp_path / "ref"
    assert run_fideval("windows", win, "--out", ref)[0] == 0
    out = tmp_path / "out"
    procs = [start_fideval("windows", win, "--out", out) for _ in range(2)]
    deadline = time.monotonic() + 300
    results = [p.communicate(timeout=max(1, deadline - time.monotonic())) for p in procs]
    codes = [p.returncode for p in procs]
    assert 0 in codes, results
    for p, (_, err) in zip(procs, results):
        if p.returncode != 0:
            error_line(p.returncode, err, str(out), "being written by another run")
    assert results_only(snapshot(out)) == results_only(snapshot(ref))
    assert temp_leftovers(out) == []
