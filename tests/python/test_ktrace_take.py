"""Tests of bench/ktrace/take.sh (alternated ktrace traces of a binary's variants, each an environment), with a stand-in
binary that writes its environment and arguments where the trace would go: the variants' order in each round, the
environment each ran with, KT_ARGS, and clear refusals of bad arguments and of a run that writes no trace.

Run: python3 -m pytest -q tests/python/test_ktrace_take.py
"""

from __future__ import annotations

import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TAKE = os.path.join(ROOT, "bench", "ktrace", "take.sh")


def run(args, env=None):
    return subprocess.run(["bash", TAKE] + args, capture_output=True, text=True, env={**os.environ, **(env or {})})


@pytest.fixture()
def fake(tmp_path):
    """A stand-in bench binary: appends its round stamp to a log, then writes FOO, BAR and its arguments as the trace."""
    path = tmp_path / "fake.sh"
    log = tmp_path / "order.txt"
    path.write_text(f'#!/bin/bash\necho "$KTRACE_OUT" >> {log}\necho "$FOO|$BAR|$*" > "$KTRACE_OUT"\n')
    path.chmod(0o755)
    return str(path), log


def test_rounds_alternate_variants_with_their_environments(tmp_path, fake):
    binary, log = fake
    out = tmp_path / "kts"
    r = run([binary, "CKPT", str(out), "2", "a=", "b=FOO=1 BAR=two"], {"KT_ARGS": "--batches 8 --queued"})
    if r.returncode != 0 and "cupti" in (r.stdout + r.stderr).lower():
        pytest.skip("no CUPTI headers here to build the tracer")
    assert r.returncode == 0, r.stderr
    order = [os.path.basename(p) for p in log.read_text().split()]
    assert order == ["kt_a_1.csv", "kt_b_1.csv", "kt_a_2.csv", "kt_b_2.csv"]
    assert (out / "kt_a_2.csv").read_text().strip() == "||CKPT --batches 8 --queued"
    assert (out / "kt_b_1.csv").read_text().strip() == "1|two|CKPT --batches 8 --queued"


def test_bad_arguments_and_a_run_without_a_trace_are_refused(tmp_path, fake):
    binary, _ = fake
    r = run([binary, "CKPT", str(tmp_path / "o"), "0", "a="])
    assert r.returncode == 2 and "ROUNDS" in r.stderr
    r = run([binary, "CKPT", str(tmp_path / "o"), "1", "no-equals-sign"])
    assert r.returncode == 2 and "NAME=ENV" in r.stderr
    r = run([binary, "CKPT", str(tmp_path / "o")])
    assert r.returncode == 2 and "usage" in r.stderr
    r = run(["/bin/true", "CKPT", str(tmp_path / "o"), "1", "a="])
    if r.returncode == 2 and "cupti" in (r.stdout + r.stderr).lower():
        pytest.skip("no CUPTI headers here to build the tracer")
    assert r.returncode == 1 and "wrote no trace" in r.stderr
