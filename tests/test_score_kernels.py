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
BACKENDS = ["reference", "torch", "torch-blocked",
            pytest.param("triton", marks=[pytest.mark.gpu, GPU]),
            pytest.param("triton-big", marks=[pytest.mark.gpu, GPU]),
            pytest.param("triton-libdevice", marks=[pytest.mark.gpu, GPU]),
            pytest.param("triton-fma", marks=[pytest.mark.gpu, GPU]),
            pytest.param("triton-select", marks=[pytest.mark.gpu, GPU]),
            pytest.param("triton-small", marks=[pytest.mark.gpu, GPU]),
            pytest.param("triton-lean", marks=[pytest.mark.gpu, GPU]),
            pytest.param("triton-leanlib", marks=[pytest.mark.gpu, GPU]),
            pytest.param("triton-leanloop", marks=[pytest.mark.gpu, GPU]),
            pytest.param("triton-tab", marks=[pytest.mark.gpu, GPU]),
            pytest.param("triton-tab64bits", marks=[pytest.mark.gpu, GPU]),
            pytest.param("triton-tab2kcg", marks=[pytest.mark.gpu, GPU]),
            pytest.param("triton-compact", marks=[pytest.mark.gpu, GPU]),
            pytest.param("triton-compact1k", marks=[pytest.mark.gpu, GPU]),
            pytest.param("triton-compactbits", marks=[pytest.mark.gpu, GPU]),
            pytest.param("triton-compactrank", marks=[pytest.mark.gpu, GPU]),
            pytest.param("triton-stream", marks=[pytest.mark.gpu, GPU]),
            pytest.param("triton-streamsmall", marks=[pytest.mark.gpu, GPU]),
            pytest.param("triton-streamnoasm", marks=[pytest.mark.gpu, GPU]),
            pytest.param("triton-stream64", marks=[pytest.mark.gpu, GPU]),
            pytest.param("triton-stream32", marks=[pytest.mark.gpu, GPU]),
            pytest.param("triton-stream16", marks=[pytest.mark.gpu, GPU]),
            pytest.param("triton-streamv5", marks=[pytest.mark.gpu, GPU]),
            pytest.param("triton-streamred1", marks=[pytest.mark.gpu, GPU]),
            pytest.param("triton-stream2k", marks=[pytest.mark.gpu, GPU]),
            pytest.param("triton-stream256", marks=[pytest.mark.gpu, GPU]),
            pytest.param("triton-stream1k", marks=[pytest.mark.gpu, GPU]),
            pytest.param("triton-stream512", marks=[pytest.mark.gpu, GPU]),
            pytest.param("triton-stream1knoasm", marks=[pytest.mark.gpu, GPU]),
            pytest.param("triton-streampair0", marks=[pytest.mark.gpu, GPU]),
            pytest.param("triton-streampair64", marks=[pytest.mark.gpu, GPU]),
            pytest.param("triton-streampair1", marks=[pytest.mark.gpu, GPU])]


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
        old = {"stream": 0, "compact": 0, "chunk": 2048, "num_warps": 4}  # the earlier kernels, at their measured shapes
        kw = {"big": {"chunk": 16384, "num_warps": 8}, "small": {"chunk": 256, "num_warps": 2},
              "fma": {**old, "fast_exp": 1, "lean": 0}, "select": {**old, "fast_exp": 2, "lean": 0},
              "libdevice": {**old, "fast_exp": 0, "lean": 0},
              # the lean partials kernel: its own exp, libdevice's, and 4 chunks per program (prefetch loop)
              "lean": {**old, "fast_exp": 3, "lean": 1}, "leanlib": {**old, "fast_exp": 0, "lean": 2, "chunk": 1024},
              "leanloop": {**old, "fast_exp": 3, "lean": 4, "chunk": 512, "num_warps": 2},
              # table exps in the lean kernel: N 256 (the default's), N 64 with integer-pipe conversions, N 2048 with .cg
              "tab": {**old, "fast_exp": 4, "lean": 1}, "tab64bits": {**old, "fast_exp": 5, "lean": 1, "cvt": 1},
              "tab2kcg": {**old, "fast_exp": 6, "lean": 2, "chunk": 1024, "ldc": 1},
              # the compact partials kernel (argmax rescanned by the combine, -inf tests only where needed)
              "compact": {"stream": 0, "fast_exp": 4, "lean": 0, "compact": 1},
              "compact1k": {"stream": 0, "fast_exp": 3, "lean": 0, "compact": 1, "chunk": 1024, "num_warps": 2},
              "compactbits": {"stream": 0, "fast_exp": 6, "lean": 0, "compact": 1, "cvt": 1, "chunk": 4096},
              "compactrank": {"stream": 0, "fast_exp": 4, "lean": 0, "compact": 1, "rank_in_combine": 1,
                              "chunk": 1024, "num_warps": 4},
              # the streaming kernel (the default, "triton"): 4 warps and one-row tiles, small segments on 2 warps
              # with Triton's copy pipeline, and without PTX
              "stream": {"num_warps": 4, "tile_rows": 1},
              "streamsmall": {"chunk": 1024, "num_warps": 2, "stages": 3},
              "streamnoasm": {"chunk": 2048, "asm": 0, "vec": 4},
              # its smaller exp tables: N 64, 32, 16
              "stream64": {"chunk": 4096, "fast_exp": 5, "stages": 4},
              "stream32": {"fast_exp": 7},
              "stream16": {"num_warps": 8, "fast_exp": 8},
              # its changes of 2026-12-03 (session 6) off: shuffle maxima, one tile a loop trip, constants as
              # literals; integer maxima without the in-lane pair maximum; segments of 2,048 on 2 warps
              "streamv5": {"red": 0, "unroll": 0, "carg": 0, "fast_exp": 4, "xadd": 0, "pair": 0},
              "streamred1": {"red": 1, "tile_rows": 1, "vec": 4},
              "stream2k": {"chunk": 2048, "num_warps": 2},
              # session 7: the N 1024 (the default since) and 512 tables with a degree-3 minimax polynomial (one
              # FMA fewer) and the exponent add on the table entry, with and without PTX
              "stream256": {"fast_exp": 4, "xadd": 0, "pair": 0},  # the default until session 7
              "stream1k": {"fast_exp": 9, "xadd": 1},
              "stream512": {"fast_exp": 10, "xadd": 1},
              "stream1knoasm": {"fast_exp": 9, "xadd": 1, "asm": 0, "chunk": 4096},
              # session 8: each lane's two tokens of a row into one set of accumulators (the default since): off
              # (the default until then), capped at 64 registers (spills), on one-row tiles
              "streampair0": {"pair": 0},
              "streampair64": {"maxnreg": 64},
              "streampair1": {"tile_rows": 1, "chunk": 4096},
              }.get(backend.partition("-")[2], {})
        out = triton_kernel.score_rows(ta.cuda(), tb.cuda(), tt.cuda(), **kw)
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


