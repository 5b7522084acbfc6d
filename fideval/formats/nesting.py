"""The one nesting bound of every JSON (and YAML) document fideval reads from outside.

No file fideval reads is more than a few levels deep (a config: 4; a store manifest: 3; a safetensors header:
3; report.json: under 10), but a parser follows whatever it is given: Python's ``json`` raises
``RecursionError`` (a traceback, not a one-line error) near 1,000 levels, and a value nested a few hundred
deep still reaches code that walks it recursively. :func:`loads` bounds every document at
:data:`MAX_DEPTH` levels of arrays and objects, and turns ``json``'s own ``RecursionError`` into the same
refusal. :class:`TooDeep` is a :class:`json.JSONDecodeError` (so a ``ValueError``): a reader that already
turns a malformed file into its one-line error does the same for a too-deep one. The YAML configs are
bounded by the same constant (:mod:`fideval.config`), the GGUF metadata arrays too
(:mod:`fideval.quant.gguf_file`).

Standard library only, like the rest of ``fideval.formats``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MAX_DEPTH = 64  # levels of arrays/objects (a top-level object is level 1)


class TooDeep(json.JSONDecodeError):
    """A document nested deeper than :data:`MAX_DEPTH` levels (``str()``: ``nested deeper than 64 levels``)."""

    def __init__(self, doc: str = "", pos: int = 0, limit: int = MAX_DEPTH):
        super().__init__(f"nested deeper than {limit} levels", doc if isinstance(doc, str) else "", pos)
        self.limit = limit

    def __str__(self) -> str:
        return self.msg

    def __reduce__(self):  # pragma: no cover - pickling of an exception, for multiprocessing
        return TooDeep, (self.doc, self.pos, self.limit)


def depth(obj: Any, limit: int = MAX_DEPTH) -> int:
    """Levels of lists/dicts in ``obj`` (a scalar: 0, ``[]``: 1), counted without recursion; the count stops
    once it passes ``limit`` (the result is then ``limit + 1``). ``obj`` must be a tree (decoded JSON is)."""
    if not isinstance(obj, (dict, list)):
        return 0
    worst, stack = 1, [(obj, 1)]
    while stack:
        node, d = stack.pop()
        if d > worst:
            worst = d
            if worst > limit:
                return limit + 1
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, d + 1) for c in children if isinstance(c, (dict, list)))
    return worst


def check(obj: Any, limit: int = MAX_DEPTH) -> Any:
    """``obj`` itself, or :class:`TooDeep` when it nests deeper than ``limit``."""
    if depth(obj, limit) > limit:
        raise TooDeep(limit=limit)
    return obj


def loads(text: str | bytes | bytearray, limit: int = MAX_DEPTH) -> Any:
    """``json.loads`` with the nesting bounded: a document deeper than ``limit`` levels raises :class:`TooDeep`
    (also where ``json`` itself would have raised ``RecursionError``); malformed JSON raises
    ``json.JSONDecodeError`` as before, bytes that are not UTF-8 ``UnicodeDecodeError``."""
    try:
        obj = json.loads(text)
    except RecursionError:
        raise TooDeep(limit=limit) from None
    return check(obj, limit)


def load_file(path: Path, hint: str) -> Any:
    """A JSON file read and parsed with the nesting bounded; every way it can fail is one line naming the file."""
    from fideval.errors import FidevalError

    try:
        return loads(Path(path).read_bytes())
    except FileNotFoundError:
        raise FidevalError(f"{path} not found", hint=hint) from None
    except TooDeep:
        raise FidevalError(f"{path} is nested deeper than {MAX_DEPTH} levels", hint=hint) from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise FidevalError(f"{path} is not readable JSON ({type(e).__name__})", hint=hint) from None
