"""The model card's metadata in the fidelity model-card format: ``model-index`` and ``x_fidelity``.

Built with huggingface_hub's own card classes (``EvalResult``, ``ModelCardData``), so the YAML is what the
Hub writes and reads back: ``ModelCard.load`` + ``save`` leaves it byte for byte unchanged.

Why the shape is what it is:
  - one model-index result per (path, length). The Hub groups EvalResults into results by (task type,
    dataset type, config, split, revision), never by ``dataset.args``; so each (path, length) gets its own
    ``dataset.config`` (``serving-2048``), else a load/save would merge the four results into one;
  - two metric types, ``kl_divergence`` (its statistic in ``config``: mean, p50, p90, p99, p99.9) and
    ``top1_agreement``, each with ``args`` saying how to read the number: units, whether higher is better,
    the direction (KL(P_ref || P_cand): reference to candidate) and the estimator (every row over the full
    vocabulary in float64), then the interval;
  - ``dataset.revision`` is the Hub commit of published teacher logits, else a content hash of the windows'
    tokens (:func:`tokens_revision`): the same windows give the same revision whatever fideval wrote them,
    where a hash of eval-windows.json changed with every release (it records fideval's commit).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

SPEC_VERSION = "fidelity-provenance/v1"
ROLE = "quantized-candidate"
# x_fidelity.generator: the card's marker. ``fideval card`` replaces an existing --out file only when it carries it
# (a card it wrote), so a project's own README.md is never overwritten without --force
GENERATOR = "fideval card"
TASK = {"type": "text-generation", "name": "Fidelity to the reference model"}
LOCAL_DATASET_TYPE = "fideval-windows"
TAGS = ["fideval", "quantized", "fidelity-evaluation", "kl-divergence"]
ESTIMATOR = "full_vocabulary_fp64"
DIRECTION = "reference_to_candidate"
KLD_ARGS = {"units": "nats/token", "higher_is_better": False, "direction": DIRECTION, "estimator": ESTIMATOR}
TOP1_ARGS = {"units": "fraction of tokens", "higher_is_better": True, "direction": DIRECTION, "estimator": ESTIMATOR}
_HUB_STORE = re.compile(r"hf://datasets/(?P<repo>[\w.-]+/[\w.-]+)@(?P<rev>[^/]+)(?:/(?P<sub>.+?))?/?$")


def tokens_revision(dataset: dict[str, Any]) -> str | None:
    """SHA-256 over ``"<window id> <token SHA-256>\\n"`` of every window, sorted by id: the windows' content,
    independent of the file that lists them. None when a window's token hash is unknown (no --windows)."""
    wins = dataset.get("windows") or []
    if not wins or any(not w.get("token_sha256") for w in wins):
        return None
    text = "".join(f"{w['id']} {w['token_sha256']}\n" for w in sorted(wins, key=lambda w: w["id"]))
    return hashlib.sha256(text.encode()).hexdigest()


def published(report: dict[str, Any]) -> tuple[str, str, list[str]] | None:
    """(repo id, revision, folders) when every teacher store was read from one Hub dataset at one pinned
    revision, else None."""
    stores = [str(t.get("store")) for t in report["provenance"].get("teacher_stores") or []]
    hits = [_HUB_STORE.match(s) for s in stores]
    if not stores or not all(hits):
        return None
    pairs = {(m["repo"], m["rev"]) for m in hits if m is not None}
    if len(pairs) != 1:
        return None
    repo, rev = pairs.pop()
    folders = sorted({(m["sub"] or ".").split("/")[0] for m in hits if m is not None})
    return repo, rev, folders


def candidate_provenance(report: dict[str, Any], candidate: str) -> dict[str, Any]:
    """What the candidate is: model id and revision, quant spec or checkpoint or store, bits per weight, the
    store manifest's SHA-256; from report.json's ``provenance.candidates`` (score.json's candidate_info)."""
    entry = (report["provenance"].get("candidates") or {}).get(candidate) or {}
    info = entry.get("info") or {}
    bits = info.get("bits_per_weight") or {}
    ckpt = info.get("checkpoint") or entry.get("checkpoint")
    return {
        "source": info.get("source") or ("checkpoint" if ckpt else "emulated" if entry.get("quant") else None),
        "model_id": info.get("model_id"),
        "model_revision": info.get("model_revision"),
        "quant": info.get("quant") or entry.get("quant"),
        "checkpoint": ckpt,
        "bits_per_weight": _num((bits.get("total") or {}).get("bpw")),
        "store": info.get("store"),
        "store_manifest_sha256": info.get("manifest_sha256"),
    }


