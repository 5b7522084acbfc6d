"""The committed demo assets: present, small, consistent with each other and with their recorded hashes.

Oracles are independent of the builders where it matters: sizes from the filesystem, hashes from hashlib,
the chat rendering re-derived from its written-out format, the planted copies found by plain substring
search, the router bias read straight from the safetensors file, top-1 as argmax == next token.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from fideval.demo import ASSETS, CALIBRATION_DIR, CORPUS_DIR, DOMAINS, MODEL_DIR

MAX_TOTAL_BYTES = 25 * 1024 * 1024


def _jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope="module")
def corpus() -> dict[str, list[dict]]:
    return {d: _jsonl(CORPUS_DIR / f"{d}.jsonl") for d in DOMAINS}


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(MODEL_DIR)


@pytest.fixture(scope="module")
def model():
    import torch
    from transformers import DeepseekV3ForCausalLM

    torch.set_num_threads(1)
    m, info = DeepseekV3ForCausalLM.from_pretrained(MODEL_DIR, output_loading_info=True)
    assert {k: v for k, v in info.items() if v} == {}, f"loading reported {info}"
    return m.eval()


def _conversation_text(messages: list[dict]) -> str:
    # The chat template's format, written out independently of fideval.demo.build_tokenizer.
    return "<|bos|>" + "".join(f"<|{m['role']}|>\n{m['content']}<|end|>\n" for m in messages)


def test_assets_exist_and_fit_the_size_budget():
    names = [f"corpus/{d}.jsonl" for d in DOMAINS] + [
        "calibration/calibration.jsonl", "calibration/planted.json", "model/config.json", "model/model.safetensors",
        "model/tokenizer.json", "model/tokenizer_config.json", "model/special_tokens_map.json", "model/TRAINING.json"]
    for name in names:
        assert (ASSETS / name).is_file(), name
    total = sum(p.stat().st_size for p in ASSETS.rglob("*") if p.is_file())
    assert total <= MAX_TOTAL_BYTES, f"demo assets are {total / 2**20:.1f} MiB"
    assert (Path(__file__).parents[1] / "fideval" / "demo" / "SOURCES.md").is_file()


def test_corpus_records_have_the_documented_shape(corpus):
    for domain, docs in corpus.items():
        ids = [d["id"] for d in docs]
        assert len(ids) == len(set(ids)), domain
        for d in docs:
            assert d["id"].startswith(f"{domain}-") and d["source"]
            if domain == "chat":
                assert set(d) == {"id", "source", "messages"}
                assert {m["role"] for m in d["messages"]} <= {"system", "user", "assistant", "tool"}  # agent chats: tool replies
                assert d["messages"][-1]["role"] == "assistant" and len(d["messages"]) >= 2
            else:
                assert set(d) == {"id", "source", "text"} and d["text"].strip()


def test_each_domain_has_enough_tokens_in_varied_documents(corpus, tokenizer):
    for domain, docs in corpus.items():
        texts = [_conversation_text(d["messages"]) if "messages" in d else d["text"] for d in docs]
        lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
        assert sum(lengths) >= 40_000, (domain, sum(lengths))
        in_range = sum(200 <= n <= 3_000 for n in lengths) / len(lengths)
        assert in_range >= 0.75, (domain, in_range)  # "most documents 200-3,000 tokens"
        assert max(lengths) / min(lengths) >= 3, (domain, "document lengths do not vary")


def test_tokenizer_loads_with_special_tokens_and_chat_template(tokenizer):
    assert len(tokenizer) == 4096
    assert tokenizer.convert_ids_to_tokens([tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id]) == [
        "<|bos|>", "<|eos|>", "<|pad|>"]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 2?"},
                {"role": "assistant", "content": "4"}]
    assert tokenizer.apply_chat_template(messages, tokenize=False) == _conversation_text(messages)
    prompt = tokenizer.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|assistant|>\n")
    ids = tokenizer(_conversation_text(messages), add_special_tokens=False)["input_ids"]
    assert ids[0] == tokenizer.bos_token_id and tokenizer.convert_tokens_to_ids("<|end|>") in ids
    for text in ["Grüße aus Köln", "Привет, мир", "日本語のテキスト", "def f(x):\n    return x ** 2\n"]:
        assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text


def test_model_has_the_deepseek_v3_features(model):
    c = model.config
    assert c.model_type == "deepseek_v3" and c.vocab_size == 4096 and c.max_position_embeddings >= 2048
    assert c.q_lora_rank and c.kv_lora_rank and c.qk_rope_head_dim and c.qk_nope_head_dim and c.v_head_dim  # MLA
    assert c.first_k_dense_replace == 1 and 3 <= c.num_hidden_layers <= 4
    assert c.n_shared_experts >= 1 and c.n_routed_experts > c.num_experts_per_tok >= 2
    assert c.n_group > 1 and 1 <= c.topk_group < c.n_group and c.norm_topk_prob and not c.tie_word_embeddings
    assert type(model.model.layers[0].mlp).__name__ == "DeepseekV3MLP"
    assert all(type(layer.mlp).__name__ == "DeepseekV3MoE" for layer in model.model.layers[1:])
    assert not (model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr())


def test_weights_match_training_record_and_router_bias_survives_loading(model):
    from safetensors import safe_open

    record = json.loads((MODEL_DIR / "TRAINING.json").read_text())
    weights = MODEL_DIR / "model.safetensors"
    assert hashlib.sha256(weights.read_bytes()).hexdigest() == record["model_safetensors_sha256"]
    assert hashlib.sha256((MODEL_DIR / "tokenizer.json").read_bytes()).hexdigest() == record["tokenizer_json_sha256"]
    with safe_open(str(weights), "pt") as f:
        keys = [k for k in f.keys() if k.endswith("e_score_correction_bias")]
        assert len(keys) == model.config.num_hidden_layers - model.config.first_k_dense_replace
        for k in keys:
            on_disk = f.get_tensor(k)
            assert on_disk.abs().max() > 0, f"{k} is all zeros: balancing never ran"
            layer = int(k.split(".")[2])
            assert (model.model.layers[layer].mlp.gate.e_score_correction_bias == on_disk).all()


def test_planted_documents_are_verbatim_in_the_calibration_file(corpus):
    planted = json.loads((CALIBRATION_DIR / "planted.json").read_text())
    calib = {d["id"]: d["text"] for d in _jsonl(CALIBRATION_DIR / "calibration.jsonl")}
    by_id = {d["id"]: d for docs in corpus.values() for d in docs}
    entries = planted["planted"]
    assert {by_id[p["demo_id"]]["id"].split("-")[0] for p in entries} >= {"chat"}
    assert {p["domain"] for p in entries} & {"code", "prose"}
    for p in entries:
        doc = by_id[p["demo_id"]]
        text = "\n".join(f"{m['role']}: {m['content']}" for m in doc["messages"]) if "messages" in doc else doc["text"]
        assert text in calib[p["calibration_id"]], p
    # and nothing else was copied: only the planted demo texts appear as whole calibration records
    demo_texts = {d["text"] for docs in corpus.values() for d in docs if "text" in d}
    copied = {cid for cid, t in calib.items() if t in demo_texts}
    assert copied == {p["calibration_id"] for p in entries if p["domain"] != "chat"}


def test_top1_agreement_is_peaked_but_not_saturated_on_each_domain(corpus, tokenizer, model):
    import torch

    eos = tokenizer.eos_token_id
    for domain, docs in corpus.items():
        stream: list[int] = []
        for d in docs:
            text = _conversation_text(d["messages"]) if "messages" in d else d["text"]
            stream += tokenizer(text, add_special_tokens=False)["input_ids"] + [eos]
            if len(stream) >= 2048:
                break
        ids = torch.tensor([stream[:2048]])
        with torch.no_grad():
            pred = model(input_ids=ids).logits[0, :-1].argmax(-1)
        top1 = (pred == ids[0, 1:]).double().mean().item()
        assert 0.20 <= top1 <= 0.995, (domain, top1)
