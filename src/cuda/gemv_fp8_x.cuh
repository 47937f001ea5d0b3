// Pieces shared by the E4M3 decode GEMVs that stage x in shared memory (fp8_walk_gemv, fp8_rows_gemv): the exact
// e4m3 decode, the fast-x test without act quant, and the block's x prologue (the raw
// rows by cp.async, then their fake quantisation in place with the 2^-8 of the fast path; or, for act-quant groups of
// 32 and raw x, both in one pass with one block barrier). Device code only.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/fp_decode.cuh"
#include "cuda/quant.cuh"

namespace deepinfer::cuda {

// Four e4m3 codes (byte i = element i) -> f[i] = e4m3 (kScaled: e4m3 * 2^-8), exact; NaN codes give NaN.
template <bool kScaled>
__device__ __forceinline__ void decode4(uint32_t w, float (&f)[4]) {
  const uint32_t l = e4m3x2_lo(w), h = e4m3x2_hi(w);  // fp_decode.cuh: the high codes converted in place
  __half2 lo = *reinterpret_cast<const __half2*>(&l);
  __half2 hi = *reinterpret_cast<const __half2*>(&h);
  if constexpr (kScaled) {
    // e4m3 * 2^-8 is an fp16 (normal, or subnormal on the 2^-24 grid), so the fp16 multiply is exact.
    const __half2 k = __float2half2_rn(0x1p-8f);
    lo = __hmul2(lo, k);
    hi = __hmul2(hi, k);
  }
  f[0] = __low2float(lo);
  f[1] = __high2float(lo);
  f[2] = __low2float(hi);
  f[3] = __high2float(hi);
}

// The pair exchange of the E4M3 walks: lanes 2p and 2p + 1 (h = 0, 1) loaded bytes [16h, 16h + 16) of one 32-byte
// chunk each (q); one shuffle pair gives lane h wj[j] = bytes 8j + 4h .. 8j + 4h + 3, the codes of chains 4h .. 4h + 3.
__device__ __forceinline__ void pair_words(uint4 q, int h, uint32_t (&wj)[4]) {
  const uint32_t r0 = __shfl_xor_sync(0xffffffffu, h ? q.x : q.y, 1);
  const uint32_t r1 = __shfl_xor_sync(0xffffffffu, h ? q.z : q.w, 1);
  wj[0] = h ? r0 : q.x, wj[1] = h ? r1 : q.z, wj[2] = h ? q.y : r0, wj[3] = h ? q.w : r1;
}

// v * k value by value (k a power of two here: the fast path's 2^-8 and its undoing, exact).
__device__ __forceinline__ float4 mul4(float4 v, float k) {
  return make_float4(__fmul_rn(v.x, k), __fmul_rn(v.y, k), __fmul_rn(v.z, k), __fmul_rn(v.w, k));
}

// True when x value v qualifies for the fast path without act quant (linear_gemv_fp8.cu's top comment).
__device__ __forceinline__ bool fast_raw_x(float v) {
  const uint32_t u = __float_as_uint(v), e = (u >> 23) & 0xffu;
  return (u & 0x7fffffffu) == 0u || e == 0xffu || (e >= 127u - 100u && e < 127u + 100u && (u & 0xfu) == 0u);
}

// The x prologue's first half: the block's x rows m < MT (row_of(m): the row of p.x; rows >= mrows and columns >= K
// zero) into xs [MT][xcols] by cp.async, float4 c of row m at float4 slot(c) (a permutation within each row), all in
// flight at once. The caller waits (cp_async_wait_all) and syncs before fp8_quantise_x.
template <int MT, typename RowOf, typename Slot>
__device__ __forceinline__ void fp8_stage_x(float* xs, int xcols, const float* x, int64_t ldx, int mrows, int K,
                                            RowOf&& row_of, Slot&& slot) {
  const int tid = static_cast<int>(threadIdx.x), nthreads = static_cast<int>(blockDim.x);
  const int k4 = K >> 2, xc4 = xcols >> 2;
  for (int i = tid; i < MT * xc4; i += nthreads) {
    const int m = i / xc4, c = i - m * xc4;
    float* dst = xs + m * xcols + 4 * slot(c);
    if (m < mrows && c < k4)
      cp_async16(dst, x + row_of(m) * ldx + 4 * c);
    else
      *reinterpret_cast<float4*>(dst) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
}

// The x prologue's second half, after the staged rows are complete and gmax [MT][ng] is zeroed: with act quant
// (A > 0), the group amax (integer atomicMax), the ue8m0 scales (gmax then holds them, ginv their reciprocals) and
// the quantised values in place; without, the fast-x test. Returns whether x takes the fast path (the same answer in
// every thread), in which case the values are scaled by 2^-8. Ends with the block synchronised.
template <int MT, typename Slot>
__device__ __forceinline__ bool fp8_quantise_x(float* xs, int xcols, uint32_t* gmax, float* ginv, int A, int ng,
                                               int mrows, int K, Slot&& slot) {
  const int tid = static_cast<int>(threadIdx.x), nthreads = static_cast<int>(blockDim.x);
  const int k4 = K >> 2;
  bool fast;
  if (A > 0) {
    for (int i = tid; i < mrows * k4; i += nthreads) {  // group amax
      const int m = i / k4, c = i - m * k4;
      fp8_group_max4(gmax + m * ng, 4 * c, *reinterpret_cast<const float4*>(xs + m * xcols + 4 * slot(c)), A);
    }
    __syncthreads();  // group amax complete
    bool ok = true;
    for (int i = tid; i < MT * ng; i += nthreads) {
      const float s = fp8_group_scale(__uint_as_float(gmax[i]));
      gmax[i] = __float_as_uint(s);
      ginv[i] = __fdiv_rn(1.0f, s);
      ok = ok && s < 0x1p91f;
    }
    fast = __syncthreads_and(ok) != 0;  // and the group scales are complete
    const float k = fast ? 0x1p-8f : 1.0f;
    for (int i = tid; i < mrows * k4; i += nthreads) {
      const int m = i / k4, c = i - m * k4, col = 4 * c;
      float4* v = reinterpret_cast<float4*>(xs + m * xcols + 4 * slot(c));
      *v = mul4(fp8_fake_quant4_groups(*v, col, A, reinterpret_cast<const float*>(gmax) + m * ng, ginv + m * ng), k);
    }
    __syncthreads();  // quantised x complete
  } else {
    bool ok = true;
    for (int i = tid; i < mrows * k4; i += nthreads) {
      const int m = i / k4, c = i - m * k4;
      const float4 v = *reinterpret_cast<const float4*>(xs + m * xcols + 4 * slot(c));
      ok = ok && fast_raw_x(v.x) && fast_raw_x(v.y) && fast_raw_x(v.z) && fast_raw_x(v.w);
    }
    fast = __syncthreads_and(ok) != 0;
    if (fast) {
      for (int i = tid; i < mrows * k4; i += nthreads) {
        const int m = i / k4, c = i - m * k4;
        float4* v = reinterpret_cast<float4*>(xs + m * xcols + 4 * slot(c));
        *v = mul4(*v, 0x1p-8f);
      }
      __syncthreads();
    }
  }
  return fast;
}

// Whether fp8_stage_quantise_x takes a block's x (its preconditions on A and xcols).
__device__ __forceinline__ bool fp8_one_pass_x(int A, int xcols) { return (A == 0 || A == 32) && xcols % 128 == 0; }

// The x prologue in one pass, for act-quant groups of 32 columns (A = 32) or x used as is (A = 0): the values of
// fp8_stage_x then fp8_quantise_x, with one block barrier instead of three or four and no shared-memory atomics, on
// the critical path of every decode GEMV that stages x after griddepcontrol.wait. Each thread loads its float4 straight
// into registers (with A = 32 the 8 lanes of a group take its amax by shuffles and quantise) and stores it already
// scaled by 2^-8, betting on the fast path; the barrier that ends the pass also takes the fast test. When x is not
// fast (rare: a group scale of 2^91 or more; raw x with more than 20 significant bits or out of range) a second pass
// stores the values without the 2^-8: with A = 32 it multiplies by 256 (exact: no quantised value is small enough to
// lose bits), with A = 0 it reloads x. Preconditions: A == 0 or 32, K % 32 == 0, xcols a multiple of 128 and
// blockDim.x of 32 (whole warps walk the same iterations); x rows m < mrows are read at row_of(m) after the previous
// kernel completed (griddepcontrol.wait). Returns whether x is fast (the same answer in every thread); ends with the
// block synchronised.
template <int MT, typename RowOf, typename Slot>
__device__ __forceinline__ bool fp8_stage_quantise_x(float* xs, int xcols, const float* x, int64_t ldx, int mrows,
                                                     int K, int A, RowOf&& row_of, Slot&& slot) {
  const int tid = static_cast<int>(threadIdx.x), nthreads = static_cast<int>(blockDim.x);
  const int k4 = K >> 2, xc4 = xcols >> 2;
  auto load = [&](int m, int c) {
    return m < mrows && c < k4 ? __ldcg(reinterpret_cast<const float4*>(x + row_of(m) * ldx + 4 * c))
                               : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  };
  bool ok = true;
  for (int i = tid; i < MT * xc4; i += nthreads) {  // with A = 32, i's 8-lane group is one act-quant group
    const int m = i / xc4, c = i - m * xc4;
    float4 v = load(m, c);
    if (A == 32) {
      float a = amax4(0.0f, v);
      a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 1));
      a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 2));
      a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 4));
      const float sc = fp8_group_scale(a), inv = __fdiv_rn(1.0f, sc);
      ok = ok && sc < 0x1p91f;
      v = fp8_fake_quant4_inv(v, sc, inv);
    } else {
      ok = ok && fast_raw_x(v.x) && fast_raw_x(v.y) && fast_raw_x(v.z) && fast_raw_x(v.w);
    }
    *reinterpret_cast<float4*>(xs + m * xcols + 4 * slot(c)) = mul4(v, 0x1p-8f);
  }
  const bool fast = __syncthreads_and(ok) != 0;
  if (!fast) {  // the slow path takes x as quantised (A = 32) or raw (A = 0): without the 2^-8
    for (int i = tid; i < MT * xc4; i += nthreads) {
      const int m = i / xc4, c = i - m * xc4;
      float4* v = reinterpret_cast<float4*>(xs + m * xcols + 4 * slot(c));
      *v = A == 32 ? mul4(*v, 256.0f) : load(m, c);
    }
    __syncthreads();
  }
  return fast;
}

}  // namespace deepinfer::cuda
