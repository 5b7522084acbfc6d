"""Issue 40 for ``fideval card``: it never overwrites a file that is not a card it wrote, never links a plot that is
not there, says why an interval it prints has no bound, and names the interval the tool computes."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import synthetic as syn  # tests/synthetic.py
import yaml
from cli_runner import run_fideval
from faults_fixtures import snapshot
from test_report_card import _report

from fideval.report.card_intervals import Cell, Notes, reason

ROOT = Path(__file__).resolve().parent.parent
PROJECT_README = "# my project\n\nHand-written, with a pasted x_fidelity block:\n"


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory):
    return _report(tmp_path_factory.mktemp("cardsafety"))


def _card(report_dir, out, *extra, cwd=None):
    return run_fideval("card", str(report_dir / "report.json"), "--candidate", "q4", "--out", str(out), *extra, cwd=cwd)


def _refusal(path: str, page: bool = False) -> str:
    if page:
        return (f"fideval: error: --html {path} exists and is not a results page fideval card wrote (no <meta "
                "name=\"generator\" content=\"fideval card\"> in its head) (choose another --html, e.g. "
                "reports/RUN/results.html, or pass --force to replace it)")
    return (f"fideval: error: --out {path} exists and is not a model card fideval card wrote (no 'x_fidelity.generator: "
            "fideval card' in its YAML front matter) (choose another --out, e.g. reports/RUN/README.md, or pass --force "
            "to replace it)")


def test_a_project_readme_is_never_overwritten_without_force(report_dir, tmp_path):
    """README's own former example, ``fideval card reports/RUN/report.json --out README.md``, run in a project folder:
    refused in one line, the README byte for byte as it was; --force replaces it; then the card is fideval's and a
    rerun replaces it without --force."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "README.md").write_text(PROJECT_README)
    before = snapshot(proj)
    assert _card(report_dir, "README.md", cwd=proj).error() == _refusal("README.md")
    assert snapshot(proj) == before
    res = _card(report_dir, "README.md", "--force", cwd=proj)
    assert res.code == 0, res.stderr
    card = (proj / "README.md").read_text()
    assert yaml.safe_load(card.split("---\n")[1])["x_fidelity"]["generator"] == "fideval card"
    res = _card(report_dir, "README.md", cwd=proj)  # a card fideval wrote: replaced, the same bytes
    assert res.code == 0, res.stderr
    assert (proj / "README.md").read_text() == card


def test_a_pasted_x_fidelity_block_or_an_older_card_is_not_the_marker(report_dir, tmp_path):
    """A README holding fideval's metadata without the generator line (a hand-made README that pasted the block, or a
    card of a fideval before the marker) is refused: measured_by says who measured, not who wrote the file."""
    out = tmp_path / "README.md"
    assert _card(report_dir, out).code == 0
    text = out.read_text()
    legacy = text.replace("  generator: fideval card\n", "")
    assert legacy != text and "measured_by:" in legacy
    out.write_text(legacy + "\nMy own paragraph.\n")
    assert _card(report_dir, out).error() == _refusal(str(out))
    assert out.read_text().endswith("My own paragraph.\n")


def test_the_results_page_is_refused_the_same_way(report_dir, tmp_path):
    page = tmp_path / "results.html"
    page.write_text("<html><body>my page</body></html>\n")
    res = _card(report_dir, tmp_path / "README.md", "--html", str(page))
    assert res.error() == _refusal(str(page), page=True)
    assert page.read_text() == "<html><body>my page</body></html>\n" and not (tmp_path / "README.md").exists()
    assert _card(report_dir, tmp_path / "README.md", "--html", str(page), "--force").code == 0
    assert '<meta name="generator" content="fideval card">' in page.read_text()
    assert _card(report_dir, tmp_path / "README.md", "--html", str(page)).code == 0  # fideval's page now


def test_a_folder_is_refused_and_an_empty_file_replaced(report_dir, tmp_path):
    (tmp_path / "d").mkdir()
    assert _card(report_dir, tmp_path / "d").error() == (
        f"fideval: error: --out {tmp_path / 'd'} is a folder (give a file name, e.g. {tmp_path / 'd' / 'README.md'})")
    (tmp_path / "empty.md").write_text("")
    assert _card(report_dir, tmp_path / "empty.md").code == 0
    assert "generator: fideval card" in (tmp_path / "empty.md").read_text()


def _links(card: str) -> list[str]:
    return re.findall(r"!\[[^\]]*\]\(([^)]+)\)", card)


