"""The screen as the windows stage uses it: wire the calibration sources and the tokenizer to the index,
measure a conversation or a window, attribute matches. (The n-gram rule is ``ngrams.py``, the index
``index.py``, the calibration pass ``scan.py``.)

The evaluation side is indexed (``index.Queries``): :meth:`Screen.of_text` and :meth:`Screen.of_segments`
answer ``None`` for n-grams not resolved yet and queue them; :meth:`Screen.resolve` streams the calibration
sources once for everything queued, and attribution comes from the same passes. Calibration memory is one
batch. ``fideval windows`` drives it in rounds (``build.py``); ``fideval screen`` queues every built window,
resolves once, then reads the answers.
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
from fideval.windows.screen.index import Overlap, Queries
from fideval.windows.screen.ngrams import Hasher
from fideval.windows.screen.scan import rank
from fideval.windows.sources import Document, describe, iter_documents


def calibration_documents(cfg: ScreenConfig, enc: Encoder) -> Iterator[Document]:
    for i, src in enumerate(cfg.calibration):
        yield from iter_documents(src, f"screen.calibration[{i}]", enc.render)


@dataclass
class Screen:
    cfg: ScreenConfig
    enc: Encoder
    hasher: Hasher
    queries: Queries

    @classmethod
    def from_config(cls, cfg: ScreenConfig, enc: Encoder) -> "Screen | None":
        """``None`` when no calibration is configured (screening skipped); an error when it is configured
        but yields nothing to screen against ("no documents" is found out by reading the first one, "no
        n-gram" by the first pass)."""
        if not cfg.calibration:
            return None
        hasher = Hasher(unit=cfg.unit, n=cfg.ngram, encode=enc.ids)
        first = calibration_documents(cfg, enc)
        empty = next(first, None) is None
        first.close()
        if empty:
            raise _no_documents()
        return cls(cfg=cfg, enc=enc, hasher=hasher, queries=Queries(hasher))

    def of_text(self, text: str) -> Overlap | None:
        """The overlap of one document's text (``None`` until resolved)."""
        h, _ = self.hasher.of_texts([text])
        return self.queries.overlap(h)

    def of_segments(self, segments: Sequence[np.ndarray]) -> Overlap | None:
        """The overlap of a window's document segments (``None`` until resolved)."""
        h, _ = self.hasher.of_tokens(list(segments), self.enc.decode)
        return self.queries.overlap(h)

    def resolve(self) -> bool:
        """One calibration pass for every n-gram queued so far (none if nothing is queued after the first).
        True if a pass was made."""
        with progress(f"calibration pass {self.queries.passes + 1}", unit="chars") as bar:
            docs = ((d.origin, d.text) for d in calibration_documents(self.cfg, self.enc))
            res = self.queries.resolve(docs, on_batch=bar.advance)
        if res is not None:
            _check(self.cfg, res.documents, res.ngrams)
        return res is not None

    def attribute(self, targets: dict[str, np.ndarray], top_k: int = 3) -> dict[str, list[dict]]:
        if not any(v.size for v in targets.values()):
            return {}
        q = self.queries
        return rank(q.pair_doc, q.pair_hash, q.origins, targets, top_k)

    @property
    def documents(self) -> int:
        return self.queries.documents

    def record(self) -> dict[str, Any]:
        return {"status": "applied", "unit": self.cfg.unit, "ngram": self.cfg.ngram,
                "max_window_fraction": self.cfg.max_window_fraction,
                "max_conversation_fraction": self.cfg.max_conversation_fraction,
                "calibration": {"sources": [describe(s) for s in self.cfg.calibration],
                                "documents": self.queries.documents, "ngrams": self.queries.ngrams,
                                # the screen never holds the calibration set, so cannot count it (v2)
                                "distinct_ngrams": None}}


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
