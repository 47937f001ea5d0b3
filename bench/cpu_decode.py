#!/usr/bin/env python3
"""CPU decode and prefill throughput of a generated checkpoint (default: the `small` preset).

Prints a table: prefill tokens/s, decode tokens/s, the weight bytes one decode token reads, the
bandwidth that implies, and its ratio to the anchor: host memory bandwidth measured in the same
run (a large numpy copy, bytes read + written). Decode of a batch of one is bound by reading the
active weights, so that ratio says how close decode is to the machine's roofline.

    python3 bench/cpu_decode.py [--preset small] [--prompt 256] [--decode 64] [--threads N]
"""
import argparse
import json
import os
import re
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def memory_bandwidth_gbs(n_bytes=512 << 20, reps=5):
    a = np.ones(n_bytes // 8)
    b = np.empty_like(a)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t)
    return 2 * n_bytes / best / 1e9


def active_weight_bytes(model_dir):
    """Bytes one decode token reads: everything but the routed experts, plus top-k of E experts
    per layer, minus the embedding table (one row is read)."""
    cfg = json.loads((model_dir / "config.json").read_text())
    sizes = {}
    for f in model_dir.glob("*.safetensors"):
        with open(f, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            hdr = json.loads(fh.read(n))
        for name, info in hdr.items():
            if name != "__metadata__":
                sizes[name] = info["data_offsets"][1] - info["data_offsets"][0]
    experts = sum(v for k, v in sizes.items() if ".ffn.experts." in k)
    other = sum(v for k, v in sizes.items() if ".ffn.experts." not in k and k != "embed.weight")
    frac = cfg["num_experts_per_tok"] / cfg["n_routed_experts"]
    return other + experts * frac, sum(sizes.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--decode", type=int, default=256)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--bin", default=str(ROOT / "build" / "src" / "deepinfer"))
    args = ap.parse_args()

    model = ROOT / "build" / "bench-models" / f"v4-{args.preset}-s{args.seed}"
    if not (model / "config.json").exists():
        subprocess.run([sys.executable, str(ROOT / "tools" / "make_checkpoint.py"), "--family", "v4", "--preset",
                        args.preset, "--seed", str(args.seed), "--out", str(model)], check=True)
    cfg = json.loads((model / "config.json").read_text())
    ids = np.random.default_rng(0).integers(3, cfg["vocab_size"], args.prompt).tolist()
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS=str(args.threads))
    rows = []
    for dtype, invariant in [("bfloat16", "1"), ("float32", "1"), ("bfloat16", "0")]:
        env["DEEPINFER_BATCH_INVARIANT"] = invariant
        r = subprocess.run([args.bin, "generate", "--model", str(model), "--prompt-ids", ",".join(map(str, ids)),
                            "--max-tokens", str(args.decode + 1), "--ignore-eos", "--dtype", dtype],
                           capture_output=True, text=True, env=env, check=True)
        m = re.search(r"prefill (\d+) tokens in ([\d.]+) s .*decode (\d+) tokens in ([\d.]+) s", r.stderr)
        pre_tps = int(m.group(1)) / float(m.group(2))
        dec_tps = int(m.group(3)) / float(m.group(4))
        rows.append((dtype + ("" if invariant == "1" else " BI=0"), pre_tps, dec_tps))
    bw = memory_bandwidth_gbs()
    active, total = active_weight_bytes(model)
    print(f"model {model.name}: {total / 1e6:.1f} MB of weights, {active / 1e6:.1f} MB read per decode token; "
          f"{args.threads} threads; prompt {args.prompt}, decode {args.decode}")
    print(f"anchor: host memory bandwidth (numpy copy, same run) = {bw:.2f} GB/s")
    print("BI=0: DEEPINFER_BATCH_INVARIANT=0 (prefill GEMMs through OpenBLAS sgemm; not batch-invariant)")
    print(f"{'activations':<16} {'prefill tok/s':>14} {'decode tok/s':>13} {'decode GB/s':>12} {'vs anchor':>10}")
    for dtype, p, d in rows:
        gbs = d * active / 1e9
        print(f"{dtype:<16} {p:>14.1f} {d:>13.2f} {gbs:>12.2f} {gbs / bw:>10.3f}")


if __name__ == "__main__":
    main()
