"""Documents from a configured source, in stream order, each with where it came from.

Sources (``fideval.config.LocalSource`` / ``HubSource``):

* ``.jsonl``: one JSON object a line; blank lines skipped; origin ``{"file", "line"}`` (1-based).
* ``.parquet``: one row a document; origin ``{"file", "row"}`` (0-based).
* ``.txt``: documents are separated by one or more blank lines (lines holding only whitespace); a
  document's text is its lines joined by ``\\n`` without the trailing newline; origin ``{"file", "line"}``
  of its first line. Only plain text: ``messages_field`` is refused.
* Hugging Face ``datasets``: ``load_dataset(id, config, split=, revision=, streaming=)``; origin
  ``{"dataset", "config", "revision", "split", "row"}`` with the row's 0-based position in the split.
  ``id`` may also be a local folder of data files (a cloned dataset repository): then a revision is
  resolved with ``git rev-parse`` when the folder is a git repository.

The field: ``text_field`` (a string), or ``messages_field`` (a list of ``{role, content}``), rendered by
the caller's ``render`` (the tokenizer's chat template). With neither set, ``text`` is used when the
first row has it, else ``messages``. A row's ``id`` field, when present, is kept as ``doc_id``.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fideval.config import HubSource, LocalSource, resolve_path
from fideval.errors import FidevalError

HEX40 = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class Document:
    origin: dict[str, Any]  # where it came from (file + line/row, or dataset + revision + split + row)
    text: str  # the text the model sees (chat: the rendered template)
    chat: bool = False


def _field(src: LocalSource | HubSource, first: dict, where: str, label: str) -> tuple[str, bool]:
    """(field name, is_messages) after checking that the first row has it."""
    if src.text_field or src.messages_field:
        name, chat = (src.text_field, False) if src.text_field else (src.messages_field, True)
    elif "text" in first:
        name, chat = "text", False
    elif "messages" in first:
        name, chat = "messages", True
    else:
        raise FidevalError(f"{where}: rows of {label} have no 'text' or 'messages' field (fields: {', '.join(map(str, first))})",
                           hint="set text_field or messages_field")
    if name not in first:
        raise FidevalError(f"{where}: field '{name}' does not exist in the rows of {label} (fields: {', '.join(map(str, first))})",
                           hint="fix text_field/messages_field")
    return name, chat


def _payload(row: dict, name: str, chat: bool, where: str, at: Callable[[], str], render: Callable[[list], str]) -> str:
    """The row's text (or rendered conversation); ``at()`` names the row in an error (built only then)."""
    if name not in row:
        raise FidevalError(f"{where}: {at()} has no field '{name}'", hint="every row needs the configured field")
    v = row[name]
    if chat:
        if not (isinstance(v, list) and all(isinstance(m, dict) and "role" in m and "content" in m for m in v)):
            raise FidevalError(f"{where}: {at()} field '{name}' is not a list of {{role, content}} messages",
                           hint="fix the row, or use text_field for plain text")
        return render(v)
    if not isinstance(v, str):
        raise FidevalError(f"{where}: {at()} field '{name}' is not a string ({type(v).__name__})",
                           hint="fix the row, or use messages_field for conversations")
    return v


