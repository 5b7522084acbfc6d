"""Bench: a long-context run through the verbs on one GPU -- ``fideval teacher`` (hidden store) and ``fideval score
--config`` (the MXFP4-experts candidate, serving path) on windows of 32,768 tokens, with bench/evaluation.py's random
checkpoint in DeepSeek-V3's FP8 release layout (1 dense + 2 MoE layers at the real sizes; its config's
max_position_embeddings is DeepSeek-V3's 163,840).

Run on the GPU machine: ``PYTHONPATH=. python3 bench/long_context.py`` (``--small`` for a CPU smoke run; the verbs'
packages as bench/evaluation.py says). Prints one table: each verb's wall time, tokens/s (its own profile), the GPU's
peak memory while it ran (nvidia-smi, every 200 ms), the store's bytes against what FP32 logits would take, and the
scored rows' mean KLD.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import evaluation as ev  # noqa: E402  (bench/evaluation.py: the checkpoint, windows, config and verb helpers)


class PeakMemory:
    """The GPU's largest memory.used (MiB) while the block runs, polled with nvidia-smi (the verb is another process)."""

    def __init__(self):
        self.peak, self._stop = 0, threading.Event()

    def _poll(self):
        while not self._stop.is_set():
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                     capture_output=True, text=True, timeout=5).stdout
                self.peak = max([self.peak] + [int(x) for x in out.split() if x.strip().isdigit()])
            except (OSError, subprocess.SubprocessError):
                return
            self._stop.wait(0.2)

    def __enter__(self):
        self._t = threading.Thread(target=self._poll, daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join(timeout=10)
        return False


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true", help="CPU-sized smoke run")
    ap.add_argument("--dir", default="/tmp/fideval-evaluation")
    ap.add_argument("--length", type=int, default=32768)
    ap.add_argument("--windows", type=int, default=2)
    ap.add_argument("--result", default=None)
    a = ap.parse_args()
    import torch

    s = dict(ev.SMALL if a.small else ev.V3)
    device = "cuda" if torch.cuda.is_available() and not a.small else "cpu"
    L = min(a.length, 1024) if a.small else a.length
    work = Path(a.dir)
    ckpt = work / "ckpt"
    work.mkdir(parents=True, exist_ok=True)
    if not (ckpt / "model.safetensors.index.json").is_file():
        ev.write_checkpoint(ckpt, s)
    cfg_json = json.loads((ckpt / "config.json").read_text())
    if cfg_json.get("max_position_embeddings", 0) < L:  # an older rehearsal checkpoint: DeepSeek-V3's own limit
        cfg_json["max_position_embeddings"] = 163840
        (ckpt / "config.json").write_text(json.dumps(cfg_json, indent=1))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), "PYTHONUNBUFFERED": "1"}
    long = work / "long"
    import shutil

    shutil.rmtree(long, ignore_errors=True)
    win = ev.write_windows(long / "windows", s["vocab"], a.windows, L)  # a.windows sequences of L tokens
    cfg = long / "long.yaml"
    ev.write_config(cfg, ckpt, device, long / "unused.jsonl")
    rows, result = [], {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "L": L, "windows": a.windows}
    store, rec = long / "teacher", long / "records"
    with PeakMemory() as pm:
        t_s, _ = ev.verb(["teacher", "--config", str(cfg), "--windows", str(win), "--out", str(store), "--device", device,
                          "--store", "hidden"], env)
    meta = json.loads((store / "manifest.json").read_text())["meta"]
    prof, block = json.loads(meta["profile"]), json.loads(meta["teacher"])
    nbytes = sum(p.stat().st_size for p in store.rglob("*.safetensors"))
    logit_bytes = a.windows * L * s["vocab"] * 4
    result["teacher"] = {"wall_s": t_s, "profile": prof, "settings": {k: block.get(k) for k in ("micro_batch", "mlp_tokens",
                         "chunk_bytes", "lm_head")}, "peak_mib": pm.peak, "store_bytes": nbytes}
    rows += [(f"fideval teacher, {a.windows} x {L:,} tokens, hidden store", f"{t_s:.1f} s ({prof.get('wall_s', 0):.1f} s run), "
              f"{prof.get('tokens_per_s') or 0:,.0f} tokens/s, peak GPU {pm.peak / 1024:.1f} GiB; settings micro-batch "
              f"{block.get('micro_batch')}, MoE block {block.get('mlp_tokens')}; " + ev.parts_line(prof), ""),
             ("teacher store", f"{nbytes / 1e9:.2f} GB (FP32 logits would be {logit_bytes / 1e9:.1f} GB: "
              f"{logit_bytes / nbytes:.0f}x)", "")]
    with PeakMemory() as pm:
        s_s, _ = ev.verb(["score", "--teacher", str(store), "--config", str(cfg), "--candidate", "mxfp4-experts", "--path",
                          "serving", "--out", str(rec), "--device", device], env)
    sj = json.loads((rec / "score.json").read_text())
    sp = sj.get("profile") or {}
    kld = ev._records_kld(rec / "records.parquet")
    result["score"] = {"wall_s": s_s, "profile": sp, "rows": sj.get("rows"), "peak_mib": pm.peak, "mean_kld": kld}
    rows += [("fideval score --config (MXFP4 serving) against it", f"{s_s:.1f} s, {sj.get('rows'):,} rows, "
              f"{sp.get('tokens_per_s') or 0:,.0f} tokens/s, peak GPU {pm.peak / 1024:.1f} GiB, mean KLD {kld:.6g}; scoring loop "
              f"{ev.scoring_rate(sp, sj.get('rows') or 0):,.0f} rows/s; " + ev.parts_line(sp), "")]
    if a.result:
        Path(a.result).write_text(json.dumps(result, default=str, indent=1))
    ev.print_table(rows, f"bench/long_context.py on {result['device']}")


if __name__ == "__main__":
    main()
