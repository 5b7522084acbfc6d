"""docs/formats*.md's field tables are the models' own (python -m fideval.formats.docs keeps them current)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from fideval.errors import FidevalError
from fideval.formats import docs
from fideval.formats.model import Model, fields_table, key

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_the_committed_docs_are_current():
    assert docs.stale(DOCS) == [], "run: python -m fideval.formats.docs"


def test_every_table_is_in_the_docs_once():
    used = [n for p in sorted(DOCS.glob("formats*.md")) for n in docs.names(p.read_text(encoding="utf-8"))]
    assert sorted(used) == sorted(docs.TABLES)


@dataclass(frozen=True, kw_only=True)
class _Tiny(Model):
    FORMAT = "x.tiny"
    VERSION = 1

    format: str = key("`x.tiny`", default=FORMAT)
    version: int = key("`1`", default=VERSION)
    name: str = key("a name | with a bar")
    tags: list[str] | None = key("tags", default=None)


def test_fields_table_against_a_hand_written_one():
    assert fields_table(_Tiny) == (
        "| key | type | required | meaning |\n"
        "| --- | --- | --- | --- |\n"
        "| `format` | string | yes | `x.tiny` |\n"
        "| `version` | integer | yes | `1` |\n"
        "| `name` | string | yes | a name \\| with a bar |\n"
        "| `tags` | list of string or null | no | tags |"
    )


def test_check_finds_a_stale_table_and_the_command_rewrites_it(tmp_path, capsys):
    doc = tmp_path / "formats-x.md"
    text = "# x\n\n<!-- fields:score.self_check -->\n| old | table |\n<!-- /fields -->\n\nafter\n"
    doc.write_text(text)
    (tmp_path / "other.md").write_text("<!-- fields:nonesuch -->\n<!-- /fields -->\n")  # not formats*.md: left alone
    assert docs.main(["--check", "--docs", str(tmp_path)]) == 1
    assert "formats-x.md: stale" in capsys.readouterr().out and doc.read_text() == text
    assert docs.main(["--docs", str(tmp_path)]) == 0
    want = ("# x\n\n<!-- fields:score.self_check -->\n| key | type | required | meaning |\n| --- | --- | --- | --- |\n"
            "| `max_kld` | number | yes | largest \\|KLD\\| of the teacher scored against itself (must be exactly 0) |\n"
            "| `top1` | number | yes | top-1 agreement of the teacher with itself (must be exactly 1) |\n"
            "| `rows` | integer or null | no | rows scored |\n<!-- /fields -->\n\nafter\n")
    assert doc.read_text() == want
    assert docs.main(["--check", "--docs", str(tmp_path)]) == 0


def test_an_unknown_table_is_one_line(tmp_path, capsys):
    with pytest.raises(FidevalError, match="doc.md: unknown table 'fields:nonesuch'"):
        docs.render("<!-- fields:nonesuch -->\n<!-- /fields -->\n", "doc.md")
    (tmp_path / "formats-y.md").write_text("<!-- fields:nonesuch -->\n<!-- /fields -->\n")
    assert docs.main(["--check", "--docs", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "formats-y.md: unknown table 'fields:nonesuch'" in err


def test_a_folder_without_format_docs_is_one_line(tmp_path, capsys):
    assert docs.main(["--check", "--docs", str(tmp_path)]) == 2
    assert f"no formats*.md in {tmp_path}" in capsys.readouterr().err
