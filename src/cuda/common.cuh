// Small helpers shared by the CUDA kernels: viewing a tensor as rows, a growing workspace, block-wide
// reductions and bf16 rounding. Host parts are plain C++; device parts compile only under nvcc.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>

#include "cuda/device.h"
#include "deepinfer/error.h"
#include "deepinfer/tensor.h"

namespace deepinfer::cuda {

// Limits of the current device, queried once per process (a query is a driver round trip; the
// backend uses one device).
inline int device_attribute_once(cudaDeviceAttr attr) {
  int dev = 0, v = 0;
  DI_CHECK(cudaGetDevice(&dev) == cudaSuccess && cudaDeviceGetAttribute(&v, attr, dev) == cudaSuccess,
           "cuda: could not read device attribute {}", static_cast<int>(attr));
  return v;
}
inline int sm_count() {
  static const int n = device_attribute_once(cudaDevAttrMultiProcessorCount);
  return n;
}
inline int smem_optin() {
  static const int n = device_attribute_once(cudaDevAttrMaxSharedMemoryPerBlockOptin);
  return n;
}

// A call's own device scratch of at least `bytes` (float32 storage) from the caching allocator: stream-ordered reuse,
// unlike one shared workspace, which two linears on two streams (side work) would race on and a grown buffer would
// leave dangling in a captured graph. Held until the call's launches are queued.
inline Tensor call_scratch(size_t bytes) {
  return Tensor::empty({static_cast<int64_t>((bytes + 3) / 4)}, DType::kF32, Device::kCUDA);
}

// A device scratch buffer that grows on demand and never shrinks (kernels' private workspaces).
// Growing waits for the device first: work queued earlier may still read the old buffer.
class GrowingBuffer {
 public:
  void* get(size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    if (bytes_ < bytes) {
      flush_deferred();
      if (p_ != nullptr) {
        DI_CHECK(cudaDeviceSynchronize() == cudaSuccess && cudaFree(p_) == cudaSuccess,
                 "cuda: could not release a workspace of {} bytes", bytes_);
        p_ = nullptr;
        bytes_ = 0;
      }
      const size_t want = std::max<size_t>(bytes, size_t{1} << 20);
      DI_CHECK(cudaMalloc(&p_, want) == cudaSuccess, "cuda: could not allocate a workspace of {} bytes", want);
      bytes_ = want;
    }
    return p_;
  }

