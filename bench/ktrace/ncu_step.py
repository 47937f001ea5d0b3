#!/usr/bin/env python3
"""One decode step's kernels from an Nsight Compute CSV: each kernel alone (ncu replays it serialised, caches flushed),
its time, the DRAM bytes it read, issue-slot and warp occupancy, registers and launch shape, then the time and bytes
per kernel name. Why beside report.py (CUPTI start / end in the running step): ncu's numbers say what a kernel costs by
itself and why (bytes against time, issue slots against warps), which the overlapped step hides; the difference
between the two is what concurrency and launch overlap give or take.

Take the CSV with (bench_cuda_model at batch 1; skip the load and prefill, keep a few steps):
  ncu --clock-control none --csv --launch-skip 200 --launch-count 420 --metrics \\
    gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,\\
smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,\\
launch__registers_per_thread,smsp__inst_executed.sum \\
    bench_cuda_model CKPT --batches 1 --context 128 --steps 6 --prefill 0 --queued > step.csv
then
  python3 bench/ktrace/ncu_step.py step.csv [--step -2] [--marker embedding_kernel] [--quiet] [--stalls N]

--print-metrics prints that --metrics list with the stall metrics added (bench/gpu_call.sh's ncu step uses it).
--stalls N: where the CSV also holds the warp-stall metrics (STALL_METRICS below, added to --metrics), a third table
for the N kernel names of most time: for each, the stall reasons that hold its warps most, as warps stalled for that
reason per issued instruction (ncu's smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio), averaged over
the name's calls weighted by their time. Why: the decode GEMVs issue in half their cycles or less (bench/RESULTS.md,
fifty-eighth session), and which wait holds them (a global load: long_scoreboard; shared memory or ldmatrix:
short_scoreboard; a fixed-latency dependency: wait; a full pipe: math_pipe_throttle / mio_throttle) says which change
could help.

A step runs from one launch of the marker kernel to the next; --step -2 (default) takes the last complete one; --all
takes every kernel of the CSV instead (for ncu runs filtered by -k, which hold no marker).
--quiet prints the per-name table only.
"""
import argparse
import csv
import os
import sys
from collections import OrderedDict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import short  # noqa: E402

TIME = "gpu__time_duration.sum"
BYTES = "dram__bytes_read.sum"
OPTIONAL = [
    ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "dram%"),
    ("smsp__issue_active.avg.pct_of_peak_sustained_active", "issue%"),
    ("sm__warps_active.avg.pct_of_peak_sustained_active", "warps%"),
    ("launch__registers_per_thread", "regs"),
]

STALL_PREFIX = "smsp__average_warps_issue_stalled_"
STALL_SUFFIX = "_per_issue_active.ratio"
STALL_REASONS = ["long_scoreboard", "short_scoreboard", "wait", "math_pipe_throttle", "mio_throttle", "lg_throttle",
                 "barrier", "membar", "not_selected", "selected", "dispatch_stall", "no_instruction", "branch_resolving",
                 "drain", "sleeping", "tex_throttle", "imc_miss", "misc"]
STALL_METRICS = ",".join(STALL_PREFIX + r + STALL_SUFFIX for r in STALL_REASONS)


def load(path):
    """Kernels in launch order: {name, grid, block, metric name: value} (ncu's long CSV: one row per metric)."""
    with open(path, newline="") as f:
        lines = f.read().splitlines()
    # ncu writes its own messages before the table; the table starts at the header row.
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"') or line.startswith("ID,")), None)
    if start is None:
        sys.exit(f"ncu_step: {path} holds no ncu CSV table (no ID header row)")
    kernels = OrderedDict()
    for row in csv.DictReader(lines[start:]):
        if not row.get("ID") or row.get("Metric Name") is None:
            continue
        k = kernels.setdefault(int(row["ID"]), {"name": row["Kernel Name"], "grid": row.get("Grid Size", ""),
                                                "block": row.get("Block Size", "")})
        k[row["Metric Name"]] = row["Metric Value"].replace(",", "")
    if not kernels:
        sys.exit(f"ncu_step: {path} holds no kernels")
    missing = [m for m in (TIME, BYTES) if m not in next(iter(kernels.values()))]
    if missing:
        sys.exit(f"ncu_step: {path} lacks the metric(s) {', '.join(missing)} (see --help for the command)")
    return list(kernels.values())