def _not_utf8(path: Path) -> FidevalError:
    """The error for a file that is not UTF-8, naming the first line that does not decode (text-mode reads
    decode in blocks, so the line being read when the error surfaced may be an earlier one)."""
    line = 0
    with open(path, "rb") as f:
        for line, raw in enumerate(f, 1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                break
    return FidevalError(f"{path}:{line} is not UTF-8 text", hint="convert the file to UTF-8")


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number from 1, line) of a UTF-8 text file; a file that is not UTF-8 is one error naming the
    first line that does not decode. A plain loop over the file: next() per line measured twice as slow."""
    with open(path, encoding="utf-8") as f:
        try:
            yield from enumerate(f, 1)
        except UnicodeDecodeError:
            raise _not_utf8(path) from None


def _jsonl_row(path: Path, i: int, line: str) -> dict | None:
    """Line ``i`` of a jsonl file as its row, or ``None`` for a blank line."""
    if not line.strip():
        return None
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        raise FidevalError(f"{path}:{i} is not valid JSON", hint="one JSON object per line") from None
    if not isinstance(row, dict):
        raise FidevalError(f"{path}:{i} is not a JSON object", hint="one JSON object per line")
    return row


def _rows_jsonl(path: Path) -> Iterator[tuple[dict, dict]]:
    for i, line in _lines(path):
        row = _jsonl_row(path, i, line)
        if row is not None:
            yield {"line": i}, row


def _rows_parquet(path: Path) -> Iterator[tuple[dict, dict]]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:
        raise FidevalError(f"{path} is not a readable parquet file ({type(e).__name__})",
                           hint="re-export the file, or use jsonl") from None
    r = 0
    for batch in pf.iter_batches(batch_size=1024):
        for row in batch.to_pylist():
            yield {"row": r}, row
            r += 1


def _rows_txt(path: Path) -> Iterator[tuple[dict, dict]]:
    lines: list[str] = []
    start = 0
    for i, line in _lines(path):
        if line.strip():
            if not lines:
                start = i
            lines.append(line.rstrip("\n").rstrip("\r"))
        elif lines:
            yield {"line": start}, {"text": "\n".join(lines)}
            lines = []
    if lines:
        yield {"line": start}, {"text": "\n".join(lines)}


def _local_rows(src: LocalSource, where: str) -> tuple[Iterator[tuple[dict, dict]], dict]:
    path = resolve_path(src.path)
    if not path.is_file():
        raise FidevalError(f"{where}.path: file {src.path} does not exist", hint="fix the path")
    suffix = path.suffix.lower()
    readers = {".jsonl": _rows_jsonl, ".parquet": _rows_parquet, ".txt": _rows_txt}
    if suffix not in readers:
        raise FidevalError(f"{where}.path: {src.path} is not .jsonl, .parquet or .txt", hint="convert it to jsonl")
    if suffix == ".txt" and src.messages_field:
        raise FidevalError(f"{where}: {src.path} is a .txt file of plain text; messages_field needs jsonl or parquet",
                           hint="use text_field, or convert the conversations to jsonl")
    return readers[suffix](path), {"file": src.path}


def resolve_revision(src: HubSource, where: str) -> dict[str, Any]:
    """{"revision": as given, "commit": resolved 40-hex or None, "note": why unresolved}.

    A revision that does not exist is an error; an unreachable Hub (offline) only leaves it unresolved.
    """
    key = (src.id, src.revision)
    if key not in _RESOLVED:
        _RESOLVED[key] = _resolve(src, where)
    return _RESOLVED[key]


_RESOLVED: dict[tuple[str, str], dict[str, Any]] = {}


def _resolve(src: HubSource, where: str) -> dict[str, Any]:
    rev = src.revision
    folder = Path(src.id)
    if folder.is_dir():
        if not (folder / ".git").exists():
            return {"revision": rev, "commit": None, "note": "local folder, not a git repository: revision not checked"}
        out = subprocess.run(["git", "-C", str(folder), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise FidevalError(f"{where}.revision: '{rev}' does not resolve in the dataset repository {src.id}",
                               hint="give a branch, tag or commit that exists")
        return {"revision": rev, "commit": out.stdout.strip(), "note": None}
    try:
        from huggingface_hub import HfApi
        from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

        sha = HfApi().dataset_info(src.id, revision=rev, timeout=15).sha
    except RevisionNotFoundError:
        raise FidevalError(f"{where}.revision: '{rev}' does not resolve for dataset {src.id}",
                           hint="give a branch, tag or commit that exists") from None
    except RepositoryNotFoundError:
        raise FidevalError(f"{where}.id: dataset {src.id} not found on the Hub (or not accessible)",
                           hint="check the id and your token") from None
    except Exception as e:  # offline, proxy, timeout: keep going, say so
        return {"revision": rev, "commit": rev if HEX40.match(rev) else None,
                "note": f"unresolved: Hub unreachable ({type(e).__name__})"}
    return {"revision": rev, "commit": sha, "note": None}


def _load_error(src: HubSource, where: str, e: Exception) -> FidevalError:
    name, msg = type(e).__name__, str(e).splitlines()[0] if str(e) else ""
    low = msg.lower()
    label = f"dataset {src.id}" + (f" ({src.config})" if src.config else "")
    if "offline" in low or name in ("ConnectionError", "OfflineModeIsEnabled", "LocalEntryNotFoundError"):
        return FidevalError(f"{where}: cannot reach the Hub to load {label} (offline)",
                            hint="connect, or point id at a local copy of the dataset")
    if "revision" in low or name == "RevisionNotFoundError":
        return FidevalError(f"{where}.revision: '{src.revision}' does not resolve for {label}", hint="fix the revision")
    if "split" in low:
        return FidevalError(f"{where}.split: {label} has no split '{src.split}' ({msg[:160]})", hint="fix the split")
    if "config" in low and src.config:
        return FidevalError(f"{where}.config: {label} has no configuration '{src.config}'", hint="fix the config")
    return FidevalError(f"{where}: cannot load {label}: {name}: {msg[:200]}", hint="check id, config and split")


def _hub_rows(src: HubSource, where: str) -> tuple[Iterator[tuple[dict, dict]], dict]:
    if src.id.startswith(("/", "./", "../", "~")) and not Path(src.id).expanduser().is_dir():
        raise FidevalError(f"{where}.id: dataset folder {src.id} does not exist", hint="fix the path")
    rev = resolve_revision(src, where)
    try:
        from datasets import load_dataset

        kw: dict[str, Any] = {"split": src.split, "streaming": src.streaming}
        if not Path(src.id).is_dir():
            kw["revision"] = rev["commit"] or src.revision
        ds = load_dataset(src.id, src.config, **kw)
    except FidevalError:
        raise
    except Exception as e:
        raise _load_error(src, where, e) from None
    origin = {"dataset": src.id, "config": src.config, "revision": rev["commit"] or src.revision, "split": src.split}
    if rev["note"]:
        origin["revision_note"] = rev["note"]

    def rows() -> Iterator[tuple[dict, dict]]:
        try:
            for i, row in enumerate(ds):
                yield {"row": i}, row
        except FidevalError:
            raise
        except Exception as e:
            raise _load_error(src, where, e) from None

    return rows(), origin


def iter_documents(src: LocalSource | HubSource, where: str, render: Callable[[list], str]) -> Iterator[Document]:
    """Every document of ``src`` in stream order. ``where`` names the config key in error messages."""
    rows, base = _hub_rows(src, where) if src.type == "hf" else _local_rows(src, where)
    label = base.get("file") or base.get("dataset")
    name: str | None = None
    chat = False
    for pos, row in rows:
        if name is None:
            name, chat = _field(src, row, where, label)
        text = _payload(row, name, chat, where, _at(label, pos), render)
        yield Document(origin=_origin(base, pos, row), text=text, chat=chat)


def _at(label: str, pos: dict) -> Callable[[], str]:
    return lambda: f"{label} " + ", ".join(f"{k} {v}" for k, v in pos.items())


def _origin(base: dict, pos: dict, row: dict) -> dict[str, Any]:
    origin = {**{k: v for k, v in base.items() if v is not None}, **pos}
    if isinstance(row.get("id"), (str, int)):
        origin["doc_id"] = row["id"]
    return origin


def describe(src: LocalSource | HubSource) -> dict[str, Any]:
    """The source as recorded in eval-windows.json (the HF revision resolved where possible)."""
    d = src.model_dump(mode="json")
    if src.type == "hf":
        d["resolved"] = resolve_revision(src, "source")
    return d


# == blocks of documents: the calibration pass's input =======================================================


@dataclass
class TextBlock:
    """Consecutive documents of one source in stream order, as the calibration pass reads them: document
    ``i``'s text is ``texts[i]`` when ``i`` is in ``texts``, else the ASCII bytes
    ``buf[bounds[i]:bounds[i + 1]]`` (then the range of a document in ``texts`` is empty). ``buf`` has
    ``kernels.PAD`` readable bytes after ``bounds[-1]``. ``origin(i)`` is document ``i``'s origin, as
    :func:`iter_documents` gives it (built on demand: the pass asks only for documents that matched)."""

    buf: np.ndarray  # uint8
    bounds: np.ndarray  # int64, one more than documents
    texts: dict[int, str]
    origin: Callable[[int], dict[str, Any]]
    chars: int  # characters of all the texts

    def __len__(self) -> int:
        return self.bounds.size - 1

    @classmethod
    def of_texts(cls, texts: list[str], origins: list[Any]) -> "TextBlock":
        """A block whose every document is a Python string (no bytes in ``buf``)."""
        return cls(_EMPTY, np.zeros(len(texts) + 1, np.int64), dict(enumerate(texts)), origins.__getitem__,
                   sum(map(len, texts)))

    def text(self, i: int) -> str:
        t = self.texts.get(i)
        return t if t is not None else self.buf[self.bounds[i]:self.bounds[i + 1]].tobytes().decode("ascii")


class Blocks:
    """A stream of :class:`TextBlock` (what :func:`iter_blocks` yields), marked as such for the calibration
    pass (``overlap.scan``), which otherwise takes (origin, text) pairs."""

    def __init__(self, blocks: Iterable[TextBlock]):
        self._blocks = blocks

    def __iter__(self) -> Iterator[TextBlock]:
        return iter(self._blocks)


_EMPTY = np.zeros(64, np.uint8)  # kernels.PAD bytes: a block whose documents are all in ``texts``


def batched(docs: Iterable, size_of: Callable[[Any], int], limit: int) -> Iterator[list]:
    """``docs`` in consecutive lists, each closed once its items' sizes reach ``limit``."""
    batch, n = [], 0
    for d in docs:
        batch.append(d)
        n += size_of(d)
        if n >= limit:
            yield batch
            batch, n = [], 0
    if batch:
        yield batch


