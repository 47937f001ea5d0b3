// GPU check of the tensor-core linear (src/cuda/linear_tc.cu) against the CPU op ops::linear.
//
// Not a ctest test (CI has no GPU). Run on a Hopper machine:
//   ./build/src/cuda/deepinfer_cuda_linear_tc_tests
// Prints one PASS/FAIL line per case (and "     differ x/n max|d|/S ..." under each comparison); exit
// status 0 = all passed, 1 = a failure, 2 = no GPU.
//
// Tolerance. With xq the CPU's FP8-quantised x and W the dequantised weight, every product xq_k * W_k is
// exact on both sides, so the two results are two orders of FP32 additions of the same terms. With
// S = sum_k |xq_k W_k| (computed on the GPU by cuda::linear from |xq| and |W|, both exact in bf16) and
// u = 2^-24, a recursive FP32 sum of depth d is off by at most about d u S; the CPU's depth is about
// K/32 + 8, the tensor-core kernel's K/KS + 2 KS/16 (fold blocks plus the MMA chain in a block, allowing a
// few ulps for the MMA's internal alignment), so each output must satisfy
//     |y_tc - y_cpu| <= (K/16 + 64) u S + 1e-35
// plus, with round_out_bf16, one bf16 step: + 2^-7 max(|y_tc|, |y_cpu|). NaN == NaN.
// Batch invariance is checked bit for bit: a row computed in M = 64 / 300 calls equals the same row
// computed alone (M = 1), at other positions of M = 3 and 8 calls (E4M3: the decode kernel, linear_tc_gemv.cu) and
// of an M = 16 call (the GEMM kernel).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cuda/device.h"
#include "cuda/linear.cuh"
#include "cuda/linear_tc.cuh"
#include "cuda/linear_tc_bf16.cuh"
#include "cuda/linear_tc_gemv.cuh"
#include "cuda_test_util.h"
#include "deepinfer/dtype.h"
#include "deepinfer/error.h"
#include "ops/ops.h"

namespace di = deepinfer;

namespace {

using namespace cuda_test;  // NOLINT: the shared test helpers

// |W| dequantised, as an exact BF16 [N, K] CUDA weight (e4m3 / e2m1 times a power of two fit bf16).
di::ops::QWeight abs_weight_bf16(const di::ops::QWeight& wh) {
  const di::Tensor d = di::ops::dequantize(wh);
  di::Tensor b = di::Tensor::empty({d.size(0), d.size(1)}, di::DType::kBF16);
  const float* s = d.data<float>();
  uint16_t* o = b.data<uint16_t>();
  for (int64_t i = 0; i < d.numel(); ++i) o[i] = di::f32_to_bf16(std::fabs(s[i]));
  di::ops::QWeight q;
  q.w = di::cuda::copy_to_device(b);
  return q;
}

// S[m, n] = sum_k |xq[m, k] W[n, k]| (host copy), xq the CPU's FP8 quantisation of x (act > 0) or x itself (act 0).
di::Tensor abs_sums(const di::Tensor& x, int64_t act, const di::ops::QWeight& absw) {
  di::Tensor xq = x.clone();
  if (act > 0) di::ops::fake_quant_fp8(xq, 0, xq.size(1), act);
  float* p = xq.data<float>();
  for (int64_t i = 0; i < xq.numel(); ++i) p[i] = std::fabs(p[i]);
  return di::cuda::copy_to_host(di::cuda::linear(di::cuda::copy_to_device(xq), absw, di::ops::LinearOpts{}));
}

// `depth`: the summation depth of the bound, depth 2^-24 S (K/16 + 64 for linear_tc).
std::string compare_tol(const di::Tensor& want, const di::Tensor& got, const di::Tensor& S, int64_t depth, bool round,
                        std::string& stats) {
  const int64_t n = want.numel();
  if (got.numel() != n || S.numel() != n) return "size mismatch";
  const float* a = want.data<float>();
  const float* b = got.data<float>();
  const float* s = S.data<float>();
  const double rel = static_cast<double>(depth) * std::ldexp(1.0, -24);
  int64_t differ = 0, bad = 0, first = -1;
  double max_ratio = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (bits(a[i]) == bits(b[i])) continue;
    ++differ;
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    double tol = rel * s[i] + 1e-35;
    if (round) tol += std::ldexp(1.0, -7) * std::max(std::fabs(a[i]), std::fabs(b[i]));
    if (!round && s[i] > 0) max_ratio = std::max(max_ratio, d / s[i]);
    if (!(d <= tol)) {
      if (first < 0) first = i;
      ++bad;
    }
  }
  char buf[300];
  std::snprintf(buf, sizeof buf, "differ %lld/%lld max|d|/S %.3g (tol %.3g)", static_cast<long long>(differ),
                static_cast<long long>(n), max_ratio, rel);
  stats = buf;
  if (bad == 0) return "";
  std::snprintf(buf, sizeof buf, "%lld of %lld out of tolerance; first at %lld: cpu %.9g, tc %.9g, S %.9g; %s",
                static_cast<long long>(bad), static_cast<long long>(n), static_cast<long long>(first), a[first],
                b[first], s[first], stats.c_str());
  return buf;
}

