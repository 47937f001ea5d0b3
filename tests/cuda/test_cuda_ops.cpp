// GPU check of the CUDA kernels against the CPU ops (the reference for every backend).
//
// Not a ctest test (CI has no GPU). Run on a Hopper machine:
//   ./build/src/cuda/deepinfer_cuda_tests
// Prints one PASS/FAIL line per case; exit status 0 = all passed, 1 = a failure, 2 = no GPU.
//
// fake_quant_fp8 and round_bf16 must match bit for bit (their results do not depend on any
// summation order). rms_norm sums in a different order on each backend, so it is compared with
// a tolerance: 1e-5 relative in fp32, at most one bf16 step when rounding.
//
// The remaining ops (each case prints "differ x/n max|d|" and its rule):
//   bit for bit: fake_quant_fp4, fake_quant_fp4_e4m3_scale, dequantize, hadamard, apply_rope,
//     hc_collapse, hc_expand, topk_rows (indices), attn_input_norms (against the CUDA ops it fuses, and against the
//     CPU op: its norms' FP64 sums could round apart as rms_norm's, which these cases never do);
//   tolerance: hc_mixes 2e-6 relative (FP64 sums in another order, exp ulps), hc_head (its pre as
//     hc_mixes: one bf16 step rounded, 1e-5 otherwise), sparse_attention (CPU order replayed, exp as
//     fp32(exp(double)) vs glibc expf: 1e-5 of the row max for >= 99.9% of values, 1e-2 for all).
// The model-level ops: index_scores, embedding, gather_rows bit for bit; moe_route ids exact and
//   weights 1e-6 relative, swiglu 1e-6 relative (one bf16 step when rounded): exp / log1p as
//   fp32(exp/log1p(double)) vs glibc expf / log1pf. moe_group, moe_combine, copy_into, renorm_heads bit for bit;
//   moe_combine_expand bit for bit against the CPU's hc_expand(moe_combine(...));
//   compress_pool 1e-5 relative + 1e-6 absolute (exp as fp32(exp(double)) vs glibc expf).
// The index lists: candidate_blocks, mask_to_blocks, topk_rows by index and sparse_index bit for bit.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cuda/attention.cuh"
#include "cuda/device.h"
#include "cuda/hopper.cuh"
#include "cuda/linear.cuh"
#include "cuda/model_ops.cuh"
#include "cuda/quant.cuh"
#include "cuda/rms_norm.cuh"
#include "cuda/topk.cuh"
#include "cuda_test_util.h"
#include "deepinfer/dtype.h"
#include "deepinfer/error.h"
#include "ops/ops.h"

namespace di = deepinfer;

namespace {

using namespace cuda_test;  // NOLINT: the shared test helpers

// Compares two CPU float32 tensors of the same shape bit for bit.
std::string compare_exact(const di::Tensor& want, const di::Tensor& got) {
  const int64_t n = want.numel();
  if (got.numel() != n) return "size mismatch";
  const float* a = want.data<float>();
  const float* b = got.data<float>();
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (bits(a[i]) != bits(b[i])) {
      if (first < 0) first = i;
      ++bad;
    }
  }
  if (bad == 0) return "";
  char buf[200];
  std::snprintf(buf, sizeof buf, "%lld of %lld values differ; first at %lld: cpu %.9g, cuda %.9g",
                static_cast<long long>(bad), static_cast<long long>(n), static_cast<long long>(first), a[first],
                b[first]);
  return buf;
}

// rms_norm tolerance: fp32 relative 1e-5, or (bf16 mode) at most one bf16 step apart.
std::string compare_close(const di::Tensor& want, const di::Tensor& got, bool bf16) {
  const int64_t n = want.numel();
  if (got.numel() != n) return "size mismatch";
  const float* a = want.data<float>();
  const float* b = got.data<float>();
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < n; ++i) {
    bool ok;
    if (bf16) {
      const int64_t d = static_cast<int64_t>(di::f32_to_bf16(a[i])) - static_cast<int64_t>(di::f32_to_bf16(b[i]));
      ok = d >= -1 && d <= 1;  // same sign and neighbouring codes
    } else {
      ok = std::fabs(a[i] - b[i]) <= 1e-5f * std::fabs(a[i]) + 1e-30f;
    }
    if (!ok) {
      if (first < 0) first = i;
      ++bad;
    }
  }
  if (bad == 0) return "";
  char buf[200];
  std::snprintf(buf, sizeof buf, "%lld of %lld values out of tolerance; first at %lld: cpu %.9g, cuda %.9g",
                static_cast<long long>(bad), static_cast<long long>(n), static_cast<long long>(first), a[first],
                b[first]);
  return buf;
}

void test_fake_quant_fp8() {
  struct Case {
    int64_t rows, cols, begin, end, block;
  };
  const Case cases[] = {
      {37, 512, 0, 512, 128},   // activation quantisation of a GEMM input
      {16, 512, 64, 448, 64},   // a column range (e.g. the non-rope part of a KV row)
      {5, 500, 0, 500, 128},    // partial last group
      {1, 7168, 0, 7168, 128},  // one long row
  };
  uint32_t seed = 1;
  for (const Case& c : cases) {
    char name[128];
    std::snprintf(name, sizeof name, "fake_quant_fp8 [%lld, %lld] cols [%lld, %lld) block %lld",
                  static_cast<long long>(c.rows), static_cast<long long>(c.cols), static_cast<long long>(c.begin),
                  static_cast<long long>(c.end), static_cast<long long>(c.block));
    run_case(name, [&] {
      di::Tensor cpu = random_rows(c.rows, c.cols, seed++);
      di::Tensor dev = di::cuda::copy_to_device(cpu);
      di::ops::fake_quant_fp8(cpu, c.begin, c.end, c.block);
      di::cuda::fake_quant_fp8(dev, c.begin, c.end, c.block);
      return compare_exact(cpu, di::cuda::copy_to_host(dev));
    });
  }
  // A column slice of a wider tensor on the device (row stride != cols).
  run_case("fake_quant_fp8 on a strided column slice", [&] {
    di::Tensor host = random_rows(9, 512, seed++);
    di::Tensor dev = di::cuda::copy_to_device(host);
    di::Tensor dev_slice = dev.slice(1, 128, 384);
    di::cuda::fake_quant_fp8(dev_slice, 0, 256, 128);
    di::Tensor want = host.clone();
    di::ops::fake_quant_fp8(want, 128, 384, 128);
    return compare_exact(want, di::cuda::copy_to_host(dev));
  });
}

void test_round_bf16() {
  run_case("round_bf16 [64, 1000]", [] {
    di::Tensor cpu = random_rows(64, 1000, 99);
    di::Tensor dev = di::cuda::copy_to_device(cpu);
    di::ops::round_bf16(cpu, true);
    di::cuda::round_bf16(dev, true);
    return compare_exact(cpu, di::cuda::copy_to_host(dev));
  });
}

void test_rms_norm() {
  enum class W { kNone, kF32, kBF16 };
  struct Case {
    int64_t rows, cols;
    W w;
    bool round;
  };
  const Case cases[] = {
      {5, 4096, W::kBF16, true},
      {5, 4096, W::kBF16, false},
      {3, 7168, W::kF32, true},
      {4, 512, W::kNone, true},
      {4, 512, W::kNone, false},
      {2, 100, W::kF32, false},
      // the register-held kernel's range (cols % 4 == 0, <= 8192) and edges; 8196 and 102 take the loop
      {1, 5120, W::kBF16, true},
      {2, 1024, W::kBF16, true},
      {1, 8192, W::kF32, false},
      {1, 36, W::kNone, false},
      {2, 8196, W::kBF16, true},
      {3, 102, W::kF32, true},
  };
  uint32_t seed = 1000;
  for (const Case& c : cases) {
    const char* wname = c.w == W::kNone ? "none" : (c.w == W::kF32 ? "f32" : "bf16");
    char name[128];
    std::snprintf(name, sizeof name, "rms_norm [%lld, %lld] weight %s round %d", static_cast<long long>(c.rows),
                  static_cast<long long>(c.cols), wname, c.round ? 1 : 0);
    run_case(name, [&] {
      const float eps = 1e-6f;
      di::Tensor x = random_rows(c.rows, c.cols, seed++);
      di::Tensor w;
      if (c.w != W::kNone) {
        di::Tensor wf = random_rows(1, c.cols, seed++).view({c.cols});
        if (c.w == W::kF32) {
          w = wf;
        } else {
          w = di::Tensor::empty({c.cols}, di::DType::kBF16);
          for (int64_t i = 0; i < c.cols; ++i) w.data<uint16_t>()[i] = di::f32_to_bf16(wf.data<float>()[i]);
        }
      }
      di::Tensor want = di::ops::rms_norm(x, w, eps, c.round);
      di::Tensor got = di::cuda::rms_norm(di::cuda::copy_to_device(x),
                                          w.defined() ? di::cuda::copy_to_device(w) : di::Tensor(), eps, c.round);
      return compare_close(want, di::cuda::copy_to_host(got), c.round);
    });
  }
}

// ---- linear ----------------------------------------------------------------------------------------------
// Exact comparison that also reports the largest difference (in bf16 steps when rounding).
std::string compare_linear(const di::Tensor& want, const di::Tensor& got, std::string& stats) {
  const int64_t n = want.numel();
  const float* a = want.data<float>();
  const float* b = got.data<float>();
  int64_t bad = 0;
  double maxabs = 0.0, maxrel = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (bits(a[i]) != bits(b[i])) {
      ++bad;
      const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
      maxabs = std::max(maxabs, d);
      maxrel = std::max(maxrel, d / std::max(1e-30, std::fabs(static_cast<double>(a[i]))));
    }
  }
  char buf[200];
  std::snprintf(buf, sizeof buf, "differ %lld/%lld max|d| %.3g maxrel %.3g", static_cast<long long>(bad),
                static_cast<long long>(n), maxabs, maxrel);
  stats = buf;
  return bad == 0 ? "" : stats;
}

// ops::linear of x by a weight (wh on the CPU, wd its device copy) on both devices, compared bit for bit.
std::string check_linear(const di::Tensor& x, const di::ops::QWeight& wh, const di::ops::QWeight& wd, int64_t act,
                         bool round) {
  di::ops::LinearOpts o;
  o.act_quant_block = act;
  o.round_out_bf16 = round;
  const di::Tensor want = di::ops::linear(x, wh, o);
  const di::Tensor got = di::ops::linear(di::cuda::copy_to_device(x), wd, o);
  std::string stats;
  const std::string r = compare_linear(want, di::cuda::copy_to_host(got), stats);
  std::printf("     %s\n", stats.c_str());
  return r;
}

// Lists of random expert weights on both devices, with the list pointers ops::linear_grouped takes (which point into
// the struct: neither copied nor moved).
struct ExpertLists {
  std::vector<std::vector<di::ops::QWeight>> host, dev;
  std::vector<const std::vector<di::ops::QWeight>*> hl, dl;
  ExpertLists(di::DType dt, int64_t N, int64_t K, int64_t block, int64_t E, int64_t lists, uint32_t& seed)
      : host(static_cast<size_t>(lists)), dev(static_cast<size_t>(lists)) {
    for (size_t l = 0; l < host.size(); ++l) {
      for (int64_t e = 0; e < E; ++e) {
        host[l].push_back(random_weight(dt, N, K, block, seed++));
        dev[l].push_back(to_device(host[l].back()));
      }
      hl.push_back(&host[l]), dl.push_back(&dev[l]);
    }
  }
  ExpertLists(const ExpertLists&) = delete;
  ExpertLists& operator=(const ExpertLists&) = delete;
};

// ops::linear_grouped of x's rows (row r through expert ids[r]) on both devices, the GPU's call with tile_rows and
// row_period, compared bit for bit; out bf16-rounded.
std::string check_grouped(const ExpertLists& w, const di::Tensor& x, const di::Tensor& ids, int64_t act,
                          int64_t tile_rows, int64_t row_period) {
  di::ops::LinearOpts o;
  o.act_quant_block = act;
  o.round_out_bf16 = true;
  const di::Tensor want = di::ops::linear_grouped(x, ids, w.hl, o);
  const di::Tensor got = di::ops::linear_grouped(di::cuda::copy_to_device(x), di::cuda::copy_to_device(ids), w.dl, o,
                                                 tile_rows, row_period);
  std::string stats;
  const std::string r = compare_linear(want, di::cuda::copy_to_host(got), stats);
  std::printf("     %s\n", stats.c_str());
  return r;
}

void test_linear() {
  struct Case {
    const char* what;
    di::DType dt;
    int64_t K, N, block, act;
    bool round;
  };
  const Case cases[] = {
      {"v4.1 wq_a-like", di::DType::kE4M3, 5120, 1280, 32, 128, true},
      {"v4.1 wq_b-like", di::DType::kE4M3, 1280, 32768, 32, 128, false},
      {"v4.1 wkv-like", di::DType::kE4M3, 5120, 512, 32, 128, true},
      {"v4.1 wo-like", di::DType::kE4M3, 8192, 5120, 32, 128, false},
      {"v4.1 expert w1", di::DType::kE2M1x2, 5120, 2304, 32, 128, true},
      {"v4.1 expert w2", di::DType::kE2M1x2, 2304, 5120, 32, 128, false},
      {"v4 block 128", di::DType::kE4M3, 5120, 1280, 128, 128, false},
      {"v4 block 128 wo-like", di::DType::kE4M3, 8192, 5120, 128, 128, true},
      {"fp8 no act quant", di::DType::kE4M3, 5120, 1280, 128, 0, false},
      {"bf16", di::DType::kBF16, 5120, 1280, 0, 0, false},
      {"bf16 rounded", di::DType::kBF16, 1280, 4096, 0, 0, true},
      // Wider than bf16_lane_gemv takes: at one row the slab kernel stages x from the row itself (the head's path).
      {"bf16 wide", di::DType::kBF16, 1024, 8300, 0, 0, false},
      {"fp8 ragged N", di::DType::kE4M3, 4160, 1000, 128, 128, false},
      {"fp8 block 64, ragged slabs and N", di::DType::kE4M3, 2112, 333, 64, 128, true},
      {"fp8 block 32, short K, ragged N", di::DType::kE4M3, 96, 37, 32, 0, false},
      {"fp4 short K, ragged N", di::DType::kE2M1x2, 96, 37, 32, 0, false},
      {"bf16 short K, ragged N", di::DType::kBF16, 96, 37, 0, 0, true},
  };
  uint32_t seed = 5000;
  for (const Case& c : cases) {
    const di::ops::QWeight wh = random_weight(c.dt, c.N, c.K, c.block, seed++);
    const di::ops::QWeight wd = to_device(wh);
    for (int64_t M : {1, 2, 3, 4, 16, 64}) {
      char name[200];
      std::snprintf(name, sizeof name, "linear %s %s K=%lld N=%lld B=%lld act=%lld round=%d M=%lld", c.what,
                    di::dtype_name(c.dt), static_cast<long long>(c.K), static_cast<long long>(c.N),
                    static_cast<long long>(c.block), static_cast<long long>(c.act), c.round ? 1 : 0,
                    static_cast<long long>(M));
      run_case(name, [&] {
        di::Tensor x = random_rows(M, c.K, seed++);
        di::ops::round_bf16(x, true);  // activations live on the bf16 grid
        di::ops::LinearOpts o;
        o.act_quant_block = c.act;
        o.round_out_bf16 = c.round;
        const di::Tensor want = di::ops::linear(x, wh, o);
        di::Tensor got = di::ops::linear(di::cuda::copy_to_device(x), wd, o);  // the op layer's dispatch
        std::string stats;
        const std::string r = compare_linear(want, di::cuda::copy_to_host(got), stats);
        std::printf("     %s\n", stats.c_str());
        return r;
      });
    }
  }
  // A NaN code makes the row NaN, as on the CPU.
  run_case("linear fp8 NaN code", [&] {
    di::ops::QWeight wh = random_weight(di::DType::kE4M3, 64, 512, 128, seed++);
    wh.w.data<uint8_t>()[3 * 512 + 100] = 0x7f;
    di::Tensor x = random_rows(2, 512, seed++);
    di::ops::round_bf16(x, true);
    di::ops::LinearOpts o;
    std::string stats;
    return compare_linear(di::ops::linear(x, wh, o),
                          di::cuda::copy_to_host(di::ops::linear(di::cuda::copy_to_device(x), to_device(wh), o)),
                          stats);
  });
}

