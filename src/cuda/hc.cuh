// CUDA hyper-connections: the contracts of ops::hc_mixes, hc_collapse, hc_expand and hc_head
// (src/ops/ops.h) on float32 tensors that live on kCUDA. CPU reference: src/cpu/hc.cpp.
//
// Numerics.
//  * hc_collapse, hc_expand: one thread per output, the CPU's fp32 order (acc = 0; acc += p_j * s_j
//    for j = 0..hc-1; expand: post * y + acc) with explicit IEEE operations: bit for bit the CPU op.
//  * hc_mixes, hc_head: one launch. The projection sums (mean of squares, fn . flat(stream)) are FP64 as on
//    the CPU, but split over 160-column chunks (one block each, a fixed tree inside) added in chunk order
//    by the token's last block instead of the CPU's sequential order; products are exact in FP64, so the
//    fp32 mixes equal the CPU's unless a double-rounding boundary is hit (rare, one fp32 ulp). Everything
//    after (sigmoid, softmax, Sinkhorn) replays the CPU's fp32 order per value in one warp per token (lane l
//    owns comb[l]; row / column sums formed sequentially from shuffles in the CPU's order), exp as
//    fp32(exp(double)) (glibc's expf is correctly rounded but for ~0.5 ulp cases). Tests allow 2e-6
//    relative on pre / post / comb.
//  * hc_mixes returns pre and post computed, and comb still being computed on the side stream (device.h:
//    side_fork): its Sinkhorn overlaps the sublayer, and hc_expand (and any copy of comb) joins it first.
#pragma once

#include <cstdint>

#include "deepinfer/tensor.h"
#include "ops/ops.h"

namespace deepinfer::cuda {

// stream [T, hc, dim] contiguous float32 on kCUDA; fn [(2+hc)*hc, hc*dim], scale [3], base [(2+hc)*hc]
// float32 on kCUDA. Returns pre [T, hc], post [T, hc], comb [T, hc, hc] on kCUDA (comb written by the side
// stream: read it only through hc_expand or a copy, which join the side stream).
ops::HcMix hc_mixes(const Tensor& stream, const Tensor& fn, const Tensor& scale, const Tensor& base, int64_t hc,
                    int64_t sinkhorn_iters, float hc_eps, float norm_eps);
// out[t, d] = round(sum_j pre[t, j] * stream[t, j, d]); [T, dim].
Tensor hc_collapse(const Tensor& stream, const Tensor& pre, bool round);
// out[t, k, d] = round(post[t, k] * y[t, d] + sum_j comb[t, j, k] * stream[t, j, d]); [T, hc, dim].
Tensor hc_expand(const Tensor& y, const Tensor& stream, const Tensor& post, const Tensor& comb, bool round);
// pre_j = sigmoid(mix_j * scale[0] + base_j) + hc_eps (fn [hc, hc*dim]), then hc_collapse.
Tensor hc_head(const Tensor& stream, const Tensor& fn, const Tensor& scale, const Tensor& base, float hc_eps,
               float norm_eps, bool round);

}  // namespace deepinfer::cuda

#ifdef __CUDACC__
#include "cuda/common.cuh"

namespace deepinfer::cuda {

// hc_expand's value of copy k, column d of token t (y_td = y[t, d]): acc = 0; acc += comb[t, j, k] * stream[t, j, d]
// for j ascending; post[t, k] * y_td + acc, rounded when `round`. Shared with moe_combine_expand (model_ops.cu), which
// must give these bits.
__device__ __forceinline__ float hc_expand_value(float y_td, const float* stream, const float* post, const float* comb,
                                                 int64_t t, int hc, int64_t k, int64_t dim, int64_t d, bool round) {
  float acc = 0.0f;
  for (int j = 0; j < hc; ++j)
    acc = __fadd_rn(acc, __fmul_rn(comb[(t * hc + j) * hc + k], stream[(t * hc + j) * dim + d]));
  const float v = __fadd_rn(__fmul_rn(post[t * hc + k], y_td), acc);
  return round ? round_to_bf16(v) : v;
}

}  // namespace deepinfer::cuda
#endif  // __CUDACC__
