"""The sequence-id grammar: the ids the windows stage writes are the ones the workflow names as targets."""

import pytest

from fideval.formats import ids


def test_windows_and_cuts():
    assert ids.sequence_ids("code", 2) == ["code-000", "code-001"]
    assert ids.sequence_ids("code", 2, 2) == ["code-000.c0", "code-000.c1", "code-001.c0", "code-001.c1"]
    assert ids.window_of("code-001.c1") == ids.window_of("code-001") == "code-001"
    assert ids.window_id("math", 1234) == "math-1234"


@pytest.mark.parametrize("sid, ok", [("code-003.c1", True), ("a", True), (".hidden", False), ("a..b", False),
                                     ("a/b", False), ("x" * 200, True), ("x" * 201, False), (3, False), ("", False)])
def test_file_safe(sid, ok):
    assert ids.is_file_safe(sid) is ok


def test_the_workflow_names_the_shards_the_windows_stage_writes():
    """common.smk's seq_ids and the windows stage's records share the grammar (no copy in the workflow)."""
    from pathlib import Path

    smk = (Path(__file__).parents[1] / "workflow" / "rules" / "common.smk").read_text()
    assert "sequence_ids(" in smk and '.c{' not in smk and ":03d}" not in smk
