"""The decode path (one token per forward) and chunked prefill give the same logits as one prefill
forward, for sequences of 1-700 tokens, in every numerics mode.

Lengths are chosen around the boundaries of the tiny preset: window 16, C4 groups, index_topk 4
(top-k starts selecting at position 19), C128 groups (positions 127, 255, ...).
Tolerance: max |delta logit| / max |logit| <= 1e-4 and identical argmax, as for the reference goldens.
"""
import numpy as np
import pytest

LENGTHS = [1, 2, 3, 4, 5, 15, 16, 17, 19, 20, 127, 128, 129, 255, 256, 257, 700]
TOL = 1e-4


def _logits(run_cli, model, ids, tmp_path, *extra):
    out = tmp_path / "logits.bin"
    run_cli(["logits", "--model", model, "--input-ids", ",".join(map(str, ids)), "--out", out, *extra])
    return np.fromfile(out, dtype=np.float32).reshape(len(ids), -1)


def _assert_close(a, b, what):
    rel = np.abs(a - b).max() / np.abs(a).max()
    assert rel <= TOL, f"{what}: max|d|/max = {rel:.3g}"
    assert (a.argmax(-1) == b.argmax(-1)).all(), f"{what}: argmax differs"


@pytest.mark.parametrize("mode", [["--dtype", "float32", "--no-simulate-qat"], ["--dtype", "bfloat16"]],
                         ids=["fp32-noqat", "bf16-qat"])
def test_decode_equals_prefill(make_checkpoint, run_cli, tmp_path, mode):
    model = make_checkpoint("tiny", seed=7)
    ids = np.random.default_rng(11).integers(3, 1024, max(LENGTHS)).tolist()
    decoded = _logits(run_cli, model, ids, tmp_path, "--decode", *mode)
    for n in LENGTHS:
        pre = _logits(run_cli, model, ids[:n], tmp_path, *mode)
        _assert_close(pre, decoded[:n], f"prefill of {n} tokens vs decode")


@pytest.mark.parametrize("chunk", [1, 3, 16, 50])
def test_chunked_prefill_equals_prefill(make_checkpoint, run_cli, tmp_path, chunk):
    model = make_checkpoint("tiny", seed=7)
    ids = np.random.default_rng(12).integers(3, 1024, 300).tolist()
    full = _logits(run_cli, model, ids, tmp_path)
    chunked = _logits(run_cli, model, ids, tmp_path, "--chunk", str(chunk))
    _assert_close(full, chunked, f"chunks of {chunk}")


def test_every_chunk_size_is_bitwise_equal_to_one_prefill(make_checkpoint, run_cli, tmp_path):
    """Chunked prefill carries the window ring, compressor partial groups (C4 overlap included) and
    index visibility across chunks: every chunk size 1..N gives the one-shot logits bit for bit."""
    model = make_checkpoint("tiny", seed=7)
    ids = np.random.default_rng(13).integers(3, 1024, 45).tolist()  # window 16, C4 groups, top-k 4 selects
    full = _logits(run_cli, model, ids, tmp_path)
    for chunk in range(1, len(ids) + 1):
        got = _logits(run_cli, model, ids, tmp_path, "--chunk", str(chunk))
        assert np.array_equal(got, full), f"chunk {chunk}: max |d| {np.abs(got - full).max()}"
