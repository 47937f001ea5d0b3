"""tools/train (issue 9): the PyTorch DeepSeek-V4.1 model's eval forward equals `deepinfer logits` and
`deepinfer perplexity` on the same (exported) weights, and the exporter writes the V4.1 tensor table.

Random init of a small config with ratio-2 and ratio-1 kv/index sources, a candidate source and a
reindex layer, hc 4 with Sinkhorn, 8 FP4 experts + shared expert, gate_temp != 1; export; compare.
Skips when torch is not installed (it is not in requirements-dev.txt)."""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import REPO_ROOT  # noqa: E402

sys.path.insert(0, str(REPO_ROOT / "tools" / "train"))
sys.path.insert(0, str(REPO_ROOT / "tools"))

import export as X  # noqa: E402
import model as M  # noqa: E402

CTX = 64


def small_config(**kw) -> "M.V41Config":
    base = dict(vocab_size=1024, dim=128, compress_ratios=(0, 2, 2, 2, 1, 1, 1), kv_source_layers=(1, 3, 4),
                index_source_layers=(1, 3, 4, 6), candidate_source_layer=4, candidate_topk_blocks=8,
                candidate_block_size=8, n_heads=2, head_dim=128, q_lora_rank=64, o_groups=2, o_lora_rank=32,
                moe_inter_dim=64, n_routed_experts=8, n_activated_experts=2, window_size=16, index_n_heads=2,
                index_head_dim=64, index_topk=CTX, max_seq_len=CTX, gate_temp=1.3, dspark_target_layer_ids=(4, 5))
    base.update(kw)
    return M.V41Config(**base)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    torch.manual_seed(0)
    model = M.V41Model(small_config())
    with torch.no_grad():  # non-trivial values where the init is zero
        for blk in model.layers:
            blk.ffn.gate.bias.normal_(0, 0.1)
            blk.attn.attn_sink.normal_(0, 1)
    out = tmp_path_factory.mktemp("v41train") / "ckpt"
    X.export(model, str(out))
    return model, out


def test_simplification_checked():
    """The exact-selection simplification is enforced by the config (README: simplifications)."""
    with pytest.raises(ValueError, match="index_topk"):
        small_config(index_topk=CTX - 1).validate()
    with pytest.raises(ValueError, match="candidate_topk_blocks"):
        small_config(candidate_topk_blocks=7).validate()


def test_tensor_table_matches_generator(exported):
    """Names, dtypes and shapes equal those tools/make_checkpoint.py plans for the same V4.1 layout."""
    import make_checkpoint as mc
    model, out = exported
    c = model.cfg
    p = mc.PresetV41(name="t", vocab_size=c.vocab_size, dim=c.dim, compress_ratios=c.compress_ratios,
                     kv_source_layers=c.kv_source_layers, index_source_layers=c.index_source_layers,
                     candidate_source_layer=c.candidate_source_layer, candidate_topk_blocks=c.candidate_topk_blocks,
                     candidate_block_size=c.candidate_block_size, n_heads=c.n_heads, head_dim=c.head_dim,
                     q_lora_rank=c.q_lora_rank, o_groups=c.o_groups, o_lora_rank=c.o_lora_rank,
                     moe_inter_dim=c.moe_inter_dim, n_routed_experts=c.n_routed_experts,
                     n_activated_experts=c.n_activated_experts, window_size=c.window_size,
                     index_n_heads=c.index_n_heads, index_head_dim=c.index_head_dim, index_topk=c.index_topk,
                     engram_layer_ids=(), engram_max_ngram_size=4, engram_vocab_size=1000, engram_n_heads=4,
                     engram_head_dim=32)
    want = {n: (dt, list(shape)) for t in mc.plan_v41(p, dense=False) for n, (dt, shape, _) in t.stored.items()}
    header, _ = mc.cf.read_safetensors_header(str(out / "model.safetensors"))
    got = {n: (h["dtype"], h["shape"]) for n, h in header.items() if n != "__metadata__"}
    assert got == want
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "deepseek_v41" and cfg["quantization_config"]["weight_block_size"] == [32, 32]


def test_loader_roundtrip(exported):
    """load() returns the exported (quantised) values; the master model's engine-mode forward (weights
    fake-quantised on the fly) gives the same logits."""
    model, out = exported
    loaded = X.load(str(out))
    ids = torch.randint(0, model.cfg.vocab_size, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a = model(ids, num=M.Numerics.engine())
        b = loaded(ids)
    assert torch.equal(a, b)
    _, hid = loaded(ids, return_hidden=True)
    assert len(hid["taps"]) == 2 and hid["taps"][0].dtype == torch.bfloat16 and hid["taps"][0].shape == (2, 40, 128)


def test_logits_equal_engine(exported, deepinfer_bin, run_cli, tmp_path):
    model, out = exported
    loaded = X.load(str(out))
    g = torch.Generator().manual_seed(2)
    worst, agree, total = 0.0, 0, 0
    for n in (CTX, 41, 9):
        ids = torch.randint(0, model.cfg.vocab_size, (1, n), generator=g)
        f = tmp_path / f"l{n}.bin"
        run_cli(["logits", "--model", str(out), "--input-ids", ",".join(map(str, ids[0].tolist())), "--out", str(f)])
        eng = np.fromfile(f, dtype=np.float32).reshape(n, -1)
        with torch.no_grad():
            ours = loaded(ids)[0].numpy()
        d = np.abs(ours - eng)
        worst = max(worst, float(d.max()))
        agree += int((ours.argmax(-1) == eng.argmax(-1)).sum())
        total += n
        scale = float(np.abs(eng).max())
        # Most rows are equal to float32 rounding; a rare BF16 rounding flip (different FP32 summation
        # order) moves a few rows by ~1e-2. A real mismatch (wrong rope, mask, quant) gives O(1).
        assert np.median(d.max(-1)) < 1e-4, (n, np.median(d.max(-1)))
        assert d.max() < 0.05 * scale, (n, d.max(), scale)
    print(f"\nmax |dlogit| {worst:.3g}, argmax agreement {agree}/{total}")
    assert agree >= total - 1


def test_perplexity_equal_engine(exported, deepinfer_bin, run_cli, tmp_path):
    import make_checkpoint as mc
    from tokenizers import Tokenizer
    _, out = exported
    loaded = X.load(str(out))
    text = mc.SAMPLE_TEXT * 2
    (tmp_path / "t.txt").write_text(text, encoding="utf-8")
    r = run_cli(["perplexity", "--model", str(out), "--text-file", str(tmp_path / "t.txt"),
                 "--max-tokens-per-window", str(CTX), "--show-token-ids"])
    eng_ids = [int(x) for x in r.stderr.split("token ids:")[1].split()[0].split(",")]
    ids = Tokenizer.from_file(str(out / "tokenizer.json")).encode(text, add_special_tokens=False).ids
    assert ids == eng_ids
    eng_ppl = float(r.stdout.split("perplexity:")[1].split()[0])
    nll, scored = M.perplexity(loaded, ids, CTX)
    ppl = math.exp(nll)
    print(f"\nperplexity: deepinfer {eng_ppl:.6g}, PyTorch {ppl:.6g} ({scored} tokens)")
    assert f"{ppl:.3g}" == f"{eng_ppl:.3g}" or abs(ppl / eng_ppl - 1) < 2e-4
    assert abs(ppl / eng_ppl - 1) < 1e-3