def test_the_card_links_only_plots_that_are_there(report_dir, tmp_path):
    rep = json.loads((report_dir / "report.json").read_text())
    mine = [p["file"] for p in rep["plots"] if p["candidate"] == "q4"]
    assert len(mine) == 6
    # beside its report: every plot linked, every link a file
    inside = report_dir / "card-here.md"
    assert _card(report_dir, inside).code == 0
    links = _links(inside.read_text())
    assert sorted(links) == sorted(mine) and all((report_dir / h).is_file() for h in links)
    assert "not shown" not in inside.read_text()
    # a copy of report.json alone elsewhere: no broken image, and the card says what it left out
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(report_dir / "report.json", alone / "report.json")
    res = _card(alone, alone / "README.md")
    assert res.code == 0, res.stderr
    text = (alone / "README.md").read_text()
    assert _links(text) == []
    assert (f"6 plots of this build in report.json are not shown: no file at `{mine[0]}` and 5 more relative to this "
            "card (written away from its report folder?); write the card into the report folder, or copy the report's "
            "plots/ beside it, and run `fideval card` again.") in text
    # one plot missing of six: five linked, one named
    shutil.copytree(report_dir / "plots", alone / "plots")
    (alone / mine[2]).unlink()
    assert _card(alone, alone / "README.md").code == 0
    text = (alone / "README.md").read_text()
    assert sorted(_links(text)) == sorted(m for m in mine if m != mine[2])
    assert f"1 plot of this build in report.json is not shown: no file at `{mine[2]}` relative to this card" in text


# -- intervals the card cannot bound -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """Three windows in two domains (one of them a single window): the design that printed '[0, —]' unexplained."""
    root = tmp_path_factory.mktemp("small")
    windows = syn.window_ids(["code"], 2) + syn.window_ids(["chat"], 1)
    args = []
    for cand, eff in (("q4", 1.2), ("q8", 0.4)):
        df = syn.records_frame(cand, "serving", 64, 64, windows, effect=eff)
        args += ["--records", str(syn.write_records(root / cand, df, cand, "serving", 64))]
    syn.write_eval_windows(root, windows, 64)
    res = run_fideval("report", *args, "--windows", str(root), "--out", str(root / "report"), "--resamples", "400")
    assert res.code == 0, res.stderr  # its plots drew too: a collapsed interval's bar no longer refuses to draw
    res = run_fideval("card", str(root / "report"), "--candidate", "q4", "--out", str(root / "report" / "README.md"))
    assert res.code == 0, res.stderr
    return {"rep": json.loads((root / "report" / "report.json").read_text()), "card": (root / "report" / "README.md").read_text()}


def test_a_small_design_says_why_its_intervals_have_no_bound(small):
    rep, card = small["rep"], small["card"]
    m = rep["results"][0]["overall"]["mean_kld"]
    ratio = next(c for c in rep["comparisons"]["builds"] if c["numerator"] == "q4")
    assert m["ci"][0] == pytest.approx(m["ci"][1], rel=1e-12) and "degenerate" not in m["flags"]  # collapsed, not flagged
    assert ratio["ci"][1] is None and "unbounded" in ratio["flags"]  # '[0, —]'
    assert f"| serving | {m['estimate']:.4g} [{m['ci'][0]:.4g}, {m['ci'][1]:.4g}]¹ |" in card
    assert f"| q8 | serving | 64 | {ratio['estimate']:.4g} [{ratio['ci'][0]:.4g}, —]² |" in card
    assert f"raises the mean KLD {ratio['estimate']:.3g} times [{ratio['ci'][0]:.3g}, —]² against q8" in card
    flags = ", ".join(f"`{f}`" for f in sorted(m["flags"]))
    notes = card.split("## Notes on the intervals\n")[1].split("\n## ")[0]
    assert notes == (
        "\nAn interval marked above has no bound (—) or is its estimate alone; why, from report.json:\n\n"
        "- ¹ no width: on 3 windows in 2 domains every window resample that varies gives the estimate back, so the "
        f"interval collapses to it (flags {flags}); more windows widen it\n"
        "- ² no upper bound: on 3 windows in 2 domains the bootstrap-t's quantile, at the level expanded for few windows, "
        "is so far out that the interval has no finite upper end (flag `unbounded`); more windows bound it\n")
    # no '—' bound anywhere in the card's tables without a note mark
    for line in card.splitlines():
        if line.startswith("|") and ", —]" in line:
            assert re.search(r", —\][¹²³⁴⁵⁶⁷⁸⁹]", line), line


