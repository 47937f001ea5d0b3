#!/usr/bin/env python3
"""Offline throughput and latency of deepinfer on one workload.

    python examples/benchmark.py --model DIR [--num-prompts 32] [--input-len 64] [--output-len 32]
                                 [--batch-size 8] [--concurrency-sweep 1,4,16]

Random token-id prompts of --input-len tokens, --output-len generated tokens each (ignore_eos, so
every request generates exactly that many). For each batch size (the engine's max_num_seqs) it
prints requests/s and output tokens/s, and the ratio to the first (smallest) batch size measured
in the same run. Run from the repository root after `make build`
(PYTHONPATH=python); `deepinfer bench` is the same measurement from the CLI.
"""
import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
import deepinfer  # noqa: E402


def run(model: str, prompts, output_len: int, max_num_seqs: int):
    llm = deepinfer.LLM(model=model, max_num_seqs=max_num_seqs, max_model_len=len(prompts[0]) + output_len + 8)
    params = deepinfer.SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    llm.generate(prompts[:1], params)  # warm-up (page-in of the weights)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - t0
    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
    return elapsed, n_out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(ROOT / "models" / "mini-v41"))
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--concurrency-sweep", default="1,4,16", help="comma-separated max_num_seqs values")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if not (Path(args.model) / "config.json").exists():
        sys.exit(f"no model at {args.model}; pass --model")
    cfg = json.loads((Path(args.model) / "config.json").read_text())
    vocab = (cfg.get("text_config") or cfg)["vocab_size"]
    rng = np.random.default_rng(args.seed)
    prompts = [rng.integers(3, vocab, args.input_len).tolist() for _ in range(args.num_prompts)]
    print(f"model {args.model}: {args.num_prompts} prompts x {args.input_len} tokens -> {args.output_len} tokens")
    print(f"{'max_num_seqs':>12} {'req/s':>8} {'out tok/s':>10} {'s total':>8} {'vs first':>9}")
    base = None
    for b in [int(x) for x in args.concurrency_sweep.split(",")]:
        elapsed, n_out = run(args.model, prompts, args.output_len, b)
        tps = n_out / elapsed
        base = base or tps
        print(f"{b:>12} {args.num_prompts / elapsed:>8.2f} {tps:>10.1f} {elapsed:>8.2f} {tps / base:>8.2f}x")


if __name__ == "__main__":
    main()
