#!/usr/bin/env python3
"""DeepSeek-V4 reference-model goldens: prefill + greedy decode in BF16 with QAT simulation.

Runs DeepSeek's reference ``inference/model.py`` (NOT part of this repo: obtain it into a
git-ignored folder such as ``.ref/v4/``, see tools/goldens/README.md) on a checkpoint with
official tensor names.  The reference imports its TileLang kernels from a module ``kernel``;
this script copies the reference model file into a fresh temporary directory as ``model.py``
next to OUR plain-PyTorch ``ref_kernel_shim.py`` as ``kernel.py`` and imports it from there
(and registers our Walsh-Hadamard as ``fast_hadamard_transform``).

The model is built from the checkpoint's flat ``inference/config.json`` with every ModelArgs
field given explicitly (fields the config lacks come from the table OFFICIAL_DEFAULTS below,
never from the copy's dataclass defaults, which may be altered), ``max_batch_size`` 1 and
``max_seq_len`` at least P + n_steps.  Weights are loaded as the reference expects them:
FP8 weights as float8_e4m3fn with ``.scale`` float8_e8m0fnu, routed experts' I8 viewed as
float4_e2m1fn_x2, ``attn.wo_a`` dequantised to BF16 (as convert.py does), everything else
converted to the reference's parameter dtypes.  Default dtype BF16, fake quantisation on
(the reference always simulates it).  One process per run, so compressor state starts clean.

Saves (np.savez_compressed):
  input_ids   int64 [P]           the prompt: numpy default_rng(S).integers(3, vocab, P)
  tokens      int64 [n_steps]     greedy (argmax) tokens
  logits      float32 [n_steps+1, V]  last-position logits after prefill and after each step
  prefill_logits float32 [P, V]   with --all-logits: prefill logits of every position
  experts_L{l}, indexer_L{l}      with --capture: prefill routing (sorted ascending) and C4
                                  indexer picks (compressed-entry index j from 0, sorted,
                                  -1 padded to index_topk), same layout as hf_v4.py
  meta        JSON string

Usage:
  python tools/goldens/ref_v4.py --ref-dir .ref/v4 --ckpt DIR --input-ids-seed 1 \
      --n-prompt 200 --n-steps 64 [--device cpu|cuda] [--all-logits] [--capture] --out FILE.npz
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import golden_common as gc  # noqa: E402

# Values for ModelArgs fields that the flat V4 inference/config.json may not carry: the
# official ModelArgs defaults (docs/v4-architecture.md §1.1: norm_eps, hc_eps, n_mtp_layers,
# scale_dtype "fp8"; expert_dtype None, i.e. a config without the key (a --dense checkpoint)
# has BF16 experts). max_batch_size / max_seq_len are set by this script.
OFFICIAL_DEFAULTS = {
    "norm_eps": 1e-6,
    "hc_eps": 1e-6,
    "n_mtp_layers": 1,
    "scale_dtype": "fp8",
    "scale_fmt": "ue8m0",
    "dtype": "fp8",
    "expert_dtype": None,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
}
DEFAULT_MAX_SEQ_LEN = 4096  # official ModelArgs default; raised when P + n_steps needs more


def import_reference(ref_dir: str, ref_model: str, workdir: str):
    """Copy the reference model + our kernel shim into ``workdir`` and import them."""
    src = os.path.join(ref_dir, ref_model)
    if not os.path.exists(src):
        raise SystemExit(f"reference model not found: {src} (see tools/goldens/README.md)")
    if "mockingjay" in ref_model:
        raise SystemExit("model_mockingjay.py has a modified fused MoE; use the original model code")
    shutil.copy(src, os.path.join(workdir, "model.py"))
    shutil.copy(os.path.join(HERE, "ref_kernel_shim.py"), os.path.join(workdir, "kernel.py"))
    for mod in ("model", "kernel"):
        sys.modules.pop(mod, None)
    sys.path.insert(0, workdir)
    kernel = importlib.import_module("kernel")
    kernel.install_fast_hadamard_module()
    model = importlib.import_module("model")
    return model, kernel, src


def build_args(ref, flat_cfg: dict, max_seq_len: int):
    fields = {f.name for f in dataclasses.fields(ref.ModelArgs)}
    unknown = sorted(k for k in flat_cfg if k not in fields)
    values = {}
    for name in sorted(fields):
        if name == "max_batch_size":
            values[name] = 1
        elif name == "max_seq_len":
            values[name] = max_seq_len
        elif name in flat_cfg:
            values[name] = flat_cfg[name]
        elif name in OFFICIAL_DEFAULTS:
            values[name] = OFFICIAL_DEFAULTS[name]
        else:
            raise SystemExit(f"ModelArgs field {name!r} is neither in inference/config.json nor "
                             f"in OFFICIAL_DEFAULTS; refusing to use the copy's default")
    values["compress_ratios"] = tuple(values["compress_ratios"])
    return ref.ModelArgs(**values), values, unknown


def load_weights(model, tensors: dict, device: torch.device) -> dict:
    """Convert official checkpoint tensors to the reference's parameter layout and load."""
    sd = model.state_dict()
    prepared = {}
    unexpected = []
    converted = {"wo_a_dequantised": 0, "experts_viewed_fp4": 0}
    for name, t in tensors.items():
        if name.endswith(".attn.wo_a.scale"):
            continue
        if name.endswith(".attn.wo_a.weight") and t.dtype == torch.float8_e4m3fn:
            scale = tensors[name[: -len("weight")] + "scale"]
            t = gc.dequant_fp8_tiles(t, scale, 128).to(torch.bfloat16)
            converted["wo_a_dequantised"] += 1
        if name not in sd:
            unexpected.append(name)
            continue
        p = sd[name]
        if p.dtype == torch.float4_e2m1fn_x2 and t.dtype in (torch.int8, torch.uint8):
            t = t.view(torch.float4_e2m1fn_x2)
            converted["experts_viewed_fp4"] += 1
        if tuple(p.shape) != tuple(t.shape):
            raise SystemExit(f"{name}: checkpoint shape {tuple(t.shape)} != reference {tuple(p.shape)}")
        if p.dtype in (torch.float8_e4m3fn, torch.float8_e8m0fnu, torch.float4_e2m1fn_x2) and t.dtype != p.dtype:
            raise SystemExit(f"{name}: checkpoint dtype {t.dtype} cannot be loaded into {p.dtype}")
        prepared[name] = t
    res = model.load_state_dict(prepared, strict=False)
    missing = list(res.missing_keys)
    missing_non_mtp = [k for k in missing if not k.startswith("mtp.")]
    if unexpected or missing_non_mtp:
        raise SystemExit(f"reference load failed: unexpected {unexpected[:20]} missing {missing_non_mtp[:20]}")
    return {"loaded": len(prepared), "missing_mtp_only": len(missing), "unexpected": unexpected,
            **converted}


