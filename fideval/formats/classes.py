"""The token-class side file of the windows stage: ``token-classes.safetensors``, format ``fideval.token-classes`` v1.

Why a side file and not a column of the token arrays: the token files (``fideval.sequences`` v1) are what the
teacher, the scorer and the published stores are keyed on; a class is a *reading* of the tokens, decided by rules
that may change while the tokens do not. So the classes sit beside the tokens, name the tokens they describe by
their SHA-256 (the ``sha256`` of each window in ``eval-windows.json``), and the report joins them to the scored
rows by sequence id and position, checking that chain first (``fideval/report/classes.py``).

One tensor ``classes`` int32 ``[n_windows, W]``: bit ``b`` of entry ``[i, t]`` set when token ``t`` of window
``i`` is of class ``CLASSES[b]``; a token may be of several classes (an assistant's numeral in its reasoning).
String metadata (safetensors requires strings): ``format``, ``version``, ``length`` (W), ``ids`` (JSON list of
window ids), ``window_sha256`` (JSON list aligned with ``ids``), ``classes`` (JSON list of class names, bit
order), ``rules`` (JSON: the rule table entry applied, or null), ``rules_sha256`` (canonical hash of the whole
``token_classes`` config), ``tokenizer_sha256``. The header is canonical (sorted keys), so the file is a pure
function of its content. Written and read with numpy and the standard library only. Documented in
``docs/formats-classes.md``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fideval.errors import FidevalError

FORMAT = "fideval.token-classes"
VERSION = "1"
FILE = "token-classes.safetensors"

# bit order is the format: appending a class is a new version, reordering never happens
CLASSES: tuple[tuple[str, str], ...] = (
    ("template", "the chat template's own characters (turn headers, role names, end-of-turn and marker tokens)"),
    ("system", "content of a system (or developer) message"),
    ("user", "content of a user message"),
    ("assistant", "content of an assistant message (reasoning, answer and tool-call arguments)"),
    ("tool", "content of a tool message (a tool's output)"),
    ("reasoning", "inside an assistant's think markers (or its reasoning_content)"),
    ("answer", "assistant content outside reasoning and tool calls"),
    ("tool_call", "a tool call: between the rule's tool-call markers, or the arguments of a rendered tool_calls entry"),
    ("structured", "JSON or XML inside a message or document"),
    ("code", "a fenced code block, or any content token of a code domain"),
    ("numeral", "a token holding a decimal digit"),
    ("turn_start", "the first k content tokens of a message (token_classes.turn_tokens)"),
    ("latin", "a token whose letters are all Latin script"),
    ("non_latin", "a token with a letter of another script"),
    ("text", "content of a plain-text document"),
    ("separator", "a windows.separator token (BOS/EOS between documents)"),
    ("unknown", "a token of a conversation whose messages could not be located in its rendering: no structural class"),
)
NAMES = tuple(n for n, _ in CLASSES)
BIT = {n: 1 << i for i, n in enumerate(NAMES)}


@dataclass(frozen=True)
class TokenClasses:
    """A side file in memory: per-window class bits and what they describe."""

    ids: list[str]
    window_sha256: list[str]
    classes: np.ndarray  # int32 [n, W]
    meta: dict[str, Any]


def _bytes(classes: np.ndarray, meta: dict[str, str]) -> bytes:
    arr = np.ascontiguousarray(classes, dtype="<i4")
    from fideval.formats.safetensors import sorted_header

    return sorted_header({"classes": ("I32", list(arr.shape), arr.nbytes)}, meta) + arr.tobytes()


def encode(tc: TokenClasses) -> bytes:
    """The file's bytes (the caller writes them atomically)."""
    if tc.classes.ndim != 2 or tc.classes.shape[0] != len(tc.ids) or len(tc.ids) != len(tc.window_sha256):
        raise ValueError("ids, window_sha256 and classes disagree in count")
    meta = {"format": FORMAT, "version": VERSION, "length": str(tc.classes.shape[1]), "ids": json.dumps(tc.ids),
            "window_sha256": json.dumps(tc.window_sha256), "classes": json.dumps(list(NAMES)),
            "rules": json.dumps(tc.meta.get("rules"), sort_keys=True), "rules_sha256": str(tc.meta.get("rules_sha256")),
            "tokenizer_sha256": str(tc.meta.get("tokenizer_sha256"))}
    return _bytes(tc.classes.astype(np.int32), meta)


def read(path: str | Path) -> TokenClasses:
    """The side file at ``path``; anything else than a v1 file of consistent shape is one line."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise FidevalError(f"no token classes at {path}", hint="rebuild the windows with this fideval ('fideval windows')")
    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
            if meta.get("format") != FORMAT:
                raise FidevalError(f"{path} is not a token-classes file (format {meta.get('format')!r})")
            if meta.get("version") != VERSION:
                raise FidevalError(f"{path} has token-classes version {meta.get('version')!r}; this fideval reads {VERSION}",
                                   hint="rebuild the windows with this fideval")
            arr = f.get_tensor("classes")
        ids, shas, names = (json.loads(meta[k]) for k in ("ids", "window_sha256", "classes"))
        rules = json.loads(meta.get("rules") or "null")
    except FidevalError:
        raise
    except Exception as e:  # corrupt header or metadata: safetensors and json raise their own types
        raise FidevalError(f"{path} is unreadable ({type(e).__name__})", hint="rebuild the windows") from None
    if names != list(NAMES):
        raise FidevalError(f"{path} names classes {names[:3]}..., this fideval's v{VERSION} order is {list(NAMES[:3])}...",
                           hint="rebuild the windows with this fideval")
    if arr.dtype != np.int32 or arr.ndim != 2 or arr.shape[0] != len(ids) or len(shas) != len(ids):
        raise FidevalError(f"{path} is inconsistent (shape {tuple(arr.shape)}, {len(ids)} ids)", hint="rebuild the windows")
    return TokenClasses(ids=ids, window_sha256=shas, classes=arr,
                        meta={"rules": rules, "rules_sha256": meta.get("rules_sha256"),
                              "tokenizer_sha256": meta.get("tokenizer_sha256")})
