#!/usr/bin/env python3
"""make_checkpoint.py: deterministic random-weight checkpoints in DeepSeek-V4-Flash's on-disk format.

Usage
-----
    python3 tools/make_checkpoint.py --family v4 --preset tiny|small|flash-shape --seed N --out DIR [--dense]
    python3 tools/make_checkpoint.py --family v41 --preset tiny|small|engram-huge|flash-shape --seed N --out DIR
        [--dense]
    flash-shape only:  [--layers N] [--experts E]     (see "Presets" and "Fast random weights")
    any preset:        [--config-only]  config.json, inference/config.json and, for the sharded
                       flash-shape presets, model.safetensors.index.json; no tensors, no tokenizer

Needs numpy; the tokenizer step also needs the `tokenizers` package (and --family v41 also sympy,
for the Engram primes). No torch, no safetensors. The V4.1 family is described in its own section
at the end of this docstring; everything up to there is the V4 family.

What DIR receives
-----------------
* `config.json`: the HF form (architectures DeepseekV4ForCausalLM, model_type deepseek_v4, the key
  names of docs/v4-architecture.md §1.1, `compress_ratios` with exactly num_hidden_layers entries
  since num_nextn_predict_layers is 0; HF's DeepseekV4Config turns it into `layer_types`, cutting
  the list to num_hidden_layers). With FP8 weights it carries
  `quantization_config` {fp8, e4m3, ue8m0, dynamic, [128,128]} and `expert_dtype: "fp4"` (HF's
  FP8 integration reads the latter to know the experts are packed FP4); `--dense` omits both.
* `inference/config.json`: the flat ModelArgs form of DeepSeek's reference (dim, n_layers, ...,
  dtype "fp8"/"bf16", scale_fmt "ue8m0", expert_dtype "fp4" (not with --dense), n_mtp_layers 0).
* Weights: `model.safetensors` (tiny, small) or `model-0000i-of-0000n.safetensors` shards plus
  `model.safetensors.index.json` (flash-shape: top-level tensors but `head`, one shard per layer,
  then `head`). Tensor names, shapes and dtypes are those of §1.3 (V4-Flash):
    top level  embed.weight, head.weight [vocab, dim] BF16; norm.weight [dim] BF16;
               hc_head_fn [hc, hc*dim], hc_head_base [hc], hc_head_scale [1] F32
    layer l    hc_{attn,ffn}_fn [(2+hc)*hc, hc*dim], hc_*_base [(2+hc)*hc], hc_*_scale [3] F32;
               attn_norm/ffn_norm.weight BF16;
               attn.{wq_a,wq_b,wkv,wo_a,wo_b}.weight F8_E4M3 + .scale F8_E8M0 (128x128 tiles);
               attn.q_norm/kv_norm.weight BF16; attn.attn_sink [n_heads] F32;
               ratio 4 or 128: attn.compressor.{wkv,wgate}.weight BF16 [c*head_dim, dim]
                 (c = 2 for ratio 4: overlap), attn.compressor.ape F32 [ratio, c*head_dim],
                 attn.compressor.norm.weight BF16 [head_dim];
               ratio 4: attn.indexer.wq_b FP8 [index_heads*index_head_dim, q_lora] + scale,
                 attn.indexer.weights_proj.weight BF16 [index_heads, dim],
                 attn.indexer.compressor.{wkv,wgate}.weight BF16 [2*index_head_dim, dim],
                 .ape F32 [4, 2*index_head_dim], .norm.weight BF16 [index_head_dim];
               ffn.gate.weight BF16 [E, dim]; layers < n_hash_layers: ffn.gate.tid2eid I64
                 [vocab, top_k] (each row top_k distinct experts), other layers: ffn.gate.bias F32 [E];
               ffn.experts.e.{w1,w3}.weight I8 [inter, dim/2] + .scale F8_E8M0 [inter, dim/32],
               ffn.experts.e.w2.weight I8 [dim, inter/2] + .scale [dim, inter/32] (packed e2m1,
                 low nibble = even K index);
               ffn.shared_experts.{w1,w3}.weight F8 [inter, dim], .w2 F8 [dim, inter] + scales.
  With `--dense` every FP8/FP4 weight is written instead as its exact BF16 dequantisation under
  the same name (FP4 experts at their logical [out, in] shape) and no `.scale` tensors exist: the
  same logical values as the quantised checkpoint of the same seed.
  safetensors files are written by hand: 8-byte little-endian header length, a JSON header
  ({"__metadata__": {"format": "pt"}} then every tensor, keys sorted by name, each with dtype,
  shape, data_offsets) padded with spaces to a multiple of 8, then the data. The data section is
  ordered widest dtype first, then by name (as safetensors' own serializer does) so that every
  tensor is naturally aligned and there are no holes.
* `tokenizer.json` + `tokenizer_config.json`: byte-level BPE whose vocabulary has exactly
  vocab_size ids: 0 `<｜begin▁of▁sentence｜>`, 1 `<｜end▁of▁sentence｜>`, 2 `<｜▁pad▁｜>`, then the 256
  byte tokens (ordered by their byte-level character, as in DeepSeek's own vocabulary: id 3 is "!",
  id 223 is "Ġ", the space byte), then merges trained by `tokenizers`' BpeTrainer on SAMPLE_TEXT
  below, then chat specials and, when training runs out of merges, unused placeholders
  `<｜place▁holder▁no▁N｜>`. Chat specials `<｜User｜>`, `<｜Assistant｜>`, `<think>`, `</think>`,
  `｜DSML｜` sit at their real V4 ids (128803, 128804, 128821, 128822, 128825) when the vocabulary
  is that large (flash-shape), else at the top 5 ids. The pre-tokenizer is DeepSeek-V3's split
  sequence (§4.1) + ByteLevel; a post-processor prepends BOS.

Quantisation (docs §3)
----------------------
Every tensor (except in the flash-shape presets: see "Fast random weights") is drawn as a float32
"master" and then stored:
  FP8: per 128x128 tile, scale = 2^ceil(log2(amax_tile / 448)) (amax floored at 2^-100), code =
       e4m3 round-to-nearest-even of w/scale (|w/scale| <= 448 by construction).
  FP4: per row per 32 K-values, scale = 2^ceil(log2(amax / 6)), code = e2m1 RNE of w/scale
       (grid 0 .5 1 1.5 2 3 4 6; ties to the even code).
  BF16: RNE of the master; F32: the master; tid2eid: see below.
The scale exponent is computed exactly (float64 division and frexp), not via log2.

Determinism and draw order
--------------------------
Each tensor has its own random stream, independent of every other tensor, so the draw order of
tensors does not matter and any subset (one shard, a --dense variant) reproduces the same values:
    key    = the tensor's stored name (for FP8/FP4 weights the `.weight` name; the `.scale` comes from
             the same master)
    stream = numpy.random.Generator(PCG64(SeedSequence([seed, w0, ..., w7]))), w0..w7 the eight
             big-endian uint32 words of sha256(key.encode()).
Within a tensor the elements are drawn in row-major order using only `Generator.random()` (uniform
float64, exact integer arithmetic, no libm), so the values are identical on every machine:
    "normal" std s: element i uses uniforms u[4i..4i+3] (consecutive), x = (((u0+u1)+u2)+u3 - 2)
                    * sqrt(3) * s in float64, then rounded to float32 (Irwin-Hall(4): mean 0,
                    variance s^2, |x| <= 2*sqrt(3)*s, near-Gaussian shape);
    "one_plus" s:   1 + the "normal" draw;
    "uniform" a,b:  element i uses u[i]: a + (b - a) * u.
    tid2eid:        u = stream.random((vocab, E)); row t = the first top_k entries of
                    argsort(u[t], kind="stable"): top_k distinct experts, uniform over tokens.
FP8/FP4 weights are then multiplied by a power-of-two gain per scale block (see quant_master:
g = 2^(floor(3u) - 1) / sqrt(1.75), u from the stream of key + "#gain", one per 128x128 tile or per
row x 32 K-values in row-major block order) so that neighbouring blocks get different scales.
Large tensors are drawn in row chunks; the element-major stream makes the result independent of
the chunking. Same seed + preset + flags -> byte-identical output (tokenizer included).

Fast random weights (the flash-shape presets of both families, Preset.fast)
-----------------------------------------------------------------------------
Real-size tensors are far too big for the exact per-element masters above, so the flash-shape presets
draw their bytes directly (vectorised, ~1.5-5 GB/s per core; peak RAM < 0.5 GB; a background thread
draws ahead of the file writes). Same per-tensor streams (tensor_rng of the key), different rules, so
flash-shape values are NOT those of the exact path (and changed when this path was introduced):
  FP8/FP4 codes: the raw 64-bit words of the key's stream (PCG64 random_raw) as little-endian bytes,
       row-major; FP8: the e4m3fn NaN codes 0x7F/0xFF become 0x7E/0xFE (+-448), every other byte is
       kept; FP4: every byte is two e2m1 codes (any nibble). Each row is a whole number of words, so
       the codes do not depend on the chunking.
  E8M0 scales (per tile / per row x 32, as usual): 127 + e + k with k = integers(0, 3) - 1 per block
       from the stream key + "#scale", e = round(log2(std / (code_rms * sqrt(1.75)))), std = the
       init std 1/sqrt(in), code_rms = the RMS of a uniformly random code (e4m3fn ~107.2, e2m1
       sqrt(8.5625)): the weight RMS is the init std up to the power-of-two rounding.
  --dense: the exact BF16 dequantisation of those codes and scales.
  BF16/F32: u = random(dtype=float32) of the key's stream, then normal s -> (u - 1/2) * s * sqrt(12),
       one_plus s -> 1 + that, uniform a, b -> a + (b - a) u (same mean and std as the init, uniform
       shape); BF16 by round-to-nearest-even. tid2eid: as above.
Deterministic: same seed + preset + flags -> byte-identical files.

Init scales (chosen for a well-conditioned forward: RMSNorm outputs ~1, linear outputs ~1,
attention scores ~N(0,1), router logits ~N(0,1), final logits ~N(0, 3^2)):
    linear weights (all FP8/FP4/BF16 projections, compressors, indexer, gate): normal 1/sqrt(in)
    embed normal 1; head normal 3/sqrt(dim); norms one_plus 0.05; attn_sink normal 1;
    hc_*_fn normal 1/sqrt(hc*dim); hc_*_base normal 1; hc_*_scale uniform [0.1, 1];
    compressor ape normal 0.5; gate.bias normal 0.1.

Presets
-------
    tiny        CI: vocab 1024, dim 256, 5 layers ratios [0,4,128,4,128], 2 hash layers, 4 heads x 128,
                q_lora 128, o_groups 2 x o_lora 128, 8 experts top-2 (+1 shared) x inter 128,
                window 16, indexer 16 heads x 128 top-4.
    small       benchmarks: vocab 4096, dim 512, 8 layers [0,0,4,128,4,128,4,128], 3 hash layers,
                8 heads x 256, q_lora 256, o_groups 4 x 128, 64 experts top-4 x inter 256,
                window 32, indexer 16 heads x 128 top-16.
    flash-shape every per-tensor shape of V4-Flash (dim 4096, 64 heads x 512, q_lora 1024,
                o_groups 8 x 1024, inter 2048, indexer 64 x 128 top-512, window 128, vocab 129280)
                with 4 layers [0,4,128,4], 1 hash layer, 16 experts top-6; sharded; fast random
                weights (below; peak RAM < 0.5 GB). --layers N (1..43): the real model's first N
                layers instead: compress_ratios = the first N of V4-Flash's [0,0] + [4,128]x20 + [4]
                (§1.1, without the NextN entry), min(N, 3) hash layers (real: layers 0-2).
                --experts E (6..256, real 256): E routed experts. Sizes: top 1.06 GB + head 1.06 GB,
                per layer ~0.15 GB + 13.4 MB per expert (0.36 GB with 16, 3.57 GB with 256 experts).
All share: rope_head_dim 64, rope_theta 1e4, compress_rope_theta 1.6e5, YaRN factor 16 / original
65536 / beta 32,1, route_scale 1.5, swiglu_limit 10, hc_mult 4, 20 Sinkhorn iterations,
eps 1e-6, max_position_embeddings 1048576, sqrtsoftplus scoring, 1 shared expert.

V4.1 family (--family v41; docs/v4-architecture.md §1.2, §1.3, §2.6-§2.10, §3)
---------------------------------------------------------------------------
Same random streams, draw rules, init scales, tokenizer and safetensors writer as V4; differences:
* `config.json`: architectures DeepseekV41ForCausalLM, model_type deepseek_v41, top-level
  quantization_config {quant_method fp8, activation_scheme dynamic, weight_block_size [32, 32],
  scale_fmt ue8m0, expert_dtype fp4} (omitted with --dense) and `text_config` (model_type
  deepseek_v41_text) with the §1.2 keys: the V4 ones without num_hash_layers, plus
  kv_source_layer_ids, index_source_layer_ids, candidate_source_layer_id, candidate_topk_blocks,
  candidate_block_size, engram_layer_ids, engram_num_embeddings, engram_max_ngram_size,
  engram_vocab_size, engram_n_heads, engram_head_dim, engram_pad_token_id,
  engram_compressed_vocab_size, rms_norm_eps 1e-20, num_nextn_predict_layers 0, and gate_temp only
  when the preset sets it. compress_ratios has exactly num_hidden_layers entries (no MTP layers).
* `inference/config.json`: DeepSeek's V4.1 ModelArgs names only (dim, n_layers, n_mtp_layers 0, ...,
  kv_source_layers, index_source_layers, candidate_source_layer, engram_pad_id, gate_temp,
  norm_topk_prob, dtype fp8|bf16, expert_dtype fp4|null); no scale_fmt (a module constant in V4.1).
* `engram_hash.safetensors`: token_map I32 [vocab], multipliers I64 [G, max_ngram], primes I64
  [G, max_ngram-1, n_heads], layer_ids I64 [G] (tools/engram/hash_data.py; checked against the
  config: the compressed vocabulary of the generated tokenizer and the prime sums are what the
  configs carry as engram_compressed_vocab_size / engram_num_embeddings). Not written when the
  preset has no Engram layers (flash-shape): the engine never reads it then.
* Weights (`model.safetensors`, one file; flash-shape: shards as V4's flash-shape, top-level
  `embed`/`norm`, one shard per layer, then `head`, plus model.safetensors.index.json):
    top level  embed.weight, head.weight [vocab, dim] BF16; norm.weight [dim] BF16; no hc_head_*
    layer l    hc_{attn,ffn}_{fn,base,scale} F32 as V4; attn_norm/ffn_norm.weight BF16;
               attn.{wq_a,wq_b,wkv,wo_a,wo_b}.weight F8_E4M3 + .scale F8_E8M0 with 32x32 tiles
                 (wo_a [o_groups*o_lora_rank, n_heads*head_dim/o_groups]);
               attn.q_norm/kv_norm.weight BF16; attn.attn_sink [n_heads] F32;
               kv sources: attn.compressor.wkv.weight BF16 [head_dim, dim], ratio 2 also
                 attn.compressor.wgate.weight BF16 [head_dim, dim]; attn.compressor.norm.weight
                 [head_dim]; attn.indexer.wk.weight BF16 [index_head_dim, head_dim],
                 attn.indexer.k_norm.weight [index_head_dim] (no ape, no indexer compressor);
               index sources: attn.indexer.wq_b FP8 [index_heads*index_head_dim, q_lora] + scale,
                 attn.indexer.weights_proj.weight BF16 [index_heads, dim];
               ffn.gate.weight BF16 [E, dim], ffn.gate.bias F32 [E], ffn.gate.bias_vl F32 [E]
                 (every layer: no hash layers, no tid2eid);
               ffn.experts.e.w{1,2,3} FP4 I8 + E8M0 per 32 (as V4); ffn.shared_experts FP8 32x32;
               Engram layers: engram.embed.weight F8_E4M3 [rows, engram_head_dim] +
                 engram.embed.scale F8_E8M0 [rows, engram_head_dim/32] (one scale per row per 32
                 values; rows = that layer's prime sum), engram.wkv.weight F8_E4M3
                 [dim*(hc+1), (max_ngram-1)*engram_n_heads*engram_head_dim] + 32x32 scale,
                 engram.q_weight, engram.k_weight BF16 [hc, dim].
  The Engram tables are stored after every other tensor in the data section (still naturally
  aligned, no holes); with `sparse_engram` (preset engram-huge) their bytes are not written at all:
  the file is extended with truncate, so they read as zero codes and zero scales (valid values,
  2^-127 scales) and occupy no disk blocks on file systems with sparse files.
  --dense writes every FP8/FP4 weight as its exact BF16 dequantisation, except the Engram tables,
  which stay FP8 + E8M0 (an embedding the reference dequantises per lookup in either mode).
* Quantisation: FP8 tiles of 32x32 and per-tile power-of-two gains on 32x32 tiles; Engram tables:
  per row per 32 values, scale 2^ceil(log2(amax/448)), gains per row x 32 values; init normal 1
  (like embed). engram.q_weight / k_weight: one_plus 0.1; gate.bias_vl: normal 0.1.
* Presets (all: rope_head_dim 64, head_dim multiple of 32, every FP8-GEMM input width a multiple
  of 32, norm_eps 1e-20, hc_eps 1e-6, route_scale 1.5, swiglu_limit 10, YaRN 16/65536/32/1,
  compress_rope_theta 1.6e5, 1 shared expert, engram_max_ngram_size 4, engram_pad_id 2):
    tiny        vocab 1024, dim 256, 10 layers ratios [0,0,2,2,2,2,1,1,1,1]: kv sources 2, 4, 6;
                index sources 2, 4, 6, 8; candidate source 6 (blocks of 2, top 4 blocks); so
                0 window, 1 window + Engram, 2 ratio-2 source, 3 reuse, 4 ratio-2 source + Engram,
                5 reuse, 6 ratio-1 kv/index/candidate source, 7 reuse, 8 reindex (keys of 6,
                candidates of 6), 9 reuse. 4 heads x 128, q_lora 128, o_groups 2 x 64, 8 experts
                top-2 x inter 128, window 8, indexer 8 heads x 128 top-6; Engram layers 1, 4,
                4 heads x 32, engram_vocab_size 1000 (rows 12458, 13416). ~13 MB.
    small       vocab 4096, dim 512, 12 layers [0,0,2,2,2,2,2,1,1,1,1,1]: kv sources 2, 5, 7;
                index sources 2, 5, 7, 9, 11; candidate source 7 (blocks of 4, top 6); Engram
                layers 1, 5 (8 heads x 64, engram_vocab_size 4000); 8 heads x 256, q_lora 256,
                o_groups 4 x 128, 32 experts top-4 x inter 128, window 16, indexer 16 x 128 top-16,
                gate_temp 1.5. ~97 MB.
    engram-huge memory test: tiny-sized model (6 layers [0,0,2,2,1,1], no candidates) with one
                Engram table (layer 1, 4 heads x 64, engram_vocab_size 44,000,000) of 528,001,060
                rows x 66 bytes = 34.86e9 bytes (> 32 GiB) written as a sparse-file hole; the file
                takes ~8 MB of disk. No golden.
    flash-shape every per-tensor shape of V4.1-Flash (§1.2/§1.3): vocab 129280, dim 5120, 64 heads
                x 512, q_lora 1280, o_groups 8 x o_lora 1024, 384 experts top-6 (+1 shared) x inter
                2304, window 128, indexer 32 heads x 128 top-512, candidate blocks of 8, top 2048
                blocks, hc 4, norm_eps 1e-20, the V4.1 gate (gate.bias + gate.bias_vl, no gate_temp
                key: 1.0), FP8 32x32 tiles, FP4 experts; sharded; fast random weights (above); no
                DSpark/MTP tensors (n_mtp_layers 0). Default: the real model's first 4 layers
                [0,0,2,2] (kv/index source 2, no candidate source).
                --layers N (1..40): the real first N layers: compress_ratios = the first N of
                [0,0] + [2]x18 + [1]x20 (the three trailing DSpark entries are not generated),
                kv_source_layer_ids / index_source_layer_ids = the real [2,8,14,20] /
                [2,8,14,20,24,28,32,36] restricted to layers < N, candidate_source_layer_id 20 when
                N > 20 else -1 (candidate_topk_blocks / block_size keep the real 2048 / 8). Rule kept
                for validity (check_preset_v41): a compressed layer whose latest kv source at or below
                it is missing or of another ratio becomes a kv + index source itself; it never fires
                for the real lists (layers 2 and 20, the first layers of each ratio, are sources).
                N = 25 covers every layer role (window, ratio-2 source/reuse, ratio-1 kv + index +
                candidate source, reuse, reindex).
                --experts E (6..384, default 384): E routed experts.
                Engram: off (engram_layer_ids [], engram_num_embeddings []; the other engram_* keys
                keep the real values: max_ngram 4, vocab 16,000,000, 8 heads x 256, pad 2, and the
                generated tokenizer's compressed vocabulary). The real tables (2 x ~3.8e8 rows x 256
                codes, ~203 GB) do not fit the target machines; neither check_preset_v41 (which accepts
                presets without Engram layers) nor the loader (an empty engram_layer_ids skips every
                Engram key, tensor and the hash file) requires them.
                Sizes: top 1.32 GB + head 1.32 GB, per layer ~0.17 GB + 18.8 MB per expert (7.39 GB
                with 384 experts); e.g. --layers 1: 10.04e9 bytes, --layers 4: 32.2e9 bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
from dataclasses import dataclass, field, replace

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ckpt_format as cf  # noqa: E402

FP8_BLOCK = 128
FP4_GROUP = 32

# ---------------------------------------------------------------------------------------------
# Presets


@dataclass(frozen=True)
class Preset:
    name: str
    vocab_size: int
    dim: int
    compress_ratios: tuple
    n_hash_layers: int
    n_heads: int
    head_dim: int
    q_lora_rank: int
    o_groups: int
    o_lora_rank: int
    moe_inter_dim: int
    n_routed_experts: int
    n_activated_experts: int
    window_size: int
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    sharded: bool = False
    n_shared_experts: int = 1
    rope_head_dim: int = 64
    route_scale: float = 1.5
    swiglu_limit: float = 10.0
    rope_theta: float = 10000.0
    compress_rope_theta: float = 160000.0
    rope_factor: float = 16.0
    original_seq_len: int = 65536
    beta_fast: int = 32
    beta_slow: int = 1
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    norm_eps: float = 1e-6
    max_position_embeddings: int = 1048576
    fast: bool = False  # FP8/FP4 codes and scales drawn as random bytes (see "Fast random weights")

    @property
    def n_layers(self) -> int:
        return len(self.compress_ratios)


# The real V4-Flash layer pattern (docs §1.1): compress_ratios of the 43 backbone layers (the 44th
# entry, the NextN layer, is left out), layers 0-2 hash-routed, 256 routed experts.
V4_FLASH_RATIOS = (0, 0) + (4, 128) * 20 + (4,)
V4_FLASH_HASH_LAYERS = 3
V4_FLASH_EXPERTS = 256
V4_FLASH_DEFAULT_EXPERTS = 16

PRESETS = {
    "tiny": Preset(
        name="tiny", vocab_size=1024, dim=256, compress_ratios=(0, 4, 128, 4, 128), n_hash_layers=2,
        n_heads=4, head_dim=128, q_lora_rank=128, o_groups=2, o_lora_rank=128, moe_inter_dim=128,
        n_routed_experts=8, n_activated_experts=2, window_size=16, index_n_heads=16,
        index_head_dim=128, index_topk=4),
    "small": Preset(
        name="small", vocab_size=4096, dim=512, compress_ratios=(0, 0, 4, 128, 4, 128, 4, 128),
        n_hash_layers=3, n_heads=8, head_dim=256, q_lora_rank=256, o_groups=4, o_lora_rank=128,
        moe_inter_dim=256, n_routed_experts=64, n_activated_experts=4, window_size=32,
        index_n_heads=16, index_head_dim=128, index_topk=16),
    "flash-shape": Preset(
        name="flash-shape", vocab_size=129280, dim=4096, compress_ratios=(0, 4, 128, 4),
        n_hash_layers=1, n_heads=64, head_dim=512, q_lora_rank=1024, o_groups=8, o_lora_rank=1024,
        moe_inter_dim=2048, n_routed_experts=16, n_activated_experts=6, window_size=128,
        index_n_heads=64, index_head_dim=128, index_topk=512, sharded=True, fast=True),
}


def v4_flash_preset(layers: int | None = None, experts: int | None = None) -> Preset:
    """The V4 flash-shape preset; with `layers` N: the real model's first N layers (compress ratios
    V4_FLASH_RATIOS[:N], min(N, 3) hash layers); `experts` E: E routed experts (top-6 needs E >= 6)."""
    base = PRESETS["flash-shape"]
    kw = {}
    if layers is not None:
        if not 1 <= layers <= len(V4_FLASH_RATIOS):
            raise ValueError(f"--layers must be in [1, {len(V4_FLASH_RATIOS)}] for v4 flash-shape, got {layers}")
        kw.update(compress_ratios=V4_FLASH_RATIOS[:layers], n_hash_layers=min(layers, V4_FLASH_HASH_LAYERS))
    if experts is not None:
        if not base.n_activated_experts <= experts <= V4_FLASH_EXPERTS:
            raise ValueError(f"--experts must be in [{base.n_activated_experts}, {V4_FLASH_EXPERTS}] for v4 "
                             f"flash-shape, got {experts}")
        kw.update(n_routed_experts=experts)
    return replace(base, **kw) if kw else base


def check_preset(p: Preset) -> None:
    """The constraints the formats and kernels impose; raises ValueError. (V4.1 presets: see
    check_preset_v41, which this forwards to.)"""
    if isinstance(p, PresetV41):
        return check_preset_v41(p)

    def need(cond, msg):
        if not cond:
            raise ValueError(f"preset {p.name}: {msg}")
    for what, v in (("dim", p.dim), ("q_lora_rank", p.q_lora_rank), ("moe_inter_dim", p.moe_inter_dim),
                    ("n_heads*head_dim/o_groups", p.n_heads * p.head_dim // p.o_groups),
                    ("o_groups*o_lora_rank", p.o_groups * p.o_lora_rank)):
        need(v % FP8_BLOCK == 0, f"{what}={v} must be a multiple of {FP8_BLOCK}")
    need(p.n_heads % p.o_groups == 0, "n_heads must be a multiple of o_groups")
    need(p.rope_head_dim == 64, "rope_head_dim must be 64")
    need((p.head_dim - p.rope_head_dim) % 64 == 0, "head_dim - rope_head_dim must be a multiple of 64")
    need(p.index_head_dim == 128, "index_head_dim must be 128")
    need(p.index_n_heads >= 16, "index_n_heads must be >= 16")
    need(all(r in (0, 4, 128) for r in p.compress_ratios), "compress ratios must be 0, 4 or 128")
    need(0 <= p.n_hash_layers <= p.n_layers, "bad n_hash_layers")
    need(p.n_activated_experts <= p.n_routed_experts, "top-k larger than the expert count")
    need(p.vocab_size >= 300, "vocab_size must be >= 300 (tokenizer: 3 specials + 256 bytes + chat)")


# ---------------------------------------------------------------------------------------------
# Tensor plan


@dataclass
class Logical:
    """One logical tensor; FP8/FP4 ones are stored as .weight + .scale (or one BF16 with --dense)."""
    key: str         # stored name of the value tensor (the RNG key)
    kind: str        # bf16 | f32 | fp8 | fp4 | tid2eid | fp8row (V4.1 Engram table: e4m3 + e8m0 per row per 32)
    shape: tuple     # logical shape
    init: tuple      # ("normal", std) | ("one_plus", std) | ("uniform", lo, hi) | ("tid2eid", E)
    stored: dict = field(default_factory=dict)  # stored name -> (dtype, shape, part)
    block: int = FP8_BLOCK  # FP8 tile edge (128 V4, 32 V4.1)
    hole: bool = False      # fp8row only: written as a sparse-file hole (all-zero bytes), never drawn


def _lin(out_dim: int, in_dim: int) -> tuple:
    return ("normal", 1.0 / math.sqrt(in_dim))


def _plan_block_common(add, lin, p, pre: str) -> str:
    """The tensors every block of both families has, in their fixed order: the hc mixes, the two
    norms and the attention projections. Returns the attention prefix."""
    d, hc = p.dim, p.hc_mult
    mix, norm = (2 + hc) * hc, ("one_plus", 0.05)
    for s in ("attn", "ffn"):
        add(f"{pre}hc_{s}_fn", "f32", (mix, hc * d), ("normal", 1.0 / math.sqrt(hc * d)))
        add(f"{pre}hc_{s}_base", "f32", (mix,), ("normal", 1.0))
        add(f"{pre}hc_{s}_scale", "f32", (3,), ("uniform", 0.1, 1.0))
    add(f"{pre}attn_norm.weight", "bf16", (d,), norm)
    add(f"{pre}ffn_norm.weight", "bf16", (d,), norm)
    a = pre + "attn."
    lin(a + "wq_a.weight", "fp8", p.q_lora_rank, d)
    add(a + "q_norm.weight", "bf16", (p.q_lora_rank,), norm)
    lin(a + "wq_b.weight", "fp8", p.n_heads * p.head_dim, p.q_lora_rank)
    lin(a + "wkv.weight", "fp8", p.head_dim, d)
    add(a + "kv_norm.weight", "bf16", (p.head_dim,), norm)
    lin(a + "wo_a.weight", "fp8", p.o_groups * p.o_lora_rank, p.n_heads * p.head_dim // p.o_groups)
    lin(a + "wo_b.weight", "fp8", d, p.o_groups * p.o_lora_rank)
    add(a + "attn_sink", "f32", (p.n_heads,), ("normal", 1.0))
    return a


def plan_logical(p: Preset) -> list[Logical]:
    """Every logical tensor of the checkpoint, in a fixed order (the order has no effect on values)."""
    d, hc = p.dim, p.hc_mult
    norm = ("one_plus", 0.05)
    T: list[Logical] = []

    def add(key, kind, shape, init):
        T.append(Logical(key, kind, tuple(int(s) for s in shape), init))

    def lin(key, kind, out_dim, in_dim):
        add(key, kind, (out_dim, in_dim), _lin(out_dim, in_dim))

    add("embed.weight", "bf16", (p.vocab_size, d), ("normal", 1.0))
    add("head.weight", "bf16", (p.vocab_size, d), ("normal", 3.0 / math.sqrt(d)))
    add("norm.weight", "bf16", (d,), norm)
    add("hc_head_fn", "f32", (hc, hc * d), ("normal", 1.0 / math.sqrt(hc * d)))
    add("hc_head_base", "f32", (hc,), ("normal", 1.0))
    add("hc_head_scale", "f32", (1,), ("uniform", 0.1, 1.0))

    inter = p.moe_inter_dim
    shared_inter = p.n_shared_experts * p.moe_inter_dim
    for l, ratio in enumerate(p.compress_ratios):
        pre = f"layers.{l}."
        a = _plan_block_common(add, lin, p, pre)
        if ratio:
            c = 2 if ratio == 4 else 1
            lin(a + "compressor.wkv.weight", "bf16", c * p.head_dim, d)
            lin(a + "compressor.wgate.weight", "bf16", c * p.head_dim, d)
            add(a + "compressor.ape", "f32", (ratio, c * p.head_dim), ("normal", 0.5))
            add(a + "compressor.norm.weight", "bf16", (p.head_dim,), norm)
        if ratio == 4:
            ix = a + "indexer."
            lin(ix + "wq_b.weight", "fp8", p.index_n_heads * p.index_head_dim, p.q_lora_rank)
            lin(ix + "weights_proj.weight", "bf16", p.index_n_heads, d)
            lin(ix + "compressor.wkv.weight", "bf16", 2 * p.index_head_dim, d)
            lin(ix + "compressor.wgate.weight", "bf16", 2 * p.index_head_dim, d)
            add(ix + "compressor.ape", "f32", (4, 2 * p.index_head_dim), ("normal", 0.5))
            add(ix + "compressor.norm.weight", "bf16", (p.index_head_dim,), norm)

        f = pre + "ffn."
        lin(f + "gate.weight", "bf16", p.n_routed_experts, d)
        if l < p.n_hash_layers:
            add(f + "gate.tid2eid", "tid2eid", (p.vocab_size, p.n_activated_experts),
                ("tid2eid", p.n_routed_experts))
        else:
            add(f + "gate.bias", "f32", (p.n_routed_experts,), ("normal", 0.1))
        for e in range(p.n_routed_experts):
            lin(f"{f}experts.{e}.w1.weight", "fp4", inter, d)
            lin(f"{f}experts.{e}.w2.weight", "fp4", d, inter)
            lin(f"{f}experts.{e}.w3.weight", "fp4", inter, d)
        lin(f + "shared_experts.w1.weight", "fp8", shared_inter, d)
        lin(f + "shared_experts.w2.weight", "fp8", d, shared_inter)
        lin(f + "shared_experts.w3.weight", "fp8", shared_inter, d)
    return T


def plan(p: Preset, dense: bool) -> list[Logical]:
    """plan_logical + the stored tensors (name -> (dtype, shape, part)) of each logical tensor."""
    T = plan_logical(p)
    for t in T:
        base = t.key[:-len(".weight")] if t.key.endswith(".weight") else None
        if t.kind == "bf16":
            t.stored[t.key] = ("BF16", t.shape, "value")
        elif t.kind == "f32":
            t.stored[t.key] = ("F32", t.shape, "value")
        elif t.kind == "tid2eid":
            t.stored[t.key] = ("I64", t.shape, "value")
        elif dense:
            t.stored[t.key] = ("BF16", t.shape, "dense")
        elif t.kind == "fp8":
            o, i = t.shape
            t.stored[t.key] = ("F8_E4M3", t.shape, "codes")
            t.stored[base + ".scale"] = ("F8_E8M0", (-(-o // FP8_BLOCK), -(-i // FP8_BLOCK)), "scales")
        elif t.kind == "fp4":
            o, i = t.shape
            t.stored[t.key] = ("I8", (o, i // 2), "codes")
            t.stored[base + ".scale"] = ("F8_E8M0", (o, i // FP4_GROUP), "scales")
        else:
            raise AssertionError(t.kind)
    return T


def shard_of(name: str, p: Preset) -> str:
    """Shard group: "top" (top-level but head), "layer.L", "head"."""
    if name == "head.weight":
        return "head"
    if name.startswith("layers."):
        return "layer." + name.split(".")[1]
    return "top"


# ---------------------------------------------------------------------------------------------
# Random masters


def tensor_rng(seed: int, key: str) -> np.random.Generator:
    words = np.frombuffer(hashlib.sha256(key.encode()).digest(), dtype=">u4").astype(np.uint64)
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed)] + [int(w) for w in words])))


CHUNK_ELEMS = 1 << 23  # elements per draw chunk (memory only; values do not depend on it)


def iter_master(seed: int, t: Logical):
    """Yields the float32 master of t in row chunks (2-D) or whole (1-D); row-major stream."""
    rng = tensor_rng(seed, t.key)
    kind = t.init[0]
    rows = t.shape[0] if len(t.shape) == 2 else 1
    cols = t.shape[1] if len(t.shape) == 2 else t.shape[0]
    step = max(1, CHUNK_ELEMS // cols)
    for r0 in range(0, rows, step):
        r = min(step, rows - r0)
        n = r * cols
        if kind in ("normal", "one_plus"):
            u = rng.random((n, 4))
            x = (((u[:, 0] + u[:, 1]) + u[:, 2]) + u[:, 3] - 2.0) * (math.sqrt(3.0) * t.init[1])
            if kind == "one_plus":
                x = 1.0 + x
        elif kind == "uniform":
            lo, hi = t.init[1], t.init[2]
            x = lo + (hi - lo) * rng.random(n)
        else:
            raise AssertionError(kind)
        x = x.astype(np.float32)
        yield x.reshape(r, cols) if len(t.shape) == 2 else x


def master(seed: int, t: Logical) -> np.ndarray:
    parts = list(iter_master(seed, t))
    return np.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]


GAIN_NORM = 1.0 / math.sqrt(1.75)  # E[g^2] = (1/4 + 1 + 4) / 3 for g = 2^k, k in {-1, 0, 1}


def quant_master(seed: int, t: Logical) -> np.ndarray:
    """Master of an FP8/FP4 weight: the "normal" draw times a power-of-two gain per scale block
    (128x128 tile for FP8, row x 32 K-values for FP4), so that the stored scales differ from block
    to block (a loader that applies the wrong block's scale gets visibly wrong values). Gains come
    from the stream of key + "#gain": u = random(n_blocks) in row-major block order,
    g = 2^(floor(3u) - 1); the product is renormalised by 1/sqrt(1.75) to keep the variance."""
    x = master(seed, t).astype(np.float64)
    out_dim, in_dim = t.shape
    bo, bi = (t.block, t.block) if t.kind == "fp8" else (1, FP4_GROUP)
    no, ni = -(-out_dim // bo), -(-in_dim // bi)
    k = np.floor(tensor_rng(seed, t.key + "#gain").random((no, ni)) * 3.0).astype(np.int64) - 1
    g = np.ldexp(GAIN_NORM, k)
    g = np.repeat(np.repeat(g, bo, axis=0), bi, axis=1)[:out_dim, :in_dim]
    return (x * g).astype(np.float32)


def tid2eid(seed: int, t: Logical) -> np.ndarray:
    rng = tensor_rng(seed, t.key)
    vocab, k = t.shape
    n_exp = t.init[1]
    out = np.empty((vocab, k), dtype=np.int64)
    step = 16384
    for r0 in range(0, vocab, step):  # rows of u are consecutive in the stream: chunking is exact
        u = rng.random((min(step, vocab - r0), n_exp))
        out[r0:r0 + len(u)] = np.argsort(u, axis=1, kind="stable")[:, :k]
    return out


def quantize(t: Logical, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if t.kind == "fp8":
        return cf.quantize_fp8_block(w, t.block)
    if t.kind == "fp8row":
        return cf.quantize_fp8_rows(w, FP4_GROUP)
    return cf.quantize_fp4_rows(w, FP4_GROUP)


def dequantize(t: Logical, codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    if t.kind == "fp8":
        return cf.dequantize_fp8_block(codes, scales, t.block)
    if t.kind == "fp8row":
        return cf.dequantize_fp8_rows(codes, scales, FP4_GROUP)
    return cf.dequantize_fp4_rows(codes, scales, FP4_GROUP)


# ---------------------------------------------------------------------------------------------
# Fast random weights (presets with fast=True: the flash-shape ones). See the docstring section
# "Fast random weights": random codes and scales straight from the bit generator, no masters.

FAST_CHUNK_BYTES = 1 << 24  # bytes per drawn chunk (memory only: code values do not depend on it)
_M7F, _M01, _M80 = (np.uint64(int(b * 8, 16)) for b in ("7f", "01", "80"))
_SEVEN = np.uint64(7)


def _fix_e4m3_nan(w: np.ndarray) -> np.ndarray:
    """In place on uint64 words of 8 e4m3 codes: the NaN codes 0x7F / 0xFF become 0x7E / 0xFE (+-448).
    Per byte, ((b & 0x7F) + 1) & 0x80 is set exactly for b & 0x7F == 0x7F and never carries."""
    t = w & _M7F
    t += _M01
    t &= _M80
    t >>= _SEVEN
    w -= t
    return w


def _code_rms(values: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(values))))


_E4M3_CODES = _fix_e4m3_nan(np.arange(256, dtype=np.uint8).view(np.uint64).copy()).view(np.uint8)
E4M3_CODE_RMS = _code_rms(cf.decode_e4m3(_E4M3_CODES))             # ~ 104.7
E2M1_CODE_RMS = _code_rms(cf.decode_e2m1(np.arange(16, dtype=np.uint8)))  # sqrt(8.5625)


def _fast_dims(t: Logical) -> tuple[int, int, int]:
    """(rows, stored columns of the codes, scale block height) of an FP8/FP4 weight."""
    o, i = t.shape
    return (o, i, t.block) if t.kind == "fp8" else (o, i // 2, 1)


def fast_scale_exponent(t: Logical) -> int:
    """Centre exponent e of the E8M0 scales: 2^e * code_rms * sqrt(1.75) ~ the init std 1/sqrt(in)
    (sqrt(1.75): the RMS of the per-block factor 2^{-1,0,1})."""
    rms = E4M3_CODE_RMS if t.kind == "fp8" else E2M1_CODE_RMS
    return int(round(math.log2(t.init[1] / (rms * math.sqrt(1.75)))))


def fast_scales(seed: int, t: Logical) -> np.ndarray:
    """E8M0 scale bytes: 127 + e + k, k uniform in {-1, 0, 1} per block, from the stream key + "#scale"."""
    o, i = t.shape
    shape = (-(-o // t.block), -(-i // t.block)) if t.kind == "fp8" else (o, i // FP4_GROUP)
    e = 127 + fast_scale_exponent(t)
    assert 1 <= e <= 253, (t.key, e)
    k = tensor_rng(seed, t.key + "#scale").integers(0, 3, size=shape, dtype=np.uint8)
    return k + np.uint8(e - 1)


def fast_codes(seed: int, t: Logical, rows_per_chunk: int | None = None):
    """Yields (row0, uint8 [r, cols] codes) in row order: the raw 64-bit words of the key's stream as
    little-endian bytes (FP8: NaN codes remapped; FP4: any nibble). cols is a multiple of 8, so every
    chunk takes whole words and the codes do not depend on the chunking."""
    rows, cols, blk = _fast_dims(t)
    assert cols % 8 == 0, (t.key, cols)
    step = rows_per_chunk or max(blk, FAST_CHUNK_BYTES // cols // blk * blk)
    bitgen = tensor_rng(seed, t.key).bit_generator
    for r0 in range(0, rows, step):
        r = min(step, rows - r0)
        w = bitgen.random_raw(r * cols // 8).astype("<u8", copy=False)
        if t.kind == "fp8":
            _fix_e4m3_nan(w)
        yield r0, w.view(np.uint8).reshape(r, cols)


def fast_produce(seed: int, t: Logical, part: str):
    """Byte chunks (1-D uint8 arrays) of one stored tensor of a fast preset."""
    if t.kind in ("bf16", "f32"):
        # Uniform draws with the init's mean and std: normal s -> (u - 1/2) * s * sqrt(12),
        # one_plus s -> 1 + that, uniform a, b -> a + (b - a) u; u = float32 random() of the key's stream.
        rng = tensor_rng(seed, t.key)
        n = math.prod(t.shape)
        kind = t.init[0]
        step = FAST_CHUNK_BYTES // 4
        for i0 in range(0, n, step):
            x = rng.random(min(step, n - i0), dtype=np.float32)
            if kind in ("normal", "one_plus"):
                x -= np.float32(0.5)
                x *= np.float32(t.init[1] * math.sqrt(12.0))
                if kind == "one_plus":
                    x += np.float32(1.0)
            elif kind == "uniform":
                x *= np.float32(t.init[2] - t.init[1])
                x += np.float32(t.init[1])
            else:
                raise AssertionError(kind)
            yield (cf.f32_to_bf16_bits(x) if t.kind == "bf16" else x.astype("<f4", copy=False)).view(np.uint8)
    elif t.kind == "tid2eid":
        yield tid2eid(seed, t).astype("<i8").view(np.uint8).reshape(-1)
    elif t.kind not in ("fp8", "fp4"):
        raise AssertionError(f"{t.key}: no fast path for {t.kind}")
    elif part == "codes":
        for _, c in fast_codes(seed, t):
            yield c.reshape(-1)
    elif part == "scales":
        yield fast_scales(seed, t).reshape(-1)
    else:  # dense: the exact BF16 dequantisation of the same codes and scales
        scales = fast_scales(seed, t)
        rows, cols, blk = _fast_dims(t)
        step = max(blk, (1 << 20) // cols // blk * blk)
        for r0, c in fast_codes(seed, t, step):
            if t.kind == "fp8":
                w = cf.dequantize_fp8_block(c, scales[r0 // blk:r0 // blk + -(-len(c) // blk)], blk)
            else:
                w = cf.dequantize_fp4_rows(c, scales[r0:r0 + len(c)], FP4_GROUP)
            yield cf.f32_to_bf16_bits(w).view(np.uint8).reshape(-1)


class Producer:
    """Produces the bytes of stored tensors; the .weight/.scale pair of a quantised tensor is computed
    once and held until both halves were written. fast=True: fast_produce (no cache needed: codes and
    scales come from separate streams); with `order`, the names in the order the writer will ask for
    them, a background thread draws ahead of the writer (at most PREFETCH_CHUNKS chunks queued), so
    drawing overlaps the file writes (numpy's bit generators and ufuncs release the GIL)."""

    PREFETCH_CHUNKS = 16

    def __init__(self, seed: int, logicals: list[Logical], fast: bool = False, order: list[str] | None = None):
        self.seed = seed
        self.owner = {name: t for t in logicals for name in t.stored}
        self.cache: dict[str, tuple] = {}
        self.fast = fast
        self.order = list(order) if fast and order else None
        self.queue = None

    def _prefetch(self):
        try:
            for name in self.order:
                t = self.owner[name]
                for chunk in fast_produce(self.seed, t, t.stored[name][2]):
                    self.queue.put((name, chunk))
                self.queue.put((name, None))
        except BaseException as e:  # handed to the writer thread
            self.queue.put((None, e))

    def __call__(self, name: str):
        t = self.owner[name]
        part = t.stored[name][2]
        if self.order is not None:
            if self.queue is None:
                import queue
                import threading
                self.queue = queue.Queue(self.PREFETCH_CHUNKS)
                threading.Thread(target=self._prefetch, daemon=True).start()
            while True:
                got, chunk = self.queue.get()
                if got is None:
                    raise chunk
                if got != name:
                    raise RuntimeError(f"prefetch order: writer asked for {name}, next drawn is {got}")
                if chunk is None:
                    return
                yield chunk
        elif self.fast:
            yield from fast_produce(self.seed, t, part)
        elif t.kind == "bf16":
            for x in iter_master(self.seed, t):
                yield cf.f32_to_bf16_bits(x).tobytes()
        elif t.kind == "f32":
            for x in iter_master(self.seed, t):
                yield x.astype("<f4").tobytes()
        elif t.kind == "tid2eid":
            yield tid2eid(self.seed, t).astype("<i8").tobytes()
        elif part == "dense":
            codes, scales = quantize(t, quant_master(self.seed, t))
            yield cf.f32_to_bf16_bits(dequantize(t, codes, scales)).tobytes()
        else:
            if t.key not in self.cache:
                self.cache[t.key] = [*quantize(t, quant_master(self.seed, t)), 2]
            entry = self.cache[t.key]
            arr = entry[0] if part == "codes" else entry[1]
            entry[2] -= 1
            if entry[2] == 0:
                del self.cache[t.key]
            yield np.ascontiguousarray(arr).tobytes()


# ---------------------------------------------------------------------------------------------
# Configs


def hf_config(p: Preset, dense: bool) -> dict:
    cfg = {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "vocab_size": p.vocab_size,
        "hidden_size": p.dim,
        "num_hidden_layers": p.n_layers,
        "num_attention_heads": p.n_heads,
        "num_key_value_heads": 1,
        "head_dim": p.head_dim,
        "qk_rope_head_dim": p.rope_head_dim,
        "q_lora_rank": p.q_lora_rank,
        "o_lora_rank": p.o_lora_rank,
        "o_groups": p.o_groups,
        "moe_intermediate_size": p.moe_inter_dim,
        "n_routed_experts": p.n_routed_experts,
        "n_shared_experts": p.n_shared_experts,
        "num_experts_per_tok": p.n_activated_experts,
        "num_hash_layers": p.n_hash_layers,
        "scoring_func": "sqrtsoftplus",
        "topk_method": "noaux_tc",
        "norm_topk_prob": True,
        "routed_scaling_factor": p.route_scale,
        "swiglu_limit": p.swiglu_limit,
        "hidden_act": "silu",
        "rms_norm_eps": p.norm_eps,
        "sliding_window": p.window_size,
        "max_position_embeddings": p.max_position_embeddings,
        "rope_theta": p.rope_theta,
        "compress_rope_theta": p.compress_rope_theta,
        "rope_scaling": {
            "type": "yarn",
            "factor": p.rope_factor,
            "original_max_position_embeddings": p.original_seq_len,
            "beta_fast": p.beta_fast,
            "beta_slow": p.beta_slow,
        },
        "index_n_heads": p.index_n_heads,
        "index_head_dim": p.index_head_dim,
        "index_topk": p.index_topk,
        "hc_mult": p.hc_mult,
        "hc_sinkhorn_iters": p.hc_sinkhorn_iters,
        "hc_eps": p.hc_eps,
        "num_nextn_predict_layers": 0,
        "compress_ratios": list(p.compress_ratios),  # num_hidden_layers + 0 MTP entries
        "bos_token_id": 0,
        "eos_token_id": 1,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    if not dense:
        cfg["expert_dtype"] = "fp4"
        cfg["quantization_config"] = {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "scale_fmt": "ue8m0",
            "activation_scheme": "dynamic",
            "weight_block_size": [FP8_BLOCK, FP8_BLOCK],
        }
    return cfg


def inference_config(p: Preset, dense: bool) -> dict:
    cfg = {
        "vocab_size": p.vocab_size,
        "dim": p.dim,
        "moe_inter_dim": p.moe_inter_dim,
        "n_layers": p.n_layers,
        "n_mtp_layers": 0,
        "n_hash_layers": p.n_hash_layers,
        "n_heads": p.n_heads,
        "n_routed_experts": p.n_routed_experts,
        "n_shared_experts": p.n_shared_experts,
        "n_activated_experts": p.n_activated_experts,
        "score_func": "sqrtsoftplus",
        "route_scale": p.route_scale,
        "swiglu_limit": p.swiglu_limit,
        "q_lora_rank": p.q_lora_rank,
        "head_dim": p.head_dim,
        "rope_head_dim": p.rope_head_dim,
        "norm_eps": p.norm_eps,
        "o_groups": p.o_groups,
        "o_lora_rank": p.o_lora_rank,
        "window_size": p.window_size,
        "original_seq_len": p.original_seq_len,
        "rope_theta": p.rope_theta,
        "rope_factor": p.rope_factor,
        "beta_fast": p.beta_fast,
        "beta_slow": p.beta_slow,
        "index_n_heads": p.index_n_heads,
        "index_head_dim": p.index_head_dim,
        "index_topk": p.index_topk,
        "hc_mult": p.hc_mult,
        "hc_sinkhorn_iters": p.hc_sinkhorn_iters,
        "hc_eps": p.hc_eps,
        "dtype": "bf16" if dense else "fp8",
        "scale_fmt": "ue8m0",
        "compress_rope_theta": p.compress_rope_theta,
        "compress_ratios": list(p.compress_ratios),  # n_layers + n_mtp_layers (0) entries
    }
    if not dense:
        cfg["expert_dtype"] = "fp4"
    return cfg


def write_json(path: str, obj: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


# ---------------------------------------------------------------------------------------------
# Tokenizer

BOS, EOS, PAD = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"
# Chat specials and their V4 ids (docs §4.1); used at these ids when the vocabulary reaches them.
CHAT_SPECIALS = [("<｜User｜>", 128803), ("<｜Assistant｜>", 128804), ("<think>", 128821),
                 ("</think>", 128822), ("｜DSML｜", 128825)]

# DeepSeek-V3/V4 pre-tokenizer splits (docs §4.1), each "isolated", then ByteLevel.
PRETOKENIZER_REGEXES = [
    r"\p{N}{1,3}",
    r"[一-龥぀-ゟ゠-ヿ]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
]

# Training text for the BPE merges: English prose, code and Chinese (written for this tool).
SAMPLE_TEXT = r"""
The quick brown fox jumps over the lazy dog. A language model reads a sequence of tokens and
predicts the next one. Each token is a small piece of text: a whole word, part of a word, a
number, a space, or a single byte of a character that the vocabulary does not know. The model
turns every token into a vector, mixes the vectors with attention, and sends the result through
a mixture of experts before the final projection produces one score for every entry of the
vocabulary. Sampling picks the next token from those scores, and the loop starts again.

Long contexts are expensive, so the attention keeps a sliding window of recent tokens and a
compressed summary of everything older. Every fourth token group is merged into one entry, and a
small indexer chooses which compressed entries each query should read. Other layers compress one
hundred and twenty-eight tokens into a single entry and read all of them. The weights are stored
in eight-bit floating point with one scale per tile of one hundred and twenty-eight by one hundred
and twenty-eight values, while the routed experts use four-bit values with a scale for every
thirty-two numbers along a row. Hyper-connections keep four copies of the hidden state and mix
them with a doubly stochastic matrix computed by twenty Sinkhorn iterations.

Questions people ask the model: What is the capital of France? How many days are there in a leap
year? Why is the sky blue during the day and red at sunset? Please write a short poem about the
sea, the wind, and the stars. Translate "good morning" into Chinese. Summarize the following
paragraph in one sentence. Explain the difference between a list and a tuple in Python.
The answer is 42. The meeting starts at 10:30 on 2024-05-17 in room 301; bring 3 copies.
Prices went from $19.99 to $24.50 (an increase of 22.6%), and 1,000,000 users signed up.

def fibonacci(n: int) -> list[int]:
    \"\"\"Return the first n Fibonacci numbers.\"\"\"
    values = [0, 1]
    while len(values) < n:
        values.append(values[-1] + values[-2])
    return values[:n]


class Tokenizer:
    def __init__(self, vocab: dict[str, int], merges: list[tuple[str, str]]):
        self.vocab = vocab
        self.ranks = {pair: i for i, pair in enumerate(merges)}

    def encode(self, text: str) -> list[int]:
        tokens = list(text.encode("utf-8"))
        return [self.vocab.get(str(t), 0) for t in tokens]


for i in range(10):
    if i % 2 == 0:
        print(f"even: {i}")
    else:
        print(f"odd: {i}")

#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
  std::vector<float> weights(4096, 0.0f);
  for (size_t i = 0; i < weights.size(); ++i) {
    weights[i] = static_cast<float>(i) * 0.5f;
  }
  std::printf("sum of %zu weights\n", weights.size());
  return 0;
}

SELECT name, count(*) AS total FROM users WHERE created_at > '2024-01-01' GROUP BY name;
{"model": "deepseek", "layers": 43, "experts": 256, "window": 128, "dtype": "fp8"}

人工智能正在改变我们的生活和工作方式。大型语言模型通过阅读大量的文本来学习语言的规律，
然后根据上下文预测下一个词。这个模型使用混合专家结构，每个词只激活少数几个专家，
因此计算量比参数量小得多。注意力机制会保留最近的若干个词，并把更早的内容压缩成摘要。
今天天气很好，我们一起去公园散步吧。你好，请问你叫什么名字？我是一个乐于助人的助手。
中国的首都是北京，上海是最大的城市。学习编程需要耐心和练习，多写代码才能进步。
春天来了，花儿开了，小鸟在树上唱歌。数学、物理和化学都是重要的基础学科。
日本語の文章も少し含めます。こんにちは、世界。カタカナとひらがなの例です。
"""


def _bytes_in_vocab_order():
    """GPT-2 byte-level alphabet: byte -> printable character."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def build_tokenizer_json(vocab_size: int) -> str:
    """Trains the merges and assembles tokenizer.json (a str, deterministic)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    if vocab_size >= 129280:
        chat = list(CHAT_SPECIALS)
    else:
        chat = [(tok, vocab_size - len(CHAT_SPECIALS) + i) for i, (tok, _) in enumerate(CHAT_SPECIALS)]
    n_train = min(vocab_size, min(i for _, i in chat))  # ids below the first chat special

    def make_pretok():
        return pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(rx), behavior="isolated", invert=False) for rx in PRETOKENIZER_REGEXES]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = make_pretok()
    trainer = trainers.BpeTrainer(vocab_size=n_train, min_frequency=0, show_progress=False,
                                  special_tokens=[BOS, EOS, PAD],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([SAMPLE_TEXT], trainer=trainer)
    trained = json.loads(tok.to_str())
    vocab = trained["model"]["vocab"]
    merges = trained["model"]["merges"]
    # Check the layout: specials, then the 256 byte characters in code-point order.
    byte_chars = sorted(_bytes_in_vocab_order().values())
    inv = {i: s for s, i in vocab.items()}
    assert [inv[i] for i in range(3)] == [BOS, EOS, PAD], "special ids"
    assert [inv[3 + i] for i in range(256)] == byte_chars, "byte token order"
    assert len(vocab) <= n_train and sorted(vocab.values()) == list(range(len(vocab)))

    extra = {i: tok_s for tok_s, i in chat}
    placeholder_no = 0
    added = [(0, BOS), (1, EOS), (2, PAD)]
    for i in range(len(vocab), vocab_size):
        if i in extra:
            added.append((i, extra[i]))
        else:
            added.append((i, f"<｜place▁holder▁no▁{placeholder_no}｜>"))
            placeholder_no += 1

    tj = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True} for i, s in added],
        "normalizer": None,
        "pre_tokenizer": json.loads(make_pretok().__getstate__()),
        "post_processor": json.loads(processors.TemplateProcessing(
            single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, 0)]).__getstate__()),
        "decoder": json.loads(decoders.ByteLevel().__getstate__()),
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {s: i for s, i in sorted(vocab.items(), key=lambda kv: kv[1])},
            "merges": merges,
        },
    }
    text = json.dumps(tj, ensure_ascii=False, indent=2) + "\n"
    # Round-trip through tokenizers: must load and have exactly vocab_size ids.
    check = Tokenizer.from_str(text)
    assert check.get_vocab_size(with_added_tokens=True) == vocab_size, check.get_vocab_size(True)
    assert check.id_to_token(vocab_size - 1) is not None and check.id_to_token(vocab_size) is None
    return text


