"""Fixtures shared by the Python end-to-end tests.

    repo_root        the repository root (Path)
    build_dir        the CMake build directory: $DEEPINFER_BUILD_DIR (the Makefile exports it), else build/
    deepinfer_bin    build/src/deepinfer; skips the test when it is missing, fails instead when CI=true
    make_checkpoint  make_checkpoint(preset="tiny", seed=0, dense=False, family="v4") -> Path of a
                     random-weight checkpoint from tools/make_checkpoint.py, cached in
                     build/test-models/<family>-<preset>-s<seed>[-dense] across sessions
    run_cli          run_cli(args, timeout=300, check=True, env=None, input=None) -> CompletedProcess
                     of `deepinfer *args` (text mode); a non-zero exit fails the test when check=True

Example:

    def test_generate(make_checkpoint, run_cli):
        model = make_checkpoint("tiny", seed=0)
        out = run_cli(["generate", "--model", model, "--prompt-ids", "0,17,42,7", "--max-tokens", "4"])
        assert out.stdout.strip()
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Mapping, Sequence

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
IN_CI = os.environ.get("CI", "").lower() == "true"
# OpenMP's default spin-waiting makes the CPU backend crawl when cores are shared (the test machines
# have two); passive waiting for every engine this test process or its children start (README).
os.environ.setdefault("OMP_WAIT_POLICY", "passive")
GENERATOR = REPO_ROOT / "tools" / "make_checkpoint.py"
STAMP_NAME = ".deepinfer-test-stamp.json"


def _build_dir() -> Path:
    d = Path(os.environ.get("DEEPINFER_BUILD_DIR") or "build")
    return d if d.is_absolute() else REPO_ROOT / d


def _missing(what: str) -> None:
    """A prerequisite is absent: skip locally, fail under CI (where everything must be built)."""
    if IN_CI:
        pytest.fail(f"{what} (CI=true: a missing prerequisite is a failure, not a skip)", pytrace=False)
    pytest.skip(what)


def _text(s: str | bytes | None) -> str:
    if s is None:
        return ""
    return s.decode(errors="replace") if isinstance(s, bytes) else s


def _show(cmd: Sequence[str], limit: int = 120) -> str:
    """A command line for messages, with very long arguments (token id lists) shortened."""
    def short(a: str) -> str:
        if len(a) <= limit:
            return a
        n = a.count(",") + 1
        return a[:limit // 2] + f"...<{len(a)} chars" + (f", {n} items" if n > 1 else "") + ">"
    return shlex.join(short(a) for a in cmd)


def _generator_hash() -> str:
    """sha256 over the generator and the modules it imports (tools/*.py, tools/engram/*.py)."""
    h = hashlib.sha256()
    for p in sorted(GENERATOR.parent.glob("*.py")) + sorted((GENERATOR.parent / "engram").glob("*.py")):
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("DEEPINFER_TEST_GPU") == "1":
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU: set DEEPINFER_TEST_GPU=1 on a machine with one")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def build_dir() -> Path:
    return _build_dir()


@pytest.fixture(scope="session")
def deepinfer_bin(build_dir: Path) -> Path:
    exe = build_dir / "src" / "deepinfer"
    if not (exe.is_file() and os.access(exe, os.X_OK)):
        _missing(f"{exe} is missing: build it first with `make build`")
    return exe


@pytest.fixture(scope="session")
def make_checkpoint(build_dir: Path) -> Callable[..., Path]:
    """Returns make(preset="tiny", seed=0, dense=False, family="v4") -> checkpoint directory.

    A directory is reused while its stamp matches the generator's hash and the arguments; otherwise
    it is regenerated (into a temporary directory, then renamed, so no half-written model remains).
    """
    made: dict[tuple, Path] = {}

    def make(preset: str = "tiny", seed: int = 0, dense: bool = False, family: str = "v4") -> Path:
        key = (family, preset, int(seed), bool(dense))
        if key in made:
            return made[key]
        if not GENERATOR.is_file():
            _missing(f"{GENERATOR} is missing")
        out = build_dir / "test-models" / f"{family}-{preset}-s{seed}{'-dense' if dense else ''}"
        stamp = {"generator_sha256": _generator_hash(), "family": family, "preset": preset, "seed": int(seed),
                 "dense": bool(dense)}
        stamp_file = out / STAMP_NAME
        try:
            current = json.loads(stamp_file.read_text()) if stamp_file.is_file() else None
        except (OSError, ValueError):
            current = None
        if current != stamp:
            tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.parent.mkdir(parents=True, exist_ok=True)
            cmd = [sys.executable, str(GENERATOR), "--family", family, "--preset", preset, "--seed", str(seed),
                   "--out", str(tmp)] + (["--dense"] if dense else [])
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=REPO_ROOT)
            except subprocess.TimeoutExpired as e:
                shutil.rmtree(tmp, ignore_errors=True)
                pytest.fail(f"`{_show(cmd)}` timed out after 900 s\n{_text(e.stderr)}", pytrace=False)
            if proc.returncode != 0:
                shutil.rmtree(tmp, ignore_errors=True)
                pytest.fail(f"`{_show(cmd)}` failed with exit code {proc.returncode}\n"
                            f"--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}", pytrace=False)
            (tmp / STAMP_NAME).write_text(json.dumps(stamp, indent=1) + "\n")
            shutil.rmtree(out, ignore_errors=True)
            tmp.rename(out)
        made[key] = out
        return out

    return make


@pytest.fixture(scope="session")
def run_cli(deepinfer_bin: Path) -> Callable[..., subprocess.CompletedProcess]:
    """Returns run(args, timeout=300, check=True, env=None, input=None, cwd=None) -> CompletedProcess.

    Runs `deepinfer *args` (args are str()-ed, so Paths work) capturing stdout and stderr as text.
    `env` entries are added to the current environment. A timeout always fails the test; a non-zero
    exit fails it when check=True (pass check=False to test error handling).
    """

    def run(args: Sequence[object], *, timeout: float = 300, check: bool = True,
            env: Mapping[str, str] | None = None, input: str | None = None,
            cwd: str | Path | None = None) -> subprocess.CompletedProcess:
        cmd = [str(deepinfer_bin), *(str(a) for a in args)]
        full_env = dict(os.environ)
        if env:
            full_env.update(env)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env, input=input,
                                  cwd=cwd)
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"`{_show(cmd)}` timed out after {timeout} s\n"
                        f"--- stdout ---\n{_text(e.stdout)}\n--- stderr ---\n{_text(e.stderr)}", pytrace=False)
        if check and proc.returncode != 0:
            pytest.fail(f"`{_show(cmd)}` exited with {proc.returncode}\n"
                        f"--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}", pytrace=False)
        return proc

    return run
