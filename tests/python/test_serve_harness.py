"""DeepSeek Harness (DSH) against `deepinfer serve`: a replay of the harness's request flow on its
official route (deepinfer.md §4: raw fetch + SSE, OpenAI Chat Completions, always streaming, thinking
and tools in every request, reasoning_content passed back on assistant turns across tool turns, tool
results, the x-deepseek-harness-* headers, GET /models without /v1), checking every SSE chunk for the
fields DSH reads; then malformed requests (status + error shape) and slow-loris connections while a
healthy DSH stream runs. Random-weight V4.1 checkpoint: gibberish, deterministic at temperature 0.

The server runs with a short --header-timeout (2 s) so the slow-loris checks finish quickly.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import uuid

import pytest
from serve_helpers import Server

API_KEY = "dsh-key"
MODEL = "tiny"
MAX_MODEL_LEN = 1536
HEADER_TIMEOUT = 2.0
USER_ID = str(uuid.uuid4())
SESSION_ID = str(uuid.uuid4())
# What DSH's fetch sends on every call (llm-deepseek/src/serialize.ts + undici's defaults).
DSH_HEADERS = {
    "Authorization": f"Bearer {API_KEY}",
    "Content-Type": "application/json",
    "Accept": "text/event-stream",
    "Accept-Encoding": "gzip, deflate",
    "User-Agent": "deepseek-harness/0.4.2 (linux; node 22)",
    "x-deepseek-harness-user-id": USER_ID,
    "x-deepseek-harness-session-id": SESSION_ID,
}
TOOLS = [
    {"type": "function", "function": {"name": "read_file", "description": "Read a file of the workspace",
                                      "parameters": {"type": "object", "properties": {
                                          "path": {"type": "string", "description": "relative path"}},
                                                     "required": ["path"]}}},
    {"type": "function", "function": {"name": "bash", "description": "Run a shell command",
                                      "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                                                     "required": ["command"]}}},
]
SYSTEM = "You are DeepSeek Harness, a coding agent. Work in /repo."
FINISH_OK = {"stop", "length", "tool_calls"}  # anything else is an error for DSH


@pytest.fixture(scope="module")
def server(deepinfer_bin, make_checkpoint):
    srv = Server(deepinfer_bin, make_checkpoint("tiny", seed=0, family="v41"),
                 ["--api-key", API_KEY, "--header-timeout", str(HEADER_TIMEOUT), "--max-request-body", "1M"],
                 headers=DSH_HEADERS, served_model_name=MODEL, max_model_len=MAX_MODEL_LEN)
    yield srv
    srv.stop()


# ---- SSE as DSH reads it ---------------------------------------------------------------------------

def read_sse(resp: http.client.HTTPResponse) -> list:
    """The `data:` payloads of an SSE response, in order: dicts, then the string "[DONE]". Fails on a
    line DSH's parser would not take (every event is `data: <one JSON object>` + a blank line)."""
    events, data = [], None
    while True:
        line = resp.readline()
        if not line:
            break
        assert line.endswith(b"\n"), f"truncated SSE line {line[:200]!r}"
        line = line.rstrip(b"\r\n")
        if line == b"":
            if data is not None:
                events.append(data)
                data = None
            continue
        if line.startswith(b":"):  # a comment / keep-alive
            continue
        assert line.startswith(b"data: "), f"not an SSE data line: {line[:200]!r}"
        assert data is None, "an event with two data lines"
        payload = line[len(b"data: "):]
        if payload == b"[DONE]":
            data = "[DONE]"
        else:
            data = json.loads(payload.decode("utf-8"))  # strict UTF-8, one JSON value
            assert isinstance(data, dict), data
    assert data is None, "the stream ended inside an event"
    return events


