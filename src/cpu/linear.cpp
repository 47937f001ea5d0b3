// CPU linear layer: y[M, N] = x[M, K] . W^T in FP32 for BF16, F32, FP8 (E4M3 + E8M0 tile scales)
// and FP4 (packed E2M1 + E8M0 per-32 scales) weights (docs/v4-architecture.md §2.1, §3).
//
// Numerics. Every weight format dequantises exactly into fp32 (e4m3 / e2m1 values times powers of
// two), so the product with the exact dequantised weight equals the reference's per-block FP32
// partial sums up to the order of FP32 additions.
//
// Two paths, which differ in summation order only:
//  * M <= 24 (decode, speculative drafts, MoE experts that see few tokens): a fused dequant-dot GEMV
//    that reads the codes directly, parallel over output rows with OpenMP (dynamic tasks), the x rows in
//    register-blocked groups of up to 7 (a task's weight rows stay in L2 across the groups). Measured on
//    the 2-core AVX2 target (2 threads), 4096x4096 FP8: M=16 3.5 ms, M=24 5.0 ms, M=32 6.7 ms for the
//    GEMV vs 9.1 ms (M=24) and 7.4 ms (M=32) for the panel path below (4.9 / 6.4 ms with OpenBLAS at one
//    thread), so the crossover sits at about M = 24-32. Codes are decoded in registers through IEEE
//    half precision (F16C):
//      e4m3 -> fp16: sign-extend to 16 bits, shift left 7, clear bit 14: the fp16 value is exactly
//        e4m3 * 2^-8 (e4m3 subnormals become fp16 subnormals); each 32-byte chunk is multiplied into
//        the M rows of x, and every tile's FP32 partial sum is scaled once by 2^(e-119) = 2^8 * scale.
//      e2m1 -> fp16: a 16-entry pshufb table of the fp16 high bytes (the low byte is always zero),
//        times the per-32 scale 2^(e-127); x is read in a per-32-block even/odd permuted copy so the
//        low/high nibbles need no interleaving.
//      bf16 -> fp32: zero-extend and shift by 16.
//    The weight stream is software-prefetched 16 KiB ahead (the hardware prefetcher stops at 4 KiB
//    pages; measured 2.3 -> 1.4 ms for a 64 MiB BF16 weight at M = 1).
//    F32 weights take the same GEMV (plain loads), so decoding never wakes OpenBLAS's thread pool.
//    Groups of 4-7 x rows need 16-28 accumulators and spill with AVX2's 16 registers; where the CPU has
//    AVX-512VL they run a second build of the same kernels with 32 ymm registers (identical 8-lane FP32
//    operations, bitwise-equal results: test Linear.WideKernelsBitwiseEqualAvx2Kernels). Measured on the
//    2-core AMD EPYC (AVX-512) host, 4096x4096 M=64: FP8 21.2 -> 14.2 ms, BF16 15.3 -> 13.9 ms,
//    2048x4096 FP4 10.9 -> 8.0 ms; M = 1 runs the unchanged AVX2 build.
//  * M > 24 (prefill): panels of W (up to 256 rows x K, at most 4 MiB of fp32) are dequantised by the
//    calling thread into a reused thread-local buffer and multiplied with cblas_sgemm from that thread
//    (OpenBLAS runs its own pool); F32 weights go to one cblas_sgemm directly.
//    No OpenMP region runs on this path, on purpose: the two thread pools fight over the cores right
//    after each other's work (libgomp workers spin after a region, OpenBLAS workers spin-yield for a
//    long while after a call). Measured on the 2-core target: dequantising the panels with an OpenMP
//    loop made FP8 M=64 4096x4096 take 64 ms instead of 12-20 ms; in the other direction, a GEMV right
//    after sgemm calls takes 8 ms instead of 0.5 ms.
//    When OpenBLAS is limited to one thread (openblas_set_num_threads(1) or OPENBLAS_NUM_THREADS=1, the
//    process letting OpenMP own the cores) the OpenMP threads run the panels instead, each dequantising
//    its own and calling the then single-threaded sgemm: FP8 M=64 4096x4096 11 ms, steadily.
// Rare cases take exact scalar code: e4m3 NaN codes (the GEMV flags the row NaN; the dequantiser
// decodes the chunk with the table) and tile scales whose factor would not fit fp32.
#include <cblas.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/cpu_ops.h"
#include "deepinfer/error.h"

