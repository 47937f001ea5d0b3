// fp8_gemm: the exact E4M3 linear for calls of many rows of x (decode batches, prefill chunks), tiled over rows of x
// and of the weight so that each decoded weight serves a whole tile of x rows from shared memory. The bits are those of
// the slab kernels (linear.cu) and of the CPU op: the order of linear.cuh, per output (m, n) and chain l the tile sum
// s[l] = ((v0 + v1) + v2) + v3 (v[j][l] over the tile's 32-column chunks, v = fma(w, x, v) from 0), then
// tot[l] = fma(s, 2^(e-119), tot) tile by tile in K order, then the CPU's hsum. Why a third exact kernel: the GEMV and
// the slab kernels re-read the weight once per pass of 1-4 rows of x, so at 256 rows they ran at ~18% of the FP32
// FMA peak (bench/RESULTS.md, twenty-third session); here a block reads its 64 weight rows once for 32 rows of x.
// Internal to the CUDA backend: cuda::linear picks it (linear.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace deepinfer::cuda {

// The x layout fp8_gemm reads: row m's K values (act-quantised when the call quantises), each 32-column chunk
// permuted so that chain l's four values (columns 8j + l, j = 0..3) are adjacent: column 32c + 8j + l sits at
// 32c + 4l + j. Rows are K floats apart.
__host__ __device__ constexpr int64_t fp8_gemm_x_pos(int64_t k) {
  const int64_t r = k & 31;
  return (k - r) + 4 * (r & 7) + (r >> 3);
}

// True when fp8_gemm takes an E4M3 weight of tile B and width K: K a multiple of its 128-column stage, B 32, 64 or
// 128 (a stage holds whole tiles).
bool fp8_gemm_supported(int B, int64_t K);

// y[M, N] (row stride N) = x . W^T on `stream`, x in fp8_gemm_x_pos's layout [M, K]; w / scale / ldw / lds as
// WeightLayout (E4M3, tile B). Preconditions: fp8_gemm_supported(B, K), M, N >= 1. Launched with programmatic
// dependent launch (the weight's first stages stream before griddepcontrol.wait).
void fp8_gemm_into(const uint8_t* w, int64_t ldw, const uint8_t* scale, int64_t lds, int B, int N, int K,
                   const float* xp, int M, float* y, bool round, cudaStream_t stream);

// ops::linear_grouped's calls whose rows repeat their matrices with a period P (row_expert[r] == row_expert[r % P]:
// wo_a's groups, P = 8; the shared expert's w1 / w3, two lists of one matrix, P = 1) as one launch over the L x P
// matrices: matrix (l, p) is list l's expert row_expert[p] (read on the device) on the x rows p, p + P, ..., into
// y rows l R + p, l R + p + P, ... (y [L R, N]). table: linear_grouped's device table (L E weight pointers, list by
// list, then their scales), every expert with the layout ldw / lds.
struct Fp8GemmGroups {
  const uint8_t* const* table = nullptr;
  const int32_t* row_expert = nullptr;
  int L = 1, E = 1, P = 1, R = 0;
};
void fp8_gemm_grouped_into(const Fp8GemmGroups& g, int64_t ldw, int64_t lds, int B, int N, int K, const float* xp,
                           float* y, bool round, cudaStream_t stream);

}  // namespace deepinfer::cuda
