// CUDA hyper-connection kernels. Contracts in hc.cuh.
#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>
#include <string>

#include "cuda/common.cuh"
#include "cuda/device.h"
#include "cuda/fp_decode.cuh"
#include "cuda/hc.cuh"

namespace deepinfer::cuda {

namespace {

constexpr int kMaxMix = 32;  // (2 + hc) * hc for hc <= 4; hc_head uses hc rows
constexpr int kMaxHc = 8;

// fp32 exp as the CPU's std::exp(float) (glibc expf, correctly rounded but for rare ~0.5 ulp cases).
__device__ __forceinline__ float exp_f(float x) { return __double2float_rn(exp(static_cast<double>(x))); }
__device__ __forceinline__ float sigmoid_f(float x) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, exp_f(-x))); }

// hc_mixes / hc_head in one launch. Block (s, t) sums columns [s * kMixChunk, (s + 1) * kMixChunk) of
// token t (thread i: columns i, i + kMixThreads, ...) into FP64 partials (fn[m] . x for each mix m, then
// x . x; each product is exact in FP64), reduced inside the block in a fixed order, and writes them to
// `part`. The block that finishes last for its token (a per-token arrival counter, reset by that block
// for the next launch) adds the partials in split order and finishes in warp 0. The split depends only on
// the width, and the addition order never on which block arrives last, so a row's result depends neither
// on the batch nor on scheduling. At decode the kernel is latency-bound (ncu: ~12 cycles per issued
// instruction, one or two blocks per SM): what counts is dependent instructions per warp, hence one column
// per thread (every load issued at once) in blocks of 160 columns, so that the models' width (4 x 5120) is
// 128 blocks: one wave on an H200's 132 SMs (with 160 blocks of 128 the second wave doubled the time before
// the last block could finish), and the recursive-halving warp reduction (31 shuffles for 32 values
// instead of 5 per value).
constexpr int kMixThreads = 160;
constexpr int kMixCols = 1;                            // columns per thread
constexpr int64_t kMixChunk = kMixThreads * kMixCols;  // columns per block
constexpr int kSumGroups = 4;                          // threads per mix adding the partials
constexpr int kMixTokens = 8;  // tokens per block (hc_mix_kernel's TB) for calls of kMixManyRows rows or more
constexpr int kMixManyRows = 16;
static_assert(kSumGroups * (kMaxMix + 1) <= kMixThreads, "the last block's adders");

// Sums v[j] (j < 32) over the warp; lane j returns the total of v[j]. Level o: the lanes with bit o
// keep the upper half of their current window and send the lower half to their partner, the others the
// reverse, so the window halves each level and lane j ends with index j. The order is fixed.
template <int O>
__device__ __forceinline__ void transpose_sum_level(double (&v)[32], int lane) {
  const bool upper = (lane & O) != 0;
#pragma unroll
  for (int i = 0; i < O; ++i) {
    const double send = upper ? v[i] : v[i + O];
    const double keep = upper ? v[i + O] : v[i];
    v[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
  }
}
__device__ __forceinline__ double warp_transpose_sum(double (&v)[32]) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  transpose_sum_level<16>(v, lane);
  transpose_sum_level<8>(v, lane);
  transpose_sum_level<4>(v, lane);
  transpose_sum_level<2>(v, lane);
  transpose_sum_level<1>(v, lane);
  return v[0];
}

// Adds 1 to a block's arrival counter with acquire-release semantics at GPU scope (one thread, after a block
// barrier): it publishes the writes the block made before the barrier, and the last block to arrive sees every
// other block's. Cheaper than a full fence around a relaxed atomic.
__device__ __forceinline__ int arrive_acq_rel(int* counter) {
  int prev;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;\n" : "=r"(prev) : "l"(counter) : "memory");
  return prev;
}

// The scale of every mix: 1 / sqrt(float(ss / width) + norm_eps), from the FP64 sum of squares.
__device__ __forceinline__ float mix_scale(double ss, int64_t width, float norm_eps) {
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(static_cast<float>(ss / static_cast<double>(width)), norm_eps)));
}

