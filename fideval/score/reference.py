"""The numpy float64 reference scorer: the CPU check that every GPU run is held to.

Row by row, straight from the definitions in :mod:`fideval.score.metrics` with the row's global maxima
(no chunking, no online rescaling, numpy's pairwise sums), so it shares no code path with the kernels it
checks. Slow (a Python loop over rows) by design: it runs on a sample of rows.
"""

from __future__ import annotations

import numpy as np

from fideval.score.metrics import FIGURES, FLAGS


def nonfinite_rows(logits: np.ndarray) -> np.ndarray:
    """Rows holding NaN or +inf, or no finite logit (all -inf)."""
    x = np.asarray(logits)
    bad = np.isnan(x).any(axis=-1) | np.isposinf(x).any(axis=-1)
    return bad | ~np.isfinite(x).any(axis=-1)


def _rank(b: np.ndarray, i: int) -> int:
    """Tokens ahead of ``i`` in the candidate order (logit descending, index ascending)."""
    bi = b[i]
    return int(np.count_nonzero(b > bi) + np.count_nonzero(b[:i] == bi))


def score_row(a: np.ndarray, b: np.ndarray, t: int) -> tuple[np.ndarray, np.ndarray]:
    """Figures (float64, in ``FIGURES`` order) and flags (bool, ``FLAGS`` order) of one row."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    ma, mb = a.max(), b.max()
    xa, xb = a - ma, b - mb
    ea, eb = np.exp(xa), np.exp(xb)
    sa, sb = ea.sum(), eb.sum()
    fa, fb = np.isfinite(a), np.isfinite(b)
    both = fa & fb  # p > 0 exactly where a is finite (whether or not exp underflows)
    e = xa - xb  # log p - log q up to the constant log(S_a / S_b)
    ep_e = np.sum(ea[both] * e[both]) / sa
    eq_e = np.sum(eb[both] * e[both]) / sb
    ep_x = np.sum(ea[fa] * xa[fa]) / sa
    log_ratio = np.log(sa / sb)
    kld = np.inf if np.any(fa & ~fb) else ep_e - log_ratio  # q = 0 where p > 0
    rkld = np.inf if np.any(fb & ~fa) else -eq_e + log_ratio
    nll_ref = (ma - a[t]) + np.log(sa)
    nll_cand = (mb - b[t]) + np.log(sb)
    dp = np.exp(b[t] - mb) / sb - np.exp(a[t] - ma) / sa
    entropy = np.log(sa) - ep_x
    p1 = 1.0 / sa
    ia = int(np.argmax(a))
    rank = _rank(b, ia)
    figs = np.array([kld, rkld, nll_ref, nll_cand, dp, entropy, p1], dtype=np.float64)
    flags = np.array([rank < 1, rank < 5, rank < 10, ia == t], dtype=bool)
    assert figs.shape == (len(FIGURES),) and flags.shape == (len(FLAGS),)
    return figs, flags


def score_rows(ref: np.ndarray, cand: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Score rows ``[n, V]``: figures float64 ``[n, 7]`` and flags bool ``[n, 4]`` (non-finite rows are
    the caller's business: their figures are whatever IEEE arithmetic makes of them)."""
    n = len(targets)
    figs = np.empty((n, len(FIGURES)), dtype=np.float64)
    flags = np.empty((n, len(FLAGS)), dtype=bool)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        for r in range(n):
            figs[r], flags[r] = score_row(ref[r], cand[r], int(targets[r]))
    return figs, flags
