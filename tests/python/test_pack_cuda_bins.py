"""Tests of bench/pack_cuda_bins.sh (prebuilt CUDA binaries and the shared libraries they load, packed for a GPU machine
without the build dependencies): the tarball's layout, that a packed binary starts with the packed lib/ as its library
path (on a machine without a GPU the CUDA programs then report that and exit 2), and the error for a binary that was
not built.

Run: python3 -m pytest -q tests/python/test_pack_cuda_bins.py
"""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

from conftest import REPO_ROOT, _missing

PACK = REPO_ROOT / "bench" / "pack_cuda_bins.sh"
BINARY = "deepinfer_cuda_sampling_tests"  # the smallest CUDA program of tests/cuda/run.sh


def require_cuda_build(build_dir: Path) -> Path:
    """The build directory, once it holds the CUDA programs (a missing one skips locally, fails under CI)."""
    if not os.access(build_dir / "src" / "cuda" / BINARY, os.X_OK):
        _missing(f"{BINARY} is not built in {build_dir} (no CUDA toolkit at configure time)")
    return build_dir


def test_pack_holds_the_binary_and_its_libraries_and_runs_from_them(tmp_path, build_dir):
    d = require_cuda_build(build_dir)
    out = tmp_path / "w.tar.xz"
    r = subprocess.run(["bash", str(PACK), str(d), str(out), BINARY], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "1 binaries" in r.stdout
    with tarfile.open(out) as tar:
        names = tar.getnames()
        tar.extractall(tmp_path / "w")
    assert f"bin/{BINARY}" in names
    libs = [n for n in names if n.startswith("lib/") and n != "lib"]
    assert any(os.path.basename(n).startswith("libfmt.so") for n in libs), names  # fmt is linked shared
    assert not any(os.path.basename(n).startswith(("libc.so", "libstdc++", "ld-linux")) for n in libs), names
    # The packed lib/ as the library path (the loader's default paths still follow it, so this shows the binary runs from
    # the tarball, not that lib/ alone would suffice): it must load and reach its own GPU check.
    env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(tmp_path / "w" / "lib")}
    run = subprocess.run([str(tmp_path / "w" / "bin" / BINARY)], capture_output=True, text=True, env=env, timeout=300)
    assert "error while loading shared libraries" not in run.stderr
    if run.returncode == 2:
        assert "no CUDA device" in run.stdout + run.stderr
    else:
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]


def test_a_binary_that_was_not_built_is_a_clear_error(tmp_path, build_dir):
    d = require_cuda_build(build_dir)
    r = subprocess.run(["bash", str(PACK), str(d), str(tmp_path / "x.tar.xz"), "no_such_program"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1
    assert "no binary no_such_program" in r.stderr
    assert not (tmp_path / "x.tar.xz").exists()
