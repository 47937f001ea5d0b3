"""tool_choice "required" / a named function (OpenAI) and {"type": "any"} / {"type": "tool"} (Anthropic)
against `deepinfer serve`: the structured-output engine forces a DSML tool-call block of the allowed
tools (src/structured/dsml_tools.cpp). A random-weight checkpoint at temperature 1.0 produces a
well-formed call whose arguments validate against the tool's schema only because of the grammar."""

from __future__ import annotations

import json

import pytest
from serve_helpers import Server

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

API_KEY = "tools-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
# Bounded schemas (maxLength, enums, integer ranges, maxItems) so that a random model's calls end.
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 10},
    "days": {"type": "integer", "minimum": 1, "maximum": 7},
    "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "days"], "additionalProperties": False}
ALARM = {"type": "object", "properties": {
    "time": {"type": "string", "pattern": "[0-2][0-9]:[0-5][0-9]"},
    "repeat": {"type": "boolean"},
    "tags": {"type": "array", "items": {"enum": ["work", "home"]}, "maxItems": 3},
    "at": {"type": "object", "properties": {"room": {"enum": ["kitchen", "hall"]}, "floor": {"type": "integer",
           "minimum": 0, "maximum": 3}}, "required": ["room", "floor"], "additionalProperties": False}},
    "required": ["time", "tags", "at"], "additionalProperties": False}
SCHEMAS = {"get_weather": WEATHER, "set_alarm": ALARM}
TOOLS = [{"type": "function", "function": {"name": n, "description": f"the {n} tool", "parameters": s}}
         for n, s in SCHEMAS.items()]
MSGS = [{"role": "user", "content": "What should I do?"}]
OFF = {"thinking": {"type": "disabled"}}
SEEDS = range(3)


@pytest.fixture(scope="module", params=["v41", "v4"])
def server(request, deepinfer_bin, make_checkpoint):
    srv = Server(deepinfer_bin, make_checkpoint("tiny", seed=0, family=request.param), ["--api-key", API_KEY],
                 headers=AUTH, max_model_len=4096)
    srv.family = request.param
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key=API_KEY, max_retries=0, timeout=300)


def check_call(name: str, arguments: str | dict, allowed: set[str]) -> None:
    assert name in allowed, name
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    jsonschema.validate(args, SCHEMAS[name])


@pytest.mark.parametrize("choice", ["required", "named"])
def test_openai_tool_choice(client, choice):
    if choice == "required":
        tool_choice, allowed = "required", set(SCHEMAS)
    else:
        tool_choice, allowed = {"type": "function", "function": {"name": "set_alarm"}}, {"set_alarm"}
    kw = dict(model="tiny", messages=MSGS, tools=TOOLS, tool_choice=tool_choice, max_tokens=900, temperature=1.0,
              parallel_tool_calls=False, extra_body=OFF)
    for seed in SEEDS:
        r = client.chat.completions.create(seed=seed, **kw)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls", (seed, c)
        assert len(c.message.tool_calls) == 1 and not c.message.content
        call = c.message.tool_calls[0]
        assert call.type == "function" and call.id
        check_call(call.function.name, call.function.arguments, allowed)
        # Streamed: the same call (same seed), delivered as a tool_calls delta.
        chunks = list(client.chat.completions.create(seed=seed, stream=True, **kw))
        deltas = [tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
        assert [(d.index, d.function.name, d.function.arguments) for d in deltas] == \
            [(0, call.function.name, call.function.arguments)]
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == ""
        assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == \
            ["tool_calls"]


def test_openai_parallel_required(client):
    # Several calls may follow one another; whatever completed validates (a long run may hit max_tokens).
    total = 0
    for seed in SEEDS:
        r = client.chat.completions.create(model="tiny", messages=MSGS, tools=TOOLS, tool_choice="required",
                                           max_tokens=900, temperature=1.0, seed=seed, extra_body=OFF)
        c = r.choices[0]
        assert c.finish_reason in ("tool_calls", "length") and c.message.tool_calls
        for call in c.message.tool_calls:
            check_call(call.function.name, call.function.arguments, set(SCHEMAS))
        total += len(c.message.tool_calls)
    assert total >= len(SEEDS)


def test_anthropic_tool_choice(server):
    anthropic = pytest.importorskip("anthropic")
    c = anthropic.Anthropic(base_url=server.base, api_key=API_KEY, max_retries=0, timeout=300)
    tools = [{"name": n, "description": f"the {n} tool", "input_schema": s} for n, s in SCHEMAS.items()]
    for tool_choice, allowed in [({"type": "any", "disable_parallel_tool_use": True}, set(SCHEMAS)),
                                 ({"type": "tool", "name": "get_weather"}, {"get_weather"})]:
        for seed in SEEDS[:2]:
            kw = dict(model="tiny", max_tokens=900, messages=[{"role": "user", "content": "Hello"}], tools=tools,
                      tool_choice=tool_choice, thinking={"type": "disabled"},
                      extra_body={"temperature": 1.0, "seed": seed})
            full = c.messages.create(**kw)
            assert full.stop_reason == "tool_use", full
            uses = [b for b in full.content if b.type == "tool_use"]
            assert len(uses) == 1 and all(b.type == "tool_use" for b in full.content)
            check_call(uses[0].name, uses[0].input, allowed)
            with c.messages.stream(**kw) as s:
                final = s.get_final_message()
            assert [(b.type, b.name, b.input) for b in final.content] == [(b.type, b.name, b.input) for b in uses]
            assert final.stop_reason == "tool_use"


def test_invalid_tool_choice(server, client):
    bad = [
        ({"type": "function", "function": {"name": "launch_rocket"}}, TOOLS, "launch_rocket"),
        ("required", None, "tools"),
        ("sometimes", TOOLS, "sometimes"),
        ({"type": "function"}, TOOLS, "tool_choice"),
    ]
    for tool_choice, tools, word in bad:
        body = {"model": "tiny", "messages": MSGS, "tool_choice": tool_choice, "max_tokens": 4}
        if tools is not None:
            body["tools"] = tools
        status, _, raw = server.request("POST", "/v1/chat/completions", body)
        assert status == 400, (tool_choice, raw)
        err = json.loads(raw)["error"]
        assert err["type"] == "invalid_request_error" and err["param"] == "tool_choice" and word in err["message"]
        assert "code" in err
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=MSGS, tools=TOOLS, max_tokens=4,
                                       tool_choice={"type": "function", "function": {"name": "nope"}})
    # A tool schema the grammar cannot take is a 400 naming the keyword, before any generation.
    weird = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"not": {"type": "string"}}}}}}]
    status, _, raw = server.request("POST", "/v1/chat/completions", {"model": "tiny", "messages": MSGS,
                                                                     "tools": weird, "tool_choice": "required",
                                                                     "stream": True})
    assert status == 400 and "'not'" in json.loads(raw)["error"]["message"]
    # Both tool_choice and response_format constrain the output: refused.
    status, _, raw = server.request("POST", "/v1/chat/completions", {
        "model": "tiny", "messages": MSGS, "tools": TOOLS, "tool_choice": "required",
        "response_format": {"type": "json_object"}})
    assert status == 400 and json.loads(raw)["error"]["param"] == "tool_choice"
    # Anthropic: its own error shape.
    status, _, raw = server.request("POST", "/v1/messages", {
        "model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"name": "a", "input_schema": {"type": "object"}}], "tool_choice": {"type": "tool", "name": "b"}})
    assert status == 400
    j = json.loads(raw)
    assert j["type"] == "error" and "'b'" in j["error"]["message"]
