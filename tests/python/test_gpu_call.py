"""Tests of bench/gpu_call.sh (one device call's checks, figure and ktraces in a time budget) with stand-ins: a fake
nvidia-smi, a tarball of fake test and bench programs, a checkpoint folder that already holds a config.json. What is
checked: the steps' summary in log.txt and the few files that come back, a failing check failing the call, steps left
out when the budget is short or GPU_CALL_SKIP names them, GPU_CALL_BENCHES through bench/cuda_run.sh, no GPU and bad
arguments refused with exit 2.

Run: python3 -m pytest -q tests/python/test_gpu_call.py
"""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from conftest import REPO_ROOT

CALL = REPO_ROOT / "bench" / "gpu_call.sh"
TESTS = ["deepinfer_cuda_tests", "deepinfer_cuda_gemv_tests", "deepinfer_cuda_linear_tc_tests",
         "deepinfer_cuda_sampling_tests"]


def script(path: Path, body: str) -> None:
    path.write_text("#!/bin/bash\n" + body + "\n")
    path.chmod(0o755)


@pytest.fixture()
def rig(tmp_path):
    """A fake GPU on PATH, a checkpoint folder and a builder of tarballs (failing: test programs that print a FAIL)."""
    smi = tmp_path / "smibin"
    smi.mkdir()
    script(smi / "nvidia-smi", 'echo "Fake GPU, 1980 MHz, 1980 MHz, 0.0"')
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")

    def tarball(failing=()):
        stage = tmp_path / "stage"
        (stage / "bin").mkdir(parents=True, exist_ok=True)
        (stage / "lib").mkdir(exist_ok=True)
        for name in TESTS:
            bad = name in failing
            fail = f'\necho "FAIL {name} other"\nexit 1' if bad else ""
            script(stage / "bin" / name, f'echo "PASS {name} case"' + fail)
        script(stage / "bin" / "deepinfer_cuda_model_tests", 'echo "model checks: ALL PASSED"')
        script(stage / "bin" / "bench_cuda_model", 'echo "| bench | $* |"')
        script(stage / "bin" / "bench_cuda_bmma_probe", 'echo "| probe table |"')
        out = tmp_path / "w.tar.xz"
        with tarfile.open(out, "w:xz") as tar:
            tar.add(stage / "bin", arcname="bin")
            tar.add(stage / "lib", arcname="lib")
        return out

    env = {**os.environ, "PATH": f"{smi}:{os.environ['PATH']}", "CKPT": str(ckpt)}
    return tmp_path, tarball, env


def call(args, env, **extra):
    return subprocess.run(["bash", str(CALL)] + [str(a) for a in args], capture_output=True, text=True,
                          env={**env, **extra}, timeout=300)


def test_checks_and_figure_run_and_come_back_in_few_files(rig):
    tmp, tarball, env = rig
    out = tmp / "out"
    r = call([tarball(), out], env)
    assert r.returncode == 0, r.stdout + r.stderr
    log = (out / "log.txt").read_text()
    assert "Fake GPU" in log
    for line in ("ops: 1 PASS, 0 FAIL", "gemv: 1 PASS, 0 FAIL", "model checks: ALL PASSED"):
        assert line in log, log
    assert "| bench | " in log and "--batches 1,8 --context 128 --steps 32 --prefill 0" in log, log
    assert "gpu_call: done in" in log and "exit 0" in log
    files = sorted(p.name for p in out.iterdir())
    assert files == ["log.txt", "test_cuda.tgz"], files
    with tarfile.open(out / "test_cuda.tgz") as tar:
        names = tar.getnames()
    assert "./ops.txt" in names and "./run.txt" in names and not any("ckpt" in n for n in names), names


def test_a_failing_check_fails_the_call_and_names_the_case(rig):
    tmp, tarball, env = rig
    out = tmp / "out"
    r = call([tarball(failing=["deepinfer_cuda_gemv_tests"]), out], env)
    assert r.returncode == 1
    log = (out / "log.txt").read_text()
    assert "FAIL deepinfer_cuda_gemv_tests other" in log and "test: FAILED" in log, log
    assert "| bench | " in log  # the later steps still ran


def test_short_budget_and_skips_leave_steps_out_in_order(rig):
    tmp, tarball, env = rig
    out = tmp / "out"
    r = call([tarball(), out, "v=FOO=1"], env, GPU_CALL_BUDGET="100", GPU_CALL_ROUNDS="6")
    assert r.returncode == 0, r.stdout + r.stderr
    log = (out / "log.txt").read_text()
    assert "== test: not run" in log and "needs ~150" in log, log
    assert "| bench | " in log
    assert "== ktrace: not run" in log and "needs ~120" in log, log
    out2 = tmp / "out2"
    r = call([tarball(), out2], env, GPU_CALL_SKIP="test model")
    assert r.returncode == 0
    log = (out2 / "log.txt").read_text()
    assert "== test: skipped (GPU_CALL_SKIP)" in log and "== model: skipped (GPU_CALL_SKIP)" in log, log
    assert "| bench | " not in log


def test_no_gpu_and_bad_arguments_are_refused(rig):
    tmp, tarball, env = rig
    script(Path(env["PATH"].split(":")[0]) / "nvidia-smi", "exit 9")
    out = tmp / "out"
    r = call([tarball(), out], env)
    assert r.returncode == 2 and "no GPU here" in r.stdout
    assert not (out / "test_cuda.tgz").exists()
    for bad in (["x"], ["d=FOO=1"]):
        r = call([tarball(), tmp / "o3"] + bad, env)
        assert r.returncode == 2 and "variant" in r.stderr, r.stderr
    r = call([tmp / "missing.tar.xz", tmp / "o4"], env)
    assert r.returncode == 2 and "no tarball" in r.stderr
    r = call([tarball(), tmp / "o5"], env, GPU_CALL_BUDGET="soon")
    assert r.returncode == 2 and "whole numbers" in r.stderr


