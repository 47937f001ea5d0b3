#!/usr/bin/env python3
"""Builds the tokenizer parity corpus (tests/data/tokenizer/corpus.jsonl.gz), deterministically.

Each line is a JSON object {"cat": CATEGORY, "text": STRING}. The categories cover CJK (the exact
ranges of the DeepSeek-V3/V4 pre-tokenizer's second regex, U+4E00-9FA5, U+3040-309F, U+30A0-30FF,
and their neighbours), Korean, Arabic, Hebrew, Devanagari, Thai, Cyrillic, Greek, emoji (skin tones,
ZWJ sequences, flags, keycaps), combining marks, NFC/NFD pairs, digit runs of every length, numbers
with separators, code, whitespace runs of every kind, special tokens and look-alikes inside text,
mixed scripts, punctuation runs, URLs, JSON and random valid Unicode scalar values.

The ~1 MB strings are not stored: `big_strings()` generates them (tests import this module).

    python3 tools/tokenizer/make_corpus.py            # writes tests/data/tokenizer/corpus.jsonl.gz
    python3 tools/tokenizer/make_corpus.py --out F    # elsewhere
"""
from __future__ import annotations

import argparse
import gzip
import json
import random
import unicodedata
from pathlib import Path

SEED = 20240601
ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "tests" / "data" / "tokenizer" / "corpus.jsonl.gz"

SPECIALS = [
    "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "<｜User｜>", "<｜Assistant｜>",
    "<｜System｜>", "<think>", "</think>", "<|EOT|>", "<｜fim▁hole｜>", "<｜fim▁begin｜>", "<｜fim▁end｜>",
    "｜DSML｜", "<｜DSML｜tool_calls>", "<｜latest_reminder｜>", "<｜action｜>", "<｜query｜>",
    "<｜tool▁calls▁begin｜>", "<｜tool▁sep｜>", "<｜place▁holder▁no▁0｜>", "<｜place▁holder▁no▁17｜>",
]
LOOKALIKES = [
    "<|User|>", "<｜User|>", "<｜user｜>", "<｜User｜", "｜User｜>", "< think>", "<think >", "<thin", "think>",
    "</think", "<|end_of_sentence|>", "<｜end▁of▁sentence", "<｜begin_of_sentence｜>", "<｜｜>", "<｜", "｜>",
    "<<｜User｜>>", "<｜User｜｜Assistant｜>", "<｜DSML", "DSML｜", "<|EOT|", "<|EOT|>>", "<｜place▁holder▁no▁",
]
WORDS = {
    "zh": ["你好", "世界", "推理", "答案", "我们", "今天", "天气", "很好", "毕老师", "学习", "机器", "模型", "深度",
           "求索", "的", "了", "是", "在", "中华人民共和国", "龥", "龦", "〇", "㐀", "𠀀", "鿿"],
    "ja": ["こんにちは", "ありがとう", "カタカナ", "ひらがな", "日本語", "東京", "ー", "ゝゞ", "ヽヾ", "ヿ", "゠",
           "゙゚", "ㇰㇱ", "ｶﾀｶﾅ", "ぁ", "ゟ", "ヷ", "漢字かな交じり文"],
    "ko": ["안녕하세요", "세계", "한국어", "감사합니다", "각", "ㄱㄴㄷ"],
    "ar": ["مرحبا", "بالعالم", "العربية", "٠١٢٣٤٥٦٧٨٩", "السَّلَامُ", "عَلَيْكُمْ", "ﷺ", "؟", "،"],
    "he": ["שלום", "עולם", "עִבְרִית", "״", "׳"],
    "hi": ["नमस्ते", "दुनिया", "हिन्दी", "क्षत्रिय", "०१२३४५६७८९", "।"],
    "th": ["สวัสดี", "ภาษาไทย", "ครับ", "๑๒๓", "กำ"],
    "ru": ["Привет", "мир", "ёжик", "Москва", "ЁЖ", "ѣ"],
    "el": ["Γειά", "σου", "κόσμε", "ΑΒΓ", "ς", "ΐ"],
    "en": ["Hello", "world", "the", "quick", "brown", "fox", "don't", "I'm", "we'll", "they've", "it's", "A",
           "HTTP", "camelCase", "snake_case", "naïve", "café", "Zürich", "ﬁ", "Ǆ"],
}
EMOJI = ["😀", "👍", "👍🏻", "👍🏽", "👍🏿", "👩‍💻", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇨🇳", "🇯🇵", "🇺🇸", "🇪🇺", "❤️", "✌🏾",
         "1️⃣", "#️⃣", "🧑🏽‍🚀", "🤷‍♀️", "🫠", "🐉", "🦄", "©️", "™", "🏴󠁧󠁢󠁳󠁣󠁴󠁿"]
