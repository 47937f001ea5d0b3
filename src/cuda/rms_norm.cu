// CUDA RMSNorm. Contract in rms_norm.cuh.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>
#include <type_traits>

#include "core/env.h"
#include "cuda/common.cuh"
#include "cuda/device.h"
#include "cuda/fp_decode.cuh"
#include "cuda/hc.cuh"
#include "cuda/rms_norm.cuh"

namespace deepinfer::cuda {

namespace {

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
    if (w != nullptr) v = norm_weight(w, c) * v;
    yr[c] = round ? round_to_bf16(v) : v;
  }
}

// The same op for rows of at most kNormVecThreads * kNormVecMax float4 (8,192 columns, cols % 4 == 0, 16-byte
// aligned rows): the row is loaded once into registers (every load of a thread issued before the first use) and
// normalised there (norm_row_apply in rms_norm.cuh), so a decode row costs one load latency instead of a chain of
// them (the loop above waits on each strided load in turn and reads x twice). Same arithmetic per value; the FP64
// sum of squares is grouped differently (any grouping of these exact squares almost always rounds to the same fp32
// variance).

// v (norm_row_apply's layout for nt = blockDim.x) normalised with wv (norm_weights_vec's) and written to yr.
__device__ __forceinline__ void norm_row_vec_store(float4 (&v)[kNormVecMax], const float4 (&wv)[kNormVecMax], int n4,
                                                   int64_t cols, bool has_w, float eps, bool round, float4* yr) {
  const int tid = static_cast<int>(threadIdx.x), nt = static_cast<int>(blockDim.x);
  norm_row_apply(v, wv, cols, has_w, eps, round);
#pragma unroll
  for (int k = 0; k < kNormVecMax; ++k) {
    const int c = tid + k * nt;
    if (c < n4) yr[c] = v[k];
  }
}

