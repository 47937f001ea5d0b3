// ops::linear and ops::dequantize against a naive double-precision reference built from the scalar
// conversions of include/deepinfer/dtype.h (docs/v4-architecture.md §2.1 "Linear with ... weight", §3).
//
// The kernels differ from the reference only in the order of FP32 additions, so every output must be
// within 1e-5 of the L1 magnitude sum_k |w[n,k] x[m,k]| of its dot product. M in {1, 3, 8, 24} takes the
// fused GEMV path (8 and 24 in several register-blocked groups of x rows), M in {25, 37} the
// dequantised-panel sgemm path.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/cpu_ops.h"
#include "deepinfer/error.h"
#include "ops/ops.h"

using namespace deepinfer;

namespace {

const int64_t kMs[] = {1, 3, 8, 24, 25, 37};

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// ---- weights -------------------------------------------------------------------------------------------
ops::QWeight fp8_weight(int64_t N, int64_t K, int64_t B, uint32_t seed, int e_lo = 112, int e_hi = 130) {
  std::mt19937 rng(seed);
  ops::QWeight q;
  q.block = B;
  q.w = Tensor::empty({N, K}, DType::kE4M3);
  uint8_t* w = q.w.data<uint8_t>();
  for (int64_t i = 0; i < N * K; ++i) {
    uint8_t c;
    do c = static_cast<uint8_t>(rng());
    while ((c & 0x7f) == 0x7f);  // no NaN codes
    w[i] = c;
  }
  const int64_t sr = (N + B - 1) / B, sc = (K + B - 1) / B;
  q.scale = Tensor::empty({sr, sc}, DType::kE8M0);
  for (int64_t i = 0; i < sr * sc; ++i)
    q.scale.data<uint8_t>()[i] = static_cast<uint8_t>(e_lo + static_cast<int>(rng() % (e_hi - e_lo + 1)));
  return q;
}

ops::QWeight fp4_weight(int64_t N, int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  ops::QWeight q;
  q.w = Tensor::empty({N, K}, DType::kE2M1x2);
  for (int64_t i = 0; i < N * K / 2; ++i) q.w.data<uint8_t>()[i] = static_cast<uint8_t>(rng());
  q.scale = Tensor::empty({N, K / 32}, DType::kE8M0);
  for (int64_t i = 0; i < N * K / 32; ++i) q.scale.data<uint8_t>()[i] = static_cast<uint8_t>(110 + rng() % 20);
  return q;
}

ops::QWeight bf16_weight(int64_t N, int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  ops::QWeight q;
  q.w = Tensor::empty({N, K}, DType::kBF16);
  for (int64_t i = 0; i < N * K; ++i) q.w.data<uint16_t>()[i] = f32_to_bf16(nd(rng));
  return q;
}

ops::QWeight f32_weight(int64_t N, int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  ops::QWeight q;
  q.w = Tensor::empty({N, K}, DType::kF32);
  for (int64_t i = 0; i < N * K; ++i) q.w.data<float>()[i] = nd(rng);
  return q;
}

// The exact dequantised weight element, from the scalar definitions (independent of ops::dequantize).
double ref_w(const ops::QWeight& q, int64_t n, int64_t k) {
  const int64_t K = q.w.size(1);
  const int64_t ld = q.w.strides()[0];
  switch (q.w.dtype()) {
    case DType::kF32:
      return q.w.data<float>()[n * ld + k];
    case DType::kBF16:
      return bf16_to_f32(q.w.data<uint16_t>()[n * ld + k]);
    case DType::kE4M3: {
      const int64_t B = q.block;
      const uint8_t e = q.scale.data<uint8_t>()[(n / B) * q.scale.strides()[0] + k / B];
      return static_cast<double>(e4m3_to_f32(q.w.data<uint8_t>()[n * ld + k])) * std::ldexp(1.0, e - 127);
    }
    case DType::kE2M1x2: {
      const uint8_t byte = q.w.data<uint8_t>()[(n * K + k) / 2];
      const uint8_t code = (k % 2 == 0) ? (byte & 15) : (byte >> 4);
      const uint8_t e = q.scale.data<uint8_t>()[n * (K / 32) + k / 32];
      return static_cast<double>(e2m1_to_f32(code)) * std::ldexp(1.0, e - 127);
    }
    default:
      return NAN;
  }
}

// ---- activations ---------------------------------------------------------------------------------------
Tensor random_x(int64_t M, int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ex(-3.0f, 3.0f);
  Tensor x = Tensor::empty({M, K}, DType::kF32);
  for (int64_t m = 0; m < M; ++m) {
    const float rs = std::exp2(ex(rng));
    for (int64_t k = 0; k < K; ++k) x.data<float>()[m * K + k] = round_bf16(nd(rng) * rs);
  }
  return x;
}

// Naive FP8 activation fake-quant per row per `block` columns (scalar conversions only).
std::vector<float> naive_act_quant(const Tensor& x, int64_t block) {
  const int64_t M = x.size(0), K = x.size(1);
  std::vector<float> v(x.data<float>(), x.data<float>() + M * K);
  if (block <= 0) return v;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < K; g += block) {
      float* p = v.data() + m * K + g;
      const int64_t n = std::min(block, K - g);
      float amax = 0;
      for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(p[i]));
      const float s = ue8m0_scale(std::max(amax, 1e-4f), 448.0f);
      for (int64_t i = 0; i < n; ++i) p[i] = e4m3_to_f32(f32_to_e4m3(std::clamp(p[i] / s, -448.0f, 448.0f))) * s;
    }
  return v;
}

