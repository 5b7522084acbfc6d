"""The scorers (numpy reference, torch fallback, Triton kernel) against an oracle written here from scipy.

The oracle takes the textbook route -- scipy's log_softmax, rel_entr, entr, and a full lexicographic sort
for top-k -- so it shares no formula with the scorers (which work from row maxima and sum ratios). The
Triton cases are marked ``gpu`` and skip without CUDA; they run the very same checks on the device.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.special import entr, log_softmax, rel_entr

from fideval.score import reference, torch_kernel, triton_kernel
from fideval.score.metrics import FIGURES, FLAGS, max_rel_diff, rel_diff

GPU = pytest.mark.skipif(not triton_kernel.available(), reason="needs CUDA and triton")
BACKENDS = ["reference", "torch", "torch-blocked", pytest.param("triton", marks=[pytest.mark.gpu, GPU])]


def oracle(a: np.ndarray, b: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    figs, flags = [], []
    for r in range(len(t)):
        x, y = a[r].astype(np.float64), b[r].astype(np.float64)
        lp, lq = log_softmax(x), log_softmax(y)
        p, q = np.exp(lp), np.exp(lq)
        k = int(t[r])
        figs.append([rel_entr(p, q).sum(), rel_entr(q, p).sum(), -lp[k], -lq[k], q[k] - p[k], entr(p).sum(), p.max()])
        ia = int(np.flatnonzero(x == x.max())[0])
        order = np.lexsort((np.arange(len(y)), -y))  # logit descending, then index ascending
        pos = int(np.flatnonzero(order == ia)[0])
        flags.append([pos < 1, pos < 5, pos < 10, ia == k])
    return np.array(figs), np.array(flags, dtype=bool)


def run(backend: str, a: np.ndarray, b: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if backend == "reference":
        figs, flags = reference.score_rows(a, b, t)
        return figs, flags, reference.nonfinite_rows(a) | reference.nonfinite_rows(b)
    ta, tb, tt = torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(t.astype(np.int64))
    if backend.startswith("torch"):
        out = torch_kernel.score_rows(ta, tb, tt, budget_bytes=1 if backend == "torch-blocked" else 1 << 28)
    else:
        out = triton_kernel.score_rows(ta.cuda(), tb.cuda(), tt.cuda())
    return tuple(x.cpu().numpy() for x in out)


def assert_close(figs, flags, ref_figs, ref_flags, atol=1e-13, rtol=1e-10):
    for j, name in enumerate(FIGURES):
        np.testing.assert_allclose(figs[:, j], ref_figs[:, j], rtol=rtol, atol=atol, err_msg=name)
    for j, name in enumerate(FLAGS):
        np.testing.assert_array_equal(flags[:, j], ref_flags[:, j], err_msg=name)


def realistic(rng, n, vocab, noise):
    """LLM-like rows: a broad bulk and a few tokens far above it; candidate = reference + noise."""
    a = rng.standard_normal((n, vocab)).astype(np.float32) * 2.5
    a[np.arange(n)[:, None], rng.integers(0, vocab, (n, 3))] += rng.uniform(8, 20, (n, 3)).astype(np.float32)
    b = (a + rng.standard_normal((n, vocab)).astype(np.float32) * noise).astype(np.float32)
    return a, b, rng.integers(0, vocab, n)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("vocab", [1000, 4097, 5003])  # not multiples of any kernel block
def test_random_rows_match_oracle(backend, vocab):
    rng = np.random.default_rng(vocab)
    a, b, t = realistic(rng, 7, vocab, 0.3)
    b[3] = rng.standard_normal(vocab).astype(np.float32) * 4  # an unrelated candidate: large KLD, top-1 miss
    t[:2] = np.argmax(a[:2], axis=1)  # some rows where the reference is right
    figs, flags, bad = run(backend, a, b, t)
    assert not bad.any()
    assert_close(figs, flags, *oracle(a, b, t))
    assert flags[:2, 3].all() and figs[3, 0] > 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_agrees_with_reference_to_check_tolerance_at_full_vocab(backend):
    rng = np.random.default_rng(5)
    a, b, t = realistic(rng, 4, 129_280, 0.05)
    figs, flags, _ = run(backend, a, b, t)
    d, where = max_rel_diff(figs, flags, *reference.score_rows(a, b, t))
    assert d <= 2e-12, (d, where)


@pytest.mark.parametrize("backend", BACKENDS)
def test_identical_rows_give_exactly_zero(backend):
    rng = np.random.default_rng(1)
    a, _, t = realistic(rng, 5, 3001, 0.0)
    a[4, ::2] = -np.inf
    figs, flags, _ = run(backend, a, a.copy(), t)
    assert (figs[:, 0] == 0).all() and (figs[:, 1] == 0).all() and (figs[:, 4] == 0).all()
    assert (figs[:, 2] == figs[:, 3]).all() and flags[:, :3].all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_extreme_logits(backend):
    """Logits of +-1e4: float64 must not overflow; the oracle's log_softmax loses ~1e-12 absolute there."""
    rng = np.random.default_rng(2)
    vocab = 2050
    a = rng.choice(np.array([-1e4, 1e4], np.float32), (4, vocab)) + rng.standard_normal((4, vocab)).astype(np.float32)
    b = (a + rng.standard_normal((4, vocab)).astype(np.float32) * 2).astype(np.float32)
    a[3] = -1e4
    a[3, 17] = 1e4  # one token 2e4 above the rest: p = 1 - 2049 * exp(-2e4) = 1 exactly
    t = np.array([0, 1, 2, 17])
    figs, flags, bad = run(backend, a, b, t)
    assert np.isfinite(figs).all() and not bad.any()
    of, ofl = oracle(a, b, t)
    # row 3: exp(-2e4) underflows, so rel_entr(q, p) sees p = 0 and says inf; the true reverse KLD is
    # finite (~2e4 nats) and the log-space sum gives it
    lp, lq = log_softmax(a[3].astype(np.float64)), log_softmax(b[3].astype(np.float64))
    assert of[3, 1] == np.inf
    of[3, 1] = np.sum(np.exp(lq) * (lq - lp))
    assert_close(figs, flags, of, ofl, atol=1e-8, rtol=1e-8)
    assert figs[3, 2] == 0 and figs[3, 5] == 0 and figs[3, 6] == 1 and flags[3, 3]


