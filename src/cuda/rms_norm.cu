// CUDA RMSNorm. Contract in rms_norm.cuh.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>
#include <type_traits>

#include "cuda/common.cuh"
#include "cuda/device.h"
#include "cuda/fp_decode.cuh"
#include "cuda/hc.cuh"
#include "cuda/rms_norm.cuh"

namespace deepinfer::cuda {

namespace {

__device__ __forceinline__ float load_weight(const float* w, int64_t c) { return w[c]; }
__device__ __forceinline__ float load_weight(const __nv_bfloat16* w, int64_t c) { return __bfloat162float(w[c]); }

// One thread block per row. W is float or __nv_bfloat16; w == nullptr means no weight.
template <typename W>
__global__ void rms_norm_kernel(const float* x, int64_t row_stride, int64_t cols, const W* w, float eps, bool round,
                                float* y) {
  pdl_wait();
  pdl_launch_dependents();
  const float* xr = x + blockIdx.x * row_stride;
  float* yr = y + blockIdx.x * cols;

  // mean(x^2): squares and their sum in fp64 (as the CPU op does), so the summation order
  // barely matters and the fp32 result almost always equals the CPU's bit for bit.
  double ss = 0.0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) ss += static_cast<double>(xr[c]) * xr[c];
  ss = block_reduce(ss, SumOp{}, 0.0);
  const float var = static_cast<float>(ss / static_cast<double>(cols));
  // 1/sqrt with IEEE division and square root (not the approximate rsqrtf), like the CPU op.
  const float inv = 1.0f / sqrtf(var + eps);

  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    float v = xr[c] * inv;  // w * (x * inv): the reference's order
    if (w != nullptr) v = load_weight(w, c) * v;
    yr[c] = round ? round_to_bf16(v) : v;
  }
}

// The same op for rows of at most 32 * kVecThreads float4 (8,192 columns, cols % 4 == 0, 16-byte aligned
// rows): the row is loaded once into registers (every load of a thread issued before the first use) and
// the weight before the reduction, so a decode row costs one load latency instead of a chain of them (the
// loop above waits on each strided load in turn and reads x twice). Same arithmetic per value; the FP64
// sum of squares is grouped differently (any grouping of these exact squares almost always rounds to
// the same fp32 variance).
constexpr int kVecThreads = 256;
constexpr int kVecMax = 8;  // float4 per thread

template <typename W>
__device__ __forceinline__ float4 load_weight4(const W* w, int64_t c4) {
  return make_float4(load_weight(w, 4 * c4), load_weight(w, 4 * c4 + 1), load_weight(w, 4 * c4 + 2),
                     load_weight(w, 4 * c4 + 3));
}
__device__ __forceinline__ float4 load_weight4(const float* w, int64_t c4) {
  return reinterpret_cast<const float4*>(w)[c4];
}

// The norm of one row held as v[k] = float4 number tid + k * blockDim.x (zeros past n4), written to yr.
template <typename W>
__device__ __forceinline__ void norm_row_vec(float4 (&v)[kVecMax], int n4, int64_t cols, const W* w, float eps,
                                             bool round, float4* yr) {
  const int tid = static_cast<int>(threadIdx.x), nt = static_cast<int>(blockDim.x);
  float4 wv[kVecMax];
#pragma unroll
  for (int k = 0; k < kVecMax; ++k) {
    const int c = tid + k * nt;
    wv[k] = make_float4(1.0f, 1.0f, 1.0f, 1.0f);
    if (w != nullptr && c < n4) wv[k] = load_weight4(w, c);
  }
  double ss = 0.0;
#pragma unroll
  for (int k = 0; k < kVecMax; ++k) {
    ss += static_cast<double>(v[k].x) * v[k].x;
    ss += static_cast<double>(v[k].y) * v[k].y;
    ss += static_cast<double>(v[k].z) * v[k].z;
    ss += static_cast<double>(v[k].w) * v[k].w;
  }
  ss = block_reduce(ss, SumOp{}, 0.0);
  const float var = static_cast<float>(ss / static_cast<double>(cols));
  const float inv = 1.0f / sqrtf(var + eps);
  auto one = [&](float a, float wt) {
    const float r = w != nullptr ? wt * (a * inv) : a * inv;  // w * (x * inv): the reference's order
    return round ? round_to_bf16(r) : r;
  };
#pragma unroll
  for (int k = 0; k < kVecMax; ++k) {
    const int c = tid + k * nt;
    if (c < n4)
      yr[c] = make_float4(one(v[k].x, wv[k].x), one(v[k].y, wv[k].y), one(v[k].z, wv[k].z), one(v[k].w, wv[k].w));
  }
}

