#!/usr/bin/env python3
"""Writes tests/data/parsers/goldens.json: model outputs and their expected parses.

Well-formed cases are rendered and parsed by DeepSeek's reference V4 encoding script
(`encoding_dsv4.py`, passed with --ref; it is not part of this repository): the output text is what
the reference renders for an assistant message (reasoning + "</think>" + content + "\\n\\n" + DSML
block), and the expected parse is the reference's `parse_message_from_completion_text` of that text
+ EOS. V4.1 (`encoding/encoding.py` of V4.1) renders and parses exactly like V4 except for the tag
names (" calls", " invoke", " parameter"), so V4.1 cases are rendered with V4 and the tag names
substituted, and parsed back with the inverse substitution.

Malformed and edge cases (which the reference rejects with an exception) carry hand-written
expectations that follow the rules documented in src/tokenizer/parsers.h.

Usage: python3 tools/parsers/make_goldens.py --ref .ref/v4enc/encoding/encoding_dsv4.py
"""
import argparse
import importlib.util
import json
import pathlib

D = "｜DSML｜"
EOS = "<｜end▁of▁sentence｜>"
V41_SUBST = [(f"{D}tool_calls", f"{D} calls"), (f"{D}invoke", f"{D} invoke"), (f"{D}parameter", f"{D} parameter")]


def to_v41(s):
    for a, b in V41_SUBST:
        s = s.replace(a, b)
    return s


def from_v41(s):
    for a, b in V41_SUBST:
        s = s.replace(b, a)
    return s


