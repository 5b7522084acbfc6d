"""The windows stage: config -> screened, packed windows and their cuts (written by ``records.py``).

Per domain, in config order: documents in seeded order (``packing.sampled``); chat conversations whose
overlap with calibration exceeds ``screen.max_conversation_fraction`` are dropped before packing; each
packed window whose overlap exceeds ``screen.max_window_fraction`` is rejected and rebuilt from the next
unused documents (the rejection is recorded on the window that replaced it), at most
``screen.max_replacements`` times per domain.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from fideval.config import Config, Domain, resolve_path
from fideval.errors import FidevalError
from fideval.provenance import canonical_hash
from fideval.windows.encode import Encoded, Encoder, load_tokenizer, tokenizer_sha256
from fideval.windows.overlap import Overlap
from fideval.windows.packing import Window, domain_rng, pack_window, sampled
from fideval.windows.screen import Screen
from fideval.windows.sources import Document, describe, iter_documents


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
        return f"{self.domain}-{self.k:03d}"


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


def build_domain(dom: Domain, cfg: Config, enc: Encoder, screen: Screen | None) -> tuple[list[Built], DomainStats]:
    w, want = cfg.windows.window_tokens, cfg.windows.windows_per_domain
    stats = DomainStats()
    docs = sampled(iter_documents(dom.source, f"domains.{dom.name}.source", enc.render), domain_rng(cfg.windows.seed, dom.name))

    def encoded() -> Iterator[tuple[Document, Encoded]]:
        for d in docs:
            stats.documents_read += 1
            if screen is not None and dom.kind == "chat":
                ov = screen.of_text(d.text)
                if ov.fraction > screen.cfg.max_conversation_fraction:
                    stats.dropped.append({"source": d.origin, "overlap": ov.fraction, "ngrams": ov.total})
                    continue
            e = enc.encode(d.text)
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
        if ov is not None and ov.fraction > screen.cfg.max_window_fraction:
            n_rejected += 1
            if n_rejected > screen.cfg.max_replacements:
                raise FidevalError(f"domains.{dom.name}: more than {screen.cfg.max_replacements} windows failed the overlap "
                                   f"screen (> {screen.cfg.max_window_fraction:.1%} of {screen.cfg.ngram}-grams in calibration)",
                                   hint="the domain's source overlaps the calibration data; use another source")
            rejected.append((win, ov))
            continue
        built.append(Built(domain=dom.name, k=len(built), window=win, overlap=ov, rejected=rejected))
        rejected = []
    return built, stats


def build(cfg: Config) -> tuple[list[Built], dict[str, Any]]:
    """Build every domain's windows; returns them and the record fields that are not per-window."""
    tok_dir = resolve_path(cfg.model.tokenizer or cfg.model.path)
    enc = Encoder(load_tokenizer(tok_dir, cfg.model.trust_remote_code), cfg.windows.separator)
    screen = Screen.from_config(cfg.screen, enc)
    out: list[Built] = []
    domains: dict[str, Any] = {}
    for dom in cfg.domains:
        built, st = build_domain(dom, cfg, enc, screen)
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
    }
    return out, meta

