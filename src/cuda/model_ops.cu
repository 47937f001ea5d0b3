// CUDA kernels of the model-level ops. Contracts in model_ops.cuh (and ops.h).
#include <cuda_runtime.h>

#include <string>
#include <utility>
#include <vector>

#include "cuda/common.cuh"
#include "cuda/device.h"
#include "cuda/model_ops.cuh"

namespace deepinfer::cuda {

namespace {

std::string desc(const Tensor& t) { return t.defined() ? t.describe() : std::string("undefined"); }

void check_f32(const Tensor& t, const char* op, const char* name) {
  DI_CHECK(t.defined() && t.device() == Device::kCUDA && t.dtype() == DType::kF32 && t.is_contiguous(),
           "{}: {} must be a contiguous float32 CUDA tensor, got {}", op, name, desc(t));
}

void check_ids(const Tensor& t, int64_t n, const char* op, const char* name) {
  DI_CHECK(t.defined() && t.device() == Device::kCUDA && t.dtype() == DType::kI32 && t.dim() == 1 &&
               t.is_contiguous() && t.size(0) == n,
           "{}: {} must be int32 [{}] on CUDA, got {}", op, name, n, desc(t));
}

unsigned grid_for(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

// fp32 exp / log1p as the CPU's std::exp(float) / std::log1p(float), up to glibc's rare last-ulp cases.
__device__ __forceinline__ float exp_f(float x) { return __double2float_rn(exp(static_cast<double>(x))); }
__device__ __forceinline__ float log1p_f(float x) { return __double2float_rn(log1p(static_cast<double>(x))); }

// ---- index_scores ----------------------------------------------------------------------------------
constexpr int kKeys = 128;   // keys per block, one per thread
constexpr int kQueries = 8;  // queries per block
constexpr int kPad = kKeys + 1;

__global__ void __launch_bounds__(kKeys)
    index_scores_kernel(const float* q, const float* keys, const float* w, const int32_t* counts, int64_t start_pos,
                        int64_t ratio, int T, int N, int nh, int d, bool round, float* out) {
  extern __shared__ float smem[];
  float* ks = smem;                                   // [d][kPad]: the block's keys, transposed
  float* qs = smem + static_cast<int64_t>(d) * kPad;  // [kQueries][d]: one head of each query
  __shared__ int vis[kQueries];
  const int tid = threadIdx.x;
  const int j0 = blockIdx.x * kKeys, t0 = blockIdx.y * kQueries;
  const int nq = min(kQueries, T - t0);
  if (tid < kQueries) {
    int v = 0;
    if (tid < nq) {
      const int64_t c = counts ? counts[t0 + tid] : (start_pos + t0 + tid + 1) / ratio;
      v = static_cast<int>(c < 0 ? 0 : (c > N ? N : c));
    }
    vis[tid] = v;
  }
  __syncthreads();
  int maxvis = 0;
  for (int i = 0; i < nq; ++i) maxvis = max(maxvis, vis[i]);
  const int j = j0 + tid;
  if (j0 >= maxvis) {  // no query of the block sees any of these keys
    if (j < N)
      for (int i = 0; i < nq; ++i) out[static_cast<int64_t>(t0 + i) * N + j] = -INFINITY;
    return;
  }
  const int nk = min(kKeys, maxvis - j0);
  for (int idx = tid; idx < kKeys * d; idx += kKeys) {
    const int jj = idx / d, i = idx - jj * d;
    ks[i * kPad + jj] = jj < nk ? keys[static_cast<int64_t>(j0 + jj) * d + i] : 0.0f;
  }
  double total[kQueries];
#pragma unroll
  for (int i = 0; i < kQueries; ++i) total[i] = 0.0;
  for (int h = 0; h < nh; ++h) {
    __syncthreads();  // ks written / qs of the previous head consumed
    for (int idx = tid; idx < nq * d; idx += kKeys) {
      const int qi = idx / d, i = idx - qi * d;
      qs[qi * d + i] = q[(static_cast<int64_t>(t0 + qi) * nh + h) * d + i];
    }
    __syncthreads();
    float dot[kQueries];
#pragma unroll
    for (int qi = 0; qi < kQueries; ++qi) dot[qi] = 0.0f;
    for (int i = 0; i < d; ++i) {
      const float kv = ks[i * kPad + tid];
#pragma unroll
      for (int qi = 0; qi < kQueries; ++qi)
        if (qi < nq) dot[qi] = __fadd_rn(dot[qi], __fmul_rn(qs[qi * d + i], kv));
    }
#pragma unroll
    for (int qi = 0; qi < kQueries; ++qi) {
      if (qi >= nq) continue;
      const float dv = round ? round_to_bf16(dot[qi]) : dot[qi];
      if (dv > 0) {
        const float p = __fmul_rn(dv, w[static_cast<int64_t>(t0 + qi) * nh + h]);
        total[qi] += static_cast<double>(round ? round_to_bf16(p) : p);
      }
    }
  }
  if (j >= N) return;
#pragma unroll
  for (int qi = 0; qi < kQueries; ++qi) {
    if (qi >= nq) continue;
    const float s = __double2float_rn(total[qi]);
    out[static_cast<int64_t>(t0 + qi) * N + j] = j < vis[qi] ? (round ? round_to_bf16(s) : s) : -INFINITY;
  }
}

// ---- moe_route --------------------------------------------------------------------------------------
constexpr int kRouteThreads = 256;

__global__ void __launch_bounds__(kRouteThreads)
    moe_route_kernel(const float* logits, int E, int k, int func, float temp, const float* bias, const void* tid2eid,
                     bool tid_i64, int64_t vocab, const int32_t* tokens, bool normalize, float norm_eps,
                     float route_scale, int32_t* ids, float* weights) {
  extern __shared__ float sh[];
  float* s = sh;           // [E] scores
  float* biased = sh + E;  // [E] selection keys
  __shared__ float red;
  const int64_t t = blockIdx.x;
  const float* lr = logits + t * E;
  const int tid = threadIdx.x;
  for (int e = tid; e < E; e += kRouteThreads) {
    const float l = temp != 1.0f ? __fdiv_rn(lr[e], temp) : lr[e];
    float v;
    if (func == 0) {
      v = __fsqrt_rn(l > 20.0f ? l : log1p_f(exp_f(l)));
    } else if (func == 1) {
      v = __fdiv_rn(1.0f, __fadd_rn(1.0f, exp_f(-l)));
    } else {
      v = l;
    }
    s[e] = v;
  }
  __syncthreads();
  if (func == 2) {  // softmax: max, exp, sequential sum (the CPU's order), divide
    if (tid == 0) {
      float m = -INFINITY;
      for (int e = 0; e < E; ++e) m = s[e] > m ? s[e] : m;  // std::max(m, s): NaN-free scores
      red = m;
    }
    __syncthreads();
    for (int e = tid; e < E; e += kRouteThreads) s[e] = exp_f(__fsub_rn(s[e], red));
    __syncthreads();
    if (tid == 0) {
      float sum = 0.0f;
      for (int e = 0; e < E; ++e) sum = __fadd_rn(sum, s[e]);
      red = sum;
    }
    __syncthreads();
    for (int e = tid; e < E; e += kRouteThreads) s[e] = __fdiv_rn(s[e], red);
    __syncthreads();
  }
  int32_t* ti = ids + t * k;
  float* tw = weights + t * k;
  if (tid2eid) {
    if (tid == 0) {
      const int64_t tok = tokens[t];
      const bool ok = tok >= 0 && tok < vocab;
      float sum = 0.0f;
      for (int j = 0; j < k; ++j) {
        int64_t id = -1;
        if (ok)
          id = tid_i64 ? static_cast<const int64_t*>(tid2eid)[tok * k + j]
                       : static_cast<const int32_t*>(tid2eid)[tok * k + j];
        if (id < 0 || id >= E) id = -1;
        ti[j] = static_cast<int32_t>(id);
        tw[j] = id < 0 ? 0.0f : s[id];
        sum = __fadd_rn(sum, tw[j]);
      }
      const float denom = __fadd_rn(sum, norm_eps);
      for (int j = 0; j < k; ++j) {
        float v = tw[j];
        if (normalize) v = __fdiv_rn(v, denom);
        tw[j] = __fmul_rn(v, route_scale);
      }
    }
    return;
  }
  for (int e = tid; e < E; e += kRouteThreads) biased[e] = bias ? __fadd_rn(s[e], bias[e]) : s[e];
  __syncthreads();
  if (tid != 0) return;
  // k passes of (score desc, index asc) argmax over the not yet chosen, -inf never chosen: the
  // order of the CPU's partial_sort. Chosen entries are marked by setting them to -inf.
  float sum = 0.0f;
  int picked = 0;
  for (int j = 0; j < k; ++j) {
    int best = -1;
    float bv = -INFINITY;
    for (int e = 0; e < E; ++e) {
      const float v = biased[e];
      if (v == -INFINITY) continue;
      if (best < 0 || v > bv) {
        best = e;
        bv = v;
      }
    }
    ti[j] = best;
    if (best < 0) {
      tw[j] = 0.0f;
      continue;
    }
    biased[best] = -INFINITY;
    ++picked;
    tw[j] = s[best];
    sum = __fadd_rn(sum, tw[j]);
  }
  (void)picked;
  const float denom = __fadd_rn(sum, norm_eps);
  for (int j = 0; j < k; ++j) {
    float v = tw[j];
    if (normalize) v = __fdiv_rn(v, denom);
    tw[j] = __fmul_rn(v, route_scale);
  }
}

// ---- swiglu, embedding, gather_rows ------------------------------------------------------------------
__global__ void swiglu_kernel(const float* g, const float* u, const float* wts, float limit, bool round, int64_t T,
                              int64_t I, float* h) {
  const int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (n >= T * I) return;
  float gv = g[n], uv = u[n];
  if (limit > 0) {
    uv = uv < -limit ? -limit : uv;  // std::max(uv, -limit), NaN kept
    uv = limit < uv ? limit : uv;    // std::min(uv, limit)
    gv = limit < gv ? limit : gv;
  }
  const float silu = __fdiv_rn(gv, __fadd_rn(1.0f, exp_f(-gv)));
  float v = __fmul_rn(silu, uv);
  if (wts) v = __fmul_rn(wts[n / I], v);
  h[n] = round ? round_to_bf16(v) : v;
}

__global__ void embedding_kernel(const void* table, bool bf16, const int32_t* ids, int64_t T, int copies, int64_t dim,
                                 float* out) {
  const int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (n >= T * copies * dim) return;
  const int64_t d = n % dim, t = n / (copies * dim);
  const int64_t row = ids[t];
  out[n] = bf16 ? __uint_as_float(static_cast<uint32_t>(static_cast<const uint16_t*>(table)[row * dim + d]) << 16)
                : static_cast<const float*>(table)[row * dim + d];
}

__global__ void gather_rows_kernel(const float* x, const int32_t* rows, int64_t R, int64_t width, float* out) {
  const int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (n >= R * width) return;
  out[n] = x[static_cast<int64_t>(rows[n / width]) * width + n % width];
}

// ---- MoE dispatch and combine ------------------------------------------------------------------------
__global__ void moe_count_kernel(const int32_t* ids, int64_t P, int E, int32_t* counts) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= P) return;
  const int32_t e = ids[i];
  if (e >= 0 && e < E) atomicAdd(counts + e, 1);
}

// offsets[e] = sum of counts[0..e), offsets[E] = the total (one thread: E is a few hundred).
__global__ void moe_offsets_kernel(const int32_t* counts, int E, int32_t* offsets) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  int32_t run = 0;
  for (int e = 0; e < E; ++e) {
    offsets[e] = run;
    run += counts[e];
  }
  offsets[E] = run;
}

