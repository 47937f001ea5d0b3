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
// Kernel shape. One warp per weight row, 1..8 rows per thread block; thread 8j + l owns
// accumulator v[j][l] (so it reads byte 32c + 8j + l: consecutive across the warp), the four j
// meet through shuffles at each tile end, and lanes 0..7 hold tot[l] for the final sum. The
// weight rows stream through shared memory in 512-byte-per-row slabs with 16-byte cp.async, four
// stages deep, together with the matching slab of x, so the loads in flight do not depend on the
// number of threads; the block's scales are read into shared memory once. x is quantised once (a
// small pre-pass) into a [M/MT][K][MT] fp32 workspace, read as MT-wide vectors; a thread handles
// MT <= 8 rows of x, larger M is tiled over MT (grid.y), re-reading the weight (from L2 when it
// fits). Requirements: K % 32 == 0, E4M3 tile size a multiple of 32, 16-byte aligned rows.
#pragma once

#include <cstdint>

#include "deepinfer/tensor.h"
#include "ops/ops.h"

struct CUstream_st;

namespace deepinfer::cuda {

// y[M, N] = x[M, K] . W^T; x float32 [M, K] on kCUDA (rows dense), W and its scale on kCUDA.
Tensor linear(const Tensor& x, const ops::QWeight& w, const ops::LinearOpts& opts);

// As linear, into a preallocated float32 [M, N] contiguous CUDA tensor, on `stream` (nullptr: the
// legacy default stream). The x workspace is cached and grows on demand (a grow synchronises).
void linear_into(const Tensor& x, const ops::QWeight& w, const ops::LinearOpts& opts, Tensor& y,
                 CUstream_st* stream = nullptr);

}  // namespace deepinfer::cuda