def disable_fake_quant(ref) -> None:
    """Turn the reference's in-place act_quant / fp4_act_quant calls into no-ops (GEMM input
    quantisation inside ``linear`` is untouched; use a --dense checkpoint to avoid it)."""
    act_quant, fp4_act_quant = ref.act_quant, ref.fp4_act_quant

    def act_quant_noop(x, block_size=128, scale_fmt=None, scale_dtype=torch.float32, inplace=False):
        return x if inplace else act_quant(x, block_size, scale_fmt, scale_dtype, inplace)

    def fp4_act_quant_noop(x, block_size=32, inplace=False):
        return x if inplace else fp4_act_quant(x, block_size, inplace)

    ref.act_quant, ref.fp4_act_quant = act_quant_noop, fp4_act_quant_noop


def emulate_cuda_semantics() -> None:
    """Pins two behaviours the reference leaves to torch: BF16 rsqrt computed in FP32 and rounded
    once (CUDA; torch's CPU kernel gives e.g. rsqrt(4.3125) = 0.48046875, CUDA 0.482421875) and
    deterministic top-k ties (score desc, index asc; torch.topk's order is implementation-defined)."""
    rsqrt = torch.rsqrt
    torch.rsqrt = lambda x: rsqrt(x.float()).to(x.dtype)

    def topk(self, k, dim=-1, largest=True, sorted=True):
        v, i = torch.sort(self, dim=dim, descending=largest, stable=True)
        return v.narrow(dim, 0, k), i.narrow(dim, 0, k)
    torch.Tensor.topk = topk


