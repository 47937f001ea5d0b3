#!/usr/bin/env python3
"""DeepSeek-V4.1 reference-model goldens: prefill + greedy decode with per-layer captures.

Runs DeepSeek's V4.1 reference ``inference/model.py`` (NOT part of this repo) through the public
CPU-runnable copy in tenstorrent/tt-metal (models/demos/deepseek_v3_d_p/reference/deepseek_v41/:
model.py, engram.py, kernel_cpu.py, vision.py, image_processor.py; kept verbatim in the git-ignored
folder ``.ref/v41/`` with an empty ``__init__.py``, see tools/goldens/README.md). The folder is
imported as a package (model.py uses relative imports). If Pillow is missing, inert stand-ins for
``PIL.Image`` / ``PIL.ImageOps`` are registered (only image loading uses them; never called here).

The model is built from the checkpoint's flat ``inference/config.json`` with every ModelArgs field
given explicitly (fields the config lacks come from OFFICIAL_DEFAULTS below, never from the copy's
dataclass defaults): max_batch_size 1, max_seq_len max(4096, P + steps), temperature 0, vision off
(vision_n_layers 0), DSpark off (dspark_block_size 0, n_mtp_layers 0). The tokenizer handed to the
reference (it only feeds the Engram token map) is a minimal object with ``backend_tokenizer`` (the
checkpoint's tokenizer.json via ``tokenizers``) and ``__len__``. Weights are loaded in the reference's
parameter dtypes, with strict name/shape checks: FP8 as float8_e4m3fn + ``.scale`` float8_e8m0fnu,
expert I8 viewed as float4_e2m1fn_x2, ``attn.wo_a`` dequantised to BF16 with its 32x32 tiles (as
convert.py does), the FP32 parameters (head, ratio-2 compressor wkv/wgate, hc_*, attn_sink, gate
bias) converted from the checkpoint dtype, ``ffn.gate.bias_vl`` dropped (the module has none with
vision off). Default dtype BF16; the reference's QAT fake quantisation is always on.

Behaviour changes to the reference: exactly one, the indexer-key fix of docs §2.6. Each
``Indexer.forward`` is wrapped so that ``shared_attn.index_k`` is set to the ``k_cache`` of the latest
kv-source layer <= its own layer before the original runs (the unpatched reference lets ratio-2
index sources read layer c's ratio-1 key cache on decode steps with even start_pos).
``--no-indexer-fix`` reproduces the bug (diagnostic only). Everything else is observation through
wrappers that return the original results unchanged. The script also checks that the reference's own
compressed token map, multipliers and primes equal the checkpoint's ``engram_hash.safetensors``.

Golden layout (np.savez_compressed; P prompt length, S decode steps, V vocab, T index_topk, K
n_activated_experts, B candidate_topk_blocks, G engram layers, C (engram_max_ngram-1)*engram_n_heads;
l runs over layers, "index sources" are index_source_layers, c = candidate_source_layer):

  input_ids            int64 [P]        numpy default_rng(seed).integers(3, vocab, size=P)
  tokens               int64 [S]        tokens[i] = argmax(logits[i]) (first maximum)
  logits               float32 [S+1, V] row 0: the reference's own last-position output of the prefill;
                                        row i+1: output after feeding tokens[i] at position P+i
  prefill_logits       float32 [P, V]   the head applied to every prefill row (head.forward(x,
                                        full_logits=True) on the same normed hidden state, in an extra
                                        call; its last row is compared with logits[0] in meta)
  experts_L{l}         int32 [P, K]     every layer: prefill routed expert ids per token, sorted ascending
  dec_experts_L{l}     int32 [S, K]     every layer: the same for decode step i (token tokens[i])
  indexer_L{l}         int32 [P, T]     index sources: compressed positions j picked for each prefill query
                                        (the reference's topk_idxs minus its window offset), sorted
                                        ascending, -1 padded (invisible / surplus picks are -1)
  index_scores_L{l}    float32 [P, P//r]  index sources: the BF16 score matrix the picks were selected from
                                        (exactly the tensor passed to topk: visibility mask -inf, and for
                                        layers after c the candidate mask -inf), r = compress ratio
  dec_indexer_L{l}     int32 [S, T]     index sources: decode-step picks (same convention)
  dec_index_scores_L{l} float32 [S, (P+S)//r]  decode-step scores; row i holds (P+i+1)//r entries, NaN after
  candidates_L{c}      int32 [P, B]     candidate source: kept candidate block ids per prefill row
                                        (block b = compressed positions b*bs..b*bs+bs-1, bs =
                                        candidate_block_size), sorted ascending, -1 padded
  dec_candidates_L{c}  int32 [S, B]     candidate source: the same per decode step
  engram_hash_ids      int64 [P, G, C]  the reference's Engram hash row ids (offsets included) per prompt token
  dec_engram_hash_ids  int64 [S, G, C]  the same for each decode step
  meta                 JSON string      checkpoint (generator, preset, seed, family, sha256 of every
                                        safetensors file), command, versions (torch ...), model_args,
                                        loading report, engram check, tie statistics, timings-free

Indexer picks are an unsorted torch.topk: when scores tie exactly at the k-th place, which tied
position is kept is implementation-defined, so a test should accept a pick set that differs only
by swaps among positions whose score equals the k-th largest score of that row (scores are BF16;
ties are common, e.g. all-zero relu rows). meta.index_ties counts rows where this can happen.
The candidate-block top-k ties the same way; candidates can be re-derived from index_scores_L{c}
(pad to a multiple of bs with -inf, block score = max, the block of the newest visible entry
(visible-1) div bs pinned to +inf, keep the top min(B, n_blocks) blocks with score > -inf);
meta.candidate_ties counts rows where an unkept block scores >= the lowest kept block (pinned one aside).

Usage:
  python tools/goldens/ref_v41.py --ref-dir .ref/v41 --ckpt DIR --input-ids-seed 1 \
      --n-prompt 121 --n-steps 64 [--no-indexer-fix] [--threads N] --out FILE.npz
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import json
import os
import sys
import time
import types

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "engram"))
import golden_common as gc  # noqa: E402
import hash_data  # noqa: E402

PKG = "deepinfer_ref_v41"
# ModelArgs fields that a flat V4.1 inference/config.json may lack: the values the released config
# implies (docs §1.2: gate_temp 1.0, norm_topk_prob true; no vision, no DSpark for our checkpoints).
OFFICIAL_DEFAULTS = {
    "temperature": 0.0,
    "gate_temp": 1.0,
    "norm_topk_prob": True,
    "n_mtp_layers": 0,
    "expert_dtype": None,
    "candidate_source_layer": -1,
    "candidate_topk_blocks": 0,
    "candidate_block_size": 0,
    "engram_pad_id": 2,
    "vision_n_layers": 0,
    "vision_dim": 1024,
    "vision_n_heads": 16,
    "vision_inter_dim": 2816,
    "vision_patch_size": 14,
    "vision_rope_theta": 10000.0,
    "vision_downsample_ratio": 3,
    "vision_max_n_token": 1024,
    "vision_min_pixels": 295936,
    "vision_max_wh_ratio": None,
    "image_token_id": 129264,
    "dspark_block_size": 0,
    "dspark_noise_token_id": 0,
    "dspark_target_layer_ids": (),
    "dspark_markov_rank": 256,
    "dspark_n_routed_experts": 0,
    "dspark_n_activated_experts": 0,
}
FORCED = {"vision_n_layers": 0, "dspark_block_size": 0, "n_mtp_layers": 0, "temperature": 0.0}
TUPLE_FIELDS = ("compress_ratios", "kv_source_layers", "index_source_layers", "engram_layer_ids",
                "engram_num_embeddings", "dspark_target_layer_ids")
DEFAULT_MAX_SEQ_LEN = 4096
REF_FILES = ("model.py", "engram.py", "kernel_cpu.py", "vision.py", "image_processor.py")


def _install_pil_stub() -> bool:
    try:
        import PIL.Image  # noqa: F401
        import PIL.ImageOps  # noqa: F401
        return False
    except ImportError:
        pil = types.ModuleType("PIL")
        pil.Image = types.ModuleType("PIL.Image")
        pil.ImageOps = types.ModuleType("PIL.ImageOps")
        sys.modules.update({"PIL": pil, "PIL.Image": pil.Image, "PIL.ImageOps": pil.ImageOps})
        return True


def import_reference(ref_dir: str):
    """Import ref_dir/model.py as the package module PKG.model (relative imports resolve inside)."""
    for f in REF_FILES:
        if not os.path.exists(os.path.join(ref_dir, f)):
            raise SystemExit(f"reference file missing: {os.path.join(ref_dir, f)} (see tools/goldens/README.md)")
    stub = _install_pil_stub()
    init = os.path.join(ref_dir, "__init__.py")
    spec = importlib.util.spec_from_file_location(PKG, init if os.path.exists(init) else None,
                                                  submodule_search_locations=[ref_dir])
    pkg = importlib.util.module_from_spec(spec)
    sys.modules[PKG] = pkg
    if spec.loader is not None:
        spec.loader.exec_module(pkg)
    return importlib.import_module(PKG + ".model"), stub


class MinimalTokenizer:
    """What the reference's build_compressed_token_map needs: backend_tokenizer and len()."""

    def __init__(self, path: str):
        from tokenizers import Tokenizer
        self.backend_tokenizer = Tokenizer.from_file(path)

    def __len__(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)


