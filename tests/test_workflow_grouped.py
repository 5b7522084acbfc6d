"""The verbs behind the workflow's grouped jobs (issue 45): one job per length runs every domain, each into its own
folder (`{domain}` in --out); a template without its domains, or domains without a template, is one line."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def fideval(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fideval", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args, line", [
    (("score", "--teacher", "t/{domain}", "--out", "r/{domain}"),
     "--teacher t/{domain} names {domain} but no --domain is given (pass --domain D once per domain)"),
    (("score", "--teacher", "t/code", "--out", "r/code", "--domain", "code"),
     "--domain is given but --teacher t/code does not name {domain}"),
    (("score", "--teacher", "t/{domain}", "--out", "r/{domain}", "--candidate", "c/x", "--domain", "code"),
     "--domain is given but --candidate c/x does not name {domain}"),
])
def test_a_domain_template_needs_its_domains(args, line, tmp_path):
    r = fideval(*args, cwd=tmp_path)
    assert r.returncode == 2
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"fideval: error: {line}"), r.stderr
    assert not list(tmp_path.iterdir()), "a refused run wrote something"