def load_ref(path):
    spec = importlib.util.spec_from_file_location("encoding_dsv4", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def render(ref, reasoning, content, calls, thinking):
    """The assistant turn as the reference renders it (no EOS), thinking-mode prompt ends in <think>."""
    text = ""
    if thinking:
        text += reasoning + ref.thinking_end_token
    text += content
    if calls:
        tcs = [ref.tool_call_template.format(dsml_token=ref.dsml_token, name=c["name"],
                                             arguments=ref.encode_arguments_to_dsml(c)) for c in calls]
        text += "\n\n" + ref.tool_calls_template.format(dsml_token=ref.dsml_token, tool_calls="\n".join(tcs),
                                                        tc_block_name=ref.tool_calls_block_name)
    return text


def ref_parse(ref, text, thinking, family):
    t = from_v41(text) if family == "v4.1" else text
    msg = ref.parse_message_from_completion_text(t + EOS, "thinking" if thinking else "chat")
    return {
        "reasoning": msg["reasoning_content"],
        "content": msg["content"],
        "tool_calls": [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                       for c in msg["tool_calls"]],
    }


def call(name, **args):
    return {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}


# (name, thinking, reasoning, content, tool calls) rendered by the reference, for both families.
WELL_FORMED = [
    ("plain_content", False, "", "Hello, world! How can I help?", []),
    ("plain_multiline", False, "", "Line 1\n\nLine 2 with <b>html</b> & a < b > c", []),
    ("reasoning_and_content", True, "The user greets me. I should greet back.", "Hi there!", []),
    ("reasoning_only", True, "Just thinking, no answer yet.", "", []),
    ("empty_reasoning", True, "", "Direct answer.", []),
    ("one_call_string", False, "", "", [call("get_weather", city="Paris")]),
    ("one_call_with_content", False, "", "Let me check the weather.", [call("get_weather", city="Paris", unit="C")]),
    ("thinking_content_call", True, "Need the weather tool.", "Checking.", [call("get_weather", city="Tokyo")]),
    ("thinking_call_no_content", True, "Call the tool directly.", "", [call("search", query="deepseek v4")]),
    ("several_calls", True, "Three lookups.", "", [
        call("search", query="a"), call("fetch", url="https://example.com/?q=1&r=2", timeout=30),
        call("calc", expr="2+2", precise=True)]),
    ("typed_values", False, "", "", [call("f", i=42, x=-3.5e-7, t=True, f=False, n=None, s="42")]),
    ("nested_json", False, "", "", [call("create", spec={"a": [1, {"b": [True, None, "x"]}], "c": {"d": {}}},
                                         items=[[1, 2], [], ["s"]])]),
    ("unicode", True, "用户问天气。🤔", "好的，我来查一下。", [call("天气", 城市="北京", emoji="😀 ✓", mixed="naïve café")]),
    ("escaping", False, "", "", [call("write", path="C:\\dir\\file.txt",
                                      text="quote \" backslash \\ newline\n tab\t cr\r bell\x07 nul-ish\x01 end")]),
    ("empty_params", False, "", "Calling.", [{"name": "list_files", "arguments": "{}"}]),
    ("empty_string_value", False, "", "", [call("echo", text="")]),
    ("value_with_markup", False, "", "", [call("render", html="<div>\n  <p>hi</p>\n</div>", note="a <think> b")]),
    ("multiline_code_value", True, "Write code.", "Here:", [call("write_file", path="a.py",
                                                                content="def f(x):\n    return {'k': [x]}\n\n\nprint(f(1))\n")]),
    ("json_looking_string", False, "", "", [call("f", s="{\"a\": 1}", t="[1, 2]", u="true")]),
]

# Hand-written expectations (text, expected). X(...) builds an expectation.
def X(reasoning="", content="", calls=()):
    return {"reasoning": reasoning, "content": content, "tool_calls": [{"name": n, "arguments": a} for n, a in calls]}


def malformed(v):
    """Edge and malformed cases for the dialect of family v ("v4" or "v4.1")."""
    sp = " " if v == "v4.1" else ""
    blk = f"{D} calls" if v == "v4.1" else f"{D}tool_calls"
    BO, BC = f"<{blk}>", f"</{blk}>"
    IO, IC = f"<{D}{sp}invoke", f"</{D}{sp}invoke>"
    PO, PC = f"<{D}{sp}parameter", f"</{D}{sp}parameter>"
    inv = f'{IO} name="f">\n{PO} name="a" string="true">x{PC}\n{IC}'
    inv2 = f'{IO} name="g">\n{PO} name="b" string="false">2{PC}\n{IC}'
    good = f"\n\n{BO}\n{inv}\n{BC}"
    cases = [
        ("truncated_in_value", False, f"Hi\n\n{BO}\n{IO} name=\"f\">\n{PO} name=\"a\" string=\"true\">par",
         X(content=f"Hi\n\n{BO}\n{IO} name=\"f\">\n{PO} name=\"a\" string=\"true\">par")),
        ("truncated_after_one_invoke", False, f"\n\n{BO}\n{inv}\n{IO} name=\"g\">\n",
         X(content=f"\n{IO} name=\"g\">\n", calls=[("f", '{"a": "x"}')])),
        ("truncated_open_tag_only", True, f"r</think>c\n\n{BO}", X("r", f"c\n\n{BO}")),
        ("unknown_tag_in_block", False, f"A\n\n{BO}\n<{D}{sp}bogus>\n{BC}\nB",
         X(content=f"A\n\n{BO}\n<{D}{sp}bogus>\n{BC}\nB")),
        ("bad_string_attr", False, f"\n\n{BO}\n{IO} name=\"f\">\n{PO} name=\"a\" string=\"maybe\">x{PC}\n{IC}\n{BC}",
         X(content=f"\n\n{BO}\n{IO} name=\"f\">\n{PO} name=\"a\" string=\"maybe\">x{PC}\n{IC}\n{BC}")),
        ("missing_name", False, f"\n\n{BO}\n{IO}>\n{IC}\n{BC}", X(content=f"\n\n{BO}\n{IO}>\n{IC}\n{BC}")),
        ("invalid_json_literal", False, f"\n\n{BO}\n{IO} name=\"f\">\n{PO} name=\"a\" string=\"false\">not json{PC}\n"
         f"{PO} name=\"b\" string=\"false\">{PC}\n{IC}\n{BC}", X(calls=[("f", '{"a": "not json", "b": ""}')])),
        ("json_literal_whitespace_kept", False, f"\n\n{BO}\n{IO} name=\"f\">\n{PO} name=\"a\" string=\"false\"> [1, 2]\n{PC}\n{IC}\n{BC}",
         X(calls=[("f", '{"a":  [1, 2]\n}')])),
        ("duplicate_param_last_wins", False, f"\n\n{BO}\n{IO} name=\"f\">\n{PO} name=\"a\" string=\"true\">1{PC}\n"
         f"{PO} name=\"b\" string=\"true\">2{PC}\n{PO} name=\"a\" string=\"true\">3{PC}\n{IC}\n{BC}",
         X(calls=[("f", '{"a": "3", "b": "2"}')])),
        ("no_newlines_between_tags", False, f"{BO}{IO} name=\"f\">{PO} name=\"a\" string=\"true\">x{PC}{IC}{BC}",
         X(calls=[("f", '{"a": "x"}')])),
        ("extra_whitespace", False, f"\n\n{BO}\n\n  {IO}  name=\"f\" >\n\t{PO}  name=\"a\"  string=\"false\" >1{PC}  \n{IC}\n \n{BC}",
         X(calls=[("f", '{"a": 1}')])),
        ("single_newline_before_block", False, f"text\n{good[2:]}", X(content="text\n", calls=[("f", '{"a": "x"}')])),
        ("text_after_block", False, f"{good}\nafter", X(content="\nafter", calls=[("f", '{"a": "x"}')])),
        ("two_blocks", False, f"a{good}b\n\n{BO}\n{inv2}\n{BC}",
         X(content="ab", calls=[("f", '{"a": "x"}'), ("g", '{"b": 2}')])),
        ("two_invokes_then_garbage", False, f"\n\n{BO}\n{inv}\n{inv2}\ngarbage{BC}",
         X(content=f"\ngarbage{BC}", calls=[("f", '{"a": "x"}'), ("g", '{"b": 2}')])),
        ("value_contains_invoke_close", False,
         f"\n\n{BO}\n{IO} name=\"f\">\n{PO} name=\"a\" string=\"true\">x{IC}y{PC}\n{IC}\n{BC}",
         X(calls=[("f", json.dumps({"a": f"x{IC}y"}, ensure_ascii=False))])),
        ("value_contains_think_end", False,
         f"\n\n{BO}\n{IO} name=\"f\">\n{PO} name=\"a\" string=\"true\">a</think>b{PC}\n{IC}\n{BC}",
         X(calls=[("f", '{"a": "a</think>b"}')])),
        ("thinking_no_end_tag", True, "still thinking <th", X(reasoning="still thinking <th")),
        ("thinking_partial_end_at_eof", True, "reason</thi", X(reasoning="reason</thi")),
        ("thinking_repeated_start_tag", True, "<think>r</think>c", X("r", "c")),
        ("chat_leading_think", False, "<think>hidden</think>visible", X("hidden", "visible")),
        ("chat_think_not_leading", False, "a <think>b</think> c", X(content="a <think>b c")),
        ("chat_partial_think_at_eof", False, "<thin", X(content="<thin")),
        ("stray_think_end_in_content", True, "r</think>a</think>b", X("r", "ab")),
        ("eos_ends_output", True, f"r</think>answer{EOS}trailing junk", X("r", "answer")),
        ("eos_after_block", False, f"{good}{EOS}", X(calls=[("f", '{"a": "x"}')])),
        ("call_inside_reasoning", True, f"reasoning{good}",
         X("reasoning", "", calls=[("f", '{"a": "x"}')])),
        ("call_inside_reasoning_then_think_end", True, f"reasoning{good}</think>",
         X("reasoning", "", calls=[("f", '{"a": "x"}')])),
        ("partial_block_tag_at_eof", False, f"Hello <{D}{blk[:3]}", X(content=f"Hello <{D}{blk[:3]}")),
        ("lone_dsml_token", False, f"a {D} b <{D}> c", X(content=f"a {D} b <{D}> c")),
        ("empty_output_thinking", True, "", X()),
        ("empty_output_chat", False, "", X()),
        ("invoke_outside_block", False, f"{inv}", X(content=inv)),
        ("unclosed_block_with_good_invoke", True, f"r</think>\n\n{BO}\n{inv}\n",
         X("r", "\n", calls=[("f", '{"a": "x"}')])),
    ]
    other = "v4" if v == "v4.1" else "v4.1"
    other_blk = f"{D}tool_calls" if v == "v4.1" else f"{D} calls"
    cases.append(("other_dialect_is_content", False, f"x\n\n<{other_blk}>\n</{other_blk}>",
                  X(content=f"x\n\n<{other_blk}>\n</{other_blk}>")))
    return cases


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ref", default=".ref/v4enc/encoding/encoding_dsv4.py")
    ap.add_argument("--out", default="tests/data/parsers/goldens.json")
    args = ap.parse_args()
    ref = load_ref(args.ref)
    out = []
    for family in ("v4", "v4.1"):
        for name, thinking, reasoning, content, calls in WELL_FORMED:
            text = render(ref, reasoning, content, calls, thinking)
            if family == "v4.1":
                text = to_v41(text)
            exp = ref_parse(ref, text, thinking, family)
            assert exp["content"] == content and exp["reasoning"] == (reasoning if thinking else ""), name
            out.append({"name": f"{family}/{name}", "family": family, "thinking": thinking, "text": text,
                        "expected": exp, "source": "reference"})
        for name, thinking, text, exp in malformed(family):
            out.append({"name": f"{family}/{name}", "family": family, "thinking": thinking, "text": text,
                        "expected": exp, "source": "hand"})
    pathlib.Path(args.out).write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n")
    print(f"wrote {len(out)} goldens to {args.out}")


if __name__ == "__main__":
    main()
