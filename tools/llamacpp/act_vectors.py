"""Write ggml's activation-quantization test vectors from llama.cpp's own code (run once, by hand).

    pip download --no-binary :all: --no-deps llama-cpp-python==0.3.36   # vendors llama.cpp
    tar xzf llama_cpp_python-0.3.36.tar.gz
    python tools/llamacpp/act_vectors.py --llama-cpp llama_cpp_python-0.3.36/vendor/llama.cpp

Before a quantized matmul, ggml's CPU backend quantizes each row of the activations (``src1``) to the weight
type's ``vec_dot_type`` with that type's ``from_float``: ``quantize_row_q8_0`` / ``quantize_row_q8_1`` /
``quantize_row_q8_K`` (``ggml/src/ggml-cpu/ggml-cpu.c``'s ``type_traits_cpu``). Two builds of them are dumped:

* ``x86``: ``ggml/src/ggml-cpu/arch/x86/quants.c`` compiled with ``-mavx2 -mf16c -mfma`` (what a native build on
  any AVX/AVX2/AVX-512 machine runs: ``id = 127/amax``, ties to even, float16 scale by F16C); its Q8_K is the
  reference below.
* ``ref``: ``ggml/src/ggml-quants.c``'s ``quantize_row_q8_{0,1,K}_ref`` (a build without SIMD: ``id = 1/d``,
  ``roundf`` -- ties away from zero; Q8_K on every CPU).

Both are compiled with gcc ``-O2 -DNDEBUG`` into one shared library (with a shim for the few ggml symbols they
name), called on fixed rows of 512 floats (zeros, tiny, float32 subnormals, float16-subnormal and overflowing
scales, ties, one-signed rows, repeated extremes of both signs, outliers, random rows) and the raw block bytes
are written to ``tests/data/llamacpp/act_vectors.npz``. CI never builds llama.cpp;
``tests/test_quant_ggml_activations.py`` reads the file. Nothing of llama.cpp is copied into the repository.
"""

from __future__ import annotations

import argparse
import ctypes
import subprocess
import tempfile
from pathlib import Path

import numpy as np

# activation type -> (block elements, block bytes) as in ggml-common.h
TYPES = {"q8_0": (32, 34), "q8_1": (32, 36), "q8_K": (256, 292)}

SHIM = r"""
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <stdint.h>
void ggml_abort(const char * file, int line, const char * fmt, ...) { fprintf(stderr, "ggml_abort %s:%d\n", file, line); abort(); }
size_t ggml_type_size(int type) { (void) type; abort(); }
size_t ggml_row_size(int type, int64_t ne) { (void) type; (void) ne; abort(); }
const char * ggml_type_name(int type) { (void) type; return "?"; }
/* tables the x86 dot products read (never called here) */
float ggml_table_f32_f16[1 << 16];
float ggml_table_f32_e8m0_half[256];
float ggml_table_f32_ue4m3[256];
"""


def build(src: Path, work: Path) -> ctypes.CDLL:
    ggml = src / "ggml"
    (work / "shim.c").write_text(SHIM)
    lib = work / "libggmlact.so"
    inc = [f"-I{ggml / 'include'}", f"-I{ggml / 'src'}", f"-I{ggml / 'src' / 'ggml-cpu'}"]
    objs = []
    for name, path, extra in (("quants", ggml / "src" / "ggml-quants.c", []),
                              ("x86", ggml / "src" / "ggml-cpu" / "arch" / "x86" / "quants.c", ["-mavx2", "-mf16c", "-mfma"]),
                              ("shim", work / "shim.c", [])):
        obj = work / f"{name}.o"
        cmd = ["gcc", "-O2", "-DNDEBUG", "-std=c11", "-fPIC", *extra, *inc, "-c", str(path), "-o", str(obj)]
        print(" ".join(cmd))
        subprocess.run(cmd, check=True)
        objs.append(str(obj))
    subprocess.run(["gcc", "-shared", "-o", str(lib), *objs, "-lm"], check=True)
    return ctypes.CDLL(str(lib))