// The tiled E4M3 GEMM (linear_gemm_fp8.cuh), forced from one row: against the CPU op on the V4.1 / V4 dense shapes,
// ragged rows of x (its tiles of 32 / 16) and of the weight (tiles of 64, odd N), tiles of 32, 64 and 128, no act
// quant, and a NaN weight code; K a multiple of its 128-column stage (other K keep the other kernels). x on the bf16
// grid (the model's), raw fp32 x without act quant (the slow path: products not exact), or one value of 3e30 (its
// group scale beyond the fast path's 2^91: that stage of every block of its row takes the slow path).
void test_linear_fp8_gemm() {
  enum XKind { kBf16X, kRawX, kHugeX };
  struct Case {
    const char* what;
    int64_t K, N, block, act;
    bool round;
    std::vector<int64_t> Ms;
    XKind xk = kBf16X;
  };
  const Case cases[] = {
      {"v4.1 wq_a + wkv-like", 5120, 1536, 32, 32, true, {1, 5, 16, 33, 100, 256}},
      {"v4.1 wq_b-like", 1024, 4096, 32, 32, false, {17, 64, 130}},
      {"v4.1 wo-like", 8192, 640, 32, 32, false, {40, 256}},
      {"v4 block 128, ragged N", 4096, 1000, 128, 128, false, {3, 47, 100}},
      {"block 64, ragged N", 2048, 333, 64, 64, true, {20, 64}},
      {"no act quant", 1024, 256, 128, 0, false, {33}},
      {"odd N, one stage", 128, 37, 32, 32, true, {9, 70}},
      {"raw fp32 x, no act quant", 1024, 320, 32, 0, false, {45}, kRawX},
      {"one huge x value", 2048, 256, 32, 32, true, {40}, kHugeX},
  };
  di::cuda::linear_set_fp8_gemm_rows(1);
  uint32_t seed = 7000;
  for (const Case& c : cases) {
    const di::ops::QWeight wh = random_weight(di::DType::kE4M3, c.N, c.K, c.block, seed++);
    const di::ops::QWeight wd = to_device(wh);
    for (int64_t M : c.Ms) {
      char name[200];
      std::snprintf(name, sizeof name, "linear fp8_gemm %s K=%lld N=%lld B=%lld act=%lld round=%d M=%lld", c.what,
                    static_cast<long long>(c.K), static_cast<long long>(c.N), static_cast<long long>(c.block),
                    static_cast<long long>(c.act), c.round ? 1 : 0, static_cast<long long>(M));
      run_case(name, [&] {
        di::Tensor x = random_rows(M, c.K, seed++);
        if (c.xk != kRawX) di::ops::round_bf16(x, true);
        if (c.xk == kHugeX) x.data<float>()[(M / 2) * c.K + 300] = 3e30f;
        return check_linear(x, wh, wd, c.act, c.round);
      });
    }
  }
  // Grouped calls with a row period, one launch over the matrices: wo_a's groups (row r through group r % 8), the
  // shared expert's w1 / w3 (two lists of one matrix), a period whose experts are permuted (row_expert read on the
  // device), tiles of 128.
  struct GroupCase {
    const char* what;
    int64_t N, K, block, E, P, R, lists, act;
    bool permuted;
  };
  const GroupCase gcases[] = {
      {"wo_a-like groups", 256, 512, 32, 8, 8, 8 * 70, 1, 0, false},
      {"shared w1 + w3-like", 320, 1024, 32, 1, 1, 100, 2, 32, false},
      {"permuted period, block 128", 200, 1024, 128, 4, 4, 4 * 33, 2, 128, true},
  };
  for (const GroupCase& c : gcases) {
    run_case(std::string("linear_grouped fp8_gemm ") + c.what, [&] {
      const ExpertLists w(di::DType::kE4M3, c.N, c.K, c.block, c.E, c.lists, seed);
      di::Tensor ids = di::Tensor::empty({c.R}, di::DType::kI32);
      for (int64_t r = 0; r < c.R; ++r)
        ids.data<int32_t>()[r] = static_cast<int32_t>(c.permuted ? (c.E - 1 - r % c.P) : r % c.P);
      di::Tensor x = random_rows(c.R, c.K, seed++);
      di::ops::round_bf16(x, true);
      return check_grouped(w, x, ids, c.act, 0, c.P);
    });
  }
  run_case("linear fp8_gemm NaN code", [&] {
    di::ops::QWeight wh = random_weight(di::DType::kE4M3, 70, 512, 32, seed++);
    wh.w.data<uint8_t>()[3 * 512 + 100] = 0x7f;
    wh.w.data<uint8_t>()[66 * 512 + 511] = 0xff;
    di::Tensor x = random_rows(40, 512, seed++);
    di::ops::round_bf16(x, true);
    di::ops::LinearOpts o;
    o.act_quant_block = 32;
    std::string stats;
    return compare_linear(di::ops::linear(x, wh, o),
                          di::cuda::copy_to_host(di::ops::linear(di::cuda::copy_to_device(x), to_device(wh), o)),
                          stats);
  });
  di::cuda::linear_set_fp8_gemm_rows(-1);
}

// The exact tiled FP4 GEMM (linear_gemm_fp4.cuh), forced from one row of x (cuda::linear_set_fp4_gemm_rows): dense
// calls on the routed experts' shapes and ragged ones (several 16-row passes, a last partial tile of weight rows),
// with and without act quant, scale codes outside the fast decode's [104, 128] (the exact fp32 decode, 255 = NaN), raw
// fp32 x; then grouped calls on rows sorted by expert (empty experts, experts of 1 to 40 rows, one or two lists);
// each bit for bit against the CPU op.
void test_linear_fp4_gemm() {
  struct Case {
    const char* what;
    int64_t N, K, act;
    bool round;
    std::vector<int64_t> Ms;
    bool raw_x = false;
    int scale_lo = 0, scale_hi = 0;  // non-zero: the scale codes drawn from [lo, hi] instead of random_weight's
  };
  const Case cases[] = {
      {"w1-like", 2304, 5120, 32, true, {1, 16, 64}},
      {"w2-like", 5120, 2304, 32, true, {17, 40}},
      {"ragged N, one stage", 100, 128, 32, false, {3, 33}},
      {"no act quant", 192, 1024, 0, true, {20}},
      {"raw fp32 x", 130, 512, 0, false, {18}, true},
      {"scale codes 1 .. 254", 96, 1024, 32, false, {24}, false, 1, 254},
      {"scale codes 250 .. 255 (NaN)", 64, 256, 32, false, {9}, false, 250, 255},
  };
  di::cuda::linear_set_fp4_gemm_rows(1);
  uint32_t seed = 7600;
  for (const Case& c : cases) {
    di::ops::QWeight wh = random_weight(di::DType::kE2M1x2, c.N, c.K, 32, seed++);
    if (c.scale_hi > 0) {
      std::mt19937 rng(seed++);
      std::uniform_int_distribution<int> e(c.scale_lo, c.scale_hi);
      for (int64_t i = 0; i < wh.scale.numel(); ++i) wh.scale.data<uint8_t>()[i] = static_cast<uint8_t>(e(rng));
    }
    const di::ops::QWeight wd = to_device(wh);
    for (int64_t M : c.Ms) {
      char name[200];
      std::snprintf(name, sizeof name, "linear fp4_gemm %s K=%lld N=%lld act=%lld round=%d M=%lld", c.what,
                    static_cast<long long>(c.K), static_cast<long long>(c.N), static_cast<long long>(c.act),
                    c.round ? 1 : 0, static_cast<long long>(M));
      run_case(name, [&] {
        di::Tensor x = random_rows(M, c.K, seed++);
        if (!c.raw_x) di::ops::round_bf16(x, true);
        return check_linear(x, wh, wd, c.act, c.round);
      });
    }
  }
  struct GroupCase {
    const char* what;
    int64_t N, K, E, lists, act;
    std::vector<int> rows;  // rows of each expert (sorted order), 0 = empty
  };
  const GroupCase gcases[] = {
      {"w1 + w3-like, 2 lists", 256, 1024, 6, 2, 32, {17, 0, 1, 40, 16, 5}},
      {"w2-like, ragged N", 300, 512, 5, 1, 32, {0, 33, 2, 0, 20}},
      {"no act quant", 128, 256, 4, 2, 0, {8, 8, 0, 31}},
  };
  for (const GroupCase& c : gcases) {
    run_case(std::string("linear_grouped fp4_gemm ") + c.what, [&] {
      const ExpertLists w(di::DType::kE2M1x2, c.N, c.K, 32, c.E, c.lists, seed);
      std::vector<int32_t> order;
      for (int64_t e = 0; e < c.E; ++e)
        order.insert(order.end(), static_cast<size_t>(c.rows[e]), static_cast<int32_t>(e));
      const int64_t R = static_cast<int64_t>(order.size());
      di::Tensor ids = di::Tensor::empty({R}, di::DType::kI32);
      std::copy(order.begin(), order.end(), ids.data<int32_t>());
      di::Tensor x = random_rows(R, c.K, seed++);
      di::ops::round_bf16(x, true);
      return check_grouped(w, x, ids, c.act, 4, 0);
    });
  }
  di::cuda::linear_set_fp4_gemm_rows(-1);
}

// ops::linear_grouped through the op layer (the expert table, one or two lists in one launch), against
// the CPU op, on the decode shapes of the routed experts (FP4) and of wo_a's groups (FP8 block 32).
void test_linear_grouped() {
  struct Case {
    const char* what;
    di::DType dt;
    int64_t N, K, block, E, R, lists;
  };
  const Case cases[] = {
      {"experts w1+w3 fp4, 1 token", di::DType::kE2M1x2, 2304, 5120, 32, 16, 6, 2},
      {"experts w2 fp4, 8 tokens", di::DType::kE2M1x2, 5120, 2304, 32, 16, 48, 1},
      {"experts w1+w3 fp4, 40 tokens", di::DType::kE2M1x2, 256, 512, 32, 12, 240, 2},
      {"wo_a groups fp8, 2 tokens", di::DType::kE4M3, 1024, 4096, 32, 8, 16, 1},
      {"fp8 block 128 ragged N", di::DType::kE4M3, 333, 1024, 128, 5, 7, 2},
  };
  uint32_t seed = 9000;
  for (const Case& c : cases) {
    run_case(std::string("linear_grouped ") + c.what, [&] {
      const ExpertLists w(c.dt, c.N, c.K, c.block, c.E, c.lists, seed);
      di::Tensor ids = di::Tensor::empty({c.R}, di::DType::kI32);
      std::mt19937 rng(seed++);
      for (int64_t r = 0; r < c.R; ++r) ids.data<int32_t>()[r] = static_cast<int32_t>(rng() % c.E);
      std::sort(ids.data<int32_t>(), ids.data<int32_t>() + c.R);  // moe_group's order: by expert
      di::Tensor x = random_rows(c.R, c.K, seed++);
      di::ops::round_bf16(x, true);
      return check_grouped(w, x, ids, 32, 0, 0);
    });
  }
}

// ---- the remaining ops (issue 8): quantisers, dequantize, hadamard, rope, hyper-connections, attention, top-k ----
// Comparison with NaN == NaN and a per-case report line "     differ x/n max|d| ..." (as linear's).
struct Diff {
  int64_t n = 0, differ = 0, bad = 0, first_bad = -1;
  double maxabs = 0.0;
};

std::string diff_line(const Diff& d) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "differ %lld/%lld max|d| %.3g", static_cast<long long>(d.differ),
                static_cast<long long>(d.n), d.maxabs);
  return buf;
}

// Bit-for-bit comparison (NaNs equal); prints the stats line.
std::string exact(const di::Tensor& want_any, const di::Tensor& got_dev) {
  const di::Tensor got = got_dev.device() == di::Device::kCUDA ? di::cuda::copy_to_host(got_dev) : got_dev;
  const di::Tensor want = want_any.device() == di::Device::kCUDA ? di::cuda::copy_to_host(want_any) : want_any;
  if (got.numel() != want.numel()) return "size mismatch";
  const float* a = want.data<float>();
  const float* b = got.data<float>();
  Diff d;
  d.n = want.numel();
  for (int64_t i = 0; i < d.n; ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (bits(a[i]) != bits(b[i])) {
      if (d.first_bad < 0) d.first_bad = i;
      ++d.differ;
      d.maxabs = std::max(d.maxabs, std::fabs(static_cast<double>(a[i]) - b[i]));
    }
  }
  std::printf("     %s (bit-exact required)\n", diff_line(d).c_str());
  if (d.differ == 0) return "";
  char buf[200];
  std::snprintf(buf, sizeof buf, "%s; first at %lld: cpu %.9g, cuda %.9g", diff_line(d).c_str(),
                static_cast<long long>(d.first_bad), a[d.first_bad], b[d.first_bad]);
  return buf;
}

// Tolerance comparison: |a - b| <= rel * |a| + abs_tol; prints the stats line.
std::string close_to(const di::Tensor& want, const di::Tensor& got_dev, double rel, double abs_tol, const char* rule) {
  const di::Tensor got = got_dev.device() == di::Device::kCUDA ? di::cuda::copy_to_host(got_dev) : got_dev;
  if (got.numel() != want.numel()) return "size mismatch";
  const float* a = want.data<float>();
  const float* b = got.data<float>();
  Diff d;
  d.n = want.numel();
  for (int64_t i = 0; i < d.n; ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (bits(a[i]) == bits(b[i])) continue;
    ++d.differ;
    const double e = std::fabs(static_cast<double>(a[i]) - b[i]);
    d.maxabs = std::max(d.maxabs, std::isnan(e) ? INFINITY : e);
    if (!(e <= rel * std::fabs(static_cast<double>(a[i])) + abs_tol)) {
      if (d.first_bad < 0) d.first_bad = i;
      ++d.bad;
    }
  }
  std::printf("     %s (tolerance: %s)\n", diff_line(d).c_str(), rule);
  if (d.bad == 0) return "";
  char buf[240];
  std::snprintf(buf, sizeof buf, "%lld out of tolerance, %s; first at %lld: cpu %.9g, cuda %.9g",
                static_cast<long long>(d.bad), diff_line(d).c_str(), static_cast<long long>(d.first_bad),
                a[d.first_bad], b[d.first_bad]);
  return buf;
}

di::Tensor dev(const di::Tensor& t) { return di::cuda::copy_to_device(t); }

// Normal(0, sigma) float32 of `shape`, optionally on the bf16 grid.
di::Tensor normal_tensor(const std::vector<int64_t>& shape, float sigma, uint32_t seed, bool bf16) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  di::Tensor t = di::Tensor::empty(shape, di::DType::kF32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = bf16 ? di::round_bf16(normal(rng)) : normal(rng);
  return t;
}

std::string shape_name(std::initializer_list<int64_t> dims) {
  std::string s = "[";
  for (int64_t d : dims) s += (s.size() > 1 ? ", " : "") + std::to_string(d);
  return s + "]";
}

void test_fake_quant_fp4() {
  struct Case {
    int64_t rows, cols, block;
    bool e4m3;
  };
  const Case cases[] = {
      {64, 512, 32, false}, {7, 5120, 32, false}, {3, 100, 32, false}, {256, 2048, 32, false},
      {64, 512, 16, true},  {5, 448, 16, true},   {1, 100, 16, true},  {256, 448, 16, true},
  };
  uint32_t seed = 20000;
  for (const Case& c : cases) {
    const std::string name = std::string(c.e4m3 ? "fake_quant_fp4_e4m3_scale " : "fake_quant_fp4 ") +
                             shape_name({c.rows, c.cols}) + " block " + std::to_string(c.block);
    run_case(name, [&] {
      di::Tensor cpu = random_rows(c.rows, c.cols, seed++);
      di::Tensor d = dev(cpu);
      if (c.e4m3) {
        di::ops::fake_quant_fp4_e4m3_scale(cpu, c.block);
        di::ops::fake_quant_fp4_e4m3_scale(d, c.block);
      } else {
        di::ops::fake_quant_fp4(cpu, c.block);
        di::ops::fake_quant_fp4(d, c.block);
      }
      return exact(cpu, d);
    });
  }
  run_case("fake_quant_fp4 on a strided column slice", [&] {
    di::Tensor host = random_rows(9, 512, seed++);
    di::Tensor d = dev(host);
    di::Tensor ds = d.slice(1, 128, 384);
    di::ops::fake_quant_fp4(ds, 32);
    di::Tensor want = host.clone();
    di::Tensor ws = want.slice(1, 128, 384);
    di::ops::fake_quant_fp4(ws, 32);
    return exact(want, d);
  });
}

void test_dequantize() {
  struct Case {
    const char* what;
    di::DType dt;
    int64_t N, K, block;
  };
  const Case cases[] = {
      {"e4m3 block 128", di::DType::kE4M3, 1280, 5120, 128},
      {"e4m3 block 32 ragged", di::DType::kE4M3, 333, 2112, 32},
      {"e2m1x2", di::DType::kE2M1x2, 2304, 5120, 0},
      {"bf16", di::DType::kBF16, 100, 96, 0},
  };
  uint32_t seed = 21000;
  for (const Case& c : cases) {
    run_case(std::string("dequantize ") + c.what + " " + shape_name({c.N, c.K}), [&] {
      di::ops::QWeight wh = random_weight(c.dt, c.N, c.K, c.block, seed++);
      if (c.dt == di::DType::kE4M3) wh.w.data<uint8_t>()[7] = 0x7f;  // a NaN code
      return exact(di::ops::dequantize(wh), di::ops::dequantize(to_device(wh)));
    });
  }
  run_case("dequantize f32", [&] {
    di::ops::QWeight wh;
    wh.w = random_rows(17, 33, seed++);
    return exact(di::ops::dequantize(wh), di::ops::dequantize(to_device(wh)));
  });
}

