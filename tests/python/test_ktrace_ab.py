"""Tests of bench/ktrace/ab.py (an A / B of a step's GPU times from ktrace CSVs) and bench/welch.py (the interval it and
bench/ab_model.py print), on synthetic traces whose answers are known.

Run: python3 -m pytest -q tests/python/test_ktrace_ab.py
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AB = os.path.join(ROOT, "bench", "ktrace", "ab.py")
sys.path.insert(0, os.path.join(ROOT, "bench"))
from welch import interval  # noqa: E402

HEADER = "start_ns,end_ns,stream,correlation,graph_node,name\n"


def trace(tmp_path, name, moe_us, gap_us):
    """Two steps; the last complete one (the first) is: embedding 0-1 us, hc_expand 1-2, a kernel on stream 2 to
    2 + moe_us, moe_combine_expand ending at 3 + moe_us, a gap of gap_us, a last kernel of 1 us."""
    end = 3000 + 1000 * moe_us
    rows = [
        (0, 1000, 7, "embedding_kernel(int)"),
        (1000, 2000, 7, "hc_expand_kernel(float*)"),
        (2000, 2000 + 1000 * moe_us, 2, "fp4_mma_gemv(P)"),
        (end - 1000, end, 7, "moe_combine_expand_kernel(float*)"),
        (end + 1000 * gap_us, end + 1000 * gap_us + 1000, 7, "tail_kernel()"),
        (100000, 101000, 7, "embedding_kernel(int)"),
        (101000, 102000, 7, "tail_kernel()"),
    ]
    path = tmp_path / name
    path.write_text(HEADER + "".join(f"{s},{e},{st},{i},0,{n}\n" for i, (s, e, st, n) in enumerate(rows)))
    return str(path)


def run_ab(*args):
    return subprocess.run([sys.executable, AB, *args], capture_output=True, text=True, timeout=60)


def test_welch_interval_known_values():
    d, h = interval([1.0, 2.0, 3.0], [2.0, 3.0, 4.0])
    # sd 1 each, se = sqrt(2 / 3), Welch df = 4, t = 2.776
    assert d == pytest.approx(1.0)
    assert h == pytest.approx(2.776 * (2.0 / 3.0) ** 0.5, rel=1e-6)
    with pytest.raises(ValueError):
        interval([1.0], [1.0, 2.0])


def test_busy_and_between_means(tmp_path):
    a = [trace(tmp_path, f"a{i}.csv", moe, 2) for i, moe in enumerate((10, 12))]
    b = [trace(tmp_path, f"b{i}.csv", moe, 2) for i, moe in enumerate((8, 10))]
    out = run_ab("--a", *a, "--b", *b, "--between", "hc_expand_kernel", "moe_combine_expand")
    assert out.returncode == 0, out.stderr
    rows = {m.group(1).strip(): (float(m.group(2)), float(m.group(3)), float(m.group(4)))
            for m in re.finditer(r"^(.{40}) +([\d.]+) +([\d.]+) +([+-][\d.]+)  \[", out.stdout, re.M)}
    # span = 3 + moe + gap + 1 us, idle = the gap; the sublayer = moe + 1 us (hc_expand's end to the combine's end);
    # means over moe 10, 12 (A) and 8, 10 (B)
    assert rows["kernels"] == (5.0, 5.0, 0.0)
    assert rows["span us"] == (17.0, 15.0, -2.0)
    assert rows["busy us"] == (15.0, 13.0, -2.0)
    assert rows["hc_expand_kernel -> moe_combine_expand"] == (12.0, 10.0, -2.0)


def test_clear_errors(tmp_path):
    a = [trace(tmp_path, f"a{i}.csv", 10, 1) for i in range(2)]
    out = run_ab("--a", *a, "--b", *a, "--between", "hc_expand_kernel", "no_such_kernel")
    assert out.returncode != 0 and "no 'hc_expand_kernel' followed by 'no_such_kernel'" in out.stderr
    out = run_ab("--a", a[0], "--b", *a)
    assert out.returncode != 0 and "at least two traces on each side" in out.stderr
    out = run_ab("--a", *a, "--b", *a, "--between", "hc_expand_kernel")
    assert out.returncode != 0 and "FROM TO pairs" in out.stderr