// The finish (warp 0 of the last block) from the FP64 sums: mixes[m] = float(fn[m] . flat) * mix_scale;
// lane j < hc writes pre[j], and post[j] unless post is null (hc_head: M = hc). comb is hc_comb_kernel's,
// on the side stream, from the sums the kernel stores. HC > 0: hc known at compile time; 0: hc_rt.
template <int HC>
__device__ void hc_finish_warp(const double* sums, int64_t width, const float* scale, const float* base, int hc_rt,
                               float hc_eps, float norm_eps, float* pre, float* post) {
  const int hc = HC > 0 ? HC : hc_rt;
  const int lane = static_cast<int>(threadIdx.x);
  const float r = mix_scale(sums[kMaxMix], width, norm_eps);
  if (lane < hc) {
    const float mix = __fmul_rn(static_cast<float>(sums[lane]), r);
    pre[lane] = __fadd_rn(sigmoid_f(__fadd_rn(__fmul_rn(mix, scale[0]), base[lane])), hc_eps);
  }
  if (post != nullptr && lane < hc) {
    const float mix = __fmul_rn(static_cast<float>(sums[hc + lane]), r);
    post[lane] = __fmul_rn(2.0f, sigmoid_f(__fadd_rn(__fmul_rn(mix, scale[1]), base[hc + lane])));
  }
}

// comb from the FP64 sums (r: mix_scale): lane l < hc*hc owns c[l] (row l / hc, column l % hc) in a
// register and every row / column sum is formed by each lane of that row / column with shuffles, sequentially
// in the CPU's order (k ascending for a row, j ascending for a column), so each value sees exactly the CPU's
// fp32 operation sequence.
template <int HC>
__device__ void hc_comb_warp(const double* sums, float r, const float* scale, const float* base, int hc_rt,
                             int sinkhorn_iters, float hc_eps, float* comb) {
  const int hc = HC > 0 ? HC : hc_rt;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  // Lanes past hc*hc mirror lane 0 (their values are never written); all lanes take part in the shuffles.
  const int l = lane < hc * hc ? lane : 0;
  const int row0 = (l / hc) * hc, col = l % hc;
  constexpr unsigned kAll = 0xffffffffu;
  float c = __fadd_rn(__fmul_rn(__fmul_rn(static_cast<float>(sums[2 * hc + l]), r), scale[2]), base[2 * hc + l]);
  // Row softmax + eps, then column normalisation, then (iters - 1) row / column rounds (the CPU's order).
  {
    float mx = -INFINITY;
#pragma unroll
    for (int k = 0; k < hc; ++k) mx = fmaxf(mx, __shfl_sync(kAll, c, row0 + k));
    const float e = exp_f(__fsub_rn(c, mx));
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < hc; ++k) sum = __fadd_rn(sum, __shfl_sync(kAll, e, row0 + k));
    c = __fadd_rn(__fdiv_rn(e, sum), hc_eps);
  }
  const int rounds = sinkhorn_iters > 1 ? sinkhorn_iters : 1;  // the CPU always normalises columns once
  for (int it = 0; it < rounds; ++it) {
    if (it > 0) {
      float sum = 0.0f;
#pragma unroll
      for (int k = 0; k < hc; ++k) sum = __fadd_rn(sum, __shfl_sync(kAll, c, row0 + k));
      c = __fdiv_rn(c, __fadd_rn(sum, hc_eps));
    }
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < hc; ++j) sum = __fadd_rn(sum, __shfl_sync(kAll, c, j * hc + col));
    c = __fdiv_rn(c, __fadd_rn(sum, hc_eps));
  }
  if (lane < hc * hc) comb[lane] = c;
}