constexpr int kGroupThreads = 256;

// One block per expert: an ordered compaction of the (t, j) pairs routed to it, in ascending t*k + j.
__global__ void __launch_bounds__(kGroupThreads)
    moe_group_kernel(const int32_t* ids, const float* w, int64_t P, int k, const int32_t* offsets, int32_t* rows,
                     float* wout, int32_t* slots) {
  __shared__ int warp_count[kGroupThreads / 32];
  const int e = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int64_t base = offsets[e];
  for (int64_t c0 = 0; c0 < P; c0 += kGroupThreads) {
    const int64_t i = c0 + tid;
    const bool hit = i < P && ids[i] == e;
    const unsigned ballot = __ballot_sync(0xffffffffu, hit);
    if (lane == 0) warp_count[warp] = __popc(ballot);
    __syncthreads();
    int before = 0, total = 0;
    for (int wi = 0; wi < kGroupThreads / 32; ++wi) {
      before += wi < warp ? warp_count[wi] : 0;
      total += warp_count[wi];
    }
    if (hit) {
      const int64_t pos = base + before + __popc(ballot & ((1u << lane) - 1u));
      rows[pos] = static_cast<int32_t>(i / k);
      wout[pos] = w[i];
      slots[i] = static_cast<int32_t>(pos);
    }
    base += total;
    __syncthreads();  // warp_count consumed before the next chunk writes it
  }
}

