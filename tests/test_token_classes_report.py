"""report.json ``token_classes``: the join by sequence and position, the figures, the flags, the card section.

Synthetic records (``tests/synthetic.py``) on windows whose side file plants classes at known window positions:
``template`` on every window (66 windows: no flag), ``reasoning`` on the windows of one domain (33 windows:
``few_windows``, as a per-domain mean there would be), ``numeral`` on every 7th token with its KLD made 4 times
larger in one build, ``tool`` on 5 windows with its KLD 10 times larger (``too_few_windows``: no interval, never
named as degrading), ``tool_call`` nowhere (``no_rows``). Every figure checked is recomputed here from the
records parquet with its own row-to-token mapping.
"""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from synthetic import records_frame, window_ids, write_eval_windows, write_records

from fideval.config import ReportConfig
from fideval.errors import FidevalError
from fideval.formats import classes as fmt
from fideval.formats.classes import BIT
from fideval.fsio import write_bytes
from fideval.report import build
from fideval.report.classes import class_report
from fideval.report.inputs import load_windows

W, L = 256, 128
WINS = window_ids(["chat", "prose"], 33)


def _bits() -> np.ndarray:
    b = np.full((len(WINS), W), BIT["template"], dtype=np.int32)
    for i, (_, dom) in enumerate(WINS):
        if dom == "chat":
            b[i, 40:90] |= BIT["reasoning"]
    b[:, ::7] |= BIT["numeral"]
    b[:5, 100:140] |= BIT["tool"]  # 5 windows: too few for any interval
    return b


def _token_of(df: pl.DataFrame) -> np.ndarray:
    """Window position of the token each row predicts: cut j of length L starts at j * L; row r predicts r + 1."""
    j = np.array([int(s.split(".c")[1]) for s in df["seq_id"].to_list()])
    return j * L + df["position"].to_numpy() + 1


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("classes")
    write_eval_windows(root / "w", WINS, W)
    ew = json.loads((root / "w" / "eval-windows.json").read_text())
    bits = _bits()
    write_bytes(root / "w" / fmt.FILE, fmt.encode(fmt.TokenClasses(
        ids=[w for w, _ in WINS], window_sha256=[e["token_sha256"] for e in ew["windows"]], classes=bits,
        meta={"rules": {"rule": {"name": "test"}}, "rules_sha256": "x", "tokenizer_sha256": None})))
    frames, dirs = {}, []
    row = {w: i for i, (w, _) in enumerate(WINS)}
    for cand, path, eff in (("a", "serving", 1.0), ("a", "weights-only", 0.8), ("b", "serving", 2.0)):
        df = records_frame(cand, path, L, W, WINS, effect=eff)
        if (cand, path) == ("a", "serving"):
            win = np.array([row[w] for w in df["window_id"].to_list()])
            got = bits[win, _token_of(df)]
            factor = np.where((got & BIT["numeral"]) != 0, 4.0, 1.0) * np.where((got & BIT["tool"]) != 0, 10.0, 1.0)
            df = df.with_columns(pl.Series("kld", df["kld"].to_numpy() * factor))
        frames[(cand, path)] = df
        dirs.append(write_records(root / f"r-{cand}-{path}", df, cand, path, L))
    b = build.build(dirs, windows=load_windows(root / "w"), settings=ReportConfig(resamples=500))
    return root, frames, bits, b


def _result(b, cand, path):
    return next(r for r in b.report["token_classes"]["results"] if (r["candidate"], r["path"]) == (cand, path))


def test_class_figures_are_the_rows_of_the_tokens_they_predict(made):
    _, frames, bits, b = made
    block = b.report["token_classes"]
    assert block["status"] == "measured" and block["version"] == 1 and block["source"]["rule"] == "test"
    assert block["source"]["windows_checked"] == len(WINS)
    row = {w: i for i, (w, _) in enumerate(WINS)}
    for (cand, path), df in frames.items():
        res = _result(b, cand, path)
        win = np.array([row[w] for w in df["window_id"].to_list()])
        got = bits[win, _token_of(df)]
        kld, top1 = df["kld"].to_numpy(), df["top1"].to_numpy()
        for name in ("template", "reasoning", "numeral"):
            m = (got & BIT[name]) != 0
            c = res["classes"][name]
            assert c["rows"] == int(m.sum()) > 0
            assert c["clusters"] == len(set(df["window_id"].to_numpy()[m]))
            assert c["mean_kld"]["estimate"] == pytest.approx(kld[m].mean(), rel=1e-12)
            assert c["top1"]["estimate"] == pytest.approx(top1[m].mean(), rel=1e-12)
            assert c["ratio_to_overall"]["estimate"] == pytest.approx(kld[m].mean() / kld.mean(), rel=1e-9)
        assert res["classes"]["tool_call"]["rows"] == 0 and res["classes"]["tool_call"]["flags"] == ["no_rows"]


