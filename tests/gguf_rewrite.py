"""Copy a GGUF file with some metadata keys or tensors changed, through gguf-py's reader and writer: how the tests
make a converter-written fixture disagree with its reference in one key, and how tools/llamacpp/moe_ggufs.py
re-encodes tensors as Q4_K."""

from __future__ import annotations

from pathlib import Path


def rewrite_gguf(src: Path, dst: Path, *, kv: dict | None = None, drop_kv: tuple[str, ...] = (),
                 tensors: dict | None = None, drop: tuple[str, ...] = ()) -> Path:
    """``kv``: key -> (value, GGUFValueType) set or added; ``drop_kv``: keys left out; ``tensors``: name ->
    (raw array, GGMLQuantizationType) replacing a tensor's data (quantized data as uint8 [..., bytes per row]) or
    added after the others; ``drop``: tensors left out."""
    import gguf

    kv, tensors = kv or {}, tensors or {}
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), r.fields["general.architecture"].contents())
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture" or f.name in drop_kv:
            continue
        if f.name in kv:
            w.add_key_value(f.name, kv[f.name][0], kv[f.name][1])
            continue
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(f.name, f.contents(), f.types[0], sub_type=sub)
    for key, (val, vtype) in kv.items():
        if key not in r.fields:
            w.add_key_value(key, val, vtype)
    for t in r.tensors:
        if t.name not in drop:
            data, qtype = tensors.get(t.name, (t.data, t.tensor_type))
            w.add_tensor(t.name, data, raw_dtype=qtype)
    for name, (data, qtype) in tensors.items():
        if name not in {t.name for t in r.tensors}:
            w.add_tensor(name, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst
