"""Seeded document order and window packing for one domain.

**Order.** Documents are read in stream order in blocks of ``BLOCK`` (8,192) rows and each block is
permuted by ``numpy.random.default_rng([seed, crc32(domain)])``; blocks are consumed in order. For a
source of at most 8,192 documents this is a uniform seeded permutation; for a large (streaming) source
the windows come from its first blocks, a deliberate trade for bounded memory and no full pass over a
multi-terabyte split. Seeding by domain name keeps a domain's windows unchanged when domains are
added or reordered.

**Packing.** A window is filled with whole documents in that order, each wrapped by the separator
tokens (:class:`~fideval.windows.encode.Encoder`). The document that crosses the window's end is
**truncated** there (recorded as ``truncated`` with the characters kept); its remainder is discarded,
and the next window starts with the next document: no document is ever used in two windows of a run.
Documents of zero tokens are skipped. Documents of a rejected window (overlap screen) are not reused.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import numpy as np

from fideval.formats.classes import BIT
from fideval.windows.encode import Encoded, Encoder
from fideval.windows.sources import Document

BLOCK = 8192
SEPARATOR = BIT["separator"]


def domain_rng(seed: int, domain: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(domain.encode("utf-8"))])


def sampled(docs: Iterable[Document], rng: np.random.Generator, block: int = BLOCK) -> Iterator[Document]:
    it = iter(docs)
    while blk := list(islice(it, block)):
        for i in rng.permutation(len(blk)):
            yield blk[int(i)]


@dataclass
class Piece:
    """One document's part of a window: its content tokens sit at window positions [start, end)."""

    origin: dict[str, Any]
    start: int
    end: int
    chars: tuple[int, int]
    doc_chars: int
    truncated: bool

    def record(self) -> dict[str, Any]:
        return {"source": self.origin, "tokens": [self.start, self.end], "chars": list(self.chars),
                "document_chars": self.doc_chars, "truncated": self.truncated}


@dataclass
class Window:
    tokens: np.ndarray  # int32 [window_tokens]
    pieces: list[Piece] = field(default_factory=list)
    classes: np.ndarray | None = None  # int32 [window_tokens]: token class bits (fideval.formats.classes), when tagged

    def segments(self) -> list[np.ndarray]:
        """Each document's content tokens (separators excluded): the units the screen hashes."""
        return [self.tokens[p.start:p.end] for p in self.pieces if p.end > p.start]


def pack_window(docs: Iterator[tuple[Document, Encoded]], length: int, enc: Encoder) -> Window | None:
    """Fill one window of ``length`` tokens from ``docs``; ``None`` when the documents run out first."""
    buf = np.empty(length, dtype=np.int32)
    cls = np.zeros(length, dtype=np.int32)
    pieces: list[Piece] = []
    pos = 0
    for doc, e in docs:
        seg = np.concatenate([np.asarray(enc.prefix, np.int32), e.ids, np.asarray(enc.suffix, np.int32)])
        take = min(seg.size, length - pos)
        buf[pos:pos + take] = seg[:take]
        if e.classes is not None:  # separators are of class separator, the document's tokens of theirs
            sep = np.full(len(enc.prefix), SEPARATOR, np.int32), np.full(len(enc.suffix), SEPARATOR, np.int32)
            cls[pos:pos + take] = np.concatenate([sep[0], e.classes, sep[1]])[:take]
        c0 = pos + len(enc.prefix)
        k = max(0, min(e.ids.size, take - len(enc.prefix)))  # content tokens that fit
        chars = int(e.char_ends[k - 1]) if k else 0
        pieces.append(Piece(origin=doc.origin, start=min(c0, pos + take), end=min(c0, pos + take) + k,
                            chars=(0, chars), doc_chars=len(doc.text), truncated=take < seg.size))
        pos += take
        if pos == length:
            return Window(tokens=buf, pieces=pieces, classes=cls)
    return None
