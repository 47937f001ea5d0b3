// CUDA RMSNorm. Contract in rms_norm.cuh.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda/common.cuh"
#include "cuda/device.h"
#include "cuda/rms_norm.cuh"

namespace deepinfer::cuda {

namespace {

__device__ __forceinline__ float load_weight(const float* w, int64_t c) { return w[c]; }
__device__ __forceinline__ float load_weight(const __nv_bfloat16* w, int64_t c) { return __bfloat162float(w[c]); }

// One thread block per row. W is float or __nv_bfloat16; w == nullptr means no weight.
template <typename W>
__global__ void rms_norm_kernel(const float* x, int64_t row_stride, int64_t cols, const W* w, float eps, bool round,
                                float* y) {
  const float* xr = x + blockIdx.x * row_stride;
  float* yr = y + blockIdx.x * cols;

  // mean(x^2): squares and their sum in fp64 (as the CPU op does), so the summation order
  // barely matters and the fp32 result almost always equals the CPU's bit for bit.
  double ss = 0.0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) ss += static_cast<double>(xr[c]) * xr[c];
  ss = block_reduce(ss, SumOp{}, 0.0);
  const float var = static_cast<float>(ss / static_cast<double>(cols));
  // 1/sqrt with IEEE division and square root (not the approximate rsqrtf), like the CPU op.
  const float inv = 1.0f / sqrtf(var + eps);

  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    float v = xr[c] * inv;  // w * (x * inv): the reference's order
    if (w != nullptr) v = load_weight(w, c) * v;
    yr[c] = round ? round_to_bf16(v) : v;
  }
}

}  // namespace

Tensor rms_norm(const Tensor& x, const Tensor& w, float eps, bool round) {
  const Rows r = as_rows(x, "cuda::rms_norm");
  if (w.defined()) {
    DI_CHECK(w.device() == Device::kCUDA, "cuda::rms_norm: weight must be on CUDA, got {}", w.describe());
    DI_CHECK(w.dtype() == DType::kF32 || w.dtype() == DType::kBF16,
             "cuda::rms_norm: weight must be float32 or bfloat16, got {}", w.describe());
    DI_CHECK(w.dim() == 1 && w.size(0) == r.cols && w.is_contiguous(),
             "cuda::rms_norm: weight {} does not match {} columns", w.describe(), r.cols);
  }
  Tensor y = Tensor::empty(x.shape(), DType::kF32, Device::kCUDA);
  if (r.rows == 0 || r.cols == 0) return y;
  DI_CHECK(r.rows < (int64_t{1} << 31), "cuda::rms_norm: {} rows is too many for one launch", r.rows);
  const int threads = threads_for(r.cols, 512);
  const auto grid = static_cast<unsigned>(r.rows);
  float* out = y.data<float>();
  if (w.defined() && w.dtype() == DType::kBF16) {
    rms_norm_kernel<<<grid, threads>>>(r.data, r.row_stride, r.cols, w.data<__nv_bfloat16>(), eps, round, out);
  } else {
    const float* wf = w.defined() ? w.data<float>() : nullptr;
    rms_norm_kernel<<<grid, threads>>>(r.data, r.row_stride, r.cols, wf, eps, round, out);
  }
  DI_CUDA_CHECK(cudaGetLastError());
  return y;
}

}  // namespace deepinfer::cuda
