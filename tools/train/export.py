"""Export a tools/train V41Model to the DeepSeek-V4.1 checkpoint format `deepinfer` loads, and load one back.

    export(model, out_dir, tokenizer_dir=None) -> dict      config.json (HF form, text_config), inference/config.json,
                                                             model.safetensors, tokenizer.json + tokenizer_config.json
    load(model_dir, device="cpu") -> V41Model               weights = the exported (dequantised) values; evaluate it
                                                             with Numerics.engine(weights_loaded=True)

Formats (docs v4-architecture §1.3, §3; writers and quantizers from tools/ckpt_format.py): FP8 e4m3 dense
weights with 32x32 E8M0 tile scales, routed experts packed FP4 e2m1 (I8 [out, in/2], low nibble = even K)
with per-32 E8M0 scales, BF16 embed/head/norms/gate/compressor/indexer projections, F32 hc tensors,
attn_sink and gate biases. No Engram layers (none in the config: engram keys are omitted).
"""

from __future__ import annotations

import json
import os
import shutil
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
TOOLS = os.path.dirname(HERE)
for p in (HERE, TOOLS):
    if p not in sys.path:
        sys.path.insert(0, p)

import ckpt_format as cf  # noqa: E402
from model import V41Config, V41Model  # noqa: E402

FP8_BLOCK = 32
FP4_GROUP = 32


def entries(model: V41Model):
    """[(checkpoint name, kind, getter, setter)] for every checkpoint tensor; kind in bf16|f32|fp8|fp4."""
    cfg = model.cfg
    out = []

    def param(name, kind, mod, attr, index=None):
        def get():
            t = getattr(mod, attr)
            return (t[index] if index is not None else t).detach().float().cpu()

        def set_(v):
            t = getattr(mod, attr)
            with torch.no_grad():
                (t[index] if index is not None else t).copy_(v.to(t.device, t.dtype))
        out.append((name, kind, get, set_))

    param("embed.weight", "bf16", model.embed, "weight")
    param("head.weight", "bf16", model, "head")
    param("norm.weight", "bf16", model, "norm")
    for l, blk in enumerate(model.layers):
        p = f"layers.{l}."
        for s in ("attn", "ffn"):
            for t in ("fn", "base", "scale"):
                param(f"{p}hc_{s}_{t}", "f32", blk, f"hc_{s}_{t}")
        param(p + "attn_norm.weight", "bf16", blk, "attn_norm")
        param(p + "ffn_norm.weight", "bf16", blk, "ffn_norm")
        a, A = p + "attn.", blk.attn
        param(a + "wq_a.weight", "fp8", A, "wq_a")
        param(a + "q_norm.weight", "bf16", A, "q_norm")
        param(a + "wq_b.weight", "fp8", A, "wq_b")
        param(a + "wkv.weight", "fp8", A, "wkv")
        param(a + "kv_norm.weight", "bf16", A, "kv_norm")
        param(a + "wo_a.weight", "fp8", A, "wo_a")
        param(a + "wo_b.weight", "fp8", A, "wo_b")
        param(a + "attn_sink", "f32", A, "attn_sink")
        if A.kv_source:
            C = A.compressor
            param(a + "compressor.wkv.weight", "bf16", C, "wkv")
            if A.ratio == 2:
                param(a + "compressor.wgate.weight", "bf16", C, "wgate")
            param(a + "compressor.norm.weight", "bf16", C, "norm")
        if A.index_source:
            I = A.indexer
            param(a + "indexer.wq_b.weight", "fp8", I, "wq_b")
            param(a + "indexer.weights_proj.weight", "bf16", I, "weights_proj")
            if A.kv_source:
                param(a + "indexer.wk.weight", "bf16", I, "wk")
                param(a + "indexer.k_norm.weight", "bf16", I, "k_norm")
        f, Fm = p + "ffn.", blk.ffn
        param(f + "gate.weight", "bf16", Fm.gate, "weight")
        param(f + "gate.bias", "f32", Fm.gate, "bias")
        param(f + "gate.bias_vl", "f32", Fm.gate, "bias_vl")
        for e in range(Fm.E):
            for w in ("w1", "w2", "w3"):
                param(f"{f}experts.{e}.{w}.weight", "fp4", Fm, w, index=e)
        for w in ("w1", "w2", "w3"):
            param(f"{f}shared_experts.{w}.weight", "fp8", Fm.shared_experts, w)
    return out