class RefCapture:
    """Hooks on the reference Gate (weights, indices) and Indexer (topk_idxs with offset)."""

    def __init__(self, model):
        self.experts, self.index = {}, {}
        self.handles = []
        for l, layer in enumerate(model.layers):
            self.handles.append(layer.ffn.gate.register_forward_hook(self._hook(self.experts, l, 1)))
            idx = getattr(layer.attn, "indexer", None)
            if idx is not None:
                self.handles.append(idx.register_forward_hook(self._hook(self.index, l, None)))

    @staticmethod
    def _hook(store, l, which):
        def hook(mod, inp, out):
            o = out if which is None else out[which]
            store.setdefault(l, []).append(o.detach().cpu())
        return hook

    def remove(self):
        for h in self.handles:
            h.remove()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref-dir", required=True, help="folder holding the reference model code (e.g. .ref/v4)")
    ap.add_argument("--ref-model", default="auto",
                    help="file name inside --ref-dir (default: model.py if present, else model_nicooo.py)")
    ap.add_argument("--ckpt", required=True, help="checkpoint dir (official names, inference/config.json)")
    ap.add_argument("--input-ids-seed", type=int, required=True)
    ap.add_argument("--n-prompt", type=int, required=True)
    ap.add_argument("--n-steps", type=int, default=64)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--all-logits", action="store_true", help="also save prefill logits of every position")
    ap.add_argument("--capture", action="store_true", help="also save prefill experts / indexer picks")
    ap.add_argument("--no-fake-quant", action="store_true",
                    help="diagnostic only (not for goldens): make the reference's in-place fake "
                         "quantisation calls (window/compressed KV act_quant, indexer "
                         "fp4_act_quant) no-ops, as docs §2.14 'Preparing the reference' describes")
    ap.add_argument("--emulate-cuda", action="store_true",
                    help="diagnostic for CPU runs: BF16 rsqrt rounded once from FP32 (as CUDA does; torch's CPU "
                         "kernel rounds differently) and top-k ties broken by (score desc, index asc); with it a "
                         "CPU run matches deepinfer's BF16 path until the first FP32-summation-order flip")
    ap.add_argument("--ckpt-info", action="append", default=[], metavar="KEY=VALUE",
                    help="provenance recorded in meta.checkpoint (e.g. preset=tiny seed=1)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    t0 = time.time()
    dev = gc.setup_torch(args.device, args.threads)
    ref_model = args.ref_model
    if ref_model == "auto":
        ref_model = "model.py" if os.path.exists(os.path.join(args.ref_dir, "model.py")) else "model_nicooo.py"

    flat = gc.read_json(os.path.join(args.ckpt, "inference", "config.json"))
    if flat is None:
        raise SystemExit(f"{args.ckpt}/inference/config.json (flat ModelArgs config) is missing")
    P, n_steps = args.n_prompt, args.n_steps
    max_seq_len = max(DEFAULT_MAX_SEQ_LEN, P + n_steps)

    workdir = tempfile.mkdtemp(prefix="ref_v4_")
    try:
        ref, kernel, ref_src = import_reference(os.path.abspath(args.ref_dir), ref_model, workdir)
        margs, arg_values, unknown_cfg = build_args(ref, flat, max_seq_len)
        if args.no_fake_quant:
            disable_fake_quant(ref)
        if args.emulate_cuda:
            emulate_cuda_semantics()

        torch.set_default_dtype(torch.bfloat16)
        if dev.type == "cuda":
            torch.set_default_device(dev)
        torch.manual_seed(0)
        with torch.device(dev):
            model = ref.Transformer(margs)
        model.eval()
        tensors = gc.read_checkpoint(args.ckpt)
        load_report = load_weights(model, tensors, dev)
        del tensors
        load_report["unknown_config_keys"] = unknown_cfg
        # compressor state must start clean (docs §2.5): a fresh process guarantees it; check.
        for name, buf in model.named_buffers():
            if name.endswith("kv_state"):
                assert torch.all(buf == 0), name
            elif name.endswith("score_state"):
                assert torch.all(torch.isneginf(buf)), name
        t_load = time.time() - t0

        vocab = margs.vocab_size
        ids_np = gc.make_input_ids(args.input_ids_seed, P, vocab)
        ids = torch.from_numpy(ids_np).view(1, P).to(dev)
        cap = RefCapture(model) if args.capture else None

        t1 = time.time()
        prefill_all = None
        if args.all_logits:
            orig = ref.ParallelHead.get_logits
            ref.ParallelHead.get_logits = lambda self, x: torch.nn.functional.linear(x.float(), self.weight)
            try:
                out = model(ids, 0)              # [1, P, V]
            finally:
                ref.ParallelHead.get_logits = orig
            prefill_all = out[0].float().cpu()
            last = out[:, -1]
        else:
            last = model(ids, 0)                 # [1, V]
        if cap is not None:
            cap.remove()
        t_prefill = time.time() - t1

        rows = [last[0].float().cpu()]
        toks = []
        t2 = time.time()
        for step in range(n_steps):
            nxt = int(torch.argmax(rows[-1]).item())
            toks.append(nxt)
            tok = torch.tensor([[nxt]], dtype=torch.long, device=dev)
            rows.append(model(tok, P + step)[0].float().cpu())
        t_decode = time.time() - t2

        logits = torch.stack(rows).numpy().astype(np.float32)
        arrays = {"input_ids": ids_np, "tokens": np.array(toks, dtype=np.int64), "logits": logits}
        if prefill_all is not None:
            arrays["prefill_logits"] = prefill_all.numpy().astype(np.float32)
            assert np.array_equal(arrays["prefill_logits"][-1], logits[0])
        if cap is not None:
            for l, (w_idx,) in sorted((l, v) for l, v in cap.experts.items()):
                arrays[f"experts_L{l}"] = np.sort(w_idx.numpy().astype(np.int32), axis=1)
            for l, (sel,) in sorted((l, v) for l, v in cap.index.items()):
                s = sel[0].numpy().astype(np.int64)
                s = np.where(s >= 0, s - P, -1)  # prefill offset = P (window kv of all tokens)
                arrays[f"indexer_L{l}"] = gc.pad_sorted(s, margs.index_topk)

        meta = {
            "kind": "ref_v4 prefill + greedy decode golden",
            "script": "tools/goldens/ref_v4.py",
            "command": gc.command_line(args.ckpt),
            "checkpoint": gc.checkpoint_provenance(args.ckpt, args.ckpt_info),
            "reference_code": {"file": os.path.basename(ref_src), "sha256": gc.sha256_file(ref_src),
                               "kernel_shim": "tools/goldens/ref_kernel_shim.py",
                               "kernel_shim_sha256": gc.sha256_file(os.path.join(HERE, "ref_kernel_shim.py")),
                               "sparse_attn_tile": kernel.SPARSE_ATTN_TILE,
                               "act_quant_inplace": "e4m3 RNE of clamp(x/s, +-448), written back as bf16(q*s)"},
            "model_args": {k: (list(v) if isinstance(v, tuple) else v) for k, v in arg_values.items()},
            "versions": gc.versions(),
            "device": gc.device_name(dev),
            "dtype": "bfloat16 default dtype, reference numerics with QAT fake quantisation"
                     + (" DISABLED (--no-fake-quant diagnostic run)" if args.no_fake_quant else ""),
            "input_ids_seed": args.input_ids_seed,
            "input_ids_rule": "numpy.random.default_rng(seed).integers(3, vocab, size=P, dtype=int64)",
            "n_prompt": P, "n_steps": n_steps, "vocab_size": vocab,
            "logits_rule": "row 0: last prompt position after prefill; row i+1: after feeding tokens[i] at position P+i",
            "tokens_rule": "tokens[i] = argmax(logits[i]) (first maximum)",
            "logits_sha256": gc.sha256_array(logits),
            "loading": load_report,
        }
        size = gc.save_golden(args.out, arrays, meta)
        print(f"[ref_v4] seconds: load {t_load:.1f}, prefill {t_prefill:.1f}, decode {t_decode:.1f}",
              file=sys.stderr)
        print(f"[ref_v4] wrote {args.out} ({size} bytes) in {time.time() - t0:.1f}s; "
              f"tokens[:8] {toks[:8]}", file=sys.stderr)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