def tokenizer_config() -> dict:
    return {
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "legacy": True,
        "model_max_length": 1048576,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "use_default_system_prompt": False,
    }


# ---------------------------------------------------------------------------------------------
# V4.1 family (docs/v4-architecture.md §1.2, §1.3, §2.6-§2.10, §3)

FP8_BLOCK_V41 = 32
ENGRAM_GROUP = 32  # Engram table rows: one E8M0 scale per 32 values
HASH_FILE = "engram_hash.safetensors"


@dataclass(frozen=True)
class PresetV41:
    name: str
    vocab_size: int
    dim: int
    compress_ratios: tuple       # one per backbone layer (0 window only, 2, 1)
    kv_source_layers: tuple
    index_source_layers: tuple
    candidate_source_layer: int
    candidate_topk_blocks: int
    candidate_block_size: int
    n_heads: int
    head_dim: int
    q_lora_rank: int
    o_groups: int
    o_lora_rank: int
    moe_inter_dim: int
    n_routed_experts: int
    n_activated_experts: int
    window_size: int
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    engram_layer_ids: tuple
    engram_max_ngram_size: int
    engram_vocab_size: int
    engram_n_heads: int
    engram_head_dim: int
    engram_pad_id: int = 2
    gate_temp: float | None = None       # None: not written to the HF config (reference default 1.0)
    norm_topk_prob: bool | None = None   # None: true, written as true
    sparse_engram: bool = False          # Engram tables written as a sparse-file hole (all zero)
    n_shared_experts: int = 1
    rope_head_dim: int = 64
    route_scale: float = 1.5
    swiglu_limit: float = 10.0
    rope_theta: float = 10000.0
    compress_rope_theta: float = 160000.0
    rope_factor: float = 16.0
    original_seq_len: int = 65536
    beta_fast: int = 32
    beta_slow: int = 1
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    norm_eps: float = 1e-20
    max_position_embeddings: int = 1048576
    sharded: bool = False
    fast: bool = False  # FP8/FP4 codes and scales drawn as random bytes (see "Fast random weights")

    @property
    def n_layers(self) -> int:
        return len(self.compress_ratios)


