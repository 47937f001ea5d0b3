// The third FP4 decode GEMV kernel (fp4_mma_gemv, linear_gemv_fp4_mma.cu): the bits of the other two and of the
// CPU op (the order of linear_gemv.cuh), with every weight x activation product formed by the tensor cores
// instead of an fp16 decode, an fp16 -> fp32 convert and an FMA per weight. Internal to the CUDA backend:
// callers go through gemv_into, which picks the kernel (gemv_set_fp4_variant).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/linear_gemv.cuh"

namespace deepinfer::cuda {

// True when fp4_mma_gemv takes this call: FP4, gemv_supported(a), no act quant (the model's grouped expert calls
// take x already quantised), K % 128 == 0 and K <= 8192, 4-byte aligned scale rows; any number of x rows (a block
// per row).
bool gemv_fp4_mma_supported(const GemvArgs& a);

// Launches fp4_mma_gemv. Preconditions: gemv_fp4_mma_supported(a), a.M > 0, a.N > 0.
void gemv_fp4_mma_into(const GemvArgs& a, cudaStream_t stream);

// Tests: how many warps (16 weight rows each) took the scalar slow path since the last reset (synchronises the
// device); reset: set the count back to 0.
int64_t gemv_fp4_mma_slow_warps(bool reset = false);

}  // namespace deepinfer::cuda