namespace deepinfer::cpu {

namespace {

#define DI_AVX2 __attribute__((target("avx2,fma,f16c")))
// The same 8-lane (ymm) kernels compiled with AVX-512VL enabled: identical FP32 operations, but 32 vector
// registers instead of 16, so the 4 accumulators x 7 rows of the larger GEMV groups no longer spill.
#define DI_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512vl")))
#define DI_INLINE __attribute__((always_inline)) inline

bool batch_invariant() {
  static const bool on = [] {
    const char* v = std::getenv("DEEPINFER_BATCH_INVARIANT");
    return !(v && std::string(v) == "0");
  }();
  return on;
}

constexpr int64_t kGemvMaxM = 24;             // M <= this takes the fused GEMV (measured crossover, see linear())
constexpr int64_t kGemvGroup = 7;             // x rows per register-blocked GEMV pass
constexpr int64_t kPrefetchBytes = 16 << 10;  // software prefetch distance along the weight stream
constexpr int64_t kPanelMaxRows = 256;        // rows of W per dequantised panel
constexpr int64_t kPanelMaxFloats = 1 << 20;  // 4 MiB of fp32 per panel

bool g_wide_allowed = true;  // set_linear_wide_kernels (testing)

bool have_avx512vl() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl");
  return ok;
}

bool have_avx2() {
  static const bool ok =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  return ok;
}

struct Luts {
  float e4m3[256];        // exact e4m3 values (NaN codes decode to NaN)
  float e2m1[16];         // exact e2m1 values
  float e8m0[256];        // 2^(e-127), NaN for 0xFF
  float fp8_factor[256];  // 2^(e-119) = 2^8 * 2^(e-127) for e <= 246 (the fp16 decode is e4m3 * 2^-8); 0: slow path
};

const Luts& luts() {
  static const Luts t = [] {
    Luts l{};
    for (int c = 0; c < 256; ++c) l.e4m3[c] = e4m3_to_f32(static_cast<uint8_t>(c));
    for (int c = 0; c < 16; ++c) l.e2m1[c] = e2m1_to_f32(static_cast<uint8_t>(c));
    for (int e = 0; e < 256; ++e) {
      l.e8m0[e] = e8m0_to_f32(static_cast<uint8_t>(e));
      l.fp8_factor[e] = e <= 246 ? std::ldexp(1.0f, e - 119) : 0.0f;
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
  DI_CHECK(dense_rows && w.strides()[0] >= v.K, "{}: the weight's rows must be dense (stride 1 along in), got {}", op,
           w.describe());
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
    DI_CHECK((cols <= 1 || s.strides()[1] == 1) && s.strides()[0] >= cols, "{}: the scale's rows must be dense, got {}",
             op, s.describe());
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
      DI_CHECK(v.K % 32 == 0, "{}: an FP4 weight's in-dimension must be a multiple of 32, got {}", op, w.describe());
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
// 16 e4m3 codes -> 16 fp16 values equal to e4m3 * 2^-8 (NaN codes are not handled here).
DI_AVX2 inline __m256i e4m3x16_f16(const uint8_t* p) {
  const __m256i v = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_and_si256(_mm256_slli_epi16(v, 7), _mm256_set1_epi16(static_cast<short>(0xbfff)));
}
DI_AVX2 inline __m256 e4m3x8_f16ps(const uint8_t* p) {
  const __m128i v = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  return _mm256_cvtph_ps(_mm_and_si128(_mm_slli_epi16(v, 7), _mm_set1_epi16(static_cast<short>(0xbfff))));
}
DI_AVX2 inline __m256 f16lo(__m256i h) { return _mm256_cvtph_ps(_mm256_castsi256_si128(h)); }
DI_AVX2 inline __m256 f16hi(__m256i h) { return _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)); }

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

// High bytes of the fp16 encodings of the 16 e2m1 codes (every low byte is zero).
DI_AVX2 inline __m128i e2m1_f16_table() {
  return _mm_setr_epi8(0x00, 0x38, 0x3c, 0x3e, 0x40, 0x42, 0x44, 0x46, static_cast<char>(0x80), static_cast<char>(0xb8),
                       static_cast<char>(0xbc), static_cast<char>(0xbe), static_cast<char>(0xc0),
                       static_cast<char>(0xc2), static_cast<char>(0xc4), static_cast<char>(0xc6));
}
// 16 packed bytes (one 32-block): lo[i] / hi[i] = fp16 high byte of the code at k = 2i / 2i + 1.
DI_AVX2 inline void e2m1_block_f16(const uint8_t* p, __m128i& lo, __m128i& hi) {
  const __m128i table = e2m1_f16_table();
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  lo = _mm_shuffle_epi8(table, _mm_and_si128(b, mask));
  hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(b, 4), mask));
}
// 8 fp16 high bytes (low half of hb) -> 8 fp32.
DI_AVX2 inline __m256 f16hb_lo(__m128i hb) { return _mm256_cvtph_ps(_mm_unpacklo_epi8(_mm_setzero_si128(), hb)); }
DI_AVX2 inline __m256 f16hb_hi(__m128i hb) { return _mm256_cvtph_ps(_mm_unpackhi_epi8(_mm_setzero_si128(), hb)); }

