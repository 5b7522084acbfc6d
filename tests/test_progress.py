"""Progress on a terminal (a rich bar) and in a log (plain lines); the bar is driven through a real pty."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from rich.progress import Progress

from fideval.progress import progress, rate_column

DRIVE = """
import time
from fideval.progress import progress
with progress("score demo", total=30, unit="rows") as bar:
    time.sleep(0.4)  # rich refreshes before the first advance: the rate is not known yet
    for _ in range(3):
        bar.advance(10)
        time.sleep(0.15)
"""


def test_rate_column_before_and_after_the_first_advance():
    p = Progress(rate_column("rows"))
    tid = p.add_task("x", total=100)
    col = p.columns[0]
    assert col.render(p.tasks[0]).plain == "         - rows/s"
    p.advance(tid, 10)
    time.sleep(0.05)
    p.advance(tid, 10)
    shown = col.render(p.tasks[0]).plain
    assert shown.endswith(" rows/s") and "-" not in shown and float(shown.split()[0].replace(",", "")) > 0


def test_bar_on_a_real_terminal_renders_without_a_traceback():
    leader, follower = os.openpty()
    proc = subprocess.Popen([sys.executable, "-c", DRIVE], stdin=subprocess.DEVNULL, stdout=follower, stderr=follower,
                            env={**os.environ, "COLUMNS": "100", "TERM": "xterm"})
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    assert proc.wait(timeout=60) == 0
    text = out.decode(errors="replace")
    assert "Traceback" not in text and "Error" not in text, text
    assert "score demo" in text and "30/30" in text and "rows/s" in text


def test_plain_lines_in_a_log(capsys):
    with progress("teacher", total=4, unit="rows", every_s=0.0) as bar:
        bar.advance(2)
        bar.advance(2)
    lines = capsys.readouterr().err.splitlines()
    assert lines[-1].startswith("teacher: 4/4 rows (") and "ETA 0 s" in lines[-1]
