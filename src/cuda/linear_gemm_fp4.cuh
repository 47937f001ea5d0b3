// fp4_gemm: the exact FP4 linear (packed E2M1 weights, an E8M0 scale per 32 columns) for calls of many rows of x:
// the routed experts of a prefill chunk as one launch over every expert (rows sorted by expert), and dense calls. The
// bits are those of the CPU op and of the other exact kernels (linear.cuh's order): per output (m, n) the 32 chains
// v[j][l] run over all of K, v = fma(w, x, v) from +0 with w = e2m1 * 2^(e-127) (one rounding, as the CPU's f16 value
// times its e8m0 factor) and x element 32c + 2 (l + 8 (j & 1)) + (j >> 1) of chunk c (the CPU's permuted x); then
// s[l] = ((v0 + v1) + v2) + v3, tot[l] = fma(s, 1, 0) and the CPU's hsum. Why a fourth exact FP4 kernel: the GEMV
// and the slab kernels read the weight once per 1-4 rows of x; here a block decodes its 64 weight rows once per 16 rows
// of x. Measured (bench/RESULTS.md, twenty-ninth session): dense calls of 64 rows 1.8x the slab kernels (w1 + w3 of a
// 4,096-token prefill's experts called one by one); over grouped rows at 64 per expert 1.07x the grouped GEMV on
// w1 + w3 (0.98x on w2), even at 32, slower at 16 and below, hence DEEPINFER_CUDA_FP4_GEMM_ROWS = 64.
// Internal to the CUDA backend: cuda::linear and cuda::linear_grouped pick it (linear.cu, linear_grouped.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace deepinfer::cuda {

// The x layout fp4_gemm reads: row m's K values (act-quantised when the call quantises), each 32-column chunk permuted
// so that chain l's four values (j = 0..3) are adjacent: column 32c + r sits at 32c + 4 l + j with l = (r >> 1) & 7
// and j = 2 (r & 1) + ((r >> 4) & 1). Rows are K floats apart.
__host__ __device__ constexpr int64_t fp4_gemm_x_pos(int64_t k) {
  const int64_t r = k & 31;
  return (k - r) + 4 * ((r >> 1) & 7) + 2 * (r & 1) + ((r >> 4) & 1);
}

// True when fp4_gemm takes a packed FP4 weight of width K: K a multiple of its 128-column stage, and the block's
// scale codes fit shared memory.
bool fp4_gemm_supported(int64_t K);

// y[M, N] (row stride N) = x . W^T on `stream`, x in fp4_gemm_x_pos's layout [M, K]; w: packed E2M1 rows of K / 2
// bytes, ldw bytes apart (16-byte aligned); scale: E8M0 codes [N, K / 32], lds bytes apart. Preconditions:
// fp4_gemm_supported(K), M, N >= 1. Launched with programmatic dependent launch (the weight's first stages stream
// before griddepcontrol.wait).
void fp4_gemm_into(const uint8_t* w, int64_t ldw, const uint8_t* scale, int64_t lds, int N, int K, const float* xp,
                   int M, float* y, bool round, cudaStream_t stream);

// ops::linear_grouped's calls on rows sorted by expert (moe_group's order) as one launch: block (weight rows, expert e,
// list l) runs e's rows [offsets[e], offsets[e + 1]) of x through matrix l E + e of the table (linear_grouped's: the
// L E weight pointers list by list, then their scales; every expert with the layout ldw / lds) into y rows l R + r
// (y [L R, N]). offsets [E + 1] on the device (expert_offsets_into), read after griddepcontrol.wait.
struct Fp4GemmGroups {
  const uint8_t* const* table = nullptr;
  const int32_t* offsets = nullptr;
  int L = 1, E = 1, R = 0;
};
void fp4_gemm_grouped_into(const Fp4GemmGroups& g, int64_t ldw, int64_t lds, int N, int K, const float* xp, float* y,
                           bool round, cudaStream_t stream);

}  // namespace deepinfer::cuda
