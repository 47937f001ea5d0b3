// What one dependency between two steps of a decode layer costs, by the mechanism that carries it: a kernel boundary
// in a CUDA graph (plain, or with programmatic dependent launch as the engine's launch_pdl), a grid-wide barrier inside
// one persistent kernel, or a per-block flag inside one (a block waits only for the block whose output it reads).
// Why: a batch-1 V4.1 layer is ~30 dependent kernels, most of them small, and the layers run at about a third of their
// memory roofline on the H200 (bench/RESULTS.md); the persistent layer kernel named since the twenty-seventh session
// would trade each boundary for a barrier or a flag, and this says what that trade is worth before anyone builds it.
//
// Each of P steps: every block reads one float that another block wrote in the step before (block (7 b + 1) % G, from
// L2), adds one, and writes its own; so every step depends on the previous one through global memory, as a layer's
// kernels do, and the final values check that no step ran early. Printed: us per step for each mechanism and grid size,
// and the ratio of each kernel form to the persistent barrier measured in the same run (the anchor).
//   bench_cuda_boundary_probe [--steps P]
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cuda/fp_decode.cuh"
#include "cuda/launch_record.h"
#include "cuda_bench_util.cuh"

namespace deepinfer::bench {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ int src_block(int b, int G) { return (7 * b + 1) % G; }

// One step as its own kernel: PDL waits for the previous kernel before the read (griddepcontrol is a no-op without
// the launch attribute). Step p reads ring p - 1 and writes ring p: every buffer is written once a run, so no block can
// overwrite what another has yet to read (a fair base for the flag form, whose blocks do not move in lock step).
__global__ void __launch_bounds__(kThreads) step_kernel(const float* prev, float* next, int G) {
  cuda::pdl_launch_dependents();
  cuda::pdl_wait();
  const int b = static_cast<int>(blockIdx.x);
  const float v = __ldcg(prev + src_block(b, G) * kThreads + threadIdx.x);
  next[b * kThreads + threadIdx.x] = v + 1.0f;
}

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// All P steps in one launch of G co-resident blocks over the same ring (stride: floats per ring buffer). MODE 0: a
// grid barrier after each step (a monotonic counter: step p waits until G (p - 1) blocks have arrived); MODE 1: block
// b waits only for its source block's flag of step p - 1.
template <int MODE>
__global__ void __launch_bounds__(kThreads)
    persistent_kernel(float* ring, int64_t stride, unsigned* sync, int G, int P) {
  const int b = static_cast<int>(blockIdx.x);
  for (int p = 1; p <= P; ++p) {
    if (p > 1) {
      if (threadIdx.x == 0) {
        const unsigned* s = MODE == 0 ? sync : sync + src_block(b, G);
        const unsigned target = MODE == 0 ? static_cast<unsigned>(G) * (p - 1) : static_cast<unsigned>(p - 1);
        while (ld_acquire(s) < target) {
        }
      }
      __syncthreads();
    }
    const float v = __ldcg(ring + (p - 1) * stride + src_block(b, G) * kThreads + threadIdx.x);
    ring[p * stride + b * kThreads + threadIdx.x] = v + 1.0f;
    __syncthreads();  // the block's writes, then one release for them all
    if (threadIdx.x == 0) {
      __threadfence();
      if (MODE == 0)
        atomicAdd(sync, 1u);
      else
        atomicExch(sync + b, static_cast<unsigned>(p));
    }
  }
}

void run(int P) {
  cudaStream_t st;
  DI_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  int dev = 0, sms = 0;
  DI_CUDA_CHECK(cudaGetDevice(&dev));
  DI_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop;
  DI_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  int per_sm = 0;
  DI_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persistent_kernel<0>, kThreads, 0));
  std::printf("device: %s, %d SMs; %d steps per measurement, %d threads a block\n", prop.name, sms, P, kThreads);
  std::printf(
      "| blocks | graph, plain launches | graph, PDL (launch_pdl) | persistent, grid barrier | persistent, "
      "per-block flags | plain / barrier | PDL / barrier | check |\n|---|---|---|---|---|---|---|---|\n");
  const int grids[] = {1, 32, sms, 2 * sms};
  const int max_g = 2 * sms;
  // Ring buffers 0..P (buffer 0 stays zero), each of max_g blocks' values.
  const int64_t stride = static_cast<int64_t>(max_g) * kThreads;
  float* ring = nullptr;
  unsigned* sync = nullptr;
  DI_CUDA_CHECK(cudaMalloc(&ring, sizeof(float) * stride * (P + 1)));
  DI_CUDA_CHECK(cudaMalloc(&sync, sizeof(unsigned) * max_g));
  std::vector<float> host(static_cast<size_t>(max_g) * kThreads);
  bool all_ok = true;
  for (const int G : grids) {
    if (G > per_sm * sms) {
      std::printf("| %d | (not co-resident: %d blocks an SM) |\n", G, per_sm);
      continue;
    }
    const size_t bytes = sizeof(float) * G * kThreads;
    // Every run reads buffer 0 (zeros) and adds one a step, so every value of buffer P must end at P.
    auto launch_step = [&](bool pdl, int i) {
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3(static_cast<unsigned>(G));
      cfg.blockDim = dim3(kThreads);
      cfg.stream = st;
      cudaLaunchAttribute attr;
      cuda::set_pdl(cfg, attr, pdl);  // launch_pdl's attribute, on or off whatever DEEPINFER_CUDA_PDL says
      DI_CUDA_CHECK(cudaLaunchKernelEx(&cfg, step_kernel, static_cast<const float*>(ring + i * stride),
                                       ring + (i + 1) * stride, G));
    };
    auto check = [&]() {
      DI_CUDA_CHECK(cudaStreamSynchronize(st));
      DI_CUDA_CHECK(cudaMemcpy(host.data(), ring + P * stride, bytes, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < static_cast<size_t>(G) * kThreads; ++i)
        if (host[i] != static_cast<float>(P)) return false;
      return true;
    };
    double us[4];
    bool ok = true;
    for (int form = 0; form < 4; ++form) {
      DI_CUDA_CHECK(cudaMemsetAsync(ring, 0, sizeof(float) * stride * (P + 1), st));
      DI_CUDA_CHECK(cudaStreamSynchronize(st));
      constexpr int kReps = 7;  // time_graph's replays, after one warm-up
      double ms;
      if (form < 2) {
        ms = time_graph(
                 st, P, [&](int i) { launch_step(form == 1, i); }, kReps) *
             P;  // P launches per graph
        ok = ok && check();
      } else {
        // One launch per replay; the counter / flags reset by a memset node before it (~1-2 us, over P steps).
        ms = time_graph(
            st, 1,
            [&](int) {
              DI_CUDA_CHECK(cudaMemsetAsync(sync, 0, sizeof(unsigned) * G, st));
              if (form == 2)
                persistent_kernel<0><<<G, kThreads, 0, st>>>(ring, stride, sync, G, P);
              else
                persistent_kernel<1><<<G, kThreads, 0, st>>>(ring, stride, sync, G, P);
              DI_CUDA_CHECK(cudaGetLastError());
            },
            kReps);
        ok = ok && check();
      }
      us[form] = ms * 1e3 / P;
    }
    all_ok = all_ok && ok;
    std::printf("| %d | %.2f | %.2f | %.2f | %.2f | %.1fx | %.1fx | %s |\n", G, us[0], us[1], us[2], us[3],
                us[0] / us[2], us[1] / us[2], ok ? "ok" : "WRONG");
  }
  std::printf(
      "us per step (one dependent read from L2, one write, per thread). check: every value equals the steps "
      "run, so no step read before its source was written.\n");
  DI_CUDA_CHECK(cudaFree(ring));
  DI_CUDA_CHECK(cudaFree(sync));
  DI_CUDA_CHECK(cudaStreamDestroy(st));
  DI_CHECK(all_ok, "bench_cuda_boundary_probe: a form produced wrong values (a step ran before its input)");
}

}  // namespace
}  // namespace deepinfer::bench

int main(int argc, char** argv) {
  int P = 256;
  for (int i = 1; i < argc; ++i) {
    char* end = nullptr;
    if (std::strcmp(argv[i], "--steps") == 0 && i + 1 < argc) {
      const long v = std::strtol(argv[++i], &end, 10);
      P = *end == '\0' && v >= 2 && v <= 4096 ? static_cast<int>(v) : -1;
    } else {
      std::fprintf(stderr, "usage: %s [--steps P]\n", argv[0]);
      return 2;
    }
  }
  if (P < 0) {
    std::fprintf(stderr, "bench_cuda_boundary_probe: --steps must be 2 to 4096 (got %s)\n", argv[argc - 1]);
    return 2;
  }
  return deepinfer::bench::bench_main("bench_cuda_boundary_probe", [&] { deepinfer::bench::run(P); });
}
