// CUDA row-wise top-k: the contract of ops::topk_rows (src/ops/ops.h) on scores that live on kCUDA.
//
// One thread block per row. The k-th largest score is found by a 4-pass radix select (8 bits per
// pass) on order-preserving 32-bit keys; every score above it is taken, and of the scores equal to
// it the lowest indices (a block-wide scan in index order). The <= k picks are then sorted by a
// bitonic sort on 64-bit (score desc, index asc) keys (or by index when asked). Integer work only,
// so the result is exactly the CPU's (NaN scores aside, whose CPU order is unspecified).
#pragma once

#include <cstdint>

#include "deepinfer/tensor.h"

namespace deepinfer::cuda {

// scores: float32 [T, n] on kCUDA (rows dense). Returns int32 [T, k] on kCUDA: per row the indices
// of the k largest finite-or-+inf scores (-inf never), ordered by (score desc, index asc), or by
// index ascending when `sort_by_index`; -1 after the last pick when fewer than k qualify.
// k <= 4096.
Tensor topk_rows(const Tensor& scores, int64_t k, bool sort_by_index = false);

}  // namespace deepinfer::cuda