// Checks y = linear(x, w, opts) against the double reference.
void check_linear(const Tensor& x, const ops::QWeight& w, const ops::LinearOpts& opts, const std::string& what) {
  const int64_t M = x.size(0), K = x.size(1), N = w.w.size(0);
  Tensor y = ops::linear(x, w, opts);
  ASSERT_EQ(y.dtype(), DType::kF32);
  ASSERT_EQ(y.shape(), (Shape{M, N})) << what;
  const std::vector<float> xq = naive_act_quant(x, opts.act_quant_block);
  std::vector<double> wd(static_cast<size_t>(N * K));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) wd[n * K + k] = ref_w(w, n, k);
  Tensor y_plain;  // the unrounded output of the same path
  if (opts.round_out_bf16) {
    ops::LinearOpts o = opts;
    o.round_out_bf16 = false;
    y_plain = ops::linear(x, w, o);
  }
  int bad = 0;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double ref = 0, l1 = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = wd[n * K + k] * static_cast<double>(xq[m * K + k]);
        ref += p;
        l1 += std::fabs(p);
      }
      const float got = y.data<float>()[m * N + n];
      double tol = 1e-5 * l1;
      if (opts.round_out_bf16) {
        tol += std::fabs(ref) * std::ldexp(1.0, -8);
        if (round_bf16(got) != got || bits_of(got) != bits_of(round_bf16(y_plain.data<float>()[m * N + n]))) {
          if (++bad <= 5) ADD_FAILURE() << what << ": y[" << m << "," << n << "] = " << got << " is not bf16(fp32 y)";
          continue;
        }
      }
      if (!(std::fabs(got - ref) <= tol)) {
        if (++bad <= 5)
          ADD_FAILURE() << what << ": y[" << m << "," << n << "] = " << got << " want " << ref << " (L1 " << l1 << ")";
      }
    }
  EXPECT_EQ(bad, 0) << what;
}

void check_all_modes(const ops::QWeight& w, int64_t act_block, const std::string& name, uint32_t seed) {
  const int64_t K = w.w.size(1);
  for (int64_t M : kMs) {
    Tensor x = random_x(M, K, seed + static_cast<uint32_t>(M));
    for (int64_t aq : {int64_t{0}, act_block})
      for (bool round : {false, true}) {
        ops::LinearOpts o;
        o.act_quant_block = aq;
        o.round_out_bf16 = round;
        check_linear(
            x, w, o,
            name + " M=" + std::to_string(M) + " aq=" + std::to_string(aq) + (round ? " bf16-out" : " f32-out"));
      }
  }
}

}  // namespace

// ---- formats x paths x options ---------------------------------------------------------------------------
TEST(Linear, Fp8TileScaledPartialTiles) {
  // N and K not multiples of the 128 block: the last row/column tiles are partial.
  check_all_modes(fp8_weight(200, 384, 128, 1), 128, "fp8 200x384 B128", 100);
  check_all_modes(fp8_weight(200, 200, 128, 2), 128, "fp8 200x200 B128", 200);
}

