// Tensor-core CUDA linear for the quantised weights (E4M3 + E8M0 tiles, packed E2M1 + E8M0 per 32) with
// the FP8 input site (act_quant_block > 0): an alternative implementation of the ops::linear contract
// (src/ops/ops.h) that is numerically close to the CPU op, not bit-exact; cuda::linear takes it when
// DEEPINFER_CUDA_GEMM asks (linear.cu).
//
// Numerics. x is first quantised per row and act_quant_block columns exactly as the CPU's fake_quant_fp8
// (amax floored at 1e-4, ue8m0 scale sx = 2^ceil(log2(amax / 448)), codes e4m3_rne(x / sx)), so the CPU's
// quantised x equals cx * sx bit for bit. FP4 codes are exact in E4M3, so every weight is cw * sw with an
// E4M3 code cw and a power of two sw (E8M0). For each fold block of KS = gcd(act_quant_block, weight
// scale block) columns (32 for V4.1 and for FP4 weights, 128 for V4; it must divide 128) both scales are
// constant. Each stage of 128 columns has the total
//     T_s[m, n] = its fold blocks b, in K order from 0:  tot = fma(P_b[m, n], sx[m, b] * sw[n, b], tot)
// where P_b = sum of cx * cw over the block is computed by the tensor core with FP32 accumulation, and
//     y[m, n] = ((0 + T_0) + T_1) + ... in stage order (FP32 additions).
// The stage totals are independent of each other, so a kernel may split K by stages (the decode kernel,
// linear_tc_gemv.cu) and still give the same bits.
// The MMA: sm_90 has no native FP8 mma.sync (ptxas lowers mma.m16n8k32.e4m3 to FP16 HMMAs plus
// conversions; native FP8 is WGMMA only), so the kernel converts the codes to FP16 itself (exact:
// cvt.rn.f16x2.e4m3x2) and issues mma.sync.m16n8k16.row.col.f32.f16.f16.f32, two per 32-column k step,
// each converted fragment reused across the warp's tile; a fold block chains its 2 KS / 32 MMAs through
// the accumulator. Each product cx * cw is exact; what differs from the CPU op is (a) the order (and the
// tensor core's internal alignment) of the FP32 additions inside a fold block, and (b) the order of the
// additions across blocks (sequential here, the CPU's 8-lane tree there). sx * sw is exact (powers of
// two) unless it leaves the fp32 range. Error bound used by the test: |y - y_cpu| <= (K/16 + 64) 2^-24 S
// with S = sum_k |x_k w_k| (both sides' worst-case FP32 summation error; tests/cuda/test_cuda_linear_tc.cpp).
// round_out_bf16 rounds the final y to bf16 (nearest even) once. Weight NaN codes propagate through the
// MMA (the row turns NaN, as on the CPU).
// Batch invariance: every output sums its stages as above, and each block's MMA chain depends only on that
// output's row of x and row of W, so a row's result does not depend on M, on the row's position in the batch,
// on the tile configuration (which is chosen from M and N) or on which of the two kernels ran it.
//
// Kernel shape ("swap AB"). The MMA's M dimension holds 16 weight rows, its N dimension 8 tokens; within
// one 32-column k step both operands use the same fixed permutation of the 32 columns so that every lane
// reads 8 contiguous bytes per row (FP8) or one 32-bit word of 8 nibbles (FP4, expanded to E4M3 bytes in
// registers with two byte permutes for the magnitudes and two for the signs, then to FP16 as FP8). A thread block owns
// WR x MI x 16 weight rows and WT x NI x 8 tokens (warps WR x WT, each MI x NI MMA tiles), walks all of K
// in stages of 128 columns (16-byte cp.async, S stages: weight rows, x codes, x scales and FP4 weight
// scales; E4M3 tile scales are read through the L1), and keeps FP32 running totals in registers:
//   M <= 64  (decode, small batches): MI = 1, NI = ceil(M / 8) rounded up to 1/2/4/8, WT = 1, WR = 4 when
//            N / 64 >= 2 x the SM count, else 1 (16-row blocks); 3..24 stages (~96 KiB); the weight is
//            read once from HBM.
//   M <= 256: 64 x 64 tiles (4 warps, 32 x 32 each); M > 256: 128 x 128 tiles (8 warps, 32 x 64 each).
// x is quantised by a pre-pass into a call's scratch: codes uint8 [M, K] and scales float [K/32, M4]
// (one per 32 columns, repeated over an act block; M4 = M rounded up to 4).
// Decode (E4M3 or FP4, M <= 8, act_quant_block 32 / 64 / 128; and grouped rows, linear_tc_grouped below):
// linear_tc_gemv.cu instead, one launch that quantises x in every block and splits K by stages over the warps (wo_b
// [5120, 8192] at M = 1: 84 us in the GEMM kernel).
// Grouped rows sorted by expert (linear_tc_grouped_gemm_into, large decode batches): the GEMM kernel again, a block per
// (128 weight rows, expert, list) walking the expert's rows in tiles of 8 tokens.
// Requirements (else linear_tc_supported is false): x float32 [M, K] on kCUDA with dense rows,
// act_quant_block > 0 and a multiple of 32, K % 128 == 0, gcd(act_quant_block, block) dividing 128, E4M3 block a
// multiple of 32 (or E2M1x2 with scale [N, K/32]), 16-byte aligned weight rows, 4-byte aligned scale rows.
#pragma once

