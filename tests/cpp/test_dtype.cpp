// Exhaustive checks of the scalar formats against their definitions (include/deepinfer/dtype.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "deepinfer/dtype.h"

using namespace deepinfer;

// Decodes e4m3fn from first principles, independently of the library's table-free decoder.
static double e4m3_definition(int code) {
  int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return NAN;
  double v = e == 0 ? (m / 8.0) * std::pow(2.0, -6) : (1 + m / 8.0) * std::pow(2.0, e - 7);
  return s ? -v : v;
}

TEST(DType, E4M3AllCodesDecode) {
  for (int c = 0; c < 256; ++c) {
    double want = e4m3_definition(c);
    float got = e4m3_to_f32(static_cast<uint8_t>(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << c;
    } else {
      EXPECT_EQ(static_cast<double>(got), want) << "code " << c;
      EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << c;
    }
  }
  EXPECT_EQ(e4m3_to_f32(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
}

TEST(DType, E4M3RoundTripEveryCode) {
  for (int c = 0; c < 256; ++c) {
    float v = e4m3_to_f32(static_cast<uint8_t>(c));
    if (std::isnan(v)) continue;
    EXPECT_EQ(f32_to_e4m3(v), c) << "value " << v;
  }
}

// Every midpoint between neighbouring finite e4m3 values rounds to the even code; values just
// off the midpoint round to the nearer neighbour.
TEST(DType, E4M3TiesToEven) {
  for (int c = 0; c < 0x7E; ++c) {
    float lo = e4m3_to_f32(static_cast<uint8_t>(c)), hi = e4m3_to_f32(static_cast<uint8_t>(c + 1));
    float mid = 0.5f * (lo + hi);  // exact in fp32
    int even = (c % 2 == 0) ? c : c + 1;
    EXPECT_EQ(f32_to_e4m3(mid), even) << "tie between codes " << c << " and " << c + 1;
    EXPECT_EQ(f32_to_e4m3(-mid), even | 0x80);
    EXPECT_EQ(f32_to_e4m3(std::nextafter(mid, 0.0f)), c);
    EXPECT_EQ(f32_to_e4m3(std::nextafter(mid, 1000.0f)), c + 1);
  }
  // Above the largest finite value: 448 < x < 464 rounds to 448; 464 (the tie with 480) is NaN.
  EXPECT_EQ(f32_to_e4m3(460.0f), 0x7E);
  EXPECT_TRUE(std::isnan(e4m3_to_f32(f32_to_e4m3(464.0f))));
  EXPECT_TRUE(std::isnan(e4m3_to_f32(f32_to_e4m3(NAN))));
}

TEST(DType, E8M0AllCodes) {
  for (int c = 0; c < 255; ++c) {
    float v = e8m0_to_f32(static_cast<uint8_t>(c));
    EXPECT_EQ(static_cast<double>(v), std::pow(2.0, c - 127)) << c;
    EXPECT_EQ(f32_to_e8m0(v), c);
  }
  EXPECT_TRUE(std::isnan(e8m0_to_f32(255)));
}

TEST(DType, E2M1AllCodesAndTies) {
  const float vals[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int c = 0; c < 16; ++c) {
    float want = (c & 8) ? -vals[c & 7] : vals[c & 7];
    EXPECT_EQ(e2m1_to_f32(static_cast<uint8_t>(c)), want) << c;
    if (c != 8) EXPECT_EQ(f32_to_e2m1(want), c);  // -0 is code 8, +0 is 0
  }
  // Ties: 0.25, 1.25, 2.5, 5 round down to the even code; 0.75, 1.75, 3.5 round up.
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(0.25f)), 0.0f);
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(0.75f)), 1.0f);
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(1.25f)), 1.0f);
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(1.75f)), 2.0f);
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(2.5f)), 2.0f);
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(3.5f)), 4.0f);
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(5.0f)), 4.0f);
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(-2.5f)), -2.0f);
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(100.0f)), 6.0f);  // saturates
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(std::nextafter(2.5f, 3.0f))), 3.0f);
}

TEST(DType, Bf16RoundToNearestEven) {
  // Every tie pattern in the low 16 bits around a few exponents.
  for (uint32_t hi : {0x3F80u, 0x3F81u, 0x4000u, 0x7F00u, 0x0001u}) {
    uint32_t tie = (hi << 16) | 0x8000u;
    float f;
    std::memcpy(&f, &tie, 4);
    uint16_t want = (hi & 1) ? static_cast<uint16_t>(hi + 1) : static_cast<uint16_t>(hi);
    EXPECT_EQ(f32_to_bf16(f), want) << std::hex << tie;
    uint32_t below = tie - 1, above = tie + 1;
    std::memcpy(&f, &below, 4);
    EXPECT_EQ(f32_to_bf16(f), hi);
    std::memcpy(&f, &above, 4);
    EXPECT_EQ(f32_to_bf16(f), hi + 1);
  }
  for (uint32_t b = 0; b < 65536; ++b) {  // every bf16 value round-trips (NaNs stay NaN)
    float f = bf16_to_f32(static_cast<uint16_t>(b));
    if (std::isnan(f))
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f))));
    else
      EXPECT_EQ(f32_to_bf16(f), b);
  }
}

TEST(DType, Ue8m0ScaleIsCeilPowerOfTwo) {
  EXPECT_EQ(ue8m0_scale(448.0f, 448.0f), 1.0f);
  EXPECT_EQ(ue8m0_scale(449.0f, 448.0f), 2.0f);
  EXPECT_EQ(ue8m0_scale(6.0f, 6.0f), 1.0f);
  EXPECT_EQ(ue8m0_scale(3.0f, 6.0f), 0.5f);
  EXPECT_EQ(ue8m0_scale(1e-4f, 448.0f), std::ldexp(1.0f, -22));  // 1e-4/448 = 2.23e-7 -> 2^-22
  for (int e = -30; e < 30; ++e) {
    float amax = std::ldexp(1.37f, e);
    float s = ue8m0_scale(amax, 448.0f);
    float t = amax * (1.0f / 448.0f);
    EXPECT_GE(s, t);
    EXPECT_LT(s * 0.5f, t);
  }
}

TEST(DType, SafetensorsNames) {
  for (const char* n : {"F32", "BF16", "F16", "F8_E4M3", "F8_E8M0", "I8", "U8", "I32", "I64"}) {
    auto t = dtype_from_safetensors(n);
    ASSERT_TRUE(t.has_value()) << n;
    EXPECT_STREQ(dtype_to_safetensors(*t), n);
  }
  EXPECT_FALSE(dtype_from_safetensors("F8_E5M2").has_value());
  EXPECT_EQ(dtype_nbytes(DType::kE2M1x2, 64), 32u);
}