def hf_config(cfg: V41Config) -> dict:
    text = {
        "model_type": "deepseek_v41_text",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": 1,
        "head_dim": cfg.head_dim,
        "qk_rope_head_dim": cfg.rope_head_dim,
        "q_lora_rank": cfg.q_lora_rank,
        "o_lora_rank": cfg.o_lora_rank,
        "o_groups": cfg.o_groups,
        "moe_intermediate_size": cfg.moe_inter_dim,
        "n_routed_experts": cfg.n_routed_experts,
        "n_shared_experts": cfg.n_shared_experts,
        "num_experts_per_tok": cfg.n_activated_experts,
        "scoring_func": "sqrtsoftplus",
        "topk_method": "noaux_tc",
        "norm_topk_prob": bool(cfg.norm_topk_prob),
        "gate_temp": cfg.gate_temp,
        "routed_scaling_factor": cfg.route_scale,
        "swiglu_limit": cfg.swiglu_limit,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.norm_eps,
        "tie_word_embeddings": False,
        "max_position_embeddings": 1048576,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": {"type": "yarn", "factor": cfg.rope_factor, "beta_fast": cfg.beta_fast,
                         "beta_slow": cfg.beta_slow, "original_max_position_embeddings": cfg.original_seq_len},
        "compress_rope_theta": cfg.compress_rope_theta,
        "sliding_window": cfg.window_size,
        "compress_ratios": list(cfg.compress_ratios),
        "kv_source_layer_ids": list(cfg.kv_source_layers),
        "index_source_layer_ids": list(cfg.index_source_layers),
        "index_n_heads": cfg.index_n_heads,
        "index_head_dim": cfg.index_head_dim,
        "index_topk": cfg.index_topk,
        "candidate_source_layer_id": cfg.candidate_source_layer,
        "candidate_topk_blocks": cfg.candidate_topk_blocks,
        "candidate_block_size": cfg.candidate_block_size,
        "hc_mult": cfg.hc_mult,
        "hc_sinkhorn_iters": cfg.hc_sinkhorn_iters,
        "hc_eps": cfg.hc_eps,
        "num_nextn_predict_layers": 0,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "torch_dtype": "bfloat16",
    }
    if cfg.dspark_target_layer_ids:
        text["dspark_target_layer_ids"] = list(cfg.dspark_target_layer_ids)
    return {
        "architectures": ["DeepseekV41ForCausalLM"],
        "model_type": "deepseek_v41",
        "bos_token_id": 0,
        "eos_token_id": 1,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic",
                                "weight_block_size": [FP8_BLOCK, FP8_BLOCK], "scale_fmt": "ue8m0",
                                "expert_dtype": "fp4"},
        "text_config": text,
        # Not read by deepinfer: the trainer's own config (context length, ...) for load().
        "deepinfer_train_config": cfg.to_dict(),
    }


def inference_config(cfg: V41Config) -> dict:
    """DeepSeek's flat ModelArgs form (inference/config.json), as tools/make_checkpoint.py writes it."""
    return {
        "vocab_size": cfg.vocab_size, "dim": cfg.dim, "moe_inter_dim": cfg.moe_inter_dim, "n_layers": cfg.n_layers,
        "n_mtp_layers": 0, "n_heads": cfg.n_heads, "n_routed_experts": cfg.n_routed_experts,
        "n_shared_experts": cfg.n_shared_experts, "n_activated_experts": cfg.n_activated_experts,
        "score_func": "sqrtsoftplus", "gate_temp": cfg.gate_temp, "norm_topk_prob": bool(cfg.norm_topk_prob),
        "route_scale": cfg.route_scale, "swiglu_limit": cfg.swiglu_limit, "q_lora_rank": cfg.q_lora_rank,
        "head_dim": cfg.head_dim, "rope_head_dim": cfg.rope_head_dim, "norm_eps": cfg.norm_eps,
        "o_groups": cfg.o_groups, "o_lora_rank": cfg.o_lora_rank, "window_size": cfg.window_size,
        "compress_ratios": list(cfg.compress_ratios), "kv_source_layers": list(cfg.kv_source_layers),
        "index_source_layers": list(cfg.index_source_layers), "compress_rope_theta": cfg.compress_rope_theta,
        "original_seq_len": cfg.original_seq_len, "rope_theta": cfg.rope_theta, "rope_factor": cfg.rope_factor,
        "beta_fast": cfg.beta_fast, "beta_slow": cfg.beta_slow, "index_n_heads": cfg.index_n_heads,
        "index_head_dim": cfg.index_head_dim, "index_topk": cfg.index_topk,
        "candidate_source_layer": cfg.candidate_source_layer, "candidate_topk_blocks": cfg.candidate_topk_blocks,
        "candidate_block_size": cfg.candidate_block_size, "hc_mult": cfg.hc_mult,
        "hc_sinkhorn_iters": cfg.hc_sinkhorn_iters, "hc_eps": cfg.hc_eps, "dtype": "fp8", "expert_dtype": "fp4",
    }