SPACES = [" ", "  ", "\t", "\n", "\r\n", "\r", "\n\n", "\u00a0", "\u3000", "\u2028", "\u2029", "\u000b",
          "\u000c", "\u0085", "\u1680", "\u2000", "\u2003", "\u2009", "\u200a", "\u202f", "\u205f", "\u180e",
          "\u200b", "\ufeff", " \n", "\t\t", "   \n  ", "\n \n"]
PUNCT = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + ["。", "，", "！", "？", "、", "：", "；", "「", "」",
                                                      "…", "—", "–", "«", "»", "¿", "¡", "•", "€", "£",
                                                      "¥", "§", "°", "±", "×", "÷", "→", "∑", "√", "∞"]
CODE = [
    "def foo(x: int) -> int:\n    return x * 2  # double\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}\n",
    "fn main() {\n    println!(\"{}\", 42);\n}\n",
    "const f = async (a, b) => { await g(a?.b ?? 0); };\n",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;\n",
    "#include <stdio.h>\nint main(void){printf(\"%d\\n\",1<<3);}\n",
    "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"hi\") }\n",
    "<div class=\"a\"><p>Hello &amp; bye</p></div>\n",
    "$ ls -la | grep '^d' && echo \"done\" >> /tmp/log 2>&1\n",
    "x = [i**2 for i in range(10) if i % 3 == 0]\r\n",
    "\\begin{equation} E = mc^2 \\end{equation}\n",
    "public static void main(String[] args) throws IOException {}\n",
]
URLS = ["https://www.example.com/path/to/page?query=1&b=two#frag", "http://localhost:8080/v1/chat/completions",
        "ftp://user:pass@host.org/file.tar.gz", "mailto:someone@example.org", "https://zh.wikipedia.org/wiki/中国",
        "www.deepseek.com", "file:///C:/Users/x/Desktop/a%20b.txt"]


def random_scalar(rng: random.Random) -> str:
    """A random Unicode scalar value (never a surrogate), biased towards the BMP and assigned chars."""
    while True:
        r = rng.random()
        if r < 0.6:
            cp = rng.randrange(0x20, 0x3000)
        elif r < 0.85:
            cp = rng.randrange(0x3000, 0x10000)
        elif r < 0.97:
            cp = rng.randrange(0x10000, 0x30000)
        else:
            cp = rng.randrange(0, 0x110000)
        if 0xD800 <= cp <= 0xDFFF:
            continue
        return chr(cp)


def number(rng: random.Random) -> str:
    k = rng.randrange(6)
    n = rng.randrange(10 ** rng.randrange(1, 13))
    if k == 0:
        return f"{n:,}"
    if k == 1:
        return f"{n:_}"
    if k == 2:
        return f"{n / 1000:.{rng.randrange(1, 6)}f}"
    if k == 3:
        return f"{rng.uniform(-1e6, 1e6):.3e}"
    if k == 4:
        return f"{n:,}".replace(",", " ").replace(" ", "\u202f" if rng.random() < 0.5 else " ")
    return "0x" + format(n, "x")


