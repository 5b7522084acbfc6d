"""The torch fallback scorer: the figures of :mod:`fideval.score.metrics` for a block of rows, on any device.

Used on CPU (and on a GPU without Triton). It materialises float64 ``[rows, V]`` temporaries, so rows go
through in blocks sized to ``budget_bytes`` -- memory stays bounded whatever the shard length.
"""

from __future__ import annotations

import torch

from fideval.score.metrics import FIGURES, FLAGS

# ~12 float64-sized [block, V] temporaries live at once.
_TEMPS = 12


def _block_rows(vocab: int, budget_bytes: int) -> int:
    return max(1, budget_bytes // (_TEMPS * 8 * max(vocab, 1)))


def nonfinite_rows(logits: torch.Tensor) -> torch.Tensor:
    """Rows holding NaN or +inf, or no finite logit (all -inf)."""
    bad = torch.isnan(logits).any(dim=-1) | torch.isposinf(logits).any(dim=-1)
    return bad | ~torch.isfinite(logits).any(dim=-1)


def _all_finite(x: torch.Tensor) -> bool:
    """Every value finite, from one float32 sum: a NaN or an infinity makes the sum non-finite; a finite sum can
    come only from finite values (an overflow of finite values gives inf: then the careful path runs, as it would)."""
    return bool(torch.isfinite(x.sum()))


def _score_block(a32: torch.Tensor, b32: torch.Tensor, t: torch.Tensor,
                 careful: bool | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``careful``: the masks for -inf, +inf and NaN logits (None: only where a block holds a non-finite value; the
    masked sums of an all-finite block are the plain sums term for term, so both give the same bits)."""
    if careful is None:
        careful = not (_all_finite(a32) and _all_finite(b32))
    a, b = a32.double(), b32.double()
    ma = a.max(dim=1, keepdim=True).values
    mb = b.max(dim=1, keepdim=True).values
    xa, xb = a - ma, b - mb
    ea, eb = torch.exp(xa), torch.exp(xb)
    sa, sb = ea.sum(dim=1), eb.sum(dim=1)
    e = xa - xb
    if careful:
        fa, fb = torch.isfinite(a), torch.isfinite(b)
        both = fa & fb  # p > 0 exactly where a is finite (whether or not exp underflows)
        zero = torch.zeros((), dtype=torch.float64, device=a.device)
        ep_e = torch.where(both, ea * e, zero).sum(dim=1) / sa
        eq_e = torch.where(both, eb * e, zero).sum(dim=1) / sb
        ep_x = torch.where(fa, ea * xa, zero).sum(dim=1) / sa
        kl_inf = (fa & ~fb).any(dim=1)
        rkl_inf = (fb & ~fa).any(dim=1)
        del fa, fb, both
    else:
        ep_e, eq_e, ep_x = (ea * e).sum(dim=1) / sa, (eb * e).sum(dim=1) / sb, (ea * xa).sum(dim=1) / sa
        kl_inf = rkl_inf = torch.zeros(a.shape[0], dtype=torch.bool, device=a.device)
    del e, ea, eb, xa, xb
    log_ratio = torch.log(sa / sb)
    inf = torch.tensor(float("inf"), dtype=torch.float64, device=a.device)
    at = a.gather(1, t[:, None])[:, 0]
    bt = b.gather(1, t[:, None])[:, 0]
    ma, mb = ma[:, 0], mb[:, 0]
    figs = torch.stack([
        torch.where(kl_inf, inf, ep_e - log_ratio),
        torch.where(rkl_inf, inf, -eq_e + log_ratio),
        (ma - at) + torch.log(sa),
        (mb - bt) + torch.log(sb),
        torch.exp(bt - mb) / sb - torch.exp(at - ma) / sa,
        torch.log(sa) - ep_x,
        1.0 / sa,
    ], dim=1)
    # argmax: lowest index among equal maxima (torch.argmax documents the first occurrence)
    ia = torch.argmax(a32, dim=1)
    bi = b32.gather(1, ia[:, None])
    idx = torch.arange(b32.shape[1], device=b32.device)
    rank = (b32 > bi).sum(dim=1) + ((b32 == bi) & (idx[None, :] < ia[:, None])).sum(dim=1)
    flags = torch.stack([rank < 1, rank < 5, rank < 10, ia == t], dim=1)
    bad = nonfinite_rows(a32) | nonfinite_rows(b32) if careful else torch.zeros_like(kl_inf)
    return figs, flags, bad


def score_rows(ref: torch.Tensor, cand: torch.Tensor, targets: torch.Tensor, *,
               budget_bytes: int = 1 << 28) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Score ``ref``/``cand`` float32 ``[n, V]`` against realized ``targets`` ``[n]``.

    Returns figures float64 ``[n, 7]`` (``FIGURES`` order), flags bool ``[n, 4]`` (``FLAGS`` order) and the
    non-finite row mask bool ``[n]``, on the inputs' device.
    """
    n, vocab = ref.shape
    targets = targets.to(device=ref.device, dtype=torch.int64)
    figs = torch.empty((n, len(FIGURES)), dtype=torch.float64, device=ref.device)
    flags = torch.empty((n, len(FLAGS)), dtype=torch.bool, device=ref.device)
    bad = torch.empty((n,), dtype=torch.bool, device=ref.device)
    step = _block_rows(vocab, budget_bytes)
    for s in range(0, n, step):
        figs[s:s + step], flags[s:s + step], bad[s:s + step] = _score_block(
            ref[s:s + step], cand[s:s + step], targets[s:s + step])
    return figs, flags, bad