// TB: tokens per block (blockIdx.y * TB.. of the launch's rows). Each token's partials, their reduction and its finish
// are what a block of one token computes (the same operations in the same order), so TB never changes a bit; what it
// changes is how often fn's columns are loaded and the block's fixed costs paid. At one token a block is latency-bound
// (above); at many (a decode batch of 256, a prefill chunk) one token per block ran 128 blocks per token at three
// blocks per SM (the fn and FP64 accumulator registers), ~220 us a call at 256 tokens.
template <int HC, int TB>
__global__ void __launch_bounds__(kMixThreads)
    hc_mix_kernel(const float* stream, int64_t width, const float* fn, int64_t rows, int M, int splits, double* part,
                  int* counters, const float* scale, const float* base, int hc_rt, float hc_eps, float norm_eps,
                  float* pre, float* post, double* sums_out) {
  pdl_launch_dependents();
  static_assert(kMaxMix == 32, "warp_transpose_sum reduces 32 mixes");
  __shared__ double warp_sums[TB][kMixThreads / 32][kMaxMix + 1];
  __shared__ double group_sums[kSumGroups][kMaxMix + 1];
  __shared__ double sums[kMaxMix + 1];
  __shared__ int is_last[TB];
  const int hc = HC > 0 ? HC : hc_rt;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * TB, s = blockIdx.x;
  const int nt = TB == 1 ? 1 : static_cast<int>(rows - t0 < TB ? rows - t0 : TB);  // this block's tokens
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  // The projection's columns first: fn is a weight (not written by the previous kernel), so its loads (from HBM:
  // the layer's other weights evicted it) overlap that kernel's tail under programmatic dependent launch.
  bool in[kMixCols];
  float fv[kMixCols][kMaxMix];
#pragma unroll
  for (int q = 0; q < kMixCols; ++q) {
    const int64_t i = s * kMixChunk + q * kMixThreads + tid;
    in[q] = i < width;
    const float* f = fn + i;  // mix m's value: f[m * width]
#pragma unroll
    for (int m = 0; m < kMaxMix; ++m) fv[q][m] = m < M && in[q] ? f[m * width] : 0.0f;
  }
  pdl_wait();
  double xv[TB][kMixCols];  // every token's columns loaded at once
#pragma unroll
  for (int u = 0; u < TB; ++u)
#pragma unroll
    for (int q = 0; q < kMixCols; ++q)
      xv[u][q] =
          u < nt && in[q] ? static_cast<double>(stream[(t0 + u) * width + s * kMixChunk + q * kMixThreads + tid]) : 0.0;
#pragma unroll
  for (int u = 0; u < TB; ++u) {
    if (u >= nt) break;  // block-uniform
    double acc[kMaxMix];
#pragma unroll
    for (int q = 0; q < kMixCols; ++q) {
#pragma unroll
      for (int m = 0; m < kMaxMix; ++m) {  // one add per m
        if (q == 0) acc[m] = 0.0;
        if (m < M && in[q]) acc[m] += static_cast<double>(fv[q][m]) * xv[u][q];
      }
    }
    double ss = 0.0;
#pragma unroll
    for (int q = 0; q < kMixCols; ++q) ss += xv[u][q] * xv[u][q];  // exact squares, as the CPU's
    const double mine = warp_transpose_sum(acc);                   // lane m: this warp's sum of mix m
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    warp_sums[u][warp][lane] = mine;
    if (lane == 0) warp_sums[u][warp][kMaxMix] = ss;
  }
  __syncthreads();
  if (tid <= kMaxMix && (tid < M || tid == kMaxMix)) {
    for (int u = 0; u < nt; ++u) {
      double v = 0.0;
      for (int w = 0; w < kMixThreads / 32; ++w) v += warp_sums[u][w][tid];
      part[((t0 + u) * splits + s) * (kMaxMix + 1) + tid] = v;
    }
  }
  // Publish the partials, then count this block in for each token; the last block of a token sees every partial.
  __syncthreads();
  if (tid < nt) {
    const int prev = arrive_acq_rel(counters + t0 + tid);
    is_last[tid] = prev == splits - 1;
    if (is_last[tid]) counters[t0 + tid] = 0;  // every block of this token has arrived: ready for the next launch
  }
  __syncthreads();
  for (int u = 0; u < nt; ++u) {
    if (!is_last[u]) continue;  // block-uniform
    const int64_t t = t0 + u;
    // Thread (g, m) adds splits g, g + kSumGroups, ... of mix m in order (kBatch loads in flight at once: one
    // L2 round trip for the models' widths); then mix m's groups in order.
    const double* tok_part = part + t * splits * (kMaxMix + 1);
    __syncthreads();  // the previous token's finish has read sums
    if (tid < kSumGroups * (kMaxMix + 1)) {
      const int g = tid / (kMaxMix + 1), m = tid % (kMaxMix + 1);
      double v = 0.0;
      if (m < M || m == kMaxMix) {
        constexpr int kBatch = 32;
        for (int q0 = g; q0 < splits; q0 += kBatch * kSumGroups) {
          double pv[kBatch];
#pragma unroll
          for (int i = 0; i < kBatch; ++i) {
            const int q = q0 + i * kSumGroups;
            pv[i] = q < splits ? __ldcg(tok_part + static_cast<int64_t>(q) * (kMaxMix + 1) + m) : 0.0;
          }
#pragma unroll
          for (int i = 0; i < kBatch; ++i)
            if (q0 + i * kSumGroups < splits) v += pv[i];
        }
      }
      group_sums[g][m] = v;
    }
    __syncthreads();
    if (tid <= kMaxMix) {
      double v = 0.0;
      for (int g = 0; g < kSumGroups; ++g) v += group_sums[g][tid];
      sums[tid] = v;
    }
    __syncthreads();
    if (sums_out != nullptr && tid <= kMaxMix) sums_out[t * (kMaxMix + 1) + tid] = sums[tid];  // for hc_comb_kernel
    if (warp == 0)
      hc_finish_warp<HC>(sums, width, scale, base, hc, hc_eps, norm_eps, pre + t * hc, post ? post + t * hc : nullptr);
  }
}

