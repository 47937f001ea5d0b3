// Fake quantisation (ops::fake_quant_*) and ops::round_bf16 against naive reimplementations built from
// the scalar conversions of include/deepinfer/dtype.h (docs/v4-architecture.md §3).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "deepinfer/error.h"
#include "ops/ops.h"

using namespace deepinfer;

namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ---- naive reference quantisers (one group, scalar conversions only) ------------------------------
void naive_fp8(float* p, int64_t n) {
  float amax = 0;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(p[i]));
  amax = std::max(amax, 1e-4f);
  const float s = ue8m0_scale(amax, 448.0f);
  for (int64_t i = 0; i < n; ++i) {
    const float v = std::clamp(p[i] / s, -448.0f, 448.0f);
    p[i] = e4m3_to_f32(f32_to_e4m3(v)) * s;
  }
}
void naive_fp4(float* p, int64_t n) {
  float amax = 0;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(p[i]));
  amax = std::max(amax, 6.0f * std::ldexp(1.0f, -126));
  const float s = ue8m0_scale(amax, 6.0f);
  for (int64_t i = 0; i < n; ++i) {
    const float v = std::clamp(p[i] / s, -6.0f, 6.0f);
    p[i] = e2m1_to_f32(f32_to_e2m1(v)) * s;
  }
}
void naive_fp4_e4m3(float* p, int64_t n) {
  float amax = 0;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(p[i]));
  amax = std::max(amax, 6.0f * std::ldexp(1.0f, -9));
  const float s = e4m3_to_f32(f32_to_e4m3(amax * (1.0f / 6.0f)));
  for (int64_t i = 0; i < n; ++i) {
    const float v = std::clamp(p[i] / s, -6.0f, 6.0f);
    p[i] = e2m1_to_f32(f32_to_e2m1(v)) * s;
  }
}

// Random values on the bf16 grid with a wide per-row dynamic range (and a few exact zeros).
Tensor random_rows(int64_t rows, int64_t cols, uint32_t seed, float spread = 8.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ex(-spread, spread);
  Tensor t = Tensor::empty({rows, cols}, DType::kF32);
  float* p = t.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float row_scale = std::exp2(ex(rng));
    for (int64_t c = 0; c < cols; ++c) {
      float v = nd(rng) * row_scale * std::exp2(0.5f * ex(rng));
      if (rng() % 97 == 0) v = 0.0f;
      p[r * cols + c] = round_bf16(v);
    }
  }
  return t;
}

std::vector<float> to_vec(const Tensor& t) {
  const float* p = t.data<float>();
  return std::vector<float>(p, p + t.numel());
}

void expect_bitwise_equal(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (bits_of(got[i]) != bits_of(want[i]) && !(got[i] == 0.0f && want[i] == 0.0f)) {
      if (++bad <= 5) ADD_FAILURE() << what << ": index " << i << " got " << got[i] << " want " << want[i];
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

void expect_on_bf16_grid(const Tensor& t) {
  const float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) ASSERT_EQ(round_bf16(p[i]), p[i]) << "index " << i << " value " << p[i];
}

}  // namespace

// ---- FP8 ----------------------------------------------------------------------------------------------
TEST(FakeQuantFp8, MatchesNaiveReference) {
  for (int64_t block : {32, 64, 128}) {
    for (int64_t cols : {int64_t{128}, int64_t{384}, int64_t{200}, int64_t{7}}) {
      Tensor x = random_rows(9, cols, static_cast<uint32_t>(block * 1000 + cols));
      std::vector<float> want = to_vec(x);
      for (int64_t r = 0; r < 9; ++r)
        for (int64_t g = 0; g < cols; g += block) naive_fp8(want.data() + r * cols + g, std::min(block, cols - g));
      ops::fake_quant_fp8(x, 0, cols, block);
      expect_bitwise_equal(to_vec(x), want, "fp8");
      expect_on_bf16_grid(x);
    }
  }
}

TEST(FakeQuantFp8, ColumnRangeLeavesOtherColumnsAlone) {
  // V4 window KV: the first 448 of 512 columns are quantised per 64, the RoPE tail stays as is.
  Tensor x = random_rows(5, 512, 7);
  std::vector<float> want = to_vec(x);
  for (int64_t r = 0; r < 5; ++r)
    for (int64_t g = 0; g < 448; g += 64) naive_fp8(want.data() + r * 512 + g, 64);
  ops::fake_quant_fp8(x, 0, 448, 64);
  expect_bitwise_equal(to_vec(x), want, "fp8 [0,448)");

  // A range that does not start at 0 and ends in a shorter group.
  Tensor y = random_rows(3, 300, 8);
  std::vector<float> want2 = to_vec(y);
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t g = 10; g < 250; g += 32) naive_fp8(want2.data() + r * 300 + g, std::min<int64_t>(32, 250 - g));
  ops::fake_quant_fp8(y, 10, 250, 32);
  expect_bitwise_equal(to_vec(y), want2, "fp8 [10,250)");
}