PRESETS_V41 = {
    # 10 layers: 0 window, 1 window + Engram, 2 ratio-2 kv/index source, 3 reuse, 4 ratio-2 kv/index
    # source + Engram (like the real layer 14), 5 reuse, 6 ratio-1 kv/index/candidate source, 7 reuse,
    # 8 ratio-1 reindex (index source using candidates, keys of 6), 9 reuse.
    "tiny": PresetV41(
        name="tiny", vocab_size=1024, dim=256, compress_ratios=(0, 0, 2, 2, 2, 2, 1, 1, 1, 1),
        kv_source_layers=(2, 4, 6), index_source_layers=(2, 4, 6, 8), candidate_source_layer=6,
        candidate_topk_blocks=4, candidate_block_size=2, n_heads=4, head_dim=128, q_lora_rank=128,
        o_groups=2, o_lora_rank=64, moe_inter_dim=128, n_routed_experts=8, n_activated_experts=2,
        window_size=8, index_n_heads=8, index_head_dim=128, index_topk=6, engram_layer_ids=(1, 4),
        engram_max_ngram_size=4, engram_vocab_size=1000, engram_n_heads=4, engram_head_dim=32),
    # 12 layers: 0 window, 1 window + Engram, 2 r2 source, 3-4 reuse, 5 r2 source + Engram, 6 reuse,
    # 7 r1 kv/index/candidate source, 8 reuse, 9 reindex, 10 reuse, 11 reindex; gate_temp 1.5.
    "small": PresetV41(
        name="small", vocab_size=4096, dim=512, compress_ratios=(0, 0, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1),
        kv_source_layers=(2, 5, 7), index_source_layers=(2, 5, 7, 9, 11), candidate_source_layer=7,
        candidate_topk_blocks=6, candidate_block_size=4, n_heads=8, head_dim=256, q_lora_rank=256,
        o_groups=4, o_lora_rank=128, moe_inter_dim=128, n_routed_experts=32, n_activated_experts=4,
        window_size=16, index_n_heads=16, index_head_dim=128, index_topk=16, engram_layer_ids=(1, 5),
        engram_max_ngram_size=4, engram_vocab_size=4000, engram_n_heads=8, engram_head_dim=64,
        gate_temp=1.5),
    # Memory test: tiny everywhere except one Engram table of 528,001,060 rows x (64 + 2) bytes
    # (> 34e9 bytes, > 32 GiB) written as a sparse-file hole (all-zero codes and scales).
    "engram-huge": PresetV41(
        name="engram-huge", vocab_size=1024, dim=256, compress_ratios=(0, 0, 2, 2, 1, 1),
        kv_source_layers=(2, 4), index_source_layers=(2, 4), candidate_source_layer=-1,
        candidate_topk_blocks=0, candidate_block_size=0, n_heads=4, head_dim=128, q_lora_rank=128,
        o_groups=2, o_lora_rank=64, moe_inter_dim=128, n_routed_experts=8, n_activated_experts=2,
        window_size=8, index_n_heads=8, index_head_dim=128, index_topk=6, engram_layer_ids=(1,),
        engram_max_ngram_size=4, engram_vocab_size=44_000_000, engram_n_heads=4, engram_head_dim=64,
        sparse_engram=True),
}

