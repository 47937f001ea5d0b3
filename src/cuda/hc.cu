// CUDA hyper-connection kernels. Contracts in hc.cuh.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "cuda/common.cuh"
#include "cuda/device.h"
#include "cuda/hc.cuh"

namespace deepinfer::cuda {

namespace {

constexpr int kMaxMix = 32;  // (2 + hc) * hc for hc <= 4; hc_head uses hc rows
constexpr int kMaxHc = 8;

// fp32 exp as the CPU's std::exp(float) (glibc expf, correctly rounded but for rare ~0.5 ulp cases).
__device__ __forceinline__ float exp_f(float x) { return __double2float_rn(exp(static_cast<double>(x))); }
__device__ __forceinline__ float sigmoid_f(float x) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, exp_f(-x))); }

// The projections are split over the row's width so that one token still fills the GPU: block (s, t)
// sums columns [s * chunk, (s + 1) * chunk) of token t into FP64 partials (fn[m] . x for each mix m,
// then x . x), reduced inside the block in a fixed order (warp shuffles, then warps in order); the
// finishing kernel adds the partials in split order. The split depends only on the width, so a row's
// result does not depend on the batch.
constexpr int kPartThreads = 128;
constexpr int64_t kPartChunk = 512;

__global__ void hc_partial_kernel(const float* stream, int64_t width, const float* fn, int M, int splits,
                                  double* part) {
  __shared__ double warp_sums[kPartThreads / 32][kMaxMix + 1];
  const int64_t t = blockIdx.y, s = blockIdx.x;
  const float* x = stream + t * width;
  const int64_t c0 = s * kPartChunk, c1 = min(width, c0 + kPartChunk);
  double ss = 0.0;
  double acc[kMaxMix];
#pragma unroll
  for (int m = 0; m < kMaxMix; ++m) acc[m] = 0.0;
  for (int64_t i = c0 + threadIdx.x; i < c1; i += blockDim.x) {
    const double xv = x[i];
    ss = __fma_rn(xv, xv, ss);  // the product is exact in FP64, so fma == the CPU's multiply-then-add
#pragma unroll
    for (int m = 0; m < kMaxMix; ++m)
      if (m < M) acc[m] = __fma_rn(static_cast<double>(fn[m * width + i]), xv, acc[m]);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int m = 0; m <= kMaxMix; ++m) {
    if (m < M || m == kMaxMix) {
      double v = m == kMaxMix ? ss : acc[m];
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0) warp_sums[warp][m] = v;
    }
  }
  __syncthreads();
  if (threadIdx.x <= kMaxMix && (static_cast<int>(threadIdx.x) < M || threadIdx.x == kMaxMix)) {
    double v = 0.0;
    for (int w = 0; w < kPartThreads / 32; ++w) v += warp_sums[w][threadIdx.x];
    part[(t * splits + s) * (kMaxMix + 1) + threadIdx.x] = v;
  }
}

// One block of kFinishThreads per token. Thread m (m < M, and thread kMaxMix for x . x) adds its
// column of partials in split order (the same FP64 adds as before, one column per thread instead of
// all columns in one thread). Then warp 0 finishes: mixes[m] = float(fn[m] . flat) *
// (1 / sqrt(float(ss / width) + norm_eps)); lane j < hc writes pre[j] (and post[j]); for comb, lane
// l < hc*hc owns c[l] (row l / hc, column l % hc) in a register and every row / column sum is formed
// by each lane of that row / column with shuffles, sequentially in the CPU's order (k ascending for
// a row, j ascending for a column), so each value sees exactly the CPU's fp32 operation sequence.
// mode 0: hc_mixes (writes pre, post, comb); mode 1: hc_head (writes pre only, M = hc).
constexpr int kFinishThreads = 64;

