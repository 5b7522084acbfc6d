"""What a quant spec does to a checkpoint, from its safetensors headers alone (shapes and dtypes, no data).

Every tensor is mapped to its module class (:func:`fideval.quant.spec.module_class_of`); the spec's classes
must exist in the model and every block must divide its tensor, so a bad spec fails before a long run
(``fideval quant inspect``) and before the emulated candidate's first layer (``fideval score --config``).
"""

from __future__ import annotations

from pathlib import Path

from fideval.errors import FidevalError

FP4_PACKED = "F4_E2M1"  # the logical dtype of an I8 tensor that packs two FP4 e2m1 values per byte


def _packed_fp4(shape: tuple[int, ...], scale_shape: tuple[int, ...]) -> bool:
    """An I8 ``X.weight`` whose E8M0 ``X.scale`` has one scale per 32 logical elements of each row, the row twice
    as long as stored: FP4 e2m1 packed two per byte (DeepSeek-V4.1-Flash's routed experts)."""
    return (len(shape) >= 2 and len(scale_shape) == len(shape) and tuple(scale_shape[:-1]) == tuple(shape[:-1])
            and scale_shape[-1] * 32 == 2 * shape[-1])


def release_layout(tensors: dict[str, tuple[tuple[int, ...], str]]) -> dict[str, tuple[str, str]]:
    """``{weight name: (its scale tensor, kind)}`` for a release's quantized weights, from names, shapes and dtypes:
    ``fp8`` an F8_E4M3 weight with a float32 ``X.weight_scale_inv`` (DeepSeek-V3's FP8 release) or an E8M0
    ``X.scale`` (V4.1's); ``fp4x2`` an I8 weight packing FP4 e2m1 pairs with an E8M0 ``X.scale`` (V4.1's experts)."""
    out = {}
    for k, (shape, dtype) in tensors.items():
        if dtype == "F8_E4M3" and k + "_scale_inv" in tensors:
            out[k] = (k + "_scale_inv", "fp8")
        elif k.endswith(".weight") and dtype in ("F8_E4M3", "I8"):
            sc = k[: -len("weight")] + "scale"
            if sc not in tensors or tensors[sc][1] != "F8_E8M0":
                continue
            if dtype == "F8_E4M3":
                out[k] = (sc, "fp8")
            elif _packed_fp4(tuple(shape), tuple(tensors[sc][0])):
                out[k] = (sc, "fp4x2")
    return out


def weight_shapes(model_dir: Path, headers: dict | None = None) -> dict[str, tuple[tuple[int, ...], str]]:
    """``{tensor name: (shape, dtype)}`` of the model's weights: the headers' tensors, less a release's block
    scales (part of their quantized weight, which the runner dequantizes before a spec sees it); an I8 tensor of
    packed FP4 pairs is listed at its logical shape with dtype ``F4_E2M1``. ``headers``: the folder's
    :func:`~fideval.formats.safetensors.folder_shapes`, when the caller has read them already."""
    from fideval.formats.safetensors import folder_shapes

    tensors = headers if headers is not None else folder_shapes(model_dir)
    layout = release_layout(tensors)
    scales = {sc for sc, _ in layout.values()}
    out = {}
    for k, (shape, dtype) in tensors.items():
        if k in scales:
            continue
        if layout.get(k, ("", ""))[1] == "fp4x2":
            shape, dtype = (*shape[:-1], 2 * shape[-1]), FP4_PACKED
        out[k] = (tuple(shape), dtype)
    return out


def release_bits(model_dir: Path, headers: dict | None = None) -> dict[str, float]:
    """Stored bits of each quantized weight of a release (:func:`release_layout`), its block scales included (what
    a spec that leaves the weight alone keeps): 8 or 4 bits an element plus 32 (float32) or 8 (E8M0) a scale;
    empty for an unquantized checkpoint. ``headers``: as for :func:`weight_shapes`."""
    import math

    from fideval.formats.safetensors import DTYPE_BITS, folder_shapes

    tensors = headers if headers is not None else folder_shapes(model_dir)
    bits = {}
    for k, (sc, _kind) in release_layout(tensors).items():
        (shape, _), (sshape, sdtype) = tensors[k], tensors[sc]
        bits[k] = math.prod(shape) * 8 + math.prod(sshape) * DTYPE_BITS[sdtype]  # stored bytes: one or two values
    return bits