def latest_at_or_before(layers, l: int) -> int:
    c = [s for s in layers if s <= l]
    return max(c) if c else -1


# The real V4.1-Flash layer pattern (docs §1.2): 40 backbone layers (the three trailing ratio-0
# entries are the DSpark stages, not generated), their kv / index / candidate sources, 384 experts.
V41_FLASH_RATIOS = (0, 0) + (2,) * 18 + (1,) * 20
V41_FLASH_KV_SOURCES = (2, 8, 14, 20)
V41_FLASH_INDEX_SOURCES = (2, 8, 14, 20, 24, 28, 32, 36)
V41_FLASH_CANDIDATE_SOURCE = 20
V41_FLASH_EXPERTS = 384
V41_FLASH_DEFAULT_LAYERS = 4


def v41_flash_layout(n: int) -> tuple[tuple, tuple, tuple, int]:
    """(compress_ratios, kv sources, index sources, candidate source) of the real V4.1-Flash's first n
    layers: the real lists restricted to layers < n (candidate source -1 when 20 >= n). Safeguard, per
    check_preset_v41: a compressed layer whose latest kv source at or below it is missing or has another
    ratio becomes a kv + index source itself. No prefix of the real pattern needs it (layer 2, the
    first ratio-2 layer, and layer 20, the first ratio-1 layer, are sources), so it never fires for
    n in [1, 40]."""
    if not 1 <= n <= len(V41_FLASH_RATIOS):
        raise ValueError(f"--layers must be in [1, {len(V41_FLASH_RATIOS)}] for v41 flash-shape, got {n}")
    R = V41_FLASH_RATIOS[:n]
    kv = [s for s in V41_FLASH_KV_SOURCES if s < n]
    ix = [s for s in V41_FLASH_INDEX_SOURCES if s < n]
    for l, r in enumerate(R):
        ks = latest_at_or_before(kv, l)
        if r and (ks < 0 or R[ks] != r):
            kv = sorted(kv + [l])
            ix = sorted(set(ix + [l]))
    cand = V41_FLASH_CANDIDATE_SOURCE if V41_FLASH_CANDIDATE_SOURCE < n else -1
    return R, tuple(kv), tuple(ix), cand


