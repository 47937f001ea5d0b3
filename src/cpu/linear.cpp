// CPU linear layer: y[M, N] = x[M, K] . W^T in FP32 for BF16, F32, FP8 (E4M3 + E8M0 tile scales)
// and FP4 (packed E2M1 + E8M0 per-32 scales) weights (docs/v4-architecture.md §2.1, §3).
//
// Numerics. Every weight format dequantises exactly into fp32 (e4m3 / e2m1 values times powers of
// two), so the product with the exact dequantised weight equals the reference's per-block FP32
// partial sums up to the order of FP32 additions.
//
// Two paths, which differ in summation order only:
//  * M < 8 (decode): a fused dequant-dot GEMV that reads the codes directly. Each weight element is
//    decoded in registers (e4m3: sign-extend, shift into the fp32 exponent/mantissa, one multiply by
//    2^(e-7) = 2^120 * tile scale, which also rebiases the exponent and covers e4m3 subnormals; e2m1:
//    a 16-entry pshufb table of 2*value as int8, one multiply by 2^(e-128); bf16: shift), multiplied
//    into M rows of x with FMAs, parallel over output rows with OpenMP. FP4 reads x in a per-32-block
//    even/odd permuted copy so the low/high nibbles need no interleaving.
//  * M >= 8 (prefill): panels of W (up to 256 rows x K, at most 4 MiB of fp32) are dequantised into a
//    reused thread-local buffer (OpenMP over the panel's rows) and multiplied with cblas_sgemm from
//    the calling thread (OpenBLAS runs its own pool; it is never called inside an OpenMP region).
//  * F32 weights go straight to cblas_sgemm / cblas_sgemv.
// Rare cases take exact scalar code: an e4m3 NaN code (checked per 32 bytes) and tile scales above
// 2^7 (whose 2^(e-7) factor would not fit fp32).
#include <cblas.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "deepinfer/error.h"
#include "ops/ops.h"

