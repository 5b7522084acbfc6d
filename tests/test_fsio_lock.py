"""Atomic writes, path containment and the output lock."""

import multiprocessing as mp
import os

import pytest

from fideval.errors import FidevalError
from fideval.fsio import atomic_open, safe_join, write_json
from fideval.lock import output_lock


def test_atomic_open_keeps_old_file_on_failure(tmp_path):
    target = tmp_path / "x.json"
    write_json(target, {"a": 1})
    with pytest.raises(RuntimeError):
        with atomic_open(target) as f:
            f.write(b"partial")
            raise RuntimeError("crash mid-write")
    assert target.read_text() == '{\n  "a": 1\n}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]  # no temp file left behind


def test_disk_full_gives_one_line_and_no_partial(tmp_path, monkeypatch):
    import errno

    target = tmp_path / "y.bin"

    class Full:
        def __init__(self, f):
            self.f = f

        def write(self, b):
            raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(FidevalError, match="disk full while writing"):
        with atomic_open(target) as f:
            Full(f).write(b"x")
    assert not target.exists() and list(tmp_path.iterdir()) == []


def test_unwritable_folder_is_one_line(tmp_path):
    # A regular file where a folder should be: fails the same way for root (which ignores mode bits).
    (tmp_path / "blocker").write_text("")
    with pytest.raises(FidevalError, match="cannot create folder"):
        write_json(tmp_path / "blocker" / "sub" / "z.json", {})


@pytest.mark.parametrize("rel", ["../escape", "/etc/passwd", "a/../../b"])
def test_safe_join_refuses_escapes(tmp_path, rel):
    with pytest.raises(FidevalError, match="leaves its root"):
        safe_join(tmp_path, rel)


def test_safe_join_refuses_links_out(tmp_path):
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "link").symlink_to(tmp_path)
    with pytest.raises(FidevalError, match="resolves outside"):
        safe_join(tmp_path / "root", "link/secret")
    assert safe_join(tmp_path / "root", "inside.bin") == (tmp_path / "root" / "inside.bin").resolve()


def _hold(folder: str, ready, release) -> None:
    with output_lock(folder):
        ready.set()
        release.wait(30)


def test_second_run_on_same_folder_is_refused(tmp_path):
    ctx = mp.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    p = ctx.Process(target=_hold, args=(str(tmp_path), ready, release))
    p.start()
    try:
        assert ready.wait(60)
        with pytest.raises(FidevalError, match="being written by another run"):
            with output_lock(tmp_path):
                pass
    finally:
        release.set()
        p.join(30)
    with output_lock(tmp_path):  # released when the holder exits
        pass


def test_lock_released_by_sigkill(tmp_path):
    ctx = mp.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    p = ctx.Process(target=_hold, args=(str(tmp_path), ready, release))
    p.start()
    assert ready.wait(60)
    p.kill()
    p.join(30)
    with output_lock(tmp_path):
        pass


def test_written_files_get_the_usual_mode(tmp_path):
    old = os.umask(0o022)
    try:
        import importlib

        import fideval.fsio as fsio

        importlib.reload(fsio)
        fsio.write_json(tmp_path / "m.json", {})
        assert (tmp_path / "m.json").stat().st_mode & 0o777 == 0o644
    finally:
        os.umask(old)