def head_bits(report: dict[str, Any], candidate: str) -> float | None:
    """Bits per weight of the output head (lm_head) in the candidate, scales included: 16 for a head left
    at bf16; None when the report does not record the candidate's bits."""
    entry = (report["provenance"].get("candidates") or {}).get(candidate) or {}
    per = ((entry.get("info") or {}).get("bits_per_weight") or {}).get("per_class") or {}
    return _num((per.get("lm_head") or {}).get("bpw"))


def _num(x: Any) -> float | None:
    return None if x is None else float(x)


def _teacher_meta(report: dict[str, Any]) -> dict[str, Any]:
    for m in report["provenance"].get("teacher_manifests") or []:
        t = (m.get("meta") or {}).get("teacher")
        if t:
            return json.loads(t) if isinstance(t, str) else dict(t)
    return {}


def teacher_kind(report: dict[str, Any]) -> str | None:
    """``logits`` (FP32 logits from the model) or ``logprobs`` (an imported, lossy llama.cpp file)."""
    kinds = {t.get("kind") for t in report["provenance"].get("teacher_stores") or [] if t.get("kind")}
    kinds |= {(m.get("meta") or {}).get("kind") for m in report["provenance"].get("teacher_manifests") or []}
    kinds.discard(None)
    return ", ".join(sorted(kinds)) if kinds else None


def teacher_head(report: dict[str, Any]) -> str | None:
    """A hidden teacher store's lm head content digest(s) (``weight_sha256`` of its head block): the head every
    replayed logit came from; None for logit stores."""
    heads = set()
    for m in report["provenance"].get("teacher_manifests") or []:
        raw = (m.get("meta") or {}).get("head")
        try:
            block = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            block = None
        if isinstance(block, dict) and block.get("weight_sha256"):
            heads.add(str(block["weight_sha256"]))
    heads |= {t["head_sha256"] for t in report["provenance"].get("teacher_stores") or [] if t.get("head_sha256")}
    return ", ".join(sorted(heads)) if heads else None


def measurement(report: dict[str, Any], candidate: str) -> dict[str, Any]:
    """How it was measured: the teacher's implementation, model parallel and hardware, and the scorer's."""
    t = _teacher_meta(report)
    runs = [
        run
        for s in ((report["provenance"].get("candidates") or {}).get(candidate) or {}).get("scoring", [])
        for run in s.get("runs", [])
    ]
    impl = f"{t['runner']} ({t.get('arch')}, {t.get('dtype')})" if t.get("runner") else None
    return {
        "implementation": impl,
        "model_parallel": int(t["model_parallel"]) if t.get("model_parallel") is not None else None,
        "teacher_hardware": t.get("device"),
        "scoring_hardware": ", ".join(sorted({str(r.get("device")) for r in runs if r.get("device")})) or None,
        "scoring_kernel": ", ".join(sorted({str(r.get("kernel")) for r in runs if r.get("kernel")})) or None,
    }


def _dataset(report: dict[str, Any]) -> dict[str, Any]:
    ds = report["provenance"]["dataset"]
    tokens = tokens_revision(ds)
    pub = published(report)
    if pub is not None:
        repo, rev, folders = pub
        return {"type": repo, "name": repo, "revision": rev, "tokens_sha256": tokens,
                "fidelity_dataset": f"{repo}@{rev} ({', '.join(folders)})"}
    return {"type": LOCAL_DATASET_TYPE, "name": str(ds["name"]), "revision": tokens, "tokens_sha256": tokens,
            "fidelity_dataset": f"{ds['name']} (local, not published)"}


def _bound(x: float | None) -> float | None:
    return None if x is None else float(x)


def _interval(fig: dict[str, Any]) -> dict[str, Any]:
    """The interval's bounds as the report gives them: null where it is unbounded (a flagged bootstrap-t interval
    on too few windows), never a number it does not have."""
    return {"ci_low": _bound(fig["ci"][0]), "ci_high": _bound(fig["ci"][1]), "confidence": float(fig["confidence"]),
            "interval": fig["method"]}


