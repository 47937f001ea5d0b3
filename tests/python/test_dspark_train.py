"""tools/train/dspark.py: export names/shapes, the training loss, the ring mask and the acceptance count.

CPU only, a tiny random V4.1 backbone (tools/train/model.py); < 60 s on two cores.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "train"))

import dspark as D  # noqa: E402
import train_dspark as T  # noqa: E402
from model import Numerics, V41Model  # noqa: E402


@pytest.fixture(scope="module")
def toy():
    torch.manual_seed(0)
    torch.set_num_threads(2)
    cfg = T.smoke_config()
    bb = V41Model(cfg).eval()
    for p in bb.parameters():
        p.requires_grad_(False)
    dcfg = D.DSparkConfig(block_size=5, noise_token_id=cfg.vocab_size - 1, markov_rank=32, n_routed_experts=4,
                          n_activated_experts=2)
    torch.manual_seed(1)
    draft = D.DSparkDraft(cfg, dcfg, bb.embed.weight, bb.head)
    return bb, draft, D.backbone_fn(bb, draft.cfg.target_layer_ids)


def test_export_names_shapes_dtypes_and_config(toy, tmp_path):
    bb, draft, _ = toy
    import export as E
    ck = tmp_path / "ckpt"
    E.export(bb, str(ck))
    summary = D.export_dspark(draft, str(ck))
    import ckpt_format as cf
    header, _ = cf.read_safetensors_header(str(ck / D.DSPARK_FILE))
    got = {n: (h["dtype"], tuple(h["shape"])) for n, h in header.items() if n != "__metadata__"}
    want = D.expected_names(bb.cfg, draft.cfg)
    assert got == want
    assert summary["tensors"] == len(want)
    # the V4.1 census: 30 non-expert names per stage (+ experts and their scales aside), stage extras
    assert "mtp.0.main_proj.weight" in got and got["mtp.0.main_proj.weight"] == ("F8_E4M3", (64, 3 * 64))
    assert got["mtp.2.confidence_head.proj.weight"] == ("BF16", (1, 64 + 32))
    assert got["mtp.2.markov_head.embed.weight"] == ("BF16", (320, 32))
    assert not any(n.startswith("mtp.1.markov") or n.startswith("mtp.1.main") for n in got)
    index = json.loads((ck / D.INDEX_FILE).read_text())["weight_map"]
    assert all(index[n] == D.DSPARK_FILE for n in want)
    assert index["embed.weight"] == "model.safetensors"
    text = json.loads((ck / "config.json").read_text())["text_config"]
    assert text["dspark_block_size"] == 5 and text["dspark_noise_token_id"] == 319
    assert text["dspark_target_layer_ids"] == [1, 2, 3] and text["dspark_markov_rank"] == 32
    assert text["dspark_n_routed_experts"] == 4 and text["dspark_num_experts_per_tok"] == 2
    assert text["num_nextn_predict_layers"] == 3 and text["compress_ratios"] == [0, 0, 2, 1, 0, 0, 0]
    flat = json.loads((ck / "inference" / "config.json").read_text())
    assert flat["n_mtp_layers"] == 3 and flat["dspark_n_activated_experts"] == 2
    # idempotent
    D.export_dspark(draft, str(ck))
    assert json.loads((ck / "config.json").read_text())["text_config"]["compress_ratios"] == [0, 0, 2, 1, 0, 0, 0]

    # round trip: the reloaded (dequantised) draft computes what the fake-quantised one does
    torch.manual_seed(5)
    fresh = D.DSparkDraft(bb.cfg, draft.cfg, bb.embed.weight, bb.head)
    D.load_dspark(str(ck), fresh)
    fresh.num = Numerics.engine(weights_loaded=True)
    ids = torch.randint(0, 320, (1, 30))
    _, taps = toy[2](ids)
    p, t = torch.tensor([20]), ids[:, 21]
    a = draft.draft_block(taps, p, t)
    b = fresh.draft_block(taps, p, t)
    assert torch.equal(a[0], b[0])
    assert torch.allclose(a[1], b[1], atol=1e-5)

    # the engine still loads the checkpoint with the mtp.* tensors and dspark keys
    exe = Path(os.environ.get("DEEPINFER_BUILD_DIR", ROOT / "build")) / "src" / "deepinfer"
    if exe.exists():
        out = tmp_path / "x.bin"
        r = subprocess.run([str(exe), "logits", "--model", str(ck), "--input-ids", "1,2,3", "--out", str(out)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr


def test_ring_mask(toy):
    """Draft rows see main_kv of positions p-W+1 .. p only (the 128-slot ring, here W = 16)."""
    bb, draft, f = toy
    W = bb.cfg.window_size
    ids = torch.randint(0, 320, (1, 60))
    _, taps = f(ids)
    p = 40
    base = draft.trunk(taps, ids[:, p + 1:p + 2], torch.tensor([[p]]))[1]
    for q, changes in ((p - W, False), (p + 1, False), (p + 5, False), (p - W + 1, True), (p, True)):
        t2 = taps.clone()
        t2[:, q] += 1.0
        out = draft.trunk(t2, ids[:, p + 1:p + 2], torch.tensor([[p]]))[1]
        assert (not torch.equal(out, base)) == changes, q


def test_loss_decreases(toy):
    bb, _, f = toy
    torch.manual_seed(2)
    draft = D.DSparkDraft(bb.cfg, D.DSparkConfig(block_size=5, noise_token_id=319, markov_rank=32,
                                                 n_routed_experts=4, n_activated_experts=2),
                          bb.embed.weight, bb.head)
    rng = np.random.default_rng(0)
    toks = T.synthetic_tokens(4000, 320, 0)
    ids = T.sample_batch(toks, 4, 48, rng)
    logits, taps = f(ids)
    anchors = T.sample_anchors(48, 12, 5, rng)
    rows = anchors[:, None] + 1 + torch.arange(5)
    opt = torch.optim.AdamW(draft.parameters(), lr=3e-3)
    losses = []
    for _ in range(12):
        dl, cl = draft.forward_train(taps, ids, anchors, num=Numerics.train())
        loss, met = D.dspark_loss(dl, cl, logits[:, rows])
        opt.zero_grad()
        loss.backward()
        opt.step()
        draft.update_moe_bias()
        losses.append(met["loss"])
    assert np.isfinite(losses).all()
    assert np.mean(losses[-3:]) < losses[0] - 0.05, losses


def test_loss_formula():
    """L = sum_k w_k (0.1 CE + 0.9 TV + BCE(c_k, 1 - TV_k)) / sum_k w_k, w_k = exp(-(k-1)/G)."""
    torch.manual_seed(3)
    G, V = 5, 7
    dl, tl, cl = torch.randn(2, G, V), torch.randn(2, G, V), torch.randn(2, G)
    loss, _ = D.dspark_loss(dl, cl, tl)
    tot = 0.0
    for a in range(2):
        num = den = 0.0
        for k in range(G):
            pd, pt = dl[a, k].softmax(-1), tl[a, k].softmax(-1)
            tv = 0.5 * (pd - pt).abs().sum()
            ce = -pd.log()[pt.argmax()]
            s = torch.sigmoid(cl[a, k])
            bce = -((1 - tv) * s.log() + tv * (1 - s).log())
            w = np.exp(-k / G)
            num += w * (0.1 * ce + 0.9 * tv + bce)
            den += w
        tot += num / den
    assert abs(float(loss) - float(tot) / 2) < 1e-5


def _greedy(f, ids, n):
    seq = list(ids)
    for _ in range(n):
        logits, _ = f(torch.tensor([seq]))
        seq.append(int(logits[0, -1].argmax()))
    return seq


def test_acceptance_matches_brute_force(toy):
    bb, draft, f = toy
    torch.manual_seed(4)
    # train a few steps so that some drafts are accepted
    toks = T.synthetic_tokens(4000, 320, 1)
    rng = np.random.default_rng(1)
    opt = torch.optim.AdamW(draft.parameters(), lr=3e-3)
    for _ in range(6):
        ids = T.sample_batch(toks, 4, 48, rng)
        logits, taps = f(ids)
        anchors = T.sample_anchors(48, 12, 5, rng)
        dl, cl = draft.forward_train(taps, ids, anchors, num=Numerics.train())
        loss, _ = D.dspark_loss(dl, cl, logits[:, anchors[:, None] + 1 + torch.arange(5)])
        opt.zero_grad()
        loss.backward()
        opt.step()
    draft.eval()
    prompts = T.heldout_prompts(toks, 3, 12, 0)
    max_new, G = 14, 5
    res = D.measure_acceptance(f, draft, prompts, max_new, keep_trace=True)

    # brute force: per prompt, one row at a time; verification by generating the greedy continuation
    # token by token; the emitted text must be the plain greedy continuation
    accepted = []
    for r in range(prompts.shape[0]):
        seq = prompts[r].tolist()
        L = len(seq)
        while len(seq) - L < max_new:
            logits, taps = f(torch.tensor([seq]))
            bonus = int(logits[0, -1].argmax())
            drafts, _, _ = draft.draft_block(taps, torch.tensor([len(seq) - 1]), torch.tensor([bonus]))
            cont = _greedy(f, seq + [bonus], G)[len(seq) + 1:]
            a = 0
            while a < G and int(drafts[0, a]) == cont[a]:
                a += 1
            accepted.append((r, a))
            seq = seq + [bonus] + cont[:a]
        assert seq[:L + max_new] == _greedy(f, prompts[r].tolist(), max_new)[:L + max_new]
    got = sorted((t[0], i, t[4]) for i, t in enumerate(res.trace))
    per_row = {}
    for r, _, a in got:
        per_row.setdefault(r, []).append(a)
    want = {}
    for r, a in accepted:
        want.setdefault(r, []).append(a)
    assert per_row == want
    assert res.steps == len(accepted)
    assert abs(res.tau_excl_bonus - np.mean([a for _, a in accepted])) < 1e-12
    assert abs(res.tau_incl_bonus - res.tau_excl_bonus - 1) < 1e-12
    assert sum(res.histogram) == res.steps


def test_ece():
    assert D.ece(np.array([0.05, 0.05, 0.95, 0.95]), np.array([0, 0, 1, 1])) == pytest.approx(0.05)
    assert D.ece(np.array([0.5, 0.5]), np.array([0, 1])) == pytest.approx(0.0)