def class_shapes(model_dir: Path) -> dict[str | None, dict[str, tuple[int, ...]]]:
    """``{module class or None: {tensor name: shape}}`` of the checkpoint in ``model_dir``."""
    from fideval.quant.spec import module_class_of

    by_class: dict[str | None, dict[str, tuple[int, ...]]] = {}
    for name, (shape, _dtype) in weight_shapes(model_dir).items():
        by_class.setdefault(module_class_of(name), {})[name] = tuple(shape)
    return by_class


def classes_present(by_class: dict) -> set[str]:
    """The module classes a checkpoint has, from :func:`class_shapes`: those a candidate's spec may name."""
    return {c for c in by_class if c is not None}


def inspect_model(model_dir: Path, spec_text: str) -> dict:
    """The per-class bits table of ``spec_text`` applied to the checkpoint in ``model_dir``."""
    from fideval.formats.safetensors import DTYPE_BITS, FLOAT_DTYPES, folder_shapes
    from fideval.quant.base import get_format
    from fideval.quant.gguf_mix_spec import mix_name
    from fideval.quant.spec import check_spec_classes, compile_spec, is_quantized_tensor, module_class_of

    if mix_name(spec_text) is not None:
        return _inspect_mix(model_dir, mix_name(spec_text))
    compiled = compile_spec(spec_text)
    headers = folder_shapes(model_dir)  # read once: the shapes and the release's stored bits
    tensors = weight_shapes(model_dir, headers)
    shapes: dict[str, dict[str, tuple[int, ...]]] = {}
    present, dtype_count, quantized = set(), {}, []
    for name, (shape, dtype) in sorted(tensors.items()):
        cls = module_class_of(name) or "other"
        shapes.setdefault(cls, {})[name] = shape
        if cls != "other" and is_quantized_tensor(name, shape, dtype in FLOAT_DTYPES or dtype in ("F8_E4M3", FP4_PACKED)):
            present.add(cls)
            quantized.append((name, cls, shape))
        dtype_count[dtype] = dtype_count.get(dtype, 0) + 1
    check_spec_classes(spec_text, present)  # first: a class the model lacks is the bigger mistake
    for name, cls, shape in quantized:  # then every block must divide its tensor (fail now, not mid-run)
        m = compiled.modules.get(cls)
        if m is not None:
            try:
                get_format(m.format).check_divides(shape, m.group)
            except FidevalError as e:
                raise FidevalError(f"{name}: {e.message}", hint=e.hint) from None
    plain = {d: c for d, c in dtype_count.items() if d not in ("F8_E4M3", FP4_PACKED)} or dtype_count  # a release's
    base = max(plain, key=plain.get)  # count their stored bits, the rest its (bf16) dtype
    table = compiled.bits(shapes, base_bits=DTYPE_BITS.get(base, 16), stored=release_bits(model_dir, headers))
    table["base_dtype"] = base
    table["classes_present"] = sorted(present)
    return table


def _inspect_mix(model_dir: Path, mix: str) -> dict:
    """A ``gguf_mix`` spec's table: per class (``embedding`` for the token embedding) the GGML types llama-quantize
    gives its tensors and their stored bits; unquantized tensors at the checkpoint's most common dtype."""
    from fideval.formats.safetensors import DTYPE_BITS
    from fideval.quant.gguf_mix_spec import MixSpec

    spec = MixSpec(mix, model_dir)
    dtypes: dict[str, int] = {}
    for _shape, dtype in weight_shapes(model_dir).values():
        dtypes[dtype] = dtypes.get(dtype, 0) + 1
    base = max(dtypes, key=dtypes.get) if dtypes else "BF16"
    table = spec.bits(base_bits=DTYPE_BITS.get(base, 16))
    table["base_dtype"] = base
    table["classes_present"] = sorted(spec.classes())
    table["gguf_mix"] = {"mix": spec.mix, "types": spec.types}
    return table
