"""Tests of bench/ktrace/report.py (the per-step table of a CUPTI kernel trace): span, idle gaps and how far each
kernel moved the step's end, on a synthetic trace whose answers are known.

Run: python3 -m pytest -q tests/python/test_ktrace_report.py
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REPORT = os.path.join(ROOT, "bench", "ktrace", "report.py")

# Two steps (embedding_kernel starts each). Step 1: embedding 0-2 us; A on stream 1 after a 1 us gap, 3-10 us; B on
# stream 2 inside A, 4-8 us (moves the end by nothing); a copy after a 2 us gap, 12-15 us.
TRACE = """start_ns,end_ns,stream,correlation,graph_node,name
0,2000,7,1,0,embedding_kernel(int)
3000,10000,1,2,0,kernel_a<4>(float*)
4000,8000,2,3,0,kernel_b(float*)
12000,15000,7,4,0,memcpy kind 8 2048 bytes
20000,21000,7,5,0,embedding_kernel(int)
21500,30000,1,6,0,kernel_a<4>(float*)
40000,41000,7,7,0,embedding_kernel(int)
"""


def run_report(tmp_path, *args):
    path = tmp_path / "trace.csv"
    path.write_text(TRACE)
    out = subprocess.run([sys.executable, REPORT, str(path), *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_first_step_span_idle_and_adds(tmp_path):
    out = run_report(tmp_path, "--step", "0")
    assert "step: 4 kernels, span 15.0 us, idle (no kernel on any stream) 3.0 us, busy 12.0 us" in out
    adds = {m.group(1).strip(): float(m.group(3)) for m in re.finditer(r"^(\S.*?)\s+(\d+)\s+([\d.]+)$", out, re.M)}
    assert adds["kernel_a<4>"] == 8.0  # ends 8 us after the embedding
    assert adds["kernel_b"] == 0.0  # inside kernel_a
    assert adds["memcpy kind 8 2048 bytes"] == 5.0  # 2 us idle + its 3 us
    assert adds["embedding_kernel"] == 2.0


def test_default_is_the_last_complete_step(tmp_path):
    out = run_report(tmp_path, "--quiet")
    assert "step: 2 kernels, span 10.0 us, idle (no kernel on any stream) 0.5 us, busy 9.5 us" in out


def test_too_few_markers_is_a_clear_error(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text(TRACE.splitlines()[0] + "\n0,1,1,1,0,other\n")
    out = subprocess.run([sys.executable, REPORT, str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "fewer than two embedding_kernel launches" in out.stderr
