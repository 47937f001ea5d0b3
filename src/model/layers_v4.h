// The V4 sublayers, one function per block of docs/v4-architecture.md §2.4–§2.8.
#pragma once

#include <vector>

#include "model/model.h"

namespace deepinfer {

struct LayerCtx {
  const ModelConfig& cfg;
  const ops::Numerics& num;
  int64_t layer;
  Trace* trace;
};

// Linears by contract (§2.1): FP8/FP4-role (activation fake-quant, BF16 out), BF16 (BF16 out),
// FP32-promoted (FP32 in and out).
Tensor linear_q(const Tensor& x, const ops::QWeight& w, const LayerCtx& c);
Tensor linear_bf16(const Tensor& x, const ops::QWeight& w, const LayerCtx& c);
Tensor linear_f32(const Tensor& x, const ops::QWeight& w);

// Attention of one layer over the chunk x [T, dim] (already collapsed and normalised) at
// positions start_pos..start_pos+T-1; updates the layer's state. Returns [T, dim].
Tensor attention_v4(const AttentionWeights& w, const Tensor& x, int64_t start_pos, LayerState& st,
                    const ops::RopeFreqs& rope, const LayerCtx& c);

// The end of both families' attention (§2.4): sparse attention of q [T, H*D] over the KV table by
// idx with the per-head sink, the chunk's window KV kv [T, D] written into the ring, then the output:
// conjugate RoPE at the query positions, the grouped BF16 wo_a, then wo_b. Returns [T, dim].
Tensor attend_and_project(const Tensor& q, const Tensor& table, const Tensor& idx, const Tensor& kv, const Tensor& sink,
                          int64_t start_pos, WindowRing& ring, const ops::QWeight& wo_a, const ops::QWeight& wo_b,
                          const int64_t* positions, const ops::RopeFreqs& rope, const LayerCtx& c);

// The indexer score of one query against one index key (§2.5, §2.6): per head a BF16 dot product,
// relu, times the head's BF16 weight rounded to BF16, summed over heads and rounded to BF16 (each
// rounding only when bf16). q: [n_heads * head_dim], w: [n_heads].
inline float index_score(const float* q, const float* key, const float* w, int64_t n_heads, int64_t head_dim,
                         bool bf16) {
  auto rd = [&](float v) { return bf16 ? round_bf16(v) : v; };
  double total = 0;
  for (int64_t h = 0; h < n_heads; ++h) {
    const float* qh = q + h * head_dim;
    float dot = 0.0f;
    for (int64_t i = 0; i < head_dim; ++i) dot += qh[i] * key[i];
    dot = rd(dot);
    if (dot > 0) total += rd(dot * w[h]);
  }
  return rd(static_cast<float>(total));
}

// MoE of one layer (both families, §2.8). tokens are the chunk's ids (V4 hash routing). Returns [T, dim].
Tensor moe(const MoeWeights& w, const Tensor& x, const std::vector<int32_t>& tokens, const LayerCtx& c);

}  // namespace deepinfer