constexpr int kCombineMaxK = 64;

// One thread per (token, column): the token's slots sorted ascending, then 0 + y[s1] + y[s2] + ... + shared.
__global__ void moe_combine_kernel(const float* y, const int32_t* slots, const float* shared, int k, int64_t dim,
                                   bool round, float* out) {
  const int64_t t = blockIdx.y;
  const int64_t d = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (d >= dim) return;
  int32_t s[kCombineMaxK];
  int n = 0;
  for (int j = 0; j < k; ++j) {
    const int32_t v = slots[t * k + j];
    if (v < 0) continue;
    int at = n++;
    while (at > 0 && s[at - 1] > v) {
      s[at] = s[at - 1];
      --at;
    }
    s[at] = v;
  }
  float acc = 0.0f;
  for (int i = 0; i < n; ++i) acc = __fadd_rn(acc, y[static_cast<int64_t>(s[i]) * dim + d]);
  const float v = __fadd_rn(acc, shared[t * dim + d]);
  out[t * dim + d] = round ? round_to_bf16(v) : v;
}

// ---- compressor pooling ----------------------------------------------------------------------------
// One thread per (group, channel): three passes over the group's rows (max, exp sum, weighted sum),
// each in the CPU's row order; exp recomputed identically in each pass.
__global__ void compress_pool_kernel(const float* kv, const float* score, const float* ape, int r, int64_t d, int64_t w,
                                     bool overlap, bool has_prev, int64_t lead, float* out) {
  const int64_t g = blockIdx.y;
  const int64_t ch = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (ch >= d) return;
  const int64_t base = lead + g * r;
  const bool prev = overlap && (g > 0 || has_prev);
  const int n = overlap ? 2 * r : r;
  // Row i of the pooled set: its buffer row and column (overlap: r previous rows at ch, then r at d + ch).
  auto at = [&](int i, int64_t& row, int64_t& col) {
    if (overlap && i < r) {
      row = base - r + i;
      col = ch;
    } else {
      row = base + (overlap ? i - r : i);
      col = overlap ? d + ch : ch;
    }
  };
  auto sc = [&](int i) -> float {
    if (overlap && i < r && !prev) return -INFINITY;
    int64_t row, col;
    at(i, row, col);
    const float s = score[row * w + col];
    return ape ? __fadd_rn(s, ape[(row % r) * w + col]) : s;
  };
  auto kvv = [&](int i) -> float {
    if (overlap && i < r && !prev) return 0.0f;
    int64_t row, col;
    at(i, row, col);
    return kv[row * w + col];
  };
  float m = -INFINITY;
  for (int i = 0; i < n; ++i) m = fmaxf(m, sc(i));
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) sum = __fadd_rn(sum, exp_f(__fsub_rn(sc(i), m)));
  float acc = 0.0f;
  for (int i = 0; i < n; ++i) acc = __fadd_rn(acc, __fmul_rn(kvv(i), __fdiv_rn(exp_f(__fsub_rn(sc(i), m)), sum)));
  out[g * d + ch] = acc;
}