__global__ void __launch_bounds__(kFinishThreads)
    hc_finish_kernel(const double* part, int splits, int64_t width, int M, const float* scale, const float* base,
                     int hc, int sinkhorn_iters, float hc_eps, float norm_eps, int mode, float* pre, float* post,
                     float* comb) {
  __shared__ double sums[kMaxMix + 1];
  const int64_t t = blockIdx.x;
  const int tid = threadIdx.x;
  if (tid <= kMaxMix && (tid < M || tid == kMaxMix)) {
    const double* p = part + t * splits * (kMaxMix + 1) + tid;
    double v = 0.0;
#pragma unroll 8
    for (int s = 0; s < splits; ++s) v += p[static_cast<int64_t>(s) * (kMaxMix + 1)];
    sums[tid] = v;
  }
  __syncthreads();
  if (tid >= 32) return;
  const int lane = tid;
  const float r =
      __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(static_cast<float>(sums[kMaxMix] / static_cast<double>(width)), norm_eps)));
  if (lane < hc) {
    const float mix = __fmul_rn(static_cast<float>(sums[lane]), r);
    pre[t * hc + lane] = __fadd_rn(sigmoid_f(__fadd_rn(__fmul_rn(mix, scale[0]), base[lane])), hc_eps);
  }
  if (mode == 1) return;
  if (lane < hc) {
    const float mix = __fmul_rn(static_cast<float>(sums[hc + lane]), r);
    post[t * hc + lane] = __fmul_rn(2.0f, sigmoid_f(__fadd_rn(__fmul_rn(mix, scale[1]), base[hc + lane])));
  }
  // Lanes past hc*hc mirror lane 0 (their values are never written); all lanes take part in the shuffles.
  const int l = lane < hc * hc ? lane : 0;
  const int row0 = (l / hc) * hc, col = l % hc;
  constexpr unsigned kAll = 0xffffffffu;
  float c = __fadd_rn(__fmul_rn(__fmul_rn(static_cast<float>(sums[2 * hc + l]), r), scale[2]), base[2 * hc + l]);
  // Row softmax + eps, then column normalisation, then (iters - 1) row / column rounds (the CPU's order).
  {
    float mx = -INFINITY;
    for (int k = 0; k < hc; ++k) mx = fmaxf(mx, __shfl_sync(kAll, c, row0 + k));
    const float e = exp_f(__fsub_rn(c, mx));
    float sum = 0.0f;
    for (int k = 0; k < hc; ++k) sum = __fadd_rn(sum, __shfl_sync(kAll, e, row0 + k));
    c = __fadd_rn(__fdiv_rn(e, sum), hc_eps);
  }
  const int rounds = sinkhorn_iters > 1 ? sinkhorn_iters : 1;  // the CPU always normalises columns once
  for (int it = 0; it < rounds; ++it) {
    if (it > 0) {
      float sum = 0.0f;
      for (int k = 0; k < hc; ++k) sum = __fadd_rn(sum, __shfl_sync(kAll, c, row0 + k));
      c = __fdiv_rn(c, __fadd_rn(sum, hc_eps));
    }
    float sum = 0.0f;
    for (int j = 0; j < hc; ++j) sum = __fadd_rn(sum, __shfl_sync(kAll, c, j * hc + col));
    c = __fdiv_rn(c, __fadd_rn(sum, hc_eps));
  }
  if (lane < hc * hc) comb[t * hc * hc + lane] = c;
}

__global__ void hc_collapse_kernel(const float* stream, const float* pre, int64_t T, int hc, int64_t dim, bool round,
                                   float* out) {
  const int64_t total = T * dim;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = e / dim, d = e % dim;
    float acc = 0.0f;
    for (int j = 0; j < hc; ++j) acc = __fadd_rn(acc, __fmul_rn(pre[t * hc + j], stream[(t * hc + j) * dim + d]));
    out[e] = round ? round_to_bf16(acc) : acc;
  }
}

__global__ void hc_expand_kernel(const float* y, const float* stream, const float* post, const float* comb, int64_t T,
                                 int hc, int64_t dim, bool round, float* out) {
  const int64_t total = T * hc * dim;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t d = e % dim, k = (e / dim) % hc, t = e / (dim * hc);
    float acc = 0.0f;
    for (int j = 0; j < hc; ++j)
      acc = __fadd_rn(acc, __fmul_rn(comb[(t * hc + j) * hc + k], stream[(t * hc + j) * dim + d]));
    const float v = __fadd_rn(__fmul_rn(post[t * hc + k], y[t * dim + d]), acc);
    out[e] = round ? round_to_bf16(v) : v;
  }
}

void check_dev(const Tensor& t, const char* op, const char* what) {
  DI_CHECK(t.defined() && t.device() == Device::kCUDA && t.dtype() == DType::kF32 && t.is_contiguous(),
           "{}: {} must be a contiguous float32 CUDA tensor, got {}", op, what,
           t.defined() ? t.describe() : std::string("undefined"));
}

unsigned grid_for(int64_t total, int threads) {
  return static_cast<unsigned>(std::min<int64_t>((total + threads - 1) / threads, int64_t{1} << 20));
}

