#!/usr/bin/env python3
"""Online serving benchmark of `deepinfer serve`, in the shape of `vllm bench serve`, with the offline
engine on the same workload as the anchor.

Random prompts (token ids, or text of random words) and output lengths, uniform in
[len * (1 - range_ratio), len * (1 + range_ratio)]; requests arrive as a Poisson process of
`--request-rate` per second (inf: all at once), at most `--max-concurrency` in flight. Each request is
a streamed /v1/completions call with ignore_eos (every request makes exactly its output length) and
greedy sampling. Printed: TTFT / TPOT / ITL mean, median and p99, request and token throughput; then
the offline engine (python deepinfer.LLM, the same prompts and SamplingParams, max_num_seqs =
min(server's, max concurrency)) and the server overhead per output token =
server time per output token - offline time per output token (duration / generated tokens each).

    PYTHONPATH=python python3 bench/serve.py --model build/test-models/v41-tiny-s0 \\
        --num-prompts 64 --input-len 128 --output-len 64 --request-rate inf --max-concurrency 16

The server is started from --server-bin (default build/src/deepinfer) on a free port, or give
--base-url to measure a running one (then the anchor is skipped unless --model is also given).
Raw asyncio streams: no HTTP client package needed.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parents[1]

WORDS = ("the of and to in is that for it as was with be by on not he this are or his from at which but have an "
         "they you were her she there been one all we their has would when if so no will can more time out up some "
         "model token engine stream cache batch kernel layer expert router weight tensor prompt decode").split()


@dataclass
class Req:
    prompt: object  # str or list[int]
    prompt_len: int
    output_len: int


@dataclass
class Result:
    ok: bool = False
    error: str = ""
    ttft: float = 0.0
    latency: float = 0.0
    itl: list = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int = 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * q / 100
    f = int(k)
    c = min(f + 1, len(xs) - 1)
    return xs[f] + (xs[c] - xs[f]) * (k - f)


def http_json(base: str, path: str, body: dict | None = None, key: str = "") -> dict:
    req = urllib.request.Request(base + path, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def make_workload(args, base: str, vocab: int) -> list[Req]:
    rng = random.Random(args.seed)

    def length(n):
        lo, hi = max(1, int(n * (1 - args.range_ratio))), max(1, int(n * (1 + args.range_ratio)))
        return rng.randint(lo, hi)

    reqs = []
    for _ in range(args.num_prompts):
        il, ol = length(args.input_len), length(args.output_len)
        if args.prompt_kind == "ids":
            reqs.append(Req([rng.randint(100, vocab - 1) for _ in range(il)], il, ol))
        else:
            text = " ".join(rng.choice(WORDS) for _ in range(il))
            # The server's tokenization (BOS added as /v1/completions does), so the anchor sees the same ids.
            ids = http_json(base, "/tokenize", {"prompt": text}, args.api_key)["tokens"]
            reqs.append(Req(text, len(ids), ol))
            reqs[-1].ids = ids
    return reqs


async def one(host: str, port: int, req: Req, args) -> Result:
    res = Result()
    body = {"model": args.served_model_name, "prompt": req.prompt, "max_tokens": req.output_len, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True, "temperature": 0}
    payload = json.dumps(body).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {args.api_key}\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n")
    t0 = time.perf_counter()
    try:
        reader, writer = await asyncio.open_connection(host, port, limit=1 << 24)
    except OSError as e:
        res.error = f"connect: {e}"
        return res
    try:
        writer.write(head.encode() + payload)
        await writer.drain()
        status = int((await reader.readuntil(b"\r\n")).split(b" ", 2)[1])
        while await reader.readuntil(b"\r\n") != b"\r\n":
            pass
        if status != 200:
            res.error = f"HTTP {status}: {(await reader.read(300))!r}"
            return res
        buf, last, done = b"", None, False
        while not done:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                break
            buf += await reader.readexactly(size)
            await reader.readexactly(2)  # the chunk's CRLF
            now = time.perf_counter()
            while b"\n\n" in buf:
                ev, buf = buf.split(b"\n\n", 1)
                ev = ev.strip(b"\r\n")
                if not ev.startswith(b"data: "):
                    continue
                data = ev[6:]
                if data == b"[DONE]":
                    done = True
                    break
                j = json.loads(data)
                if "error" in j:
                    res.error = j["error"].get("message", "error event")
                    return res
                if j.get("usage"):
                    res.output_tokens = j["usage"]["completion_tokens"]
                    res.prompt_tokens = j["usage"]["prompt_tokens"]
                if j.get("choices") and (j["choices"][0].get("text") or j["choices"][0].get("finish_reason")):
                    if last is None:
                        res.ttft = now - t0
                    else:
                        res.itl.append(now - last)
                    last = now
        res.latency = time.perf_counter() - t0
        res.ok = done and res.output_tokens == req.output_len
        if not res.ok and not res.error:
            res.error = f"incomplete stream ({res.output_tokens}/{req.output_len} tokens, [DONE]={done})"
    except (OSError, asyncio.IncompleteReadError, ValueError) as e:
        res.error = f"{type(e).__name__}: {e}"
    finally:
        writer.close()
    return res


async def run_load(host: str, port: int, reqs: list[Req], args) -> tuple[list[Result], float]:
    rng = random.Random(args.seed + 1)
    sem = asyncio.Semaphore(args.max_concurrency or len(reqs))

    async def limited(r):
        async with sem:
            return await one(host, port, r, args)

    tasks = []
    t0 = time.perf_counter()
    for r in reqs:
        tasks.append(asyncio.create_task(limited(r)))
        if args.request_rate != float("inf"):
            await asyncio.sleep(rng.expovariate(args.request_rate))
    results = await asyncio.gather(*tasks)
    return results, time.perf_counter() - t0


def offline(args, reqs: list[Req]) -> tuple[float, int]:
    sys.path.insert(0, str(ROOT / "python"))
    import deepinfer  # noqa: PLC0415

    seqs = min(args.max_num_seqs, args.max_concurrency or args.max_num_seqs)
    llm = deepinfer.LLM(model=args.model, max_model_len=args.max_model_len, max_num_seqs=seqs)
    prompts = [r.prompt if isinstance(r.prompt, list) else r.ids for r in reqs]
    params = [deepinfer.SamplingParams(temperature=0, max_tokens=r.output_len, ignore_eos=True) for r in reqs]
    llm.generate(prompts[:1], deepinfer.SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))  # warm-up
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    el = time.perf_counter() - t0
    return el, sum(len(o.outputs[0].token_ids) for o in outs)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="checkpoint directory (the server's --model and the anchor's)")
    ap.add_argument("--server-bin", default=os.environ.get("DEEPINFER_BIN", str(ROOT / "build" / "src" / "deepinfer")))
    ap.add_argument("--base-url", help="measure a running server instead of starting one")
    ap.add_argument("--served-model-name", default="bench")
    ap.add_argument("--api-key", default="")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--range-ratio", type=float, default=0.5)
    ap.add_argument("--prompt-kind", choices=["ids", "text"], default="ids")
    ap.add_argument("--request-rate", type=float, default=float("inf"))
    ap.add_argument("--max-concurrency", type=int, default=0, help="0: unlimited")
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--http-threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-anchor", action="store_true", help="skip the offline engine run")
    ap.add_argument("--result-json", help="write the numbers here")
    args = ap.parse_args()
    if not args.base_url and not args.model:
        ap.error("give --model (and the server is started) or --base-url")

    proc, log = None, None
    if args.base_url:
        base = args.base_url.rstrip("/")
    else:
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        log = tempfile.NamedTemporaryFile(mode="w+", prefix="deepinfer-serve-", suffix=".log", delete=False)
        cmd = [args.server_bin, "serve", "--model", args.model, "--port", str(port), "--served-model-name",
               args.served_model_name, "--max-model-len", str(args.max_model_len), "--max-num-seqs",
               str(args.max_num_seqs), "--http-threads", str(args.http_threads)]
        if args.api_key:
            cmd += ["--api-key", args.api_key]
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while True:
            if proc.poll() is not None or time.time() > deadline:
                log.seek(0)
                sys.exit(f"the server did not start:\n{log.read()}")
            try:
                urllib.request.urlopen(base + "/health", timeout=2)
                break
            except OSError:
                time.sleep(0.1)
    u = urlparse(base)
    host, port = u.hostname, u.port or 80
    try:
        models = http_json(base, "/v1/models", key=args.api_key)
        args.served_model_name = models["data"][0]["id"]
        # Random ids below 100000: inside the model and the tokenizer, clear of DeepSeek's special tokens.
        cfg = json.loads((Path(args.model) / "config.json").read_text()) if args.model else {}
        def find_vocab(d):
            if isinstance(d, dict):
                if isinstance(d.get("vocab_size"), int):
                    return d["vocab_size"]
                for v in d.values():
                    if (x := find_vocab(v)) is not None:
                        return x
            return None
        vocab = min(find_vocab(cfg) or 1000, 100000)
        reqs = make_workload(args, base, vocab)
        asyncio.run(run_load(host, port, reqs[:2], argparse.Namespace(**{**vars(args), "max_concurrency": 2})))
        results, dur = asyncio.run(run_load(host, port, reqs, args))
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()

    ok = [r for r in results if r.ok]
    bad = [r for r in results if not r.ok]
    out_toks = sum(r.output_tokens for r in ok)
    in_toks = sum(r.prompt_tokens for r in ok)
    ttft = [r.ttft * 1e3 for r in ok]
    tpot = [(r.latency - r.ttft) / (r.output_tokens - 1) * 1e3 for r in ok if r.output_tokens > 1]
    itl = [x * 1e3 for r in ok for x in r.itl]
    e2e = [r.latency * 1e3 for r in ok]
    rate = "inf" if args.request_rate == float("inf") else f"{args.request_rate:g}"
    res = {"successful": len(ok), "failed": len(bad), "duration_s": dur, "input_tokens": in_toks,
           "output_tokens": out_toks, "request_throughput": len(ok) / dur, "output_throughput": out_toks / dur,
           "total_throughput": (in_toks + out_toks) / dur}
    for name, xs in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2e)):
        res[f"mean_{name}_ms"] = statistics.fmean(xs) if xs else float("nan")
        res[f"median_{name}_ms"] = pct(xs, 50)
        res[f"p99_{name}_ms"] = pct(xs, 99)

    w = 50
    print(f"{' Serving Benchmark Result ':=^{w}}")
    print(f"{'Model:':<34}{Path(args.model).name if args.model else args.served_model_name}")
    print(f"{'Prompts / kind:':<34}{args.num_prompts} {args.prompt_kind}, in {args.input_len} out "
          f"{args.output_len} (range ratio {args.range_ratio})")
    print(f"{'Request rate / max concurrency:':<34}{rate} / {args.max_concurrency or 'unlimited'}")
    print(f"{'Successful requests:':<34}{len(ok)}")
    print(f"{'Failed requests:':<34}{len(bad)}")
    print(f"{'Benchmark duration (s):':<34}{dur:.2f}")
    print(f"{'Total input tokens:':<34}{in_toks}")
    print(f"{'Total generated tokens:':<34}{out_toks}")
    print(f"{'Request throughput (req/s):':<34}{res['request_throughput']:.2f}")
    print(f"{'Output token throughput (tok/s):':<34}{res['output_throughput']:.2f}")
    print(f"{'Total token throughput (tok/s):':<34}{res['total_throughput']:.2f}")
    for name, title in (("ttft", "Time to First Token"), ("tpot", "Time per Output Token (excl. 1st token)"),
                        ("itl", "Inter-token Latency"), ("e2el", "End-to-end Latency")):
        print(f"{title:-^{w}}")
        for stat in ("mean", "median", "p99"):
            print(f"{f'{stat.capitalize()} {name.upper()} (ms):':<34}{res[f'{stat}_{name}_ms']:.2f}")
    if bad:
        print(f"first failure: {bad[0].error}")

    if args.model and not args.no_anchor:
        el, n = offline(args, reqs)
        srv_tpt = dur / max(1, out_toks) * 1e3
        off_tpt = el / max(1, n) * 1e3
        res.update({"offline_duration_s": el, "offline_output_tokens": n, "offline_output_throughput": n / el,
                    "server_ms_per_output_token": srv_tpt, "offline_ms_per_output_token": off_tpt,
                    "server_overhead_ms_per_token": srv_tpt - off_tpt})
        print(f"{' Offline anchor (deepinfer.LLM, same workload) ':-^{w}}")
        print(f"{'Offline duration (s):':<34}{el:.2f}")
        print(f"{'Offline output throughput (tok/s):':<34}{n / el:.2f}")
        print(f"{'Server time per output token (ms):':<34}{srv_tpt:.3f}")
        print(f"{'Offline time per output token (ms):':<34}{off_tpt:.3f}")
        print(f"{'Server overhead per token (ms):':<34}{srv_tpt - off_tpt:.3f} "
              f"({100 * (srv_tpt - off_tpt) / off_tpt:+.1f}%)")
    print("=" * w)
    if args.result_json:
        Path(args.result_json).write_text(json.dumps(res, indent=2))
    if log is not None:
        os.unlink(log.name)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