struct Case {
  const char* what;
  di::DType dt;
  int64_t N, K, block, act;
};

void test_against_cpu() {
  const Case cases[] = {
      {"v4.1 [1280,5120]", di::DType::kE4M3, 1280, 5120, 32, 32},
      {"v4.1 [32768,1280]", di::DType::kE4M3, 32768, 1280, 32, 32},
      {"v4.1 [512,5120]", di::DType::kE4M3, 512, 5120, 32, 32},
      {"v4.1 [5120,8192]", di::DType::kE4M3, 5120, 8192, 32, 32},
      {"v4.1 expert [2304,5120]", di::DType::kE2M1x2, 2304, 5120, 0, 32},
      {"v4.1 expert [5120,2304]", di::DType::kE2M1x2, 5120, 2304, 0, 32},
      {"v4 block 128 [1280,5120]", di::DType::kE4M3, 1280, 5120, 128, 128},
      {"v4 block 128 [5120,8192]", di::DType::kE4M3, 5120, 8192, 128, 128},
      {"fp8 block 32, act 128", di::DType::kE4M3, 1280, 5120, 32, 128},
      {"fp8 block 128, act 32", di::DType::kE4M3, 640, 2048, 128, 32},
      {"fp8 block 64, act 64, ragged N", di::DType::kE4M3, 333, 2176, 64, 64},
      {"fp8 block 128 ragged N", di::DType::kE4M3, 1000, 4096, 128, 128},
      {"fp8 block 32 short K, N 37", di::DType::kE4M3, 37, 256, 32, 32},
      {"fp4 short K, N 37", di::DType::kE2M1x2, 37, 128, 0, 32},
      {"fp4 act 128", di::DType::kE2M1x2, 768, 1024, 0, 128},
  };
  uint32_t seed = 7000;
  for (const Case& c : cases) {
    const di::ops::QWeight wh = random_weight(c.dt, c.N, c.K, c.block, seed++);
    const di::ops::QWeight wd = to_device(wh);
    const di::ops::QWeight absw = abs_weight_bf16(wh);
    struct Run {
      int64_t M;
      bool round;
    };
    for (const Run run : {Run{1, false}, Run{3, false}, Run{3, true}, Run{8, false}, Run{16, false}, Run{64, false},
                          Run{64, true}, Run{256, false}, Run{300, true}}) {
      char name[240];
      std::snprintf(name, sizeof name, "linear_tc %s %s N=%lld K=%lld B=%lld act=%lld round=%d M=%lld", c.what,
                    di::dtype_name(c.dt), static_cast<long long>(c.N), static_cast<long long>(c.K),
                    static_cast<long long>(c.block), static_cast<long long>(c.act), run.round ? 1 : 0,
                    static_cast<long long>(run.M));
      run_case(name, [&] {
        const di::Tensor x = random_rows(run.M, c.K, seed++);
        di::ops::LinearOpts o;
        o.act_quant_block = c.act;
        o.round_out_bf16 = run.round;
        const di::Tensor xd = di::cuda::copy_to_device(x);
        if (!di::cuda::linear_tc_supported(xd, wd, o)) return std::string("linear_tc_supported is false");
        const di::Tensor want = di::ops::linear(x, wh, o);
        const di::Tensor got = di::cuda::copy_to_host(di::cuda::linear_tc(xd, wd, o));
        const di::Tensor S = abs_sums(x, c.act, absw);
        std::string stats;
        const std::string r = compare_tol(want, got, S, c.K / 16 + 64, run.round, stats);
        std::printf("     %s\n", stats.c_str());
        return r;
      });
    }
  }
}

