"""Our torch GGUF encoders/decoders against gguf-py (llama.cpp's reference arithmetic), byte for byte."""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf import quants

from fideval.errors import FidevalError
from fideval.quant import get_format, quant_dequant
from fideval.quant.gguf_formats import GGUF_FORMATS, gguf_dequantize, gguf_encode

KINDS = list(GGUF_FORMATS)
# gguf-py warns on the deliberate float16-overflow edge block; the values are still compared.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def edge_rows() -> np.ndarray:
    """Rows of 64 (two blocks each) that exercise every branch of the reference quantizers."""
    g = np.random.default_rng(0)
    rows = [
        np.zeros(64),  # all-zero blocks: d == 0 -> id = 0
        np.full(64, 0.5),  # constant block: max == min for Q4_1/Q5_1
        np.r_[np.full(32, -3.0), np.full(32, 7.0)],
        np.r_[[-2.0, 2.0] * 16, [2.0, -2.0] * 16],  # equal |max| with both signs: first one wins
        np.r_[np.arange(32) - 15.5, (np.arange(32) - 16) / 16],  # half-integers after scaling: ties
        np.ldexp(1.0, np.arange(-40, 24)),  # wide dynamic range
        np.r_[[1e-30] * 32, [65504.0 * 127 * 1.5] + [1.0] * 31],  # tiny block; d overflows float16 -> inf
        np.r_[g.standard_normal(32) * 1e-3, g.standard_normal(32) * 1e3],
    ]
    # MXFP4: amax a few float32 ulps either side of a power of two (where log2f rounds)
    for k in (-9, -5, -1, 0, 1, 3, 7):
        p = np.float32(2.0**k)
        for ulps in (-3, -2, -1, 0, 1, 2):
            amax = np.float32(p)
            for _ in range(abs(ulps)):
                amax = np.nextafter(amax, np.float32(np.inf if ulps > 0 else 0), dtype=np.float32)
            r = g.uniform(-1, 1, 64).astype(np.float32) * amax
            r[5] = amax
            r[40] = -amax
            rows.append(r)
    return np.stack([np.asarray(r, dtype=np.float32) for r in rows])


def random_rows() -> np.ndarray:
    g = np.random.default_rng(1)
    x = g.standard_normal((96, 256)).astype(np.float32)
    x *= np.exp(g.uniform(-6, 6, (96, 1))).astype(np.float32)  # row scales over many binades
    x[::7, 3] *= 50  # outliers
    # values on the E2M1 grid and on midpoints (ties) of a block with amax exactly 6 * 2**k
    grid = np.array([0, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75, 2, 2.5, 3, 3.5, 4, 5, 6, -0.25], np.float32)
    x[0, :32] = np.resize(grid, 32) * np.float32(0.125)
    x[1, :32] = -np.resize(grid, 32) * np.float32(0.125)  # negative ties, and -0.25 between -0 and -0.5
    x[2, :32] = np.resize(grid[::-1], 32) * np.float32(2.0**-20) * np.where(np.arange(32) % 2, 1, -1)
    return x


@pytest.mark.parametrize("kind", KINDS)
def test_encoder_is_byte_identical_to_gguf_py(kind):
    qt = T[kind.upper()]
    for x in (random_rows(), edge_rows()):
        ref = quants.quantize(x, qt)
        ours = gguf_encode(torch.from_numpy(x), kind).numpy()
        assert ours.shape == ref.shape
        bad = np.argwhere(ours != ref)
        assert bad.size == 0, f"{kind}: {len(bad)} bytes differ, first at {bad[:3].tolist()}"


@pytest.mark.parametrize("kind", KINDS)
def test_decoder_matches_gguf_py(kind):
    qt = T[kind.upper()]
    for x in (random_rows(), edge_rows()):
        raw = quants.quantize(x, qt)
        ref = quants.dequantize(raw, qt)
        fmt = get_format(f"gguf_{kind}")
        ours = fmt.decode(fmt.encode(torch.from_numpy(x)))
        assert np.array_equal(ours.numpy(), ref, equal_nan=True)


@pytest.mark.parametrize("kind", ["q8_0", "q4_0", "mxfp4"])
def test_bf16_and_3d_inputs(kind):
    g = torch.Generator().manual_seed(5)
    w = torch.randn(3, 8, 64, generator=g).to(torch.bfloat16)  # fused experts [E, out, in]
    ref = quants.quantize(w.float().numpy().reshape(-1, 64), T[kind.upper()])
    assert np.array_equal(gguf_encode(w, kind).numpy().reshape(ref.shape), ref)
    y = quant_dequant(w, f"gguf_{kind}")
    assert y.dtype == torch.bfloat16 and y.shape == w.shape
    want = quants.dequantize(ref, T[kind.upper()]).reshape(3, 8, 64)
    assert torch.equal(y, torch.from_numpy(want).to(torch.bfloat16))


