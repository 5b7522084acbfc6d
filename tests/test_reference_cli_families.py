"""DeepSeek-V3.2-Exp and DeepSeek-V4.1-Flash through the verbs with ``model.implementation: reference``: tiny
releases (tests/ref_deepseek_v32.py in float32, tests/ref_deepseek_v41.py with bf16 weights in bfloat16) through
``fideval teacher`` and ``fideval score --config`` with an MXFP4 routed-experts candidate on both paths, and
``fideval report``, whose ``provenance.reference`` carries each family's code (SHA-256 per file) and kernels.
The store holds the driver's own logits; the weights-only candidate is the vendor's own forward on the release
with its routed experts quantize-dequantized here by fideval.quant's MXFP4 (V4.1 also: an FP8/FP4 release's
MXFP4 candidate is the reference bit for bit, through the vendor's fp4_gemm)."""

from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import pytest
import ref_deepseek_v32 as rv32
import ref_deepseek_v41 as rv41
import torch
import yaml
from cli_runner import run_fideval
from test_model_teacher import _windows

from fideval.store import StoreReader

REV = "a" * 40
FAMILIES = {  # family -> (code folder, run dtype, expert tensors of the release: name filter)
    "v32": (rv32.VENDOR, "float32", lambda k: ".mlp.experts." in k and k.endswith("_proj.weight")),
    "v41": (rv41.V41, "bfloat16", lambda k: ".ffn.experts." in k and k.endswith(".weight")),
}


def _need(fam: str):
    if not (FAMILIES[fam][0] / "model.py").is_file():
        pytest.skip(f"vendor code not at {FAMILIES[fam][0]} (CI provides ../shared/reference-code)")


def _model(fam: str, folder, **kw):
    if fam == "v32":
        return rv32.write_tiny_v32(folder, dtype=torch.float32, **kw)
    return rv41.write_tiny_v41(folder, **{"dtype": "bf16", **kw})


def _driver(fam: str, folder):
    """The family's driver on ``folder`` at N = 1 on the CPU, as the runner opens it."""
    from fideval.model.device import resolve_dtype
    from fideval.model.reference.runner import open_driver

    return open_driver(folder, trust=True, dtype=resolve_dtype(FAMILIES[fam][1]))


def _tokens(store, ids):
    return torch.from_numpy(np.stack([store.token_ids(s) for s in ids]).astype(np.int64))


def _verbs(tmp, fam: str, model):
    sha = hashlib.sha256((model / "tokenizer.json").read_bytes()).hexdigest() if (model / "tokenizer.json").is_file() else "b" * 64
    _windows(tmp / "w", vocab=512, tokenizer_sha=sha)
    cfg = {"run": "t", "model": {"path": str(model), "id": f"toy/{fam}", "revision": REV, "implementation": "reference",
                                 "trust_remote_code": True},
           "domains": [{"name": "code", "source": {"type": "local", "path": "x.jsonl"}},
                       {"name": "prose", "source": {"type": "local", "path": "y.jsonl"}}],
           "teacher": {"device": "cpu", "micro_batch": 2, "dtype": FAMILIES[fam][1]},
           "candidates": [{"name": "mx", "quant": {"routed_experts": {"format": "mxfp4"}}, "paths": ["weights-only", "serving"]}]}
    path = tmp / "ref.yaml"
    path.write_text(yaml.safe_dump(cfg))
    res = run_fideval("teacher", "--config", path, "--windows", tmp / "w" / "cuts-8" / "tokens.safetensors",
                      "--lengths", "cuts", "--out", tmp / "teacher")
    assert res.code == 0, res.stderr
    for p in ("weights-only", "serving"):
        res = run_fideval("score", "--teacher", tmp / "teacher", "--config", path, "--candidate", "mx", "--path", p,
                          "--device", "cpu", "--out", tmp / f"scored-{p}")
        assert res.code == 0, res.stderr
    return path


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def ran(request, tmp_path_factory):
    fam = request.param
    _need(fam)
    tmp = tmp_path_factory.mktemp(f"refcli-{fam}")
    model = _model(fam, tmp / "model")
    path = _verbs(tmp, fam, model)
    return dict(fam=fam, tmp=tmp, model=model, path=path)


