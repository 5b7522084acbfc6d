"""Build the demo corpus (6 domains) and the calibration corpus from text that is on this machine offline.

Why these sources: the demo must ship inside the repository, so every byte has to be redistributable and
reachable without a network. Python's own sources and docs (PSF licence), the licence texts Debian ships in
``/usr/share/common-licenses`` (verbatim copying is what they permit), GNU/Linux-PAM translation catalogs
in ``/usr/share/locale`` (the packages' own licences) and text we generate ourselves (math, chat) cover
six domains with different statistics: code, legal, prose, math, multilingual, chat.

Why a planted calibration corpus: the windows stage screens eval windows for 13-gram overlap with the
calibration text. A demo where that screen never fires proves nothing, so a few demo documents are copied
verbatim into the calibration file and listed in ``planted.json`` — the screen must find exactly those.

Determinism: inputs are read in a fixed order, every random choice comes from ``random.Random(SEED)`` per
domain, and JSONL is written with fixed key order, so ``python tools/demo/build_corpus.py`` re-creates
the committed files byte for byte on a machine with the same inputs (SOURCES.md lists them).
"""

from __future__ import annotations

import ast
import gettext
import json
import random
import re
import sys
import sysconfig
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agent_chats import agent_docs  # noqa: E402 -- this folder's sibling module, not a package

from fideval import fsio
from fideval.demo import CALIBRATION_DIR, CORPUS_DIR

SEED = 20261202
# The generated documents' "source" labels name this builder by the module path it had when the committed corpus
# was built (fideval.demo.build_corpus); they stay so that a rebuild is still byte-identical to the committed files.
STDLIB = Path(sysconfig.get_paths()["stdlib"])
LICENSES = Path("/usr/share/common-licenses")
LOCALE = Path("/usr/share/locale")
DEBIAN_DOC = Path("/usr/share/doc")

# Fixed input lists: demo and calibration never share a source file (only the planted copies overlap).
DEMO_CODE = ["textwrap", "colorsys", "bisect", "heapq", "fractions", "shlex", "string", "graphlib", "fnmatch",
             "glob", "queue", "sched", "copy", "base64", "cmd", "getopt", "reprlib", "numbers", "netrc",
             "json/encoder", "json/decoder", "json/__init__", "calendar", "statistics", "difflib", "csv"]
CALIB_CODE = ["argparse", "pathlib", "logging/__init__", "tarfile", "zipfile", "inspect", "enum", "pprint",
              "random", "ipaddress", "configparser", "urllib/parse", "tempfile", "shutil", "dataclasses",
              "functools", "contextlib", "ast", "traceback", "pickle", "gzip", "selectors", "socketserver",
              "smtplib", "imaplib", "ftplib", "optparse", "locale", "typing", "datetime"]
DEMO_LICENSES = ["Apache-2.0", "Artistic", "BSD", "CC0-1.0", "GFDL-1.3", "GPL-1", "GPL-2", "GPL-3",
                 "LGPL-2.1", "LGPL-3", "MPL-1.1", "MPL-2.0"]
ML_LANGS = ["de", "fr", "es", "it", "pt_BR", "nl", "pl", "sv", "cs", "tr", "ru", "uk", "ja", "zh_CN"]
ML_PACKAGES = ["grep", "diffutils", "findutils", "Linux-PAM", "coreutils"]
ML_BYTES_PER_LANG = 8_000
TARGET_CHARS = {"code": 160_000, "prose": 160_000, "math": 101_000, "chat": 147_000}
CALIB_CHARS = {"code": 900_000, "prose": 200_000, "legal": 450_000}
PLANTED_DOMAINS = ("code", "prose", "legal", "chat")  # one demo document of each is copied into calibration
AGENT_CHATS = 40  # agent conversations (tool calls, reasoning) appended to the chat domain (agent_chats.py)


# ----------------------------------------------------------------------------------------------- helpers
def _split_units(text: str, sep: str) -> list[str]:
    parts = re.split(sep, text)
    return [p for p in parts if p.strip()]


