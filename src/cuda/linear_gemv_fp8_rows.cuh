// The fourth E4M3 decode GEMV kernel (fp8_rows_gemv, linear_gemv_fp8_rows.cu): the bits of fp8_walk_gemv and of the
// CPU op (the order of linear_gemv.cuh) for decode batches, each warp on 16 weight rows side by side so that every x
// value read from shared memory serves all 16. Internal to the CUDA backend: callers go through gemv_into, which picks
// the kernel (gemv_set_fp8_variant).
#pragma once

#include <cuda_runtime.h>

#include "cuda/linear_gemv.cuh"

namespace deepinfer::cuda {

// True when fp8_rows_gemv takes this call: E4M3 (tiles of 32, 64 or 128), gemv_supported(a), dense or grouped with
// a known row period (GemvArgs::row_period), and one x row and its act-quant groups fit the block's shared memory.
bool gemv_fp8_rows_supported(const GemvArgs& a);

// Launches fp8_rows_gemv. Preconditions: gemv_fp8_rows_supported(a).
void gemv_fp8_rows_into(const GemvArgs& a, cudaStream_t stream);

}  // namespace deepinfer::cuda