def test_teacher_store_holds_the_drivers_logits(ran):
    store = StoreReader(ran["tmp"] / "teacher")
    block = json.loads(store.meta["teacher"])
    assert block["implementation"] == "reference" and block["dtype"] == FAMILIES[ran["fam"]][1]
    code = block["reference_code"]
    assert code["family"] == {"v32": "deepseek_v32", "v41": "deepseek_v41"}[ran["fam"]]
    assert code["files"]["model.py"] == hashlib.sha256((FAMILIES[ran["fam"]][0] / "model.py").read_bytes()).hexdigest()
    drv = _driver(ran["fam"], ran["model"])
    ids = sorted(store.seq_ids)
    for a in range(0, len(ids), 2):  # the runner's micro-batches of 2, composed by hand
        toks = _tokens(store, ids[a:a + 2])
        state = drv.begin(toks)
        for i in range(drv.n_layers):
            state = drv.forward_layer(i, drv.load_layer(i), state)
        ref = drv.finish(state)
        for k, sid in enumerate(ids[a:a + 2]):
            assert torch.equal(torch.from_numpy(np.asarray(store.read(sid)[0], dtype=np.float32)), ref[k])


def test_mxfp4_weights_only_is_the_vendors_forward_on_mxfp4_experts(ran, tmp_path):
    from safetensors.torch import load_file, save_file

    from fideval.config import load_config
    from fideval.quant.base import get_format
    from fideval.score.candidate import from_config

    cand = from_config(load_config(ran["path"]), "mx", "weights-only", StoreReader(ran["tmp"] / "teacher"), "cpu")
    got = {s.seq_id: torch.as_tensor(np.asarray(s.logits)) for s in cand.shards}
    emu = tmp_path / "emu"
    shutil.copytree(ran["model"], emu, symlinks=True)
    sd = load_file(str(emu / "model.safetensors"))
    mx, n = get_format("mxfp4"), 0
    for k, v in sd.items():
        if FAMILIES[ran["fam"]][2](k):
            sd[k], n = mx.quant_dequant(v.float(), None, None).to(v.dtype), n + 1
    assert n == {"v32": 2 * 8 * 3, "v41": 6 * 4 * 3}[ran["fam"]]
    save_file(sd, str(emu / "model.safetensors"), metadata={"format": "pt"})
    drv = _driver(ran["fam"], emu)
    store = StoreReader(ran["tmp"] / "teacher")
    ids = sorted(store.seq_ids)
    for a in range(0, len(ids), 2):
        ref = drv.vendor_logits(_tokens(store, ids[a:a + 2]))
        for k, sid in enumerate(ids[a:a + 2]):
            assert (got[sid][-1] - ref[k]).abs().max().item() <= 1e-6 * ref.abs().max().item()
            teacher = torch.from_numpy(np.asarray(store.read(sid)[0], dtype=np.float32))[-1]
            assert (got[sid][-1] - teacher).abs().max().item() > 1e-3  # MXFP4 experts moved the logits


def test_score_on_both_paths_and_the_report_record_the_code(ran):
    import polars as pl

    tmp, fam = ran["tmp"], ran["fam"]
    kld = {}
    for p in ("weights-only", "serving"):
        summary = json.loads((tmp / f"scored-{p}" / "score.json").read_text())
        info = summary["candidate_info"]
        assert info["run_settings"]["reference_code"]["files"]["model.py"] == \
            hashlib.sha256((FAMILIES[fam][0] / "model.py").read_bytes()).hexdigest()
        assert summary["rows"] == 4 * 7
        kld[p] = pl.read_parquet(tmp / f"scored-{p}" / summary["records"])["kld"].to_numpy()
        assert np.isfinite(kld[p]).all() and 0 < kld[p].mean() < 5
    assert not np.array_equal(kld["weights-only"], kld["serving"])  # E4M3 activations into the experts
    res = run_fideval("report", "--records", tmp / "scored-weights-only", "--records", tmp / "scored-serving",
                      "--teacher-manifest", tmp / "teacher" / "manifest.json", "--config", ran["path"],
                      "--out", tmp / "report", "--no-plots", "--resamples", "100",
                      "--allow-partial")  # a few cuts of the config's windows: a report marked partial
    assert res.code == 0, res.stderr
    ref = json.loads((tmp / "report" / "report.json").read_text())["provenance"]["reference"]
    assert ref["implementation"] == "reference" and ref["trust_remote_code"] is True
    code = ref["reference_code"]
    folder = FAMILIES[fam][0]
    assert code["files"] == {k: hashlib.sha256((folder / k).read_bytes()).hexdigest() for k in code["files"]}
    assert "model.py" in code["files"] and code["kernels"]
    if fam == "v32":
        assert code["modules"] == {"fast_hadamard_transform": "fideval.model.reference.deepseek_v32_kernels",
                                   "kernel": "fideval.model.reference.deepseek_v32_kernels"}
    else:
        assert code["kernels"]["fp4_gemm"] == "kernel_cpu" and code["model"]["hc_mult"] == 2


