"""What the run will write: the teacher stores, float32 logits for every token of every sequence, one store
per length in ``teacher.lengths`` (windows and cuts hold the same tokens: a window's cuts tile it), and as many
again for the noise floor (``report.noise_floor``: the teacher run a second time, ``results/<run>/teacher-noise/``).
Their size is printed, and refused when it exceeds the free space where they will be written. The per-token
records (a few dozen bytes a row against 4 x vocabulary for a logit row) are not counted.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from fideval.validate.findings import Findings
from fideval.validate.model import Probe

if TYPE_CHECKING:
    from fideval.config import Config


LOGIT_BYTES = 4  # float32


def human(n: float) -> str:
    """Decimal units, three significant digits: 1.08 TB."""
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1000
    raise AssertionError  # pragma: no cover


def rows(cfg: Config) -> int:
    """Logit rows per store: domains x windows per domain x tokens per window."""
    return len(cfg.domains) * cfg.windows.windows_per_domain * cfg.windows.window_tokens


def nearest_existing(p: Path) -> Path:
    p = p.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def written(folder: Path) -> int:
    """Bytes already under ``folder`` (a resumed run needs only the rest)."""
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) if folder.is_dir() else 0


def stores(cfg: Config) -> list[tuple[str, str]]:
    """(what, folder under ``results/<run>/``) of every logit store the run writes, one store per length and domain
    in each: the teacher's, and with ``report.noise_floor`` the teacher run again under the harmless change
    (workflow/rules/noise.smk, rule teacher_noise). Candidates write records, not logit stores."""
    out = [("teacher", "teacher")]
    if cfg.report.noise_floor is not None:
        out.append(("noise-floor", "teacher-noise"))
    return out


def check(cfg: Config, probe: Probe, found: Findings) -> None:
    vocab = probe.vocab_size
    if vocab is None:
        return  # no config.json at hand: the model note says so
    n, r = len(cfg.teacher.lengths), rows(cfg)
    each = n * r * vocab * LOGIT_BYTES
    kinds = stores(cfg)
    total = each * len(kinds)
    found.facts.append(f"teacher stores: {n} x {r:,} rows x {vocab:,} x {LOGIT_BYTES} B = {human(each)}")
    if len(kinds) > 1:
        found.facts.append(f"noise-floor stores (report.noise_floor): the same {human(each)} again; "
                           f"all logit stores {human(total)}")
    results = Path("results") / cfg.run
    need = max(0, total - sum(written(results / folder) for _, folder in kinds))
    where = nearest_existing(results)
    free = shutil.disk_usage(where).free
    if need > free:
        what = "the teacher stores" if len(kinds) == 1 else "the teacher and noise-floor stores"
        found.add("teacher.lengths", f"{what} need {human(need)} more, and {where} has {human(free)} free",
                  hint="free space there, or lower windows.windows_per_domain or windows.window_tokens, or keep one length"
                  + ("" if len(kinds) == 1 else ", or drop report.noise_floor"))