void test_hadamard() {
  struct Case {
    int64_t T, heads, n;
    bool round;
  };
  const Case cases[] = {
      {1, 32, 128, true},   {64, 32, 128, true}, {256, 32, 128, false}, {1, 64, 512, true},
      {128, 64, 512, true}, {5, 3, 64, false},   {2, 1, 8192, false},   {3, 7, 1, true},
  };
  uint32_t seed = 22000;
  for (const Case& c : cases) {
    run_case("hadamard " + shape_name({c.T, c.heads * c.n}) + " n " + std::to_string(c.n) + " round " +
                 std::to_string(c.round),
             [&] {
               di::Tensor cpu = normal_tensor({c.T, c.heads * c.n}, 1.0f, seed++, true);
               di::Tensor d = dev(cpu);
               di::ops::hadamard(cpu, c.n, c.round);
               di::ops::hadamard(d, c.n, c.round);
               return exact(cpu, d);
             });
  }
}

void test_rope() {
  struct Case {
    const char* what;
    int64_t T, heads, head_width, rope_dim;
    bool yarn, inverse, round;
    int64_t start;
  };
  const Case cases[] = {
      {"q 64 x 512", 1, 64, 512, 64, true, false, true, 70000},
      {"q 64 x 512", 256, 64, 512, 64, true, false, true, 1000},
      {"q 64 x 512 inverse (output)", 64, 64, 512, 64, true, true, true, 123456},
      {"kv 1 x 512", 256, 1, 512, 64, true, false, true, 0},
      {"index q 32 x 128", 128, 32, 128, 64, true, false, false, 999},
      {"no yarn", 17, 4, 96, 32, false, false, false, 5},
      {"no yarn inverse", 17, 4, 96, 32, false, true, true, 1 << 20},
  };
  uint32_t seed = 23000;
  for (const Case& c : cases) {
    run_case(std::string("apply_rope ") + c.what + " T=" + std::to_string(c.T) + " rope " + std::to_string(c.rope_dim) +
                 (c.yarn ? " yarn" : "") + (c.inverse ? " inverse" : "") + " round " + std::to_string(c.round),
             [&] {
               const di::ops::RopeFreqs f = c.yarn ? di::ops::rope_freqs(c.rope_dim, 10000.0, 16.0, 65536, 32.0, 1.0)
                                                   : di::ops::rope_freqs(c.rope_dim, 10000.0, 1.0, 0, 32.0, 1.0);
               std::vector<int64_t> pos(static_cast<size_t>(c.T));
               std::mt19937 rng(seed);
               for (int64_t t = 0; t < c.T; ++t)
                 pos[t] = c.start + t + (t % 3 == 2 ? static_cast<int64_t>(rng() % 5000) : 0);
               di::Tensor cpu = normal_tensor({c.T, c.heads * c.head_width}, 1.0f, seed++, true);
               di::Tensor d = dev(cpu);
               di::ops::apply_rope(cpu, c.head_width, c.rope_dim, pos.data(), f, c.inverse, c.round);
               di::ops::apply_rope(d, c.head_width, c.rope_dim, pos.data(), f, c.inverse, c.round);
               return exact(cpu, d);
             });
  }
}

void test_hc() {
  uint32_t seed = 24000;
  // hc = 4 (the models') runs the kernel specialised for it; hc = 3 the generic one.
  for (int64_t hc : {int64_t{4}, int64_t{3}})
    for (int64_t dim : {int64_t{5120}, int64_t{96}}) {
      for (int64_t T : {int64_t{1}, int64_t{21}, int64_t{64}, int64_t{256}}) {
        if ((dim == 96 || hc != 4) && T == 256) continue;
        const std::string sh = " T=" + std::to_string(T) + " hc=" + std::to_string(hc) + " dim=" + std::to_string(dim);
        di::Tensor stream = normal_tensor({T, hc, dim}, 1.0f, seed++, true);
        di::Tensor sd = dev(stream);
        // mixes: fn [24, hc*dim] small, scale [3], base [24]
        const int64_t M = (2 + hc) * hc;
        di::Tensor fn = normal_tensor({M, hc * dim}, 0.02f, seed++, false);
        di::Tensor scale = normal_tensor({3}, 0.5f, seed++, false);
        di::Tensor base = normal_tensor({M}, 1.0f, seed++, false);
        run_case("hc_mixes (sinkhorn 20)" + sh, [&] {
          const di::ops::HcMix want = di::ops::hc_mixes(stream, fn, scale, base, hc, 20, 1e-6f, 1e-6f);
          const di::ops::HcMix got = di::ops::hc_mixes(sd, dev(fn), dev(scale), dev(base), hc, 20, 1e-6f, 1e-6f);
          const char* rule = "2e-6 relative (FP64 sums in a different order, exp ulps)";
          std::string r = close_to(want.pre, got.pre, 2e-6, 1e-30, rule);
          const std::string r2 = close_to(want.post, got.post, 2e-6, 1e-30, rule);
          const std::string r3 = close_to(want.comb, got.comb, 2e-6, 1e-12, rule);
          if (!r.empty() || !r2.empty() || !r3.empty())
            return !r.empty() ? "pre: " + r : (!r2.empty() ? "post: " + r2 : "comb: " + r3);
          // Batch invariance: the first and last rows alone give the bits they got among T (the kernel takes several
          // tokens per block from 16 rows up).
          for (int64_t row : {int64_t{0}, T - 1}) {
            const di::ops::HcMix one =
                di::ops::hc_mixes(sd.slice(0, row, row + 1), dev(fn), dev(scale), dev(base), hc, 20, 1e-6f, 1e-6f);
            const std::string e = exact(di::cuda::copy_to_host(one.pre), got.pre.slice(0, row, row + 1)) +
                                  exact(di::cuda::copy_to_host(one.post), got.post.slice(0, row, row + 1)) +
                                  exact(di::cuda::copy_to_host(one.comb), got.comb.slice(0, row, row + 1));
            if (!e.empty()) return "row " + std::to_string(row) + " alone: " + e;
          }
          return std::string();
        });
        for (bool round : {true, false}) {
          const std::string rs = " round " + std::to_string(round);
          di::Tensor pre = normal_tensor({T, hc}, 0.5f, seed++, false);
          run_case("hc_collapse" + sh + rs, [&] {
            return exact(di::ops::hc_collapse(stream, pre, round), di::ops::hc_collapse(sd, dev(pre), round));
          });
          // The fused collapse + norm: the same bits as the two CUDA ops, the norm's tolerance against the CPU.
          di::Tensor nw = normal_tensor({dim}, 1.0f, seed++, true);
          run_case("hc_collapse_norm" + sh + rs, [&] {
            const di::Tensor got = di::ops::hc_collapse_norm(sd, dev(pre), dev(nw), 1e-6f, round);
            const di::Tensor two = di::ops::rms_norm(di::ops::hc_collapse(sd, dev(pre), round), dev(nw), 1e-6f, round);
            const std::string r = exact(di::cuda::copy_to_host(two), got);
            if (!r.empty()) return "vs the two CUDA ops: " + r;
            return compare_close(di::ops::hc_collapse_norm(stream, pre, nw, 1e-6f, round), di::cuda::copy_to_host(got),
                                 round);
          });
          di::Tensor y = normal_tensor({T, dim}, 1.0f, seed++, true);
          di::Tensor post = normal_tensor({T, hc}, 0.5f, seed++, false);
          di::Tensor comb = normal_tensor({T, hc, hc}, 0.5f, seed++, false);
          run_case("hc_expand" + sh + rs, [&] {
            return exact(di::ops::hc_expand(y, stream, post, comb, round),
                         di::ops::hc_expand(dev(y), sd, dev(post), dev(comb), round));
          });
          di::Tensor hfn = normal_tensor({hc, hc * dim}, 0.02f, seed++, false);
          di::Tensor hscale = normal_tensor({1}, 0.5f, seed++, false);
          di::Tensor hbase = normal_tensor({hc}, 1.0f, seed++, false);
          run_case("hc_head" + sh + rs, [&] {
            const di::Tensor want = di::ops::hc_head(stream, hfn, hscale, hbase, 1e-6f, 1e-6f, round);
            const di::Tensor got = di::ops::hc_head(sd, dev(hfn), dev(hscale), dev(hbase), 1e-6f, 1e-6f, round);
            // pre may differ by an ulp (see hc_mixes), then one bf16 step when rounding.
            return round ? close_to(want, got, 1.0 / 128, 1e-30, "one bf16 step")
                         : close_to(want, got, 1e-5, 1e-6, "1e-5 relative + 1e-6");
          });
        }
      }
    }
}

// attn_input_norms: the fused kernel against the CUDA ops it replaces (rms_norm twice, apply_rope, fake_quant_fp8)
// and against the CPU op, both bit for bit. Inputs are the model's: column slices of one stacked [T, q_lora + D]
// projection (contiguous for one case). The real shapes (V4.1: quant over the whole row in blocks of 32; V4: the
// NoPE part in blocks of 64) at T = 1, 3, 8, 64; widths with several float4 per thread, a kv wider than q, and
// widths the fused kernel leaves to the ops (odd, or over 8,192).
void test_attn_inputs() {
  struct Case {
    int64_t q_lora, D, rd, quant_end, block;
    std::vector<int64_t> Ts;
  };
  const Case cases[] = {
      {1024, 512, 64, 512, 32, {1, 3, 8, 64}},  // V4.1
      {1024, 512, 64, 448, 64, {1, 3, 8, 64}},  // V4
      {1536, 512, 64, 448, 64, {1, 5}},
      {5120, 1024, 64, 1024, 32, {2}},  // several float4 per thread in both halves
      {64, 1024, 64, 960, 64, {3}},     // kv wider than q: the block is kv's width
      {100, 36, 8, 36, 32, {1, 4}},     // small widths, a partial quant group
      {98, 34, 8, 34, 32, {1, 3}},      // widths % 4 != 0: the ops one after the other
      {8196, 512, 64, 448, 64, {2}},    // q over 8,192: the ops one after the other
  };
  uint32_t seed = 27000;
  for (const Case& c : cases)
    for (int64_t T : c.Ts)
      for (bool bf16_w : {true, false})
        for (bool round : {true, false})
          for (bool quant : {true, false}) {
            if (!bf16_w && T > 8) continue;  // F32 weights: the small batches suffice
            const int64_t block = quant ? c.block : 0;
            const std::string name = "attn_input_norms q_lora " + std::to_string(c.q_lora) + " D " +
                                     std::to_string(c.D) + " rope " + std::to_string(c.rd) + " T=" + std::to_string(T) +
                                     (bf16_w ? " bf16" : " f32") + " weights round " + std::to_string(round) +
                                     " quant [0, " + std::to_string(c.quant_end) + ") block " + std::to_string(block);
            run_case(name, [&] {
              const di::ops::RopeFreqs f = di::ops::rope_freqs(c.rd, 10000.0, 16.0, 65536, 32.0, 1.0);
              std::vector<int64_t> pos(static_cast<size_t>(T));  // a progression on odd T, uploaded otherwise
              for (int64_t t = 0; t < T; ++t) pos[t] = 5000 + t + (T % 2 == 0 && t % 3 == 1 ? 700 : 0);
              const di::Tensor stacked = normal_tensor({T, c.q_lora + c.D}, 2.0f, seed++, true);
              const di::Tensor qw = normal_tensor({c.q_lora}, 1.0f, seed++, true);
              const di::Tensor kw = normal_tensor({c.D}, 1.0f, seed++, true);
              auto weight = [&](const di::Tensor& w) {
                if (!bf16_w) return dev(w);
                di::Tensor b = di::Tensor::empty(w.shape(), di::DType::kBF16);
                for (int64_t i = 0; i < w.numel(); ++i) b.data<uint16_t>()[i] = di::f32_to_bf16(w.data<float>()[i]);
                return dev(b);
              };
              const di::Tensor dqw = weight(qw), dkw = weight(kw), ds = dev(stacked);
              const bool sliced = c.q_lora != 1536;
              const di::Tensor qa = sliced ? ds.slice(1, 0, c.q_lora) : dev(stacked.slice(1, 0, c.q_lora));
              const di::Tensor kva =
                  sliced ? ds.slice(1, c.q_lora, c.q_lora + c.D) : dev(stacked.slice(1, c.q_lora, c.q_lora + c.D));
              const di::ops::AttnInputs got =
                  di::ops::attn_input_norms(qa, dqw, kva, dkw, 1e-6f, round, c.rd, pos.data(), f, c.quant_end, block);
              // The CUDA ops it replaces.
              const di::Tensor qr = di::ops::rms_norm(qa, dqw, 1e-6f, round);
              di::Tensor kv = di::ops::rms_norm(kva, dkw, 1e-6f, round);
              di::ops::apply_rope(kv, c.D, c.rd, pos.data(), f, false, round);
              if (block > 0) di::ops::fake_quant_fp8(kv, 0, c.quant_end, block);
              std::string r = exact(qr, got.qr);
              if (!r.empty()) return "qr vs the CUDA ops: " + r;
              r = exact(kv, got.kv);
              if (!r.empty()) return "kv vs the CUDA ops: " + r;
              // The CPU op (host copies of the same inputs and weights).
              const di::ops::AttnInputs want =
                  di::ops::attn_input_norms(stacked.slice(1, 0, c.q_lora), di::cuda::copy_to_host(dqw),
                                            stacked.slice(1, c.q_lora, c.q_lora + c.D), di::cuda::copy_to_host(dkw),
                                            1e-6f, round, c.rd, pos.data(), f, c.quant_end, block);
              r = exact(want.qr, got.qr);
              if (!r.empty()) return "qr vs the CPU op: " + r;
              r = exact(want.kv, got.kv);
              return r.empty() ? r : "kv vs the CPU op: " + r;
            });
          }
}

// idx rows for attention: the first `valid` slots random kv rows (some repeated), then -1; a few rows
// fully empty or starting with a fully empty tile.
di::Tensor attention_idx(int64_t T, int64_t K, int64_t N, uint32_t seed, bool holes) {
  std::mt19937 rng(seed);
  di::Tensor idx = di::Tensor::empty({T, K}, di::DType::kI32);
  int32_t* p = idx.data<int32_t>();
  for (int64_t t = 0; t < T; ++t) {
    int64_t valid = K;
    if (holes) valid = K - static_cast<int64_t>(rng() % static_cast<uint32_t>(std::min<int64_t>(K, 200)));
    for (int64_t i = 0; i < K; ++i) p[t * K + i] = i < valid ? static_cast<int32_t>(rng() % N) : -1;
    if (holes && t % 7 == 3)  // scattered holes
      for (int64_t i = 0; i < K; i += 3) p[t * K + i] = -1;
    if (holes && t % 11 == 5)  // the first tile empty: the skip path
      for (int64_t i = 0; i < std::min<int64_t>(K, 64); ++i) p[t * K + i] = -1;
    if (holes && t % 13 == 6)  // nothing at all: zeros
      for (int64_t i = 0; i < K; ++i) p[t * K + i] = -1;
  }
  return idx;
}

// Attention tolerance: relative to the largest |value| of each (t, h) row: tight 1e-5 for all but
// 0.1% of values, loose 1e-2 for every value (an exp result one ulp off the CPU's can, rarely, move a
// bf16-rounded probability by one bf16 step). Rounded outputs: at most one bf16 step for the same.
std::string attention_close(const di::Tensor& want, const di::Tensor& got_dev, int64_t D) {
  const di::Tensor got = di::cuda::copy_to_host(got_dev);
  const float* a = want.data<float>();
  const float* b = got.data<float>();
  const int64_t n = want.numel();
  int64_t differ = 0, tight = 0, loose = 0, first = -1;
  double maxabs = 0.0, maxrel = 0.0;
  for (int64_t r = 0; r < n / D; ++r) {
    double rmax = 0.0;
    for (int64_t d = 0; d < D; ++d) rmax = std::max(rmax, std::fabs(static_cast<double>(a[r * D + d])));
    for (int64_t d = 0; d < D; ++d) {
      const int64_t i = r * D + d;
      if (bits(a[i]) == bits(b[i])) continue;
      ++differ;
      const double e = std::fabs(static_cast<double>(a[i]) - b[i]);
      maxabs = std::max(maxabs, e);
      const double rel = e / std::max(rmax, 1e-30);
      maxrel = std::max(maxrel, std::isnan(rel) ? INFINITY : rel);
      if (!(rel <= 1e-5)) ++tight;
      if (!(rel <= 1e-2)) {
        ++loose;
        if (first < 0) first = i;
      }
    }
  }
  char buf[240];
  std::snprintf(buf, sizeof buf, "differ %lld/%lld max|d| %.3g max|d|/rowmax %.3g beyond 1e-5: %lld",
                static_cast<long long>(differ), static_cast<long long>(n), maxabs, maxrel,
                static_cast<long long>(tight));
  std::printf("     %s (tolerance: 1e-5 of the row max for >= 99.9%%, 1e-2 for all)\n", buf);
  if (loose == 0 && tight * 1000 <= n) return "";
  std::string s = buf;
  if (first >= 0) {
    char b2[120];
    std::snprintf(b2, sizeof b2, "; first loose miss at %lld: cpu %.9g, cuda %.9g", static_cast<long long>(first),
                  a[first], b[first]);
    s += b2;
  }
  return s;
}

