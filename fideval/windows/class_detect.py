"""Spans inside one piece of text: marker pairs, fenced code blocks, JSON and XML.

Each function returns character spans ``[start, end)`` inside ``text[a:b]``. They look only at the text, so a
plain document and a message's content are read the same way. What counts:

* markers (``<think>``/``</think>``, ``<tool_call>``/``</tool_call>``...): from an open marker to the next close,
  both included; an open marker without a close runs to the end (a truncated window); with
  ``open_may_be_missing``, a close marker with no open before it starts at the piece's start (DeepSeek-R1's
  generations begin inside the reasoning, so its content holds only ``</think>``);
* fenced code: a line opening with three or more backticks or tildes to the line closing it (the fence lines
  included); an unclosed fence runs to the end;
* structured: a JSON object or array (``json.JSONDecoder.raw_decode`` from a ``{`` or ``[``) with at least one
  key or two elements, and an XML element ``<tag ...>...</tag>`` that is not a marker pair of the rule.
"""

from __future__ import annotations

import json
import re

_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[^\n]*$", re.M)
_XML = re.compile(r"<([A-Za-z][\w:.-]*)(?:\s[^<>]*)?>.*?</\1\s*>", re.S)
_DECODER = json.JSONDecoder()


def marker_spans(text: str, a: int, b: int, pair: list[str], open_may_be_missing: bool = False) -> list[tuple[int, int]]:
    if not pair:
        return []
    op, cl = pair
    out: list[tuple[int, int]] = []
    pos = a
    if open_may_be_missing:
        first_open, first_close = text.find(op, a, b), text.find(cl, a, b)
        if first_close >= 0 and (first_open < 0 or first_close < first_open):
            out.append((a, first_close + len(cl)))
            pos = first_close + len(cl)
    while True:
        s = text.find(op, pos, b)
        if s < 0:
            return out
        e = text.find(cl, s + len(op), b)
        end = b if e < 0 else e + len(cl)
        out.append((s, end))
        pos = end


def code_spans(text: str, a: int, b: int) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    fences = [m for m in _FENCE.finditer(text, a, b)]
    i = 0
    while i < len(fences):
        op = fences[i]
        mark = op.group(1)
        close = next((k for k in range(i + 1, len(fences)) if fences[k].group(1)[0] == mark[0]
                      and len(fences[k].group(1)) >= len(mark) and not fences[k].group(0).strip()[len(fences[k].group(1)):]), None)
        if close is None:
            out.append((op.start(), b))
            return out
        out.append((op.start(), fences[close].end()))
        i = close + 1
    return out


def structured_spans(text: str, a: int, b: int, markers: tuple[str, ...] = ()) -> list[tuple[int, int]]:
    """JSON and XML spans; an element opening with one of ``markers`` (the rule's think and tool-call markers)
    is the template's syntax, not structured output, and is skipped (the JSON inside a tool call still counts)."""
    out: list[tuple[int, int]] = []
    piece = text[a:b]
    i = 0
    n = len(piece)
    while i < n:
        j = min((k for k in (piece.find("{", i), piece.find("[", i)) if k >= 0), default=-1)
        if j < 0:
            break
        try:
            value, end = _DECODER.raw_decode(piece, j)
        except ValueError:
            i = j + 1
            continue
        if (isinstance(value, dict) and value) or (isinstance(value, list) and len(value) >= 2):
            out.append((a + j, a + end))
            i = end
        else:
            i = j + 1
    for m in _XML.finditer(text, a, b):
        if not any(text.startswith(op, m.start()) for op in markers):
            out.append((m.start(), m.end()))
    return out