def test_rel_diff_floor_and_infinities():
    assert rel_diff(np.float64(1e-6 + 1e-15), np.float64(1e-6), 1e-2) == pytest.approx(1e-13)
    assert rel_diff(np.float64(2.0), np.float64(1.0), 1e-2) == 1.0
    assert rel_diff(np.inf, np.inf, 1e-2) == 0 and rel_diff(np.inf, 1.0, 1e-2) == np.inf


@pytest.mark.gpu
@GPU
def test_fma_exp_matches_numpy():
    """The kernel's FMA-polynomial exp: within 2 ulp of numpy's on [-708, 0]; 0 below -708.4 (subnormal range)."""
    rng = np.random.default_rng(6)
    x = np.concatenate([-rng.exponential(3.0, 200_000), rng.uniform(-708, 0, 200_000), [0.0, -0.0, -1e-300, -708.0]])
    y = triton_kernel.exp64(torch.from_numpy(x).cuda()).cpu().numpy()
    np.testing.assert_allclose(y, np.exp(x), rtol=4.5e-16, atol=0)
    z = triton_kernel.exp64(torch.tensor([-709.0, -745.0, -1e4, -np.inf], dtype=torch.float64).cuda()).cpu().numpy()
    assert (z == 0).all()
    x2 = x[x >= -700]
    y2 = triton_kernel.exp64(torch.from_numpy(x2).cuda(), variant=2).cpu().numpy()
    np.testing.assert_allclose(y2, np.exp(x2), rtol=4.5e-16, atol=0)