void test_sparse_attention() {
  // Index lists: kRandom (attention_idx above), kDecode (as the model's decode rows: the window's
  // empty slots -1 first, then its rows ascending, then the picks ascending, then -1; every fifth row
  // full, every fifth + 4 empty), kOutOfRange (random ids in [-3, N + 30): the CPU op rejects ids >= N,
  // so its reference gets them as -1, the CUDA op treats them as empty).
  enum class Lists { kRandom, kDecode, kOutOfRange };
  struct Case {
    const char* what;
    int64_t T, H, D, N, K;
    bool holes, bf16_probs, round;
    int hg;  // 0: automatic; 4, 8, 16: the tiled kernel; -4, -8, -16: the split (cluster) kernel
    Lists lists = Lists::kRandom;
  };
  const Case cases[] = {
      {"small ragged", 3, 5, 64, 300, 130, true, true, true, 0},
      {"small ragged fp32", 3, 5, 64, 300, 130, true, false, false, 0},
      {"v4.1 decode", 1, 64, 512, 5000, 640, false, true, true, 0},
      {"v4.1 decode holes", 1, 64, 512, 5000, 640, true, true, true, 0},
      {"v4.1 decode batch", 16, 64, 512, 8192, 640, true, true, false, 0},
      {"v4.1 prefill", 64, 64, 512, 4000, 640, true, true, true, 0},
      {"v4.1 prefill", 256, 64, 512, 6000, 640, true, true, true, 0},
      {"v4.1 prefill fp32 probs", 128, 64, 512, 3000, 640, true, false, false, 0},
      {"window only (K=128)", 64, 64, 512, 128, 128, true, true, true, 0},
      {"HG 4", 8, 64, 512, 2000, 576, true, true, true, 4},
      {"HG 8", 8, 64, 512, 2000, 576, true, true, true, 8},
      {"HG 16", 8, 64, 512, 2000, 576, true, true, true, 16},
      {"H=7 HG 16 (partial group)", 4, 7, 128, 500, 200, true, true, false, 16},
      // The split kernel (automatic for T * ceil(H / 16) * 8 <= 2 * SMs: T <= 8 at H = 64 on 132 SMs).
      {"decode rows T=1 (split, 4 heads)", 1, 64, 512, 1152, 640, false, true, true, 0, Lists::kDecode},
      {"decode rows T=1 fp32 (split)", 1, 64, 512, 1152, 640, false, false, false, 0, Lists::kDecode},
      {"decode rows T=2 (split, 4 heads)", 2, 64, 512, 1152, 640, false, true, true, 0, Lists::kDecode},
      {"decode rows T=3 (split, 8 heads)", 3, 64, 512, 2000, 640, false, true, true, 0, Lists::kDecode},
      {"decode rows T=8 (split, 16 heads)", 8, 64, 512, 2000, 640, false, true, true, 0, Lists::kDecode},
      {"decode rows T=8 fp32 (split)", 8, 64, 512, 2000, 640, false, false, false, 0, Lists::kDecode},
      {"decode rows T=9 (tiled)", 9, 64, 512, 2000, 640, false, true, true, 0, Lists::kDecode},
      {"decode rows T=8 tiled HG 4", 8, 64, 512, 2000, 640, false, true, true, 4, Lists::kDecode},
      {"decode rows T=5 split 4 heads", 5, 64, 512, 2000, 640, false, true, false, -4, Lists::kDecode},
      {"decode rows T=2 split 8 heads", 2, 64, 512, 2000, 640, false, true, true, -8, Lists::kDecode},
      {"decode rows T=2 split 16 heads", 2, 64, 512, 2000, 640, false, false, true, -16, Lists::kDecode},
      {"K=20 (one partial tile)", 1, 64, 512, 300, 20, true, true, true, 0},
      {"K=20 split 16 heads", 2, 64, 512, 300, 20, true, false, false, -16},
      {"K=1", 2, 16, 64, 10, 1, false, true, true, 0},
      {"K=64 (one tile)", 1, 64, 512, 500, 64, true, true, true, 0},
      {"K=128", 2, 64, 512, 500, 128, true, true, true, 0},
      {"K=256 fp32", 1, 64, 512, 900, 256, true, false, false, 0},
      {"K=1024 (16 tiles)", 1, 64, 512, 3000, 1024, true, true, true, 0},
      {"K=2048 (the split kernel's longest list)", 1, 16, 128, 5000, 2048, true, true, true, 0},
      {"K=2049 (tiled)", 1, 16, 128, 5000, 2049, true, true, true, 0},
      {"H=7 split 4 heads (partial group)", 4, 7, 128, 500, 200, true, true, false, -4},
      {"H=7 split 8 heads (partial group)", 4, 7, 128, 500, 200, true, true, false, -8},
      {"H=7 split 16 heads (partial group)", 4, 7, 128, 500, 200, true, true, false, -16},
      {"H=10 D=64 split", 3, 10, 64, 300, 130, true, false, false, -4},
      {"D=100 split (partial chunk, uneven column slices)", 2, 6, 100, 400, 150, true, true, true, -4},
      {"D=4 split (one CTA owns every column)", 2, 5, 4, 100, 70, true, false, false, -8},
      {"empty rows and empty first tiles, split", 14, 16, 256, 1000, 300, true, true, true, -4},
      {"out-of-range ids (N=50), split", 3, 8, 64, 50, 200, false, true, true, 0, Lists::kOutOfRange},
      {"out-of-range ids (N=50), tiled", 3, 8, 64, 50, 200, false, true, true, 4, Lists::kOutOfRange},
      {"T=16 split 16 heads (forced)", 16, 64, 512, 4000, 640, true, true, true, -16},
  };
  // Decode rows (see above): window rows are kv rows [0, W), picks come from [W, N).
  auto decode_idx = [](int64_t T, int64_t K, int64_t N, uint32_t seed) {
    std::mt19937 rng(seed);
    const int64_t W = std::min<int64_t>(128, K);
    di::Tensor idx = di::Tensor::empty({T, K}, di::DType::kI32);
    int32_t* p = idx.data<int32_t>();
    for (int64_t t = 0; t < T; ++t) {
      int64_t nwin = 0, npick = 0;
      if (t % 5 == 0) {
        nwin = W;
        npick = std::min(K - W, N - W);
      } else if (t % 5 != 4) {
        nwin = static_cast<int64_t>(rng() % static_cast<uint32_t>(W + 1));
        npick = static_cast<int64_t>(rng() % static_cast<uint32_t>(std::min(K - W, N - W) + 1));
      }
      int32_t* row = p + t * K;
      for (int64_t i = 0; i < K; ++i) row[i] = -1;
      for (int64_t i = 0; i < nwin; ++i) row[W - nwin + i] = static_cast<int32_t>(W - nwin + i);
      // npick of the N - W compressed rows, ascending (selection sampling).
      int64_t need = npick, out = W;
      for (int64_t c = 0; c < N - W && need > 0; ++c)
        if (static_cast<int64_t>(rng() % static_cast<uint32_t>(N - W - c)) < need) {
          row[out++] = static_cast<int32_t>(W + c);
          --need;
        }
    }
    return idx;
  };
  uint32_t seed = 25000;
  for (const Case& c : cases) {
    char name[240];
    std::snprintf(
        name, sizeof name, "sparse_attention %s T=%lld H=%lld D=%lld N=%lld K=%lld bf16_probs=%d round=%d hg=%d",
        c.what, static_cast<long long>(c.T), static_cast<long long>(c.H), static_cast<long long>(c.D),
        static_cast<long long>(c.N), static_cast<long long>(c.K), c.bf16_probs ? 1 : 0, c.round ? 1 : 0, c.hg);
    run_case(name, [&] {
      const di::Tensor q = normal_tensor({c.T, c.H, c.D}, 1.0f, seed++, true);
      const di::Tensor kv = normal_tensor({c.N, c.D}, 1.0f, seed++, true);
      const di::Tensor sink = normal_tensor({c.H}, 1.0f, seed++, false);
      di::Tensor idx, idx_ref;
      if (c.lists == Lists::kDecode) {
        idx = idx_ref = decode_idx(c.T, c.K, c.N, seed++);
      } else if (c.lists == Lists::kOutOfRange) {
        std::mt19937 rng(seed++);
        idx = di::Tensor::empty({c.T, c.K}, di::DType::kI32);
        idx_ref = di::Tensor::empty({c.T, c.K}, di::DType::kI32);
        for (int64_t i = 0; i < c.T * c.K; ++i) {
          const int32_t j = static_cast<int32_t>(rng() % static_cast<uint32_t>(c.N + 33)) - 3;
          idx.data<int32_t>()[i] = j;
          idx_ref.data<int32_t>()[i] = j < c.N ? j : -1;
        }
      } else {
        idx = idx_ref = attention_idx(c.T, c.K, c.N, seed++, c.holes);
      }
      const float scale = 1.0f / std::sqrt(static_cast<float>(c.D));
      const di::Tensor want = di::ops::sparse_attention(q, kv, idx_ref, sink, scale, c.bf16_probs, c.round);
      di::Tensor got;
      if (c.hg == 0) {
        got = di::ops::sparse_attention(dev(q), dev(kv), dev(idx), dev(sink), scale, c.bf16_probs, c.round);
      } else {
        got = di::Tensor::empty({c.T, c.H, c.D}, di::DType::kF32, di::Device::kCUDA);
        di::cuda::sparse_attention_into(dev(q), dev(kv), dev(idx), dev(sink), scale, c.bf16_probs, c.round, got,
                                        nullptr, c.hg);
      }
      std::string err = attention_close(want, got, c.D);
      if (!err.empty()) return err;
      // The fused de-rotation (ops::AttnDerotate, the model's o): bit for bit the same kernel's output followed by
      // apply_rope(inverse), and the CPU op's within the tolerance. Positions a progression (odd seeds) or scattered.
      const int64_t rd = c.D >= 128 ? 64 : c.D / 4 * 2;
      const di::ops::RopeFreqs f = di::ops::rope_freqs(rd, 10000.0, 1.0, 0, 32.0, 1.0);
      std::vector<int64_t> pos(static_cast<size_t>(c.T));
      std::mt19937 prng(seed++);
      const bool progression = (seed & 1) != 0;
      for (int64_t t = 0; t < c.T; ++t) pos[t] = progression ? 700 + t : static_cast<int64_t>(prng() % 9000);
      const di::ops::AttnDerotate derot{pos.data(), &f, rd};
      const di::Tensor want_d = di::ops::sparse_attention(q, kv, idx_ref, sink, scale, c.bf16_probs, c.round, &derot);
      di::Tensor got_d;
      if (c.hg == 0) {
        got_d = di::ops::sparse_attention(dev(q), dev(kv), dev(idx), dev(sink), scale, c.bf16_probs, c.round, &derot);
      } else {
        got_d = di::Tensor::empty({c.T, c.H, c.D}, di::DType::kF32, di::Device::kCUDA);
        di::cuda::sparse_attention_into(dev(q), dev(kv), dev(idx), dev(sink), scale, c.bf16_probs, c.round, got_d,
                                        nullptr, c.hg, &derot);
      }
      di::ops::apply_rope(got, c.D, rd, pos.data(), f, true, c.round);
      std::printf("     de-rotated (rope dims %lld, %s positions) against the kernel then apply_rope:\n",
                  static_cast<long long>(rd), progression ? "progression" : "scattered");
      err = exact(got, got_d);
      if (!err.empty()) return "de-rotated: " + err;
      if (c.hg == 0) {  // into a caller's buffer (ops::sparse_attention's out: the model's graph input slot)
        di::Tensor buf = di::Tensor::zeros({c.T, c.H * c.D}, di::DType::kF32).to(di::Device::kCUDA);
        const di::Tensor into =
            di::ops::sparse_attention(dev(q), dev(kv), dev(idx), dev(sink), scale, c.bf16_probs, c.round, &derot, buf);
        if (into.raw() != buf.raw()) return std::string("out: the result is not in the caller's buffer");
        err = exact(got_d, into);
        if (!err.empty()) return "into a buffer: " + err;
      }
      err = attention_close(want_d, got_d, c.D);
      return err.empty() ? err : "de-rotated against the CPU: " + err;
    });
  }
}

// Scores with many ties (a small value set), some -inf (masked), +inf, -0 / +0, and per-row visible counts.
di::Tensor topk_scores(int64_t T, int64_t n, uint32_t seed, bool ties) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  di::Tensor s = di::Tensor::empty({T, n}, di::DType::kF32);
  float* p = s.data<float>();
  for (int64_t t = 0; t < T; ++t) {
    const int64_t visible = t % 5 == 1 ? static_cast<int64_t>(rng() % static_cast<uint32_t>(n + 1)) : n;
    for (int64_t i = 0; i < n; ++i) {
      float v = ties ? static_cast<float>(static_cast<int>(rng() % 17) - 8) * 0.25f : normal(rng);
      if (ties && v == 0.0f && (rng() & 1)) v = -0.0f;
      if (rng() % 97 == 0) v = -INFINITY;
      if (rng() % 4999 == 0) v = INFINITY;
      p[t * n + i] = i < visible ? v : -INFINITY;
    }
  }
  return s;
}

std::string compare_idx(const di::Tensor& want, const di::Tensor& got_dev) {
  const di::Tensor got = di::cuda::copy_to_host(got_dev);
  if (got.numel() != want.numel()) return "size mismatch";
  const int32_t* a = want.data<int32_t>();
  const int32_t* b = got.data<int32_t>();
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < want.numel(); ++i)
    if (a[i] != b[i]) {
      if (first < 0) first = i;
      ++bad;
    }
  std::printf("     differ %lld/%lld (exact required)\n", static_cast<long long>(bad),
              static_cast<long long>(want.numel()));
  if (bad == 0) return "";
  char buf[160];
  std::snprintf(buf, sizeof buf, "%lld of %lld indices differ; first at %lld: cpu %d, cuda %d",
                static_cast<long long>(bad), static_cast<long long>(want.numel()), static_cast<long long>(first),
                a[first], b[first]);
  return buf;
}

void test_topk() {
  struct Case {
    const char* what;
    int64_t T, n, k;
    bool ties;
  };
  const Case cases[] = {
      {"indexer decode", 1, 5000, 512, false},
      {"indexer prefill", 64, 6000, 512, false},
      {"indexer prefill", 256, 4096, 512, true},
      {"indexer short rows", 16, 300, 512, false},
      {"moe routing", 256, 256, 8, true},
      {"moe routing", 1, 256, 6, false},
      {"large n", 4, 65536, 2048, true},
      {"k = 1", 8, 1000, 1, true},
      {"n = 1", 3, 1, 4, false},
      // A long context's decode rows (V4.1-Flash: 4 tokens an index key): over a cluster of CTAs from 8k keys (by
      // index), staged in one block's shared memory up to ~57k keys, else read from global memory.
      {"decode 32k", 1, 32768, 512, false},
      {"decode 32k", 1, 32768, 512, true},
      {"decode 48k", 2, 49152, 512, false},
      {"decode past the stage", 1, 70000, 512, false},
      {"decode 256k (a 1M-token context)", 3, 262144, 512, false},
      {"64 rows at the cluster's least", 64, 8192, 512, true},
      {"65 rows (not staged)", 65, 3000, 512, false},
  };
  uint32_t seed = 26000;
  for (const Case& c : cases) {
    const di::Tensor s = topk_scores(c.T, c.n, seed++, c.ties);
    const di::Tensor sd = dev(s);
    for (bool by_index : {false, true}) {
      const di::Tensor want = di::ops::topk_rows(s, c.k, by_index);
      for (int stage : {2, 1, 0}) {  // a row over a cluster, staged in one block, read from global memory
        char name[192];
        std::snprintf(name, sizeof name, "topk_rows %s T=%lld n=%lld k=%lld ties=%d order=%s stage=%d", c.what,
                      static_cast<long long>(c.T), static_cast<long long>(c.n), static_cast<long long>(c.k),
                      c.ties ? 1 : 0, by_index ? "index" : "score", stage);
        di::cuda::topk_set_staging(stage);
        run_case(name, [&] { return compare_idx(want, di::ops::topk_rows(sd, c.k, by_index)); });
      }
      di::cuda::topk_set_staging(-1);
    }
  }
}

