// The second E4M3 decode GEMV kernel (fp8_walk_gemv, linear_gemv_fp8.cu): same contract and bits as
// fp8_gemv in linear_gemv.cu (the order of linear_gemv.cuh), a different shape (each warp walks whole rows;
// see the .cu). Internal to the CUDA backend: callers go through gemv_into, which picks the kernel
// (gemv_set_fp8_variant).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/fp_decode.cuh"
#include "cuda/linear_gemv.cuh"

namespace deepinfer::cuda {

// The fields that every GEMV kernel's parameter block (Params in linear_gemv.cu, WalkParams, MmaParams, RowsParams)
// takes from the call as they are: pointers, strides, shapes, the grouped mode, and the act-quant groups. Each block
// derives from it and adds its launch shape; copy_gemv_args fills it.
struct GemvCall {
  const uint8_t* w;   // dense weight (grouped: from the tables)
  int64_t ldw;        // bytes between weight rows
  const uint8_t* sc;  // dense scale codes (grouped: from the tables)
  int64_t lds;        // bytes between scale rows
  const float* x;
  int64_t ldx;                // floats between x rows
  float* y;                   // [M, N]
  const int32_t* row_expert;  // grouped mode when not null
  const uint8_t* const* w_table;
  const uint8_t* const* s_table;
  int x_rows;     // grouped, > 0: row m reads x row m % x_rows and expert list m / x_rows (GemvArgs)
  int n_experts;  // experts per list
  int N, K, M;
  int A;   // act_quant_block, 0: x is used as is
  int ng;  // groups of A columns per x row (0 when A == 0)
  bool round;
};

inline void copy_gemv_args(const GemvArgs& a, GemvCall& p) {
  p.w = a.w;
  p.ldw = a.ldw;
  p.sc = a.scale;
  p.lds = a.lds;
  p.x = a.x;
  p.ldx = a.ldx;
  p.y = a.y;
  p.row_expert = a.row_expert;
  p.w_table = a.w_table;
  p.s_table = a.s_table;
  p.x_rows = a.x_rows;
  p.n_experts = a.n_experts;
  p.N = a.N;
  p.K = a.K;
  p.M = a.M;
  p.A = static_cast<int>(a.act_quant_block < a.K ? a.act_quant_block : a.K);  // a block >= K: one group per row
  p.ng = p.A > 0 ? (p.K + p.A - 1) / p.A : 0;
  p.round = a.round;
}

// Blocks of `kernel` that fit one SM with this launch shape, for the GEMV kernels' persistent grids (cached;
// sets the kernel's dynamic shared memory limit to the opt-in maximum on first use). linear_gemv.cu.
int gemv_blocks_per_sm(const void* kernel, int threads, int64_t smem);

// Launches a persistent GEMV kernel with programmatic stream serialisation: as many blocks as fit the GPU at once, at
// most one per (weight step, x-row group) (p.steps x p.mtiles), and a multiple of p.mtiles.
template <typename P>
void launch_persistent(void (*kernel)(P), const P& p, int threads, int64_t smem, cudaStream_t stream) {
  const int64_t work = static_cast<int64_t>(p.steps) * p.mtiles;
  const int64_t resident =
      static_cast<int64_t>(gemv_blocks_per_sm(reinterpret_cast<const void*>(kernel), threads, smem)) * sm_count();
  const int64_t grid = std::max<int64_t>(p.mtiles, std::min(work, resident) / p.mtiles * p.mtiles);
  DI_CHECK(grid < (int64_t{1} << 31), "cuda::gemv: grid of {} blocks", grid);
  launch_pdl(kernel, dim3(static_cast<unsigned>(grid)), threads, smem, stream, p);
}

// Launches a GEMV kernel that runs one block per SM (fp8_walk_gemv, fp8_rows_gemv): `xgroups` x-row groups of
// `per_mt` blocks each, the blocks of a group dealing out its `groups` row groups between them. Warps per block:
// `max_warps`, halved while half as many would still give every row group a warp of its own (more warps would idle).
// smem_bytes(warps): the block's dynamic shared memory. Checks that the shape fits an SM (`name` in the error) and
// that the grid is launchable.
template <typename P, typename SmemFn>
void launch_sm_blocks(void (*kernel)(P), const P& p, int64_t xgroups, int64_t per_mt, int64_t groups, int max_warps,
                      const SmemFn& smem_bytes, const char* name, cudaStream_t stream) {
  int nw = max_warps;
  while (nw > 2 && static_cast<int64_t>(nw / 2) * per_mt >= groups) nw /= 2;
  const int64_t smem = smem_bytes(nw);
  DI_CHECK(gemv_blocks_per_sm(reinterpret_cast<const void*>(kernel), 32 * nw, smem) >= 1,
           "cuda::gemv: {} does not fit an SM ({} warps, {} bytes of shared memory)", name, nw, smem);
  const int64_t grid = xgroups * per_mt;
  DI_CHECK(grid < (int64_t{1} << 31), "cuda::gemv: grid of {} blocks", grid);
  launch_pdl(kernel, dim3(static_cast<unsigned>(grid)), 32 * nw, smem, stream, p);
}

// Launches fp8_walk_gemv for an E4M3 call; form 2: its whole-chunk form (each lane on all 32 bytes of a tile of its own
// rows, no exchange) where that form exists (tiles of 32, one x row per block), the pair form elsewhere; form 3: the
// whole-chunk form fed by the bulk ring (bulk copies into shared memory) where it fits, else as form 2; form 1: the
// pair form everywhere (the same bits in every form). Preconditions: gemv_supported(a), a.fmt == 0, a.M > 0, a.N > 0.
void gemv_fp8_walk_into(const GemvArgs& a, int form, cudaStream_t stream);

}  // namespace deepinfer::cuda
