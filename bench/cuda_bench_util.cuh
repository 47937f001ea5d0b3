// Helpers shared by the CUDA benchmarks: a deterministic xorshift for test data, CUDA-graph timing and the
// HBM ceilings (read kernel, device-to-device copy) measured in the same run.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <vector>

#include "cuda/device.h"
#include "deepinfer/error.h"
#include "deepinfer/tensor.h"

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

// ---- device-side test data (values do not change the kernels' speed; no host loops over GBs) ----------
__device__ __forceinline__ uint32_t hash_u32(uint64_t i, uint32_t seed) {
  uint64_t z = i * 0x9E3779B97F4A7C15ull + (static_cast<uint64_t>(seed) + 1) * 0xD1B54A32D192ED03ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return static_cast<uint32_t>((z ^ (z >> 31)) >> 16);
}

// Bytes uniform in [lo, hi]; no_fp8_nan replaces the E4M3 NaN codes (0x7f, 0xff).
inline __global__ void fill_bytes_kernel(uint8_t* p, size_t n, uint32_t seed, int lo, int hi, bool no_fp8_nan) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    int c = lo + static_cast<int>(hash_u32(i, seed) % static_cast<uint32_t>(hi - lo + 1));
    if (no_fp8_nan && (c & 0x7f) == 0x7f) c = 0x11;
    p[i] = static_cast<uint8_t>(c);
  }
}

// Activations on the bf16 grid in [-3.34, 3.34] (as the model's BF16-rounded inputs).
inline __global__ void fill_act_kernel(float* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float v = (static_cast<float>(hash_u32(i, seed) % 2001u) - 1000.0f) / 300.0f;
    p[i] = __uint_as_float(__float_as_uint(v) & 0xffff0000u);
  }
}

// BF16 weights: random sign and mantissa, magnitudes 2^-12 .. 2^-1.
inline __global__ void fill_bf16_kernel(uint16_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint32_t v = hash_u32(i, seed);
    p[i] = static_cast<uint16_t>((v & 0x8000u) | ((115u + (v >> 16) % 12u) << 7) | (v & 0x7fu));
  }
}

// The seed of the next fill (each tensor gets its own stream of values).
inline uint32_t next_fill_seed() {
  static uint32_t seed = 1;
  return seed++;
}

// A CUDA tensor of random bytes in [lo, hi] (weights' codes and scales).
inline Tensor dev_bytes(const std::vector<int64_t>& shape, DType dt, int lo, int hi, bool no_fp8_nan = false) {
  Tensor t = Tensor::empty(shape, dt, Device::kCUDA);
  fill_bytes_kernel<<<1024, 256>>>(static_cast<uint8_t*>(t.raw()), t.nbytes(), next_fill_seed(), lo, hi, no_fp8_nan);
  DI_CUDA_CHECK(cudaGetLastError());
  return t;
}

// A BF16 CUDA tensor of weights (fill_bf16_kernel).
inline Tensor dev_bf16(const std::vector<int64_t>& shape) {
  Tensor t = Tensor::empty(shape, DType::kBF16, Device::kCUDA);
  fill_bf16_kernel<<<1024, 256>>>(static_cast<uint16_t*>(t.raw()), static_cast<size_t>(t.numel()), next_fill_seed());
  DI_CUDA_CHECK(cudaGetLastError());
  return t;
}

// A float32 CUDA tensor of activations on the bf16 grid.
inline Tensor dev_act(const std::vector<int64_t>& shape) {
  Tensor t = Tensor::empty(shape, DType::kF32, Device::kCUDA);
  fill_act_kernel<<<1024, 256>>>(t.data<float>(), static_cast<size_t>(t.numel()), next_fill_seed());
  DI_CUDA_CHECK(cudaGetLastError());
  return t;
}

// A benchmark's main: SKIP (exit 0) without a CUDA device, else run(), reporting an error as `name: what`.
template <typename F>
int bench_main(const char* name, F run) {
  if (cuda::device_count() == 0) {
    std::printf("SKIP: no CUDA device\n");
    return 0;
  }
  try {
    run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 1;
  }
  return 0;
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