DI_AVX2 inline __m256 bf16x8(const uint16_t* p) {
  const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

DI_AVX2 DI_INLINE float hsum(__m256 v) {
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
      for (; k + 32 <= w.K; k += 32) {
        _mm_prefetch(reinterpret_cast<const char*>(p + k) + kPrefetchBytes, _MM_HINT_T0);
        _mm256_storeu_ps(out + k, bf16x8(p + k));
        _mm256_storeu_ps(out + k + 8, bf16x8(p + k + 8));
        _mm256_storeu_ps(out + k + 16, bf16x8(p + k + 16));
        _mm256_storeu_ps(out + k + 24, bf16x8(p + k + 24));
      }
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
            _mm_prefetch(reinterpret_cast<const char*>(wr + k) + kPrefetchBytes, _MM_HINT_T0);
            if (e4m3_has_nan32(wr + k)) {
              for (int64_t j = k; j < k + 32; ++j) out[j] = L.e4m3[wr[j]] * s;
              continue;
            }
            const __m256i h0 = e4m3x16_f16(wr + k), h1 = e4m3x16_f16(wr + k + 16);
            _mm256_storeu_ps(out + k, _mm256_mul_ps(f16lo(h0), vf));
            _mm256_storeu_ps(out + k + 8, _mm256_mul_ps(f16hi(h0), vf));
            _mm256_storeu_ps(out + k + 16, _mm256_mul_ps(f16lo(h1), vf));
            _mm256_storeu_ps(out + k + 24, _mm256_mul_ps(f16hi(h1), vf));
          }
          for (; k + 8 <= k1 && !e4m3_has_nan8(wr + k); k += 8)
            _mm256_storeu_ps(out + k, _mm256_mul_ps(e4m3x8_f16ps(wr + k), vf));
        }
        for (; k < k1; ++k) out[k] = L.e4m3[wr[k]] * s;
      }
      break;
    }
    case DType::kE2M1x2: {
      const uint8_t* sr = w.s + n * w.lds;
      for (int64_t kb = 0; kb < w.K / 32; ++kb) {
        if (kb % 4 == 0) _mm_prefetch(reinterpret_cast<const char*>(wr + kb * 16) + kPrefetchBytes, _MM_HINT_T0);
        __m128i lo, hi;
        e2m1_block_f16(wr + kb * 16, lo, hi);
        const __m128i a = _mm_unpacklo_epi8(lo, hi), b = _mm_unpackhi_epi8(lo, hi);  // natural k order
        const __m256 vf = _mm256_set1_ps(L.e8m0[sr[kb]]);
        float* o = out + kb * 32;
        _mm256_storeu_ps(o, _mm256_mul_ps(f16hb_lo(a), vf));
        _mm256_storeu_ps(o + 8, _mm256_mul_ps(f16hb_hi(a), vf));
        _mm256_storeu_ps(o + 16, _mm256_mul_ps(f16hb_lo(b), vf));
        _mm256_storeu_ps(o + 24, _mm256_mul_ps(f16hb_hi(b), vf));
      }
      break;
    }
    default:
      dequant_row_scalar(w, n, out);
  }
}

