// The V4 sublayers, one function per block of docs/v4-architecture.md §2.4–§2.8.
#pragma once

#include <utility>
#include <vector>

#include "core/env.h"
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
ops::LinearOpts linear_q_opts(const LayerCtx& c);  // linear_q's options (the FP8 input site)
// Whether matrices applied per row (the routed experts, wo_a's groups) run as one ops::linear_grouped
// on these rows: on CUDA up to 2048 rows (one launch, each row reading its own matrix, rows of one
// matrix from L2 after the first: decode batches up to 256 tokens at top-6), instead of one call per
// matrix, whose rows share each weight read (the prefill shape, where the tensor-core kernel takes
// them; and the CPU's, where per-row calls would only add overhead). Same bits either way.
inline bool run_grouped(int64_t rows, Device device) {
  return device == Device::kCUDA && rows <= MoeWeights::kGroupedRowsMax;
}
// Whether independent work over these rows runs as ops::SideWork beside the main stream: decode steps of up to
// DEEPINFER_CUDA_SIDE_ROWS (4) rows, whose GEMVs leave HBM bandwidth unused (V4.1 batch 1 / 2 / 4: 1.44 / 2.25 /
// 3.68 -> 1.37 / 2.16 / 3.58 ms; at batch 8 and 32 the concurrent GEMVs measured 9% and 32% slower, each sized to
// fill the GPU alone). The variable is for A/B runs of kernels that assume the whole GPU.
inline bool run_beside(int64_t rows) {
  static const int64_t side_rows_max = env_int("DEEPINFER_CUDA_SIDE_ROWS", 0);
  return rows <= side_rows_max;
}
Tensor linear_bf16(const Tensor& x, const ops::QWeight& w, const LayerCtx& c);
Tensor linear_f32(const Tensor& x, const ops::QWeight& w);
// linear_q of x by a and by b (two linears over the same input); from one call when they are stacked
// (`stacked`, from stack_rows), whose output columns are then split: the same values either way.
std::pair<Tensor, Tensor> linear_q_pair(const Tensor& x, const ops::QWeight& a, const ops::QWeight& b,
                                        const ops::QWeight& stacked, const LayerCtx& c);

// Attention of one layer runs in four steps so that every projection sees the whole stacked batch
// (each weight read once per step) and only the state-dependent middle runs per sequence:
//   attention_rows_*  the per-token projections of all rows (x [T, dim] collapsed and normalised,
//                     positions[T] each row's position),
//   attention_seq_*   per sequence, on its rows (AttnRows::rows): compressors, indexer and the state they
//                     update; returns the chunk's AttnChunk (its KV table's parts, its index-list layout),
//   attend_chunks     every chunk's table and lists stacked, one sparse attention (o de-rotated), the window
//                     rings,
//   attention_output  the stacked o back to [T, dim].
// The per-token projections of one layer's attention. V4: qr, q (re-normed, RoPE), kv (window KV),
// ckv / cscore (the compressor's FP32 projections), ikv / iscore (the indexer compressor's), iq / iw
// (the indexer's queries and scaled head weights). V4.1: qr, q, kv, ckv / cscore (kv sources: ratio 1
// ckv is the normed latent; ratio 2 the FP32 projections), iq / iw (index sources). Undefined when unused.
struct AttnRows {
  Tensor qr, q, kv;
  Tensor ckv, cscore;
  Tensor ikv, iscore;
  Tensor iq, iw;
  AttnRows rows(int64_t a, int64_t b) const;  // rows [a, b) of each
};
AttnRows attention_rows_v4(const AttentionWeights& w, const Tensor& x, const int64_t* positions,
                           const ops::RopeFreqs& rope, const LayerCtx& c);