TEST(Linear, Fp8SmallBlocksAndOddK) {
  check_all_modes(fp8_weight(70, 96, 32, 3), 32, "fp8 70x96 B32", 300);
  check_all_modes(fp8_weight(45, 203, 32, 4), 32, "fp8 45x203 B32", 400);  // K tail not a multiple of 8
  check_all_modes(fp8_weight(20, 100, 48, 5), 48, "fp8 20x100 B48", 500);
}

TEST(Linear, Fp8ManyPanelsAndTasks) { check_all_modes(fp8_weight(600, 256, 128, 6), 128, "fp8 600x256", 600); }

TEST(Linear, Fp8ExtremeScales) {
  // Scales above 2^7 (e > 134) and very small ones take the exact scalar fallback / subnormal-safe path.
  check_all_modes(fp8_weight(64, 256, 32, 7, 135, 150), 32, "fp8 big scales", 700);
  check_all_modes(fp8_weight(64, 256, 32, 8, 1, 20), 32, "fp8 tiny scales", 800);
}

TEST(Linear, Fp4Experts) {
  check_all_modes(fp4_weight(96, 256, 9), 128, "fp4 96x256", 900);
  check_all_modes(fp4_weight(33, 64, 10), 32, "fp4 33x64", 1000);
  check_all_modes(fp4_weight(21, 96, 10), 32, "fp4 21x96", 1050);  // an odd number of 32-blocks
  check_all_modes(fp4_weight(300, 512, 11), 128, "fp4 300x512", 1100);
}

TEST(Linear, Bf16Weights) {
  check_all_modes(bf16_weight(130, 300, 12), 128, "bf16 130x300", 1200);
  check_all_modes(bf16_weight(300, 64, 13), 32, "bf16 300x64", 1300);
}

TEST(Linear, F32Weights) {
  check_all_modes(f32_weight(50, 77, 14), 32, "f32 50x77", 1400);
  check_all_modes(f32_weight(260, 128, 15), 128, "f32 260x128", 1500);
}

// Decoding NaN codes and NaN scales gives NaN outputs exactly where the reference has them.
TEST(Linear, NanCodesAndScalesPropagate) {
  for (DType dt : {DType::kE4M3, DType::kE2M1x2}) {
    ops::QWeight w = dt == DType::kE4M3 ? fp8_weight(64, 128, 32, 16) : fp4_weight(64, 128, 16);
    if (dt == DType::kE4M3) w.w.data<uint8_t>()[5 * 128 + 70] = 0xff;                     // row 5
    w.scale.data<uint8_t>()[dt == DType::kE4M3 ? (40 / 32) * 4 + 1 : 40 * 4 + 1] = 0xff;  // row 40 (fp8: rows 32..63)
    for (int64_t M : kMs) {
      Tensor y = ops::linear(random_x(M, 128, 17), w, {});
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < 64; ++n) {
          const bool want_nan = (dt == DType::kE4M3 && (n == 5 || n >= 32)) || n == 40;
          EXPECT_EQ(std::isnan(y.data<float>()[m * 64 + n]), want_nan) << dtype_name(dt) << " M=" << M << " n=" << n;
        }
    }
  }
}

// The fused GEMV (M <= 24) and the panel GEMM (M > 24) agree row by row up to summation order.
TEST(Linear, GemvAndPanelPathsAgree) {
  const ops::QWeight ws[] = {fp8_weight(257, 512, 128, 18), fp4_weight(257, 512, 19), bf16_weight(257, 512, 20)};
  for (const auto& w : ws) {
    Tensor x = random_x(30, 512, 21);
    ops::LinearOpts o;
    o.act_quant_block = 128;
    Tensor y = ops::linear(x, w, o);
    const std::vector<float> xq = naive_act_quant(x, 128);
    const Tensor wd = ops::dequantize(w);
    for (int64_t m = 0; m < 30; ++m) {
      Tensor y1 = ops::linear(x.slice(0, m, m + 1), w, o);
      for (int64_t n = 0; n < 257; ++n) {
        double l1 = 0;  // the dot product's L1 magnitude bounds the summation-order difference
        for (int64_t k = 0; k < 512; ++k) l1 += std::fabs(double{wd.data<float>()[n * 512 + k]} * xq[m * 512 + k]);
        const float a = y.data<float>()[m * 257 + n], b = y1.data<float>()[n];
        EXPECT_NEAR(a, b, 1e-5 * l1) << dtype_name(w.w.dtype()) << " m=" << m << " n=" << n;
      }
    }
  }
}

