// CUDA kernels of the model-level ops (issue 8): the contracts of ops::index_scores, moe_route,
// swiglu, embedding, gather_rows, moe_group, moe_combine, copy_into, compress_pool and renorm_heads
// (src/ops/ops.h) on tensors that live on kCUDA.
//
// index_scores replays the CPU order exactly (fp32 dots in ascending i with separate multiply and add,
// the head sum in FP64 in head order), so it is bit-identical: for up to 16 queries (decode) one lane
// per head (two heads a lane, one key group a warp, the head sum by one lane per key), else one thread
// per (query, key) for 8 queries a block.
// embedding and gather_rows are copies (exact). moe_route and swiglu take exp / log1p as
// fp32(exp(double)) / fp32(log1p(double)) rather than glibc's expf / log1pf (which differ in rare
// ~0.5-1 ulp cases), so their values may differ by an ulp; the selection order, the weight sums and
// everything else follow the CPU's sequence (the top-k by one warp: per-lane scans, then a butterfly on
// (score desc, index asc)). moe_group (count + scan in one block, ordered compaction per expert),
// moe_combine (a token's outputs added in sorted grouped order), copy_into and renorm_heads (one
// warp per head, sequential FP64 sum) are bit-identical; compress_pool replays the CPU order with exp
// as fp32(exp(double)) (ulps). Device-side checks are limited: ids / rows / tokens
// out of range are the caller's error (hash routing writes id -1 and weight 0 for such a token).
#pragma once

#include <cstdint>

#include "ops/ops.h"

namespace deepinfer::cuda {

Tensor index_scores(const Tensor& q, const Tensor& keys, const Tensor& w, const ops::KeyVisibility& vis, bool round);
// index_scores over the keys of the table that ops::gather_segments(segments, ...) would build (d floats a row), read
// where they are by the decode kernel (up to 16 queries, or rows over their own keys: a decode step's indexers), where
// a gather copied every key of the layer at every step; an undefined tensor for a call that kernel does not take (the
// caller gathers the keys for cuda::index_scores).
Tensor index_scores_runs(const Tensor& q, const std::vector<ops::RowSegment>& segments, int64_t d, const Tensor& w,
                         const ops::KeyVisibility& vis, bool round);
// The decode kernel's keys per warp group: 8, 16 or 32 for every call (tests and benchmarks compare them; the same
// bits either way), 0 (the default) as DEEPINFER_CUDA_INDEX_GROUP says.
void index_scores_set_group(int keys);
ops::Routing moe_route(const Tensor& logits, const Tensor& bias, const Tensor& tid2eid, const Tensor& tokens, int64_t k,
                       const ops::RouteOpts& opts);
// ops::moe_dispatch of a single token (logits [1, n_experts], k <= 32, x float32 [1, width]) without host offsets:
// moe_route's launch also groups the pairs (warp 0, after the top-k) and gathers x (blocks beside the route's), with
// the bits of moe_route, moe_group and gather_rows. Returns an undefined routing (ids) for any other call, and for
// every call unless the one launch is on (moe_dispatch_set_mode).
ops::MoeDispatch moe_dispatch(const Tensor& logits, const Tensor& bias, const Tensor& tid2eid, const Tensor& tokens,
                              int64_t k, const ops::RouteOpts& opts, int64_t n_experts, const Tensor& x,
                              int64_t quant_block);
// Whether cuda::moe_dispatch takes the calls it can: 0 = DEEPINFER_CUDA_MOE_DISPATCH (1, the default: one launch; 0:
// the three ops), 1 = never, 2 = always (tests). Returns the previous mode.
int moe_dispatch_set_mode(int mode);
// quant_block > 0: the output fake-quantised in the same launch, as ops::fake_quant_fp8 (see ops.h).
Tensor swiglu(const Tensor& g, const Tensor& u, const Tensor& weights, float limit, bool round,
              int64_t quant_block = 0);
Tensor embedding(const Tensor& table, const Tensor& ids, int64_t copies);
Tensor gather_rows(const Tensor& x, const Tensor& rows, int64_t quant_block = 0);
ops::MoeGroups moe_group(const Tensor& ids, const Tensor& weights, int64_t n_experts, bool host_offsets = true);
Tensor moe_combine(const Tensor& expert_out, const Tensor& slots, const Tensor& shared, bool round);
Tensor moe_combine_expand(const Tensor& expert_out, const Tensor& slots, const Tensor& shared, const Tensor& stream,
                          const Tensor& post, const Tensor& comb, bool round);
void copy_into(const Tensor& dst, const Tensor& src);
// ops::copy_rows (and so ops::gather_segments): every run on the device.
void copy_rows(const std::vector<ops::RowCopy>& copies, int64_t width);
// ops::gather_listed: a warp per list entry (its row found by a binary search over the runs' first rows).
void gather_listed(const std::vector<ops::RowSegment>& segments, const Tensor& idx, const Tensor& dst);
// Device-to-device copies of any sizes and alignments in one PDL launch per 16 copies (their table in the launch's
// parameters, 16-, 4- or 1-byte units as each copy's addresses and size allow): what a decode step's eager copies
// (the attention's table runs and ring writes, the graphs' static inputs) use instead of a cudaMemcpyAsync each or an
// uploaded table, which left the GPU idle between kernels (ktrace: the eager middle of a batch-1 layer 37 -> 30 us).
// Exact.
struct ByteCopy {
  void* dst;
  const void* src;
  int64_t bytes;
};
void copy_bytes_many(const std::vector<ByteCopy>& copies);
void scale(Tensor& x, float s, bool round);
void renorm_heads(Tensor& q, int64_t head_dim, float eps, bool round);
Tensor compress_pool(const Tensor& kv, const Tensor& score, const Tensor& ape, int64_t ratio, int64_t d, bool overlap,
                     bool has_prev);
// The sparse-attention index lists (integer-exact, bit-identical to the CPU): candidate_blocks takes the
// block maxima (one thread per (row, block)), pins the newest visible block and keeps the best blocks with
// cuda::topk_rows (sorted by index, keep <= 4096); mask_to_blocks finds each entry's block in the row's
// ascending list by binary search; sparse_index writes one thread per (row, column).
Tensor candidate_blocks(const Tensor& scores, int64_t start_pos, int64_t ratio, int64_t block_size, int64_t keep);
void mask_to_blocks(Tensor& scores, const Tensor& blocks, int64_t block_size);
Tensor sparse_index(const ops::IndexLayout& layout, int64_t T, const Tensor& picks, const Tensor& into = Tensor());
// The lists of several chunks into the rows of `into` (ops::sparse_index_many checked the chunks): one launch, the
// chunks' layouts uploaded as one table (one chunk: sparse_index).
void sparse_index_many(const std::vector<ops::IndexChunk>& chunks, const Tensor& into);

}  // namespace deepinfer::cuda
