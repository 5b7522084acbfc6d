"""What produced an artifact: fideval version, git commit, config hash, file hashes.

Every artifact carries this block so that a published number can be traced to code, model and data.
"""

from __future__ import annotations

import functools
import hashlib
import json
import platform
import subprocess
from pathlib import Path
from typing import Any

from fideval import __version__


@functools.cache
def git_commit() -> str | None:
    """The commit of the fideval checkout this code runs from (``None`` when installed from a wheel)."""
    here = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    sha = out.stdout.strip()
    return sha if out.returncode == 0 and len(sha) == 40 else None


def canonical_hash(obj: Any) -> str:
    """SHA-256 of the canonical JSON of ``obj`` (sorted keys, no whitespace): the config hash."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def tool_block() -> dict[str, Any]:
    return {
        "name": "fideval",
        "version": __version__,
        "git_commit": git_commit(),
        "python": platform.python_version(),
    }
