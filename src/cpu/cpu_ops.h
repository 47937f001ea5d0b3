// CPU kernels of the op layer: the same functions and contracts as src/ops/ops.h, for CPU tensors.
// Model code never calls these directly; ops:: dispatches here on Device::kCPU.
#pragma once

#include "ops/ops.h"

namespace deepinfer::cpu {

using ops::HcMix;
using ops::KeyVisibility;
using ops::LinearOpts;
using ops::MoeGroups;
using ops::QWeight;
using ops::RopeFreqs;
using ops::RouteOpts;
using ops::Routing;

Tensor linear(const Tensor& x, const QWeight& w, const LinearOpts& opts);
Tensor dequantize(const QWeight& w);
// Testing: allow (default) or forbid the AVX-512VL build of the GEMV kernels (same FP32 operations, more
// registers); forbidden, linear() runs the AVX2 build. Returns the previous setting. Not thread-safe.
bool set_linear_wide_kernels(bool on);
void fake_quant_fp8(Tensor& x, int64_t col_begin, int64_t col_end, int64_t block);
void fake_quant_fp4(Tensor& x, int64_t block);
void fake_quant_fp4_e4m3_scale(Tensor& x, int64_t block);
void round_bf16(Tensor& x, bool enable = true);
Tensor rms_norm(const Tensor& x, const Tensor& w, float eps, bool round);
void hadamard(Tensor& x, int64_t n, bool round);
RopeFreqs rope_freqs(int64_t rope_dim, double base, double factor, int64_t original_seq_len, double beta_fast,
                     double beta_slow);
void apply_rope(Tensor& x, int64_t head_width, int64_t rope_dim, const int64_t* positions, const RopeFreqs& f,
                bool inverse, bool round);
HcMix hc_mixes(const Tensor& stream, const Tensor& fn, const Tensor& scale, const Tensor& base, int64_t hc,
               int64_t sinkhorn_iters, float hc_eps, float norm_eps);
Tensor hc_collapse(const Tensor& stream, const Tensor& pre, bool round);
Tensor hc_expand(const Tensor& y, const Tensor& stream, const Tensor& post, const Tensor& comb, bool round);
Tensor hc_head(const Tensor& stream, const Tensor& fn, const Tensor& scale, const Tensor& base, float hc_eps,
               float norm_eps, bool round);
Tensor sparse_attention(const Tensor& q, const Tensor& kv, const Tensor& idx, const Tensor& sink, float scale,
                        bool bf16_probs, bool round);
// The same with KV row j at rows[j] (n_rows rows of q's D floats): the attention reads the rows where they live
// (ops::sparse_attention_segments), not from one table.
Tensor sparse_attention_rows(const Tensor& q, const float* const* rows, int64_t n_rows, const Tensor& idx,
                             const Tensor& sink, float scale, bool bf16_probs, bool round);
int64_t topk(const float* scores, int64_t n, int64_t k, int32_t* out);
Tensor topk_rows(const Tensor& scores, int64_t k, bool sort_by_index);
Tensor candidate_blocks(const Tensor& scores, int64_t start_pos, int64_t ratio, int64_t block_size, int64_t keep);
void mask_to_blocks(Tensor& scores, const Tensor& blocks, int64_t block_size);
Tensor sparse_index(const ops::IndexLayout& layout, int64_t T, const Tensor& picks, const Tensor& into = Tensor());
Tensor index_scores(const Tensor& q, const Tensor& keys, const Tensor& w, const KeyVisibility& vis, bool round);
// The same with key j at rows[j] (n_rows rows of d floats): the indexer reads the keys where they live
// (ops::index_scores_segments), not from one table.
Tensor index_scores_rows(const Tensor& q, const float* const* rows, int64_t n_rows, int64_t d, const Tensor& w,
                         const KeyVisibility& vis, bool round);
Routing moe_route(const Tensor& logits, const Tensor& bias, const Tensor& tid2eid, const Tensor& tokens, int64_t k,
                  const RouteOpts& opts);
Tensor swiglu(const Tensor& g, const Tensor& u, const Tensor& weights, float limit, bool round);
Tensor embedding(const Tensor& table, const Tensor& ids, int64_t copies);
Tensor gather_rows(const Tensor& x, const Tensor& rows);
MoeGroups moe_group(const Tensor& ids, const Tensor& weights, int64_t n_experts);
Tensor linear_grouped(const Tensor& x, const Tensor& row_expert, const std::vector<const std::vector<QWeight>*>& lists,
                      const LinearOpts& opts);
Tensor moe_combine(const Tensor& expert_out, const Tensor& slots, const Tensor& shared, bool round);
void copy_into(const Tensor& dst, const Tensor& src);
void scale(Tensor& x, float s, bool round);
void renorm_heads(Tensor& q, int64_t head_dim, float eps, bool round);
Tensor compress_pool(const Tensor& kv, const Tensor& score, const Tensor& ape, int64_t ratio, int64_t d, bool overlap,
                     bool has_prev);

}  // namespace deepinfer::cpu