@pytest.mark.gpu
@GPU
def test_lean_exp_matches_numpy():
    """``_exp64m`` (degree-10 polynomial, exponent-bit scaling): within 4 ulp of numpy's on [-700, 0] (2 ulp
    of the exact value, checked against mpmath with exact FMAs), and exactly 1 at 0 (identical rows and
    one-hot rows depend on it)."""
    rng = np.random.default_rng(7)
    x = np.concatenate([-rng.exponential(3.0, 200_000), rng.uniform(-700, 0, 200_000),
                        [0.0, -0.0, -1e-300, -700.0, -np.log(2) / 2, -np.log(2) * 1.5]])
    x = x[x >= -700]
    y = triton_kernel.exp64(torch.from_numpy(x).cuda(), variant=3).cpu().numpy()
    np.testing.assert_allclose(y, np.exp(x), rtol=8.9e-16, atol=0)
    assert y[np.flatnonzero(x == 0)[0]] == 1.0


@pytest.mark.gpu
@GPU
@pytest.mark.parametrize("variant", [4, 5, 6])
def test_table_exps_match_numpy(variant):
    """The table exps: within 2 ulp of numpy's (1 ulp each side) plus the one-FMA reduction's |x| * 3.4e-17
    (the rounding of ln2 / N, times k), on [-700, 0]; exactly 1 at 0."""
    rng = np.random.default_rng(9)
    x = np.concatenate([-rng.exponential(3.0, 200_000), rng.uniform(-700, 0, 200_000),
                        [0.0, -0.0, -1e-300, -700.0, -np.log(2) / 2, -np.log(2) * 1.5, -np.log(2) / 512]])
    x = x[x >= -700]
    y = triton_kernel.exp64(torch.from_numpy(x).cuda(), variant=variant).cpu().numpy()
    rel = np.abs(y - np.exp(x)) / np.exp(x)
    assert (rel <= 4.5e-16 + 3.4e-17 * np.abs(x)).all(), float(rel.max())
    assert rel[np.abs(x) <= 20].max() <= 1.2e-15
    assert y[np.flatnonzero(x == 0)[0]] == 1.0


@pytest.mark.gpu
@GPU
@pytest.mark.parametrize("variant", [4, 5, 7, 8, 9, 10])
@pytest.mark.parametrize("asm", [1, 0])
@pytest.mark.parametrize("xadd", [0, 1])
def test_streaming_exp_matches_numpy(variant, asm, xadd):
    """The streaming kernel's table exp (N 256/64/32/16/1024/512, with and without its PTX, with the exponent
    add after the polynomial or on the table entry): within 2 ulp near 0 (N 512: its minimax polynomial's
    1.5e-15 more), and off by at most |x| * 2.5e-16 relative further down -- ln2/N is one rounded constant
    (|x| * 3.3e-17 with a fused FMA; Triton's interpreter rounds the FMA twice, ~|x| * 1.4e-16), and a term 40
    nats below its shift is below e**-40 of the maximum's, so no sum sees it."""
    from fideval.score import triton_stream

    rng = np.random.default_rng(variant)
    x = np.concatenate([rng.uniform(-40, 0, 20000), rng.uniform(-700, -40, 20000), [0.0, -1e-300, -700.0]])
    want = np.exp(x)
    xd = torch.from_numpy(x).cuda()
    got = triton_stream.exp_tab(xd, triton_kernel.exp_table(variant, xd.device, bool(xadd)),
                                triton_kernel._TAB_LOG2N[variant], asm, xadd).cpu().numpy()
    rel = np.abs(got - want) / want
    bound = (4.5e-16 + 1.6e-15 * (variant == 10)) + np.abs(x) * 2.5e-16
    assert (rel <= bound).all(), float(np.max(rel / bound))
    assert got[-3] == 1.0