def build_args(ref, flat_cfg: dict, max_seq_len: int):
    fields = {f.name for f in dataclasses.fields(ref.ModelArgs)}
    unknown = sorted(k for k in flat_cfg if k not in fields)
    if unknown:
        raise SystemExit(f"inference/config.json keys that are not ModelArgs fields: {unknown}")
    values = {}
    for name in sorted(fields):
        if name == "max_batch_size":
            values[name] = 1
        elif name == "max_seq_len":
            values[name] = max_seq_len
        elif name in FORCED:
            values[name] = FORCED[name]
        elif name in flat_cfg:
            values[name] = flat_cfg[name]
        elif name in OFFICIAL_DEFAULTS:
            values[name] = OFFICIAL_DEFAULTS[name]
        else:
            raise SystemExit(f"ModelArgs field {name!r} is neither in inference/config.json nor in "
                             f"OFFICIAL_DEFAULTS; refusing to use the copy's default")
    for name in TUPLE_FIELDS:
        values[name] = tuple(values[name])
    return ref.ModelArgs(**values), values


def load_weights(model, tensors: dict) -> dict:
    """Checkpoint tensors -> the reference's parameters (dtypes and layouts), strict."""
    sd = model.state_dict()
    prepared, unexpected, dropped = {}, [], []
    conv = {"wo_a_dequantised": 0, "experts_viewed_fp4": 0, "cast": {}}
    for name, t in tensors.items():
        if name.endswith(".attn.wo_a.scale"):
            continue
        if name.endswith(".attn.wo_a.weight") and t.dtype == torch.float8_e4m3fn:
            t = gc.dequant_fp8_tiles(t, tensors[name[: -len("weight")] + "scale"], 32).to(torch.bfloat16)
            conv["wo_a_dequantised"] += 1
        if name not in sd:
            if name.endswith(".ffn.gate.bias_vl"):
                dropped.append(name)
                continue
            unexpected.append(name)
            continue
        p = sd[name]
        if p.dtype == torch.float4_e2m1fn_x2 and t.dtype in (torch.int8, torch.uint8):
            t = t.view(torch.float4_e2m1fn_x2)
            conv["experts_viewed_fp4"] += 1
        if tuple(p.shape) != tuple(t.shape):
            raise SystemExit(f"{name}: checkpoint shape {tuple(t.shape)} != reference {tuple(p.shape)}")
        if p.dtype != t.dtype:
            if p.dtype in (torch.float8_e4m3fn, torch.float8_e8m0fnu, torch.float4_e2m1fn_x2) or \
                    t.dtype in (torch.float8_e4m3fn, torch.float8_e8m0fnu, torch.float4_e2m1fn_x2):
                raise SystemExit(f"{name}: checkpoint dtype {t.dtype} cannot be loaded into {p.dtype}")
            key = f"{t.dtype}->{p.dtype}".replace("torch.", "")
            conv["cast"][key] = conv["cast"].get(key, 0) + 1
            t = t.to(p.dtype)
        prepared[name] = t
    res = model.load_state_dict(prepared, strict=False)
    if unexpected or res.missing_keys or res.unexpected_keys:
        raise SystemExit(f"reference load failed: unexpected {unexpected[:20]} missing {list(res.missing_keys)[:20]}")
    for name, p in model.state_dict().items():  # bit-exact check of what landed
        t = prepared[name]
        a, b = p.contiguous().view(torch.uint8), t.contiguous().view(torch.uint8)
        if not torch.equal(a, b):
            raise SystemExit(f"{name}: loaded parameter differs from the prepared tensor")
    return {"loaded": len(prepared), "dropped_bias_vl": len(dropped), **conv}


