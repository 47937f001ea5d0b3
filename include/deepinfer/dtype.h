// Element types and their exact conversions.
//
// Definitions (OCP MX / IEEE):
//   bf16     1-8-7, the top half of an fp32; f32 -> bf16 rounds to nearest even.
//   e4m3fn   1-4-3, bias 7, no infinities, S.1111.111 = NaN, max 448, min subnormal 2^-9.
//   e8m0     unsigned exponent byte: 2^(e-127); 0xFF = NaN.
//   e2m1     1-2-1, bias 1: codes 0..7 = {0, .5, 1, 1.5, 2, 3, 4, 6}, bit 3 = sign.
//            Packed two per byte, low nibble first (the even K index).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace deepinfer {

enum class DType : uint8_t {
  kF32,
  kBF16,
  kF16,
  kE4M3,    // float8_e4m3fn
  kE8M0,    // float8_e8m0fnu (scales)
  kE2M1x2,  // two e2m1 codes per byte; shape is logical (element count), bytes = numel / 2
  kI8,
  kU8,
  kI32,
  kI64,
};

// Bits per element (4 for packed e2m1).
int dtype_bits(DType t);
const char* dtype_name(DType t);
// safetensors dtype strings: "F32", "BF16", "F16", "F8_E4M3", "F8_E8M0", "I8", "U8", "I32", "I64".
std::optional<DType> dtype_from_safetensors(std::string_view s);
const char* dtype_to_safetensors(DType t);
// Bytes for n elements of type t (rounds packed types up).
size_t dtype_nbytes(DType t, int64_t n);

// ---- scalar conversions -------------------------------------------------------------------------
inline float bf16_to_f32(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
// Round to nearest, ties to even. NaN stays NaN (quiet).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
// Rounds an fp32 value onto the bf16 grid (returned as fp32).
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

float e4m3_to_f32(uint8_t code);
// Round to nearest even. |x| beyond the largest finite value after rounding (>= 464) gives NaN,
// as torch's float8_e4m3fn cast does: callers clamp to +-448 first where the contract says so.
uint8_t f32_to_e4m3(float f);

float e8m0_to_f32(uint8_t code);
// Exact for powers of two in [2^-127, 2^127]; other values are an error of the caller.
uint8_t f32_to_e8m0(float pow2);

float e2m1_to_f32(uint8_t code);  // code in 0..15
// Round to nearest even on the e2m1 grid, saturating at +-6.
uint8_t f32_to_e2m1(float f);

// ue8m0 ("power of two") scale for amax/qmax, formed as in DeepSeek's kernels:
// t = amax * fp32(1/qmax); scale = 2^ceil(log2 t) by exponent bits (exponent, +1 if mantissa != 0).
float ue8m0_scale(float amax, float qmax);

}  // namespace deepinfer