void test_unsupported() {
  struct U {
    const char* what;
    di::DType dt;
    int64_t N, K, block, act;
  };
  const U us[] = {
      {"fp8 K=96 N=37", di::DType::kE4M3, 37, 96, 32, 32},
      {"fp4 K=96 N=37", di::DType::kE2M1x2, 37, 96, 0, 32},
      {"fp8 without the act quant site", di::DType::kE4M3, 64, 256, 32, 0},
      {"fp8 act 16", di::DType::kE4M3, 64, 256, 32, 16},
  };
  uint32_t seed = 9000;
  for (const U& u : us) {
    run_case(std::string("linear_tc_supported is false: ") + u.what, [&] {
      const di::ops::QWeight wd = to_device(random_weight(u.dt, u.N, u.K, u.block, seed++));
      const di::Tensor xd = di::cuda::copy_to_device(random_rows(2, u.K, seed++));
      di::ops::LinearOpts o;
      o.act_quant_block = u.act;
      if (di::cuda::linear_tc_supported(xd, wd, o)) return std::string("supported() returned true");
      try {
        (void)di::cuda::linear_tc(xd, wd, o);
      } catch (const di::Error&) {
        return std::string();
      }
      return std::string("linear_tc did not throw");
    });
  }
  run_case("linear_tc_supported is false: bf16 weight", [&] {
    di::ops::QWeight q;
    q.w = di::Tensor::zeros({64, 256}, di::DType::kBF16, di::Device::kCUDA);
    const di::Tensor xd = di::cuda::copy_to_device(random_rows(2, 256, 1));
    di::ops::LinearOpts o;
    o.act_quant_block = 32;
    return di::cuda::linear_tc_supported(xd, q, o) ? std::string("supported() returned true") : std::string();
  });
}

// Row r of a batch equals, bit for bit, the row computed alone and at another position in another batch.
void test_batch_invariance() {
  const Case cases[] = {
      {"v4.1 fp8 [1280,5120]", di::DType::kE4M3, 1280, 5120, 32, 32},
      {"v4.1 fp8 [32768,1280]", di::DType::kE4M3, 32768, 1280, 32, 32},
      {"v4.1 fp4 [2304,5120]", di::DType::kE2M1x2, 2304, 5120, 0, 32},
      {"v4 fp8 block 128 [5120,8192]", di::DType::kE4M3, 5120, 8192, 128, 128},
      {"v4.1 fp8 [5120,8192]", di::DType::kE4M3, 5120, 8192, 32, 32},
      {"v4.1 fp8 [512,5120]", di::DType::kE4M3, 512, 5120, 32, 32},
      {"fp8 block 64, act 64, ragged N", di::DType::kE4M3, 333, 2176, 64, 64},
      {"fp8 block 32, act 128", di::DType::kE4M3, 1280, 5120, 32, 128},
      {"fp8 block 32 short K, N 37", di::DType::kE4M3, 37, 256, 32, 32},
  };
  uint32_t seed = 11000;
  for (const Case& c : cases) {
    const di::ops::QWeight wd = to_device(random_weight(c.dt, c.N, c.K, c.block, seed++));
    for (const bool round : {false, true}) {
      char name[240];
      std::snprintf(name, sizeof name, "linear_tc batch invariance %s round=%d (M = 1, 3, 8, 16, 64, 300)", c.what,
                    round ? 1 : 0);
      run_case(name, [&] {
        di::ops::LinearOpts o;
        o.act_quant_block = c.act;
        o.round_out_bf16 = round;
        const di::Tensor big = random_rows(300, c.K, seed++);
        const di::Tensor other = random_rows(16, c.K, seed++);
        const di::Tensor y300 = di::cuda::copy_to_host(di::cuda::linear_tc(di::cuda::copy_to_device(big), wd, o));
        const di::Tensor y64 = di::cuda::copy_to_host(
            di::cuda::linear_tc(di::cuda::copy_to_device(big.slice(0, 0, 64).contiguous()), wd, o));
        const int64_t K = c.K, N = c.N;
        for (const int64_t r : {int64_t{0}, int64_t{5}, int64_t{37}, int64_t{63}}) {
          const di::Tensor xr = big.slice(0, r, r + 1).contiguous();
          const di::Tensor y1 = di::cuda::copy_to_host(di::cuda::linear_tc(di::cuda::copy_to_device(xr), wd, o));
          di::Tensor x16 = other.clone();
          const int64_t pos = (r * 7 + 3) % 16;
          std::memcpy(x16.data<float>() + pos * K, xr.data<float>(), static_cast<size_t>(K) * sizeof(float));
          const di::Tensor y16 = di::cuda::copy_to_host(di::cuda::linear_tc(di::cuda::copy_to_device(x16), wd, o));
          // The decode path (M <= 8, E4M3) at other positions of 3- and 8-row calls.
          const int64_t p3 = r % 3, p8 = (r * 5 + 1) % 8;
          di::Tensor x3 = other.slice(0, 0, 3).contiguous(), x8 = other.slice(0, 8, 16).contiguous();
          std::memcpy(x3.data<float>() + p3 * K, xr.data<float>(), static_cast<size_t>(K) * sizeof(float));
          std::memcpy(x8.data<float>() + p8 * K, xr.data<float>(), static_cast<size_t>(K) * sizeof(float));
          const di::Tensor y3 = di::cuda::copy_to_host(di::cuda::linear_tc(di::cuda::copy_to_device(x3), wd, o));
          const di::Tensor y8 = di::cuda::copy_to_host(di::cuda::linear_tc(di::cuda::copy_to_device(x8), wd, o));
          const float* a = y64.data<float>() + r * N;
          const float* b300 = y300.data<float>() + r * N;
          const float* b1 = y1.data<float>();
          const float* b16 = y16.data<float>() + pos * N;
          const float* b3 = y3.data<float>() + p3 * N;
          const float* b8 = y8.data<float>() + p8 * N;
          for (int64_t n = 0; n < N; ++n) {
            if (bits(a[n]) != bits(b1[n]) || bits(a[n]) != bits(b16[n]) || bits(a[n]) != bits(b300[n]) ||
                bits(a[n]) != bits(b3[n]) || bits(a[n]) != bits(b8[n])) {
              char buf[300];
              std::snprintf(
                  buf, sizeof buf,
                  "row %lld col %lld: M=64 %.9g, M=1 %.9g, M=3 %.9g, M=8 %.9g, M=16 (pos %lld) %.9g, M=300 %.9g",
                  static_cast<long long>(r), static_cast<long long>(n), a[n], b1[n], b3[n], b8[n],
                  static_cast<long long>(pos), b16[n], b300[n]);
              return std::string(buf);
            }
          }
        }
        return std::string();
      });
    }
  }
}

