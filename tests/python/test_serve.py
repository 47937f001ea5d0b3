"""End-to-end tests of `deepinfer serve` (src/server): the OpenAI and Anthropic clients against a
server on a random-weight V4.1 checkpoint (gibberish text, but deterministic at temperature 0)."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import threading
import time

import pytest
from serve_helpers import Server

openai = pytest.importorskip("openai")

API_KEY = "test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def server(deepinfer_bin, make_checkpoint):
    srv = Server(deepinfer_bin, make_checkpoint("tiny", seed=0, family="v41"),
                 ["--api-key", API_KEY, "--max-request-body", "1M"], headers=AUTH)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key=API_KEY, max_retries=0, timeout=60)


MSGS = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Hello there"}]


def test_models_and_health(server, client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    status, _, body = server.request("GET", "/models")  # without /v1 too (DSH's "Fetch available models")
    assert status == 200 and json.loads(body)["data"][0]["id"] == "tiny"
    assert server.request("GET", "/health", headers={"Authorization": ""})[0] == 200


def test_chat_non_stream_and_usage(client):
    r = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=8, temperature=0)
    assert r.object == "chat.completion" and len(r.choices) == 1
    c = r.choices[0]
    assert c.finish_reason in ("length", "stop")
    assert r.usage.completion_tokens == 8 or c.finish_reason == "stop"
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    extra = r.usage.model_extra
    assert extra["prompt_cache_hit_tokens"] == 0 and extra["prompt_cache_miss_tokens"] == r.usage.prompt_tokens
    assert 0 <= r.usage.completion_tokens_details.reasoning_tokens <= r.usage.completion_tokens
    # Thinking is on by default: the gibberish lands in reasoning_content.
    assert (c.message.model_extra.get("reasoning_content") or "") + (c.message.content or "")


@pytest.mark.parametrize("thinking", ["enabled", "disabled"])
def test_chat_stream_equals_non_stream(client, thinking):
    kw = dict(model="tiny", messages=MSGS, max_tokens=12, temperature=0, extra_body={"thinking": {"type": thinking}})
    full = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    reasoning = "".join((ch.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
                        for ch in chunks if ch.choices)
    assert content == full.choices[0].message.content
    assert reasoning == (full.choices[0].message.model_extra.get("reasoning_content") or "")
    if thinking == "disabled":
        assert reasoning == "" and content
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finishes == [full.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens


def test_completions_stream_and_logprobs(client):
    kw = dict(model="tiny", prompt="The quick brown fox", max_tokens=6, temperature=0)
    full = client.completions.create(logprobs=2, **kw)
    assert full.usage.completion_tokens == 6 and full.choices[0].finish_reason == "length"
    lp = full.choices[0].logprobs
    assert len(lp.tokens) == 6 and len(lp.token_logprobs) == 6 and all(len(t) <= 2 for t in lp.top_logprobs)
    streamed = "".join(ch.choices[0].text for ch in client.completions.create(stream=True, **kw) if ch.choices)
    assert streamed == full.choices[0].text
    ids = client.completions.create(model="tiny", prompt=[0, 17, 42, 7], max_tokens=3, temperature=0)
    assert ids.usage.prompt_tokens == 4


def test_n_seed_and_stop(client):
    kw = dict(model="tiny", messages=MSGS, max_tokens=8, temperature=1.0, seed=1234,
              extra_body={"thinking": {"type": "disabled"}})
    a = client.chat.completions.create(n=2, **kw)
    b = client.chat.completions.create(n=2, **kw)
    assert [c.index for c in a.choices] == [0, 1]
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
    assert a.usage.completion_tokens == sum(1 for _ in range(2)) * 8 or any(c.finish_reason == "stop" for c in a.choices)
    # A stop string cut from the greedy text: the text ends right before it, streamed or not.
    g = client.completions.create(model="tiny", prompt="Once upon", max_tokens=10, temperature=0).choices[0].text
    stop = g[3:5] if len(g) >= 5 else None
    if stop and stop.strip():
        s = client.completions.create(model="tiny", prompt="Once upon", max_tokens=10, temperature=0, stop=[stop])
        assert s.choices[0].finish_reason == "stop" and s.choices[0].text == g[:g.index(stop)]
        streamed = "".join(ch.choices[0].text for ch in client.completions.create(
            model="tiny", prompt="Once upon", max_tokens=10, temperature=0, stop=[stop], stream=True) if ch.choices)
        assert streamed == s.choices[0].text


def _healthy_stream(server, out: dict):
    try:
        c = openai.OpenAI(base_url=server.base + "/v1", api_key=API_KEY, max_retries=0, timeout=60)
        chunks = list(c.chat.completions.create(model="tiny", messages=MSGS, max_tokens=48, temperature=0,
                                                stream=True))
        out["finish"] = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    except Exception as e:  # noqa: BLE001 - reported by the test
        out["error"] = repr(e)


BAD = [
    # (method, path, body, headers, status)
    ("POST", "/v1/chat/completions", "{not json", None, 400),
    ("POST", "/v1/chat/completions", "[1, 2]", None, 400),
    ("POST", "/v1/chat/completions", {"model": "tiny"}, None, 400),
    ("POST", "/v1/chat/completions", {"model": "tiny", "messages": []}, None, 400),
    ("POST", "/v1/chat/completions", {"model": "tiny", "messages": "hi"}, None, 400),
    ("POST", "/v1/chat/completions", {"model": "tiny", "messages": [{"content": "x"}]}, None, 400),
    ("POST", "/v1/chat/completions", {"model": "tiny", "messages": [{"role": "wizard", "content": "x"}]}, None, 400),
    ("POST", "/v1/chat/completions", {"model": "tiny", "messages": MSGS, "max_tokens": -1}, None, 400),
    ("POST", "/v1/chat/completions", {"model": "tiny", "messages": MSGS, "max_tokens": "10"}, None, 400),
    ("POST", "/v1/chat/completions", {"model": "tiny", "messages": MSGS, "temperature": "hot"}, None, 400),
    ("POST", "/v1/chat/completions", {"model": "tiny", "messages": MSGS, "top_p": 5}, None, 400),
    ("POST", "/v1/chat/completions", {"model": "tiny", "messages": MSGS, "n": 100000}, None, 400),
    ("POST", "/v1/chat/completions", {"model": "tiny", "messages": MSGS, "stream": "yes"}, None, 400),
    ("POST", "/v1/chat/completions", {"model": "tiny", "messages": MSGS, "thinking": {"type": "sometimes"}}, None, 400),
    ("POST", "/v1/chat/completions", {"model": "tiny", "messages": MSGS, "reasoning_effort": "extreme"}, None, 400),
    ("POST", "/v1/chat/completions", {"model": "tiny", "messages": MSGS, "stop": 7}, None, 400),
    ("POST", "/v1/chat/completions", {"model": "tiny", "messages": MSGS, "tools": "all"}, None, 400),
    ("POST", "/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "word " * 1100}]},
     None, 400),
    ("POST", "/v1/completions", {"model": "tiny", "prompt": [1, -5]}, None, 400),
    ("POST", "/v1/completions", {"model": "tiny", "prompt": [10 ** 9]}, None, 400),
    ("POST", "/v1/completions", {"model": "tiny", "prompt": {"a": 1}}, None, 400),
    ("POST", "/v1/completions", {"model": "tiny"}, None, 400),
    ("POST", "/v1/chat/completions", {"model": "nope", "messages": MSGS}, None, 404),
    ("POST", "/v1/chat/completions", {"model": "tiny", "messages": MSGS}, {"Authorization": "Bearer wrong"}, 401),
    ("POST", "/v1/chat/completions", {"model": "tiny", "messages": MSGS}, {"Authorization": ""}, 401),
    ("GET", "/v1/nowhere", None, None, 404),
    ("GET", "/v1/chat/completions", None, None, 405),
    ("POST", "/v1/models", "{}", None, 405),
    ("POST", "/v1/completions", "x" * (2 << 20), None, 413),
]


def test_malformed_requests_do_not_disturb_a_stream(server):
    healthy: dict = {}
    t = threading.Thread(target=_healthy_stream, args=(server, healthy))
    t.start()
    for method, path, body, headers, want in BAD:
        status, _, raw = server.request(method, path, body, headers)
        assert status == want, (method, path, str(body)[:80], status, raw[:300])
        err = json.loads(raw)["error"]
        assert isinstance(err["message"], str) and err["message"] and "type" in err and "code" in err and "param" in err
    t.join(60)
    assert "error" not in healthy, healthy.get("error")
    assert healthy["finish"] in (["length"], ["stop"])
    # The context overflow says so (DSH maps this to CONTEXT_WINDOW_EXCEEDED).
    status, _, raw = server.request("POST", "/v1/chat/completions",
                                    {"model": "tiny", "messages": [{"role": "user", "content": "word " * 1100}]})
    assert status == 400 and "maximum context length" in json.loads(raw)["error"]["message"]


def test_client_disconnect_mid_stream_aborts(server, client):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("POST", "/v1/chat/completions", body=json.dumps(
        {"model": "tiny", "messages": MSGS, "max_tokens": 400, "temperature": 0, "stream": True,
         "ignore_eos": True}),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"})
    r = conn.getresponse()
    assert r.status == 200
    r.fp.readline()  # the first event arrived: generation runs
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    # The aborted request leaves the engine: running drops to 0 long before 400 tokens could be made.
    deadline = time.time() + 20
    running = None
    while time.time() < deadline:
        metrics = server.request("GET", "/metrics")[2].decode()
        running = next(line for line in metrics.splitlines() if line.startswith("deepinfer:num_requests_running"))
        if running.endswith(" 0") and 'finished_reason="abort"' in metrics:
            break
        time.sleep(0.05)
    assert running.endswith(" 0") and 'finished_reason="abort"' in metrics
    r2 = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=4, temperature=0)
    assert r2.usage.completion_tokens == 4 or r2.choices[0].finish_reason == "stop"


def test_anthropic_messages(server):
    anthropic = pytest.importorskip("anthropic")
    c = anthropic.Anthropic(base_url=server.base, api_key=API_KEY, max_retries=0, timeout=60)
    kw = dict(model="tiny", max_tokens=10, messages=[{"role": "user", "content": "Hello"}], extra_body={"temperature": 0})
    full = c.messages.create(**kw)
    assert full.role == "assistant" and full.stop_reason in ("max_tokens", "end_turn")
    assert full.usage.output_tokens == 10 or full.stop_reason == "end_turn"
    with c.messages.stream(**kw) as s:
        final = s.get_final_message()
    assert [b.type for b in final.content] == [b.type for b in full.content]
    assert final.model_dump()["content"] == full.model_dump()["content"]
    off = c.messages.create(thinking={"type": "disabled"}, **kw)
    assert all(b.type == "text" for b in off.content)
    status, _, raw = server.request("POST", "/v1/messages", {"model": "tiny", "messages": []})
    assert status == 400 and json.loads(raw)["type"] == "error"


def test_tokenize_detokenize_metrics(server):
    status, _, raw = server.request("POST", "/tokenize", {"prompt": "hello world"})
    assert status == 200
    toks = json.loads(raw)["tokens"]
    assert json.loads(raw)["count"] == len(toks) > 0
    status, _, raw = server.request("POST", "/detokenize", {"tokens": toks})
    assert status == 200 and json.loads(raw)["prompt"].endswith("hello world")
    status, headers, raw = server.request("GET", "/metrics")
    text = raw.decode()
    assert status == 200 and "deepinfer:time_to_first_token_seconds_bucket" in text
    assert "deepinfer:generation_tokens_total" in text and "deepinfer:num_requests_waiting" in text


def test_sigterm_drains_and_exits_zero(deepinfer_bin, make_checkpoint):
    srv = Server(deepinfer_bin, make_checkpoint("tiny", seed=0, family="v41"), headers=AUTH)
    c = openai.OpenAI(base_url=srv.base + "/v1", api_key="none", max_retries=0, timeout=60)
    stream = c.completions.create(model="tiny", prompt="abc", max_tokens=64, temperature=0, stream=True,
                                  stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    it = iter(stream)
    next(it)  # the request is in flight
    srv.proc.send_signal(signal.SIGTERM)
    rest = list(it)
    assert rest[-1].usage.completion_tokens == 64  # drained, not cut off
    assert srv.proc.wait(timeout=30) == 0
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", srv.port), timeout=1).close()


def test_chat_tools_and_history(client):
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                                "parameters": {"type": "object", "properties": {
                                                    "city": {"type": "string"}}, "required": ["city"]}}}]
    plain = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=2, temperature=0)
    with_tools = client.chat.completions.create(model="tiny", messages=MSGS, tools=tools, max_tokens=2,
                                                temperature=0)
    assert with_tools.usage.prompt_tokens > plain.usage.prompt_tokens + 10  # the tool schema is in the prompt
    # A tool turn with reasoning passback (and one without reasoning_content: treated as empty), as DSH sends.
    history = [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": "need the tool",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"id": "call_2", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"city\": \"Lyon\"}"}}]},
        {"role": "tool", "tool_call_id": "call_2", "content": "(no output)"},
    ]
    r = client.chat.completions.create(model="tiny", messages=history, tools=tools, max_tokens=3, temperature=0,
                                       extra_body={"reasoning_effort": "max"})
    assert r.choices[0].finish_reason in ("length", "stop", "tool_calls")


# response_format is enforced by the structured-output engine (the official API only asks the model):
# a random-weight model at temperature 1 produces schema-valid JSON only because of the mask.
def test_response_format_is_enforced(client):
    import jsonschema
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 120}},
              "required": ["name", "age"], "additionalProperties": False}
    finished = 0
    for seed in range(4):
        r = client.chat.completions.create(
            model="tiny", messages=MSGS, max_tokens=60, temperature=1.0, seed=seed,
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}},
            extra_body={"thinking": {"type": "disabled"}})
        if r.choices[0].finish_reason == "stop":
            finished += 1
            jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    assert finished >= 2
    r = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=60, temperature=1.0, seed=7,
                                       response_format={"type": "json_object"},
                                       extra_body={"thinking": {"type": "disabled"}})
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=4,
                                       response_format={"type": "json_schema",
                                                        "json_schema": {"name": "x", "schema": {"type": "bogus"}}})
    assert "bogus" in str(e.value)


# Past --max-queued-requests the server answers 429 (OpenAI's rate-limit shape) instead of queueing
# without bound; the request in flight is not disturbed and capacity comes back when it ends.
def test_queue_full_is_429(deepinfer_bin, make_checkpoint):
    srv = Server(deepinfer_bin, make_checkpoint("tiny", seed=0, family="v41"),
                 ["--api-key", API_KEY, "--max-queued-requests", "1"], headers=AUTH)
    try:
        c = openai.OpenAI(base_url=srv.base + "/v1", api_key=API_KEY, max_retries=0, timeout=60)
        stream = c.chat.completions.create(model="tiny", messages=MSGS, max_tokens=200, temperature=0, stream=True,
                                           extra_body={"ignore_eos": True})
        first = next(iter(stream))  # the long request is in flight
        assert first.id
        status, _, body = srv.request("POST", "/v1/chat/completions",
                                      {"model": "tiny", "messages": MSGS, "max_tokens": 2})
        assert status == 429
        err = json.loads(body)["error"]
        assert err["code"] == "rate_limit_exceeded" and "max-queued-requests" in err["message"]
        text = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
        assert isinstance(text, str)
        r = c.chat.completions.create(model="tiny", messages=MSGS, max_tokens=2, temperature=0)
        assert r.choices[0].finish_reason in ("length", "stop")
    finally:
        assert srv.stop() == 0


# /v1/completions options: a list of prompts (choices prompt-major: index = prompt * n + child, as
# OpenAI and vLLM number them), echo (with prompt logprobs), best_of == n, return_token_ids.
def test_completions_prompt_lists(server, client):
    prompts = ["The quick brown", "Once upon a time"]
    kw = dict(model="tiny", max_tokens=5, temperature=1.0, seed=11, n=2)
    multi = client.completions.create(prompt=prompts, **kw)
    assert [c.index for c in multi.choices] == [0, 1, 2, 3]
    singles = [client.completions.create(prompt=p, **kw) for p in prompts]
    for k, s in enumerate(singles):
        for j in range(2):
            assert multi.choices[k * 2 + j].text == s.choices[j].text
    assert multi.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles)
    assert multi.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)
    # Streamed: the same texts per index, one finish per choice.
    texts: dict[int, str] = {}
    finishes = []
    for ch in client.completions.create(prompt=prompts, stream=True, **kw):
        for c in ch.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            if c.finish_reason:
                finishes.append(c.index)
    assert texts == {c.index: c.text for c in multi.choices} and sorted(finishes) == [0, 1, 2, 3]
    # Lists of token-id lists; a single id list is still one prompt.
    ids = client.completions.create(model="tiny", prompt=[[0, 17, 42], [0, 5, 6, 7]], max_tokens=2, temperature=0)
    assert ids.usage.prompt_tokens == 7 and len(ids.choices) == 2
    one = client.completions.create(model="tiny", prompt=[0, 17, 42], max_tokens=2, temperature=0)
    assert len(one.choices) == 1 and one.choices[0].text == ids.choices[0].text
    # best_of equal to n is accepted; anything else is a clear 400.
    assert len(client.completions.create(prompt="x", best_of=2, **kw).choices) == 2
    for body, param in [({"prompt": "x", "best_of": 3}, "best_of"), ({"prompt": "x", "n": 2, "best_of": 1}, "best_of"),
                        ({"prompt": []}, "prompt"), ({"prompt": [["a"]]}, "prompt"), ({"prompt": [1, "a"]}, "prompt"),
                        ({"prompt": ["a", "b", "c"], "n": 50}, "prompt"), ({"prompt": "x", "echo": "yes"}, "echo")]:
        status, _, raw = server.request("POST", "/v1/completions", {"model": "tiny", "max_tokens": 2, **body})
        err = json.loads(raw)["error"]
        assert status == 400 and err["param"] == param, (body, raw)
    status, _, raw = server.request("POST", "/v1/completions", {"model": "tiny", "prompt": "x", "best_of": 3})
    assert "best_of must equal n" in json.loads(raw)["error"]["message"]


def test_completions_echo_and_token_ids(server, client):
    prompt = "The quick brown fox"
    kw = dict(model="tiny", prompt=prompt, max_tokens=4, temperature=0)
    plain = client.completions.create(**kw)
    echo = client.completions.create(echo=True, logprobs=1, **kw)
    assert echo.choices[0].text == prompt + plain.choices[0].text
    n_prompt = echo.usage.prompt_tokens
    lp = echo.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == n_prompt + 4
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # nothing predicts the first token
    assert all(x <= 0 for x in lp.token_logprobs[1:]) and all(len(t) >= 1 for t in lp.top_logprobs[1:])
    assert lp.text_offset == sorted(lp.text_offset)
    streamed = "".join(c.text for ch in client.completions.create(echo=True, stream=True, **kw) for c in ch.choices)
    assert streamed == echo.choices[0].text
    # Token-id prompts echo their decoded text (special tokens skipped, as in the completion text).
    status, _, raw = server.request("POST", "/tokenize", {"prompt": prompt})
    toks = json.loads(raw)["tokens"]
    assert len(toks) == n_prompt
    r = client.completions.create(model="tiny", prompt=toks, max_tokens=4, temperature=0, echo=True)
    assert r.choices[0].text == prompt + plain.choices[0].text
    # vLLM's return_token_ids: the prompt's ids and the generated ones.
    status, _, raw = server.request("POST", "/v1/completions", {**kw, "return_token_ids": True})
    c = json.loads(raw)["choices"][0]
    assert c["prompt_token_ids"] == toks and len(c["token_ids"]) == 4


# FIM (/beta/completions): generated tokenizers have no FIM tokens, so this test gives a copy of the
# checkpoint three of them, on the ids of the tokenizer's last three BPE merges (the copy's weights are
# links to the original's; no token id or golden elsewhere changes).
FIM_TOKENS = ["<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"]


def _fim_checkpoint(src, dst) -> dict[str, int]:
    dst.mkdir()
    for p in src.iterdir():
        if p.name != "tokenizer.json":
            (dst / p.name).symlink_to(p.resolve())
    tj = json.loads((src / "tokenizer.json").read_text(encoding="utf-8"))
    vocab, merges = tj["model"]["vocab"], tj["model"]["merges"]
    ids = {}
    for tok in reversed(FIM_TOKENS):
        merged = "".join(merges.pop())  # the last merge made the highest id: nothing builds on it
        i = vocab.pop(merged)
        assert i == max(vocab.values()) + 1
        ids[tok] = i
        tj["added_tokens"].append({"id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
                                   "normalized": False, "special": True})
    tj["added_tokens"].sort(key=lambda t: t["id"])
    (dst / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False), encoding="utf-8")
    return ids


def test_fim(server, deepinfer_bin, make_checkpoint, tmp_path):
    body = {"model": "tiny", "prompt": "def add(a, b):\n", "suffix": "\n    return c\n", "max_tokens": 6,
            "temperature": 0}
    status, _, raw = server.request("POST", "/beta/completions", body)  # no FIM tokens in this tokenizer
    assert status == 400 and "fill-in-the-middle" in json.loads(raw)["error"]["message"]
    status, _, raw = server.request("POST", "/v1/completions", body)
    assert status == 400 and json.loads(raw)["error"]["param"] == "suffix"
    ids = _fim_checkpoint(make_checkpoint("tiny", seed=0, family="v41"), tmp_path / "fim")
    srv = Server(deepinfer_bin, tmp_path / "fim", headers=AUTH)
    try:
        def tok(text):
            status, _, raw = srv.request("POST", "/tokenize", {"prompt": text, "add_special_tokens": False})
            assert status == 200
            return json.loads(raw)["tokens"]
        assert [tok(t) for t in FIM_TOKENS] == [[ids[t]] for t in FIM_TOKENS]
        want = [0, ids[FIM_TOKENS[0]], *tok(body["prompt"]), ids[FIM_TOKENS[1]], *tok(body["suffix"]),
                ids[FIM_TOKENS[2]]]
        status, _, raw = srv.request("POST", "/beta/completions", {**body, "return_token_ids": True})
        assert status == 200, raw
        r = json.loads(raw)
        c = r["choices"][0]
        assert c["prompt_token_ids"] == want and r["usage"]["prompt_tokens"] == len(want)
        assert c["finish_reason"] in ("length", "stop") and len(c["token_ids"]) == r["usage"]["completion_tokens"] >= 1
        assert isinstance(c["text"], str)
        # Streaming gives the same text; the /v1 prefix and the OpenAI client's suffix work too.
        fim = openai.OpenAI(base_url=srv.base + "/beta", api_key="none", max_retries=0, timeout=60)
        streamed = "".join(ch.choices[0].text for ch in fim.completions.create(
            model="tiny", prompt=body["prompt"], suffix=body["suffix"], max_tokens=6, temperature=0, stream=True)
            if ch.choices)
        assert streamed == c["text"]
        for bad in [{"prompt": ["a", "b"]}, {"echo": True}]:
            status, _, raw = srv.request("POST", "/beta/completions", {**body, **bad})
            assert status == 400, bad
    finally:
        assert srv.stop() == 0