// ---- renorm_heads: one thread per head, the CPU's sequential FP64 sum (bit for bit) ----------------
__global__ void renorm_heads_kernel(float* q, int64_t n, int64_t hd, float eps, bool round) {
  const int64_t h = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (h >= n) return;
  float* a = q + h * hd;
  auto rd = [&](float v) { return round ? round_to_bf16(v) : v; };
  double ss = 0;
  for (int64_t i = 0; i < hd; ++i) ss = __dadd_rn(ss, static_cast<double>(rd(__fmul_rn(a[i], a[i]))));
  const float mean = rd(__double2float_rn(__ddiv_rn(ss, static_cast<double>(hd))));
  const float r = rd(__fdiv_rn(1.0f, __fsqrt_rn(rd(__fadd_rn(mean, eps)))));
  for (int64_t i = 0; i < hd; ++i) a[i] = rd(__fmul_rn(a[i], r));
}

}  // namespace

Tensor index_scores(const Tensor& q, const Tensor& keys, const Tensor& w, const ops::KeyVisibility& vis, bool round) {
  const char* op = "cuda::index_scores";
  check_f32(q, op, "q");
  check_f32(keys, op, "keys");
  check_f32(w, op, "w");
  DI_CHECK(keys.dim() == 2 && w.dim() == 2 && q.dim() >= 2, "{}: expected keys [N, d], w [T, heads], got {}, {}", op,
           keys.describe(), w.describe());
  const int64_t T = q.size(0), N = keys.size(0), d = keys.size(1), nh = w.size(1);
  DI_CHECK(w.size(0) == T && q.numel() == T * nh * d, "{}: q {} does not match w {} and keys {}", op, q.describe(),
           w.describe(), keys.describe());
  DI_CHECK(vis.counts.defined() || vis.ratio > 0, "{}: ratio {} must be positive", op, vis.ratio);
  if (vis.counts.defined()) check_ids(vis.counts, T, op, "counts");
  DI_CHECK(N < (int64_t{1} << 31) && T < (int64_t{1} << 24) * kQueries, "{}: [{}, {}] is too large", op, T, N);
  const size_t smem = (static_cast<size_t>(d) * kPad + static_cast<size_t>(kQueries) * d) * sizeof(float);
  // The device's limits, queried once (each query costs a driver round trip).
  static const std::pair<int, cudaFuncAttributes> limits = [] {
    int dev = 0, v = 0;
    DI_CUDA_CHECK(cudaGetDevice(&dev));
    DI_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    cudaFuncAttributes a{};
    DI_CUDA_CHECK(cudaFuncGetAttributes(&a, index_scores_kernel));
    return std::make_pair(v, a);
  }();
  const int optin = limits.first;
  const cudaFuncAttributes& attr = limits.second;
  DI_CHECK(smem + attr.sharedSizeBytes <= static_cast<size_t>(optin),
           "{}: key width {} needs {} bytes of shared memory (device: {})", op, d, smem + attr.sharedSizeBytes, optin);
  // The dynamic shared memory limit is raised to what this launch needs (at most optin - static).
  static size_t configured = 48 * 1024 - 64;
  if (smem > configured) {
    DI_CUDA_CHECK(cudaFuncSetAttribute(index_scores_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(optin - attr.sharedSizeBytes)));
    configured = optin - attr.sharedSizeBytes;
  }
  Tensor out = Tensor::empty({T, N}, DType::kF32, Device::kCUDA);
  if (T == 0 || N == 0) return out;
  const dim3 grid(grid_for(N, kKeys), static_cast<unsigned>((T + kQueries - 1) / kQueries));
  index_scores_kernel<<<grid, kKeys, smem>>>(q.data<float>(), keys.data<float>(), w.data<float>(),
                                             vis.counts.defined() ? vis.counts.data<int32_t>() : nullptr, vis.start_pos,
                                             vis.ratio, static_cast<int>(T), static_cast<int>(N), static_cast<int>(nh),
                                             static_cast<int>(d), round, out.data<float>());
  DI_CUDA_CHECK(cudaGetLastError());
  return out;
}

