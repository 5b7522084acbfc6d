"""Train the demo's tiny DeepSeek-V3 model (MLA + dense first layer + shared/routed experts) on the demo corpus.

Why train at all: a randomly initialised model has flat next-token distributions, so every quantized
candidate would score a near-zero KLD and the demo would show nothing. A model trained for a few minutes
on the demo corpus has peaked distributions like a real LM's (top-1 agreement 20-99.5 % on the demo
windows), which is what makes KLD, top-1 flips and their confidence intervals meaningful.

Why these choices:
- ``DeepseekV3ForCausalLM`` from transformers itself, so the runner's adapters drive the reference code.
- Mostly 512-token sequences (cheap) plus one step in five at 2,048 tokens, so every position the demo
  evaluates (2,048-token windows, 512-token cuts from position 0) has been trained.
- The router's ``e_score_correction_bias`` is updated as in DeepSeek-V3's auxiliary-loss-free balancing
  (bias += gamma * sign(mean load - expert load) after each step), so it is non-zero and has to survive
  save/load — a check the tests make.
- Deterministic: one seed, a fixed step count (not a time budget), 2 threads, a fixed data order.

Run after ``build_tokenizer``: ``python tools/demo/train_model.py`` (writes config.json,
model.safetensors, generation_config.json and TRAINING.json into ``assets/model/``).
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import tempfile
import time
from pathlib import Path

from build_tokenizer import document_text, read_domain  # tools/demo/build_tokenizer.py, beside this file

from fideval import fsio
from fideval.demo import DOMAINS, MODEL_DIR

SEED = 1234
STEPS = 1800
LR, LR_MIN, WARMUP = 3e-3, 3e-4, 50
SHORT, SHORT_BATCH = 512, 4     # 2,048 tokens per step either way
LONG, LONG_BATCH, LONG_EVERY = 2048, 1, 5
BIAS_GAMMA = 1e-3
THREADS = 1
WINDOW = 2048

CONFIG = dict(
    vocab_size=4096, hidden_size=128, intermediate_size=384, moe_intermediate_size=128,
    num_hidden_layers=4, first_k_dense_replace=1, num_attention_heads=4, num_key_value_heads=4,
    q_lora_rank=96, kv_lora_rank=64, qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32,
    n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, n_group=4, topk_group=2,
    norm_topk_prob=True, routed_scaling_factor=1.0, max_position_embeddings=2048, rope_theta=10000.0,
    tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, pad_token_id=2, initializer_range=0.02,
)


def domain_docs(tokenizer, domain: str) -> list[list[int]]:
    """Token ids of each document of a domain, EOS appended (the packing the demo windows use)."""
    eos = tokenizer.token_to_id("<|eos|>")
    return [tokenizer.encode(document_text(d), add_special_tokens=False).ids + [eos] for d in read_domain(domain)]


def pack_windows(tokenizer, domain: str, length: int = WINDOW) -> list[list[int]]:
    """Documents in file order joined into one stream, cut into consecutive ``length``-token chunks."""
    stream = [t for doc in domain_docs(tokenizer, domain) for t in doc]
    return [stream[i:i + length] for i in range(0, len(stream) - length + 1, length)]


def batches(docs: list[list[int]], rng: random.Random, steps: int):
    """Yield (step, LongTensor [B, L]): each epoch shuffles documents, joins them and cuts at a random offset."""
    import torch

    buf: list[int] = []
    for step in range(steps):
        length, b = (LONG, LONG_BATCH) if step % LONG_EVERY == LONG_EVERY - 1 else (SHORT, SHORT_BATCH)
        while len(buf) < length * b:
            order = list(range(len(docs)))
            rng.shuffle(order)
            epoch = [t for i in order for t in docs[i]]
            buf += epoch[rng.randrange(length):]
        chunk, buf = buf[:length * b], buf[length * b:]
        yield step, torch.tensor(chunk, dtype=torch.long).view(b, length)


def lr_at(step: int, steps: int) -> float:
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    frac = (step - WARMUP) / max(1, steps - WARMUP)
    return LR_MIN + 0.5 * (LR - LR_MIN) * (1 + math.cos(math.pi * frac))


def build_model():
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(SEED)
    return DeepseekV3ForCausalLM(DeepseekV3Config(**CONFIG))


def train(steps: int = STEPS, log=print):
    import torch
    from tokenizers import Tokenizer

    from fideval.progress import progress

    torch.set_num_threads(THREADS)
    tok = Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))
    docs = [d for domain in DOMAINS for d in domain_docs(tok, domain)]
    model = build_model()
    model.train()
    routers = [m for m in model.modules() if type(m).__name__ == "DeepseekV3TopkRouter"]
    loads = {id(r): torch.zeros(r.num_experts) for r in routers}

    def count(router, _inp, out):
        loads[id(router)] += torch.bincount(out[2].flatten(), minlength=router.num_experts).float()

    hooks = [r.register_forward_hook(count) for r in routers]
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "gate.weight" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "gate.weight" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=(0.9, 0.95), eps=1e-8)
    rng = random.Random(SEED)
    t0, losses = time.monotonic(), []
    with progress("train", total=steps, unit="steps") as bar:
        for step, x in batches(docs, rng, steps):
            for g in opt.param_groups:
                g["lr"] = lr_at(step, steps)
            loss = model(input_ids=x, labels=x).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            with torch.no_grad():  # auxiliary-loss-free balancing (DeepSeek-V3 sec. 2.1.2)
                for r in routers:
                    load = loads[id(r)]
                    r.e_score_correction_bias += BIAS_GAMMA * torch.sign(load.mean() - load)
                    load.zero_()
            losses.append(loss.item())
            if step % 20 == 0 or step == steps - 1:
                log(f"step {step:4d} loss {loss.item():.4f} lr {lr_at(step, steps):.2e} {time.monotonic() - t0:6.1f}s")
            bar.advance(1)
    for h in hooks:
        h.remove()
    seconds = time.monotonic() - t0
    final = sum(losses[-20:]) / len(losses[-20:])
    return model, {"seconds": round(seconds, 1), "final_loss": round(final, 4), "last_step_loss": round(losses[-1], 4)}


def top1_by_domain(model, tokenizer) -> dict[str, list[float]]:
    """Top-1 agreement (argmax of row r == token r+1) on every packed 2,048-token chunk, per domain."""
    import torch

    model.eval()
    out = {}
    with torch.no_grad():
        for domain in DOMAINS:
            vals = []
            for chunk in pack_windows(tokenizer, domain):
                ids = torch.tensor([chunk])
                pred = model(input_ids=ids).logits[0, :-1].argmax(-1)
                vals.append((pred == ids[0, 1:]).float().mean().item())
            out[domain] = vals
    return out


def save(model, out: Path = MODEL_DIR) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        for name in ("config.json", "model.safetensors", "generation_config.json"):
            if (Path(tmp) / name).exists():
                fsio.write_bytes(out / name, (Path(tmp) / name).read_bytes())


def check_reload(model, out: Path = MODEL_DIR) -> float:
    """Reload from disk; fail on missing/unexpected keys; return the max |logit difference| on a probe."""
    import torch
    from transformers import DeepseekV3ForCausalLM

    again, info = DeepseekV3ForCausalLM.from_pretrained(out, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    if bad:
        raise RuntimeError(f"reloading {out} reported {bad}")
    x = torch.arange(3, 515).view(1, -1) % 4096
    model.eval()
    again.eval()
    with torch.no_grad():
        return (model(input_ids=x).logits - again(input_ids=x).logits).abs().max().item()


def main(argv: list[str] | None = None) -> None:
    import torch
    from tokenizers import Tokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=STEPS)
    args = ap.parse_args(argv)
    torch.manual_seed(SEED)
    model, stats = train(args.steps)
    save(model)
    diff = check_reload(model)
    tok = Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))
    top1 = top1_by_domain(model, tok)
    summary = {d: {"chunks": len(v), "min": round(min(v), 4), "max": round(max(v), 4),
                   "mean": round(sum(v) / len(v), 4)} for d, v in top1.items()}
    for d, s in summary.items():
        print(f"top1 {d:13s} chunks {s['chunks']:3d} min {s['min']:.3f} max {s['max']:.3f} mean {s['mean']:.3f}")
    # the committed TRAINING.json says "python -m fideval.demo.train_model": this script at its former place
    command = "python tools/demo/train_model.py" + (f" --steps {args.steps}" if args.steps != STEPS else "")
    fsio.write_json(MODEL_DIR / "TRAINING.json", {
        "format": "fideval.demo.training", "version": "1", "command": command, "seed": SEED, "steps": args.steps,
        "threads": THREADS, "tokens_per_step": SHORT * SHORT_BATCH,
        "schedule": {"lr": LR, "lr_min": LR_MIN, "warmup": WARMUP, "short": [SHORT, SHORT_BATCH],
                     "long": [LONG, LONG_BATCH], "long_every": LONG_EVERY, "bias_gamma": BIAS_GAMMA},
        "final_loss": stats["final_loss"], "final_loss_note": "mean training loss (nats/token) of the last 20 steps",
        "seconds": stats["seconds"], "reload_max_abs_logit_diff": diff,
        "top1_packed_2048": summary, "dtype": "float32",
        "model_safetensors_sha256": fsio.sha256_file(MODEL_DIR / "model.safetensors"),
        "tokenizer_json_sha256": fsio.sha256_file(MODEL_DIR / "tokenizer.json"),
        "torch": torch.__version__, "python": sys.version.split()[0],
    })
    print(f"final loss {stats['final_loss']} in {stats['seconds']} s; reload max |dlogit| {diff:.3g}")


if __name__ == "__main__":
    main()
