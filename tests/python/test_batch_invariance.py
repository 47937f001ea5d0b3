"""Batch invariance: a sequence's logits are bitwise identical alone and inside batches of random
composition (other sequences of random lengths, in random order, prefill and decode mixed by
ragged lengths), in both numerics modes, for both model families. The batched forward stacks every
sequence's tokens into one GEMM batch, so this holds only because every kernel's per-row reduction
order is fixed. V4.1 adds per-sequence state the batch must keep apart: ratio-2 partial pairs, the
shared compressed KV / index keys of the source layers, candidate blocks and the Engram n-gram
history."""
import numpy as np
import pytest

# Per family: checkpoint (preset tiny), target length, longest other sequence.
FAMILIES = {"v4": dict(seed=3, target=90, other_max=140), "v41": dict(seed=3, target=70, other_max=100)}
MODES = [[], ["--dtype", "float32", "--no-simulate-qat"]]
MODE_IDS = ["bf16-qat", "fp32"]


def _run(run_cli, model, seqs, tmp_path, *extra):
    out = tmp_path / "b.bin"
    spec = ";".join(",".join(map(str, s)) for s in seqs)
    run_cli(["logits", "--model", model, "--input-ids", spec, "--out", out, *extra])
    flat = np.fromfile(out, dtype=np.float32)
    vocab = flat.size // sum(len(s) for s in seqs)
    rows, res = 0, []
    for s in seqs:
        res.append(flat[rows * vocab:(rows + len(s)) * vocab].reshape(len(s), vocab))
        rows += len(s)
    return res


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_logits_bitwise_identical_across_batches(make_checkpoint, run_cli, tmp_path, mode, family):
    spec = FAMILIES[family]
    model = make_checkpoint("tiny", seed=spec["seed"], family=family)
    rng = np.random.default_rng(5)
    target = rng.integers(3, 1024, spec["target"]).tolist()
    alone = _run(run_cli, model, [target], tmp_path, *mode)[0]
    for trial in range(12):
        others = [rng.integers(3, 1024, int(rng.integers(1, spec["other_max"]))).tolist()
                  for _ in range(int(rng.integers(1, 5)))]
        seqs = others + [target]
        order = rng.permutation(len(seqs))
        seqs = [seqs[i] for i in order]
        pos = int(np.nonzero(order == len(others))[0][0])
        chunking = [[], ["--decode"], ["--chunk", str(int(rng.integers(1, 40)))]][trial % 3]
        got = _run(run_cli, model, seqs, tmp_path, *mode, *chunking)[pos]
        assert np.array_equal(got, alone), f"trial {trial} ({chunking}): max |d| {np.abs(got - alone).max()}"


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_v41_every_sequence_of_a_mixed_batch_equals_alone(make_checkpoint, run_cli, tmp_path, mode):
    """Every member of one V4.1 batch (lengths 1 to 71: inside one window, exactly a window, odd and
    even past it; a duplicate of another member) equals its own run alone, with one prefill, the
    decode path and chunks of 3 and 11 (sequences finish at different steps, so later steps run a
    shrinking batch)."""
    model = make_checkpoint("tiny", seed=2, family="v41")
    rng = np.random.default_rng(8)
    seqs = [rng.integers(3, 1024, n).tolist() for n in (33, 1, 8, 71, 2, 9, 16, 50)]
    seqs.append(list(seqs[3][:40]))  # a prefix of another member: same tokens, separate state
    alone = [_run(run_cli, model, [s], tmp_path, *mode)[0] for s in seqs]
    for chunking in ([], ["--decode"], ["--chunk", "3"], ["--chunk", "11"]):
        got = _run(run_cli, model, seqs, tmp_path, *mode, *chunking)
        for i, (g, a) in enumerate(zip(got, alone)):
            assert np.array_equal(g, a), (f"{chunking}: sequence {i} (length {len(seqs[i])}) differs from alone, "
                                          f"max |d| {np.abs(g - a).max()}")