def v41_flash_preset(layers: int | None = None, experts: int | None = None) -> "PresetV41":
    """Every per-tensor shape of V4.1-Flash (docs §1.2/§1.3) with the real model's first `layers`
    layers (default 4) and `experts` routed experts (default 384, the real count). No Engram layers."""
    n = V41_FLASH_DEFAULT_LAYERS if layers is None else layers
    E = V41_FLASH_EXPERTS if experts is None else experts
    if not 6 <= E <= V41_FLASH_EXPERTS:
        raise ValueError(f"--experts must be in [6, {V41_FLASH_EXPERTS}] for v41 flash-shape, got {E}")
    R, kv, ix, cand = v41_flash_layout(n)
    return PresetV41(
        name="flash-shape", vocab_size=129280, dim=5120, compress_ratios=R, kv_source_layers=kv,
        index_source_layers=ix, candidate_source_layer=cand, candidate_topk_blocks=2048,
        candidate_block_size=8, n_heads=64, head_dim=512, q_lora_rank=1280, o_groups=8, o_lora_rank=1024,
        moe_inter_dim=2304, n_routed_experts=E, n_activated_experts=6, window_size=128, index_n_heads=32,
        index_head_dim=128, index_topk=512, engram_layer_ids=(), engram_max_ngram_size=4,
        engram_vocab_size=16_000_000, engram_n_heads=8, engram_head_dim=256, sharded=True, fast=True)