def blocks_of(docs: Iterable[tuple[Any, str]], batch_chars: int) -> Iterator[TextBlock]:
    """(origin, text) pairs as blocks of ~``batch_chars`` characters, every text a Python string."""
    for batch in batched(docs, lambda d: len(d[1]), batch_chars):
        yield TextBlock.of_texts([t for _, t in batch], [o for o, _ in batch])


def iter_blocks(src: LocalSource | HubSource, where: str, render: Callable[[list], str],
                batch_chars: int = 2 << 20) -> Iterator[TextBlock]:
    """The documents of :func:`iter_documents` (same texts, origins and errors), as blocks of ~``batch_chars``
    characters. A ``.jsonl`` file of plain text is read by :func:`_jsonl_blocks`, which hands the text of
    most lines to the hashing loop without making a Python string of it; everything else goes through
    :func:`iter_documents`."""
    if src.type == "local":
        path = resolve_path(src.path)
        if path.is_file() and path.suffix.lower() == ".jsonl" and not src.messages_field:
            first = _rows_jsonl(path)
            row = next(first, None)
            first.close()
            if row is None:
                return
            name, chat = _field(src, row[1], where, src.path)
            if not chat:
                yield from _jsonl_blocks(path, src.path, name, where, batch_chars)
                return
    yield from blocks_of(((d.origin, d.text) for d in iter_documents(src, where, render)), batch_chars)


