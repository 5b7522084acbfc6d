"""Whether one sequence of each length fits the GPU the teacher will run on: the runner's own sizing
(:func:`fideval.model.sizing.choose`, which the teacher and ``fideval score --config`` call with the same
arguments) asked at ``windows.window_tokens`` and ``windows.cut_tokens``, so a window too long for the device is
refused in seconds instead of when the stage sizes its first chunk (or runs out of memory inside it).

What is sized (docs/runner.md, "Run settings and accounting"): the two largest weight units, the reserve, and one
micro-batch of ``L`` tokens at its largest phase -- attention (its ``heads x L`` scores per token where they are
materialised: the vendor's reference code, eager attention), the MoE block, or the head's float32 logits. The
teacher's ``micro_batch`` (and the noise floor's, ``report.noise_floor.micro_batch``) when given as a number is
checked as given; ``auto`` is what the runner would choose.

The device: ``FIDEVAL_GPU_GIB`` when set (GiB free on the GPU the teacher will get: an H200 showed 139.3 after its
CUDA context, 2026-12-07), else the free memory of this machine's first GPU when one is visible, else an 80 GB H100
as the teacher sees it (78.5 GiB free at its start, the worked example of docs/runner.md).

A CPU teacher (``teacher.device: cpu``: micro-batch 1, nothing sized by the runner) is checked where its attention
materialises the scores: the reference code, eager attention, and sdpa where the query/key head dim differs from the
value's (MLA: torch's CPU flash kernel needs them equal and sdpa falls back to its math path; measured: 2.5 GB more
resident for 4 heads x 8,192^2 float32 scores of 1 GB, none with equal dims; the demo model's teacher at 16,384 tokens
peaked at 11.2 GB, and at 32,768 was killed at 24 GB). One sequence's scores, ``heads x L^2 x (2 b + 4)`` bytes (the
estimate of fideval.model.sizing), must fit the machine's memory.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from fideval.errors import FidevalError
from fideval.validate.findings import Findings
from fideval.validate.model import Probe

if TYPE_CHECKING:
    from fideval.config import Config

GiB = float(1 << 30)
H100_FREE = int(78.5 * GiB)  # an H100 80GB as the teacher found it (docs/runner.md, the worked example)
ENV = "FIDEVAL_GPU_GIB"


def device_free() -> tuple[int, str]:
    """(bytes free on the teacher's GPU, where that number comes from)."""
    text = os.environ.get(ENV)
    if text is not None:
        try:
            gib = float(text)
        except ValueError:
            gib = float("nan")
        if not (gib > 0 and gib < 1e6):
            raise FidevalError(f"{ENV}={text!r} is not a positive number of GiB", hint=f"e.g. {ENV}=139.3, or unset it")
        return int(gib * GiB), f"{gib:g} GiB free ({ENV})"
    try:
        import torch

        if torch.cuda.is_available():
            free, _ = torch.cuda.mem_get_info(0)
            return int(free), f"{free / GiB:.1f} GiB free on this machine's {torch.cuda.get_device_name(0)}"
    except (ImportError, RuntimeError):  # a broken CUDA install: size the default card
        pass
    return H100_FREE, f"78.5 GiB free, an 80 GB H100 (no GPU here; {ENV} sets another)"


def sizing_model(cfg: Config, probe: Probe, driver: Any) -> Any:
    """What the stage hands :func:`~fideval.model.sizing.choose`: transformers' config as the runner's adapter
    built it (its attention implementation set), or for the reference code its ``sizing_config``."""
    if getattr(cfg.model, "implementation", "transformers") == "reference":
        if driver is None:
            return None
        from fideval.model.reference.runner import sizing_config

        return sizing_config(driver, probe.config or {})
    return probe.adapter.config if probe.adapter is not None else None


def _runs(cfg: Config) -> list[tuple[str, int | str]]:
    """(config key of the micro-batch, its value) of every teacher pass: the teacher's, the noise floor's."""
    out: list[tuple[str, int | str]] = [("teacher.micro_batch", cfg.teacher.micro_batch)]
    if cfg.report.noise_floor is not None:
        out.append(("report.noise_floor.micro_batch", cfg.report.noise_floor.micro_batch))
    return out


def _models(cfg: Config) -> int:
    if not cfg.teacher.fused:
        return 1
    from fideval.score.fused import fusable

    return 1 + len(fusable(cfg))


def check(cfg: Config, probe: Probe, found: Findings, driver: Any = None) -> None:
    """A problem on the length's key when one sequence of it does not fit beside the weights, or on the micro-batch
    key when a given micro-batch does not; a fact line with the sizing of each length otherwise."""
    model = sizing_model(cfg, probe, driver)
    if model is None:
        return  # the model is not local (a note says so) or was refused (a problem says so)
    from fideval.model.device import resolve_dtype

    if cfg.teacher.device == "cpu":
        _check_cpu(cfg, model, resolve_dtype(cfg.teacher.dtype), found)
        return

    try:
        free, where = device_free()
    except FidevalError as e:
        found.add(None, e)
        return
    reference = getattr(cfg.model, "implementation", "transformers") == "reference"
    fp8 = (probe.config or {}).get("quantization_config", {}) or {}
    kw = dict(world=cfg.teacher.model_parallel, free_bytes=free, math_attention=True if reference else None,
              split_heads=reference, models=_models(cfg),
              grouped_experts=reference and getattr(cfg.model, "reference_experts", "vendor") == "grouped",
              stored_bytes=1 if cfg.teacher.fused and fp8.get("quant_method") == "fp8" else None,
              mlp_tokens=cfg.teacher.mlp_tokens, chunk_bytes=cfg.teacher.chunk_bytes)
    dtype = resolve_dtype(cfg.teacher.dtype)
    w = cfg.windows
    lengths = [(n, L, k) for n, L, k in (("windows", w.window_tokens, "windows.window_tokens"),
                                         ("cuts", w.cut_tokens, "windows.cut_tokens")) if n in cfg.teacher.lengths]
    sized = []
    for name, L, key in lengths:
        n_seq = w.windows_per_domain * (w.window_tokens // L)
        fits = _fits(model, dtype, L, n_seq, kw)
        if not fits:
            found.add(key, _too_long(model, dtype, L, name, kw, where), hint=_shorter(model, dtype, cfg, name, kw))
            continue
        st = fits
        for mb_key, mb in _runs(cfg):
            if mb == "auto":
                continue
            need = int(mb) * L * _call(st) + st.plan["weights_bytes"] + st.plan["reserve_bytes"]
            if need > free:
                best = _most(model, dtype, L, n_seq, kw, free)
                found.add(mb_key, f"{mb} sequences of {L:,} tokens ({name}) in one attention call need {need / GiB:.1f} GiB "
                          f"with the weights and reserve, and the GPU has {where}",
                          hint=f"set {mb_key} to {best} or less" + (", or to auto" if mb_key == "teacher.micro_batch" else ""))
        shown = cfg.teacher.micro_batch if cfg.teacher.micro_batch != "auto" else st.micro_batch
        sized.append(f"{name} {L:,}: micro-batch {shown}, one sequence's largest phase "
                     f"{L * _call_one(st) / GiB:.3g} GiB")
    if sized:
        found.facts.append(f"attention and head sized for {where}: " + "; ".join(sized))


def _call(st) -> float:
    """Bytes a token of one attention call (or head) holds, with its hidden state: what ``choose`` divides A by."""
    p = st.plan["per_token"]
    head = p["head"] * (3 if st.plan["models"] > 1 else 1)
    return max(p["attention"] + p["scores"], head) + p["state"]


def _call_one(st) -> float:
    p = st.plan["per_token"]
    return max(p["attention"] + p["scores"], p["mlp"], p["head"]) + p["state"]


def _fits(model, dtype, L: int, n_seq: int, kw: dict):
    """The runner's settings at length ``L``, or None where it refuses (one sequence does not fit)."""
    from fideval.model import sizing

    try:
        return sizing.choose("cuda", dtype, model, L, n_sequences=n_seq, micro_batch="auto", **kw)
    except FidevalError:
        return None


def _most(model, dtype, L: int, n_seq: int, kw: dict, free: int) -> int:
    """The most sequences of ``L`` tokens one attention call can hold (at least 1): the runner's auto choice
    without its 16,384-token target."""
    st = _fits(model, dtype, L, n_seq, kw)
    room = free - st.plan["weights_bytes"] - st.plan["reserve_bytes"]
    return max(1, int(room // (L * _call(st))))


def _too_long(model, dtype, L: int, name: str, kw: dict, where: str) -> str:
    from fideval.model import sizing

    fp = sizing.footprint(model, dtype, L, kw["world"], bool(kw["math_attention"]) or _eager(model), kw["split_heads"])
    phases = {"attention": fp.attention + fp.scores, "MoE/MLP": fp.mlp, "head": fp.head}
    biggest = max(phases, key=phases.get)
    what = biggest + (f" (its materialised scores: {fp.scores * L / GiB:.1f} GiB)" if biggest == "attention" and fp.scores
                      else "")
    free = kw["free_bytes"]
    reserve = sizing.RESERVE_BYTES + sizing.RESERVE_FRACTION * free
    return (f"{name} of {L:,} tokens do not fit the teacher's GPU: one sequence needs {L * (phases[biggest] + fp.state) / GiB:.1f}"
            f" GiB at its largest phase, the {what}, beside two weight units of {fp.unit_bytes / GiB:.1f} GiB and the "
            f"{reserve / GiB:.1f} GiB reserve, and the GPU has {where}")


def _eager(model) -> bool:
    impl = model.get("_attn_implementation") if isinstance(model, dict) else getattr(model, "_attn_implementation", None)
    return impl == "eager"


def _shorter(model, dtype, cfg: Config, name: str, kw: dict) -> str:
    """What to change: the longest length of the same kind that fits (a multiple of the cut for windows, a divisor
    of the window for cuts), then the other levers."""
    w = cfg.windows
    if name == "windows":
        options = range(w.window_tokens - w.cut_tokens, 0, -w.cut_tokens)
        key = "windows.window_tokens"
    else:
        options = (d for d in range(w.cut_tokens - 1, 0, -1) if w.window_tokens % d == 0)
        key = "windows.cut_tokens"
    best = next((L for L in options if _fits(model, dtype, L, 1, kw)), None)
    L = w.window_tokens if name == "windows" else w.cut_tokens
    levers = [f"lower {key} to {best:,} or less"] if best is not None else []
    world = next((n for n in (2, 4, 8, 16) if n > kw["world"] and _fits(model, dtype, L, 1, {**kw, "world": n})), None)
    if world is not None:
        levers.append(f"set teacher.model_parallel: {world}")
    if cfg.teacher.dtype != "bfloat16" and _fits(model, resolve_bf16(), L, 1, kw):
        levers.append("set teacher.dtype: bfloat16")
    levers.append(f"size for a larger GPU with {ENV}")
    return ", or ".join(levers)


def resolve_bf16():
    import torch

    return torch.bfloat16


def host_memory() -> int:
    """This machine's physical memory in bytes (what a CPU teacher has)."""
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def _cpu_math(cfg: Config, model) -> bool:
    """Whether a CPU teacher's attention materialises its scores (module docstring)."""
    if getattr(cfg.model, "implementation", "transformers") == "reference" or _eager(model):
        return True
    get = model.get if isinstance(model, dict) else lambda k, v=None: getattr(model, k, v)
    if get("kv_lora_rank"):
        return int(get("qk_nope_head_dim")) + int(get("qk_rope_head_dim")) != int(get("v_head_dim"))
    return False


def _check_cpu(cfg: Config, model, dtype, found: Findings) -> None:
    if not _cpu_math(cfg, model):
        return
    from fideval.model import sizing

    ram, w = host_memory(), cfg.windows

    def need(L: int) -> float:
        fp = sizing.footprint(model, dtype, L, 1, True, False)
        return L * (fp.attention + fp.scores + fp.state)

    for name, L, key, options in (
            ("windows", w.window_tokens, "windows.window_tokens", range(w.window_tokens - w.cut_tokens, 0, -w.cut_tokens)),
            ("cuts", w.cut_tokens, "windows.cut_tokens", (d for d in range(w.cut_tokens - 1, 0, -1) if w.window_tokens % d == 0))):
        if name not in cfg.teacher.lengths or need(L) <= ram:
            continue
        best = next((n for n in options if need(n) <= ram), None)
        found.add(key, f"{name} of {L:,} tokens do not fit the CPU teacher: its attention materialises the scores (sdpa's "
                  f"math path), one sequence's {need(L) / GiB:.1f} GiB, and this machine has {ram / GiB:.1f} GiB",
                  hint=(f"lower {key} to {best:,} or less, or " if best else "") + "run the teacher on a GPU with teacher.device: cuda")
