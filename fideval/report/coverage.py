"""What the records cover against what was asked, and the windows' tokens they were scored on.

A report states figures "over the windows"; that is only true when every records set holds every sequence it was
asked to score. What was asked comes from the config (candidates x paths x lengths x domains) and, sequence by
sequence, from eval-windows.json (every window id and cut id, with its token SHA-256); without either, nothing
can be asked and coverage is ``not_run``. A set that lacks sequences, a domain or a whole (candidate, path, length)
makes the report *partial*: ``fideval report`` refuses it unless ``--allow-partial``, and then report.json's
``coverage.complete`` is false, the ``coverage`` check fails (so ``fideval check`` fails) and the card says so.

:func:`token_links` is the last link of the chain of custody (docs/formats.md): each score.json names the SHA-256 of
the token ids every sequence was scored on; they must equal eval-windows.json's, or the records were scored on
other windows (another seed, another tokenizer, a rebuilt corpus) than the ones the report cites.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from fideval.errors import FidevalError

if TYPE_CHECKING:
    from fideval.config import Config
    from fideval.report.inputs import RecordSet


def asked_lengths(cfg: Config) -> list[int]:
    """The sequence lengths the config's workflow scores (``teacher.lengths``: windows and/or cuts)."""
    by_kind = {"windows": cfg.windows.window_tokens, "cuts": cfg.windows.cut_tokens}
    return sorted({by_kind[k] for k in cfg.teacher.lengths})


def asked_sets(cfg: Config) -> list[tuple[str, str, int]]:
    """Every (candidate, path, length) the config asks for."""
    return sorted({(c.name, p, n) for c in cfg.candidates for p in c.paths for n in asked_lengths(cfg)})


def _expected_sequences(length: int, cfg: Config | None, windows: dict[str, Any] | None) -> dict[str, str] | None:
    """Sequence id -> domain of every sequence of ``length`` the windows hold (the config's domains only)."""
    if windows is None:
        return None
    seqs = windows.get("by_length", {}).get(length)
    if seqs is None:  # a thinner listing without this length's sequences: the config counts them, if given
        return None
    domains = {d.name for d in cfg.domains} if cfg is not None else None
    return {sid: dom for sid, dom in seqs.items() if domains is None or dom in domains}


def coverage(sets: list[RecordSet], cfg: Config | None, windows: dict[str, Any] | None) -> dict[str, Any]:
    """``{status, complete, detail, sets: [...], missing_sets: [...]}``: per records set the sequences asked and
    found (by domain), and every asked (candidate, path, length) with no records at all."""
    if cfg is None and windows is None:
        return {"status": "not_run", "complete": None, "detail": "no config and no eval-windows.json: nothing was asked",
                "sets": [], "missing_sets": []}
    out, short = [], []
    for rs in sets:
        found = {str(s) for s in np.unique(rs.cols["seq_id"].astype(str))}
        want = _expected_sequences(rs.length, cfg, windows)
        entry: dict[str, Any] = {"candidate": rs.candidate, "path": rs.path, "length": rs.length, "found": len(found)}
        if want is None and cfg is None:  # nothing says what this length should hold
            entry.update(asked=None, missing=0, missing_domains=[], first_missing=None)
            out.append(entry)
            continue
        if want is None:  # the config alone: count sequences per domain
            per_domain = cfg.windows.windows_per_domain * (
                cfg.windows.window_tokens // cfg.windows.cut_tokens if rs.length == cfg.windows.cut_tokens
                and rs.length != cfg.windows.window_tokens else 1)
            doms = {d.name: 0 for d in cfg.domains}
            for sid_dom in np.unique(np.stack([rs.cols["seq_id"].astype(str), rs.cols["domain"].astype(str)]), axis=1).T:
                if sid_dom[1] in doms:
                    doms[sid_dom[1]] += 1
            entry["asked"] = per_domain * len(doms)
            lacking = {d: per_domain - n for d, n in doms.items() if n < per_domain}
            entry["missing"] = sum(lacking.values())
            entry["missing_domains"] = sorted(lacking)
            entry["first_missing"] = None
        else:
            missing = sorted(set(want) - found)
            entry["asked"] = len(want)
            entry["missing"] = len(missing)
            entry["missing_domains"] = sorted({want[s] for s in missing})
            entry["first_missing"] = missing[0] if missing else None
        out.append(entry)
        if entry["missing"]:
            short.append(entry)
    have = {rs.key for rs in sets}
    missing_sets = [{"candidate": c, "path": p, "length": n} for c, p, n in (asked_sets(cfg) if cfg is not None else [])
                    if (c, p, n) not in have]
    complete = not short and not missing_sets
    if complete:
        detail = f"{len(out)} records sets, each holding every sequence asked ({sum(e['asked'] or 0 for e in out)} in all)"
    else:
        parts = [f"{e['candidate']}/{e['path']}/{e['length']} lacks {e['missing']} of {e['asked']} sequences (domains "
                 f"{', '.join(e['missing_domains'])}" + (f"; first {e['first_missing']})" if e["first_missing"] else ")")
                 for e in short]
        parts += [f"{m['candidate']}/{m['path']}/{m['length']} has no records" for m in missing_sets]
        detail = "; ".join(parts[:3]) + (f" (and {len(parts) - 3} more)" if len(parts) > 3 else "")
    return {"status": "pass" if complete else "fail", "complete": complete, "detail": detail, "sets": out,
            "missing_sets": missing_sets}


def refuse_partial(cov: dict[str, Any]) -> None:
    """One line when the records do not cover what was asked (``fideval report`` without ``--allow-partial``)."""
    if cov["complete"] is False:
        raise FidevalError(f"the records do not cover what was asked: {cov['detail']}",
                           hint="score what is missing, or pass --allow-partial to write a report marked partial")


def token_links(sets: list[RecordSet], windows: dict[str, Any] | None) -> dict[str, int]:
    """Each score.json's sequence token SHA-256 against eval-windows.json's; one line at the first that differs.
    Returns how many sequences were checked and how many records folders could not be (no ``sequences`` in their
    score.json: written before it existed)."""
    if windows is None:
        return {"checked": 0, "unchecked_folders": 0}
    known = windows.get("sequences") or {}
    checked, unchecked = 0, 0
    for rs in sets:
        for p in rs.parts:
            seqs = p.score.get("sequences")
            if not isinstance(seqs, dict):
                unchecked += 1
                continue
            in_records = {str(s) for s in np.unique(rs.cols["seq_id"].astype(str))}
            stray = sorted(in_records - set(seqs))
            if stray:
                raise FidevalError(f"{p.folder}: records hold sequence {stray[0]}, which its score.json does not name",
                                   hint="the records and score.json are from different runs; re-run 'fideval score'")
            for sid in sorted(in_records):
                want, got = known.get(sid), seqs.get(sid)
                if want is None:
                    continue  # not in eval-windows.json: the windows_match check names it
                if got != want:
                    raise FidevalError(
                        f"{p.folder}: sequence {sid} was scored on tokens {str(got)[:12]}..., {windows['file']} says "
                        f"{want[:12]}...: the records come from other windows (another seed, tokenizer or corpus)",
                        hint="report with the eval-windows.json the teacher ran on, or re-run the teacher and score")
                checked += 1
    return {"checked": checked, "unchecked_folders": unchecked}
