"""Resumable scoring: every teacher shard's records are kept as soon as they are scored, and a rerun with the
same inputs scores only the shards that are missing.

A killed or interrupted ``fideval score`` of a model-run candidate used to keep nothing, so a long run started
over. Now each shard's rows go to ``<out>/records.partial/<seq_id>.parquet`` (written under a temp name, then
renamed) with a sidecar ``<seq_id>.json`` written after it, holding:

  key    SHA-256 of what the rows depend on: the teacher shard's SHA-256 (from its manifest), the candidate
         shard's (a store's) or the candidate's identity (a model run: model, revision, quant spec or
         checkpoint hashes, run settings), the candidate's name and path, the kernel, the device type, the
         CPU-check and non-finite settings, the run-wide index of the shard's first row (which rows the CPU
         check samples), the records format and fideval's version and commit;
  rows   the parquet's SHA-256 and the shard's contribution to score.json (rows, rows checked, worst CPU
         difference, non-finite rows, self-check figures).

A rerun reuses a shard only when its sidecar's key equals the key it would compute and the parquet's SHA-256
matches; anything else is scored again and overwritten. The finished records.parquet is assembled from the
per-shard files in the teacher's order (one row group per shard, as before), so an interrupted-then-resumed
run writes the same bytes as an uninterrupted one; the folder is removed once records.parquet and score.json
are in place. A run that fails with an error (a CPU-check failure, non-finite logits) removes it: its inputs
must change before a rerun, and with them every key.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fideval.formats import nesting
from fideval.fsio import atomic_path, sha256_file, write_json
from fideval.provenance import canonical_hash

if TYPE_CHECKING:
    from fideval.store.rows import TeacherRows


PARTIAL = "records.partial"
SIDECAR_VERSION = 1


class ShardCache:
    """``records.partial/`` of one output folder: per-shard records and what they were computed from."""

    def __init__(self, out_dir: str | Path, base: dict[str, Any]):
        self.dir = Path(out_dir) / PARTIAL
        self.base = canonical_hash(base)

    def key(self, seq_id: str, teacher_sha256: str | None, candidate_sha256: str | None, first_row: int) -> str:
        return canonical_hash({"base": self.base, "seq_id": seq_id, "teacher": teacher_sha256,
                               "candidate": candidate_sha256, "first_row": int(first_row), "v": SIDECAR_VERSION})

    def _files(self, seq_id: str) -> tuple[Path, Path]:
        return self.dir / f"{seq_id}.parquet", self.dir / f"{seq_id}.json"

    def load(self, seq_id: str, key: str) -> dict[str, Any] | None:
        """The shard's sidecar when it was scored from these very inputs and its records are intact, else None."""
        data, side = self._files(seq_id)
        try:
            meta = nesting.loads(side.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(meta, dict) or meta.get("key") != key:
            return None
        if meta.get("records_sha256") is not None:
            try:
                if sha256_file(data) != meta["records_sha256"]:
                    return None
            except OSError:
                return None
        return meta

    def save(self, seq_id: str, key: str, table: Any, stats: dict[str, Any]) -> None:
        """The shard's records (None: nothing scorable) then its sidecar, each atomically."""
        import pyarrow.parquet as pq

        data, side = self._files(seq_id)
        sha = None
        if table is not None:
            with atomic_path(data) as tmp:
                pq.write_table(table, str(tmp), compression="zstd", row_group_size=max(table.num_rows, 1))
            sha = sha256_file(data)
        write_json(side, {"key": key, "records_sha256": sha, **stats})

    def table(self, seq_id: str) -> Any:
        import pyarrow.parquet as pq

        return pq.read_table(self._files(seq_id)[0])

    def assemble(self, out_dir: str | Path, seq_ids: list[str], with_rows: set[str]) -> int:
        """records.parquet from the kept shards, in ``seq_ids`` order, one row group per shard (written
        atomically by the records writer); returns its rows."""
        from fideval.formats.records import arrow_schema
        from fideval.score.records import RecordsWriter

        schema = arrow_schema()
        with RecordsWriter(out_dir) as w:
            for sid in seq_ids:
                if sid in with_rows:
                    w.add_table(self.table(sid).cast(schema))
        return w.rows

    def clear(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


STAT_KEYS = ("rows", "checked", "nonfinite", "top1")


def first_rows(teacher: TeacherRows, seq_ids: list[str], extent: Any) -> dict[str, int]:
    """The run-wide index of each shard's first scored row, from the manifests alone: the CPU check samples
    rows by that index, so a resumed shard must start where it started in an uninterrupted run. A shard
    scores rows [max(teacher start, candidate start), min(teacher end, candidate end, length - 1))."""
    out, seen = {}, 0
    for sid in seq_ids:
        e = teacher.entry(sid)
        length, t0 = int(e["tokens"]), int(e["row_start"])
        c0, cn = extent(sid) if extent is not None else (0, length)
        out[sid] = seen
        seen += max(min(t0 + int(e["rows"]), c0 + cn, length - 1) - max(t0, c0), 0)
    return out


def fold(stats: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's score.json figures from its shards' stats, in shard order: counts summed, the largest |KLD|,
    the worst CPU difference (the first shard holding it, as a run scoring them in order reports it)."""
    out: dict[str, Any] = {k: sum(int(s[k]) for s in stats) for k in STAT_KEYS}
    out["max_kld"] = max((float(s["max_kld"]) for s in stats), default=0.0)
    out["worst"], out["worst_at"] = 0.0, ""
    for s in stats:
        if float(s["worst"]) > out["worst"]:
            out["worst"], out["worst_at"] = float(s["worst"]), s["worst_at"]
    out["lengths"] = {int(s["length"]) for s in stats if s.get("length") is not None}
    return out