def test_exp_table_is_correctly_rounded():
    """2**(j/N) from decimal arithmetic: equal to numpy's exp2 within half an ulp, and exact at j = 0."""
    for variant, n in ((4, 256), (5, 64), (6, 2048), (9, 1024), (10, 512)):
        tab = triton_kernel.exp_table(variant, "cpu").numpy()
        want = np.exp2(np.arange(n) / n)
        assert tab.shape == (n,) and tab[0] == 1.0
        assert (np.abs(tab - want) <= np.spacing(want)).all()
        # the exponent-add table: each entry lowered by j << (52 - log2 N), a normal float64 in [0.5, 1] whose
        # bits plus j << (52 - log2 N) are the entry again
        low = triton_kernel.exp_table(variant, "cpu", xadd=True).numpy()
        assert ((low >= 0.5) & (low <= 1.0)).all()
        j = np.arange(n, dtype=np.int64)
        assert np.array_equal(low.view(np.int64) + (j << (52 - int(np.log2(n)))), tab.view(np.int64))


@pytest.mark.parametrize("backend", [pytest.param(b, marks=[pytest.mark.gpu, GPU])
                                     for b in ("triton-lean", "triton-leanloop", "triton-tab", "triton-tab64bits",
                                               "triton-compact", "triton-compact1k", "triton-compactbits",
                                               "triton-compactrank", "triton-stream", "triton-streamsmall",
                                               "triton-streamnoasm", "triton-stream64", "triton-stream32",
                                               "triton-stream16", "triton-streamv5", "triton-streamred1",
                                               "triton-stream2k", "triton-stream256", "triton-stream1k",
                                               "triton-stream512", "triton-stream1knoasm", "triton-streampair0",
                                               "triton-streampair64", "triton-streampair1")])
def test_lean_flags_at_chunk_and_program_edges(backend):
    """The lean kernel reads its flags off the maxima: put each special value on the last token of a chunk,
    of a row, and of a program's run of chunks, where a masked-lane or prefetch slip would show."""
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


@pytest.mark.skipif(triton_kernel.triton is None, reason="needs triton")
def test_streaming_kernel_refuses_shapes_it_has_no_code_for():
    """Tiles of other than 1 or 2 rows, exps without a table the streaming kernel knows, and segments that are
    not whole tiles fail before any launch with a one-line error (checked ahead of the device, so no GPU is needed)."""
    a = torch.zeros((2, 300))
    t = torch.zeros(2, dtype=torch.int64)
    with pytest.raises(ValueError, match="tiles of 1 or 2 rows, not 4"):
        triton_kernel.score_rows(a, a, t, tile_rows=4)
    with pytest.raises(ValueError, match="fast_exp 4, 5, 7, 8, 9 or 10, not 6"):
        triton_kernel.score_rows(a, a, t, fast_exp=6)
    with pytest.raises(ValueError, match="chunk 300 is not a multiple of 128"):
        triton_kernel.score_rows(a, a, t, chunk=300)


@pytest.mark.gpu
@GPU
def test_streaming_speedups_change_no_bit():
    """Integer-key maxima, two tiles a loop trip, constants as kernel arguments and the exponent add on the
    table entry (a power-of-two scaling moved before an FMA: the same rounding for normal results, and every
    term the sums take is normal) do the same float64 operations in the same order as the kernel without them:
    the outputs are equal bit for bit, on rows that hold zeros of both signs, subnormals and a ragged last
    segment."""
    rng = np.random.default_rng(12)
    a, b, t = realistic(rng, 6, 20_011, 0.1)
    a[0, :50] = 0.0
    b[0, :50] = -0.0
    a[1, 100:120] = 1e-41
    b[1, 100:120] = -3e-45
    a[2] = -np.abs(a[2])  # every logit negative: the sign flip of the integer keys
    b[3] = np.abs(b[3])
    ta, tb, tt = (torch.from_numpy(x).cuda() for x in (a, b, t.astype(np.int64)))
    # the default table (N 1,024, degree 3) and the earlier one (N 256, degree 4); one or two accumulator sets a
    # lane (pair: another summation order, so compared within itself)
    for fast_exp, pair in ((9, 0), (4, 0), (9, 1)):
        base = triton_kernel.score_rows(ta, tb, tt, fast_exp=fast_exp, red=0, unroll=0, carg=0, xadd=0, pair=pair)
        for kw in ({}, {"red": 1}, {"carg": 0}, {"unroll": 0}, {"xadd": 0}, {"xadd": 1, "carg": 0}):
            out = triton_kernel.score_rows(ta, tb, tt, fast_exp=fast_exp, pair=pair, **kw)
            for x, y in zip(out, base):
                assert torch.equal(x, y), (fast_exp, pair, kw)