// Row l R + r of a grouped result y (host copy, R = x's rows) against linear_tc of x row r alone through expert ids[r]
// of list l, bit for bit: "" or the first difference (`what` names the grouped call).
std::string grouped_equals_per_row(const di::Tensor& y, const di::Tensor& x, const std::vector<int32_t>& ids,
                                   const std::vector<std::vector<di::ops::QWeight>>& lists,
                                   const di::ops::LinearOpts& o, const char* what) {
  const int64_t R = x.size(0), N = y.size(1);
  for (size_t l = 0; l < lists.size(); ++l)
    for (int64_t r = 0; r < R; ++r) {
      const di::ops::QWeight& w = lists[l][static_cast<size_t>(ids[static_cast<size_t>(r)])];
      const di::Tensor want = di::cuda::copy_to_host(
          di::cuda::linear_tc(di::cuda::copy_to_device(x.slice(0, r, r + 1).contiguous()), w, o));
      const float* a = want.data<float>();
      const float* b = y.data<float>() + (static_cast<int64_t>(l) * R + r) * N;
      for (int64_t n = 0; n < N; ++n)
        if (bits(a[n]) != bits(b[n])) {
          char buf[200];
          std::snprintf(buf, sizeof buf, "round=%d list %zu row %lld col %lld: %s %.9g, alone %.9g",
                        o.round_out_bf16 ? 1 : 0, l, static_cast<long long>(r), static_cast<long long>(n), what, b[n],
                        a[n]);
          return std::string(buf);
        }
    }
  return std::string();
}

