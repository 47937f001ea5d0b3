// bench_linear: times ops::linear for the shipped weight formats at decode (M=1) and prefill (M=64)
// sizes, against cblas_sgemm on the same weight pre-dequantised to F32 (the anchor, measured in the
// same run). FP8 / FP4 rows include the FP8 activation fake-quant (per 128), as the model runs them.
//
//   bench_linear [runs [M ...]]   runs: timed calls per row, the median is shown (default 15, after
//                                 2 warm-ups); M: batch rows to time (default 1 64)
#include <cblas.h>
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "ops/ops.h"

using namespace deepinfer;

namespace {

double median_ms(int runs, const std::function<void()>& fn) {
  for (int i = 0; i < 2; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < runs; ++i) {
    const auto a = std::chrono::steady_clock::now();
    fn();
    const auto b = std::chrono::steady_clock::now();
    t.push_back(std::chrono::duration<double, std::milli>(b - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

ops::QWeight make_weight(const std::string& fmt, int64_t N, int64_t K, std::mt19937& rng) {
  ops::QWeight q;
  if (fmt == "FP8") {
    q.block = 128;
    q.w = Tensor::empty({N, K}, DType::kE4M3);
    for (int64_t i = 0; i < N * K; ++i) {
      uint8_t c = static_cast<uint8_t>(rng());
      if ((c & 0x7f) == 0x7f) c = 0x7e;
      q.w.data<uint8_t>()[i] = c;
    }
    q.scale = Tensor::empty({(N + 127) / 128, (K + 127) / 128}, DType::kE8M0);
    for (int64_t i = 0; i < q.scale.numel(); ++i) q.scale.data<uint8_t>()[i] = static_cast<uint8_t>(112 + rng() % 8);
  } else if (fmt == "FP4") {
    q.w = Tensor::empty({N, K}, DType::kE2M1x2);
    for (int64_t i = 0; i < N * K / 2; ++i) q.w.data<uint8_t>()[i] = static_cast<uint8_t>(rng());
    q.scale = Tensor::empty({N, K / 32}, DType::kE8M0);
    for (int64_t i = 0; i < q.scale.numel(); ++i) q.scale.data<uint8_t>()[i] = static_cast<uint8_t>(118 + rng() % 8);
  } else {
    std::normal_distribution<float> nd(0.0f, 0.02f);
    q.w = Tensor::empty({N, K}, DType::kBF16);
    for (int64_t i = 0; i < N * K; ++i) q.w.data<uint16_t>()[i] = f32_to_bf16(nd(rng));
  }
  return q;
}

}  // namespace

int main(int argc, char** argv) {
  const int runs = argc > 1 ? std::max(1, std::atoi(argv[1])) : 15;
  std::vector<int64_t> ms;
  for (int i = 2; i < argc; ++i) ms.push_back(std::max(1, std::atoi(argv[i])));
  if (ms.empty()) ms = {1, 64};
  struct Case {
    std::string fmt;
    int64_t N, K;
  };
  const Case cases[] = {{"FP8", 4096, 4096}, {"FP4", 2048, 4096}, {"BF16", 4096, 4096}};
  std::mt19937 rng(1234);

  fmt::print("bench_linear: median of {} runs; OpenMP {} threads, OpenBLAS {} threads\n", runs, omp_get_max_threads(),
             openblas_get_num_threads());
  fmt::print("{:<12} {:<5} {:>3} {:>9} {:>9} {:>8} | {:>11} {:>11} {:>9}\n", "shape", "fmt", "M", "ms", "GFLOP/s",
             "GB/s(W)", "sgemm ms", "sgemm GF/s", "speedup");
  for (const Case& c : cases) {
    const ops::QWeight w = make_weight(c.fmt, c.N, c.K, rng);
    const double wbytes = static_cast<double>(w.w.nbytes() + (w.scale.defined() ? w.scale.nbytes() : 0));
    const Tensor wf = ops::dequantize(w);  // the anchor's F32 weight
    for (int64_t M : ms) {
      Tensor x = Tensor::empty({M, c.K}, DType::kF32);
      std::normal_distribution<float> nd(0.0f, 1.0f);
      for (int64_t i = 0; i < M * c.K; ++i) x.data<float>()[i] = round_bf16(nd(rng));
      ops::LinearOpts o;
      o.act_quant_block = c.fmt == "BF16" ? 0 : 128;
      const double ms = median_ms(runs, [&] { (void)ops::linear(x, w, o); });
      Tensor y = Tensor::empty({M, c.N}, DType::kF32);
      const double ms_ref = median_ms(runs, [&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(M), static_cast<blasint>(c.N),
                    static_cast<blasint>(c.K), 1.0f, x.data<float>(), static_cast<blasint>(c.K), wf.data<float>(),
                    static_cast<blasint>(c.K), 0.0f, y.data<float>(), static_cast<blasint>(c.N));
      });
      const double flop = 2.0 * static_cast<double>(M) * static_cast<double>(c.N) * static_cast<double>(c.K);
      fmt::print("{:<12} {:<5} {:>3} {:>9.3f} {:>9.1f} {:>8.2f} | {:>11.3f} {:>11.1f} {:>8.2f}x\n",
                 fmt::format("{}x{}", c.N, c.K), c.fmt, M, ms, flop / ms * 1e-6, wbytes / ms * 1e-6, ms_ref,
                 flop / ms_ref * 1e-6, ms_ref / ms);
    }
  }
  return 0;
}
