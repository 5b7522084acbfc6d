"""DeepSeek-V4.1-Flash through the reference-code driver against the vendor's own ``Transformer.forward``.

The oracle is the vendor's code itself (``../shared/reference-code/deepseek-v4.1-flash``) on the same weights.
It returns the last position only, so earlier positions are checked through prefixes: the vendor's forward on
the first k tokens against our position k-1. The vendor computes in bf16 (its kernels take nothing else), the
head in float32. Two checks per comparison: the float32 logits within 1e-6 (the head GEMM over B x L rows
sums in another order than the vendor's over B rows: measured ~5e-7, see docs/runner.md), and bit-identity of
our final hidden state put through the vendor's head exactly as its forward calls it.
"""

from __future__ import annotations

import json
import os
import socket
import sys

import pytest
import torch
from ref_deepseek_v41 import MISSING, V41, vendor_code, write_tiny_v41, write_tokenizer

pytestmark = pytest.mark.skipif(not (V41 / "model.py").is_file(), reason=MISSING)
BOUND = 1e-6
L = 24  # past the window (8): compressed KV (ratios 2 and 1) and the indexer's top-4 of up to 24 positions


def _driver(folder, **kw):
    from fideval.model.reference.code import load_vendor_code
    from fideval.model.reference.deepseek_v41 import DeepseekV41Driver
    from fideval.model.weights.checkpoint import Checkpoint

    ck = Checkpoint(folder)
    return DeepseekV41Driver(load_vendor_code(folder / "inference", trust=True), ck.config_dict, ck, **kw)


def _run(d, tokens):
    """Layer by layer as the runner drives it; returns (logits [B, L, V], final state, shared-slot keys per layer)."""
    st, kept = d.begin(tokens), []
    for i in range(d.n_layers):
        st = d.forward_layer(i, d.load_layer(i), st)
        kept.append((sorted(st.shared), st.hashes is not None))
    return d.finish(st), st, kept


def _vendor_head(d, st, k):
    """Our state's first k positions through the vendor's collapse, norm and head as its forward calls them."""
    norm, head = d._head
    with torch.inference_mode():
        return head(norm(d.m.Block.hc_pre(None, st.h[:, :k], st.pre_mix[:, :k]))).float()


@pytest.fixture(scope="module", params=["fp8", "bf16"])
def model(request, tmp_path_factory):
    torch.set_num_threads(1)
    return write_tiny_v41(tmp_path_factory.mktemp("v41") / request.param, dtype=request.param)


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, 512, (2, L), generator=torch.Generator().manual_seed(1))


def test_all_positions_match_the_vendors_forward(model, tokens):
    from fideval.model.reference.deepseek_v41 import describe

    d = _driver(model)
    logits, st, _ = _run(d, tokens)
    assert logits.shape == (2, L, 512) and logits.dtype == torch.float32
    info = describe(d)
    assert (info["compress_ratios"], info["engram_layer_ids"], info["kernels"]["sparse_attn"]) == ([0, 2, 2, 1, 1, 1], [0, 2], "kernel_cpu")
    for k in (6, 13, L):  # inside the window; past it (compressed KV, top-k); the whole sequence
        ref = d.vendor_logits(tokens[:, :k])
        assert ref.std() > 0.3  # not a degenerate model
        assert (logits[:, k - 1] - ref).abs().max().item() <= BOUND, k
        assert torch.equal(_vendor_head(d, st, k), ref), k


def test_shared_slots_and_engram_ids_are_carried_only_while_needed(model, tokens):
    _, _, kept = _run(_driver(model), tokens)
    # the tiny schedule (ref_deepseek_v41.TINY), read off the vendor's Attention/Indexer: layer 1 (ratio 2)
    # publishes compressed KV + top-k for layer 2; layer 3 (ratio 1, candidate source) publishes all four
    # for 4 (KV, top-k) and 5 (an index source that reads 3's index keys and candidates); Engram on 0 and 2
    assert kept == [([], True), (["compress_kv", "topk_idxs"], True), ([], False),
                    (["candidates", "compress_kv", "index_k", "topk_idxs"], False),
                    (["candidates", "compress_kv", "index_k"], False), ([], False)]


