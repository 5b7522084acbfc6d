"""What the run will write: the teacher stores, one per length in ``teacher.lengths`` and domain (windows and cuts
hold the same tokens: a window's cuts tile it), and as many again for the noise floor (``report.noise_floor``: the
teacher run a second time, ``results/<run>/teacher-noise/``). Their size follows ``teacher.store``:

* ``logits``: ``rows x V x 4`` bytes (float32 logits, a row per position);
* ``hidden``: ``rows x H x b`` bytes (the final norm's output in the layers' dtype: ``b`` = 2 for bfloat16, 4 for
  float32) plus the head, ``V x H x h`` bytes (``h`` = 2 where the head is bfloat16-exact -- stored BF16 in the
  checkpoint, or a bfloat16 ``dtype`` in config.json when no weights are local -- else 4), once: every store of a run
  holds a hard link to the same ``head.safetensors`` (fideval.store.head), so its bytes are on the disk once.

``rows`` = lengths x domains x windows per domain x tokens per window. Their size is printed, and refused when it
exceeds the free space where they will be written. ``teacher.store: auto`` is the teacher's own choice
(:func:`fideval.model.teacher_pass.store_kind`: hidden with either backend). The token ids, headers
and manifests (a few bytes a row) and the per-token records (a few dozen bytes a row) are not counted.
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
HIDDEN_BYTES = {"bfloat16": 2, "float32": 4}  # teacher.dtype -> bytes of a hidden value
HEAD_NAMES = ("lm_head.weight", "head.weight")  # transformers', the vendor reference code's
EMBED_NAMES = ("model.embed_tokens.weight", "embed.weight")  # a tied head


def human(n: float) -> str:
    """Decimal units, three significant digits: 1.08 TB."""
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1000
    raise AssertionError  # pragma: no cover


def rows(cfg: Config) -> int:
    """Rows per store length (all domains): domains x windows per domain x tokens per window."""
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
    """(what, folder under ``results/<run>/``) of every teacher store the run writes, one store per length and domain
    in each: the teacher's, and with ``report.noise_floor`` the teacher run again under the harmless change
    (workflow/rules/noise.smk, rule teacher_noise). Candidates write records, not stores."""
    out = [("teacher", "teacher")]
    if cfg.report.noise_floor is not None:
        out.append(("noise-floor", "teacher-noise"))
    return out


def hidden_size(probe: Probe) -> int | None:
    """H: the transformers config's ``hidden_size`` (or config.json's, its ``text_config``'s, the vendor's ``dim``)."""
    a = probe.adapter
    if a is not None and isinstance(getattr(a.config, "hidden_size", None), int):
        return int(a.config.hidden_size)
    cfg = probe.config or {}
    for c in (cfg, cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}):
        for key in ("hidden_size", "dim"):
            v = c.get(key)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
    return None


def head_bytes(probe: Probe) -> tuple[int, str]:
    """(bytes a head value is stored in, why): 2 for a bfloat16-exact head, else 4 (fideval.store.head stores a head
    bfloat16 when every value is one). From the safetensors headers when the weights are local, else config.json."""
    folder = probe.folder
    if folder is not None and any(folder.glob("*.safetensors")):
        from fideval.errors import FidevalError
        from fideval.formats.safetensors import folder_shapes

        try:
            shapes = folder_shapes(folder)
        except FidevalError:
            shapes = {}
        tied = bool((probe.config or {}).get("tie_word_embeddings"))
        names = (EMBED_NAMES + HEAD_NAMES) if tied else (HEAD_NAMES + EMBED_NAMES)
        name = next((n for n in names if n in shapes), None)
        if name is not None:
            dtype = shapes[name][1]
            return (2, f"{name} is BF16") if dtype == "BF16" else (4, f"{name} is {dtype}")
    cfg = probe.config or {}
    dtype = cfg.get("torch_dtype") or cfg.get("dtype")
    if dtype == "bfloat16":
        return 2, "config.json dtype bfloat16"
    return 4, f"config.json dtype {dtype}" if dtype else "no dtype in config.json"


def kind(cfg: Config) -> str:
    """The kind the teacher will write (``teacher.store``, ``auto`` resolved), asked of the teacher stage's own rule."""
    from fideval.model.teacher_pass import store_kind

    return store_kind(cfg.teacher.store, getattr(cfg.model, "implementation", "transformers"))


def store_bytes(cfg: Config, probe: Probe, store: str | None = None) -> tuple[int, str] | None:
    """(bytes of one set of teacher stores of kind ``store`` (None: :func:`kind`), every length and domain; the formula
    with its numbers), None when config.json is not at hand (a note says so)."""
    n, r, vocab = len(cfg.teacher.lengths), rows(cfg), probe.vocab_size
    if vocab is None:
        return None
    if (store or kind(cfg)) == "logits":
        each = n * r * vocab * LOGIT_BYTES
        return each, f"{n} x {r:,} rows x {vocab:,} x {LOGIT_BYTES} B = {human(each)}"
    H = hidden_size(probe)
    if H is None:
        return None
    b = HIDDEN_BYTES[cfg.teacher.dtype]
    h, why = head_bytes(probe)
    heads = 1  # one head's bytes: the stores of a run hard-link the same file (fideval.store.head)
    each = n * r * H * b + heads * vocab * H * h
    return each, (f"{n} x {r:,} rows x {H:,} x {b} B + the head {vocab:,} x {H:,} x {h} B ({why}), one file hard-linked "
                  f"into every store = {human(each)}; "
                  f"as logits {human(n * r * vocab * LOGIT_BYTES)}")


def check(cfg: Config, probe: Probe, found: Findings) -> None:
    from fideval.errors import FidevalError

    try:
        store = kind(cfg)
    except FidevalError as e:
        found.add("teacher.store", e)
        return
    sized = store_bytes(cfg, probe, store)
    if sized is None:
        return  # no config.json at hand: the model note says so
    each, formula = sized
    kinds = stores(cfg)
    total = each * len(kinds)
    hidden = store == "hidden"
    found.facts.append(f"teacher stores{' (hidden)' if hidden else ''}: {formula}")
    if len(kinds) > 1:
        found.facts.append(f"noise-floor stores (report.noise_floor): the same {human(each)} again; "
                           f"all {'teacher' if hidden else 'logit'} stores {human(total)}")
    results = Path("results") / cfg.run
    need = max(0, total - sum(written(results / folder) for _, folder in kinds))
    where = nearest_existing(results)
    free = shutil.disk_usage(where).free
    if need > free:
        what = "the teacher stores" if len(kinds) == 1 else "the teacher and noise-floor stores"
        smaller = "" if hidden else ", or set teacher.store: hidden"
        found.add("teacher.lengths", f"{what} need {human(need)} more, and {where} has {human(free)} free",
                  hint="free space there, or lower windows.windows_per_domain or windows.window_tokens, or keep one length"
                  + smaller + ("" if len(kinds) == 1 else ", or drop report.noise_floor"))
