"""Bad input gets a clear error and a non-zero exit, never a crash: malformed ids, ids outside the
vocabulary, missing or corrupt models, configs that disagree with the weights; for V4.1 also missing
Engram hash data, Engram table sizes, missing tensors and layer-role lists."""
import json
import shutil
import struct

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


# --- V4.1 -----------------------------------------------------------------------------------------

def _edit_configs(m, text_config=None, flat=None):
    """Edits config.json's text_config (HF form) and inference/config.json (flat form) in place."""
    if text_config:
        cfg = json.loads((m / "config.json").read_text())
        cfg["text_config"].update(text_config)
        (m / "config.json").write_text(json.dumps(cfg))
    if flat:
        inf = m / "inference" / "config.json"
        cfg = json.loads(inf.read_text())
        cfg.update(flat)
        inf.write_text(json.dumps(cfg))


def _logits_fails(run_cli, m, tmp_path, *needles):
    r = _fails(run_cli, ["logits", "--model", m, "--input-ids", "5,6,7", "--out", tmp_path / "o"], *needles)
    assert "Traceback" not in r.stderr and r.stderr.lstrip().startswith("error"), r.stderr
    return r


@pytest.fixture
def v41_copy(make_checkpoint, tmp_path):
    return _copy(make_checkpoint("tiny", seed=1, family="v41"), tmp_path)


def test_v41_copy_loads(v41_copy, run_cli, tmp_path):
    """The unedited copy runs (so each failure below is due to its one edit), in both config forms:
    the HF config.json and DeepSeek's flat inference/config.json in its place."""
    run_cli(["logits", "--model", v41_copy, "--input-ids", "5,6,7", "--out", tmp_path / "a"])
    shutil.copy(v41_copy / "inference" / "config.json", v41_copy / "config.json")
    run_cli(["logits", "--model", v41_copy, "--input-ids", "5,6,7", "--out", tmp_path / "b"])
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes()


def test_v41_missing_engram_hash_data(v41_copy, run_cli, tmp_path):
    (v41_copy / "engram_hash.safetensors").unlink()
    _logits_fails(run_cli, v41_copy, tmp_path, "engram_hash.safetensors", "tools/engram/hash_data.py")
    _fails(run_cli, ["generate", "--model", v41_copy, "--prompt-ids", "5,6", "--max-tokens", "2"],
           "engram_hash.safetensors", "tools/engram/hash_data.py")


def test_v41_engram_num_embeddings_disagrees_with_the_table(v41_copy, run_cli, tmp_path):
    cfg = json.loads((v41_copy / "config.json").read_text())["text_config"]
    rows = list(cfg["engram_num_embeddings"])
    bad = rows[:-1] + [rows[-1] + 2]
    _edit_configs(v41_copy, {"engram_num_embeddings": bad}, {"engram_num_embeddings": bad})
    r = _logits_fails(run_cli, v41_copy, tmp_path)
    assert "engram" in r.stderr and (str(rows[-1]) in r.stderr or str(bad[-1]) in r.stderr), r.stderr
    # One entry for two Engram layers.
    _edit_configs(v41_copy, {"engram_num_embeddings": rows[:1]}, {"engram_num_embeddings": rows[:1]})
    _logits_fails(run_cli, v41_copy, tmp_path, "engram_num_embeddings")


def test_v41_missing_indexer_key_weight(v41_copy, run_cli, tmp_path):
    """A kv-source layer (4) without attn.indexer.wk.weight: the entry is dropped from the
    safetensors header (the data section is left as it was)."""
    st = v41_copy / "model.safetensors"
    data = st.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    del header["layers.4.attn.indexer.wk.weight"]
    new = json.dumps(header).encode()
    new += b" " * (-len(new) % 8)
    st.write_bytes(struct.pack("<Q", len(new)) + new + data[8 + n:])
    _logits_fails(run_cli, v41_copy, tmp_path, "missing tensor", "layers.4.attn.indexer.wk.weight")


def _set_kv_sources(m, form, layers):
    if form == "hf":
        _edit_configs(m, {"kv_source_layer_ids": layers})
    else:  # config.json holds DeepSeek's flat form
        cfg = json.loads((m / "config.json").read_text())
        cfg["kv_source_layers"] = layers
        (m / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("form", ["hf", "flat"])
def test_v41_kv_source_layers_not_ascending(v41_copy, run_cli, tmp_path, form):
    if form == "flat":  # DeepSeek's flat form (inference/config.json) as the model's config.json
        shutil.copy(v41_copy / "inference" / "config.json", v41_copy / "config.json")
    for layers, needle in (([4, 2, 6], "ascending"), ([2, 2, 4, 6], "ascending"), ([2, 4, 60], "60")):
        _set_kv_sources(v41_copy, form, layers)
        _logits_fails(run_cli, v41_copy, tmp_path, "kv_source_layers", needle)
