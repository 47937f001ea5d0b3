// CUDA fake quantisation (FP8 e4m3, ue8m0 scales) and bf16 rounding. Contracts in quant.cuh.
#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/common.cuh"
#include "cuda/device.h"
#include "cuda/quant.cuh"

namespace deepinfer::cuda {

namespace {

// One thread block per (row, group): find the group's amax, derive the scale, quantise.
// Groups are numbered row-major: blockIdx.x = row * groups_per_row + group.
__global__ void fake_quant_fp8_kernel(float* x, int64_t row_stride, int64_t col_begin, int64_t col_end, int64_t block,
                                      int64_t groups_per_row) {
  const int64_t row = blockIdx.x / groups_per_row;
  const int64_t group = blockIdx.x % groups_per_row;
  const int64_t c0 = col_begin + group * block;
  const int64_t c1 = min(c0 + block, col_end);
  float* p = x + row * row_stride;

  // 1. amax over the group (max is order-independent, so this is exact).
  float amax = 0.0f;
  for (int64_t c = c0 + threadIdx.x; c < c1; c += blockDim.x) amax = fmaxf(amax, fabsf(p[c]));
  amax = block_reduce(amax, MaxOp{}, 0.0f);

  // 2. Power-of-two scale with the 1e-4 floor; dividing by it is exact.
  const float s = ue8m0_scale(fmaxf(amax, 1e-4f), kE4M3Max);

  // 3. Quantise and write back the dequantised value q * s (exact in fp32).
  for (int64_t c = c0 + threadIdx.x; c < c1; c += blockDim.x) p[c] = e4m3_rne(p[c] / s) * s;
}

// Elementwise bf16 rounding over rows; a grid-stride loop over all rows * cols values.
__global__ void round_bf16_kernel(float* x, int64_t rows, int64_t cols, int64_t row_stride) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float* v = x + (i / cols) * row_stride + i % cols;
    *v = round_to_bf16(*v);
  }
}

}  // namespace

void fake_quant_fp8(Tensor& x, int64_t col_begin, int64_t col_end, int64_t block) {
  const Rows r = as_rows(x, "cuda::fake_quant_fp8");
  DI_CHECK(block > 0, "cuda::fake_quant_fp8: block must be positive, got {}", block);
  DI_CHECK(0 <= col_begin && col_begin <= col_end && col_end <= r.cols,
           "cuda::fake_quant_fp8: columns [{}, {}) out of range for {}", col_begin, col_end, x.describe());
  if (r.rows == 0 || col_begin == col_end) return;
  const int64_t groups_per_row = (col_end - col_begin + block - 1) / block;
  const int64_t grid = r.rows * groups_per_row;
  DI_CHECK(grid < (int64_t{1} << 31), "cuda::fake_quant_fp8: {} groups is too many for one launch", grid);
  const int threads = threads_for(block, 256);
  fake_quant_fp8_kernel<<<static_cast<unsigned>(grid), threads>>>(r.data, r.row_stride, col_begin, col_end, block,
                                                                  groups_per_row);
  DI_CUDA_CHECK(cudaGetLastError());
}

void round_bf16(Tensor& x, bool enable) {
  if (!enable) return;
  const Rows r = as_rows(x, "cuda::round_bf16");
  const int64_t n = r.rows * r.cols;
  if (n == 0) return;
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 65536);
  round_bf16_kernel<<<static_cast<unsigned>(blocks), kThreads>>>(r.data, r.rows, r.cols, r.row_stride);
  DI_CUDA_CHECK(cudaGetLastError());
}

}  // namespace deepinfer::cuda
