"""report.json's format name, version and structural validation (docs/formats-report.md).

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

FORMAT = "fideval.report"
VERSION = 1
TOP_KEYS = (
    "format",
    "version",
    "settings",
    "provenance",
    "results",
    "comparisons",
    "checks",
    "gates",
    "plots",
)
SETTINGS_KEYS = ("resamples", "seed", "confidence", "quantiles", "quantile_method", "clusters", "domains")
PROVENANCE_KEYS = ("reference", "base_model", "dataset", "tool", "config_hash")
RESULT_KEYS = (
    "candidate",
    "path",
    "length",
    "rows",
    "clusters",
    "overall",
    "domains",
    "positions",
    "confidence_buckets",
)


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
    """Check format, version and the keys card/check rely on; one-line FidevalError otherwise."""
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        fmt = obj.get("format") if isinstance(obj, dict) else None
        raise FidevalError(
            f"{origin} is not a fideval report (format {fmt!r})",
            hint="pass the report.json 'fideval report' wrote",
        )
    v = obj.get("version")
    if v != VERSION:
        age = (
            "an older"
            if isinstance(v, int) and v < VERSION
            else "a newer" if isinstance(v, int) else "an unknown"
        )
        raise FidevalError(
            f"{origin} has report format version {v!r} ({age} fideval); this fideval reads version {VERSION}",
            hint=(
                "upgrade fideval"
                if age == "a newer"
                else "regenerate it with 'fideval report' of this version"
            ),
        )
    for k in TOP_KEYS:
        if k not in obj:
            raise FidevalError(f"{origin}: missing key '{k}'", hint="regenerate it with 'fideval report'")
    for section, keys in (("settings", SETTINGS_KEYS), ("provenance", PROVENANCE_KEYS)):
        for k in keys:
            if not isinstance(obj[section], dict) or k not in obj[section]:
                raise FidevalError(
                    f"{origin}: missing key '{section}.{k}'", hint="regenerate it with 'fideval report'"
                )
    for i, r in enumerate(obj["results"]):
        for k in RESULT_KEYS:
            if k not in r:
                raise FidevalError(
                    f"{origin}: results[{i}] is missing key '{k}'", hint="regenerate it with 'fideval report'"
                )
    return obj


def load_report(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if path.is_dir():
        path = path / "report.json"
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FidevalError(f"report {path} not found", hint="run 'fideval report' first") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FidevalError(
            f"{path} is not readable JSON ({type(e).__name__})", hint="regenerate it with 'fideval report'"
        ) from None
    return validate(obj, str(path))