// Both families (§2.4): one sequence's chunk made ready for the sparse attention by attention_seq_*: the
// parts of its KV table and the layout of its index lists (relative to its own table).
struct AttnChunk {
  Tensor kv;  // the chunk's window KV [T, D]
  int64_t start_pos = 0, wstart = 0;
  WindowRing* ring = nullptr;
  const RowPages* compressed = nullptr;  // the kv source's compressed entries, or null
  ops::IndexLayout lay;
  Tensor picks;  // the indexer's top-k [T, kcols], or undefined
};
// A chunk's table parts (both families' attention_seq): its window KV, window start and ring, and the
// compressed entries it reads (or null); the index layout and picks are the family's.
inline AttnChunk attn_chunk(const Tensor& kv, int64_t start_pos, int64_t wstart, WindowRing* ring,
                            const RowPages* compressed) {
  AttnChunk chunk;
  chunk.kv = kv;
  chunk.start_pos = start_pos;
  chunk.wstart = wstart;
  chunk.ring = ring;
  chunk.compressed = compressed;
  return chunk;
}
// The attention of a layer for every chunk of the batch at once: each chunk's KV table is built into one
// stacked table and its index lists shifted to its rows there (ops::IndexLayout::base) and padded with -1
// to the widest chunk's, then one sparse attention of q [sum T, H*D] (the chunks' rows stacked in their
// order) with the per-head sink, and each chunk's window KV is written into its ring. A row's lists name
// the same KV rows as alone, and the padding only adds empty slots, so every row's result is the one it
// gets alone (batch invariance); one launch per layer instead of one per sequence. Returns o [sum T, H*D], already
// through the conjugate RoPE (§2.4) at the rows' positions[sum T] (ops::AttnDerotate: on CUDA the attention kernel
// applies it to its own output). out (optional): a contiguous float32 buffer of [sum T, H*D] values that receives o
// (the next graph piece's input slot, Model::piece_input), else o is allocated.
Tensor attend_chunks(const Tensor& q, std::vector<AttnChunk>& chunks, const Tensor& sink, const int64_t* positions,
                     const ops::RopeFreqs& rope, const LayerCtx& c, const Tensor& out = Tensor());

// An index source's scoring of one sequence's chunk, deferred so that a layer scores every sequence at once: the
// chunk's rows [row0, row0 + T) of the batch's stacked rows (set by the caller, with `chunk`, the AttnChunk's index in
// the layer's list), its start position, the index keys it scores and the causal ratio (row t sees min(keys, (start_pos
// + t + 1) / ratio) of them).
struct IndexJob {
  int64_t row0 = 0, T = 0, start_pos = 0, ratio = 0;
  const RowPages* keys = nullptr;
  size_t chunk = 0;
};
// The indexer scores of every job's rows, each over its own keys: the jobs' keys gathered into one table and one
// ops::index_scores with per-row key offsets. iq [rows, nh*hd] and iw [rows, nh] are the batch's stacked rows; the
// jobs' rows ascending. Returns float32 [hi - lo, W] for the rows lo = jobs.front().row0 .. hi = the last job's end
// (rows of no job: -inf), W = the most keys of any job: each row's scores are those of its sequence alone, then -inf.
Tensor index_scores_jobs(const std::vector<IndexJob>& jobs, const Tensor& iq, const Tensor& iw, int64_t nh, int64_t hd,
                         bool round);

// The compressors of a layer for every sequence of the forward at once, before their attention_seq_v4 calls (rows: the
// forward's stacked AttnRows; sequence b's are offset[b]..offset[b + 1], at positions start[b].., its layer state
// *states[b]): the indexer's compressor, then the layer's, each one compressor_pool_batch; their new index keys and
// compressed entries rotated, quantised and appended to each sequence's stores. Every op works row by row, so each
// sequence gets the bits it gets alone; on CUDA the launches are per layer, not per sequence.
void compress_batch_v4(const AttentionWeights& w, const AttnRows& rows, const std::vector<int64_t>& offset,
                       const std::vector<int64_t>& start, const std::vector<LayerState*>& states,
                       const ops::RopeFreqs& rope, const LayerCtx& c);
// One sequence's chunk at positions start_pos..start_pos+T-1 (r: its rows; the layer's compressors have run:
// compress_batch_v4); updates the layer's window and returns the chunk for attend_chunks. jobs: when given, the
// indexer's top-k is recorded there (IndexJob) and set by index_batch_v4 for every sequence of the layer at once.
AttnChunk attention_seq_v4(const AttentionWeights& w, const AttnRows& r, int64_t start_pos, LayerState& st,
                           const LayerCtx& c, std::vector<IndexJob>* jobs = nullptr);
