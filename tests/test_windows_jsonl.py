"""The calibration pass's jsonl reader (``sources.iter_blocks``: most lines parsed by a compiled loop)
against ``json.loads`` and against ``sources.iter_documents`` (the reader every other stage uses)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fideval.config import LocalSource
from fideval.windows import kernels
from fideval.windows import ngrams as ng
from fideval.windows.overlap import Hasher, Probe, scan
from fideval.windows.sources import Blocks, iter_blocks, iter_documents


def _compiled(lines: list[bytes], key: bytes) -> list[str | None]:
    """What the compiled loop makes of each line (one block): its field's text, or None (left to Python)."""
    data = b"\n".join(lines) + b"\n"
    n = len(data)
    raw = np.zeros(n + kernels.PAD, np.uint8)
    raw[:n] = np.frombuffer(data, np.uint8)
    out = np.empty(n + kernels.PAD, np.uint8)
    ls, le, ob, oe = (np.empty(len(lines) + 1, np.int64) for _ in range(4))
    k, p, o = kernels.jsonl_field(raw, 0, n, np.frombuffer(key, np.uint8), out, 0, ls, le, ob, oe)
    assert (k, p) == (len(lines), n)
    assert [raw[a:b].tobytes() for a, b in zip(ls[:k], le[:k])] == lines
    return [None if oe[j] < 0 else out[ob[j]:oe[j]].tobytes().decode("ascii") for j in range(k)]


SEEDS = [
    b'{"text": "plain words here"}',
    b'{"id": 3, "text": "tab\\tnew\\nline \\"q\\" back\\\\slash \\/ \\b\\f\\r \\u0041\\u007F", '
    b'"x": [1, -2.5e+3, 0, true, false, null, {"a": []}]}',
    b'{"text": "\\u00e9\\ud83d\\ude00 \\ud800"}',
    b'  {"meta": {"url": "http://x/\\u00e9", "n": [[], {}]}, "text": "A b, C."}  \t',
    b'{"text": "x", "text": "y"}',
    b'{"te\\u0078t": "escaped key"}',
    b'{"text": "caf\xc3\xa9"}',
    b'{"text": 12, "t": "s"}',
    b'{"t": "no field"}',
    b'[{"text": "not an object"}]',
    b'{"text": "a"} {"text": "b"}',
    b'{"n": 01, "text": "a"}',
    b'{"n": 1., "text": "a"}',
    b'{"n": -, "text": "a"}',
    b'{"n": NaN, "text": "a"}',
    b'{"n": 1e5, "m": -0.0E-7, "text": "\\u0000"}',
    b'{"text": "ctl\x01"}',
    b'{"text": "\\x"}',
    b'{"text": "\\u12G4"}',
    b'{,"text": "a"}',
    b'{"text": "a",}',
    b'{"text" "a"}',
    b'{"a": [1, 2,], "text": "a"}',
    b'{"a": tru, "text": "a"}',
    b'{"text": "' + b"long " * 40 + b'"}',
]
FUZZ = b'{}[]":,\\ \t0123456789.eE+-tfnrulasx\x00\x7f\x80\xc3'


def _mutate(rng: np.random.Generator, line: bytes) -> bytes:
    b = bytearray(line)
    for _ in range(int(rng.integers(1, 4))):
        op, at = int(rng.integers(0, 3)), int(rng.integers(0, len(b) + 1))
        ch = FUZZ[int(rng.integers(0, len(FUZZ)))]
        if op == 0:
            b.insert(at, ch)
        elif op == 1 and at < len(b):
            del b[at]
        elif at < len(b):
            b[at] = ch
    return bytes(b).replace(b"\n", b" ")


def _oracle(line: bytes, key: str) -> str | None:
    """json.loads's answer when it is an object whose ``key`` is an ASCII string, else None."""
    try:
        row = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    if isinstance(row, dict) and isinstance(row.get(key), str) and row[key].isascii():
        return row[key]
    return None


