"""Where each message sits in its rendered conversation, as per-character class bits.

The chat template is a program (Jinja) that may reorder, strip and drop what it is given: Qwen3 moves
``reasoning_content`` between its own ``<think>`` markers and drops the reasoning of turns before the last user
query; DeepSeek-R1 drops everything up to ``</think>``; tool calls are printed by the template around their
arguments. So a message is not assumed to be rendered verbatim: its *pieces* (reasoning, content, each tool
call's name and arguments) are searched for, in order, in the rendered string, each from where the previous one
ended. A required piece (content, tool-call arguments) that cannot be found makes the whole conversation
``unknown`` (never a guess), as does a role the rule lists nowhere and content given as a list of blocks; an
optional one (reasoning, a tool's name) the template may have dropped is skipped (its characters are not there),
and so is one found only where the message's next required piece no longer follows it (it was found in a later
turn). A piece found only after stripping whitespace leaves the stripped whitespace to the template.

Inside a located piece the rule's markers and the content detectors (``class_detect.py``) add reasoning,
tool-call, code and structured spans. Every character not inside a piece is the template's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fideval.formats.classes import BIT
from fideval.windows.class_config import TemplateRule
from fideval.windows.class_detect import code_spans, marker_spans, structured_spans


@dataclass
class Layout:
    """Per-character class bits of one rendered text, and each message's piece spans (for turn starts)."""

    bits: np.ndarray  # int32 [len(text)]
    messages: list[list[tuple[int, int]]] = field(default_factory=list)


def _find(text: str, piece: str, start: int, stop: int | None = None) -> tuple[int, int] | None:
    """``piece`` in ``text[start:stop]``, exactly or whitespace-stripped; its [start, end) or None."""
    for p in (piece, piece.strip()):
        if p:
            at = text.find(p, start, stop if stop is not None else len(text))
            if at >= 0:
                return at, at + len(p)
    return None


def _argument_forms(args: Any) -> list[str]:
    """How a template may print tool-call arguments: a string as it is; an object as transformers' ``tojson``
    (``json.dumps``, ensure_ascii off), or ASCII-escaped, or compact."""
    if isinstance(args, str):
        return [args]
    return [json.dumps(args, ensure_ascii=False), json.dumps(args),
            json.dumps(args, ensure_ascii=False, separators=(",", ":"))]


def _split_think(content: str, think: list[str]) -> tuple[str, str] | None:
    """(reasoning, answer) of content that carries its own think markers, as templates split it, else None."""
    if not think or think[1] not in content:
        return None
    before, after = content.split(think[1], 1)[0], content.split(think[1])[-1]
    return before.split(think[0])[-1].strip(), after.strip()


_DEFAULT_ROLES = TemplateRule(name="default", match=["-"]).roles  # a template no rule fits: the default role names


def role_class(role: Any, rule: TemplateRule | None) -> str | None:
    """The role class (system, user, assistant, tool) of a message role, or None when the rule lists it nowhere."""
    roles = rule.roles if rule is not None else _DEFAULT_ROLES
    return next((cls for cls, names in roles.items() if role in names), None)


def _pieces(m: dict, rule: TemplateRule | None) -> list[tuple[str, list[str], bool]]:
    """The message's pieces in render order: (kind, accepted forms, required)."""
    think = rule.think if rule is not None else []
    out: list[tuple[str, list[str], bool]] = []
    rc = m.get("reasoning_content")
    if isinstance(rc, str) and rc.strip():
        out.append(("reasoning", [rc], False))
    content = m.get("content")
    if isinstance(content, str) and content.strip():
        out.append(("content", [content], True))
    calls = m.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        fn = call.get("function", call) if isinstance(call, dict) else {}
        if isinstance(fn, dict) and isinstance(fn.get("name"), str) and fn["name"]:
            out.append(("tool_name", [fn["name"]], False))
        if isinstance(fn, dict) and fn.get("arguments") not in (None, "", {}):
            out.append(("tool_call", _argument_forms(fn["arguments"]), True))
    if out and out[0][0] != "reasoning" and isinstance(content, str):
        split = _split_think(content, think)
        if split is not None:  # a template that moves inline reasoning: accept its parts too
            i = next(k for k, p in enumerate(out) if p[0] == "content")
            out[i] = ("content", [content, split[1]], True)
            out.insert(i, ("reasoning_split", [split[0]], False))
    return out


def _locate(text: str, forms: list[str], start: int, stop: int | None) -> tuple[int, int] | None:
    for f in forms:
        hit = _find(text, f, start, stop)
        if hit is not None:
            return hit
    return None


