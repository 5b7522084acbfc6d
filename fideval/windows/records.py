"""Write (and read back) the windows stage's outputs; formats in ``docs/formats-windows.md``.

``<out>/windows-<W>/`` and ``<out>/cuts-<C>/`` (``layout.write_sequences``), ``<out>/eval-windows.json``
(format ``fideval.eval-windows`` v1), ``<out>/index.parquet`` (one row per window x cut) and, when the windows
were tagged, ``<out>/token-classes.safetensors`` (format ``fideval.token-classes``, docs/formats-classes.md).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from fideval.errors import FidevalError
from fideval.formats import classes as class_format
from fideval.formats import nesting
from fideval.formats.ids import cut_ids
from fideval.formats.model import dump, parse
from fideval.formats.windows import FILE as WINDOWS_FILE
from fideval.formats.windows import EvalWindows
from fideval.fsio import atomic_path, write_bytes, write_json
from fideval.provenance import tool_block
from fideval.windows.build import Built
from fideval.windows.layout import FILE, Sequences, length_dir, token_sha256, write_sequences
from fideval.windows.packing import Window
from fideval.windows.screen.stage import overlap_record

FORMAT = EvalWindows.FORMAT
VERSION = EvalWindows.VERSION
EVAL_WINDOWS = WINDOWS_FILE
INDEX = "index.parquet"
STAGING = ".staging-"  # a dot-name: never mistaken for a result


def _window_fields(win: Window) -> dict[str, Any]:
    return {"documents": [p.record() for p in win.pieces], "sha256": token_sha256(win.tokens)}


def window_record(b: Built, cut: int, top: dict[str, list[dict]]) -> dict[str, Any]:
    n = b.window.tokens.size // cut
    cuts = [{"id": cid, "start": j * cut, "end": (j + 1) * cut, "sha256": token_sha256(b.window.tokens[j * cut:(j + 1) * cut])}
            for j, cid in enumerate(cut_ids(b.id, n))]
    replacements = [{**_window_fields(w), "reason": "overlap", "overlap": overlap_record(ov, top.get(f"{b.id}~{i}"))}
                    for i, (w, ov) in enumerate(b.rejected)]
    return {"id": b.id, "domain": b.domain, "tokens": int(b.window.tokens.size), **_window_fields(b.window),
            "overlap": overlap_record(b.overlap, top.get(b.id)), "replacements": replacements, "cuts": cuts}


def write_outputs(out: Path, built: list[Built], meta: dict[str, Any], cfg_windows: dict[str, Any]) -> dict[str, Any]:
    """Write sequences, index.parquet and eval-windows.json (last, so its presence means complete).

    Everything is first written (atomically, file by file) into a staging folder inside ``out``, then
    renamed into place, eval-windows.json last. So a full disk or a kill while writing leaves a previous
    run's output exactly as it was; only a kill during the renames themselves (no data is written then)
    can mix old and new files, and it removes eval-windows.json first, so that state reads as incomplete.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    w, c = cfg_windows["window_tokens"], cfg_windows["cut_tokens"]
    ids, domains = [b.id for b in built], [b.domain for b in built]
    tokens = np.stack([b.window.tokens for b in built]).astype(np.int32)
    per = w // c
    windows = [window_record(b, c, meta["top"]) for b in built]
    table = pa.table({
        "domain": [r["domain"] for r in windows for _ in r["cuts"]],
        "window_id": [r["id"] for r in windows for _ in r["cuts"]],
        "cut_id": [x["id"] for r in windows for x in r["cuts"]],
        "start": pa.array([x["start"] for r in windows for x in r["cuts"]], pa.int32()),
        "end": pa.array([x["end"] for r in windows for x in r["cuts"]], pa.int32()),
        "window_sha256": [r["sha256"] for r in windows for _ in r["cuts"]],
        "cut_sha256": [x["sha256"] for r in windows for x in r["cuts"]],
    }, metadata={"format": "fideval.windows-index", "version": "1"})
    record = {"format": FORMAT, "version": VERSION,
              "provenance": {**meta["provenance"], "tool": tool_block()},
              "windows_config": cfg_windows,
              "screen": meta["screen"] if meta["screen"] is not None else
              {"status": "skipped", "reason": "no screen.calibration configured"},
              "domains": meta["domains"], "windows": windows}
    record = dump(parse(EvalWindows, record, str(Path(out) / EVAL_WINDOWS)))  # what is written is what the readers take
    for old in Path(out).glob(f"{STAGING}*"):  # left by a killed run (the caller holds the output lock)
        shutil.rmtree(old, ignore_errors=True)
    stage = Path(out) / f"{STAGING}{os.getpid()}"
    names = [f"{length_dir('', 'windows', w)}/{FILE}", f"{length_dir('', 'cuts', c)}/{FILE}", INDEX, EVAL_WINDOWS]
    tagged = all(b.window.classes is not None for b in built) and meta.get("token_classes") is not None
    if tagged:
        names.insert(-1, class_format.FILE)
    try:
        write_sequences(length_dir(stage, "windows", w), Sequences(ids=ids, domains=domains, tokens=tokens))
        write_sequences(length_dir(stage, "cuts", c), Sequences(
            ids=[cid for i in ids for cid in cut_ids(i, per)], domains=[d for d in domains for _ in range(per)],
            tokens=tokens.reshape(-1, c)))
        with atomic_path(stage / INDEX) as tmp:
            pq.write_table(table, tmp)
        if tagged:
            tc = meta["token_classes"]
            write_bytes(stage / class_format.FILE, class_format.encode(class_format.TokenClasses(
                ids=ids, window_sha256=[r["sha256"] for r in windows], classes=np.stack([b.window.classes for b in built]),
                meta={"rules": {k: tc[k] for k in ("rule", "turn_tokens", "code_domains")},
                      "rules_sha256": tc["rules_sha256"], "tokenizer_sha256": meta["provenance"]["tokenizer_sha256"]})))
        write_json(stage / EVAL_WINDOWS, record)
        for name in names:
            (Path(out) / name).parent.mkdir(parents=True, exist_ok=True)
        (Path(out) / EVAL_WINDOWS).unlink(missing_ok=True)  # from here until the last rename: incomplete
        if not tagged:  # an older side file must not outlive the windows it described
            (Path(out) / class_format.FILE).unlink(missing_ok=True)
        for name in names:
            os.replace(stage / name, Path(out) / name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return record


def read_eval_windows(folder: Path) -> dict[str, Any]:
    path = Path(folder) / EVAL_WINDOWS
    if not path.is_file():
        raise FidevalError(f"no {EVAL_WINDOWS} in {folder}", hint="run 'fideval windows' first")
    try:
        rec = nesting.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise FidevalError(f"{path} is not valid JSON", hint="rebuild the windows") from None
    parse(EvalWindows, rec, str(path))
    return rec