def _write_json(path: str, obj: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def export(model: V41Model, out_dir: str, tokenizer_dir: str | None = None) -> dict:
    """Writes the checkpoint; returns {"tensors", "bytes" (data section), "file_bytes"}."""
    cfg = model.cfg
    os.makedirs(os.path.join(out_dir, "inference"), exist_ok=True)
    stored: dict[str, tuple[str, list[int]]] = {}
    blobs: dict[str, bytes] = {}
    for name, kind, get, _ in entries(model):
        w = get().numpy().astype(np.float32)
        if kind == "bf16":
            stored[name] = ("BF16", list(w.shape))
            blobs[name] = cf.f32_to_bf16_bits(w).tobytes()
        elif kind == "f32":
            stored[name] = ("F32", list(w.shape))
            blobs[name] = w.astype("<f4").tobytes()
        else:
            base = name[: -len(".weight")]
            if kind == "fp8":
                codes, scales = cf.quantize_fp8_block(w, FP8_BLOCK)
                stored[name] = ("F8_E4M3", list(codes.shape))
            else:
                codes, scales = cf.quantize_fp4_rows(w, FP4_GROUP)
                stored[name] = ("I8", list(codes.shape))
            stored[base + ".scale"] = ("F8_E8M0", list(scales.shape))
            blobs[name] = np.ascontiguousarray(codes).tobytes()
            blobs[base + ".scale"] = np.ascontiguousarray(scales).tobytes()
    st_path = os.path.join(out_dir, "model.safetensors")
    total = cf.write_safetensors(st_path, stored, lambda n: iter([blobs[n]]), {"format": "pt"})
    _write_json(os.path.join(out_dir, "config.json"), hf_config(cfg))
    _write_json(os.path.join(out_dir, "inference", "config.json"), inference_config(cfg))
    if tokenizer_dir:
        for fn in ("tokenizer.json", "tokenizer_config.json"):
            src = os.path.join(tokenizer_dir, fn)
            if os.path.exists(src):
                shutil.copyfile(src, os.path.join(out_dir, fn))
    else:  # the random-checkpoint generator's tokenizer for this vocabulary size (tests)
        import make_checkpoint as mc
        with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
            f.write(mc.build_tokenizer_json(cfg.vocab_size))
        _write_json(os.path.join(out_dir, "tokenizer_config.json"), mc.tokenizer_config())
    return {"tensors": len(stored), "bytes": total, "file_bytes": os.path.getsize(st_path)}


def read_safetensors(path: str) -> dict[str, np.ndarray]:
    header, off = cf.read_safetensors_header(path)
    np_dt = {"F32": "<f4", "BF16": "<u2", "F8_E4M3": "u1", "F8_E8M0": "u1", "I8": "i1", "I64": "<i8"}
    with open(path, "rb") as f:
        data = f.read()
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        a, b = h["data_offsets"]
        out[name] = np.frombuffer(data, dtype=np_dt[h["dtype"]], count=(b - a) // np.dtype(np_dt[h["dtype"]]).itemsize,
                                  offset=off + a).reshape(h["shape"])
    return out


def config_from_dir(model_dir: str) -> V41Config:
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        j = json.load(f)
    if "deepinfer_train_config" in j:
        return V41Config.from_dict(j["deepinfer_train_config"])
    t = j["text_config"]
    d = dict(vocab_size=t["vocab_size"], dim=t["hidden_size"], compress_ratios=t["compress_ratios"],
             kv_source_layers=t["kv_source_layer_ids"], index_source_layers=t["index_source_layer_ids"],
             candidate_source_layer=t.get("candidate_source_layer_id", -1),
             candidate_topk_blocks=t.get("candidate_topk_blocks", 0), candidate_block_size=t.get("candidate_block_size", 0),
             n_heads=t["num_attention_heads"], head_dim=t["head_dim"], q_lora_rank=t["q_lora_rank"],
             o_groups=t["o_groups"], o_lora_rank=t["o_lora_rank"], moe_inter_dim=t["moe_intermediate_size"],
             n_routed_experts=t["n_routed_experts"], n_activated_experts=t["num_experts_per_tok"],
             window_size=t["sliding_window"], index_n_heads=t["index_n_heads"], index_head_dim=t["index_head_dim"],
             index_topk=t["index_topk"], gate_temp=t.get("gate_temp", 1.0), norm_topk_prob=t.get("norm_topk_prob", True),
             route_scale=t["routed_scaling_factor"], swiglu_limit=t["swiglu_limit"], norm_eps=t["rms_norm_eps"],
             max_seq_len=t["index_topk"])
    return V41Config.from_dict(d)


def load(model_dir: str, device: str = "cpu") -> V41Model:
    """A V41Model holding the checkpoint's dequantised weights (exactly the values the engine uses)."""
    cfg = config_from_dir(model_dir)
    model = V41Model(cfg)
    st = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    for name, kind, _, set_ in entries(model):
        if kind == "bf16":
            v = cf.bf16_bits_to_f32(st[name])
        elif kind == "f32":
            v = st[name].astype(np.float32)
        else:
            scale = st[name[: -len(".weight")] + ".scale"]
            v = (cf.dequantize_fp8_block(st[name], scale, FP8_BLOCK) if kind == "fp8"
                 else cf.dequantize_fp4_rows(st[name], scale, FP4_GROUP))
        set_(torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)))
    model.num = model.num.__class__.engine(weights_loaded=True)
    return model.to(device).eval()
