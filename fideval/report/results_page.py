"""The card's body as a standalone HTML page: the results page of ``snakemake --report``.

Snakemake's report shows the plots a rule declares and nothing else, so a reader of report.html saw twelve
plots and not one number. ``fideval card --html FILE`` writes the same tables the card shows (headline per
length, domains, comparisons, checks, how it was measured) as HTML, declared by the card rule as a report
item beside the plots. The YAML front matter is left out (it is for machines) and so is the plots section
(the report shows the plots themselves). Rendered with markdown-it-py (CommonMark plus tables), escaping
HTML in the text; the same card gives the same bytes.
"""

from __future__ import annotations

import html
import re

# the page's marker: ``fideval card --html`` replaces an existing file only when it carries it (or with --force)
GENERATOR_TAG = '<meta name="generator" content="fideval card">'
STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:72em;margin:2em auto;padding:0 1em;color:#222}"
    "table{border-collapse:collapse;margin:1em 0}th,td{border:1px solid #ccc;padding:.3em .6em;text-align:left}"
    "th{background:#f3f3f3}code{background:#f3f3f3;padding:0 .2em}"
)


def body_of(card: str) -> str:
    """The card's markdown body: without its YAML front matter and its plots section."""
    text = re.sub(r"\A---\n.*?\n---\n", "", card, count=1, flags=re.S)
    return re.sub(r"\n## Plots\n.*?(?=\n## |\Z)", "\n", text, flags=re.S).strip() + "\n"


def page(card: str, title: str, base: str | None = None) -> str:
    """The page; ``base``: the card's folder relative to the page's, which a plot the card shows in its body (the
    Routing section's) is linked through when the page is written elsewhere than the card."""
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    body = md.render(body_of(card))
    if base not in (None, "", "."):
        body = re.sub(r'(<img src=")(?![a-zA-Z][a-zA-Z0-9+.-]*:|/|#)([^"]*)"',
                      lambda m: f'{m.group(1)}{html.escape(base.rstrip("/"))}/{m.group(2)}"', body)
    return (
        f"<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n{GENERATOR_TAG}\n"
        f"<title>{html.escape(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
        f"{body}</body>\n</html>\n"
    )