@pytest.mark.parametrize(("fig", "kind", "words"), [
    ({"estimate": 0.0, "ci": [0.0, 0.0], "method": "degenerate", "flags": ["degenerate"], "clusters": 36, "se": 0.0},
     "kld", "the mean KLD is exactly 0"),
    ({"estimate": 1.0, "ci": [1.0, 1.0], "method": "degenerate", "flags": ["degenerate"], "clusters": 8, "se": 0.0},
     "agreement", "the agreement is exactly 100 %"),
    ({"estimate": 0.2, "ci": [0.2, 0.2], "method": "degenerate", "flags": ["degenerate", "few_clusters"], "clusters": 1,
      "strata": 1, "se": None}, "kld", "1 window with rows, and resampling needs at least two"),
    ({"estimate": 0.2, "ci": [0.2, 0.2], "method": "degenerate", "flags": ["degenerate"], "clusters": 9, "se": 0.0},
     "kld", "zero variance, every window gives the same value"),
    ({"estimate": 0.2, "ci": [0.01, None], "method": "cluster-percentile-expanded", "flags": ["few_tail_windows"],
      "tail_windows": 3.25}, "kld", "come from 3.2 effective windows (fewer than 25)"),
    ({"estimate": 2.0, "ci": [0.0, None], "flags": ["unbounded"], "clusters": 4, "strata": 2}, "ratio",
     "no upper bound: on 4 windows in 2 domains"),
    ({"estimate": None, "ci": None, "method": "undefined", "flags": ["undefined"]}, "ratio", "undefined: the estimate is not"),
    ({"estimate": 0.2, "ci": [0.1, 0.3], "flags": ["few_clusters"], "clusters": 9}, "kld", None),
])
def test_each_reason_in_words(fig, kind, words):
    got = reason(fig, kind)
    assert (got is None) if words is None else (words in got), got


def test_notes_are_numbered_as_the_card_prints_them():
    """A cell registers its note when it is printed: a template that leaves a table out gets no note for it."""
    import jinja2

    notes = Notes()
    a = Cell("0.1 [0, —]", "why a", notes)
    b = Cell("0.2 [0.2, 0.2]", "why b", notes)
    assert a == "0.1 [0, —]" and len(a) == 10  # as a string, the interval as before
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    text = env.from_string("{{ b }} {{ b }}|{% for n in notes %}{{ n.mark }} {{ n.reason }};{% endfor %}").render(
        a=a, b=b, notes=notes)
    assert text == "0.2 [0.2, 0.2]¹ 0.2 [0.2, 0.2]¹|¹ why b;"  # a never printed: no note, no number


def test_the_card_and_its_template_fields_of_the_notes(small, tmp_path):
    """A user template sees the notes of the figures it printed (docs/formats-report.md lists the fields)."""
    rep = tmp_path / "report.json"
    rep.write_text(json.dumps(small["rep"]))
    tpl = tmp_path / "t.md.j2"
    tpl.write_text("{% for r in card.headline %}{{ r.mean }}\n{% endfor %}"
                   "{% for n in card.interval_notes %}{{ n.mark }}: {{ n.reason[:8] }}\n{% endfor %}")
    res = run_fideval("card", str(rep), "--candidate", "q4", "--template", str(tpl), "--out", str(tmp_path / "c.md"))
    assert res.code == 0, res.stderr
    body = (tmp_path / "c.md").read_text().split("---\n", 2)[2]
    m = small["rep"]["results"][0]["overall"]["mean_kld"]
    assert body == f"\n{m['estimate']:.4g} [{m['ci'][0]:.4g}, {m['ci'][1]:.4g}]¹\n¹: no width\n"


# -- the interval the tool computes, named -----------------------------------------------------------------------

def test_help_texts_and_captions_name_the_default_interval():
    res = run_fideval("check", "--help", env={"COLUMNS": "400"})
    text = " ".join(res.stdout.split())
    assert "upper interval bound (the default cluster bootstrap-t; a version 1 report's BCa)" in text
    assert "lower interval bound (the default cluster bootstrap-t; a version 1 report's Wilson)" in text
    plots = (ROOT / "workflow/report/plots.rst").read_text()
    results = (ROOT / "workflow/report/results.rst").read_text()
    assert "(Wilson intervals)" not in plots and "bootstrap-t" in plots
    assert "window-block BCa" not in results and "top-1 agreement (Wilson)" not in results
    assert "bootstrap-t" in results and "(the BCa and Wilson intervals beside it)" in results
    assert "gives BCa intervals" not in (ROOT / "docs/quant.md").read_text()


def test_readme_never_shows_a_card_written_over_the_project_readme():
    readme = (ROOT / "README.md").read_text()
    assert "--out README.md" not in readme
    assert "`fideval card reports/RUN/report.json --out reports/RUN/README.md`" in readme