// Dequantises rows [n0, n1) into out (row stride K); `parallel`: OpenMP over rows when worthwhile.
void dequant_rows(const WView& w, int64_t n0, int64_t n1, float* out, bool parallel) {
  const bool avx2 = have_avx2();
  const bool par = parallel && (n1 - n0) > 1 && (n1 - n0) * w.K >= (int64_t{1} << 16);
#pragma omp parallel for schedule(static) if (par)
  for (int64_t n = n0; n < n1; ++n) {
    float* o = out + (n - n0) * w.K;
    if (avx2)
      dequant_row_avx2(w, n, o);
    else
      dequant_row_scalar(w, n, o);
  }
}

// ---- fused GEMV kernels: rows [n0, n1) of y[m * ldy + n] for M rows of x ---------------------------
// Four independent accumulators per x row, whatever the group size M: each output's FP32 summation
// order is then the same for every M (batch invariance: a row's result does not depend on which
// or how many other rows share the call), at the price of register spills in the larger groups.
template <int M>
constexpr int kAcc = 4;

template <int M>
struct Accum {
  __m256 v[M][kAcc<M>];  // running sums (per tile for FP8)
  __m256 tot[M];         // FP8: the scaled tile sums
  float tail[M];         // exact scalar products (tails, slow tiles)
};

template <int M>
DI_AVX2 DI_INLINE void acc_zero(Accum<M>& a) {
  for (int m = 0; m < M; ++m) {
    for (int j = 0; j < kAcc<M>; ++j) a.v[m][j] = _mm256_setzero_ps();
    a.tot[m] = _mm256_setzero_ps();
    a.tail[m] = 0.0f;
  }
}

// acc[m] += w0..w3 . x[m][k .. k+32)
template <int M>
DI_AVX2 DI_INLINE void fma32(Accum<M>& a, const float* x, int64_t ldx, int64_t k, __m256 w0, __m256 w1, __m256 w2,
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
DI_AVX2 DI_INLINE void fma8(Accum<M>& a, const float* x, int64_t ldx, int64_t k, __m256 w0) {
  for (int m = 0; m < M; ++m) a.v[m][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + m * ldx + k), a.v[m][0]);
}

// tot[m] += scale * sum_j v[m][j]; v = 0.
template <int M>
DI_AVX2 DI_INLINE void acc_flush(Accum<M>& a, __m256 scale) {
  for (int m = 0; m < M; ++m) {
    __m256 s = a.v[m][0];
    for (int j = 1; j < kAcc<M>; ++j) s = _mm256_add_ps(s, a.v[m][j]);
    a.tot[m] = _mm256_fmadd_ps(s, scale, a.tot[m]);
    for (int j = 0; j < kAcc<M>; ++j) a.v[m][j] = _mm256_setzero_ps();
  }
}

template <int M>
DI_AVX2 DI_INLINE void acc_store(Accum<M>& a, float* y, int64_t ldy, int64_t n) {
  for (int m = 0; m < M; ++m) y[m * ldy + n] = hsum(a.tot[m]) + a.tail[m];
}