def test_compiled_lines_mean_what_json_loads_says():
    """Every line the compiled loop answers, json.loads answers the same (the loop may leave lines to
    Python, never contradict it), over hand-written lines and thousands of random mutations of them."""
    rng = np.random.default_rng(5)
    lines = SEEDS + [_mutate(rng, SEEDS[int(rng.integers(0, len(SEEDS)))]) for _ in range(6000)]
    got = _compiled(lines, b"text")
    for line, g in zip(lines, got):
        if g is not None:
            assert _oracle(line, "text") == g, line
    # and it answers the plain lines itself: the seeds of ASCII text and most valid mutants
    assert [g is not None for g in got[:5]] == [True, True, False, True, False]
    valid = [g for line, g in zip(lines, got) if _oracle(line, "text") is not None and b"\\u" not in line
             and line.count(b'"text"') == 1]
    assert sum(g is not None for g in valid) > 0.9 * len(valid)


def _via_documents(path, batch=None):
    src = LocalSource(path=str(path), text_field=None)
    try:
        return [(d.origin, d.text) for d in iter_documents(src, "cal", lambda m: "")], None
    except Exception as e:  # noqa: BLE001 - the two readers must fail alike, whatever the exception
        return None, (type(e).__name__, str(e))


def _via_blocks(path, batch):
    src = LocalSource(path=str(path), text_field=None)
    try:
        docs = []
        for b in iter_blocks(src, "cal", lambda m: "", batch):
            texts = [b.text(i) for i in range(len(b))]
            buf, bounds = ng.block_buffer(b.buf, b.bounds, b.texts)
            want_buf, want_bounds = ng.doc_buffer(texts)
            assert np.array_equal(bounds, want_bounds)
            assert buf[:bounds[-1]].tobytes() == want_buf[:want_bounds[-1]].tobytes()
            assert b.chars == sum(map(len, texts))
            docs += [(b.origin(i), t) for i, t in enumerate(texts)]
        return docs, None
    except Exception as e:  # noqa: BLE001
        return None, (type(e).__name__, str(e))


def _rows(rng: np.random.Generator, n: int) -> list[str]:
    words = ["alpha", "Beta,", "gamma.", "d\u00e9j\u00e0", "\u2014", "x\ty", "q\"uote", "back\\slash", "\u00bd",
             "\U0001F600", "new\nline", "\u0000", "Ｆｕｌｌ"]
    out = []
    for i in range(n):
        text = " ".join(rng.choice(words, size=int(rng.integers(0, 30))).tolist())
        row = {"text": text}
        kind = i % 7
        if kind == 1:
            row = {"id": f"d{i}", "meta": {"n": [i, 1.5, None, True]}, "text": text}
        elif kind == 2:
            row = {"id": i, "text": text, "extra": "z" * int(rng.integers(0, 200))}
        elif kind == 3:
            row = {"id": 1.5, "text": text}
        dumped = json.dumps(row, ensure_ascii=bool(rng.integers(0, 2)),
                            separators=[(",", ":"), (", ", ": "), (" ,\t", " :  ")][i % 3])
        out.append(dumped if i % 5 else "  " + dumped + " \t")
    return out


def test_blocks_equal_iter_documents_on_valid_files(tmp_path):
    rng = np.random.default_rng(8)
    rows = _rows(rng, 300)
    cases = {
        "plain": "\n".join(rows) + "\n",
        "no_final_newline": "\n".join(rows),
        "blank_lines": "\n\n".join(rows[:50]) + "\n \t \n\x0c\n" + "\n".join(rows[50:]) + "\n\n",
        "crlf": "\r\n".join(rows[:40]) + "\r\n" + "\n".join(rows[40:]) + "\n",
        "cr": "\n".join(rows[:40]) + "\n\r" + "\n".join(rows[40:80]) + "\n",
        "long_lines": "\n".join(rows[:5] + [json.dumps({"text": "word " * 40_000})] + rows[5:20]) + "\n",
        "other_field_first": "\n".join(['{"body": "b", "text": "t"}'] + rows[:20]) + "\n",
    }
    for name, content in cases.items():
        path = tmp_path / f"{name}.jsonl"
        path.write_bytes(content.encode("utf-8"))
        want, err = _via_documents(path)
        assert err is None, (name, err)
        for batch in (64, 5000, 1 << 20):
            assert _via_blocks(path, batch) == (want, None), (name, batch)
    # lines whose text is ASCII are the compiled loop's (no Python string), the others Python's
    blocks = list(iter_blocks(LocalSource(path=str(tmp_path / "plain.jsonl")), "cal", lambda m: ""))
    in_python = [b.text(i) for b in blocks for i in b.texts]
    assert sum(len(b) for b in blocks) == 300 and 0 < len(in_python) < 300
    assert not any(t.isascii() for t in in_python)