// Grouped rows (linear_tc_grouped, the decode GEMV's grouped mode): row l R + r equals linear_tc of x row r through
// expert ids[r] of list l, bit for bit.
void test_grouped() {
  const Case cases[] = {
      {"v4.1 fp8 experts [1024,4096]", di::DType::kE4M3, 1024, 4096, 32, 32},
      {"v4.1 fp4 experts [2304,5120]", di::DType::kE2M1x2, 2304, 5120, 0, 32},
      {"v4.1 fp4 experts [5120,2304]", di::DType::kE2M1x2, 5120, 2304, 0, 32},
      {"v4 fp8 block 128 experts [640,2048]", di::DType::kE4M3, 640, 2048, 128, 128},
      {"fp8 block 64 ragged N experts [333,2176]", di::DType::kE4M3, 333, 2176, 64, 64},
  };
  uint32_t seed = 13000;
  for (const Case& c : cases) {
    for (const int64_t L : {int64_t{1}, int64_t{2}})
      for (const int stream : {2, 0}) {
        char name[240];
        std::snprintf(name, sizeof name,
                      "linear_tc_grouped %s lists=%lld (R = 6, 5 experts, stream %d) equals linear_tc per row", c.what,
                      static_cast<long long>(L), stream);
        run_case(name, [&] {
          struct Restore {
            int prev;
            ~Restore() { di::cuda::tc_stream_set(prev); }
          } restore{di::cuda::tc_stream_set(stream)};
          constexpr int64_t kE = 5, kR = 6;
          std::vector<std::vector<di::ops::QWeight>> lists(static_cast<size_t>(L));
          for (auto& list : lists)
            for (int64_t e = 0; e < kE; ++e) list.push_back(to_device(random_weight(c.dt, c.N, c.K, c.block, seed++)));
          std::vector<const std::vector<di::ops::QWeight>*> ptrs;
          for (const auto& list : lists) ptrs.push_back(&list);
          const std::vector<int32_t> ids = {3, 0, 3, 4, 1, 2};
          di::Tensor ih = di::Tensor::empty({kR}, di::DType::kI32);
          std::memcpy(ih.data<int32_t>(), ids.data(), ids.size() * sizeof(int32_t));
          const di::Tensor x = random_rows(kR, c.K, seed++);
          const di::Tensor xd = di::cuda::copy_to_device(x);
          for (const bool round : {false, true}) {
            di::ops::LinearOpts o;
            o.act_quant_block = c.act;
            o.round_out_bf16 = round;
            const di::Tensor y =
                di::cuda::copy_to_host(di::cuda::linear_tc_grouped(xd, di::cuda::copy_to_device(ih), ptrs, o));
            const std::string r = grouped_equals_per_row(y, x, ids, lists, o, "grouped");
            if (!r.empty()) return r;
          }
          return std::string();
        });
      }
  }
}

// Grouped rows sorted by expert through the GEMM kernel (linear_tc_grouped_gemm, large decode batches): row l R + r
// equals linear_tc of x row r alone through expert ids[r] of list l, bit for bit; experts with no rows, one row, and
// many tiles of 8 rows, with an expert's first row anywhere (its tiles start there).
void test_grouped_gemm() {
  const Case cases[] = {
      {"v4.1 fp4 experts [2304,5120]", di::DType::kE2M1x2, 2304, 5120, 0, 32},
      {"v4.1 fp4 experts [5120,2304]", di::DType::kE2M1x2, 5120, 2304, 0, 32},
      {"v4.1 fp8 experts [1024,4096]", di::DType::kE4M3, 1024, 4096, 32, 32},
      {"v4 fp8 block 128 experts [640,2048]", di::DType::kE4M3, 640, 2048, 128, 128},
      {"fp8 block 64 ragged N experts [333,2176]", di::DType::kE4M3, 333, 2176, 64, 64},
  };
  // Rows per expert: 12 experts, 0 / 1 / 37 rows among them (R = 150, two lists), 10 experts with 5 on average
  // (R = 49), 16 experts with at most 3 rows (R = 21), and 4 experts of prefill's tens of rows (R = 215, where the
  // default takes wider token tiles). Every layout runs at every token tile (linear_tc_set_grouped_variant).
  const std::vector<std::vector<int>> counts = {{5, 0, 1, 37, 9, 14, 0, 22, 3, 31, 17, 11},
                                                {4, 7, 0, 5, 9, 2, 6, 5, 3, 8},
                                                {2, 0, 3, 1, 1, 0, 2, 3, 1, 1, 0, 2, 1, 3, 0, 1},
                                                {70, 0, 64, 81}};
  uint32_t seed = 15000;
  for (const Case& c : cases) {
    for (const auto& cnt : counts) {
      const int64_t E = static_cast<int64_t>(cnt.size()), L = E == 12 ? 2 : 1;
      std::vector<int32_t> ids;
      for (int64_t e = 0; e < E; ++e)
        for (int i = 0; i < cnt[static_cast<size_t>(e)]; ++i) ids.push_back(static_cast<int32_t>(e));
      const int64_t R = static_cast<int64_t>(ids.size());
      char name[240];
      std::snprintf(name, sizeof name,
                    "linear_tc_grouped_gemm %s lists=%lld (R = %lld sorted over %lld experts) equals linear_tc per row",
                    c.what, static_cast<long long>(L), static_cast<long long>(R), static_cast<long long>(E));
      run_case(name, [&] {
        std::vector<std::vector<di::ops::QWeight>> lists(static_cast<size_t>(L));
        for (auto& list : lists)
          for (int64_t e = 0; e < E; ++e) list.push_back(to_device(random_weight(c.dt, c.N, c.K, c.block, seed++)));
        std::vector<const std::vector<di::ops::QWeight>*> ptrs;
        for (const auto& list : lists) ptrs.push_back(&list);
        di::Tensor ih = di::Tensor::empty({R}, di::DType::kI32);
        std::memcpy(ih.data<int32_t>(), ids.data(), ids.size() * sizeof(int32_t));
        const di::Tensor x = random_rows(R, c.K, seed++);
        const di::Tensor xd = di::cuda::copy_to_device(x);
        for (const bool round : {false, true}) {
          di::ops::LinearOpts o;
          o.act_quant_block = c.act;
          o.round_out_bf16 = round;
          for (int tile = 0; tile <= 4; ++tile) {
            const int prev = di::cuda::linear_tc_set_grouped_variant(tile);
            const di::Tensor y =
                di::cuda::copy_to_host(di::cuda::linear_tc_grouped_gemm(xd, di::cuda::copy_to_device(ih), ptrs, o));
            di::cuda::linear_tc_set_grouped_variant(prev);
            const std::string what = "gemm, token tile variant " + std::to_string(tile);
            const std::string r = grouped_equals_per_row(y, x, ids, lists, o, what.c_str());
            if (!r.empty()) return r;
          }
        }
        return std::string();
      });
    }
  }
}