template <int M>
DI_AVX2 DI_INLINE void gemv_fp8(const WView& w, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t n0,
                                int64_t n1) {
  const Luts& L = luts();
  const __m256i c7f = _mm256_set1_epi8(0x7f);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* wr = w.w + n * w.ldw;
    const uint8_t* sr = w.s + (n / w.B) * w.lds;
    Accum<M> a;
    acc_zero(a);
    __m256i nanmax = _mm256_setzero_si256();  // max of |code| over the vector chunks: 0x7f = a NaN code
    bool nan = false;
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
      if (fac == 0.0f) {  // scale 2^(e-127) with e > 246 or NaN: exact scalar products
        scalar(k0, k1, L.e8m0[e]);
        continue;
      }
      int64_t k = k0;
      for (; k + 32 <= k1; k += 32) {
        _mm_prefetch(reinterpret_cast<const char*>(wr + k) + kPrefetchBytes, _MM_HINT_T0);
        nanmax = _mm256_max_epu8(nanmax,
                                 _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wr + k)), c7f));
        const __m256i h0 = e4m3x16_f16(wr + k), h1 = e4m3x16_f16(wr + k + 16);
        fma32<M>(a, x, ldx, k, f16lo(h0), f16hi(h0), f16lo(h1), f16hi(h1));
      }
      for (; k + 8 <= k1; k += 8) {
        nan |= e4m3_has_nan8(wr + k);
        fma8<M>(a, x, ldx, k, e4m3x8_f16ps(wr + k));
      }
      acc_flush(a, _mm256_set1_ps(fac));
      scalar(k, k1, L.e8m0[e]);
    }
    nan |= _mm256_movemask_epi8(_mm256_cmpeq_epi8(nanmax, c7f)) != 0;
    if (nan) {
      for (int m = 0; m < M; ++m) y[m * ldy + n] = std::nanf("");
      continue;
    }
    acc_store(a, y, ldy, n);
  }
}

// x is the per-32-block permuted copy: [k even 0..14 | even 16..30 | odd 1..15 | odd 17..31].
template <int M>
DI_AVX2 DI_INLINE void gemv_fp4(const WView& w, const float* xp, int64_t ldx, float* y, int64_t ldy, int64_t n0,
                                int64_t n1) {
  const Luts& L = luts();
  const int64_t nblk = w.K / 32;
  const __m256i table = _mm256_broadcastsi128_si256(e2m1_f16_table());
  const __m256i mask = _mm256_set1_epi8(0x0f);
  const __m256i zero = _mm256_setzero_si256();
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* wr = w.w + n * w.ldw;
    const uint8_t* sr = w.s + n * w.lds;
    Accum<M> a;
    acc_zero(a);
    int64_t kb = 0;
    for (; kb + 2 <= nblk; kb += 2) {  // two 32-blocks: lane 0 = block kb, lane 1 = block kb + 1
      _mm_prefetch(reinterpret_cast<const char*>(wr + kb * 16) + kPrefetchBytes, _MM_HINT_T0);
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wr + kb * 16));
      const __m256i lo = _mm256_shuffle_epi8(table, _mm256_and_si256(b, mask));
      const __m256i hi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(b, 4), mask));
      const __m256i e0 = _mm256_unpacklo_epi8(zero, lo), e1 = _mm256_unpackhi_epi8(zero, lo);
      const __m256i o0 = _mm256_unpacklo_epi8(zero, hi), o1 = _mm256_unpackhi_epi8(zero, hi);
      const __m256 f0 = _mm256_set1_ps(L.e8m0[sr[kb]]), f1 = _mm256_set1_ps(L.e8m0[sr[kb + 1]]);
      fma32<M>(a, xp, ldx, kb * 32, _mm256_mul_ps(f16lo(e0), f0), _mm256_mul_ps(f16lo(e1), f0),
               _mm256_mul_ps(f16lo(o0), f0), _mm256_mul_ps(f16lo(o1), f0));
      fma32<M>(a, xp, ldx, kb * 32 + 32, _mm256_mul_ps(f16hi(e0), f1), _mm256_mul_ps(f16hi(e1), f1),
               _mm256_mul_ps(f16hi(o0), f1), _mm256_mul_ps(f16hi(o1), f1));
    }
    if (kb < nblk) {
      __m128i lo, hi;
      e2m1_block_f16(wr + kb * 16, lo, hi);
      const __m256 f = _mm256_set1_ps(L.e8m0[sr[kb]]);
      fma32<M>(a, xp, ldx, kb * 32, _mm256_mul_ps(f16hb_lo(lo), f), _mm256_mul_ps(f16hb_hi(lo), f),
               _mm256_mul_ps(f16hb_lo(hi), f), _mm256_mul_ps(f16hb_hi(hi), f));
    }
    acc_flush(a, _mm256_set1_ps(1.0f));
    acc_store(a, y, ldy, n);
  }
}

