#!/usr/bin/env python3
"""A / B of two bench_cuda_model binaries on one checkpoint: runs them alternately (A, B, A, B, ...) so that drift of the
machine hits both alike, parses each run's decode row, and prints every run, the means, the sample standard deviations
and the difference of B against A with a 95% interval (Welch's t). Why: runs of one binary vary by about 1% between
calls on the H200 (bench/RESULTS.md, nineteenth session), so a change of a few microseconds a step needs several pairs
before it can be told from noise.

  python3 bench/ab_model.py A_BIN B_BIN CKPT_DIR [--pairs 6] [--batch 1] [--steps 32] [--context 128] [-- extra args]

Exits 2 when a binary gives no decode row (no GPU: bench_cuda_model prints SKIP).
"""
import argparse
import statistics
import subprocess
import sys

from welch import interval


def run(binary, a):
    cmd = [binary, a.ckpt, "--batches", str(a.batch), "--steps", str(a.steps), "--context", str(a.context),
           "--prefill", "0"] + a.extra
    out = subprocess.run(cmd, capture_output=True, text=True).stdout
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 5 and cells[0] == str(a.batch) and cells[1] == str(a.context):
            return float(cells[2]), float(cells[3])  # ms per step, tokens/s per sequence
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a_bin")
    ap.add_argument("b_bin")
    ap.add_argument("ckpt")
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("extra", nargs="*", help="after --: more bench_cuda_model arguments for both")
    a = ap.parse_args()
    if a.pairs < 2:
        raise SystemExit("ab_model: --pairs must be at least 2")
    tps = {"A": [], "B": []}
    for i in range(a.pairs):
        for name, binary in (("A", a.a_bin), ("B", a.b_bin)):
            r = run(binary, a)
            if r is None:
                print(f"ab_model: {binary} gave no decode row for batch {a.batch} (no GPU?)")
                sys.exit(2)
            tps[name].append(r[1])
            print(f"pair {i + 1} {name}: {r[0]:.3f} ms / step, {r[1]:.1f} tokens/s per sequence", flush=True)
    ma, mb = statistics.mean(tps["A"]), statistics.mean(tps["B"])
    sa, sb = statistics.stdev(tps["A"]), statistics.stdev(tps["B"])
    na = len(tps["A"])
    d, h = interval(tps["A"], tps["B"])
    print(f"\nA {ma:.1f} tokens/s (sd {sa:.1f}), B {mb:.1f} (sd {sb:.1f}), n = {na} each")
    print(f"B - A = {d:+.1f} tokens/s ({100 * d / ma:+.2f}%), 95% interval [{d - h:+.1f}, {d + h:+.1f}]"
          f" ({'differs' if abs(d) > h else 'not distinguishable from noise'})")


if __name__ == "__main__":
    main()