TEST(FakeQuantFp8, StridedRowsOfASlice) {
  Tensor big = random_rows(6, 256, 9);
  std::vector<float> want = to_vec(big);
  for (int64_t r = 0; r < 6; ++r) naive_fp8(want.data() + r * 256 + 64, 128);
  Tensor mid = big.slice(1, 64, 192);  // rows with stride 256
  ops::fake_quant_fp8(mid, 0, 128, 128);
  expect_bitwise_equal(to_vec(big), want, "fp8 on a slice");
}

TEST(FakeQuantFp8, Idempotent) {
  Tensor x = random_rows(16, 512, 11);
  ops::fake_quant_fp8(x, 0, 512, 128);
  std::vector<float> once = to_vec(x);
  ops::fake_quant_fp8(x, 0, 512, 128);
  expect_bitwise_equal(to_vec(x), once, "fp8 twice");
}

TEST(FakeQuantFp8, AmaxExactlyPowerOfTwoTimes448) {
  // amax = 448 * 2^k: amax * fp32(1/448) rounds to exactly 2^k, so the scale is 2^k (not 2^(k+1)) and
  // the block's values that are e4m3 multiples of 2^k survive unchanged.
  for (int k : {-12, -3, 0, 5}) {
    const float s = std::ldexp(1.0f, k);
    Tensor x = Tensor::zeros({1, 32}, DType::kF32);
    float* p = x.data<float>();
    const float vals[6] = {448, -448, 224, 1.125f, -0.015625f, 3.0f};
    for (int i = 0; i < 6; ++i) p[i] = vals[i] * s;
    ops::fake_quant_fp8(x, 0, 32, 32);
    for (int i = 0; i < 6; ++i) EXPECT_EQ(p[i], vals[i] * s) << "k=" << k << " i=" << i;
    // Slightly above: the scale doubles and 448*2^k still fits (it is 224 * 2^(k+1)).
    Tensor y = Tensor::zeros({1, 32}, DType::kF32);
    y.data<float>()[0] = 452.0f * s;  // amax just above 448 * 2^k: scale 2^(k+1)
    y.data<float>()[1] = 1.125f * s;  // 1.125 * 2^k = 0.5625 * 2^(k+1): an e4m3 value, unchanged
    ops::fake_quant_fp8(y, 0, 32, 32);
    EXPECT_EQ(y.data<float>()[0], 448.0f * s);  // 452/2 = 226 rounds to 224
    EXPECT_EQ(y.data<float>()[1], 1.125f * s);
  }
}

TEST(FakeQuantFp8, ZerosStayZeros) {
  Tensor x = Tensor::zeros({3, 256}, DType::kF32);
  ops::fake_quant_fp8(x, 0, 256, 128);
  for (float v : to_vec(x)) EXPECT_EQ(v, 0.0f);
  // A tiny block below the 1e-4 amax floor: scale 2^-22, values quantised on that grid.
  Tensor y = Tensor::zeros({1, 4}, DType::kF32);
  y.data<float>()[0] = 3e-7f;
  y.data<float>()[1] = -1e-10f;
  ops::fake_quant_fp8(y, 0, 4, 4);
  const float s = std::ldexp(1.0f, -22);
  EXPECT_EQ(y.data<float>()[0], e4m3_to_f32(f32_to_e4m3(3e-7f / s)) * s);
  EXPECT_EQ(y.data<float>()[1], -0.0f);  // -1e-10 / 2^-22 = -0.00042 < half of 2^-9 -> -0
  EXPECT_TRUE(std::signbit(y.data<float>()[1]));
}