namespace deepinfer::ops {

namespace {

#define DI_AVX2 __attribute__((target("avx2,fma")))

constexpr int64_t kGemvMaxM = 7;           // M <= this takes the fused GEMV
constexpr int64_t kPanelMaxRows = 256;     // rows of W per dequantised panel
constexpr int64_t kPanelMaxFloats = 1 << 20;  // 4 MiB of fp32 per panel

bool have_avx2() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
}

struct Luts {
  float e4m3[256];        // exact e4m3 values (NaN codes decode to NaN)
  float e2m1[16];         // exact e2m1 values
  float e8m0[256];        // 2^(e-127), NaN for 0xFF
  float fp8_factor[256];  // 2^(e-7) = 2^120 * 2^(e-127) for e <= 134 (the raw e4m3 decode is x 2^-120); 0: slow path
  float fp4_factor[256];  // 2^(e-128) = 0.5 * 2^(e-127) (the pshufb decode gives 2 * e2m1); NaN for 0xFF
};

const Luts& luts() {
  static const Luts t = [] {
    Luts l{};
    for (int c = 0; c < 256; ++c) l.e4m3[c] = e4m3_to_f32(static_cast<uint8_t>(c));
    for (int c = 0; c < 16; ++c) l.e2m1[c] = e2m1_to_f32(static_cast<uint8_t>(c));
    for (int e = 0; e < 256; ++e) {
      l.e8m0[e] = e8m0_to_f32(static_cast<uint8_t>(e));
      l.fp8_factor[e] = e <= 134 ? std::ldexp(1.0f, e - 7) : 0.0f;
      l.fp4_factor[e] = e == 255 ? std::nanf("") : std::ldexp(1.0f, e - 128);
    }
    return l;
  }();
  return t;
}

// A validated, raw view of a weight. Row strides are in bytes (weights) / elements (scales).
struct WView {
  DType dt = DType::kF32;
  int64_t N = 0, K = 0;
  const uint8_t* w = nullptr;
  int64_t ldw = 0;  // bytes between weight rows
  const uint8_t* s = nullptr;
  int64_t lds = 0;  // bytes between scale rows
  int64_t B = 0;    // e4m3 tile size
  int64_t KB = 0;   // scale columns
};

WView make_view(const QWeight& qw, const char* op) {
  const Tensor& w = qw.w;
  DI_CHECK(w.defined(), "{}: the weight tensor is undefined", op);
  DI_CHECK(w.device() == Device::kCPU, "{}: only the CPU backend exists so far, got weight {}", op, w.describe());
  DI_CHECK(w.dim() == 2, "{}: the weight must be 2-D [out, in], got {}", op, w.describe());
  WView v;
  v.dt = w.dtype();
  v.N = w.size(0);
  v.K = w.size(1);
  const bool dense_rows = v.K <= 1 || w.strides()[1] == 1;
  DI_CHECK(dense_rows && w.strides()[0] >= v.K, "{}: the weight's rows must be dense (stride 1 along in), got {}",
           op, w.describe());
  const int64_t esize = dtype_bits(v.dt) / 8;
  v.w = static_cast<const uint8_t*>(w.raw());
  v.ldw = w.strides()[0] * esize;

  auto check_scale = [&](int64_t rows, int64_t cols, const char* layout) {
    const Tensor& s = qw.scale;
    DI_CHECK(s.defined(), "{}: a {} weight needs an E8M0 scale {}, but none was given", op, dtype_name(v.dt), layout);
    DI_CHECK(s.device() == Device::kCPU, "{}: scale on {}, expected cpu", op, s.describe());
    DI_CHECK(s.dtype() == DType::kE8M0, "{}: the scale of a {} weight must be float8_e8m0, got {}", op,
             dtype_name(v.dt), s.describe());
    DI_CHECK(s.dim() == 2 && s.size(0) == rows && s.size(1) == cols,
             "{}: scale shape {} does not match weight {}: expected {} = [{}, {}]", op, shape_str(s.shape()),
             w.describe(), layout, rows, cols);
    DI_CHECK((cols <= 1 || s.strides()[1] == 1) && s.strides()[0] >= cols,
             "{}: the scale's rows must be dense, got {}", op, s.describe());
    v.s = static_cast<const uint8_t*>(s.raw());
    v.lds = s.strides()[0];
    v.KB = cols;
  };

  switch (v.dt) {
    case DType::kF32:
    case DType::kBF16:
      DI_CHECK(!qw.scale.defined(), "{}: a {} weight takes no scale, got {}", op, dtype_name(v.dt),
               qw.scale.describe());
      break;
    case DType::kE4M3: {
      DI_CHECK(qw.block > 0, "{}: an E4M3 weight needs a positive tile size (QWeight::block), got {}", op, qw.block);
      v.B = qw.block;
      check_scale((v.N + v.B - 1) / v.B, (v.K + v.B - 1) / v.B, "[ceil(out/block), ceil(in/block)]");
      break;
    }
    case DType::kE2M1x2:
      DI_CHECK(v.K % 32 == 0, "{}: an FP4 weight's in-dimension must be a multiple of 32, got {}", op,
               w.describe());
      DI_CHECK(w.is_contiguous(), "{}: a packed FP4 weight must be contiguous, got {}", op, w.describe());
      v.ldw = v.K / 2;
      check_scale(v.N, v.K / 32, "[out, in/32]");
      break;
    default:
      fail("{}: unsupported weight dtype {} (expected bfloat16, float32, float8_e4m3 or packed float4_e2m1)", op,
           w.describe());
  }
  return v;
}

// ---- SIMD decoders ---------------------------------------------------------------------------------
// 8 e4m3 codes -> fp32 values times 2^-120 (sign | exponent/mantissa bits at 20..26). Exact, including
// e4m3 subnormals (they become fp32 subnormals); NaN codes are not handled here.
DI_AVX2 inline __m256 e4m3_raw8(const uint8_t* p) {
  const __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(
      _mm256_and_si256(_mm256_slli_epi32(v, 20), _mm256_set1_epi32(static_cast<int>(0x87f00000u))));
}

// True when any of the 32 codes at p is an e4m3 NaN (S.1111.111).
DI_AVX2 inline bool e4m3_has_nan32(const uint8_t* p) {
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i m = _mm256_set1_epi8(0x7f);
  return _mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_and_si256(b, m), m)) != 0;
}
DI_AVX2 inline bool e4m3_has_nan8(const uint8_t* p) {
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  const __m128i m = _mm_set1_epi8(0x7f);
  return (_mm_movemask_epi8(_mm_cmpeq_epi8(_mm_and_si128(b, m), m)) & 0xff) != 0;
}

