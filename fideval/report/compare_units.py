"""The resampling unit of ``fideval compare``: the window (default) or the document (``--unit document``).

A window's tokens share a context, so windows are the report's clusters. Where windows share documents (a long
document cut into several windows, passages of one article, rows of a dataset that carry the same document id),
the windows of one document are not independent either: a document that is hard for one of its windows is hard
for the others, and resampling windows then makes intervals too narrow (bench/coverage_many.py's shared-document
shapes measure by how much). ``--unit document`` resamples documents instead: windows linked by a shared document,
directly or through a chain of them, form one unit (the connected components of the window--document graph), and
each unit is resampled whole, within its domain as windows are. Every figure is a ratio of sums, so a unit's sums
are its windows' sums and the statistics are unchanged; only what is drawn together changes.

Documents are read from eval-windows.json (``windows[].documents[].source``, as the windows stage records them).
A document's identity is its ``source``: with a ``doc_id`` (the row's own id field), the source without its
position (``line``, ``row``), so rows of one document id in one file or dataset are one document; without one, the
whole source (file and line, or dataset, config, revision, split and row). A string source is its own identity.
fideval's own windows never reuse a document (``fideval/windows/packing.py``), so there the two units agree
unless rows share a ``doc_id``.
"""

from __future__ import annotations

import json
from typing import Any

from fideval.errors import FidevalError

UNITS = ("window", "document")
POSITION_KEYS = ("line", "row")


def document_key(source: Any) -> str:
    """The identity of the document a window's ``documents[].source`` names (module docstring)."""
    if isinstance(source, dict):
        if source.get("doc_id") is not None:
            source = {k: v for k, v in source.items() if k not in POSITION_KEYS}
        return json.dumps(source, sort_keys=True, default=str)
    return json.dumps(source, default=str)


def document_units(
    window_domains: dict[str, str], documents: dict[str, list[Any]], where: str
) -> tuple[dict[str, str], dict[str, str]]:
    """``(unit of each window, stratum of each unit)``: windows sharing a document (transitively) are one unit.

    ``documents``: window id -> its documents' sources. A unit is named by its first window id (sorted) and
    stratified by its domain; a unit whose windows lie in several domains is a stratum of its own named by them
    (``a+b``), since the design fixed neither. A window with rows and no documents recorded is refused."""
    parent = {w: w for w in window_domains}

    def find(w: str) -> str:
        while parent[w] != w:
            parent[w] = parent[parent[w]]
            w = parent[w]
        return w

    first: dict[str, str] = {}
    for w in sorted(window_domains):
        docs = documents.get(w)
        if not docs:
            raise FidevalError(f"{where}: window {w} records no documents (windows[].documents[].source)",
                               hint="--unit document needs the windows stage's eval-windows.json; or use --unit window")
        for src in docs:
            k = document_key(src)
            if k in first:
                a, b = find(first[k]), find(w)
                if a != b:
                    parent[max(a, b)] = min(a, b)
            else:
                first[k] = w
    unit_of = {w: find(w) for w in window_domains}
    doms: dict[str, set[str]] = {}
    for w, u in unit_of.items():
        doms.setdefault(u, set()).add(window_domains[w])
    return unit_of, {u: "+".join(sorted(d)) for u, d in doms.items()}


def read_documents(windows: Any, loaded: list[tuple[Any, dict[str, Any]]]) -> tuple[dict[str, list[Any]], str]:
    """Window id -> its documents' sources, from eval-windows.json ``windows`` (a file or its folder), checked to be
    the windows the reports were made on: the SHA-256 a report recorded of its windows file, else the token SHA-256
    of every window both record. Returns ``(documents, the file)``."""
    from fideval.report.inputs import load_windows

    if windows is None:
        raise FidevalError("--unit document needs the windows' documents: no eval-windows.json given",
                           hint="add --windows eval-windows.json (the windows stage's, or its folder)")
    w = load_windows(windows)
    for p, rep in loaded:
        ds = rep["provenance"]["dataset"]
        if ds.get("windows_file_sha256") and ds["windows_file_sha256"] != w["sha256"]:
            raise FidevalError(f"{w['file']} is not the eval-windows.json {p} was made with (its SHA-256 differs)",
                               hint="give the windows file the reports were made with")
        for r in ds["windows"]:
            mine = (w["windows"].get(r["id"]) or {}).get("token_sha256")
            if r["id"] not in w["windows"] or (r.get("token_sha256") and mine and mine != r["token_sha256"]):
                raise FidevalError(f"{w['file']} does not hold window {r['id']} of {p} as scored",
                                   hint="give the windows file the reports were made with")
    return w["document_sources"], w["file"]