ops::Routing moe_route(const Tensor& logits, const Tensor& bias, const Tensor& tid2eid, const Tensor& tokens, int64_t k,
                       const ops::RouteOpts& o) {
  const char* op = "cuda::moe_route";
  check_f32(logits, op, "logits");
  DI_CHECK(logits.dim() == 2, "{}: logits must be [T, E], got {}", op, logits.describe());
  const int64_t T = logits.size(0), E = logits.size(1);
  DI_CHECK(k >= 1 && k <= E && E <= 16384, "{}: k = {} for {} experts", op, k, E);
  const bool hash = tid2eid.defined();
  if (bias.defined()) {
    check_f32(bias, op, "bias");
    DI_CHECK(bias.numel() == E, "{}: bias {} for {} experts", op, bias.describe(), E);
  }
  if (hash) {
    DI_CHECK(tid2eid.device() == Device::kCUDA && tid2eid.is_contiguous() && tid2eid.dim() == 2 &&
                 tid2eid.size(1) == k && (tid2eid.dtype() == DType::kI32 || tid2eid.dtype() == DType::kI64),
             "{}: tid2eid must be int32/int64 [vocab, {}] on CUDA, got {}", op, k, tid2eid.describe());
    check_ids(tokens, T, op, "tokens");
  }
  ops::Routing r{Tensor::empty({T, k}, DType::kI32, Device::kCUDA), Tensor::empty({T, k}, DType::kF32, Device::kCUDA)};
  if (T == 0) return r;
  const int func = o.func == ops::ScoreFunc::kSqrtSoftplus ? 0 : o.func == ops::ScoreFunc::kSigmoid ? 1 : 2;
  moe_route_kernel<<<static_cast<unsigned>(T), kRouteThreads, 2 * E * sizeof(float)>>>(
      logits.data<float>(), static_cast<int>(E), static_cast<int>(k), func, o.temp,
      bias.defined() ? bias.data<float>() : nullptr, hash ? tid2eid.raw() : nullptr,
      hash && tid2eid.dtype() == DType::kI64, hash ? tid2eid.size(0) : 0, hash ? tokens.data<int32_t>() : nullptr,
      o.normalize, o.norm_eps, o.route_scale, r.ids.data<int32_t>(), r.weights.data<float>());
  DI_CUDA_CHECK(cudaGetLastError());
  return r;
}