 private:
  std::mutex mu_;
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// Checks a linear's output: a contiguous float32 CUDA tensor [rows, cols] (`op` names the caller in the error).
inline void check_linear_out(const Tensor& y, int64_t rows, int64_t cols, const char* op) {
  DI_CHECK(y.defined() && y.device() == Device::kCUDA && y.dtype() == DType::kF32 && y.is_contiguous() &&
               y.dim() == 2 && y.size(0) == rows && y.size(1) == cols,
           "{}: output {} is not a contiguous float32 CUDA [{}, {}]", op, y.defined() ? y.describe() : "undefined",
           rows, cols);
}

// Why a linear's operands are not x a 2-D float32 CUDA tensor and w a 2-D CUDA tensor, each with dense rows ("" when
// they are): what the tensor-core kernels (linear_tc.cu, linear_tc_bf16.cu) check first.
inline std::string dense_operands_why(const Tensor& x, const Tensor& w) {
  if (!x.defined() || x.device() != Device::kCUDA || x.dtype() != DType::kF32 || x.dim() != 2)
    return "x must be a 2-D float32 CUDA tensor";
  if (x.size(1) > 1 && x.strides()[1] != 1) return "x's rows must be dense";
  if (!w.defined() || w.device() != Device::kCUDA || w.dim() != 2) return "the weight must be a 2-D CUDA tensor";
  if (w.size(1) > 1 && w.strides()[1] != 1) return "the weight's rows must be dense";
  return "";
}

// A float32 tensor on kCUDA seen as `rows` rows of `cols` contiguous values, `row_stride`
// elements apart. Accepts 1-D tensors (one row), 2-D tensors whose last dimension is dense (so
// column slices work) and contiguous tensors of higher rank (flattened to [-1, last]).
struct Rows {
  float* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_stride = 0;
};

inline Rows as_rows(const Tensor& x, const char* op) {
  DI_CHECK(x.defined(), "{}: undefined tensor", op);
  DI_CHECK(x.device() == Device::kCUDA, "{}: expected a CUDA tensor, got {}", op, x.describe());
  DI_CHECK(x.dtype() == DType::kF32, "{}: expected float32, got {}", op, x.describe());
  DI_CHECK(x.dim() >= 1, "{}: expected at least one dimension, got {}", op, x.describe());
  Rows r;
  r.data = x.data<float>();
  r.cols = x.size(-1);
  if (x.dim() == 1) {
    DI_CHECK(x.strides()[0] == 1, "{}: expected a dense row, got {}", op, x.describe());
    r.rows = 1;
    r.row_stride = r.cols;
  } else if (x.dim() == 2) {
    DI_CHECK(x.strides()[1] == 1, "{}: the last dimension must be dense, got {}", op, x.describe());
    r.rows = x.size(0);
    r.row_stride = x.strides()[0];
  } else {
    DI_CHECK(x.is_contiguous(), "{}: expected a contiguous tensor, got {}", op, x.describe());
    r.rows = r.cols == 0 ? 0 : x.numel() / r.cols;
    r.row_stride = r.cols;
  }
  return r;
}

// Threads per block for a kernel that gives one thread block to `width` values: a whole number
// of warps, at least one, at most `max_threads`.
inline int threads_for(int64_t width, int max_threads) {
  int64_t t = (width + 31) / 32 * 32;
  if (t < 32) t = 32;
  if (t > max_threads) t = max_threads;
  return static_cast<int>(t);
}

}  // namespace deepinfer::cuda

#ifdef __CUDACC__
#include <cuda_bf16.h>

namespace deepinfer::cuda {

// fp32 -> nearest-even bf16 -> fp32 (as f32_to_bf16 in deepinfer/dtype.h).
__device__ __forceinline__ float round_to_bf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

// Asynchronous global -> shared copies (cp.async; 16 bytes bypass L1, 4 bytes go through it), their
// commit groups and waits. The "memory" clobbers keep the compiler from moving shared-memory accesses
// across a commit or a wait.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async8(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// 16 bytes of shared memory at a shared-space address.
__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}

// Four 8x8 b16 matrices from shared memory: lanes 8i .. 8i + 7 give the 16-byte row addresses of matrix i (a
// shared-space address s, or a generic pointer p), and lane (g, t) receives in r[i] the 4-byte word t of row g of
// matrix i. No memory clobber: the callers order it after the shared stores it reads with a barrier (__syncthreads,
// __syncwarp), which the compiler does not move it across.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], unsigned s) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  ldmatrix_x4(r, static_cast<unsigned>(__cvta_generic_to_shared(p)));
}
// Two such matrices (lanes 0 .. 15 give the row addresses).
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* p) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(s));
}

struct MaxOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a > b ? a : b;
  }
};
struct SumOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};

// Reduces `v` (float or double) over the whole thread block and returns the result to every
// thread. blockDim.x must be a multiple of 32 (at most 1024). `identity` is the neutral element
// of `op`. The combination order is fixed (a butterfly within each warp, then across warps), so
// a given launch shape always gives the same bits.
template <typename T, typename Op>
__device__ T block_reduce(T v, Op op, T identity) {
  __shared__ T partial[32];
  __syncthreads();  // `partial` may still be read by a previous call in the same kernel
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  // Every warp reduces the per-warp partials, so all threads end with the result.
  const int nwarps = blockDim.x >> 5;
  v = lane < nwarps ? partial[lane] : identity;
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

}  // namespace deepinfer::cuda
#endif  // __CUDACC__
