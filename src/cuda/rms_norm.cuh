// CUDA RMSNorm: the contract of ops::rms_norm in src/ops/ops.h, on tensors that live on kCUDA.
#pragma once

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

}  // namespace deepinfer::cuda
