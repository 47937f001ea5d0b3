"""Soak test of `deepinfer serve`: many concurrent streaming clients for a bounded time, some of which
disconnect at random points; asserts no error responses, every completed stream well-formed, and the
server's RSS and open-fd count flat between a warm-up point and the end.

Skipped unless DEEPINFER_SOAK=1 (CI stays fast). Knobs (environment):

    DEEPINFER_SOAK_CLIENTS      concurrent clients (default 256)
    DEEPINFER_SOAK_SECONDS      measured load time after the warm-up (default 120)
    DEEPINFER_SOAK_WARMUP       warm-up load time (default max(10, SECONDS / 5))
    DEEPINFER_SOAK_DISCONNECT   probability that a request is abandoned by its client (default 0.2)
    DEEPINFER_SOAK_RSS_SLACK_MB allowed RSS growth (default 32, or 10% of the baseline if larger)

    DEEPINFER_SOAK=1 DEEPINFER_SOAK_CLIENTS=64 DEEPINFER_SOAK_SECONDS=30 \\
        python3 -m pytest -q -s tests/python/test_serve_soak.py
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(os.environ.get("DEEPINFER_SOAK") != "1",
                                reason="soak test: set DEEPINFER_SOAK=1 (see the module docstring)")

CLIENTS = int(os.environ.get("DEEPINFER_SOAK_CLIENTS", "256"))
SECONDS = float(os.environ.get("DEEPINFER_SOAK_SECONDS", "120"))
WARMUP = float(os.environ.get("DEEPINFER_SOAK_WARMUP", str(max(10.0, SECONDS / 5))))
P_DISCONNECT = float(os.environ.get("DEEPINFER_SOAK_DISCONNECT", "0.2"))
RSS_SLACK_MB = float(os.environ.get("DEEPINFER_SOAK_RSS_SLACK_MB", "32"))
MODEL = "tiny"
REQUEST_TIMEOUT = 300.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name) and not line.startswith("#"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


class Stats:
    def __init__(self):
        self.completed = self.disconnected = self.tokens = self.requests = 0
        self.errors: list[str] = []


PROMPTS = ["Hello there", "Write a haiku about the sea.", "Explain TCP slow start in one paragraph.",
           "List five prime numbers.", "word " * 40, "你好，请介绍一下你自己。"]


def make_body(rng: random.Random) -> tuple[str, dict]:
    max_tokens = rng.randint(1, 48)
    if rng.random() < 0.5:
        body = {"model": MODEL, "messages": [{"role": "user", "content": rng.choice(PROMPTS)}],
                "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True},
                "temperature": rng.choice([0, 0.7]), "thinking": {"type": rng.choice(["enabled", "disabled"])}}
        return "/v1/chat/completions", body
    prompt = rng.choice(PROMPTS) if rng.random() < 0.5 else [rng.randint(100, 1000) for _ in range(rng.randint(1, 64))]
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}, "temperature": 0.8, "seed": rng.randint(0, 2 ** 31)}
    return "/v1/completions", body


async def read_chunked(reader: asyncio.StreamReader):
    """Yields the chunks of a chunked HTTP body."""
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")
            return
        data = await reader.readexactly(size)
        assert await reader.readexactly(2) == b"\r\n"
        yield data


def validate(path: str, body: dict, events: list) -> tuple[int, str | None]:
    """Checks a completed stream; returns (completion tokens, error or None)."""
    if not events or events[-1] != "[DONE]" or events.count("[DONE]") != 1:
        return 0, "no single trailing [DONE]"
    chunks = events[:-1]
    if any("error" in c for c in chunks):
        return 0, f"error event {chunks}"
    finish = [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch.get("finish_reason")]
    if len(finish) != 1:
        return 0, f"finish reasons {finish}"
    usage = [c["usage"] for c in chunks if c.get("usage")]
    if len(usage) != 1 or chunks[-1].get("usage") is None:
        return 0, f"usage chunks {usage}"
    n = usage[0]["completion_tokens"]
    if n > body["max_tokens"] or (finish[0] == "length" and n != body["max_tokens"]):
        return 0, f"completion_tokens {n} vs max_tokens {body['max_tokens']} ({finish[0]})"
    if path == "/v1/completions" and (finish[0] != "length" or n != body["max_tokens"]):
        return 0, f"ignore_eos completion ended with {finish[0]} after {n}"
    return n, None


async def client(cid: int, port: int, stop: asyncio.Event, stats: Stats, seed: int):
    rng = random.Random(seed * 100003 + cid)
    conn = None
    while not stop.is_set():
        await asyncio.sleep(rng.random() * 0.05)
        path, body = make_body(rng)
        payload = json.dumps(body).encode()
        head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\nConnection: keep-alive\r\n\r\n").encode()
        # Where this request is abandoned: -2 mid-request, -1 before the response, k after k events.
        abandon = None
        if rng.random() < P_DISCONNECT:
            abandon = rng.choice([-2, -1] + list(range(0, 12)))
        stats.requests += 1
        try:
            if conn is None or rng.random() < 0.1:
                if conn is not None:
                    conn[1].close()
                conn = await asyncio.open_connection("127.0.0.1", port)
            reader, writer = conn
            if abandon == -2:
                writer.write(head + payload[: len(payload) // 2])
                await writer.drain()
                writer.transport.abort()
                conn = None
                stats.disconnected += 1
                continue
            writer.write(head + payload)
            await writer.drain()
            if abandon == -1:
                writer.transport.abort()
                conn = None
                stats.disconnected += 1
                continue

            async def read_response():
                status_line = await reader.readuntil(b"\r\n")
                status = int(status_line.split(b" ", 2)[1])
                headers = {}
                while True:
                    line = await reader.readuntil(b"\r\n")
                    if line == b"\r\n":
                        break
                    k, _, v = line.decode().partition(":")
                    headers[k.strip().lower()] = v.strip()
                if status != 200:
                    n = int(headers.get("content-length", "0"))
                    return status, (await reader.readexactly(n))[:300], None, headers
                buf, events = b"", []
                async for chunk in read_chunked(reader):
                    buf += chunk
                    while b"\n\n" in buf:
                        ev, buf = buf.split(b"\n\n", 1)
                        assert ev.startswith(b"data: "), ev[:100]
                        data = ev[6:]
                        events.append("[DONE]" if data == b"[DONE]" else json.loads(data))
                        if abandon is not None and len(events) > abandon:
                            return status, b"", None, headers
                return status, buf, events, headers

            status, rest, events, headers = await asyncio.wait_for(read_response(), REQUEST_TIMEOUT)
            if status != 200:
                stats.errors.append(f"HTTP {status}: {rest!r}")
                conn[1].close()
                conn = None
                continue
            if events is None:  # abandoned mid-stream
                writer.transport.abort() if rng.random() < 0.5 else writer.close()
                conn = None
                stats.disconnected += 1
                continue
            if rest.strip():
                stats.errors.append(f"trailing bytes after the last event: {rest[:100]!r}")
            n, err = validate(path, body, events)
            if err:
                stats.errors.append(err)
            else:
                stats.completed += 1
                stats.tokens += n
            if headers.get("connection", "").lower() == "close":
                writer.close()
                conn = None
        except asyncio.TimeoutError:
            stats.errors.append(f"request stalled for {REQUEST_TIMEOUT} s")
            conn = None
        except (OSError, asyncio.IncompleteReadError, ValueError, KeyError, AssertionError) as e:
            stats.errors.append(f"{type(e).__name__}: {e}")
            conn = None
    if conn is not None:
        conn[1].close()


async def load(port: int, seconds: float, stats: Stats, seed: int, on_tick=None):
    stop = asyncio.Event()
    tasks = [asyncio.create_task(client(i, port, stop, stats, seed)) for i in range(CLIENTS)]
    t_end = time.monotonic() + seconds
    while time.monotonic() < t_end:
        await asyncio.sleep(1.0)
        if on_tick:
            on_tick()
    stop.set()
    await asyncio.gather(*tasks)


def quiesce(port: int, pid: int, timeout: float = 60.0) -> tuple[int, int]:
    """Waits until the engine is idle and the fd count settles; returns (rss kB, fds)."""
    deadline = time.monotonic() + timeout
    last, same = None, 0
    while time.monotonic() < deadline:
        idle = metric(port, "deepinfer:num_requests_running") == 0 and metric(port, "deepinfer:num_requests_waiting") == 0
        fds = fd_count(pid)
        same = same + 1 if (idle and fds == last) else 0
        last = fds
        if same >= 5:
            break
        time.sleep(0.2)
    return rss_kb(pid), fd_count(pid)


def test_soak(deepinfer_bin, make_checkpoint):
    model = make_checkpoint("tiny", seed=0, family="v41")
    port = _free_port()
    env = dict(os.environ, OMP_WAIT_POLICY="passive")
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen([str(deepinfer_bin), "serve", "--model", str(model), "--port", str(port),
                             "--served-model-name", MODEL, "--max-model-len", "512", "--http-threads", "2",
                             "--max-num-seqs", "64"], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 60
        while True:
            assert proc.poll() is None and time.time() < deadline, "server did not start"
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                time.sleep(0.1)
        pid = proc.pid
        start = (rss_kb(pid), fd_count(pid))
        warm, main = Stats(), Stats()
        asyncio.run(load(port, WARMUP, warm, seed=1))
        base = quiesce(port, pid)
        peak = {"rss": base[0], "fds": base[1]}

        def tick():
            peak["rss"] = max(peak["rss"], rss_kb(pid))
            peak["fds"] = max(peak["fds"], fd_count(pid))

        t0 = time.monotonic()
        asyncio.run(load(port, SECONDS, main, seed=2, on_tick=tick))
        elapsed = time.monotonic() - t0
        end = quiesce(port, pid)
        aborts = metric(port, 'deepinfer:request_success_total{model_name="tiny",finished_reason="abort"}')
        report = {
            "clients": CLIENTS, "warmup_s": WARMUP, "seconds": round(elapsed, 1),
            "requests": main.requests, "completed": main.completed, "disconnected": main.disconnected,
            "errors": len(main.errors) + len(warm.errors), "tokens": main.tokens,
            "req_per_s": round(main.completed / elapsed, 1), "tok_per_s": round(main.tokens / elapsed, 1),
            "rss_mb": {"start": round(start[0] / 1024, 1), "warm": round(base[0] / 1024, 1),
                       "peak": round(peak["rss"] / 1024, 1), "end": round(end[0] / 1024, 1)},
            "fds": {"start": start[1], "warm": base[1], "peak": peak["fds"], "end": end[1]},
            "server_aborts_total": aborts,
        }
        print("\nsoak:", json.dumps(report))
        assert proc.poll() is None, "the server died"
        errors = warm.errors + main.errors
        assert not errors, f"{len(errors)} errors, first: {errors[:5]}"
        assert main.completed > 0 and (P_DISCONNECT == 0 or main.disconnected > 0)
        assert end[1] <= base[1] + 2, f"fd count grew: {base[1]} -> {end[1]}"
        slack_kb = max(RSS_SLACK_MB * 1024, 0.10 * base[0])
        assert end[0] <= base[0] + slack_kb, f"RSS grew: {base[0]} -> {end[0]} kB"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if os.environ.get("DEEPINFER_SOAK_LOG"):
            log.seek(0)
            Path(os.environ["DEEPINFER_SOAK_LOG"]).write_text(log.read())