// 16 packed e2m1 bytes (32 codes) -> 2 * value as int8: lo[i] = code of k = 2i, hi[i] = k = 2i + 1.
DI_AVX2 inline void e2m1_nibbles(const uint8_t* p, __m128i& lo, __m128i& hi) {
  const __m128i table = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  lo = _mm_shuffle_epi8(table, _mm_and_si128(b, mask));
  hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(b, 4), mask));
}
DI_AVX2 inline __m256 i8x8_to_ps(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }

DI_AVX2 inline __m256 bf16x8(const uint16_t* p) {
  const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

DI_AVX2 inline float hsum(__m256 v) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
  return _mm_cvtss_f32(h);
}

// ---- panel dequantisation: rows [n0, n1) of W into out[(n - n0) * K + k] ----------------------------
void dequant_row_scalar(const WView& w, int64_t n, float* out) {
  const Luts& L = luts();
  const uint8_t* wr = w.w + n * w.ldw;
  switch (w.dt) {
    case DType::kF32:
      std::memcpy(out, wr, static_cast<size_t>(w.K) * 4);
      break;
    case DType::kBF16: {
      const uint16_t* p = reinterpret_cast<const uint16_t*>(wr);
      for (int64_t k = 0; k < w.K; ++k) out[k] = bf16_to_f32(p[k]);
      break;
    }
    case DType::kE4M3: {
      const uint8_t* sr = w.s + (n / w.B) * w.lds;
      for (int64_t k = 0; k < w.K; ++k) out[k] = L.e4m3[wr[k]] * L.e8m0[sr[k / w.B]];
      break;
    }
    case DType::kE2M1x2: {
      const uint8_t* sr = w.s + n * w.lds;
      for (int64_t k = 0; k < w.K; k += 2) {
        const float s = L.e8m0[sr[k / 32]];
        out[k] = L.e2m1[wr[k / 2] & 15] * s;
        out[k + 1] = L.e2m1[wr[k / 2] >> 4] * s;
      }
      break;
    }
    default:
      break;
  }
}

