#!/usr/bin/env python3
"""HF transformers DeepseekV4ForCausalLM goldens (FP32, dequantised weights).

Loads a V4 checkpoint with official DeepSeek tensor names (tools/make_checkpoint.py output,
quantised or ``--dense``) into ``DeepseekV4ForCausalLM`` in float32, runs one prefill forward
over N random token ids and saves (np.savez_compressed):

  input_ids        int64 [N]      numpy default_rng(S).integers(3, vocab, N)
  logits           float32 [N, V] all positions (or a subset, see --logit-rows; then
                                  logits_rows int32 [R] names the rows)
  experts_L{l}     int32 [N, topk]        routed expert ids per token, sorted ascending
                                          (hash layers included)
  indexer_L{l}     int32 [N, index_topk]  C4 layers only: selected compressed-entry indices j
                                          (group j = tokens 4j..4j+3, counted from 0, not offset
                                          by the window), sorted ascending, -1 padded
  meta             JSON string    provenance, versions, loading checks, index tie-gap stats,
                                  decode-vs-prefill stats (with --decode)

FP8/FP4 weights are dequantised here (docs/v4-architecture.md §3) and handed to HF as dense
FP32 tensors under their official names, so HF's own name conversion (conversion_mapping.py,
"deepseek_v4") is what maps them; HF's FP8 quantizer path is never used. After loading, every
HF parameter is compared bit-for-bit with the official tensor it should hold (docs §2.14).

Usage:
  python tools/goldens/hf_v4.py --ckpt DIR --input-ids-seed 1 --n-tokens 300 \
      [--device cpu|cuda] [--decode] --out tests/data/goldens/hf_tiny_s1.npz
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden_common as gc  # noqa: E402


# --------------------------------------------------------------------------- name mapping
# Our own statement of the official -> HF 5.17 name mapping (docs §2.14), used only to check
# what HF's loader produced. Experts map to (stacked HF tensor, expert id, part w1/w3/w2).

_TOP = {"embed.weight": "model.embed_tokens.weight", "head.weight": "lm_head.weight",
        "norm.weight": "model.norm.weight", "hc_head_fn": "model.hc_head.hc_fn",
        "hc_head_base": "model.hc_head.hc_base", "hc_head_scale": "model.hc_head.hc_scale"}
_LAYER_PREFIX = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
_HC = {"hc_attn_": "attn_hc.", "hc_ffn_": "ffn_hc."}
_ATTN_PART = {"wq_a": "q_a_proj", "wq_b": "q_b_proj", "wkv": "kv_proj", "wgate": "gate_proj",
              "wo_a": "o_a_proj", "wo_b": "o_b_proj", "q_norm": "q_a_norm", "norm": "kv_norm",
              "ape": "position_bias", "attn_sink": "sinks"}
_SHARED = {"w1": "gate_proj", "w2": "down_proj", "w3": "up_proj"}


def official_to_hf(name: str):
    if name in _TOP:
        return _TOP[name], None, None
    parts = name.split(".")
    assert parts[0] == "layers", name
    head, rest = f"model.layers.{parts[1]}", parts[2:]
    first = rest[0]
    if first in _LAYER_PREFIX:
        return ".".join([head, _LAYER_PREFIX[first]] + rest[1:]), None, None
    for pre, rep in _HC.items():
        if first.startswith(pre):
            return f"{head}.{rep}{first[len(pre):]}", None, None
    if first == "attn":
        sub = rest[1:]
        if sub[0] == "indexer":  # the indexer lives inside HF's CSA compressor
            if sub[1] == "compressor":
                sub = ["compressor", "indexer"] + sub[2:]
            elif sub[1] == "weights_proj":
                sub = ["compressor", "indexer", "scorer"] + sub[1:]
            else:
                sub = ["compressor", "indexer"] + sub[1:]
        sub = [_ATTN_PART.get(c, c) for c in sub]
        return ".".join([head, "self_attn"] + sub), None, None
    if first == "ffn":
        sub = rest[1:]
        if sub[0] == "experts":
            e, part = int(sub[1]), sub[2]
            tgt = "gate_up_proj" if part in ("w1", "w3") else "down_proj"
            return f"{head}.mlp.experts.{tgt}", e, part
        if sub[0] == "shared_experts":
            sub = [sub[0], _SHARED[sub[1]]] + sub[2:]
        if sub == ["gate", "bias"]:
            sub = ["gate", "e_score_correction_bias"]
        return ".".join([head, "mlp"] + sub), None, None
    raise KeyError(f"unmapped official tensor name {name}")


def check_loaded_params(model, dense: dict) -> dict:
    """Every official tensor must sit bit-exactly in its HF parameter/buffer, and every HF
    parameter/persistent buffer must be covered."""
    sd = model.state_dict()
    covered = {}
    bad = []
    inter = model.config.moe_intermediate_size
    for name, t in dense.items():
        if name.startswith("mtp."):
            continue
        hf, e, part = official_to_hf(name)
        if hf not in sd:
            bad.append(f"{name} -> {hf}: not in HF state dict")
            continue
        p = sd[hf].detach().cpu()
        if e is None:
            got, want = p, t
        else:
            got = p[e]
            if part == "w1":
                got = got[:inter]
            elif part == "w3":
                got = got[inter:]
            want = t
        want = want.to(got.dtype) if got.is_floating_point() else want.to(got.dtype)
        if got.shape != want.shape or not torch.equal(got, want):
            bad.append(f"{name} -> {hf}{'' if e is None else f'[{e}].{part}'}: value/shape mismatch "
                       f"{tuple(got.shape)} vs {tuple(want.shape)}")
        covered.setdefault(hf, 0)
        covered[hf] += 1
    buffers_nonpersistent = {n for n, _ in model.named_buffers()
                             if n not in dict(model.state_dict())}
    uncovered = [k for k in sd if k not in covered and k not in buffers_nonpersistent
                 and not k.endswith("inv_freq")]
    return {"mismatched": bad, "uncovered_hf_keys": uncovered,
            "n_official_tensors": len([k for k in dense if not k.startswith("mtp.")]),
            "n_hf_keys_covered": len(covered)}


# --------------------------------------------------------------------------- loading

def load_model(ckpt: str, device: torch.device, workdir: str):
    from transformers import DeepseekV4ForCausalLM

    raw = gc.read_checkpoint(ckpt)
    quantised = gc.is_quantised(raw)
    cfg = gc.read_json(os.path.join(ckpt, "config.json"))
    if cfg is None:
        raise SystemExit(f"{ckpt}/config.json (HF form) is missing")
    qcfg = cfg.pop("quantization_config", None)
    fp8_block = 128
    if qcfg and "weight_block_size" in qcfg:
        fp8_block = int(qcfg["weight_block_size"][0])
        assert qcfg["weight_block_size"][0] == qcfg["weight_block_size"][1]
    dense = gc.dequantise_checkpoint(raw, fp8_block=fp8_block)
    del raw
    cfg["torch_dtype"] = "float32"
    cfg.pop("dtype", None)
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=1)
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in dense.items()}, os.path.join(workdir, "model.safetensors"))

    model, info = DeepseekV4ForCausalLM.from_pretrained(
        workdir, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    model = model.to(device).eval()
    load_report = {
        "checkpoint_was_quantised": quantised,
        "fp8_block": fp8_block,
        "dequantised_by": "tools/goldens/golden_common.py (not HF's FP8 quantizer)",
        "missing_keys": sorted(info.get("missing_keys", [])),
        "unexpected_keys": sorted(info.get("unexpected_keys", [])),
        "mismatched_keys": [str(x) for x in info.get("mismatched_keys", [])],
        "error_msgs": [str(x) for x in info.get("error_msgs", [])],
    }
    load_report["param_check"] = check_loaded_params(model, dense)
    problems = (load_report["missing_keys"] or load_report["mismatched_keys"]
                or load_report["error_msgs"] or load_report["param_check"]["mismatched"]
                or load_report["param_check"]["uncovered_hf_keys"]
                or [k for k in load_report["unexpected_keys"] if not k.startswith("mtp.")])
    if problems:
        print(json.dumps(load_report, indent=1), file=sys.stderr)
        raise SystemExit("HF loading check failed (see report above)")
    return model, cfg, load_report


# --------------------------------------------------------------------------- capture

class Capture:
    """Forward hooks on the routers (experts) and the C4 indexers (selections, scores)."""

    def __init__(self, model):
        self.experts = {}
        self.router_gaps = {}
        self.index_sel = {}
        self.index_scores = {}
        self.handles = []
        for l, layer in enumerate(model.model.layers):
            self.handles.append(layer.mlp.gate.register_forward_hook(self._gate_hook(l)))
            comp = layer.self_attn.compressor
            idx = getattr(comp, "indexer", None) if comp is not None else None
            if idx is not None:
                self.handles.append(idx.register_forward_hook(self._idx_hook(l)))
                self.handles.append(idx.scorer.register_forward_hook(self._score_hook(l)))

    def _gate_hook(self, l):
        def hook(mod, inp, out):
            self.experts.setdefault(l, []).append(out[2].detach().cpu())
            bias = getattr(mod, "e_score_correction_bias", None)
            if bias is not None:  # score-routed layer: margin of the top-k choice
                biased = (mod.score_fn(out[0].float()) + bias.float()).detach().cpu().double()
                srt = torch.sort(biased, dim=-1, descending=True).values
                self.router_gaps.setdefault(l, []).append(srt[:, mod.top_k - 1] - srt[:, mod.top_k])
        return hook

    def _idx_hook(self, l):
        def hook(mod, inp, out):
            self.index_sel.setdefault(l, []).append(out.detach().cpu())
        return hook

    def _score_hook(self, l):
        def hook(mod, inp, out):
            self.index_scores.setdefault(l, []).append(out.detach().cpu())
        return hook

    def reset(self):
        self.experts.clear()
        self.router_gaps.clear()
        self.index_sel.clear()
        self.index_scores.clear()

    def remove(self):
        for h in self.handles:
            h.remove()


def tie_gap_stats(scores: torch.Tensor, n_tokens: int, ratio: int, k: int) -> dict:
    """scores [S, T] (FP32, before masking). For rows whose visible groups ((t+1)//ratio)
    exceed k, the gap between the k-th and (k+1)-th largest visible score."""
    gaps, rel, rows = [], [], []
    T = scores.shape[-1]
    for t in range(n_tokens):
        v = min((t + 1) // ratio, T)
        if v <= k:
            continue
        s = torch.sort(scores[t, :v].double(), descending=True).values
        g = (s[k - 1] - s[k]).item()
        gaps.append(g)
        rel.append(g / max(abs(s[k - 1].item()), 1e-30))
        rows.append(t)
    if not gaps:
        return {"rows_selecting": 0}
    gaps_a = np.array(gaps)
    i = int(np.argmin(gaps_a))
    return {
        "rows_selecting": len(gaps),
        "min_gap": float(gaps_a.min()),
        "min_gap_row": rows[i],
        "min_rel_gap": float(np.min(rel)),
        "n_exact_ties": int((gaps_a == 0).sum()),
        "n_gap_below_1e-5": int((gaps_a < 1e-5).sum()),
        "median_gap": float(np.median(gaps_a)),
        "frac_scores_exactly_zero": float((scores[:, :T] == 0).float().mean().item()),
    }


# --------------------------------------------------------------------------- main

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", required=True, help="checkpoint dir (official names, HF-form config.json)")
    ap.add_argument("--input-ids-seed", type=int, required=True)
    ap.add_argument("--n-tokens", type=int, required=True)
    ap.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    ap.add_argument("--decode", action="store_true",
                    help="also feed the tokens one at a time through HF's cache and record "
                         "decode-vs-prefill differences in meta")
    ap.add_argument("--save-decode-logits", action="store_true",
                    help="with --decode: also store decode_logits (same rows as logits)")
    ap.add_argument("--logit-rows", default="auto",
                    help="'all', 'auto' (all unless the file would exceed ~3 MB) or a count R "
                         "(R evenly spaced rows incl. the last)")
    ap.add_argument("--ckpt-info", action="append", default=[], metavar="KEY=VALUE",
                    help="provenance recorded in meta.checkpoint (e.g. preset=tiny seed=1)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--workdir", default=None, help="scratch dir for the dense FP32 copy (default: temp)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    t0 = time.time()
    dev = gc.setup_torch(args.device, args.threads)
    with tempfile.TemporaryDirectory(prefix="hf_v4_") as tmp:
        model, cfg, load_report = load_model(args.ckpt, dev, args.workdir or tmp)
    t_load = time.time() - t0
    conf = model.config
    vocab = conf.vocab_size
    n = args.n_tokens
    ids_np = gc.make_input_ids(args.input_ids_seed, n, vocab)
    ids = torch.from_numpy(ids_np).view(1, n).to(dev)

    cap = Capture(model)
    t1 = time.time()
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=False, logits_to_keep=0)
    t_prefill = time.time() - t1
    logits = out.logits[0].float().cpu()
    assert logits.shape == (n, vocab)

    arrays = {"input_ids": ids_np}
    topk = conf.num_experts_per_tok
    for l in range(conf.num_hidden_layers):
        (e,) = cap.experts[l]
        arrays[f"experts_L{l}"] = np.sort(e.numpy().astype(np.int32), axis=1)
        assert arrays[f"experts_L{l}"].shape == (n, topk)

    router_gap = {}
    for l, g in sorted(cap.router_gaps.items()):
        g = torch.cat(g)
        router_gap[f"L{l}"] = {"min_gap": float(g.min()), "min_gap_token": int(g.argmin()),
                               "n_gap_below_1e-3": int((g < 1e-3).sum()),
                               "n_gap_below_1e-2": int((g < 1e-2).sum())}

    ratio = conf.compress_rates["compressed_sparse_attention"]
    k_idx = conf.index_topk
    tie = {}
    c4_layers = sorted(cap.index_sel)
    for l in c4_layers:
        (sel,) = cap.index_sel[l]
        (sc,) = cap.index_scores[l]
        arrays[f"indexer_L{l}"] = gc.pad_sorted(sel[0].numpy(), k_idx)
        # sanity: every valid pick is visible
        vis = (np.arange(n) + 1) // ratio
        a = arrays[f"indexer_L{l}"]
        assert np.all((a < 0) | (a < vis[:, None])), f"layer {l}: invisible pick"
        tie[f"L{l}"] = tie_gap_stats(sc[0], n, ratio, min(k_idx, sc.shape[-1]))
    sel_gaps = [v["min_gap"] for v in tie.values() if v.get("rows_selecting")]
    tie_summary = {"index_topk": k_idx, "index_n_heads": conf.index_n_heads,
                   "min_gap_all_layers": min(sel_gaps) if sel_gaps else None,
                   "per_layer": tie}

    decode_report = None
    decode_logits = None
    if args.decode:
        cap.reset()
        t2 = time.time()
        dl = []
        with torch.no_grad():
            past = None
            for t in range(n):
                o = model(input_ids=ids[:, t:t + 1], past_key_values=past, use_cache=True)
                past = o.past_key_values
                dl.append(o.logits[0, -1].float().cpu())
        t_decode = time.time() - t2
        decode_logits = torch.stack(dl)
        diff = (decode_logits - logits).abs()
        per_pos = diff.max(dim=1).values
        exp_mism = {}
        for l in range(conf.num_hidden_layers):
            d_e = np.sort(torch.cat(cap.experts[l]).numpy().astype(np.int32), axis=1)
            exp_mism[f"L{l}"] = int((d_e != arrays[f"experts_L{l}"]).any(axis=1).sum())
        idx_mism = {}
        for l in c4_layers:
            rows = [r[0, 0].numpy() for r in cap.index_sel[l]]
            d_i = gc.pad_sorted(rows, k_idx)
            idx_mism[f"L{l}"] = int((d_i != arrays[f"indexer_L{l}"]).any(axis=1).sum())
        decode_report = {
            "max_abs_diff": float(diff.max()),
            "max_abs_diff_pos": int(per_pos.argmax()),
            "mean_abs_diff": float(diff.mean()),
            "max_abs_logit": float(logits.abs().max()),
            "argmax_agree": int((decode_logits.argmax(1) == logits.argmax(1)).sum()),
            "expert_rows_differing": exp_mism,
            "indexer_rows_differing": idx_mism,
        }
        print(f"[hf_v4] decode vs prefill: max|dlogit| {decode_report['max_abs_diff']:.3e} "
              f"(pos {decode_report['max_abs_diff_pos']}), argmax agree "
              f"{decode_report['argmax_agree']}/{n}", file=sys.stderr)

    # logits rows (keep files small)
    lg = logits.numpy().astype(np.float32)
    rows = choose_rows(args.logit_rows, n, vocab)
    meta_logits = {"full_shape": [n, vocab], "full_sha256": gc.sha256_array(lg)}
    if rows is None:
        arrays["logits"] = lg
        meta_logits["rows"] = "all"
    else:
        arrays["logits"] = lg[rows]
        arrays["logits_rows"] = rows.astype(np.int32)
        meta_logits["rows"] = f"subset of {len(rows)} (see logits_rows)"
    if decode_logits is not None and args.save_decode_logits:
        dnp = decode_logits.numpy().astype(np.float32)
        arrays["decode_logits"] = dnp if rows is None else dnp[rows]

    meta = {
        "kind": "hf_v4 prefill golden",
        "script": "tools/goldens/hf_v4.py",
        "command": gc.command_line(args.ckpt),
        "checkpoint": gc.checkpoint_provenance(args.ckpt, args.ckpt_info),
        "versions": gc.versions(),
        "device": gc.device_name(dev),
        "dtype": "float32 (weights dequantised to FP32, FP32 compute, eager attention, no TF32)",
        "model_class": type(model).__name__,
        "layer_types": list(conf.layer_types),
        "mlp_layer_types": list(conf.mlp_layer_types),
        "input_ids_seed": args.input_ids_seed,
        "input_ids_rule": "numpy.random.default_rng(seed).integers(3, vocab, size=n, dtype=int64)",
        "n_tokens": n,
        "vocab_size": vocab,
        "logits": meta_logits,
        "experts_rule": "router top-k ids per token (hash layers: tid2eid[token]), sorted ascending",
        "indexer_rule": ("C4 layers: HF indexer picks per query position; compressed-entry index j "
                         "(tokens ratio*j .. ratio*j+ratio-1), from 0, sorted ascending, -1 padded"),
        "index_tie_gap": tie_summary,
        "router_tie_gap": {"rule": "per score-routed layer, min over tokens of the gap between the "
                                   "k-th and (k+1)-th biased score sqrtsoftplus(logit)+bias",
                           "per_layer": router_gap},
        "loading": load_report,
        "decode_vs_prefill": decode_report,
    }
    size = gc.save_golden(args.out, arrays, meta)
    print(f"[hf_v4] seconds: load {t_load:.1f}, prefill {t_prefill:.1f}"
          + (f", decode {t_decode:.1f}" if args.decode else ""), file=sys.stderr)
    print(f"[hf_v4] wrote {args.out} ({size} bytes) in {time.time() - t0:.1f}s; "
          f"min index tie gap {tie_summary['min_gap_all_layers']}", file=sys.stderr)
    if size > gc.MAX_GOLDEN_BYTES:
        print(f"[hf_v4] warning: {args.out} is {size} bytes (> 3 MB); use --logit-rows", file=sys.stderr)
    return 0


def choose_rows(spec: str, n: int, vocab: int):
    if spec == "all":
        return None
    if spec == "auto":
        if n * vocab * 4 <= 2_500_000:
            return None
        r = max(16, 2_000_000 // (vocab * 4))
    else:
        r = int(spec)
    if r >= n:
        return None
    rows = np.unique(np.round(np.linspace(0, n - 1, r)).astype(np.int64))
    return rows


if __name__ == "__main__":
    sys.exit(main())
