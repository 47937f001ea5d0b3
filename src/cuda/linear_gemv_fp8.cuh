// The second E4M3 decode GEMV kernel (fp8_walk_gemv, linear_gemv_fp8.cu): same contract and bits as
// fp8_gemv in linear_gemv.cu (the order of linear_gemv.cuh), a different shape (each warp walks whole rows;
// see the .cu). Internal to the CUDA backend: callers go through gemv_into, which picks the kernel
// (gemv_set_fp8_variant).
#pragma once

#include <cuda_runtime.h>

#include "cuda/linear_gemv.cuh"

namespace deepinfer::cuda {

// Launches fp8_walk_gemv for an E4M3 call. Preconditions: gemv_supported(a), a.fmt == 0, a.M > 0, a.N > 0.
void gemv_fp8_walk_into(const GemvArgs& a, cudaStream_t stream);

}  // namespace deepinfer::cuda
