// CUDA sparse attention with a per-head sink: the contract of ops::sparse_attention (src/ops/ops.h)
// on tensors that live on kCUDA. CPU reference: src/cpu/attention.cpp.
//
// Numerics: the CPU's order is replayed. Per (t, head): for each 64-entry tile of idx, scores are
// sequential fp32 dots over d = 0..D-1 (one thread per (entry, head), explicit IEEE multiply then
// add) times `scale`; the tile max, m_new, rescale = exp(m - m_new), p = exp(s - m_new), the
// sequential fp32 tile sum and l = l * rescale + tsum follow the CPU statement by statement; P.V is
// accumulated in FP64 per output element in entry order (p * v is exact in FP64, so an FMA equals the
// CPU's multiply-then-add), the accumulator rescaled per tile in FP64. Output: float(acc) / (l +
// exp(sink - m)). exp is fp32(exp(double)), which equals glibc's expf except in rare ~0.5 ulp
// cases, so results are bit for bit the CPU's almost always; the tests allow 1e-5 relative.
//
// Two kernels, the same arithmetic (every value above goes through the same fp32 / fp64 operations in
// the same order in both; only which thread computes it, and when, differs):
// * Tiled (prefill-sized T): one CTA (256 threads) per (token, group of HG heads), HG in {4, 8, 16}
//   picked from the number of CTAs the launch gets (more heads per CTA = fewer re-reads of the
//   gathered rows). Each 64-entry tile's KV rows are gathered by idx into shared memory with 16-byte
//   cp.async (rows padded to D + 4 floats: conflict-free float4 reads), scores go through shared
//   memory, one warp per head does the softmax step, and every thread owns output columns d and
//   d + 256 of all HG heads (2 * HG FP64 accumulators in registers; the tile's probabilities are
//   converted to FP64 once, in shared memory).
// * Split (decode: T * ceil(H / 16) * 8 <= 2 * SMs, K <= 2048): one cluster of 8 CTAs per (token, group of HG
//   heads), HG = 8 where its layout fits, then 16, then 4 (T = 1, H = 64: 8 heads, 64 CTAs); q 16-byte aligned
//   (else the tiled kernel). The scores of ALL tiles are computed first, the valid entries split over the 8 CTAs
//   (each score a sequential dot; a thread forms two heads' dots of one entry; rows streamed through shared memory
//   in chunks); the per-tile maxima and then the probabilities are exchanged through distributed shared memory (two
//   cluster barriers); every CTA then redoes the tile sums / rescales / l for its heads and runs P.V tile by tile for
//   its own D / 8 output columns (the rows' column slices come from L2).
// Entries with idx < 0 or >= N are skipped (empty).
// De-rotation (ops::AttnDerotate): both kernels apply the inverse RoPE to their own output before storing it: the
// columns (2i, 2i + 1) of a pair sit in lanes l, l ^ 1 of one warp (one shuffle), and the rotation is rope.cuh's
// rope_rotate on the rounded values, so o is the bits that apply_rope(o, ..., inverse) would give.
// Requirements: D % 4 == 0, D <= 512; q [T, H, D], kv [N, D], idx [T, K] int32, sink [H] float32,
// all contiguous on kCUDA.
#pragma once

#include <cstdint>

#include "deepinfer/tensor.h"
#include "ops/ops.h"

struct CUstream_st;

namespace deepinfer::cuda {

Tensor sparse_attention(const Tensor& q, const Tensor& kv, const Tensor& idx, const Tensor& sink, float scale,
                        bool bf16_probs, bool round, const ops::AttnDerotate* derotate = nullptr);

// As sparse_attention into a preallocated contiguous float32 [T, H, D] CUDA tensor on `stream`;
// heads_per_cta 0 picks the kernel and HG automatically; 4, 8 or 16 force the tiled kernel and -4, -8
// or -16 the split kernel with that many heads per CTA / cluster (benchmarks, tests).
void sparse_attention_into(const Tensor& q, const Tensor& kv, const Tensor& idx, const Tensor& sink, float scale,
                           bool bf16_probs, bool round, Tensor& out, CUstream_st* stream = nullptr,
                           int heads_per_cta = 0, const ops::AttnDerotate* derotate = nullptr);

}  // namespace deepinfer::cuda
