#!/usr/bin/env python3
"""DeepSeek-V4.1 reference goldens, layer by layer: every sublayer's input and output in a prefill.

The free-running comparison (ref_v41.py goldens) cannot be elementwise: one flipped BF16 rounding
(an FP32 summation-order difference, e.g. in the hc projection GEMM) feeds an FP8 fake-quantisation
step and spreads through a random-weight model. This golden makes the comparison local: our engine
replays it with teacher forcing (DEEPINFER_FORCE_DIR, src/core/debug_dump.h): before every sublayer
its input is replaced by the reference's, so each sublayer's output is compared on identical input.

Runs the same reference and loading as ref_v41.py (tools/goldens/ref_v41.py: the V4.1 reference
copy in .ref/v41, the indexer-key fix of docs §2.6) with one more documented choice: torch.topk's
order among exactly tied scores is implementation-defined (docs §6.3), so the run resolves ties as
(score desc, index asc), the rule our engine uses, through a stable descending sort. Prefill, then optionally greedy one-token decode steps (--n-steps).

Saves (np.savez_compressed); P prompt length, V vocab; tensors of BF16 values are stored as their
uint16 bit patterns (exact), stream tensors as [P, hc*dim], others [P, dim]:
  input_ids              int64 [P]       numpy default_rng(seed).integers(3, vocab, size=P)
  engram_stream_L{l}     uint16          engram layers: the stream after the Engram lookup
  attn_in_L{l}           uint16 [P, dim] attention input (collapsed with the incoming pre-mix, normed)
  attn_out_L{l}          uint16 [P, dim] attention output
  attn_stream_L{l}       uint16          the stream after the attention's hc_post
  ffn_in_L{l}            uint16 [P, dim] MoE input
  ffn_out_L{l}           uint16 [P, dim] MoE output
  stream_L{l}            uint16          the block output
  experts_L{l}, indexer_L{l}, candidates_L{c}  as in ref_v41.py (prefill)
  prefill_logits         float32 [P, V]
  with --n-steps S: greedy one-token decode steps after the prefill (token = first argmax):
  tokens                 int64 [S]
  step_logits            float32 [S+1, V] row 0 after the prefill, row i+1 after feeding tokens[i]
  dec_<name>_L{l}        uint16 [S, width] the same tensors as above for each decode step
  dec_experts_L{l}, dec_indexer_L{l}, dec_candidates_L{c}   [S, ...] per decode step
  meta                   JSON string     as ref_v41.py, plus "tie_rule"

Usage:
  python tools/goldens/ref_v41_layers.py --ref-dir .ref/v41 --ckpt DIR --input-ids-seed 1 --n-prompt 64 \\
      --out FILE.npz
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import golden_common as gc  # noqa: E402
import ref_v41 as rv  # noqa: E402


def stable_topk(t, k, dim=-1, largest=True, sorted=True):  # noqa: A002 (torch's keyword)
    """torch.topk with ties resolved as (score desc, index asc)."""
    v, i = torch.sort(t, dim=dim, descending=largest, stable=True)
    return torch.return_types.topk((v.narrow(dim, 0, k), i.narrow(dim, 0, k)))


def bf16_bits(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    assert t.dtype == torch.bfloat16, t.dtype
    return t.contiguous().view(torch.int16).cpu().numpy().view(np.uint16)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref-dir", required=True)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--input-ids-seed", type=int, required=True)
    ap.add_argument("--n-prompt", type=int, required=True)
    ap.add_argument("--n-steps", type=int, default=0, help="greedy one-token decode steps after the prefill")
    ap.add_argument("--ckpt-info", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    gc.setup_torch("cpu", args.threads)
    torch.set_grad_enabled(False)
    ref, pil_stub = rv.import_reference(os.path.abspath(args.ref_dir))
    flat = gc.read_json(os.path.join(args.ckpt, "inference", "config.json"))
    P, S = args.n_prompt, args.n_steps
    margs, arg_values = rv.build_args(ref, flat, max(rv.DEFAULT_MAX_SEQ_LEN, P + S))
    torch.set_default_dtype(torch.bfloat16)
    torch.manual_seed(0)
    model = ref.Transformer(margs, rv.MinimalTokenizer(os.path.join(args.ckpt, "tokenizer.json")))
    model.eval()
    engram_check = rv.check_engram_hash(model, args.ckpt)
    load_report = rv.load_weights(model, rv.read_weights(args.ckpt))
    torch.Tensor.topk = stable_topk  # before Capture, whose spy wraps whatever topk is current
    cap = rv.Capture(ref, model, margs, fix=True)

    arrays = {}
    dec = {}  # decode steps: key -> list of [1, width] rows
    phase = ["prefill"]
    hc = margs.hc_mult

    def put(name, l, t):
        a = bf16_bits(t[0])
        if phase[0] == "prefill":
            arrays[f"{name}_L{l}"] = a.reshape(P, -1)
        else:
            dec.setdefault(f"dec_{name}_L{l}", []).append(a.reshape(1, -1))

    def hook(l, in_name, out_name):
        def fn(module, inputs, output):  # returns None: the output is left unchanged
            if in_name:
                put(in_name, l, inputs[0])
            put(out_name, l, output[0] if isinstance(output, tuple) else output)
        return fn

    for l, layer in enumerate(model.layers):
        if layer.engram is not None:
            layer.engram.register_forward_hook(hook(l, None, "engram_stream"))
        layer.attn.register_forward_hook(hook(l, "attn_in", "attn_out"))
        layer.ffn.register_forward_hook(hook(l, "ffn_in", "ffn_out"))
        layer.register_forward_hook(hook(l, None, "stream"))
        orig_mixes = layer.hc_mixes

        def mixes(x, fn, scale, base, l=l, orig=orig_mixes, layer=layer):
            if fn is layer.hc_ffn_fn:  # the FFN's coefficients are computed on the post-attention stream
                put("attn_stream", l, x)
            return orig(x, fn, scale, base)
        layer.hc_mixes = mixes

    V = margs.vocab_size
    ids_np = gc.make_input_ids(args.input_ids_seed, P, V)
    _, last, _ = model(torch.from_numpy(ids_np).view(1, P), 0)
    step_logits = [last[0].float().numpy()]
    phase[0] = cap.phase = "decode"  # cap keeps the prefill's all-row logits
    tokens = []
    for i in range(S):  # greedy (first maximum), one token per forward
        tokens.append(int(np.argmax(step_logits[-1])))
        _, lg, _ = model(torch.tensor([[tokens[-1]]], dtype=torch.long), P + i)
        step_logits.append(lg[0].float().numpy())

    arrays["input_ids"] = ids_np
    arrays["prefill_logits"] = cap.full_logits.astype(np.float32)
    T = margs.index_topk
    for l in range(margs.n_layers):
        arrays[f"experts_L{l}"] = cap.experts[l][0]
    for l in sorted(cap.picks):
        arrays[f"indexer_L{l}"] = gc.pad_sorted(cap.picks[l][0], T)
    for l, masks in sorted(cap.cands.items()):
        arrays[f"candidates_L{l}"] = rv.kept_blocks(masks[0], margs.candidate_block_size, margs.candidate_topk_blocks)
    for l in range(margs.n_layers):
        for name in ("attn_in", "attn_out", "attn_stream", "ffn_in", "ffn_out", "stream"):
            assert f"{name}_L{l}" in arrays, (name, l)
    if S:
        arrays["tokens"] = np.array(tokens, dtype=np.int64)
        arrays["step_logits"] = np.stack(step_logits).astype(np.float32)
        for key, rows in dec.items():
            assert len(rows) == S, (key, len(rows))
            arrays[key] = np.concatenate(rows, axis=0)
        for l in range(margs.n_layers):
            arrays[f"dec_experts_L{l}"] = np.concatenate(cap.experts[l][1:], axis=0).astype(np.int32)
        for l in sorted(cap.picks):
            arrays[f"dec_indexer_L{l}"] = np.concatenate([gc.pad_sorted(x, T) for x in cap.picks[l][1:]], axis=0)
        for l, masks in sorted(cap.cands.items()):
            arrays[f"dec_candidates_L{l}"] = np.concatenate(
                [rv.kept_blocks(m, margs.candidate_block_size, margs.candidate_topk_blocks) for m in masks[1:]], axis=0)

    meta = {
        "kind": "ref_v41 layer-by-layer prefill golden (teacher forcing)",
        "script": "tools/goldens/ref_v41_layers.py",
        "layout": "see the docstring of tools/goldens/ref_v41_layers.py",
        "tie_rule": "torch.topk ties resolved as (score desc, index asc) via a stable sort",
        "checkpoint": gc.checkpoint_provenance(args.ckpt, args.ckpt_info),
        "command": gc.command_line(args.ckpt),
        "versions": gc.versions(),
        "model_args": arg_values,
        "loading": load_report,
        "engram_hash_check": engram_check,
        "indexer_key_fix": True,
        "pil_stub": pil_stub,
        "input_ids_seed": args.input_ids_seed,
        "n_prompt": P,
        "n_steps": S,
        "hc_mult": hc,
    }
    n = gc.save_golden(args.out, arrays, meta)
    print(f"wrote {args.out}: {n} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