// Batch invariance of a call on x [M, K] (host in, host out [M, N]): rows 0, 7, 38 and 99 of a 100-row call against
// the same rows at other positions of calls of 1, 8, 16 and 40 rows, bit for bit (every tile configuration).
std::string rows_batch_invariant(int64_t K, int64_t N, uint32_t& seed,
                                 const std::function<di::Tensor(const di::Tensor&)>& call) {
  const di::Tensor big = random_rows(100, K, seed++);
  const di::Tensor other = random_rows(40, K, seed++);
  const di::Tensor y100 = call(big);
  for (const int64_t r : {int64_t{0}, int64_t{7}, int64_t{38}, int64_t{99}}) {
    const float* a = y100.data<float>() + r * N;
    for (const int64_t M : {int64_t{1}, int64_t{8}, int64_t{16}, int64_t{40}}) {
      di::Tensor xm = other.slice(0, 0, M).contiguous();
      const int64_t pos = (r * 7 + 3) % M;
      std::memcpy(xm.data<float>() + pos * K, big.data<float>() + r * K, static_cast<size_t>(K) * sizeof(float));
      const di::Tensor ym = call(xm);
      const float* b = ym.data<float>() + pos * N;
      for (int64_t n = 0; n < N; ++n)
        if (bits(a[n]) != bits(b[n])) {
          char buf[200];
          std::snprintf(buf, sizeof buf, "row %lld col %lld: M=100 %.9g, M=%lld (pos %lld) %.9g",
                        static_cast<long long>(r), static_cast<long long>(n), a[n], static_cast<long long>(M),
                        static_cast<long long>(pos), b[n]);
          return std::string(buf);
        }
    }
  }
  return std::string();
}

}  // namespace