// early_w: the weight is loaded before griddepcontrol.wait (norm_weights_vec; DEEPINFER_CUDA_NORM_PREFETCH).
template <typename W>
__global__ void __launch_bounds__(kNormVecThreads)
    rms_norm_vec_kernel(const float* x, int64_t row_stride, int64_t cols, const W* w, float eps, bool round,
                        bool early_w, float* y) {
  const int n4 = static_cast<int>(cols / 4), tid = static_cast<int>(threadIdx.x), nt = static_cast<int>(blockDim.x);
  float4 wv[kNormVecMax];
  if (early_w) norm_weights_vec(wv, n4, nt, w);
  pdl_wait();
  pdl_launch_dependents();
  const float4* xr = reinterpret_cast<const float4*>(x + blockIdx.x * row_stride);
  float4 v[kNormVecMax];
#pragma unroll
  for (int k = 0; k < kNormVecMax; ++k) {
    const int c = tid + k * nt;
    v[k] = c < n4 ? xr[c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  if (!early_w) norm_weights_vec(wv, n4, nt, w);
  norm_row_vec_store(v, wv, n4, cols, w != nullptr, eps, round, reinterpret_cast<float4*>(y + blockIdx.x * cols));
}

// hc_collapse then rms_norm of one token per block (dim % 4 == 0, dim <= 8192, 16-byte aligned): the
// collapse of each column exactly as hc_collapse_kernel (acc = 0; acc += pre_j * h_j for j ascending;
// rounded when `round`), kept in registers for the norm: one launch and no round trip of the row. Every
// load of a thread is issued before the first use (HC > 0: hc known at compile time; 0: any hc <= 8).
template <int HC, typename W>
__global__ void __launch_bounds__(kNormVecThreads)
    hc_collapse_norm_kernel(const float* stream, const float* pre, int hc_rt, int64_t dim, const W* w, float eps,
                            bool round, bool early_w, float* y) {
  const int n4 = static_cast<int>(dim / 4), tid = static_cast<int>(threadIdx.x), nt = static_cast<int>(blockDim.x);
  float4 wv[kNormVecMax];
  if (early_w) norm_weights_vec(wv, n4, nt, w);
  pdl_wait();
  pdl_launch_dependents();
  constexpr int kH = HC > 0 ? HC : 8;
  const int hc = HC > 0 ? HC : hc_rt;
  const int64_t t = blockIdx.x;
  const float4* s = reinterpret_cast<const float4*>(stream + t * hc * dim);
  float p[kH];
#pragma unroll
  for (int j = 0; j < kH; ++j) p[j] = j < hc ? pre[t * hc + j] : 0.0f;
  float4 h[kH][kNormVecMax];
#pragma unroll
  for (int j = 0; j < kH; ++j)
#pragma unroll
    for (int k = 0; k < kNormVecMax; ++k) {
      const int c = tid + k * nt;
      h[j][k] = j < hc && c < n4 ? s[j * n4 + c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  float4 v[kNormVecMax];
#pragma unroll
  for (int k = 0; k < kNormVecMax; ++k) {
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
  if (!early_w) norm_weights_vec(wv, n4, nt, w);
  norm_row_vec_store(v, wv, n4, dim, w != nullptr, eps, round, reinterpret_cast<float4*>(y + t * dim));
}

}  // namespace

void check_norm_weight(const Tensor& w, int64_t cols, const char* op) {
  if (!w.defined()) return;
  DI_CHECK(w.device() == Device::kCUDA, "{}: weight must be on CUDA, got {}", op, w.describe());
  DI_CHECK(w.dtype() == DType::kF32 || w.dtype() == DType::kBF16, "{}: weight must be float32 or bfloat16, got {}", op,
           w.describe());
  DI_CHECK(w.dim() == 1 && w.size(0) == cols && w.is_contiguous(), "{}: weight {} does not match {} columns", op,
           w.describe(), cols);
}

bool norm_vec_fits(const float* data, int64_t cols, int64_t row_stride, const Tensor& w) {
  return cols % 4 == 0 && row_stride % 4 == 0 && cols <= 4 * kNormVecThreads * kNormVecMax &&
         reinterpret_cast<uintptr_t>(data) % 16 == 0 &&
         (!w.defined() || w.dtype() != DType::kF32 || reinterpret_cast<uintptr_t>(w.raw()) % 16 == 0);
}

int norm_vec_threads(int64_t cols) { return threads_for(cols / 4, kNormVecThreads); }  // one float4 each, <= 8

bool norm_prefetch() {
  static const bool on = env_switch("DEEPINFER_CUDA_NORM_PREFETCH", 1) != 0;
  return on;
}

Tensor rms_norm(const Tensor& x, const Tensor& w, float eps, bool round) {
  const Rows r = as_rows(x, "cuda::rms_norm");
  check_norm_weight(w, r.cols, "cuda::rms_norm");
  Tensor y = Tensor::empty(x.shape(), DType::kF32, Device::kCUDA);
  if (r.rows == 0 || r.cols == 0) return y;
  DI_CHECK(r.rows < (int64_t{1} << 31), "cuda::rms_norm: {} rows is too many for one launch", r.rows);
  const auto grid = static_cast<unsigned>(r.rows);
  float* out = y.data<float>();
  if (norm_vec_fits(r.data, r.cols, r.row_stride, w)) {
    const int threads = norm_vec_threads(r.cols);
    if (w.defined() && w.dtype() == DType::kBF16) {
      launch_pdl(rms_norm_vec_kernel<__nv_bfloat16>, grid, threads, 0, nullptr, r.data, r.row_stride, r.cols,
                 w.data<__nv_bfloat16>(), eps, round, norm_prefetch(), out);
    } else {
      const float* wf = w.defined() ? w.data<float>() : nullptr;
      launch_pdl(rms_norm_vec_kernel<float>, grid, threads, 0, nullptr, r.data, r.row_stride, r.cols, wf, eps, round,
                 norm_prefetch(), out);
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
  side_join_if_reads(pre.raw(), pre.nbytes());  // pre may come from hc_mixes on the side stream (V4: just now)
  const bool fused = hc <= 8 && norm_vec_fits(stream.data<float>(), dim, dim, w);
  if (!fused || T == 0) return rms_norm(hc_collapse(stream, pre, round), w, eps, round);
  check_norm_weight(w, dim, op);
  DI_CHECK(T < (int64_t{1} << 31), "{}: {} rows is too many for one launch", op, T);
  Tensor y = Tensor::empty({T, dim}, DType::kF32, Device::kCUDA);
  const int threads = norm_vec_threads(dim);
  const auto grid = static_cast<unsigned>(T);
  auto go = [&](auto* wp) {
    using W = std::remove_const_t<std::remove_pointer_t<decltype(wp)>>;
    auto kernel = hc == 4 ? hc_collapse_norm_kernel<4, W> : hc_collapse_norm_kernel<0, W>;
    launch_pdl(kernel, grid, threads, 0, nullptr, stream.data<float>(), pre.data<float>(), static_cast<int>(hc), dim,
               wp, eps, round, norm_prefetch(), y.data<float>());
  };
  if (w.defined() && w.dtype() == DType::kBF16)
    go(w.data<__nv_bfloat16>());
  else
    go(w.defined() ? w.data<float>() : static_cast<const float*>(nullptr));
  DI_CUDA_CHECK(cudaGetLastError());
  return y;
}

}  // namespace deepinfer::cuda