DI_AVX2 void dequant_row_avx2(const WView& w, int64_t n, float* out) {
  const Luts& L = luts();
  const uint8_t* wr = w.w + n * w.ldw;
  switch (w.dt) {
    case DType::kBF16: {
      const uint16_t* p = reinterpret_cast<const uint16_t*>(wr);
      int64_t k = 0;
      for (; k + 8 <= w.K; k += 8) _mm256_storeu_ps(out + k, bf16x8(p + k));
      for (; k < w.K; ++k) out[k] = bf16_to_f32(p[k]);
      break;
    }
    case DType::kE4M3: {
      const uint8_t* sr = w.s + (n / w.B) * w.lds;
      for (int64_t kb = 0; kb < w.KB; ++kb) {
        const int64_t k0 = kb * w.B, k1 = std::min(k0 + w.B, w.K);
        const uint8_t e = sr[kb];
        const float fac = L.fp8_factor[e], s = L.e8m0[e];
        int64_t k = k0;
        if (fac != 0.0f) {
          const __m256 vf = _mm256_set1_ps(fac);
          for (; k + 32 <= k1; k += 32) {
            if (e4m3_has_nan32(wr + k)) {
              for (int64_t j = k; j < k + 32; ++j) out[j] = L.e4m3[wr[j]] * s;
              continue;
            }
            _mm256_storeu_ps(out + k, _mm256_mul_ps(e4m3_raw8(wr + k), vf));
            _mm256_storeu_ps(out + k + 8, _mm256_mul_ps(e4m3_raw8(wr + k + 8), vf));
            _mm256_storeu_ps(out + k + 16, _mm256_mul_ps(e4m3_raw8(wr + k + 16), vf));
            _mm256_storeu_ps(out + k + 24, _mm256_mul_ps(e4m3_raw8(wr + k + 24), vf));
          }
          for (; k + 8 <= k1 && !e4m3_has_nan8(wr + k); k += 8)
            _mm256_storeu_ps(out + k, _mm256_mul_ps(e4m3_raw8(wr + k), vf));
        }
        for (; k < k1; ++k) out[k] = L.e4m3[wr[k]] * s;
      }
      break;
    }
    case DType::kE2M1x2: {
      const uint8_t* sr = w.s + n * w.lds;
      for (int64_t kb = 0; kb < w.K / 32; ++kb) {
        __m128i lo, hi;
        e2m1_nibbles(wr + kb * 16, lo, hi);
        const __m128i a = _mm_unpacklo_epi8(lo, hi), b = _mm_unpackhi_epi8(lo, hi);  // natural k order
        const __m256 vf = _mm256_set1_ps(L.fp4_factor[sr[kb]]);
        float* o = out + kb * 32;
        _mm256_storeu_ps(o, _mm256_mul_ps(i8x8_to_ps(a), vf));
        _mm256_storeu_ps(o + 8, _mm256_mul_ps(i8x8_to_ps(_mm_srli_si128(a, 8)), vf));
        _mm256_storeu_ps(o + 16, _mm256_mul_ps(i8x8_to_ps(b), vf));
        _mm256_storeu_ps(o + 24, _mm256_mul_ps(i8x8_to_ps(_mm_srli_si128(b, 8)), vf));
      }
      break;
    }
    default:
      dequant_row_scalar(w, n, out);
  }
}

// Dequantises rows [n0, n1) into out (row stride K), in parallel over rows when worthwhile.
void dequant_rows(const WView& w, int64_t n0, int64_t n1, float* out) {
  const bool avx2 = have_avx2();
  const bool par = (n1 - n0) > 1 && (n1 - n0) * w.K >= (int64_t{1} << 16);
#pragma omp parallel for schedule(static) if (par)
  for (int64_t n = n0; n < n1; ++n) {
    float* o = out + (n - n0) * w.K;
    if (avx2) dequant_row_avx2(w, n, o);
    else dequant_row_scalar(w, n, o);
  }
}

// ---- fused GEMV kernels: rows [n0, n1) of y[m * ldy + n] for M rows of x ---------------------------
// Independent accumulators per x row, enough to hide the FMA latency without spilling.
template <int M>
constexpr int kAcc = M <= 2 ? 4 : (M <= 4 ? 2 : 1);

template <int M>
struct Accum {
  __m256 v[M][kAcc<M>];
  float tail[M];
};

template <int M>
DI_AVX2 inline void acc_zero(Accum<M>& a) {
  for (int m = 0; m < M; ++m) {
    for (int j = 0; j < kAcc<M>; ++j) a.v[m][j] = _mm256_setzero_ps();
    a.tail[m] = 0.0f;
  }
}

