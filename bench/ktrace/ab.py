#!/usr/bin/env python3
"""A / B of two builds or switches from ktrace CSVs (bench/ktrace/ktrace.c) instead of wall-clock runs: for each trace,
one decode step's kernel count, span and busy time (time with a kernel on some stream) and, for each --between pair,
the time from the end of every kernel whose name contains FROM to the end of the next one containing TO (e.g. a MoE
sublayer: 'hc_expand_kernel' to 'moe_combine_expand'); then the means of A and B and B - A with a 95% interval (Welch's
t). Why: on a machine whose runs vary by several percent between calls (bench/RESULTS.md, fifty-second and fifty-third
sessions), the GPU's own time per step, taken from traces alternated A, B, A, B, ..., shows a change of a few
microseconds that ab_model.py's tokens/s cannot tell from noise; the host's share of the noise is not in it.

  python3 bench/ktrace/ab.py --a A1.csv A2.csv ... --b B1.csv B2.csv ... [--step -2] [--marker embedding_kernel]
                             [--between FROM TO ...]

Take each trace as report.py does: CUDA_INJECTION64_PATH=libktrace.so KTRACE_OUT=F bench_cuda_model CKPT --batches 1
--context 128 --steps 6 --prefill 0 --queued. Each --between pair gives one value per trace: the mean over the step's
occurrences (each layer's), with every occurrence listed.
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from report import busy_span, load, pick_step  # noqa: E402
from welch import interval  # noqa: E402


def between(step, start, end):
    """us from the end of each kernel whose name contains start to the end of the next kernel whose name contains end."""
    out = []
    for i, (_, e0, _, name) in enumerate(step):
        if start in name:
            nxt = next((r for r in step[i + 1:] if end in r[3]), None)
            if nxt is not None:
                out.append((nxt[1] - e0) / 1e3)
    return out


def measure(path, a):
    rows, _ = load(path)
    step = pick_step(rows, a.marker, a.step, path)
    span, idle = busy_span(step)
    m = {"kernels": float(len(step)), "span us": span / 1e3, "busy us": (span - idle) / 1e3}
    each = {}
    for f, t in a.pairs:
        vals = between(step, f, t)
        if not vals:
            raise SystemExit(f"ktrace ab: no '{f}' followed by '{t}' in the step of {path}")
        m[f"{f} -> {t}"] = statistics.mean(vals)
        each[f"{f} -> {t}"] = vals
    return m, each


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", nargs="+", required=True, help="the A traces")
    ap.add_argument("--b", nargs="+", required=True, help="the B traces")
    ap.add_argument("--step", type=int, default=-2, help="which step of each trace (report.py's --step)")
    ap.add_argument("--marker", default="embedding_kernel")
    ap.add_argument("--between", nargs="+", default=[], metavar="NAME",
                    help="FROM TO pairs: us from each FROM kernel's end to the next TO kernel's end")
    a = ap.parse_args()
    if len(a.between) % 2:
        raise SystemExit("ktrace ab: --between takes FROM TO pairs")
    if len(a.a) < 2 or len(a.b) < 2:
        raise SystemExit("ktrace ab: at least two traces on each side")
    a.pairs = list(zip(a.between[::2], a.between[1::2]))
    res = {"A": [measure(p, a) for p in a.a], "B": [measure(p, a) for p in a.b]}
    keys = list(res["A"][0][0])
    for side, paths in (("A", a.a), ("B", a.b)):
        for p, (m, each) in zip(paths, res[side]):
            cells = ", ".join(f"{k} {v:.1f}" for k, v in m.items())
            print(f"{side} {os.path.basename(p)}: {cells}")
            for k, vals in each.items():
                print(f"    {k}: " + " / ".join(f"{v:.1f}" for v in vals))
    print(f"\n{'measure':40s} {'A mean':>9} {'B mean':>9} {'B - A':>8}  95% interval")
    for k in keys:
        va = [m[k] for m, _ in res["A"]]
        vb = [m[k] for m, _ in res["B"]]
        d, h = interval(va, vb)
        ma = statistics.mean(va)
        pct = f" ({100 * d / ma:+.2f}%)" if ma else ""
        print(f"{k:40s} {ma:9.1f} {statistics.mean(vb):9.1f} {d:+8.1f}  [{d - h:+.1f}, {d + h:+.1f}]{pct}")


if __name__ == "__main__":
    main()
