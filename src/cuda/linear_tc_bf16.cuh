// Tensor-core CUDA linear without an input site (act_quant_block 0) under DEEPINFER_CUDA_GEMM=tc: BF16 weights (the
// vocabulary head), and E4M3 weights with E8M0 block scales in the block-diagonal form of wo_a's groups
// (linear_tc_groups). An alternative implementation of the ops::linear contract (src/ops/ops.h) that is numerically
// close to the CPU op, not bit-exact, like linear_tc.cuh for the weights at the FP8 input site.
//
// Numerics. A pre-pass splits each float32 x into three bf16 pieces, x = hi + mid + lo with hi = bf16(x) toward
// zero (so a finite x never gives an infinite piece), mid = bf16(x - hi), lo = bf16(x - hi - mid) (nearest even; each
// difference is exact in FP32, and the pieces hold x's 24 significant bits, so the split is exact for normal x); a
// non-finite x keeps hi = x and zero mid and lo.
// Every product piece * w is then exact in FP32, and the tensor core (mma.m16n8k16 bf16, FP32 accumulation) sums
//     y[m, n] = for each 16-column k step in K order: acc += hi . w; acc += mid . w; acc += lo . w   (acc from 0)
// so what differs from the CPU op is only the order (and the tensor core's internal alignment) of the FP32
// additions, as for linear_tc. Error bound used by the test: |y - y_cpu| <= (3 K/16 + 64) 2^-24 S with
// S = sum_k |x_k w_k|. round_out_bf16 rounds the final y to bf16 once.
// E4M3 weights: each code is turned into the bf16 of its value (exact: e4m3 has 3 mantissa bits); within each B x B
// scale block the k steps' MMAs of piece q sum into acc_q (from 0; three chains, so that a decode call, one m16 tile
// per warp over all of K, waits a third as long on the tensor core), and the blocks are folded in K order,
// tot = fma((acc_hi + acc_mid) + acc_lo, scale, tot) from tot = 0, the scale E8M0 (a power of two or NaN), within
// each of 4 contiguous K segments; the segment totals are added in K order, y = ((((0 + t0) + t1) + t2) + t3) (so that
// a decode call can walk the segments with four warps, one each: at one token wo_a has only 512 m16 tiles); bound
// (3 K/16 + K/B + 64) 2^-24 S. Requires K a multiple of 256 whose quarters are whole scale blocks.
// linear_tc_groups: G groups side by side, x [M, G K] and W [G N, K] (G blocks of N rows, N and K whole scale
// blocks): y [M, G N] with y[:, g N + n] = x[:, g K : (g + 1) K] . W[g N + n], one launch (a grid dimension per group),
// each group under the numerics above. The model's wo_a (o_groups blocks of o_lora_rank rows over the heads' outputs).
// Batch invariance: an output's MMA chain reads only its row of x and its row of W, in the same order whatever the
// tile configuration (chosen from M), so a row's result does not depend on M or on its position in the batch.
//
// Kernel shape ("swap AB", as linear_tc): the MMA's M dimension holds 16 weight rows, its N dimension 8 tokens. A
// thread block owns WR x MI x 16 weight rows and NI x 8 tokens (WR warps of MI x NI tiles), walks all of K in stages
// of 64 columns (16-byte cp.async into padded rows, ldmatrix to the fragments), two stages. Token tiles are the fast
// grid dimension, so the blocks that share weight rows run together and the weight is read from HBM about once.
// Requirements (linear_tc_bf16_supported): x float32 [M, K] on kCUDA with dense rows, W BF16 [N, K] on kCUDA with
// dense 16-byte aligned rows and no scale, act_quant_block 0, K > 0 and K % 64 == 0, M < 2^22, N < 2^22,
// M K < 2^36.
#pragma once

#include "deepinfer/tensor.h"
#include "ops/ops.h"

struct CUstream_st;

namespace deepinfer::cuda {

// Whether linear_tc_bf16_into can take this call (the requirements above).
bool linear_tc_bf16_supported(const Tensor& x, const ops::QWeight& w, const ops::LinearOpts& opts);

// Whether cuda::linear gives this BF16 weight to the tensor-core kernel under DEEPINFER_CUDA_GEMM=tc: weights of at
// least 16,384 rows (the vocabulary heads). The small BF16 linears (the MoE gate, the compressors, the indexer's
// weights) stay on the exact kernels: their outputs pick experts and KV rows, and a one-token call over a few hundred
// rows would leave most of the GPU idle in 64-row tiles. A rule on the weight's shape only: batch-invariant.
bool linear_tc_bf16_takes(const Tensor& x, const ops::QWeight& w, const ops::LinearOpts& opts);

// y [M, N] float32 contiguous CUDA = x W^T under the numerics above (enqueued on `stream`, default: the current one).
void linear_tc_bf16_into(const Tensor& x, const ops::QWeight& w, const ops::LinearOpts& opts, Tensor& y,
                         CUstream_st* stream = nullptr);
Tensor linear_tc_bf16(const Tensor& x, const ops::QWeight& w, const ops::LinearOpts& opts);

// The grouped form above for BF16 or E4M3 weights (E4M3: block a multiple of 32 that divides 64 or that 64 divides,
// each group's rows and columns whole blocks, scale [G N / B, K / B] with dense rows, 16-byte aligned weight rows).
bool linear_tc_groups_supported(const Tensor& x, const ops::QWeight& w, int64_t groups, const ops::LinearOpts& opts);
Tensor linear_tc_groups(const Tensor& x, const ops::QWeight& w, int64_t groups, const ops::LinearOpts& opts);

}  // namespace deepinfer::cuda