@pytest.mark.parametrize("kind", ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1"])
def test_subnormal_rows_are_byte_identical_to_gguf_py(kind):
    # d subnormal -> 1/d = inf -> inf/NaN codes, which ggml's int8 cast (and gguf-py's) turns into 0; the old
    # clamp to the top code differed here (10 to 20 bytes per row). MXFP4 is left out: its documented deviation.
    g = np.random.default_rng(7)
    x = np.stack([np.r_[np.full(32, 2e-39), g.standard_normal(32) * 1e-40],
                  np.r_[g.standard_normal(32) * 3e-39, -np.full(32, 1e-45)]]).astype(np.float32)
    ref = quants.quantize(x, T[kind.upper()])
    assert np.array_equal(gguf_encode(torch.from_numpy(x), kind).numpy(), ref)


def test_q8_0_hand_vector():
    # amax 127 -> d = 1 exactly; roundf: 2.5 -> 3 and -2.5 -> -3 (half away from zero, not to even)
    x = torch.zeros(32)
    x[:4] = torch.tensor([127.0, 2.5, -2.5, 0.49999997])
    raw = gguf_encode(x, "q8_0")
    assert raw[:2].view(torch.float16).item() == 1.0
    assert raw[2:6].view(torch.int8).tolist() == [127, 3, -3, 0]


def test_mxfp4_exponent_follows_ggml_log2f_not_the_bits():
    # amax one ulp below 2**-5: the exact floor(log2) is -6, log2f rounds to -5 -> ggml's byte is one higher
    amax = np.nextafter(np.float32(2.0**-5), np.float32(0), dtype=np.float32)
    x = np.zeros((1, 32), np.float32)
    x[0, 0] = amax
    ref = quants.quantize(x, T.MXFP4)
    ours = gguf_encode(torch.from_numpy(x), "mxfp4").numpy()
    assert ours[0, 0] == ref[0, 0] == np.uint8(-5 - 2 + 127)
    ocp = get_format("mxfp4").encode(torch.from_numpy(x), "floor")
    assert int(ocp.scales[0, 0]) == -6 - 2 + 127  # the OCP floor recipe, from the bits


def test_import_decode_of_k_and_iq_types():
    # gguf-py cannot quantize K/IQ types; decode of random bytes must have the right shape and agree
    # with gguf-py called directly (our path only adds typing and shape handling).
    g = np.random.default_rng(2)
    for name in ("Q4_K", "Q6_K", "IQ4_NL", "IQ4_XS", "Q2_K"):
        qt = T[name]
        block, size = quants.GGML_QUANT_SIZES[qt]
        raw = g.integers(0, 256, (4, 2 * size), dtype=np.uint8)
        raw_f16_safe = raw.copy()
        out = gguf_dequantize(raw_f16_safe, name, shape=(4, 2 * block))
        ref = quants.dequantize(raw, qt)
        assert out.shape == (4, 2 * block)
        assert np.array_equal(out.numpy(), ref, equal_nan=True)
    with pytest.raises(FidevalError, match="unknown GGUF type"):
        gguf_dequantize(np.zeros((1, 34), np.uint8), "Q9_9")


def test_bad_inputs_are_one_line_errors():
    with pytest.raises(FidevalError, match="does not divide the last dimension 48"):
        quant_dequant(torch.zeros(2, 48), "gguf_q4_0")
    with pytest.raises(FidevalError, match="unknown recipe"):
        quant_dequant(torch.zeros(2, 64), "gguf_q4_0", recipe="imatrix")
    with pytest.raises(FidevalError, match="group 64 is not allowed"):
        quant_dequant(torch.zeros(2, 64), "gguf_q8_0", group=64)
    with pytest.raises(FidevalError, match="NaN/Inf"):
        quant_dequant(torch.tensor([[float("nan")] * 32]), "gguf_q8_0")


def _write_gguf(path):
    from gguf import GGUFWriter

    g = np.random.default_rng(3)
    t = {
        "token_embd.weight": (g.standard_normal((16, 64)).astype(np.float32), T.F16),
        "blk.0.attn_q.weight": (g.standard_normal((32, 64)).astype(np.float32), T.Q8_0),
        "blk.0.attn_norm.weight": (np.ones(64, np.float32), T.F32),
        "blk.0.ffn_gate_inp.weight": (g.standard_normal((4, 64)).astype(np.float32), T.F32),
        "blk.0.ffn_gate_exps.weight": (g.standard_normal((4, 8, 64)).astype(np.float32), T.Q4_0),
        "blk.0.ffn_down_shexp.weight": (g.standard_normal((64, 32)).astype(np.float32), T.MXFP4),
        "output.weight": (g.standard_normal((16, 64)).astype(np.float32), T.Q5_1),
    }
    w = GGUFWriter(str(path), "qwen3moe")
    for name, (a, qt) in t.items():
        data = a.astype(np.float16) if qt == T.F16 else (a if qt == T.F32 else quants.quantize(a, qt))
        w.add_tensor(name, data, raw_dtype=None if qt in (T.F32, T.F16) else qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return t


def test_gguf_file_decode_and_bits(tmp_path):
    from fideval.quant.gguf_file import gguf_architecture, gguf_bits, iter_gguf_tensors

    p = tmp_path / "tiny.gguf"
    t = _write_gguf(p)
    assert gguf_architecture(p) == "qwen3moe"
    seen = {}
    for name, qtype, val in iter_gguf_tensors(p):
        a, qt = t[name]
        assert qtype == qt.name and tuple(val.shape) == a.shape
        if qt == T.F16:
            want = a.astype(np.float16).astype(np.float32)
        else:
            want = a if qt == T.F32 else quants.dequantize(quants.quantize(a, qt), qt)
        assert np.array_equal(val.numpy(), want)
        seen[name] = qtype
    assert set(seen) == set(t)
    b = gguf_bits(p)["per_class"]
    assert b["attention"]["bpw"] == 8.5 and b["attention"]["format"] == "Q8_0"
    assert b["routed_experts"]["bpw"] == 4.5 and b["shared_experts"]["bpw"] == 4.25 and b["lm_head"]["bpw"] == 6.0
    assert b["other"]["bits"] == 16 * 64 * 16 + 64 * 32 + 4 * 64 * 32  # embeddings F16, norm and router F32


def test_gguf_inspect_cli(tmp_path):
    from cli_runner import run_fideval

    p = tmp_path / "tiny.gguf"
    _write_gguf(p)
    r = run_fideval("quant", "inspect", "--model", str(p))
    assert r.code == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("routed_experts"))
    assert line.split()[1] == "Q4_0" and line.split()[-1] == "4.5000"
    r = run_fideval("quant", "inspect", "--model", str(p), "--quant", "attention=mxfp4")
    assert "already quantized" in r.error()
    (tmp_path / "bad.gguf").write_bytes(b"not a gguf file at all")
    r = run_fideval("quant", "inspect", "--model", str(tmp_path / "bad.gguf"))
    assert "not a readable GGUF file" in r.error()


def test_truncated_gguf_and_unknown_tensor_type_are_one_line_errors(tmp_path):
    import struct

    from gguf import GGUFWriter

    from fideval.quant.gguf_file import gguf_tensor_info, iter_gguf_tensors

    p = tmp_path / "t.gguf"
    w = GGUFWriter(str(p), "llama")
    a = np.random.default_rng(0).standard_normal((8, 256)).astype(np.float32)
    w.add_tensor("blk.0.attn_q.weight", quants.quantize(a, T.Q8_0), raw_dtype=T.Q8_0)
    w.add_tensor("blk.0.attn_k.weight", a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    raw = p.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(raw[:-100])
    for fn in (gguf_tensor_info, lambda f: list(iter_gguf_tensors(f))):
        with pytest.raises(FidevalError, match="not a readable GGUF file") as e:
            fn(tmp_path / "cut.gguf")
        assert "\n" not in e.value.message
    at = raw.find(b"blk.0.attn_q.weight") + len("blk.0.attn_q.weight")
    n_dims = struct.unpack_from("<I", raw, at)[0]
    bad = bytearray(raw)
    struct.pack_into("<I", bad, at + 4 + 8 * n_dims, 99)  # the tensor's GGML type id
    (tmp_path / "unknown.gguf").write_bytes(bytes(bad))
    with pytest.raises(FidevalError, match="a tensor has an unknown GGML type") as e:
        gguf_tensor_info(tmp_path / "unknown.gguf")
    assert "update the gguf package" in e.value.hint
