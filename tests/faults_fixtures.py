"""Helpers for the fault-injection suite (tests/test_faults_*.py): check an error line, hash a folder before and
after, build small stores / llama.cpp files / GGUF files / checkpoints, plant pickles that would leave a
marker if anything ever unpickled them, and mount small tmpfs file systems (full disk, read-only).

Nothing here downloads anything; every input is generated in a few milliseconds.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

ERROR = "fideval: error: "
# A fix is a parenthesised hint at the end of the line (FidevalError(..., hint=...)).
HINT = re.compile(r"\([^()]*(\([^()]*\)[^()]*)*\)$")


# -- the contract of an error (the CLI itself runs through tests/cli_runner.py) --------------------------------
def error_line(code: int, err: str, *needles: str, exit_code: int = 2, need_hint: bool = True) -> str:
    """Assert the user-facing contract of a bad input and return the error line:

    exit status ``exit_code``; no traceback; exactly one ``fideval: error:`` line, and it is the last
    non-empty line of stderr (warnings and progress lines may precede it); it ends with a fix in
    parentheses; it contains every needle (the file name, the key...).
    """
    assert "Traceback" not in err, err
    assert code == exit_code, f"exit {code}, stderr:\n{err}"
    lines = [ln for ln in err.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith(ERROR)]
    assert len(errors) == 1 and lines[-1] == errors[0], err
    line = errors[0]
    if need_hint:
        assert HINT.search(line), f"no fix (hint in parentheses) in: {line}"
    for n in needles:
        assert n in line, f"{n!r} not in: {line}"
    return line


# -- before/after snapshots ---------------------------------------------------------------------------------
def snapshot(root: Path) -> dict[str, str]:
    """{relative path: sha256} of every regular file under ``root`` (links are recorded by their target)."""
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "link:" + os.readlink(p)
            elif p.is_file() and p.stat().st_size > 64 << 20:  # huge (sparse) test files: size and mtime
                st = p.stat()
                out[rel] = f"size:{st.st_size}:mtime:{st.st_mtime_ns}"
            elif p.is_file():
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def assert_kept(before: dict[str, str], root: Path, *, allow_new: tuple[str, ...] = (".fideval.lock",)) -> None:
    """Every file that existed before is still there, byte for byte; no temp file or partial output appeared
    (new files are allowed only when their name is in ``allow_new``)."""
    after = snapshot(root)
    changed = [k for k, v in before.items() if after.get(k) != v]
    assert not changed, f"files changed or lost: {changed}"
    new = [k for k in after if k not in before and Path(k).name not in allow_new]
    assert not new, f"new files appeared after a failed run: {new}"


def temp_leftovers(root: Path) -> list[str]:
    """Temp files and staging folders (dot-names) under ``root``; the output lock file does not count."""
    return sorted(str(p.relative_to(root)) for p in Path(root).rglob(".*") if p.name != ".fideval.lock")


def _hidden(rel: str) -> bool:
    return any(part.startswith(".") for part in Path(rel).parts)


# -- logit stores --------------------------------------------------------------------------------------------
STORE_META = {"model_id": "test/teacher", "model_revision": "0" * 40, "tokenizer_sha256": "ab" * 32,
              "vocab_size": 32, "kind": "logits"}


def store_data(n: int = 3, length: int = 16, vocab: int = 32, seed: int = 0) -> list[tuple[str, np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [(f"code-{k:03d}", (rng.standard_normal((length, vocab)) * 3).astype(np.float32),
             rng.integers(0, vocab, length).astype(np.int32)) for k in range(n)]


def make_store(root: Path, n: int = 3, length: int = 16, vocab: int = 32, seed: int = 0) -> Path:
    from fideval.store import StoreWriter

    w = StoreWriter(root, {**STORE_META, "vocab_size": vocab})
    for sid, lg, tk in store_data(n, length, vocab, seed):
        w.write(sid, lg, tk, window_id=sid, domain="code")
    w.finish()
    return root


def edit_manifest(root: Path, fn) -> None:
    """Apply ``fn`` to the parsed manifest and write it back (plain write: this is the attacker's edit)."""
    p = root / "manifest.json"
    m = json.loads(p.read_text())
    fn(m)
    p.write_text(json.dumps(m, indent=2, sort_keys=True))


def reseal(root: Path, seq_id: str) -> None:
    """Make the manifest and index.parquet agree with a shard's current bytes (size + SHA-256), so that only
    the check the test aims at can fire (a forged store, not a damaged one)."""
    from fideval.fsio import sha256_file
    from fideval.store.manifest import write_index

    path = root / "shards" / f"{seq_id}.safetensors"

    def fix(m):
        m["shards"][seq_id]["sha256"] = sha256_file(path)
        m["shards"][seq_id]["bytes"] = path.stat().st_size
        write_index(root, m["shards"])

    edit_manifest(root, fix)


def rewrite_shard_header(path: Path, edit) -> None:
    """Parse a shard's JSON header, apply ``edit(header)``, write it back with the same data bytes."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    edit(header)
    new = json.dumps(header, separators=(",", ":")).encode()
    new += b" " * (-(8 + len(new)) % 8)
    path.write_bytes(len(new).to_bytes(8, "little") + new + raw[8 + n:])


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


# -- llama.cpp --kl-divergence-base files -----------------------------------------------------------------
def write_kld_base(path: Path, n_ctx: int = 16, n_vocab: int = 24, n_chunk: int = 3, seed: int = 0) -> Path:
    """A structurally valid v1 file (magic, header, tokens, uint16 rows with float32 scale/min in front)."""
    rng = np.random.default_rng(seed)
    first = n_ctx // 2
    rows = n_ctx - 1 - first
    nv = 2 * ((n_vocab + 1) // 2) + 4
    with open(path, "wb") as f:
        f.write(b"_logits_")
        f.write(np.array([n_ctx, n_vocab, n_chunk], "<i4").tobytes())
        f.write(rng.integers(0, n_vocab, (n_chunk, n_ctx)).astype("<i4").tobytes())
        for _ in range(n_chunk * rows):
            row = np.zeros(nv, "<u2")
            row[:4] = np.array([16 / 65535, -20.0], "<f4").view("<u2")
            row[4:4 + n_vocab] = rng.integers(0, 65536, n_vocab)
            f.write(row.tobytes())
    return path


# -- GGUF files -------------------------------------------------------------------------------------------------
def write_gguf(path: Path) -> Path:
    """A tiny valid GGUF (two tensors) written by gguf-py itself."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    rng = np.random.default_rng(0)
    w.add_tensor("blk.0.attn_q.weight", rng.standard_normal((64, 64)).astype(np.float32))
    w.add_tensor("output.weight", rng.standard_normal((64, 64)).astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# -- checkpoints -----------------------------------------------------------------------------------------------
def write_checkpoint(folder: Path, header_override: dict | bytes | None = None) -> Path:
    """A Hugging Face-shaped folder: config.json + model.safetensors with one attention and one MLP weight."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    rng = np.random.default_rng(0)
    save_file({"model.layers.0.self_attn.q_proj.weight": rng.standard_normal((64, 64)).astype(np.float32),
               "model.layers.0.mlp.up_proj.weight": rng.standard_normal((96, 64)).astype(np.float32)},
              str(folder / "model.safetensors"))
    return folder


def safetensors_with_header(path: Path, header, data: bytes = b"") -> Path:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + data)
    return path


# -- planted pickles --------------------------------------------------------------------------------------------
class Detonator:
    """Unpickling this object calls ``os.mkdir(marker)``: a marker folder appears iff the file was unpickled."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def pickle_bytes(marker: Path) -> bytes:
    return pickle.dumps({"weight": Detonator(marker)}, protocol=4)


def plant_pickle(path: Path, marker: Path, *, torch_format: bool = False) -> Path:
    """Write a pickle whose loading would create ``marker`` -- as plain pickle bytes or as torch.save's zip."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if torch_format:
        import torch

        torch.save({"weight": Detonator(marker)}, str(path))
    else:
        path.write_bytes(pickle_bytes(marker))
    return path


# -- mounts -----------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def tmpfs(path: Path, size: str, *, read_only: bool = False) -> Iterator[Path]:
    """Mount a tmpfs of ``size`` at ``path`` (needs root / CAP_SYS_ADMIN); skip the test when that fails."""
    path.mkdir(parents=True, exist_ok=True)
    opts = f"size={size}" + (",ro" if read_only else "")
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, f"fideval-test-{uuid.uuid4().hex[:8]}", str(path)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()[:80]})")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def remount(path: Path, opts: str) -> None:
    r = subprocess.run(["mount", "-o", f"remount,{opts}", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


# -- SIGKILL at a chosen point of a real CLI run ------------------------------------------------------------
# The driver runs ``fideval ARGS`` in a child process with fideval's atomic writers wrapped so that every
# byte written and every completed rename is one numbered "event"; at event KILL_AT the process SIGKILLs
# itself (after flushing the bytes before it), i.e. dies mid-file or right between two files, exactly where
# asked. KILL_AT -1 runs to the end and prints the number of events (the range to draw kill points from).
KILL_DRIVER = r'''
import atexit, contextlib, os, signal, sys

kill_at = int(sys.argv[1])
events = [0]

def die():
    os.kill(os.getpid(), signal.SIGKILL)

class Counting:
    def __init__(self, f):
        self._f = f
    def write(self, b):
        mv = memoryview(b).cast("B")
        n = len(mv)
        if 0 <= kill_at < events[0] + n:
            self._f.write(mv[: kill_at - events[0]])
            self._f.flush()
            die()
        events[0] += n
        return self._f.write(b)
    def __getattr__(self, k):
        return getattr(self._f, k)

def renamed():
    if kill_at == events[0]:
        die()
    events[0] += 1

import fideval.fsio as fsio
_open, _path = fsio.atomic_open, fsio.atomic_path

@contextlib.contextmanager
def atomic_open(path, mode="wb"):
    with _open(path, mode) as f:
        yield Counting(f)
    renamed()

@contextlib.contextmanager
def atomic_path(path):
    with _path(path) as tmp:
        yield tmp
        renamed()  # killed after the library wrote the temp file, before the rename
    renamed()

fsio.atomic_open, fsio.atomic_path = atomic_open, atomic_path
import importlib
for name in ("fideval.store.shard", "fideval.windows.records", "fideval.store.manifest", "fideval.windows.layout"):
    mod = importlib.import_module(name)
    for attr, fn in (("atomic_open", atomic_open), ("atomic_path", atomic_path)):
        if hasattr(mod, attr):
            setattr(mod, attr, fn)
atexit.register(lambda: print(f"FIDEVAL-EVENTS {events[0]}", file=sys.stderr))
sys.argv = ["fideval", *sys.argv[2:]]
from fideval.cli import main
main()
'''


def run_killed(tmp: Path, args: list, kill_at: int, timeout: float = 300) -> tuple[subprocess.CompletedProcess, int]:
    """Run ``fideval ARGS`` under the kill driver; returns (process, events counted when it ran to the end)."""
    driver = tmp / "kill_driver.py"
    if not driver.exists():
        driver.write_text(KILL_DRIVER)
    p = subprocess.run([sys.executable, str(driver), str(kill_at), *map(str, args)], capture_output=True, text=True,
                       timeout=timeout)
    m = re.search(r"FIDEVAL-EVENTS (\d+)", p.stderr)
    return p, int(m.group(1)) if m else -1


def assert_no_partial_files(folder: Path, reference: Path, *, volatile: tuple[str, ...] = (".entry.json",)) -> None:
    """After a kill: every visible file under ``folder`` is byte-identical to the same file of an uninterrupted
    run (files whose name ends with one of ``volatile`` -- sidecars holding an mtime -- only need to parse)."""
    ref = snapshot(reference)
    for rel, sha in snapshot(folder).items():
        name = Path(rel).name
        if _hidden(rel):
            continue  # temp files, staging folders and the lock: dot-names are never results
        if name.endswith(volatile):
            json.loads((folder / rel).read_text())
            continue
        assert rel in ref, f"{rel} is not an output of a complete run"
        assert sha == ref[rel], f"{rel} differs from the uninterrupted run (partial or wrong)"


def results_only(snap: dict[str, str]) -> dict[str, str]:
    """A snapshot without dot-files (the lock file; temp files are checked separately)."""
    return {k: v for k, v in snap.items() if not _hidden(k)}