PRESETS_V41["flash-shape"] = v41_flash_preset()


_ENGRAM_CACHE: dict = {}


def engram_derived(p: PresetV41) -> tuple[int, list[int], np.ndarray]:
    """(engram_compressed_vocab_size from the generated tokenizer, engram_num_embeddings, primes)."""
    key = (p.vocab_size, len(p.engram_layer_ids), p.engram_max_ngram_size, p.engram_n_heads,
           p.engram_vocab_size)
    if key not in _ENGRAM_CACHE:
        from tokenizers import Tokenizer
        hd = _hash_data()
        _, cv = hd.compressed_token_map(Tokenizer.from_str(build_tokenizer_json(p.vocab_size)))
        pr = hd.primes(len(p.engram_layer_ids), p.engram_max_ngram_size, p.engram_n_heads, p.engram_vocab_size)
        _ENGRAM_CACHE[key] = (cv, [int(x) for x in pr.sum(axis=(1, 2))], pr)
    return _ENGRAM_CACHE[key]


def _hash_data():
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "engram", "hash_data.py")
    name = "deepinfer_engram_hash_data"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def check_preset_v41(p: PresetV41) -> None:
    """The constraints the formats, the reference and the kernels impose; raises ValueError."""
    def need(cond, msg):
        if not cond:
            raise ValueError(f"preset v41/{p.name}: {msg}")
    B = FP8_BLOCK_V41
    n_cols = (p.engram_max_ngram_size - 1) * p.engram_n_heads
    for what, v in (("dim", p.dim), ("q_lora_rank", p.q_lora_rank), ("moe_inter_dim", p.moe_inter_dim),
                    ("head_dim", p.head_dim), ("n_heads*head_dim/o_groups", p.n_heads * p.head_dim // p.o_groups),
                    ("o_groups*o_lora_rank", p.o_groups * p.o_lora_rank), ("index_head_dim", p.index_head_dim),
                    ("engram_head_dim", p.engram_head_dim), ("engram wkv input", n_cols * p.engram_head_dim)):
        need(v % B == 0 and v > 0, f"{what}={v} must be a positive multiple of {B} (FP8 GEMM input / tiles)")
    need(p.n_heads % p.o_groups == 0, "n_heads must be a multiple of o_groups")
    need(p.rope_head_dim == 64, "rope_head_dim must be 64")
    need(p.head_dim > p.rope_head_dim and p.head_dim % 16 == 0, "head_dim > rope_head_dim, multiple of 16")
    need(p.index_head_dim >= p.rope_head_dim, "index_head_dim must be >= rope_head_dim")
    need(p.index_n_heads >= 1 and p.index_topk >= 1, "bad indexer shape")
    need(p.n_shared_experts == 1, "the reference needs exactly one shared expert")
    need(p.n_activated_experts <= p.n_routed_experts, "top-k larger than the expert count")
    need(p.vocab_size >= 300, "vocab_size must be >= 300")
    need(0 <= p.engram_pad_id < p.vocab_size, "engram_pad_id outside the vocabulary")
    need(p.window_size >= 1, "window_size must be >= 1")
    R = p.compress_ratios
    need(all(r in (0, 1, 2) for r in R), "V4.1 compress ratios are 0, 1 or 2")
    need(list(p.kv_source_layers) == sorted(set(p.kv_source_layers)), "kv sources must be sorted, distinct")
    need(list(p.index_source_layers) == sorted(set(p.index_source_layers)), "index sources sorted, distinct")
    for s in p.kv_source_layers:
        need(0 <= s < p.n_layers and R[s] > 0, f"kv source {s} must be a compressed layer")
        need(s in p.index_source_layers, f"kv source {s} must also be an index source (it owns index keys)")
    for l, r in enumerate(R):
        if r == 0:
            continue
        ks = latest_at_or_before(p.kv_source_layers, l)
        ix = latest_at_or_before(p.index_source_layers, l)
        need(ks >= 0 and R[ks] == r, f"layer {l}: latest kv source <= l must exist with the same ratio")
        need(ix >= 0 and R[ix] == r and ix >= ks, f"layer {l}: latest index source must share its kv source")
    for s in p.index_source_layers:
        need(0 <= s < p.n_layers and R[s] > 0, f"index source {s} must be a compressed layer")
    c = p.candidate_source_layer
    if c >= 0:
        need(c in p.index_source_layers and c in p.kv_source_layers, "candidate source: kv and index source")
        need(p.candidate_topk_blocks >= 1 and p.candidate_block_size >= 1, "bad candidate block settings")
        for s in p.index_source_layers:
            if s > c:
                need(s not in p.kv_source_layers and R[s] == R[c],
                     f"index source {s} after the candidate source must reuse its keys")
    need(all(0 <= l < p.n_layers for l in p.engram_layer_ids), "engram layers outside the model")
    need(not (p.fast and p.engram_layer_ids), "fast presets have no Engram layers (no fast path for the tables)")
    need(p.engram_max_ngram_size >= 2 and p.engram_n_heads >= 1, "bad Engram n-gram shape")
    need((p.dim * (p.hc_mult + 1)) % B == 0, "engram wkv output")


def plan_logical_v41(p: PresetV41) -> list[Logical]:
    """Every logical tensor of a V4.1 checkpoint (§1.3), in a fixed order (no effect on values)."""
    d, hc = p.dim, p.hc_mult
    norm = ("one_plus", 0.05)
    T: list[Logical] = []

    def add(key, kind, shape, init, **kw):
        T.append(Logical(key, kind, tuple(int(s) for s in shape), init, **kw))

    def lin(key, kind, out_dim, in_dim):
        add(key, kind, (out_dim, in_dim), _lin(out_dim, in_dim), block=FP8_BLOCK_V41)

    add("embed.weight", "bf16", (p.vocab_size, d), ("normal", 1.0))
    add("head.weight", "bf16", (p.vocab_size, d), ("normal", 3.0 / math.sqrt(d)))
    add("norm.weight", "bf16", (d,), norm)

    _, rows, _ = engram_derived(p)
    n_cols = (p.engram_max_ngram_size - 1) * p.engram_n_heads
    inter = p.moe_inter_dim
    for l, ratio in enumerate(p.compress_ratios):
        pre = f"layers.{l}."
        a = _plan_block_common(add, lin, p, pre)
        kv_src = l in p.kv_source_layers
        if kv_src:
            lin(a + "compressor.wkv.weight", "bf16", p.head_dim, d)
            if ratio == 2:
                lin(a + "compressor.wgate.weight", "bf16", p.head_dim, d)
            add(a + "compressor.norm.weight", "bf16", (p.head_dim,), norm)
        if l in p.index_source_layers:
            ix = a + "indexer."
            lin(ix + "wq_b.weight", "fp8", p.index_n_heads * p.index_head_dim, p.q_lora_rank)
            lin(ix + "weights_proj.weight", "bf16", p.index_n_heads, d)
            if kv_src:
                lin(ix + "wk.weight", "bf16", p.index_head_dim, p.head_dim)
                add(ix + "k_norm.weight", "bf16", (p.index_head_dim,), norm)

        f = pre + "ffn."
        lin(f + "gate.weight", "bf16", p.n_routed_experts, d)
        add(f + "gate.bias", "f32", (p.n_routed_experts,), ("normal", 0.1))
        add(f + "gate.bias_vl", "f32", (p.n_routed_experts,), ("normal", 0.1))
        for e in range(p.n_routed_experts):
            lin(f"{f}experts.{e}.w1.weight", "fp4", inter, d)
            lin(f"{f}experts.{e}.w2.weight", "fp4", d, inter)
            lin(f"{f}experts.{e}.w3.weight", "fp4", inter, d)
        lin(f + "shared_experts.w1.weight", "fp8", inter, d)
        lin(f + "shared_experts.w2.weight", "fp8", d, inter)
        lin(f + "shared_experts.w3.weight", "fp8", inter, d)

        if l in p.engram_layer_ids:
            g = pre + "engram."
            add(g + "embed.weight", "fp8row", (rows[p.engram_layer_ids.index(l)], p.engram_head_dim),
                ("normal", 1.0), hole=p.sparse_engram)
            lin(g + "wkv.weight", "fp8", d * (hc + 1), n_cols * p.engram_head_dim)
            add(g + "q_weight", "bf16", (hc, d), ("one_plus", 0.1))
            add(g + "k_weight", "bf16", (hc, d), ("one_plus", 0.1))
    return T


def plan_v41(p: PresetV41, dense: bool) -> list[Logical]:
    """plan_logical_v41 + stored tensors. --dense densifies FP8/FP4 weights to BF16; the Engram
    tables stay FP8 + E8M0 (an embedding table, dequantised per lookup by the reference in both modes)."""
    T = plan_logical_v41(p)
    for t in T:
        base = t.key[:-len(".weight")] if t.key.endswith(".weight") else None
        if t.kind == "bf16":
            t.stored[t.key] = ("BF16", t.shape, "value")
        elif t.kind == "f32":
            t.stored[t.key] = ("F32", t.shape, "value")
        elif t.kind == "fp8row":
            rows, dd = t.shape
            t.stored[t.key] = ("F8_E4M3", t.shape, "codes")
            t.stored[base + ".scale"] = ("F8_E8M0", (rows, dd // ENGRAM_GROUP), "scales")
        elif dense:
            t.stored[t.key] = ("BF16", t.shape, "dense")
        elif t.kind == "fp8":
            o, i = t.shape
            t.stored[t.key] = ("F8_E4M3", t.shape, "codes")
            t.stored[base + ".scale"] = ("F8_E8M0", (-(-o // t.block), -(-i // t.block)), "scales")
        elif t.kind == "fp4":
            o, i = t.shape
            t.stored[t.key] = ("I8", (o, i // 2), "codes")
            t.stored[base + ".scale"] = ("F8_E8M0", (o, i // FP4_GROUP), "scales")
        else:
            raise AssertionError(t.kind)
    return T


def hf_config_v41(p: PresetV41, dense: bool) -> dict:
    cv, rows, _ = engram_derived(p)
    text = {
        "model_type": "deepseek_v41_text",
        "vocab_size": p.vocab_size,
        "hidden_size": p.dim,
        "num_hidden_layers": p.n_layers,
        "num_attention_heads": p.n_heads,
        "num_key_value_heads": 1,
        "head_dim": p.head_dim,
        "qk_rope_head_dim": p.rope_head_dim,
        "q_lora_rank": p.q_lora_rank,
        "o_lora_rank": p.o_lora_rank,
        "o_groups": p.o_groups,
        "moe_intermediate_size": p.moe_inter_dim,
        "n_routed_experts": p.n_routed_experts,
        "n_shared_experts": p.n_shared_experts,
        "num_experts_per_tok": p.n_activated_experts,
        "scoring_func": "sqrtsoftplus",
        "topk_method": "noaux_tc",
        "norm_topk_prob": True if p.norm_topk_prob is None else bool(p.norm_topk_prob),
        "routed_scaling_factor": p.route_scale,
        "swiglu_limit": p.swiglu_limit,
        "hidden_act": "silu",
        "rms_norm_eps": p.norm_eps,
        "tie_word_embeddings": False,
        "max_position_embeddings": p.max_position_embeddings,
        "rope_theta": p.rope_theta,
        "rope_scaling": {
            "type": "yarn",
            "factor": p.rope_factor,
            "beta_fast": p.beta_fast,
            "beta_slow": p.beta_slow,
            "original_max_position_embeddings": p.original_seq_len,
        },
        "compress_rope_theta": p.compress_rope_theta,
        "sliding_window": p.window_size,
        "compress_ratios": list(p.compress_ratios),  # num_hidden_layers + 0 MTP entries
        "kv_source_layer_ids": list(p.kv_source_layers),
        "index_source_layer_ids": list(p.index_source_layers),
        "index_n_heads": p.index_n_heads,
        "index_head_dim": p.index_head_dim,
        "index_topk": p.index_topk,
        "candidate_source_layer_id": p.candidate_source_layer,
        "candidate_topk_blocks": p.candidate_topk_blocks,
        "candidate_block_size": p.candidate_block_size,
        "hc_mult": p.hc_mult,
        "hc_sinkhorn_iters": p.hc_sinkhorn_iters,
        "hc_eps": p.hc_eps,
        "engram_layer_ids": list(p.engram_layer_ids),
        "engram_num_embeddings": rows,
        "engram_max_ngram_size": p.engram_max_ngram_size,
        "engram_vocab_size": p.engram_vocab_size,
        "engram_n_heads": p.engram_n_heads,
        "engram_head_dim": p.engram_head_dim,
        "engram_pad_token_id": p.engram_pad_id,
        "engram_compressed_vocab_size": cv,
        "num_nextn_predict_layers": 0,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "torch_dtype": "bfloat16",
    }
    if p.gate_temp is not None:
        text["gate_temp"] = p.gate_temp
    cfg = {
        "architectures": ["DeepseekV41ForCausalLM"],
        "model_type": "deepseek_v41",
        "bos_token_id": 0,
        "eos_token_id": 1,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    if not dense:
        cfg["quantization_config"] = {
            "quant_method": "fp8",
            "activation_scheme": "dynamic",
            "weight_block_size": [FP8_BLOCK_V41, FP8_BLOCK_V41],
            "scale_fmt": "ue8m0",
            "expert_dtype": "fp4",
        }
    cfg["text_config"] = text
    return cfg


def inference_config_v41(p: PresetV41, dense: bool) -> dict:
    """DeepSeek's flat ModelArgs form; every key is a ModelArgs field of the V4.1 reference."""
    cv, rows, _ = engram_derived(p)
    return {
        "vocab_size": p.vocab_size,
        "dim": p.dim,
        "moe_inter_dim": p.moe_inter_dim,
        "n_layers": p.n_layers,
        "n_mtp_layers": 0,
        "n_heads": p.n_heads,
        "n_routed_experts": p.n_routed_experts,
        "n_shared_experts": p.n_shared_experts,
        "n_activated_experts": p.n_activated_experts,
        "score_func": "sqrtsoftplus",
        "gate_temp": 1.0 if p.gate_temp is None else p.gate_temp,
        "norm_topk_prob": True if p.norm_topk_prob is None else bool(p.norm_topk_prob),
        "route_scale": p.route_scale,
        "swiglu_limit": p.swiglu_limit,
        "q_lora_rank": p.q_lora_rank,
        "head_dim": p.head_dim,
        "rope_head_dim": p.rope_head_dim,
        "norm_eps": p.norm_eps,
        "o_groups": p.o_groups,
        "o_lora_rank": p.o_lora_rank,
        "window_size": p.window_size,
        "compress_ratios": list(p.compress_ratios),  # n_layers + n_mtp_layers (0) entries
        "kv_source_layers": list(p.kv_source_layers),
        "index_source_layers": list(p.index_source_layers),
        "compress_rope_theta": p.compress_rope_theta,
        "original_seq_len": p.original_seq_len,
        "rope_theta": p.rope_theta,
        "rope_factor": p.rope_factor,
        "beta_fast": p.beta_fast,
        "beta_slow": p.beta_slow,
        "index_n_heads": p.index_n_heads,
        "index_head_dim": p.index_head_dim,
        "index_topk": p.index_topk,
        "candidate_source_layer": p.candidate_source_layer,
        "candidate_topk_blocks": p.candidate_topk_blocks,
        "candidate_block_size": p.candidate_block_size,
        "hc_mult": p.hc_mult,
        "hc_sinkhorn_iters": p.hc_sinkhorn_iters,
        "hc_eps": p.hc_eps,
        "engram_layer_ids": list(p.engram_layer_ids),
        "engram_num_embeddings": rows,
        "engram_max_ngram_size": p.engram_max_ngram_size,
        "engram_vocab_size": p.engram_vocab_size,
        "engram_n_heads": p.engram_n_heads,
        "engram_head_dim": p.engram_head_dim,
        "engram_pad_id": p.engram_pad_id,
        "engram_compressed_vocab_size": cv,
        "dtype": "bf16" if dense else "fp8",
        "expert_dtype": None if dense else "fp4",
    }


def generate_v41(preset: str, seed: int, out: str, dense: bool = False, tokenizer: bool = True,
                 layers: int | None = None, experts: int | None = None, config_only: bool = False) -> dict:
    p = resolve_preset("v41", preset, layers, experts)
    check_preset_v41(p)
    if seed < 0:
        raise ValueError("seed must be >= 0")
    os.makedirs(os.path.join(out, "inference"), exist_ok=True)
    tok_text = build_tokenizer_json(p.vocab_size)
    hf = hf_config_v41(p, dense)
    write_json(os.path.join(out, "config.json"), hf)
    write_json(os.path.join(out, "inference", "config.json"), inference_config_v41(p, dense))
    logicals = plan_v41(p, dense)
    entries = {name: (dt, list(shape)) for t in logicals for name, (dt, shape, _) in t.stored.items()}
    if config_only:
        return write_index_only(out, p, entries)
    if tokenizer:
        with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
            f.write(tok_text)
        write_json(os.path.join(out, "tokenizer_config.json"), tokenizer_config())
    hash_files = []
    if p.engram_layer_ids:  # without Engram layers the loader never reads the hash data: none written
        # Engram hash data (token map, multipliers, primes), checked against the config just written.
        from tokenizers import Tokenizer
        hd = _hash_data()
        hd.write(os.path.join(out, HASH_FILE), hd.build(Tokenizer.from_str(tok_text), hf))
        hash_files.append(HASH_FILE)

    tables = [n for t in logicals if t.kind == "fp8row" for n in t.stored]
    holes = [n for t in logicals if t.kind == "fp8row" and t.hole for n in t.stored]
    if p.sharded:
        assert not tables, "sharded presets have no Engram tables"
        produce = Producer(seed, logicals, fast=p.fast, order=write_order(p, entries))
        total, files = write_shards(out, p, entries, produce)
    else:
        produce = Producer(seed, logicals, fast=p.fast)
        total = cf.write_safetensors(os.path.join(out, "model.safetensors"), entries, produce, {"format": "pt"},
                                     last=tables, holes=holes)
        files = ["model.safetensors"]
    assert not produce.cache, "unpaired quantised tensors"
    return {"tensors": len(entries), "bytes": total, "files": files + hash_files}


# ---------------------------------------------------------------------------------------------
# Driver


def resolve_preset(family: str, preset: str, layers: int | None = None, experts: int | None = None):
    """The preset object for family/preset and the flash-shape flags; raises ValueError."""
    presets = {"v4": PRESETS, "v41": PRESETS_V41}.get(family)
    if presets is None:
        raise ValueError(f"unknown family {family}")
    if preset not in presets:
        raise ValueError(f"preset {preset!r} is not a {family} preset (choose from {', '.join(presets)})")
    if preset != "flash-shape":
        if layers is not None or experts is not None:
            raise ValueError(f"--layers / --experts only apply to the flash-shape presets, not {preset!r}")
        return presets[preset]
    return (v4_flash_preset if family == "v4" else v41_flash_preset)(layers, experts)


def shard_groups(p, entries: dict) -> list[tuple[str, dict]]:
    """Sharded presets: [(file name, entries)] for "top" (top-level but head), each layer, "head"."""
    groups = ["top"] + [f"layer.{l}" for l in range(p.n_layers)] + ["head"]
    n = len(groups)
    return [(f"model-{gi + 1:05d}-of-{n:05d}.safetensors",
             {k: v for k, v in entries.items() if shard_of(k, p) == g}) for gi, g in enumerate(groups)]


def write_order(p, entries: dict) -> list[str]:
    """The order in which write_shards asks for the tensors (shard by shard, each in storage order)."""
    return [n for _, sub in shard_groups(p, entries) for n in cf.storage_order(sub)]


def write_index(out: str, total: int, weight_map: dict) -> None:
    write_json(os.path.join(out, "model.safetensors.index.json"),
               {"metadata": {"total_size": total},
                "weight_map": {k: weight_map[k] for k in sorted(weight_map)}})


def write_shards(out: str, p, entries: dict, produce) -> tuple[int, list[str]]:
    total, files, weight_map = 0, [], {}
    for fname, sub in shard_groups(p, entries):
        total += cf.write_safetensors(os.path.join(out, fname), sub, produce, {"format": "pt"})
        weight_map.update({k: fname for k in sub})
        files.append(fname)
    write_index(out, total, weight_map)
    return total, files


def write_index_only(out: str, p, entries: dict) -> dict:
    """--config-only: no tensors; sharded presets still get model.safetensors.index.json (its
    total_size is the data-section total the shards would have)."""
    total = sum(cf.tensor_nbytes(dt, s) for dt, s in entries.values())
    files = []
    if p.sharded:
        write_index(out, total, {k: fname for fname, sub in shard_groups(p, entries) for k in sub})
        files.append("model.safetensors.index.json")
    return {"tensors": len(entries), "bytes": total, "files": files}


def generate(preset: str, seed: int, out: str, dense: bool = False, family: str = "v4",
             tokenizer: bool = True, layers: int | None = None, experts: int | None = None,
             config_only: bool = False) -> dict:
    if family == "v41":
        return generate_v41(preset, seed, out, dense=dense, tokenizer=tokenizer, layers=layers, experts=experts,
                            config_only=config_only)
    p = resolve_preset(family, preset, layers, experts)
    check_preset(p)
    if seed < 0:
        raise ValueError("seed must be >= 0")
    os.makedirs(os.path.join(out, "inference"), exist_ok=True)
    write_json(os.path.join(out, "config.json"), hf_config(p, dense))
    write_json(os.path.join(out, "inference", "config.json"), inference_config(p, dense))
    logicals = plan(p, dense)
    entries = {name: (dt, list(shape)) for t in logicals for name, (dt, shape, _) in t.stored.items()}
    if config_only:
        return write_index_only(out, p, entries)
    if tokenizer:
        with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
            f.write(build_tokenizer_json(p.vocab_size))
        write_json(os.path.join(out, "tokenizer_config.json"), tokenizer_config())

    produce = Producer(seed, logicals, fast=p.fast, order=write_order(p, entries) if p.sharded else None)
    if not p.sharded:
        total = cf.write_safetensors(os.path.join(out, "model.safetensors"), entries, produce, {"format": "pt"})
        files = ["model.safetensors"]
    else:
        total, files = write_shards(out, p, entries, produce)
    assert not produce.cache, "unpaired quantised tensors"
    return {"tensors": len(entries), "bytes": total, "files": files}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=["v4", "v41"], default="v4")
    ap.add_argument("--preset", choices=sorted(set(PRESETS) | set(PRESETS_V41)), required=True,
                    help="v4: " + ", ".join(PRESETS) + "; v41: " + ", ".join(PRESETS_V41))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    ap.add_argument("--dense", action="store_true",
                    help="write every FP8/FP4 weight as its exact BF16 dequantisation")
    ap.add_argument("--layers", type=int, metavar="N",
                    help="flash-shape only: the real model's first N layers (v4: 1..43, default 4 layers "
                         "[0,4,128,4]; v41: 1..40, default 4)")
    ap.add_argument("--experts", type=int, metavar="E",
                    help="flash-shape only: routed experts (v4: 6..256, default 16; v41: 6..384, default 384)")
    ap.add_argument("--config-only", action="store_true",
                    help="write config.json, inference/config.json (and the shard index) but no tensors")
    ap.add_argument("--no-tokenizer", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    try:
        resolve_preset(args.family, args.preset, args.layers, args.experts)
    except ValueError as e:
        ap.error(str(e))
    info = generate(args.preset, args.seed, args.out, dense=args.dense, family=args.family,
                    tokenizer=not args.no_tokenizer, layers=args.layers, experts=args.experts,
                    config_only=args.config_only)
    extra = "".join(f" --{k} {v}" for k, v in (("layers", args.layers), ("experts", args.experts)) if v is not None)
    print(f"{args.family}/{args.preset}{extra} seed {args.seed}{' dense' if args.dense else ''}"
          f"{' (config only)' if args.config_only else ''}: "
          f"{info['tensors']} tensors, {info['bytes']} bytes in {len(info['files'])} file(s) -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