// The BF16 tensor-core linear (linear_tc_bf16.cuh): against the CPU op within (3 K/16 + 64) 2^-24 S, with
// non-finite x, a finite x past bf16's range and rows of every magnitude; and batch invariance bit for bit (a row of
// an M = 100 call equals the same row in calls of 1, 8, 16 and 40 rows at other positions: every tile configuration).
void test_bf16() {
  struct B {
    const char* what;
    int64_t N, K;
  };
  const B cases[] = {{"[1000,448]", 1000, 448},
                     {"[16421,1024]", 16421, 1024},
                     {"head-like [20000,5120]", 20000, 5120},
                     {"short K, N 37 [37,64]", 37, 64}};
  uint32_t seed = 16000;
  for (const B& c : cases) {
    const di::ops::QWeight wh = random_weight(di::DType::kBF16, c.N, c.K, 0, seed++);
    const di::ops::QWeight wd = to_device(wh);
    const di::ops::QWeight absw = abs_weight_bf16(wh);
    for (const bool round : {false, true}) {
      di::ops::LinearOpts o;
      o.round_out_bf16 = round;
      for (const int64_t M : {int64_t{1}, int64_t{5}, int64_t{9}, int64_t{33}, int64_t{100}}) {
        char name[240];
        std::snprintf(name, sizeof name, "linear_tc_bf16 vs cpu %s M=%lld round=%d", c.what, static_cast<long long>(M),
                      round ? 1 : 0);
        run_case(name, [&] {
          di::Tensor x = random_rows(M, c.K, seed++);
          if (M >= 5) {  // NaN, inf, -inf and a finite value that rounds to inf in bf16
            x.data<float>()[1 * c.K + 3] = std::numeric_limits<float>::quiet_NaN();
            x.data<float>()[2 * c.K + 5] = std::numeric_limits<float>::infinity();
            x.data<float>()[3 * c.K + 7] = -std::numeric_limits<float>::infinity();
            x.data<float>()[4 * c.K + 1] = 3.395e38f;
          }
          const di::Tensor want = di::ops::linear(x, wh, o);
          const di::Tensor got = di::cuda::copy_to_host(di::cuda::linear_tc_bf16(di::cuda::copy_to_device(x), wd, o));
          const di::Tensor S = abs_sums(x, 0, absw);
          std::string stats;
          const std::string r = compare_tol(want, got, S, 3 * c.K / 16 + 64, round, stats);
          std::printf("     %s\n", stats.c_str());
          return r;
        });
      }
      char name[240];
      std::snprintf(name, sizeof name, "linear_tc_bf16 batch invariance %s round=%d (M = 1, 8, 16, 40, 100)", c.what,
                    round ? 1 : 0);
      run_case(name, [&] {
        return rows_batch_invariant(c.K, c.N, seed, [&](const di::Tensor& x) {
          return di::cuda::copy_to_host(di::cuda::linear_tc_bf16(di::cuda::copy_to_device(x), wd, o));
        });
      });
    }
  }
  run_case("linear_tc_bf16 refuses what it cannot take", [] {
    const di::ops::QWeight wd = to_device(random_weight(di::DType::kBF16, 64, 96, 0, 1));
    const di::Tensor x = di::cuda::copy_to_device(random_rows(2, 96, 2));
    di::ops::LinearOpts o;
    if (di::cuda::linear_tc_bf16_supported(x, wd, o)) return std::string("K = 96 accepted");
    bool threw = false;
    try {
      (void)di::cuda::linear_tc_bf16(x, wd, o);
    } catch (const di::Error&) {
      threw = true;
    }
    if (!threw) return std::string("K = 96 did not throw");
    const di::ops::QWeight w128 = to_device(random_weight(di::DType::kBF16, 64, 128, 0, 3));
    const di::Tensor x128 = di::cuda::copy_to_device(random_rows(2, 128, 4));
    o.act_quant_block = 32;
    if (di::cuda::linear_tc_bf16_supported(x128, w128, o)) return std::string("act_quant_block 32 accepted");
    o.act_quant_block = 0;
    if (!di::cuda::linear_tc_bf16_supported(x128, w128, o)) return std::string("a plain call refused");
    if (di::cuda::linear_tc_bf16_takes(x128, w128, o)) return std::string("a 64-row weight taken as a head");
    return std::string();
  });
}