def read_weights(ckpt: str) -> dict:
    """Every tensor of the checkpoint's weight files (all *.safetensors but engram_hash)."""
    from safetensors import safe_open
    out = {}
    for f in gc.safetensors_files(ckpt):
        if os.path.basename(f) == hash_data.HASH_FILE:
            continue
        with safe_open(f, framework="pt") as fh:
            for k in fh.keys():
                if k in out:
                    raise SystemExit(f"tensor {k} appears in two files")
                out[k] = fh.get_tensor(k)
    return out


def check_engram_hash(model, ckpt: str) -> dict:
    path = os.path.join(ckpt, hash_data.HASH_FILE)
    if not os.path.exists(path):
        raise SystemExit(f"{path} missing")
    ours = hash_data.read(path)
    eh = model.engram_hash
    theirs = {"token_map": eh.token_map.cpu().numpy().astype(np.int64),
              "multipliers": eh.multipliers.cpu().numpy().astype(np.int64),
              "primes": eh.primes.cpu().numpy().astype(np.int64),
              "layer_ids": np.array(eh.layout.layer_ids, dtype=np.int64)}
    for k, v in theirs.items():
        o = ours[k].astype(np.int64)
        if o.shape != v.shape or not np.array_equal(o, v):
            raise SystemExit(f"engram hash data mismatch in {k}: ours {o.shape} vs reference {v.shape}")
    return {"file": hash_data.HASH_FILE, "sha256": gc.sha256_file(path), "equal": sorted(theirs),
            "compressed_vocab": int(theirs["token_map"].max()) + 1,
            "rows": [int(x) for x in theirs["primes"].sum(axis=(1, 2))]}


