"""deepinfer.ReasoningParser / ToolCallParser / ChatOutputParser through the Python module, checked
against the goldens of tests/data/parsers (split at every byte, fed as bytes)."""
import json
import os
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
try:
    import deepinfer
    HAVE = hasattr(deepinfer, "ChatOutputParser")
except ImportError:
    HAVE = False

pytestmark = pytest.mark.skipif(not HAVE and os.environ.get("CI") != "true",
                                reason="deepinfer Python module not built")

GOLDENS = json.loads((ROOT / "tests/data/parsers/goldens.json").read_text())


def run(parser, chunks):
    acc = {"reasoning": "", "content": "", "tool_calls": []}
    for out in [parser.feed(c) for c in chunks] + [parser.finish()]:
        for k in ("reasoning", "content"):
            acc[k] += out.get(k, "")
        acc["tool_calls"] += out["tool_calls"]
    return acc


def check(g, acc):
    exp = g["expected"]
    assert acc["reasoning"] == exp["reasoning"], g["name"]
    assert acc["content"] == exp["content"], g["name"]
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in acc["tool_calls"]] == \
        [(c["name"], c["arguments"]) for c in exp["tool_calls"]], g["name"]
    for i, c in enumerate(acc["tool_calls"]):
        assert c["index"] == i and c["id"] == f"call_{i}" and c["type"] == "function"
        assert isinstance(json.loads(c["function"]["arguments"]), dict)


@pytest.mark.parametrize("g", GOLDENS, ids=[g["name"] for g in GOLDENS])
def test_golden_bytes_every_split(g):
    data = g["text"].encode()
    for k in range(0, len(data) + 1, 1 if len(data) < 400 else 7):
        p = deepinfer.ChatOutputParser(g["family"], g["thinking"])
        check(g, run(p, [data[:k], data[k:]]))  # bytes split inside characters come out whole
    p = deepinfer.ChatOutputParser(g["family"], g["thinking"])
    check(g, run(p, list(g["text"])))  # str, one character at a time


def test_reasoning_and_tool_parsers():
    r = deepinfer.ReasoningParser(starts_in_reasoning=True)
    assert r.feed("a</th") == {"reasoning": "a", "content": ""}
    assert r.feed("ink>b") == {"reasoning": "", "content": "b"}
    assert r.finish() == {"reasoning": "", "content": ""}
    t = deepinfer.ToolCallParser("v4.1", id_generator=lambda i: f"id-{i}")
    out = t.feed('x\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name="f">\n'
                 '<｜DSML｜ parameter name="k" string="false">[1]</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>')
    assert out["content"] == "x"
    assert out["tool_calls"] == [{"index": 0, "id": "id-0", "type": "function",
                                  "function": {"name": "f", "arguments": '{"k": [1]}'}}]
    assert t.num_tool_calls == 1
    with pytest.raises(ValueError):
        deepinfer.ChatOutputParser("v5")


def test_invalid_utf8_bytes_do_not_raise():
    p = deepinfer.ChatOutputParser("v4", False)
    acc = run(p, [b"ok \xff\xfe", b"\xe4\xb8", b"\xad end"])
    assert acc["content"] == "ok \ufffd\ufffd中 end"