// ---- the model-level ops (issue 8 step 2): indexer scores, MoE routing, SwiGLU, embedding, row gather ----
// The rows of `table` [N, d] (host) as runs of the given lengths stored on the device in reverse order with a row of
// gap between them (`store` keeps them); returns the runs in table order (a paged store's segments).
std::vector<di::ops::RowSegment> device_runs(const di::Tensor& table, const std::vector<int64_t>& lengths,
                                             di::Tensor& store) {
  const int64_t N = table.size(0), d = table.size(1), n = static_cast<int64_t>(lengths.size());
  di::Tensor host = di::Tensor::zeros({N + n, d}, di::DType::kF32);
  std::vector<int64_t> at(lengths.size());
  int64_t pos = 0;
  for (int64_t i = n - 1; i >= 0; --i) {  // run i at `pos`, the last run first
    at[i] = pos;
    pos += lengths[i] + 1;
  }
  int64_t from = 0;
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(host.data<float>() + at[i] * d, table.data<float>() + from * d,
                static_cast<size_t>(lengths[i] * d) * sizeof(float));
    from += lengths[i];
  }
  store = dev(host);
  std::vector<di::ops::RowSegment> runs;
  for (int64_t i = 0; i < n; ++i) runs.push_back({store.data<float>() + at[i] * d, lengths[i]});
  return runs;
}

// The decode kernel's keys per warp group under test (cuda::index_scores_set_group; 0: the default), named in the
// cases.
int g_index_group = 0;
std::string group_tag() { return g_index_group == 0 ? std::string() : " group=" + std::to_string(g_index_group); }

// index_scores over keys kept as runs (ops::index_scores_segments: the indexer reading a paged store in place on CUDA)
// against the CPU op over the same keys as one table, bit for bit: 64-row pages (a RowPages store: up to 313 runs,
// the uploaded run table) and ragged runs of 1-30 rows (a warp's key group across runs); decode rows with the causal
// rule or counts, rows over their own keys (offsets), and a prefill chunk (the other kernel: gathered first).
void test_index_scores_runs() {
  struct Case {
    const char* what;
    int64_t T, N, nh, d, start_pos, ratio;
    bool counts, offsets, round, pages;
  };
  const Case cases[] = {
      {"flash decode, 64-row pages", 1, 20000, 64, 128, 4 * 20000 - 1, 4, false, false, true, true},
      {"flash decode, ragged runs", 1, 3000, 64, 128, 2 * 3000 - 1, 2, false, false, true, false},
      {"decode, 5 pages (runs in the parameters)", 1, 301, 64, 128, 301, 1, false, false, true, true},
      {"decode batch counts, ragged", 7, 2000, 64, 128, 0, 1, true, false, true, false},
      {"batch over own keys, pages", 9, 1500, 64, 128, 0, 1, true, true, true, true},
      {"odd shapes fp32, ragged", 3, 301, 6, 40, 0, 1, true, false, false, false},
      {"prefill chunk (gathered), pages", 96, 2100, 64, 128, 4104, 2, false, false, true, true},
  };
  uint32_t seed = 31500;
  for (const Case& c : cases) {
    run_case(std::string("index_scores runs ") + c.what + group_tag(), [&] {
      std::mt19937 rng(seed++);
      const di::Tensor q = normal_tensor({c.T, c.nh, c.d}, 1.0f, seed++, c.round);
      const di::Tensor keys = normal_tensor({c.N, c.d}, 1.0f, seed++, c.round);
      const di::Tensor w = normal_tensor({c.T, c.nh}, 0.05f, seed++, c.round);
      di::ops::KeyVisibility vis{di::Tensor(), c.start_pos, c.ratio};
      if (c.counts) {
        vis.counts = di::Tensor::empty({c.T}, di::DType::kI32);
        for (int64_t t = 0; t < c.T; ++t)
          vis.counts.data<int32_t>()[t] = static_cast<int32_t>(t == 0 ? c.N : rng() % static_cast<uint32_t>(c.N + 1));
      }
      if (c.offsets) {  // row t's own keys start at t * N / T, width N / T + 3 (counts beyond the row's keys cut)
        vis.offsets = di::Tensor::empty({c.T}, di::DType::kI32);
        for (int64_t t = 0; t < c.T; ++t) vis.offsets.data<int32_t>()[t] = static_cast<int32_t>(t * c.N / c.T);
        vis.width = c.N / c.T + 3;
      }
      std::vector<int64_t> lengths;
      for (int64_t left = c.N; left > 0;) {
        const int64_t n = std::min<int64_t>(left, c.pages ? 64 : 1 + static_cast<int64_t>(rng() % 30));
        lengths.push_back(n);
        left -= n;
      }
      di::Tensor store;
      const std::vector<di::ops::RowSegment> runs = device_runs(keys, lengths, store);
      di::ops::KeyVisibility vis_dev = vis;
      if (c.counts) vis_dev.counts = dev(vis.counts);
      if (c.offsets) vis_dev.offsets = dev(vis.offsets);
      const di::Tensor want = di::ops::index_scores(q, keys, w, vis, c.round);
      return exact(want, di::ops::index_scores_segments(dev(q), runs, dev(w), vis_dev, c.round));
    });
  }
}

void test_index_scores() {
  struct Case {
    const char* what;
    int64_t T, N, nh, d, start_pos, ratio;
    bool counts, round;
  };
  // V4.1-Flash indexer: 64 heads of 128; decode rows see up to 1M/4 keys, prefill is causal.
  const Case cases[] = {
      {"flash decode", 1, 20000, 64, 128, 4 * 20000 - 1, 4, false, true},
      {"flash decode, a 160k-token context", 1, 40000, 64, 128, 4 * 40000 - 3, 4, false, true},
      {"flash decode batch", 7, 5000, 64, 128, 0, 1, true, true},
      {"flash decode batch of 4, ragged counts", 4, 9001, 64, 128, 0, 1, true, true},
      {"flash prefill causal r4", 1024, 256, 64, 128, 0, 4, false, true},
      {"flash chunk r2", 96, 2100, 64, 128, 4104, 2, false, true},
      {"flash chunk long", 16, 16384, 64, 128, 4 * 16384 - 16, 4, false, true},
      {"fp32 counts", 33, 700, 64, 128, 0, 1, true, false},
      {"odd shapes", 19, 301, 6, 40, 0, 1, true, true},
      {"odd shapes causal fp32", 50, 30, 5, 24, 70, 3, false, false},
  };
  uint32_t seed = 31000;
  for (const Case& c : cases) {
    char name[200];
    std::snprintf(name, sizeof name, "index_scores %s T=%lld N=%lld heads=%lld d=%lld round=%d", c.what,
                  static_cast<long long>(c.T), static_cast<long long>(c.N), static_cast<long long>(c.nh),
                  static_cast<long long>(c.d), c.round ? 1 : 0);
    run_case(name + group_tag(), [&] {
      const di::Tensor q = normal_tensor({c.T, c.nh, c.d}, 1.0f, seed++, c.round);
      const di::Tensor keys = normal_tensor({c.N, c.d}, 1.0f, seed++, c.round);
      const di::Tensor w = normal_tensor({c.T, c.nh}, 0.05f, seed++, c.round);
      di::ops::KeyVisibility vis{di::Tensor(), c.start_pos, c.ratio};
      di::ops::KeyVisibility vis_dev = vis;
      if (c.counts) {
        std::mt19937 rng(seed++);
        vis.counts = di::Tensor::empty({c.T}, di::DType::kI32);
        for (int64_t t = 0; t < c.T; ++t)
          vis.counts.data<int32_t>()[t] = static_cast<int32_t>(t == 0 ? c.N : rng() % static_cast<uint32_t>(c.N + 1));
        vis_dev.counts = dev(vis.counts);
      }
      const di::Tensor want = di::ops::index_scores(q, keys, w, vis, c.round);
      return exact(want, di::ops::index_scores(dev(q), dev(keys), dev(w), vis_dev, c.round));
    });
  }
  // Rows over their own keys of a stacked table (a decode batch's indexer in one call): offsets and counts per row,
  // W columns; against the CPU op with the same offsets.
  struct OffCase {
    const char* what;
    int64_t T, keys_per_row, nh, d, W;
    bool round;
  };
  const OffCase off_cases[] = {
      {"batch of 256 short rows", 256, 32, 64, 128, 40, true},
      {"batch of 8 long rows", 8, 3000, 64, 128, 3001, true},
      {"odd shapes", 37, 19, 6, 40, 25, false},
  };
  for (const OffCase& c : off_cases) {
    char name[200];
    std::snprintf(name, sizeof name, "index_scores offsets %s T=%lld W=%lld", c.what, static_cast<long long>(c.T),
                  static_cast<long long>(c.W));
    run_case(name + group_tag(), [&] {
      std::mt19937 rng(seed++);
      di::ops::KeyVisibility vis;
      vis.counts = di::Tensor::empty({c.T}, di::DType::kI32);
      vis.offsets = di::Tensor::empty({c.T}, di::DType::kI32);
      vis.width = c.W;
      int64_t N = 0;
      for (int64_t t = 0; t < c.T; ++t) {
        const int64_t n = 1 + static_cast<int64_t>(rng() % static_cast<uint32_t>(c.keys_per_row));
        vis.offsets.data<int32_t>()[t] = static_cast<int32_t>(N);
        vis.counts.data<int32_t>()[t] = static_cast<int32_t>(t % 5 == 0 ? c.W : n);  // some above the row's keys
        N += n;
      }
      const di::Tensor q = normal_tensor({c.T, c.nh, c.d}, 1.0f, seed++, c.round);
      const di::Tensor keys = normal_tensor({N, c.d}, 1.0f, seed++, c.round);
      const di::Tensor w = normal_tensor({c.T, c.nh}, 0.05f, seed++, c.round);
      di::ops::KeyVisibility vis_dev = vis;
      vis_dev.counts = dev(vis.counts);
      vis_dev.offsets = dev(vis.offsets);
      const di::Tensor want = di::ops::index_scores(q, keys, w, vis, c.round);
      return exact(want, di::ops::index_scores(dev(q), dev(keys), dev(w), vis_dev, c.round));
    });
  }
  test_index_scores_runs();
}

void test_moe_route() {
  struct Case {
    const char* what;
    int64_t T, E, k;
    di::ops::ScoreFunc func;
    float temp;
    bool bias, hash, ties, normalize;
    float eps, scale;
  };
  using SF = di::ops::ScoreFunc;
  const Case cases[] = {
      {"flash sqrtsoftplus bias", 512, 256, 6, SF::kSqrtSoftplus, 1.0f, true, false, false, true, 0.0f, 1.5f},
      {"v4.1 gate_temp eps", 300, 256, 6, SF::kSqrtSoftplus, 1.7f, true, false, false, true, 1e-20f, 2.5f},
      {"v4.1 no norm", 64, 256, 6, SF::kSqrtSoftplus, 1.0f, true, false, false, false, 1e-20f, 1.0f},
      {"ties", 256, 256, 8, SF::kSqrtSoftplus, 1.0f, false, false, true, true, 0.0f, 1.0f},
      {"hash", 200, 256, 6, SF::kSqrtSoftplus, 1.0f, false, true, false, true, 0.0f, 1.5f},
      {"sigmoid", 128, 256, 8, SF::kSigmoid, 1.0f, true, false, false, true, 1e-20f, 2.5f},
      {"softmax", 128, 64, 6, SF::kSoftmax, 1.0f, false, false, false, true, 0.0f, 1.0f},
      {"decode", 1, 256, 6, SF::kSqrtSoftplus, 1.0f, true, false, false, true, 0.0f, 1.5f},
      // The V4.1 expert count, E not a multiple of 32, k up to 40, and E past 512.
      {"v4.1 384 experts", 64, 384, 6, SF::kSqrtSoftplus, 1.7f, true, false, false, true, 1e-20f, 2.5f},
      {"ties 384", 128, 384, 6, SF::kSqrtSoftplus, 1.0f, false, false, true, true, 0.0f, 1.0f},
      {"512 experts", 32, 512, 8, SF::kSqrtSoftplus, 1.0f, true, false, false, true, 0.0f, 1.0f},
      {"100 experts", 32, 100, 6, SF::kSigmoid, 1.0f, true, false, true, true, 0.0f, 1.0f},
      {"k 32 ties", 16, 256, 32, SF::kSqrtSoftplus, 1.0f, false, false, true, true, 0.0f, 1.0f},
      {"640 experts (register top-k)", 32, 640, 8, SF::kSqrtSoftplus, 1.0f, true, false, false, true, 0.0f, 1.0f},
      {"k 40", 16, 256, 40, SF::kSqrtSoftplus, 1.0f, false, false, true, true, 0.0f, 1.0f},
      {"one token, 384 experts", 1, 384, 6, SF::kSqrtSoftplus, 1.0f, true, false, false, true, 0.0f, 1.0f},
      {"ties 768 (the register top-k's limit)", 16, 768, 8, SF::kSqrtSoftplus, 1.0f, false, false, true, true, 0.0f,
       1.0f},
      {"1000 experts (shared-memory scan)", 8, 1000, 8, SF::kSqrtSoftplus, 1.0f, true, false, false, true, 0.0f, 1.0f},
      {"ties 769 (shared-memory scan)", 8, 769, 12, SF::kSqrtSoftplus, 1.0f, false, false, true, true, 0.0f, 1.0f},
  };
  uint32_t seed = 32000;
  for (const Case& c : cases) {
    char name[200];
    std::snprintf(name, sizeof name, "moe_route %s T=%lld E=%lld k=%lld", c.what, static_cast<long long>(c.T),
                  static_cast<long long>(c.E), static_cast<long long>(c.k));
    run_case(name, [&] {
      std::mt19937 rng(seed++);
      std::normal_distribution<float> normal(0.0f, 2.5f);
      di::Tensor logits = di::Tensor::empty({c.T, c.E}, di::DType::kF32);
      for (int64_t i = 0; i < logits.numel(); ++i)
        logits.data<float>()[i] = c.ties ? static_cast<float>(static_cast<int>(rng() % 9) - 4) * 0.5f
                                         : (rng() % 50 == 0 ? 20.0f + normal(rng) : normal(rng));
      di::Tensor bias, tid2eid, tokens;
      if (c.bias) bias = normal_tensor({c.E}, 0.1f, seed++, false);
      if (c.hash) {
        const int64_t vocab = 1000;
        tid2eid = di::Tensor::empty({vocab, c.k}, di::DType::kI64);
        for (int64_t i = 0; i < tid2eid.numel(); ++i) tid2eid.data<int64_t>()[i] = static_cast<int64_t>(rng() % c.E);
        tokens = di::Tensor::empty({c.T}, di::DType::kI32);
        for (int64_t t = 0; t < c.T; ++t) tokens.data<int32_t>()[t] = static_cast<int32_t>(rng() % vocab);
      }
      di::ops::RouteOpts o;
      o.func = c.func;
      o.temp = c.temp;
      o.normalize = c.normalize;
      o.norm_eps = c.eps;
      o.route_scale = c.scale;
      const di::ops::Routing want = di::ops::moe_route(logits, bias, tid2eid, tokens, c.k, o);
      const di::ops::Routing got =
          di::ops::moe_route(dev(logits), bias.defined() ? dev(bias) : di::Tensor(),
                             c.hash ? dev(tid2eid) : di::Tensor(), c.hash ? dev(tokens) : di::Tensor(), c.k, o);
      std::string p = compare_idx(want.ids, got.ids);
      const std::string w = close_to(want.weights, got.weights, 1e-6, 1e-30, "1e-6 relative (exp/log1p ulps)");
      return p.empty() ? w : p;
    });
  }
}

