// CPU fake quantisation (docs/v4-architecture.md §3, "QAT fake-quantization") and bf16 rounding.
//
// Every function works in place on float32 rows: the last dimension must have stride 1, the
// leading dimensions may be strided (rows of a slice). Groups of `block` columns are formed from
// the start of the range; a range whose width is not a multiple of `block` ends in a shorter group.
//
// Rounding onto the e4m3 / e2m1 grids uses the "magic number" form of round-to-nearest-even: with
// a in [2^E, 2^(E+1)) and the format keeping p mantissa bits, (a + 2^(E+23-p)) - 2^(E+23-p) is a
// rounded to a multiple of 2^(E-p) in the current (nearest-even) mode. Clamping E at the format's
// smallest normal exponent gives its subnormal grid. It agrees with f32_to_e4m3 / f32_to_e2m1 for
// every clamped input (tests/cpp/test_quant.cpp checks this exhaustively over a dense range).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu/cpu_ops.h"
#include "deepinfer/error.h"

namespace deepinfer::cpu {

namespace {

inline uint32_t fbits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bitsf(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// RNE onto the e4m3 grid for |v| <= 448 (callers clamp first). Sign (and -0) preserved.
inline float round_e4m3_grid(float v) {
  const uint32_t u = fbits(v);
  const uint32_t sign = u & 0x80000000u;
  const uint32_t a = u & 0x7fffffffu;
  const uint32_t ea = std::max(a & 0x7f800000u, 121u << 23);  // exponent >= -6 (smallest normal)
  const float magic = bitsf(ea + (20u << 23));                // 2^(E + 20): ulp 2^(E-3)
  const float r = (bitsf(a) + magic) - magic;
  return bitsf(fbits(r) | sign);
}

// RNE onto the e2m1 grid {0, .5, 1, 1.5, 2, 3, 4, 6} for |v| <= 6. Sign preserved.
inline float round_e2m1_grid(float v) {
  const uint32_t u = fbits(v);
  const uint32_t sign = u & 0x80000000u;
  const uint32_t a = u & 0x7fffffffu;
  const uint32_t ea = std::max(a & 0x7f800000u, 127u << 23);  // exponent >= 0 (smallest normal)
  const float magic = bitsf(ea + (22u << 23));                // 2^(E + 22): ulp 2^(E-1)
  const float r = (bitsf(a) + magic) - magic;
  return bitsf(fbits(r) | sign);
}

bool have_avx2() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
}

#define DI_AVX2 __attribute__((target("avx2,fma")))

DI_AVX2 inline __m256 round_e4m3_grid8(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i sign = _mm256_and_si256(u, _mm256_set1_epi32(static_cast<int>(0x80000000u)));
  const __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
  const __m256i ea = _mm256_max_epi32(_mm256_and_si256(a, _mm256_set1_epi32(0x7f800000)), _mm256_set1_epi32(121 << 23));
  const __m256 magic = _mm256_castsi256_ps(_mm256_add_epi32(ea, _mm256_set1_epi32(20 << 23)));
  const __m256 r = _mm256_sub_ps(_mm256_add_ps(_mm256_castsi256_ps(a), magic), magic);
  return _mm256_or_ps(r, _mm256_castsi256_ps(sign));
}

DI_AVX2 inline __m256 round_e2m1_grid8(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i sign = _mm256_and_si256(u, _mm256_set1_epi32(static_cast<int>(0x80000000u)));
  const __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
  const __m256i ea = _mm256_max_epi32(_mm256_and_si256(a, _mm256_set1_epi32(0x7f800000)), _mm256_set1_epi32(127 << 23));
  const __m256 magic = _mm256_castsi256_ps(_mm256_add_epi32(ea, _mm256_set1_epi32(22 << 23)));
  const __m256 r = _mm256_sub_ps(_mm256_add_ps(_mm256_castsi256_ps(a), magic), magic);
  return _mm256_or_ps(r, _mm256_castsi256_ps(sign));
}

// ---- group amax ----------------------------------------------------------------------------------
float amax_scalar(const float* p, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(p[i]));
  return m;
}

DI_AVX2 float amax_avx2(const float* p, int64_t n) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 m0 = _mm256_setzero_ps(), m1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    m0 = _mm256_max_ps(m0, _mm256_and_ps(_mm256_loadu_ps(p + i), abs_mask));
    m1 = _mm256_max_ps(m1, _mm256_and_ps(_mm256_loadu_ps(p + i + 8), abs_mask));
  }
  for (; i + 8 <= n; i += 8) m0 = _mm256_max_ps(m0, _mm256_and_ps(_mm256_loadu_ps(p + i), abs_mask));
  m0 = _mm256_max_ps(m0, m1);
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m0), _mm256_extractf128_ps(m0, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
  float m = _mm_cvtss_f32(h);
  for (; i < n; ++i) m = std::max(m, std::fabs(p[i]));
  return m;
}

