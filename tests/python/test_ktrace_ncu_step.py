"""Tests of bench/ktrace/ncu_step.py (one decode step's kernels from an Nsight Compute CSV): the step's bounds, the
per-name sums and the clear errors, on a synthetic CSV in ncu's long format (one row per metric) whose answers are
known.

Run: python3 -m pytest -q tests/python/test_ktrace_ncu_step.py
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "bench", "ktrace", "ncu_step.py")

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def rows(kid, name, ns, read_bytes, regs=32):
    out = []
    for metric, unit, value in (("gpu__time_duration.sum", "nsecond", ns), ("dram__bytes_read.sum", "byte", read_bytes),
                                ("launch__registers_per_thread", "register/thread", regs)):
        out.append(f'"{kid}","1","bench","host","{name}","1","7","(128, 1, 1)","(4, 1, 1)","0","9.0","Command line '
                   f'profiler metrics","{metric}","{unit}","{value:,}"')
    return out


# Two complete steps (embedding_kernel starts each), then the start of a third. Step 0: embedding 2 us, two gemv
# calls of 10 and 20 us reading 30 and 50 MB, a norm of 3 us. Step 1: embedding 2 us, one gemv of 40 us, one k of 1 us.
CSV = "\n".join(["==PROF== Connected to process 1", "model: 4 layers", HEADER] +
                rows(0, "embedding_kernel(int)", 2000, 1000) +
                rows(1, "void unnamed>::gemv<1>(Params)", 10000, 30_000_000) +
                rows(2, "void (anonymous namespace)::gemv<1>(Params)", 20000, 50_000_000, regs=128) +
                rows(3, "norm_kernel(const float *)", 3000, 0) +
                rows(4, "embedding_kernel(int)", 2000, 1000) +
                rows(5, "unnamed>::gemv<1>(Params)", 40000, 80_000_000) +
                rows(6, "void unnamed>::k<unnamed>::Runs, 8>(Params)", 1000, 0) +
                rows(7, "embedding_kernel(int)", 2000, 1000)) + "\n"


def run_tool(tmp_path, text, *args):
    path = tmp_path / "step.csv"
    path.write_text(text)
    return subprocess.run([sys.executable, TOOL, str(path), *args], capture_output=True, text=True, timeout=60)


def per_name(out):
    return {m.group(1).strip(): (int(m.group(2)), float(m.group(3)), float(m.group(4)))
            for m in re.finditer(r"^(\S.*?)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+\d+$", out, re.M)}


def test_first_step_sums_per_name(tmp_path):
    out = run_tool(tmp_path, CSV, "--step", "0")
    assert out.returncode == 0, out.stderr
    assert "step: 4 kernels, 35.0 us of kernel time one by one, 80.0 MB read from DRAM" in out.stdout
    table = per_name(out.stdout)
    assert table["gemv<1>"] == (2, 30.0, 80.0)
    assert table["norm_kernel"] == (1, 3.0, 0.0)
    assert " 128.0 " in out.stdout  # the second gemv's registers, in its own row


def test_default_is_the_last_complete_step(tmp_path):
    out = run_tool(tmp_path, CSV, "--quiet")
    assert out.returncode == 0, out.stderr
    assert "step: 3 kernels, 43.0 us of kernel time one by one, 80.0 MB read from DRAM" in out.stdout
    table = per_name(out.stdout)
    assert table["gemv<1>"] == (1, 40.0, 80.0)  # ncu's "unnamed>::" dropped, the template's "<" kept
    assert table["k<Runs, 8>"] == (1, 1.0, 0.0)


def test_errors_are_clear(tmp_path):
    out = run_tool(tmp_path, "no table here\n")
    assert out.returncode != 0 and "no ncu CSV table" in out.stderr
    one_step = "\n".join([HEADER] + rows(0, "embedding_kernel(int)", 2000, 0) + rows(1, "k(int)", 1000, 0)) + "\n"
    out = run_tool(tmp_path, one_step)
    assert out.returncode != 0 and "fewer than two embedding_kernel launches" in out.stderr
    no_time = "\n".join([HEADER, rows(0, "embedding_kernel(int)", 2000, 0)[1]]) + "\n"
    out = run_tool(tmp_path, no_time)
    assert out.returncode != 0 and "lacks the metric(s) gpu__time_duration.sum" in out.stderr
    out = run_tool(tmp_path, CSV, "--step", "5")
    assert out.returncode != 0 and "out of range" in out.stderr


def stall_rows(kid, name, reasons):
    return [f'"{kid}","1","bench","host","{name}","1","7","(128, 1, 1)","(4, 1, 1)","0","9.0","Command line profiler '
            f'metrics","smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio","","{v}"' for r, v in reasons]


def test_stalls_are_time_weighted_per_name(tmp_path):
    # Step 0's two gemv calls (10 and 20 us): long_scoreboard 1.0 and 4.0 -> (10 + 80) / 30 = 3.0; wait 2.0 and 0.5 ->
    # (20 + 10) / 30 = 1.0; selected (the issuing warp, 1.0) is not a wait and stays out of the total.
    lines = CSV.splitlines()
    extra = (stall_rows(1, "void unnamed>::gemv<1>(Params)", [("long_scoreboard", 1.0), ("wait", 2.0), ("selected", 1)]) +
             stall_rows(2, "void (anonymous namespace)::gemv<1>(Params)",
                        [("long_scoreboard", 4.0), ("wait", 0.5), ("selected", 1)]) +
             stall_rows(3, "norm_kernel(const float *)", [("barrier", 0.25)]))
    out = run_tool(tmp_path, "\n".join(lines + extra) + "\n", "--step", "0", "--quiet", "--stalls", "5")
    assert out.returncode == 0, out.stderr
    gemv = next(line for line in out.stdout.splitlines() if line.startswith("gemv<1>") and "long_scoreboard" in line)
    assert re.search(r"30\.0\s+4\.00\s+long_scoreboard 3\.00, wait 1\.00$", gemv), gemv
    norm = next(line for line in out.stdout.splitlines() if line.startswith("norm_kernel") and "barrier" in line)
    assert re.search(r"3\.0\s+0\.25\s+barrier 0\.25$", norm), norm
    lines_after = out.stdout.split("stalls (")[1].splitlines()
    assert lines_after[2].startswith("gemv<1>") and lines_after[3].startswith("norm_kernel")  # by time


def test_stalls_without_the_metrics_and_the_metrics_list(tmp_path):
    out = run_tool(tmp_path, CSV, "--stalls", "3")
    assert out.returncode != 0 and "holds no smsp__average_warps_issue_stalled_" in out.stderr
    out = subprocess.run([sys.executable, TOOL, "--print-metrics"], capture_output=True, text=True, timeout=60)
    metrics = out.stdout.strip().split(",")
    assert out.returncode == 0 and metrics[:2] == ["gpu__time_duration.sum", "dram__bytes_read.sum"]
    assert "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio" in metrics
    assert len(metrics) == len(set(metrics)) == 25
    out = subprocess.run([sys.executable, TOOL], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "the CSV is required" in out.stderr


def test_all_takes_every_kernel_without_markers(tmp_path):
    out = run_tool(tmp_path, CSV, "--all", "--quiet")
    assert out.returncode == 0, out.stderr
    assert "step: 8 kernels, 80.0 us of kernel time one by one, 160.0 MB read from DRAM" in out.stdout
    no_marker = "\n".join([HEADER] + rows(0, "k(int)", 1000, 0)) + "\n"
    out = run_tool(tmp_path, no_marker, "--all")
    assert out.returncode == 0 and "step: 1 kernels" in out.stdout
