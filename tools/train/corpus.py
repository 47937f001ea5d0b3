#!/usr/bin/env python3
"""Builds the English training corpus of the small DeepSeek-V4.1-architecture model (issue 9) from
Debian packages (tools/train/install_corpus_deps.sh installs them; CORPUS.md lists their licences):

  kjv       bible-kjv / bible-kjv-text  the King James Bible, one document per chapter
  jargon    jargon-text                 the Jargon File 4.4.7: chapters, lexicon entries, appendices
  pydoc     python3.11-doc              the Python 3.11 documentation (HTML -> plain text), one page
                                        per document (tutorial, library, reference, howto, faq, ...)
  wordnet   wordnet-base                WordNet 3.0 synsets with their glosses, 64 synsets a document

Output (--out, default build/train/corpus/):
  train.txt, heldout.txt      documents separated by two empty lines ("\\n\\n\\n"); inside a document
                              paragraphs are separated by exactly one empty line, so the separator is
                              unambiguous. train.txt is shuffled (seeded) and repeats the KJV --kjv-repeat
                              times (the KJV is the most coherent prose; the default weights it to ~40%).
  train.jsonl, heldout.jsonl  the same documents, one {"source", "id", "text"} object a line (train.jsonl
                              without the repeats; a trainer that wants EOS between documents uses these)
  stats.json                  sizes per source and split, package versions, sha256 of each file
  heldout_excerpt.txt         a ~30 KB excerpt of the held-out split (what tests/data/train/heldout.txt is)

The held-out split is chosen per source by document (a KJV chapter, a Jargon entry, a Python page, a
WordNet chunk): documents sorted by sha256 of their id, taken until --heldout-frac of the source's bytes.
Everything is deterministic: the same packages give byte-identical files.
"""
from __future__ import annotations

import argparse
import glob
import gzip
import hashlib
import html
import json
import os
import random
import re
import subprocess
import sys
import unicodedata
from html.parser import HTMLParser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PACKAGES = {
    "kjv": ["bible-kjv", "bible-kjv-text"],
    "jargon": ["jargon-text"],
    "pydoc": ["python3.11-doc"],
    "wordnet": ["wordnet-base"],
}

KJV_BOOKS = [
    "Genesis", "Exodus", "Leviticus", "Numbers", "Deuteronomy", "Joshua", "Judges", "Ruth", "1 Samuel",
    "2 Samuel", "1 Kings", "2 Kings", "1 Chronicles", "2 Chronicles", "Ezra", "Nehemiah", "Esther", "Job",
    "Psalms", "Proverbs", "Ecclesiastes", "Song of Solomon", "Isaiah", "Jeremiah", "Lamentations", "Ezekiel",
    "Daniel", "Hosea", "Joel", "Amos", "Obadiah", "Jonah", "Micah", "Nahum", "Habakkuk", "Zephaniah",
    "Haggai", "Zechariah", "Malachi", "Matthew", "Mark", "Luke", "John", "Acts", "Romans", "1 Corinthians",
    "2 Corinthians", "Galatians", "Ephesians", "Philippians", "Colossians", "1 Thessalonians",
    "2 Thessalonians", "1 Timothy", "2 Timothy", "Titus", "Philemon", "Hebrews", "James", "1 Peter",
    "2 Peter", "1 John", "2 John", "3 John", "Jude", "Revelation",
]

# Typographic characters mapped to ASCII (a small byte-level vocabulary spends no merges on them).
PUNCT = {
    "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u00ab": '"', "\u00bb": '"',
    "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u2032": "'", "\u2033": '"',
    "\u2014": "--", "\u2013": "-", "\u2012": "-", "\u2010": "-", "\u2011": "-", "\u2212": "-",
    "\u2026": "...", "\u00a0": " ", "\u2009": " ", "\u202f": " ", "\u2002": " ", "\u2003": " ",
    "\u200b": "", "\u00ad": "", "\ufeff": "", "\u00b6": "", "\u2022": "*",
}
_PUNCT_RE = re.compile("|".join(map(re.escape, PUNCT)))


def clean_text(text: str) -> str:
    """NFC, ASCII punctuation, tabs -> spaces, no trailing spaces, no control characters, at most one
    empty line in a row, no leading/trailing blank lines."""
    text = unicodedata.normalize("NFC", text)
    text = _PUNCT_RE.sub(lambda m: PUNCT[m.group(0)], text)
    text = text.replace("\r\n", "\n").replace("\r", "\n").expandtabs(4)
    text = "".join(c for c in text if c == "\n" or unicodedata.category(c)[0] != "C")
    lines = [ln.rstrip() for ln in text.split("\n")]
    text = "\n".join(lines)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip("\n")


