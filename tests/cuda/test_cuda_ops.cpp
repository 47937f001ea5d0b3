// GPU check of the CUDA kernels against the CPU ops (the reference for every backend).
//
// Not a ctest test (CI has no GPU). Run on a Hopper machine:
//   ./build/src/cuda/deepinfer_cuda_tests
// Prints one PASS/FAIL line per case; exit status 0 = all passed, 1 = a failure, 2 = no GPU.
//
// fake_quant_fp8 and round_bf16 must match bit for bit (their results do not depend on any
// summation order). rms_norm sums in a different order on each backend, so it is compared with
// a tolerance: 1e-5 relative in fp32, at most one bf16 step when rounding.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>

#include "cuda/device.h"
#include "cuda/linear.cuh"
#include "cuda/quant.cuh"
#include "cuda/rms_norm.cuh"
#include "deepinfer/dtype.h"
#include "deepinfer/error.h"
#include "ops/ops.h"

namespace di = deepinfer;

namespace {

int g_failures = 0;

void report(const std::string& name, const std::string& problem) {
  if (problem.empty()) {
    std::printf("PASS %s\n", name.c_str());
  } else {
    std::printf("FAIL %s: %s\n", name.c_str(), problem.c_str());
    ++g_failures;
  }
  std::fflush(stdout);
}

// Runs one case; a thrown deepinfer::Error is a failure of that case, not of the program.
void run_case(const std::string& name, const std::function<std::string()>& body) {
  try {
    report(name, body());
  } catch (const std::exception& e) {
    report(name, std::string("threw: ") + e.what());
  }
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Random float32 [rows, cols] with magnitudes spread over 10^-6 .. 10^3, a few exact zeros and
// some values on e4m3 rounding ties.
di::Tensor random_rows(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> expo(-6.0f, 3.0f);
  std::uniform_int_distribution<int> pick(0, 31);
  di::Tensor t = di::Tensor::empty({rows, cols}, di::DType::kF32);
  float* p = t.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float row_scale = std::pow(10.0f, expo(rng));  // rows of very different magnitudes
    for (int64_t c = 0; c < cols; ++c) {
      const int k = pick(rng);
      if (k == 0) {
        p[r * cols + c] = 0.0f;
      } else if (k == 1) {
        p[r * cols + c] = 1.0625f * row_scale;  // halfway between two e4m3 codes at some scales
      } else {
        p[r * cols + c] = normal(rng) * row_scale;
      }
    }
  }
  return t;
}

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
      {5, 4096, W::kBF16, true}, {5, 4096, W::kBF16, false}, {3, 7168, W::kF32, true},
      {4, 512, W::kNone, true},  {4, 512, W::kNone, false},  {2, 100, W::kF32, false},
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
// Random weights of each format (no e4m3 NaN codes unless asked), scales around 2^-6 .. 2^2.
di::ops::QWeight random_weight(di::DType dt, int64_t N, int64_t K, int64_t block, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  di::ops::QWeight q;
  auto scales = [&](int64_t rows, int64_t cols, int lo, int hi) {
    std::uniform_int_distribution<int> e(lo, hi);
    di::Tensor s = di::Tensor::empty({rows, cols}, di::DType::kE8M0);
    for (int64_t i = 0; i < rows * cols; ++i) s.data<uint8_t>()[i] = static_cast<uint8_t>(e(rng));
    return s;
  };
  if (dt == di::DType::kE4M3) {
    q.w = di::Tensor::empty({N, K}, dt);
    uint8_t* p = q.w.data<uint8_t>();
    for (int64_t i = 0; i < N * K; ++i) {
      int c = byte(rng);
      while ((c & 0x7f) == 0x7f) c = byte(rng);
      p[i] = static_cast<uint8_t>(c);
    }
    q.block = block;
    q.scale = scales((N + block - 1) / block, (K + block - 1) / block, 115, 125);
  } else if (dt == di::DType::kE2M1x2) {
    q.w = di::Tensor::empty({N, K}, dt);
    uint8_t* p = static_cast<uint8_t*>(q.w.raw());
    for (int64_t i = 0; i < N * K / 2; ++i) p[i] = static_cast<uint8_t>(byte(rng));
    q.scale = scales(N, K / 32, 118, 128);
  } else {
    q.w = di::Tensor::empty({N, K}, di::DType::kBF16);
    for (int64_t i = 0; i < N * K; ++i) q.w.data<uint16_t>()[i] = di::f32_to_bf16(normal(rng));
  }
  return q;
}

di::ops::QWeight to_device(const di::ops::QWeight& q) {
  di::ops::QWeight d = q;
  d.w = di::cuda::copy_to_device(q.w);
  if (q.scale.defined()) d.scale = di::cuda::copy_to_device(q.scale);
  return d;
}

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

}  // namespace

int main() {
  const int n = di::cuda::device_count();
  if (n == 0) {
    std::printf("SKIP: no CUDA device visible; these tests need a GPU (sm_90)\n");
    return 2;
  }
  try {
    di::cuda::init();
  } catch (const std::exception& e) {
    std::printf("FAIL init: %s\n", e.what());
    return 1;
  }
  test_fake_quant_fp8();
  test_round_bf16();
  test_rms_norm();
  test_linear();
  try {
    di::cuda::synchronize();
  } catch (const std::exception& e) {
    report("synchronize", e.what());
  }
  std::printf("%s: %d failure(s)\n", g_failures == 0 ? "PASS" : "FAIL", g_failures);
  return g_failures == 0 ? 0 : 1;
}