def all_words() -> list[str]:
    return [w for ws in WORDS.values() for w in ws]


def mixed(rng: random.Random, n: int) -> str:
    pools = [all_words(), EMOJI, SPACES, PUNCT, SPECIALS, LOOKALIKES, URLS]
    weights = [40, 6, 20, 15, 3, 3, 1]
    out = []
    for _ in range(n):
        pool = rng.choices(pools, weights)[0]
        r = rng.random()
        if r < 0.08:
            out.append(number(rng))
        elif r < 0.12:
            out.append(str(rng.randrange(10 ** rng.randrange(1, 20))))
        else:
            out.append(rng.choice(pool))
    return "".join(out)


def build(seed: int = SEED) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    items: list[tuple[str, str]] = []

    def add(cat: str, text: str) -> None:
        items.append((cat, text))

    # Single-script sentences.
    for lang, ws in WORDS.items():
        for _ in range(600):
            sep = rng.choice(["", " ", " ", "  ", "\n", "，", ", "])
            add(lang, sep.join(rng.choice(ws) for _ in range(rng.randrange(1, 12))))
    # Exact boundaries of the CJK/kana class [一-龥぀-ゟ゠-ヿ] and neighbours.
    edges = [0x4DFF, 0x4E00, 0x4E01, 0x9FA4, 0x9FA5, 0x9FA6, 0x9FFF, 0x303F, 0x3040, 0x3041, 0x309F, 0x30A0,
             0x30FF, 0x3100, 0x31F0, 0xF900, 0x20000, 0x3400, 0xFF66]
    for a in edges:
        for b in edges:
            add("cjk-edges", chr(a) + chr(b) + chr(a) + "a" + chr(b) + "1" + chr(a))
    for _ in range(800):
        add("cjk-range", "".join(chr(rng.choice([rng.randrange(0x4E00, 0x9FA6), rng.randrange(0x3040, 0x30A0),
                                                  rng.randrange(0x30A0, 0x3100), rng.randrange(0x9FA6, 0xA000),
                                                  rng.randrange(0x3400, 0x4DC0), ord(rng.choice("a1 。!"))]))
                                 for _ in range(rng.randrange(1, 20))))
    # Emoji.
    for _ in range(700):
        add("emoji", "".join(rng.choice(EMOJI + [" ", "a", "你", "!"]) for _ in range(rng.randrange(1, 10))))
    # Combining marks and NFC/NFD pairs.
    marks = [chr(c) for c in range(0x300, 0x370)] + ["\u0488", "\u20dd", "\u0e31", "\u093f", "\u05b0"]
    for _ in range(500):
        base = rng.choice("aeiouAEIOUnc ्1!" + "你")
        add("combining", "".join(base + "".join(rng.choice(marks) for _ in range(rng.randrange(0, 4)))
                                 for _ in range(rng.randrange(1, 8))))
    nf_src = ["café", "naïve", "Å", "한국어", "ﬁ", "ẛ̣", "Ω", "é", "ḱṷṓn", "Ǆ", "ガ", "ｶﾞ", "①", "x²", "Ⅻ",
              "Ελληνικά", "ồ", "ự"]
    for w in nf_src * 20:
        w2 = w + rng.choice(["", " test", "1", "。"])
        for form in ("NFC", "NFD", "NFKC", "NFKD"):
            add("nf", unicodedata.normalize(form, w2))
    # Digit runs of every length, numbers with separators.
    for n in range(1, 101):
        add("digits", "".join(rng.choice("0123456789") for _ in range(n)))
        add("digits", "x" + "7" * n + "y")
        add("digits", " " + "1" * n)
    for _ in range(300):
        add("digits", "".join(rng.choice("0123456789٠١٢३४५๑๒²³¼①") for _ in range(rng.randrange(1, 30))))
    for _ in range(800):
        add("numbers", rng.choice(["", "$", "€", "price: ", "v", "-", "+", "#"]) + number(rng)
            + rng.choice(["", "%", " USD", "元", "km", ".", "s"]))
    # Code.
    for _ in range(800):
        parts = [rng.choice(CODE) for _ in range(rng.randrange(1, 4))]
        text = "".join(parts)
        if rng.random() < 0.3:
            text = text.replace("    ", "\t")
        add("code", text)
    # Whitespace runs of every kind.
    for sp in SPACES:
        for n in range(1, 17):
            add("ws", sp * n)
            add("ws", "a" + sp * n + "b")
            add("ws", "1" + sp * n)
            add("ws", sp * n + "你")
            add("ws", "!" + sp * n + "!")
    for _ in range(1000):
        add("ws-mixed", "".join(rng.choice(SPACES + ["a", "b", "1", ".", "你", "-"]) for _ in range(rng.randrange(1, 25))))
    # Special tokens and look-alikes in text.
    for _ in range(1500):
        add("special", mixed(rng, rng.randrange(1, 8)).join(
            rng.choice(SPECIALS + LOOKALIKES) for _ in range(rng.randrange(1, 4))))
    # Punctuation runs.
    for _ in range(1000):
        add("punct", "".join(rng.choice(PUNCT + [" ", "\n", "a", "Z", "你"]) for _ in range(rng.randrange(1, 20))))
    # URLs and JSON.
    for _ in range(500):
        add("url", rng.choice(URLS) + rng.choice(["", " ", ".", ")", "\n"]) + mixed(rng, rng.randrange(0, 3)))
    for _ in range(800):
        obj = {mixed(rng, 1): [rng.randrange(-10**6, 10**6), mixed(rng, 2), None, True, rng.random()],
               "k": {"nested": mixed(rng, 3)}}
        add("json", json.dumps(obj, ensure_ascii=rng.random() < 0.3, indent=rng.choice([None, 2, "\t"])))
    # Mixed-script strings.
    for _ in range(4000):
        add("mixed", mixed(rng, rng.randrange(1, 30)))
    # Random Unicode scalar values.
    for _ in range(3000):
        add("random", "".join(random_scalar(rng) for _ in range(rng.randrange(1, 40))))
    # Edge cases.
    for s in ["", " ", "\n", "a", "'s", "'S", "'ll", " 's", "I'M", "\u0000", "\u0000\u0001\u001f\u007f",
              "\ud7ff\ue000\uffff\U0010ffff", "\U0001F600" * 5, "<" * 30, "｜" * 10, "▁" * 10]:
        add("edge", s)
    return items


