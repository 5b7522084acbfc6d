"""The screen as the windows stage uses it: build the calibration index from the config, measure a
conversation or a window, attribute matches. (The index and the n-gram rule live in ``overlap.py`` and
``ngrams.py``; this module only wires them to config sources and the tokenizer.)
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
from fideval.windows.overlap import CalibrationIndex, Hasher, Overlap, attribute, overlap_of
from fideval.windows.sources import Document, describe, iter_documents


def calibration_documents(cfg: ScreenConfig, enc: Encoder) -> Iterator[Document]:
    for i, src in enumerate(cfg.calibration):
        yield from iter_documents(src, f"screen.calibration[{i}]", enc.render)


@dataclass
class Screen:
    cfg: ScreenConfig
    enc: Encoder
    hasher: Hasher
    index: CalibrationIndex

    @classmethod
    def from_config(cls, cfg: ScreenConfig, enc: Encoder) -> "Screen | None":
        """``None`` when no calibration is configured (screening skipped); an error when it is configured
        but yields nothing to screen against."""
        if not cfg.calibration:
            return None
        hasher = Hasher(unit=cfg.unit, n=cfg.ngram, encode=enc.ids)
        with progress("calibration index", unit="chars") as bar:
            index = CalibrationIndex.build((d.text for d in calibration_documents(cfg, enc)), hasher,
                                           on_batch=bar.advance)
        if index.documents == 0:
            raise FidevalError("screen.calibration: the calibration sources yield no documents",
                               hint="fix the calibration paths/fields, or remove screen.calibration to skip screening")
        if index.hashes.size == 0:
            raise FidevalError(f"screen.calibration: {index.documents} calibration documents hold no {cfg.ngram}-gram "
                               f"of {cfg.unit} (all too short)", hint="check the calibration field")
        return cls(cfg=cfg, enc=enc, hasher=hasher, index=index)

    def of_text(self, text: str) -> Overlap:
        h, _ = self.hasher.of_texts([text])
        return overlap_of(h, self.index)

    def of_segments(self, segments: Sequence[np.ndarray]) -> Overlap:
        h, _ = self.hasher.of_tokens(list(segments), self.enc.decode)
        return overlap_of(h, self.index)

    def attribute(self, targets: dict[str, np.ndarray], top_k: int = 3) -> dict[str, list[dict]]:
        if not any(v.size for v in targets.values()):
            return {}
        docs = ((d.origin, d.text) for d in calibration_documents(self.cfg, self.enc))
        return attribute(docs, targets, self.hasher, top_k=top_k)

    def record(self) -> dict[str, Any]:
        return {"status": "applied", "unit": self.cfg.unit, "ngram": self.cfg.ngram,
                "max_window_fraction": self.cfg.max_window_fraction,
                "max_conversation_fraction": self.cfg.max_conversation_fraction,
                "calibration": {"sources": [describe(s) for s in self.cfg.calibration],
                                "documents": self.index.documents, "ngrams": self.index.ngrams,
                                "distinct_ngrams": int(self.index.hashes.size)}}


def skipped_record(cfg: ScreenConfig) -> dict[str, Any]:
    return {"status": "skipped", "reason": "no screen.calibration configured", "unit": cfg.unit, "ngram": cfg.ngram}


def overlap_record(ov: Overlap | None, top: list[dict] | None) -> dict[str, Any] | None:
    if ov is None:
        return None
    return {"fraction": ov.fraction, "ngrams": ov.total, "matched": ov.matched, "top_calibration": top or []}
