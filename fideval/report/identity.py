"""What a candidate is, as report.json records it: the identity fields of its score.json ``candidate_info``.

Every records folder of one candidate must describe the same build: a report that merged folders scored
from two quant specs, two checkpoints or two stores under one name would print one build's name over
another's numbers. So the fields that name the build are compared across folders and a difference is a
one-line error; what legitimately differs by path or run (activations, run settings) is left out.
"""

from __future__ import annotations

import json
from typing import Any

from fideval.errors import FidevalError

PER_RUN = ("activations", "run_settings")


def candidate_identity(candidate: str, parts: list[tuple[str, dict[str, Any] | None]]) -> dict[str, Any] | None:
    """The candidate's identity from ``[(folder, candidate_info)]``; None when no folder records one (records
    written by hand, or scored by an older fideval)."""
    seen: dict[str, tuple[str, dict[str, Any]]] = {}
    for folder, info in parts:
        if not info:
            continue
        ident = {k: v for k, v in info.items() if k not in PER_RUN}
        seen.setdefault(json.dumps(ident, sort_keys=True), (folder, ident))
    if len(seen) > 1:
        (f1, a), (f2, b) = list(seen.values())[:2]
        diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        raise FidevalError(
            f"candidate {candidate!r}: {f1} and {f2} were scored from different builds (they differ in {', '.join(diff)})",
            hint="give each build its own candidate name, or re-score the stale folders",
        )
    return next(iter(seen.values()))[1] if seen else None