Tensor swiglu(const Tensor& g, const Tensor& u, const Tensor& weights, float limit, bool round) {
  const char* op = "cuda::swiglu";
  check_f32(g, op, "g");
  check_f32(u, op, "u");
  DI_CHECK(g.dim() == 2 && g.shape() == u.shape(), "{}: g {} and u {} must be the same [T, I]", op, g.describe(),
           u.describe());
  const int64_t T = g.size(0), I = g.size(1);
  if (weights.defined()) {
    check_f32(weights, op, "weights");
    DI_CHECK(weights.numel() == T, "{}: weights {} for {} rows", op, weights.describe(), T);
  }
  Tensor h = Tensor::empty({T, I}, DType::kF32, Device::kCUDA);
  if (T * I == 0) return h;
  swiglu_kernel<<<grid_for(T * I, 256), 256>>>(g.data<float>(), u.data<float>(),
                                               weights.defined() ? weights.data<float>() : nullptr, limit, round, T, I,
                                               h.data<float>());
  DI_CUDA_CHECK(cudaGetLastError());
  return h;
}

Tensor embedding(const Tensor& table, const Tensor& ids, int64_t copies) {
  const char* op = "cuda::embedding";
  DI_CHECK(table.defined() && table.device() == Device::kCUDA && table.is_contiguous() && table.dim() == 2 &&
               (table.dtype() == DType::kBF16 || table.dtype() == DType::kF32),
           "{}: table must be a contiguous BF16/F32 [V, dim] CUDA tensor, got {}", op, desc(table));
  DI_CHECK(copies >= 1 && copies < 1024, "{}: copies = {}", op, copies);
  DI_CHECK(ids.defined() && ids.dim() == 1, "{}: ids must be int32 [T], got {}", op, desc(ids));
  const int64_t T = ids.size(0), dim = table.size(1);
  check_ids(ids, T, op, "ids");
  Tensor out = Tensor::empty({T, copies, dim}, DType::kF32, Device::kCUDA);
  if (out.numel() == 0) return out;
  embedding_kernel<<<grid_for(out.numel(), 256), 256>>>(table.raw(), table.dtype() == DType::kBF16, ids.data<int32_t>(),
                                                        T, static_cast<int>(copies), dim, out.data<float>());
  DI_CUDA_CHECK(cudaGetLastError());
  return out;
}