def _jsonl_blocks(path: Path, label: str, name: str, where: str, batch_bytes: int) -> Iterator[TextBlock]:
    """A jsonl file's documents (field ``name``, plain text) in blocks of whole lines, ~``batch_bytes`` each.

    Each block is read as bytes, and the compiled loop ``kernels.jsonl_field`` parses every line that is
    of a strict subset of JSON (an object of plain-ASCII bytes, exactly one top-level member ``name``, a
    string unescaping to ASCII, ...: see ``kernels._json_line``) and writes the field's unescaped text back
    to back into the block's buffer: no Python object per line. Any other line (blank, non-ASCII,
    malformed, the field missing or not a string, ...) goes through the code of :func:`iter_documents`
    (``_jsonl_row``, ``_payload``), so texts, skipped lines and errors are the same; a block holding a
    ``\\r`` outside the compiled lines (a line break for Python's text files) is read by that code whole,
    with Python's line splitting. Origins of the compiled lines are made on demand, by ``json.loads`` of
    the line (the pass asks only for documents that matched)."""
    from fideval.windows import kernels

    pad = kernels.PAD
    key = np.frombuffer(name.encode("utf-8"), np.uint8)
    base = {"file": label}
    line0 = 1  # line number of the block's first line
    carry = b""
    cap = max(batch_bytes, 1 << 16)
    with open(path, "rb", buffering=0) as f:
        while True:
            size = max(cap, 2 * len(carry))  # a line longer than the buffer doubles it
            raw = np.empty(size + pad, np.uint8)
            n = len(carry)
            raw[:n] = np.frombuffer(carry, np.uint8)
            mv = memoryview(raw)
            eof = False
            while n < size:
                got = f.readinto(mv[n:size])
                if not got:
                    eof = True
                    break
                n += got
            end = n if eof else int(kernels.last_newline(raw, n)) + 1
            carry = raw[end:n].tobytes()
            if end:
                raw[end:end + pad] = 0
                block, lines = _jsonl_block(raw, end, key, path, label, name, where, line0, base)
                line0 += lines
                if len(block):
                    yield block
            if eof:
                return