@pytest.mark.slow
def test_v41_fp8_release_mxfp4_candidate_is_the_reference_bit_for_bit(tmp_path):
    """The vendor's FP4 experts already are MXFP4: the candidate re-encodes into the vendor's storage exactly
    and its fp4_gemm computes what the reference computed (score.json says which path the experts took)."""
    import polars as pl

    _need("v41")
    model = _model("v41", tmp_path / "model", dtype="fp8")
    _verbs(tmp_path, "v41", model)
    summary = json.loads((tmp_path / "scored-weights-only" / "score.json").read_text())
    kld = pl.read_parquet(tmp_path / "scored-weights-only" / summary["records"])["kld"].to_numpy()
    assert summary["rows"] == 4 * 7 and not kld.any()
    kernels = summary["candidate_info"]["run_settings"]["reference_code"]["kernels"]
    assert kernels["linears: routed_experts"] == "fp4_gemm (stored MXFP4 kept: the transform's identity)"
    served = json.loads((tmp_path / "scored-serving" / "score.json").read_text())
    assert pl.read_parquet(tmp_path / "scored-serving" / served["records"])["kld"].to_numpy().mean() > 0


def test_vendor_logits_runs_prepare_on_the_vendors_model(ran):
    """The contract's ``vendor_logits(tokens, prepare)``: ``prepare`` gets the vendor's ``Transformer`` before it
    runs (here: a forward hook doubling the head's output)."""
    drv = _driver(ran["fam"], ran["model"])
    store = StoreReader(ran["tmp"] / "teacher")
    toks = _tokens(store, sorted(store.seq_ids)[:2])
    plain = drv.vendor_logits(toks)
    seen = []

    def prepare(model):
        seen.append(type(model).__name__)
        model.head.register_forward_hook(lambda _m, _a, out: out * 2)

    doubled = _driver(ran["fam"], ran["model"]).vendor_logits(toks, prepare=prepare)
    assert seen == ["Transformer"]
    assert torch.equal(doubled, 2 * plain)


@pytest.mark.slow
@pytest.mark.parametrize("fam", sorted(FAMILIES))
def test_teacher_under_torchrun_at_model_parallel_2(fam, tmp_path):
    """The teacher's torchrun entry with the reference code on 2 gloo ranks (the default process group the
    vendors' collectives use; V3.2 then creates none of its own): rank 0 writes a store recording model parallel 2
    and the code, close to the one-rank store. Not equal: V3.2's E4M3 KV cache and V4.1's bf16 partial sums round
    N = 2's reassociated sums differently (docs/runner.md: V3.2 max 1.35e-3, V4.1 mean KLD 0.010 on bf16 weights)."""
    import os
    import socket
    import subprocess
    import sys

    _need(fam)
    model = _model(fam, tmp_path / "model")
    sha = hashlib.sha256((model / "tokenizer.json").read_bytes()).hexdigest() if fam == "v41" else "b" * 64
    _windows(tmp_path / "w", vocab=512, tokenizer_sha=sha)
    common = ["--model", str(model), "--windows", str(tmp_path / "w"), "--device", "cpu", "--lengths", "windows",
              "--dtype", FAMILIES[fam][1], "--implementation", "reference", "--trust-remote-code"]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for out, launch in (("one", []), ("two", ["-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(port)])):
        res = subprocess.run([sys.executable, *launch, "-m", "fideval.model.teacher", *common, "--out", str(tmp_path / out)],
                             capture_output=True, text=True, timeout=600, env=env)
        assert res.returncode == 0, res.stderr[-3000:]
    one, two = StoreReader(tmp_path / "one"), StoreReader(tmp_path / "two")
    meta = json.loads(two.meta["teacher"])
    assert meta["model_parallel"] == 2 and meta["reference_code"]["files"]["model.py"]
    assert json.loads(two.meta["canary"])["identical"]
    a = torch.cat([torch.from_numpy(np.asarray(one.read(s)[0], dtype=np.float32)) for s in sorted(one.seq_ids)])
    b = torch.cat([torch.from_numpy(np.asarray(two.read(s)[0], dtype=np.float32)) for s in sorted(one.seq_ids)])
    kld = (a.log_softmax(-1).exp() * (a.log_softmax(-1) - b.log_softmax(-1))).sum(-1)
    if fam == "v32":
        assert (a - b).abs().max().item() <= 1e-2 * a.abs().max().item()
    else:
        assert kld.mean().item() < 0.05