@pytest.mark.parametrize("backend", BACKENDS)
def test_minus_inf_entries_and_one_hot_rows(backend):
    rng = np.random.default_rng(3)
    vocab = 1500
    a, b, t = realistic(rng, 4, vocab, 0.2)
    a[0, ::3] = -np.inf  # masked tokens in the reference: p = 0, contribute nothing
    b[0, ::3] = -np.inf
    a[1] = -np.inf
    a[1, 700] = 3.0  # one-hot reference: entropy 0, p1 1
    b[2, 5::7] = -np.inf  # candidate masks tokens the reference gives mass: KLD is +inf, reverse KLD finite
    t[0] = 3  # a masked realized token: infinite NLL
    t[1] = 700
    figs, flags, bad = run(backend, a, b, t)
    assert not bad.any()
    of, ofl = oracle(a, b, t)
    assert_close(figs, flags, of, ofl)
    assert figs[0, 2] == np.inf and figs[2, 0] == np.inf and np.isfinite(figs[2, 1])
    assert figs[1, 5] == 0 and figs[1, 6] == 1 and flags[1, 3]


@pytest.mark.parametrize("backend", BACKENDS)
def test_ties_follow_the_lowest_index_rule(backend):
    vocab = 600
    a = np.zeros((3, vocab), np.float32)
    b = np.zeros((3, vocab), np.float32)
    a[:, 10] = a[:, 20] = 5.0  # reference argmax is 10 (lowest index among equals)
    b[0, 10] = b[0, 20] = 5.0  # candidate ties too: argmax 10 -> top-1 agrees
    b[1, 20] = 5.0
    b[1, 10] = 4.0  # 20 beats 10: rank 1, top-5 but not top-1
    b[2, [1, 2, 3, 4, 5]] = 1.0
    b[2, 10] = 1.0
    b[2, 0] = -0.0  # equal logits at lower indices push 10 to rank 5: outside the top-5, inside the top-10
    t = np.array([10, 10, 10])
    figs, flags, _ = run(backend, a, b, t)
    np.testing.assert_array_equal(flags, [[1, 1, 1, 1], [0, 1, 1, 1], [0, 0, 1, 1]])
    np.testing.assert_array_equal(flags, oracle(a, b, t)[1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_row_and_nonfinite_flags(backend):
    rng = np.random.default_rng(4)
    a, b, t = realistic(rng, 1, 777, 0.1)
    figs, flags, bad = run(backend, a, b, t)
    assert_close(figs, flags, *oracle(a, b, t))
    a2, b2, t2 = realistic(rng, 4, 777, 0.1)
    a2[0, 5] = np.nan
    b2[1, 6] = np.inf
    b2[2] = -np.inf
    _, _, bad = run(backend, a2, b2, t2)
    np.testing.assert_array_equal(bad, [True, True, True, False])


def test_torch_blocks_without_nonfinite_values_skip_the_masks_with_the_same_bits():
    """The torch kernel's plain sums where a block is all finite (its masks only where one is not): the figures, flags
    and row mask are those of the masked sums bit for bit; a block holding -inf, +inf or NaN takes the masks."""
    rng = np.random.default_rng(9)
    a, b, t = (torch.from_numpy(x) for x in realistic(rng, 64, 4096, 0.05))
    plain = torch_kernel._score_block(a, b, t)
    masked = torch_kernel._score_block(a, b, t, careful=True)
    for x, y in zip(plain, masked):
        assert torch.equal(x, y)
    for value in (-np.inf, np.inf, np.nan):
        b2 = b.clone()
        b2[3, 7] = value
        auto, want = torch_kernel._score_block(a, b2, t), torch_kernel._score_block(a, b2, t, careful=True)
        for x, y in zip(auto, want):
            assert torch.equal(x.nan_to_num(), y.nan_to_num())
        assert bool(auto[2][3]) == (value != -np.inf) and (value != -np.inf or bool(auto[0][3, 0] == np.inf))


def test_rel_diff_floor_and_infinities():
    assert rel_diff(np.float64(1e-6 + 1e-15), np.float64(1e-6), 1e-2) == pytest.approx(1e-13)
    assert rel_diff(np.float64(2.0), np.float64(1.0), 1e-2) == 1.0
    assert rel_diff(np.inf, np.inf, 1e-2) == 0 and rel_diff(np.inf, 1.0, 1e-2) == np.inf


def test_exp_table_is_correctly_rounded():
    """2**(j/1024) from decimal arithmetic, lowered by j << 42 for the exponent add: each entry plus j << 42 is
    numpy's exp2 within half an ulp, a normal float64 in [0.5, 1], and exactly 1 at j = 0."""
    low = triton_kernel.exp_table("cpu").numpy()
    j = np.arange(1024, dtype=np.int64)
    tab = (low.view(np.int64) + (j << 42)).view(np.float64)
    want = np.exp2(j / 1024)
    assert tab.shape == (1024,) and tab[0] == 1.0 and ((low >= 0.5) & (low <= 1.0)).all()
    assert (np.abs(tab - want) <= np.spacing(want)).all()


@pytest.mark.gpu
@GPU
@pytest.mark.parametrize("backend", ["triton"])
def test_flags_at_segment_and_row_edges(backend):
    """The kernel reads its flags off the maxima and minima: put each special value on the last token of a tile,
    of a segment and of a row, where a masked-lane or prefetch slip would show."""
    rng = np.random.default_rng(8)
    vocab = 5003
    a, b, t = realistic(rng, 9, vocab, 0.2)
    a[0, 511] = np.nan
    b[1, 1023] = np.inf
    b[2, vocab - 1] = -np.inf  # KL +inf, reverse finite
    a[3, 2047] = -np.inf  # reverse KL +inf, KL finite
    a[4, 512:1024] = -np.inf
    b[4, 512:1024] = -np.inf  # a whole masked chunk: NaN in u, ignored
    a[5] = -np.inf
    a[5, vocab - 1] = 1.0  # one-hot on the last token
    t[5] = vocab - 1
    figs, flags, bad = run(backend, a, b, t)
    np.testing.assert_array_equal(bad, [True, True] + [False] * 7)
    of, ofl = oracle(a[2:], b[2:], t[2:])
    assert_close(figs[2:], flags[2:], of, ofl)
    assert figs[2, 0] == np.inf and np.isfinite(figs[2, 1]) and figs[3, 1] == np.inf and np.isfinite(figs[3, 0])
    assert figs[5, 5] == 0 and figs[5, 6] == 1 and flags[5, 3]


@pytest.mark.gpu
@GPU
@pytest.mark.parametrize("backend", ["triton"])
def test_rank_near_ten_from_tile_maxima(backend):
    """The rank stops at 10 and reads only tiles whose candidate maximum reaches b[i]: 9 and 10 tokens ahead,
    spread over tiles and segments, on both sides of i; ties at a lower index (one of them -0.0 against +0.0)
    in a tile whose maximum equals b[i]; a tie after i, which does not count; ahead tokens in the ragged tail."""
    vocab = 20_011
    spots = [5, 900, 2300, 4100, 8191, 8192, 12_000, 16_500, 19_990, 20_010]  # last two: past the whole tiles
    rows = []
    for ahead, ties_before, tie_after in ((9, 0, 0), (10, 0, 0), (3, 2, 1), (8, 1, 1), (0, 0, 1), (4, 0, 0)):
        a = np.full(vocab, -3.0, np.float32)
        b = np.full(vocab, -3.0, np.float32)
        i = 10_000
        a[i] = 5.0
        b[i] = 0.0
        for k in spots[:ahead]:
            b[k] = 1.0 + k * 1e-5
        for k in (3000, 3001)[:ties_before]:
            b[k] = -0.0 if k == 3001 else 0.0
        if tie_after:
            b[15_000] = 0.0
        rows.append((a, b))
    a = np.stack([r[0] for r in rows])
    b = np.stack([r[1] for r in rows])
    t = np.full(len(rows), 10_000)
    figs, flags, bad = run(backend, a, b, t)
    assert not bad.any()
    np.testing.assert_array_equal(flags, oracle(a, b, t)[1])
    np.testing.assert_array_equal(flags[:, 2], [True, False, True, True, True, True])
    np.testing.assert_array_equal(flags[:, 1], [False, False, False, False, True, True])


_INTERPRETED = """
import sys
import numpy as np, torch
from fideval.score import triton_kernel
d = np.load(sys.argv[1])
out = triton_kernel.score_rows(*(torch.from_numpy(d[k]) for k in ("a", "b", "t")))
np.savez(sys.argv[2], *(x.numpy() for x in out))
"""


def test_streaming_kernel_under_triton_interpreter_matches_oracle(tmp_path):
    """The kernel runs on the CPU under ``TRITON_INTERPRET=1`` (a fresh process: Triton reads the switch at
    import), on rows with a ragged last segment, a -inf entry (the guarded redo) and a one-hot row, against the
    scipy oracle: its logic is checked without a GPU. score_rows then runs it without PTX (the interpreter runs
    no inline assembly) and with the exp's constants as literals (Triton 3.6's interpreter passed float
    scalars as float32, 1e-9 off the oracle); the GPU tests cover both. Interpreters that run them: Triton 3.7
    and 3.8 (CI installs 3.8); 3.6's and 3.9's cannot (the skips below)."""
    import os
    import subprocess
    import sys

    triton = pytest.importorskip("triton")
    if tuple(map(int, triton.__version__.split(".")[:2])) == (3, 9):
        pytest.skip("Triton 3.9's interpreter refuses a Python bool as a load mask (the register prefetch's)")
    try:
        int(np.array([1]))  # what Triton 3.6's interpreter does to loop bounds
    except TypeError:  # NumPy 2.4 and later (measured: 2.4.6, 2.5.2) refuse it
        if tuple(map(int, triton.__version__.split(".")[:2])) <= (3, 6):
            pytest.skip("Triton <= 3.6's interpreter takes int() of 1-element arrays (loop bounds), which this "
                        f"NumPy ({np.__version__}) refuses")
    rng = np.random.default_rng(5)
    a, b, t = realistic(rng, 3, 9_000, 0.1)
    a[1, 17] = -np.inf
    b[2] = -np.inf
    b[2, 4_321] = 3.0
    np.savez(tmp_path / "in.npz", a=a, b=b, t=t.astype(np.int64))
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    p = subprocess.run([sys.executable, "-c", _INTERPRETED, str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
                       env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    out = np.load(tmp_path / "out.npz")
    figs, flags, bad = out["arr_0"], out["arr_1"], out["arr_2"]
    assert not bad.any()
    assert_close(figs, flags, *oracle(a, b, t))
