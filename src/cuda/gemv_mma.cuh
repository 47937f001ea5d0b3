// Pieces shared by the tensor-core decode GEMVs (fp4_mma_gemv, fp8_mma_gemv): the parameter block, the exact
// one-product-per-output mma, and a 16-byte shared-memory load at a shared-space address.
#pragma once

#include <cstdint>

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
  int mtiles;  // x rows served: M (grouped) or 1
  int steps;   // ceil(N / rows per step)
  bool round;
};

#ifdef __CUDACC__
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
#endif

}  // namespace deepinfer::cuda