def check_dsh_stream(events: list, n: int = 1) -> dict:
    """Checks the chunks the way DSH consumes them and returns what it would accumulate:
    {"reasoning", "content", "tool_calls", "finish_reason", "usage", "id"}."""
    assert events and events[-1] == "[DONE]", "no [DONE]: DSH reports STREAM_CLOSED"
    assert events.count("[DONE]") == 1
    chunks = events[:-1]
    assert chunks, "no chunk before [DONE]"
    ids = {c.get("id") for c in chunks}
    assert len(ids) == 1 and isinstance(next(iter(ids)), str), ids
    out = {"reasoning": "", "content": "", "tool_calls": {}, "finish_reason": None, "usage": None,
           "id": next(iter(ids))}
    usage_chunks = 0
    for c in chunks:
        assert "error" not in c, c
        assert c["object"] == "chat.completion.chunk" and c["model"] == MODEL, c
        assert isinstance(c["created"], int) and isinstance(c["choices"], list), c
        if c.get("usage") is not None:
            usage_chunks += 1
            out["usage"] = c["usage"]
        for ch in c["choices"]:
            assert ch["index"] == 0 or n > 1
            assert out["finish_reason"] is None, "a chunk after the finish chunk"
            d = ch["delta"]
            assert isinstance(d, dict), ch
            for k in ("content", "reasoning_content"):
                assert d.get(k) is None or isinstance(d[k], str), (k, d)
            out["content"] += d.get("content") or ""
            out["reasoning"] += d.get("reasoning_content") or ""
            for tc in d.get("tool_calls") or []:
                assert isinstance(tc["index"], int), tc
                acc = out["tool_calls"].setdefault(tc["index"], {"id": None, "name": "", "arguments": ""})
                if tc.get("id"):
                    acc["id"] = tc["id"]
                f = tc.get("function") or {}
                acc["name"] += f.get("name") or ""
                acc["arguments"] += f.get("arguments") or ""
            fr = ch.get("finish_reason")
            if fr is not None:
                assert fr in FINISH_OK, f"finish_reason {fr!r} is an error for DSH"
                out["finish_reason"] = fr
    assert out["finish_reason"] is not None, "no finish_reason"
    assert usage_chunks == 1, f"{usage_chunks} chunks carry usage"
    u = out["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], u
    assert u["prompt_cache_hit_tokens"] + u["prompt_cache_miss_tokens"] == u["prompt_tokens"], u
    assert u["prompt_tokens_details"]["cached_tokens"] == u["prompt_cache_hit_tokens"], u
    assert 0 <= u["completion_tokens_details"]["reasoning_tokens"] <= u["completion_tokens"], u
    if out["finish_reason"] == "tool_calls":
        assert out["tool_calls"] and all(t["id"] and t["name"] for t in out["tool_calls"].values())
    return out


def dsh_stream(server: Server, body: dict, headers: dict | None = None, conn=None, path="/chat/completions"):
    """One DSH call on the official route: POST {base}/chat/completions, SSE back."""
    own = conn is None
    conn = conn or http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    try:
        h = dict(DSH_HEADERS)
        h.update(headers or {})
        conn.request("POST", path, body=json.dumps(body), headers=h)
        r = conn.getresponse()
        assert r.status == 200, (r.status, r.read()[:500])
        assert r.getheader("Content-Type", "").startswith("text/event-stream")
        assert r.getheader("Content-Encoding") is None  # not compressed although gzip was offered
        assert r.getheader("x-request-id")  # DSH keeps it for error reports
        events = read_sse(r)
        return check_dsh_stream(events), r
    finally:
        if own:
            conn.close()


def dsh_body(messages, max_tokens=256000, effort="high", tools=TOOLS, **extra):
    """The request body of llm-deepseek's serialize.ts: no tool_choice, no JSON mode."""
    b = {"model": MODEL, "messages": messages, "stream": True, "stream_options": {"include_usage": True},
         "max_tokens": max_tokens, "temperature": 0}
    if effort == "off":
        b["thinking"] = {"type": "disabled"}
    else:
        b["thinking"] = {"type": "enabled"}
        b["reasoning_effort"] = effort
    if tools:
        b["tools"] = tools
    b.update(extra)
    return b


def assistant_turn(got: dict, fallback_call: dict) -> tuple[dict, list]:
    """The assistant message DSH appends after a streamed turn, and the tool calls to answer. The
    random model never calls a tool, so a call is made up when it did not (as if it had)."""
    calls = [{"id": t["id"], "type": "function", "function": {"name": t["name"], "arguments": t["arguments"]}}
             for _, t in sorted(got["tool_calls"].items())] or [fallback_call]
    msg = {"role": "assistant", "content": got["content"], "tool_calls": calls}
    if got["reasoning"]:  # passed back whenever non-empty; omitted when empty (the §4 gotcha)
        msg["reasoning_content"] = got["reasoning"]
    return msg, calls


def test_dsh_fetch_models(server):
    # "Fetch available models": GET {base}/models, the base URL without /v1.
    status, headers, raw = server.request("GET", "/models", headers={"Accept": "application/json",
                                                                      "Content-Type": None})
    assert status == 200 and headers["content-type"].startswith("application/json")
    body = json.loads(raw)
    assert body["object"] == "list" and [m["id"] for m in body["data"]] == [MODEL]
    assert all(m["object"] == "model" for m in body["data"])
    assert server.request("GET", "/models", headers={"Authorization": "Bearer nope"})[0] == 401


def test_dsh_agent_loop(server):
    """A DSH session: title call (thinking forced off), two agent steps with tool calls and
    reasoning passback (one with empty reasoning omitted), a new user turn, a compaction call."""
    def tok_len(msgs, effort="high"):  # the server's own rendering of the conversation
        return json.loads(server.request("POST", "/tokenize", {"model": MODEL, "messages": msgs, "tools": TOOLS,
                                                               "reasoning_effort": effort})[2])["count"]

    # 1. Title generation: thinking forced off, no tools.
    title, _ = dsh_stream(server, dsh_body([{"role": "user", "content": "Generate a short title for: fix the build"}],
                                           max_tokens=16, effort="off", tools=None))
    assert title["reasoning"] == "" and title["finish_reason"] in ("stop", "length")
    assert title["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0

    # 2. The agent loop, on one keep-alive connection as undici would.
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Why does `make` fail? Fix it."}]
    prompt_sizes, ids = [], set()
    fallback = [
        {"id": "call_00_read", "type": "function",
         "function": {"name": "read_file", "arguments": json.dumps({"path": "Makefile"})}},
        {"id": "call_01_bash", "type": "function", "function": {"name": "bash", "arguments": json.dumps(
            {"command": "make 2>&1 | tail -5"})}},
    ]
    results = ["all:\n\tcc -o app main.c\n", ""]
    for step in range(2):
        # DSH's per-model maxTokens is configurable; 24 keeps the test quick (the 256000 default is
        # checked in test_malformed_requests_beside_a_dsh_stream).
        effort = ["high", "max"][step]
        got, resp = dsh_stream(server, dsh_body(msgs, max_tokens=24, effort=effort), conn=conn)
        assert not resp.will_close  # keep-alive survives a stream
        ids.add(got["id"])
        assert got["usage"]["prompt_tokens"] == tok_len(msgs, effort)  # the rendered conversation, nothing else
        prompt_sizes.append(got["usage"]["prompt_tokens"])
        if got["finish_reason"] == "length":
            assert got["usage"]["completion_tokens"] == 24
        if step == 1:
            got["reasoning"] = ""  # as if the model had thought nothing: DSH then omits the field
        msg, calls = assistant_turn(got, fallback[step])
        msgs.append(msg)
        for c in calls:  # an empty tool result becomes "(no output)"
            msgs.append({"role": "tool", "tool_call_id": c["id"], "content": results[step] or "(no output)"})
    assert any("reasoning_content" in m for m in msgs if m["role"] == "assistant")
    assert any(m["role"] == "assistant" and "reasoning_content" not in m for m in msgs)
    # The reasoning passed back is in the prompt: each step's prompt grows by at least the previous turn.
    assert prompt_sizes == sorted(prompt_sizes) and len(set(prompt_sizes)) == 2

    # 3. The answer after the last tool result, then a new user turn (old reasoning may be dropped).
    final, _ = dsh_stream(server, dsh_body(msgs, max_tokens=24, effort="low"), conn=conn)
    assert final["usage"]["prompt_tokens"] == tok_len(msgs, "low") > prompt_sizes[-1]
    msgs.append({"role": "assistant", "content": final["content"] or "Done.",
                 **({"reasoning_content": final["reasoning"]} if final["reasoning"] else {})})
    msgs.append({"role": "user", "content": "Thanks. Now run the tests."})
    nxt, _ = dsh_stream(server, dsh_body(msgs, max_tokens=8, stop=["\n\n\n"]), conn=conn)
    assert nxt["usage"]["prompt_tokens"] == tok_len(msgs)
    ids.add(final["id"])
    ids.add(nxt["id"])
    assert len(ids) == 4  # a fresh id per call
    conn.close()

    # 4. Compaction: the x-deepseek-harness-compact header, a summary call over the transcript.
    compact = [{"role": "system", "content": "Summarize the conversation so far for a continuation."},
               {"role": "user", "content": json.dumps(msgs, ensure_ascii=False)[:600]}]
    got, _ = dsh_stream(server, dsh_body(compact, max_tokens=8, tools=None),
                        headers={"x-deepseek-harness-compact": "1"})
    assert got["finish_reason"] in FINISH_OK

    # 5. The same conversation through the pi-ai custom-provider route (openai-completions protocol
    # with default compat): system prompt as `developer`, max_completion_tokens, strict functions.
    pi_tools = [{"type": "function", "function": {**t["function"], "strict": False}} for t in TOOLS]
    pi_msgs = [{"role": "developer", "content": SYSTEM}] + msgs[1:4]
    body = {"model": MODEL, "messages": pi_msgs, "stream": True, "stream_options": {"include_usage": True},
            "max_completion_tokens": 8, "reasoning_effort": "medium", "tools": pi_tools, "temperature": 0}
    got, _ = dsh_stream(server, body, path="/v1/chat/completions")
    assert got["usage"]["completion_tokens"] <= 8


def test_dsh_stream_is_deterministic_and_matches_reasoning_split(server):
    """Temperature 0: the same DSH call twice gives the same reasoning/content split."""
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hello"}]
    a, _ = dsh_stream(server, dsh_body(msgs, max_tokens=12, tools=None))
    b, _ = dsh_stream(server, dsh_body(msgs, max_tokens=12, tools=None))
    assert (a["reasoning"], a["content"], a["finish_reason"]) == (b["reasoning"], b["content"], b["finish_reason"])
    assert a["usage"]["completion_tokens"] == b["usage"]["completion_tokens"]
    assert a["reasoning"] or a["content"]


# ---- malformed requests while a DSH stream runs -------------------------------------------------------

USER = [{"role": "user", "content": "hi"}]
GOOD = {"model": MODEL, "messages": USER, "max_tokens": 2}


def _chat(**kw):
    b = dict(GOOD)
    b.update(kw)
    return b


def _raw_http(port: int, data: bytes, timeout: float = 10.0) -> tuple[int, bytes]:
    """Sends raw bytes, returns (status, body) of the answer (the server closes after it)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        buf = b""
        while True:
            try:
                b = s.recv(65536)
            except ConnectionResetError:
                break
            if not b:
                break
            buf += b
    head, _, body = buf.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def _post_raw(body: bytes, content_type: str = "application/json", path: str = "/v1/chat/completions",
              extra: bytes = b"") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n").encode() + extra + b"\r\n" + body


BAD = [  # (name, method, path, body (dict | bytes | str), extra headers, status)
    ("invalid utf-8", "POST", "/chat/completions",
     b'{"model": "tiny", "messages": [{"role": "user", "content": "\xff\xfe\xc3"}]}', None, 400),
    ("form body", "POST", "/chat/completions", "model=tiny&messages=hi",
     {"Content-Type": "application/x-www-form-urlencoded"}, 400),
    ("multipart body", "POST", "/chat/completions",
     "--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\ntiny\r\n--b--\r\n",
     {"Content-Type": "multipart/form-data; boundary=b"}, 400),
    ("NaN literal", "POST", "/chat/completions", '{"model": "tiny", "messages": [], "temperature": NaN}', None, 400),
    ("legacy function role", "POST", "/chat/completions",
     _chat(messages=[{"role": "function", "name": "f", "content": "x"}]), None, 400),
    ("tool without tool_call_id", "POST", "/chat/completions",
     _chat(messages=USER + [{"role": "assistant", "content": "", "tool_calls": [
         {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
                            {"role": "tool", "content": "out"}]), None, 400),
    ("tool_call_id not a string", "POST", "/chat/completions",
     _chat(messages=USER + [{"role": "tool", "tool_call_id": 7, "content": "out"}]), None, 400),
    ("tool call without function", "POST", "/chat/completions",
     _chat(messages=USER + [{"role": "assistant", "content": "", "tool_calls": [{"id": "c1"}]}]), None, 400),
    ("reasoning_content a number", "POST", "/chat/completions",
     _chat(messages=USER + [{"role": "assistant", "content": "a", "reasoning_content": 5}, USER[0]]), None, 400),
    ("content a number", "POST", "/chat/completions", _chat(messages=[{"role": "user", "content": 5}]), None, 400),
    ("content part without type", "POST", "/chat/completions",
     _chat(messages=[{"role": "user", "content": [{"text": "x"}]}]), None, 400),
    ("messages null", "POST", "/chat/completions", _chat(messages=None), None, 400),
    ("negative temperature", "POST", "/chat/completions", _chat(temperature=-0.5), None, 400),
    ("top_p above 1", "POST", "/chat/completions", _chat(top_p=1.01), None, 400),
    ("top_p 0", "POST", "/chat/completions", _chat(top_p=0), None, 400),
    ("n 0", "POST", "/chat/completions", _chat(n=0), None, 400),
    ("top_logprobs 21", "POST", "/chat/completions", _chat(logprobs=True, top_logprobs=21), None, 400),
    ("max_tokens 0", "POST", "/chat/completions", _chat(max_tokens=0), None, 400),
    ("max_tokens vs max_completion_tokens", "POST", "/chat/completions",
     _chat(max_tokens=4, max_completion_tokens=5), None, 400),
    ("presence_penalty 3", "POST", "/chat/completions", _chat(presence_penalty=3), None, 400),
    ("negative seed", "POST", "/chat/completions", _chat(seed=-1), None, 400),
    ("empty stop string", "POST", "/chat/completions", _chat(stop=["a", ""]), None, 400),
    ("stream_options not an object", "POST", "/chat/completions", _chat(stream=True, stream_options=True), None, 400),
    ("thinking a string", "POST", "/chat/completions", _chat(thinking="enabled"), None, 400),
    ("tool without name", "POST", "/chat/completions",
     _chat(tools=[{"type": "function", "function": {"parameters": {}}}]), None, 400),
    ("tool_choice naming a function not in tools", "POST", "/chat/completions",
     _chat(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "rm_rf"}}), None, 400),
    ("tool_choice required without tools", "POST", "/chat/completions", _chat(tool_choice="required"), None, 400),
    ("reasoning_effort integer out of range", "POST", "/chat/completions", _chat(reasoning_effort=0), None, 400),
    ("POST /files (DSH vision upload)", "POST", "/files", "x", {"Content-Type": "application/octet-stream"}, 404),
    ("DELETE /models", "DELETE", "/models", None, None, 405),
]

ACCEPTED = [  # lenient on purpose: (name, body, extra headers)
    ("JSON sent as text/plain", _chat(), {"Content-Type": "text/plain"}),
    ("JSON sent as a form (curl -d)", _chat(), {"Content-Type": "application/x-www-form-urlencoded"}),
    ("no Content-Type", _chat(), {"Content-Type": None}),
    ("100 stop strings", _chat(stop=[f"zq{i}zq" for i in range(100)]), None),
    ("tool_choice required (enforced after the reasoning)", _chat(tools=TOOLS, tool_choice="required"), None),
    ("thinking as a boolean", _chat(thinking=False), None),
    ("tool result with no preceding call", _chat(messages=USER + [{"role": "tool", "tool_call_id": "x",
                                                                    "content": "(no output)"}]), None),
    ("unknown fields", _chat(frobnicate={"a": 1}, user="u1", metadata={"k": "v"}), None),
]


def _check_error(raw: bytes, what) -> dict:
    body = json.loads(raw)
    assert set(body) == {"error"}, (what, body)
    err = body["error"]
    assert isinstance(err["message"], str) and err["message"], (what, err)
    assert isinstance(err["type"], str) and err["type"], (what, err)
    assert "param" in err and "code" in err, (what, err)
    return err


class SlowLoris(threading.Thread):
    """Sends a request's head one byte every `gap` seconds and never finishes it; records when (and
    whether) the server closed the connection."""

    def __init__(self, port: int, gap: float = 0.1, idle: bool = False):
        super().__init__(daemon=True)
        self.port, self.gap, self.idle = port, gap, idle
        self.started = self.closed_after = None
        self.sent = 0

    def run(self):
        s = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        self.started = time.monotonic()
        head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"X-Padding: " + b"a" * 10000)
        try:
            if self.idle:
                s.settimeout(30)
                while s.recv(4096):
                    pass
            else:
                for i in range(len(head)):
                    s.sendall(head[i:i + 1])
                    self.sent += 1
                    time.sleep(self.gap)
                    s.setblocking(False)
                    try:
                        if s.recv(4096) == b"":
                            break
                    except BlockingIOError:
                        pass
                    finally:
                        s.setblocking(True)
        except OSError:
            pass
        self.closed_after = time.monotonic() - self.started
        s.close()


def test_malformed_requests_beside_a_dsh_stream(server):
    """Malformed requests and slow-loris connections, while a DSH first-turn stream with DSH's default
    max_tokens 256000 runs (cut to what the context leaves)."""
    healthy: dict = {}

    def run_healthy():
        try:
            msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Explain the repo layout."}]
            healthy["got"], _ = dsh_stream(server, dsh_body(msgs))
        except BaseException as e:  # noqa: BLE001 - reported below
            healthy["error"] = repr(e)

    loris = [SlowLoris(server.port, gap=0.1) for _ in range(3)] + [SlowLoris(server.port, idle=True)]
    for t in loris:
        t.start()
    th = threading.Thread(target=run_healthy)
    th.start()
    time.sleep(0.3)

    for name, method, path, body, headers, want in BAD:
        t0 = time.monotonic()
        status, h, raw = server.request(method, path, body, headers)
        assert status == want, (name, status, raw[:300])
        assert h["content-type"].startswith("application/json"), name
        err = _check_error(raw, name)
        if name == "tool without tool_call_id":
            assert "tool_call_id" in (err["param"] or "") + err["message"]
        assert time.monotonic() - t0 < 5, f"{name}: slow answer while slow-loris connections are open"
    for name, body, headers in ACCEPTED:
        status, _, raw = server.request("POST", "/chat/completions", body, headers)
        assert status == 200, (name, status, raw[:300])
        r = json.loads(raw)
        assert r["object"] == "chat.completion" and r["usage"]["completion_tokens"] <= 2, name

    # HTTP-level garbage: still an OpenAI-shaped JSON error.
    for name, data, want in [
        ("duplicate Content-Length", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
                                     b"Content-Length: 4\r\n\r\nabcd", 400),
        ("negative Content-Length", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
         400),
        ("not HTTP", b"HELLO THERE\r\n\r\n", 400),
        ("header over 64 KiB", b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n", 431),
        ("empty body", _post_raw(b""), 400),
    ]:
        status, raw = _raw_http(server.port, data)
        assert status == want, (name, status, raw[:200])
        _check_error(raw, name)
    # A chunked request body (undici streams bodies this way) is accepted.
    body = json.dumps(GOOD).encode()
    status, raw = _raw_http(server.port, (
        f"POST /chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}\r\n"
        f"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n{len(body):x}\r\n").encode() + body + b"\r\n0\r\n\r\n")
    assert status == 200 and json.loads(raw)["object"] == "chat.completion"

    # The slow-loris connections are cut after --header-timeout, not held for the body timeout.
    for t in loris:
        t.join(HEADER_TIMEOUT + 10)
        assert t.closed_after is not None, "a slow-loris connection is still open"
        assert HEADER_TIMEOUT - 0.5 <= t.closed_after <= HEADER_TIMEOUT + 3, t.closed_after
    assert all(t.sent < 100 for t in loris if not t.idle)  # closed long before the head could complete

    th.join(120)
    assert "error" not in healthy, healthy.get("error")
    got = healthy["got"]
    u = got["usage"]
    # max_tokens 256000 is cut to what the context leaves.
    assert got["finish_reason"] == "stop" or u["prompt_tokens"] + u["completion_tokens"] == MAX_MODEL_LEN, u
    # A context overflow says so: DSH maps it to CONTEXT_WINDOW_EXCEEDED.
    status, _, raw = server.request("POST", "/chat/completions",
                                    dsh_body([{"role": "user", "content": "word " * MAX_MODEL_LEN}]))
    assert status == 400 and "maximum context length" in _check_error(raw, "overflow")["message"]
    assert server.request("GET", "/health")[0] == 200
