"""``eval-windows.json`` (format ``fideval.eval-windows`` v2, v1 still read): the windows stage's record.

Written by ``fideval.windows.records`` (through :class:`EvalWindows`, so a file it writes is one its readers
take), read back whole by ``fideval screen`` and, as a :class:`Listing`, by ``fideval report`` for each
window's domain and token SHA-256 and the domains' sources.

The report has always taken thinner files than the stage writes (a records set from elsewhere, with a
hand-made windows file): ``windows`` as a list of objects with ``id`` or ``window_id``, a token hash under
``sha256``, ``token_sha256`` or ``tokens_sha256``, or as an object keyed by window id. :func:`listing` keeps
all of those and reads them into one shape; what it adds is that the file must name its format and a
version this fideval reads, as every other fideval file does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fideval.errors import FidevalError
from fideval.formats.model import Model, key, parse

FILE = "eval-windows.json"
_HINT = "rebuild the windows with this fideval"
_SHA_KEYS = ("token_sha256", "tokens_sha256", "sha256")  # the first that is a string


@dataclass(frozen=True, kw_only=True)
class WindowsSettings(Model):
    HINT = _HINT

    window_tokens: int = key("tokens per window W")
    cut_tokens: int = key("tokens per cut C (C divides W)")
    separator: str = key("`eos`, `bos`, `bos_eos` or `none`")
    windows_per_domain: int | None = key("windows per domain", default=None)
    seed: int | None = key("the packing seed", default=None)

    def problem(self) -> str | None:
        if self.cut_tokens < 1 or self.window_tokens % self.cut_tokens:
            return f"cut_tokens {self.cut_tokens} does not divide window_tokens {self.window_tokens}"
        return None


@dataclass(frozen=True, kw_only=True)
class Document(Model):
    HINT = _HINT

    source: dict[str, Any] = key("where the document came from: `file` + `line` or `row`, or `dataset`, "
                                 "`config`, `revision`, `split`, `row`")
    tokens: list[int] = key("the document's content tokens in the window, `[start, end)`")
    chars: list[int] = key("the characters of the document text those tokens cover, `[start, end)`")
    document_chars: int = key("the document's length in characters")
    truncated: bool = key("true when the window's end cut the document")


@dataclass(frozen=True, kw_only=True)
class Cut(Model):
    HINT = _HINT

    id: str = key("`<window id>.c<j>`")
    start: int = key("first window position of the cut")
    end: int = key("one past its last position")
    sha256: str = key("SHA-256 of the cut's tokens (little-endian int32)")


@dataclass(frozen=True, kw_only=True)
class Replacement(Model):
    HINT = _HINT

    reason: str = key("`overlap`")
    sha256: str = key("SHA-256 of the rejected window's tokens")
    documents: list[Document] = key("its documents")
    overlap: dict[str, Any] | None = key("its overlap, as a window's")


@dataclass(frozen=True, kw_only=True)
class Window(Model):
    HINT = _HINT

    id: str = key("`<domain>-<k:03d>`")
    domain: str = key("its domain")
    tokens: int = key("its length W")
    sha256: str = key("SHA-256 of its tokens (little-endian int32)")
    documents: list[Document] = key("the documents packed into it, in order")
    overlap: dict[str, Any] | None = key("`fraction`, `ngrams`, `matched`, `top_calibration`; null when "
                                         "screening was skipped")
    replacements: list[Replacement] = key("windows rejected for this slot before this one was accepted")
    cuts: list[Cut] = key("its cuts, in order")


@dataclass(frozen=True, kw_only=True)
class EvalWindows(Model):
    FORMAT = "fideval.eval-windows"
    VERSION = 2  # v2: screen.calibration.distinct_ngrams may be null
    READABLE = (1, 2)  # v1 differs only in that field, so it is still read
    KIND = "eval-windows"
    HINT = _HINT

    format: str = key("`fideval.eval-windows`", default=FORMAT)
    version: int = key("`2` (`1` is still read)", default=VERSION)
    windows_config: WindowsSettings = key("the config's `windows` block")
    windows: list[Window] = key("every window, in config domain order")
    provenance: dict[str, Any] | None = key("`tokenizer_sha256`, `tokenizer_path`, `model_id`, `model_revision`, "
                                            "`config_hash`, `tool`", default=None)
    screen: dict[str, Any] | None = key("the overlap screen's settings and calibration, or `{status: skipped, "
                                        "reason}`", default=None)
    domains: dict[str, dict[str, Any]] | None = key("per domain: kind, source, documents and tokens read, "
                                                    "windows rejected, conversations dropped", default=None)


@dataclass(frozen=True, kw_only=True)
class WindowRef(Model):
    HINT = _HINT

    id: str = key("window id (`window_id` is read too)")
    domain: str | None = key("its domain (absent: the id up to its last `-`)", default=None)
    sha256: str | None = key("SHA-256 of its tokens (read from `token_sha256`, `tokens_sha256` or `sha256`)",
                             default=None)


@dataclass(frozen=True, kw_only=True)
class Listing(Model):
    """What ``fideval report`` reads of an eval-windows.json (the writer's file or a thinner one)."""

    FORMAT = EvalWindows.FORMAT
    VERSION = EvalWindows.VERSION
    READABLE = EvalWindows.READABLE
    KIND = EvalWindows.KIND
    HINT = _HINT

    format: str = key("`fideval.eval-windows`", default=FORMAT)
    version: int = key("`2` (`1` is still read)", default=VERSION)
    windows: list[WindowRef] = key("the windows: a list, or an object keyed by window id")
    domains: dict[str, Any] | None = key("per domain; `domains.<name>.source` is the dataset source",
                                         default=None)
    provenance: dict[str, Any] | None = key("as in the stage's file", default=None)


def listing(obj: Any, origin: str) -> Listing:
    """``obj`` (a decoded eval-windows.json) as a :class:`Listing`, its windows' older shapes read as one."""
    raw = obj.get("windows") if isinstance(obj, dict) else None
    if isinstance(raw, dict):
        raw = [{"id": k, **v} if isinstance(v, dict) else v for k, v in raw.items()]
    if isinstance(raw, list):
        refs = []
        for i, w in enumerate(raw):
            if not isinstance(w, dict):
                raise FidevalError(f"{origin}: 'windows[{i}]' is not a JSON object", hint=_HINT)
            ref = {"id": w.get("id", w.get("window_id")), "sha256": next(
                (w[k] for k in _SHA_KEYS if isinstance(w.get(k), str)), None)}
            refs.append(ref | ({"domain": w["domain"]} if "domain" in w else {}))
        obj = {**obj, "windows": refs}
    return parse(Listing, obj, origin)