class Capture:
    """Wrappers (results returned unchanged) + the indexer-key fix."""

    def __init__(self, ref, model, margs, fix: bool):
        self.ref, self.model, self.margs = ref, model, margs
        self.phase = "prefill"
        self.experts = {}       # l -> list per forward of int [n, K] sorted
        self.picks = {}         # l -> list of (picks [n, k] with offset removed)
        self.scores = {}        # l -> list of float32 [n, W]
        self.cands = {}         # l -> list of bool [n, W]
        self.hash_ids = []      # list of int64 [n, G, C]
        self.full_logits = None
        self.fix_applied = 0
        kv_src = sorted(margs.kv_source_layers)
        for l, layer in enumerate(model.layers):
            self._wrap_gate(l, layer.ffn.gate)
            if layer.attn.indexer is not None:
                src = max(s for s in kv_src if s <= l)
                kc = model.layers[src].attn.indexer.k_cache
                self._wrap_indexer(l, layer.attn.indexer, kc if fix else None)
        self._wrap_hash(model.engram_hash)
        self._wrap_head(model.head)

    def _wrap_gate(self, l, gate):
        orig = gate.forward

        def fwd(*a, **k):
            w, idx = orig(*a, **k)
            self.experts.setdefault(l, []).append(np.sort(idx.detach().cpu().numpy().astype(np.int32), axis=1))
            return w, idx
        gate.forward = fwd

    def _wrap_indexer(self, l, idx, k_cache):
        orig = idx.forward
        shared = self.ref.shared_attn
        is_cand = idx.is_candidate_source

        def fwd(x, qr, latent, start_pos, offset):
            if k_cache is not None:
                shared.index_k = k_cache
                self.fix_applied += 1
            seen = []
            topk_orig = torch.Tensor.topk

            def topk_spy(t, *a, **k):
                seen.append((t.detach().clone(), dict(k)))
                return topk_orig(t, *a, **k)
            torch.Tensor.topk = topk_spy
            try:
                out = orig(x, qr, latent, start_pos, offset)
            finally:
                torch.Tensor.topk = topk_orig
            score = [t for t, k in seen if k.get("sorted", True) is False]
            assert len(score) == 1, f"layer {l}: expected one unsorted topk call, saw {len(seen)}"
            s = score[0][0].float().cpu().numpy()                    # [n, W]
            o = out[0].cpu().numpy().astype(np.int64)
            self.picks.setdefault(l, []).append(np.where(o >= 0, o - int(offset), -1))
            self.scores.setdefault(l, []).append(s)
            if is_cand:
                self.cands.setdefault(l, []).append(shared.candidates[0].cpu().numpy().copy())
            return out
        idx.forward = fwd

    def _wrap_hash(self, eh):
        orig = eh.forward

        def fwd(*a, **k):
            h = orig(*a, **k)
            self.hash_ids.append(h[0].cpu().numpy().astype(np.int64))
            return h
        eh.forward = fwd

    def _wrap_head(self, head):
        orig = head.forward

        def fwd(x, full_logits=False):
            out = orig(x, full_logits)
            if self.phase == "prefill" and not full_logits:
                self.full_logits = orig(x, True)[0].float().cpu().numpy()
            return out
        head.forward = fwd


