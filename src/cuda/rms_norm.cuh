// CUDA RMSNorm: the contract of ops::rms_norm in src/ops/ops.h, on tensors that live on kCUDA.
//
// The launchers are plain C++ declarations; the device part below them (the register-held row norm) compiles
// only under nvcc and is shared with the fused kernels that must give rms_norm's bits (attn_inputs.cu).
#pragma once

#include <cstdint>

#include "deepinfer/tensor.h"

namespace deepinfer::cuda {

// y = w * (x * rsqrt(mean(x^2) + eps)) per row, FP32 math (the sum of squares in FP64, as on
// the CPU), rounded to bf16 if `round`.
// x: float32 on kCUDA (layouts as Rows in common.cuh); w: BF16 or F32 [cols] on kCUDA, or
// undefined for a weightless norm. Returns a new contiguous float32 tensor of x's shape.
// Asynchronous on the default stream.
Tensor rms_norm(const Tensor& x, const Tensor& w, float eps, bool round);

// rms_norm(hc_collapse(stream, pre, round), w, eps, round) (hc.cuh) in one kernel where the row fits
// (dim % 4 == 0, dim <= 8192), the same bits as the two ops; the two ops otherwise. stream [T, hc, dim],
// pre [T, hc] float32 on kCUDA. Returns [T, dim].
Tensor hc_collapse_norm(const Tensor& stream, const Tensor& pre, const Tensor& w, float eps, bool round);

// The register-held kernel's range (norm_row_apply below): rows of at most kNormVecThreads * kNormVecMax float4,
// each thread holding up to kNormVecMax of them.
constexpr int kNormVecThreads = 256;
constexpr int kNormVecMax = 8;

// Whether rms_norm takes the register-held kernel for rows of `cols` values `row_stride` apart from `data`
// (cols % 4 == 0, at most 8,192, 16-byte aligned rows and F32 weight), and its thread count there: fused kernels
// that must give rms_norm's bits ask these, since the FP64 sum's grouping depends on that count.
bool norm_vec_fits(const float* data, int64_t cols, int64_t row_stride, const Tensor& w);
int norm_vec_threads(int64_t cols);
// Whether the register-held norms load their weight before griddepcontrol.wait (DEEPINFER_CUDA_NORM_PREFETCH, 1).
bool norm_prefetch();
// Throws (naming `op`) unless w is undefined or a contiguous BF16 / F32 [cols] CUDA tensor.
void check_norm_weight(const Tensor& w, int64_t cols, const char* op);

}  // namespace deepinfer::cuda

#ifdef __CUDACC__
#include <cuda_bf16.h>

#include "cuda/common.cuh"

namespace deepinfer::cuda {

__device__ __forceinline__ float norm_weight(const float* w, int64_t c) { return w[c]; }
__device__ __forceinline__ float norm_weight(const __nv_bfloat16* w, int64_t c) { return __bfloat162float(w[c]); }

template <typename W>
__device__ __forceinline__ float4 norm_weight4(const W* w, int64_t c4) {
  return make_float4(norm_weight(w, 4 * c4), norm_weight(w, 4 * c4 + 1), norm_weight(w, 4 * c4 + 2),
                     norm_weight(w, 4 * c4 + 3));
}
__device__ __forceinline__ float4 norm_weight4(const float* w, int64_t c4) {
  return reinterpret_cast<const float4*>(w)[c4];
}

// The norm weight in norm_row_apply's layout (ones where w is null or past the row): a weight is no earlier kernel's
// output, so the kernels load it before griddepcontrol.wait and its HBM latency passes under the previous kernel.
template <typename W>
__device__ __forceinline__ void norm_weights_vec(float4 (&wv)[kNormVecMax], int n4, int nt, const W* w) {
  const int tid = static_cast<int>(threadIdx.x);
  const bool active = tid < nt;
#pragma unroll
  for (int k = 0; k < kNormVecMax; ++k) {
    const int c = tid + k * nt;
    wv[k] = make_float4(1.0f, 1.0f, 1.0f, 1.0f);
    if (w != nullptr && active && c < n4) wv[k] = norm_weight4(w, c);
  }
}

// The RMSNorm of one row held in registers (rms_norm's kernel for rows of at most 8,192 columns): the first nt
// threads of the block hold v[k] = float4 number tid + k * nt of the row (zeros past n4); threads from nt on hold
// zeros and only join the reduction (every thread of the block must call this). wv: norm_weights_vec's (has_w false:
// no weight). On return v holds w * (x * rsqrt(mean(x^2) + eps)), rounded to bf16 if `round`. The FP64 sum's grouping
// depends on nt, not on blockDim: the extra warps add exact zeros, so a wider block (a fused kernel's) gives the bits
// of a launch of nt threads.
__device__ __forceinline__ void norm_row_apply(float4 (&v)[kNormVecMax], const float4 (&wv)[kNormVecMax], int64_t cols,
                                               bool has_w, float eps, bool round) {
  double ss = 0.0;
#pragma unroll
  for (int k = 0; k < kNormVecMax; ++k) {
    ss += static_cast<double>(v[k].x) * v[k].x;
    ss += static_cast<double>(v[k].y) * v[k].y;
    ss += static_cast<double>(v[k].z) * v[k].z;
    ss += static_cast<double>(v[k].w) * v[k].w;
  }
  ss = block_reduce(ss, SumOp{}, 0.0);
  const float var = static_cast<float>(ss / static_cast<double>(cols));
  // 1/sqrt with IEEE division and square root (not the approximate rsqrtf), like the CPU op.
  const float inv = 1.0f / sqrtf(var + eps);
  auto one = [&](float a, float wt) {
    const float r = has_w ? wt * (a * inv) : a * inv;  // w * (x * inv): the reference's order
    return round ? round_to_bf16(r) : r;
  };
#pragma unroll
  for (int k = 0; k < kNormVecMax; ++k)
    v[k] = make_float4(one(v[k].x, wv[k].x), one(v[k].y, wv[k].y), one(v[k].z, wv[k].z), one(v[k].w, wv[k].w));
}

}  // namespace deepinfer::cuda
#endif  // __CUDACC__
