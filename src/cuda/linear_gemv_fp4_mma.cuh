// The third FP4 decode GEMV kernel (fp4_mma_gemv, linear_gemv_fp4_mma.cu): the bits of the other two and of the
// CPU op (the order of linear_gemv.cuh), with every weight x activation product formed by the tensor cores
// instead of an fp16 decode, an fp16 -> fp32 convert and an FMA per weight. Internal to the CUDA backend:
// callers go through gemv_into, which picks the kernel (gemv_set_fp4_variant).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/linear_gemv.cuh"

namespace deepinfer::cuda {

// True when fp4_mma_gemv takes this call: FP4, gemv_supported(a), no act quant (the model's grouped expert calls
// take x already quantised), K % 128 == 0 and K <= 8192, 4-byte aligned scale rows; any number of x rows (a block
// per row).
bool gemv_fp4_mma_supported(const GemvArgs& a);

// Launches fp4_mma_gemv. Preconditions: gemv_fp4_mma_supported(a), a.M > 0, a.N > 0.
void gemv_fp4_mma_into(const GemvArgs& a, cudaStream_t stream);

// Deal mode, an A/B switch (DEEPINFER_CUDA_FP4_DEAL; default 0, off): 1 runs calls that fit one wave as one block of 16
// warps per SM, 2 as two blocks of 8 per SM, each block on an equal share of its x row's 16-row groups, instead of
// blocks of 4 warps on 64-row steps that the GPU places where it likes (bench/RESULTS.md, forty-first session: at one
// token the call's time hardly grows with its work until a second wave, as if some SMs held four blocks while others
// idled). 3 and 4, claim mode, for calls with the x pre-pass (at most 8 x rows): four blocks of 4 warps (3) or two of
// 7 (4) per SM, each warp taking its x row's next unclaimed 16-row group from an atomic counter until none is left, so
// that blocks which start late (their SM held by the side stream's kernels) find the work taken instead of adding a
// tail (forty-second session: deal mode lost in the model though it won alone). Mode 4's 14 warps an SM are about the
// one-token calls' groups per SM (w1 + w3 1,728 / 132, w2 1,920 / 132): with 16, the warps that find nothing left are
// spread at random and some SMs still run 16. The same bits in every mode. Tests and benches:
// gemv_fp4_mma_set_deal(0 .. 4; -1 back to the variable); gemv_fp4_mma_deal_taken: whether a call would run in deal
// or claim mode now.
void gemv_fp4_mma_set_deal(int mode);
bool gemv_fp4_mma_deal_taken(const GemvArgs& a);

// Tests: how many warps (16 weight rows each) took the scalar slow path since the last reset (synchronises the
// device); reset: set the count back to 0.
int64_t gemv_fp4_mma_slow_warps(bool reset = false);

}  // namespace deepinfer::cuda
