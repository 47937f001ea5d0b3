// CUDA fake quantisation and bf16 rounding: the contracts of ops::fake_quant_fp8 and
// ops::round_bf16 in src/ops/ops.h, on float32 tensors that live on kCUDA.
//
// The launchers are plain C++ declarations (callable from .cpp files); the device helpers below
// them compile only under nvcc and are meant for reuse by fused kernels (e.g. a GEMM's
// activation-quantisation prologue).
#pragma once

#include <cstdint>

#include "deepinfer/tensor.h"
#include "ops/ops.h"

namespace deepinfer::cuda {

// In place on each row of x (see Rows in common.cuh for the accepted layouts): columns
// [col_begin, col_end) are cut into `block`-wide groups (the last may be shorter); each group is
// fake-quantised to FP8 e4m3 with a ue8m0 scale of max(amax, 1e-4) / 448, clamp to +-448, round
// to nearest even, and written back as q * scale. Asynchronous on the default stream.
void fake_quant_fp8(Tensor& x, int64_t col_begin, int64_t col_end, int64_t block);

// In place: every value rounded to the bf16 grid (nearest even). No-op when !enable.
void round_bf16(Tensor& x, bool enable = true);

// In place on each row (Rows layouts), groups of `block` columns from column 0 (the last may be
// shorter): FP4 e2m1 with a ue8m0 scale of max(amax, 6*2^-126) / 6, clamp +-6, round to nearest
// even; written back as q * scale. Bit for bit the CPU op. Asynchronous on the default stream.
void fake_quant_fp4(Tensor& x, int64_t block);
// As fake_quant_fp4 with an E4M3 scale s = e4m3(max(amax, 6*2^-9) * fp32(1/6)) (NaN when that
// is >= 464, as the host's f32_to_e4m3) and a true division x / s (V4.1 KV). Bit for bit the CPU op.
void fake_quant_fp4_e4m3_scale(Tensor& x, int64_t block);

// ops::dequantize on a weight that lives on kCUDA (BF16, F32, E4M3 + E8M0 tiles, E2M1x2 + E8M0 per
// 32): a new dense float32 [out, in] CUDA tensor, bit for bit the CPU op (every product is one
// IEEE multiply of exact values; NaN codes give NaN).
Tensor dequantize(const ops::QWeight& w);

}  // namespace deepinfer::cuda

#ifdef __CUDACC__
#include <cuda_fp16.h>
#include <cuda_fp8.h>

namespace deepinfer::cuda {

constexpr float kE4M3Max = 448.0f;

// ue8m0 ("power of two") scale for amax / qmax, formed as DeepSeek's kernels do (and as
// deepinfer::ue8m0_scale on the host): t = amax * fp32(1/qmax), then 2^ceil(log2 t) read off the
// exponent bits (the exponent, plus one if any mantissa bit is set). amax must be positive/normal.
__device__ __forceinline__ float ue8m0_scale(float amax, float qmax) {
  const float t = amax * (1.0f / qmax);
  const uint32_t bits = __float_as_uint(t);
  const int exp = static_cast<int>((bits >> 23) & 0xFFu) - 127 + ((bits & 0x7FFFFFu) != 0 ? 1 : 0);
  return __uint_as_float(static_cast<uint32_t>(exp + 127) << 23);
}

// v clamped to +-448, then rounded to the nearest e4m3 value (ties to even), returned as fp32.
// NaN stays NaN (the comparisons are false for NaN, as with torch.clamp).
__device__ __forceinline__ float e4m3_rne(float v) {
  v = v > kE4M3Max ? kE4M3Max : (v < -kE4M3Max ? -kE4M3Max : v);
  const __nv_fp8_storage_t code = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
  // Every e4m3 value is exactly representable in fp16 (and so in fp32).
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3)));
}

