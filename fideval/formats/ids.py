"""The sequence-id grammar: what every window and cut is called, in files, records and workflow targets.

A window of domain ``d`` is ``d-KKK`` (its index in the domain, three digits at least); its cuts are
``d-KKK.cJ``. Ids become file names (``shards/<id>.safetensors``), so they are kept to letters, digits and
``._-``, never start with a dot and hold no ``..``. The workflow (``workflow/rules/common.smk``) names its
targets with the same functions, so a rule's declared outputs are exactly the shards the teacher writes.
"""

from __future__ import annotations

import re

CUT_SEP = ".c"
_FILE_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


def window_id(domain: str, k: int) -> str:
    """Window ``k`` of ``domain``."""
    return f"{domain}-{k:03d}"


def cut_id(window: str, j: int) -> str:
    """Cut ``j`` of a window."""
    return f"{window}{CUT_SEP}{j}"


def cut_ids(window: str, n: int) -> list[str]:
    """The ``n`` cuts of a window, in order."""
    return [cut_id(window, j) for j in range(n)]


def window_of(seq_id: str) -> str:
    """The window a sequence belongs to (a window id is its own window)."""
    return seq_id.split(CUT_SEP)[0]


def is_file_safe(seq_id: object) -> bool:
    """Whether ``seq_id`` can name a shard file: letters, digits, ``._-``, no leading dot, no ``..``, <= 200 chars."""
    return isinstance(seq_id, str) and bool(_FILE_SAFE.fullmatch(seq_id)) and ".." not in seq_id


def sequence_ids(domain: str, windows: int, cuts_per_window: int | None = None) -> list[str]:
    """The ids of one domain's windows, or of their cuts when ``cuts_per_window`` is given."""
    wins = [window_id(domain, k) for k in range(windows)]
    if cuts_per_window is None:
        return wins
    return [c for w in wins for c in cut_ids(w, cuts_per_window)]