def pkg_version(pkg: str) -> str | None:
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", pkg], capture_output=True, text=True)
    except FileNotFoundError:
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


# --------------------------------------------------------------------------------------------- KJV
def kjv_docs() -> list[tuple[str, str]]:
    raw = subprocess.run(["bible", "-f", "gen1:1-rev22:21"], stdin=subprocess.DEVNULL, capture_output=True,
                         check=True).stdout.decode("ascii")
    verse_re = re.compile(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$")
    chapters: dict[tuple[int, int], list[str]] = {}
    abbrevs: list[str] = []
    for line in raw.splitlines():
        m = verse_re.match(line)
        if not m:
            raise SystemExit(f"corpus: unexpected line from `bible`: {line!r}")
        ab, ch, _verse, text = m.groups()
        if not abbrevs or abbrevs[-1] != ab:
            abbrevs.append(ab)
        chapters.setdefault((len(abbrevs) - 1, int(ch)), []).append(" ".join(text.split()))
    if len(abbrevs) != 66 or len(chapters) != 1189:
        raise SystemExit(f"corpus: expected 66 books / 1189 chapters, got {len(abbrevs)} / {len(chapters)}")
    docs = []
    for (b, ch), verses in sorted(chapters.items()):
        book = KJV_BOOKS[b]
        title = f"{book} {ch}" if book != "Psalms" else f"Psalm {ch}"
        # One verse a line, without verse numbers: readable prose, consistent throughout.
        docs.append((f"kjv/{b + 1:02d}-{ch:03d}", clean_text(title + "\n\n" + "\n".join(verses))))
    return docs


# ------------------------------------------------------------------------------------------ Jargon
_BOX = re.compile("[\u2500-\u257f]")


def _unwrap(block: list[str]) -> str:
    """A paragraph of the 3-space-indented text dump: joined into one line; a bulleted list ("* ...",
    continuation lines indented by two more) one item a line; anything else with extra indentation is
    preformatted and kept line by line."""
    ind = [len(ln) - len(ln.lstrip()) for ln in block]
    base = min(ind)
    bullet = re.compile(r"^(\*|\u2022|-|\d+\.) ")
    if bullet.match(block[0].lstrip()) and all(
            (i == ind[0] and bullet.match(ln.lstrip())) or i == ind[0] + 2 for ln, i in zip(block, ind)):
        items: list[list[str]] = []
        for ln, i in zip(block, ind):
            if i == ind[0]:
                items.append([])
            items[-1].append(ln.strip())
        return "\n".join(_xref(" ".join(it)) for it in items)
    if any(i > 3 for i in ind[1:]) or ind[0] > 4:
        return "\n".join(ln[base:] for ln in block)
    return _xref(" ".join(ln.strip() for ln in block))


def _xref(text: str) -> str:
    return re.sub(r"\{([^{}]*)\}", r"\1", text)  # {cross reference} -> cross reference


def _paragraphs(lines: list[str]) -> list[str]:
    paras, cur = [], []
    for ln in lines + [""]:
        if ln.strip() and not _BOX.search(ln):
            cur.append(ln.rstrip())
        elif cur:
            paras.append(_unwrap(cur))
            cur = []
    return paras


def jargon_docs() -> list[tuple[str, str]]:
    with gzip.open("/usr/share/doc/jargon-text/jargon.txt.gz", "rt", encoding="utf-8") as f:
        lines = f.read().replace("\u00a0", " ").split("\n")
    # Top-level headings start in column 0 (chapters, "Glossary", appendices and their sections).
    heads = [i for i, ln in enumerate(lines) if ln and not ln[0].isspace()]
    first = next(i for i in heads if lines[i].startswith("Chapter 1."))
    gloss = next(i for i in heads if lines[i] == "Glossary")
    appx = next(i for i in heads if lines[i].startswith("Appendix A."))
    biblio = next(i for i in heads if lines[i] == "Bibliography")
    docs = []
    # Chapters 1-12: one document each.
    chap_heads = [i for i in heads if first <= i < gloss] + [gloss]
    for a, b in zip(chap_heads, chap_heads[1:]):
        body = _paragraphs(lines[a + 1:b])
        if body:
            n = len(docs)
            docs.append((f"jargon/intro-{n:02d}", clean_text("\n\n".join([lines[a].strip()] + body))))
    # Lexicon: an entry runs from its ":term: ..." line to the next entry or letter heading ("  A").
    entry_re = re.compile(r"^   :(.+?):\s*(.*)$")
    i, n_entry = gloss + 1, 0
    while i < appx:
        m = entry_re.match(lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while j < appx and not entry_re.match(lines[j]) and not re.match(r"^  \S", lines[j]):
            j += 1
        term, rest = m.group(1), m.group(2).strip()
        rest = re.sub(r"^//,?\s*", "", rest)  # empty pronunciation
        head = f"{term}: {rest}" if rest else term
        body = _paragraphs(lines[i + 1:j])
        if body:
            docs.append((f"jargon/entry-{n_entry:05d}", clean_text("\n\n".join([head] + body))))
            n_entry += 1
        i = j
    # Appendices A-C: one document per section (the bibliography, a list of books, is left out).
    app_heads = [i for i in heads if appx <= i < biblio] + [biblio]
    for k, (a, b) in enumerate(zip(app_heads, app_heads[1:])):
        body = _paragraphs(lines[a + 1:b])
        if body:
            docs.append((f"jargon/appendix-{k:02d}", clean_text("\n\n".join([lines[a].strip()] + body))))
    return docs


# ---------------------------------------------------------------------------------- Python docs
PYDOC_ROOT = "/usr/share/doc/python3.11/html"
PYDOC_SECTIONS = ["tutorial", "library", "reference", "howto", "faq", "using", "extending", "installing",
                  "distributing"]
PYDOC_PAGES = ["glossary.html"]
_BLOCK = {"p", "h1", "h2", "h3", "h4", "h5", "h6", "li", "dt", "dd", "div", "section", "blockquote", "tr",
          "table", "ul", "ol", "dl", "figure", "figcaption", "caption", "aside", "br", "hr"}


class _DocText(HTMLParser):
    """Plain text of a Sphinx page's main body: paragraphs, headings, list items ("- "), definition
    terms, table rows (cells joined by " | "), admonitions ("Note: ..."), code blocks kept verbatim.
    Permalink marks and the like are dropped."""

    VOID = ("br", "hr", "img", "input", "meta", "link", "wbr")

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.blocks: list[str] = []
        self.buf: list[str] = []
        self.prefix = ""         # put before the next non-empty paragraph ("- ", "Note: ")
        self.depth = 0           # div nesting inside the main body (0: outside)
        self.skip = 0            # inside an element whose text is dropped
        self.pre = 0
        self.cell = 0            # inside a table cell: blocks do not break the row
        self.row_cells = 0
        self.stack: list[tuple[str, bool, bool]] = []  # (tag, skipped, admonition title)

    def _text(self) -> str:
        text = " ".join("".join(self.buf).split())
        self.buf = []
        return text

    def _flush(self):
        text = self._text()
        if text:
            self.blocks.append(self.prefix + text)
            self.prefix = ""

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        cls = (a.get("class") or "").split()
        if self.depth == 0:
            if tag == "div" and "body" in cls and a.get("role") == "main":
                self.depth = 1
                self.stack = [("div", False, False)]
            return
        if tag in self.VOID:
            if tag == "br" and not self.skip:
                if self.pre:
                    self.buf.append("\n")
                elif not self.cell:
                    self._flush()
            return
        skipped = bool({"headerlink", "linenos"} & set(cls)) or tag in ("script", "style", "button")
        self.stack.append((tag, skipped, tag == "p" and "admonition-title" in cls))
        if tag == "div":
            self.depth += 1
        if skipped:
            self.skip += 1
            return
        if self.skip:
            return
        if tag == "pre":
            self._flush()
            self.pre += 1
        elif tag in ("td", "th"):
            if self.row_cells:
                self.buf.append(" | ")
            self.row_cells += 1
            self.cell += 1
        elif self.cell or self.pre:
            if tag in _BLOCK:
                self.buf.append(" ")
        elif tag in _BLOCK:
            self._flush()
            if tag == "tr":
                self.row_cells = 0
            if tag == "li":
                self.prefix = "- "

    def handle_endtag(self, tag):
        if self.depth == 0 or tag in self.VOID:
            return
        if not any(t == tag for t, _, _ in self.stack):
            return  # stray end tag
        while self.stack:  # pop to the matching start tag (tolerates unclosed <p>/<li>)
            t, skipped, title = self.stack.pop()
            if t == "div":
                self.depth -= 1
            if skipped:
                self.skip -= 1
            elif not self.skip:
                if t == "pre":
                    code = "".join(self.buf).strip("\n")
                    if code.strip():
                        self.blocks.append("\n".join(ln.rstrip() for ln in code.split("\n")))
                    self.buf = []
                    self.pre -= 1
                elif t in ("td", "th"):
                    self.cell -= 1
                elif self.cell or self.pre:
                    pass
                elif title:
                    text = self._text()
                    self.prefix = (text.rstrip(":") + ": ") if text else ""
                elif t in _BLOCK:
                    self._flush()
            if t == tag:
                break
        if self.depth == 0:
            self._flush()

    def handle_data(self, data):
        if self.depth and not self.skip:
            self.buf.append(data)


def html_to_text(page: str) -> str:
    p = _DocText()
    p.feed(page)
    p.close()
    p._flush()
    return "\n\n".join(p.blocks)


def pydoc_docs() -> list[tuple[str, str]]:
    paths = list(PYDOC_PAGES)
    for sec in PYDOC_SECTIONS:
        paths += sorted(os.path.relpath(p, PYDOC_ROOT) for p in glob.glob(f"{PYDOC_ROOT}/{sec}/**/*.html",
                                                                           recursive=True))
    docs = []
    for rel in paths:
        with open(os.path.join(PYDOC_ROOT, rel), encoding="utf-8") as f:
            text = clean_text(html_to_text(f.read()))
        if len(text) >= 200:
            docs.append((f"pydoc/{rel[:-5]}", text))
    return docs


# ---------------------------------------------------------------------------------------- WordNet
WN_POS = {"n": "noun", "v": "verb", "a": "adjective", "s": "adjective", "r": "adverb"}


def wordnet_docs(chunk: int = 64) -> list[tuple[str, str]]:
    groups: dict[tuple[str, int], list[str]] = {}
    for pos in ("noun", "verb", "adj", "adv"):
        with open(f"/usr/share/wordnet/data.{pos}", encoding="utf-8") as f:
            for line in f:
                if line.startswith("  "):
                    continue  # licence header
                fields, _, gloss = line.partition(" | ")
                parts = fields.split()
                lexfile, ss_type, w_cnt = int(parts[1]), parts[2], int(parts[3], 16)
                words = [parts[4 + 2 * k] for k in range(w_cnt)]
                words = [re.sub(r"\([a-z]+\)$", "", w).replace("_", " ") for w in words]
                gloss = " ".join(gloss.split())
                groups.setdefault((pos, lexfile), []).append(f"{', '.join(words)} ({WN_POS[ss_type]}): {gloss}")
    docs = []
    for (pos, lexfile), items in sorted(groups.items()):
        for k in range(0, len(items), chunk):
            docs.append((f"wordnet/{pos}-{lexfile:02d}-{k // chunk:04d}", clean_text("\n".join(items[k:k + chunk]))))
    return docs


SOURCES = {"kjv": kjv_docs, "jargon": jargon_docs, "pydoc": pydoc_docs, "wordnet": wordnet_docs}


# ------------------------------------------------------------------------------------------ split
def _h(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()


def split_heldout(docs: list[tuple[str, str]], frac: float) -> set[str]:
    total = sum(len(t.encode()) for _, t in docs)
    chosen, acc = set(), 0
    for doc_id, text in sorted(docs, key=lambda d: _h(d[0])):
        if acc >= frac * total:
            break
        chosen.add(doc_id)
        acc += len(text.encode())
    return chosen


def excerpt(held: dict[str, list[tuple[str, str]]], budgets: dict[str, int]) -> str:
    """Whole held-out documents (hash order) per source up to its byte budget; a document that does not
    fit is cut at a paragraph or line boundary."""
    parts = []
    for src, budget in budgets.items():
        used = 0
        for doc_id, text in sorted(held.get(src, []), key=lambda d: _h(d[0])):
            room = budget - used
            if room < 400:
                break
            if len(text.encode()) > room:
                cut = text.encode()[:room].decode("utf-8", "ignore")
                k = max(cut.rfind("\n\n"), cut.rfind("\n"))
                if k < 200:
                    continue
                text = cut[:k].rstrip()
            parts.append(text)
            used += len(text.encode()) + 3
    return "\n\n\n".join(parts) + "\n"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "build" / "train" / "corpus"))
    ap.add_argument("--sources", default="kjv,jargon,pydoc,wordnet")
    ap.add_argument("--heldout-frac", type=float, default=0.015)
    ap.add_argument("--kjv-repeat", type=int, default=2, help="copies of each KJV train chapter in train.txt")
    ap.add_argument("--wordnet-max-mb", type=float, default=3.0,
                    help="cap on WordNet text (MB): a seeded choice of chunks, glosses being fragments")
    ap.add_argument("--seed", type=int, default=9)
    ap.add_argument("--excerpt-kb", type=int, default=32, help="size of heldout_excerpt.txt")
    args = ap.parse_args(argv)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sources = [s.strip() for s in args.sources.split(",") if s.strip()]
    all_docs: dict[str, list[tuple[str, str]]] = {}
    for src in sources:
        docs = SOURCES[src]()
        if src == "wordnet" and args.wordnet_max_mb > 0:
            rng = random.Random(args.seed)
            order = list(range(len(docs)))
            rng.shuffle(order)
            keep, acc = set(), 0
            for k in order:
                if acc >= args.wordnet_max_mb * 1e6:
                    break
                keep.add(k)
                acc += len(docs[k][1].encode())
            docs = [d for k, d in enumerate(docs) if k in keep]
        all_docs[src] = docs
        print(f"{src}: {len(docs)} documents, {sum(len(t.encode()) for _, t in docs) / 1e6:.2f} MB", file=sys.stderr)

    train, held = [], {}
    stats_src = {}
    for src, docs in all_docs.items():
        hid = split_heldout(docs, args.heldout_frac)
        h = [d for d in docs if d[0] in hid]
        t = [d for d in docs if d[0] not in hid]
        held[src] = h
        reps = args.kjv_repeat if src == "kjv" else 1
        train += [(src, d) for d in t]
        stats_src[src] = {
            "packages": {p: pkg_version(p) for p in PACKAGES[src]},
            "documents": len(docs), "train_documents": len(t), "heldout_documents": len(h),
            "train_bytes": sum(len(x.encode()) for _, x in t), "heldout_bytes": sum(len(x.encode()) for _, x in h),
            "train_repeat": reps,
        }

    def write_jsonl(path: Path, items):
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            for src, (doc_id, text) in items:
                f.write(json.dumps({"source": src, "id": doc_id, "text": text}, ensure_ascii=False) + "\n")

    rng = random.Random(args.seed)
    train_sorted = sorted(train, key=lambda x: x[1][0])
    write_jsonl(out / "train.jsonl", train_sorted)
    weighted = []
    for src, d in train_sorted:
        weighted += [(src, d)] * (args.kjv_repeat if src == "kjv" else 1)
    rng.shuffle(weighted)
    with open(out / "train.txt", "w", encoding="utf-8", newline="\n") as f:
        f.write("\n\n\n".join(text for _, (_, text) in weighted) + "\n")
    held_items = [(src, d) for src in sources for d in sorted(held[src], key=lambda d: d[0])]
    write_jsonl(out / "heldout.jsonl", held_items)
    with open(out / "heldout.txt", "w", encoding="utf-8", newline="\n") as f:
        f.write("\n\n\n".join(text for _, (_, text) in held_items) + "\n")

    kb = args.excerpt_kb * 1000
    shares = {"kjv": 0.45, "jargon": 0.2, "pydoc": 0.2, "wordnet": 0.15}
    budgets = {s: int(kb * shares.get(s, 0.1)) for s in sources}
    (out / "heldout_excerpt.txt").write_text(excerpt(held, budgets), encoding="utf-8")

    files = ["train.txt", "heldout.txt", "train.jsonl", "heldout.jsonl", "heldout_excerpt.txt"]
    train_txt_bytes = (out / "train.txt").stat().st_size
    stats = {
        "format": "documents separated by '\\n\\n\\n'; paragraphs inside a document by '\\n\\n'",
        "seed": args.seed, "heldout_frac": args.heldout_frac, "kjv_repeat": args.kjv_repeat,
        "wordnet_max_mb": args.wordnet_max_mb,
        "sources": stats_src,
        "train_txt_share": {src: round(s["train_bytes"] * s["train_repeat"] / train_txt_bytes, 4)
                            for src, s in stats_src.items()},
        "files": {n: {"bytes": (out / n).stat().st_size, "sha256": sha256_file(out / n)} for n in files},
    }
    (out / "stats.json").write_text(json.dumps(stats, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({n: v["bytes"] for n, v in stats["files"].items()}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
