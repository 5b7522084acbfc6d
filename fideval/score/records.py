"""``records.parquet`` (format ``fideval.records`` v1): one row per scored next-token row, one row group
per shard, written through a temp file renamed into place only when the whole run succeeded.

The stats stage reads nothing else, so every column a report needs is here, named in
:data:`fideval.formats.records.COLUMNS` and documented in ``docs/formats-records.md``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fideval.formats.records import COLUMNS, FILE, arrow_schema
from fideval.fsio import atomic_path
from fideval.score.metrics import FIGURES, FLAGS


def shard_table(*, candidate: str, path: str, length: int, seq_id: str, window_id: str, domain: str, positions: Any,
                tokens: Any, figs: Any, flags: Any) -> Any:
    """One shard's records as an Arrow table in the records contract's column order."""
    import pyarrow as pa

    n = len(positions)
    cols: dict[str, Any] = {
        "candidate": pa.array([candidate] * n, pa.string()), "path": pa.array([path] * n, pa.string()),
        "length": pa.array(np.full(n, length, np.int32)), "seq_id": pa.array([seq_id] * n, pa.string()),
        "window_id": pa.array([window_id] * n, pa.string()), "domain": pa.array([domain] * n, pa.string()),
        "position": pa.array(np.asarray(positions, np.int32)), "token": pa.array(np.asarray(tokens, np.int32)),
    }
    for j, name in enumerate(FIGURES):
        cols[name] = pa.array(np.ascontiguousarray(figs[:, j], np.float64))
    for j, name in enumerate(FLAGS):
        cols[name] = pa.array(np.ascontiguousarray(flags[:, j], bool))
    return pa.table([cols[name] for name, _ in COLUMNS], schema=arrow_schema())


class RecordsWriter:
    """``with RecordsWriter(out_dir) as w: w.add_shard(...)``; the file appears only on a clean exit."""

    def __init__(self, out_dir: str | Path):
        self.path = Path(out_dir) / FILE
        self.rows = 0
        self._ctx = None
        self._writer = None

    def __enter__(self) -> "RecordsWriter":
        import pyarrow.parquet as pq

        self._ctx = atomic_path(self.path)
        tmp = self._ctx.__enter__()
        self._schema = arrow_schema()
        self._writer = pq.ParquetWriter(str(tmp), self._schema, compression="zstd")
        return self

    def add_shard(self, **shard: Any) -> None:
        """One shard's rows (:func:`shard_table`'s fields) as one row group (bounded memory whatever the run's size)."""
        if len(shard["positions"]) == 0:
            return
        self.add_table(shard_table(**shard))

    def add_table(self, table: Any) -> None:
        """A shard's table (:func:`shard_table`) as one row group."""
        self._writer.write_table(table, row_group_size=table.num_rows)
        self.rows += table.num_rows

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._writer.close()
        return bool(self._ctx.__exit__(exc_type, exc, tb))
