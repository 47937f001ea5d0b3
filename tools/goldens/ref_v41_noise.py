#!/usr/bin/env python3
"""How far DeepSeek's V4.1 reference drifts from its own goldens when one FP32 summation order
changes: the noise floor for the free-running comparisons of tests/python/test_goldens_v41.py.

For each free-running golden (tests/data/goldens/ref41_*.npz) this rebuilds the golden's
checkpoint, runs the reference exactly as tools/goldens/ref_v41.py does (same loading, indexer-key
fix) except that every block's hc projection `F.linear(x, hc_fn)` is accumulated in FP64 (an
equally valid order), teacher-forced on the golden's prompt and greedy tokens, and prints the
mean KL and argmax agreement against the golden's logits (prefill rows and decode steps), i.e. the
same metrics the test applies to our engine.

  python tools/goldens/ref_v41_noise.py [--ref-dir .ref/v41] [GOLDEN.npz ...]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
import golden_common as gc  # noqa: E402
import ref_v41 as rv  # noqa: E402


def log_softmax(x):
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def metrics(ref, got):
    kl = (np.exp(log_softmax(ref)) * (log_softmax(ref) - log_softmax(got))).sum(-1)
    return float(kl.mean()), float((ref.argmax(-1) == got.argmax(-1)).mean())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref-dir", default=str(REPO / ".ref" / "v41"))
    ap.add_argument("goldens", nargs="*")
    args = ap.parse_args(argv)
    goldens = args.goldens or sorted(str(p) for p in (REPO / "tests/data/goldens").glob("ref41_*.npz"))
    ref, _ = rv.import_reference(os.path.abspath(args.ref_dir))
    F = torch.nn.functional
    torch.set_grad_enabled(False)
    for path in goldens:
        z = np.load(path)
        ck = json.loads(str(z["meta"]))["checkpoint"]
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([sys.executable, str(REPO / "tools/make_checkpoint.py"), "--family", "v41", "--preset",
                            ck["preset"], "--seed", str(ck["seed"]), "--out", tmp], check=True,
                           stdout=subprocess.DEVNULL)
            margs, _ = rv.build_args(ref, gc.read_json(os.path.join(tmp, "inference", "config.json")), 4096)
            torch.set_default_dtype(torch.bfloat16)
            model = ref.Transformer(margs, rv.MinimalTokenizer(os.path.join(tmp, "tokenizer.json")))
            model.eval()
            rv.load_weights(model, rv.read_weights(tmp))
        cap = rv.Capture(ref, model, margs, fix=True)
        for layer in model.layers:
            def mixes(x, fn, scale, base, layer=layer):
                x = x.flatten(2).float()
                rs = torch.rsqrt(x.square().mean(-1, keepdim=True) + layer.norm_eps)
                m = F.linear(x.double(), fn.double()).float() * rs
                return ref.hc_split_sinkhorn(m, scale, base, layer.hc_mult, layer.hc_sinkhorn_iters, layer.hc_eps)
            layer.hc_mixes = mixes
        prompt, tokens = z["input_ids"].tolist(), z["tokens"].tolist()
        P = len(prompt)
        _, last, _ = model(torch.tensor([prompt]), 0)
        steps = [last[0].float().numpy()]
        cap.phase = "decode"
        for i, t in enumerate(tokens):
            _, lg, _ = model(torch.tensor([[t]]), P + i)
            steps.append(lg[0].float().numpy())
        kp, ap_ = metrics(z["prefill_logits"], cap.full_logits)
        ks, as_ = metrics(z["logits"], np.stack(steps))
        print(f"{Path(path).stem}: prefill rows KL {kp:.3f} argmax {ap_:.3f}; decode steps KL {ks:.3f} argmax {as_:.3f}")


if __name__ == "__main__":
    main()
