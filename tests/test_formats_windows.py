"""eval-windows.json's models: the stage's file read and dumped back, the report's thinner shapes, bad input."""

from __future__ import annotations

import copy
import json

import pytest
from synthetic import write_eval_windows

from fideval.errors import FidevalError
from fideval.formats.model import dump, parse
from fideval.formats.windows import EvalWindows
from fideval.report.inputs import load_windows
from fideval.windows.records import read_eval_windows

DOC = {"source": {"file": "a.jsonl", "line": 1}, "tokens": [0, 60], "chars": [0, 300], "document_chars": 300,
       "truncated": False}
OVERLAP = {"fraction": 0.5, "ngrams": 4, "matched": 2, "top_calibration": []}
HAND = {
    "format": "fideval.eval-windows", "version": 2,
    "provenance": {"tokenizer_sha256": None, "model_id": "t", "model_revision": None, "config_hash": "c",
                   "tokenizer_path": "tok", "tool": {"name": "fideval"}},
    "windows_config": {"window_tokens": 128, "cut_tokens": 64, "windows_per_domain": 1, "seed": 0, "separator": "eos"},
    "screen": {"status": "skipped", "reason": "no screen.calibration configured"},
    "domains": {"a": {"kind": "text", "source": {"type": "local", "path": "a.jsonl"}, "documents_read": 3}},
    "windows": [{"id": "a-000", "domain": "a", "tokens": 128, "sha256": "1" * 64, "documents": [DOC],
                 "overlap": None,
                 "replacements": [{"reason": "overlap", "sha256": "2" * 64, "documents": [DOC], "overlap": OVERLAP}],
                 "cuts": [{"id": "a-000.c0", "start": 0, "end": 64, "sha256": "3" * 64},
                          {"id": "a-000.c1", "start": 64, "end": 128, "sha256": "4" * 64}]}],
}


def test_the_stages_file_reads_field_by_field_and_back():
    ew = parse(EvalWindows, copy.deepcopy(HAND), "eval-windows.json")
    assert (ew.windows_config.window_tokens, ew.windows_config.separator) == (128, "eos")
    w = ew.windows[0]
    assert (w.id, w.tokens, w.overlap, w.documents[0].tokens, w.documents[0].truncated) == ("a-000", 128, None, [0, 60], False)
    assert w.replacements[0].overlap["matched"] == 2 and [c.end for c in w.cuts] == [64, 128]
    assert dump(ew) == HAND


def test_version_1_and_the_screens_thin_file_are_read(tmp_path):
    (tmp_path / "eval-windows.json").write_text(json.dumps(HAND | {"version": 1}))
    assert read_eval_windows(tmp_path)["version"] == 1
    thin = {"format": "fideval.eval-windows", "version": 1, "windows": [],
            "windows_config": {"window_tokens": 256, "cut_tokens": 64, "separator": "eos"}}
    (tmp_path / "eval-windows.json").write_text(json.dumps(thin))
    assert read_eval_windows(tmp_path) == thin


def _w(tmp_path, obj):
    (tmp_path / "eval-windows.json").write_text(json.dumps(obj))
    return load_windows(tmp_path)


def test_the_report_reads_every_shape_it_accepted(tmp_path):
    base = {"format": "fideval.eval-windows", "version": 1}
    want = {"code-000": {"domain": "code", "token_sha256": "a" * 64},
            "math-001": {"domain": "math", "token_sha256": None}}
    listed = [{"id": "code-000", "domain": "code", "token_sha256": "a" * 64}, {"window_id": "math-001"}]
    assert _w(tmp_path, base | {"windows": listed})["windows"] == want
    keyed = {"code-000": {"tokens_sha256": "a" * 64, "sha256": "b" * 64}, "math-001": {"sha256": 7}}
    assert _w(tmp_path, base | {"windows": keyed})["windows"] == want
    got = _w(tmp_path, HAND)
    assert got["windows"] == {"a-000": {"domain": "a", "token_sha256": "1" * 64}}
    assert got["sources"] == {"a": {"type": "local", "path": "a.jsonl"}} and got["version"] == 2
    assert got["provenance"]["model_id"] == "t"


def test_the_synthetic_builders_file_is_read(tmp_path):
    write_eval_windows(tmp_path, [("code-000", "code"), ("prose-000", "prose")], 64)
    got = load_windows(tmp_path)
    assert sorted(got["windows"]) == ["code-000", "prose-000"] and got["windows"]["prose-000"]["domain"] == "prose"
    assert got["sources"]["code"]["id"] == "org/code"


def _break(edit):
    obj = copy.deepcopy(HAND)
    edit(obj)
    return obj


@pytest.mark.parametrize("edit, want", [
    (lambda o: o.pop("windows_config"), "missing key 'windows_config'"),
    (lambda o: o["windows_config"].update(cut_tokens="64"), "windows_config: 'cut_tokens' is '64', expected integer"),
    (lambda o: o["windows_config"].update(cut_tokens=48), "windows_config: cut_tokens 48 does not divide window_tokens 128"),
    (lambda o: o["windows"][0]["cuts"][1].pop("sha256"), "missing key 'windows[0].cuts[1].sha256'"),
    (lambda o: o["windows"][0]["documents"][0].update(truncated=0), "windows[0].documents[0]: 'truncated' is 0, expected boolean"),
    (lambda o: o.update(version=3), "has eval-windows version 3 (a newer fideval); this fideval reads version 1, 2"),
    (lambda o: o.update(format="fideval.store"), "is not a fideval.eval-windows file (format 'fideval.store')"),
])
def test_bad_stage_files_are_one_line_naming_the_file_and_key(tmp_path, edit, want):
    (tmp_path / "eval-windows.json").write_text(json.dumps(_break(edit)))
    with pytest.raises(FidevalError) as e:
        read_eval_windows(tmp_path)
    line = e.value.line()
    assert "\n" not in line and line.startswith(str(tmp_path / "eval-windows.json")) and want in line, line


@pytest.mark.parametrize("obj, want", [
    ({"version": 1, "windows": []}, "is not a fideval.eval-windows file (format None)"),
    ({"format": "fideval.eval-windows", "version": 9, "windows": []}, "version 9 (a newer fideval)"),
    ({"format": "fideval.eval-windows", "version": 1}, "missing key 'windows'"),
    ({"format": "fideval.eval-windows", "version": 1, "windows": [{"domain": "a"}]}, "windows[0]: 'id' is None, expected string"),
    ({"format": "fideval.eval-windows", "version": 1, "windows": ["a-000"]}, "'windows[0]' is not a JSON object"),
    ({"format": "fideval.eval-windows", "version": 1, "windows": [{"id": "a-0", "domain": 3}]},
     "windows[0]: 'domain' is 3, expected string"),
])
def test_bad_report_inputs_are_one_line_naming_the_file_and_key(tmp_path, obj, want):
    with pytest.raises(FidevalError) as e:
        _w(tmp_path, obj)
    line = e.value.line()
    assert "\n" not in line and line.startswith(str(tmp_path / "eval-windows.json")) and want in line, line
