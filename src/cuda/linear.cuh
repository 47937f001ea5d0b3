// CUDA linear layer: the contract of ops::linear (src/ops/ops.h) on tensors that live on kCUDA,
// bit for bit equal to the CPU op (src/cpu/linear.cpp) on the formats the model ships.
//
// Numerics. Every product x * w is exact in fp32 (bf16 or FP8-quantised x times e4m3 / e2m1 /
// bf16 weights), so the result depends only on the order of the FP32 additions. The kernel
// replays the CPU GEMV's order exactly: per output, 32 accumulators v[j][l] (j = 0..3, l = 0..7)
// take element 32c + 8j + l of each 32-wide chunk c (FP4: the even/odd nibble order of the CPU's
// permuted x); at each end of an E4M3 scale tile (BF16 / FP4: at the end of K)
// s[l] = ((v0 + v1) + v2) + v3 is added to tot[l] as fma(s, scale, tot); finally
// y = ((tot0+tot4) + (tot2+tot6)) + ((tot1+tot5) + (tot3+tot7)) + 0, as the CPU's hsum.
// Known gap: an E8M0 tile scale above 2^119 (code > 246, never seen in checkpoints) takes the
// CPU's scalar path, which this kernel does not replay (results then agree to rounding only).
//
// Kernel shape. Every block owns 8 weight rows and streams them, with the matching x, through
// shared memory (16-byte cp.async, 3-4 stages; rows padded so that reads are bank-conflict free).
//  * E4M3: tiles are independent until tot, so one thread per (row, tile) computes the tile's s[l]
//    from its whole 32-byte chunks in registers (codes decoded two per 32-bit word, as the CPU's fp16
//    bits); the s[l] go to shared memory and 64 * MT threads (row, m, l) fold them into tot[l] in tile
//    order, one slab behind the compute. 256 threads per block (128 for tiles above 32).
//  * FP4 / BF16: the v[j][l] chains run over all of K, so 16 threads per row each own two chains
//    (BF16 elements 2q, 2q + 1; FP4 byte q = both nibbles) and walk K; shuffles give s and the hsum.
// x is quantised once (a small pre-pass) into a padded fp32 workspace, [tile of MT rows][group of
// one E4M3 tile or 32 columns][column][MT] + 4 pad floats per group; MT <= 4 rows of x per pass (2
// for E4M3 tiles above 32), larger M is tiled over grid.y, re-reading the weight (from L2 when it
// fits). The GEMV is launched with programmatic dependent launch: it streams its first weight slabs
// while the pre-pass runs and waits for it (griddepcontrol.wait) before touching x.
// Requirements: K % 32 == 0, E4M3 tile size a multiple of 32, 16-byte aligned rows.
#pragma once

#include <cstdint>

#include "deepinfer/tensor.h"
#include "ops/ops.h"

struct CUstream_st;