TEST(FakeQuantFp8, MidpointsRoundToEven) {
  // 448 in the block makes the scale exactly 1, so the values below hit e4m3 midpoints directly.
  struct Case {
    float in, out;
  } cases[] = {
      {1.0625f, 1.0f},
      {1.1875f, 1.25f},
      {17.0f, 16.0f},
      {19.0f, 20.0f},
      {232.0f, 224.0f},
      {248.0f, 256.0f},
      {400.0f, 384.0f},
      {432.0f, 448.0f},
      {-1.0625f, -1.0f},
      {std::ldexp(1.0f, -10), 0.0f},
      {std::ldexp(3.0f, -10), std::ldexp(1.0f, -8)},
      {std::ldexp(15.0f, -10), std::ldexp(1.0f, -6)},  // subnormal/normal boundary: 7.5 * 2^-9 -> 8 * 2^-9
      {std::ldexp(17.0f, -10), std::ldexp(1.0f, -6)},  // first normal binade midpoint 1.0625 * 2^-6 -> 2^-6
  };
  const int n = static_cast<int>(std::size(cases));
  Tensor x = Tensor::zeros({1, 16}, DType::kF32);
  float* p = x.data<float>();
  p[0] = 448.0f;
  for (int i = 0; i < n; ++i) p[i + 1] = cases[i].in;
  ops::fake_quant_fp8(x, 0, 16, 16);
  EXPECT_EQ(p[0], 448.0f);
  for (int i = 0; i < n; ++i) EXPECT_EQ(p[i + 1], cases[i].out) << "input " << cases[i].in;
}

// The vectorised grid rounding agrees with f32_to_e4m3 over a dense sweep of [2^-14, 448] (scale 1).
TEST(FakeQuantFp8, DenseSweepAgreesWithScalarCast) {
  std::vector<float> vals;
  for (uint32_t u = bits_of(std::ldexp(1.0f, -14)); u <= bits_of(448.0f); u += 331) vals.push_back(from_bits(u));
  for (int c = 0; c < 0x7e; ++c) {  // every midpoint and its neighbours
    const float mid = 0.5f * (e4m3_to_f32(static_cast<uint8_t>(c)) + e4m3_to_f32(static_cast<uint8_t>(c + 1)));
    vals.push_back(mid);
    vals.push_back(std::nextafter(mid, 0.0f));
    vals.push_back(std::nextafter(mid, 1000.0f));
  }
  const int64_t per_row = 63;  // + one 448 per row to pin the scale at 1
  const int64_t rows = (static_cast<int64_t>(vals.size()) + per_row - 1) / per_row;
  Tensor x = Tensor::zeros({rows, 64}, DType::kF32);
  float* p = x.data<float>();
  for (int64_t r = 0; r < rows; ++r) p[r * 64] = 448.0f;
  for (size_t i = 0; i < vals.size(); ++i) {
    const int64_t r = static_cast<int64_t>(i) / per_row, c = static_cast<int64_t>(i) % per_row + 1;
    p[r * 64 + c] = (i % 2) ? -vals[i] : vals[i];
  }
  ops::fake_quant_fp8(x, 0, 64, 64);
  for (size_t i = 0; i < vals.size(); ++i) {
    const int64_t r = static_cast<int64_t>(i) / per_row, c = static_cast<int64_t>(i) % per_row + 1;
    const float in = (i % 2) ? -vals[i] : vals[i];
    ASSERT_EQ(p[r * 64 + c], e4m3_to_f32(f32_to_e4m3(in))) << "input " << in;
  }
}

// ---- FP4 (ue8m0 scale) ---------------------------------------------------------------------------------
TEST(FakeQuantFp4, MatchesNaiveReference) {
  for (int64_t cols : {int64_t{128}, int64_t{512}, int64_t{96}, int64_t{40}}) {
    Tensor x = random_rows(7, cols, static_cast<uint32_t>(cols), 20.0f);
    std::vector<float> want = to_vec(x);
    for (int64_t r = 0; r < 7; ++r)
      for (int64_t g = 0; g < cols; g += 32) naive_fp4(want.data() + r * cols + g, std::min<int64_t>(32, cols - g));
    ops::fake_quant_fp4(x, 32);
    expect_bitwise_equal(to_vec(x), want, "fp4");
    expect_on_bf16_grid(x);
  }
}

TEST(FakeQuantFp4, IdempotentAndZeros) {
  Tensor x = random_rows(8, 256, 21);
  ops::fake_quant_fp4(x, 32);
  std::vector<float> once = to_vec(x);
  ops::fake_quant_fp4(x, 32);
  expect_bitwise_equal(to_vec(x), once, "fp4 twice");
  Tensor z = Tensor::zeros({2, 64}, DType::kF32);
  ops::fake_quant_fp4(z, 32);
  for (float v : to_vec(z)) EXPECT_EQ(v, 0.0f);
}

