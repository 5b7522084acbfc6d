"""The canary's digest (fideval.model.execution.determinism.digest) against an independent computation of the same
sums: numpy uint64 arithmetic (modulo 2**64 by definition) over the float32 bit patterns, the weights' generator
checked against SplitMix64's published first output, and the digest the same on CUDA as on the CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fideval.model.execution import determinism
from fideval.model.execution.determinism import DIGEST, digest, digest_weights

B = 1 << 16


def _oracle(x: torch.Tensor) -> str:
    """The documented sum in numpy uint64: lane l is sum_i b_i * u_l[i mod B] * v_l[i div B] modulo 2**64."""
    b = x.detach().float().contiguous().reshape(-1).numpy().view(np.int32).astype(np.int64).view(np.uint64)
    i = np.arange(b.size)
    lanes = []
    with np.errstate(over="ignore"):
        for lane in range(2):
            u = digest_weights(B, lane, 0)
            v = digest_weights(int(i[-1]) // B + 1, lane, 1)
            lanes.append(int(np.sum(b * u[i % B] * v[i // B], dtype=np.uint64)))
    return f"{DIGEST}:{b.size}:{lanes[0]:016x}{lanes[1]:016x}"


def test_weights_are_splitmix64_and_odd():
    # SplitMix64 from state 0: its first output is 0xE220A8397B1DCDAF (Vigna's reference splitmix64.c)
    assert int(determinism._splitmix64(np.zeros(1, np.uint64))[0]) == 0xE220A8397B1DCDAF
    for lane in (0, 1):
        for stream in (0, 1):
            w = digest_weights(1000, lane, stream)
            assert (w & np.uint64(1)).all() and len(set(w.tolist())) == 1000
    assert not np.array_equal(digest_weights(50, 0, 0), digest_weights(50, 1, 0))
    assert not np.array_equal(digest_weights(50, 0, 0), digest_weights(50, 0, 1))


@pytest.mark.parametrize("n", [1, 7, B - 1, B, 3 * B + 17, 70 * B + 5])  # one step holds 64 blocks: 70 * B spans two
def test_digest_equals_the_numpy_oracle(n):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g) * torch.exp(torch.randn(n, generator=g) * 8)
    x[: min(n, 3)] = torch.tensor([-0.0, float("inf"), float("-inf")])[: min(n, 3)]
    assert digest(x) == _oracle(x)


def test_digest_is_of_the_float32_values_in_row_major_order():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(37, 300, generator=g)
    assert digest(x) == digest(x.reshape(-1)) == digest(x.T.contiguous().T)  # the values, not the strides
    assert digest(x.T) != digest(x)  # another order of the same values
    h = x.to(torch.bfloat16)
    assert digest(h) == digest(h.float()) == _oracle(h)  # widened exactly, as the old SHA-256 of float32 bytes was
    assert digest(torch.zeros(5)) != digest(torch.zeros(6))  # the length is part of it
    assert digest(x, "cpu") == digest(x)  # computed where asked, a step at a time
    assert digest(torch.tensor([0.0])) != digest(torch.tensor([-0.0]))  # bits, not values


def test_every_single_changed_value_is_seen():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(5 * B + 3, generator=g)
    base = digest(x)
    for pos in torch.randint(0, x.numel(), (40,), generator=g).tolist() + [0, x.numel() - 1, B, B - 1]:
        for change in ("ulp", "sign", "top"):
            y = x.clone()
            bits = y.view(torch.int32)
            bits[pos] ^= {"ulp": 1, "sign": -(2**31), "top": 1 << 30}[change]
            assert digest(y) != base, (pos, change)
    y = x.clone()
    y[[3, 4]] = y[[4, 3]]  # two values swapped
    assert digest(y) != base


def test_canary_verdict_names_the_digest():
    from fideval.model.execution.hooks import Canary

    c = Canary([0])
    x = torch.randn(4, 9)
    c.first(0, x)
    c.last(0, x.clone())
    assert c.verdict == {"row": 0, "digest": DIGEST, "digest_start": digest(x), "digest_end": digest(x), "identical": True}
    d = Canary([0])
    d.first(0, x)
    y = x.clone()
    y[3, 8] = torch.nextafter(y[3, 8], torch.tensor(float("inf")))
    d.last(0, y)
    assert d.verdict["identical"] is False


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_digest_on_cuda_equals_the_cpu():
    g = torch.Generator().manual_seed(3)
    for n in (1, B + 1, 200 * B + 11):
        x = torch.randn(n, generator=g) * 1e3
        assert digest(x.cuda()) == digest(x) == digest(x, "cuda") == _oracle(x)  # a host tensor digested on the GPU
    h = torch.randn(512, 129_280, generator=g).to(torch.bfloat16)
    assert digest(h.cuda()) == digest(h)


def test_a_changed_canary_is_one_line_naming_both_digests_new_and_legacy_keys():
    from fideval.errors import FidevalError
    from fideval.model.teacher_pass import TeacherPass

    new = {"identical": False, "seq_id": "code-000", "folder": "cuts-8", "digest_start": "lin128-v1:8:" + "a" * 32,
           "digest_end": "lin128-v1:8:" + "b" * 32}
    old = {"identical": False, "seq_id": "code-000", "folder": "cuts-8", "sha256_start": "c" * 64, "sha256_end": "d" * 64}
    for verdict, pair in ((new, "a" * 12 + " vs " + "b" * 12), (old, "c" * 12 + " vs " + "d" * 12)):
        with pytest.raises(FidevalError) as e:
            TeacherPass.check_canaries([verdict, {"identical": True}], "the store was")
        assert f"canary code-000 in cuts-8 changed between the start and the end of the run ({pair})" in str(e.value)
    TeacherPass.check_canaries([{"identical": True}, {"identical": None}], "the store was")  # unchecked is no failure