// The deferred indexers of one layer (V4: the top min(index_topk, compressed entries) by score of each row): one
// index_scores_jobs, one ops::topk_rows with k = the largest of the chunks' kcols; each chunk's picks are its own
// followed by -1 (its kcols set to k). One job: the sequence's own indexer, unchanged.
void index_batch_v4(const std::vector<IndexJob>& jobs, std::vector<AttnChunk>& chunks, const Tensor& iq,
                    const Tensor& iw, const LayerCtx& c);
// The output of both families (§2.4) over stacked rows: o already de-rotated (attend_chunks), the grouped BF16 wo_a,
// then wo_b. Returns [T, dim].
Tensor attention_output(const Tensor& o, const ops::QWeight& wo_a, const ops::QWeight& wo_b, const LayerCtx& c);

// The compressors' pooling for a batch (both families), one ops::compress_pool for every sequence: sequence b's chunk
// is rows offset[b]..offset[b + 1] of kv / score [rows, width], the forward's stacked FP32 projections (score without
// the position bias), at positions start[b]..; the pending rows of its state *states[b] and, with overlap, its previous
// group complete them. Pools every group each chunk completes (`ape` the V4 position bias or undefined), appends their
// group ids (sequence by sequence) to `groups` and each sequence's count to `counts`, updates the states (pending rows
// and previous group, on their device) and returns the pooled latents [sum of counts, d] before the bf16 rounding and
// norm. Each sequence's latents are the bits it gets alone; the copies in and out of the states are one launch each.
Tensor compressor_pool_batch(const std::vector<CompressorState*>& states, const Tensor& kv, const Tensor& score,
                             const Tensor& ape, int64_t d, bool overlap, const std::vector<int64_t>& offset,
                             const std::vector<int64_t>& start, std::vector<int64_t>& groups,
                             std::vector<int64_t>& counts);
// Appends each sequence's rows of t (counts[b] rows, sequence by sequence) to its store: one copy launch for all.
void append_rows_batch(const Tensor& t, const std::vector<int64_t>& counts, const std::vector<RowPages*>& stores);
// Member m of each of a batch's layer states, in order (their compressors or paged stores, for the batch functions).
template <typename M>
std::vector<M*> each_state(const std::vector<LayerState*>& states, M LayerState::*m) {
  std::vector<M*> out;
  for (LayerState* st : states) out.push_back(&(st->*m));
  return out;
}

// The indexer's head weights of both families (§2.5, §2.6): the BF16 projection of x scaled by
// (index_head_dim * index_n_heads)^-1/2 (rounded to bf16 in bf16 mode). [T, index_n_heads].
Tensor indexer_head_weights(const Tensor& x, const ops::QWeight& proj, const LayerCtx& c);

// ops::index_scores of q [T, heads, d] and w [T, heads] over a paged store's rows (the indexer's keys), through
// ops::index_scores_segments: read where they live on the CPU, gathered into one table on CUDA.
Tensor index_scores_pages(const Tensor& q, const RowPages& keys, const Tensor& w, const ops::KeyVisibility& vis,
                          bool round);
// Host ids as an int32 tensor [n] on `device` (token ids, row lists for ops::embedding / gather_rows).
template <typename I>
Tensor ids_tensor(const std::vector<I>& ids, Device device = Device::kCPU) {
  Tensor t = Tensor::empty({static_cast<int64_t>(ids.size())}, DType::kI32);
  for (size_t i = 0; i < ids.size(); ++i) t.data<int32_t>()[i] = static_cast<int32_t>(ids[i]);
  return t.to(device);
}

// The FFN sublayer (both families, §2.8), from the stream [T, hc, dim] to the next: x = hc_collapse_norm(stream, pre,
// norm) (dumped and teacher-forced as "ffn_in"), y = the MoE of x (dumped as "ffn_out"), then hc_expand(y, stream,
// post, comb). token_ids: the rows' token ids, int32 [T] on the stream's device, read by hash-routed layers only
// (undefined otherwise).
Tensor ffn_moe(const MoeWeights& w, const Tensor& stream, const Tensor& pre, const Tensor& norm, const Tensor& post,
               const Tensor& comb, const Tensor& token_ids, const LayerCtx& c);

}  // namespace deepinfer