#include <cstdint>
#include <vector>

#include "deepinfer/tensor.h"
#include "ops/ops.h"

struct CUstream_st;

namespace deepinfer::cuda {

// Whether linear_tc handles this call (shapes, formats, devices and alignment; see above).
bool linear_tc_supported(const Tensor& x, const ops::QWeight& w, const ops::LinearOpts& opts);

// y[M, N] = x[M, K] . W^T into a preallocated float32 [M, N] contiguous CUDA tensor on `stream`
// (nullptr: the legacy default stream). Throws deepinfer::Error when !linear_tc_supported. The x workspace
// is cached and grows on demand (a grow synchronises the device).
void linear_tc_into(const Tensor& x, const ops::QWeight& w, const ops::LinearOpts& opts, Tensor& y,
                    CUstream_st* stream = nullptr);

// As linear_tc_into, allocating y.
Tensor linear_tc(const Tensor& x, const ops::QWeight& w, const ops::LinearOpts& opts);

// Grouped rows under this contract (linear_grouped.cu, the decode GEMV's grouped mode): y [lists * R, N], row l R + r
// = linear_tc(x[r], (*lists[l])[row_expert[r]], opts) bit for bit, one launch, the ids read on the device. The experts
// of all lists share one format and layout that linear_tc supports, with 4-byte aligned FP4 scale rows; act_quant_block
// 32, 64 or 128; lists * R <= 65535. Throws where the GEMV does not take the call. cuda::linear_grouped uses it
// under DEEPINFER_CUDA_GEMM=tc.
// The grouped rows of a large decode batch through the GEMM kernel: x [R, K] sorted by expert (row_expert ascending,
// moe_group's order), y [lists R, N] row l R + r = linear_tc(x[r], matrix l E + row_expert[r] of the tables) bit for
// bit, each expert's weight read once per tile of its rows instead of once per row (linear_grouped.cu takes it under
// DEEPINFER_CUDA_GEMM=tc from DEEPINFER_CUDA_TC_GROUPED_ROWS rows). w_table / s_table: device arrays of lists x
// n_experts weight and scale pointers sharing w0's layout (linear_tc_supported on x and w0). One x pre-pass, one
// launch.
void linear_tc_grouped_gemm_into(const Tensor& x, const Tensor& row_expert, const uint8_t* const* w_table,
                                 const uint8_t* const* s_table, int lists, int n_experts, const ops::QWeight& w0,
                                 const ops::LinearOpts& opts, Tensor& y);

// The grouped GEMM's token tile: 0 = chosen by rows per expert (the default), 1 / 2 / 3 / 4 = tiles of 8 / 16 / 32 /
// 64 tokens for every call (tests, benchmarks: the same bits either way). Returns the previous setting.
int linear_tc_set_grouped_variant(int v);

// As linear_tc_grouped_into's tables built from the lists (linear_grouped.cu); x's rows sorted by expert.
Tensor linear_tc_grouped_gemm(const Tensor& x, const Tensor& row_expert,
                              const std::vector<const std::vector<ops::QWeight>*>& lists, const ops::LinearOpts& opts);

Tensor linear_tc_grouped(const Tensor& x, const Tensor& row_expert,
                         const std::vector<const std::vector<ops::QWeight>*>& lists, const ops::LinearOpts& opts);
void linear_tc_grouped_into(const Tensor& x, const Tensor& row_expert,
                            const std::vector<const std::vector<ops::QWeight>*>& lists, const ops::LinearOpts& opts,
                            Tensor& y);

}  // namespace deepinfer::cuda
