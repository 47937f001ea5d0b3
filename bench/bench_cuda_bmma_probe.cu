// bench_cuda_bmma_probe: fp8_bmma_gemv (linear_gemv_fp8_bmma.cu: the exact E4M3 decode GEMV with the weights as the
// tensor cores' B operand, 8 rows a warp) beside the engine's default kernel for the same call, at one x row on the
// V4.1 shapes it would serve (wo_b, wo_a's bytes, the shared expert, wq_a + wkv): the outputs compared bit for bit and
// both timed, with their share of the read ceiling measured in the same run. The kernel began here as a probe of the
// design (bench/RESULTS.md, fifty-eighth session) and moved into the engine; gemv_set_fp8_variant(8) picks it here.
// DEEPINFER_CUDA_BMMA_DEPTH / _WARPS set its shape for the whole run. Fast-path data (scale codes 112-124, bf16-grid
// x).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "cuda/device.h"
#include "cuda/linear_gemv.cuh"
#include "cuda/linear_gemv_fp8_bmma.cuh"
#include "cuda_bench_util.cuh"

namespace di = deepinfer;

namespace {

struct Shape {
  const char* name;
  int N, K;
};

}  // namespace

int main() {
  return di::bench::bench_main("bench_cuda_bmma_probe", [] {
    di::cuda::init();
    cudaStream_t st;
    DI_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const double read_gbs = di::bench::read_ceiling_gbs(st, size_t{1} << 30);
    std::printf("# fp8_bmma_gemv against the default kernel (gemv_into, variant 5), one x row, fast-path data\n");
    std::printf("read ceiling %.0f GB/s\n\n", read_gbs);
    std::printf(
        "| weight [N, K] | default us | bmma us | bmma / default | bmma %% of read | outputs differing | "
        "slow warps |\n");
    std::printf("|---|---|---|---|---|---|---|\n");
    const Shape shapes[] = {{"wo_b", 5120, 8192},
                            {"[8192, 4096] (wo_a's bytes)", 8192, 4096},
                            {"shared w1 / w3", 2304, 5120},
                            {"shared w2", 5120, 2304},
                            {"wq_a + wkv", 1792, 5120}};
    for (const Shape& sh : shapes) {
      const int N = sh.N, K = sh.K;
      const int64_t bytes = int64_t{N} * K;
      const int copies = static_cast<int>(std::max<int64_t>(2, (int64_t{512} << 20) / bytes + 1));
      std::vector<di::Tensor> w, sc;
      for (int i = 0; i < copies; ++i) {
        w.push_back(di::bench::dev_bytes({N, K}, di::DType::kU8, 0, 255, true));
        sc.push_back(di::bench::dev_bytes({N / 32, K / 32}, di::DType::kU8, 112, 124));
      }
      const di::Tensor x = di::bench::dev_act({1, K});
      di::Tensor y_ref = di::Tensor::empty({1, N}, di::DType::kF32, di::Device::kCUDA);
      di::Tensor y_new = di::Tensor::empty({1, N}, di::DType::kF32, di::Device::kCUDA);
      auto args = [&](int i, di::Tensor& y) {
        di::cuda::GemvArgs a;
        a.fmt = 0;
        a.w = static_cast<const uint8_t*>(w[static_cast<size_t>(i)].raw());
        a.ldw = K;
        a.scale = static_cast<const uint8_t*>(sc[static_cast<size_t>(i)].raw());
        a.lds = K / 32;
        a.B = 32;
        a.N = N;
        a.K = K;
        a.x = x.data<float>();
        a.ldx = K;
        a.M = 1;
        a.act_quant_block = 32;
        a.y = y.data<float>();
        return a;
      };
      auto run = [&](int variant, int i, di::Tensor& y) {
        const int was = di::cuda::gemv_set_fp8_variant(variant);
        di::cuda::gemv_into(args(i, y), st);
        di::cuda::gemv_set_fp8_variant(was);
      };
      di::cuda::gemv_fp8_bmma_slow_warps(true);
      run(0, 0, y_ref);  // eager first: the kernels set their limits
      run(8, 0, y_new);
      const int64_t slow = di::cuda::gemv_fp8_bmma_slow_warps(true);
      std::vector<float> a(static_cast<size_t>(N)), b(static_cast<size_t>(N));
      DI_CUDA_CHECK(cudaMemcpy(a.data(), y_ref.raw(), 4 * static_cast<size_t>(N), cudaMemcpyDeviceToHost));
      DI_CUDA_CHECK(cudaMemcpy(b.data(), y_new.raw(), 4 * static_cast<size_t>(N), cudaMemcpyDeviceToHost));
      int differ = 0;
      for (int n = 0; n < N; ++n) differ += std::memcmp(&a[static_cast<size_t>(n)], &b[static_cast<size_t>(n)], 4) != 0;
      const double ref_ms = di::bench::time_graph(st, 2 * copies, [&](int i) { run(0, i % copies, y_ref); });
      const double new_ms = di::bench::time_graph(st, 2 * copies, [&](int i) { run(8, i % copies, y_new); });
      const double gbs = static_cast<double>(bytes) / new_ms / 1e6;
      std::printf("| %s [%d, %d] | %.2f | %.2f | %.2fx | %.0f%% | %d of %d | %lld |\n", sh.name, N, K, ref_ms * 1e3,
                  new_ms * 1e3, ref_ms / new_ms, 100.0 * gbs / read_gbs, differ, N, static_cast<long long>(slow));
    }
    DI_CUDA_CHECK(cudaStreamDestroy(st));
  });
}
