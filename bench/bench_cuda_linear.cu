// GPU benchmark of cuda::linear (the decode GEMV) against the device's memory ceiling and a cuBLAS
// BF16 GEMV. Needs a CUDA GPU (prints SKIP and exits 0 without one). Each timed call streams the
// weight from HBM: the weight is rotated over copies totalling >= 512 MiB (L2 is 50-60 MB), and the
// calls are captured into a CUDA graph so launch gaps stay out of the figures.
//   ./build/bench/bench_cuda_linear
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "cuda/device.h"
#include "cuda/linear.cuh"
#include "cuda_bench_util.cuh"
#include "deepinfer/dtype.h"
#include "deepinfer/error.h"

namespace di = deepinfer;

namespace {

#define CK(expr) DI_CUDA_CHECK(expr)
#define CB(expr)                                                       \
  do {                                                                 \
    if ((expr) != CUBLAS_STATUS_SUCCESS) di::fail("{} failed", #expr); \
  } while (0)

using deepinfer::bench::next_u32;
using deepinfer::bench::time_graph;

di::Tensor random_device(const std::vector<int64_t>& shape, di::DType dt, int lo = 0, int hi = 255,
                         bool no_fp8_nan = false) {
  di::Tensor h = di::Tensor::empty(shape, dt);
  auto* p = static_cast<uint8_t*>(h.raw());
  for (size_t i = 0; i < h.nbytes(); ++i) {
    int c = lo + static_cast<int>(next_u32() % static_cast<uint32_t>(hi - lo + 1));
    if (no_fp8_nan && (c & 0x7f) == 0x7f) c = 0x11;
    p[i] = static_cast<uint8_t>(c);
  }
  return di::cuda::copy_to_device(h);
}

}  // namespace

int main() {
  if (di::cuda::device_count() == 0) {
    std::printf("SKIP: no CUDA device\n");
    return 0;
  }
  di::cuda::init();
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));

  // ---- ceilings: a read kernel and a device-to-device copy over 2 GiB ----------------------------------
  const size_t big = size_t{2} << 30;
  const double read_gbs = deepinfer::bench::read_ceiling_gbs(st, big);
  const double copy_gbs = deepinfer::bench::copy_ceiling_gbs(st, big);
  std::printf("HBM ceiling: read kernel %.0f GB/s, D2D copy %.0f GB/s (read + write)\n", read_gbs, copy_gbs);

  cublasHandle_t cb;
  CB(cublasCreate(&cb));
  CB(cublasSetStream(cb, st));

  struct Shape {
    const char* what;
    di::DType dt;
    int64_t K, N, B;
  };
  const Shape shapes[] = {
      {"wq_a 5120->1280", di::DType::kE4M3, 5120, 1280, 32},
      {"wq_b 1280->32768", di::DType::kE4M3, 1280, 32768, 32},
      {"wkv 5120->512", di::DType::kE4M3, 5120, 512, 32},
      {"w1 5120->2304 fp4", di::DType::kE2M1x2, 5120, 2304, 0},
      {"w2 2304->5120 fp4", di::DType::kE2M1x2, 2304, 5120, 0},
      {"wo 8192->5120", di::DType::kE4M3, 8192, 5120, 32},
      {"wo 8192->5120 B128", di::DType::kE4M3, 8192, 5120, 128},
      {"bf16 5120->1280", di::DType::kBF16, 5120, 1280, 0},
  };
  std::printf("\n| weight (K->N) | fmt | M | us/call | GB/s | %% of read ceiling | cuBLAS bf16 M=1 us (GB/s) |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (const Shape& s : shapes) {
    // One weight, then copies of it (same bytes: the kernel's speed does not depend on the values).
    di::ops::QWeight w0;
    if (s.dt == di::DType::kE4M3) {
      w0.w = random_device({s.N, s.K}, s.dt, 0, 255, true);
      w0.scale = random_device({(s.N + s.B - 1) / s.B, (s.K + s.B - 1) / s.B}, di::DType::kE8M0, 117, 123);
      w0.block = s.B;
    } else if (s.dt == di::DType::kE2M1x2) {
      w0.w = random_device({s.N, s.K}, s.dt);
      w0.scale = random_device({s.N, s.K / 32}, di::DType::kE8M0, 120, 126);
    } else {
      w0.w = random_device({s.N, s.K}, s.dt, 0x3c, 0x3d);  // high bytes of moderate bf16 values
    }
    const double wbytes = static_cast<double>(w0.w.nbytes() + (w0.scale.defined() ? w0.scale.nbytes() : 0));
    const int copies = static_cast<int>(std::min<double>(64, std::max(2.0, (512.0 * (1 << 20)) / wbytes)));
    std::vector<di::ops::QWeight> ws(copies, w0);
    for (int i = 1; i < copies; ++i) {
      ws[i].w = di::cuda::copy_to_device(w0.w);
      if (w0.scale.defined()) ws[i].scale = di::cuda::copy_to_device(w0.scale);
    }
    // cuBLAS anchor at M = 1: y[N] = W_bf16[N, K] . x (the dequantised weight's size), rotated the same way.
    const size_t bf_bytes = static_cast<size_t>(s.N * s.K * 2);
    const int bf_copies = static_cast<int>(std::min<double>(64, std::max(2.0, (512.0 * (1 << 20)) / bf_bytes)));
    std::vector<di::Tensor> wbf;
    for (int i = 0; i < bf_copies; ++i) wbf.push_back(random_device({s.N, s.K}, di::DType::kBF16, 0x3c, 0x3d));
    di::Tensor xbf = random_device({s.K}, di::DType::kBF16, 0x3c, 0x3d);
    di::Tensor ybf = di::Tensor::empty({s.N}, di::DType::kF32, di::Device::kCUDA);
    const float alpha = 1.0f, beta = 0.0f;
    const int calls_bf = std::max(bf_copies, 32);
    const double t_bf = time_graph(st, calls_bf, [&](int i) {
      CB(cublasGemmEx(cb, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(s.N), 1, static_cast<int>(s.K), &alpha,
                      wbf[i % bf_copies].raw(), CUDA_R_16BF, static_cast<int>(s.K), xbf.raw(), CUDA_R_16BF,
                      static_cast<int>(s.K), &beta, ybf.raw(), CUDA_R_32F, static_cast<int>(s.N), CUBLAS_COMPUTE_32F,
                      CUBLAS_GEMM_DEFAULT));
    });
    wbf.clear();

    for (int64_t M : {1, 4, 16}) {
      di::Tensor xh = di::Tensor::empty({M, s.K}, di::DType::kF32);
      for (int64_t i = 0; i < M * s.K; ++i)
        xh.data<float>()[i] =
            di::bf16_to_f32(di::f32_to_bf16((static_cast<float>(next_u32() % 2001) - 1000.0f) / 300.0f));
      di::Tensor x = di::cuda::copy_to_device(xh);
      di::Tensor y = di::Tensor::empty({M, s.N}, di::DType::kF32, di::Device::kCUDA);
      di::ops::LinearOpts o;
      o.act_quant_block = s.dt == di::DType::kBF16 ? 0 : 128;
      o.round_out_bf16 = true;
      di::cuda::linear_into(x, ws[0], o, y, st);  // workspace sized outside the capture
      CK(cudaStreamSynchronize(st));
      const int calls = std::max(copies, 32);
      const double t = time_graph(st, calls, [&](int i) { di::cuda::linear_into(x, ws[i % copies], o, y, st); });
      const double gbs = wbytes / t / 1e6;
      char anchor[64] = "";
      if (M == 1) std::snprintf(anchor, sizeof anchor, "%.2f (%.0f)", t_bf * 1e3, bf_bytes / t_bf / 1e6);
      std::printf("| %s | %s | %lld | %.2f | %.0f | %.0f%% | %s |\n", s.what, di::dtype_name(s.dt),
                  static_cast<long long>(M), t * 1e3, gbs, 100.0 * gbs / read_gbs, anchor);
      std::fflush(stdout);
    }
  }
  CB(cublasDestroy(cb));
  CK(cudaStreamDestroy(st));
  return 0;
}