// Dense weights: T = uint16_t (bf16 bits) or float.
template <typename T>
DI_AVX2 inline __m256 dense8(const T* p) {
  if constexpr (sizeof(T) == 2)
    return bf16x8(p);
  else
    return _mm256_loadu_ps(p);
}
template <typename T>
inline float dense1(T v) {
  if constexpr (sizeof(T) == 2)
    return bf16_to_f32(v);
  else
    return v;
}

template <int M, typename T>
DI_AVX2 DI_INLINE void gemv_dense(const WView& w, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t n0,
                                  int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    const T* wr = reinterpret_cast<const T*>(w.w + n * w.ldw);
    Accum<M> a;
    acc_zero(a);
    int64_t k = 0;
    for (; k + 32 <= w.K; k += 32) {
      _mm_prefetch(reinterpret_cast<const char*>(wr + k) + kPrefetchBytes, _MM_HINT_T0);
      if constexpr (sizeof(T) == 4)
        _mm_prefetch(reinterpret_cast<const char*>(wr + k) + kPrefetchBytes + 64, _MM_HINT_T0);
      fma32<M>(a, x, ldx, k, dense8(wr + k), dense8(wr + k + 8), dense8(wr + k + 16), dense8(wr + k + 24));
    }
    for (; k + 8 <= w.K; k += 8) fma8<M>(a, x, ldx, k, dense8(wr + k));
    for (; k < w.K; ++k) {
      const float wv = dense1(wr[k]);
      for (int m = 0; m < M; ++m) a.tail[m] += wv * x[m * ldx + k];
    }
    acc_flush(a, _mm256_set1_ps(1.0f));
    acc_store(a, y, ldy, n);
  }
}

template <int M>
DI_AVX2 DI_INLINE void gemv_rows_body(const WView& w, const float* x, int64_t ldx, float* y, int64_t n0, int64_t n1) {
  switch (w.dt) {
    case DType::kE4M3:
      gemv_fp8<M>(w, x, ldx, y, w.N, n0, n1);
      break;
    case DType::kE2M1x2:
      gemv_fp4<M>(w, x, ldx, y, w.N, n0, n1);
      break;
    case DType::kBF16:
      gemv_dense<M, uint16_t>(w, x, ldx, y, w.N, n0, n1);
      break;
    case DType::kF32:
      gemv_dense<M, float>(w, x, ldx, y, w.N, n0, n1);
      break;
    default:
      break;
  }
}

