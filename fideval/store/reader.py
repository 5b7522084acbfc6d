"""``StoreReader``: hand teacher logits to the scorer without copies it does not need, and never unchecked.

Two ways to read a shard:

* ``read(seq_id)`` memory-maps the logits (``np.memmap`` at the offsets the bounded header parser checked),
  so a 4 GB shard costs no host memory until rows are touched, and the page cache is shared between
  processes;
* ``iter(seq_ids, device, prefetch)`` streams shards through a background thread that reads each file
  once, in 16 MiB chunks, into a (pinned, for CUDA) host buffer and hashes the chunks as they arrive, so the
  SHA-256 check costs no second pass over the disk. With a CUDA device the buffers are a fixed pool of
  ``prefetch`` page-locked buffers of the shard's exact size (:mod:`fideval.store.pinned`; torch's own
  pinned allocator would round each up to a power of two) reused round-robin, each shard copied to the GPU
  on a side stream and its buffer reused once the copy is done; host memory then stays at ``prefetch``
  shards whatever the store's size, and the buffers are unlocked when the iteration ends. On CPU every
  shard gets a fresh tensor (the caller may keep it), at most ``prefetch + 2`` alive while the caller drops
  the old ones.

Every shard's SHA-256 is checked against the manifest the first time this reader touches it; a mismatch,
a truncation or an impossible header is one :class:`FidevalError` line naming the shard.
"""

from __future__ import annotations

import hashlib
import os
import queue
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from fideval.errors import FidevalError
from fideval.fsio import safe_join, sha256_file
from fideval.store import manifest as mf
from fideval.store.pinned import HostBuffers
from fideval.store.shard import ShardHeader, data_rows, parse_header, read_header

_CHUNK = 1 << 24
_END = object()
_IDENTITY = ("model_id", "model_revision", "tokenizer_sha256", "vocab_size", "kind")
_HINT = "run 'fideval verify' on the store; re-run the teacher or re-download the store"


def link_root(root: Path) -> Path:
    """The folder shard paths must stay inside: ``root`` itself, or for a store inside a Hugging Face cache
    snapshot, the cached repo folder (snapshot files are symlinks into its ``blobs/``)."""
    root = Path(os.path.abspath(root))
    for p in [root, *root.parents]:
        if p.parent.name == "snapshots" and p.parent.parent.name.startswith(("datasets--", "models--")):
            return p.parent.parent
    return root


def _hash_spans(h: Any, mv: memoryview, spans: queue.SimpleQueue) -> None:
    while (span := spans.get()) is not None:
        h.update(mv[span[0]:span[1]])