// comb of token blockIdx.x from the sums hc_mix_kernel left, on the side stream: one warp.
template <int HC>
__global__ void __launch_bounds__(32)
    hc_comb_kernel(const double* sums, int64_t width, const float* scale, const float* base, int hc_rt,
                   int sinkhorn_iters, float hc_eps, float norm_eps, float* comb) {
  pdl_wait();
  pdl_launch_dependents();
  const int hc = HC > 0 ? HC : hc_rt;
  const int64_t t = blockIdx.x;
  const double* st = sums + t * (kMaxMix + 1);
  hc_comb_warp<HC>(st, mix_scale(st[kMaxMix], width, norm_eps), scale, base, hc, sinkhorn_iters, hc_eps,
                   comb + t * hc * hc);
}

__global__ void hc_collapse_kernel(const float* stream, const float* pre, int64_t T, int hc, int64_t dim, bool round,
                                   float* out) {
  pdl_wait();
  pdl_launch_dependents();
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
  pdl_wait();
  pdl_launch_dependents();
  const int64_t total = T * hc * dim;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t d = e % dim, k = (e / dim) % hc, t = e / (dim * hc);
    out[e] = hc_expand_value(y[t * dim + d], stream, post, comb, t, hc, k, dim, d, round);
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

// hc_mix_kernel's per-token arrival counters: zero between launches (each token's last block resets
// its own). Grown, never shrunk; growing synchronises the device (the old buffer may still be in use).
int* arrival_counters(int64_t rows) {
  static std::mutex mu;
  static int* buf = nullptr;
  static int64_t cap = 0;
  std::lock_guard<std::mutex> lock(mu);
  if (rows > cap) {
    flush_deferred();
    if (buf != nullptr) {
      DI_CUDA_CHECK(cudaDeviceSynchronize());
      DI_CUDA_CHECK(cudaFree(buf));
    }
    const int64_t n = std::max<int64_t>(rows, 4096);
    DI_CUDA_CHECK(cudaMalloc(&buf, static_cast<size_t>(n) * sizeof(int)));
    DI_CUDA_CHECK(cudaMemset(buf, 0, static_cast<size_t>(n) * sizeof(int)));
    cap = n;
    bump_graph_epoch();  // captured launches name the old counters
  }
  return buf;
}

// Launches hc_mix_kernel on `cs`; returns its scratch (the per-block partials), which must live until the kernel ran.
Tensor launch_project(const Tensor& stream, const Tensor& fn, const Tensor& scale, const Tensor& base, int64_t M,
                      int64_t hc, float hc_eps, float norm_eps, float* pre, float* post, double* sums_out,
                      const char* op, cudaStream_t cs) {
  check_dev(stream, op, "stream");
  check_dev(fn, op, "fn");
  check_dev(scale, op, "scale");
  check_dev(base, op, "base");
  const int64_t T = stream.size(0), width = T > 0 ? stream.numel() / T : 0;
  DI_CHECK(M <= kMaxMix && hc <= kMaxHc, "{}: {} mixes / hc {} exceed the kernel's {} / {}", op, M, hc, kMaxMix,
           kMaxHc);
  DI_CHECK(fn.dim() == 2 && fn.size(0) == M && fn.size(1) == width, "{}: fn {} does not match stream rows of {}", op,
           fn.describe(), width);
  DI_CHECK(base.numel() >= M && scale.numel() >= (post ? 3 : 1), "{}: base {} / scale {} too small", op,
           base.describe(), scale.describe());
  if (T == 0) return Tensor();
  DI_CHECK(T < (int64_t{1} << 31) && width > 0, "{}: too many rows or an empty row", op);
  const int splits = static_cast<int>((width + kMixChunk - 1) / kMixChunk);
  constexpr int64_t kRowsPerLaunch = 65535;  // grid.y limit
  const int64_t rows = std::min(T, kRowsPerLaunch);
  Tensor part = Tensor::empty({rows * splits * (kMaxMix + 1) * 2}, DType::kF32, Device::kCUDA);  // doubles
  double* p = static_cast<double*>(part.raw());
  int* counters = arrival_counters(rows);
  // Tokens per block: one at decode's few rows (the blocks of a token then spread over the SMs), kMixTokens from
  // kMixManyRows up. Either gives the same bits.
  const int tb = T >= kMixManyRows ? kMixTokens : 1;
  for (int64_t t0 = 0; t0 < T; t0 += kRowsPerLaunch) {
    const int64_t n = std::min(kRowsPerLaunch, T - t0);
    const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>((n + tb - 1) / tb));
    auto kernel = tb == 1 ? (hc == 4 ? hc_mix_kernel<4, 1> : hc_mix_kernel<0, 1>)
                          : (hc == 4 ? hc_mix_kernel<4, kMixTokens> : hc_mix_kernel<0, kMixTokens>);
    launch_pdl(kernel, grid, kMixThreads, 0, cs, stream.data<float>() + t0 * width, width, fn.data<float>(), n,
               static_cast<int>(M), splits, p, counters, scale.data<float>(), base.data<float>(), static_cast<int>(hc),
               hc_eps, norm_eps, pre + t0 * hc, post ? post + t0 * hc : nullptr,
               sums_out ? sums_out + t0 * (kMaxMix + 1) : nullptr);
    DI_CUDA_CHECK(cudaGetLastError());
  }
  return part;
}

}  // namespace