// ops::moe_dispatch: a single token's route, grouping and gather in the route's launch (cuda::moe_dispatch) against the
// three ops run one after the other on the GPU, bit for bit (each of those is checked against the CPU: test_moe_route,
// test_moe_group, test_embedding_gather), plus the ids against the CPU's route; the op's fallback for other calls.
void test_moe_dispatch_fused() {
  struct Case {
    const char* what;
    int64_t T, E, k, width, block;
    bool hash, ties;
  };
  const Case cases[] = {
      {"v4.1 flash decode", 1, 384, 6, 4096, 128, false, false},
      {"quant 32", 1, 384, 6, 5120, 32, false, false},
      {"no quant (tc)", 1, 384, 6, 4096, 0, false, false},
      {"ragged width 1000 block 128", 1, 256, 8, 1000, 128, false, false},
      {"hash (repeated experts)", 1, 64, 8, 4096, 128, true, false},
      {"ties, k 32", 1, 256, 32, 512, 128, false, true},
      {"k 1", 1, 100, 1, 300, 128, false, false},
      {"1000 experts (shared-memory top-k)", 1, 1000, 6, 2048, 128, false, false},
      {"block 48 (the generic gather)", 1, 384, 6, 4096, 48, false, false},
      {"width 16384 (the generic gather)", 1, 384, 6, 16384, 128, false, false},
      {"two tokens (the three ops)", 2, 384, 6, 4096, 128, false, false},
      {"k 40 (the three ops)", 1, 256, 40, 512, 128, false, true},
  };
  uint32_t seed = 32500;
  for (const Case& c : cases) {
    char name[200];
    std::snprintf(name, sizeof name, "moe_dispatch %s T=%lld E=%lld k=%lld width=%lld block=%lld", c.what,
                  static_cast<long long>(c.T), static_cast<long long>(c.E), static_cast<long long>(c.k),
                  static_cast<long long>(c.width), static_cast<long long>(c.block));
    run_case(name, [&] {
      std::mt19937 rng(seed++);
      std::normal_distribution<float> normal(0.0f, 2.5f);
      di::Tensor logits = di::Tensor::empty({c.T, c.E}, di::DType::kF32);
      for (int64_t i = 0; i < logits.numel(); ++i)
        logits.data<float>()[i] = c.ties ? static_cast<float>(static_cast<int>(rng() % 9) - 4) * 0.5f : normal(rng);
      di::Tensor bias, tid2eid, tokens;
      if (c.hash) {
        const int64_t vocab = 50;
        tid2eid = di::Tensor::empty({vocab, c.k}, di::DType::kI32);
        for (int64_t i = 0; i < tid2eid.numel(); ++i) tid2eid.data<int32_t>()[i] = static_cast<int32_t>(rng() % 9);
        tokens = di::Tensor::empty({c.T}, di::DType::kI32);
        for (int64_t t = 0; t < c.T; ++t) tokens.data<int32_t>()[t] = static_cast<int32_t>(rng() % vocab);
      } else {
        bias = normal_tensor({c.E}, 0.1f, seed++, false);
      }
      const di::Tensor x = normal_tensor({c.T, c.width}, 1.0f, seed++, true);
      di::ops::RouteOpts o;
      o.temp = 1.7f;
      o.norm_eps = 1e-20f;
      o.route_scale = 2.5f;
      const di::Tensor dl = dev(logits), db = c.hash ? di::Tensor() : dev(bias);
      const di::Tensor dt = c.hash ? dev(tid2eid) : di::Tensor(), dk = c.hash ? dev(tokens) : di::Tensor();
      const di::Tensor dx = dev(x);
      const di::ops::MoeDispatch fused = di::cuda::moe_dispatch(dl, db, dt, dk, c.k, o, c.E, dx, c.block);
      const bool single = c.T == 1 && c.k <= 32;
      if (fused.routing.ids.defined() != single)
        return std::string(single ? "the fused launch did not take a single token" : "the fused launch took the call");
      const di::ops::MoeDispatch got = di::ops::moe_dispatch(dl, db, dt, dk, c.k, o, c.E, false, dx, c.block);
      const di::ops::Routing r = di::ops::moe_route(dl, db, dt, dk, c.k, o);
      const di::ops::MoeGroups g = di::ops::moe_group(r.ids, r.weights, c.E, /*host_offsets=*/false);
      const di::Tensor xg = di::ops::gather_rows(dx, g.rows, c.block);
      const di::ops::Routing cpu = di::ops::moe_route(logits, bias, tid2eid, tokens, c.k, o);
      std::string p = compare_idx(cpu.ids, got.routing.ids);
      const auto idx = [](const di::Tensor& want_dev, const di::Tensor& got_dev) {
        return compare_idx(di::cuda::copy_to_host(want_dev), got_dev);
      };
      if (p.empty()) p = idx(r.ids, got.routing.ids);
      if (p.empty()) p = exact(r.weights, got.routing.weights);
      if (p.empty()) p = idx(g.rows, got.groups.rows);
      if (p.empty()) p = idx(g.row_expert, got.groups.row_expert);
      if (p.empty()) p = idx(g.slots, got.groups.slots);
      if (p.empty()) p = exact(g.weights, got.groups.weights);
      if (p.empty() && !got.groups.offsets.empty()) p = "host offsets returned";
      return p.empty() ? exact(xg, got.x) : p;
    });
  }
}

void test_swiglu() {
  struct Case {
    int64_t T, I;
    float limit;
    bool weights, round;
  };
  const Case cases[] = {{64, 2048, 10.0f, true, true},  {64, 2048, 10.0f, false, true}, {1, 2048, 10.0f, true, true},
                        {33, 2048, 10.0f, true, false}, {17, 300, 0.0f, false, true},   {17, 300, 0.0f, true, false}};
  uint32_t seed = 33000;
  for (const Case& c : cases) {
    char name[200];
    std::snprintf(name, sizeof name, "swiglu [%lld, %lld] limit %g weights=%d round=%d", static_cast<long long>(c.T),
                  static_cast<long long>(c.I), c.limit, c.weights ? 1 : 0, c.round ? 1 : 0);
    run_case(name, [&] {
      const di::Tensor g = normal_tensor({c.T, c.I}, 6.0f, seed++, true),
                       u = normal_tensor({c.T, c.I}, 6.0f, seed++, true);
      di::Tensor w;
      if (c.weights) w = normal_tensor({c.T}, 0.3f, seed++, false);
      const di::Tensor want = di::ops::swiglu(g, u, w, c.limit, c.round);
      const di::Tensor got = di::ops::swiglu(dev(g), dev(u), c.weights ? dev(w) : di::Tensor(), c.limit, c.round);
      return c.round ? close_to(want, got, 1.0 / 128, 0.0, "one bf16 step (exp ulps)")
                     : close_to(want, got, 1e-6, 1e-30, "1e-6 relative (exp ulps)");
    });
  }
  // quant_block: the fused fake quantisation gives the bits of the plain swiglu followed by fake_quant_fp8 (both
  // on the GPU; each is checked against the CPU above and in test_quant).
  for (const int64_t block : {32, 128, 48}) {
    const Case& c = cases[static_cast<size_t>(block == 48 ? 4 : 0)];
    run_case("swiglu quant_block " + std::to_string(block) + " " + shape_name({c.T, c.I}), [&] {
      const di::Tensor g = dev(normal_tensor({c.T, c.I}, 6.0f, seed++, true)),
                       u = dev(normal_tensor({c.T, c.I}, 6.0f, seed++, true));
      const di::Tensor w = dev(normal_tensor({c.T}, 0.3f, seed++, false));
      di::Tensor want = di::ops::swiglu(g, u, w, c.limit, c.round);
      di::ops::fake_quant_fp8(want, 0, c.I, block);
      return exact(want, di::ops::swiglu(g, u, w, c.limit, c.round, block));
    });
  }
}

void test_embedding_gather() {
  uint32_t seed = 34000;
  // V4.1-Flash embedding width 4096 (a slice of the vocabulary), 4 hc copies.
  for (bool bf16 : {true, false}) {
    const int64_t V = bf16 ? 8192 : 1000, dim = bf16 ? 4096 : 512, T = 300, copies = bf16 ? 4 : 1;
    run_case(std::string("embedding ") + (bf16 ? "bf16" : "f32") + " " + shape_name({V, dim}) + " T=300 copies " +
                 std::to_string(copies),
             [&] {
               const di::Tensor f = normal_tensor({V, dim}, 1.0f, seed++, true);
               di::Tensor table = f;
               if (bf16) {
                 table = di::Tensor::empty({V, dim}, di::DType::kBF16);
                 for (int64_t i = 0; i < f.numel(); ++i)
                   table.data<uint16_t>()[i] = di::f32_to_bf16(f.data<float>()[i]);
               }
               std::mt19937 rng(seed++);
               di::Tensor ids = di::Tensor::empty({T}, di::DType::kI32);
               for (int64_t t = 0; t < T; ++t) ids.data<int32_t>()[t] = static_cast<int32_t>(rng() % V);
               return exact(di::ops::embedding(table, ids, copies), di::ops::embedding(dev(table), dev(ids), copies));
             });
  }
  run_case("gather_rows [1000, 4, 4096] R=37", [&] {
    const di::Tensor x = normal_tensor({1000, 4, 4096}, 1.0f, seed++, false);
    std::mt19937 rng(seed++);
    di::Tensor rows = di::Tensor::empty({37}, di::DType::kI32);
    for (int64_t i = 0; i < 37; ++i) rows.data<int32_t>()[i] = static_cast<int32_t>(rng() % 1000);
    return exact(di::ops::gather_rows(x, rows), di::ops::gather_rows(dev(x), dev(rows)));
  });
  // quant_block: each gathered row fake-quantised in the same launch, against the CPU's gather + fake_quant_fp8.
  for (const int64_t block : {32, 128, 100}) {
    run_case("gather_rows quant_block " + std::to_string(block) + " [300, 5120] R=40", [&] {
      const di::Tensor x = normal_tensor({300, 5120}, 3.0f, seed++, false);
      std::mt19937 rng(seed++);
      di::Tensor rows = di::Tensor::empty({40}, di::DType::kI32);
      for (int64_t i = 0; i < 40; ++i) rows.data<int32_t>()[i] = static_cast<int32_t>(rng() % 300);
      return exact(di::ops::gather_rows(x, rows, block), di::ops::gather_rows(dev(x), dev(rows), block));
    });
  }
}

// ---- MoE dispatch and combine (issue 8 step 3): grouping by expert, the FP32 combine, copy_into ----
di::Tensor route_ids(int64_t T, int64_t E, int64_t k, bool distinct, uint32_t seed) {
  std::mt19937 rng(seed);
  di::Tensor ids = di::Tensor::empty({T, k}, di::DType::kI32);
  std::vector<int32_t> perm(E);
  for (int64_t t = 0; t < T; ++t) {
    if (distinct) {  // top-k routing: k different experts in score order
      for (int64_t e = 0; e < E; ++e) perm[e] = static_cast<int32_t>(e);
      for (int64_t j = 0; j < k; ++j) std::swap(perm[j], perm[j + rng() % (E - j)]);
    }
    for (int64_t j = 0; j < k; ++j)
      ids.data<int32_t>()[t * k + j] = distinct ? perm[j] : static_cast<int32_t>(rng() % E);  // hash: repeats
  }
  return ids;
}

void test_moe_dispatch() {
  struct Case {
    const char* what;
    int64_t T, E, k, dim;
    bool distinct;
  };
  // V4.1-Flash: 256 experts, 6 active, dim 4096; hash layers can repeat an expert within a token.
  const Case cases[] = {
      {"flash prefill", 512, 256, 6, 4096, true},    {"flash decode", 1, 256, 6, 4096, true},
      {"flash decode batch", 9, 256, 6, 4096, true}, {"hash repeats", 200, 64, 8, 512, false},
      {"long chunk", 3000, 256, 6, 256, true},       {"odd", 37, 7, 3, 300, false},
  };
  uint32_t seed = 35000;
  for (const Case& c : cases) {
    char name[200];
    std::snprintf(name, sizeof name, "moe_group %s T=%lld E=%lld k=%lld", c.what, static_cast<long long>(c.T),
                  static_cast<long long>(c.E), static_cast<long long>(c.k));
    const di::Tensor ids = route_ids(c.T, c.E, c.k, c.distinct, seed++);
    const di::Tensor w = normal_tensor({c.T, c.k}, 0.3f, seed++, false);
    run_case(name, [&] {
      const di::ops::MoeGroups want = di::ops::moe_group(ids, w, c.E);
      const di::ops::MoeGroups got = di::ops::moe_group(dev(ids), dev(w), c.E);
      if (want.offsets != got.offsets) return std::string("offsets differ");
      std::string p = compare_idx(want.rows, got.rows);
      if (p.empty()) p = compare_idx(want.slots, got.slots);
      return p.empty() ? exact(want.weights, got.weights) : p;
    });
    for (bool round : {true, false}) {
      std::snprintf(name, sizeof name, "moe_combine %s T=%lld k=%lld dim=%lld round=%d", c.what,
                    static_cast<long long>(c.T), static_cast<long long>(c.k), static_cast<long long>(c.dim),
                    round ? 1 : 0);
      run_case(name, [&] {
        const di::ops::MoeGroups g = di::ops::moe_group(ids, w, c.E);
        const di::Tensor y = normal_tensor({c.T * c.k, c.dim}, 0.5f, seed++, round);
        const di::Tensor shared = normal_tensor({c.T, c.dim}, 0.5f, seed++, round);
        const di::Tensor want = di::ops::moe_combine(y, g.slots, shared, round);
        return exact(want, di::ops::moe_combine(dev(y), dev(g.slots), dev(shared), round));
      });
      if (c.T > 600) continue;
      std::snprintf(name, sizeof name, "moe_combine_expand %s T=%lld k=%lld dim=%lld round=%d", c.what,
                    static_cast<long long>(c.T), static_cast<long long>(c.k), static_cast<long long>(c.dim),
                    round ? 1 : 0);
      run_case(name, [&] {  // against the CPU's hc_expand(moe_combine(...)) (ops.cpp), bit for bit
        const di::ops::MoeGroups g = di::ops::moe_group(ids, w, c.E);
        const di::Tensor y = normal_tensor({c.T * c.k, c.dim}, 0.5f, seed++, round);
        const di::Tensor shared = normal_tensor({c.T, c.dim}, 0.5f, seed++, round);
        const di::Tensor stream = normal_tensor({c.T, 4, c.dim}, 1.0f, seed++, round);
        const di::Tensor post = normal_tensor({c.T, 4}, 0.8f, seed++, false);
        const di::Tensor comb = normal_tensor({c.T, 4, 4}, 0.4f, seed++, false);
        const di::Tensor want = di::ops::moe_combine_expand(y, g.slots, shared, stream, post, comb, round);
        const di::Tensor got =
            di::ops::moe_combine_expand(dev(y), dev(g.slots), dev(shared), dev(stream), dev(post), dev(comb), round);
        return exact(want, got);
      });
    }
  }
  // The device-only grouping (host_offsets = false, the grouped experts' path): moe_group_small_kernel up to 512
  // pairs, the count / scan / compaction kernels above; the rows of the valid pairs must be the CPU's.
  for (const Case& c : cases) {
    if (c.T * c.k > 4000) continue;
    char name[200];
    std::snprintf(name, sizeof name, "moe_group device rows %s T=%lld E=%lld k=%lld", c.what,
                  static_cast<long long>(c.T), static_cast<long long>(c.E), static_cast<long long>(c.k));
    const di::Tensor ids = route_ids(c.T, c.E, c.k, c.distinct, seed++);
    const di::Tensor w = normal_tensor({c.T, c.k}, 0.3f, seed++, false);
    run_case(name, [&] {
      const di::ops::MoeGroups want = di::ops::moe_group(ids, w, c.E);
      const di::ops::MoeGroups got = di::ops::moe_group(dev(ids), dev(w), c.E, /*host_offsets=*/false);
      if (!got.offsets.empty()) return std::string("host offsets returned");
      const int64_t P = c.T * c.k;
      if (got.rows.numel() != P || got.row_expert.numel() != P) return std::string("row count differs");
      std::string p = compare_idx(want.rows, got.rows);
      if (p.empty()) p = compare_idx(want.row_expert, got.row_expert);
      if (p.empty()) p = compare_idx(want.slots, got.slots);
      return p.empty() ? exact(want.weights, got.weights) : p;
    });
  }
  run_case("moe_combine empty slots (-1) and [17, 5] dim 1000", [&] {
    std::mt19937 rng(seed++);
    const int64_t T = 17, k = 5, R = 40, dim = 1000;
    di::Tensor slots = di::Tensor::empty({T, k}, di::DType::kI32);
    for (int64_t i = 0; i < T * k; ++i)
      slots.data<int32_t>()[i] = rng() % 3 == 0 ? -1 : static_cast<int32_t>(rng() % R);
    const di::Tensor y = normal_tensor({R, dim}, 3.0f, seed++, false);
    const di::Tensor shared = normal_tensor({T, dim}, 0.1f, seed++, false);
    return exact(di::ops::moe_combine(y, slots, shared, false),
                 di::ops::moe_combine(dev(y), dev(slots), dev(shared), false));
  });
  run_case("copy_into row slice [100, 4096] rows 37..80", [&] {
    const di::Tensor src = normal_tensor({43, 4096}, 1.0f, seed++, false);
    di::Tensor want = normal_tensor({100, 4096}, 1.0f, seed++, false);
    const di::Tensor got = dev(want);
    di::ops::copy_into(want.slice(0, 37, 80), src);
    di::ops::copy_into(got.slice(0, 37, 80), dev(src));
    return exact(want, got);
  });
}

// ---- compressor pooling (issue 8 step 3): V4 ratio 4 with overlap and ape, V4 HCA ratio 128, V4.1 ratio 2 ----
void test_compress_pool() {
  struct Case {
    const char* what;
    int64_t G, r, d;
    bool overlap, has_prev, ape;
  };
  const Case cases[] = {
      {"v4 csa r4 overlap prefill", 256, 4, 512, true, false, true},
      {"v4 csa r4 overlap decode", 1, 4, 512, true, true, true},
      {"v4 indexer r4 overlap", 64, 4, 128, true, true, true},
      {"v4 hca r128", 8, 128, 512, false, false, true},
      {"v4.1 flash r2", 512, 2, 512, false, false, false},
      {"v4.1 flash r2 decode", 1, 2, 512, false, false, false},
      {"odd", 7, 3, 77, true, false, false},
  };
  uint32_t seed = 36000;
  for (const Case& c : cases) {
    char name[200];
    std::snprintf(name, sizeof name, "compress_pool %s G=%lld r=%lld d=%lld", c.what, static_cast<long long>(c.G),
                  static_cast<long long>(c.r), static_cast<long long>(c.d));
    run_case(name, [&] {
      const int64_t w = c.overlap ? 2 * c.d : c.d, rows = (c.overlap ? c.r : 0) + c.G * c.r;
      const di::Tensor kv = normal_tensor({rows, w}, 1.0f, seed++, false);
      const di::Tensor score = normal_tensor({rows, w}, 3.0f, seed++, false);
      di::Tensor ape;
      if (c.ape) ape = normal_tensor({c.r, w}, 1.0f, seed++, false);
      const di::Tensor want = di::ops::compress_pool(kv, score, ape, c.r, c.d, c.overlap, c.has_prev);
      const di::Tensor got =
          di::ops::compress_pool(dev(kv), dev(score), c.ape ? dev(ape) : di::Tensor(), c.r, c.d, c.overlap, c.has_prev);
      return close_to(want, got, 1e-5, 1e-6, "1e-5 relative + 1e-6 (exp ulps)");
    });
  }
}

