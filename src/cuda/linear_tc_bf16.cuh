// Tensor-core CUDA linear for BF16 weights without an input site (act_quant_block 0): the vocabulary head under
// DEEPINFER_CUDA_GEMM=tc. An alternative implementation of the ops::linear contract (src/ops/ops.h) that is
// numerically close to the CPU op, not bit-exact, like linear_tc.cuh for the quantised weights.
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

}  // namespace deepinfer::cuda
