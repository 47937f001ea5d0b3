// Shared pieces of the GPU test programs (tests/cuda/*.cpp): PASS / FAIL reporting, random inputs
// and weights of every format, host -> device copies of a weight.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>

#include "cuda/device.h"
#include "deepinfer/dtype.h"
#include "deepinfer/tensor.h"
#include "ops/ops.h"

namespace cuda_test {

namespace di = deepinfer;

inline int g_failures = 0;

inline void report(const std::string& name, const std::string& problem) {
  if (problem.empty()) {
    std::printf("PASS %s\n", name.c_str());
  } else {
    std::printf("FAIL %s: %s\n", name.c_str(), problem.c_str());
    ++g_failures;
  }
  std::fflush(stdout);
}

// Runs one case; a thrown deepinfer::Error is a failure of that case, not of the program.
inline void run_case(const std::string& name, const std::function<std::string()>& body) {
  try {
    report(name, body());
  } catch (const std::exception& e) {
    report(name, std::string("threw: ") + e.what());
  }
}

inline uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Random float32 [rows, cols] with magnitudes spread over 10^-6 .. 10^3, a few exact zeros and
// some values on e4m3 rounding ties.
inline di::Tensor random_rows(int64_t rows, int64_t cols, uint32_t seed) {
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

// Random weights of each format (no e4m3 NaN codes unless asked), scales around 2^-6 .. 2^2.
inline di::ops::QWeight random_weight(di::DType dt, int64_t N, int64_t K, int64_t block, uint32_t seed) {
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

inline di::ops::QWeight to_device(const di::ops::QWeight& q) {
  di::ops::QWeight d = q;
  d.w = di::cuda::copy_to_device(q.w);
  if (q.scale.defined()) d.scale = di::cuda::copy_to_device(q.scale);
  return d;
}

// A test program's main: SKIP (exit 2) without a GPU, initialise CUDA, run `cases`, check that the device
// finished cleanly, print the summary; 0 when every case passed, else 1.
inline int run_test_program(const std::function<void()>& cases) {
  if (di::cuda::device_count() == 0) {
    std::printf("SKIP: no CUDA device visible; these tests need a GPU (sm_90)\n");
    return 2;
  }
  try {
    di::cuda::init();
  } catch (const std::exception& e) {
    std::printf("FAIL init: %s\n", e.what());
    return 1;
  }
  cases();
  try {
    di::cuda::synchronize();
  } catch (const std::exception& e) {
    report("synchronize", e.what());
  }
  std::printf("%s: %d failure(s)\n", g_failures == 0 ? "PASS" : "FAIL", g_failures);
  return g_failures == 0 ? 0 : 1;
}

}  // namespace cuda_test
