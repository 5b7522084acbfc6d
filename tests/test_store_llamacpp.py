"""llama.cpp ``--kl-divergence-base`` import: a fixture writes the v1 layout exactly as perplexity.cpp does
(encoder transcribed from its ``log_softmax(..., uint16_t * log_prob, ...)``), the test decodes independently."""

from __future__ import annotations

import numpy as np
import pytest
from cli_runner import run_fideval

from fideval.errors import FidevalError
from fideval.store import StoreReader
from fideval.store.llamacpp import KldBase
from fideval.store.verify import verify_store


def _encode_row(logits: np.ndarray) -> tuple[np.float32, np.float32, np.ndarray]:
    """perplexity.cpp's encoder, in float32 like the C code (sum in double, nearest_int rounds half to even)."""
    f = np.float32
    max_logit, min_logit = f(logits.max()), f(logits.min())
    min_logit = max(min_logit, f(max_logit - f(16)))
    sum_exp = float(np.sum(np.exp(logits - max_logit).astype(np.float64)))
    log_sum_exp = f(np.log(sum_exp))
    min_log_prob = f(f(min_logit - max_logit) - log_sum_exp)
    scale = f(f(max_logit - min_logit) / f(65535))
    inv_scale = f(f(1) / scale)
    codes = np.where(logits > min_logit, np.rint(inv_scale * (logits - min_logit)), 0).astype(np.uint16)
    return scale, min_log_prob, codes


def _write_kld_base(path, n_ctx, n_vocab, n_chunk, seed=0):
    """Write a v1 file; return (tokens [n_chunk, n_ctx], logits [n_chunk, n_ctx, n_vocab], expected list)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, n_vocab, (n_chunk, n_ctx)).astype("<i4")
    logits = (rng.standard_normal((n_chunk, n_ctx, n_vocab)) * 4).astype(np.float32)
    logits[:, :, 0] -= 40  # some vocab entries below the 16-nat floor
    first = n_ctx // 2
    nv = 2 * ((n_vocab + 1) // 2) + 4
    expected = []
    with open(path, "wb") as f:
        f.write(b"_logits_")
        f.write(np.array([n_ctx, n_vocab, n_chunk], "<i4").tobytes())
        f.write(tokens.tobytes())
        for k in range(n_chunk):
            rows = []
            for j in range(first, n_ctx - 1):  # the scored rows of a chunk
                scale, mlp, codes = _encode_row(logits[k, j])
                row = np.zeros(nv, "<u2")
                row[:4] = np.array([scale, mlp], "<f4").view("<u2")
                row[4:4 + n_vocab] = codes
                f.write(row.tobytes())
                rows.append(np.float32(scale) * codes.astype(np.float32) + np.float32(mlp))
            expected.append(np.stack(rows))
    return tokens, logits, expected


@pytest.mark.parametrize("n_ctx,n_vocab", [(10, 33), (9, 40)])
def test_import_matches_independent_decode(tmp_path, n_ctx, n_vocab):
    n_chunk = 3
    src = tmp_path / "base.kld"
    tokens, logits, expected = _write_kld_base(src, n_ctx, n_vocab, n_chunk)
    out = run_fideval("import-llamacpp", str(src), "--out", str(tmp_path / "st"), "--model-id", "org/base")
    assert out.code == 0, out.stderr
    warn = [ln for ln in out.stderr.splitlines() if "warning" in ln]
    assert len(warn) == 1 and "lossy" in warn[0] and "16 nats" in warn[0]
    assert verify_store(tmp_path / "st")[0] == []
    r = StoreReader(tmp_path / "st")
    assert r.kind == "logprobs" and r.vocab_size == n_vocab and "16 nats" in r.meta["lossy"]
    assert r.meta["model_id"] == "org/base"
    first = n_ctx // 2
    assert r.seq_ids == [f"llamacpp-{k:03d}" for k in range(n_chunk)]
    for k, sid in enumerate(r.seq_ids):
        lp, tk = r.read(sid)
        assert np.array_equal(tk, tokens[k]) and r.row_start(sid) == first
        assert lp.shape == (n_ctx - 1 - first, n_vocab)
        assert lp.tobytes() == expected[k].tobytes()
        # and the decode is what the codes mean: within half a step of the true log-softmax above the floor
        ref = logits[k, first:n_ctx - 1].astype(np.float64)
        ref = ref - ref.max(1, keepdims=True)
        ref = ref - np.log(np.exp(ref).sum(1, keepdims=True))
        floor = lp.min(1, keepdims=True)
        above = ref > floor + 1e-3
        step = (16 / 65535)
        assert np.all(np.abs(lp - ref)[above] <= step / 2 + 2e-5)
        assert np.all(lp[:, 0] == floor[:, 0])  # the -40 entries sit on the floor


def test_bos_and_resume(tmp_path):
    src = tmp_path / "b.kld"
    tokens, _, _ = _write_kld_base(src, 8, 20, 2, seed=3)
    from fideval.store.llamacpp import import_llamacpp

    s = import_llamacpp(src, tmp_path / "st", bos_id=1)
    assert s["written"] == 2 and s["rows_per_chunk"] == 3
    r = StoreReader(tmp_path / "st")
    assert [int(r.read(sid)[1][0]) for sid in r.seq_ids] == [1, 1]
    assert np.array_equal(r.read(r.seq_ids[1])[1][1:], tokens[1, 1:])
    assert import_llamacpp(src, tmp_path / "st", bos_id=1)["written"] == 0  # verified shards are skipped


def test_bad_files_refused_in_one_line(tmp_path):
    src = tmp_path / "b.kld"
    _write_kld_base(src, 8, 20, 2)
    raw = src.read_bytes()
    (tmp_path / "short.kld").write_bytes(raw[:-10])
    with pytest.raises(FidevalError, match=r"implies \d+ bytes, the file has \d+ \(truncated\)"):
        KldBase(tmp_path / "short.kld")
    # counts implying ~2^31 chunks of 2^20 tokens: refused from the header alone
    huge = raw[:8] + np.array([1 << 20, 129280, (1 << 31) - 1], "<i4").tobytes() + raw[20:]
    (tmp_path / "huge.kld").write_bytes(huge)
    with pytest.raises(FidevalError, match="implies"):
        KldBase(tmp_path / "huge.kld")
    (tmp_path / "neg.kld").write_bytes(raw[:8] + np.array([8, -5, 2], "<i4").tobytes() + raw[20:])
    with pytest.raises(FidevalError, match="impossible"):
        KldBase(tmp_path / "neg.kld")
    (tmp_path / "magic.kld").write_bytes(b"_logitz_" + raw[8:])
    out = run_fideval("import-llamacpp", str(tmp_path / "magic.kld"), "--out", str(tmp_path / "st"))
    assert out.code == 2
    err = [ln for ln in out.stderr.splitlines() if ln.startswith("fideval: error:")]
    assert len(err) == 1 and "_logits_" in err[0]