ops::HcMix hc_mixes(const Tensor& stream, const Tensor& fn, const Tensor& scale, const Tensor& base, int64_t hc,
                    int64_t sinkhorn_iters, float hc_eps, float norm_eps) {
  const int64_t T = stream.size(0), M = (2 + hc) * hc;
  // The whole mix runs on the side stream: no consumer needs it before the sublayer's input is formed, and in V4.1
  // none before the sublayer's end (its input takes the previous mix's pre), so the mix (~9 us at batch 1, a
  // latency-bound reduction) overlaps the default stream's work. pre, post, comb and the FP64 sums the Sinkhorn
  // starts from share one buffer, the pending bytes; the consumers join (hc_expand always, hc_collapse_norm /
  // hc_collapse / gather_rows when they read it).
  const int64_t pre_floats = T * hc, comb_floats = (T * hc * hc + 1) / 2 * 2, sums_floats = 2 * T * (kMaxMix + 1);
  const int64_t head = (2 * pre_floats + comb_floats + 1) / 2 * 2;  // doubles start 8-byte aligned
  Tensor buf = Tensor::empty({head + sums_floats}, DType::kF32, Device::kCUDA);
  ops::HcMix out{buf.slice(0, 0, pre_floats).view({T, hc}), buf.slice(0, pre_floats, 2 * pre_floats).view({T, hc}),
                 buf.slice(0, 2 * pre_floats, 2 * pre_floats + T * hc * hc).view({T, hc, hc})};
  double* sums = reinterpret_cast<double*>(buf.data<float>() + head);
  if (T == 0) return out;
  cudaStream_t side = side_fork();
  Tensor part = launch_project(stream, fn, scale, base, M, hc, hc_eps, norm_eps, out.pre.data<float>(),
                               out.post.data<float>(), sums, "cuda::hc_mixes", side);
  // The Sinkhorn (~20 dependent rounds in one warp) after it, on the same stream.
  auto kernel = hc == 4 ? hc_comb_kernel<4> : hc_comb_kernel<0>;
  launch_pdl(kernel, static_cast<unsigned>(T), 32, 0, side, sums, stream.numel() / T, scale.data<float>(),
             base.data<float>(), static_cast<int>(hc), static_cast<int>(sinkhorn_iters), hc_eps, norm_eps,
             out.comb.data<float>());
  DI_CUDA_CHECK(cudaGetLastError());
  side_pending(buf.raw(), buf.nbytes(), {stream, fn, scale, base, part});
  return out;
}

