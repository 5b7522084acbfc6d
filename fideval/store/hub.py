"""Published stores: ``hf://datasets/ORG/NAME@REVISION/sub/dir`` or a local folder, resolved to a local path.

A teacher store for a large model costs GPU-hours to make, so it is published once (as a Hub dataset) and
scored against many times. Pinning the revision (a commit hash, ideally) keeps a report reproducible: the
same spec always yields the same bytes, and the manifest's SHA-256s check them. Only ``sub/dir/**`` is
fetched, so one dataset repo can hold stores for several models or lengths. Offline (``HF_HUB_OFFLINE=1``)
the spec resolves from the local Hub cache or fails with one line.
"""

from __future__ import annotations

import re
from pathlib import Path

from fideval.errors import FidevalError

_SPEC = re.compile(r"hf://datasets/(?P<org>[\w.-]+)/(?P<name>[\w.-]+)(?:@(?P<rev>[^/]+))?(?:/(?P<sub>.+?))?/?")


def parse_spec(spec: str) -> tuple[str, str, str]:
    """``hf://datasets/ORG/NAME[@REV][/sub/dir]`` -> (repo_id, revision, sub); revision defaults to main."""
    m = _SPEC.fullmatch(spec)
    if not m:
        raise FidevalError(f"store spec {spec!r} is not hf://datasets/ORG/NAME@REVISION/sub/dir",
                           hint="or give a local folder")
    sub = m["sub"] or ""
    if any(part in ("", ".", "..") for part in sub.split("/")) and sub:
        raise FidevalError(f"store spec {spec!r}: sub-folder {sub!r} is not a plain relative path")
    return f"{m['org']}/{m['name']}", m["rev"] or "main", sub


def resolve_store(spec: str | Path, *, cache_dir: str | Path | None = None, local_files_only: bool | None = None) -> Path:
    """Return a local folder holding the store named by ``spec`` (downloading what is missing)."""
    if not str(spec).startswith("hf://"):
        path = Path(spec)
        if not path.is_dir():
            raise FidevalError(f"store {path} is not a folder", hint="give a store folder or hf://datasets/ORG/NAME@REV/sub")
        return path
    repo_id, revision, sub = parse_spec(str(spec))
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    offline = constants.HF_HUB_OFFLINE if local_files_only is None else local_files_only
    try:
        folder = snapshot_download(repo_id, repo_type="dataset", revision=revision, cache_dir=cache_dir,
                                   allow_patterns=[f"{sub}/**"] if sub else None, local_files_only=offline)
    except RevisionNotFoundError:
        raise FidevalError(f"{spec}: revision {revision!r} does not exist in dataset {repo_id}",
                           hint="check the revision (a commit hash, tag or branch)") from None
    except RepositoryNotFoundError:
        raise FidevalError(f"{spec}: dataset {repo_id} not found (or private)",
                           hint="check the name; log in with 'hf auth login'") from None
    except LocalEntryNotFoundError:
        raise FidevalError(f"{spec}: revision {revision!r} of {repo_id} is not in the local Hub cache and the Hub is not reachable",
                           hint="download it once online, or unset HF_HUB_OFFLINE") from None
    except (HfHubHTTPError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise FidevalError(f"{spec}: cannot fetch from the Hub ({first})", hint="check the network and the spec") from None
    path = Path(folder) / sub if sub else Path(folder)
    if not (path / "manifest.json").is_file():
        raise FidevalError(f"{spec}: no manifest.json under {sub or 'the repo root'} at revision {revision}",
                           hint="check the sub-folder in the spec")
    return path