def test_quant_hooks_reach_the_vendor_modules(model, tokens):
    seen = set()

    def wt(cls, name, t):
        seen.add(cls)
        assert t.dtype == torch.float32
        return (t * 16).round() / 16

    act = {"routed_experts": lambda x: x.clamp(-0.25, 0.25), "attention": lambda x: x * 0.5}
    plain = _driver(model)
    d = _driver(model, weight_transform=wt, act_transform=act)
    logits, _, _ = _run(d, tokens)
    assert seen == {"routed_experts", "shared_experts", "attention", "lm_head"}
    ref = d.vendor_logits(tokens)  # the vendor's forward with the same hooks
    assert (logits[:, -1] - ref).abs().max().item() <= BOUND
    assert (ref - plain.vendor_logits(tokens)).abs().max().item() > 1e-2  # the hooks change the model


def test_engram_rows_come_from_host_memory_by_id(model):
    from safetensors.torch import load_file

    d = _driver(model)
    block = d.load_layer(2)
    rows = block.engram_rows
    full = load_file(str(model / "model.safetensors"))
    ids = torch.tensor([[5, 0, 5], [rows.total - 1, 17, 3]])
    u, w, s = rows.owned(ids)
    assert u.tolist() == [0, 3, 5, 17, rows.total - 1]
    assert torch.equal(w.view(torch.uint8), full["layers.2.engram.embed.weight"][u].view(torch.uint8))
    assert torch.equal(s.view(torch.uint8), full["layers.2.engram.embed.scale"][u].view(torch.uint8))
    assert block.engram.embed.weight.numel() == 0  # the layer holds no table of its own
    # a rank that owns none of the looked-up rows (possible at large N): every lookup is masked to zero, as the
    # vendor masks other ranks' ids, so its share adds nothing (with a zero lookup, Engram returns h as is)
    rows.lo = rows.hi = rows.total
    h = torch.randn(2, 3, d.args.hc_mult, d.args.dim).to(torch.bfloat16)
    with torch.inference_mode():
        assert torch.equal(d._engram(block, h, ids.unsqueeze(-1).expand(-1, -1, 4).contiguous()), h)


def test_a_release_name_map_is_applied(model, tokens, tmp_path):
    """Renamed tensors (``model.`` prefix, ``attn`` -> ``self_attn``, ``ffn`` -> ``mlp``) with a name map
    give the same logits bit for bit."""
    from safetensors.torch import load_file, save_file

    renamed = tmp_path / "renamed"
    renamed.mkdir()
    comps = {"self_attn": "attn", "mlp": "ffn"}
    inv = {v: k for k, v in comps.items()}
    full = load_file(str(model / "model.safetensors"))
    save_file({"model." + ".".join(inv.get(c, c) for c in k.split(".")): v for k, v in full.items()},
              str(renamed / "model.safetensors"))
    for f in ("config.json", "tokenizer.json"):
        (renamed / f).write_text((model / f).read_text())
    (renamed / "inference").symlink_to(V41, target_is_directory=True)
    (renamed / "name_map.json").write_text(json.dumps({"strip_prefix": "model.", "components": comps}))
    a, _, _ = _run(_driver(model), tokens[:, :10])
    b, _, _ = _run(_driver(renamed), tokens[:, :10])
    assert torch.equal(a, b)
    (renamed / "name_map.json").unlink()
    from fideval.errors import FidevalError

    with pytest.raises(FidevalError, match="name_map.json"):
        _driver(renamed).load_layer(0)


