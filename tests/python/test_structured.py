"""Structured outputs end to end (issue 6): a tiny random-weight V4.1 checkpoint with its own
byte-level tokenizer, sampling at temperature 1.0 so the grammar, not the model, decides. Every
JSON output that ends (finish_reason "stop") must validate against its schema (jsonschema), regex
outputs must fullmatch, EBNF outputs must match an equivalent Python regex; bad so_args are
rejected by add_request with a message that points at the problem, leaving the engine usable."""
import json
import re
from pathlib import Path

import pytest

import deepinfer

jsonschema = pytest.importorskip("jsonschema")
SCHEMAS = json.loads((Path(__file__).resolve().parents[1] / "data" / "structured" / "schemas.json").read_text())


@pytest.fixture(scope="module")
def llm(make_checkpoint):
    model = make_checkpoint("tiny", seed=0, family="v41")
    return deepinfer.LLM(model=str(model), kv_cache_memory=1 << 28, max_model_len=1024, max_num_seqs=64)


def _run(llm, so_args_list, seeds, max_tokens):
    prompts, params = [], []
    for so in so_args_list:
        for s in seeds:
            prompts.append([0, 17, 42, 7])
            params.append(deepinfer.SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=s, so_args=so))
    return llm.generate(prompts, params)


def test_json_schemas_validate(llm):
    seeds = [1, 2, 3]
    so = [{"type": "json_schema", "value": json.dumps(s)} for s in SCHEMAS]
    outs = _run(llm, so, seeds, max_tokens=96)
    finished = 0
    for i, o in enumerate(outs):
        schema = SCHEMAS[i // len(seeds)]
        c = o.outputs[0]
        assert o.error is None, o.error
        if c.finish_reason != "stop":
            continue
        finished += 1
        value = json.loads(c.text)
        jsonschema.validate(value, schema)  # raises with the path on a violation
    print(f"{finished} of {len(outs)} finished")
    assert finished >= 0.75 * len(outs), f"only {finished} of {len(outs)} finished"


def test_json_object_and_choice(llm):
    outs = _run(llm, [{"type": "json_object"}], [1, 2, 3, 4], max_tokens=64)
    for o in outs:
        if o.outputs[0].finish_reason == "stop":
            assert isinstance(json.loads(o.outputs[0].text), dict)
    choices = ["apple", "banana", "cherry pie"]
    outs = _run(llm, [{"type": "choice", "value": choices}], [1, 2, 3, 4, 5], max_tokens=16)
    for o in outs:
        assert o.outputs[0].finish_reason == "stop"
        assert o.outputs[0].text in choices


REGEXES = [r"\d{3}-\d{4}", r"(cat|dog)s?", r"[a-f0-9]{8}", r"[A-Z][a-z]{1,5}( [A-Z][a-z]{1,5})?",
           r"(\+|-)?(0|[1-9]\d{0,3})(\.\d{1,2})?", r"[^\n]{5}"]


def test_regex(llm):
    outs = _run(llm, [{"type": "regex", "value": r} for r in REGEXES], [1, 2, 3], max_tokens=32)
    for i, o in enumerate(outs):
        c = o.outputs[0]
        assert c.finish_reason == "stop", (REGEXES[i // 3], c.text)
        assert re.fullmatch(REGEXES[i // 3], c.text), (REGEXES[i // 3], c.text)


EBNF = r'''
root ::= expr
expr ::= term (("+" | "-") term){0,3}
term ::= num | "(" expr ")"
num  ::= [1-9] [0-9]?
'''


def _balanced_expr(s):
    depth = 0
    for ch in s:
        depth += ch == "("
        depth -= ch == ")"
        if depth < 0:
            return False
    return depth == 0 and re.fullmatch(r"[0-9+\-()]+", s) and eval(s) is not None  # noqa: S307


def test_ebnf(llm):
    outs = _run(llm, [{"type": "ebnf", "value": EBNF}], [1, 2, 3, 4, 5, 6], max_tokens=48)
    done = [o.outputs[0] for o in outs if o.outputs[0].finish_reason == "stop"]
    assert len(done) >= 4
    for c in done:
        assert _balanced_expr(c.text), c.text


@pytest.mark.parametrize("so, message", [
    ({"type": "regex", "value": "(ab"}, "missing ')'"),
    ({"type": "ebnf", "value": "root ::= foo"}, "'foo' is used but never defined"),
    ({"type": "json_schema", "value": {"type": "object", "properties": {"a": {"not": {}}}}},
     "keyword 'not' is not supported at $.properties.a"),
    ({"type": "json_schema", "value": {"$ref": "#/$defs/x"}}, "does not resolve"),
    ({"type": "xml", "value": "x"}, "unknown type 'xml'"),
])
def test_bad_so_args_are_rejected(llm, so, message):
    bad = llm.generate([[5, 6]], deepinfer.SamplingParams(max_tokens=2, so_args=so))[0]
    assert bad.outputs[0].finish_reason == "abort"
    assert message in bad.error
    ok = llm.generate([[5, 6]], deepinfer.SamplingParams(max_tokens=2, ignore_eos=True))[0]
    assert len(ok.outputs[0].token_ids) == 2