inline float group_amax(const float* p, int64_t n) { return have_avx2() ? amax_avx2(p, n) : amax_scalar(p, n); }

// ---- per-group quantisers: p[0..n) in place ---------------------------------------------------------
// FP8: s is a power of two, so x/s == x * (1/s) exactly (both are the correctly rounded quotient).
void fp8_group_scalar(float* p, int64_t n, float s) {
  const float inv = 1.0f / s;
  for (int64_t i = 0; i < n; ++i) {
    const float v = std::clamp(p[i] * inv, -448.0f, 448.0f);
    p[i] = round_e4m3_grid(v) * s;
  }
}

DI_AVX2 void fp8_group_avx2(float* p, int64_t n, float s) {
  const float inv = 1.0f / s;
  const __m256 vinv = _mm256_set1_ps(inv), vs = _mm256_set1_ps(s);
  const __m256 lo = _mm256_set1_ps(-448.0f), hi = _mm256_set1_ps(448.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_mul_ps(_mm256_loadu_ps(p + i), vinv);
    v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
    _mm256_storeu_ps(p + i, _mm256_mul_ps(round_e4m3_grid8(v), vs));
  }
  if (i < n) fp8_group_scalar(p + i, n - i, s);
}

void fp4_group_scalar(float* p, int64_t n, float s) {
  const float inv = 1.0f / s;
  for (int64_t i = 0; i < n; ++i) {
    const float v = std::clamp(p[i] * inv, -6.0f, 6.0f);
    p[i] = round_e2m1_grid(v) * s;
  }
}

DI_AVX2 void fp4_group_avx2(float* p, int64_t n, float s) {
  const float inv = 1.0f / s;
  const __m256 vinv = _mm256_set1_ps(inv), vs = _mm256_set1_ps(s);
  const __m256 lo = _mm256_set1_ps(-6.0f), hi = _mm256_set1_ps(6.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_mul_ps(_mm256_loadu_ps(p + i), vinv);
    v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
    _mm256_storeu_ps(p + i, _mm256_mul_ps(round_e2m1_grid8(v), vs));
  }
  if (i < n) fp4_group_scalar(p + i, n - i, s);
}

// E4M3-scaled FP4: s is not a power of two, so the quotient is a true fp32 division.
void fp4e_group_scalar(float* p, int64_t n, float s) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = std::clamp(p[i] / s, -6.0f, 6.0f);
    p[i] = round_e2m1_grid(v) * s;
  }
}

DI_AVX2 void fp4e_group_avx2(float* p, int64_t n, float s) {
  const __m256 vs = _mm256_set1_ps(s);
  const __m256 lo = _mm256_set1_ps(-6.0f), hi = _mm256_set1_ps(6.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_div_ps(_mm256_loadu_ps(p + i), vs);
    v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
    _mm256_storeu_ps(p + i, _mm256_mul_ps(round_e2m1_grid8(v), vs));
  }
  if (i < n) fp4e_group_scalar(p + i, n - i, s);
}

void bf16_row_scalar(float* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i) p[i] = ::deepinfer::round_bf16(p[i]);
}

// f32 -> bf16 grid with RNE; NaN stays NaN (quiet), as deepinfer::f32_to_bf16.
DI_AVX2 void bf16_row_avx2(float* p, int64_t n) {
  const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff);
  const __m256i keep = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  const __m256i quiet = _mm256_set1_epi32(0x00400000);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 f = _mm256_loadu_ps(p + i);
    const __m256i u = _mm256_castps_si256(f);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
    __m256i r = _mm256_and_si256(_mm256_add_epi32(u, _mm256_add_epi32(bias, lsb)), keep);
    const __m256 nan = _mm256_cmp_ps(f, f, _CMP_UNORD_Q);
    const __m256i qn = _mm256_and_si256(_mm256_or_si256(u, quiet), keep);
    r = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(qn), nan));
    _mm256_storeu_ps(p + i, _mm256_castsi256_ps(r));
  }
  if (i < n) bf16_row_scalar(p + i, n - i);
}

// ---- row iteration ---------------------------------------------------------------------------------
struct Rows {
  std::vector<float*> ptr;
  int64_t cols = 0;
};