def chunk(text: str, rng: random.Random, lo: int = 1200, hi: int = 9000, sep: str = r"\n\s*\n") -> list[str]:
    """Cut ``text`` into documents of varied size (a fresh target in [lo, hi] chars each) at ``sep`` boundaries.

    Why varied: the windows stage packs documents into 2,048-token windows; a mix of short and long
    documents exercises both document boundaries inside a window and windows inside one document.
    """
    units: list[str] = []
    for u in re.split(f"({sep})", text):
        if len(u) > hi:  # an over-long unit is cut at line breaks so no document exceeds ~hi chars
            lines = u.splitlines(keepends=True)
            cur = ""
            for line in lines:
                if len(cur) + len(line) > hi and cur:
                    units.append(cur)
                    cur = ""
                cur += line
            units.append(cur)
        else:
            units.append(u)
    docs, cur, target = [], "", rng.randint(lo, hi)
    for u in units:
        cur += u
        if len(cur) >= target:
            docs.append(cur.strip("\n"))
            cur, target = "", rng.randint(lo, hi)
    if cur.strip():
        if docs and len(cur) < lo // 2:
            docs[-1] = docs[-1] + "\n\n" + cur.strip("\n")
        else:
            docs.append(cur.strip("\n"))
    return [d for d in docs if d.strip()]


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace").replace("\r\n", "\n").replace("\f", "")


def _stdlib_file(name: str) -> Path:
    return STDLIB / f"{name}.py"


# ----------------------------------------------------------------------------------------------- domains
def code_docs(rng: random.Random, modules: list[str], budget: int) -> list[dict]:
    docs, total = [], 0
    for mod in modules:
        text = _read(_stdlib_file(mod))
        for piece in chunk(text, rng, 1000, 8000, sep=r"\n(?=(?:def |class |@|if __name__))"):
            docs.append({"source": f"python{sys.version_info[0]}.{sys.version_info[1]}/Lib/{mod}.py (PSF-2.0)",
                         "text": piece})
            total += len(piece)
        if total >= budget:
            break
    return docs


def legal_docs(rng: random.Random) -> list[dict]:
    docs = []
    for name in DEMO_LICENSES:
        for piece in chunk(_read(LICENSES / name), rng, 1500, 9000):
            docs.append({"source": f"/usr/share/common-licenses/{name} (verbatim licence text)", "text": piece})
    for piece in chunk(_read(STDLIB / "LICENSE.txt"), rng, 1500, 9000):
        docs.append({"source": "python3.11/LICENSE.txt (PSF-2.0 licence text)", "text": piece})
    return docs


def _topic_split() -> tuple[list[str], list[str]]:
    """Split pydoc topics into demo and calibration halves by a fixed rule (alternating by size rank)."""
    from pydoc_data.topics import topics

    ranked = sorted(topics, key=lambda k: (-len(topics[k]), k))
    demo = [k for i, k in enumerate(ranked) if i % 3 != 2]
    calib = [k for i, k in enumerate(ranked) if i % 3 == 2]
    return demo, calib


def prose_docs(rng: random.Random, keys: list[str], budget: int, tag: str = "") -> list[dict]:
    from pydoc_data.topics import topics

    docs, total = [], 0
    for key in keys:
        for piece in chunk(topics[key].replace("\r\n", "\n"), rng, 1000, 9000):
            docs.append({"source": f"python3.11 pydoc_data/topics.py[{key!r}] (PSF-2.0){tag}", "text": piece})
            total += len(piece)
        if total >= budget:
            break
    return docs


_NAMES = ["Ada", "Bruno", "Chen", "Dara", "Elif", "Farah", "Goran", "Hana", "Ines", "Jonas", "Kofi", "Lena",
          "Mateo", "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Sami", "Tomas", "Uma", "Viktor", "Wen", "Yusuf"]
_ITEMS = [("notebook", "notebooks"), ("pencil", "pencils"), ("apple", "apples"), ("ticket", "tickets"),
          ("book", "books"), ("cup of tea", "cups of tea"), ("bus fare", "bus fares"), ("sandwich", "sandwiches")]


