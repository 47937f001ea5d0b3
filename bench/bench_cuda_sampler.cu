// GPU sampling (cuda::sample_rows, src/cuda/sampling.cu) against the CPU path it replaces: the D2H copy of the
// logits the CPU sampler needs plus sample() on every row. Needs a CUDA GPU (prints SKIP and exits 0 without one).
//   ./build/bench/bench_cuda_sampler [REPS]
//
// V = 129,280 (DeepSeek-V4), R = 1 .. 256 rows of lm-like logits (N(0, 3^2), every row different), three modes:
// greedy, top_p 0.9 with temperature 0.7, and temperature 1.0 alone (the APIs' default: the split race). GPU columns:
// the whole call (H2D of the params, the kernels, the D2H of the results and the host's final step), timed by CUDA
// events around the call (ev ms: the GPU timeline from the first to the last event, host packing included since the GPU
// waits for it) and by the host clock (wall). CPU column: cudaMemcpy of the [R, V] logits to pageable host memory +
// sample() per row, wall clock, single thread (as EngineCore::sample_rows). Median over REPS calls after a warm-up.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "cuda/device.h"
#include "cuda/sampling.cuh"
#include "cuda_bench_util.cuh"
#include "deepinfer/error.h"
#include "deepinfer/tensor.h"
#include "sampling/sampler.h"
#include "sampling/sampling_params.h"

namespace di = deepinfer;

namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void run(int reps) {
  di::cuda::init();
  const int64_t V = 129280;
  const int64_t kMaxR = 256;
  std::mt19937_64 g(42);
  std::normal_distribution<float> n(0.0f, 3.0f);
  di::Tensor host = di::Tensor::empty({kMaxR, V}, di::DType::kF32);
  for (int64_t i = 0; i < kMaxR * V; ++i) host.data<float>()[i] = n(g);
  const di::Tensor dev = di::cuda::copy_to_device(host);
  cudaEvent_t ev0, ev1;
  DI_CUDA_CHECK(cudaEventCreate(&ev0));
  DI_CUDA_CHECK(cudaEventCreate(&ev1));

  std::printf("cuda::sample_rows vs CPU sample(), V = %lld, median of %d calls (ms per call)\n",
              static_cast<long long>(V), reps);
  std::printf("%-22s %5s %10s %10s %12s %8s\n", "mode", "R", "gpu ev", "gpu wall", "cpu (+D2H)", "cpu/gpu");
  const char* names[] = {"greedy", "top_p 0.9 T 0.7", "T 1.0"};
  for (int mode = 0; mode < 3; ++mode) {
    di::SamplingParams p;
    if (mode == 0) {
      p.temperature = 0.0f;
    } else if (mode == 1) {
      p.temperature = 0.7f;
      p.top_p = 0.9f;
    } else {
      p.temperature = 1.0f;
    }
    for (int64_t R : {1, 8, 32, 64, 128, 256}) {
      const di::Tensor logits = dev.slice(0, 0, R);
      std::vector<di::SampleInput> rows(static_cast<size_t>(R));
      for (int64_t r = 0; r < R; ++r) {
        rows[static_cast<size_t>(r)].vocab = V;
        rows[static_cast<size_t>(r)].params = &p;
        rows[static_cast<size_t>(r)].seed = static_cast<uint64_t>(r) + 1;
        rows[static_cast<size_t>(r)].position = 10;
      }
      std::vector<double> ev_ms, wall_ms, cpu_ms;
      std::vector<float> h(static_cast<size_t>(R * V));
      for (int rep = 0; rep <= reps; ++rep) {  // rep 0: warm-up
        DI_CUDA_CHECK(cudaEventRecord(ev0, nullptr));
        const double t0 = now_ms();
        const std::vector<di::SampleResult> gpu = di::cuda::sample_rows(logits, rows);
        const double t1 = now_ms();
        DI_CUDA_CHECK(cudaEventRecord(ev1, nullptr));
        DI_CUDA_CHECK(cudaEventSynchronize(ev1));
        float ms = 0.0f;
        DI_CUDA_CHECK(cudaEventElapsedTime(&ms, ev0, ev1));

        const double c0 = now_ms();
        DI_CUDA_CHECK(cudaMemcpy(h.data(), logits.data<float>(), h.size() * sizeof(float), cudaMemcpyDeviceToHost));
        int32_t mismatch = 0;
        for (int64_t r = 0; r < R; ++r) {
          di::SampleInput in = rows[static_cast<size_t>(r)];
          in.logits = h.data() + r * V;
          mismatch += di::sample(in).token != gpu[static_cast<size_t>(r)].token;
        }
        const double c1 = now_ms();
        DI_CHECK(mismatch == 0, "bench_cuda_sampler: {} rows differ from the CPU", mismatch);
        if (rep == 0) continue;
        ev_ms.push_back(ms);
        wall_ms.push_back(t1 - t0);
        cpu_ms.push_back(c1 - c0);
      }
      const double ge = median(ev_ms), gw = median(wall_ms), c = median(cpu_ms);
      std::printf("%-22s %5lld %10.3f %10.3f %12.3f %7.1fx\n", names[mode], static_cast<long long>(R), ge, gw, c,
                  c / gw);
      std::fflush(stdout);
    }
  }
  DI_CUDA_CHECK(cudaEventDestroy(ev0));
  DI_CUDA_CHECK(cudaEventDestroy(ev1));
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 20;
  return di::bench::bench_main("bench_cuda_sampler", [&] { run(reps); });
}