template <int M>
DI_AVX2 void gemv_rows_avx2(const WView& w, const float* x, int64_t ldx, float* y, int64_t n0, int64_t n1) {
  gemv_rows_body<M>(w, x, ldx, y, n0, n1);
}
template <int M>
DI_AVX512 void gemv_rows_avx512(const WView& w, const float* x, int64_t ldx, float* y, int64_t n0, int64_t n1) {
  gemv_rows_body<M>(w, x, ldx, y, n0, n1);
}
template <int M>
void gemv_rows(bool wide, const WView& w, const float* x, int64_t ldx, float* y, int64_t n0, int64_t n1) {
  if (M >= 4 && wide)  // groups of 1-3 fit the 16 registers: those keep the AVX2 build
    gemv_rows_avx512<M>(w, x, ldx, y, n0, n1);
  else
    gemv_rows_avx2<M>(w, x, ldx, y, n0, n1);
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
  // x rows go in groups of at most kGemvGroup (the register-blocked kernels); a task decodes its block
  // of weight rows once per group, and the block stays in L2 between groups.
  const int64_t ngroups = (M + kGemvGroup - 1) / kGemvGroup;
  // The AVX-512VL build for groups of >= 4 rows (see gemv_rows); for BF16/F32 only with several groups:
  // a single group streams the weight from memory, where it measured slower (BF16 M=5: 1.5 vs 1.2 ms).
  const bool wide =
      g_wide_allowed && have_avx512vl() && (ngroups > 1 || w.dt == DType::kE4M3 || w.dt == DType::kE2M1x2);
  const int64_t row_bytes = std::max<int64_t>(1, dtype_nbytes(w.dt, w.K));
  // About 16 tasks per thread, handed out dynamically (a thread on a busy core takes fewer), each at
  // most ~256 KiB of weights so that it stays in L2 across the groups.
  const int64_t threads = std::max(1, omp_get_max_threads());
  int64_t rows_per_task = std::max<int64_t>(8, (w.N + 16 * threads - 1) / (16 * threads));
  if (ngroups > 1) rows_per_task = std::max<int64_t>(8, std::min(rows_per_task, (int64_t{256} << 10) / row_bytes));
  const int64_t ntask = (w.N + rows_per_task - 1) / rows_per_task;
  const bool par = threads > 1 && ntask > 1 && w.N * w.K * M >= (int64_t{1} << 15);
#pragma omp parallel for schedule(dynamic, 1) if (par)
  for (int64_t t = 0; t < ntask; ++t) {
    const int64_t n0 = t * rows_per_task, n1 = std::min(w.N, n0 + rows_per_task);
    for (int64_t g = 0, m0 = 0; g < ngroups; ++g) {
      const int64_t mg = M / ngroups + (g < M % ngroups ? 1 : 0);  // balanced group sizes
      const float* xg = x + m0 * w.K;
      float* yg = y + m0 * w.N;
      switch (mg) {
        case 1:
          gemv_rows<1>(wide, w, xg, w.K, yg, n0, n1);
          break;
        case 2:
          gemv_rows<2>(wide, w, xg, w.K, yg, n0, n1);
          break;
        case 3:
          gemv_rows<3>(wide, w, xg, w.K, yg, n0, n1);
          break;
        case 4:
          gemv_rows<4>(wide, w, xg, w.K, yg, n0, n1);
          break;
        case 5:
          gemv_rows<5>(wide, w, xg, w.K, yg, n0, n1);
          break;
        case 6:
          gemv_rows<6>(wide, w, xg, w.K, yg, n0, n1);
          break;
        default:
          gemv_rows<7>(wide, w, xg, w.K, yg, n0, n1);
          break;
      }
      m0 += mg;
    }
  }
}

// Panel GEMM: dequantise up to kPanelMaxRows rows of W, then one sgemm with all M rows of x.
//  * OpenBLAS threaded (its default): panels in turn, dequantised by the calling thread, sgemm from it.
//  * OpenBLAS limited to one thread (openblas_set_num_threads(1) or OPENBLAS_NUM_THREADS=1: the process
//    lets OpenMP own the cores): each OpenMP thread dequantises its own panels and calls the then
//    single-threaded sgemm on them, so the dequantisation is parallel too.
// F32 weights need no dequantisation: their "panels" are row ranges of the weight itself.
void panel_gemm(const WView& w, const float* x, int64_t M, float* y) {
  const bool blas_threaded = openblas_get_num_threads() > 1;
  const bool dense = w.dt == DType::kF32;
  const int64_t threads = std::max(1, omp_get_max_threads());
  const int64_t rows = dense ? (blas_threaded ? w.N : std::max<int64_t>(16, (w.N + 4 * threads - 1) / (4 * threads)))
                             : std::clamp<int64_t>(kPanelMaxFloats / std::max<int64_t>(w.K, 1), 16, kPanelMaxRows);
  const int64_t nb_max = std::min(rows, w.N);
  const int64_t npanel = (w.N + nb_max - 1) / nb_max;
  auto run_panel = [&](int64_t p, std::vector<float>& buf) {
    const int64_t n0 = p * nb_max, nb = std::min(nb_max, w.N - n0);
    const float* panel = reinterpret_cast<const float*>(w.w + n0 * w.ldw);
    int64_t ld = w.ldw / 4;
    if (!dense) {
      if (buf.size() < static_cast<size_t>(nb_max * w.K)) buf.resize(static_cast<size_t>(nb_max * w.K));
      dequant_rows(w, n0, n0 + nb, buf.data(), /*parallel=*/false);
      panel = buf.data();
      ld = w.K;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(M), static_cast<blasint>(nb),
                static_cast<blasint>(w.K), 1.0f, x, static_cast<blasint>(w.K), panel, static_cast<blasint>(ld), 0.0f,
                y + n0, static_cast<blasint>(w.N));
  };
  thread_local std::vector<float> buf;
  if (blas_threaded || npanel == 1 || threads == 1) {
    for (int64_t p = 0; p < npanel; ++p) run_panel(p, buf);
    return;
  }
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t p = 0; p < npanel; ++p) run_panel(p, buf);
}

}  // namespace