// ---- renorm_heads (V4 q): one warp per head, lane 0 replaying the sequential FP64 sum ----
void test_renorm_heads() {
  struct Case {
    int64_t T, H, D;
    bool round;
  };
  const Case cases[] = {
      {256, 64, 512, true}, {1, 64, 512, true}, {33, 64, 512, false}, {5, 3, 72, true}, {3, 5, 37, false}};
  uint32_t seed = 37000;
  for (const Case& c : cases) {
    char name[200];
    std::snprintf(name, sizeof name, "renorm_heads [%lld, %lld*%lld] round=%d", static_cast<long long>(c.T),
                  static_cast<long long>(c.H), static_cast<long long>(c.D), c.round ? 1 : 0);
    run_case(name, [&] {
      di::Tensor want = normal_tensor({c.T, c.H * c.D}, 2.0f, seed++, c.round);
      di::Tensor got = dev(want);
      di::ops::renorm_heads(want, c.D, 1e-6f, c.round);
      di::ops::renorm_heads(got, c.D, 1e-6f, c.round);
      return exact(want, got);
    });
  }
}

// ---- scale (indexer weights) and the device copies (copy_tensor, Tensor::to / clone) ----
void test_scale_and_copies() {
  uint32_t seed = 38000;
  for (const bool round : {true, false}) {
    run_case(round ? "scale [300, 64] round=1" : "scale [300, 64] round=0", [&] {
      di::Tensor want = normal_tensor({300, 64}, 3.0f, seed++, round);
      di::Tensor got = dev(want);
      di::ops::scale(want, 0.0110485f, round);
      di::ops::scale(got, 0.0110485f, round);
      return exact(want, got);
    });
  }
  run_case("copy_tensor column slices host->device->host", [&] {
    di::Tensor a = normal_tensor({37, 96}, 1.0f, seed++, false);
    di::Tensor d = di::Tensor::zeros({37, 3, 32}, di::DType::kF32, di::Device::kCUDA);
    for (int g = 0; g < 3; ++g) di::copy_tensor(d.select(1, g), a.view({37, 3, 32}).select(1, g).contiguous());
    di::Tensor back = d.view({37, 96}).clone().to(di::Device::kCPU);
    di::Tensor strided = d.select(1, 1).contiguous();  // a device 2D copy
    di::Tensor want1 = a.view({37, 3, 32}).select(1, 1).contiguous();
    const std::string e = exact(a, back);
    return e.empty() ? exact(want1, strided) : e;
  });
}

// ---- side work (ops::SideWork): ops beside the main stream, bit for bit; a block freed inside it is not handed to
// the main stream before the join ----
// nseg runs of 1 to 130 rows (every seventh empty) at random places of a store of 8,192 rows of `width` (normal values
// from `seed`), as host runs over `host` and the same runs over its device copy `store`; returns their rows in all.
int64_t scattered_runs(int64_t width, int nseg, std::mt19937& rng, uint32_t seed, di::Tensor& host, di::Tensor& store,
                       std::vector<di::ops::RowSegment>& hs, std::vector<di::ops::RowSegment>& ds) {
  const int64_t store_rows = 8192;
  host = normal_tensor({store_rows, width}, 1.0f, seed, false);
  store = dev(host);
  int64_t rows = 0;
  for (int i = 0; i < nseg; ++i) {
    const int64_t n = i % 7 == 3 ? 0 : 1 + static_cast<int64_t>(rng() % 130);
    const int64_t at = static_cast<int64_t>(rng() % static_cast<uint32_t>(store_rows - n));
    hs.push_back({host.data<float>() + at * width, n});
    ds.push_back({store.data<float>() + at * width, n});
    rows += n;
  }
  return rows;
}

// gather_segments on the device against the CPU op, bit for bit: runs of 1 to 130 rows (a window's two runs, a chunk's
// rows, 64-row pages) from scattered places of a store, some empty, widths 512 and 128.
void test_gather_segments() {
  uint32_t seed = 39700;
  for (const int64_t width : {512, 128}) {
    for (const int nseg : {1, 3, 40}) {
      run_case("gather_segments width " + std::to_string(width) + " segments " + std::to_string(nseg), [&] {
        std::mt19937 rng(seed++);
        di::Tensor host, store;
        std::vector<di::ops::RowSegment> hs, ds;
        const int64_t rows = scattered_runs(width, nseg, rng, seed++, host, store, hs, ds);
        di::Tensor want = di::Tensor::zeros({rows, width}, di::DType::kF32);
        di::Tensor got = di::Tensor::zeros({rows, width}, di::DType::kF32, di::Device::kCUDA);
        di::ops::gather_segments(hs, want);
        di::ops::gather_segments(ds, got);
        return exact(want, got);
      });
    }
  }
}

// gather_listed on the device against the CPU op, bit for bit (the gathered rows and the rewritten lists): runs
// scattered in a store (3: the table in the launch's parameters; 40: uploaded), widths 512, 128 and 66 (not a float4
// multiple: the one-float copies), lists of valid, empty (-1, -3) and (device only) out-of-range entries, which the CPU
// reference gets as -1. Then the use: the split decode attention over the listed rows against the same kernel over the
// whole table, bit for bit.
void test_gather_listed() {
  uint32_t seed = 39750;
  for (const int64_t width : {512, 128, 66}) {
    for (const int nseg : {3, 40}) {
      run_case("gather_listed width " + std::to_string(width) + " segments " + std::to_string(nseg), [&] {
        std::mt19937 rng(seed++);
        const int64_t R = 3, K = 200;
        di::Tensor host, store;
        std::vector<di::ops::RowSegment> hs, ds;
        const int64_t N = scattered_runs(width, nseg, rng, seed++, host, store, hs, ds);
        di::Tensor idx_h = di::Tensor::empty({R, K}, di::DType::kI32), idx_d = idx_h.clone();
        for (int64_t e = 0; e < R * K; ++e) {
          const uint32_t r = rng() % 10;
          const int32_t j = r == 0 ? -1 : r == 1 ? -3 : static_cast<int32_t>(rng() % static_cast<uint32_t>(N));
          idx_h.data<int32_t>()[e] = j;
          idx_d.data<int32_t>()[e] = r == 2 ? static_cast<int32_t>(N + rng() % 50) : j;  // past the table: empty
          if (r == 2) idx_h.data<int32_t>()[e] = -1;
        }
        di::Tensor want = di::Tensor::zeros({R * K, width}, di::DType::kF32);
        di::Tensor got = di::Tensor::zeros({R * K, width}, di::DType::kF32, di::Device::kCUDA);
        di::Tensor idx_dev = dev(idx_d);
        di::ops::gather_listed(hs, idx_h, want);
        di::ops::gather_listed(ds, idx_dev, got);
        const std::string e = exact(want, got);
        if (!e.empty()) return e;
        const di::Tensor idx_back = di::cuda::copy_to_host(idx_dev);
        for (int64_t i = 0; i < R * K; ++i)
          if (idx_back.data<int32_t>()[i] != idx_h.data<int32_t>()[i])
            return "list entry " + std::to_string(i) + ": cpu " + std::to_string(idx_h.data<int32_t>()[i]) + ", cuda " +
                   std::to_string(idx_back.data<int32_t>()[i]);
        return std::string();
      });
    }
  }
  run_case("gather_listed then the split decode attention (T=1, 64 x 512, 640 entries of 20,000 rows)", [&] {
    const int64_t T = 1, H = 64, D = 512, K = 640, N = 20000;
    const di::Tensor kv_h = normal_tensor({N, D}, 1.0f, seed++, true);
    const di::Tensor q = dev(normal_tensor({T, H, D}, 0.05f, seed++, true));
    const di::Tensor sink = dev(normal_tensor({H}, 1.0f, seed++, false));
    const di::Tensor kv = dev(kv_h);
    std::mt19937 rng(seed++);
    di::Tensor idx_h = di::Tensor::empty({T, K}, di::DType::kI32);
    for (int64_t e = 0; e < T * K; ++e)  // the window's empty slots first, then rows
      idx_h.data<int32_t>()[e] = e < 40 ? -1 : static_cast<int32_t>(rng() % static_cast<uint32_t>(N));
    // The table as runs of 64 rows (a paged store), one more run than the parameters hold.
    std::vector<di::ops::RowSegment> runs;
    for (int64_t r = 0; r < N; r += 64) runs.push_back({kv.data<float>() + r * D, std::min<int64_t>(64, N - r)});
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    const di::Tensor want = di::ops::sparse_attention(q, kv, dev(idx_h), sink, scale, true, true);
    di::Tensor idx = dev(idx_h);
    di::Tensor rows = di::Tensor::empty({T * K, D}, di::DType::kF32, di::Device::kCUDA);
    di::ops::gather_listed(runs, idx, rows);
    const di::Tensor got = di::ops::sparse_attention(q, rows, idx, sink, scale, true, true);
    return exact(want, got);
  });
}

// A table [N, d] (host) as a paged store on the device: pages of `page_rows` rows, laid in reverse order with a page of
// gap between them (`store`), their addresses on the host (`host_pages`) and on the device (`table`, u64), as
// RowPages::paged_segment gives them. device_table false: the store without its device copy (the runs' fallback).
di::ops::RowSegment paged_store(const di::Tensor& t, int64_t page_rows, bool device_table, di::Tensor& store,
                                std::vector<float*>& host_pages, di::Tensor& table) {
  const int64_t N = t.size(0), d = t.size(1), P = (N + page_rows - 1) / page_rows;
  di::Tensor host = di::Tensor::zeros({2 * P * page_rows, d}, di::DType::kF32);
  for (int64_t p = 0; p < P; ++p)  // page p at slot 2 (P - 1 - p)
    std::memcpy(host.data<float>() + 2 * (P - 1 - p) * page_rows * d, t.data<float>() + p * page_rows * d,
                static_cast<size_t>(std::min(page_rows, N - p * page_rows) * d) * sizeof(float));
  store = dev(host);
  host_pages.clear();
  di::Tensor addr = di::Tensor::empty({std::max<int64_t>(P, 1)}, di::DType::kI64);
  for (int64_t p = 0; p < P; ++p) {
    host_pages.push_back(store.data<float>() + 2 * (P - 1 - p) * page_rows * d);
    addr.data<int64_t>()[p] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(host_pages.back()));
  }
  table = dev(addr);
  di::ops::RowSegment s{nullptr, N};
  s.pages = host_pages.data();
  s.page_rows = page_rows;
  if (device_table) s.device_pages = reinterpret_cast<const uint64_t*>(table.data<int64_t>());
  return s;
}

// Paged stores read in place (ops::RowSegment's paged form, one entry of the launch's run table however many pages):
// gather_listed and the indexer's decode kernel over [a run, a paged store, a run] and over 20 stores (more entries
// than the parameters hold: the pages' runs uploaded), and a store without its device copy (its pages' runs), against
// the CPU ops over the same rows as one table, bit for bit.
void test_paged_stores() {
  uint32_t seed = 39770;
  struct Case {
    const char* what;
    int64_t N, page_rows;
    int stores;
    bool device_table;
  };
  const Case cases[] = {
      {"one store of 313 pages between two runs", 20000, 64, 1, true},
      {"one store of pages of 16", 1001, 16, 1, true},
      {"20 stores (uploaded as runs)", 3000, 64, 20, true},
      {"a store without its device table", 5000, 64, 1, false},
  };
  for (const Case& c : cases) {
    run_case(std::string("paged stores ") + c.what, [&]() -> std::string {
      std::mt19937 rng(seed++);
      const int64_t d = 128, nh = 64, lead = 3, tail = 2;  // a window's run before, a chunk's rows after
      const int64_t N = lead + c.N + tail;
      const di::Tensor all = normal_tensor({N, d}, 1.0f, seed++, true);
      const di::Tensor all_dev = dev(all);
      std::vector<di::ops::RowSegment> segs{{all_dev.data<float>(), lead}};
      std::vector<di::Tensor> stores(c.stores), tables(c.stores);
      std::vector<std::vector<float*>> pages(c.stores);
      int64_t at = lead;
      for (int i = 0; i < c.stores; ++i) {  // store i: rows [at, at + n) of `all`
        const int64_t n = c.N / c.stores + (i < c.N % c.stores ? 1 : 0);
        segs.push_back(paged_store(all.slice(0, at, at + n).contiguous(), c.page_rows, c.device_table, stores[i],
                                   pages[i], tables[i]));
        at += n;
      }
      segs.push_back({all_dev.data<float>() + at * d, tail});
      // gather_listed: lists of rows anywhere in the table, some empty.
      const int64_t R = 2, K = 640;
      di::Tensor idx_h = di::Tensor::empty({R, K}, di::DType::kI32);
      for (int64_t e = 0; e < R * K; ++e)
        idx_h.data<int32_t>()[e] = e % 9 == 4 ? -1 : static_cast<int32_t>(rng() % static_cast<uint32_t>(N));
      di::Tensor want = di::Tensor::zeros({R * K, d}, di::DType::kF32);
      di::Tensor got = di::Tensor::zeros({R * K, d}, di::DType::kF32, di::Device::kCUDA);
      di::Tensor idx_want = idx_h.clone(), idx_dev = dev(idx_h);
      di::ops::gather_listed({{all.data<float>(), N}}, idx_want, want);
      di::ops::gather_listed(segs, idx_dev, got);
      std::string e = exact(want, got);
      if (!e.empty()) return "gather_listed: " + e;
      const di::Tensor idx_back = di::cuda::copy_to_host(idx_dev);
      for (int64_t i = 0; i < R * K; ++i)
        if (idx_back.data<int32_t>()[i] != idx_want.data<int32_t>()[i]) return "list entry " + std::to_string(i);
      // The indexer's decode kernel over the same keys (one decode row seeing every key).
      const di::Tensor q = normal_tensor({1, nh, d}, 1.0f, seed++, true);
      const di::Tensor w = normal_tensor({1, nh}, 0.05f, seed++, true);
      const di::ops::KeyVisibility vis{di::Tensor(), N - 1, 1};
      const di::Tensor want_s = di::ops::index_scores(q, all, w, vis, true);
      e = exact(want_s, di::ops::index_scores_segments(dev(q), segs, dev(w), vis, true));
      if (!e.empty()) return "index_scores: " + e;
      // And gather_segments (the whole-table path) over the same segments.
      di::Tensor table = di::Tensor::zeros({N, d}, di::DType::kF32, di::Device::kCUDA);
      di::ops::gather_segments(segs, table);
      e = exact(all, table);
      return e.empty() ? e : "gather_segments: " + e;
    });
  }
}

// copy_rows on the device: runs scattered into a ring-like buffer (1 or 2 rows each, a decode batch's ring writes)
// from one stacked source, against the same copies on the host, bit for bit; untouched rows stay.
void test_copy_rows() {
  uint32_t seed = 39800;
  for (const int n : {1, 2, 33}) {
    run_case("copy_rows " + std::to_string(n) + " runs into scattered rows, width 512", [&] {
      const int64_t width = 512, ring_rows = 128 * n;
      const di::Tensor src_h = normal_tensor({2 * n, width}, 1.0f, seed++, false);
      const di::Tensor ring_h = normal_tensor({ring_rows, width}, 1.0f, seed++, false);
      di::Tensor want = ring_h.clone();
      di::Tensor got = dev(ring_h);
      const di::Tensor src_d = dev(src_h);
      std::vector<di::ops::RowCopy> hc, dc;
      int64_t s = 0;
      for (int i = 0; i < n; ++i) {
        const int64_t rows = 1 + i % 2, at = 128 * i + (37 * i) % 120;
        hc.push_back({want.data<float>() + at * width, src_h.data<float>() + s * width, rows});
        dc.push_back({got.data<float>() + at * width, src_d.data<float>() + s * width, rows});
        s += rows;
      }
      di::ops::copy_rows(hc, width, di::Device::kCPU);
      di::ops::copy_rows(dc, width, di::Device::kCUDA);
      return exact(want, got);
    });
  }
}

