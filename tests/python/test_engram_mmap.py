"""V4.1 Engram tables are memory-mapped, never read into memory: the engram-huge preset has one
Engram table of > 34e9 bytes (larger than this machine's RAM), stored as a sparse-file hole, and
`deepinfer logits` / `generate` / `bench` on it must run in a small process (peak RSS < 1 GiB). Peak RSS is measured
per child with os.wait4 (that child's own rusage, not the max over every child pytest ever ran)."""
import json
import os
import re
import signal
import subprocess
import tempfile
import threading

import numpy as np
import pytest

RSS_LIMIT = 1 << 30  # bytes


def _mem_total() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    pytest.skip("no MemTotal in /proc/meminfo")


def _sparse_files_supported(directory) -> bool:
    """A 1 GiB file made by truncate takes (almost) no blocks where holes are supported."""
    os.makedirs(directory, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=directory) as f:
        f.truncate(1 << 30)
        f.flush()
        return os.fstat(f.fileno()).st_blocks * 512 < (1 << 24)


def _run_measured(cmd, timeout=300):
    """(returncode, stdout, stderr, peak RSS in bytes) of one fresh child process."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen([str(c) for c in cmd], stdout=out, stderr=err)
        timer = threading.Timer(timeout, lambda: os.kill(p.pid, signal.SIGKILL))
        timer.start()
        try:
            _, status, usage = os.wait4(p.pid, 0)
        finally:
            timer.cancel()
        p.returncode = os.waitstatus_to_exitcode(status)  # reaped here: keep Popen from waiting again
        out.seek(0)
        err.seek(0)
        return p.returncode, out.read().decode(errors="replace"), err.read().decode(errors="replace"), \
            usage.ru_maxrss * 1024  # Linux: kilobytes


@pytest.fixture(scope="module")
def huge_model(make_checkpoint, build_dir):
    if not _sparse_files_supported(build_dir / "test-models"):
        pytest.skip(f"the filesystem of {build_dir / 'test-models'} does not support sparse files: the engram-huge "
                    "checkpoint would take > 34 GB of disk")
    model = make_checkpoint("engram-huge", seed=0, family="v41")
    st = os.stat(model / "model.safetensors")
    mem = _mem_total()
    # The claim is only proven if the file could not have been read into memory.
    assert st.st_size > mem, f"checkpoint {st.st_size} bytes is not larger than MemTotal {mem}"
    assert st.st_blocks * 512 < st.st_size // 100, "the checkpoint is not sparse"
    cfg = json.loads((model / "config.json").read_text())["text_config"]
    assert cfg["engram_num_embeddings"][0] * (cfg["engram_head_dim"] + cfg["engram_head_dim"] // 32) > mem
    return model


def test_logits_on_a_table_larger_than_memory(huge_model, deepinfer_bin, tmp_path):
    ids = np.random.default_rng(0).integers(3, 1024, 24).tolist()
    out = tmp_path / "l.bin"
    rc, _, err, rss = _run_measured([deepinfer_bin, "logits", "--model", huge_model, "--input-ids",
                                     ",".join(map(str, ids)), "--out", out])
    assert rc == 0, err
    logits = np.fromfile(out, dtype=np.float32).reshape(len(ids), -1)
    assert logits.shape[1] == 1024 and np.isfinite(logits).all()
    assert rss < RSS_LIMIT, f"peak RSS {rss / 2**20:.0f} MiB"
    # The decode path reads the same rows: bitwise the same logits, still small.
    rc, _, err, rss = _run_measured([deepinfer_bin, "logits", "--model", huge_model, "--input-ids",
                                     ",".join(map(str, ids)), "--decode", "--out", tmp_path / "d.bin"])
    assert rc == 0, err
    assert np.array_equal(np.fromfile(tmp_path / "d.bin", dtype=np.float32).reshape(logits.shape), logits)
    assert rss < RSS_LIMIT, f"peak RSS {rss / 2**20:.0f} MiB (--decode)"


def test_generate_on_a_table_larger_than_memory(huge_model, deepinfer_bin, run_cli, tmp_path):
    prompt = [5, 6, 7, 8, 9, 10, 11, 12, 13]
    rc, out, err, rss = _run_measured([deepinfer_bin, "generate", "--model", huge_model, "--prompt-ids",
                                       ",".join(map(str, prompt)), "--max-tokens", "6", "--ignore-eos"])
    assert rc == 0, err
    toks = [int(t) for t in out.strip().split(",")]
    assert len(toks) == 6 and all(0 <= t < 1024 for t in toks)
    assert rss < RSS_LIMIT, f"peak RSS {rss / 2**20:.0f} MiB"
    # Greedy: each token is the argmax of the logits of the sequence so far (teacher-forced).
    ids = prompt + toks[:-1]
    run_cli(["logits", "--model", huge_model, "--input-ids", ",".join(map(str, ids)), "--out", tmp_path / "l.bin"])
    logits = np.fromfile(tmp_path / "l.bin", dtype=np.float32).reshape(len(ids), -1)
    assert logits[len(prompt) - 1:].argmax(-1).tolist() == toks


def test_engine_on_a_table_larger_than_memory(huge_model, deepinfer_bin):
    """The engine path (scheduler, KV accounting, batched forward) through `deepinfer bench`."""
    rc, out, err, rss = _run_measured([deepinfer_bin, "bench", "--model", huge_model, "--input-len", "16",
                                       "--output-len", "4", "--num-prompts", "2", "--max-model-len", "64"])
    assert rc == 0, err
    assert re.search(r"^output tokens\s+8$", out, re.M), out
    assert rss < RSS_LIMIT, f"peak RSS {rss / 2**20:.0f} MiB"
