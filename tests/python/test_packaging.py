"""`pip install .` from a clean checkout (pyproject.toml, scikit-build-core) into a fresh venv.

A full build of the extension takes minutes, so this runs only with DEEPINFER_TEST_PIP=1:

    DEEPINFER_TEST_PIP=1 python3 -m pytest -q tests/python/test_packaging.py

It needs the system libraries of scripts/install-deps.sh and PyPI (pip's build isolation fetches
scikit-build-core and pybind11).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def _clean_checkout(dest: Path) -> Path:
    """Copies the files a checkout would have (tracked and not ignored: no build outputs, no
    in-tree `_deepinfer*.so`) to dest; falls back to the whole tree when git is unavailable."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             cwd=REPO_ROOT, check=True, capture_output=True).stdout
    except (OSError, subprocess.CalledProcessError):
        shutil.copytree(REPO_ROOT, dest, ignore=shutil.ignore_patterns("build", "build-*", ".git",
                                                                       "_deepinfer*.so", "__pycache__"))
        return dest
    for rel in filter(None, out.decode().split("\0")):
        src = REPO_ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("DEEPINFER_TEST_PIP") != "1",
                    reason="builds the wheel with pip (minutes): set DEEPINFER_TEST_PIP=1")
def test_pip_install_from_clean_checkout(tmp_path: Path) -> None:
    src = _clean_checkout(tmp_path / "src")
    assert not list((src / "python" / "deepinfer").glob("_deepinfer*.so"))
    venv.EnvBuilder(with_pip=True).create(tmp_path / "venv")
    py = tmp_path / "venv" / "bin" / "python"

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    pip = subprocess.run([str(py), "-m", "pip", "install", "--disable-pip-version-check", str(src)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)
    assert pip.returncode == 0, f"pip install failed:\n{pip.stdout[-6000:]}\n{pip.stderr[-6000:]}"
    # The build must not write into the source tree (CMake's in-tree output is for `make build`).
    assert not list((src / "python" / "deepinfer").glob("_deepinfer*.so"))

    # Import from outside the repository: only the installed package can be found.
    check = ("import importlib.metadata as m, pathlib, deepinfer; "
             "print(deepinfer.LLM.__name__, deepinfer.Tokenizer.__name__, m.version('deepinfer')); "
             "print(pathlib.Path(deepinfer._deepinfer.__file__).parent == pathlib.Path(deepinfer.__file__).parent)")
    out = subprocess.run([str(py), "-c", check], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["LLM", "Tokenizer", "0.1.0", "True"], out.stdout
    assert str(tmp_path / "venv") in subprocess.run(
        [str(py), "-c", "import deepinfer; print(deepinfer.__file__)"], cwd=tmp_path, env=env,
        capture_output=True, text=True, check=True).stdout