// copy_bytes_many: 20 copies (two launches) of sizes 1 byte to 128 KB + 4 at odd, 4- and 16-byte offsets, against the
// same memcpys on the host, byte for byte; the bytes between them stay.
void test_copy_bytes_many() {
  run_case("copy_bytes_many: 20 copies, 1 B .. 128 KB, odd / 4 / 16-byte aligned", [&] {
    const di::Tensor src_h = normal_tensor({1 << 16}, 1.0f, 39900, false);  // 256 KB
    const di::Tensor dst_h = normal_tensor({1 << 17}, 1.0f, 39901, false);  // 512 KB
    di::Tensor want = dst_h.clone();
    di::Tensor got = dev(dst_h);
    const di::Tensor src_d = dev(src_h);
    const int64_t sizes[] = {1, 3, 4, 8, 16, 17, 80, 2048, 131076, 64, 5, 12, 4096, 1000, 15, 32, 48, 7, 2, 256};
    std::vector<di::cuda::ByteCopy> dc;
    int64_t at = 0;
    for (int i = 0; i < 20; ++i) {
      const int64_t so = (i % 3 == 0 ? 16 * i : i % 3 == 1 ? 4 * i + 4 : 7 * i + 1), n = sizes[i];
      memcpy(static_cast<char*>(want.raw()) + at, static_cast<const char*>(src_h.raw()) + so, static_cast<size_t>(n));
      dc.push_back({static_cast<char*>(got.raw()) + at, static_cast<const char*>(src_d.raw()) + so, n});
      at += n + 3 + (i % 5);
    }
    di::cuda::copy_bytes_many(dc);
    const di::Tensor back = di::cuda::copy_to_host(got);
    return memcmp(back.raw(), want.raw(), want.nbytes()) == 0 ? std::string() : std::string("bytes differ");
  });
}

// hopper.cuh's bulk_pieces_elect alone (bulk_pieces_probe: one warp, one phase): R = 2 and 4 pieces, the constant 512-
// byte form and run-time sizes down to 16 bytes, rows 528 bytes apart as the bulk-ring walk lays them; every stage byte
// must be the piece's or the 0xEE fill, and the barrier's phase must complete.
void test_bulk_pieces() {
  const int64_t ld = 1040;  // a row stride that is 16-byte aligned but not a multiple of the piece
  std::vector<uint8_t> src_h(4 * ld);
  uint32_t x = 12345u;
  for (auto& b : src_h) b = static_cast<uint8_t>((x = x * 1664525u + 1013904223u) >> 24);
  di::Tensor src_t = di::Tensor::empty({4 * ld}, di::DType::kU8);
  std::memcpy(src_t.raw(), src_h.data(), src_h.size());
  const di::Tensor src_d = dev(src_t);
  const uint32_t step = 528;
  for (int R : {2, 4})
    for (const auto& [bytes, constant] :
         std::vector<std::pair<uint32_t, bool>>{{512, true}, {512, false}, {496, false}, {256, false}, {16, false}}) {
      run_case("bulk_pieces_elect R " + std::to_string(R) + ", " + std::to_string(bytes) + " bytes" +
                   (constant ? " (constant)" : ""),
               [&]() -> std::string {
                 di::Tensor out = di::Tensor::zeros({R * step}, di::DType::kU8, di::Device::kCUDA);
                 const int st = di::cuda::bulk_pieces_probe(static_cast<const uint8_t*>(src_d.raw()), ld, R, bytes,
                                                            constant, step, static_cast<uint8_t*>(out.raw()));
                 if (st != 0) return "the barrier's phase did not complete";
                 const di::Tensor back = di::cuda::copy_to_host(out);
                 const uint8_t* got = static_cast<const uint8_t*>(back.raw());
                 for (int r = 0; r < R; ++r)
                   for (uint32_t i = 0; i < step; ++i) {
                     const uint8_t want = i < bytes ? src_h[r * ld + i] : uint8_t{0xEE};
                     if (got[r * step + i] != want)
                       return "row " + std::to_string(r) + " byte " + std::to_string(i) + ": " +
                              std::to_string(got[r * step + i]) + ", want " + std::to_string(want);
                   }
                 return "";
               });
    }
}

void test_side_work() {
  uint32_t seed = 39000;
  run_case("side work: a linear beside a main-stream linear, joined", [&] {
    const di::Tensor x = normal_tensor({3, 1024}, 1.0f, seed++, true);
    const di::Tensor wf = normal_tensor({4096, 1024}, 0.05f, seed++, true);
    di::Tensor w = di::Tensor::empty(wf.shape(), di::DType::kBF16);
    for (int64_t i = 0; i < w.numel(); ++i) w.data<uint16_t>()[i] = di::f32_to_bf16(wf.data<float>()[i]);
    const di::ops::QWeight qw{w, {}, 0};
    const di::Tensor want_side = di::ops::linear(x, qw, {0, true}), want_main = di::ops::linear(x, qw, {0, false});
    const di::Tensor dx = dev(x), dw = dev(w);
    const di::ops::QWeight dq{dw, {}, 0};
    di::Tensor side_out;
    {
      di::ops::SideWork side(di::Device::kCUDA, {dx});
      side_out = di::ops::linear(dx, dq, {0, true});
      side.done({side_out});
    }
    const di::Tensor main_out = di::ops::linear(dx, dq, {0, false});  // concurrently with the side linear
    di::ops::side_join(di::Device::kCUDA);
    const std::string e = exact(want_side, side_out.to(di::Device::kCPU));
    return e.empty() ? exact(want_main, main_out.to(di::Device::kCPU)) : e;
  });
  run_case("side work: a block freed inside is reused only after the join", [&] {
    const size_t bytes = size_t{3} << 20;  // a size no other test leaves cached
    const void* freed = nullptr;
    {
      di::ops::SideWork side(di::Device::kCUDA, {});
      di::Tensor t = di::Tensor::empty({static_cast<int64_t>(bytes / 4)}, di::DType::kF32, di::Device::kCUDA);
      freed = t.raw();
      side.done({});
    }  // t freed inside the scope: deferred
    di::Tensor before = di::Tensor::empty({static_cast<int64_t>(bytes / 4)}, di::DType::kF32, di::Device::kCUDA);
    if (before.raw() == freed) return std::string("the main stream got the side block before the join");
    di::ops::side_join(di::Device::kCUDA);
    di::Tensor after = di::Tensor::empty({static_cast<int64_t>(bytes / 4)}, di::DType::kF32, di::Device::kCUDA);
    if (after.raw() != freed) return std::string("the side block did not come back after the join");
    return std::string();
  });
}

// ---- sparse-attention index lists: candidate_blocks, mask_to_blocks, topk_rows by index, sparse_index ----
// All bit for bit (integer work). Shapes of the real V4.1-Flash indexer (candidate blocks of 8, top 2048
// blocks, index_topk 512), the shipped mini-v41 (8 / 32 / 256) and the small test presets (4 / 6 / 16).
void test_index_lists() {
  struct Case {
    const char* what;
    int64_t T, n, start_pos, ratio, bs, keep, topk;
    bool ties, real;  // real: scores from index_scores (bf16 grid, ReLU zeros) instead of topk_scores
  };
  const Case cases[] = {
      {"flash decode r1", 1, 20000, 19999, 1, 8, 2048, 512, false, true},
      {"flash decode r1 ties", 4, 20000, 19996, 1, 8, 2048, 512, true, false},
      {"flash prefill r1", 128, 1000, 0, 1, 8, 2048, 512, true, false},
      {"flash chunk r2", 128, 1000, 1872, 2, 8, 2048, 512, false, true},
      {"mini decode", 1, 1000, 999, 1, 8, 32, 256, true, false},
      {"mini batch rows", 4, 1000, 996, 1, 8, 32, 256, false, true},
      {"mini prefill", 128, 1000, 0, 1, 8, 32, 256, true, false},
      {"mini short", 4, 32, 28, 1, 8, 32, 256, true, false},
      {"small preset", 128, 32, 0, 1, 4, 6, 16, true, false},
      {"tiny preset", 4, 32, 60, 2, 2, 4, 6, true, false},
      {"visible 0", 4, 32, 0, 8, 4, 6, 16, false, false},
      {"keep > blocks", 4, 20000, 19996, 1, 8, 4096, 512, true, false},
  };
  uint32_t seed = 47000;
  for (const Case& c : cases) {
    di::Tensor s;
    if (c.real) {
      const int64_t nh = 8, d = 128;
      const di::Tensor q = normal_tensor({c.T, nh, d}, 1.0f, seed++, true);
      const di::Tensor keys = normal_tensor({c.n, d}, 1.0f, seed++, true);
      const di::Tensor w = normal_tensor({c.T, nh}, 0.05f, seed++, true);
      s = di::ops::index_scores(q, keys, w, {di::Tensor(), c.start_pos, c.ratio}, true);
    } else {
      s = topk_scores(c.T, c.n, seed++, c.ties);
    }
    const di::Tensor sd = dev(s);
    char tag[200];
    std::snprintf(tag, sizeof tag, "%s T=%lld n=%lld start=%lld r=%lld block %lld keep %lld", c.what,
                  static_cast<long long>(c.T), static_cast<long long>(c.n), static_cast<long long>(c.start_pos),
                  static_cast<long long>(c.ratio), static_cast<long long>(c.bs), static_cast<long long>(c.keep));
    const di::Tensor blocks = di::ops::candidate_blocks(s, c.start_pos, c.ratio, c.bs, c.keep);
    di::Tensor blocks_d;
    run_case(std::string("candidate_blocks ") + tag, [&] {
      blocks_d = di::ops::candidate_blocks(sd, c.start_pos, c.ratio, c.bs, c.keep);
      return compare_idx(blocks, blocks_d);
    });
    if (!blocks_d.defined()) continue;
    // The filtered layers' chain on the CPU's blocks uploaded (so a candidate_blocks failure does not
    // hide this one), then the picks.
    di::Tensor m = s.contiguous(), md = dev(s);
    di::ops::mask_to_blocks(m, blocks, c.bs);
    run_case(std::string("mask_to_blocks ") + tag, [&] {
      di::ops::mask_to_blocks(md, dev(blocks), c.bs);
      return exact(m, md);
    });
    const int64_t k = std::min(c.topk, c.n);
    run_case(std::string("topk_rows by index (picks) ") + tag,
             [&] { return compare_idx(di::ops::topk_rows(m, k, true), di::ops::topk_rows(dev(m), k, true)); });
  }

  // sparse_index: V4.1 prefill / decode (right-aligned) / bounded-replay floor, V4 C4 picks and C128.
  struct Layout {
    const char* what;
    int64_t start_pos, T, W, floor, kcols, ratio;
    bool v41, picks;
  };
  const Layout layouts[] = {
      {"v41 decode", 19999, 1, 128, 0, 512, 1, true, true},
      {"v41 decode ring filling", 40, 1, 128, 0, 20, 2, true, true},
      {"v41 decode batch rows", 996, 4, 128, 0, 512, 1, true, true},
      {"v41 prefill", 0, 128, 128, 0, 64, 2, true, true},
      {"v41 prefill T > W", 0, 300, 128, 0, 150, 2, true, true},
      {"v41 replay floor", 2000, 128, 128, 1950, 512, 1, true, true},
      {"v41 window only", 7, 1, 128, 0, 0, 1, true, false},
      {"v4 C4 decode", 80000, 1, 128, 0, 512, 4, false, true},
      {"v4 C4 chunk", 4096, 128, 128, 0, 512, 4, false, true},
      {"v4 C128 decode", 80000, 1, 128, 0, 625, 128, false, false},
      {"v4 C128 prefill", 0, 1000, 128, 0, 7, 128, false, false},
      {"v4 window only", 300, 4, 128, 0, 0, 0, false, false},
  };
  std::mt19937 rng(seed++);
  // Every layout above as one chunk of a batch (sparse_index_many: one launch), against the CPU's per-chunk lists.
  std::vector<di::ops::IndexChunk> many_cpu, many_gpu;
  int64_t many_rows = 0, many_width = 0;
  for (const Layout& c : layouts)
    many_width = std::max(many_width, (c.v41 && c.start_pos == 0 ? std::min(c.T, c.W) : c.W) + c.kcols);
  for (const Layout& c : layouts) {
    const int64_t T = c.T, sp = c.start_pos;
    di::ops::IndexLayout lay;
    lay.start_pos = sp;
    lay.window = c.W;
    lay.floor = c.floor;
    lay.wstart = std::max<int64_t>({0, sp - c.W + 1, c.floor});
    lay.wcols = c.v41 && sp == 0 ? std::min(T, c.W) : c.W;
    lay.pad_front = c.v41 && sp > 0 && T == 1;
    lay.offset = sp + T - lay.wstart;
    lay.kcols = c.kcols;
    lay.ratio = c.ratio;
    di::Tensor picks;
    if (c.picks) {
      picks = di::Tensor::empty({T, c.kcols}, di::DType::kI32);
      for (int64_t i = 0; i < picks.numel(); ++i)
        picks.data<int32_t>()[i] = rng() % 5 == 0 ? -1 : static_cast<int32_t>(rng() % 20000);
    }
    run_case(std::string("sparse_index ") + c.what + " T=" + std::to_string(T) + " start=" + std::to_string(sp), [&] {
      const di::Tensor want = di::ops::sparse_index(lay, T, picks, di::Device::kCPU);
      return compare_idx(want, di::ops::sparse_index(lay, T, c.picks ? dev(picks) : di::Tensor(), di::Device::kCUDA));
    });
    // The same lists inside a batch's stacked table (attend_chunks): shifted and padded.
    di::ops::IndexLayout shifted = lay;
    shifted.base = 1000 + sp;
    shifted.width = lay.wcols + lay.kcols + 3;
    run_case(std::string("sparse_index shifted ") + c.what + " T=" + std::to_string(T), [&] {
      const di::Tensor want = di::ops::sparse_index(shifted, T, picks, di::Device::kCPU);
      return compare_idx(want,
                         di::ops::sparse_index(shifted, T, c.picks ? dev(picks) : di::Tensor(), di::Device::kCUDA));
    });
    di::ops::IndexLayout in_batch = lay;
    in_batch.base = 7 * many_rows;
    in_batch.width = many_width;
    many_cpu.push_back({in_batch, T, picks});
    many_gpu.push_back({in_batch, T, c.picks ? dev(picks) : di::Tensor()});
    many_rows += T;
    run_case(std::string("sparse_index into a row slice ") + c.what + " T=" + std::to_string(T), [&] {
      const di::Tensor want = di::ops::sparse_index(shifted, T, picks, di::Device::kCPU);
      di::Tensor stacked = di::Tensor::zeros({T + 2, shifted.width}, di::DType::kI32, di::Device::kCUDA);
      di::ops::sparse_index(shifted, T, c.picks ? dev(picks) : di::Tensor(), di::Device::kCUDA,
                            stacked.slice(0, 1, 1 + T));
      const di::Tensor host = stacked.to(di::Device::kCPU);
      for (int64_t i = 0; i < shifted.width; ++i)
        if (host.data<int32_t>()[i] != 0 || host.data<int32_t>()[(T + 1) * shifted.width + i] != 0)
          return std::string("a row outside the slice was written");
      return compare_idx(want, stacked.slice(0, 1, 1 + T));
    });
  }
  run_case("sparse_index_many: the " + std::to_string(many_cpu.size()) + " layouts as one batch", [&] {
    di::Tensor want = di::Tensor::empty({many_rows, many_width}, di::DType::kI32);
    int64_t r = 0;
    for (const di::ops::IndexChunk& k : many_cpu) {  // the CPU's own per-chunk lists
      di::ops::sparse_index(k.layout, k.T, k.picks, di::Device::kCPU, want.slice(0, r, r + k.T));
      r += k.T;
    }
    di::Tensor got = di::Tensor::empty({many_rows, many_width}, di::DType::kI32, di::Device::kCUDA);
    di::ops::sparse_index_many(many_gpu, di::Device::kCUDA, got);
    return compare_idx(want, got);
  });
}

}  // namespace

int main() {
  return cuda_test::run_test_program([] {
    test_fake_quant_fp8();
    test_round_bf16();
    test_rms_norm();
    test_linear();
    test_linear_fp8_gemm();
    test_linear_fp4_gemm();
    test_linear_grouped();
    test_fake_quant_fp4();
    test_dequantize();
    test_hadamard();
    test_rope();
    test_hc();
    test_attn_inputs();
    test_sparse_attention();
    test_topk();
    test_index_lists();
    test_index_scores();
    for (int group : {8, 16, 32}) {  // every keys-per-group form of the decode kernel, whatever the default picks
      g_index_group = group;
      di::cuda::index_scores_set_group(group);
      test_index_scores();
    }
    g_index_group = 0;
    di::cuda::index_scores_set_group(0);
    test_moe_route();
    {
      const int mode = di::cuda::moe_dispatch_set_mode(2);  // the one launch, whatever the default
      test_moe_dispatch_fused();
      di::cuda::moe_dispatch_set_mode(mode);
    }
    test_swiglu();
    test_embedding_gather();
    test_moe_dispatch();
    test_compress_pool();
    test_renorm_heads();
    test_scale_and_copies();
    test_side_work();
    test_gather_segments();
    test_gather_listed();
    test_paged_stores();
    test_copy_rows();
    test_copy_bytes_many();
    test_bulk_pieces();
  });
}
