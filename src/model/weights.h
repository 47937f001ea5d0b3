// Weight binding for the DeepSeek-V4 family: every checkpoint tensor, by DeepSeek's own names
// (docs/v4-architecture.md §1.3), bound to a field of the same name. Loading checks each
// tensor's shape and dtype against the config and reports missing and unexpected tensors.
#pragma once

#include <string>
#include <vector>

#include "deepinfer/model_config.h"
#include "io/checkpoint.h"
#include "ops/ops.h"

namespace deepinfer {

// Compressor (V4): ratio 4 with overlap (c = 2) or ratio 128 (c = 1); width d (512 main, 128 indexer).
struct CompressorWeights {
  int64_t ratio = 0;
  int64_t head_dim = 0;
  bool overlap = false;
  ops::QWeight wkv, wgate;  // BF16 [c*d, dim], used in FP32
  Tensor ape;               // F32 [ratio, c*d]
  Tensor norm;              // BF16 [d]
};

struct IndexerWeights {
  ops::QWeight wq_b;          // FP8 [index_heads*index_head_dim, q_lora_rank]
  ops::QWeight weights_proj;  // BF16 [index_heads, dim]
  CompressorWeights compressor;
};

struct AttentionWeights {
  ops::QWeight wq_a, wq_b, wkv, wo_a, wo_b;
  Tensor q_norm, kv_norm, attn_sink;
  bool has_compressor = false, has_indexer = false;
  CompressorWeights compressor;
  IndexerWeights indexer;
};

struct ExpertWeights {
  ops::QWeight w1, w2, w3;
};

struct MoeWeights {
  Tensor gate_weight;  // BF16 [n_experts, dim], used in FP32
  Tensor gate_bias;    // F32 [n_experts] (score-routed layers)
  Tensor tid2eid;      // I64/I32 [vocab, topk] (hash layers)
  std::vector<ExpertWeights> experts;
  ExpertWeights shared;
};

struct LayerWeights {
  Tensor hc_attn_fn, hc_attn_base, hc_attn_scale;
  Tensor hc_ffn_fn, hc_ffn_base, hc_ffn_scale;
  Tensor attn_norm, ffn_norm;
  AttentionWeights attn;
  MoeWeights ffn;
};

struct ModelWeights {
  Tensor embed, head, norm;
  Tensor hc_head_fn, hc_head_base, hc_head_scale;
  std::vector<LayerWeights> layers;
};

// Binds every tensor of a V4 checkpoint; throws deepinfer::Error naming the tensor on any mismatch,
// and on tensors the model does not use (MTP `mtp.*` tensors are accepted and skipped).
ModelWeights load_weights_v4(Checkpoint& ckpt, const ModelConfig& cfg);

}  // namespace deepinfer
