// Device helpers of the tensor-core linear (linear_tc.cu, linear_tc_gemv.cu): code conversions to the FP16
// operands of mma.m16n8k16 (exact) and the MMA itself. The two kernels must use the same operand layout and
// the same MMA sequence, since a row's result may come from either (linear_tc.cuh: batch invariance).
#pragma once

#include <cstdint>

#include "cuda/fp_decode.cuh"
#include "cuda/quant.cuh"

namespace deepinfer::cuda::tc {

// Eight e2m1 codes (nibble i of w = element i) -> eight e4m3 bytes (lo: elements 0..3, hi: 4..7), exact:
// magnitudes through an 8-entry byte table, signs (nibble bit 3) by a sign-replicating byte permute.
__device__ __forceinline__ void fp4x8_to_e4m3(uint32_t w, uint32_t& lo, uint32_t& hi) {
  constexpr uint32_t kT0 = 0x3C383000u;  // e4m3 of 0, 0.5, 1, 1.5
  constexpr uint32_t kT1 = 0x4C484440u;  // e4m3 of 2, 3, 4, 6
  const uint32_t ml = prmt(kT0, kT1, w & 0x7777u);
  const uint32_t mh = prmt(kT0, kT1, (w >> 16) & 0x7777u);
  const uint32_t w4 = w << 4;  // msb of byte j of w4: bit 8j + 3 of w (even nibbles); of w: bit 8j + 7 (odd)
  const uint32_t sl = prmt(w4, w, 0xD9C8u);
  const uint32_t sh = prmt(w4, w, 0xFBEAu);
  lo = ml | (sl & 0x80808080u);
  hi = mh | (sh & 0x80808080u);
}

// d += A(16x16 f16, row) . B(16x8 f16, col), FP32 accumulation.
__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// One 32-column k step: lane (g, t) holds elements 8t .. 8t + 7 of the step as e4m3 bytes in two words for
// weight rows g (lo0: 8t .. 8t + 3, lo1: 8t + 4 .. 8t + 7) and g + 8 (hi0, hi1), and x's codes for token g in
// (x0, x1); k16 half h uses word h (f16 k slots 2t, 2t + 1 <- bytes 0, 1; slots 2t + 8, 2t + 9 <- bytes 2, 3), the
// same for A and B. acc += the step's products (two MMAs chained through the accumulator).
__device__ __forceinline__ void kstep(float (&acc)[4], uint32_t lo0, uint32_t lo1, uint32_t hi0, uint32_t hi1,
                                      const uint32_t (&b0)[2], const uint32_t (&b1)[2]) {
  const uint32_t a0[4] = {e4m3x2_lo(lo0), e4m3x2_lo(hi0), e4m3x2_hi(lo0), e4m3x2_hi(hi0)};
  const uint32_t a1[4] = {e4m3x2_lo(lo1), e4m3x2_lo(hi1), e4m3x2_hi(lo1), e4m3x2_hi(hi1)};
  mma_f16(acc, a0, b0);
  mma_f16(acc, a1, b1);
}

// run += tot, then tot = 0, fragment by fragment: a stage's or a K segment's total added to the running sum, in K order
// (linear_tc.cu, linear_tc_bf16.cu).
template <int MI, int NI>
__device__ __forceinline__ void add_total(float (&run)[MI][NI][4], float (&tot)[MI][NI][4]) {
#pragma unroll
  for (int a = 0; a < MI; ++a)
#pragma unroll
    for (int b = 0; b < NI; ++b)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        run[a][b][c] = __fadd_rn(run[a][b][c], tot[a][b][c]);
        tot[a][b][c] = 0.0f;
      }
}

// x's codes for one token and k step (8 bytes as (x0, x1)) -> the B fragments of the two k16 halves.
__device__ __forceinline__ void b_frags(uint32_t x0, uint32_t x1, uint32_t (&b0)[2], uint32_t (&b1)[2]) {
  b0[0] = e4m3x2_lo(x0), b0[1] = e4m3x2_hi(x0);
  b1[0] = e4m3x2_lo(x1), b1[1] = e4m3x2_hi(x1);
}

