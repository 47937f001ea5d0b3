// CUDA row-wise top-k: the contract of ops::topk_rows (src/ops/ops.h) on scores that live on kCUDA.
//
// One thread block per row. The k-th largest score is found by a radix select (8 bits per pass, at most 4 passes,
// stopping early once the boundary bin is taken whole) on order-preserving 32-bit keys; every score above it is
// taken, and of the scores equal to it the lowest indices. The picks are gathered in index order (each warp owns a
// contiguous stretch of the row; a count pass, then a scan over the warps, then a write pass), so a list ordered by
// index needs no sort; a list ordered by score is then sorted by a bitonic sort on 64-bit (score desc, index asc)
// keys. Integer work only, so the result is exactly the CPU's (NaN scores aside, whose CPU order is unspecified).
//
// Where a row's keys are read, in launches of up to 64 rows (decode and short chunks, where one block per row leaves
// SMs idle and each block's passes over its row are the latency): a row of 8k+ keys listed by index is cut into 8
// slices over a cluster of CTAs, each staged in its CTA's shared memory (the pass histograms summed through
// distributed shared memory, the gather's scan run over the CTAs); other rows of up to ~57k keys (the opt-in shared
// memory less the sort buffer) are staged in their block's shared memory; the rest are read from global memory on
// every pass. DEEPINFER_CUDA_TOPK_STAGE (or topk_set_staging) picks a lesser form for A/B.
#pragma once

#include <cstdint>

#include "deepinfer/tensor.h"

struct CUstream_st;

namespace deepinfer::cuda {

// scores: float32 [T, n] on kCUDA (rows dense). Returns int32 [T, k] on kCUDA: per row the indices
// of the k largest finite-or-+inf scores (-inf never), ordered by (score desc, index asc), or by
// index ascending when `sort_by_index`; -1 after the last pick when fewer than k qualify.
// k <= 4096.
Tensor topk_rows(const Tensor& scores, int64_t k, bool sort_by_index = false);
// The same into `out` (int32 [T, k] on kCUDA, dense), launched on `stream` (null: the backend's stream).
void topk_rows_into(const Tensor& scores, int64_t k, bool sort_by_index, Tensor& out, CUstream_st* stream = nullptr);
// Where the rows' keys are read: -1 follows DEEPINFER_CUDA_TOPK_STAGE (the default), 2 over a cluster where that
// applies, else as 1; 1 staged in one block where it fits, else as 0; 0 global memory (tests and benchmarks compare
// them; the same indices either way).
void topk_set_staging(int mode);

}  // namespace deepinfer::cuda
