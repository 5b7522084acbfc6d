"""The screen as the windows stage uses it: wire the calibration sources and the tokenizer to the index,
measure a conversation or a window, attribute matches. (The index and the n-gram rule live in
``overlap.py`` and ``ngrams.py``.)

Two modes, the same fractions (see ``overlap.py``):

* ``queries`` (``fideval windows``): the evaluation side is indexed. :meth:`Screen.of_text` and
  :meth:`Screen.of_segments` answer ``None`` for n-grams not resolved yet and queue them;
  :meth:`Screen.resolve` streams the calibration sources once for everything queued. Attribution comes
  from the same passes. Calibration memory is one batch.
* ``full``: every calibration n-gram in one sorted array, built up front, for callers that ask about
  n-grams not known before a pass; attribution is a second pass. (``fideval screen`` knows all its windows
  up front, so it uses ``queries`` too: queue them all, one pass, then read the answers.)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fideval.config import ScreenConfig
from fideval.errors import FidevalError
from fideval.progress import progress
from fideval.windows.encode import Encoder
from fideval.windows.overlap import CalibrationIndex, Hasher, Overlap, Queries, attribute, overlap_of, rank
from fideval.windows.sources import Document, describe, iter_documents


def calibration_documents(cfg: ScreenConfig, enc: Encoder) -> Iterator[Document]:
    for i, src in enumerate(cfg.calibration):
        yield from iter_documents(src, f"screen.calibration[{i}]", enc.render)


@dataclass
class Screen:
    cfg: ScreenConfig
    enc: Encoder
    hasher: Hasher
    index: CalibrationIndex | None = None  # mode "full"
    queries: Queries | None = None  # mode "queries"

    @classmethod
    def from_config(cls, cfg: ScreenConfig, enc: Encoder, *, mode: str = "full") -> "Screen | None":
        """``None`` when no calibration is configured (screening skipped); an error when it is configured
        but yields nothing to screen against (in mode ``queries``, "no documents" is found out by reading
        the first one; "no n-gram" by the first pass)."""
        if not cfg.calibration:
            return None
        hasher = Hasher(unit=cfg.unit, n=cfg.ngram, encode=enc.ids)
        if mode == "queries":
            first = calibration_documents(cfg, enc)
            empty = next(first, None) is None
            first.close()
            if empty:
                raise _no_documents()
            return cls(cfg=cfg, enc=enc, hasher=hasher, queries=Queries(hasher))
        with progress("calibration index", unit="chars") as bar:
            index = CalibrationIndex.build((d.text for d in calibration_documents(cfg, enc)), hasher,
                                           on_batch=bar.advance)
        _check(cfg, index.documents, index.hashes.size)
        return cls(cfg=cfg, enc=enc, hasher=hasher, index=index)

    def _overlap(self, h: np.ndarray) -> Overlap | None:
        if self.queries is not None:
            return self.queries.overlap(h)
        return overlap_of(h, self.index)

    def of_text(self, text: str) -> Overlap | None:
        """The overlap of one document's text (mode ``queries``: ``None`` until resolved)."""
        h, _ = self.hasher.of_texts([text])
        return self._overlap(h)

    def of_segments(self, segments: Sequence[np.ndarray]) -> Overlap | None:
        """The overlap of a window's document segments (mode ``queries``: ``None`` until resolved)."""
        h, _ = self.hasher.of_tokens(list(segments), self.enc.decode)
        return self._overlap(h)

    def resolve(self) -> bool:
        """Mode ``queries``: one calibration pass for every n-gram queued so far (none if nothing is queued
        after the first). True if a pass was made."""
        assert self.queries is not None
        docs = ((d.origin, d.text) for d in calibration_documents(self.cfg, self.enc))
        with progress(f"calibration pass {self.queries.passes + 1}", unit="chars") as bar:
            res = self.queries.resolve(docs, on_batch=bar.advance)
        if res is not None:
            _check(self.cfg, res.documents, res.ngrams)
        return res is not None

    def attribute(self, targets: dict[str, np.ndarray], top_k: int = 3) -> dict[str, list[dict]]:
        if not any(v.size for v in targets.values()):
            return {}
        if self.queries is not None:
            q = self.queries
            return rank(q.pair_doc, q.pair_hash, q.origins, targets, top_k)
        docs = ((d.origin, d.text) for d in calibration_documents(self.cfg, self.enc))
        return attribute(docs, targets, self.hasher, top_k=top_k)

    @property
    def documents(self) -> int:
        return self.index.documents if self.index is not None else self.queries.documents

    def record(self) -> dict[str, Any]:
        src = self.index if self.index is not None else self.queries
        return {"status": "applied", "unit": self.cfg.unit, "ngram": self.cfg.ngram,
                "max_window_fraction": self.cfg.max_window_fraction,
                "max_conversation_fraction": self.cfg.max_conversation_fraction,
                "calibration": {"sources": [describe(s) for s in self.cfg.calibration],
                                "documents": src.documents, "ngrams": src.ngrams,
                                # the windows stage never holds the calibration set, so cannot count it
                                "distinct_ngrams": int(self.index.hashes.size) if self.index is not None else None}}


def _no_documents() -> FidevalError:
    return FidevalError("screen.calibration: the calibration sources yield no documents",
                        hint="fix the calibration paths/fields, or remove screen.calibration to skip screening")


def _check(cfg: ScreenConfig, documents: int, ngrams: int) -> None:
    if documents == 0:
        raise _no_documents()
    if ngrams == 0:
        raise FidevalError(f"screen.calibration: {documents} calibration documents hold no {cfg.ngram}-gram "
                           f"of {cfg.unit} (all too short)", hint="check the calibration field")


def skipped_record(cfg: ScreenConfig) -> dict[str, Any]:
    return {"status": "skipped", "reason": "no screen.calibration configured", "unit": cfg.unit, "ngram": cfg.ngram}


def overlap_record(ov: Overlap | None, top: list[dict] | None) -> dict[str, Any] | None:
    if ov is None:
        return None
    return {"fraction": ov.fraction, "ngrams": ov.total, "matched": ov.matched, "top_calibration": top or []}
