// The scalar path of the tensor-core E4M3 decode GEMVs (fp8_mma_gemv, fp8_wgmma_gemv): a warp's 16 weight rows for
// one x row with every product formed as the CPU forms it, for the blocks whose scale codes or x leave the fast
// path's range, and the lane-held chains' fold into y (the order of linear_gemv.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/fp_decode.cuh"
#include "cuda/linear_gemv_fp8.cuh"
#include "cuda/quant.cuh"

namespace deepinfer::cuda {

// The CPU's fake_quant_fp8 group scale of a tile whose lanes hold v (amax over |v| skipping NaN, as fmaxf from 0).
__device__ __forceinline__ float tile_scale(float v) {
  const uint32_t a = v == v ? __float_as_uint(v) & 0x7fffffffu : 0u;
  return fp8_group_scale(__uint_as_float(__reduce_max_sync(0xffffffffu, a)));
}

// A 32-column tile of x (a lane per column, v) act-quantised as the tensor-core E4M3 GEMVs form it: X =
// e4m3_rne(v / s), x's E4M3 code value (exact in f16), and kx with s = 2^kx (1 / s read off the exponent: s is a
// power of two; kx outside [-100, 100] sends the block to the slow path and X is unused). The MmaChunk the prologue
// folds (mma_x_chunks) is {kx, fp8_kx_ok(kx)}.
struct Fp8Tile {
  float X;
  int kx;
};
__device__ __forceinline__ Fp8Tile fp8_tile_code(float v) {
  const float s = tile_scale(v);
  const int kx = static_cast<int>(__float_as_uint(s) >> 23) - 127;       // s = 2^kx (inf for an infinite amax)
  const float inv = __uint_as_float((254u << 23) - __float_as_uint(s));  // 2^-kx
  return Fp8Tile{e4m3_rne(__fmul_rn(v, inv)), kx};
}
__device__ __forceinline__ bool fp8_kx_ok(int kx) { return kx >= -100 && kx <= 100; }

// The scale codes e that keep a row block on the fast path, given the block's flags (x_ok, kx min, kx max): e <= 246
// and e + kx in [1, 254] for every tile's kx (lo > hi: none).
__device__ __forceinline__ void fp8_fast_codes(const int* flags, int& lo, int& hi) {
  lo = max(0, 1 - flags[1]);
  hi = min(246, 254 - flags[2]);
}

// The slow path of one warp's 16 rows (kRows = 2; 1: row g only, tot[1] untouched): each product as the CPU forms it
// (fp8_walk_gemv's arithmetic), x quantised per tile by the warp (quantise: act_quant_block 32; else x as given); b0p /
// b1p are rows g and g + 8.
template <int kRows = 2>
__device__ __forceinline__ void slow_rows(const float* xr, const uint8_t* b0p, const uint8_t* b1p, const uint8_t* codes,
                                          int nch, int lane, int r, float (&tot)[2][2], bool quantise = true) {
#pragma unroll 1
  for (int c = 0; c < nch; ++c) {
    const float v = __ldcg(xr + 32 * c + lane);
    const float s = tile_scale(v);
    const float xq = quantise ? __fmul_rn(e4m3_rne(__fmul_rn(v, __fdiv_rn(1.0f, s))), s) : v;
    const float fac = fp8_tile_factor(codes[c]);
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float pv[2][4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int el = 8 * j + 2 * r + e;
        const float xe = __shfl_sync(0xffffffffu, xq, el);
        pv[0][j] = __fmaf_rn(__fmul_rn(e4m3_decode(b0p[32 * c + el]), 0x1p-8f), xe, 0.0f);
        if (kRows == 2) pv[1][j] = __fmaf_rn(__fmul_rn(e4m3_decode(b1p[32 * c + el]), 0x1p-8f), xe, 0.0f);
      }
#pragma unroll
      for (int a = 0; a < kRows; ++a) {
        const float sl = __fadd_rn(__fadd_rn(__fadd_rn(pv[a][0], pv[a][1]), pv[a][2]), pv[a][3]);
        tot[a][e] = __fmaf_rn(sl, fac, tot[a][e]);
      }
    }
  }
}

// y of rows g, g + 8 (kRows = 1: row g only) from the lane-held chains (lane r holds tot[a][e] of chain 2 r + e):
// y = ((tot0 + tot4) + (tot2 + tot6)) + ((tot1 + tot5) + (tot3 + tot7)) + 0.
template <int kRows = 2>
__device__ __forceinline__ void store_lane_rows(const GemvCall& p, int mt, int n0, int r, const float (&tot)[2][2]) {
#pragma unroll
  for (int a = 0; a < kRows; ++a) {
    const float u0 = __fadd_rn(tot[a][0], __shfl_xor_sync(0xffffffffu, tot[a][0], 2));  // r < 2: u_{2r}
    const float u1 = __fadd_rn(tot[a][1], __shfl_xor_sync(0xffffffffu, tot[a][1], 2));  // u_{2r + 1}
    // Lane r = 0 holds u0, u1; lane 1 holds u2, u3.
    const float x0 = __fadd_rn(u0, __shfl_xor_sync(0xffffffffu, u0, 1));  // u0 + u2
    const float x1 = __fadd_rn(u1, __shfl_xor_sync(0xffffffffu, u1, 1));  // u1 + u3
    const float out = __fadd_rn(__fadd_rn(x0, x1), 0.0f);
    const int n = n0 + 8 * a;
    if (r == 0 && n < p.N) p.y[static_cast<int64_t>(mt) * p.N + n] = p.round ? round_to_bf16(out) : out;
  }
}

}  // namespace deepinfer::cuda