// act_quant_block > 0 is exactly fake_quant_fp8 of x followed by the plain product.
TEST(Linear, ActQuantEqualsFakeQuantThenLinear) {
  const ops::QWeight w = fp8_weight(96, 256, 32, 22);
  for (int64_t M : kMs) {
    Tensor x = random_x(M, 256, 23);
    ops::LinearOpts o;
    o.act_quant_block = 32;
    Tensor y = ops::linear(x, w, o);
    Tensor xq = x.clone();
    ops::fake_quant_fp8(xq, 0, 256, 32);
    Tensor y2 = ops::linear(xq, w, {});
    for (int64_t i = 0; i < M * 96; ++i) ASSERT_EQ(bits_of(y.data<float>()[i]), bits_of(y2.data<float>()[i])) << i;
    // The input itself is left untouched.
    Tensor x2 = random_x(M, 256, 23);
    for (int64_t i = 0; i < M * 256; ++i) ASSERT_EQ(x.data<float>()[i], x2.data<float>()[i]);
  }
}

// Strided inputs and weights (row slices of larger buffers) give the same result as dense copies.
TEST(Linear, StridedInputsAndWeights) {
  Tensor big_x = random_x(30, 320, 24);
  Tensor x = big_x.slice(1, 0, 256);  // row stride 320
  ops::QWeight wbig = bf16_weight(40, 320, 25);
  ops::QWeight w;
  w.w = wbig.w.slice(1, 0, 256);
  ops::QWeight wd;
  wd.w = w.w.contiguous();
  ops::QWeight f8big = fp8_weight(40, 320, 32, 26);
  ops::QWeight f8;
  f8.block = 32;
  f8.w = f8big.w.slice(1, 0, 256);
  f8.scale = f8big.scale.slice(1, 0, 8);
  ops::QWeight f32big = f32_weight(40, 320, 27);
  ops::QWeight f32;
  f32.w = f32big.w.slice(1, 0, 256);
  ops::QWeight f32d;
  f32d.w = f32.w.contiguous();
  ops::QWeight f8d = f8;
  f8d.w = f8.w.contiguous();
  f8d.scale = f8.scale.contiguous();
  for (int64_t M : {int64_t{2}, int64_t{9}, int64_t{30}}) {
    Tensor xs = x.slice(0, 0, M);
    Tensor xd = xs.contiguous();
    for (auto [a, b] : {std::pair{&w, &wd}, std::pair{&f8, &f8d}, std::pair{&f32, &f32d}}) {
      Tensor y1 = ops::linear(xs, *a, {});
      Tensor y2 = ops::linear(xd, *b, {});
      for (int64_t i = 0; i < M * 40; ++i) EXPECT_EQ(y1.data<float>()[i], y2.data<float>()[i]) << i;
    }
  }
}

TEST(Linear, EmptyDimensions) {
  const ops::QWeight w = bf16_weight(16, 64, 27);
  Tensor y = ops::linear(Tensor::empty({0, 64}, DType::kF32), w, {});
  EXPECT_EQ(y.shape(), (Shape{0, 16}));
  ops::QWeight w0 = bf16_weight(16, 0, 28);
  Tensor y0 = ops::linear(Tensor::empty({3, 0}, DType::kF32), w0, {});
  ASSERT_EQ(y0.shape(), (Shape{3, 16}));
  for (int64_t i = 0; i < 48; ++i) EXPECT_EQ(y0.data<float>()[i], 0.0f);
}