def test_bad_input_is_one_line(model, tmp_path):
    from fideval.errors import FidevalError

    with pytest.raises(FidevalError, match="bfloat16 only"):
        _driver(model, dtype=torch.float32)
    with pytest.raises(FidevalError, match="not divisible by the world size 3"):
        _driver(model, world=3)
    cfg = json.loads((model / "config.json").read_text())
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "model.safetensors").symlink_to(model / "model.safetensors")
    (bad / "inference").symlink_to(V41, target_is_directory=True)
    (bad / "tokenizer.json").symlink_to(model / "tokenizer.json")
    for change, msg in (({"n_expert_groups": 2}, "does not take: n_expert_groups"),
                        ({"kv_source_layers": [3]}, "no earlier kv_source_layer"),
                        ({"n_layers": "six"}, "TypeError")):
        (bad / "config.json").write_text(json.dumps({**cfg, **change}))
        with pytest.raises(FidevalError, match=msg):
            _driver(bad)
    (bad / "config.json").write_text(json.dumps({**cfg, "n_routed_experts": 8}))
    with pytest.raises(FidevalError, match="tensor 'layers.0.ffn.experts.4.w1.weight'"):
        _driver(bad).load_layer(0)
    (bad / "config.json").write_text(json.dumps({**cfg, "engram_num_embeddings": [e + 1 for e in cfg["engram_num_embeddings"]]}))
    with pytest.raises(FidevalError, match="engram_num_embeddings says"):
        _driver(bad).load_layer(0)
    (bad / "config.json").write_text(json.dumps(cfg))
    (bad / "tokenizer.json").unlink()  # Engram's tokenizer: checked when the driver opens, before any output
    with pytest.raises(FidevalError, match="tokenizer.json not found"):
        _driver(bad)
    write_tokenizer(bad, 256)  # another model's tokenizer: 128 compressed entries, the config says 256
    with pytest.raises(FidevalError, match="has 128 entries, config.json's engram_compressed_vocab_size is 256"):
        _driver(bad)