@pytest.mark.gpu
@GPU
@pytest.mark.parametrize("backend", ["triton", "triton-stream", "triton-stream2k"])
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


@pytest.mark.gpu
@GPU
def test_relaunch_through_the_compiled_kernel_keeps_its_specialisation():
    """score_rows relaunches its kernels through the compiled handles (triton_launch): the same bits as the
    first, JIT-bound launch; and rows at an address 4 bytes off 16-byte alignment, or of another vocabulary,
    get a kernel compiled for them, not the cached one (a wrong alignment assumption would read the wrong
    floats), checked against the float64 oracle."""
    from fideval.score import triton_launch

    rng = np.random.default_rng(21)
    a, b, t = realistic(rng, 3, 20_003, 0.1)
    ta, tb, tt = (torch.from_numpy(x).cuda() for x in (a, b, t.astype(np.int64)))
    triton_launch.clear()
    first = triton_kernel.score_rows(ta, tb, tt)
    cached = len(triton_launch._CACHE)
    again = triton_kernel.score_rows(ta, tb, tt)
    assert len(triton_launch._CACHE) == cached
    for x, y in zip(first, again):
        assert torch.equal(x, y)
    from triton import knobs  # a launch hook (a profiler's): relaunches go through Triton's runner, which calls it

    seen = []
    hook = lambda meta: seen.append(meta.get()["name"])  # noqa: E731
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        hooked = triton_kernel.score_rows(ta, tb, tt)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert seen == ["_partials_stream", "_post"]
    for x, y in zip(first, hooked):
        assert torch.equal(x, y)
    pa = torch.from_numpy(np.pad(a, ((0, 0), (1, 0)))).cuda()[:, 1:]  # stride 20,004, address + 4 bytes
    pb = torch.from_numpy(np.pad(b, ((0, 0), (1, 0)))).cuda()[:, 1:]
    assert pa.data_ptr() % 16 == 4
    figs, flags, bad = (x.cpu().numpy() for x in triton_kernel.score_rows(pa, pb, tt))
    assert len(triton_launch._CACHE) > cached
    assert_close(figs, flags, *oracle(a, b, t))
    short = (a[:, :20_000].copy(), b[:, :20_000].copy(), np.minimum(t, 19_999))
    figs, flags, bad = (x.cpu().numpy() for x in triton_kernel.score_rows(
        *(torch.from_numpy(x).cuda() for x in (short[0], short[1], short[2].astype(np.int64)))))
    assert_close(figs, flags, *oracle(*short))


_INTERPRETED = """
import json, sys
import numpy as np, torch
from fideval.score import triton_kernel
d = np.load(sys.argv[1])
out = triton_kernel.score_rows(*(torch.from_numpy(d[k]) for k in ("a", "b", "t")), asm=0, carg=0,
                               **json.loads(sys.argv[3]))
np.savez(sys.argv[2], *(x.numpy() for x in out))
"""


@pytest.mark.parametrize("kw", [{}, {"pair": 0, "tile_rows": 1, "chunk": 4096}])
def test_streaming_kernel_under_triton_interpreter_matches_oracle(tmp_path, kw):
    """The default streaming kernels and their launch path run on the CPU under ``TRITON_INTERPRET=1`` (a
    fresh process: Triton reads the switch at import), on rows with a ragged last segment, a -inf entry (the
    guarded redo) and a one-hot row, against the scipy oracle: the kernels' logic is checked without a GPU.
    Without PTX (``asm`` 0: the interpreter runs no inline assembly) and with the exp's constants as literals
    (``carg`` 0: Triton 3.6's interpreter passes float scalars as float32 whatever the annotation, which
    measured 1e-9 off the oracle; the GPU tests cover ``carg`` 1). Interpreters that run them: Triton 3.7
    and 3.8 (CI installs 3.8); 3.6's and 3.9's cannot (the skips below)."""
    import json
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
    p = subprocess.run([sys.executable, "-c", _INTERPRETED, str(tmp_path / "in.npz"), str(tmp_path / "out.npz"),
                        json.dumps(kw)], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    out = np.load(tmp_path / "out.npz")
    figs, flags, bad = out["arr_0"], out["arr_1"], out["arr_2"]
    assert not bad.any()
    assert_close(figs, flags, *oracle(a, b, t))
