"""Typed file models: a versioned JSON file is a frozen dataclass whose fields say name, type and meaning.

One small mechanism for every format (score.json, manifest.json, eval-windows.json, report.json) instead of
a parser per file: :func:`parse` checks a decoded JSON object against the class (presence, type, then the
class's own ``problem()`` rule) and raises a one-line :class:`FidevalError` naming the key at fault;
:func:`dump` gives the plain dict back, in field order. :func:`fields_table` renders a class as the
markdown table in ``docs/formats*.md`` (``python -m fideval.formats.docs`` keeps them current).

Standard library only, like the rest of ``fideval.formats``: the GPU side reads stores without pydantic.
A model is a ``@dataclass(frozen=True, kw_only=True)`` subclass of :class:`Model`; a field is declared with
:func:`key` (required) or :func:`key` with ``default=`` (may be absent when read; always written). A file's
``format`` and ``version`` fields default to the class's own, so a writer never spells them out. Types:
``str``, ``int``, ``float`` (a JSON integer is a number too), ``bool``, ``Any``, ``X | None``, ``list[X]``,
``dict[str, X]`` and nested models. Keys a class does not declare are ignored
on reading, as the readers always did, so a file may carry more than a reader needs.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, ClassVar

from fideval.errors import FidevalError
from fideval.formats import nesting

_NO_DEFAULT = dataclasses.MISSING


def key(doc: str, *, default: Any = _NO_DEFAULT, since: int | None = None) -> Any:
    """A model field with its meaning (the docs table's last column); ``default`` makes it optional to read.

    ``since``: the file version that introduced the key. An older file read and dumped again leaves such a
    key out when it is absent (None), so re-dumping a file of an older version gives back its own bytes.
    """
    if isinstance(default, (list, dict)):
        raise TypeError("give mutable defaults as None")  # a shared list would leak between instances
    meta = {"doc": doc} if since is None else {"doc": doc, "since": since}
    return dataclasses.field(default=default, metadata=meta)


class Model:
    """Base of the file models: the format name and version a file must carry (None for nested blocks).

    ``READABLE`` lists the versions this fideval reads (default: ``VERSION`` alone); ``HINT`` is what a
    reader is told to do about a broken file.
    """

    FORMAT: ClassVar[str | None] = None
    KIND: ClassVar[str] = "fideval"  # what the file is called in messages: "store", "score format", ...
    VERSION: ClassVar[Any] = None
    READABLE: ClassVar[tuple[Any, ...] | None] = None
    HINT: ClassVar[str] = "regenerate the file with this fideval"

    def problem(self) -> str | None:
        """A rule the types cannot say (e.g. a SHA-256 is 64 hex digits); a message, or None when fine."""
        return None


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _type_name(t: Any) -> str:
    origin, args = typing.get_origin(t), typing.get_args(t)
    if t is Any:
        return "any"
    if t is type(None):
        return "null"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args)
    if origin is list:
        return f"list of {_type_name(args[0])}"
    if origin is dict:
        return f"object of {_type_name(args[1])}"
    if isinstance(t, type) and dataclasses.is_dataclass(t):
        return "object"
    return {str: "string", int: "integer", float: "number", bool: "boolean"}[t]


def _bad(origin: str, at: str, got: Any, t: Any, hint: str) -> FidevalError:
    shown = repr(got) if len(repr(got)) <= 40 else f"a {type(got).__name__}"
    parent, _, leaf = at.rpartition(".")
    where = f"{parent}: '{leaf}'" if parent and "[" not in leaf else f"'{at}'"
    return FidevalError(f"{origin}: {where} is {shown}, expected {_type_name(t)}", hint=hint)


def _value(t: Any, v: Any, origin: str, at: str, hint: str) -> Any:
    origin_t, args = typing.get_origin(t), typing.get_args(t)
    if t is Any:
        return v
    if origin_t in (typing.Union, types.UnionType):
        if v is None and type(None) in args:
            return None
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return _value(rest[0], v, origin, at, hint)
        for a in rest:
            try:
                return _value(a, v, origin, at, hint)
            except FidevalError:
                pass
        raise _bad(origin, at, v, t, hint)
    if origin_t is list:
        if not isinstance(v, list):
            raise _bad(origin, at, v, t, hint)
        return [_value(args[0], x, origin, f"{at}[{i}]", hint) for i, x in enumerate(v)]
    if origin_t is dict:
        if not isinstance(v, dict):
            raise _bad(origin, at, v, t, hint)
        return {k: _value(args[1], x, origin, f"{at}.{k}", hint) for k, x in v.items()}
    if isinstance(t, type) and dataclasses.is_dataclass(t):
        return _parse(t, v, origin, at, hint)
    ok = {bool: lambda x: isinstance(x, bool),
          int: lambda x: isinstance(x, int) and not isinstance(x, bool),
          float: lambda x: isinstance(x, (int, float)) and not isinstance(x, bool),
          str: lambda x: isinstance(x, str)}[t]
    if not ok(v):
        raise _bad(origin, at, v, t, hint)
    return v


def _parse(cls: type, obj: Any, origin: str, at: str, hint: str) -> Any:
    if not isinstance(obj, dict):
        raise FidevalError(f"{origin}: {f'{at!r}' if at else 'the top level'} is not a JSON object", hint=hint)
    hints, values, prefix = _hints(cls), {}, f"{at}." if at else ""
    for f in dataclasses.fields(cls):
        if f.name not in obj:
            if f.default is _NO_DEFAULT:
                raise FidevalError(f"{origin}: missing key '{prefix}{f.name}'", hint=hint)
            values[f.name] = f.default
            continue
        values[f.name] = _value(hints[f.name], obj[f.name], origin, prefix + f.name, hint)
    out = cls(**values)
    msg = out.problem()
    if msg:
        raise FidevalError(f"{origin}: {f'{at}: ' if at else ''}{msg}", hint=hint)
    return out


def parse(cls: type, obj: Any, origin: str, at: str = "") -> Any:
    """``obj`` (decoded JSON) as a ``cls``: format, version and every declared key checked; one line otherwise.
    ``at`` names where ``obj`` sits in its file when it is a block of a larger one (messages say ``at.key``).

    A version this fideval does not read names itself as older or newer, so the user knows which side to move.
    A document nested deeper than :data:`fideval.formats.nesting.MAX_DEPTH` levels is refused first (read files
    with :func:`fideval.formats.nesting.loads`, which also turns ``json``'s ``RecursionError`` into that refusal).
    """
    hint = cls.HINT
    if nesting.depth(obj) > nesting.MAX_DEPTH:  # a reader that decoded it with json.loads: bounded here too
        raise FidevalError(f"{origin}{f' {at}' if at else ''} is nested deeper than {nesting.MAX_DEPTH} levels", hint=hint)
    if cls.FORMAT is not None:
        fmt = obj.get("format") if isinstance(obj, dict) else None
        if fmt != cls.FORMAT:
            raise FidevalError(f"{origin} is not a {cls.FORMAT} file (format {fmt!r})", hint=hint)
        v, readable = obj.get("version"), cls.READABLE or (cls.VERSION,)
        if v not in readable or isinstance(v, bool):
            try:
                newer = int(v) > int(cls.VERSION) if not isinstance(v, bool) else None
            except (TypeError, ValueError):
                newer = None
            age = {True: "a newer", False: "an older", None: "an unknown"}[newer]
            raise FidevalError(f"{origin} has {cls.KIND} version {v!r} ({age} fideval); this fideval reads "
                               f"version {', '.join(map(str, readable))}",
                               hint="upgrade fideval" if newer else hint)
    return _parse(cls, obj, origin, at, hint)


def dump(obj: Any, version: Any = None) -> Any:
    """A model (or a list/dict of models) as plain JSON values, fields in declaration order.

    A key introduced after the file's ``version`` (``key(since=...)``) is left out while it is None."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        v = getattr(obj, "version", version) if type(obj).FORMAT is not None else version
        out = {}
        for f in dataclasses.fields(obj):
            x = getattr(obj, f.name)
            since = f.metadata.get("since")
            if x is None and since is not None and isinstance(v, int) and v < since:
                continue
            out[f.name] = dump(x, v)
        return out
    if isinstance(obj, list):
        return [dump(x, version) for x in obj]
    if isinstance(obj, dict):
        return {k: dump(x, version) for k, x in obj.items()}
    return obj


def fields_table(cls: type) -> str:
    """The markdown table of ``cls``'s keys: name, JSON type, whether a reader requires it, meaning."""
    hints = _hints(cls)
    rows = ["| key | type | required | meaning |", "| --- | --- | --- | --- |"]
    for f in dataclasses.fields(cls):
        doc = f.metadata.get("doc", "").replace("|", "\\|")
        if f.metadata.get("since"):
            doc += f" (version {f.metadata['since']} on)"
        req = "yes" if f.default is _NO_DEFAULT or (cls.FORMAT and f.name in ("format", "version")) else "no"
        rows.append(f"| `{f.name}` | {_type_name(hints[f.name])} | {req} | {doc} |")
    return "\n".join(rows)