def kept_blocks(mask: np.ndarray, bs: int, width: int) -> np.ndarray:
    """bool [n, W] entry mask -> int32 [n, width] kept block ids ascending, -1 padded."""
    n, W = mask.shape
    nb = -(-W // bs)
    out = np.full((n, width), -1, dtype=np.int32)
    for i in range(n):
        b = np.nonzero(mask[i, ::bs][:nb])[0]
        # a kept block's entries are all True up to W; a block's first entry decides
        assert len(b) <= width
        out[i, :len(b)] = b
    return out


def tie_stats(scores: list, picks: list) -> dict:
    """Rows (prefill and decode together) where the top-k boundary falls inside a group of exactly
    equal scores, so that another tie order would pick a different set."""
    rows = tied = 0
    for s, p in zip(scores, picks):
        for i in range(s.shape[0]):
            row = s[i]
            k = int((p[i] >= 0).sum())
            valid = row[np.isfinite(row)]
            if k == 0 or len(valid) <= k:
                continue
            rows += 1
            kth = np.sort(valid)[::-1][k - 1]
            if np.sum(valid >= kth) > k:  # the k-th score is shared by a position left out
                tied += 1
    return {"rows_selecting": rows, "rows_with_boundary_tie": tied}


def candidate_tie_stats(scores: list, masks: list, bs: int) -> dict:
    """Rows where the candidate-block top-k boundary falls inside a group of equal block scores
    (block score = max of its entries; the kept set is read from the captured mask)."""
    rows = tied = 0
    for s, m in zip(scores, masks):
        n, W = s.shape
        nb = -(-W // bs)
        pad = np.full((n, nb * bs), -np.inf, dtype=np.float64)
        pad[:, :W] = s
        blk = pad.reshape(n, nb, bs).max(axis=2)
        kept = m[:, ::bs][:, :nb]
        for i in range(n):
            visible = int(np.isfinite(s[i]).sum())  # the candidate source masks nothing but visibility
            kept_i = kept[i].copy()
            if visible:
                kept_i[(visible - 1) // bs] = False  # the pinned block is kept whatever its score
            cand = blk[i][~kept[i]]
            cand = cand[np.isfinite(cand)]
            kmin = blk[i][kept_i & np.isfinite(blk[i])]
            if len(kmin) == 0 or len(cand) == 0:
                continue
            rows += 1
            if np.any(cand >= kmin.min()):
                tied += 1
    return {"rows_filtering": rows, "rows_with_boundary_tie": tied}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref-dir", required=True, help="folder with the V4.1 reference package (e.g. .ref/v41)")
    ap.add_argument("--ckpt", required=True, help="checkpoint dir (make_checkpoint.py --family v41)")
    ap.add_argument("--input-ids-seed", type=int, required=True)
    ap.add_argument("--n-prompt", type=int, required=True)
    ap.add_argument("--n-steps", type=int, default=64)
    ap.add_argument("--no-indexer-fix", action="store_true",
                    help="diagnostic: run the reference unpatched (docs §2.6 indexer-key bug)")
    ap.add_argument("--ckpt-info", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    t0 = time.time()
    dev = gc.setup_torch("cpu", args.threads)
    ref_dir = os.path.abspath(args.ref_dir)
    ref, pil_stub = import_reference(ref_dir)
    flat = gc.read_json(os.path.join(args.ckpt, "inference", "config.json"))
    if flat is None:
        raise SystemExit(f"{args.ckpt}/inference/config.json is missing")
    P, S = args.n_prompt, args.n_steps
    margs, arg_values = build_args(ref, flat, max(DEFAULT_MAX_SEQ_LEN, P + S))

    torch.set_default_dtype(torch.bfloat16)
    torch.manual_seed(0)
    tok = MinimalTokenizer(os.path.join(args.ckpt, "tokenizer.json"))
    model = ref.Transformer(margs, tok)
    model.eval()
    engram_check = check_engram_hash(model, args.ckpt)
    tensors = read_weights(args.ckpt)
    load_report = load_weights(model, tensors)
    del tensors
    for name, buf in model.named_buffers():
        if name.endswith("kv_state"):
            assert torch.all(buf == 0), name
        elif name.endswith("score_state"):
            assert torch.all(torch.isneginf(buf)), name
    cap = Capture(ref, model, margs, fix=not args.no_indexer_fix)

    V = margs.vocab_size
    ids_np = gc.make_input_ids(args.input_ids_seed, P, V)
    ids = torch.from_numpy(ids_np).view(1, P)
    _, last, _ = model(ids, 0)
    rows = [last[0].float().cpu().numpy()]
    cap.phase = "decode"
    toks = []
    for step in range(S):
        nxt = int(np.argmax(rows[-1]))
        toks.append(nxt)
        _, lg, _ = model(torch.tensor([[nxt]], dtype=torch.long), P + step)
        rows.append(lg[0].float().cpu().numpy())

    logits = np.stack(rows).astype(np.float32)
    T, K = margs.index_topk, margs.n_activated_experts
    arrays = {"input_ids": ids_np, "tokens": np.array(toks, dtype=np.int64), "logits": logits,
              "prefill_logits": cap.full_logits.astype(np.float32)}
    for l in range(margs.n_layers):
        ex = cap.experts[l]
        assert len(ex) == S + 1 and ex[0].shape == (P, K)
        arrays[f"experts_L{l}"] = ex[0]
        arrays[f"dec_experts_L{l}"] = np.concatenate(ex[1:], axis=0).astype(np.int32)
    ties = {}
    for l in sorted(cap.picks):
        r = margs.compress_ratios[l]
        picks, scores = cap.picks[l], cap.scores[l]
        assert len(picks) == S + 1, (l, len(picks))
        arrays[f"indexer_L{l}"] = gc.pad_sorted(picks[0], T)
        arrays[f"index_scores_L{l}"] = scores[0].astype(np.float32)
        arrays[f"dec_indexer_L{l}"] = np.concatenate([gc.pad_sorted(p, T) for p in picks[1:]], axis=0)
        W = (P + S) // r
        dec = np.full((S, W), np.nan, dtype=np.float32)
        for i, s in enumerate(scores[1:]):
            assert s.shape == (1, (P + i + 1) // r), (l, i, s.shape)
            dec[i, :s.shape[1]] = s[0]
        arrays[f"dec_index_scores_L{l}"] = dec
        ties[f"L{l}"] = tie_stats(scores, picks)
    cand_ties = {}
    for l, masks in sorted(cap.cands.items()):
        B, bs = margs.candidate_topk_blocks, margs.candidate_block_size
        arrays[f"candidates_L{l}"] = kept_blocks(masks[0], bs, B)
        arrays[f"dec_candidates_L{l}"] = np.concatenate([kept_blocks(m, bs, B) for m in masks[1:]], axis=0)
        cand_ties[f"L{l}"] = candidate_tie_stats(cap.scores[l], masks, bs)
    assert len(cap.hash_ids) == S + 1
    arrays["engram_hash_ids"] = cap.hash_ids[0]
    arrays["dec_engram_hash_ids"] = np.concatenate(cap.hash_ids[1:], axis=0)
    last_row_diff = float(np.max(np.abs(arrays["prefill_logits"][-1] - logits[0])))

    ref_src = {f: gc.sha256_file(os.path.join(ref_dir, f)) for f in REF_FILES}
    meta = {
        "kind": "ref_v41 prefill + greedy decode golden",
        "script": "tools/goldens/ref_v41.py",
        "command": gc.command_line(args.ckpt),
        "checkpoint": gc.checkpoint_provenance(args.ckpt, args.ckpt_info),
        "reference_code": {"source": "tenstorrent/tt-metal models/demos/deepseek_v3_d_p/reference/deepseek_v41 "
                                     "(DeepSeek V4.1-Flash inference/ rev dba1be0a + kernel_cpu.py)",
                           "sha256": ref_src, "pil_stub": pil_stub},
        "indexer_key_fix": not args.no_indexer_fix,
        "indexer_key_fix_calls": cap.fix_applied,
        "model_args": {k: (list(v) if isinstance(v, tuple) else v) for k, v in arg_values.items()},
        "versions": gc.versions(),
        "device": gc.device_name(dev),
        "dtype": "bfloat16 default dtype, FP8/FP4 weights, reference QAT fake quantisation",
        "input_ids_seed": args.input_ids_seed,
        "input_ids_rule": "numpy.random.default_rng(seed).integers(3, vocab, size=P, dtype=int64)",
        "n_prompt": P, "n_steps": S, "vocab_size": V,
        "logits_rule": "row 0: last prompt position after prefill; row i+1: after feeding tokens[i] at position P+i",
        "tokens_rule": "tokens[i] = argmax(logits[i]) (first maximum)",
        "prefill_logits_last_row_max_abs_diff_vs_logits0": last_row_diff,
        "logits_sha256": gc.sha256_array(logits),
        "loading": load_report,
        "engram_hash_check": engram_check,
        "index_ties": ties,
        "candidate_ties": cand_ties,
        "layout": "see the docstring of tools/goldens/ref_v41.py",
    }
    size = gc.save_golden(args.out, arrays, meta)
    print(f"[ref_v41] wrote {args.out} ({size} bytes) in {time.time() - t0:.1f}s; tokens[:8] {toks[:8]}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
