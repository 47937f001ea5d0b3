"""Our CPU forward against goldens produced by HF transformers' DeepseekV4ForCausalLM (FP32, no
fake quantisation) and by DeepSeek's own V4 reference inference/model.py (BF16, QAT simulated).
Goldens and the scripts that made them: tests/data/goldens/, tools/goldens/.

HF (FP32): our `--dtype float32 --no-simulate-qat` must match to max |delta logit| / max |logit|
<= 1e-4 on every position, with identical argmax, routed experts and indexer top-k sets.
"""
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

GOLDENS = Path(__file__).resolve().parents[1] / "data" / "goldens"
HF_FILES = sorted(GOLDENS.glob("hf_*.npz"))
REF_FILES = sorted(GOLDENS.glob("ref_*.npz"))


def _meta(z):
    return json.loads(str(z["meta"]))


def _checkpoint_for(meta, make_checkpoint):
    """Regenerates the golden's checkpoint and checks it is byte-identical to the one the golden
    was made from (a generator change must come with regenerated goldens)."""
    ck = meta["checkpoint"]
    dense = str(ck.get("dense", "0")) in ("1", "true", "True")
    model = make_checkpoint(ck["preset"], seed=int(ck["seed"]), dense=dense)
    for name, want in ck["safetensors_sha256"].items():
        got = hashlib.sha256((model / name).read_bytes()).hexdigest()
        assert got == want, (f"{model / name} differs from the checkpoint the golden was made from: "
                             "tools/make_checkpoint.py changed; regenerate with tools/goldens/make_all.sh")
    return make_checkpoint(ck["preset"], seed=int(ck["seed"]))


def _run_logits(run_cli, model, ids, tmp_path, *extra):
    out, trace = tmp_path / "logits.bin", tmp_path / "trace"
    run_cli(["logits", "--model", model, "--input-ids", ",".join(map(str, ids)), "--out", out, "--trace", trace,
             *extra], timeout=900)
    return np.fromfile(out, dtype=np.float32).reshape(len(ids), -1), trace


@pytest.mark.parametrize("golden", HF_FILES, ids=[p.stem for p in HF_FILES])
@pytest.mark.parametrize("path", ["prefill", "decode"])
def test_hf_fp32(golden, path, make_checkpoint, run_cli, tmp_path):
    z = np.load(golden)
    meta = _meta(z)
    model = _checkpoint_for(meta, make_checkpoint)
    ids = z["input_ids"].tolist()
    extra = ["--dtype", "float32", "--no-simulate-qat"] + (["--decode"] if path == "decode" else [])
    ours, trace = _run_logits(run_cli, model, ids, tmp_path, *extra)
    ref = z["logits"]
    rel = np.abs(ours - ref).max() / np.abs(ref).max()
    assert rel <= 1e-4, f"max|d|/max|logit| = {rel:.3g}"
    assert (ours.argmax(-1) == ref.argmax(-1)).all()
    for key in z.files:
        if key.startswith("experts_L") or key.startswith("indexer_L"):
            kind, layer = key.split("_L")
            got = np.fromfile(trace / f"{kind}.L{layer}.i32", dtype=np.int32).reshape(z[key].shape)
            bad = np.nonzero((got != z[key]).any(-1))[0]
            assert bad.size == 0, f"{key}: {bad.size} positions differ, first at {bad[:5]}"