// fake_quant_fp8's group scale from the group's amax (the max of |v| taken with fmaxf, so NaNs are skipped): a power
// of two with the 1e-4 floor, so dividing by it is exact.
__device__ __forceinline__ float fp8_group_scale(float amax) { return ue8m0_scale(fmaxf(amax, 1e-4f), kE4M3Max); }
// One value fake-quantised with its group's scale s: e4m3_rne(v / s) * s (exact in fp32).
__device__ __forceinline__ float fp8_fake_quant(float v, float s) { return e4m3_rne(v / s) * s; }
// The same with the scale's reciprocal inv = 1 / s at hand (the decode GEMVs' x prologues): 1 / s is exact, so v * inv
// is the correctly rounded v / s and the bits are fp8_fake_quant's.
__device__ __forceinline__ float fp8_fake_quant_inv(float v, float s, float inv) {
  return __fmul_rn(e4m3_rne(__fmul_rn(v, inv)), s);
}
// A float4 of one group fake-quantised (fp8_fake_quant_inv on each value).
__device__ __forceinline__ float4 fp8_fake_quant4_inv(float4 v, float s, float inv) {
  return make_float4(fp8_fake_quant_inv(v.x, s, inv), fp8_fake_quant_inv(v.y, s, inv), fp8_fake_quant_inv(v.z, s, inv),
                     fp8_fake_quant_inv(v.w, s, inv));
}
// max(a, |v.x|, |v.y|, |v.z|, |v.w|) by fmaxf (NaNs skipped), for a group amax float4 by float4.
__device__ __forceinline__ float amax4(float a, float4 v) {
  return fmaxf(fmaxf(fmaxf(fmaxf(a, fabsf(v.x)), fabsf(v.y)), fabsf(v.z)), fabsf(v.w));
}
// The decode GEMVs' in-place act quant of x through shared memory, float4 by float4 (k % 4 == 0: columns k .. k+3 of
// one row, groups of A columns). fp8_group_max4 folds the four into the row's group amax g[group] (float bits: integer
// max == float max for non-negative floats; fmaxf from 0 drops NaNs as prep_x_kernel's fmaxf loop does);
// fp8_fake_quant4_groups quantises them, each by its group's scale gs and reciprocal gi.
__device__ __forceinline__ void fp8_group_max4(uint32_t* g, int k, float4 v, int A) {
  if (A % 4 == 0) {  // the four columns share a group
    atomicMax(g + k / A, __float_as_uint(amax4(0.0f, v)));
  } else {
    const float a[4] = {fabsf(v.x), fabsf(v.y), fabsf(v.z), fabsf(v.w)};
#pragma unroll
    for (int e = 0; e < 4; ++e) atomicMax(g + (k + e) / A, __float_as_uint(fmaxf(0.0f, a[e])));
  }
}
__device__ __forceinline__ float4 fp8_fake_quant4_groups(float4 v, int k, int A, const float* gs, const float* gi) {
  int g[4];
  if (A % 4 == 0) {
    g[0] = g[1] = g[2] = g[3] = k / A;
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) g[e] = (k + e) / A;
  }
  v.x = fp8_fake_quant_inv(v.x, gs[g[0]], gi[g[0]]);
  v.y = fp8_fake_quant_inv(v.y, gs[g[1]], gi[g[1]]);
  v.z = fp8_fake_quant_inv(v.z, gs[g[2]], gi[g[2]]);
  v.w = fp8_fake_quant_inv(v.w, gs[g[3]], gi[g[3]]);
  return v;
}

// Columns [c0, c1) of row p fake-quantised in place as one fake_quant_fp8 group by a whole warp (lane l: columns
// c0 + l, c0 + l + 32, ...), `amax` being the max of |value| over the lane's own columns (a kernel that just wrote
// them has it). The group's max is order-independent, so the bits are fake_quant_fp8's.
// The scale of a group whose lanes each hold `amax`, the max of |value| over their own columns (the whole warp calls
// it).
__device__ __forceinline__ float warp_fp8_group_scale(float amax) {
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  return fp8_group_scale(amax);
}
__device__ __forceinline__ void warp_fake_quant_fp8(float* p, int64_t c0, int64_t c1, int lane, float amax) {
  const float s = warp_fp8_group_scale(amax);
  for (int64_t c = c0 + lane; c < c1; c += 32) p[c] = fp8_fake_quant(p[c], s);
}
// The same, the lanes' maxima read from p first.
__device__ __forceinline__ void warp_fake_quant_fp8(float* p, int64_t c0, int64_t c1, int lane) {
  float amax = 0.0f;
  for (int64_t c = c0 + lane; c < c1; c += 32) amax = fmaxf(amax, fabsf(p[c]));
  warp_fake_quant_fp8(p, c0, c1, lane, amax);
}

// RNE onto the e2m1 grid {0, .5, 1, 1.5, 2, 3, 4, 6} for |v| <= 6, sign kept: the CPU's
// magic-number form ((a + 2^(E+22)) - 2^(E+22), E clamped at 0), with explicit IEEE adds.
__device__ __forceinline__ float round_e2m1_grid(float v) {
  const uint32_t u = __float_as_uint(v);
  const uint32_t sign = u & 0x80000000u;
  const uint32_t a = u & 0x7fffffffu;
  const uint32_t ea = max(a & 0x7f800000u, 127u << 23);
  const float magic = __uint_as_float(ea + (22u << 23));
  const float r = __fsub_rn(__fadd_rn(__uint_as_float(a), magic), magic);
  return __uint_as_float(__float_as_uint(r) | sign);
}

// e4m3 decode of a code (NaN codes give NaN), exact in fp32.
__device__ __forceinline__ float e4m3_decode(uint8_t code) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), __NV_E4M3)));
}
// e8m0 decode as deepinfer::e8m0_to_f32: 255 = NaN, 0 = 2^-127 (subnormal).
__device__ __forceinline__ float e8m0_decode(uint32_t e) {
  if (e == 255u) return __uint_as_float(0x7fc00000u);
  if (e == 0u) return __uint_as_float(0x00400000u);
  return __uint_as_float(e << 23);
}

}  // namespace deepinfer::cuda
#endif  // __CUDACC__
