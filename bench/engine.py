#!/usr/bin/env python3
"""Offline generation throughput against batch size, and where each engine step's time goes.

For each batch size B, B requests (prompt P tokens, G generated, ignore_eos, seeded sampling) go
through deepinfer.LLM.generate at once. The table gives generated tokens/s, the ratio to the
batch-1 row (the anchor, same run), and per step the time spent scheduling, in the model, in
sampling and in output processing: "overhead" = everything but the model.

    PYTHONPATH=python python3 bench/engine.py [--preset small] [--prompt 64] [--gen 32]
"""
import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
import numpy as np  # noqa: E402

import deepinfer  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--batches", default="1,2,4,8,16,32")
    args = ap.parse_args()
    model = ROOT / "build" / "bench-models" / f"v4-{args.preset}-s0"
    if not (model / "config.json").exists():
        subprocess.run([sys.executable, str(ROOT / "tools" / "make_checkpoint.py"), "--family", "v4", "--preset",
                        args.preset, "--seed", "0", "--out", str(model)], check=True)
    llm = deepinfer.LLM(model=str(model), max_model_len=4096, kv_cache_memory=2 << 30)
    vocab = llm._engine.vocab_size
    rng = np.random.default_rng(0)
    print(f"model {model.name}, prompt {args.prompt}, generate {args.gen}, threads {os.cpu_count()}")
    print(f"{'batch':>5} {'gen tok/s':>10} {'vs B=1':>7} {'steps':>6} {'ms/step':>8} {'model ms':>9} "
          f"{'sched ms':>9} {'sample ms':>10} {'output ms':>10} {'overhead':>9}")
    base = None
    for b in [int(x) for x in args.batches.split(",")]:
        prompts = [rng.integers(3, vocab, args.prompt).tolist() for _ in range(b)]
        params = deepinfer.SamplingParams(temperature=0.8, top_p=0.95, max_tokens=args.gen, ignore_eos=True, seed=1)
        llm._engine.reset_stats()
        t = time.perf_counter()
        outs = llm.generate(prompts, params)
        el = time.perf_counter() - t
        assert all(len(o.outputs[0].token_ids) == args.gen for o in outs)
        s = llm._engine.stats()
        tps = b * args.gen / el
        base = base or tps
        n = max(1, s["steps"])
        over = (s["schedule_s"] + s["sample_s"] + s["output_s"]) / max(1e-12, s["schedule_s"] + s["model_s"] +
                                                                        s["sample_s"] + s["output_s"])
        print(f"{b:>5} {tps:>10.1f} {tps / base:>7.2f} {s['steps']:>6} {1e3 * el / n:>8.2f} "
              f"{1e3 * s['model_s'] / n:>9.2f} {1e3 * s['schedule_s'] / n:>9.3f} {1e3 * s['sample_s'] / n:>10.3f} "
              f"{1e3 * s['output_s'] / n:>10.3f} {100 * over:>8.1f}%")


if __name__ == "__main__":
    main()