def rows() -> np.ndarray:
    """Rows of 512 (two Q8_K super-blocks, 16 Q8_0 blocks) that exercise every branch of the three quantizers."""
    g = np.random.default_rng(47)
    n = 512
    out = [g.standard_normal(n) * s for s in (1.0, 0.02, 3e-3, 40.0)]
    out.append(np.zeros(n))  # all zeros: d = 0, every code 0
    z = g.standard_normal(n) * 0.5
    z[:256] = 0  # a zero super-block next to a normal one
    z[256 + 32: 256 + 64] = 0  # a zero block inside a normal super-block
    out.append(z)
    out.append(g.standard_normal(n) * 1e-3)  # tiny
    out.append(g.standard_normal(n) * 2e-6)  # float16 scales in the subnormals (amax/127 < 6.1e-5)
    out.append(g.standard_normal(n) * 1e-9)  # float16 scales that round to 0
    out.append(g.standard_normal(n) * 2e-39)  # float32-subnormal inputs: 1/d and 127/amax overflow to inf
    out.append(g.standard_normal(n) * 1e6)  # huge
    out.append(g.standard_normal(n) * 4e6)  # huge: amax/127 past float16's 65504 (scale inf)
    ties = np.tile(np.arange(-63.5, 64.5, 1.0)[:32], n // 32)  # k + 1/2 ...
    ties[::32] = 127.0  # ... with amax 127: the scale is exactly 1, every product a tie
    out.append(ties)
    t2 = np.tile(np.array([-127.0] + [k + 0.5 for k in range(-15, 15)] + [2.5]), n // 32)
    out.append(t2)  # the same with the extreme negative
    out.append(np.abs(g.standard_normal(n)) + 0.5)  # all positive
    out.append(-np.abs(g.standard_normal(n)) - 0.5)  # all negative
    out.append(np.full(n, 0.75))  # constant
    pm = g.standard_normal(n)
    pm[3], pm[9] = -5.0, 5.0  # the extreme's magnitude twice, negative first (Q8_K keeps the first)
    pm[300], pm[260] = 7.0, -7.0  # and positive first, in the second super-block
    out.append(pm)
    one = np.zeros(n)
    one[77] = -3.25  # one nonzero element
    out.append(one)
    w = g.standard_normal(n)
    w[::37] *= 60  # outliers (a massive-activation channel)
    out.append(w)
    out.append(np.ldexp(1.0, g.integers(-30, 20, n)) * np.sign(g.standard_normal(n)))  # wide dynamic range
    out.append(np.round(g.standard_normal(n) * 8) / 4)  # a coarse grid
    out.append(g.standard_t(2, n) * 0.1)  # heavy tails
    for _ in range(6):
        out.append(g.standard_normal(n) * np.exp(g.uniform(-6, 6)))
    return np.stack(out).astype(np.float32)


def quantize(lib: ctypes.CDLL, fn: str, kind: str, x: np.ndarray) -> np.ndarray:
    blck, size = TYPES[kind]
    nrow, n = x.shape
    out = np.zeros((nrow, n // blck * size), np.uint8)
    f = getattr(lib, fn)
    f.restype = None
    f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    x = np.ascontiguousarray(x)
    for r in range(nrow):  # one row at a time, as ggml_compute_forward_mul_mat calls from_float
        f(x[r].ctypes.data, out[r].ctypes.data, n)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-cpp", type=Path, required=True, help="llama.cpp source tree (vendor/llama.cpp)")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[2] / "tests/data/llamacpp/act_vectors.npz")
    a = ap.parse_args()
    commit = subprocess.run(["git", "-C", str(a.llama_cpp), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        lib = build(a.llama_cpp, Path(tmp))
        x = rows()
        arrays = {"x": x}
        for kind in TYPES:
            arrays[f"ref.{kind}"] = quantize(lib, f"quantize_row_{kind}_ref", kind, x)
            arrays[f"x86.{kind}"] = quantize(lib, f"quantize_row_{kind}", kind, x)
    arrays["source"] = np.array(f"llama-cpp-python 0.3.36 vendor/llama.cpp {commit or '(no git)'}; gcc -O2 -DNDEBUG; "
                                "x86: ggml-cpu/arch/x86/quants.c with -mavx2 -mf16c -mfma; ref: ggml-quants.c")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = a.out.with_suffix(".tmp.npz")
    np.savez_compressed(tmp_out, **arrays)
    tmp_out.replace(a.out)
    print(f"wrote {a.out} ({a.out.stat().st_size} bytes): {len(x)} rows x {x.shape[1]}, types {', '.join(TYPES)}")


if __name__ == "__main__":
    main()