// acc[m] += w0..w3 . x[m][k .. k+32)
template <int M>
DI_AVX2 inline void fma32(Accum<M>& a, const float* x, int64_t ldx, int64_t k, __m256 w0, __m256 w1, __m256 w2,
                          __m256 w3) {
  constexpr int A = kAcc<M>;
  for (int m = 0; m < M; ++m) {
    const float* xm = x + m * ldx + k;
    a.v[m][0 % A] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xm), a.v[m][0 % A]);
    a.v[m][1 % A] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xm + 8), a.v[m][1 % A]);
    a.v[m][2 % A] = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xm + 16), a.v[m][2 % A]);
    a.v[m][3 % A] = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xm + 24), a.v[m][3 % A]);
  }
}

template <int M>
DI_AVX2 inline void acc_store(Accum<M>& a, float* y, int64_t ldy, int64_t n) {
  for (int m = 0; m < M; ++m) {
    __m256 s = a.v[m][0];
    for (int j = 1; j < kAcc<M>; ++j) s = _mm256_add_ps(s, a.v[m][j]);
    y[m * ldy + n] = hsum(s) + a.tail[m];
  }
}

template <int M>
DI_AVX2 void gemv_fp8(const WView& w, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t n0, int64_t n1) {
  const Luts& L = luts();
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* wr = w.w + n * w.ldw;
    const uint8_t* sr = w.s + (n / w.B) * w.lds;
    Accum<M> a;
    acc_zero(a);
    auto scalar = [&](int64_t k0, int64_t k1, float s) {
      for (int64_t k = k0; k < k1; ++k) {
        const float wv = L.e4m3[wr[k]] * s;
        for (int m = 0; m < M; ++m) a.tail[m] += wv * x[m * ldx + k];
      }
    };
    for (int64_t kb = 0; kb < w.KB; ++kb) {
      const int64_t k0 = kb * w.B, k1 = std::min(k0 + w.B, w.K);
      const uint8_t e = sr[kb];
      const float fac = L.fp8_factor[e];
      if (fac == 0.0f) {  // scale > 2^7 or NaN: exact scalar products
        scalar(k0, k1, L.e8m0[e]);
        continue;
      }
      const __m256 vf = _mm256_set1_ps(fac);
      int64_t k = k0;
      for (; k + 32 <= k1; k += 32) {
        if (e4m3_has_nan32(wr + k)) {
          scalar(k, k + 32, L.e8m0[e]);
          continue;
        }
        const __m256 w0 = _mm256_mul_ps(e4m3_raw8(wr + k), vf);
        const __m256 w1 = _mm256_mul_ps(e4m3_raw8(wr + k + 8), vf);
        const __m256 w2 = _mm256_mul_ps(e4m3_raw8(wr + k + 16), vf);
        const __m256 w3 = _mm256_mul_ps(e4m3_raw8(wr + k + 24), vf);
        fma32<M>(a, x, ldx, k, w0, w1, w2, w3);
      }
      for (; k + 8 <= k1 && !e4m3_has_nan8(wr + k); k += 8) {
        const __m256 w0 = _mm256_mul_ps(e4m3_raw8(wr + k), vf);
        for (int m = 0; m < M; ++m)
          a.v[m][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + m * ldx + k), a.v[m][0]);
      }
      scalar(k, k1, L.e8m0[e]);
    }
    acc_store(a, y, ldy, n);
  }
}

// x is the per-32-block permuted copy: [k even 0..14 | even 16..30 | odd 1..15 | odd 17..31].
template <int M>
DI_AVX2 void gemv_fp4(const WView& w, const float* xp, int64_t ldx, float* y, int64_t ldy, int64_t n0, int64_t n1) {
  const Luts& L = luts();
  const int64_t nblk = w.K / 32;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* wr = w.w + n * w.ldw;
    const uint8_t* sr = w.s + n * w.lds;
    Accum<M> a;
    acc_zero(a);
    for (int64_t kb = 0; kb < nblk; ++kb) {
      __m128i lo, hi;
      e2m1_nibbles(wr + kb * 16, lo, hi);
      const __m256 vf = _mm256_set1_ps(L.fp4_factor[sr[kb]]);
      const __m256 w0 = _mm256_mul_ps(i8x8_to_ps(lo), vf);
      const __m256 w1 = _mm256_mul_ps(i8x8_to_ps(_mm_srli_si128(lo, 8)), vf);
      const __m256 w2 = _mm256_mul_ps(i8x8_to_ps(hi), vf);
      const __m256 w3 = _mm256_mul_ps(i8x8_to_ps(_mm_srli_si128(hi, 8)), vf);
      fma32<M>(a, xp, ldx, kb * 32, w0, w1, w2, w3);
    }
    acc_store(a, y, ldy, n);
  }
}