def math_problem(rng: random.Random) -> str:
    """One arithmetic word problem with a worked solution (every step's arithmetic is exact)."""
    name, other = rng.sample(_NAMES, 2)
    kind = rng.randrange(10)
    if kind == 0:
        a, h = rng.randint(3, 60), rng.randint(2, 12)
        q = f"{name} packs {a} boxes every hour. How many boxes does {name} pack in {h} hours?"
        s = [f"Boxes per hour times hours: {a} × {h} = {a * h}."]
        ans = f"{a * h} boxes"
    elif kind == 1:
        (item, items), (item2, items2) = rng.sample(_ITEMS, 2)
        n1, p1, n2, p2 = rng.randint(2, 9), rng.randint(1, 20), rng.randint(2, 9), rng.randint(1, 20)
        total = n1 * p1 + n2 * p2
        paid = (total // 10 + 1 + rng.randint(0, 3)) * 10
        q = (f"{name} buys {n1} {items} at ${p1} each and {n2} {items2} at ${p2} each, and pays with ${paid}. "
             f"How much change does {name} get?")
        s = [f"The {items} cost {n1} × ${p1} = ${n1 * p1}.", f"The {items2} cost {n2} × ${p2} = ${n2 * p2}.",
             f"Together: ${n1 * p1} + ${n2 * p2} = ${total}.", f"Change: ${paid} − ${total} = ${paid - total}."]
        ans = f"${paid - total}"
    elif kind == 2:
        price, pct = rng.randint(2, 40) * 10, rng.choice([10, 15, 20, 25, 30, 40, 50])
        off = price * pct // 100
        q = f"A coat costs ${price}. It is on sale for {pct}% off. What is the sale price?"
        s = [f"The discount is {pct}% of ${price} = {pct}/100 × {price} = ${off}.",
             f"The sale price is ${price} − ${off} = ${price - off}."]
        ans = f"${price - off}"
    elif kind == 3:
        k, n = rng.randint(3, 12), rng.randint(20, 200)
        q_, r = divmod(n, k)
        q = f"{name} shares {n} marbles equally among {k} friends. How many does each friend get, and how many are left over?"
        s = [f"Divide: {n} ÷ {k} = {q_} remainder {r}, because {k} × {q_} = {k * q_} and {n} − {k * q_} = {r}."]
        ans = f"{q_} each, {r} left over"
    elif kind == 4:
        v, t = rng.randint(30, 110), rng.randint(2, 9)
        q = f"A train travels at {v} km/h for {t} hours. How far does it go?"
        s = [f"Distance = speed × time = {v} × {t} = {v * t} km."]
        ans = f"{v * t} km"
    elif kind == 5:
        start, give, buy = rng.randint(20, 90), rng.randint(1, 19), rng.randint(5, 40)
        q = (f"{name} has {start} stickers, gives {give} to {other}, then buys {buy} more. "
             f"How many stickers does {name} have now?")
        s = [f"After giving: {start} − {give} = {start - give}.", f"After buying: {start - give} + {buy} = {start - give + buy}."]
        ans = f"{start - give + buy} stickers"
    elif kind == 6:
        w, h = rng.randint(2, 30), rng.randint(2, 30)
        q = f"A garden is {w} m wide and {h} m long. What are its area and its perimeter?"
        s = [f"Area = {w} × {h} = {w * h} m².", f"Perimeter = 2 × ({w} + {h}) = 2 × {w + h} = {2 * (w + h)} m."]
        ans = f"{w * h} m² and {2 * (w + h)} m"
    elif kind == 7:
        a, x, b = rng.randint(2, 12), rng.randint(-10, 20), rng.randint(-30, 30)
        c = a * x + b
        bs = f"+ {b}" if b >= 0 else f"− {-b}"
        q = f"Solve for x: {a}x {bs} = {c}."
        s = [f"Subtract {b} from both sides: {a}x = {c} − ({b}) = {c - b}.", f"Divide by {a}: x = {c - b} ÷ {a} = {x}."]
        ans = f"x = {x}"
    elif kind == 8:
        vals = [rng.randint(40, 100) for _ in range(rng.randint(3, 6))]
        tot = sum(vals)
        q = f"{name}'s test scores are {', '.join(map(str, vals))}. What is the mean score?"
        s = [f"Sum: {' + '.join(map(str, vals))} = {tot}.", f"Mean: {tot} ÷ {len(vals)} = {tot / len(vals):.2f}."]
        ans = f"{tot / len(vals):.2f}"
    else:
        den = rng.choice([2, 3, 4, 5, 6, 8, 10])
        num = rng.randint(1, den - 1)
        whole = den * rng.randint(3, 30)
        part = whole * num // den
        q = f"A tank holds {whole} litres. {name} fills {num}/{den} of it. How many litres is that, and how many more fit?"
        s = [f"{num}/{den} of {whole} = {whole} ÷ {den} × {num} = {whole // den} × {num} = {part} litres.",
             f"Remaining: {whole} − {part} = {whole - part} litres."]
        ans = f"{part} litres, {whole - part} more"
    return q + "\nSolution:\n" + "\n".join(s) + f"\nAnswer: {ans}"


def math_docs(rng: random.Random, budget: int) -> list[dict]:
    docs, total, k = [], 0, 0
    while total < budget:
        k += 1
        n = rng.choice([2, 3, 4, 6, 8, 12, 16, 24, 30])
        body = "\n\n".join(f"Problem {i + 1}. {math_problem(rng)}" for i in range(n))
        text = f"Worksheet {k}: arithmetic word problems with worked solutions.\n\n{body}"
        docs.append({"source": f"generated by fideval.demo.build_corpus.math_problem (seed {SEED}; CC0-1.0)", "text": text})
        total += len(text)
    return docs


def _catalog(lang: str, package: str) -> list[str]:
    path = LOCALE / lang / "LC_MESSAGES" / f"{package}.mo"
    if not path.exists():
        return []
    with open(path, "rb") as f:
        cat = gettext.GNUTranslations(f)._catalog  # msgid -> msgstr; plural forms keyed by (msgid, n)
    out = []
    for key in sorted(cat, key=lambda k: (str(k), repr(k))):
        if key == "" or (isinstance(key, tuple) and key[1] != 0):
            continue
        msg = str(cat[key]).strip()
        if len(msg) >= 3 and msg != key:
            out.append(msg)
    return out


def multilingual_docs(rng: random.Random) -> list[dict]:
    """Translated program messages (msgstr only), grouped per language and package into documents."""
    docs = []
    for lang in ML_LANGS:
        used = 0
        for pkg in ML_PACKAGES:
            msgs = _catalog(lang, pkg)
            text, room = "", ML_BYTES_PER_LANG - used
            for m in msgs:
                if len((text + m).encode()) > room:
                    break
                text += m + "\n\n"
            used += len(text.encode())
            for piece in chunk(text, rng, 600, 6000):
                docs.append({"source": f"/usr/share/locale/{lang}/LC_MESSAGES/{pkg}.mo msgstr ({_ML_LICENCE[pkg]})",
                             "text": piece})
            if used >= ML_BYTES_PER_LANG - 200:
                break
    return docs


_ML_LICENCE = {"grep": "GPL-3.0-or-later", "diffutils": "GPL-3.0-or-later", "findutils": "GPL-3.0-or-later",
               "coreutils": "GPL-3.0-or-later", "Linux-PAM": "BSD-3-Clause OR GPL-2.0-or-later"}


# ----------------------------------------------------------------------------------------------- chat
def _functions(modules: list[str]) -> list[tuple[str, str, str, str]]:
    """(module, name, docstring first paragraph, source) for documented top-level functions and classes."""
    out = []
    for mod in modules:
        src = _read(_stdlib_file(mod))
        for node in ast.parse(src).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                doc = ast.get_docstring(node)
                if doc:
                    out.append((mod.replace("/__init__", "").replace("/", "."), node.name,
                                doc.split("\n\n")[0].strip(), ast.get_source_segment(src, node) or ""))
    return out


_SYSTEMS = ["You are a helpful assistant.", "You are a concise assistant for programmers.",
            "You are a patient tutor. Explain your reasoning step by step.",
            "You answer questions about software licences and Python. Quote sources when you can."]
_THANKS = [("Thanks, that helps.", "You're welcome! Let me know if anything else comes up."),
           ("Great, thank you!", "Glad it helped."),
           ("Perfect.", "Happy to help. Good luck with it!")]
_LEGAL_TOPICS = {"warranty": "warranties", "patent": "patents", "distribut": "distribution",
                 "modif": "modified versions", "terminat": "termination", "source code": "source code"}


def _exchange_code(rng, funcs):
    mod, name, doc, src = rng.choice(funcs)
    turns = [("user", rng.choice([f"What does `{mod}.{name}` do?", f"Can you explain {mod}.{name}?",
                                  f"I found `{name}` in the {mod} module. What is it for?"])),
             ("assistant", f"`{mod}.{name}` is documented as follows:\n\n{doc}")]
    if rng.random() < 0.6:
        body = src if len(src) <= 2000 else src[:2000].rsplit("\n", 1)[0] + "\n    ..."
        turns += [("user", rng.choice(["Show me the code.", "What does its source look like?", "Can I see the implementation?"])),
                  ("assistant", f"Here is the source from the standard library:\n\n```python\n{body}\n```")]
    return turns


def _exchange_math(rng):
    text = math_problem(rng)
    q, sol = text.split("\nSolution:\n")
    turns = [("user", q), ("assistant", "Let's work it out.\n" + sol)]
    if rng.random() < 0.4:
        text2 = math_problem(rng)
        q2, sol2 = text2.split("\nSolution:\n")
        turns += [("user", "Here is another one: " + q2), ("assistant", sol2)]
    return turns


def _exchange_legal(rng):
    name = rng.choice(DEMO_LICENSES)
    paras = [p.strip() for p in re.split(r"\n\s*\n", _read(LICENSES / name)) if 200 < len(p.strip()) < 1800]
    key = rng.choice(sorted(_LEGAL_TOPICS))
    hits = [p for p in paras if key in p.lower()] or paras
    para = rng.choice(hits)
    return [("user", f"What does the {name} licence say about {_LEGAL_TOPICS[key]}?"),
            ("assistant", f"The relevant passage of the {name} text reads:\n\n{para}\n\n"
                          "This is a quotation, not legal advice; read the full licence for the exact terms.")]


def _exchange_prose(rng, keys):
    from pydoc_data.topics import topics

    key = rng.choice(keys)
    paras = [p for p in topics[key].split("\n\n") if p.strip()]
    n = rng.randint(1, 4)
    return [("user", rng.choice([f"Explain '{key}' in Python.", f"How does Python handle {key}?",
                                 f"Could you summarise the docs on {key}?"])),
            ("assistant", "\n\n".join(paras[:n]).strip())]


def chat_docs(rng: random.Random, budget: int) -> list[dict]:
    funcs = _functions(DEMO_CODE)
    topic_keys, _ = _topic_split()
    docs, total = [], 0
    while total < budget:
        messages = []
        if rng.random() < 0.5:
            messages.append({"role": "system", "content": rng.choice(_SYSTEMS)})
        kinds = []
        for _ in range(rng.randint(2, 4)):
            kind = rng.choice(["code", "math", "legal", "prose"])
            kinds.append(kind)
            ex = {"code": lambda: _exchange_code(rng, funcs), "math": lambda: _exchange_math(rng),
                  "legal": lambda: _exchange_legal(rng), "prose": lambda: _exchange_prose(rng, topic_keys)}[kind]()
            messages += [{"role": r, "content": c} for r, c in ex]
        if rng.random() < 0.5:
            u, a = rng.choice(_THANKS)
            messages += [{"role": "user", "content": u}, {"role": "assistant", "content": a}]
        docs.append({"source": "generated by fideval.demo.build_corpus.chat_docs from templates over the "
                               f"code/legal/prose/math sources ({'+'.join(kinds)}; seed {SEED})", "messages": messages})
        total += sum(len(m["content"]) for m in messages)
    return docs


def render_chat_plain(messages: list[dict]) -> str:
    """The plain-text form used for the planted calibration copy: one ``role: content`` block per message."""
    return "\n".join(f"{m['role']}: {m['content']}" for m in messages)


# ----------------------------------------------------------------------------------------------- calibration
def word_ngrams(text: str, n: int = 13) -> set[tuple[str, ...]]:
    """Lower-cased alphanumeric word n-grams; punctuation is dropped, so this matches at least as often as
    the windows stage's normalised-word screen."""
    w = re.findall(r"\w+", text.lower())
    return {tuple(w[i:i + n]) for i in range(len(w) - n + 1)}


def _plain(doc: dict) -> str:
    return render_chat_plain(doc["messages"]) if "messages" in doc else doc["text"]


def pick_planted(demo: dict[str, list[dict]]) -> list[dict]:
    """The demo documents copied into calibration, chosen by fixed rules that keep side effects small.

    The chat conversation is a math-only one (its text occurs nowhere else in the demo) and the prose
    document is not the first chunk of its topic (chat answers quote topic openings), so the screen's hits
    are the planted documents themselves, not a cascade through the chat domain.
    """
    picks = []
    for domain in PLANTED_DOMAINS:
        docs = demo[domain]
        if domain == "chat":
            ok = [d for d in docs if re.search(r"\((math\+?)+;", d["source"])]
        elif domain == "prose":
            ok = [d for i, d in enumerate(docs) if i > 0 and docs[i - 1]["source"] == d["source"]]
        else:
            ok = [d for d in docs if 2_000 <= len(d["text"]) <= 8_000]
        picks.append(ok[len(ok) // 4])
    return picks


def calibration_docs(rng: random.Random, demo: dict[str, list[dict]]) -> tuple[list[dict], dict]:
    """Other redistributable text, minus anything sharing a word 13-gram with the demo, plus planted copies."""
    cands = code_docs(rng, CALIB_CODE, CALIB_CHARS["code"])
    _, calib_topics = _topic_split()
    cands += prose_docs(rng, calib_topics, CALIB_CHARS["prose"])
    total = 0
    for pkg in sorted(p.name for p in DEBIAN_DOC.iterdir()):
        f = DEBIAN_DOC / pkg / "copyright"
        if not f.is_file() or total >= CALIB_CHARS["legal"]:
            continue
        for piece in chunk(_read(f), rng, 1500, 9000):
            cands.append({"source": f"/usr/share/doc/{pkg}/copyright (Debian copyright file)", "text": piece})
            total += len(piece)
    seen: set[tuple[str, ...]] = set()
    for docs in demo.values():
        for d in docs:
            seen |= word_ngrams(_plain(d))
    docs = [d for d in cands if seen.isdisjoint(word_ngrams(d["text"]))]
    rng.shuffle(docs)
    planted = []
    for src in pick_planted(demo):
        domain = src["id"].rsplit("-", 1)[0]
        pos = rng.randrange(len(docs) + 1)
        docs.insert(pos, {"source": f"planted verbatim copy of demo document {src['id']}", "text": _plain(src)})
        planted.append({"demo_id": src["id"], "domain": domain,
                        "rendering": "role: content lines" if domain == "chat" else "verbatim text"})
    for i, d in enumerate(docs):
        d["id"] = f"calib-{i:04d}"
    for p in planted:
        p["calibration_id"] = next(d["id"] for d in docs if d["source"].endswith(f"document {p['demo_id']}"))
    meta = {"format": "fideval.demo.planted", "version": "1", "planted": planted,
            "screened_out": len(cands) - (len(docs) - len(planted)), "candidates": len(cands)}
    return docs, meta


# ----------------------------------------------------------------------------------------------- main
def _jsonl(docs: list[dict]) -> str:
    lines = []
    for d in docs:
        body = {"messages": d["messages"]} if "messages" in d else {"text": d["text"]}
        lines.append(json.dumps({"id": d["id"], "source": d["source"], **body}, ensure_ascii=False))
    return "\n".join(lines) + "\n"


def build() -> dict[str, list[dict]]:
    topic_keys, _ = _topic_split()
    makers = {
        "code": lambda r: code_docs(r, DEMO_CODE, TARGET_CHARS["code"]),
        "legal": legal_docs,
        "prose": lambda r: prose_docs(r, topic_keys, TARGET_CHARS["prose"]),
        "math": lambda r: math_docs(r, TARGET_CHARS["math"]),
        "multilingual": multilingual_docs,
        "chat": lambda r: chat_docs(r, TARGET_CHARS["chat"]) + agent_docs(
            random.Random(SEED + 50), AGENT_CHATS, _functions(DEMO_CODE),
            {n: _read(LICENSES / n) for n in DEMO_LICENSES}, math_problem, SEED + 50),
    }
    demo = {}
    for i, (domain, make) in enumerate(makers.items()):
        docs = make(random.Random(SEED + i))
        for k, d in enumerate(docs):
            d["id"] = f"{domain}-{k:04d}"
        demo[domain] = docs
        fsio.write_text(CORPUS_DIR / f"{domain}.jsonl", _jsonl(docs))
    calib, planted = calibration_docs(random.Random(SEED + 100), demo)
    fsio.write_text(CALIBRATION_DIR / "calibration.jsonl", _jsonl(calib))
    fsio.write_json(CALIBRATION_DIR / "planted.json", planted)
    return demo


def main() -> None:
    demo = build()
    for domain, docs in demo.items():
        size = (CORPUS_DIR / f"{domain}.jsonl").stat().st_size
        print(f"{domain:13s} {len(docs):4d} docs {size / 1e3:8.1f} kB")
    print(f"calibration   {(CALIBRATION_DIR / 'calibration.jsonl').stat().st_size / 1e3:8.1f} kB")


if __name__ == "__main__":
    main()
