"""The windows stage: config -> screened, packed windows and their cuts (written by ``records.py``).

Per domain, in config order: documents in seeded order (``packing.sampled``); chat conversations whose
overlap with calibration exceeds ``screen.max_conversation_fraction`` are dropped before packing; each
packed window whose overlap exceeds ``screen.max_window_fraction`` is rejected and rebuilt from the next
unused documents (the rejection is recorded on the window that replaced it), at most
``screen.max_replacements`` times per domain.

**How the screen is driven (why the stage runs in rounds).** The screen indexes the evaluation side and
streams the calibration data past it (``screen/``), so it needs the n-grams *before* the pass, while
which windows get packed depends on the screen's answers (a rejected window is replaced by later
documents; a dropped conversation shifts everything packed after it). So the stage runs the plain
sequential algorithm above in rounds: a round runs it with the answers known so far, treating an
unresolved conversation or window as clean for now and queueing its n-grams, and packs a few spare
windows past the last one it needs (``spare_windows``) so that replacements are queued too; then one
calibration pass resolves everything queued. A round that met no unresolved n-gram is the sequential
algorithm with exact answers, and its windows, records and statistics are the result. Usually that is
the second round, after a single calibration pass (two when conversations are dropped). Documents read
are kept (:class:`Replay`) and encodings cached, so a round re-reads no source and re-encodes nothing.
An error met in a round that used unresolved answers is not final: the next round decides.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from fideval.config import Config, Domain
from fideval.errors import FidevalError
from fideval.formats.ids import window_id
from fideval.provenance import canonical_hash
from fideval.windows.encode import Encoded, Encoder, load_tokenizer, tokenizer_sha256
from fideval.windows.packing import Window, domain_rng, pack_window, sampled
from fideval.windows.screen.index import Overlap
from fideval.windows.screen.stage import Screen
from fideval.windows.sources import Document, describe, iter_documents
from fideval.windows.tagging import Tagger


@dataclass
class Built:
    """One accepted window (``k``-th of its domain) and the rejected attempts it replaced."""

    domain: str
    k: int
    window: Window
    overlap: Overlap | None
    rejected: list[tuple[Window, Overlap]] = field(default_factory=list)

    @property
    def id(self) -> str:
        return window_id(self.domain, self.k)


@dataclass
class DomainStats:
    documents_read: int = 0
    empty_documents: int = 0
    tokens_read: int = 0
    dropped: list[dict[str, Any]] = field(default_factory=list)


def config_hash(cfg: Config) -> str:
    """Hash of what determines the windows: the windows, domains and screen sections."""
    p = cfg.as_plain()
    return canonical_hash({"windows": p["windows"], "domains": p["domains"], "screen": p["screen"]})


def spare_windows(want: int, max_replacements: int) -> int:
    """Windows packed past the last one a round needs, so that replacements are queued in the same pass."""
    return min(max_replacements, max(2, want // 8))


class Replay:
    """A document stream that can be read again from its start: what was read is kept (the documents of
    a domain that its windows need, plus one sampling block), and so is an error the source raised, which
    is raised again at the same position."""

    def __init__(self, it: Iterable[Document]):
        self.it = iter(it)
        self.cache: list[Document] = []
        self.error: Exception | None = None
        self.done = False

    def __iter__(self) -> Iterator[Document]:
        i = 0
        while True:
            if i < len(self.cache):
                yield self.cache[i]
                i += 1
                continue
            if self.error is not None:
                raise self.error
            if self.done:
                return
            try:
                self.cache.append(next(self.it))
            except StopIteration:
                self.done = True
            except FidevalError as e:
                self.error = e


@dataclass
class Round:
    """What one round of one domain met: answers not resolved yet (queued with the screen)."""

    unresolved: int = 0


def build_domain(dom: Domain, cfg: Config, enc: Encoder, screen: Screen | None, docs: Iterable[Document] | None = None,
                 memo: dict[int, Encoded] | None = None, rnd: Round | None = None,
                 tagger: Tagger | None = None) -> tuple[list[Built], DomainStats]:
    """One domain's windows by the sequential algorithm (module docstring). With a ``queries`` screen an
    answer may be unresolved: it counts as clean in this round (``rnd.unresolved``), and spare windows are
    packed (and queued) after the last one needed. With a ``tagger`` each document's tokens carry their
    classes into the window (``Window.classes``; cached with the encoding)."""
    w, want = cfg.windows.window_tokens, cfg.windows.windows_per_domain
    stats = DomainStats()
    rnd = rnd if rnd is not None else Round()
    memo = memo if memo is not None else {}
    if docs is None:
        docs = sampled(iter_documents(dom.source, f"domains.{dom.name}.source", enc.render), domain_rng(cfg.windows.seed, dom.name))

    def encoded() -> Iterator[tuple[Document, Encoded]]:
        for d in docs:
            stats.documents_read += 1
            if screen is not None and dom.kind == "chat":
                ov = screen.of_text(d.text)
                if ov is None:
                    rnd.unresolved += 1
                elif ov.fraction > screen.cfg.max_conversation_fraction:
                    stats.dropped.append({"source": d.origin, "overlap": ov.fraction, "ngrams": ov.total})
                    continue
            e = memo.get(id(d))
            if e is None:
                e = enc.encode(d.text)
                if tagger is not None:
                    e = replace(e, classes=tagger.tag(d.text, d.messages, dom.name, e.offsets[:, 0], e.offsets[:, 1]))
                memo[id(d)] = e
            stats.tokens_read += int(e.ids.size)
            if e.ids.size == 0:
                stats.empty_documents += 1
                continue
            yield d, e

    stream = encoded()
    built: list[Built] = []
    rejected: list[tuple[Window, Overlap]] = []
    n_rejected = 0
    while len(built) < want:
        win = pack_window(stream, w, enc)
        if win is None:
            raise FidevalError(
                f"domains.{dom.name}: too few tokens: ran out of documents after {len(built)} of {want} windows "
                f"({stats.documents_read} documents, {stats.tokens_read:,} tokens read; {want} x {w:,} tokens asked)",
                hint="add documents, or lower windows_per_domain / window_tokens")
        ov = screen.of_segments(win.segments()) if screen is not None else None
        if screen is not None and ov is None:
            rnd.unresolved += 1
        elif ov is not None and ov.fraction > screen.cfg.max_window_fraction:
            n_rejected += 1
            if n_rejected > screen.cfg.max_replacements:
                raise FidevalError(f"domains.{dom.name}: more than {screen.cfg.max_replacements} windows failed the overlap "
                                   f"screen (> {screen.cfg.max_window_fraction:.1%} of {screen.cfg.ngram}-grams in calibration)",
                                   hint="the domain's source overlaps the calibration data; use another source")
            rejected.append((win, ov))
            continue
        built.append(Built(domain=dom.name, k=len(built), window=win, overlap=ov, rejected=rejected))
        rejected = []
    if rnd.unresolved:  # not final: queue the windows that replacements would come from
        spare = DomainStats()
        stats_final, stats = stats, spare  # what the spares read is not this round's record
        try:
            for _ in range(spare_windows(want, screen.cfg.max_replacements)):
                win = pack_window(stream, w, enc)
                if win is None:
                    break
                screen.of_segments(win.segments())
        except FidevalError:
            pass  # a source error past the needed documents: the round that needs them raises it
        stats = stats_final
    return built, stats


def build(cfg: Config) -> tuple[list[Built], dict[str, Any]]:
    """Build every domain's windows; returns them and the record fields that are not per-window."""
    from fideval.model_source import tokenizer_folder

    tok_dir = tokenizer_folder(cfg.model)
    enc = Encoder(load_tokenizer(tok_dir, cfg.model.trust_remote_code), cfg.windows.separator)
    chat = any(d.kind == "chat" or d.source.messages_field for d in cfg.domains)
    tagger = Tagger(cfg.token_classes, enc.tok, chat)  # the rule checked before any document is read
    screen = Screen.from_config(cfg.screen, enc)
    streams = {dom.name: Replay(sampled(iter_documents(dom.source, f"domains.{dom.name}.source", enc.render),
                                        domain_rng(cfg.windows.seed, dom.name))) for dom in cfg.domains}
    memo: dict[int, Encoded] = {}
    while True:  # rounds (module docstring)
        results: dict[str, tuple[list[Built], DomainStats]] = {}
        unresolved = 0
        for dom in cfg.domains:
            rnd = Round()
            try:
                results[dom.name] = build_domain(dom, cfg, enc, screen, streams[dom.name], memo, rnd, tagger)
            except FidevalError:
                if not rnd.unresolved:
                    raise
            unresolved += rnd.unresolved
        if screen is None or (not unresolved and screen.queries.passes):
            break
        screen.resolve()  # one calibration pass for everything queued (the first pass also checks the sources)
    out: list[Built] = []
    domains: dict[str, Any] = {}
    for dom in cfg.domains:
        built, st = results[dom.name]
        out += built
        domains[dom.name] = {"kind": dom.kind, "source": describe(dom.source), "documents_read": st.documents_read,
                             "empty_documents": st.empty_documents, "tokens_read": st.tokens_read,
                             "documents_used": sum(len(b.window.pieces) for b in built),
                             "windows_rejected": sum(len(b.rejected) for b in built),
                             "conversations_dropped": st.dropped}
    top: dict[str, list[dict]] = {}
    if screen is not None:
        targets = {b.id: b.overlap.matched_hashes for b in out}
        targets |= {f"{b.id}~{i}": ov.matched_hashes for b in out for i, (_, ov) in enumerate(b.rejected)}
        top = screen.attribute(targets)
    meta = {
        "provenance": {"tokenizer_sha256": tokenizer_sha256(tok_dir), "tokenizer_path": str(cfg.model.tokenizer or cfg.model.path),
                       "model_id": cfg.model.id, "model_revision": cfg.model.revision, "config_hash": config_hash(cfg)},
        "domains": domains,
        "screen": screen.record() if screen is not None else None,
        "top": top,
        "token_classes": {**tagger.record(), "rules_sha256": canonical_hash(cfg.token_classes.model_dump(mode="json"))},
    }
    return out, meta