Tensor gather_rows(const Tensor& x, const Tensor& rows) {
  const char* op = "cuda::gather_rows";
  check_f32(x, op, "x");
  DI_CHECK(x.dim() >= 1 && rows.defined() && rows.dim() == 1, "{}: expected x [N, ...] and rows [R], got {}, {}", op,
           x.describe(), desc(rows));
  const int64_t R = rows.size(0), N = x.size(0), width = N == 0 ? 0 : x.numel() / N;
  check_ids(rows, R, op, "rows");
  Shape shape = x.shape();
  shape[0] = R;
  Tensor out = Tensor::empty(shape, DType::kF32, Device::kCUDA);
  if (out.numel() == 0) return out;
  gather_rows_kernel<<<grid_for(R * width, 256), 256>>>(x.data<float>(), rows.data<int32_t>(), R, width,
                                                        out.data<float>());
  DI_CUDA_CHECK(cudaGetLastError());
  return out;
}

ops::MoeGroups moe_group(const Tensor& ids, const Tensor& weights, int64_t n_experts) {
  const char* op = "cuda::moe_group";
  DI_CHECK(ids.defined() && ids.device() == Device::kCUDA && ids.dtype() == DType::kI32 && ids.dim() == 2 &&
               ids.is_contiguous(),
           "{}: ids must be int32 [T, k] on CUDA, got {}", op, desc(ids));
  check_f32(weights, op, "weights");
  DI_CHECK(weights.shape() == ids.shape(), "{}: weights {} for ids {}", op, weights.describe(), ids.describe());
  DI_CHECK(n_experts >= 1 && n_experts < (int64_t{1} << 24), "{}: {} experts", op, n_experts);
  const int64_t T = ids.size(0), k = ids.size(1), P = T * k, E = n_experts;
  DI_CHECK(P < (int64_t{1} << 31), "{}: {} pairs is too many", op, P);
  ops::MoeGroups g;
  Tensor rows = Tensor::empty({P}, DType::kI32, Device::kCUDA);
  Tensor wout = Tensor::empty({P}, DType::kF32, Device::kCUDA);
  g.slots = Tensor::empty({T, k}, DType::kI32, Device::kCUDA);
  Tensor counts = Tensor::empty({2 * E + 1}, DType::kI32, Device::kCUDA);  // counts [E], offsets [E + 1]
  int32_t* cp = counts.data<int32_t>();
  int32_t* op_ = cp + E;
  DI_CUDA_CHECK(cudaMemsetAsync(cp, 0, E * sizeof(int32_t)));
  if (P > 0) {
    DI_CUDA_CHECK(cudaMemsetAsync(g.slots.raw(), 0xff, P * sizeof(int32_t)));  // -1: an id outside [0, E)
    moe_count_kernel<<<grid_for(P, 256), 256>>>(ids.data<int32_t>(), P, static_cast<int>(E), cp);
    DI_CUDA_CHECK(cudaGetLastError());
  }
  moe_offsets_kernel<<<1, 1>>>(cp, static_cast<int>(E), op_);
  DI_CUDA_CHECK(cudaGetLastError());
  if (P > 0) {
    moe_group_kernel<<<static_cast<unsigned>(E), kGroupThreads>>>(ids.data<int32_t>(), weights.data<float>(), P,
                                                                  static_cast<int>(k), op_, rows.data<int32_t>(),
                                                                  wout.data<float>(), g.slots.data<int32_t>());
    DI_CUDA_CHECK(cudaGetLastError());
  }
  std::vector<int32_t> off(E + 1);
  DI_CUDA_CHECK(cudaMemcpy(off.data(), op_, (E + 1) * sizeof(int32_t), cudaMemcpyDeviceToHost));
  g.offsets.assign(off.begin(), off.end());
  const int64_t R = g.offsets[E];
  g.rows = R == P ? rows : rows.slice(0, 0, R);
  g.weights = R == P ? wout : wout.slice(0, 0, R);
  return g;
}

