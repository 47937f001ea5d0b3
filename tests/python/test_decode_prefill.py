"""The decode path (one token per forward) and chunked prefill give the same logits as one prefill
forward, for sequences of 1-700 tokens, in every numerics mode.

V4 (tiny): lengths are chosen around the boundaries of the preset: window 16, C4 groups, index_topk 4
(top-k starts selecting at position 19), C128 groups (positions 127, 255, ...).
Tolerance: max |delta logit| / max |logit| <= 1e-4 and identical argmax, as for the reference goldens.

V4.1 (tiny): window 8; ratio-2 compressors (layers 2-5: a pair closes at every odd position, so odd
and even lengths end with and without an open partial pair) and ratio-1 compressors (6-9);
index_topk 6 (top-k starts selecting around position 6 for ratio 1 and 13 for ratio 2); candidate
blocks of 2 entries, top 4 blocks (layer 8's reindex selects once there are more than 8 ratio-1
entries); Engram n-grams of up to 4 tokens (the hash history crosses chunk boundaries). Every
comparison is bitwise: one forward, any chunking and the decode path compute every row in the same
order.
"""
import numpy as np
import pytest

LENGTHS = [1, 2, 3, 4, 5, 15, 16, 17, 19, 20, 127, 128, 129, 255, 256, 257, 700]
LENGTHS_V41 = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 13, 14, 15, 16, 17, 18, 19, 31, 32, 33, 69, 70]
TOL = 1e-4
MODES = [["--dtype", "float32", "--no-simulate-qat"], ["--dtype", "bfloat16"]]
MODE_IDS = ["fp32-noqat", "bf16-qat"]
# V4.1 chunk sizes: 1, 2 (= the ratio), small primes (chunks straddle pairs, windows and n-grams),
# 11 (a prime above the window of 8) and 97 (one chunk for the 69- and 70-token prompts, 2 chunks and
# a tail for the 200-token one).
CHUNKS_V41 = [1, 2, 3, 5, 7, 11, 97]


def _logits(run_cli, model, ids, tmp_path, *extra):
    out = tmp_path / "logits.bin"
    run_cli(["logits", "--model", model, "--input-ids", ",".join(map(str, ids)), "--out", out, *extra])
    return np.fromfile(out, dtype=np.float32).reshape(len(ids), -1)


def _assert_close(a, b, what):
    rel = np.abs(a - b).max() / np.abs(a).max()
    assert rel <= TOL, f"{what}: max|d|/max = {rel:.3g}"
    assert (a.argmax(-1) == b.argmax(-1)).all(), f"{what}: argmax differs"


def _assert_bitwise(a, b, what):
    assert a.shape == b.shape, f"{what}: shapes {a.shape} vs {b.shape}"
    if not np.array_equal(a, b):
        rows = np.nonzero((a != b).any(-1))[0]
        pytest.fail(f"{what}: not bitwise equal; first differing row {rows[0]} of {len(a)} "
                    f"({len(rows)} rows differ), max |d| {np.abs(a - b).max():.3g}", pytrace=False)


# Per family: checkpoint seed, prefix lengths, chunk sizes and prompt lengths for the chunk test, and
# whether the comparison is bitwise (V4.1) or within TOL (V4).
FAMILIES = {
    "v4": dict(seed=7, lengths=LENGTHS, chunks=[1, 3, 16, 50], prompts=[300], bitwise=False),
    "v41": dict(seed=1, lengths=LENGTHS_V41, chunks=CHUNKS_V41, prompts=[69, 70, 200], bitwise=True),
}


def _model(make_checkpoint, family):
    return make_checkpoint("tiny", seed=FAMILIES[family]["seed"], family=family)


def _compare(family, ref, got, what):
    if FAMILIES[family]["bitwise"]:
        _assert_bitwise(got, ref, what)
    else:
        _assert_close(ref, got, what)


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_decode_equals_prefill(make_checkpoint, run_cli, tmp_path, mode, family):
    """Prefill of every prefix length == the decode path's rows (the prefix property: row i never
    depends on later tokens)."""
    model = _model(make_checkpoint, family)
    lengths = FAMILIES[family]["lengths"]
    ids = np.random.default_rng(11).integers(3, 1024, max(lengths)).tolist()
    decoded = _logits(run_cli, model, ids, tmp_path, "--decode", *mode)
    assert np.isfinite(decoded).all()
    for n in lengths:
        pre = _logits(run_cli, model, ids[:n], tmp_path, *mode)
        _compare(family, pre, decoded[:n], f"prefill of {n} tokens vs decode")


@pytest.mark.parametrize("family,chunk", [(f, c) for f in FAMILIES for c in FAMILIES[f]["chunks"]])
def test_chunked_prefill_equals_prefill(make_checkpoint, run_cli, tmp_path, family, chunk):
    model = _model(make_checkpoint, family)
    rng = np.random.default_rng(12)
    for n in FAMILIES[family]["prompts"]:  # V4.1: odd and even, all well past the window of 8
        ids = rng.integers(3, 1024, n).tolist()
        full = _logits(run_cli, model, ids, tmp_path)
        chunked = _logits(run_cli, model, ids, tmp_path, "--chunk", str(chunk))
        _compare(family, full, chunked, f"{n} tokens in chunks of {chunk}")


@pytest.mark.parametrize("family", ["v4", "v41"])
def test_every_chunk_size_is_bitwise_equal_to_one_prefill(make_checkpoint, run_cli, tmp_path, family):
    """Chunked prefill carries the window ring, compressor partial groups (C4 overlap / ratio-2 pairs
    included), index visibility and (V4.1) the Engram n-gram history across chunks: every chunk size
    1..N gives the one-shot logits bit for bit."""
    if family == "v4":
        model = make_checkpoint("tiny", seed=7)
        ids = np.random.default_rng(13).integers(3, 1024, 45).tolist()  # window 16, C4 groups, top-k 4 selects
    else:
        model = make_checkpoint("tiny", seed=1, family="v41")
        ids = np.random.default_rng(13).integers(3, 1024, 37).tolist()  # window 8, odd: an open ratio-2 pair
    full = _logits(run_cli, model, ids, tmp_path)
    for chunk in range(1, len(ids) + 1):
        got = _logits(run_cli, model, ids, tmp_path, "--chunk", str(chunk))
        assert np.array_equal(got, full), f"chunk {chunk}: max |d| {np.abs(got - full).max()}"


# --- V4.1 small ------------------------------------------------------------------------------------

def test_v41_small_decode_and_chunks_bitwise(make_checkpoint, run_cli, tmp_path):
    """The small preset (window 16, candidate blocks of 4, index_topk 16: ratio-2 top-k selects from
    position 33): decode and chunked prefill (7; 17, a prime above the window) equal one prefill."""
    model = make_checkpoint("small", seed=1, family="v41")
    ids = np.random.default_rng(14).integers(3, 4096, 83).tolist()
    full = _logits(run_cli, model, ids, tmp_path)
    assert np.isfinite(full).all()
    for extra in (["--decode"], ["--chunk", "7"], ["--chunk", "17"]):
        _assert_bitwise(_logits(run_cli, model, ids, tmp_path, *extra), full, " ".join(extra))