Rows float_rows(Tensor& x, const char* op) {
  DI_CHECK(x.defined(), "{}: the tensor is undefined", op);
  DI_CHECK(x.device() == Device::kCPU, "{}: only the CPU backend exists so far, got {}", op, x.describe());
  DI_CHECK(x.dtype() == DType::kF32, "{}: expected a float32 tensor, got {}", op, x.describe());
  DI_CHECK(x.dim() >= 1, "{}: expected at least one dimension, got {}", op, x.describe());
  const int nd = x.dim();
  Rows r;
  r.cols = x.size(nd - 1);
  DI_CHECK(r.cols <= 1 || x.strides()[nd - 1] == 1, "{}: the last dimension must be dense (stride 1), got {}", op,
           x.describe());
  int64_t nrows = 1;
  for (int d = 0; d < nd - 1; ++d) nrows *= x.size(d);
  if (nrows == 0 || r.cols == 0) return r;
  r.ptr.reserve(static_cast<size_t>(nrows));
  float* base = x.data<float>();
  std::vector<int64_t> idx(static_cast<size_t>(nd), 0);
  for (int64_t i = 0; i < nrows; ++i) {
    int64_t off = 0;
    for (int d = 0; d < nd - 1; ++d) off += idx[d] * x.strides()[d];
    r.ptr.push_back(base + off);
    for (int d = nd - 2; d >= 0; --d) {
      if (++idx[d] < x.size(d)) break;
      idx[d] = 0;
    }
  }
  return r;
}

// Runs fn(row, cols) over every row, in parallel when there is enough work.
template <typename Fn>
void for_rows(const Rows& r, Fn&& fn) {
  const int64_t n = static_cast<int64_t>(r.ptr.size());
  const bool par = n > 1 && n * r.cols >= (int64_t{1} << 15);
#pragma omp parallel for schedule(static) if (par)
  for (int64_t i = 0; i < n; ++i) fn(r.ptr[i], r.cols);
}

void check_block(int64_t block, const char* op) {
  DI_CHECK(block > 0, "{}: block must be positive, got {}", op, block);
}

}  // namespace

void fake_quant_fp8(Tensor& x, int64_t col_begin, int64_t col_end, int64_t block) {
  check_block(block, "fake_quant_fp8");
  Rows r = float_rows(x, "fake_quant_fp8");
  DI_CHECK(0 <= col_begin && col_begin <= col_end && col_end <= r.cols,
           "fake_quant_fp8: column range [{}, {}) is outside the {} columns of {}", col_begin, col_end, r.cols,
           x.describe());
  const bool avx2 = have_avx2();
  for_rows(r, [&](float* row, int64_t) {
    for (int64_t g = col_begin; g < col_end; g += block) {
      const int64_t n = std::min(block, col_end - g);
      const float amax = std::max(group_amax(row + g, n), 1e-4f);
      const float s = ue8m0_scale(amax, 448.0f);
      if (avx2)
        fp8_group_avx2(row + g, n, s);
      else
        fp8_group_scalar(row + g, n, s);
    }
  });
}

void fake_quant_fp4(Tensor& x, int64_t block) {
  check_block(block, "fake_quant_fp4");
  Rows r = float_rows(x, "fake_quant_fp4");
  const bool avx2 = have_avx2();
  const float floor = 6.0f * std::ldexp(1.0f, -126);
  for_rows(r, [&](float* row, int64_t cols) {
    for (int64_t g = 0; g < cols; g += block) {
      const int64_t n = std::min(block, cols - g);
      const float amax = std::max(group_amax(row + g, n), floor);
      const float s = ue8m0_scale(amax, 6.0f);
      if (avx2)
        fp4_group_avx2(row + g, n, s);
      else
        fp4_group_scalar(row + g, n, s);
    }
  });
}

void fake_quant_fp4_e4m3_scale(Tensor& x, int64_t block) {
  check_block(block, "fake_quant_fp4_e4m3_scale");
  Rows r = float_rows(x, "fake_quant_fp4_e4m3_scale");
  const bool avx2 = have_avx2();
  const float floor = 6.0f * std::ldexp(1.0f, -9);
  for_rows(r, [&](float* row, int64_t cols) {
    for (int64_t g = 0; g < cols; g += block) {
      const int64_t n = std::min(block, cols - g);
      const float amax = std::max(group_amax(row + g, n), floor);
      // amax * fp32(1/6) as the kernels form it; for bf16 amax it picks the same e4m3 scale as amax / 6
      // (checked for every fp32 amax in [6*2^-9, 2^11): only 15 non-bf16 values differ).
      const float s = e4m3_to_f32(f32_to_e4m3(amax * (1.0f / 6.0f)));
      if (avx2)
        fp4e_group_avx2(row + g, n, s);
      else
        fp4e_group_scalar(row + g, n, s);
    }
  });
}

void round_bf16(Tensor& x, bool enable) {
  if (!enable) return;
  Rows r = float_rows(x, "round_bf16");
  const bool avx2 = have_avx2();
  for_rows(r, [&](float* row, int64_t cols) {
    if (avx2)
      bf16_row_avx2(row, cols);
    else
      bf16_row_scalar(row, cols);
  });
}

}  // namespace deepinfer::cpu