def pick_step(kernels, marker, step):
    starts = [i for i, k in enumerate(kernels) if marker in k["name"]]
    if len(starts) < 2:
        sys.exit(f"ncu_step: fewer than two {marker} launches in the CSV, so no complete step")
    i = step if step >= 0 else len(starts) + step  # as report.py: -2 is the last marker but one, the last whole step
    if not 0 <= i < len(starts) - 1:
        sys.exit(f"ncu_step: step {step} out of range ({len(starts) - 1} complete steps)")
    return kernels[starts[i]:starts[i + 1]]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", nargs="?")
    ap.add_argument("--step", type=int, default=-2)
    ap.add_argument("--marker", default="embedding_kernel")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--all", action="store_true",
                    help="every kernel of the CSV as one step (a CSV of ncu -k filtered kernels has no marker)")
    ap.add_argument("--stalls", type=int, default=0, metavar="N")
    ap.add_argument("--print-metrics", action="store_true",
                    help="print the --metrics list for ncu (the columns above and the stall reasons) and exit")
    a = ap.parse_args()
    if a.print_metrics:
        print(",".join([TIME, BYTES] + [m for m, _ in OPTIONAL] + ["smsp__inst_executed.sum", STALL_METRICS]))
        return
    if a.csv is None:
        ap.error("the CSV is required")
    step = load(a.csv) if a.all else pick_step(load(a.csv), a.marker, a.step)
    per_name = OrderedDict()
    total_us = total_mb = 0.0
    if not a.quiet:
        print(f"{'kernel':48s} {'us':>8s} {'read MB':>8s} " + " ".join(f"{h:>7s}" for _, h in OPTIONAL) +
              "  grid x block")
    for k in step:
        us = float(k[TIME]) / 1e3
        mb = float(k[BYTES]) / 1e6
        total_us += us
        total_mb += mb
        s = per_name.setdefault(short(k["name"]), [0, 0.0, 0.0])
        s[0] += 1
        s[1] += us
        s[2] += mb
        if not a.quiet:
            extra = " ".join(f"{float(k[m]):7.1f}" if m in k else f"{'-':>7s}" for m, _ in OPTIONAL)
            print(f"{short(k['name']):48s} {us:8.2f} {mb:8.2f} {extra}  {k['grid']} x {k['block']}")
    print(f"step: {len(step)} kernels, {total_us:.1f} us of kernel time one by one, {total_mb:.1f} MB read from DRAM")
    print(f"{'kernel':48s} {'calls':>5s} {'us':>9s} {'MB':>9s} {'GB/s':>7s}")
    for name, (n, us, mb) in sorted(per_name.items(), key=lambda kv: -kv[1][1]):
        print(f"{name:48s} {n:5d} {us:9.1f} {mb:9.1f} {mb / us * 1e3 if us > 0 else 0.0:7.0f}")
    if a.stalls > 0:
        print_stalls(step, a.stalls)


def stall_table(step):
    """{short name: (us, {reason: time-weighted mean of warps stalled per issued instruction})} over the step's
    kernels that carry stall metrics."""
    table = OrderedDict()
    for k in step:
        reasons = {m[len(STALL_PREFIX):-len(STALL_SUFFIX)]: float(v) for m, v in k.items()
                   if m.startswith(STALL_PREFIX) and m.endswith(STALL_SUFFIX)}
        if not reasons:
            continue
        us = float(k[TIME]) / 1e3
        t = table.setdefault(short(k["name"]), [0.0, {}])
        t[0] += us
        for r, v in reasons.items():
            t[1][r] = t[1].get(r, 0.0) + v * us
    return OrderedDict((n, (us, {r: w / us if us > 0 else 0.0 for r, w in ws.items()}))
                       for n, (us, ws) in table.items())


def print_stalls(step, top):
    table = stall_table(step)
    if not table:
        sys.exit("ncu_step: --stalls: the CSV holds no smsp__average_warps_issue_stalled_* metrics (add STALL_METRICS "
                 "of this file to ncu's --metrics)")
    print(f"stalls (warps stalled per issued instruction, by reason; the {top} kernel names of most time):")
    print(f"{'kernel':48s} {'us':>8s} {'total':>6s}  top reasons")
    for name, (us, reasons) in sorted(table.items(), key=lambda kv: -kv[1][0])[:top]:
        # "selected" is the issuing warp itself (1 per instruction): not a wait, so left out of the total.
        waits = {r: v for r, v in reasons.items() if r != "selected"}
        ranked = sorted(waits.items(), key=lambda rv: -rv[1])[:4]
        print(f"{name:48s} {us:8.1f} {sum(waits.values()):6.2f}  " + ", ".join(f"{r} {v:.2f}" for r, v in ranked))


if __name__ == "__main__":
    main()
