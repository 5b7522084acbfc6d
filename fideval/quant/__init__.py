"""Emulated quantization formats: encode with a named recipe (-> codes + scales), decode (-> tensor).

Public API (the contract with the runner and scorer):
``get_format(name)``, ``quant_dequant(x, format, recipe=None, group=None)``, ``act_quant_e4m3(x, block, scale)``,
``compile_spec(spec)`` (-> ``.weight_transform``, ``.act_transform``, ``.bits``), ``parse_spec``,
``module_class_of``, ``check_spec_classes``. Families: ``fp8`` (DeepSeek 128x128 blocks), ``mx`` (OCP MX),
``nvfp4``, ``gguf_formats`` (llama.cpp blocks, byte-identical to gguf-py), ``gguf_ktypes`` (K-quants and
IQ4, byte-identical to llama.cpp, with ``imatrix``), ``intgroup`` (INT4/INT8 RTN).
"""

from fideval.quant.activations import act_quant_e4m3
from fideval.quant.base import FORMATS, Encoded, Format, get_format, quant_dequant
from fideval.quant.spec import (
    MODULE_CLASSES,
    check_spec_classes,
    compile_spec,
    module_class_of,
    parse_spec,
    resolve_spec,
)


def list_formats() -> list[Format]:
    """Every format of the table (fideval.quant.base.FORMATS), sorted by name."""
    return [get_format(k) for k in sorted(FORMATS)]


__all__ = [
    "Encoded", "Format", "FORMATS", "MODULE_CLASSES", "act_quant_e4m3", "check_spec_classes", "compile_spec",
    "get_format", "list_formats", "module_class_of", "parse_spec", "quant_dequant", "resolve_spec",
]
