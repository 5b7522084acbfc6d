"""Several models of one checkpoint through each chunk together: the fused pass (teacher and candidates).

Why: a separate candidate pass reads every layer's weights from disk again, and reads the teacher's whole store
back (DeepSeek-V4.1-Flash: 24 of an extrapolated 46 minutes, docs/runner.md "Run settings and accounting").
Here the teacher and every emulated candidate advance through each layer together: layer ``i``'s tensors are
read from disk once, into pinned host memory (as stored: FP8 with its scales), and each model copies them onto
the device and materialises its own weights from that copy (dequantized, transformed in place), so the device
holds at most two materialised units as in a separate pass, plus one unit's stored copy while it materialises
(kept on the device across the models, the read would add 11 GB of FP8 per DeepSeek-V3 MoE layer). The units
run in one fixed order, ``(layer, model)``; each model keeps its own hidden states
under the same chunks, micro-batches and MLP blocks as its separate pass, and computes with its own
:class:`~fideval.model.runner.Runner` steps, so every model's logits are bit-identical to its separate pass.

At the head the models take turns per micro-batch (the teacher first): a consumer scores each candidate's rows
against the teacher's rows of the same micro-batch while both are on the device (fideval.score.fused).

Refused (one line): the reference code (its own loading), model parallel, a candidate with its own weights (a
real build reads other files), and models whose bit-shaping settings differ.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from fideval.errors import FidevalError
from fideval.model.execution.prefetch import Prefetch
from fideval.model.layer_major import LayerMajor
from fideval.model.runner import Runner

SHAPING = ("dtype", "micro_batch", "host_budget", "device")  # what every model of a fused pass must share


class Lockstep(LayerMajor):
    """``Lockstep([teacher_runner, candidate_runner, ...])``; :meth:`run_models` yields ``(model, row, logits)``:
    per micro-batch the teacher's rows, then each candidate's. The first runner's stats and timeline are the
    pass's (give every runner the same timeline)."""

    def __init__(self, runners: list[Runner]):
        if not runners:
            raise ValueError("no runners")
        first = runners[0]
        for r in runners:
            if not isinstance(r, Runner):
                raise FidevalError("the fused pass runs the transformers runner only",
                                   hint="run the teacher and candidates separately with model.implementation: reference")
            if r.world > 1:
                raise FidevalError("the fused pass runs on one GPU (no model parallel)",
                                   hint="run the teacher and candidates separately under torchrun")
            if r.ckpt.dir != first.ckpt.dir or type(r.ckpt) is not type(first.ckpt):
                raise FidevalError(f"the fused pass needs every model on the reference weights ({first.ckpt.dir}); "
                                   f"one reads {r.ckpt.dir}", hint="score a real quantized build in its own pass")
            for key in SHAPING:
                if getattr(r, key) != getattr(first, key):
                    raise FidevalError(f"the fused pass needs one {key} for every model ({getattr(first, key)} vs "
                                       f"{getattr(r, key)})", hint="give the candidates the teacher's settings")
            if (r.options.mlp_tokens, r.adapter.arch) != (first.options.mlp_tokens, first.adapter.arch):
                raise FidevalError("the fused pass needs one architecture and MLP token block for every model")
            if r.timeline is not first.timeline:
                raise ValueError("the runners of a fused pass share one timeline")
        self.runners = runners
        self.n_models = len(runners)
        self.timeline, self.stats = first.timeline, first.stats
        self.vocab_size, self.hidden_size = first.vocab_size, first.hidden_size
        self.dtype, self.micro_batch, self.host_budget = first.dtype, first.micro_batch, first.host_budget
        self.device, self.side = first.device, first.side
        self._raw: dict[tuple, dict] = {}

    def finish_profile(self) -> dict:
        return self.runners[0].finish_profile()

    # -- loading (the prefetch thread) ------------------------------------------------------------------------
    def _load(self, key: tuple) -> torch.nn.Module:
        """Unit ``(chunk, "embed" | layer | "head", model)``, by that model's runner: a layer's tensors are read into
        (pinned) host memory for its first model and dropped once its last one has materialised them."""
        ci, unit, k = key
        r = self.runners[k]
        stored = None
        if unit not in ("embed", "head"):
            i = int(unit)
            if (ci, i) not in self._raw:
                self._raw = {(ci, i): r.adapter.read_layer(i, r.adapter.meta_layer(i, r.dtype), None,
                                                           pin=self.device.type == "cuda")}
            stored = self._raw[(ci, i)] if k < self.n_models - 1 else self._raw.pop((ci, i))
        return r._load(key, stored)  # the model in the key: a ledger shared by the runners counts each unit apart

    def _drained(self) -> None:
        """On a GPU, wait until the stream has run the unit just computed before the loader may start the unit after
        next: a unit's weights, recorded on the compute stream, cannot be reused until the kernels reading them are
        done, so without this wait the next load could find that memory still taken. Moves no bits. (The full-size
        out-of-memory it was added for turned out to be a reference cycle in fideval.model.execution.hooks; a snapshot there
        showed no memory pending on the stream. The wait's own cost is not measured apart: docs/runner.md, 'The
        fused pass'.)"""
        if self.side is not None:
            torch.cuda.current_stream(self.device).synchronize()

    # -- one chunk, every model --------------------------------------------------------------------------------
    def _chunk_models(self, tokens: np.ndarray, mbs: list[list[int]], ci: int, solo: set[int], canary: int | None
                      ) -> Iterator[tuple[int, int, int, torch.Tensor]]:
        n_layers, K = self.runners[0].adapter.n_layers, self.n_models
        units = ([(ci, "embed", k) for k in range(K)] + [(ci, i, k) for i in range(n_layers) for k in range(K)]
                 + [(ci, "head", k) for k in range(K)])
        self.stats["chunks"] += 1
        tl = self.timeline
        with tl.part("setup"):
            pf = Prefetch(units, self._load, 1 if self.runners[0].options.prefetch else 0, self.stats)

        def get():
            with tl.part("load_wait"):
                return pf.get()

        try:
            with torch.no_grad(), self.runners[0]._attn_backends():
                for r in self.runners:
                    r.warm()
                cs = [r.begin(tokens, mbs, solo, canary) for r in self.runners]
                for r, c in zip(self.runners, cs):
                    r.embed_step(c, get())
                    pf.release()
                for i in range(n_layers):
                    for r, c in zip(self.runners, cs):
                        r.layer_step(c, i, get())
                        self._drained()
                        pf.release()
                heads = []
                for _ in range(K):  # every head resident: the candidates' rows meet the teacher's per micro-batch
                    heads.append(get())
                    pf.release()  # the prefetch bound counts layers; heads are at most K units, after the last layer
                for j, mb in enumerate(mbs):
                    for k, (r, c, head) in enumerate(zip(self.runners, cs, heads)):
                        logits = r.head_step(c, head, j)
                        for q, row in enumerate(mb):
                            yield k, j, row, logits[q]
                        del logits
                del heads
        finally:
            pf.close()
            self._raw.clear()