def test_few_windows_flag_as_per_domain(made):
    _, _, _, b = made
    res = _result(b, "a", "serving")
    assert res["classes"]["reasoning"]["clusters"] == 33
    assert "few_windows" in res["classes"]["reasoning"]["mean_kld"]["flags"]
    assert res["classes"]["template"]["clusters"] == 66
    assert "few_windows" not in res["classes"]["template"]["mean_kld"]["flags"]
    tool = res["classes"]["tool"]["mean_kld"]
    assert res["classes"]["tool"]["clusters"] == 5 and "too_few_windows" in tool["flags"] and tool["ci"] == [None, None]


def test_paired_build_comparisons_per_class(made):
    _, frames, bits, b = made
    cmp = [c for c in b.report["token_classes"]["comparisons"] if c["class"] == "numeral" and c["figure"] ==
           "mean_kld_ratio" and c["numerator"] == "a" and c["denominator"] == "b"]
    assert len(cmp) == 1
    row = {w: i for i, (w, _) in enumerate(WINS)}
    means = []
    for key in (("a", "serving"), ("b", "serving")):
        df = frames[key]
        m = (bits[np.array([row[w] for w in df["window_id"].to_list()]), _token_of(df)] & BIT["numeral"]) != 0
        means.append(df["kld"].to_numpy()[m].mean())
    assert cmp[0]["estimate"] == pytest.approx(means[0] / means[1], rel=1e-9)
    paths = [c for c in b.report["token_classes"]["comparisons"] if c["figure"] == "mean_kld_difference"]
    assert {c["minuend"] for c in paths} == {"serving"} and {c["subtrahend"] for c in paths} == {"weights-only"}


def test_card_names_the_planted_class_first(made, tmp_path):
    from fideval.report.card import render

    root, _, _, b = made
    path = build.write(b, tmp_path / "rep", plots=True)
    report = json.loads(path.read_text())
    assert any(p["kind"] == "token-classes" for p in report["plots"])
    assert (tmp_path / "rep" / "plots" / "token-classes-a-serving-128.png").is_file()
    card = render(report, report_path=path, out_path=tmp_path / "rep" / "README.md", candidate="a")
    section = card.split("## Where it degrades")[1].split("\n## ")[0]
    serving = next(ln for ln in section.splitlines() if ln.startswith("- serving"))
    assert serving.split(": ", 1)[1].startswith("`numeral` ×") and "`tool`" not in serving
    assert "| reasoning |" in section and "†" in section and "| tool_call |" not in section


def test_no_side_file_is_said_not_guessed(made, tmp_path):
    root, _, _, _ = made
    write_eval_windows(tmp_path / "w", WINS, W)
    out = class_report([], {}, load_windows(tmp_path / "w"))
    assert out["status"] == "not_measured" and "token-classes.safetensors" in out["reason"]


def test_classes_of_other_tokens_are_refused_in_one_line(made, tmp_path):
    root, frames, bits, _ = made
    write_eval_windows(tmp_path / "w", WINS, W)
    write_bytes(tmp_path / "w" / fmt.FILE, fmt.encode(fmt.TokenClasses(
        ids=[w for w, _ in WINS], window_sha256=["0" * 64] * len(WINS), classes=bits, meta={})))
    with pytest.raises(FidevalError) as e:
        build.build([root / "r-a-serving"], windows=load_windows(tmp_path / "w"), settings=ReportConfig(resamples=200),
                    allow_partial=True)
    assert "classified on tokens 000000000000" in e.value.message and e.value.hint and "\n" not in e.value.message
