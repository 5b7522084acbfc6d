"""What the scorer computes per next-token row, and how two computations of it are compared.

Every figure is a function of two FP32 logit rows over the full vocabulary, ``a`` (reference, the teacher)
and ``b`` (candidate), and the realized next token ``t``; all arithmetic is float64. With ``M = max a``,
``S = sum exp(a - M)`` (so ``lse(a) = M + log S``) and the same for ``b``:

- ``kld``  = KL(P_ref || P_cand) = E_p[(a - M_a) - (b - M_b)] - log(S_a / S_b)  (nats)
- ``rkld`` = KL(P_cand || P_ref) = -E_q[(a - M_a) - (b - M_b)] + log(S_a / S_b)
- ``nll_ref`` = lse(a) - a_t = (M_a - a_t) + log S_a; ``nll_cand`` likewise
- ``dp`` = q_t - p_t (candidate minus reference probability of the realized token)
- ``entropy_ref`` = log S_a - E_p[a - M_a];  ``p1_ref`` = max_v p_v = 1 / S_a
- ``top1``: argmax b == argmax a; ``top5`` / ``top10``: the reference top-1 token is among the candidate's
  top-5 / top-10 tokens; ``ref_correct``: argmax a == t.

Why the max-relative form: ``log p - log q`` written as ``(a - b) - (lse_a - lse_b)`` subtracts two
log-sum-exps of size ~20 whose rounding (~4e-15) swamps a small KLD; subtracting the maxima first keeps
every term O(the logit difference), so identical rows give exactly 0 and small KLDs keep their digits.

Ties: the argmax is the LOWEST index among equal maxima (np.argmax / torch.argmax). The candidate's top-k
set is the first k tokens when the vocabulary is ordered by (logit descending, index ascending), so
``topk`` <=> #{v : b_v > b_i or (b_v == b_i and v < i)} < k with i the reference argmax; ``top1`` is the
k = 1 case. -0.0 and +0.0 are equal logits.

-inf logits are allowed (masked tokens: p = 0, and 0 * log 0 = 0). A row holding NaN or +inf, or no
finite logit at all, is *non-finite*: it fails the run, or is skipped and counted (``--on-nonfinite skip``).
``kld`` is +inf exactly when some token has a finite reference logit and a -inf candidate logit (p > 0 =
q, decided on the logits, not on whether exp underflows in float64); ``rkld`` mirrors it. A masked
realized token gives an infinite NLL.
"""

from __future__ import annotations

import numpy as np

FIGURES = ("kld", "rkld", "nll_ref", "nll_cand", "dp", "entropy_ref", "p1_ref")
FLAGS = ("top1", "top5", "top10", "ref_correct")

# Below this magnitude the comparison becomes absolute: |x - r| <= tolerance * floor (2e-14 at the
# default tolerance 2e-12). Why: a KLD is E_p[xa - xb] - log(S_a / S_b); two correct float64 evaluations
# (numpy's exp vs libdevice's, each within 1 ulp, and different summation orders) move log(S_a / S_b)
# by a few 1e-16 whatever the KLD, so a KLD of 1e-6 nats cannot agree to 12 significant digits -- but it
# does agree to 2e-14 nats, ~100 ulps of the log-sum-exp ratio. The same floor serves every figure.
REL_FLOOR = 1e-2


def rel_diff(x: np.ndarray, ref: np.ndarray, floor: float) -> np.ndarray:
    """``|x - ref| / max(|ref|, floor)``, elementwise; 0 where both are equal (inf == inf), inf where
    exactly one is non-finite or they disagree in sign of infinity."""
    x = np.asarray(x, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(x - ref) / np.maximum(np.abs(ref), floor)
    d = np.where(x == ref, 0.0, d)
    return np.where(np.isnan(d), np.inf, d)


def max_rel_diff(figs: np.ndarray, flags: np.ndarray, ref_figs: np.ndarray, ref_flags: np.ndarray) -> tuple[float, str]:
    """Largest difference between two scorings of the same rows over all figures, and the figure it is in.

    A flag (top-k, ref_correct) that differs counts as an infinite difference: ties are defined exactly,
    so two correct implementations never disagree on one.
    """
    worst, where = 0.0, ""
    for j, name in enumerate(FIGURES):
        if len(figs) == 0:
            break
        d = float(np.max(rel_diff(figs[:, j], ref_figs[:, j], REL_FLOOR)))
        if d > worst:
            worst, where = d, name
    for j, name in enumerate(FLAGS):
        if np.any(np.asarray(flags[:, j], bool) != np.asarray(ref_flags[:, j], bool)):
            return float("inf"), name
    return worst, where
