"""Streaming a logit store from local disk: GB/s against the disk's own sequential read speed, and peak RSS.

The scorer is fed by ``StoreReader.iter``; when it is slower than the disk, the GPU waits. This bench
writes a synthetic store of ``--gb`` GB (shards of ``--shard-mb`` MB) into ``--dir``, then measures, each
time after dropping the store's pages from the page cache (``posix_fadvise(DONTNEED)``; whether that worked
is checked from ``/proc/meminfo`` and printed):

* the ceiling: plain sequential reads of the same shard files in 16 MiB chunks (a dd-like loop);
* ``iter()`` on first touch (every shard's SHA-256 checked), and again with hashes already verified;
* ``read()`` (memory map) with every page touched;
* ``fideval score``'s own loop (``score_candidate`` with a store candidate, as the CLI calls it) on the
  teacher store and a candidate store of the same size written beside it (``--no-score``: skip), both cold:
  GB/s of both stores' bytes against the same disk ceiling, rows/s, and its peak RSS.

Peak RSS above the pre-phase baseline is sampled every 2 ms and reported in shards: it must stay at or
below 3 shards whatever the store's size. The store is deleted at the end.

    python bench/score_stream.py                                            # 2 GB here, < 1 min
    PYTHONPATH=. python3 bench/score_stream.py --gb 8 --device cuda         # GPU machine
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fideval.score.candidate import from_store
from fideval.score.run import ScoreSettings, score_candidate
from fideval.store import StoreReader, StoreWriter


def _meminfo(key: str) -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class PeakRSS:
    """Max VmRSS above the baseline at entry, sampled every 2 ms on a thread."""

    def __enter__(self):
        self.base = self.peak = _rss()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, _rss())
        self.extra = self.peak - self.base


def drop_cache(files: list[Path]) -> bool:
    """Ask the kernel to forget the files' pages; True when /proc/meminfo's Cached fell by >= half their size."""
    before = _meminfo("Cached")
    total = 0
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            total += os.fstat(fd).st_size
        finally:
            os.close(fd)
    return before - _meminfo("Cached") >= total // 2


def seq_read(files: list[Path]) -> float:
    buf = bytearray(1 << 24)
    mv = memoryview(buf)
    n = 0
    t0 = time.perf_counter()
    for p in files:
        with open(p, "rb", buffering=0) as f:
            while k := f.readinto(mv):
                n += k
    return n / (time.perf_counter() - t0) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=2.0, help="store size in GB")
    ap.add_argument("--shard-mb", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=16384)
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--prefetch", type=int, default=None, help="default: 1 on CPU (<= 3 shards alive), 2 on CUDA")
    ap.add_argument("--no-score", action="store_true", help="skip the end-to-end `fideval score` row (it writes a "
                    "candidate store of the same size beside the teacher's)")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    cuda = args.device.startswith("cuda")
    prefetch = args.prefetch if args.prefetch is not None else (2 if cuda else 1)
    rows = args.shard_mb * (1 << 20) // (4 * args.vocab)
    n_shards = max(2, round(args.gb * 1e9 / (rows * args.vocab * 4)))
    root = Path(tempfile.mkdtemp(prefix="fideval-bench-store-", dir=args.dir))
    results: list[tuple[str, float, str]] = []
    try:
        base = np.random.default_rng(0).standard_normal((rows, args.vocab), dtype=np.float32)
        tokens = np.arange(rows, dtype=np.int32) % args.vocab
        w = StoreWriter(root, {"model_id": "bench", "model_revision": "0", "tokenizer_sha256": "0" * 64,
                                "vocab_size": args.vocab, "kind": "logits"})
        t0 = time.perf_counter()
        for i in range(n_shards):
            base[0, 0] = i  # distinct bytes per shard
            w.write(f"bench-{i:04d}", base, tokens, window_id=f"bench-{i:04d}", domain="bench")
        w.finish()
        del base
        write_s = time.perf_counter() - t0
        files = sorted((root / "shards").glob("*.safetensors"))
        total = sum(p.stat().st_size for p in files)
        shard = total / n_shards
        results.append(("write (hash + fsync + rename)", total / write_s / 1e9, ""))

        blob = os.urandom(1 << 28)
        t = time.perf_counter()
        hashlib.sha256(blob).digest()
        results.append(("SHA-256 of 256 MiB in memory, one core (first-read ceiling)", len(blob) / (time.perf_counter() - t) / 1e9, ""))
        del blob
        dropped = drop_cache(files)
        disk = seq_read(files)
        hot = seq_read(files)
        results.append(("disk sequential read, 16 MiB chunks (ceiling)", disk, ""))
        results.append(("same files from page cache", hot, ""))

        def stream(label: str, reader: StoreReader) -> None:
            drop_cache(files)
            with PeakRSS() as m:
                t = time.perf_counter()
                acc = 0.0
                for _, x, _ in reader.iter(device=args.device, prefetch=prefetch):
                    acc += float(x[-1, -1])  # touch the data (and wait for the copy on CUDA)
                if cuda:
                    torch.cuda.synchronize()
                dt = time.perf_counter() - t
            results.append((label, total / dt / 1e9, f"{m.peak / 1e9:.2f} GB ({m.extra / shard:.2f} shards above base)"))

        if cuda:  # create the CUDA context first, so its few hundred MB of RSS are not charged to streaming
            torch.zeros(1, device=args.device)
            torch.cuda.synchronize()
        r = StoreReader(root)
        try:
            stream(f"iter(device={args.device}, prefetch={prefetch}), SHA-256 on first read", r)
            stream(f"iter(device={args.device}, prefetch={prefetch}), already verified", r)
        except Exception as e:  # noqa: BLE001 -- keep the other rows if the device path fails
            results.append((f"iter(device={args.device}) FAILED: {type(e).__name__}: {e}"[:200], float("nan"), ""))

        drop_cache(files)
        r2 = StoreReader(root)
        with PeakRSS() as m:
            t = time.perf_counter()
            for sid in r2.seq_ids:
                lg, _ = r2.read(sid)
                float(lg.sum(dtype=np.float32))  # touch every page
                del lg
            dt = time.perf_counter() - t
        results.append(("read() memmap + SHA-256 on first read, all pages touched", total / dt / 1e9,
                        f"{m.peak / 1e9:.2f} GB ({m.extra / shard:.2f} shards above base)"))

        if not args.no_score:  # `fideval score`'s own loop on a teacher store and a candidate store, both cold
            cand_root = root / "candidate"
            wc = StoreWriter(cand_root, {"model_id": "bench-candidate", "model_revision": "0", "tokenizer_sha256": "0" * 64,
                                         "vocab_size": args.vocab, "kind": "logits"})
            noise = np.random.default_rng(1).standard_normal((rows, args.vocab), dtype=np.float32) * 0.05
            for sid in r2.seq_ids:
                lg, tk = r2.read(sid)
                wc.write(sid, lg + noise, tk, window_id=sid, domain="bench")
            wc.finish()
            del noise
            cfiles = sorted((cand_root / "shards").glob("*.safetensors"))
            both = total + sum(p.stat().st_size for p in cfiles)
            drop_cache(files + cfiles)
            teacher, cand = StoreReader(root), StoreReader(cand_root)
            out = root / "score-out"
            with PeakRSS() as m:
                t = time.perf_counter()
                summary = score_candidate(teacher, from_store(cand, teacher, "bench", device=args.device if cuda else None),
                                          out, ScoreSettings(device=args.device))  # as `fideval score --candidate STORE`
                dt = time.perf_counter() - t
            results.append((f"fideval score loop, teacher + candidate stores ({summary['kernel']} kernel, "
                            f"{summary['rows'] / dt:,.0f} rows/s, CPU check {summary['cpu_check']['rows_checked']} rows)",
                            both / dt / 1e9, f"{m.peak / 1e9:.2f} GB ({m.extra / shard:.2f} shards above base)"))
    finally:
        shutil.rmtree(root, ignore_errors=True)

    dev = torch.cuda.get_device_name(0) if cuda else "cpu"
    where = os.path.realpath(args.dir)
    with open("/proc/mounts") as f:
        mounts = [ln.split()[1:3] for ln in f]
    fs = max((m for m in mounts if where == m[0] or where.startswith(m[0].rstrip("/") + "/")), key=lambda m: len(m[0]))[1]
    dev += f", {os.cpu_count()} cores, {args.dir} on {fs}"
    print(f"store: {n_shards} shards x {shard / 1e6:.0f} MB = {total / 1e9:.2f} GB in {args.dir} ({dev}); "
          f"page cache dropped before each cold read: {'yes' if dropped else 'NO (fadvise ignored; cold figures are cached)'}")
    print("| measurement | GB/s | vs disk ceiling | peak RSS |")
    print("|---|---|---|---|")
    for label, gbs, rss in results:
        print(f"| {label} | {gbs:.2f} | {gbs / disk:.0%} | {rss} |")
    worst = max((float(x.split("(")[1].split()[0]) for _, _, x in results if "shards" in x), default=0.0)
    print(f"peak RSS above base: {worst:.2f} shards (limit 3): {'ok' if worst <= 3 else 'OVER'}")


if __name__ == "__main__":
    main()