template <typename W>
__global__ void __launch_bounds__(kVecThreads)
    rms_norm_vec_kernel(const float* x, int64_t row_stride, int64_t cols, const W* w, float eps, bool round, float* y) {
  pdl_wait();
  pdl_launch_dependents();
  const float4* xr = reinterpret_cast<const float4*>(x + blockIdx.x * row_stride);
  const int n4 = static_cast<int>(cols / 4), tid = static_cast<int>(threadIdx.x), nt = static_cast<int>(blockDim.x);
  float4 v[kVecMax];
#pragma unroll
  for (int k = 0; k < kVecMax; ++k) {
    const int c = tid + k * nt;
    v[k] = c < n4 ? xr[c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  norm_row_vec(v, n4, cols, w, eps, round, reinterpret_cast<float4*>(y + blockIdx.x * cols));
}

// hc_collapse then rms_norm of one token per block (dim % 4 == 0, dim <= 8192, 16-byte aligned): the
// collapse of each column exactly as hc_collapse_kernel (acc = 0; acc += pre_j * h_j for j ascending;
// rounded when `round`), kept in registers for the norm: one launch and no round trip of the row. Every
// load of a thread is issued before the first use (HC > 0: hc known at compile time; 0: any hc <= 8).
template <int HC, typename W>
__global__ void __launch_bounds__(kVecThreads)
    hc_collapse_norm_kernel(const float* stream, const float* pre, int hc_rt, int64_t dim, const W* w, float eps,
                            bool round, float* y) {
  pdl_wait();
  pdl_launch_dependents();
  constexpr int kH = HC > 0 ? HC : 8;
  const int hc = HC > 0 ? HC : hc_rt;
  const int64_t t = blockIdx.x;
  const float4* s = reinterpret_cast<const float4*>(stream + t * hc * dim);
  const int n4 = static_cast<int>(dim / 4), tid = static_cast<int>(threadIdx.x), nt = static_cast<int>(blockDim.x);
  float p[kH];
#pragma unroll
  for (int j = 0; j < kH; ++j) p[j] = j < hc ? pre[t * hc + j] : 0.0f;
  float4 h[kH][kVecMax];
#pragma unroll
  for (int j = 0; j < kH; ++j)
#pragma unroll
    for (int k = 0; k < kVecMax; ++k) {
      const int c = tid + k * nt;
      h[j][k] = j < hc && c < n4 ? s[j * n4 + c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  float4 v[kVecMax];
#pragma unroll
  for (int k = 0; k < kVecMax; ++k) {
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int j = 0; j < kH; ++j) {
      if (j >= hc) break;
      acc.x = __fadd_rn(acc.x, __fmul_rn(p[j], h[j][k].x));
      acc.y = __fadd_rn(acc.y, __fmul_rn(p[j], h[j][k].y));
      acc.z = __fadd_rn(acc.z, __fmul_rn(p[j], h[j][k].z));
      acc.w = __fadd_rn(acc.w, __fmul_rn(p[j], h[j][k].w));
    }
    if (round)
      acc = make_float4(round_to_bf16(acc.x), round_to_bf16(acc.y), round_to_bf16(acc.z), round_to_bf16(acc.w));
    v[k] = tid + k * nt < n4 ? acc : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  norm_row_vec(v, n4, dim, w, eps, round, reinterpret_cast<float4*>(y + t * dim));
}

}  // namespace

Tensor rms_norm(const Tensor& x, const Tensor& w, float eps, bool round) {
  const Rows r = as_rows(x, "cuda::rms_norm");
  if (w.defined()) {
    DI_CHECK(w.device() == Device::kCUDA, "cuda::rms_norm: weight must be on CUDA, got {}", w.describe());
    DI_CHECK(w.dtype() == DType::kF32 || w.dtype() == DType::kBF16,
             "cuda::rms_norm: weight must be float32 or bfloat16, got {}", w.describe());
    DI_CHECK(w.dim() == 1 && w.size(0) == r.cols && w.is_contiguous(),
             "cuda::rms_norm: weight {} does not match {} columns", w.describe(), r.cols);
  }
  Tensor y = Tensor::empty(x.shape(), DType::kF32, Device::kCUDA);
  if (r.rows == 0 || r.cols == 0) return y;
  DI_CHECK(r.rows < (int64_t{1} << 31), "cuda::rms_norm: {} rows is too many for one launch", r.rows);
  const auto grid = static_cast<unsigned>(r.rows);
  float* out = y.data<float>();
  const bool vec = r.cols % 4 == 0 && r.row_stride % 4 == 0 && r.cols <= 4 * kVecThreads * kVecMax &&
                   reinterpret_cast<uintptr_t>(r.data) % 16 == 0 &&
                   (!w.defined() || w.dtype() != DType::kF32 || reinterpret_cast<uintptr_t>(w.raw()) % 16 == 0);
  if (vec) {
    const int threads = threads_for(r.cols / 4, kVecThreads);  // one float4 each, up to kVecMax at 256 threads
    if (w.defined() && w.dtype() == DType::kBF16) {
      launch_pdl(rms_norm_vec_kernel<__nv_bfloat16>, grid, threads, 0, nullptr, r.data, r.row_stride, r.cols,
                 w.data<__nv_bfloat16>(), eps, round, out);
    } else {
      const float* wf = w.defined() ? w.data<float>() : nullptr;
      launch_pdl(rms_norm_vec_kernel<float>, grid, threads, 0, nullptr, r.data, r.row_stride, r.cols, wf, eps, round,
                 out);
    }
    DI_CUDA_CHECK(cudaGetLastError());
    return y;
  }
  const int threads = threads_for(r.cols, 512);
  if (w.defined() && w.dtype() == DType::kBF16) {
    launch_pdl(rms_norm_kernel<__nv_bfloat16>, grid, threads, 0, nullptr, r.data, r.row_stride, r.cols,
               w.data<__nv_bfloat16>(), eps, round, out);
  } else {
    const float* wf = w.defined() ? w.data<float>() : nullptr;
    launch_pdl(rms_norm_kernel<float>, grid, threads, 0, nullptr, r.data, r.row_stride, r.cols, wf, eps, round, out);
  }
  DI_CUDA_CHECK(cudaGetLastError());
  return y;
}

}  // namespace deepinfer::cuda

namespace deepinfer::cuda {

Tensor hc_collapse_norm(const Tensor& stream, const Tensor& pre, const Tensor& w, float eps, bool round) {
  const char* op = "cuda::hc_collapse_norm";
  DI_CHECK(stream.defined() && stream.device() == Device::kCUDA && stream.dtype() == DType::kF32 &&
               stream.is_contiguous() && stream.dim() == 3,
           "{}: stream must be a contiguous float32 [T, hc, dim] CUDA tensor, got {}", op,
           stream.defined() ? stream.describe() : std::string("undefined"));
  const int64_t T = stream.size(0), hc = stream.size(1), dim = stream.size(2);
  DI_CHECK(pre.defined() && pre.device() == Device::kCUDA && pre.dtype() == DType::kF32 && pre.is_contiguous() &&
               pre.numel() == T * hc,
           "{}: pre must be a contiguous float32 CUDA tensor of {} values, got {}", op, T * hc,
           pre.defined() ? pre.describe() : std::string("undefined"));
  const bool fused = hc <= 8 && dim % 4 == 0 && dim <= 4 * kVecThreads * kVecMax &&
                     reinterpret_cast<uintptr_t>(stream.raw()) % 16 == 0 &&
                     (!w.defined() || w.dtype() != DType::kF32 || reinterpret_cast<uintptr_t>(w.raw()) % 16 == 0);
  if (!fused || T == 0) return rms_norm(hc_collapse(stream, pre, round), w, eps, round);
  if (w.defined()) {
    DI_CHECK(w.device() == Device::kCUDA && (w.dtype() == DType::kF32 || w.dtype() == DType::kBF16) && w.dim() == 1 &&
                 w.size(0) == dim && w.is_contiguous(),
             "{}: weight {} does not match {} columns", op, w.describe(), dim);
  }
  DI_CHECK(T < (int64_t{1} << 31), "{}: {} rows is too many for one launch", op, T);
  Tensor y = Tensor::empty({T, dim}, DType::kF32, Device::kCUDA);
  const int threads = threads_for(dim / 4, kVecThreads);
  const auto grid = static_cast<unsigned>(T);
  auto go = [&](auto* wp) {
    using W = std::remove_const_t<std::remove_pointer_t<decltype(wp)>>;
    auto kernel = hc == 4 ? hc_collapse_norm_kernel<4, W> : hc_collapse_norm_kernel<0, W>;
    launch_pdl(kernel, grid, threads, 0, nullptr, stream.data<float>(), pre.data<float>(), static_cast<int>(hc), dim,
               wp, eps, round, y.data<float>());
  };
  if (w.defined() && w.dtype() == DType::kBF16)
    go(w.data<__nv_bfloat16>());
  else
    go(w.defined() ? w.data<float>() : static_cast<const float*>(nullptr));
  DI_CUDA_CHECK(cudaGetLastError());
  return y;
}

}  // namespace deepinfer::cuda
