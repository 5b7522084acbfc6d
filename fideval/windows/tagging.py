"""Token classes of one document: the rule for the tokenizer, character bits, token bits.

A token is of a class when any of its characters is (its offsets from the same encoding the windows use), so a
token that straddles a template newline and the first word of a message is both ``template`` and of the message's
role: the classes say what the token touches, and never pick one side. Token-intrinsic classes (``numeral``,
``latin``, ``non_latin``) come from the token's own characters, for tokens that touch content (the letters of
``<|user|>`` are the template's, not Latin text); ``turn_start`` is the first
``token_classes.turn_tokens`` tokens touching each message's pieces.

The rule is picked once per tokenizer (:func:`pick_rule`); the bad inputs it refuses, each in one line: a named rule
whose match strings are not in the chat template, and a rule marker that occurs in the template but is not one
token of the tokenizer (``marker_tokens: true``).
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

import numpy as np

from fideval.errors import FidevalError
from fideval.formats.classes import BIT
from fideval.windows.class_config import TemplateRule, TokenClassesConfig
from fideval.windows.class_spans import Layout, layout, text_layout

_DIGIT = re.compile(r"\d")
CONTENT = BIT["system"] | BIT["user"] | BIT["assistant"] | BIT["tool"] | BIT["text"]
INTRINSIC = BIT["numeral"] | BIT["latin"] | BIT["non_latin"]
_LETTER = re.compile(r"[^\W\d_]")


def pick_rule(cfg: TokenClassesConfig, tok: Any) -> TemplateRule | None:
    """The rule row for this tokenizer's chat template (None: no template, or no row fits under ``auto``)."""
    template = getattr(tok, "chat_template", None) or ""
    if isinstance(template, dict):  # several named templates: the default one
        template = template.get("default") or next(iter(template.values()), "")
    where = "token_classes.rules"
    if cfg.rules != "auto":
        rule = next((t for t in cfg.templates if t.name == cfg.rules), None)
        if rule is None:
            raise FidevalError(f"{where}: no template rule named '{cfg.rules}' (rules: "
                               f"{', '.join(t.name for t in cfg.templates)})", hint="name a row of token_classes.templates, or auto")
        missing = [m for m in rule.match if m not in template]
        if missing:
            raise FidevalError(f"{where}: rule '{rule.name}' does not fit the tokenizer's chat template: its marker "
                               f"{missing[0]!r} is not found in it",
                               hint="use rules: auto, or a template row whose match strings the template holds")
    else:
        rule = next((t for t in cfg.templates if template and all(m in template for m in t.match)), None)
    if rule is not None and rule.marker_tokens:
        for m in rule.think + rule.tool_call:
            if m in template and len(tok(m, add_special_tokens=False, verbose=False)["input_ids"]) != 1:
                raise FidevalError(f"token_classes.templates[{rule.name}]: marker {m!r} is not a token of the tokenizer "
                                   f"{getattr(tok, 'name_or_path', '') or ''}".rstrip(),
                                   hint="fix the marker, or set marker_tokens: false for a template whose markers are plain text")
    return rule


def _script_and_digits(text: str, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """numeral / latin / non_latin bits per token, from its characters."""
    out = np.zeros(starts.size, dtype=np.int32)
    for i, (s, e) in enumerate(zip(starts.tolist(), ends.tolist())):
        t = text[s:e]
        if _DIGIT.search(t):
            out[i] |= BIT["numeral"]
        letters = _LETTER.findall(t)
        if not letters:
            continue
        if t.isascii() or all(unicodedata.name(c, "").startswith("LATIN") for c in letters):
            out[i] |= BIT["latin"]
        else:
            out[i] |= BIT["non_latin"]
    return out


def token_bits(text: str, lay: Layout | None, starts: np.ndarray, ends: np.ndarray, turn_tokens: int) -> np.ndarray:
    """Bits per token from the character layout (None: an unlocatable conversation, ``unknown``)."""
    n = starts.size
    s = np.clip(starts, 0, len(text))
    e = np.clip(np.maximum(ends, starts + 1), 0, len(text))
    out = _script_and_digits(text, s, e)
    if lay is None:
        return out | BIT["unknown"]
    present = int(np.bitwise_or.reduce(lay.bits)) if lay.bits.size else 0
    for bit in (1 << b for b in range(31) if present >> b & 1):
        cs = np.concatenate([[0], np.cumsum((lay.bits & bit) != 0)])
        out[(cs[e] - cs[s]) > 0] |= bit
    out[(out & CONTENT) == 0] &= ~INTRINSIC  # a template token's letters are the template's, not a script's
    s_sorted, e_sorted = np.maximum.accumulate(s) if n else s, np.maximum.accumulate(e) if n else e
    for spans in lay.messages:
        if not spans:
            continue
        a, b = spans[0][0], spans[-1][1]
        lo, hi = int(np.searchsorted(e_sorted, a, side="right")), int(np.searchsorted(s_sorted, b, side="left"))
        inside = [k for k in range(lo, min(hi, n)) if any(s[k] < y and e[k] > x for x, y in spans)]
        out[inside[:turn_tokens]] |= BIT["turn_start"]
    return out


class Tagger:
    """Classes of every document of a run, for one tokenizer and the ``token_classes`` config."""

    def __init__(self, cfg: TokenClassesConfig, tok: Any, chat: bool):
        self.cfg = cfg
        self.rule = pick_rule(cfg, tok) if chat else None
        self.code_domains = set(cfg.code_domains)

    def record(self) -> dict[str, Any]:
        return {"rule": self.rule.model_dump(mode="json") if self.rule is not None else None,
                "turn_tokens": self.cfg.turn_tokens, "code_domains": sorted(self.code_domains)}

    def tag(self, text: str, messages: list | None, domain: str, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        code = domain in self.code_domains
        lay = text_layout(text, code) if messages is None else layout(text, messages, self.rule, code)
        return token_bits(text, lay, starts, ends, self.cfg.turn_tokens)
