"""DeepSeek-V4.1-Flash weights into the vendor's own modules: names, per-rank slices, storage formats, hooks.

The release stores its tensors under the vendor's module names (``layers.3.attn.wq_a.weight`` with its block
scale ``layers.3.attn.wq_a.scale``; no ``convert.py`` came with the code). A release that renames them ships
a name map in the model folder, ``name_map.json`` (docs/runner.md)::

    {"strip_prefix": "model.", "components": {"self_attn": "attn", "mlp": "ffn", "weight_scale_inv": "scale"}}

Each release key is ``strip_prefix`` + its dot-separated components, each renamed through ``components``
(release component -> vendor component; the map must be one-to-one) to give the vendor name. We go the other
way: a vendor parameter name becomes the release key by the inverse map.

Per-rank slicing follows from shapes alone: a vendor parameter built at world N whose dimension d is 1/N of
the stored tensor's (ColumnParallelLinear and its scale on d = 0, RowParallelLinear on d = 1, the vocabulary
of ParallelEmbedding / ParallelHead, the per-head ``attn_sink``) takes this rank's N-th part of d; an equal
shape is read whole; anything else is a checkpoint that does not match config.json. Routed experts another
rank owns are None in the vendor's MoE, so they are never read.

Storage: FP8 e4m3 weights with E8M0 block scales (32x32) and FP4 e2m1 experts (two per byte, stored as
I8/U8 or F4, even element in the low nibble) with E8M0 scales per 32 inputs are loaded as the vendor stores
them, so its own ``linear`` dispatches to its FP8/FP4 GEMMs with FP8 activations. A floating tensor where the
vendor expects FP8/FP4 (a real build's decoded weights), or any weight a quant hook transforms (dequantized to
float32 first, then transformed), goes back into the vendor's storage when that holds it exactly (a decoded
MXFP4 expert is FP4 values with power-of-two scales per 32: :func:`reencode`), so the vendor's own kernel
computes it; otherwise it is loaded as a bf16 weight with no scale and the vendor's ``linear`` takes its
``F.linear`` path (no FP8 activation quantization there: an act_transform supplies the build's).
:attr:`Loader.paths` records which, per module class. Other tensors are cast to the vendor parameter's dtype,
as its ``load_state_dict`` would.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from fideval.errors import FidevalError
from fideval.formats import nesting
from fideval.model.execution.transforms import transform_weight
from fideval.model.weights.checkpoint import WeightSource
from fideval.quant.module_classes import vendor_module_class

NAME_MAP = "name_map.json"
QUANT = (torch.float8_e4m3fn, torch.float4_e2m1fn_x2)
_E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=torch.float32)


class NameMap:
    """Vendor parameter name -> release key (identity when the model folder has no ``name_map.json``)."""

    def __init__(self, strip_prefix: str = "", components: dict[str, str] | None = None, source: str = ""):
        self.prefix = strip_prefix
        comps = dict(components or {})
        inverse = {v: k for k, v in comps.items()}
        if len(inverse) != len(comps):
            raise FidevalError(f"{source}: components map two release names to one vendor name",
                               hint="the name map must be one-to-one (release component -> vendor component)")
        self.inverse = inverse

    @classmethod
    def load(cls, folder: Path) -> NameMap:
        path = Path(folder) / NAME_MAP
        if not path.is_file():
            return cls()
        try:
            data = nesting.loads(path.read_text())
            prefix, comps = data.get("strip_prefix", ""), data.get("components", {})
            ok = isinstance(prefix, str) and isinstance(comps, dict) and not set(data) - {"strip_prefix", "components"}
            if not ok or not all(isinstance(k, str) and isinstance(v, str) for k, v in comps.items()):
                raise ValueError
        except (OSError, ValueError, AttributeError):
            raise FidevalError(f"{path} is not a name map",
                               hint='expected {"strip_prefix": "...", "components": {"release": "vendor"}}') from None
        return cls(prefix, comps, str(path))

    def __call__(self, vendor_name: str) -> str:
        return self.prefix + ".".join(self.inverse.get(c, c) for c in vendor_name.split("."))


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """float4_e2m1fn_x2 [..., K/2] -> float32 [..., K], even element in the low nibble (the vendor's packing)."""
    b = packed.view(torch.uint8).long()
    table = _E2M1.to(packed.device)
    return torch.stack([table[b & 15], table[b >> 4]], dim=-1).flatten(-2)


def dequantize(weight: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """A vendor Linear's weight as float32: FP8 times its 32x32 block scales, FP4 times its per-32 scales."""
    if weight.dtype == torch.float4_e2m1fn_x2:
        return unpack_fp4(weight) * scale.float().repeat_interleave(weight.shape[1] * 2 // scale.shape[1], dim=1)
    if weight.dtype == torch.float8_e4m3fn:
        out, inp = weight.shape
        s = scale.float().repeat_interleave(32, 0)[:out].repeat_interleave(32, 1)[:, :inp]
        return weight.float() * s
    return weight.float()


def _pow2_at_least(x: torch.Tensor) -> torch.Tensor:
    """The smallest power of two >= x (the vendor's ue8m0 scale rule); 1 where x is 0."""
    return torch.where(x > 0, torch.exp2(torch.ceil(torch.log2(x))), torch.ones_like(x))  # float32 in, float32 out


def reencode(dense: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``dense`` [out, in] float32 in the vendor's storage (FP4 with per-32 E8M0 scales, or FP8 with 32x32 E8M0
    blocks) when that holds it exactly, else None. A block of FP4 (FP8) values times any power of two is held
    exactly with the smallest power-of-two scale that fits its largest value, so one rule finds it whenever
    one exists: a decoded MXFP4 expert (or a power-of-two-scaled FP8 weight) goes back to the vendor's kernel."""
    out, inp = dense.shape
    if dtype == torch.float4_e2m1fn_x2 and inp % 32 == 0:
        g = dense.unflatten(-1, (-1, 32))
        s = _pow2_at_least(g.abs().amax(-1) / 6)
        mag = (g / s[..., None]).abs()
        idx = torch.searchsorted(_E2M1[:8].contiguous(), mag.contiguous()).clamp(max=7)
        codes = (idx | (torch.signbit(g).long() << 3)).to(torch.uint8).flatten(-2)
        q = (codes[..., 0::2] | (codes[..., 1::2] << 4)).contiguous().view(torch.float4_e2m1fn_x2)
    elif dtype == torch.float8_e4m3fn:
        pad = torch.zeros(-(-out // 32) * 32, -(-inp // 32) * 32, dtype=torch.float32)
        pad[:out, :inp] = dense
        s = _pow2_at_least(pad.unflatten(0, (-1, 32)).unflatten(2, (-1, 32)).abs().amax(dim=(1, 3)) / 448)
        full = s.repeat_interleave(32, 0).repeat_interleave(32, 1)[:out, :inp]
        q = (dense / full).to(torch.float8_e4m3fn)
    else:
        return None
    if (s > 2.0**127).any() or (s < 2.0**-127).any():
        return None
    sc = s.to(torch.float8_e8m0fnu)
    return (q, sc) if torch.equal(dequantize(q, sc), dense) else None


class Loader:
    """Fills vendor modules from a :class:`WeightSource`: this rank's slice, storage format kept, hooks applied."""

    def __init__(self, weights: WeightSource, names: NameMap, rank: int, world: int,
                 weight_transform: Callable | None, linear_cls: type):
        self.weights, self.names, self.rank, self.world = weights, names, rank, world
        self.transform, self.linear_cls = weight_transform, linear_cls
        self.paths: dict[str, set[str]] = {}  # module class -> how its transformed / decoded linears compute
        self._kernel = {torch.float8_e4m3fn: "fp8_gemm", torch.float4_e2m1fn_x2: "fp4_gemm"}

    def key(self, vendor_name: str) -> str:
        key = self.names(vendor_name)
        if key not in self.weights:
            raise FidevalError(f"{self.weights.dir}: tensor {key!r} (vendor parameter {vendor_name}) is missing",
                               hint="the checkpoint does not match config.json, or its release names need a name_map.json")
        return key

    def read(self, vendor_name: str, shape: tuple[int, ...]) -> torch.Tensor:
        """This rank's part of a tensor whose vendor parameter has ``shape``."""
        key = self.key(vendor_name)
        stored = tuple(self.weights.info(key).shape)
        dims = [d for d, (a, b) in enumerate(zip(stored, shape)) if a != b] if len(stored) == len(shape) else None
        if dims == []:
            return self.weights.read(key)
        if dims is None or len(dims) != 1 or stored[dims[0]] != shape[dims[0]] * self.world:
            raise FidevalError(f"{self.weights.dir}: tensor {key!r} has shape {list(stored)}, the vendor's {vendor_name} at "
                               f"world size {self.world} needs {list(shape)} (or the whole of which that is one rank's part)",
                               hint="the checkpoint does not match config.json")
        d, n = dims[0], shape[dims[0]]
        if d == 0:
            return self.weights.read(key, rows=(self.rank * n, (self.rank + 1) * n))
        return self.weights.read(key).narrow(d, self.rank * n, n).contiguous()

    def fill(self, module: torch.nn.Module, prefix: str, skip: tuple[str, ...] = ()) -> None:
        """Load every parameter of ``module`` (vendor names ``prefix`` + its own), except names under ``skip``."""
        done: set[str] = set()
        for name, lin in module.named_modules():
            if isinstance(lin, self.linear_cls) and not name.startswith(skip):
                self._fill_linear(lin, prefix + name + ".")
                done.update(f"{name}.{p}" for p, _ in lin.named_parameters(recurse=False))
        for name, p in module.named_parameters():
            if name in done or name.startswith(skip):
                continue
            t = self.read(prefix + name, tuple(p.shape))
            if t.dtype in QUANT or p.dtype in QUANT or t.dtype == torch.float8_e8m0fnu:
                t = _as_stored(t, p, prefix + name)
            cls = vendor_module_class(prefix + name)
            if self.transform is not None and cls is not None and p.dim() >= 2 and p.dtype.is_floating_point:
                t = transform_weight(self.transform, cls, self.names(prefix + name), t.float())  # the head (not a vendor Linear)
            p.data = t.to(p.dtype) if t.dtype != p.dtype else t

    def _fill_linear(self, lin: torch.nn.Module, prefix: str) -> None:
        w, s = lin.weight, lin.scale
        key = self.key(prefix + "weight")
        stored_dtype = self.weights.info(key).dtype
        cls = vendor_module_class(prefix + "weight")
        transform = self.transform if cls is not None else None
        if w.dtype in QUANT and (stored_dtype.is_floating_point and stored_dtype not in QUANT):
            # a decoded build: floats where the vendor keeps FP8/FP4 -- logical shape [out, in]
            logical = (w.shape[0], w.shape[1] * (2 if w.dtype == torch.float4_e2m1fn_x2 else 1))
            dense = self.read(prefix + "weight", logical).float()
        elif w.dtype not in QUANT:  # bf16 / fp32 linears: cast, as the vendor's load_state_dict would
            q = self.read(prefix + "weight", tuple(w.shape))
            if q.dtype in QUANT:
                raise FidevalError(f"tensor for {prefix}weight is stored as {q.dtype}, the vendor keeps it as {w.dtype}",
                                   hint="the checkpoint's dtype does not match config.json's dtype / expert_dtype")
            if transform is None:
                w.data = q.to(w.dtype)
                return
            dense = q.float()
        else:
            q = _as_stored(self.read(prefix + "weight", tuple(w.shape)), w, prefix + "weight")
            sc = _as_stored(self.read(prefix + "scale", tuple(s.shape)), s, prefix + "scale")
            if transform is not None and fp4_unchanged(transform, cls, self.names(prefix + "weight"), q, sc):
                transform = None  # the stored FP4 already is the target's arithmetic: its bits are the candidate's
                self.paths.setdefault(cls or "other", set()).add("fp4_gemm (stored MXFP4 kept: the transform's identity)")
            if transform is None:
                w.data, s.data = q, sc
                return
            dense = dequantize(q, sc)
        if transform is not None:
            dense = transform_weight(transform, cls, self.names(prefix + "weight"), dense)
        exact = reencode(dense.float(), w.dtype) if w.dtype in QUANT else None
        if exact is not None:  # the vendor's own FP8/FP4 GEMM, with its FP8 activations
            w.data, s.data = exact
            self.paths.setdefault(cls or "other", set()).add(f"{self._kernel[w.dtype]} (exact re-encoding)")
            return
        keep = w.dtype if w.dtype not in QUANT else torch.bfloat16
        lin.weight = torch.nn.Parameter(dense.to(keep), requires_grad=False)  # no .scale: F.linear path
        if s is not None:
            lin.scale = None
        self.paths.setdefault(cls or "other", set()).add(f"F.linear in {str(keep).removeprefix('torch.')}")


def fp4_unchanged(transform: Callable, cls: str | None, name: str, q: torch.Tensor, sc: torch.Tensor) -> bool:
    """Whether ``transform`` leaves every value of a stored FP4 weight (E2M1 x E8M0 per 32) unchanged, so that the
    stored bytes can be kept instead of decoding, transforming and re-encoding them on the host (6.5 s for one V4.1
    expert tensor of 2,304 x 5,120 on one thread). Asked of the transform itself: blocks of 32 are quantized one by
    one, each from its largest magnitude, and every element of a block on that block's scale alone; so a probe that
    holds, at each scale exponent the tensor uses, a block for every (largest code, other code, sign) pair -- the
    whole of what any block of the tensor can be -- is left unchanged exactly when the tensor is. A transform that
    changes the probe (another format, block size or recipe) is applied as before. Asked only of a compiled quant
    spec's OCP MX format (blocks of 32, a power-of-two scale each, nothing tensor-wide for the probe to miss)."""
    if cls is None or q.dtype != torch.float4_e2m1fn_x2 or sc.dtype != torch.float8_e8m0fnu or \
            q.dim() != 2 or tuple(sc.shape) != (q.shape[0], q.shape[1] * 2 // 32):
        return False
    spec = getattr(getattr(transform, "__self__", None), "modules", {}).get(cls)  # a compiled quant spec's class
    if spec is None or not str(spec.format).startswith("mxfp") or spec.group not in (None, 32) or \
            getattr(transform.__self__, "imatrix", None) is not None:
        return False  # only the OCP MX formats: blocks of 32 with a power-of-two scale each, nothing tensor-wide
    exps = torch.unique(sc.view(torch.uint8)).to(torch.int32) - 127  # E8M0: 2^(byte - 127)
    mags = _E2M1[:8]
    big, small = torch.meshgrid(torch.arange(1, 8), torch.arange(0, 8), indexing="ij")
    keep = small <= big
    big, small = big[keep], small[keep]
    f32 = torch.float32  # explicit: the vendor's modules are built under another default dtype
    blocks = torch.zeros(2 * big.numel(), 32, dtype=f32)
    blocks[:, 0] = mags[big].repeat(2)
    blocks[:, 1] = torch.cat([mags[small], -mags[small]])
    probe = torch.cat([blocks * torch.exp2(e.to(f32)) for e in exps] + [torch.zeros(1, 32, dtype=f32)])
    # and a block no 4-bit grid holds (0.3 of its largest value): a transform that leaves it as it is did not quantize
    # the probe at all (a tensor it does not apply to), which says nothing of the weight
    canary = torch.zeros(1, 32, dtype=f32)
    canary[0, 0], canary[0, 1] = 6.0, 1.8
    try:
        out = transform(cls, name, torch.cat([probe, canary]))
    except (ValueError, FidevalError):  # a transform that takes no block of 32 does not say
        return False
    if tuple(out.shape) != (probe.shape[0] + 1, 32) or torch.equal(out[-1:].float(), canary):
        return False
    return torch.equal(out[:-1].float(), probe)


def _as_stored(t: torch.Tensor, p: torch.Tensor, name: str) -> torch.Tensor:
    """A stored tensor in the vendor parameter's quantized dtype: packed FP4 bytes viewed as e2m1 pairs."""
    if p.dtype == t.dtype:
        return t
    if p.dtype == torch.float4_e2m1fn_x2 and t.dtype in (torch.int8, torch.uint8) and tuple(t.shape) == tuple(p.shape):
        return t.view(torch.float4_e2m1fn_x2)
    raise FidevalError(f"tensor for {name} is stored as {t.dtype}, the vendor keeps it as {p.dtype}",
                       hint="the checkpoint's dtype does not match config.json's dtype / expert_dtype")


class EngramRows:
    """Rows of one Engram table (FP8 values + E8M0 scales) fetched by id from host memory, never the table.

    The vendor shards the table over ranks (``ceil(rows / N)`` rows each) and all-reduces the lookups. A
    safetensors checkpoint is memory-mapped (only the pages of looked-up rows are read, into the page cache);
    another weight source has this rank's part read once and held in host memory."""

    def __init__(self, loader: Loader, vendor_prefix: str, rows: int):
        part_rows = -(-rows // loader.world)
        self.loader, self.lo = loader, loader.rank * part_rows
        self.keys = [loader.key(vendor_prefix + n) for n in ("weight", "scale")]
        infos = [loader.weights.info(k) for k in self.keys]
        self.total = int(infos[0].shape[0])
        for key, info in zip(self.keys, infos):
            if int(info.shape[0]) != rows or torch.empty(0, dtype=info.dtype).element_size() != 1:
                raise FidevalError(f"{loader.weights.dir}: Engram tensor {key!r} is {info.dtype} of shape {list(info.shape)}, "
                                   f"config.json's engram_num_embeddings says {rows} rows of one-byte values",
                                   hint="Engram tables are FP8 e4m3 rows with E8M0 scales; the checkpoint does not match config.json")
        self.hi = min(self.lo + part_rows, self.total)
        tensors = getattr(loader.weights, "tensors", None)
        self.maps, self.parts = [], []
        for key, info in zip(self.keys, infos):
            if isinstance(tensors, dict) and hasattr(info, "file") and hasattr(info, "start"):
                width = info.nbytes // max(int(info.shape[0]), 1)
                self.maps.append((np.memmap(info.file, dtype=np.uint8, mode="r", offset=info.start,
                                            shape=(int(info.shape[0]), width)), info))
            else:
                self.maps.append((None, info))
        self.dtypes = (torch.float8_e4m3fn, torch.float8_e8m0fnu)

    def owned(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(unique ids this rank owns, the fp8 rows, the scale rows), on the CPU."""
        u = torch.unique(ids.cpu())
        u = u[(u >= self.lo) & (u < self.hi)]
        out = []
        for j, ((mm, info), dtype, key) in enumerate(zip(self.maps, self.dtypes, self.keys)):
            if mm is not None:
                raw = torch.from_numpy(np.ascontiguousarray(mm[u.numpy()]))  # [len(u), bytes per row]
            else:
                if len(self.parts) <= j:
                    self.parts.append(self.loader.weights.read(key, rows=(self.lo, self.hi)))
                raw = self.parts[j][u - self.lo].contiguous()
            out.append(raw.view(torch.uint8).view(dtype).view(len(u), *info.shape[1:]))
        return u, out[0], out[1]