def big_strings(seed: int = SEED) -> list[tuple[str, str]]:
    """Four ~1 MB strings (not stored): mixed text, a single 'word' of letters, whitespace-heavy
    text, and CJK without spaces."""
    rng = random.Random(seed + 1)
    out = []
    parts, n = [], 0
    while n < 1_000_000:
        s = mixed(rng, 20)
        parts.append(s)
        n += len(s.encode())
    out.append(("big-mixed", "".join(parts)))
    out.append(("big-letters", "".join(rng.choice("abcdefghij") for _ in range(1_000_000))))
    out.append(("big-ws", "".join(rng.choice([" ", " ", "\n", "\t", "a", "\u00a0", "\r\n"]) for _ in range(700_000))))
    out.append(("big-cjk", "".join(chr(rng.randrange(0x4E00, 0x9FA6)) for _ in range(340_000))))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--seed", type=int, default=SEED)
    args = ap.parse_args()
    items = build(args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps({"cat": c, "text": t}, ensure_ascii=False) + "\n" for c, t in items).encode()
    with open(args.out, "wb") as f:
        with gzip.GzipFile(fileobj=f, mode="wb", compresslevel=9, mtime=0) as gz:
            gz.write(data)
    print(f"wrote {len(items)} strings ({len(data)} bytes raw, {args.out.stat().st_size} gzipped) to {args.out}")


if __name__ == "__main__":
    main()
