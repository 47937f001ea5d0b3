"""Bad input gets a clear error and a non-zero exit, never a crash: malformed ids, ids outside the
vocabulary, missing or corrupt models, configs that disagree with the weights."""
import json
import shutil

import pytest


def _fails(run_cli, args, *needles):
    r = run_cli(args, check=False)
    assert r.returncode != 0, f"expected failure, got rc 0: {r.stdout}"
    assert r.returncode < 128, f"crashed with signal {r.returncode - 128}: {r.stderr}"
    for n in needles:
        assert n in r.stderr, f"{n!r} not in error: {r.stderr}"
    return r


def test_bad_token_ids(make_checkpoint, run_cli, tmp_path):
    model = make_checkpoint("tiny", seed=0)
    out = tmp_path / "o.bin"
    _fails(run_cli, ["logits", "--model", model, "--input-ids", "1,x,3", "--out", out], "'x'")
    _fails(run_cli, ["logits", "--model", model, "--input-ids", "1,-4", "--out", out], "'-4'")
    _fails(run_cli, ["logits", "--model", model, "--input-ids", "", "--out", out])
    _fails(run_cli, ["logits", "--model", model, "--input-ids", "5,1024", "--out", out], "1024", "vocabulary")
    _fails(run_cli, ["generate", "--model", model, "--prompt-ids", "99999999"], "vocabulary")


def test_missing_model(run_cli, tmp_path):
    _fails(run_cli, ["logits", "--model", tmp_path / "nope", "--input-ids", "1", "--out", tmp_path / "o"], "config")


def _copy(model, tmp_path):
    dst = tmp_path / "m"
    shutil.copytree(model, dst)
    return dst


def test_corrupt_checkpoint(make_checkpoint, run_cli, tmp_path):
    m = _copy(make_checkpoint("tiny", seed=0), tmp_path)
    st = m / "model.safetensors"
    data = st.read_bytes()
    st.write_bytes(data[: len(data) // 2])  # truncated
    _fails(run_cli, ["logits", "--model", m, "--input-ids", "1", "--out", tmp_path / "o"], "model.safetensors",
           "truncated")
    st.write_bytes(b"\xff" * 64)  # header length nonsense
    _fails(run_cli, ["logits", "--model", m, "--input-ids", "1", "--out", tmp_path / "o"], "model.safetensors")


def test_config_disagrees_with_weights(make_checkpoint, run_cli, tmp_path):
    m = _copy(make_checkpoint("tiny", seed=0), tmp_path)
    cfg = json.loads((m / "config.json").read_text())
    cfg["q_lora_rank"] = 256
    (m / "config.json").write_text(json.dumps(cfg))
    _fails(run_cli, ["logits", "--model", m, "--input-ids", "1", "--out", tmp_path / "o"], "wq_a", "expected")
    cfg["q_lora_rank"] = 128
    cfg["model_type"] = "llama"
    (m / "config.json").write_text(json.dumps(cfg))
    _fails(run_cli, ["logits", "--model", m, "--input-ids", "1", "--out", tmp_path / "o"], "model_type")
    cfg["model_type"] = "deepseek_v4"
    cfg["num_hidden_layers"] = 4  # the checkpoint has 5 layers: layer 4's tensors are unexpected
    cfg["compress_ratios"] = cfg["compress_ratios"][:4]
    (m / "config.json").write_text(json.dumps(cfg))
    _fails(run_cli, ["logits", "--model", m, "--input-ids", "1", "--out", tmp_path / "o"], "unexpected", "layers.4")


def test_dense_checkpoint_matches_quantised(make_checkpoint, run_cli, tmp_path):
    """A BF16-dequantised checkpoint stands in for the FP8/FP4 one: same logits, both numerics."""
    import numpy as np

    ids = ",".join(str(i) for i in range(3, 90))
    for mode in (["--dtype", "float32", "--no-simulate-qat"], []):
        outs = []
        for dense in (False, True):
            out = tmp_path / f"o{int(dense)}.bin"
            run_cli(["logits", "--model", make_checkpoint("tiny", seed=0, dense=dense), "--input-ids", ids,
                     "--out", out, *mode])
            outs.append(np.fromfile(out, dtype=np.float32))
        assert np.abs(outs[0] - outs[1]).max() <= 1e-5 * np.abs(outs[0]).max(), mode
