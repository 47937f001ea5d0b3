// CUDA kernels of the model-level ops (issue 8): the contracts of ops::index_scores, moe_route,
// swiglu, embedding and gather_rows (src/ops/ops.h) on tensors that live on kCUDA.
//
// index_scores replays the CPU order exactly (one thread per (query, key): fp32 dots in ascending i
// with separate multiply and add, the head sum in FP64 in head order), so it is bit-identical.
// embedding and gather_rows are copies (exact). moe_route and swiglu take exp / log1p as
// fp32(exp(double)) / fp32(log1p(double)) rather than glibc's expf / log1pf (which differ in rare
// ~0.5-1 ulp cases), so their values may differ by an ulp; the selection order, the weight sums and
// everything else follow the CPU's sequence. Device-side checks are limited: ids / rows / tokens
// out of range are the caller's error (hash routing writes id -1 and weight 0 for such a token).
#pragma once

#include <cstdint>

#include "ops/ops.h"

namespace deepinfer::cuda {

Tensor index_scores(const Tensor& q, const Tensor& keys, const Tensor& w, const ops::KeyVisibility& vis, bool round);
ops::Routing moe_route(const Tensor& logits, const Tensor& bias, const Tensor& tid2eid, const Tensor& tokens, int64_t k,
                       const ops::RouteOpts& opts);
Tensor swiglu(const Tensor& g, const Tensor& u, const Tensor& weights, float limit, bool round);
Tensor embedding(const Tensor& table, const Tensor& ids, int64_t copies);
Tensor gather_rows(const Tensor& x, const Tensor& rows);

}  // namespace deepinfer::cuda