// The grouped form (linear_tc_groups, wo_a's groups under tc): each group of an M-row call against the CPU op on its
// columns of x and its rows of W, within (3 K/16 + K/B + 64) 2^-24 S (E4M3) or (3 K/16 + 64) 2^-24 S (BF16), NaN in x
// included; a row's bits the same in calls of 1, 8, 16, 40 and 100 rows; and the refusals.
void test_groups() {
  struct G {
    const char* what;
    di::DType dt;
    int64_t groups, N, K, block;
  };
  const G cases[] = {{"v4.1 wo_a e4m3 8 x [1024, 4096] block 32", di::DType::kE4M3, 8, 1024, 4096, 32},
                     {"v4 e4m3 4 x [256, 512] block 128", di::DType::kE4M3, 4, 256, 512, 128},
                     {"e4m3 3 x [96, 256] block 32 (ragged tiles)", di::DType::kE4M3, 3, 96, 256, 32},
                     {"bf16 2 x [40, 128]", di::DType::kBF16, 2, 40, 128, 0}};
  uint32_t seed = 17000;
  for (const G& c : cases) {
    const di::ops::QWeight wh = random_weight(c.dt, c.groups * c.N, c.K, c.block, seed++);
    const di::ops::QWeight wd = to_device(wh);
    std::vector<di::ops::QWeight> parts, absw;
    for (int64_t g = 0; g < c.groups; ++g) {
      di::ops::QWeight q = wh;
      q.w = wh.w.slice(0, g * c.N, (g + 1) * c.N).contiguous();
      if (wh.scale.defined()) q.scale = wh.scale.slice(0, g * c.N / c.block, (g + 1) * c.N / c.block).contiguous();
      parts.push_back(q);
      absw.push_back(abs_weight_bf16(q));
    }
    const int64_t depth = 3 * c.K / 16 + (c.block > 0 ? c.K / c.block : 0) + 64, KX = c.groups * c.K;
    for (const bool round : {false, true}) {
      di::ops::LinearOpts o;
      o.round_out_bf16 = round;
      for (const int64_t M : {int64_t{1}, int64_t{9}, int64_t{40}}) {
        char name[240];
        std::snprintf(name, sizeof name, "linear_tc_groups vs cpu %s M=%lld round=%d", c.what,
                      static_cast<long long>(M), round ? 1 : 0);
        run_case(name, [&] {
          di::Tensor x = random_rows(M, KX, seed++);
          if (M >= 9) x.data<float>()[3 * KX + c.K + 2] = std::numeric_limits<float>::quiet_NaN();  // group 1, row 3
          const di::Tensor got =
              di::cuda::copy_to_host(di::cuda::linear_tc_groups(di::cuda::copy_to_device(x), wd, c.groups, o));
          std::string all_stats;
          for (int64_t g = 0; g < c.groups; ++g) {
            const di::Tensor xg = x.slice(1, g * c.K, (g + 1) * c.K).contiguous();
            const di::Tensor want = di::ops::linear(xg, parts[static_cast<size_t>(g)], o);
            const di::Tensor gotg = got.slice(1, g * c.N, (g + 1) * c.N).contiguous();
            std::string stats;
            const std::string r =
                compare_tol(want, gotg, abs_sums(xg, 0, absw[static_cast<size_t>(g)]), depth, round, stats);
            if (!r.empty()) return "group " + std::to_string(g) + ": " + r;
            if (g == 0) all_stats = stats;
          }
          std::printf("     group 0: %s\n", all_stats.c_str());
          return std::string();
        });
      }
      char name[240];
      std::snprintf(name, sizeof name, "linear_tc_groups batch invariance %s round=%d (M = 1, 8, 16, 40, 100)", c.what,
                    round ? 1 : 0);
      run_case(name, [&] {
        return rows_batch_invariant(KX, c.groups * c.N, seed, [&](const di::Tensor& x) {
          return di::cuda::copy_to_host(di::cuda::linear_tc_groups(di::cuda::copy_to_device(x), wd, c.groups, o));
        });
      });
    }
  }
  run_case("linear_tc_groups refuses what it cannot take", [] {
    const di::ops::QWeight w = to_device(random_weight(di::DType::kE4M3, 4 * 64, 256, 32, 5));
    const di::Tensor x = di::cuda::copy_to_device(random_rows(2, 4 * 256, 6));
    di::ops::LinearOpts o;
    if (!di::cuda::linear_tc_groups_supported(x, w, 4, o)) return std::string("a plain grouped call refused");
    if (di::cuda::linear_tc_groups_supported(x, w, 3, o)) return std::string("3 groups of 256 rows accepted");
    if (di::cuda::linear_tc_groups_supported(x.slice(1, 0, 512), w, 4, o))
      return std::string("x of 512 columns accepted");
    const di::ops::QWeight w192 = to_device(random_weight(di::DType::kE4M3, 4 * 64, 192, 32, 8));
    if (di::cuda::linear_tc_groups_supported(di::cuda::copy_to_device(random_rows(2, 4 * 192, 9)), w192, 4, o))
      return std::string("K = 192 (quarters of 48 columns) accepted");
    o.act_quant_block = 32;
    if (di::cuda::linear_tc_groups_supported(x, w, 4, o)) return std::string("act_quant_block 32 accepted");
    o.act_quant_block = 0;
    const di::ops::QWeight w96 = to_device(random_weight(di::DType::kE4M3, 4 * 48, 256, 32, 7));
    if (di::cuda::linear_tc_groups_supported(x, w96, 4, o)) return std::string("groups of 48 rows (block 32) accepted");
    bool threw = false;
    try {
      (void)di::cuda::linear_tc_groups(x, w, 3, o);
    } catch (const di::Error&) {
      threw = true;
    }
    if (!threw) return std::string("3 groups did not throw");
    if (di::cuda::linear_tc_bf16_supported(x, w, o)) return std::string("an E4M3 weight taken by the BF16 head path");
    return std::string();
  });
}

int main() {
  return cuda_test::run_test_program([] {
    // The one-row stream (linear_tc_stream.cu) on for every call it can take, whatever its size and
    // DEEPINFER_CUDA_TC_STREAM: its M = 1 rows are then checked against the GEMM kernel (batch invariance) and its
    // grouped rows against linear_tc per row (test_grouped runs those with it off too, for the decode GEMV's grouped
    // mode).
    di::cuda::tc_stream_set(2);
    test_bf16();
    test_groups();
    test_unsupported();
    test_batch_invariance();
    test_grouped();
    test_grouped_gemm();
    test_against_cpu();
  });
}