def _jsonl_block(raw: np.ndarray, n: int, key: np.ndarray, path: Path, label: str, name: str, where: str,
                 line0: int, base: dict) -> tuple[TextBlock, int]:
    """The block of whole lines ``raw[:n]`` (``raw[n:n + PAD]`` zero), its first line being line ``line0``:
    (its documents, its number of lines)."""
    from fideval.windows import kernels

    out = np.empty(n + kernels.PAD, np.uint8)
    cap = n // 1024 + 64
    parts = []
    p = o = 0
    while p < n:
        ls, le, ob, oe = (np.empty(cap, np.int64) for _ in range(4))
        k, p, o = kernels.jsonl_field(raw, p, n, key, out, o, ls, le, ob, oe)
        parts.append((ls[:k], le[:k], ob[:k], oe[:k]))
        cap *= 2
    ls, le, ob, oe = (np.concatenate(x) for x in zip(*parts)) if len(parts) > 1 else parts[0]
    lines = ls.size
    bounds = np.empty(lines + 1, np.int64)
    bounds[:-1] = ob
    bounds[-1] = o
    texts: dict[int, str] = {}
    rows: dict[int, dict] = {}
    chars = o
    blank: list[int] = []
    for j in np.flatnonzero(oe < 0).tolist():  # in order: lines before a '\r' are numbered alike either way
        i = line0 + j
        b = raw[ls[j]:le[j]].tobytes()
        if b"\r" in b:
            return _python_block(raw[:n].tobytes(), path, label, name, where, line0, base)
        try:
            line = b.decode("utf-8")
        except UnicodeDecodeError:
            raise _not_utf8(path) from None
        row = _jsonl_row(path, i, line)
        if row is None:
            blank.append(j)
            continue
        texts[j] = t = _payload(row, name, False, where, _at(label, {"line": i}), _no_render)
        rows[j] = row
        chars += len(t)
    number = np.arange(line0, line0 + lines, dtype=np.int64)  # of each document's line
    if blank:  # no document: drop them (their ranges are empty) and renumber the rest
        keep = np.ones(lines, bool)
        keep[blank] = False
        renum = np.cumsum(keep) - 1
        texts = {int(renum[j]): t for j, t in texts.items()}
        rows = {int(renum[j]): r for j, r in rows.items()}
        idx = np.flatnonzero(keep)
        bounds = np.append(bounds[idx], bounds[-1])
        ls, le, number = ls[idx], le[idx], number[idx]

    def origin(i: int) -> dict[str, Any]:
        row = rows.get(i)
        if row is None:
            row = json.loads(raw[ls[i]:le[i]].tobytes())
        return _origin(base, {"line": int(number[i])}, row)

    return TextBlock(out, bounds, texts, origin, chars), lines


def _python_block(data: bytes, path: Path, label: str, name: str, where: str, line0: int,
                  base: dict) -> tuple[TextBlock, int]:
    """The block ``data`` read line by line as :func:`iter_documents` reads a jsonl file (Python's text
    mode: ``\\r``, ``\\r\\n`` and ``\\n`` end lines): (its documents, its number of lines)."""
    texts: list[str] = []
    origins: list[dict] = []
    i = line0 - 1
    with io.TextIOWrapper(io.BytesIO(data), encoding="utf-8") as f:
        try:
            for i, line in enumerate(f, line0):
                row = _jsonl_row(path, i, line)
                if row is not None:
                    texts.append(_payload(row, name, False, where, _at(label, {"line": i}), _no_render))
                    origins.append(_origin(base, {"line": i}, row))
        except UnicodeDecodeError:
            raise _not_utf8(path) from None
    return TextBlock.of_texts(texts, origins), i - line0 + 1


def _no_render(messages: list) -> str:
    raise AssertionError("a plain-text field is never rendered")