// Grouped rows (the decode MoE): each row through its own expert, bit for bit the per-row linear; a
// row naming an expert outside the list is an error.
TEST(Linear, GroupedRowsEqualPerRowLinear) {
  const int64_t N = 48, K = 96, E = 5;
  std::vector<ops::QWeight> fp4, fp8;
  for (int64_t e = 0; e < E; ++e) {
    fp4.push_back(fp4_weight(N, K, 300 + static_cast<uint32_t>(e)));
    fp8.push_back(fp8_weight(N, K, 32, 400 + static_cast<uint32_t>(e)));
  }
  const int32_t ids[] = {0, 0, 2, 3, 3, 3, 4, 1};
  const int64_t R = 8;
  Tensor re = Tensor::empty({R}, DType::kI32);
  for (int64_t r = 0; r < R; ++r) re.data<int32_t>()[r] = ids[r];
  const Tensor x = random_x(R, K, 55);
  for (const auto* experts : {&fp4, &fp8}) {
    for (int64_t act : {int64_t{0}, int64_t{32}}) {
      const ops::LinearOpts o{act, act > 0};
      const Tensor y = ops::linear_grouped(x, re, *experts, o);
      ASSERT_EQ(y.shape(), (Shape{R, N}));
      for (int64_t r = 0; r < R; ++r) {
        const Tensor want = ops::linear(x.slice(0, r, r + 1), (*experts)[ids[r]], o);
        for (int64_t n = 0; n < N; ++n)
          ASSERT_EQ(bits_of(y.data<float>()[r * N + n]), bits_of(want.data<float>()[n])) << r;
      }
    }
  }
  re.data<int32_t>()[3] = static_cast<int32_t>(E);
  EXPECT_THROW(ops::linear_grouped(x, re, fp4, {}), Error);
}

// ---- dequantize ------------------------------------------------------------------------------------------
TEST(Dequantize, ExactForEveryFormat) {
  ops::QWeight nan8 = fp8_weight(40, 100, 32, 29);
  nan8.w.data<uint8_t>()[3] = 0x7f;
  const ops::QWeight ws[] = {fp8_weight(200, 384, 128, 30),
                             fp8_weight(45, 203, 32, 31, 120, 150),
                             nan8,
                             fp4_weight(70, 256, 32),
                             bf16_weight(33, 75, 33),
                             f32_weight(9, 10, 34)};
  for (const auto& w : ws) {
    Tensor d = ops::dequantize(w);
    const int64_t N = w.w.size(0), K = w.w.size(1);
    ASSERT_EQ(d.dtype(), DType::kF32);
    ASSERT_EQ(d.shape(), (Shape{N, K}));
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) {
        const double want = ref_w(w, n, k);
        const float got = d.data<float>()[n * K + k];
        if (std::isnan(want))
          ASSERT_TRUE(std::isnan(got)) << n << "," << k;
        else
          ASSERT_EQ(static_cast<double>(got), want) << dtype_name(w.w.dtype()) << " [" << n << "," << k << "]";
      }
  }
}

