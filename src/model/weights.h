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
  ops::QWeight wq_a_kv;  // wq_a and wkv stacked by rows (stack_rows), wq_a / wkv then views of it; else empty
  Tensor q_norm, kv_norm, attn_sink;
  bool has_compressor = false, has_indexer = false;
  CompressorWeights compressor;
  IndexerWeights indexer;
};

struct ExpertWeights {
  ops::QWeight w1, w2, w3;
};

struct MoeWeights {
  Tensor gate_weight;   // BF16 [n_experts, dim], used in FP32
  Tensor gate_bias;     // F32 [n_experts] (score-routed layers)
  Tensor gate_bias_vl;  // F32 [n_experts] (V4.1: the bias for image-span tokens; optional)
  Tensor tid2eid;       // I64/I32 [vocab, topk] (hash layers)
  std::vector<ExpertWeights> experts;
  ExpertWeights shared;
  // The routed experts' matrices as one list each, indexed by expert (the tables of
  // ops::linear_grouped); index_experts() builds them from `experts` once the weights are in place.
  std::vector<ops::QWeight> routed_w1, routed_w2, routed_w3;
  // The shared expert's w1 and w3 as one-matrix lists and kGroupedRowsMax zero expert ids on its device (every row
  // against matrix 0): its single grouped launch at decode (moe.cpp), without per-call lists or a memset. As many
  // as the grouped launches take (run_grouped in layers_v4.h).
  static constexpr int64_t kGroupedRowsMax = 2048;
  std::vector<ops::QWeight> shared_w1, shared_w3;
  Tensor shared_rows;
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

// ---- V4.1 (docs/v4-architecture.md §1.3) ----------------------------------------------------------

// Compressor of a kv-source layer: ratio 1 (plain BF16 projection) or ratio 2 (softmax-gated pairs,
// wkv and wgate used in FP32). No ape, no overlap.
struct CompressorWeightsV41 {
  int64_t ratio = 0;
  ops::QWeight wkv, wgate;  // BF16 [head_dim, dim]; wgate only for ratio 2
  Tensor norm;              // [head_dim]
};

struct IndexerWeightsV41 {
  ops::QWeight wq_b;          // FP8 [index_heads*index_head_dim, q_lora_rank]
  ops::QWeight weights_proj;  // BF16 [index_heads, dim]
  bool owns_keys = false;     // kv sources: index keys = k_norm(wk . latent)
  ops::QWeight wk;            // BF16 [index_head_dim, head_dim]
  Tensor k_norm;              // [index_head_dim]
};

struct AttentionWeightsV41 {
  ops::QWeight wq_a, wq_b, wkv, wo_a, wo_b;
  ops::QWeight wq_a_kv;  // as AttentionWeights::wq_a_kv
  Tensor q_norm, kv_norm, attn_sink;
  bool kv_source = false, index_source = false;
  CompressorWeightsV41 compressor;  // kv sources
  IndexerWeightsV41 indexer;        // index sources
};

// Engram (§2.9): the hash table rows are read straight from the checkpoint mapping.
struct EngramWeights {
  Tensor table;               // E4M3 [rows, engram_head_dim] (or BF16/F32 when dense)
  Tensor table_scale;         // E8M0 [rows, engram_head_dim/32] (undefined when dense)
  ops::QWeight wkv;           // FP8 [dim*(hc+1), n_cols*engram_head_dim]
  Tensor q_weight, k_weight;  // [hc, dim]
};

struct LayerWeightsV41 {
  Tensor hc_attn_fn, hc_attn_base, hc_attn_scale;
  Tensor hc_ffn_fn, hc_ffn_base, hc_ffn_scale;
  Tensor attn_norm, ffn_norm;
  AttentionWeightsV41 attn;
  MoeWeights ffn;
  bool has_engram = false;
  EngramWeights engram;
};

struct ModelWeightsV41 {
  Tensor embed, head, norm;
  std::vector<LayerWeightsV41> layers;
};

ModelWeightsV41 load_weights_v41(Checkpoint& ckpt, const ModelConfig& cfg);

// Binds every tensor of a V4 checkpoint; throws deepinfer::Error naming the tensor on any mismatch,
// and on tensors the model does not use (MTP `mtp.*` tensors are accepted and skipped).
ModelWeights load_weights_v4(Checkpoint& ckpt, const ModelConfig& cfg);

// Copies every weight to `device` (a no-op for the CPU, where they stay borrowed from the mapping).
// V4.1's Engram tables and projections stay on the host (Engram runs there).
void move_weights(ModelWeights& w, Device device);
void move_weights(ModelWeightsV41& w, Device device);
// One tensor / one linear weight (undefined tensors stay undefined).
void move_weight(Tensor& t, Device device);
void move_weight(ops::QWeight& q, Device device);
void move_moe(MoeWeights& m, Device device);
void index_experts(MoeWeights& m);
// Stacks two linears over the same input by rows into `out` (one launch computes both) and re-points a and b
// at its row blocks. Each output column depends on its own weight row only, so the values are the same bits.
// Only where the layouts allow it (same dtype, input width and scale tile, a's rows whole tiles); else `out`
// stays empty and a, b are left as they are.
void stack_rows(ops::QWeight& a, ops::QWeight& b, ops::QWeight& out);
// Every layer's wq_a and wkv (the two linears of the attention input): what a GPU load does, where each
// launch has a fixed cost of several microseconds; the CPU keeps the checkpoint's mapped weights as they are.
// Returns how many pairs were stacked.
template <typename Layer>
int stack_linears(std::vector<Layer>& layers) {
  int n = 0;
  for (Layer& L : layers) {
    stack_rows(L.attn.wq_a, L.attn.wkv, L.attn.wq_a_kv);
    n += L.attn.wq_a_kv.w.defined() ? 1 : 0;
  }
  return n;
}

}  // namespace deepinfer
