#!/usr/bin/env python3
"""Reads a ktrace CSV (bench/ktrace/ktrace.c) and prints one decode step: each kernel's start offset, duration and the
idle gap before it (no kernel running on any stream), then the step's span, busy time and idle time, and the time per
kernel name. A step runs from one embedding_kernel to the next; --step -2 (default) takes the last complete one.

  python3 bench/ktrace/report.py trace.csv [--step -2] [--marker embedding_kernel] [--top 40] [--api] [--segments NAME]

--segments NAME: the step cut at every start of a kernel whose name contains NAME (e.g. 'fp8_walk_gemv<1, 1, 2>',
a V4.1 layer's first projection), each segment's span and the kernels that added most to it: an A / B of two traces
per layer. --api (a trace taken with KTRACE_API=1): the host's CUDA runtime calls inside the step too, each with its host start
offset and the host time since the previous call ended, so a GPU gap can be matched to what the host was doing.
"""
import argparse
import csv
import re
import shutil
import subprocess
from collections import defaultdict


def demangle(names):
    if not shutil.which("c++filt"):
        return {n: n for n in names}
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.split("\n")
    return dict(zip(names, out))


def short(name):
    """A demangled kernel name without namespaces, arguments or "void", cut to 48 characters. ncu's CSV writes an
    anonymous namespace as "unnamed>" ("void unnamed>::k<unnamed>::T, 8>(...)"), CUPTI's as "(anonymous namespace)"."""
    for ns in ("(anonymous namespace)::", "unnamed>::", "deepinfer::cuda::"):
        name = name.replace(ns, "")
    name = re.sub(r"\(.*", "", name)
    return name.replace("void ", "")[:48]


def load(path):
    """The trace's kernel and copy rows (start ns, end ns, stream, demangled name), sorted by start, and its host API
    rows (start ns, end ns, name) when it has them."""
    rows, api = [], []
    with open(path) as f:
        for r in csv.DictReader(f):
            if r["stream"] == "api":
                api.append((int(r["start_ns"]), int(r["end_ns"]), r["name"][4:]))
            else:
                rows.append((int(r["start_ns"]), int(r["end_ns"]), int(r["stream"]), r["name"]))
    rows.sort()
    api.sort()
    plain = demangle(sorted({r[3] for r in rows}))
    return [(s, e, st, plain[n]) for s, e, st, n in rows], api


def steps(rows, marker):
    """The index ranges [i0, i1) of the trace's steps: each from one launch whose name contains marker to the next (the
    last to the trace's end)."""
    marks = [i for i, r in enumerate(rows) if marker in r[3]]
    return [(m, marks[k + 1] if k + 1 < len(marks) else len(rows)) for k, m in enumerate(marks)]


def pick_step(rows, marker, step, path):
    """One step's rows: --step's index into steps() (-2, the default, is the last complete one)."""
    ranges = steps(rows, marker)
    if len(ranges) < 2:
        raise SystemExit(f"fewer than two {marker} launches in {path}")
    i0, i1 = ranges[step % len(ranges)]  # --step -1: the last marker to the trace's end (e.g. a prefill forward)
    return rows[i0:i1]


def busy_span(step):
    """(span, idle) of a step in ns: from its first start to its last end, and the time with no kernel on any stream."""
    t0 = step[0][0]
    busy_until, idle = t0, 0
    for s, e, _, _ in step:
        idle += max(0, s - busy_until)
        busy_until = max(busy_until, e)
    return busy_until - t0, idle


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--step", type=int, default=-2)
    ap.add_argument("--marker", default="embedding_kernel")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--quiet", action="store_true", help="only the summary and the per-name table")
    ap.add_argument("--api", action="store_true", help="list the host's runtime calls (KTRACE_API=1 traces)")
    ap.add_argument("--segments", default="", help="cut the step at each kernel whose name contains this")
    a = ap.parse_args()
    rows, api = load(a.csv)
    step = pick_step(rows, a.marker, a.step, a.csv)
    t0 = step[0][0]
    streams = {s: k for k, s in enumerate(sorted({r[2] for r in step}))}
    busy_until = t0
    idle = 0
    per = defaultdict(lambda: [0, 0.0])
    if not a.quiet:
        print(f"{'start us':>9} {'end us':>8} {'dur us':>7} {'gap us':>7} {'adds us':>7} s  kernel")
    segs = []  # [start ns, {kernel: adds ns}] per segment (--segments)
    for s, e, st, name in step:
        gap = max(0, s - busy_until)
        idle += gap
        adds = max(0, e - busy_until)  # how far this kernel pushed the step's end
        busy_until = max(busy_until, e)
        per[short(name)][0] += 1
        per[short(name)][1] += adds / 1e3
        if a.segments and (a.segments in name or not segs):
            segs.append([s if a.segments in name else t0, defaultdict(int)])
        if segs:
            segs[-1][1][short(name)] += adds
        if not a.quiet:
            print(f"{(s - t0) / 1e3:9.1f} {(e - t0) / 1e3:8.1f} {(e - s) / 1e3:7.1f} {gap / 1e3:7.1f} {adds / 1e3:7.1f} "
                  f"{streams[st]}  {short(name)}")
    if a.api:
        # The host's calls from the step's first kernel's start to its last kernel's end, with the host time between
        # one call's end and the next call's start ("host us": the host's own work, not the driver's).
        print(f"\n{'host start us':>13} {'call us':>8} {'host us':>8}  runtime call")
        prev_end = None
        for s, e, name in api:
            if s < t0 - 100_000 or s > busy_until:
                continue
            host = 0.0 if prev_end is None else max(0, s - prev_end) / 1e3
            prev_end = e
            print(f"{(s - t0) / 1e3:13.1f} {(e - s) / 1e3:8.1f} {host:8.1f}  {name}")
    if a.segments:
        print(f"\nsegments at '{a.segments}' (span: to the next segment's start, the last to the step's end)")
        for k, (s0, adds) in enumerate(segs):
            s1 = segs[k + 1][0] if k + 1 < len(segs) else busy_until
            top = ", ".join(f"{n} {v / 1e3:.1f}" for n, v in sorted(adds.items(), key=lambda kv: -kv[1])[:4])
            print(f"{k:3d} {(s0 - t0) / 1e3:9.1f} us  span {(s1 - s0) / 1e3:7.1f} us  ({top})")
    span = (busy_until - t0) / 1e3
    print(f"\nstep: {len(step)} kernels, span {span:.1f} us, idle (no kernel on any stream) {idle / 1e3:.1f} us, "
          f"busy {span - idle / 1e3:.1f} us")
    print(f"\n{'kernel':48s} {'calls':>5} {'adds us':>9}  (adds: how far the kernel moved the step's end)")
    for name, (n, t) in sorted(per.items(), key=lambda kv: -kv[1][1])[: a.top]:
        print(f"{name:48s} {n:5d} {t:9.1f}")


if __name__ == "__main__":
    main()
