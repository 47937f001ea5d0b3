// The fourth E4M3 decode GEMV kernel (fp8_bmma_gemv, linear_gemv_fp8_bmma.cu): the bits of fp8_walk_gemv and of the CPU
// op (the order of linear_gemv.cuh), with the weights as the tensor cores' B operand, 8 weight rows a warp.
// Internal to the CUDA backend: callers go through gemv_into, which picks the kernel (gemv_set_fp8_variant).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/linear_gemv.cuh"

namespace deepinfer::cuda {

// True when fp8_bmma_gemv takes this call: fp8_mma_gemv's calls (E4M3 with 32 x 32 tiles and act_quant_block 32,
// gemv_supported(a), K % 128 == 0 and K <= 8192, 4-byte aligned scale rows; any number of x rows, a block per row).
bool gemv_fp8_bmma_supported(const GemvArgs& a);

// Launches fp8_bmma_gemv. Preconditions: gemv_fp8_bmma_supported(a).
void gemv_fp8_bmma_into(const GemvArgs& a, cudaStream_t stream);

// Tests: how many warps (8 weight rows each) took the scalar slow path since the last reset (synchronises the
// device); reset: set the count back to 0.
int64_t gemv_fp8_bmma_slow_warps(bool reset = false);

}  // namespace deepinfer::cuda