bool set_linear_wide_kernels(bool on) {
  const bool prev = g_wide_allowed;
  g_wide_allowed = on;
  return prev;
}

Tensor dequantize(const QWeight& qw) {
  const WView w = make_view(qw, "dequantize");
  Tensor out = Tensor::empty({w.N, w.K}, DType::kF32);
  if (w.N > 0 && w.K > 0) dequant_rows(w, 0, w.N, out.data<float>(), /*parallel=*/true);
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
    // One row at a time: fake_quant_fp8 stays serial (no OpenMP region right before an OpenBLAS call).
    for (int64_t m = 0; m < M; ++m) {
      Tensor row = xin.slice(0, m, m + 1);
      fake_quant_fp8(row, 0, K, opts.act_quant_block);
    }
  }
  const float* xp = xin.data<float>();
  float* yp = y.data<float>();

  // Batch-invariant (the default): every M takes the fused kernels, whose per-output summation
  // order does not depend on M. DEEPINFER_BATCH_INVARIANT=0 lets large M use the faster sgemm panels.
  if (have_avx2() && (M <= kGemvMaxM || batch_invariant())) {
    gemv(w, xp, M, yp);  // F32 too: decoding then never wakes OpenBLAS's thread pool
  } else {
    panel_gemm(w, xp, M, yp);
  }
  if (opts.round_out_bf16) round_bf16(y);
  return y;
}

// Runs of rows that share an expert go through linear() together: the same calls the per-expert
// loop makes, so the same bits (and linear's result for a row never depends on the other rows).
Tensor linear_grouped(const Tensor& x, const Tensor& row_expert, const std::vector<const std::vector<QWeight>*>& lists,
                      const LinearOpts& opts) {
  const char* op = "linear_grouped";
  DI_CHECK(x.defined() && x.device() == Device::kCPU && x.dtype() == DType::kF32 && x.dim() == 2 && x.is_contiguous(),
           "{}: x must be a contiguous float32 [R, K] CPU tensor, got {}", op,
           x.defined() ? x.describe() : std::string("(undefined)"));
  DI_CHECK(row_expert.defined() && row_expert.device() == Device::kCPU && row_expert.dtype() == DType::kI32 &&
               row_expert.dim() == 1 && row_expert.size(0) == x.size(0) && row_expert.is_contiguous(),
           "{}: row_expert must be int32 [{}] on the CPU, got {}", op, x.size(0),
           row_expert.defined() ? row_expert.describe() : std::string("(undefined)"));
  DI_CHECK(!lists.empty() && !lists[0]->empty(), "{}: no experts", op);
  const int64_t R = x.size(0), N = (*lists[0])[0].out(), E = static_cast<int64_t>(lists[0]->size());
  Tensor y = Tensor::empty({static_cast<int64_t>(lists.size()) * R, N}, DType::kF32);
  const int32_t* ids = row_expert.data<int32_t>();
  for (size_t l = 0; l < lists.size(); ++l) {
    const std::vector<QWeight>& experts = *lists[l];
    DI_CHECK(static_cast<int64_t>(experts.size()) == E, "{}: list {} has {} experts, list 0 has {}", op, l,
             experts.size(), E);
    float* yl = y.data<float>() + static_cast<int64_t>(l) * R * N;
    for (int64_t a = 0; a < R;) {
      const int64_t e = ids[a];
      DI_CHECK(e >= 0 && e < E, "{}: row {} names expert {} outside [0, {})", op, a, e, E);
      DI_CHECK(experts[e].out() == N, "{}: expert {} has {} outputs, expert 0 has {}", op, e, experts[e].out(), N);
      int64_t b = a + 1;
      while (b < R && ids[b] == e) ++b;
      const Tensor ye = cpu::linear(x.slice(0, a, b), experts[e], opts);
      std::memcpy(yl + a * N, ye.data<float>(), static_cast<size_t>((b - a) * N) * sizeof(float));
      a = b;
    }
  }
  return y;
}

}  // namespace deepinfer::cpu