class StoreReader:
    """A finished store on disk (a folder, or ``hf://datasets/ORG/NAME@REV/sub``): the
    :class:`~fideval.store.rows.TeacherRows` every scorer reads, with its manifest checked on open and each shard's
    SHA-256 on first touch."""

    def __init__(self, root: str | Path):
        if isinstance(root, str) and root.startswith("hf://"):
            from fideval.store.hub import resolve_store

            root = resolve_store(root)
        self.root = Path(root)
        self.manifest = mf.load_manifest(self.root)
        self.meta: dict[str, str] = self.manifest["meta"]
        self.entries: dict[str, dict[str, Any]] = self.manifest["shards"]
        self.seq_ids: list[str] = sorted(self.entries)
        self.vocab_size = int(self.meta["vocab_size"])
        self.kind = self.meta["kind"]
        self._link = link_root(self.root)
        self._prefix = Path(os.path.abspath(self.root)).relative_to(self._link)
        self._verified: set[str] = set()
        self._lock = threading.Lock()
        self._replay: Any = None  # a hidden store's replay (fideval.store.replay.HiddenStore), made on first read

    # -- paths and checks ---------------------------------------------------------------------------------
    def entry(self, seq_id: str) -> dict[str, Any]:
        try:
            return self.entries[seq_id]
        except KeyError:
            raise FidevalError(f"{self.root}: no shard for sequence {seq_id!r}",
                               hint="the store was made for other windows; check the windows/cuts folder") from None

    def path(self, seq_id: str) -> Path:
        return safe_join(self._link, str(self._prefix / self.entry(seq_id)["file"]))

    def row_start(self, seq_id: str) -> int:
        """Row i of ``read(seq_id)[0]`` predicts token ``row_start + i + 1`` (0 for a fideval teacher)."""
        return int(self.entry(seq_id)["row_start"])

    def _check_head(self, seq_id: str, head: ShardHeader) -> None:
        e = self.entry(seq_id)
        name = e["file"]
        if head.meta["seq_id"] != seq_id:
            raise FidevalError(f"shard {name}: holds sequence {head.meta['seq_id']!r}, manifest says {seq_id!r}", hint=_HINT)
        for k in _IDENTITY:
            if head.meta.get(k) != self.meta[k]:
                raise FidevalError(f"shard {name}: {k} {head.meta.get(k)!r} differs from the store's {self.meta[k]!r}", hint=_HINT)
        if (head.rows, head.length, head.row_start) != (e["rows"], e["tokens"], e["row_start"]):
            raise FidevalError(f"shard {name}: {head.rows} rows/{head.length} tokens/row_start {head.row_start}, "
                               f"manifest says {e['rows']}/{e['tokens']}/{e['row_start']}", hint=_HINT)

    def check_files(self, seq_ids: Iterable[str] | None = None) -> None:
        """Every shard's presence, size and header against the manifest, before any work is done: a truncated or
        foreign shard is one line in seconds instead of a failure half way through a run. Contents are hashed
        when each shard is read (:meth:`read`, :meth:`iter`)."""
        for sid in self.seq_ids if seq_ids is None else seq_ids:
            e, path = self.entry(sid), self.path(sid)
            try:
                size = path.stat().st_size
            except OSError:
                raise FidevalError(f"{self.root}: shard {e['file']}: missing", hint=_HINT) from None
            if size != e["bytes"]:
                raise FidevalError(f"{self.root}: shard {e['file']}: {size} bytes, manifest says {e['bytes']} (truncated?)",
                                   hint=_HINT)
            self._check_head(sid, read_header(path, e["file"]))

    def _check_hash(self, seq_id: str, path: Path) -> None:
        if seq_id in self._verified:
            return
        e = self.entry(seq_id)
        try:
            size = path.stat().st_size
        except OSError:
            raise FidevalError(f"shard {e['file']}: missing", hint=_HINT) from None
        if size != e["bytes"]:
            raise FidevalError(f"shard {e['file']}: {size} bytes, manifest says {e['bytes']} (truncated?)", hint=_HINT)
        if sha256_file(path) != e["sha256"]:
            raise FidevalError(f"shard {e['file']}: SHA-256 differs from the manifest (corrupt or altered)", hint=_HINT)
        with self._lock:
            self._verified.add(seq_id)

    # -- memory-mapped access -----------------------------------------------------------------------------
    def read(self, seq_id: str) -> tuple[np.ndarray, np.ndarray]:
        """(logits float32 [rows, V] memory-mapped read-only, token_ids int32 [L]); hash checked on first read. A hidden
        store's logits are replayed on the CPU through the store's own head (fideval.store.replay; a scorer on a GPU
        replays there instead, through :func:`fideval.store.reader.open_rows`)."""
        if self.kind == "hidden":
            if self._replay is None:
                from fideval.store.replay import HiddenStore

                self._replay = HiddenStore(self)
            return self._replay.read(seq_id)
        path = self.path(seq_id)
        self._check_hash(seq_id, path)
        head = read_header(path, self.entry(seq_id)["file"])
        self._check_head(seq_id, head)
        if head.rows:
            logits = np.memmap(path, dtype="<f4", mode="r", offset=head.logits_offset, shape=(head.rows, head.vocab))
        else:
            logits = np.empty((0, head.vocab), np.float32)
        return logits, self.token_ids(seq_id)

    def read_hidden(self, seq_id: str) -> tuple[Any, np.ndarray]:
        """A hidden store's shard: (the final norm's output, a torch tensor [rows, H] in its stored dtype over a
        read-only memory map, token_ids int32 [L]); hash checked on first read."""
        if self.kind != "hidden":
            raise FidevalError(f"{self.root} is a {self.kind} store, not a hidden one", hint="read its logits with read()")
        path = self.path(seq_id)
        self._check_hash(seq_id, path)
        head = read_header(path, self.entry(seq_id)["file"])
        self._check_head(seq_id, head)
        hidden = data_rows(path, head)
        return hidden, self.token_ids(seq_id)

    def token_ids(self, seq_id: str) -> np.ndarray:
        """A shard's token ids alone (int32 [L]), reading only its header and token bytes.

        Not hashed: this is for planning work (a candidate runs on the teacher's tokens), and the shard is
        verified when its logits are read, before anything computed from it is kept.
        """
        path = self.path(seq_id)
        head = read_header(path, self.entry(seq_id)["file"])
        self._check_head(seq_id, head)
        return np.fromfile(path, dtype="<i4", count=head.length, offset=head.token_ids_offset).astype(np.int32)

    # -- streaming ----------------------------------------------------------------------------------------
    def _load(self, seq_id: str, buf: Any, buffers: HostBuffers) -> tuple[Any, Any, np.ndarray]:
        """Read one shard into ``buf`` (a new one from ``buffers`` if None or too small), hashing on the way;
        return (buf, logits view, tokens)."""
        import torch

        e = self.entry(seq_id)
        name, size = e["file"], e["bytes"]
        path = self.path(seq_id)
        need_hash = seq_id not in self._verified
        h = hashlib.sha256() if need_hash else None
        try:
            with open(path, "rb") as f:
                actual = os.fstat(f.fileno()).st_size
                if actual != size:
                    raise FidevalError(f"shard {name}: {actual} bytes, manifest says {size} (truncated?)", hint=_HINT)
                if hasattr(os, "posix_fadvise"):
                    os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
                if buf is None or buf.numel() < size:
                    if buf is not None:  # let the old buffer go before allocating the bigger one
                        buffers.drop(buf)
                    buf = None
                    buf = buffers.new(size)
                mv = memoryview(buf.numpy())[:size]
                # hash on a second thread, one chunk behind the reads: the disk and SHA-256 (~1.5-2 GB/s
                # on one core) overlap instead of adding up; both release the GIL on large buffers
                spans: queue.SimpleQueue = queue.SimpleQueue()
                hasher = threading.Thread(target=_hash_spans, args=(h, mv, spans), daemon=True) if h else None
                if hasher:
                    hasher.start()
                pos = 0
                try:
                    while pos < size:
                        n = f.readinto(mv[pos:pos + _CHUNK])
                        if not n:
                            raise FidevalError(f"shard {name}: ended after {pos} of {size} bytes (truncated?)", hint=_HINT)
                        if hasher:
                            spans.put((pos, pos + n))
                        pos += n
                finally:
                    if hasher:
                        spans.put(None)
                        hasher.join()
        except FileNotFoundError:
            raise FidevalError(f"shard {name}: missing", hint=_HINT) from None
        if h is not None:
            if h.hexdigest() != e["sha256"]:
                raise FidevalError(f"shard {name}: SHA-256 differs from the manifest (corrupt or altered)", hint=_HINT)
            with self._lock:
                self._verified.add(seq_id)
        head = parse_header(mv, size, name)
        self._check_head(seq_id, head)
        nbytes = head.rows * head.vocab * 4
        logits = buf[head.logits_offset:head.logits_offset + nbytes].view(torch.float32).view(head.rows, head.vocab)
        tokens = np.frombuffer(mv, dtype="<i4", count=head.length, offset=head.token_ids_offset).astype(np.int32)
        return buf, logits, tokens

    def iter(self, seq_ids: Iterable[str] | None = None, device: Any = None, prefetch: int = 2
             ) -> Iterator[tuple[str, Any, np.ndarray]]:
        """Yield ``(seq_id, logits torch.float32 [rows, V], token_ids np.int32 [L])`` in order.

        A background thread reads up to ``prefetch`` shards ahead. ``device="cuda"``: ``prefetch`` page-locked
        host buffers; a shard is copied to the GPU on a side stream and its buffer goes back to the reader as
        soon as the copy has finished, before the shard is yielded, so the caller's shard holds no host memory
        and the next read starts at once. ``device=None``/"cpu": fresh CPU tensors the caller may keep
        (``prefetch`` ahead + the one the caller holds).
        """
        import torch

        if self.kind == "hidden":
            raise FidevalError(f"{self.root} is a hidden store: its shards are streamed through its head, not as logits",
                               hint="open it with fideval.store.reader.open_rows (a bug in the caller)")
        ids = list(self.seq_ids if seq_ids is None else seq_ids)
        for sid in ids:
            self.entry(sid)
        dev = torch.device(device) if device is not None else torch.device("cpu")
        cuda = dev.type == "cuda"
        prefetch = max(int(prefetch), 1)
        # host buffers alive: CUDA `prefetch` (the caller's shard is on the GPU); CPU `prefetch` + the caller's
        permits = threading.Semaphore(prefetch if cuda else prefetch + 1)
        pool: list[Any] = []  # reused host buffers (CUDA only)
        buffers = HostBuffers(pin=cuda)
        out: queue.Queue = queue.Queue()
        stop = threading.Event()

        def worker() -> None:
            try:
                for sid in ids:
                    permits.acquire()
                    if stop.is_set():
                        return
                    buf = pool.pop() if pool else None
                    out.put((sid, *self._load(sid, buf, buffers)))
                out.put(_END)
            except BaseException as exc:  # noqa: BLE001 -- handed to the caller's thread, raised there
                out.put(exc)

        thread = threading.Thread(target=worker, name="fideval-store-prefetch", daemon=True)
        thread.start()
        stream = torch.cuda.Stream(device=dev) if cuda else None
        try:
            while True:
                item = out.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                sid, buf, logits, tokens = item
                if cuda:
                    with torch.cuda.stream(stream):
                        gpu = logits.to(dev, non_blocking=True)
                    stream.synchronize()  # copied: the buffer can take the next shard while the caller works
                    del logits
                    pool.append(buf)
                    permits.release()
                    # allocated on the side stream, used on the caller's: the allocator must not hand the block
                    # to the next copy before the caller's work on it is done
                    gpu.record_stream(torch.cuda.current_stream(dev))
                    yield sid, gpu, tokens
                else:
                    del buf
                    yield sid, logits, tokens
                    del logits
                    permits.release()
        finally:
            stop.set()
            for _ in range(prefetch + 2):
                permits.release()
            thread.join(timeout=60)
            if cuda:  # no copy may still read a buffer when its pages are unlocked
                stream.synchronize()
                buffers.close()


def open_rows(spec: str | Path, *, model_head: Any = None, head_origin: str | None = None) -> Any:
    """A store (folder or ``hf://datasets/...``) as the rows a scorer reads: a logit store's :class:`StoreReader`, or
    a hidden store's :class:`~fideval.store.replay.HiddenStore` (its head from its own file, else ``model_head``, a
    tensor read from the model folder ``head_origin`` names, checked against the store's digest)."""
    reader = StoreReader(spec)
    if reader.kind != "hidden":
        return reader
    from fideval.store.replay import HiddenStore

    return HiddenStore(reader, model_head, head_origin)
