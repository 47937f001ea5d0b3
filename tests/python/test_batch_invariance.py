"""Batch invariance: a sequence's logits are bitwise identical alone and inside batches of random
composition (other sequences of random lengths, in random order, prefill and decode mixed by
ragged lengths), in both numerics modes. The batched forward stacks every sequence's tokens into
one GEMM batch, so this holds only because every kernel's per-row reduction order is fixed."""
import numpy as np
import pytest


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


@pytest.mark.parametrize("mode", [[], ["--dtype", "float32", "--no-simulate-qat"]], ids=["bf16-qat", "fp32"])
def test_logits_bitwise_identical_across_batches(make_checkpoint, run_cli, tmp_path, mode):
    model = make_checkpoint("tiny", seed=3)
    rng = np.random.default_rng(5)
    target = rng.integers(3, 1024, 90).tolist()
    alone = _run(run_cli, model, [target], tmp_path, *mode)[0]
    for trial in range(12):
        others = [rng.integers(3, 1024, int(rng.integers(1, 140))).tolist() for _ in range(int(rng.integers(1, 5)))]
        seqs = others + [target]
        order = rng.permutation(len(seqs))
        seqs = [seqs[i] for i in order]
        pos = int(np.nonzero(order == len(others))[0][0])
        chunking = [[], ["--decode"], ["--chunk", str(int(rng.integers(1, 40)))]][trial % 3]
        got = _run(run_cli, model, seqs, tmp_path, *mode, *chunking)[pos]
        assert np.array_equal(got, alone), f"trial {trial} ({chunking}): max |d| {np.abs(got - alone).max()}"
