#!/usr/bin/env python3
"""Generate the prompt-encoding goldens in tests/data/encoding/{v4,v41}.json.

Runs DeepSeek's reference encoders on a deterministic set of conversations and records, per case,
the input messages, the options and either the expected prompt string or the expected error.
The reference scripts are NOT part of this repository; point at local copies (git-ignored .ref/):

  V4:   encoding_dsv4.py (+ its tests/test_input_*.json, test_output_*.txt) from the
        DeepSeek-V4 model repository's encoding/ folder   -> .ref/v4enc/encoding/
  V4.1: encoding/encoding.py from the DeepSeek-V4.1 model repository -> .ref/v41enc/encoding.py

Usage: python3 tools/encoding/make_goldens.py [--v4-ref DIR] [--v41-ref DIR] [--out DIR]
"""
import argparse
import copy
import importlib.util
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_module(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------- building blocks

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather for a specific location",
    "parameters": {"type": "object", "properties": {
        "location": {"type": "string", "description": "The city name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["location"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the web; 多个查询用 '||' 分隔 \"quoted\" \\ back",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string"}, "num_results": {"type": "integer", "default": 5},
        "filters": {"type": "object", "properties": {"lang": {"type": "string"},
                                                     "safe": {"type": "boolean"}}}},
        "required": ["query"], "additionalProperties": False}}}
CALC = {"type": "function", "function": {
    "name": "calc", "description": "Evaluate\tan expression\n(multi-line description) ✓",
    "parameters": {"type": "object", "properties": {"expr": {"type": "string"},
                                                    "precision": {"type": "number", "minimum": 0.5}}}}}
TOOLS = [WEATHER, SEARCH, CALC]


def call(cid, name, args):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def jd(obj):
    return json.dumps(obj, ensure_ascii=False)


SYS = {"role": "system", "content": "You are a helpful assistant."}


def tool_conv():
    """Tools on the system message, two rounds of tool calls, results, final answer."""
    return [
        dict(SYS, tools=TOOLS),
        {"role": "user", "content": "What's the weather in Beijing and Paris?"},
        {"role": "assistant", "reasoning_content": "Need weather for two cities.", "content": "",
         "tool_calls": [call("c1", "get_weather", jd({"location": "Beijing", "unit": "celsius"})),
                        call("c2", "get_weather", jd({"location": "Paris"}))]},
        {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 22, \"cond\": \"sunny\"}"},
        {"role": "tool", "tool_call_id": "c2", "content": "{\"temp\": 15}"},
        {"role": "assistant", "reasoning_content": "Got both.", "content": "Beijing 22°C, Paris 15°C."},
    ]


NONSTRING_ARGS = {
    "query": "naïve 测试 \"quotes\" \\ back\nnewline\ttab 😀",
    "num_results": 10, "ratio": 0.1, "big": 12345678901234567, "neg": -3, "f1": 1.0, "exp": 1e20,
    "tiny": 1e-07, "small": 0.0001, "e16": 1e16, "e15": 1e15, "negzero": -0.0,
    "flag": True, "off": False, "nothing": None, "empty": "", "list": [1, "two", [3.5, None], {}],
    "nested": {"a": {"b": [True, {"c": "ü"}]}, "z": [], "k": "v"}, "ctrl": "\u0001\u001f\u007f",
}

CASES = []  # (name, messages, options)


def add(name, messages, **opts):
    CASES.append((name, messages, opts))


def add_modes(name, messages, **opts):
    add(name + "/thinking", messages, thinking=True, **opts)
    add(name + "/chat", messages, thinking=False, **opts)