// ---- bad inputs ------------------------------------------------------------------------------------------
TEST(LinearErrors, BadShapesAndDtypesThrow) {
  const ops::QWeight f8 = fp8_weight(64, 128, 32, 35);
  const ops::QWeight f4 = fp4_weight(64, 128, 36);
  const ops::QWeight b16 = bf16_weight(64, 128, 37);
  Tensor x = random_x(2, 128, 38);

  EXPECT_THROW(ops::linear(random_x(2, 96, 39), f8, {}), Error);  // K mismatch
  EXPECT_THROW(ops::linear(random_x(2, 96, 39), b16, {}), Error);

  ops::QWeight no_scale = f8;
  no_scale.scale = Tensor();
  EXPECT_THROW(ops::linear(x, no_scale, {}), Error);
  EXPECT_THROW(ops::dequantize(no_scale), Error);
  ops::QWeight bad_shape = f8;
  bad_shape.scale = Tensor::zeros({2, 3}, DType::kE8M0);  // want [2, 4]
  EXPECT_THROW(ops::linear(x, bad_shape, {}), Error);
  ops::QWeight bad_dtype = f8;
  bad_dtype.scale = Tensor::zeros({2, 4}, DType::kU8);
  EXPECT_THROW(ops::linear(x, bad_dtype, {}), Error);
  ops::QWeight no_block = f8;
  no_block.block = 0;
  EXPECT_THROW(ops::linear(x, no_block, {}), Error);

  ops::QWeight f4_bad_scale = f4;
  f4_bad_scale.scale = Tensor::zeros({64, 8}, DType::kE8M0);  // want [64, 4]
  EXPECT_THROW(ops::linear(x, f4_bad_scale, {}), Error);
  ops::QWeight f4_odd_k;
  f4_odd_k.w = Tensor::zeros({8, 48}, DType::kE2M1x2);  // in = 48 is not a multiple of 32
  f4_odd_k.scale = Tensor::zeros({8, 1}, DType::kE8M0);
  EXPECT_THROW(ops::linear(random_x(1, 48, 40), f4_odd_k, {}), Error);

  ops::QWeight dense_with_scale = b16;
  dense_with_scale.scale = Tensor::zeros({2, 4}, DType::kE8M0);
  EXPECT_THROW(ops::linear(x, dense_with_scale, {}), Error);
  ops::QWeight int_weight;
  int_weight.w = Tensor::zeros({64, 128}, DType::kI8);
  EXPECT_THROW(ops::linear(x, int_weight, {}), Error);
  ops::QWeight undefined_weight;
  EXPECT_THROW(ops::linear(x, undefined_weight, {}), Error);
  ops::QWeight w3d;
  w3d.w = Tensor::zeros({2, 64, 128}, DType::kBF16);
  EXPECT_THROW(ops::linear(x, w3d, {}), Error);

  EXPECT_THROW(ops::linear(Tensor::zeros({2, 128}, DType::kBF16), b16, {}), Error);    // x not float32
  EXPECT_THROW(ops::linear(Tensor::zeros({1, 2, 128}, DType::kF32), b16, {}), Error);  // x not 2-D
  EXPECT_THROW(ops::linear(Tensor(), b16, {}), Error);
  ops::LinearOpts neg;
  neg.act_quant_block = -1;
  EXPECT_THROW(ops::linear(x, b16, neg), Error);

  std::vector<float> host(2 * 128);
  Tensor gx = Tensor::borrow(host.data(), {2, 128}, DType::kF32, nullptr, Device::kCUDA);
  EXPECT_THROW(ops::linear(gx, b16, {}), Error);
  ops::QWeight gw;
  std::vector<uint16_t> hw(64 * 128);
  gw.w = Tensor::borrow(hw.data(), {64, 128}, DType::kBF16, nullptr, Device::kCUDA);
  EXPECT_THROW(ops::linear(x, gw, {}), Error);
}

// The AVX-512VL build of the GEMV kernels (more registers, used for groups of >= 4 x rows where the
// CPU has it) must reproduce the AVX2 build bit for bit: same FP32 operations per output for every M.
TEST(Linear, WideKernelsBitwiseEqualAvx2Kernels) {
  struct Case {
    const char* name;
    ops::QWeight w;
  };
  std::vector<Case> cases;
  cases.push_back({"fp8 37x300 b128", fp8_weight(37, 300, 128, 11)});
  cases.push_back({"fp8 29x77 b16", fp8_weight(29, 77, 16, 12)});
  cases.push_back({"fp8 20x256 b128 extreme", fp8_weight(20, 256, 128, 13, 100, 255)});
  cases.push_back({"fp4 29x96", fp4_weight(29, 96, 14)});
  cases.push_back({"fp4 33x256", fp4_weight(33, 256, 15)});
  cases.push_back({"bf16 31x203", bf16_weight(31, 203, 16)});
  cases.push_back({"f32 23x203", f32_weight(23, 203, 17)});
  const int64_t ms[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 64};
  std::mt19937 rng(99);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const Case& c : cases) {
    const int64_t K = c.w.w.size(1);
    for (int64_t M : ms) {
      Tensor x = Tensor::empty({M, K}, DType::kF32);
      for (int64_t i = 0; i < M * K; ++i) x.data<float>()[i] = nd(rng);
      const bool prev = cpu::set_linear_wide_kernels(false);
      Tensor ref = ops::linear(x, c.w, {});
      cpu::set_linear_wide_kernels(true);
      Tensor got = ops::linear(x, c.w, {});
      cpu::set_linear_wide_kernels(prev);
      ASSERT_EQ(ref.numel(), got.numel());
      for (int64_t i = 0; i < ref.numel(); ++i)
        ASSERT_EQ(bits_of(ref.data<float>()[i]), bits_of(got.data<float>()[i])) << c.name << " M=" << M << " at " << i;
    }
  }
}
