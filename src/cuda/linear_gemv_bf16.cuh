// The second and third BF16 GEMV kernels (bf16_tile_gemv, linear_gemv_bf16.cu; bf16_lane_gemv,
// linear_gemv_bf16_lane.cu): same contract and bits as chain_gemv in linear_gemv.cu (the order of linear_gemv.cuh) for
// dense calls without act quant: a register-tiled shape for batches of x rows (the vocabulary head), and a lane per
// chain for one x row on narrow weights (the gate). Internal to the CUDA backend: callers go through gemv_into, which
// picks the kernel (gemv_set_bf16_variant).
#pragma once

#include <cuda_runtime.h>

#include "cuda/linear_gemv.cuh"

namespace deepinfer::cuda {

// Whether bf16_tile_gemv takes this call: BF16, dense, act_quant_block 0, K % 128 == 0 and K <= 12,288 (its x rows
// in shared memory), on top of gemv_supported.
bool gemv_bf16_tile_supported(const GemvArgs& a);

// Launches bf16_tile_gemv. Preconditions: gemv_supported(a), gemv_bf16_tile_supported(a), a.M > 0, a.N > 0.
void gemv_bf16_tile_into(const GemvArgs& a, cudaStream_t stream);

// The third BF16 kernel (bf16_lane_gemv, linear_gemv_bf16_lane.cu): a warp per weight row, a lane per chain, for one
// x row on narrow weights (the MoE gate). Takes BF16, dense, act_quant_block 0, M == 1, N <= 8,192, K % 256 == 0,
// K <= 12,288.
bool gemv_bf16_lane_supported(const GemvArgs& a);
// Launches bf16_lane_gemv. Preconditions: gemv_supported(a), gemv_bf16_lane_supported(a), a.N > 0.
void gemv_bf16_lane_into(const GemvArgs& a, cudaStream_t stream);

}  // namespace deepinfer::cuda