template <int M>
DI_AVX2 void gemv_bf16(const WView& w, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    const uint16_t* wr = reinterpret_cast<const uint16_t*>(w.w + n * w.ldw);
    Accum<M> a;
    acc_zero(a);
    int64_t k = 0;
    for (; k + 32 <= w.K; k += 32)
      fma32<M>(a, x, ldx, k, bf16x8(wr + k), bf16x8(wr + k + 8), bf16x8(wr + k + 16), bf16x8(wr + k + 24));
    for (; k + 8 <= w.K; k += 8) {
      const __m256 w0 = bf16x8(wr + k);
      for (int m = 0; m < M; ++m) a.v[m][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + m * ldx + k), a.v[m][0]);
    }
    for (; k < w.K; ++k) {
      const float wv = bf16_to_f32(wr[k]);
      for (int m = 0; m < M; ++m) a.tail[m] += wv * x[m * ldx + k];
    }
    acc_store(a, y, ldy, n);
  }
}

template <int M>
void gemv_rows(const WView& w, const float* x, int64_t ldx, float* y, int64_t n0, int64_t n1) {
  switch (w.dt) {
    case DType::kE4M3: gemv_fp8<M>(w, x, ldx, y, w.N, n0, n1); break;
    case DType::kE2M1x2: gemv_fp4<M>(w, x, ldx, y, w.N, n0, n1); break;
    case DType::kBF16: gemv_bf16<M>(w, x, ldx, y, w.N, n0, n1); break;
    default: break;
  }
}

void gemv(const WView& w, const float* x, int64_t M, float* y) {
  std::vector<float> xperm;
  if (w.dt == DType::kE2M1x2) {  // even/odd split per 32-block, matching the nibble decode order
    xperm.resize(static_cast<size_t>(M * w.K));
    for (int64_t m = 0; m < M; ++m)
      for (int64_t kb = 0; kb < w.K / 32; ++kb) {
        const float* src = x + m * w.K + kb * 32;
        float* dst = xperm.data() + m * w.K + kb * 32;
        for (int i = 0; i < 16; ++i) {
          dst[(i < 8 ? 0 : 8) + (i & 7)] = src[2 * i];
          dst[(i < 8 ? 16 : 24) + (i & 7)] = src[2 * i + 1];
        }
      }
    x = xperm.data();
  }
  constexpr int64_t kRowsPerTask = 16;
  const int64_t ntask = (w.N + kRowsPerTask - 1) / kRowsPerTask;
  const bool par = ntask > 1 && w.N * w.K * M >= (int64_t{1} << 15);
#pragma omp parallel for schedule(static) if (par)
  for (int64_t t = 0; t < ntask; ++t) {
    const int64_t n0 = t * kRowsPerTask, n1 = std::min(w.N, n0 + kRowsPerTask);
    switch (M) {
      case 1: gemv_rows<1>(w, x, w.K, y, n0, n1); break;
      case 2: gemv_rows<2>(w, x, w.K, y, n0, n1); break;
      case 3: gemv_rows<3>(w, x, w.K, y, n0, n1); break;
      case 4: gemv_rows<4>(w, x, w.K, y, n0, n1); break;
      case 5: gemv_rows<5>(w, x, w.K, y, n0, n1); break;
      case 6: gemv_rows<6>(w, x, w.K, y, n0, n1); break;
      default: gemv_rows<7>(w, x, w.K, y, n0, n1); break;
    }
  }
}

