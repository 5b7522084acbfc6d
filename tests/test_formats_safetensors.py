"""The one safetensors header reader against the safetensors library's own writer and reader."""

import numpy as np
import pytest
from safetensors.numpy import save_file

from fideval.formats import safetensors as st


def test_entries_locate_the_bytes_safetensors_wrote(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {"a": rng.standard_normal((3, 5)).astype(np.float32), "b": np.arange(7, dtype=np.int64),
              "c": rng.standard_normal((2, 2, 2)).astype(np.float16)}
    path = tmp_path / "x.safetensors"
    save_file(arrays, str(path), metadata={"k": "v"})
    h = st.read(path)
    assert h.metadata == {"k": "v"} and set(h.tensors) == set(arrays)
    raw = path.read_bytes()
    for name, want in arrays.items():
        e = h.tensors[name]
        got = np.frombuffer(raw[e.start:e.start + e.nbytes], dtype=want.dtype).reshape(e.shape)
        assert np.array_equal(got, want) and e.nbytes == want.nbytes


@pytest.mark.parametrize("header, what", [
    (b"[1]", "not a JSON object"),
    (b"{x", "not valid JSON"),
    (b'{"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}', "impossible header entry"),
    (b'{"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 64]}}', "lies outside"),
    (b'{"w": {"dtype": "Q9", "shape": [4], "data_offsets": [0, 16]}}', "does not read"),
    (b'{"w": {"dtype": "F32", "shape": [true], "data_offsets": [0, 4]}}', "malformed"),
    (b'{"__metadata__": {"k": 1}}', "map of strings"),
])
def test_bad_headers_are_refused_with_what_is_wrong(tmp_path, header, what):
    path = tmp_path / "x.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + bytes(16))
    with pytest.raises(st.HeaderError, match=what):
        st.read(path)


def test_a_hostile_length_is_refused_before_reading(tmp_path):
    path = tmp_path / "x.safetensors"
    path.write_bytes((10**12).to_bytes(8, "little") + b"{}")
    with pytest.raises(st.HeaderError, match="header length 1000000000000 is impossible"):
        st.read(path)
    path.write_bytes(b"abc")
    with pytest.raises(st.HeaderError, match="too short"):
        st.read(path)
