"""The transformers runner's lm head: its weights read (this rank's rows, after a candidate's transform) with the
final norm, the head's arithmetic chosen (fideval.model.execution.head), and the whole head exported for a hidden
store (fideval.store.head). A mixin of :class:`fideval.model.runner.Runner`, kept apart so the runner's file holds
the layer loop."""

from __future__ import annotations

import torch

from fideval.errors import FidevalError
from fideval.model.execution import head as head_math


class HeadLoading:
    """Needs the runner's ``adapter``, ``ckpt``, ``options``, ``device``, ``dtype``, ``act_transform``, ``rank``,
    ``world``, ``group``, ``vocab_bounds``, ``vocab_size``, ``head_mode``, ``output`` and ``_read``."""

    def _head_weights(self) -> tuple[torch.Tensor, torch.nn.Module]:
        """This rank's lm head rows in float32 (after the candidate's weight transform) and the final norm."""
        keys, H = self.adapter.top_keys(), self.adapter.config.hidden_size
        w = self._read(keys["lm_head"], torch.float32, rows=self.vocab_bounds[self.rank])
        if w.ndim != 2 or w.shape[1] != H:
            raise FidevalError(f"{self.ckpt.dir}: {keys['lm_head']} has shape {list(w.shape)}, config.json implies "
                               f"[{self.vocab_size}, {H}]", hint="the checkpoint does not match config.json")
        if self.options.weight_transform is not None:
            w = self.adapter.transform(self.options.weight_transform, "lm_head", "lm_head.weight", w, owned=True)
        norm_w = self._read(keys["norm"], self.dtype)
        if tuple(norm_w.shape) != (H,):
            raise FidevalError(f"{self.ckpt.dir}: model.norm.weight has shape {list(norm_w.shape)}, config.json implies "
                               f"[{H}]", hint="the checkpoint does not match config.json")
        return w, self.adapter.final_norm(norm_w)

    def _load_head(self) -> torch.nn.Module:
        if self.output == "hidden":  # the final norm alone: the head is the store's (export_head), applied on replay
            mod = torch.nn.Module()
            mod.norm = self._final_norm()
            return mod
        w, norm = self._head_weights()
        mod = torch.nn.Module()
        mod.norm = norm
        if self.head_mode == "bf16":
            if not head_math.exact(w):  # the mode was chosen on these weights: a transform that is not repeatable
                raise FidevalError(f"{self.ckpt.dir}: the lm head's weights changed between loads (no longer bfloat16-exact)",
                                   hint="run with lm head float32")
            mod.lm_head = head_math.Bf16Head(w.to(torch.bfloat16))
            return mod
        mod.lm_head = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, device="meta")
        mod.lm_head.load_state_dict({"weight": w}, assign=True)
        return mod

    def _final_norm(self) -> torch.nn.Module:
        H = self.adapter.config.hidden_size
        norm_w = self._read(self.adapter.top_keys()["norm"], self.dtype)
        if tuple(norm_w.shape) != (H,):
            raise FidevalError(f"{self.ckpt.dir}: model.norm.weight has shape {list(norm_w.shape)}, config.json implies "
                               f"[{H}]", hint="the checkpoint does not match config.json")
        return self.adapter.final_norm(norm_w)

    def export_head(self) -> tuple[torch.Tensor, dict]:
        """The whole lm head as this run applies it (every vocabulary row, after the candidate's weight transform; on the
        CPU) and how (fideval.store.head's block: the mode, the family's finishing step, the tensor it came from, the
        final norm's output dtype): what a hidden store keeps beside its states."""
        keys, H = self.adapter.top_keys(), int(self.adapter.config.hidden_size)
        w = self.adapter.cast(self.adapter.read(keys["lm_head"], rows=(0, self.vocab_size)), torch.float32)
        if w.ndim != 2 or tuple(w.shape) != (self.vocab_size, H):
            raise FidevalError(f"{self.ckpt.dir}: {keys['lm_head']} has shape {list(w.shape)}, config.json implies "
                               f"[{self.vocab_size}, {H}]", hint="the checkpoint does not match config.json")
        if self.options.weight_transform is not None:
            w = self.adapter.transform(self.options.weight_transform, "lm_head", "lm_head.weight", w, owned=True)
        norm_w = self.adapter.cast(self.adapter.read(keys["norm"]), self.dtype)
        probe = self.adapter.final_norm(norm_w)(torch.zeros((1, H), dtype=self.dtype))
        info = {"lm_head": self.head_mode, "finish": self.adapter.head_finish(), "source": keys["lm_head"],
                "tied": keys["lm_head"] == keys["embed"], "hidden_dtype": str(probe.dtype).removeprefix("torch."),
                "hidden_size": H}
        return w, info

    def _choose_head(self) -> str:
        """The lm head's mode (fideval.model.execution.head): ``options.head`` or, for ``auto``, ``bf16`` where it forms the
        float32 head's own products, else ``float32``. Under model parallel every rank takes the same mode."""
        want = self.options.head
        if want not in head_math.MODES:
            raise FidevalError(f"lm head mode {want!r} is not known", hint=f"use one of {', '.join(head_math.MODES)}")
        if want == "float32":
            return "float32"
        why = head_math.unusable(self.device, self.dtype, self.act_transform)
        if why is None:
            keys, H = self.adapter.top_keys(), int(self.adapter.config.hidden_size)
            if self.options.weight_transform is None and self.ckpt.info(keys["lm_head"]).dtype == torch.bfloat16:
                w, norm = None, self.adapter.final_norm(self._read(keys["norm"], self.dtype))  # stored bf16: exact
            else:  # a transform (or another stored dtype) decides by the values: the head read once here
                w, norm = self._head_weights()
            if w is not None and not head_math.exact(w):
                why = "its weights (after the candidate's transform) are not bfloat16 values"
            elif norm(torch.zeros((1, H), dtype=self.dtype, device=self.device)).dtype != torch.bfloat16:
                why = "the final norm does not return bfloat16"
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)  # the pinned staging of the read is done with
            del w, norm
        return head_math.settle(want, why, self.device, self.world, self.group)