void launch_project(const Tensor& stream, const Tensor& fn, const Tensor& scale, const Tensor& base, int64_t M,
                    int64_t hc, int64_t iters, float hc_eps, float norm_eps, int mode, float* pre, float* post,
                    float* comb, const char* op) {
  check_dev(stream, op, "stream");
  check_dev(fn, op, "fn");
  check_dev(scale, op, "scale");
  check_dev(base, op, "base");
  const int64_t T = stream.size(0), width = T > 0 ? stream.numel() / T : 0;
  DI_CHECK(M <= kMaxMix && hc <= kMaxHc, "{}: {} mixes / hc {} exceed the kernel's {} / {}", op, M, hc, kMaxMix,
           kMaxHc);
  DI_CHECK(fn.dim() == 2 && fn.size(0) == M && fn.size(1) == width, "{}: fn {} does not match stream rows of {}", op,
           fn.describe(), width);
  DI_CHECK(base.numel() >= M && scale.numel() >= (mode == 1 ? 1 : 3), "{}: base {} / scale {} too small", op,
           base.describe(), scale.describe());
  if (T == 0) return;
  DI_CHECK(T < (int64_t{1} << 31) && width > 0, "{}: too many rows or an empty row", op);
  const int splits = static_cast<int>((width + kPartChunk - 1) / kPartChunk);
  constexpr int64_t kRowsPerLaunch = 65535;  // grid.y limit
  const int64_t rows = std::min(T, kRowsPerLaunch);
  Tensor part = Tensor::empty({rows * splits * (kMaxMix + 1) * 2}, DType::kF32, Device::kCUDA);  // doubles
  double* p = static_cast<double*>(part.raw());
  for (int64_t t0 = 0; t0 < T; t0 += kRowsPerLaunch) {
    const int64_t n = std::min(kRowsPerLaunch, T - t0);
    hc_partial_kernel<<<dim3(static_cast<unsigned>(splits), static_cast<unsigned>(n)), kPartThreads>>>(
        stream.data<float>() + t0 * width, width, fn.data<float>(), static_cast<int>(M), splits, p);
    DI_CUDA_CHECK(cudaGetLastError());
    hc_finish_kernel<<<static_cast<unsigned>(n), kFinishThreads>>>(
        p, splits, width, static_cast<int>(M), scale.data<float>(), base.data<float>(), static_cast<int>(hc),
        static_cast<int>(iters), hc_eps, norm_eps, mode, pre + t0 * hc, post ? post + t0 * hc : nullptr,
        comb ? comb + t0 * hc * hc : nullptr);
    DI_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace

ops::HcMix hc_mixes(const Tensor& stream, const Tensor& fn, const Tensor& scale, const Tensor& base, int64_t hc,
                    int64_t sinkhorn_iters, float hc_eps, float norm_eps) {
  const int64_t T = stream.size(0), M = (2 + hc) * hc;
  ops::HcMix out{Tensor::empty({T, hc}, DType::kF32, Device::kCUDA), Tensor::empty({T, hc}, DType::kF32, Device::kCUDA),
                 Tensor::empty({T, hc, hc}, DType::kF32, Device::kCUDA)};
  launch_project(stream, fn, scale, base, M, hc, sinkhorn_iters, hc_eps, norm_eps, 0, out.pre.data<float>(),
                 out.post.data<float>(), out.comb.data<float>(), "cuda::hc_mixes");
  return out;
}

Tensor hc_collapse(const Tensor& stream, const Tensor& pre, bool round) {
  const char* op = "cuda::hc_collapse";
  check_dev(stream, op, "stream");
  check_dev(pre, op, "pre");
  DI_CHECK(stream.dim() == 3 && pre.numel() == stream.size(0) * stream.size(1), "{}: stream {} pre {}", op,
           stream.describe(), pre.describe());
  const int64_t T = stream.size(0), hc = stream.size(1), dim = stream.size(2);
  Tensor y = Tensor::empty({T, dim}, DType::kF32, Device::kCUDA);
  if (T * dim == 0) return y;
  hc_collapse_kernel<<<grid_for(T * dim, 256), 256>>>(stream.data<float>(), pre.data<float>(), T, static_cast<int>(hc),
                                                      dim, round, y.data<float>());
  DI_CUDA_CHECK(cudaGetLastError());
  return y;
}

Tensor hc_expand(const Tensor& y, const Tensor& stream, const Tensor& post, const Tensor& comb, bool round) {
  const char* op = "cuda::hc_expand";
  check_dev(y, op, "y");
  check_dev(stream, op, "stream");
  check_dev(post, op, "post");
  check_dev(comb, op, "comb");
  DI_CHECK(stream.dim() == 3, "{}: stream {}", op, stream.describe());
  const int64_t T = stream.size(0), hc = stream.size(1), dim = stream.size(2);
  DI_CHECK(y.numel() == T * dim && post.numel() == T * hc && comb.numel() == T * hc * hc,
           "{}: y {} post {} comb {} vs stream {}", op, y.describe(), post.describe(), comb.describe(),
           stream.describe());
  Tensor out = Tensor::empty({T, hc, dim}, DType::kF32, Device::kCUDA);
  if (out.numel() == 0) return out;
  hc_expand_kernel<<<grid_for(out.numel(), 256), 256>>>(y.data<float>(), stream.data<float>(), post.data<float>(),
                                                        comb.data<float>(), T, static_cast<int>(hc), dim, round,
                                                        out.data<float>());
  DI_CUDA_CHECK(cudaGetLastError());
  return out;
}

Tensor hc_head(const Tensor& stream, const Tensor& fn, const Tensor& scale, const Tensor& base, float hc_eps,
               float norm_eps, bool round) {
  DI_CHECK(stream.dim() == 3, "cuda::hc_head: stream {}", stream.describe());
  const int64_t T = stream.size(0), hc = stream.size(1);
  Tensor pre = Tensor::empty({T, hc}, DType::kF32, Device::kCUDA);
  launch_project(stream, fn, scale, base, hc, hc, 0, hc_eps, norm_eps, 1, pre.data<float>(), nullptr, nullptr,
                 "cuda::hc_head");
  return hc_collapse(stream, pre, round);
}

}  // namespace deepinfer::cuda
