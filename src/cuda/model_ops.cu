// CUDA kernels of the model-level ops. Contracts in model_ops.cuh (and ops.h).
#include <cuda_runtime.h>

#include <string>

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
  float* ks = smem;                          // [d][kPad]: the block's keys, transposed
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
  float* s = sh;        // [E] scores
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
          id = tid_i64 ? static_cast<const int64_t*>(tid2eid)[tok * k + j] : static_cast<const int32_t*>(tid2eid)[tok * k + j];
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
  int dev = 0, optin = 0;
  DI_CUDA_CHECK(cudaGetDevice(&dev));
  DI_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  cudaFuncAttributes attr{};
  DI_CUDA_CHECK(cudaFuncGetAttributes(&attr, index_scores_kernel));
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
    DI_CHECK(tid2eid.device() == Device::kCUDA && tid2eid.is_contiguous() && tid2eid.dim() == 2 && tid2eid.size(1) == k &&
                 (tid2eid.dtype() == DType::kI32 || tid2eid.dtype() == DType::kI64),
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
  embedding_kernel<<<grid_for(out.numel(), 256), 256>>>(table.raw(), table.dtype() == DType::kBF16,
                                                        ids.data<int32_t>(), T, static_cast<int>(copies), dim,
                                                        out.data<float>());
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

}  // namespace deepinfer::cuda
