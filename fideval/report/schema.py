"""Reading report.json: its model is ``fideval.formats.report`` (docs/formats-report.md); plain JSON values.

``card`` and ``check`` refuse a report of another version with one line: figures and their meaning may
change between versions, and a card must never silently mislabel a number.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from fideval.errors import FidevalError
from fideval.formats import nesting
from fideval.formats.model import parse
from fideval.formats.report import Report

FORMAT = Report.FORMAT
VERSION = Report.VERSION


def plain(obj: Any, where: str = "report") -> Any:
    """Convert numpy scalars/arrays to plain Python; a non-finite float is a bug, not data."""
    if isinstance(obj, dict):
        return {str(k): plain(v, f"{where}.{k}") for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, np.ndarray):
        return plain(obj.tolist(), where)
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        v = float(obj)
        if not math.isfinite(v):
            raise ValueError(f"non-finite value at {where}")
        return v
    return obj


def validate(obj: Any, origin: str) -> dict[str, Any]:
    """Check ``obj`` against the :class:`~fideval.formats.report.Report` model (format, version, the keys
    card and check rely on, their types); one-line FidevalError otherwise. Returns ``obj`` itself."""
    parse(Report, obj, origin)
    return obj


def load_report(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if path.is_dir():
        path = path / "report.json"
    try:
        obj = nesting.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FidevalError(f"report {path} not found", hint="run 'fideval report' first") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FidevalError(
            f"{path} is not readable JSON ({type(e).__name__})", hint="regenerate it with 'fideval report'"
        ) from None
    return validate(obj, str(path))
