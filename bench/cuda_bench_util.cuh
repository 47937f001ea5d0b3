// Helpers shared by the CUDA benchmarks: a deterministic xorshift for test data, CUDA-graph timing and the
// HBM ceilings (read kernel, device-to-device copy) measured in the same run.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "deepinfer/error.h"

namespace deepinfer::bench {

// The HBM read ceiling's kernel: streams n float4 values (a graph of calls over a buffer larger than L2).
inline __global__ void read_kernel(const float4* p, size_t n, float* out) {
  float s = 0.0f;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float4 v = p[i];
    s += v.x + v.y + v.z + v.w;
  }
  if (s == 123.456f) *out = s;  // never true for the data used; keeps the loads
}

inline uint32_t next_u32() {
  static uint64_t rng = 0x9E3779B97F4A7C15ull;
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return static_cast<uint32_t>(rng >> 16);
}

// Captures `calls` invocations of body(i) into one CUDA graph and returns the median over `reps`
// replays of the mean time (ms) of one call. Launch overheads are amortised as in a decode graph.
template <typename F>
double time_graph(cudaStream_t st, int calls, F body, int reps = 7) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  DI_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < calls; ++i) body(i);
  DI_CUDA_CHECK(cudaStreamEndCapture(st, &g));
  DI_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
  DI_CUDA_CHECK(cudaGraphLaunch(ge, st));  // warm-up
  DI_CUDA_CHECK(cudaStreamSynchronize(st));
  cudaEvent_t a, b;
  DI_CUDA_CHECK(cudaEventCreate(&a));
  DI_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    DI_CUDA_CHECK(cudaEventRecord(a, st));
    DI_CUDA_CHECK(cudaGraphLaunch(ge, st));
    DI_CUDA_CHECK(cudaEventRecord(b, st));
    DI_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    DI_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms / calls);
  }
  DI_CUDA_CHECK(cudaGraphExecDestroy(ge));
  DI_CUDA_CHECK(cudaGraphDestroy(g));
  DI_CUDA_CHECK(cudaEventDestroy(a));
  DI_CUDA_CHECK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// The ceilings the benches compare against, over a device buffer of `bytes` (well above L2), timed as
// graphs of 4 calls: GB/s of the read kernel (bytes read) and of a device-to-device copy (read + written).
inline double read_ceiling_gbs(cudaStream_t st, size_t bytes) {
  int dev = 0, sms = 0;
  DI_CUDA_CHECK(cudaGetDevice(&dev));
  DI_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  void* src = nullptr;
  float* sink = nullptr;
  DI_CUDA_CHECK(cudaMalloc(&src, bytes));
  DI_CUDA_CHECK(cudaMalloc(&sink, 4));
  DI_CUDA_CHECK(cudaMemset(src, 0x3c, bytes));  // small finite floats, not zeros
  const double ms = time_graph(
      st, 4, [&](int) { read_kernel<<<sms * 8, 512, 0, st>>>(static_cast<const float4*>(src), bytes / 16, sink); });
  DI_CUDA_CHECK(cudaFree(src));
  DI_CUDA_CHECK(cudaFree(sink));
  return bytes / ms / 1e6;
}

inline double copy_ceiling_gbs(cudaStream_t st, size_t bytes) {
  void *src = nullptr, *dst = nullptr;
  DI_CUDA_CHECK(cudaMalloc(&src, bytes));
  DI_CUDA_CHECK(cudaMalloc(&dst, bytes));
  DI_CUDA_CHECK(cudaMemset(src, 0x3c, bytes));
  const double ms =
      time_graph(st, 4, [&](int) { DI_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st)); });
  DI_CUDA_CHECK(cudaFree(src));
  DI_CUDA_CHECK(cudaFree(dst));
  return 2.0 * bytes / ms / 1e6;
}

}  // namespace deepinfer::bench