def _ambiguous(text: str, placed: list[tuple[int, int, str]]) -> bool:
    """Whether a required piece's text occurs again between its end and the next required piece (a short content
    such as ``user`` may have been found on the template's own role header, the real one later): then where the
    piece is cannot be told, and the conversation is ``unknown`` rather than a guess."""
    for k, (a, b, s) in enumerate(placed):
        stop = placed[k + 1][0] + len(s) - 1 if k + 1 < len(placed) else len(text)
        if text.find(s, b, min(stop, len(text))) >= 0:
            return True
    return False


def layout(text: str, messages: list[dict], rule: TemplateRule | None, code: bool = False) -> Layout | None:
    """The per-character bits of a rendered conversation, or None when a required piece is not found or a role
    has no class (the caller marks the conversation ``unknown``)."""
    bits = np.zeros(len(text), dtype=np.int32)
    covered = np.zeros(len(text), dtype=bool)
    spans_of: list[list[tuple[int, int]]] = []
    cursor = 0
    placed: list[tuple[int, int, str]] = []  # required pieces as located: checked for ambiguity below
    for m in messages:
        cls = role_class(m.get("role"), rule)
        if cls is None or m.get("content") is not None and not isinstance(m.get("content"), str):
            return None  # a role no class lists, or content blocks (a list) this reader does not locate
        pieces = _pieces(m, rule)
        spans: list[tuple[int, int]] = []
        for j, (kind, forms, required) in enumerate(pieces):
            if kind == "reasoning_split" and _find(text, pieces[j + 1][1][0], cursor) is not None:
                continue  # the content is printed verbatim, its own markers inside it: no split to follow
            hit = _locate(text, forms, cursor, None)
            if not required and hit is not None:  # kept only if the next required piece still follows it
                nxt = next((p for p in pieces[j + 1:] if p[2]), None)
                if nxt is not None and _locate(text, nxt[1], hit[1], None) is None:
                    hit = None
            if hit is None:
                if required:
                    return None
                continue
            a, b = hit
            cursor = b
            if required:
                placed.append((a, b, text[a:b]))
            spans.append((a, b))
            covered[a:b] = True
            bits[a:b] |= BIT[cls]
            if kind in ("reasoning", "reasoning_split"):
                bits[a:b] |= BIT["reasoning"]
            elif kind in ("tool_call", "tool_name"):
                bits[a:b] |= BIT["tool_call"]
            if kind == "content" and rule is not None and cls == "assistant":
                for s, e in marker_spans(text, a, b, rule.think, open_may_be_missing=True):
                    bits[s:e] |= BIT["reasoning"]
            if kind in ("content", "tool_call"):
                _content_detectors(text, a, b, bits, rule, cls, code)
        spans_of.append(spans)
    if _ambiguous(text, placed):
        return None
    if rule is not None and rule.tool_call:  # the template's own tool-call syntax around located arguments
        for s, e in marker_spans(text, 0, len(text), rule.tool_call):
            if (bits[s:e] & BIT["tool_call"]).any():
                bits[s:e] |= BIT["tool_call"]
    bits[~covered] |= BIT["template"]
    assistant = (bits & BIT["assistant"]) != 0
    bits[assistant & ((bits & (BIT["reasoning"] | BIT["tool_call"])) == 0)] |= BIT["answer"]
    return Layout(bits=bits, messages=spans_of)


def _content_detectors(text: str, a: int, b: int, bits: np.ndarray, rule: TemplateRule | None, cls: str,
                       code: bool) -> None:
    if rule is not None and rule.tool_call and cls == "assistant":
        for s, e in marker_spans(text, a, b, rule.tool_call):
            bits[s:e] |= BIT["tool_call"]
    for s, e in code_spans(text, a, b):
        bits[s:e] |= BIT["code"]
    markers = tuple(m for m in ((rule.think + rule.tool_call) if rule is not None else []) if m.startswith("<"))
    for s, e in structured_spans(text, a, b, markers):
        bits[s:e] |= BIT["structured"]
    if code:
        bits[a:b] |= BIT["code"]


def text_layout(text: str, code: bool = False) -> Layout:
    """A plain-text document: every character is ``text`` content, with the content detectors."""
    bits = np.full(len(text), BIT["text"], dtype=np.int32)
    _content_detectors(text, 0, len(text), bits, None, "text", code)
    return Layout(bits=bits, messages=[])