Tensor moe_combine(const Tensor& expert_out, const Tensor& slots, const Tensor& shared, bool round) {
  const char* op = "cuda::moe_combine";
  check_f32(expert_out, op, "expert_out");
  check_f32(shared, op, "shared");
  DI_CHECK(slots.defined() && slots.device() == Device::kCUDA && slots.dtype() == DType::kI32 && slots.dim() == 2 &&
               slots.is_contiguous(),
           "{}: slots must be int32 [T, k] on CUDA, got {}", op, desc(slots));
  DI_CHECK(shared.dim() == 2 && shared.size(0) == slots.size(0) && expert_out.dim() == 2 &&
               expert_out.size(1) == shared.size(1),
           "{}: expert_out {}, slots {}, shared {} do not match", op, expert_out.describe(), slots.describe(),
           shared.describe());
  const int64_t T = shared.size(0), dim = shared.size(1), k = slots.size(1);
  DI_CHECK(k <= kCombineMaxK && T < (int64_t{1} << 31), "{}: k = {} (at most {}), T = {}", op, k, kCombineMaxK, T);
  Tensor out = Tensor::empty({T, dim}, DType::kF32, Device::kCUDA);
  if (T * dim == 0) return out;
  const dim3 grid(grid_for(dim, 256), static_cast<unsigned>(T));
  moe_combine_kernel<<<grid, 256>>>(expert_out.data<float>(), slots.data<int32_t>(), shared.data<float>(),
                                    static_cast<int>(k), dim, round, out.data<float>());
  DI_CUDA_CHECK(cudaGetLastError());
  return out;
}

void copy_into(const Tensor& dst, const Tensor& src) {
  DI_CHECK(dst.defined() && src.defined() && dst.device() == Device::kCUDA && src.device() == Device::kCUDA &&
               dst.is_contiguous() && src.is_contiguous() && dst.shape() == src.shape() && dst.dtype() == src.dtype(),
           "cuda::copy_into: dst {} and src {} must be contiguous CUDA tensors of one shape and dtype", desc(dst),
           desc(src));
  if (src.nbytes() > 0) DI_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDeviceToDevice));
}

Tensor compress_pool(const Tensor& kv, const Tensor& score, const Tensor& ape, int64_t ratio, int64_t d, bool overlap,
                     bool has_prev) {
  const char* op = "cuda::compress_pool";
  check_f32(kv, op, "kv");
  check_f32(score, op, "score");
  const int64_t r = ratio, lead = overlap ? r : 0;
  DI_CHECK(kv.dim() == 2 && score.shape() == kv.shape() && r >= 1 && r <= 4096 && d >= 1 &&
               kv.size(1) == (overlap ? 2 * d : d) && kv.size(0) >= lead && (kv.size(0) - lead) % r == 0,
           "{}: kv {} / score {} are not [lead + G*{}, {}]", op, kv.describe(), score.describe(), r,
           overlap ? 2 * d : d);
  const int64_t w = kv.size(1), G = (kv.size(0) - lead) / r;
  if (ape.defined()) {
    check_f32(ape, op, "ape");
    DI_CHECK(ape.numel() == r * w, "{}: ape {} for [{}, {}]", op, ape.describe(), r, w);
  }
  DI_CHECK(G < (int64_t{1} << 31), "{}: {} groups", op, G);
  Tensor out = Tensor::empty({G, d}, DType::kF32, Device::kCUDA);
  if (G == 0) return out;
  const dim3 grid(grid_for(d, 128), static_cast<unsigned>(G));
  compress_pool_kernel<<<grid, 128>>>(kv.data<float>(), score.data<float>(),
                                      ape.defined() ? ape.data<float>() : nullptr, static_cast<int>(r), d, w, overlap,
                                      has_prev, lead, out.data<float>());
  DI_CUDA_CHECK(cudaGetLastError());
  return out;
}

namespace {
__global__ void scale_kernel(float* x, int64_t n, float s, bool round) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float v = x[i] * s;
  x[i] = round ? round_to_bf16(v) : v;
}
}  // namespace

void scale(Tensor& x, float s, bool round) {
  check_f32(x, "cuda::scale", "x");
  const int64_t n = x.numel();
  if (n == 0) return;
  scale_kernel<<<grid_for(n, 256), 256>>>(x.data<float>(), n, s, round);
  DI_CUDA_CHECK(cudaGetLastError());
}

void renorm_heads(Tensor& q, int64_t head_dim, float eps, bool round) {
  check_f32(q, "cuda::renorm_heads", "q");
  DI_CHECK(head_dim >= 1 && q.numel() % head_dim == 0, "cuda::renorm_heads: {} is not whole heads of {}", q.describe(),
           head_dim);
  const int64_t n = q.numel() / head_dim;
  if (n == 0) return;
  renorm_heads_kernel<<<grid_for(n, 128), 128>>>(q.data<float>(), n, head_dim, eps, round);
  DI_CUDA_CHECK(cudaGetLastError());
}

}  // namespace deepinfer::cuda
