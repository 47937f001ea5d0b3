// CUDA row-wise top-k (radix select + bitonic sort). Contract in topk.cuh.
#include <cuda_runtime.h>

#include <string>

#include "cuda/common.cuh"
#include "cuda/device.h"
#include "cuda/fp_decode.cuh"
#include "cuda/topk.cuh"

namespace deepinfer::cuda {

namespace {

constexpr int kThreads = 512;
constexpr int kMaxK = 4096;
constexpr uint32_t kNegInfKey = 0x007fffffu;  // key of -inf

// Larger float -> larger key (total order on non-NaN values; -0 < +0 is irrelevant: equal scores
// compare by index on the CPU, and -0 == +0 there). Zero signs are merged so that -0 and +0 tie.
__device__ __forceinline__ uint32_t order_key(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) == 0) u = 0;  // -0 -> +0
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Exclusive prefix count of `flag` over the block in thread order; returns the block total in *total.
__device__ int block_excl_count(bool flag, int* warp_sums, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const unsigned ballot = __ballot_sync(0xffffffffu, flag);
  const int in_warp = __popc(ballot & ((1u << lane) - 1u));
  __syncthreads();
  if (lane == 0) warp_sums[warp] = __popc(ballot);
  __syncthreads();
  int before = 0, all = 0;
  for (int w = 0; w < kThreads / 32; ++w) {
    const int v = warp_sums[w];
    if (w < warp) before += v;
    all += v;
  }
  *total = all;
  return before + in_warp;
}

__global__ void __launch_bounds__(kThreads)
    topk_rows_kernel(const float* scores, int64_t ld, int n, int k, bool by_index, int32_t* out) {
  pdl_wait();
  pdl_launch_dependents();
  extern __shared__ unsigned long long sel[];  // [P] sort keys, P = next power of two >= k
  __shared__ int hist[256];
  __shared__ int warp_sums[kThreads / 32];
  __shared__ int s_digit, s_rem, s_count;
  const float* row = scores + static_cast<int64_t>(blockIdx.x) * ld;
  const int tid = threadIdx.x, lane = tid & 31;
  int P = 1;
  while (P < k) P <<= 1;

  // Candidates (everything but -inf).
  int cnt = 0;
  for (int i = tid; i < n; i += kThreads) cnt += order_key(row[i]) != kNegInfKey;
  cnt = block_reduce(cnt, SumOp{}, 0);
  const int m = min(cnt, k);

  uint32_t thr = 0;  // select key > thr, plus the first `rem` with key == thr
  int rem = 0;
  if (cnt > k) {
    uint32_t prefix = 0, mask = 0;
    rem = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int b = tid; b < 256; b += kThreads) hist[b] = 0;
      __syncthreads();
      for (int i = tid; i < n; i += kThreads) {
        const uint32_t key = order_key(row[i]);
        if (key != kNegInfKey && (key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1);
      }
      __syncthreads();
      if (tid < 32) {
        // Lane l owns bins [8l, 8l + 8); suffix sums over lanes find the bin holding the rem-th largest.
        int own = 0;
        for (int b = 0; b < 8; ++b) own += hist[8 * lane + b];
        int suffix = own;  // sum over lanes >= lane
        for (int o = 1; o < 32; o <<= 1) {
          const int v = __shfl_down_sync(0xffffffffu, suffix, o);
          if (lane + o < 32) suffix += v;
        }
        const unsigned hit = __ballot_sync(0xffffffffu, suffix >= rem);
        const int L = 31 - __clz(hit);  // the highest lane whose suffix still reaches rem
        if (lane == L) {
          int cum = suffix - own;  // count in bins above this lane's
          for (int b = 8 * lane + 7; b >= 8 * lane; --b) {
            if (cum + hist[b] >= rem) {
              s_digit = b;
              s_rem = rem - cum;
              break;
            }
            cum += hist[b];
          }
        }
      }
      __syncthreads();
      prefix |= static_cast<uint32_t>(s_digit) << shift;
      mask |= 255u << shift;
      rem = s_rem;
      __syncthreads();
    }
    thr = prefix;
  }