# -- model parallel 2 on gloo ------------------------------------------------------------------------------
def _slices_follow_the_vendors_classes(d, folder, rank, world) -> list[str]:
    """Every loaded tensor of layer 3 (attention with compressor and indexer, MoE), the embedding and the head
    against the stored tensor cut as the vendor's class implies (independent of the loader's shape rule)."""
    from safetensors.torch import load_file

    full, m, bad = load_file(str(folder / "model.safetensors")), d.m, []

    def part(t, dim):
        n = t.shape[dim] // world
        return t.narrow(dim, rank * n, n)

    mods = [("layers.3.", d.load_layer(3)), ("embed.", d._resident("_embed", d._build_embed)),
            ("head.", d._resident("_head", d._build_head)[1])]
    for prefix, root in mods:
        for name, mod in root.named_modules():
            dim = {m.ColumnParallelLinear: 0, m.RowParallelLinear: 1, m.ParallelEmbedding: 0, m.ParallelHead: 0}.get(type(mod))
            for pname, p in mod.named_parameters(recurse=False):
                key = prefix + (f"{name}." if name else "") + pname
                want = part(full[key], 0) if pname == "attn_sink" else full[key] if dim is None else part(full[key], dim)
                if p.element_size() == 1:  # FP8 / packed FP4 / E8M0: the stored bytes
                    same = torch.equal(p.contiguous().view(torch.uint8), want.contiguous().view(torch.uint8))
                else:
                    same = torch.equal(p, want.to(p.dtype))
                if not same:
                    bad.append(key)
            if isinstance(mod, m.MoE):
                owned = [i for i, e in enumerate(mod.experts) if e is not None]
                if owned != list(range(rank * 4 // world, (rank + 1) * 4 // world)):  # TINY: 4 routed experts
                    bad.append(f"{prefix}{name} experts {owned}")
    return bad


def _worker(rank, world, port, folder, out):
    import torch.distributed as dist

    torch.set_num_threads(1)
    sys.path.insert(0, os.path.dirname(__file__))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        toks = torch.load(f"{out}/tokens.pt")
        d = _driver(folder, rank=rank, world=world, group=dist.group.WORLD)
        logits, _, _ = _run(d, toks)
        bad = _slices_follow_the_vendors_classes(d, folder, rank, world)
        torch.save({"logits": logits, "vendor": d.vendor_logits(toks), "bad": bad}, f"{out}/rank{rank}.pt")
        dist.barrier()  # every rank past its last collective before any tears the group down (gloo aborted a rank)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_model_parallel_matches_the_vendor_at_the_same_n(model, tokens, tmp_path, world):
    """N = 2 and 4 equal the vendor's own forward at that N; each rank holds exactly the vendor's shards. N > 1
    is not N = 1 at bf16 precision, in the vendor's code itself: a RowParallelLinear returns each rank's partial
    sum rounded to bf16 before the fp32 all-reduce (1 bf16 ulp), and the FP8 activation quantization's
    power-of-two block scales amplify such steps in this random model; measured in docs/runner.md."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.save(tokens, tmp_path / "tokens.pt")
    mp.start_processes(_worker, args=(world, port, model, str(tmp_path)), nprocs=world, join=True, start_method="fork")
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    r0 = ranks[0]
    assert all(r["bad"] == [] for r in ranks)
    assert all(torch.equal(r0["logits"], r["logits"]) for r in ranks)  # gathered: every rank holds all of V
    assert (r0["logits"][:, -1] - r0["vendor"]).abs().max().item() <= BOUND
    single, _, _ = _run(_driver(model), tokens)
    p, q = torch.log_softmax(single.double(), -1), torch.log_softmax(r0["logits"].double(), -1)
    kld = (p.exp() * (p - q)).sum(-1).mean().item()
    agree = (single.argmax(-1) == r0["logits"].argmax(-1)).float().mean().item()
    print(f"N={world} vs N=1: max|dlogit| {(r0['logits'] - single).abs().max().item():.3g}, mean KLD {kld:.3g}, top-1 {agree:.3f}")
    assert kld < 0.05


class _Decoded:
    """A real build's view of the checkpoint: FP8/FP4 linears decoded to float32, their scales gone (as a
    quantized build's WeightSource returns them); ``scale_by`` perturbs one tensor so it is no longer FP4."""

    def __init__(self, ck, scale_by: dict[str, float] | None = None):
        self.ck, self.dir, self.config_dir, self.config_dict = ck, ck.dir, ck.config_dir, ck.config_dict
        self.scale_by = scale_by or {}

    def _quantized(self, key):
        return (key.endswith(".weight") and ".engram.embed." not in key and key[:-6] + "scale" in self.ck
                and self.ck.info(key).dtype in (torch.float8_e4m3fn, torch.int8))

    def __contains__(self, key):
        return key in self.ck and not (key.endswith(".scale") and self._quantized(key[:-5] + "weight"))

    def info(self, key):
        from types import SimpleNamespace

        i = self.ck.info(key)
        if not self._quantized(key):
            return i
        return SimpleNamespace(shape=(i.shape[0], i.shape[1] * (2 if i.dtype == torch.int8 else 1)), dtype=torch.float32)

    def read(self, key, rows=None, pin=False, out=None):
        from fideval.model.reference.deepseek_v41_weights import dequantize

        t = self.ck.read(key)
        if self._quantized(key):
            w = t.view(torch.float4_e2m1fn_x2) if t.dtype == torch.int8 else t
            t = dequantize(w, self.ck.read(key[:-6] + "scale")) * self.scale_by.get(key, 1.0)
        return t if rows is None else t[rows[0]:rows[1]]


def test_a_builds_decoded_weights_load_into_the_vendors_kernels(tokens, tmp_path_factory):
    """Decoded FP4 experts and FP8 linears go back into the vendor's storage exactly (same logits, bit for
    bit); a tensor that is no longer FP4 takes the bf16 F.linear path and still matches the vendor's forward."""
    from fideval.model.reference.code import load_vendor_code
    from fideval.model.reference.deepseek_v41 import DeepseekV41Driver
    from fideval.model.weights.checkpoint import Checkpoint

    torch.set_num_threads(1)
    folder = write_tiny_v41(tmp_path_factory.mktemp("v41dec") / "fp8", dtype="fp8")
    ck, code = Checkpoint(folder), load_vendor_code(folder / "inference", trust=True)
    toks = tokens[:, :14]
    ref, _, _ = _run(DeepseekV41Driver(code, ck.config_dict, ck), toks)
    d = DeepseekV41Driver(code, ck.config_dict, _Decoded(ck))
    got, _, _ = _run(d, toks)
    assert torch.equal(got, ref)
    assert d.kernels["linears: routed_experts"] == "fp4_gemm (exact re-encoding)"
    assert d.kernels["linears: attention"] == "fp8_gemm (exact re-encoding)"
    off = DeepseekV41Driver(code, ck.config_dict, _Decoded(ck, {"layers.1.ffn.experts.0.w1.weight": 1.01}))
    got, _, _ = _run(off, toks)
    assert "F.linear in bfloat16" in off.kernels["linears: routed_experts"]
    assert (got[:, -1] - off.vendor_logits(toks)).abs().max().item() <= BOUND
    assert (got - ref).abs().max().item() > 0


def test_prefetching_the_next_layer_on_a_thread_changes_nothing(model, tokens):
    """The runner loads layer i+1 on a prefetch thread while layer i computes; two micro-batches share one
    loaded layer. Same bits as one sequence at a time, and torch's default dtype is float32 again after."""
    from concurrent.futures import ThreadPoolExecutor

    d = _driver(model)
    alone = [_run(_driver(model), tokens[j:j + 1, :16])[0] for j in range(2)]
    states = [d.begin(tokens[j:j + 1, :16]) for j in range(2)]
    with ThreadPoolExecutor(1) as pool:
        nxt = pool.submit(d.load_layer, 0)
        for i in range(d.n_layers):
            block = nxt.result()
            if i + 1 < d.n_layers:
                nxt = pool.submit(d.load_layer, i + 1)
            states = [d.forward_layer(i, block, st) for st in states]
    for j, st in enumerate(states):
        assert torch.equal(d.finish(st), alone[j])
    assert torch.get_default_dtype() == torch.float32


def test_the_released_config_is_taken_whole():
    """The release's own config.json (DeepSeek-V4.1-Flash: 40 layers, Engram on 1 and 14, DSpark and vision
    parts that are not built) gives the vendor's ModelArgs as is; a world size that does not divide its 8
    output groups is one line."""
    from fideval.errors import FidevalError
    from fideval.model.reference.deepseek_v41 import _slot_keeps, model_args

    m = vendor_code().model
    cfg = json.loads((V41 / "config.json").read_text())
    a = model_args(m, cfg, 8)
    assert (a.n_layers, a.dim, a.hc_mult, a.engram_layer_ids, a.kv_source_layers) == (40, 5120, 4, (1, 14), (2, 8, 14, 20))
    keeps = _slot_keeps(a)
    # kv sources 2, 8, 14, 20 each replace the slot: the layer before one drops it, and layer 39 reads the last
    assert keeps["compress_kv"] == set(range(2, 39)) - {7, 13, 19}
    assert keeps["candidates"] == set(range(20, 36))  # read by index sources 24, 28, 32, 36
    with pytest.raises(FidevalError, match="o_groups 8 is not divisible by the world size 16"):
        model_args(m, cfg, 16)


def test_an_mxfp4_expert_candidate_runs_in_the_vendors_fp4_kernel(model, tokens):
    """The quant spec's MXFP4 on routed experts. On the FP8/FP4 model the vendor's FP4 experts already are
    MXFP4 (a block's largest value is 4 or 6 times its power-of-two scale, so OCP's floor recipe picks the same
    scale): the candidate goes back into the vendor's FP4 storage, its own fp4_gemm computes it, and the logits
    are the reference's bit for bit. On the bf16 model the experts are bf16 linears and stay so, and MXFP4
    changes them. Either way the vendor's forward with the same hook agrees."""
    from fideval.quant.spec import compile_spec

    spec = compile_spec("routed_experts=mxfp4")
    d = _driver(model, weight_transform=spec.weight_transform)
    logits, _, _ = _run(d, tokens)
    fp4 = json.loads((model / "config.json").read_text())["expert_dtype"] == "fp4"
    # the released FP4 experts already are MXFP4: kept as stored (deepseek_v41_weights.fp4_unchanged), not decoded,
    # transformed and re-encoded on the host
    assert d.kernels["linears: routed_experts"] == ("fp4_gemm (stored MXFP4 kept: the transform's identity)" if fp4
                                                    else "F.linear in bfloat16")
    assert (logits[:, -1] - d.vendor_logits(tokens)).abs().max().item() <= BOUND
    ref, _, _ = _run(_driver(model), tokens)
    p, q = torch.log_softmax(ref.double(), -1), torch.log_softmax(logits.double(), -1)
    kld = (p.exp() * (p - q)).sum(-1).mean().item()
    print(f"MXFP4 routed experts vs reference: mean KLD {kld:.3g}")
    if fp4:
        assert torch.equal(logits, ref)
    else:
        assert kld > 1e-6  # the candidate is not the reference


def test_stored_fp4_is_kept_only_where_the_transform_is_its_identity():
    """fp4_unchanged asks the transform itself, on a probe of every (largest code, other code, sign) block at each
    scale exponent the weight uses: MXFP4 (both recipes) leaves FP4 x E8M0 weights as they are; NVFP4 (blocks of 16,
    E4M3 scales) does not, nor does a transform that does not apply to the tensor (its canary block unchanged). Where
    it says kept, decoding the weight and transforming it gives the decoded weight bit for bit."""
    from fideval.model.reference.deepseek_v41_weights import dequantize, fp4_unchanged
    from fideval.quant.spec import compile_spec

    g = torch.Generator().manual_seed(3)
    codes = torch.randint(0, 256, (64, 128), generator=g, dtype=torch.int64).to(torch.uint8)
    q = codes.view(torch.float4_e2m1fn_x2)
    sc = torch.randint(120, 134, (64, 8), generator=g, dtype=torch.int64).to(torch.uint8).view(torch.float8_e8m0fnu)
    name = "model.layers.0.mlp.experts.0.down_proj.weight"
    dense = dequantize(q, sc)
    for recipe in ("floor", "rceil"):
        spec = compile_spec(f"routed_experts=mxfp4:{recipe}")
        assert fp4_unchanged(spec.weight_transform, "routed_experts", name, q, sc)
        assert torch.equal(spec.weight_transform("routed_experts", name, dense.clone()), dense)
    nv = compile_spec("routed_experts=nvfp4")
    assert not fp4_unchanged(nv.weight_transform, "routed_experts", name, q, sc)
    assert not fp4_unchanged(compile_spec("attention=mxfp4").weight_transform, "routed_experts", name, q, sc)


def test_sequences_longer_than_max_seq_len(tmp_path):
    """config.json's max_seq_len (here 16) sizes the vendor's rotary tables; a 24-token sequence gets them
    recomputed with the vendor's own precompute_freqs_cis, and matches its forward built for 24."""
    torch.set_num_threads(1)
    folder = write_tiny_v41(tmp_path / "short", dtype="bf16", max_seq_len=16)
    toks = torch.randint(0, 512, (1, L), generator=torch.Generator().manual_seed(2))
    d = _driver(folder)
    logits, _, _ = _run(d, toks)
    assert (logits[:, -1] - d.vendor_logits(toks)).abs().max().item() <= BOUND


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_a_gpu_the_vendors_kernels_run_on_its_device(model, tokens):
    """kernel_cpu.py makes its accumulators without a device and its E2M1 tables at import, on the CPU: the driver
    moves the tables and runs each kernel with its inputs' device as the default (deepseek_v41_kernels.on_device). On CUDA
    our layer-by-layer run matches the vendor's own forward on CUDA as on the CPU (its last position within the
    head's sum-order bound; our final state through its head bit for bit), and stays near the CPU run (bf16 GEMMs
    round differently on the GPU: within 2 % of the largest logit)."""
    d = _driver(model, device="cuda")
    toks = tokens.cuda()
    logits, st, _ = _run(d, toks)
    assert logits.device.type == "cuda"
    ref = d.vendor_logits(toks)
    assert (logits[:, -1] - ref).abs().max().item() <= BOUND
    assert torch.equal(_vendor_head(d, st, L), ref)
    cpu, _, _ = _run(_driver(model), tokens)
    assert (logits.cpu() - cpu).abs().max().item() <= 0.02 * cpu.abs().max().item()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fp4_weights_move_to_cuda_under_deterministic_mode_with_their_bytes_and_attributes():
    """torch has no deterministic fill for float4_e2m1fn_x2 on CUDA, so ``.to("cuda")`` of a block holding FP4 experts
    failed (an H100, 2026-12-07); ``to_device`` moves them as bytes, keeping the Parameter (the vendor hangs its
    ``scale`` on it) and every byte."""
    from fideval.model.reference.deepseek_v41 import to_device

    m = torch.nn.Linear(4, 4)
    raw = torch.randint(0, 256, (8, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    m.fp4 = torch.nn.Parameter(raw.clone().view(torch.float4_e2m1fn_x2), requires_grad=False)
    m.fp4.scale = "kept"
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        to_device(m, torch.device("cuda"))
    finally:
        torch.use_deterministic_algorithms(was)
    assert m.fp4.is_cuda and m.fp4.dtype == torch.float4_e2m1fn_x2 and m.fp4.scale == "kept" and m.weight.is_cuda
    assert torch.equal(m.fp4.view(torch.uint8).cpu(), raw)
