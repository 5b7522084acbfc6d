"""``records.parquet`` (format ``fideval.records`` v1): the per-token records' columns and their Arrow types.

The one declaration the scorer writes by (``fideval.score.records``) and the report reads by
(``fideval.report.inputs``); the column table in ``docs/formats-records.md`` is generated from it. pyarrow is
imported only by :func:`arrow_schema`, so the declaration itself costs nothing to import.
"""

from __future__ import annotations

from typing import Any

FORMAT = "fideval.records"
VERSION = "1"
FILE = "records.parquet"

# (name, type, meaning), in file order. No column is nullable.
SPEC = (
    ("candidate", "string", "candidate name (CLI `--name`, default the candidate store's folder name; `self` for a "
     "self-check)"),
    ("path", "string", "`serving`, `weights-only`, `llamacpp` (model run on the fly: docs/quant.md) or `store` (candidate "
     "logits read from a store)"),
    ("length", "int32", "the sequence's length `L` (e.g. 2048 for a cut, 8192 for a window)"),
    ("seq_id", "string", "the sequence (window or cut id), from the teacher store's manifest"),
    ("window_id", "string", "the window the sequence belongs to, from the teacher store's manifest"),
    ("domain", "string", "the window's domain, from the teacher store's manifest"),
    ("position", "int32", "`r`, the row (the realized token is at `r + 1`)"),
    ("token", "int32", "the realized next token `token_ids[r + 1]`"),
    ("kld", "float64", "KL(P_ref ‖ P_cand) in nats"),
    ("rkld", "float64", "KL(P_cand ‖ P_ref) in nats"),
    ("top1", "bool", "candidate argmax == reference argmax"),
    ("top5", "bool", "the reference top-1 token is among the candidate's top-5"),
    ("top10", "bool", "the reference top-1 token is among the candidate's top-10"),
    ("nll_ref", "float64", "−log p(token) under the reference (nats)"),
    ("nll_cand", "float64", "−log q(token) under the candidate (nats)"),
    ("dp", "float64", "q(token) − p(token): candidate minus reference probability of the realized token"),
    ("entropy_ref", "float64", "entropy of P_ref (nats)"),
    ("p1_ref", "float64", "reference top-1 probability max_v p_v"),
    ("ref_correct", "bool", "reference argmax == realized token"),
)
COLUMNS = tuple((name, kind) for name, kind, _ in SPEC)
NAMES = tuple(name for name, _ in COLUMNS)


def of_kind(kind: str) -> tuple[str, ...]:
    """The columns of one type (``string``, ``int32``, ``float64``, ``bool``), in file order."""
    return tuple(name for name, k in COLUMNS if k == kind)


def arrow_schema() -> Any:
    """The Parquet file's Arrow schema, non-nullable, with ``format`` and ``version`` in its metadata."""
    import pyarrow as pa

    types = {"string": pa.string(), "int32": pa.int32(), "float64": pa.float64(), "bool": pa.bool_()}
    return pa.schema([pa.field(name, types[kind], nullable=False) for name, kind in COLUMNS],
                     metadata={"format": FORMAT, "version": VERSION})


def columns_table() -> str:
    """The markdown table of the columns for ``docs/formats-records.md``."""
    rows = ["| column | type | meaning |", "| --- | --- | --- |"]
    rows += [f"| `{name}` | {kind} | {doc} |" for name, kind, doc in SPEC]
    return "\n".join(rows)