def eval_results(report: dict[str, Any], candidate: str) -> list[Any]:
    """One EvalResult per (path, length, metric): mean KLD, the KLD quantiles, top-1 agreement."""
    from huggingface_hub import EvalResult

    st = report["settings"]
    ds = _dataset(report)
    out = []
    for r in (r for r in report["results"] if r["candidate"] == candidate):
        o, length = r["overall"], int(r["length"])
        common = {
            "task_type": TASK["type"], "task_name": TASK["name"],
            "dataset_type": ds["type"], "dataset_name": f"{ds['name']} ({r['path']}, {length} tokens)",
            "dataset_config": f"{r['path']}-{length}", "dataset_split": "test", "dataset_revision": ds["revision"],
            "dataset_args": {"path": r["path"], "length": length, "windows": int(r["clusters"]), "rows": int(r["rows"]),
                             "domains": list(st["domains"])},
        }
        m = o["mean_kld"]
        out.append(EvalResult(**common, metric_type="kl_divergence", metric_config="mean",
                              metric_name="Mean KLD vs reference (nats/token)", metric_value=float(m["estimate"]),
                              metric_args={**KLD_ARGS, "statistic": "mean", **_interval(m), "resamples": int(st["resamples"]),
                                           "seed": int(st["seed"]), "clusters": int(m["clusters"])}))
        for q in o["kld_quantiles"]:
            stat = f"p{100 * q['q']:g}"
            out.append(EvalResult(**common, metric_type="kl_divergence", metric_config=stat,
                                  metric_name=f"KLD {100 * q['q']:g}th percentile (nats)", metric_value=float(q["estimate"]),
                                  metric_args={**KLD_ARGS, "statistic": stat, **_interval(q),
                                               "quantile_method": q["quantile_method"],
                                               **({"tail_windows": round(float(q["tail_windows"]), 1)}
                                                  if "tail_windows" in q else {})}))
        t = o["top1"]
        shown = t if "ci" in t else {**t["wilson"], "estimate": t["estimate"]}  # the report's default interval, else Wilson
        out.append(EvalResult(**common, metric_type="top1_agreement", metric_name="Top-1 agreement with reference",
                              metric_value=float(t["estimate"]),
                              metric_args={**TOP1_ARGS, **_interval(shown), "rows": int(t["rows"])}))
    return out


def x_fidelity(report: dict[str, Any], candidate: str, report_sha256: str, *, registry: str | None = None,
               lane: str | None = None) -> dict[str, Any]:
    prov, st = report["provenance"], report["settings"]
    rows = [r for r in report["results"] if r["candidate"] == candidate]
    ds = _dataset(report)
    tool = prov["tool"]
    return {
        "spec_version": SPEC_VERSION,
        "role": ROLE,
        "generator": GENERATOR,
        "reference_model": prov["reference"]["model_id"],
        "reference_revision": prov["reference"]["model_revision"],
        "fidelity_dataset": ds["fidelity_dataset"],
        "registry": registry,
        "lane": lane,
        "scope": {
            "paths": sorted({r["path"] for r in rows}),
            "lengths": sorted({int(r["length"]) for r in rows}),
            "domains": list(st["domains"]),
            "windows": int(st["clusters"]),
            "rows": int(sum(r["rows"] for r in rows)),
        },
        "head_bits": head_bits(report, candidate),
        "candidate": {"name": candidate, **candidate_provenance(report, candidate)},
        "teacher_kind": teacher_kind(report),
        "teacher_head_sha256": teacher_head(report),
        "dataset": {"name": str(prov["dataset"]["name"]), "tokens_sha256": ds["tokens_sha256"],
                    "sources": prov["dataset"]["sources"]},
        "measured_by": {
            "tool": "fideval",
            "version": tool["version"],
            "git_commit": tool["git_commit"],
            **measurement(report, candidate),
            "report_format": report["format"],
            "report_version": int(report["version"]),
            "report_sha256": report_sha256,
            "config_hash": prov["config_hash"],
            "resamples": int(st["resamples"]),
            "seed": int(st["seed"]),
        },
    }


def card_data(report: dict[str, Any], candidate: str, report_sha256: str, *, registry: str | None = None,
              lane: str | None = None) -> Any:
    """huggingface_hub's ModelCardData for the card: base model, tags, model-index, x_fidelity."""
    from huggingface_hub import ModelCardData

    prov = report["provenance"]
    xf = json.loads(json.dumps(x_fidelity(report, candidate, report_sha256, registry=registry, lane=lane)))
    return ModelCardData(base_model=prov["base_model"] or prov["reference"]["model_id"], tags=list(TAGS),
                         model_name=candidate, eval_results=eval_results(report, candidate), x_fidelity=xf)