BAD = [
    b'{"text": 5}',
    b'{"title": "no text field"}',
    b'{"text": null}',
    b'[1, 2]',
    b'{"text": "unterminated}',
    b'{"text": "a"} trailing',
    b'{"text": "ctl\x01"}',
    b'{"text": "bad \xff utf-8"}',
    b'{"text": "a", "n": ' + b"1" * 5000 + b'}',
]


@pytest.mark.parametrize("bad", range(len(BAD)))
def test_blocks_fail_like_iter_documents(tmp_path, bad):
    rows = [r.encode() for r in _rows(np.random.default_rng(bad), 30)]
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"\n".join(rows[:17] + [BAD[bad]] + rows[17:]) + b"\n")
    want = _via_documents(path)
    assert want[0] is None
    for batch in (64, 1 << 20):
        assert _via_blocks(path, batch) == want
    if want[1][0] == "FidevalError":
        assert ":18" in want[1][1] or "line 18" in want[1][1]


def test_the_pass_over_blocks_equals_the_pass_over_documents(tmp_path):
    """Counts, seen n-grams, attribution pairs and origins of a pass do not depend on the reader."""
    rng = np.random.default_rng(2)
    vocab = np.array([f"w{i}" for i in range(6)] + ["W1,", "d\u00e9j\u00e0"])
    texts = [" ".join(rng.choice(vocab, size=int(rng.integers(0, 60))).tolist()) for _ in range(200)]
    path = tmp_path / "cal.jsonl"
    path.write_text("".join(json.dumps({"id": f"c{i}", "text": t}, ensure_ascii=i % 2 == 0) + "\n"
                            for i, t in enumerate(texts)))
    hasher = Hasher("words", 4)
    probe = Probe.of(hasher.of_texts(texts[::9])[0])
    src = LocalSource(path=str(path))
    ref = scan(((d.origin, d.text) for d in iter_documents(src, "cal", lambda m: "")), hasher, probe)
    for batch in (200, 1 << 20):
        res = scan(Blocks(iter_blocks(src, "cal", lambda m: "", batch)), hasher, probe, batch_chars=200, threads=2)
        assert (res.documents, res.ngrams) == (ref.documents, ref.ngrams) == (200, ref.ngrams)
        assert np.array_equal(res.seen, ref.seen) and res.seen.any()
        assert np.array_equal(res.pair_doc, ref.pair_doc) and np.array_equal(res.pair_hash, ref.pair_hash)
        assert res.origins == ref.origins and len(res.origins) > 10


def test_other_sources_take_the_documents_path(tmp_path):
    """Conversations (rendered by the caller) and .txt files come through ``iter_documents`` unchanged."""
    chat = tmp_path / "chat.jsonl"
    chat.write_text("".join(json.dumps({"id": i, "messages": [{"role": "user", "content": f"hi {i}"}]}) + "\n"
                            for i in range(5)))
    txt = tmp_path / "d.txt"
    txt.write_text("one doc\nline two\n\n\nsecond doc\n")
    render = (lambda m: " | ".join(f"{x['role']}: {x['content']}" for x in m))
    for src in (LocalSource(path=str(chat)), LocalSource(path=str(chat), messages_field="messages"),
                LocalSource(path=str(txt))):
        want = [(d.origin, d.text) for d in iter_documents(src, "cal", render)]
        got = [(b.origin(i), b.text(i)) for b in iter_blocks(src, "cal", render, 10) for i in range(len(b))]
        assert got == want and len(want) >= 2
