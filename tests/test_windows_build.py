"""The windows stage end to end through the CLI: hashes recompute, cuts concatenate, seeds, screening."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from cli_runner import run_fideval
from windows_fixtures import chat_docs, text_docs, write_config, write_jsonl
from windows_oracles import oracle_grams

from fideval.windows.layout import read_sequences, token_sha256


@pytest.fixture(scope="module")
def tok(tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


def grams(text, n=13):
    return oracle_grams(text, n)


def build(tmp_path, tokenizer_dir, domains, name="out", seed=None, **kw):
    cfg = write_config(tmp_path / f"{name}.yaml", tokenizer_dir, domains, **kw)
    args = ["windows", cfg, "--out", tmp_path / name] + (["--seed", seed] if seed is not None else [])
    code, out, err = run_fideval(*args)
    assert code == 0, err
    rec = json.loads((tmp_path / name / "eval-windows.json").read_text())
    return rec, cfg


def corpus(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", text_docs(1, 80))
    txt = tmp_path / "b.txt"
    txt.write_text("\n\n".join(d["text"] for d in text_docs(2, 60)) + "\n")
    import pyarrow as pa

    pq.write_table(pa.table({"body": [d["text"] for d in text_docs(3, 60)]}), tmp_path / "c.parquet")
    chat = write_jsonl(tmp_path / "chat.jsonl", chat_docs(4, 60))
    return [{"name": "a", "source": {"type": "local", "path": str(a)}},
            {"name": "b", "source": {"type": "local", "path": str(txt)}},
            {"name": "c", "source": {"type": "local", "path": str(tmp_path / "c.parquet"), "text_field": "body"}},
            {"name": "chat", "kind": "chat", "source": {"type": "local", "path": str(chat), "messages_field": "messages"}}]


def test_outputs_recompute_and_cuts_concatenate(tmp_path, tokenizer_dir, tok):
    rec, _ = build(tmp_path, tokenizer_dir, corpus(tmp_path))
    assert rec["format"] == "fideval.eval-windows" and rec["version"] == 2
    assert rec["screen"]["status"] == "skipped"
    wins = read_sequences(tmp_path / "out" / "windows-256")
    cuts = read_sequences(tmp_path / "out" / "cuts-64")
    assert wins.tokens.shape == (12, 256) and cuts.tokens.shape == (48, 64)
    assert wins.ids == [w["id"] for w in rec["windows"]] == [f"{d}-{k:03d}" for d in "a b c chat".split() for k in range(3)]
    cut_rows = dict(zip(cuts.ids, cuts.tokens))
    for w, t in zip(rec["windows"], wins.tokens):
        assert token_sha256(t) == w["sha256"] and w["tokens"] == 256
        assert np.array_equal(np.concatenate([cut_rows[c["id"]] for c in w["cuts"]]), t)
        for c in w["cuts"]:
            assert token_sha256(cut_rows[c["id"]]) == c["sha256"] == token_sha256(t[c["start"]:c["end"]])
    idx = pq.read_table(tmp_path / "out" / "index.parquet").to_pylist()
    assert len(idx) == 48 and idx[5] == {"domain": "a", "window_id": "a-001", "cut_id": "a-001.c1", "start": 64, "end": 128,
                                         "window_sha256": rec["windows"][1]["sha256"], "cut_sha256": rec["windows"][1]["cuts"][1]["sha256"]}


def test_packing_separators_spans_and_no_reuse(tmp_path, tokenizer_dir, tok):
    rec, _ = build(tmp_path, tokenizer_dir, corpus(tmp_path))
    texts = {"a": {d["id"]: d["text"] for d in text_docs(1, 80)}}
    chats = {d["id"]: tok.apply_chat_template(d["messages"], tokenize=False) for d in chat_docs(4, 60)}
    wins = dict(zip(*(lambda s: (s.ids, s.tokens))(read_sequences(tmp_path / "out" / "windows-256"))))
    seen = set()
    for w in rec["windows"]:
        t = wins[w["id"]]
        pos = 0
        for i, d in enumerate(w["documents"]):
            key = json.dumps(d["source"], sort_keys=True)
            assert key not in seen  # never reused across windows
            seen.add(key)
            a, b = d["tokens"]
            assert a == pos
            last = i == len(w["documents"]) - 1
            assert not d["truncated"] or last  # only the document crossing the window end is cut
            if last:
                assert b == 256 if d["truncated"] else b + 1 == 256
            if not d["truncated"]:
                assert t[b] == tok.eos_token_id  # separator eos: EOS after every whole document
                assert d["chars"] == [0, d["document_chars"]]
                pos = b + 1
            src = d["source"]
            full = texts["a"].get(src.get("doc_id")) if w["domain"] == "a" else chats.get(src.get("doc_id"))
            if full is not None:
                assert d["document_chars"] == len(full)
                used = full[: d["chars"][1]]
                assert tok.decode(t[a:b].tolist()) == used  # the recorded span is exactly what the tokens hold
        assert w["documents"][-1]["tokens"][1] <= 256


def test_seed_determinism(tmp_path, tokenizer_dir):
    doms = corpus(tmp_path)
    r1, _ = build(tmp_path, tokenizer_dir, doms, name="s1")
    r2, _ = build(tmp_path, tokenizer_dir, doms, name="s2")
    r3, _ = build(tmp_path, tokenizer_dir, doms, name="s3", seed=7)
    assert [w["sha256"] for w in r1["windows"]] == [w["sha256"] for w in r2["windows"]]
    s1, s2 = (read_sequences(tmp_path / n / "cuts-64") for n in ("s1", "s2"))
    assert s1.ids == s2.ids and np.array_equal(s1.tokens, s2.tokens)
    assert r1["windows"] == r2["windows"]
    assert all(a["sha256"] != b["sha256"] for a, b in zip(r1["windows"], r3["windows"]))
    assert r3["windows_config"]["seed"] == 7 and r1["provenance"]["config_hash"] != r3["provenance"]["config_hash"]


@pytest.mark.parametrize("unit", ["words", "tokens"])
def test_contaminated_window_is_replaced_and_fraction_matches_bruteforce(tmp_path, tokenizer_dir, tok, unit):
    docs = text_docs(1, 80)
    doms = [{"name": "a", "source": {"type": "local", "path": str(write_jsonl(tmp_path / "a.jsonl", docs))}}]
    clean, _ = build(tmp_path, tokenizer_dir, doms, name="clean")
    victim = clean["windows"][1]["documents"][1]["source"]["doc_id"]
    cal_docs = [{"text": d["text"]} for d in text_docs(99, 20)] + [{"text": next(d["text"] for d in docs if d["id"] == victim)}]
    cal = write_jsonl(tmp_path / "cal.jsonl", cal_docs)
    rec, cfg = build(tmp_path, tokenizer_dir, doms, name="screened",
                     screen={"calibration": [{"type": "local", "path": str(cal)}], "unit": unit})
    assert rec["screen"]["status"] == "applied" and rec["screen"]["calibration"]["documents"] == 21
    used = [d["source"].get("doc_id") for w in rec["windows"] for d in w["documents"]]
    assert victim not in used
    reps = [(w["id"], r) for w in rec["windows"] for r in w["replacements"]]
    assert len(reps) == 1 and reps[0][0] == "a-001"
    rej = reps[0][1]
    assert victim in [d["source"]["doc_id"] for d in rej["documents"]]
    assert rej["overlap"]["fraction"] > 0.05
    assert rej["overlap"]["top_calibration"][0]["document"] == {"file": str(cal), "line": 21}
    # windows before the rejected one are unchanged; the fraction equals a brute-force set computation
    assert rec["windows"][0]["sha256"] == clean["windows"][0]["sha256"]
    def tgrams(ids, n=13):
        return [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]

    if unit == "words":
        cal_set = {g for d in cal_docs for g in grams(d["text"])}
    else:
        cal_set = {g for d in cal_docs for g in tgrams(tok(d["text"], add_special_tokens=False)["input_ids"])}
    wins = dict(zip(*(lambda s: (s.ids, s.tokens))(read_sequences(tmp_path / "screened" / "windows-256"))))
    for w in rec["windows"]:
        segs = [wins[w["id"]][a:b].tolist() for a, b in (d["tokens"] for d in w["documents"])]
        g = [x for s in segs for x in (grams(tok.decode(s)) if unit == "words" else tgrams(s))]
        assert w["overlap"]["ngrams"] == len(g)
        assert w["overlap"]["fraction"] == sum(x in cal_set for x in g) / len(g)
    # the report-only verb recomputes the same fractions and writes nothing new
    code, out, _ = run_fideval("screen", cfg, "--windows", tmp_path / "screened")
    assert code == 0 and "0 of 3 windows above 5.0%" in out
    printed = {ln.split()[0]: ln.split()[1:5] for ln in out.splitlines() if ln.split() and ln.split()[0] in wins}
    assert set(printed) == {w["id"] for w in rec["windows"]}
    for w in rec["windows"]:
        total, matched, fraction, recorded = printed[w["id"]]
        assert int(total) == w["overlap"]["ngrams"] and fraction == recorded == f"{w['overlap']['fraction']:.4f}"
    # the folder's eval-windows.json names the same folder
    assert run_fideval("screen", cfg, "--windows", tmp_path / "screened" / "eval-windows.json")[1] == out


def test_conversation_overlap_drops_it_before_packing(tmp_path, tokenizer_dir, tok):
    convs = chat_docs(4, 60)
    doms = [{"name": "chat", "kind": "chat", "source": {"type": "local", "path": str(write_jsonl(tmp_path / "c.jsonl", convs))}}]
    clean, _ = build(tmp_path, tokenizer_dir, doms, name="clean")
    victim = clean["windows"][0]["documents"][0]["source"]["doc_id"]
    msg = next(c for c in convs if c["id"] == victim)["messages"][1]["content"]
    cal = write_jsonl(tmp_path / "cal.jsonl", [{"text": msg}])
    rec, _ = build(tmp_path, tokenizer_dir, doms, name="scr", screen={"calibration": [{"type": "local", "path": str(cal)}]})
    dropped = rec["domains"]["chat"]["conversations_dropped"]
    assert [d["source"]["doc_id"] for d in dropped] == [victim]
    rendered = tok.apply_chat_template(next(c for c in convs if c["id"] == victim)["messages"], tokenize=False)
    g = grams(rendered)
    cs = set(grams(msg))
    assert dropped[0]["overlap"] == sum(x in cs for x in g) / len(g) > 0.02
    assert victim not in [d["source"].get("doc_id") for w in rec["windows"] for d in w["documents"]]
    assert all(not w["replacements"] for w in rec["windows"])


def test_txt_documents_split_on_blank_lines(tmp_path):
    from fideval.config import LocalSource
    from fideval.windows.sources import iter_documents

    p = tmp_path / "d.txt"
    p.write_text("first line\nsecond line\n\n  \n\nthird\r\n\nfourth\nfifth")
    docs = list(iter_documents(LocalSource(path=str(p)), "x", render=lambda m: ""))
    assert [(d.origin["line"], d.text) for d in docs] == [(1, "first line\nsecond line"), (6, "third"), (8, "fourth\nfifth")]