TEST(FakeQuantFp4, TiesAndPowerOfTwoAmax) {
  // amax = 6 * 2^k gives scale exactly 2^k; the e2m1 ties then round to the even code.
  for (int k : {-100, -4, 0, 3}) {
    const float s = std::ldexp(1.0f, k);
    const float in[] = {6, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, -5.0f, 4.4f, 0.2f, -0.3f};
    const float out[] = {6, 0.0f, 1.0f, 1.0f, 2.0f, 2.0f, 4.0f, 4.0f, -4.0f, 4.0f, 0.0f, -0.5f};
    const int n = static_cast<int>(std::size(in));
    Tensor x = Tensor::zeros({1, 32}, DType::kF32);
    for (int i = 0; i < n; ++i) x.data<float>()[i] = in[i] * s;
    ops::fake_quant_fp4(x, 32);
    for (int i = 0; i < n; ++i) EXPECT_EQ(x.data<float>()[i], out[i] * s) << "k=" << k << " in " << in[i];
  }
  // Smallest amax: floored at 6 * 2^-126, scale 2^-126.
  Tensor t = Tensor::zeros({1, 32}, DType::kF32);
  t.data<float>()[0] = std::ldexp(1.0f, -127);  // 0.5 * 2^-126 -> e2m1 0.5
  t.data<float>()[1] = std::ldexp(3.0f, -128);  // 0.75 * 2^-126 -> 1.0 (tie up to even)
  ops::fake_quant_fp4(t, 32);
  EXPECT_EQ(t.data<float>()[0], std::ldexp(1.0f, -127));
  EXPECT_EQ(t.data<float>()[1], std::ldexp(1.0f, -126));
}

TEST(FakeQuantFp4, DenseSweepAgreesWithScalarCast) {
  std::vector<float> vals;
  for (uint32_t u = bits_of(std::ldexp(1.0f, -6)); u <= bits_of(6.0f); u += 97) vals.push_back(from_bits(u));
  const int64_t per_row = 31;
  const int64_t rows = (static_cast<int64_t>(vals.size()) + per_row - 1) / per_row;
  Tensor x = Tensor::zeros({rows, 32}, DType::kF32);
  float* p = x.data<float>();
  for (int64_t r = 0; r < rows; ++r) p[r * 32] = 6.0f;
  for (size_t i = 0; i < vals.size(); ++i)
    p[(static_cast<int64_t>(i) / per_row) * 32 + static_cast<int64_t>(i) % per_row + 1] = (i % 2) ? -vals[i] : vals[i];
  ops::fake_quant_fp4(x, 32);
  for (size_t i = 0; i < vals.size(); ++i) {
    const float in = (i % 2) ? -vals[i] : vals[i];
    ASSERT_EQ(p[(static_cast<int64_t>(i) / per_row) * 32 + static_cast<int64_t>(i) % per_row + 1],
              e2m1_to_f32(f32_to_e2m1(in)))
        << "input " << in;
  }
}

// ---- FP4 with an E4M3 scale (V4.1 compressed KV) -------------------------------------------------------
TEST(FakeQuantFp4E4m3, MatchesNaiveReference) {
  for (int64_t cols : {int64_t{16}, int64_t{512}, int64_t{72}}) {
    Tensor x = random_rows(11, cols, static_cast<uint32_t>(cols + 5), 6.0f);
    std::vector<float> want = to_vec(x);
    for (int64_t r = 0; r < 11; ++r)
      for (int64_t g = 0; g < cols; g += 16)
        naive_fp4_e4m3(want.data() + r * cols + g, std::min<int64_t>(16, cols - g));
    ops::fake_quant_fp4_e4m3_scale(x, 16);
    expect_bitwise_equal(to_vec(x), want, "fp4 e4m3-scale");
    expect_on_bf16_grid(x);
  }
}

