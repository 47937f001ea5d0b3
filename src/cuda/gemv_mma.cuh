// Pieces shared by the tensor-core decode GEMVs (fp4_mma_gemv, fp8_mma_gemv): the parameter block, a block's rows,
// the exact one-product-per-output mma, a 16-byte shared-memory load at a shared-space address, and on the host the
// slow-path counter read and the launch.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#include "cuda/device.h"
#include "cuda/linear_gemv_fp8.cuh"
#endif

namespace deepinfer::cuda {

// Kernel parameters, by value (copy_gemv_args fills the call's fields).
struct MmaParams {
  const uint8_t* w;  // dense weight (grouped: from the tables)
  int64_t ldw;
  const uint8_t* sc;
  int64_t lds;
  const float* x;
  int64_t ldx;
  float* y;
  const int32_t* row_expert;
  const uint8_t* const* w_table;
  const uint8_t* const* s_table;
  int x_rows, n_experts;
  int N, K, M;
  int A, ng;   // act_quant_block and its groups per x row
  int mtiles;  // x rows served: M (dense: each against the one weight)
  int steps;   // ceil(N / rows per step)
  bool round;
};

#ifdef __CUDACC__
// A block's x row and, in grouped mode, its expert's weight and scale rows (read after pdl_wait: the ids and tables
// may come from the previous kernel), as linear_gemv.cu's expert_of.
__device__ __forceinline__ const float* mma_block_rows(const MmaParams& p, int mt, const uint8_t*& w,
                                                       const uint8_t*& sc) {
  const int64_t xrow = p.x_rows > 0 ? mt % p.x_rows : mt;
  w = p.w;
  sc = p.sc;
  if (p.row_expert != nullptr) {
    const int e = __ldcg(p.row_expert + xrow) + (p.x_rows > 0 ? mt / p.x_rows * p.n_experts : 0);
    w = reinterpret_cast<const uint8_t*>(__ldcg(reinterpret_cast<const unsigned long long*>(p.w_table + e)));
    sc = reinterpret_cast<const uint8_t*>(__ldcg(reinterpret_cast<const unsigned long long*>(p.s_table + e)));
  }
  return p.x + xrow * p.ldx;
}

// D = A diag(B): with B's only nonzeros on its diagonal, d0 / d1 are rows g, columns 2t / 2t + 1 (the lane's own a0
// times the diagonal's x), d2 / d3 rows g + 8: four exact products per lane (fp16 x fp16 into fp32, summed with zeros).
__device__ __forceinline__ void mma_f16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%7, %7, %7, %7};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a0), "r"(a1), "r"(b0), "f"(0.0f));
}

// 16 bytes of shared memory at a shared-space address.
__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}

// Host: a kernel's slow-path warp counter (a __device__ unsigned long long), after a device sync; reset sets it to 0.
inline int64_t mma_read_counter(const void* symbol, bool reset) {
  unsigned long long n = 0;
  DI_CUDA_CHECK(cudaDeviceSynchronize());
  DI_CUDA_CHECK(cudaMemcpyFromSymbol(&n, symbol, sizeof n));
  if (reset) {
    const unsigned long long zero = 0;
    DI_CUDA_CHECK(cudaMemcpyToSymbol(symbol, &zero, sizeof zero));
  }
  return static_cast<int64_t>(n);
}

// Host: launches an mma GEMV kernel for the call a (threads per block, rows per step, dynamic shared memory smem):
// one x row per block (grouped: against its expert's weight; dense: all against the one weight; the x row is the
// fastest index of the block number, so the blocks that read the same weight rows run side by side and L2 serves all
// but the first), launch_persistent's grid.
inline void mma_launch(void (*kernel)(MmaParams), const GemvArgs& a, int threads, int rows_per_step, int64_t smem,
                       cudaStream_t stream) {
  MmaParams p = {};
  copy_gemv_args(a, p);
  p.mtiles = a.M;
  p.steps = (a.N + rows_per_step - 1) / rows_per_step;
  launch_persistent(kernel, p, threads, smem, stream);
}
#endif

}  // namespace deepinfer::cuda