// Panel GEMM: dequantise up to kPanelMaxRows rows of W, then one sgemm with all M rows of x.
void panel_gemm(const WView& w, const float* x, int64_t M, float* y) {
  const int64_t rows = std::clamp<int64_t>(kPanelMaxFloats / std::max<int64_t>(w.K, 1), 16, kPanelMaxRows);
  const int64_t nb_max = std::min(rows, w.N);
  thread_local std::vector<float> buf;
  if (buf.size() < static_cast<size_t>(nb_max * w.K)) buf.resize(static_cast<size_t>(nb_max * w.K));
  for (int64_t n0 = 0; n0 < w.N; n0 += nb_max) {
    const int64_t nb = std::min(nb_max, w.N - n0);
    dequant_rows(w, n0, n0 + nb, buf.data());
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(M), static_cast<blasint>(nb),
                static_cast<blasint>(w.K), 1.0f, x, static_cast<blasint>(w.K), buf.data(),
                static_cast<blasint>(w.K), 0.0f, y + n0, static_cast<blasint>(w.N));
  }
}

}  // namespace

Tensor dequantize(const QWeight& qw) {
  const WView w = make_view(qw, "dequantize");
  Tensor out = Tensor::empty({w.N, w.K}, DType::kF32);
  if (w.N > 0 && w.K > 0) dequant_rows(w, 0, w.N, out.data<float>());
  return out;
}

Tensor linear(const Tensor& x, const QWeight& qw, const LinearOpts& opts) {
  DI_CHECK(x.defined(), "linear: the input is undefined");
  DI_CHECK(x.device() == Device::kCPU, "linear: only the CPU backend exists so far, got input {}", x.describe());
  DI_CHECK(x.dtype() == DType::kF32, "linear: the input must be float32, got {}", x.describe());
  DI_CHECK(x.dim() == 2, "linear: the input must be 2-D [M, K], got {}", x.describe());
  const WView w = make_view(qw, "linear");
  DI_CHECK(x.size(1) == w.K, "linear: input {} has K = {} but weight {} has in = {}", x.describe(), x.size(1),
           qw.w.describe(), w.K);
  DI_CHECK(opts.act_quant_block >= 0, "linear: act_quant_block must be >= 0, got {}", opts.act_quant_block);
  const int64_t M = x.size(0), N = w.N, K = w.K;

  Tensor y = Tensor::empty({M, N}, DType::kF32);
  if (M == 0 || N == 0) return y;
  if (K == 0) {
    std::memset(y.raw(), 0, y.nbytes());
    return y;
  }
  Tensor xin = x.contiguous();
  if (opts.act_quant_block > 0) {
    if (xin.raw() == x.raw()) xin = x.clone();
    fake_quant_fp8(xin, 0, K, opts.act_quant_block);
  }
  const float* xp = xin.data<float>();
  float* yp = y.data<float>();

  if (w.dt == DType::kF32) {
    const float* wp = reinterpret_cast<const float*>(w.w);
    const auto ldw = static_cast<blasint>(w.ldw / 4);
    if (M == 1)
      cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<blasint>(N), static_cast<blasint>(K), 1.0f, wp, ldw, xp,
                  1, 0.0f, yp, 1);
    else
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(M), static_cast<blasint>(N),
                  static_cast<blasint>(K), 1.0f, xp, static_cast<blasint>(K), wp, ldw, 0.0f, yp,
                  static_cast<blasint>(N));
  } else if (M <= kGemvMaxM && have_avx2()) {
    gemv(w, xp, M, yp);
  } else {
    panel_gemm(w, xp, M, yp);
  }
  if (opts.round_out_bf16) round_bf16(y);
  return y;
}

}  // namespace deepinfer::ops