namespace deepinfer::cuda {

// y[M, N] = x[M, K] . W^T; x float32 [M, K] on kCUDA (rows dense), W and its scale on kCUDA.
Tensor linear(const Tensor& x, const ops::QWeight& w, const ops::LinearOpts& opts);

// DEEPINFER_CUDA_GEMM (read once): the rows of x from which cuda::linear takes the tensor-core kernel where it can
// (0 for "tc", 64 for "auto", none for "exact"). cuda::linear_grouped follows "tc" too (linear_tc_grouped).
int64_t tc_from_rows();

// linear() runs E4M3 calls of DEEPINFER_CUDA_FP8_GEMM_ROWS (65) rows and more through the tiled GEMM of
// linear_gemm_fp8.cuh, FP4 calls of DEEPINFER_CUDA_FP4_GEMM_ROWS and more through that of linear_gemm_fp4.cuh, the
// few-row calls the decode GEMV of linear_gemv.cuh takes through it (the same bits; faster there, see linear_exact in
// linear.cu) and the rest through the slab kernels below, or the tensor-core kernel when DEEPINFER_CUDA_GEMM asks for
// it.
//
// The slab kernels alone, into a preallocated float32 [M, N] contiguous CUDA tensor, on `stream`
// (nullptr: the legacy default stream). The x workspace is cached and grows on demand (a grow
// synchronises).
void linear_into(const Tensor& x, const ops::QWeight& w, const ops::LinearOpts& opts, Tensor& y,
                 CUstream_st* stream = nullptr);

// The exact linear as cuda::linear runs it (the tiled E4M3 GEMM, the decode GEMV or the slab kernels by shape), into
// a preallocated float32 [M, N] contiguous CUDA tensor on `stream`: what benches time against the slab kernels alone.
void linear_exact_into(const Tensor& x, const ops::QWeight& w, const ops::LinearOpts& opts, Tensor& y,
                       CUstream_st* stream = nullptr);

// Tests and benches: from how many rows of x the exact linear takes the tiled E4M3 GEMM (linear_gemm_fp8.cuh); 0
// never, -1 back to DEEPINFER_CUDA_FP8_GEMM_ROWS. Same bits either way.
void linear_set_fp8_gemm_rows(int64_t rows);
// The threshold in force (0: never): DEEPINFER_CUDA_FP8_GEMM_ROWS (its default in the env table) unless set above.
int64_t fp8_gemm_rows_min();
// Whether the exact linear takes the tiled E4M3 GEMM for a call of `rows` rows of x per matrix (a dense call's M, a
// grouped call's rows per matrix), `x_rows` in all, E4M3 tiles of B and width K.
bool fp8_gemm_takes(int64_t rows, int64_t x_rows, int B, int64_t K);
// x [M, K] (float32, dense rows) act-quantised as the slab kernels' pre-pass does (act_quant_block 0: as is) into the
// tiled GEMM's layout (fp8_gemm_x_pos), in a call scratch, by one launch on `stream`.
Tensor fp8_gemm_x(const Tensor& x, int64_t act_quant_block, CUstream_st* stream);

// The same for the exact FP4 GEMM (linear_gemm_fp4.cuh): DEEPINFER_CUDA_FP4_GEMM_ROWS (its default in the env table;
// 0 never) rows of x per matrix from which the exact linear takes it, a dense call's M or a grouped call's average rows
// per expert (rows sorted by expert); the setter for tests and benches (-1: back to the variable); whether it takes a
// call; x in its layout (fp4_gemm_x_pos). Same bits either way.
void linear_set_fp4_gemm_rows(int64_t rows);
int64_t fp4_gemm_rows_min();
bool fp4_gemm_takes(int64_t rows, int64_t x_rows, int64_t K);
Tensor fp4_gemm_x(const Tensor& x, int64_t act_quant_block, CUstream_st* stream);

// offsets[e] = the first of the R rows whose expert (ids, ascending: moe_group's order) is >= e, for e in [0, E], by
// one launch on `stream` (the grouped GEMMs' pre-pass; ids may come from the previous kernel).
void expert_offsets_into(const int32_t* ids, int R, int E, int32_t* offsets, CUstream_st* stream);

// A weight's layout as the CUDA linear kernels take it, after checking it (format, E4M3 tile, the
// scale's shape, 16-byte aligned rows; throws deepinfer::Error naming `op` otherwise). fmt: 0 E4M3,
// 1 packed E2M1, 2 BF16 (GemvArgs::fmt); B: the E4M3 tile (0 otherwise); ldw: bytes between rows;
// scale / lds: the E8M0 codes and the bytes between their rows (null / 0 for BF16).
struct WeightLayout {
  int fmt = 2, B = 0;
  int64_t ldw = 0;
  const uint8_t* scale = nullptr;
  int64_t lds = 0;
};
WeightLayout weight_layout(const ops::QWeight& w, const char* op);

// ops::linear_grouped on CUDA (linear_grouped.cu): one GEMV launch over all rows, each row's expert
// read on the device from row_expert through a cached device table of the experts' pointers.
Tensor linear_grouped(const Tensor& x, const Tensor& row_expert,
                      const std::vector<const std::vector<ops::QWeight>*>& lists, const ops::LinearOpts& opts,
                      int64_t tile_rows = 0, int64_t row_period = 0);

// ops::linear_groups_exact on CUDA (linear_grouped.cu): the exact contract's block-diagonal projection y[:, g N + n] =
// x[:, g K .. (g + 1) K) . w[g N + n] in one launch, where fp8_wgmma_gemv takes it (under gemv_set_fp8_variant(7):
// E4M3 tiles of 32, 1-4 rows of x quantised per 32 or 1-3 of raw x, N % (64 groups) == 0). _supported says whether it
// does; the call throws otherwise.
bool linear_groups_exact_supported(const Tensor& x, const ops::QWeight& w, int64_t groups, const ops::LinearOpts& opts);
Tensor linear_groups_exact(const Tensor& x, const ops::QWeight& w, int64_t groups, const ops::LinearOpts& opts);

}  // namespace deepinfer::cuda