Tensor hc_collapse(const Tensor& stream, const Tensor& pre, bool round) {
  const char* op = "cuda::hc_collapse";
  check_dev(stream, op, "stream");
  check_dev(pre, op, "pre");
  side_join_if_reads(pre.raw(), pre.nbytes());  // pre may come from hc_mixes on the side stream
  DI_CHECK(stream.dim() == 3 && pre.numel() == stream.size(0) * stream.size(1), "{}: stream {} pre {}", op,
           stream.describe(), pre.describe());
  const int64_t T = stream.size(0), hc = stream.size(1), dim = stream.size(2);
  Tensor y = Tensor::empty({T, dim}, DType::kF32, Device::kCUDA);
  if (T * dim == 0) return y;
  launch_pdl(hc_collapse_kernel, grid_for(T * dim, 256), 256, 0, nullptr, stream.data<float>(), pre.data<float>(), T,
             static_cast<int>(hc), dim, round, y.data<float>());
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
  side_join();  // comb may come from hc_mixes' side stream
  launch_pdl(hc_expand_kernel, grid_for(out.numel(), 256), 256, 0, nullptr, y.data<float>(), stream.data<float>(),
             post.data<float>(), comb.data<float>(), T, static_cast<int>(hc), dim, round, out.data<float>());
  DI_CUDA_CHECK(cudaGetLastError());
  return out;
}

Tensor hc_head(const Tensor& stream, const Tensor& fn, const Tensor& scale, const Tensor& base, float hc_eps,
               float norm_eps, bool round) {
  DI_CHECK(stream.dim() == 3, "cuda::hc_head: stream {}", stream.describe());
  const int64_t T = stream.size(0), hc = stream.size(1);
  Tensor pre = Tensor::empty({T, hc}, DType::kF32, Device::kCUDA);
  side_join();  // hc_mix_kernel's arrival counters are shared with the side stream's mixes
  launch_project(stream, fn, scale, base, hc, hc, hc_eps, norm_eps, pre.data<float>(), nullptr, nullptr,
                 "cuda::hc_head", nullptr);
  return hc_collapse(stream, pre, round);
}

}  // namespace deepinfer::cuda
