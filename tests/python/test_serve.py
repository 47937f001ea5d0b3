"""End-to-end tests of `deepinfer serve` (src/server): the OpenAI and Anthropic clients against a
server on a random-weight V4.1 checkpoint (gibberish text, but deterministic at temperature 0)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")

API_KEY = "test-key"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, binary: Path, model: Path, extra: list[str] | None = None):
        self.port = _free_port()
        self.model = model
        env = dict(os.environ, OMP_WAIT_POLICY="passive", DEEPINFER_NUM_THREADS="1")
        cmd = [str(binary), "serve", "--model", str(model), "--port", str(self.port), "--served-model-name", "tiny",
               "--max-model-len", "1024", "--http-threads", "2", *(extra or [])]
        self.log = tempfile.TemporaryFile(mode="w+")  # not a pipe: a full pipe would block the server
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT, text=True)
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log.read()}")
            try:
                status, _, _ = self.request("GET", "/health")
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        self.proc.kill()
        raise RuntimeError("server did not become healthy in 60 s")

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def request(self, method: str, path: str, body: bytes | str | dict | None = None,
                headers: dict | None = None, timeout: float = 30) -> tuple[int, dict, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            if isinstance(body, dict):
                body = json.dumps(body)
            h = {"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"}
            h.update(headers or {})
            conn.request(method, path, body=body, headers=h)
            r = conn.getresponse()
            return r.status, dict(r.getheaders()), r.read()
        finally:
            conn.close()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture(scope="module")
def server(deepinfer_bin, make_checkpoint):
    srv = Server(deepinfer_bin, make_checkpoint("tiny", seed=0, family="v41"), ["--api-key", API_KEY, "--max-request-body", "1M"])
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
    srv = Server(deepinfer_bin, make_checkpoint("tiny", seed=0, family="v41"))
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
                 ["--api-key", API_KEY, "--max-queued-requests", "1"])
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