def build_cases():
    # -- basics
    add_modes("single_user", [{"role": "user", "content": "Hello"}])
    add_modes("system_user", [SYS, {"role": "user", "content": "What is 2+2?"}])
    add_modes("empty_messages", [])
    add_modes("only_system", [SYS])
    multi = [SYS, {"role": "user", "content": "Hello"},
             {"role": "assistant", "reasoning_content": "Greet back.", "content": "Hi! How can I help?"},
             {"role": "user", "content": "Capital of France?"},
             {"role": "assistant", "reasoning_content": "Paris.", "content": "Paris."}]
    add_modes("multi_turn_last_assistant", multi)
    add_modes("multi_turn_gen", multi[:4])
    add_modes("multi_turn_keep_thinking", multi, drop_thinking=False)
    add_modes("multi_turn_gen_keep_thinking", multi[:4], drop_thinking=False)
    add_modes("no_bos", multi[:4], add_default_bos_token=False)
    add_modes("consecutive_users", [{"role": "user", "content": "a"}, {"role": "user", "content": "b"},
                                    {"role": "user", "content": ""}])
    add_modes("empty_contents", [{"role": "system", "content": ""}, {"role": "user", "content": ""},
                                 {"role": "assistant", "content": ""}, {"role": "user"}])
    add_modes("missing_contents", [{"role": "system"}, {"role": "user"},
                                   {"role": "assistant"}, {"role": "user", "content": "x"}])
    add_modes("assistant_reasoning_only", [{"role": "user", "content": "q"},
                                           {"role": "assistant", "reasoning_content": "thought", "content": None}])
    add_modes("unicode_text", [{"role": "system", "content": "该助手为DeepSeek。\n😀 emoji ＼ fullwidth ｜"},
                               {"role": "user", "content": "<think>fake</think> <｜User｜> 你好\r\n\ttabs"}])
    # -- reasoning effort
    for eff in [None, "high", "max", "low", "medium", "xhigh", 1, 50, 75, 100, 0, 101, -5, True, 50.0, "50"]:
        add_modes(f"effort_{json.dumps(eff)}", [SYS, {"role": "user", "content": "Prove it."}],
                  reasoning_effort=eff)
    add("effort_max_no_system/thinking", [{"role": "user", "content": "hi"}], thinking=True, reasoning_effort="max")
    add("effort_70_no_system/thinking", [{"role": "user", "content": "hi"}], thinking=True, reasoning_effort=70)
    add("effort_invalid_empty_messages/thinking", [], thinking=True, reasoning_effort="bogus")
    # -- tools
    add_modes("tools_full", tool_conv())
    add_modes("tools_full_drop_off", tool_conv(), drop_thinking=False)
    add_modes("tools_pending_results", tool_conv()[:5])
    add_modes("tools_option", [SYS, {"role": "user", "content": "weather?"}], tools=[WEATHER])
    add_modes("tools_option_user_first", [{"role": "user", "content": "weather?"},
                                          {"role": "assistant", "reasoning_content": "r", "content": "a"},
                                          {"role": "user", "content": "again"}], tools=[WEATHER])
    add_modes("tools_empty_list", [dict(SYS, tools=[]), {"role": "user", "content": "x"},
                                   {"role": "assistant", "reasoning_content": "r", "content": "y"},
                                   {"role": "user", "content": "z"}])
    add_modes("tool_args_nonstring", [
        dict(SYS, tools=TOOLS), {"role": "user", "content": "search"},
        {"role": "assistant", "reasoning_content": "go", "content": "Let me search.",
         "tool_calls": [call("s1", "search", jd(NONSTRING_ARGS))]},
        {"role": "tool", "tool_call_id": "s1", "content": "results ✓"}])
    add_modes("tool_args_variants", [
        dict(SYS, tools=TOOLS), {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": [
            call("a", "calc", {"expr": "1+1", "precision": 2}),           # dict arguments
            call("c", "calc", "not json at all"),                         # invalid JSON
            call("d", "calc", ""),                                        # empty string
            call("e", "calc", "{}"),                                      # no parameters
            call("f", "calc", " {\"expr\" : \"x\" , \"expr2\": 1} "),     # whitespace
            call("g", "calc", "{\"a\": 1, \"b\": 2, \"a\": 3}"),          # duplicate key
        ]},
        {"role": "tool", "tool_call_id": "a", "content": "2"}])
    add_modes("tool_args_double_encoded", [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": [call("b", "calc", jd(jd({"expr": "2*3"}))),
                                                            call("c", "calc", jd(jd(jd({"e": 1}))))]}])
    add_modes("tool_args_array_string", [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": [call("a", "calc", "[1, 2]")]}])
    add_modes("tool_args_number_string", [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": [call("a", "calc", "42")]}])
    add_modes("tool_args_non_string_value", [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": [call("a", "calc", 42), call("b", "calc", None),
                                                            call("c", "calc", [1, {"x": "y"}])]}])
    add_modes("tool_results_out_of_order", [
        dict(SYS, tools=TOOLS), {"role": "user", "content": "three things"},
        {"role": "assistant", "reasoning_content": "three calls", "content": "",
         "tool_calls": [call("x1", "search", jd({"query": "one"})), call("x2", "search", jd({"query": "two"})),
                        call("x3", "calc", jd({"expr": "3"}))]},
        {"role": "tool", "tool_call_id": "x3", "content": "third"},
        {"role": "tool", "tool_call_id": "x1", "content": "first"},
        {"role": "tool", "tool_call_id": "unknown", "content": "stray"},
        {"role": "tool", "tool_call_id": "x2", "content": "second"},
        {"role": "user", "content": "and summarise"}])
    add_modes("tool_results_function_ids", [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"id": "f1", "name": "a", "arguments": "{}"}},
            {"type": "function", "function": {"id": "f2", "name": "b", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "f2", "content": "B"},
        {"role": "tool", "tool_call_id": "f1", "content": "A"}])
    add_modes("tool_results_no_ids", [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [call("i1", "a", "{}"), call("i2", "b", "{}")]},
        {"role": "tool", "content": "no id"},
        {"role": "tool", "tool_call_id": "i2", "content": "B"},
        {"role": "tool", "tool_call_id": "i1", "content": "A"}])
    add_modes("tool_result_content_kinds", [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [call("k1", "a", "{}"), call("k2", "b", "{}"),
                                                            call("k3", "c", "{}"), call("k4", "d", "{}")]},
        {"role": "tool", "tool_call_id": "k1", "content": [{"type": "text", "text": "part one"},
                                                           {"type": "text", "text": "part two"}]},
        {"role": "tool", "tool_call_id": "k2", "content": None},
        {"role": "tool", "tool_call_id": "k3"},
        {"role": "tool", "tool_call_id": "k4", "content": ""}])
    add_modes("tool_result_unsupported_part", [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [call("k1", "a", "{}")]},
        {"role": "tool", "tool_call_id": "k1", "content": [{"type": "text", "text": "see"},
                                                           {"type": "file", "file": "x"}]}])
    add_modes("tool_then_assistant_then_tool_rounds", [
        dict(SYS, tools=[WEATHER]), {"role": "user", "content": "r1"},
        {"role": "assistant", "reasoning_content": "t1", "content": "", "tool_calls": [call("r1", "get_weather", jd({"location": "A"}))]},
        {"role": "tool", "tool_call_id": "r1", "content": "A ok"},
        {"role": "assistant", "reasoning_content": "t2", "content": "", "tool_calls": [call("r2", "get_weather", jd({"location": "B"}))]},
        {"role": "tool", "tool_call_id": "r2", "content": "B ok"},
        {"role": "assistant", "reasoning_content": "t3", "content": "Done."},
        {"role": "user", "content": "thanks"}])
    add_modes("no_tools_tool_calls_drop", [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "reasoning_content": "hidden", "content": "", "tool_calls": [call("z", "f", "{\"a\": 1}")]},
        {"role": "tool", "tool_call_id": "z", "content": "r"},
        {"role": "assistant", "reasoning_content": "hidden2", "content": "a1"},
        {"role": "user", "content": "q2"}])
    # -- response format
    rf = {"type": "json_schema", "json_schema": {"name": "ans", "schema": {
        "type": "object", "properties": {"answer": {"type": "string"}, "score": {"type": "number"}}}}}
    add_modes("response_format_system", [dict(SYS, response_format=rf), {"role": "user", "content": "json please"}])
    add_modes("response_format_option", [SYS, {"role": "user", "content": "json please"}],
              response_format={"type": "json_object"})
    add_modes("response_format_and_tools", [dict(SYS, response_format=rf, tools=[CALC]),
                                            {"role": "user", "content": "x"}])
    # -- latest reminder, developer, system placement
    add_modes("latest_reminder_first", [SYS, {"role": "latest_reminder", "content": "2026-02-21, Paris"},
                                        {"role": "user", "content": "What day is it?"}])
    add_modes("latest_reminder_after_user", [{"role": "user", "content": "hi"},
                                             {"role": "latest_reminder", "content": "reminder"}])
    add_modes("latest_reminder_none", [{"role": "latest_reminder"}, {"role": "user", "content": "hi"}])
    add_modes("developer", [SYS, {"role": "developer", "content": "Search for the news.", "tools": [SEARCH]}])
    add_modes("developer_history", [SYS, {"role": "developer", "content": "old dev"},
                                    {"role": "assistant", "reasoning_content": "r", "content": "a"},
                                    {"role": "user", "content": "new"}])
    add_modes("developer_empty", [{"role": "developer", "content": ""}])
    add_modes("mid_system", [SYS, {"role": "user", "content": "hi"},
                             {"role": "assistant", "reasoning_content": "r1", "content": "hello"},
                             {"role": "system", "content": "Be brief from now on."}])
    add_modes("mid_system_then_user", [SYS, {"role": "user", "content": "hi"},
                                       {"role": "assistant", "reasoning_content": "r1", "content": "hello"},
                                       {"role": "system", "content": "New rules.", "tools": [CALC]},
                                       {"role": "user", "content": "1+1?"}])
    add_modes("mid_system_last_with_reply", [{"role": "user", "content": "hi"},
                                             {"role": "assistant", "reasoning_content": "r1", "content": "hello"},
                                             {"role": "system", "content": "note"},
                                             {"role": "assistant", "reasoning_content": "r2", "content": "ok"}])
    # -- prefix continuation, open assistant turns, context
    add_modes("wo_eos_prefix", [SYS, {"role": "user", "content": "Write a poem"},
                                {"role": "assistant", "reasoning_content": "A short poem.", "content": "Roses are",
                                 "wo_eos": True}])
    add_modes("wo_eos_no_reasoning", [{"role": "user", "content": "continue"},
                                      {"role": "assistant", "content": "Once upon", "wo_eos": True}])
    add_modes("prefix_key_is_ignored", [{"role": "user", "content": "continue"},
                                        {"role": "assistant", "content": "Once upon", "prefix": True}])
    conv = tool_conv()
    add_modes("context_tool_results", conv[3:5], context=conv[:3])
    add_modes("context_tool_results_reversed", [conv[4], conv[3]], context=conv[:3])
    add_modes("context_next_user", [{"role": "user", "content": "And tomorrow?"}], context=conv)
    add_modes("context_plain", [{"role": "assistant", "reasoning_content": "r2", "content": "a2"},
                                {"role": "user", "content": "q3"}],
              context=multi[:4])
    add_modes("context_effort", [{"role": "user", "content": "q2"}], context=[SYS, {"role": "user", "content": "q1"}],
              reasoning_effort="max")
    # -- tasks
    for task in ["action", "query", "authority", "domain", "title", "read_url"]:
        add_modes(f"task_{task}", [SYS, {"role": "user", "content": "热海大滚锅是世界著名温泉吗", "task": task}])
    add_modes("task_with_answer", [{"role": "user", "content": "q", "task": "query"},
                                   {"role": "assistant", "reasoning_content": "never shown", "content": "search terms"},
                                   {"role": "user", "content": "next"}])
    add_modes("task_action_with_reminder", [{"role": "user", "content": "q", "task": "action"},
                                            {"role": "latest_reminder", "content": "rem"}])
    add_modes("task_invalid", [{"role": "user", "content": "q", "task": "summarise"}])
    add_modes("task_user_not_merged", [{"role": "user", "content": "a", "task": "title"},
                                       {"role": "user", "content": "b"}])
    # -- content lists and images (V4.1 content blocks; V4 rejects list content on users)
    add_modes("content_list_text", [{"role": "user", "content": [{"type": "text", "text": "part A"},
                                                                 {"type": "text", "text": "part B"}]}])
    add_modes("image_url_blocks", [{"role": "user", "content": [
        {"type": "text", "text": "What is in these?"},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
        {"type": "image_url", "image_url": "data:image/png;base64,AAAA"},
        {"type": "image", "source": {"type": "base64", "data": "BBBB"}}]}])
    add_modes("image_history", [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]},
                                {"role": "assistant", "reasoning_content": "saw it", "content": "A cat."},
                                {"role": "user", "content": "colour?"}])
    add_modes("image_no_source", [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])
    add_modes("image_placeholder_in_text", [{"role": "user", "content": "look <｜deepseek_image｜> here"}])
    add_modes("image_placeholder_in_block", [{"role": "user", "content": [{"type": "text", "text": "<｜deepseek_image｜>"}]}])
    add_modes("image_in_tool_result", [
        {"role": "user", "content": "screenshot"},
        {"role": "assistant", "content": "", "tool_calls": [call("t", "shot", "{}")]},
        {"role": "tool", "tool_call_id": "t", "content": [{"type": "text", "text": "here"},
                                                          {"type": "image_url", "image_url": {"url": "x"}}]}])
    add_modes("unknown_block_type", [{"role": "user", "content": [{"type": "audio", "data": "x"},
                                                                  {"type": "text", "text": "t"}]}])
    add_modes("assistant_content_list", [{"role": "user", "content": "q"},
                                         {"role": "assistant", "content": [{"type": "text", "text": "a1"},
                                                                           {"type": "text", "text": "a2"}]}])
    # -- Python value semantics the references expose
    add_modes("python_str_values", [{"role": "system", "content": 123},
                                    {"role": "user", "content": "q"},
                                    {"role": "assistant", "content": 1.5, "reasoning_content": True},
                                    {"role": "user", "content": "q2"},
                                    {"role": "assistant", "content": {"k": "it's", "n": [None, False, 2.0]}}])
    add_modes("tool_result_dict_content", [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [call("d", "f", "{}")]},
        {"role": "tool", "tool_call_id": "d", "content": {"status": "ok", "text": "say \"hi\"", "v": [1e-05, 3]}}])
    add_modes("user_content_null", [{"role": "user", "content": None}])
    add_modes("user_content_number", [{"role": "user", "content": 7}])
    # -- errors
    add_modes("unknown_role", [{"role": "robot", "content": "beep"}])
    add_modes("tool_call_missing_name", [{"role": "user", "content": "q"},
                                         {"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}])
    add_modes("tools_bad_format", [dict(SYS, tools=[{"name": "f"}]), {"role": "user", "content": "q"}])
    add_modes("message_not_object", [{"role": "user", "content": "q"}, "oops"])


def ds_vectors(v4dir):
    tests = os.path.join(v4dir, "tests")
    out = []
    for i, mode in [(1, "thinking"), (2, "thinking"), (3, "thinking"), (4, "chat")]:
        with open(os.path.join(tests, f"test_input_{i}.json"), encoding="utf-8") as f:
            td = json.load(f)
        if isinstance(td, dict):
            messages = td["messages"]
            messages[0]["tools"] = td["tools"]
        else:
            messages = td
        with open(os.path.join(tests, f"test_output_{i}.txt"), encoding="utf-8") as f:
            gold = f.read()
        out.append((f"deepseek_test_{i}", messages, {"thinking": mode == "thinking"}, gold))
    return out


def run_reference(mod, messages, opts):
    messages = copy.deepcopy(messages)
    for key in ("tools", "response_format"):
        if opts.get(key) is not None:
            messages[0][key] = copy.deepcopy(opts[key])
    try:
        return {"expected": mod.encode_messages(
            messages, thinking_mode="thinking" if opts.get("thinking", True) else "chat",
            context=copy.deepcopy(opts.get("context")), drop_thinking=opts.get("drop_thinking", True),
            add_default_bos_token=opts.get("add_default_bos_token", True),
            reasoning_effort=opts.get("reasoning_effort"))}
    except Exception as e:  # noqa: BLE001 - every rejection becomes an expected error
        return {"error": f"{type(e).__name__}: {e}"}


def full_options(opts):
    out = {"thinking": True, "reasoning_effort": None, "drop_thinking": True, "add_default_bos_token": True,
           "context": None, "tools": None, "response_format": None}
    out.update(opts)
    return out


def main():
    if os.environ.get("PYTHONHASHSEED") != "0":  # error texts print sets: make them deterministic
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable] + sys.argv)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--v4-ref", default=os.path.join(ROOT, ".ref/v4enc/encoding"))
    ap.add_argument("--v41-ref", default=os.path.join(ROOT, ".ref/v41enc"))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests/data/encoding"))
    args = ap.parse_args()

    v4 = load_module("ref_encoding_dsv4", os.path.join(args.v4_ref, "encoding_dsv4.py"))
    v41 = load_module("ref_encoding_v41", os.path.join(args.v41_ref, "encoding.py"))
    build_cases()
    vectors = ds_vectors(args.v4_ref)

    os.makedirs(args.out, exist_ok=True)
    for family, mod, ref_name in [("v4", v4, "encoding_dsv4.py"), ("v41", v41, "encoding/encoding.py")]:
        cases = []
        for name, messages, opts in [(n, m, o) for n, m, o, _ in vectors] + CASES:
            result = run_reference(mod, messages, opts)
            case = {"name": name, "messages": messages, "options": full_options(opts)}
            case.update(result)
            cases.append(case)
        if family == "v4":  # DeepSeek's own expected outputs must match the reference run
            for (name, _, _, gold), case in zip(vectors, cases):
                assert case.get("expected") == gold, f"{name}: reference output differs from DeepSeek's golden"
        doc = {"family": family, "reference": ref_name, "generator": "tools/encoding/make_goldens.py",
               "note": "expected: the reference's prompt string; error: the reference raised (type: message)",
               "cases": cases}
        path = os.path.join(args.out, f"{family}.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(doc, f, ensure_ascii=False, indent=1)
            f.write("\n")
        n_err = sum("error" in c for c in cases)
        print(f"{path}: {len(cases)} cases ({n_err} expected errors)")


if __name__ == "__main__":
    sys.exit(main())