TEST(FakeQuantFp4E4m3, IdempotentScaleCases) {
  // A non-power-of-two scale: amax 7.5 -> s = e4m3(1.25) = 1.25; x / s is an fp32 division.
  Tensor x = Tensor::zeros({1, 16}, DType::kF32);
  float* p = x.data<float>();
  const float in[] = {7.5f, 1.0f, -2.0f, 3.1f, 0.3f};
  for (int i = 0; i < 5; ++i) p[i] = in[i];
  ops::fake_quant_fp4_e4m3_scale(x, 16);
  EXPECT_EQ(p[0], 7.5f);     // 6 * 1.25
  EXPECT_EQ(p[1], 1.25f);    // 0.8 -> 1
  EXPECT_EQ(p[2], -1.875f);  // -1.6 -> -1.5
  EXPECT_EQ(p[3], 2.5f);     // 2.48 -> 2
  EXPECT_EQ(p[4], 0.0f);     // 0.24 -> 0
  // The amax floor 6 * 2^-9 gives the smallest e4m3 scale 2^-9.
  Tensor z = Tensor::zeros({1, 16}, DType::kF32);
  z.data<float>()[0] = std::ldexp(1.0f, -10);  // 0.5 * 2^-9
  ops::fake_quant_fp4_e4m3_scale(z, 16);
  EXPECT_EQ(z.data<float>()[0], std::ldexp(1.0f, -10));
  // Idempotent on random data.
  Tensor r = random_rows(6, 128, 33);
  ops::fake_quant_fp4_e4m3_scale(r, 16);
  std::vector<float> once = to_vec(r);
  ops::fake_quant_fp4_e4m3_scale(r, 16);
  expect_bitwise_equal(to_vec(r), once, "fp4 e4m3-scale twice");
}

// ---- round_bf16 --------------------------------------------------------------------------------------
TEST(RoundBf16, MatchesScalarIncludingTiesAndSpecials) {
  std::mt19937 rng(5);
  std::vector<float> vals;
  for (int i = 0; i < 5000; ++i) vals.push_back(from_bits(static_cast<uint32_t>(rng())));
  for (uint32_t hi : {0x3F80u, 0x3F81u, 0x7F7Fu, 0x0000u, 0x8001u})
    for (uint32_t lo : {0x7FFFu, 0x8000u, 0x8001u}) vals.push_back(from_bits((hi << 16) | lo));
  vals.push_back(INFINITY);
  vals.push_back(-INFINITY);
  vals.push_back(NAN);
  vals.push_back(from_bits(0x7f800001u));  // signalling-NaN pattern: must stay NaN
  Tensor x = Tensor::empty({1, static_cast<int64_t>(vals.size())}, DType::kF32);
  std::copy(vals.begin(), vals.end(), x.data<float>());
  ops::round_bf16(x);
  for (size_t i = 0; i < vals.size(); ++i) {
    const float got = x.data<float>()[i], want = round_bf16(vals[i]);
    if (std::isnan(want))
      EXPECT_TRUE(std::isnan(got)) << i;
    else
      EXPECT_EQ(bits_of(got), bits_of(want)) << "input bits " << std::hex << bits_of(vals[i]);
  }
  Tensor y = Tensor::full({2, 3}, 1.00390625f + 1e-6f);
  ops::round_bf16(y, false);  // disabled: untouched
  EXPECT_EQ(y.data<float>()[0], 1.00390625f + 1e-6f);
}

// ---- bad inputs --------------------------------------------------------------------------------------
TEST(FakeQuantErrors, BadInputsThrow) {
  Tensor x = Tensor::zeros({2, 64}, DType::kF32);
  EXPECT_THROW(ops::fake_quant_fp8(x, 0, 65, 32), Error);
  EXPECT_THROW(ops::fake_quant_fp8(x, 10, 5, 32), Error);
  EXPECT_THROW(ops::fake_quant_fp8(x, -1, 64, 32), Error);
  EXPECT_THROW(ops::fake_quant_fp8(x, 0, 64, 0), Error);
  EXPECT_THROW(ops::fake_quant_fp4(x, 0), Error);
  EXPECT_THROW(ops::fake_quant_fp4_e4m3_scale(x, -16), Error);
  Tensor b = Tensor::zeros({2, 64}, DType::kBF16);
  EXPECT_THROW(ops::fake_quant_fp8(b, 0, 64, 32), Error);
  EXPECT_THROW(ops::fake_quant_fp4(b, 32), Error);
  EXPECT_THROW(ops::round_bf16(b), Error);
  Tensor undef;
  EXPECT_THROW(ops::round_bf16(undef), Error);
  // Column-strided (transposed-like) view: the last dimension is not dense.
  Tensor big = Tensor::zeros({4, 4}, DType::kF32);
  Tensor col = big.select(1, 0);  // shape [4], stride 4
  EXPECT_THROW(ops::fake_quant_fp4(col, 32), Error);
  // A tensor claiming to live on the GPU.
  std::vector<float> host(64);
  Tensor g = Tensor::borrow(host.data(), {1, 64}, DType::kF32, nullptr, Device::kCUDA);
  EXPECT_THROW(ops::fake_quant_fp8(g, 0, 64, 32), Error);
  EXPECT_THROW(ops::round_bf16(g), Error);
}
