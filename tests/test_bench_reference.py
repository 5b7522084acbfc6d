"""bench/reference.py --small runs on a CPU and prints its one table (the lead runs it at size on an H200)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import ref_deepseek_v3 as rv3

ROOT = Path(__file__).resolve().parent.parent


def test_bench_small_prints_the_table(tmp_path):
    code = rv3.need_code()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "reference.py"), "--small", "--dir", str(tmp_path), "--code", str(code)],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    table = [ln for ln in r.stdout.splitlines() if ln.startswith("| ")]
    figures = {ln.split("|")[1].strip(): ln.split("|")[2].strip() for ln in table[1:]}
    for impl in ("transformers", "reference (vendor experts)", "reference (grouped experts)"):  # --experts both
        tps = next(v for k, v in figures.items() if k.startswith(f"{impl}: tokens/s"))
        assert float(tps.replace(",", "")) > 0
        assert "moe" in figures[f"{impl}: time per part"]
    for e in ("vendor", "grouped"):
        kld = figures[f"mean KLD reference ({e} experts) vs transformers (last 64 positions, 2 sequences)"]
        assert 0 <= float(kld.split()[0]) < 1  # the same weights: near, not equal in bf16
    assert figures["reference (grouped experts): routed experts computed by"].startswith("grouped: ")
    # the grouped path against the vendor's loop: 0 on the CPU (docs/runner.md, 'Grouped experts')
    assert figures["grouped vs vendor loop: max abs dlogit, mean KLD (last 64 positions, 2 sequences)"].startswith("0, 0")
    assert (tmp_path / "ckpt-small" / "inference").resolve() == code.resolve()