  // Gather the picks: keys above the threshold in any order, then the equal ones in index order.
  if (tid == 0) s_count = 0;
  __syncthreads();
  auto make = [&](uint32_t key, int i) -> unsigned long long {
    return by_index ? static_cast<unsigned long long>(i)
                    : (static_cast<unsigned long long>(~key) << 32) | static_cast<unsigned long long>(i);
  };
  for (int i = tid; i < n; i += kThreads) {
    const uint32_t key = order_key(row[i]);
    if (key != kNegInfKey && (cnt <= k || key > thr)) sel[atomicAdd(&s_count, 1)] = make(key, i);
  }
  if (cnt > k) {
    const int above = k - rem;
    int taken = 0;
    for (int c0 = 0; c0 < n && taken < rem; c0 += kThreads) {  // `taken` is uniform
      const int i = c0 + tid;
      const uint32_t key = i < n ? order_key(row[i]) : kNegInfKey;
      const bool eq = i < n && key == thr;
      int total = 0;
      const int pos = taken + block_excl_count(eq, warp_sums, &total);
      if (eq && pos < rem) sel[above + pos] = make(key, i);
      taken += total;
    }
  }
  __syncthreads();
  for (int i = m + tid; i < P; i += kThreads) sel[i] = ~0ull;
  __syncthreads();
  // Bitonic sort of sel[0, P), ascending.
  for (int size = 2; size <= P; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = tid; i < P / 2; i += kThreads) {
        const int lo = 2 * i - (i & (stride - 1));
        const int hi = lo + stride;
        const bool up = (lo & size) == 0;
        const unsigned long long a = sel[lo], b = sel[hi];
        if ((a > b) == up) {
          sel[lo] = b;
          sel[hi] = a;
        }
      }
      __syncthreads();
    }
  }
  int32_t* o = out + static_cast<int64_t>(blockIdx.x) * k;
  for (int i = tid; i < k; i += kThreads) o[i] = i < m ? static_cast<int32_t>(sel[i] & 0xffffffffull) : -1;
  (void)lane;
}

}  // namespace

Tensor topk_rows(const Tensor& scores, int64_t k, bool sort_by_index) {
  const char* op = "cuda::topk_rows";
  DI_CHECK(scores.defined() && scores.device() == Device::kCUDA && scores.dtype() == DType::kF32 && scores.dim() == 2 &&
               (scores.size(1) <= 1 || scores.strides()[1] == 1),
           "{}: expected float32 [T, n] on CUDA with dense rows, got {}", op,
           scores.defined() ? scores.describe() : std::string("undefined"));
  DI_CHECK(k >= 0 && k <= kMaxK, "{}: k = {} outside [0, {}]", op, k, kMaxK);
  const int64_t T = scores.size(0), n = scores.size(1);
  DI_CHECK(n < (int64_t{1} << 31) && T < (int64_t{1} << 31), "{}: {} is too large", op, scores.describe());
  Tensor out = Tensor::empty({T, k}, DType::kI32, Device::kCUDA);
  if (T == 0 || k == 0) return out;
  int64_t P = 1;
  while (P < k) P <<= 1;
  const size_t smem = static_cast<size_t>(P) * sizeof(unsigned long long);
  static const bool configured = [] {
    DI_CUDA_CHECK(cudaFuncSetAttribute(topk_rows_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kMaxK * sizeof(unsigned long long))));
    return true;
  }();
  (void)configured;
  launch_pdl(topk_rows_kernel, static_cast<unsigned>(T), kThreads, smem, nullptr, scores.data<float>(),
             scores.strides()[0], static_cast<int>(n), static_cast<int>(k), sort_by_index, out.data<int32_t>());
  DI_CUDA_CHECK(cudaGetLastError());
  return out;
}

}  // namespace deepinfer::cuda
