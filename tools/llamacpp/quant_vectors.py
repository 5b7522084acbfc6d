"""Write the K-quant and i-quant test vectors from llama.cpp's own reference quantizers (run once, by hand).

    pip download --no-binary :all: --no-deps llama-cpp-python==0.3.36   # vendors llama.cpp
    tar xzf llama_cpp_python-0.3.36.tar.gz
    python tools/llamacpp/quant_vectors.py --llama-cpp llama_cpp_python-0.3.36/vendor/llama.cpp

It compiles ``ggml/src/ggml-quants.c`` (with a three-function shim for the ggml symbols it calls) into a
shared library with gcc, the way llama.cpp builds ``ggml-base``: ``-O2 -DNDEBUG``, no ``-march`` (ggml-base
gets no architecture flags, so on x86-64 there is no FMA contraction), then calls ``quantize_<type>`` --
the entry point ``llama-quantize`` reaches through ``ggml_quantize_chunk`` -- on fixed rows, without and with
an importance matrix, and writes ``tests/data/llamacpp/quant_vectors.npz``: the rows, the importance
weights, and llama.cpp's output bytes per type. CI never builds llama.cpp; ``tests/test_quant_kquants.py``
reads the file. Nothing of llama.cpp is copied into the repository.
"""

from __future__ import annotations

import argparse
import ctypes
import subprocess
import tempfile
from pathlib import Path

import numpy as np

# type name -> (ggml type id, block elements, block bytes) as in ggml.h / ggml-common.h
TYPES = {
    "q2_k": (10, 256, 84), "q3_k": (11, 256, 110), "q4_k": (12, 256, 144), "q5_k": (13, 256, 176),
    "q6_k": (14, 256, 210), "iq4_nl": (20, 32, 18), "iq4_xs": (23, 256, 136),
    "q4_0": (2, 32, 18), "q4_1": (3, 32, 20), "q5_0": (6, 32, 22), "q5_1": (7, 32, 24), "q8_0": (8, 32, 34),
}

SHIM = r"""
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <stdint.h>
void ggml_abort(const char * file, int line, const char * fmt, ...) { fprintf(stderr, "ggml_abort %s:%d\n", file, line); abort(); }
static const struct { int type; int64_t blck; size_t size; } T[] = {%TABLE%};
static int find(int type) { for (size_t i = 0; i < sizeof T / sizeof T[0]; i++) if (T[i].type == type) return (int) i; abort(); }
size_t ggml_type_size(int type) { return T[find(type)].size; }
size_t ggml_row_size(int type, int64_t ne) { int i = find(type); return T[i].size * ne / T[i].blck; }
const char * ggml_type_name(int type) { (void) type; return "?"; }
"""


def build(src: Path, work: Path) -> ctypes.CDLL:
    ggml = src / "ggml"
    table = ", ".join(f"{{{t}, {b}, {s}}}" for t, b, s in TYPES.values())
    (work / "shim.c").write_text(SHIM.replace("%TABLE%", table))
    lib = work / "libggmlquants.so"
    cmd = ["gcc", "-O2", "-DNDEBUG", "-std=c11", "-fPIC", "-shared", f"-I{ggml / 'include'}", f"-I{ggml / 'src'}",
           "-o", str(lib), str(ggml / "src" / "ggml-quants.c"), str(work / "shim.c"), "-lm"]
    print(" ".join(cmd))
    subprocess.run(cmd, check=True)
    return ctypes.CDLL(str(lib))


def rows() -> np.ndarray:
    """Rows of 512 (two 256-element super-blocks each) that exercise every branch of the quantizers."""
    g = np.random.default_rng(26)
    n = 512
    out = [g.standard_normal(n) * s for s in (1.0, 0.02, 3e-3, 40.0)]
    out.append(np.zeros(n))  # all zeros: every GROUP_MAX_EPS branch
    z = g.standard_normal(n) * 0.05
    z[:256] = 0  # a zero super-block next to a normal one
    z[256 + 32: 256 + 64] = 0  # a zero sub-block inside a normal super-block
    out.append(z)
    out.append(np.abs(g.standard_normal(n)) + 0.5)  # all positive: min clamps to 0 in the K-quants
    out.append(-np.abs(g.standard_normal(n)) - 0.5)  # all negative
    out.append(np.full(n, 0.75))  # constant
    out.append(g.standard_normal(n) * 3e4)  # huge: float16 scales near and past 65504
    out.append(g.standard_normal(n) * 1e6)
    out.append(g.standard_normal(n) * 1e-6)  # float16 scales in the subnormals
    out.append(g.standard_normal(n) * 1e-9)
    out.append(g.standard_normal(n) * 2e-39)  # float32 subnormal inputs
    w = g.standard_normal(n)
    w[::37] *= 60  # outliers
    out.append(w)
    out.append(np.ldexp(1.0, g.integers(-30, 20, n)) * np.sign(g.standard_normal(n)))  # wide dynamic range
    out.append(np.round(g.standard_normal(n) * 8) / 4)  # values on a coarse grid: ties in the searches
    out.append(g.standard_t(2, n) * 0.1)  # heavy tails
    for k in range(6):
        out.append(g.standard_normal(n) * np.exp(g.uniform(-4, 4)))
    return np.stack(out).astype(np.float32)


def importance(n: int) -> np.ndarray:
    """One imatrix column weight per element of a row (what llama.cpp passes as ``quant_weights``)."""
    g = np.random.default_rng(27)
    w = g.gamma(0.7, 1.0, n) * np.exp(g.uniform(-2, 2, n))
    w[5] = 0.0  # a column that was never activated
    return w.astype(np.float32)


def quantize(lib: ctypes.CDLL, kind: str, x: np.ndarray, qw: np.ndarray | None) -> np.ndarray:
    _, blck, size = TYPES[kind]
    nrow, n = x.shape
    out = np.zeros((nrow, n // blck * size), np.uint8)
    f = getattr(lib, f"quantize_{kind.replace('_k', '_K')}")
    f.restype = ctypes.c_size_t
    f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    x = np.ascontiguousarray(x)
    got = f(x.ctypes.data, out.ctypes.data, nrow, n, None if qw is None else qw.ctypes.data)
    assert got == out.nbytes, (kind, got, out.nbytes)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-cpp", type=Path, required=True, help="llama.cpp source tree (vendor/llama.cpp)")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[2] / "tests/data/llamacpp/quant_vectors.npz")
    a = ap.parse_args()
    commit = subprocess.run(["git", "-C", str(a.llama_cpp), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        lib = build(a.llama_cpp, Path(tmp))
        x = rows()
        qw = importance(x.shape[1])
        arrays = {"x": x, "imatrix": qw}
        for kind in TYPES:
            arrays[f"{kind}"] = quantize(lib, kind, x, None)
            arrays[f"{kind}.imatrix"] = quantize(lib, kind, x, qw)
    arrays["source"] = np.array(f"llama-cpp-python 0.3.36 vendor/llama.cpp {commit or '(no git)'}; gcc -O2 -DNDEBUG, x86-64")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = a.out.with_suffix(".tmp.npz")
    np.savez_compressed(tmp_out, **arrays)
    tmp_out.replace(a.out)
    print(f"wrote {a.out} ({a.out.stat().st_size} bytes): {len(x)} rows x {x.shape[1]}, types {', '.join(TYPES)}")


if __name__ == "__main__":
    main()