def test_benches_run_through_cuda_run(rig):
    tmp, tarball, env = rig
    out = tmp / "out"
    r = call([tarball(), out], env, GPU_CALL_SKIP="test model", GPU_CALL_BENCHES="bmma_probe")
    assert r.returncode == 0, r.stdout + r.stderr
    log = (out / "log.txt").read_text()
    assert "-- bench bmma_probe" in log and "| probe table |" in log, log
    r = call([tarball(), tmp / "o2"], env, GPU_CALL_SKIP="test model", GPU_CALL_BENCHES="gemv bmma_probe")
    log = (tmp / "o2" / "log.txt").read_text()
    assert r.returncode == 1 and "gemv: FAILED (gemv: rc=" in log and "| probe table |" in log, log
    assert "bmma_probe: FAILED" not in log


def test_ncu_step_gives_the_stall_table(rig):
    tmp, tarball, env = rig
    header = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
              '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')

    def row(kid, name, metric, value):
        return f'"{kid}","1","b","h","{name}","1","7","(128, 1, 1)","(4, 1, 1)","0","9.0","m","{metric}","","{value}"'

    lines = ["==PROF== Connected", header]
    for kid, name, ns in ((0, "embedding_kernel(int)", 2000), (1, "fp4_mma_gemv(MmaParams)", 30000),
                          (2, "embedding_kernel(int)", 2000)):
        lines += [row(kid, name, "gpu__time_duration.sum", ns), row(kid, name, "dram__bytes_read.sum", 1000),
                  row(kid, name, "smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio", 2.5)]
    (tmp / "ncu.csv").write_text("\n".join(lines) + "\n")
    # The stand-in ncu checks that it was given the stall metrics and the model's queued batch-1 run.
    script(Path(env["PATH"].split(":")[0]) / "ncu",
           'case "$*" in *issue_stalled_long_scoreboard*bench_cuda_model*--batches\\ 1*--queued*) ;; *) exit 7;; esac\n'
           f'cat {tmp / "ncu.csv"}')
    out = tmp / "out"
    r = call([tarball(), out], env, GPU_CALL_SKIP="test model", GPU_CALL_NCU="1")
    assert r.returncode == 0, r.stdout + r.stderr
    log = (out / "log.txt").read_text()
    assert "== ncu" in log and "stalls (" in log, log
    assert any(line.startswith("fp4_mma_gemv") and "short_scoreboard 2.50" in line for line in log.splitlines()), log
    assert (out / "ncu.csv.gz").exists()
    out2 = tmp / "out2"
    r = call([tarball(), out2], env, GPU_CALL_SKIP="test model")  # off unless asked for
    assert r.returncode == 0 and "== ncu" not in (out2 / "log.txt").read_text()
    # GPU_CALL_NCU_KERNELS narrows the window to those kernels (an ncu -k regex).
    script(Path(env["PATH"].split(":")[0]) / "ncu",
           'case "$*" in *"-k regex:fp4_mma_gemv|walk --launch-skip 30"*) ;; *) exit 7;; esac\n'
           f'cat {tmp / "ncu.csv"}')
    r = call([tarball(), tmp / "o4"], env, GPU_CALL_SKIP="test model", GPU_CALL_NCU="1",
             GPU_CALL_NCU_KERNELS="fp4_mma_gemv|walk")
    assert r.returncode == 0 and "short_scoreboard 2.50" in (tmp / "o4" / "log.txt").read_text(), r.stdout
    # GPU_CALL_NCU_ENV sets the profiled run's environment; a word that is not VAR=VALUE is refused before anything runs.
    script(Path(env["PATH"].split(":")[0]) / "ncu",
           '[ "$DEEPINFER_CUDA_WALK_BULK" = 1 ] && [ "$OTHER_SWITCH" = x ] || exit 7\n' f'cat {tmp / "ncu.csv"}')
    r = call([tarball(), tmp / "o5"], env, GPU_CALL_SKIP="test model", GPU_CALL_NCU="1",
             GPU_CALL_NCU_ENV="DEEPINFER_CUDA_WALK_BULK=1 OTHER_SWITCH=x")
    log5 = (tmp / "o5" / "log.txt").read_text()
    assert r.returncode == 0 and "ncu: with DEEPINFER_CUDA_WALK_BULK=1 OTHER_SWITCH=x" in log5, r.stdout + log5
    r = call([tarball(), tmp / "o6"], env, GPU_CALL_NCU="1", GPU_CALL_NCU_ENV="not-a-word")
    assert r.returncode == 2 and "GPU_CALL_NCU_ENV takes VAR=VALUE words" in r.stderr, r.stderr
    script(Path(env["PATH"].split(":")[0]) / "ncu", 'echo "==ERROR== no counters" >&2; exit 3')
    out3 = tmp / "out3"
    r = call([tarball(), out3], env, GPU_CALL_SKIP="test model", GPU_CALL_NCU="1")
    log = (out3 / "log.txt").read_text()
    assert r.returncode == 1 and "ncu: FAILED (ncu exit 3): ==ERROR== no counters" in log, log
