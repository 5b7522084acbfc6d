"""The 13-gram overlap screen of the windows stage: n-gram hashes (``ngrams``, compiled in ``hashing``), the
evaluation-side index (``index``), the streamed calibration pass (``scan``), the screen as the stage applies
it (``stage``) and ``fideval screen``'s re-screen report (``report``)."""

from fideval.windows.screen.index import Overlap, Probe, Queries
from fideval.windows.screen.ngrams import Hasher
from fideval.windows.screen.report import ScreenRow, ScreenSummary, report_lines, rescreen
from fideval.windows.screen.scan import Scan, rank
from fideval.windows.screen.stage import Screen, overlap_record, skipped_record

__all__ = ["Hasher", "Overlap", "Probe", "Queries", "Scan", "Screen", "ScreenRow", "ScreenSummary", "overlap_record",
           "rank", "report_lines", "rescreen", "skipped_record"]