// x's FP8 input site as the CPU's fake_quant_fp8 keeps it: the group scale of amax (floored at 1e-4) and a value's
// e4m3 code at that scale (x / s, clamped to +-448, rounded to nearest even; NaN stays NaN), formed as x * x_inv(s).
__device__ __forceinline__ float x_scale(float amax) { return fp8_group_scale(amax); }
// 1 / s for a scale of x_scale: s is a power of two in [2^-22, 2^120] for finite x, so 1 / s is exact (read off the
// exponent bits, no division) and x * inv rounds as x / s does; an infinite amax gives s = inf and 1 / inf = 0.
__device__ __forceinline__ float x_inv(float s) {
  const uint32_t b = __float_as_uint(s);
  return b >= 0x7f800000u ? 0.0f : __uint_as_float((254u << 23) - b);
}
__device__ __forceinline__ uint8_t x_code(float x, float inv) {
  float v = x * inv;
  v = v > kE4M3Max ? kE4M3Max : (v < -kE4M3Max ? -kE4M3Max : v);
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

// Four x values -> their e4m3 codes at 1 / inv (x_code's result, two values per conversion: .satfinite clamps to
// +-448 as x_code's clamp does and keeps NaN), byte i for x's element i.
__device__ __forceinline__ uint32_t x_codes4(float4 v, float inv) {
  uint32_t d;
  asm("{.reg .b16 l, h;\n cvt.rn.satfinite.e4m3x2.f32 l, %2, %1;\n cvt.rn.satfinite.e4m3x2.f32 h, %4, %3;\n"
      " mov.b32 %0, {l, h};\n}"
      : "=r"(d)
      : "f"(v.x * inv), "f"(v.y * inv), "f"(v.z * inv), "f"(v.w * inv));
  return d;
}

// x's FP8 input site for one row of K floats into shared memory, by NT threads (tid < NT, whole warps): chunk c (the
// float4 at column 4 c) in act / 4 consecutive lanes per act group, whose amax they reduce by shuffles; kU chunks per
// thread loaded before any is used. X16: the codes' FP16 values at q + 2 k (the B fragments load as they are); else the
// codes at q + k. Group scale of columns 32 j .. at sx[j * sx_stride]. Only the stages s (128 columns) with (s - sa)
// mod S < span are loaded (span >= S: all); the other slots are written from zeros and never read. The decode GEMV's
// and the one-row stream's x passes (linear_tc_gemv.cu, linear_tc_stream.cu).
template <int NT, bool X16>
__device__ __forceinline__ void x_pass_row(const float* x, int K, int act, int S, int sa, int span, uint8_t* q,
                                           float* sx, int sx_stride, int tid) {
  constexpr int kU = 4;
  const int Lq = act / 4, rowc = K / 4;
  for (int cb = 0; cb < rowc; cb += kU * NT) {
    float4 v[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int c = cb + u * NT + tid;
      const bool need = c < rowc && (span >= S || (4 * c / 128 - sa + S) % S < span);
      v[u] = need ? *reinterpret_cast<const float4*>(x + 4 * c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      if (cb + u * NT >= rowc) break;  // uniform over the threads
      const int c = cb + u * NT + tid;
      float amax = fmaxf(fmaxf(fabsf(v[u].x), fabsf(v[u].y)), fmaxf(fabsf(v[u].z), fabsf(v[u].w)));
#pragma unroll
      for (int o = 16; o > 0; o >>= 1)
        if (o < Lq) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      if (c < rowc) {
        const float sc = x_scale(amax);
        const uint32_t codes = x_codes4(v[u], x_inv(sc));
        if constexpr (X16)
          *reinterpret_cast<uint2*>(q + 8 * c) = make_uint2(e4m3x2_lo(codes), e4m3x2_hi(codes));
        else
          *reinterpret_cast<uint32_t*>(q + 4 * c) = codes;
        if (c % 8 == 0) sx[(c / 8) * sx_stride] = sc;
      }
    }
  }
}

}  // namespace deepinfer::cuda::tc
