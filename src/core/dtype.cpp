// Exact scalar conversions for the formats in include/deepinfer/dtype.h.
#include "deepinfer/dtype.h"

#include <cmath>
#include <cstring>

#include "deepinfer/error.h"

namespace deepinfer {

int dtype_bits(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kI32:
      return 32;
    case DType::kBF16:
    case DType::kF16:
      return 16;
    case DType::kE4M3:
    case DType::kE8M0:
    case DType::kI8:
    case DType::kU8:
      return 8;
    case DType::kE2M1x2:
      return 4;
    case DType::kI64:
      return 64;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "float32";
    case DType::kBF16:
      return "bfloat16";
    case DType::kF16:
      return "float16";
    case DType::kE4M3:
      return "float8_e4m3";
    case DType::kE8M0:
      return "float8_e8m0";
    case DType::kE2M1x2:
      return "float4_e2m1 (packed)";
    case DType::kI8:
      return "int8";
    case DType::kU8:
      return "uint8";
    case DType::kI32:
      return "int32";
    case DType::kI64:
      return "int64";
  }
  return "?";
}

std::optional<DType> dtype_from_safetensors(std::string_view s) {
  if (s == "F32") return DType::kF32;
  if (s == "BF16") return DType::kBF16;
  if (s == "F16") return DType::kF16;
  if (s == "F8_E4M3") return DType::kE4M3;
  if (s == "F8_E8M0") return DType::kE8M0;
  if (s == "I8") return DType::kI8;
  if (s == "U8") return DType::kU8;
  if (s == "I32") return DType::kI32;
  if (s == "I64") return DType::kI64;
  return std::nullopt;
}

const char* dtype_to_safetensors(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kE4M3:
      return "F8_E4M3";
    case DType::kE8M0:
      return "F8_E8M0";
    case DType::kE2M1x2:
      return "I8";  // the checkpoints ship packed FP4 as I8
    case DType::kI8:
      return "I8";
    case DType::kU8:
      return "U8";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
  }
  return "?";
}

size_t dtype_nbytes(DType t, int64_t n) { return static_cast<size_t>((n * dtype_bits(t) + 7) / 8); }

float e4m3_to_f32(uint8_t code) {
  const int sign = code >> 7;
  const int exp = (code >> 3) & 0xF;
  const int man = code & 0x7;
  if (exp == 0xF && man == 0x7) return std::nanf("");
  float v = exp == 0 ? std::ldexp(static_cast<float>(man), -9)  // subnormal: man/8 * 2^-6
                     : std::ldexp(1.0f + man / 8.0f, exp - 7);
  return sign ? -v : v;
}

uint8_t f32_to_e4m3(float f) {
  if (std::isnan(f)) return 0x7F;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  float a = std::fabs(f);
  // Largest finite is 448 = 1.75 * 2^8; the midpoint to the (absent) next value 480 is 464.
  if (a >= 464.0f) return sign | 0x7F;  // NaN: e4m3fn has no infinity
  if (a < std::ldexp(1.0f, -6)) {
    // Subnormal grid: multiples of 2^-9. nearbyint rounds half to even in the default mode.
    float q = std::nearbyint(a * 512.0f);   // exact scaling by a power of two
    return sign | static_cast<uint8_t>(q);  // q == 8 lands on the smallest normal, code 0x08
  }
  int e;
  std::frexp(a, &e);      // a = m * 2^e, m in [0.5, 1)
  const int exp = e - 1;  // a = 1.xxx * 2^exp
  float step = std::ldexp(1.0f, exp - 3);
  float q = std::nearbyint(a / step);  // 8..16
  int exp_field = exp + 7;
  int qi = static_cast<int>(q);
  if (qi == 16) {
    qi = 8;
    exp_field += 1;
  }
  return sign | static_cast<uint8_t>((exp_field << 3) | (qi - 8));
}

float e8m0_to_f32(uint8_t code) {
  if (code == 0xFF) return std::nanf("");
  return std::ldexp(1.0f, static_cast<int>(code) - 127);
}

uint8_t f32_to_e8m0(float pow2) {
  DI_CHECK(pow2 > 0 && std::isfinite(pow2), "e8m0 scale must be a positive power of two, got {}", pow2);
  int e;
  float m = std::frexp(pow2, &e);
  DI_CHECK(m == 0.5f, "e8m0 scale must be a power of two, got {}", pow2);
  int code = e - 1 + 127;
  DI_CHECK(code >= 0 && code <= 254, "e8m0 scale {} out of range", pow2);
  return static_cast<uint8_t>(code);
}

static constexpr float kE2M1Values[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

float e2m1_to_f32(uint8_t code) {
  float v = kE2M1Values[code & 7];
  return (code & 8) ? -v : v;
}

uint8_t f32_to_e2m1(float f) {
  const uint8_t sign = std::signbit(f) ? 8 : 0;
  float a = std::fabs(f);
  if (std::isnan(f)) return 7;  // no NaN in e2m1; saturate (callers never pass NaN)
  // Round to nearest even: at a midpoint pick the code with an even mantissa bit (even code).
  uint8_t best = 7;
  if (a < 6.0f) {
    for (uint8_t c = 0; c < 7; ++c) {
      float lo = kE2M1Values[c], hi = kE2M1Values[c + 1];
      if (a <= hi) {
        float mid = 0.5f * (lo + hi);
        if (a < mid)
          best = c;
        else if (a > mid)
          best = c + 1;
        else
          best = (c % 2 == 0) ? c : c + 1;
        break;
      }
    }
  }
  return sign | best;
}

float ue8m0_scale(float amax, float qmax) {
  const float t = amax * (1.0f / qmax);
  uint32_t bits;
  std::memcpy(&bits, &t, 4);
  int exp = static_cast<int>((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0 ? 1 : 0);
  uint32_t out = static_cast<uint32_t>(exp + 127) << 23;
  float s;
  std::memcpy(&s, &out, 4);
  return s;
}

}  // namespace deepinfer
