// CUDA kernels of the model-level ops. Contracts in model_ops.cuh (and ops.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "core/env.h"
#include "cuda/common.cuh"
#include "cuda/device.h"
#include "cuda/fp_decode.cuh"
#include "cuda/hc.cuh"
#include "cuda/model_ops.cuh"
#include "cuda/quant.cuh"
#include "cuda/topk.cuh"

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

// ---- a table's rows, contiguous or as runs (ops::RowSegment) ------------------------------------------------------
// What index_scores' decode kernel and gather_listed read: row j of a table of `width` floats a row. TableRows: one
// contiguous table. ParamRuns / UploadedRuns: runs laid end to end (a window ring's runs, a chunk's new rows, a paged
// store's 64-row pages), their table in the launch's parameters (up to kParamRuns entries, each a run or a whole paged
// store whose page addresses are in device memory) or uploaded (first rows [n + 1], then the source pointers [n]: every
// store as its pages' runs); row j is found by a binary search over the first rows (the same on every lane).
struct TableRows {
  const float* base;
  __device__ const float* row(int64_t j, int width) const { return base + j * width; }
};

template <class Runs>
__device__ __forceinline__ int run_of(const Runs& r, int64_t j) {
  int lo = 0, hi = r.n - 1;  // the last run whose first row is <= j
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (r.start(mid) <= j)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

constexpr int kParamRuns = 16;  // entries whose table travels in the launch's parameters

struct ParamRuns {
  const float* src[kParamRuns];       // a run's first row
  const uint64_t* pages[kParamRuns];  // or a paged store's page addresses (device memory), null for a run
  int64_t first[kParamRuns + 1];
  int shift[kParamRuns];  // a paged store's log2(rows a page)
  int n;
  __device__ int64_t start(int i) const { return first[i]; }
  __device__ const float* row(int64_t j, int width) const {
    const int i = run_of(*this, j);
    const int64_t r = j - first[i];
    if (pages[i] == nullptr) return src[i] + r * width;
    const float* page = reinterpret_cast<const float*>(static_cast<uintptr_t>(pages[i][r >> shift[i]]));
    return page + (r & ((int64_t{1} << shift[i]) - 1)) * width;
  }
};
struct UploadedRuns {
  const int64_t* first;
  int n;
  __device__ int64_t start(int i) const { return first[i]; }
  __device__ const float* row(int64_t j, int width) const {
    const int i = run_of(*this, j);
    return reinterpret_cast<const float*>(static_cast<uintptr_t>(first[n + 1 + i])) + (j - first[i]) * width;
  }
};

// The non-empty entries of `segments` as one of the two run tables (the uploaded one's device copy kept in `keep`
// until the launch is queued), and whether every row starts 16-byte aligned; rows: their total. A paged store stays
// one parameter entry when its page addresses are on the device and the entries fit, else it becomes its pages' runs.
struct RunTables {
  bool params = true;
  bool aligned = true;
  int64_t rows = 0;
  ParamRuns param{};
  UploadedRuns uploaded{};
  Tensor keep;
  bool in_params() const { return params; }
};
RunTables run_tables(const std::vector<ops::RowSegment>& segments, int64_t width) {
  RunTables t;
  const size_t row_bytes = static_cast<size_t>(width) * sizeof(float);
  std::vector<ops::RowSegment> entries;
  bool native = true;
  for (const ops::RowSegment& r : segments) {
    if (r.rows <= 0) continue;
    entries.push_back(r);
    native = native && (!r.paged() || r.device_pages != nullptr);
  }
  t.params = native && entries.size() <= static_cast<size_t>(kParamRuns);
  std::vector<ops::RowSegment> runs = ops::flat_runs(entries, "cuda run table");
  for (const ops::RowSegment& r : runs) {  // every run and page: the side stream's pending writes joined, alignment
    side_join_if_reads(r.src, static_cast<size_t>(r.rows) * row_bytes);  // as copy_rows
    t.aligned = t.aligned && reinterpret_cast<uintptr_t>(r.src) % 16 == 0;
    t.rows += r.rows;
  }
  if (!t.params) entries = std::move(runs);
  const int n = static_cast<int>(entries.size());
  if (t.params) {
    t.param.n = n;
    for (int i = 0; i < n; ++i) {
      const ops::RowSegment& r = entries[i];
      t.param.src[i] = r.src;
      t.param.pages[i] = r.paged() ? r.device_pages : nullptr;
      t.param.shift[i] = r.paged() ? __builtin_ctzll(static_cast<unsigned long long>(r.page_rows)) : 0;
      t.param.first[i + 1] = t.param.first[i] + r.rows;
    }
    return t;
  }
  Tensor table = Tensor::empty({2 * static_cast<int64_t>(n) + 1}, DType::kI64);
  int64_t* p = table.data<int64_t>();
  p[0] = 0;
  for (int i = 0; i < n; ++i) {
    p[i + 1] = p[i] + entries[i].rows;
    p[n + 1 + i] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(entries[i].src));
  }
  t.keep = table.to(Device::kCUDA);  // queued without a synchronisation; lives until the launch
  t.uploaded = UploadedRuns{t.keep.data<int64_t>(), n};
  return t;
}

// ---- index_scores ----------------------------------------------------------------------------------
constexpr int kKeys = 128;   // keys per block, one per thread
constexpr int kQueries = 8;  // queries per block
constexpr int kPad = kKeys + 1;

__global__ void __launch_bounds__(kKeys)
    index_scores_kernel(const float* q, const float* keys, const float* w, const int32_t* counts, int64_t start_pos,
                        int64_t ratio, int T, int N, int nh, int d, bool round, float* out) {
  pdl_wait();
  pdl_launch_dependents();
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

// Few queries (decode): one block per (query, key range). The query's heads are staged in shared memory
// once per block; each warp then takes groups of KW keys, staged in its own slice of shared
// memory. Lane l owns heads l and l + 32 and forms their dots with each of the group's keys, every
// dot its own sequential fp32 chain over i ascending (float4 loads, the 4 values used in order, no
// FMA). The lanes then store their heads' terms (rd(rd(dot) * w) for rd(dot) > 0, else +0.0: the
// FP64 sum starts at +0.0 and so is never -0.0, and adding +/-0.0 to it changes nothing, so this
// equals skipping the term) and lane kk adds key kk's 64 terms in head order in FP64. Needs
// heads <= 64 and d % 4 == 0.
constexpr int kDecWarps = 8;
constexpr int kDecThreads = kDecWarps * 32;
// Keys per warp group: 8, 16 or 32 (the kernel's KW, decode_group). DEEPINFER_CUDA_INDEX_GROUP=auto takes 16 from
// this many rows x keys a call, else 8 (bench_cuda_attention's index table on the H100, bench/RESULTS.md's
// forty-fifth section: a row of 32k keys 38.0 us in groups of 8, 29.5 in 16, 29.8 in 32; 8k keys 11.1 / 17.7 / 29.5);
// 32 is never picked (no row where it beat 16), only asked for.
constexpr int64_t kIndexGroup16Keys = 16384;
constexpr int kDecHeads = 64;            // heads per block (2 per lane)
constexpr int kTermPad = kDecHeads + 1;  // term rows, padded against bank conflicts
constexpr int kDecMaxQueries = 16;       // at most this many queries take this kernel

template <class Rows, int KW>
__global__ void __launch_bounds__(kDecThreads)
    index_scores_decode_kernel(const float* q, const __grid_constant__ Rows keys, const float* w, const int32_t* counts,
                               const int32_t* offsets, int64_t start_pos, int64_t ratio, int N, int W, int nh, int d,
                               int slice, bool round, float* out) {
  pdl_wait();
  pdl_launch_dependents();
  extern __shared__ float4 smem4[];
  const int dq = d / 4, qstride = dq + 1;  // float4s per row; q rows padded by one float4
  float4* qs = smem4;                      // [kDecHeads][qstride]
  float* warp_smem = reinterpret_cast<float*>(smem4 + kDecHeads * qstride);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int t = blockIdx.y;
  // The row's keys: keys[off ..], visible ones [0, vis) (offsets: the row's own keys of a stacked table; W columns).
  int vis, off = 0;
  {
    if (offsets) off = min(max(offsets[t], 0), N);
    const int64_t c = counts ? counts[t] : (start_pos + t + 1) / ratio;
    const int cap = min(N - off, W);
    vis = static_cast<int>(c < 0 ? 0 : (c > cap ? cap : c));
  }
  float* out_row = out + static_cast<int64_t>(t) * W;
  const int groups = (W + KW - 1) / KW, vis_groups = (vis + KW - 1) / KW;
  const int first = blockIdx.x * kDecWarps, stride = gridDim.x * kDecWarps;
  // Groups no query row sees: -inf only.
  for (int g = first + warp; g < groups; g += stride)
    if (g >= vis_groups && lane < KW && g * KW + lane < W) out_row[g * KW + lane] = -INFINITY;
  if (first >= vis_groups) return;  // block-uniform
  const float4* qrow = reinterpret_cast<const float4*>(q + static_cast<int64_t>(t) * nh * d);
  for (int idx = tid; idx < kDecHeads * dq; idx += kDecThreads) {
    const int h = idx / dq, i = idx - h * dq;
    qs[h * qstride + i] = h < nh ? qrow[h * dq + i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  const int h0 = lane, h1 = lane + 32;
  const float w0 = h0 < nh ? w[static_cast<int64_t>(t) * nh + h0] : 0.0f;
  const float w1 = h1 < nh ? w[static_cast<int64_t>(t) * nh + h1] : 0.0f;
  __syncthreads();
  float4* ks = reinterpret_cast<float4*>(warp_smem + static_cast<int64_t>(warp) * slice);  // [KW][dq]
  float* terms = warp_smem + static_cast<int64_t>(warp) * slice;                           // [KW][kTermPad]
  const float4* qa = qs + h0 * qstride;
  const float4* qb = qs + h1 * qstride;
  for (int g = first + warp; g < vis_groups; g += stride) {
    const int j0 = g * KW;
    const int nk = min(KW, W - j0), nload = min(KW, vis - j0);  // columns written, keys read
    // Lane kk < nload finds key j0 + kk's row (the group's keys may lie in two runs); every lane then copies its
    // float4s of the group, each taking its key's row from that key's lane.
    const float* mine = lane < nload ? keys.row(static_cast<int64_t>(off) + j0 + lane, d) : nullptr;
    const unsigned long long mine_bits = reinterpret_cast<uintptr_t>(mine);
    __syncwarp();  // the previous group's terms consumed
    // cp.async: every copy of the group in flight at once (a load into registers then a store held ~4 rows of
    // HBM latency in flight per lane, which a 32-key group pays 8 times over).
    for (int base = 0; base < KW * dq; base += 32) {  // a uniform trip count: every lane shuffles
      const int idx = base + lane, kk = min(idx / dq, KW - 1);
      const float4* kr =
          reinterpret_cast<const float4*>(static_cast<uintptr_t>(__shfl_sync(0xffffffffu, mine_bits, kk)));
      if (idx < KW * dq) {
        if (kk < nload) {
          cp_async16(&ks[idx], kr + (idx - kk * dq));
        } else {
          ks[idx] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
      }
    }
    cp_async_wait_all();
    __syncwarp();
    float acc0[KW], acc1[KW];
#pragma unroll
    for (int kk = 0; kk < KW; ++kk) acc0[kk] = acc1[kk] = 0.0f;
    for (int i = 0; i < dq; ++i) {
      const float4 a = qa[i], b = qb[i];
#pragma unroll
      for (int kk = 0; kk < KW; ++kk) {
        const float4 kv = ks[kk * dq + i];
        acc0[kk] = __fadd_rn(acc0[kk], __fmul_rn(a.x, kv.x));
        acc1[kk] = __fadd_rn(acc1[kk], __fmul_rn(b.x, kv.x));
        acc0[kk] = __fadd_rn(acc0[kk], __fmul_rn(a.y, kv.y));
        acc1[kk] = __fadd_rn(acc1[kk], __fmul_rn(b.y, kv.y));
        acc0[kk] = __fadd_rn(acc0[kk], __fmul_rn(a.z, kv.z));
        acc1[kk] = __fadd_rn(acc1[kk], __fmul_rn(b.z, kv.z));
        acc0[kk] = __fadd_rn(acc0[kk], __fmul_rn(a.w, kv.w));
        acc1[kk] = __fadd_rn(acc1[kk], __fmul_rn(b.w, kv.w));
      }
    }
    __syncwarp();  // every lane done reading ks before terms (same memory) are written
#pragma unroll
    for (int kk = 0; kk < KW; ++kk) {
      const float d0 = round ? round_to_bf16(acc0[kk]) : acc0[kk];
      const float d1 = round ? round_to_bf16(acc1[kk]) : acc1[kk];
      float p0 = 0.0f, p1 = 0.0f;
      if (d0 > 0) {
        p0 = __fmul_rn(d0, w0);
        if (round) p0 = round_to_bf16(p0);
      }
      if (d1 > 0) {
        p1 = __fmul_rn(d1, w1);
        if (round) p1 = round_to_bf16(p1);
      }
      terms[kk * kTermPad + h0] = p0;
      terms[kk * kTermPad + h1] = p1;
    }
    __syncwarp();
    if (lane < nk) {
      const float* tr = terms + lane * kTermPad;
      double total = 0.0;
      for (int h = 0; h < nh; ++h) total += static_cast<double>(tr[h]);
      const float sc = __double2float_rn(total);
      const int j = j0 + lane;
      out_row[j] = j < vis ? (round ? round_to_bf16(sc) : sc) : -INFINITY;
    }
  }
}

// ---- moe_route --------------------------------------------------------------------------------------
constexpr int kRouteThreads = 512;  // a thread per expert at one token for up to 512 experts (FP64 exp / log1p each)
constexpr int kRoutePerLane = 24;   // the register top-k: up to 768 experts

// Whether pair j (expert ej) comes before pair i (expert e) in moe_group's order: valid experts ascending, then the
// pair order (moe_group_small_kernel and the dispatch's route_group_pairs).
__device__ __forceinline__ bool group_before(int32_t ej, int j, int32_t e, int i) {
  return ej >= 0 && (ej < e || (ej == e && j < i));
}

// Columns [c0, c1) of a source row into dst, fake-quantised in place as one group by a whole warp (gather_rows_quant).
__device__ __forceinline__ void gather_quant_group(const float* src, float* dst, int64_t c0, int64_t c1, int lane) {
  float amax = 0.0f;
  for (int64_t c = c0 + lane; c < c1; c += 32) {
    const float v = src[c];
    dst[c] = v;
    amax = fmaxf(amax, fabsf(v));
  }
  warp_fake_quant_fp8(dst, c0, c1, lane, amax);
}

// What a single token's route also does in its launch under moe_dispatch (moe_route_kernel<true>): warp 0 of block 0
// groups the k pairs after the top-k, as moe_group_small_kernel would, while blocks 1.. gather x's one row k times,
// fake-quantised per `block` columns (0: copied) as gather_rows_quant_kernel would (every pair of a single token, and
// every row moe_group leaves unused, reads row 0). Each output gets the bits of the op it replaces.
struct RouteDispatch {
  int32_t* rows = nullptr;
  float* wout = nullptr;
  int32_t* slots = nullptr;
  int32_t* row_expert = nullptr;
  const float* x = nullptr;  // [1, width]
  int64_t width = 0, block = 0;
  float* xout = nullptr;  // [k, width]
};

// moe_group_small_kernel's grouping of one token's P <= 32 pairs by warp 0 (lane i: pair i), from the ids and weights
// lane 0 wrote (visible after the __syncwarp). Every pair is token 0's, so every row is 0.
__device__ void route_group_pairs(const int32_t* ids, const float* w, int P, int E, const RouteDispatch& d, int lane) {
  __syncwarp();
  int32_t e = -1;
  float wi = 0.0f;
  if (lane < P) {
    e = ids[lane];
    if (e < 0 || e >= E) e = -1;
    wi = w[lane];
  }
  int pos = 0;
  for (int j = 0; j < P; ++j) {
    const int32_t ej = __shfl_sync(0xffffffffu, e, j);
    pos += group_before(ej, j, e, lane);
  }
  const int R = __popc(__ballot_sync(0xffffffffu, lane < P && e >= 0));
  if (lane < P && e >= 0) {
    d.rows[pos] = 0;
    d.row_expert[pos] = e;
    d.wout[pos] = wi;
  }
  if (lane < P) d.slots[lane] = e >= 0 ? pos : -1;
  __syncwarp();
  if (lane >= R && lane < P) d.rows[lane] = 0, d.row_expert[lane] = 0, d.wout[lane] = 0.0f;
}

// The columns of a quant group (block 0: a plain copy, 128 columns a warp).
__host__ __device__ inline int64_t route_gather_span(const RouteDispatch& d) { return d.block > 0 ? d.block : 128; }

// One quant group [c0, c0 + block) of gather_rows(x, rows, block) for P rows that all read x's row 0, by one warp:
// groups of up to 128 columns in registers (every load issued first; no read-back of written values), quantised as
// warp_fake_quant_fp8 does (warp_fp8_group_scale, fp8_fake_quant: the same bits), then written to the P rows; wider
// groups through the first output row as gather_rows_quant_kernel. block 0: a plain copy of 128 columns.
__device__ void route_gather_group(const RouteDispatch& d, int P, int64_t c0, int lane) {
  const int64_t width = d.width, span = route_gather_span(d), c1 = min(c0 + span, width);
  if (span <= 128) {
    float v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t c = c0 + lane + 32 * j;
      v[j] = c < c1 ? __ldg(d.x + c) : 0.0f;
    }
    if (d.block > 0) {
      float amax = 0.0f;  // the zeros past c1 do not change it
#pragma unroll
      for (int j = 0; j < 4; ++j) amax = fmaxf(amax, fabsf(v[j]));
      const float sc = warp_fp8_group_scale(amax);
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = fp8_fake_quant(v[j], sc);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t c = c0 + lane + 32 * j;
      if (c < c1)
        for (int r = 0; r < P; ++r) d.xout[r * width + c] = v[j];
    }
    return;
  }
  gather_quant_group(d.x, d.xout, c0, c1, lane);  // each lane rereads only its own columns below
  for (int64_t c = c0 + lane; c < c1; c += 32) {
    const float v = d.xout[c];
    for (int r = 1; r < P; ++r) d.xout[r * width + c] = v;
  }
}

// The gather's blocks (blocks 1.. of a dispatch launch, sized in route_launch): a warp per quant group. In blocks of
// their own on other SMs: with the gather in the route block's idle warps (114 registers a thread) the launch ended
// 11-27 us after the gate against 6-7 for the route alone, so the two launches it saved were lost (ktrace,
// bench/RESULTS.md, fifty-second session); in blocks of their own the step's GPU time fell 13 us (fifty-third).
__device__ void route_gather(const RouteDispatch& d, int P) {
  const int64_t span = route_gather_span(d);
  const int warps = static_cast<int>(blockDim.x) / 32, lane = static_cast<int>(threadIdx.x) & 31;
  for (int64_t g = (static_cast<int64_t>(blockIdx.x) - 1) * warps + static_cast<int>(threadIdx.x) / 32;
       g * span < d.width; g += static_cast<int64_t>(gridDim.x - 1) * warps)
    route_gather_group(d, P, g * span, lane);
}

// kDispatch: moe_dispatch's launch (block 0 the token's route and grouping, blocks 1.. the gather), held to 64
// registers a thread; without it the route alone, compiled as before the dispatch existed (47 registers).
template <bool kDispatch>
__global__ void __launch_bounds__(kRouteThreads, kDispatch ? 2 : 1)
    moe_route_kernel(const float* logits, int E, int k, int func, float temp, const float* bias, const void* tid2eid,
                     bool tid_i64, int64_t vocab, const int32_t* tokens, bool normalize, float norm_eps,
                     float route_scale, int32_t* ids, float* weights, RouteDispatch dispatch) {
  if constexpr (kDispatch) {
    if (blockIdx.x > 0) {  // a gather block
      pdl_wait();
      pdl_launch_dependents();
      route_gather(dispatch, k);
      return;
    }
  }
  extern __shared__ float sh[];
  float* s = sh;                 // [E] scores
  float* biased = sh + E;        // [E] selection keys (first the bias)
  float* picked_w = sh + 2 * E;  // [k] the picks' scores
  __shared__ float red;
  const int64_t t = blockIdx.x;
  const float* lr = logits + t * E;
  const int tid = threadIdx.x;
  // The bias is a weight (no earlier kernel writes it): read it while the gate still runs.
  if (bias && !tid2eid)
    for (int e = tid; e < E; e += kRouteThreads) biased[e] = bias[e];
  pdl_wait();
  pdl_launch_dependents();
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
  const int lane = tid & 31;
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
    if (kDispatch && tid < 32) route_group_pairs(ti, tw, k, E, dispatch, lane);
    return;
  }
  for (int e = tid; e < E; e += kRouteThreads) biased[e] = bias ? __fadd_rn(s[e], biased[e]) : s[e];
  __syncthreads();
  if (tid >= 32) return;
  // k passes of (score desc, index asc) argmax over the not yet chosen, -inf never chosen: the order
  // of the CPU's partial_sort. Warp 0 only: lane l's candidates are e = l, l + 32, ... ascending (it keeps the
  // first of equal keys), then a butterfly keeps the larger key, the lower index on ties, so every
  // lane ends with the same pick (for NaN-free keys); the chosen entry leaves its lane. Up to 32 * kRoutePerLane
  // experts the candidates stay in registers and only the winning lane rescans its own (a pass was a scan of shared
  // memory by every lane: the top-k was most of the kernel's ~8 us at one token); beyond, they stay in shared memory.
  float sum = 0.0f;
  auto butterfly = [&](int& best, float& bv) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int ob = __shfl_xor_sync(0xffffffffu, best, o);
      if (ob >= 0 && (best < 0 || ov > bv || (ov == bv && ob < best))) {
        best = ob;
        bv = ov;
      }
    }
  };
  auto record = [&](int j, int best) {
    if (lane != 0) return;
    ti[j] = best;
    const float w = best < 0 ? 0.0f : s[best];
    picked_w[j] = w;
    if (best >= 0) sum = __fadd_rn(sum, w);
  };
  if (E <= 32 * kRoutePerLane) {
    float vals[kRoutePerLane];
#pragma unroll
    for (int i = 0; i < kRoutePerLane; ++i) vals[i] = lane + 32 * i < E ? biased[lane + 32 * i] : -INFINITY;
    int mine = -1;  // the lane's best candidate and its key
    float mine_v = -INFINITY;
    auto rescan = [&] {
      mine = -1;
      mine_v = -INFINITY;
#pragma unroll
      for (int i = 0; i < kRoutePerLane; ++i)
        if (vals[i] != -INFINITY && (mine < 0 || vals[i] > mine_v)) {
          mine = lane + 32 * i;
          mine_v = vals[i];
        }
    };
    rescan();
    for (int j = 0; j < k; ++j) {
      int best = mine;
      float bv = mine_v;
      butterfly(best, bv);
      if (best >= 0 && lane == (best & 31)) {
#pragma unroll
        for (int i = 0; i < kRoutePerLane; ++i)
          if (lane + 32 * i == best) vals[i] = -INFINITY;
        rescan();
      }
      record(j, best);
    }
  } else {
    for (int j = 0; j < k; ++j) {
      int best = -1;
      float bv = -INFINITY;
      for (int e = lane; e < E; e += 32) {
        const float v = biased[e];
        if (v == -INFINITY) continue;
        if (best < 0 || v > bv) {
          best = e;
          bv = v;
        }
      }
      butterfly(best, bv);
      if (best >= 0 && lane == (best & 31)) biased[best] = -INFINITY;  // only this lane reads biased[best]
      record(j, best);
    }
  }
  if (lane == 0) {
    const float denom = __fadd_rn(sum, norm_eps);
    for (int j = 0; j < k; ++j) {
      float v = picked_w[j];
      if (normalize) v = __fdiv_rn(v, denom);
      tw[j] = __fmul_rn(v, route_scale);
    }
  }
  if constexpr (kDispatch) route_group_pairs(ti, tw, k, E, dispatch, lane);
}

// ---- swiglu, embedding, gather_rows ------------------------------------------------------------------
// One value of the clamped SwiGLU (ops::swiglu): w = the row's routing weight, or null.
__device__ __forceinline__ float swiglu_value(float gv, float uv, const float* w, float limit, bool round) {
  if (limit > 0) {
    uv = uv < -limit ? -limit : uv;  // std::max(uv, -limit), NaN kept
    uv = limit < uv ? limit : uv;    // std::min(uv, limit)
    gv = limit < gv ? limit : gv;
  }
  const float silu = __fdiv_rn(gv, __fadd_rn(1.0f, exp_f(-gv)));
  float v = __fmul_rn(silu, uv);
  if (w) v = __fmul_rn(*w, v);
  return round ? round_to_bf16(v) : v;
}

__global__ void swiglu_kernel(const float* g, const float* u, const float* wts, float limit, bool round, int64_t T,
                              int64_t I, float* h) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (n >= T * I) return;
  h[n] = swiglu_value(g[n], u[n], wts ? wts + n / I : nullptr, limit, round);
}

// swiglu_kernel's values with the output fake-quantised per `block` columns: one warp per (row, group).
__global__ void swiglu_quant_kernel(const float* g, const float* u, const float* wts, float limit, bool round,
                                    int64_t T, int64_t I, int64_t block, float* h) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t groups = (I + block - 1) / block;
  const int64_t gw = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (gw >= T * groups) return;  // whole warps
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t t = gw / groups, c0 = gw % groups * block, c1 = min(c0 + block, I);
  float* out = h + t * I;
  float amax = 0.0f;
  for (int64_t c = c0 + lane; c < c1; c += 32) {
    const float v = swiglu_value(g[t * I + c], u[t * I + c], wts ? wts + t : nullptr, limit, round);
    out[c] = v;
    amax = fmaxf(amax, fabsf(v));
  }
  warp_fake_quant_fp8(out, c0, c1, lane, amax);
}

// gather_rows_kernel with each output row fake-quantised per `block` columns: one warp per (row, group).
__global__ void gather_rows_quant_kernel(const float* x, const int32_t* rows, int64_t R, int64_t width, int64_t block,
                                         float* out) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t groups = (width + block - 1) / block;
  const int64_t gw = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (gw >= R * groups) return;  // whole warps
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t r = gw / groups, c0 = gw % groups * block, c1 = min(c0 + block, width);
  gather_quant_group(x + static_cast<int64_t>(rows[r]) * width, out + r * width, c0, c1, lane);
}

__global__ void embedding_kernel(const void* table, bool bf16, const int32_t* ids, int64_t T, int copies, int64_t dim,
                                 float* out) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (n >= T * copies * dim) return;
  const int64_t d = n % dim, t = n / (copies * dim);
  const int64_t row = ids[t];
  out[n] = bf16 ? __uint_as_float(static_cast<uint32_t>(static_cast<const uint16_t*>(table)[row * dim + d]) << 16)
                : static_cast<const float*>(table)[row * dim + d];
}

__global__ void gather_rows_kernel(const float* x, const int32_t* rows, int64_t R, int64_t width, float* out) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (n >= R * width) return;
  out[n] = x[static_cast<int64_t>(rows[n / width]) * width + n % width];
}

// ---- MoE dispatch and combine ------------------------------------------------------------------------
// Counts and offsets in one block: counts[e] from the ids (shared-memory atomics when E fits, else
// global ones), then offsets[e] = sum of counts[0..e), offsets[E] = the total, by a block-wide scan in
// chunks of kScanThreads (integer adds: exact in any order). Also writes slots[i] = -1 for the ids
// outside [0, E) (the grouping kernel writes the others).
constexpr int kScanThreads = 1024;
constexpr int kScanSharedMax = 8192;  // experts counted in shared memory

__global__ void __launch_bounds__(kScanThreads)
    moe_offsets_kernel(const int32_t* ids, int64_t P, int E, int32_t* gcounts, int32_t* offsets, int32_t* slots) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ int32_t scounts[kScanSharedMax];
  __shared__ int32_t warp_sums[kScanThreads / 32];
  __shared__ int32_t carry_sh;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const bool in_shared = E <= kScanSharedMax;
  int32_t* counts = in_shared ? scounts : gcounts;  // gcounts is zeroed by the host when not in shared
  if (in_shared)
    for (int e = tid; e < E; e += kScanThreads) scounts[e] = 0;
  __syncthreads();
  for (int64_t i = tid; i < P; i += kScanThreads) {
    const int32_t e = ids[i];
    if (e >= 0 && e < E)
      atomicAdd(counts + e, 1);
    else
      slots[i] = -1;
  }
  __syncthreads();  // also orders the global atomics before the reads below (same block)
  int32_t carry = 0;
  for (int c0 = 0; c0 < E; c0 += kScanThreads) {
    const int e = c0 + tid;
    const int32_t v = e < E ? (in_shared ? scounts[e] : __ldcg(gcounts + e)) : 0;
    int32_t x = v;  // inclusive scan in the warp
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int32_t y = __shfl_up_sync(0xffffffffu, x, o);
      if (lane >= o) x += y;
    }
    if (lane == 31) warp_sums[warp] = x;
    __syncthreads();
    if (warp == 0) {
      int32_t ws = warp_sums[lane];
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int32_t y = __shfl_up_sync(0xffffffffu, ws, o);
        if (lane >= o) ws += y;
      }
      warp_sums[lane] = ws;  // inclusive over warps
      if (lane == 31) carry_sh = ws;
    }
    __syncthreads();
    const int32_t excl = carry + (warp > 0 ? warp_sums[warp - 1] : 0) + x - v;
    if (e < E) offsets[e] = excl;
    carry += carry_sh;
    __syncthreads();  // warp_sums / carry_sh read before the next chunk writes them
  }
  if (tid == 0) offsets[E] = carry;
}

constexpr int kGroupThreads = 256;

// One block per expert: an ordered compaction of the (t, j) pairs routed to it, in ascending t*k + j.
__global__ void __launch_bounds__(kGroupThreads)
    moe_group_kernel(const int32_t* ids, const float* w, int64_t P, int k, const int32_t* offsets, int32_t* rows,
                     float* wout, int32_t* slots, int32_t* row_expert) {
  pdl_wait();
  pdl_launch_dependents();
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
      row_expert[pos] = e;
      wout[pos] = w[i];
      slots[i] = static_cast<int32_t>(pos);
    }
    base += total;
    __syncthreads();  // warp_count consumed before the next chunk writes it
  }
}

// moe_offsets_kernel + moe_group_kernel in one block for the few pairs of a decode step (P <= kGroupSmallMax,
// no host offsets): pair i goes to position pos(i) = #{valid j: id_j < id_i, or id_j == id_i and j < i} (the
// order of the two-kernel path: by expert, then by pair index), counted by each thread over the ids in shared
// memory. The rows past the valid pairs (ids outside [0, E)) name token 0 and expert 0 with weight 0 (the
// two-kernel path leaves them unwritten but for row_expert). One launch instead of a memset and two kernels (~6 us
// of a batch-1 MoE layer on the H200).
constexpr int kGroupSmallMax = 512;

__global__ void __launch_bounds__(kGroupSmallMax)
    moe_group_small_kernel(const int32_t* ids, const float* w, int P, int k, int E, int32_t* rows, float* wout,
                           int32_t* slots, int32_t* row_expert) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ int32_t sid[kGroupSmallMax];
  __shared__ int valid_count;
  const int i = static_cast<int>(threadIdx.x);
  if (i == 0) valid_count = 0;
  int32_t e = -1;
  if (i < P) {
    e = ids[i];
    if (e < 0 || e >= E) e = -1;
    sid[i] = e;
  }
  __syncthreads();
  if (i < P && e >= 0) atomicAdd(&valid_count, 1);
  int pos = 0;
  if (i < P && e >= 0) {
    for (int j = 0; j < P; ++j) {
      const int32_t ej = sid[j];
      pos += group_before(ej, j, e, i);
    }
    rows[pos] = i / k;
    row_expert[pos] = e;
    wout[pos] = w[i];
  }
  if (i < P) slots[i] = e >= 0 ? pos : -1;
  __syncthreads();
  const int R = valid_count;
  if (i >= R && i < P) rows[i] = 0, row_expert[i] = 0, wout[i] = 0.0f;
}

constexpr int kCombineMaxK = 64;

// Token t's column d of the combine, unrounded: its slots sorted ascending, then 0 + y[s1] + y[s2] + ... + shared.
__device__ __forceinline__ float combine_value(const float* y, const int32_t* slots, const float* shared, int k,
                                               int64_t dim, int64_t t, int64_t d) {
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
  return __fadd_rn(acc, shared[t * dim + d]);
}

// One thread per (token, column).
__global__ void moe_combine_kernel(const float* y, const int32_t* slots, const float* shared, int k, int64_t dim,
                                   bool round, float* out) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t t = blockIdx.y;
  const int64_t d = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (d >= dim) return;
  const float v = combine_value(y, slots, shared, k, dim, t, d);
  out[t * dim + d] = round ? round_to_bf16(v) : v;
}

// moe_combine_kernel's value, then hc_expand_kernel's copies of it (hc_expand_value) in the same thread: one launch, no
// round trip of y.
__global__ void moe_combine_expand_kernel(const float* y, const int32_t* slots, const float* shared, int k, int64_t dim,
                                          bool round, const float* stream, const float* post, const float* comb, int hc,
                                          float* out) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t t = blockIdx.y;
  const int64_t d = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (d >= dim) return;
  float v = combine_value(y, slots, shared, k, dim, t, d);
  if (round) v = round_to_bf16(v);
  for (int c = 0; c < hc; ++c)
    out[(t * hc + c) * dim + d] = hc_expand_value(v, stream, post, comb, t, hc, c, dim, d, round);
}

// ---- compressor pooling ----------------------------------------------------------------------------
// One thread per (group, channel): three passes over the group's rows (max, exp sum, weighted sum),
// each in the CPU's row order; exp recomputed identically in each pass.
__global__ void compress_pool_kernel(const float* kv, const float* score, const float* ape, int r, int64_t d, int64_t w,
                                     bool overlap, bool has_prev, int64_t lead, float* out) {
  pdl_wait();
  pdl_launch_dependents();
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
// One warp per head (kRenormWarps heads per block): the lanes square the head's values into shared memory (each
// rd(a * a), as the CPU), lane 0 adds them in the CPU's order (a sequential double sum, so the warp cannot split
// it) and forms the factor, and the lanes scale the head. With one thread per head walking its row in global
// memory the dependent loads made this op ~136 us per layer at 1-8 tokens (V4-Flash shape, ncu).
constexpr int kRenormWarps = 4;
__global__ void __launch_bounds__(32 * kRenormWarps)
    renorm_heads_kernel(float* q, int64_t n, int hd, float eps, bool round) {
  pdl_wait();
  pdl_launch_dependents();
  extern __shared__ float renorm_sq[];
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int64_t h = blockIdx.x * static_cast<int64_t>(kRenormWarps) + warp;
  if (h >= n) return;  // whole warps
  float* a = q + h * hd;
  float* sq = renorm_sq + warp * (hd + 1);  // sq[hd]: the factor
  auto rd = [&](float v) { return round ? round_to_bf16(v) : v; };
  for (int i = lane; i < hd; i += 32) sq[i] = rd(__fmul_rn(a[i], a[i]));
  __syncwarp();
  if (lane == 0) {
    double ss = 0;
    int i = 0;
    for (; i + 4 <= hd; i += 4) {  // loads ahead of the dependent adds
      const float v0 = sq[i], v1 = sq[i + 1], v2 = sq[i + 2], v3 = sq[i + 3];
      ss = __dadd_rn(ss, static_cast<double>(v0));
      ss = __dadd_rn(ss, static_cast<double>(v1));
      ss = __dadd_rn(ss, static_cast<double>(v2));
      ss = __dadd_rn(ss, static_cast<double>(v3));
    }
    for (; i < hd; ++i) ss = __dadd_rn(ss, static_cast<double>(sq[i]));
    const float mean = rd(__double2float_rn(__ddiv_rn(ss, static_cast<double>(hd))));
    sq[hd] = rd(__fdiv_rn(1.0f, __fsqrt_rn(rd(__fadd_rn(mean, eps)))));
  }
  __syncwarp();
  const float r = sq[hd];
  for (int i = lane; i < hd; i += 32) a[i] = rd(__fmul_rn(a[i], r));
}

}  // namespace

namespace {

// index_scores' argument checks for keys of N rows of d floats (a table or runs); returns the result's columns.
int64_t index_scores_checks(const char* op, const Tensor& q, int64_t N, int64_t d, const Tensor& w,
                            const ops::KeyVisibility& vis) {
  check_f32(q, op, "q");
  check_f32(w, op, "w");
  DI_CHECK(w.dim() == 2 && q.dim() >= 2, "{}: expected w [T, heads], got {}", op, w.describe());
  const int64_t T = q.size(0), nh = w.size(1);
  DI_CHECK(w.size(0) == T && q.numel() == T * nh * d, "{}: q {} does not match w {} and keys of width {}", op,
           q.describe(), w.describe(), d);
  DI_CHECK(vis.counts.defined() || vis.ratio > 0, "{}: ratio {} must be positive", op, vis.ratio);
  if (vis.counts.defined()) check_ids(vis.counts, T, op, "counts");
  const bool offs = vis.offsets.defined();
  if (offs) {
    check_ids(vis.offsets, T, op, "offsets");
    DI_CHECK(vis.counts.defined() && vis.width >= 0 && vis.width < (int64_t{1} << 31),
             "{}: offsets need counts and a width in [0, 2^31) (got {})", op, vis.width);
  }
  DI_CHECK(N < (int64_t{1} << 31) && T < (int64_t{1} << 24) * kQueries, "{}: [{}, {}] is too large", op, T, N);
  return offs ? vis.width : N;
}

// Keys per warp group (the kernel's KW): 8, 16 or 32; 0 follows DEEPINFER_CUDA_INDEX_GROUP.
std::atomic<int> g_index_group{0};

int64_t decode_slice(int KW, int64_t d) { return std::max<int64_t>(KW * d, KW * kTermPad); }  // floats per warp
size_t decode_smem(int KW, int64_t d) {
  return static_cast<size_t>(kDecHeads * (d / 4 + 1)) * sizeof(float4) +
         static_cast<size_t>(kDecWarps * decode_slice(KW, d)) * sizeof(float);
}

// Which group size a call takes: a larger group shares each q load and each loop step among more keys (fewer
// instructions a key), a smaller one spreads a short row over more warps.
int decode_group(int64_t T, int64_t W, int64_t d) {
  int kw = g_index_group.load(std::memory_order_relaxed);
  if (kw == 0) {
    static const int env = [] {
      const std::string v = env_value("DEEPINFER_CUDA_INDEX_GROUP");
      DI_CHECK(v == "auto" || v == "8" || v == "16" || v == "32",
               "DEEPINFER_CUDA_INDEX_GROUP must be auto, 8, 16 or 32 (got '{}')", v);
      return v == "auto" ? 0 : std::stoi(v);
    }();
    kw = env;
  }
  if (kw == 0) kw = T * W >= kIndexGroup16Keys ? 16 : 8;
  while (kw > 8 && decode_smem(kw, d) > static_cast<size_t>(smem_optin())) kw /= 2;
  return kw;
}

template <class Rows, int KW>
Tensor launch_decode(const Tensor& q, const Rows& keys, int64_t N, int64_t d, const Tensor& w,
                     const ops::KeyVisibility& vis, bool round) {
  const int64_t T = q.size(0), nh = w.size(1);
  const bool offs = vis.offsets.defined();
  const int64_t W = offs ? vis.width : N;  // the result's columns
  const int64_t slice = decode_slice(KW, d);
  const size_t dsmem = decode_smem(KW, d);
  static size_t dec_configured = 48 * 1024;  // per instance of the kernel, as these statics are
  if (dsmem > dec_configured) {
    DI_CUDA_CHECK(cudaFuncSetAttribute(index_scores_decode_kernel<Rows, KW>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(dsmem)));
    dec_configured = dsmem;
  }
  static size_t occ_smem = 0;
  static int occ_blocks = 1;
  if (occ_smem != dsmem) {
    int b = 0;
    DI_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, index_scores_decode_kernel<Rows, KW>, kDecThreads, dsmem));
    occ_blocks = std::max(b, 1);
    occ_smem = dsmem;
  }
  Tensor out = Tensor::empty({T, W}, DType::kF32, Device::kCUDA);
  if (W == 0) return out;
  const int64_t groups = (W + KW - 1) / KW;
  const int64_t need = (groups + kDecWarps - 1) / kDecWarps;
  const int64_t cap = std::max<int64_t>(1, static_cast<int64_t>(sm_count()) * occ_blocks / T);
  const dim3 grid(static_cast<unsigned>(std::min(need, cap)), static_cast<unsigned>(T));
  launch_pdl(index_scores_decode_kernel<Rows, KW>, grid, kDecThreads, dsmem, nullptr, q.data<float>(), keys,
             w.data<float>(), vis.counts.defined() ? vis.counts.data<int32_t>() : nullptr,
             offs ? vis.offsets.data<int32_t>() : nullptr, vis.start_pos, vis.ratio, static_cast<int>(N),
             static_cast<int>(W), static_cast<int>(nh), static_cast<int>(d), static_cast<int>(slice), round,
             out.data<float>());
  DI_CUDA_CHECK(cudaGetLastError());
  return out;
}

// Few queries: the head-parallel decode kernel over `keys` (N rows of d floats; keys_aligned: every row 16-byte
// aligned). Returns an undefined tensor when the call does not fit it (the caller takes the other kernel); rows over
// their own keys (offsets) must fit it.
template <class Rows>
Tensor index_scores_decode(const char* op, const Tensor& q, const Rows& keys, bool keys_aligned, int64_t N, int64_t d,
                           const Tensor& w, const ops::KeyVisibility& vis, bool round) {
  const int64_t T = q.size(0), nh = w.size(1);
  const bool offs = vis.offsets.defined();
  const int64_t W = offs ? vis.width : N;  // the result's columns
  const bool aligned = reinterpret_cast<uintptr_t>(q.data<float>()) % 16 == 0 && keys_aligned;
  // Rows over their own keys (offsets) always take it: the other kernel shares its keys between queries.
  const int64_t max_rows = offs ? 65535 : kDecMaxQueries;
  const bool fits =
      nh <= kDecHeads && d % 4 == 0 && d > 0 && aligned && decode_smem(8, d) <= static_cast<size_t>(smem_optin());
  DI_CHECK(!offs || (fits && T <= max_rows),
           "{}: rows over their own keys need <= {} heads, d % 4 == 0, aligned rows and <= {} rows (got {} heads, d "
           "{}, {} rows)",
           op, kDecHeads, max_rows, nh, d, T);
  if (T < 1 || T > max_rows || !fits) return Tensor();
  switch (decode_group(T, W, d)) {
    case 32:
      return launch_decode<Rows, 32>(q, keys, N, d, w, vis, round);
    case 16:
      return launch_decode<Rows, 16>(q, keys, N, d, w, vis, round);
    default:
      return launch_decode<Rows, 8>(q, keys, N, d, w, vis, round);
  }
}

}  // namespace

void index_scores_set_group(int keys) {
  DI_CHECK(keys == 0 || keys == 8 || keys == 16 || keys == 32,
           "cuda::index_scores_set_group: keys per group must be 0, 8, 16 or 32 (got {})", keys);
  g_index_group.store(keys, std::memory_order_relaxed);
}

Tensor index_scores_runs(const Tensor& q, const std::vector<ops::RowSegment>& segments, int64_t d, const Tensor& w,
                         const ops::KeyVisibility& vis, bool round) {
  const char* op = "cuda::index_scores";
  DI_CHECK(q.defined(), "{}: no queries", op);
  // Only calls the decode kernel may take build the run table (an upload past 16 runs).
  if (q.size(0) < 1 || (!vis.offsets.defined() && q.size(0) > kDecMaxQueries)) return Tensor();
  DI_CHECK(d > 0, "{}: key width {}", op, d);
  const RunTables t = run_tables(segments, d);
  index_scores_checks(op, q, t.rows, d, w, vis);
  const bool aligned = t.aligned && d % 4 == 0;
  return t.in_params() ? index_scores_decode(op, q, t.param, aligned, t.rows, d, w, vis, round)
                       : index_scores_decode(op, q, t.uploaded, aligned, t.rows, d, w, vis, round);
}

Tensor index_scores(const Tensor& q, const Tensor& keys, const Tensor& w, const ops::KeyVisibility& vis, bool round) {
  const char* op = "cuda::index_scores";
  check_f32(keys, op, "keys");
  DI_CHECK(keys.dim() == 2, "{}: expected keys [N, d], got {}", op, keys.describe());
  const int64_t T = q.size(0), N = keys.size(0), d = keys.size(1);
  const int64_t W = index_scores_checks(op, q, N, d, w, vis), nh = w.size(1);
  if (T == 0) return Tensor::empty({0, W}, DType::kF32, Device::kCUDA);
  {
    const Tensor out =
        index_scores_decode(op, q, TableRows{keys.data<float>()},
                            reinterpret_cast<uintptr_t>(keys.data<float>()) % 16 == 0, N, d, w, vis, round);
    if (out.defined()) return out;
  }
  const size_t smem = (static_cast<size_t>(d) * kPad + static_cast<size_t>(kQueries) * d) * sizeof(float);
  // The kernel's static shared memory, queried once (each query costs a driver round trip).
  static const cudaFuncAttributes attr = [] {
    cudaFuncAttributes a{};
    DI_CUDA_CHECK(cudaFuncGetAttributes(&a, index_scores_kernel));
    return a;
  }();
  const int optin = smem_optin();
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
  launch_pdl(index_scores_kernel, grid, kKeys, smem, nullptr, q.data<float>(), keys.data<float>(), w.data<float>(),
             vis.counts.defined() ? vis.counts.data<int32_t>() : nullptr, vis.start_pos, vis.ratio, static_cast<int>(T),
             static_cast<int>(N), static_cast<int>(nh), static_cast<int>(d), round, out.data<float>());
  DI_CUDA_CHECK(cudaGetLastError());
  return out;
}

namespace {

// moe_route's checks and launch; a dispatch (RouteDispatch::rows set) only for one token with k <= 32.
ops::Routing route_launch(const Tensor& logits, const Tensor& bias, const Tensor& tid2eid, const Tensor& tokens,
                          int64_t k, const ops::RouteOpts& o, const RouteDispatch& dispatch) {
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
  static const bool configured = [] {  // up to 16,384 experts: 2 E + k floats need the opt-in size
    for (auto* kernel : {moe_route_kernel<false>, moe_route_kernel<true>}) {
      cudaFuncAttributes a{};
      DI_CUDA_CHECK(cudaFuncGetAttributes(&a, kernel));
      DI_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         smem_optin() - static_cast<int>(a.sharedSizeBytes)));
    }
    return true;
  }();
  (void)configured;
  // A dispatch adds the gather's blocks, a warp per quant group (route_gather).
  const bool fused = dispatch.rows != nullptr;
  const int64_t per_block = route_gather_span(dispatch) * (kRouteThreads / 32);
  const int64_t gather_blocks = fused ? (dispatch.width + per_block - 1) / per_block : 0;
  launch_pdl(fused ? moe_route_kernel<true> : moe_route_kernel<false>, static_cast<unsigned>(T + gather_blocks),
             kRouteThreads, (2 * E + k) * sizeof(float), nullptr, logits.data<float>(), static_cast<int>(E),
             static_cast<int>(k), func, o.temp, bias.defined() ? bias.data<float>() : nullptr,
             hash ? tid2eid.raw() : nullptr, hash && tid2eid.dtype() == DType::kI64, hash ? tid2eid.size(0) : 0,
             hash ? tokens.data<int32_t>() : nullptr, o.normalize, o.norm_eps, o.route_scale, r.ids.data<int32_t>(),
             r.weights.data<float>(), dispatch);
  DI_CUDA_CHECK(cudaGetLastError());
  return r;
}

}  // namespace

ops::Routing moe_route(const Tensor& logits, const Tensor& bias, const Tensor& tid2eid, const Tensor& tokens, int64_t k,
                       const ops::RouteOpts& o) {
  return route_launch(logits, bias, tid2eid, tokens, k, o, RouteDispatch{});
}

namespace {
std::atomic<int> g_dispatch_mode{0};  // moe_dispatch_set_mode
}  // namespace

int moe_dispatch_set_mode(int mode) {
  DI_CHECK(mode >= 0 && mode <= 2, "moe_dispatch_set_mode: {} is not 0 .. 2", mode);
  return g_dispatch_mode.exchange(mode, std::memory_order_relaxed);
}

ops::MoeDispatch moe_dispatch(const Tensor& logits, const Tensor& bias, const Tensor& tid2eid, const Tensor& tokens,
                              int64_t k, const ops::RouteOpts& o, int64_t n_experts, const Tensor& x,
                              int64_t quant_block) {
  ops::MoeDispatch d;
  static const bool env = env_switch("DEEPINFER_CUDA_MOE_DISPATCH", 1) != 0;
  const int mode = g_dispatch_mode.load(std::memory_order_relaxed);
  if (!(mode == 0 ? env : mode == 2)) return d;
  if (!logits.defined() || logits.dim() != 2 || logits.size(0) != 1 || logits.size(1) != n_experts || k < 1 || k > 32 ||
      !x.defined() || x.device() != Device::kCUDA || x.dtype() != DType::kF32 || !x.is_contiguous() || x.dim() != 2 ||
      x.size(0) != 1 || x.size(1) == 0 || quant_block < 0)
    return d;  // not a single token's call: the caller runs the three ops
  const int64_t width = x.size(1);
  Tensor rows = Tensor::empty({k}, DType::kI32, Device::kCUDA);
  Tensor wout = Tensor::empty({k}, DType::kF32, Device::kCUDA);
  Tensor rexp = Tensor::empty({k}, DType::kI32, Device::kCUDA);
  Tensor slots = Tensor::empty({1, k}, DType::kI32, Device::kCUDA);
  Tensor xout = Tensor::empty({k, width}, DType::kF32, Device::kCUDA);
  side_join_if_reads(x.raw(), x.nbytes());  // as gather_rows
  RouteDispatch rd;
  rd.rows = rows.data<int32_t>();
  rd.wout = wout.data<float>();
  rd.slots = slots.data<int32_t>();
  rd.row_expert = rexp.data<int32_t>();
  rd.x = x.data<float>();
  rd.width = width;
  rd.block = quant_block;
  rd.xout = xout.data<float>();
  d.routing = route_launch(logits, bias, tid2eid, tokens, k, o, rd);
  d.groups.rows = rows, d.groups.weights = wout, d.groups.slots = slots, d.groups.row_expert = rexp;
  d.x = xout;
  return d;
}

Tensor swiglu(const Tensor& g, const Tensor& u, const Tensor& weights, float limit, bool round, int64_t quant_block) {
  const char* op = "cuda::swiglu";
  DI_CHECK(quant_block >= 0, "{}: quant_block must be >= 0, got {}", op, quant_block);
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
  if (quant_block > 0) {
    const int64_t warps = T * ((I + quant_block - 1) / quant_block);
    DI_CHECK(warps < (int64_t{1} << 34), "{}: {} groups is too many for one launch", op, warps);
    launch_pdl(swiglu_quant_kernel, static_cast<unsigned>((warps + 7) / 8), 256, 0, nullptr, g.data<float>(),
               u.data<float>(), weights.defined() ? weights.data<float>() : nullptr, limit, round, T, I, quant_block,
               h.data<float>());
    DI_CUDA_CHECK(cudaGetLastError());
    return h;
  }
  launch_pdl(swiglu_kernel, grid_for(T * I, 256), 256, 0, nullptr, g.data<float>(), u.data<float>(),
             weights.defined() ? weights.data<float>() : nullptr, limit, round, T, I, h.data<float>());
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
  launch_pdl(embedding_kernel, grid_for(out.numel(), 256), 256, 0, nullptr, table.raw(), table.dtype() == DType::kBF16,
             ids.data<int32_t>(), T, static_cast<int>(copies), dim, out.data<float>());
  DI_CUDA_CHECK(cudaGetLastError());
  return out;
}

Tensor gather_rows(const Tensor& x, const Tensor& rows, int64_t quant_block) {
  const char* op = "cuda::gather_rows";
  DI_CHECK(quant_block >= 0 && (quant_block == 0 || x.dim() == 2), "{}: quant_block {} needs x [N, width], got {}", op,
           quant_block, x.describe());
  check_f32(x, op, "x");
  DI_CHECK(x.dim() >= 1 && rows.defined() && rows.dim() == 1, "{}: expected x [N, ...] and rows [R], got {}, {}", op,
           x.describe(), desc(rows));
  const int64_t R = rows.size(0), N = x.size(0), width = N == 0 ? 0 : x.numel() / N;
  check_ids(rows, R, op, "rows");
  Shape shape = x.shape();
  shape[0] = R;
  Tensor out = Tensor::empty(shape, DType::kF32, Device::kCUDA);
  if (out.numel() == 0) return out;
  side_join_if_reads(x.raw(), x.nbytes());  // x may be hc_mixes' pre, written on the side stream
  if (quant_block > 0) {
    const int64_t warps = R * ((width + quant_block - 1) / quant_block);
    DI_CHECK(warps < (int64_t{1} << 34), "{}: {} groups is too many for one launch", op, warps);
    launch_pdl(gather_rows_quant_kernel, static_cast<unsigned>((warps + 7) / 8), 256, 0, nullptr, x.data<float>(),
               rows.data<int32_t>(), R, width, quant_block, out.data<float>());
    DI_CUDA_CHECK(cudaGetLastError());
    return out;
  }
  launch_pdl(gather_rows_kernel, grid_for(R * width, 256), 256, 0, nullptr, x.data<float>(), rows.data<int32_t>(), R,
             width, out.data<float>());
  DI_CUDA_CHECK(cudaGetLastError());
  return out;
}

ops::MoeGroups moe_group(const Tensor& ids, const Tensor& weights, int64_t n_experts, bool host_offsets) {
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
  Tensor rexp = Tensor::empty({P}, DType::kI32, Device::kCUDA);
  g.slots = Tensor::empty({T, k}, DType::kI32, Device::kCUDA);
  if (!host_offsets && P <= kGroupSmallMax) {  // a decode step's pairs: one block (moe_group_small_kernel)
    if (P > 0) {
      launch_pdl(moe_group_small_kernel, 1, kGroupSmallMax, 0, nullptr, ids.data<int32_t>(), weights.data<float>(),
                 static_cast<int>(P), static_cast<int>(k), static_cast<int>(E), rows.data<int32_t>(),
                 wout.data<float>(), g.slots.data<int32_t>(), rexp.data<int32_t>());
      DI_CUDA_CHECK(cudaGetLastError());
    }
    g.rows = rows, g.weights = wout, g.row_expert = rexp;
    return g;
  }
  // Without the host offsets the row count is taken as P (every id in range, as moe_route returns
  // them); zeroed first so that a row left unwritten still names a valid expert.
  flush_deferred();  // the memsets and the host copy below are not launch_pdl
  if (!host_offsets && P > 0) DI_CUDA_CHECK(cudaMemsetAsync(rexp.raw(), 0, P * sizeof(int32_t), current_stream()));
  Tensor counts = Tensor::empty({2 * E + 1}, DType::kI32, Device::kCUDA);  // counts [E], offsets [E + 1]
  int32_t* cp = counts.data<int32_t>();
  int32_t* op_ = cp + E;
  if (E > kScanSharedMax) DI_CUDA_CHECK(cudaMemsetAsync(cp, 0, E * sizeof(int32_t), current_stream()));
  launch_pdl(moe_offsets_kernel, 1, kScanThreads, 0, nullptr, ids.data<int32_t>(), P, static_cast<int>(E), cp, op_,
             g.slots.data<int32_t>());
  DI_CUDA_CHECK(cudaGetLastError());
  if (P > 0) {
    launch_pdl(moe_group_kernel, static_cast<unsigned>(E), kGroupThreads, 0, nullptr, ids.data<int32_t>(),
               weights.data<float>(), P, static_cast<int>(k), op_, rows.data<int32_t>(), wout.data<float>(),
               g.slots.data<int32_t>(), rexp.data<int32_t>());
    DI_CUDA_CHECK(cudaGetLastError());
  }
  if (!host_offsets) {
    g.rows = rows, g.weights = wout, g.row_expert = rexp;
    return g;
  }
  std::vector<int32_t> off(E + 1);
  DI_CUDA_CHECK(cudaMemcpy(off.data(), op_, (E + 1) * sizeof(int32_t), cudaMemcpyDeviceToHost));
  g.offsets.assign(off.begin(), off.end());
  const int64_t R = g.offsets[E];
  g.rows = R == P ? rows : rows.slice(0, 0, R);
  g.weights = R == P ? wout : wout.slice(0, 0, R);
  g.row_expert = R == P ? rexp : rexp.slice(0, 0, R);
  return g;
}

namespace {

// moe_combine's argument checks (op names the caller).
void check_combine(const Tensor& expert_out, const Tensor& slots, const Tensor& shared, const char* op) {
  check_f32(expert_out, op, "expert_out");
  check_f32(shared, op, "shared");
  DI_CHECK(slots.defined() && slots.device() == Device::kCUDA && slots.dtype() == DType::kI32 && slots.dim() == 2 &&
               slots.is_contiguous(),
           "{}: slots must be int32 [T, k] on CUDA, got {}", op, desc(slots));
  DI_CHECK(shared.dim() == 2 && shared.size(0) == slots.size(0) && expert_out.dim() == 2 &&
               expert_out.size(1) == shared.size(1),
           "{}: expert_out {}, slots {}, shared {} do not match", op, expert_out.describe(), slots.describe(),
           shared.describe());
  const int64_t T = shared.size(0), k = slots.size(1);
  DI_CHECK(k <= kCombineMaxK && T < (int64_t{1} << 31), "{}: k = {} (at most {}), T = {}", op, k, kCombineMaxK, T);
}

}  // namespace

Tensor moe_combine(const Tensor& expert_out, const Tensor& slots, const Tensor& shared, bool round) {
  check_combine(expert_out, slots, shared, "cuda::moe_combine");
  const int64_t T = shared.size(0), dim = shared.size(1), k = slots.size(1);
  side_join_if_reads(shared.raw(), shared.nbytes());  // the shared expert may run beside the routed ones
  Tensor out = Tensor::empty({T, dim}, DType::kF32, Device::kCUDA);
  if (T * dim == 0) return out;
  const dim3 grid(grid_for(dim, 256), static_cast<unsigned>(T));
  launch_pdl(moe_combine_kernel, grid, 256, 0, nullptr, expert_out.data<float>(), slots.data<int32_t>(),
             shared.data<float>(), static_cast<int>(k), dim, round, out.data<float>());
  DI_CUDA_CHECK(cudaGetLastError());
  return out;
}

Tensor moe_combine_expand(const Tensor& expert_out, const Tensor& slots, const Tensor& shared, const Tensor& stream,
                          const Tensor& post, const Tensor& comb, bool round) {
  const char* op = "cuda::moe_combine_expand";
  check_combine(expert_out, slots, shared, op);
  check_f32(stream, op, "stream");
  check_f32(post, op, "post");
  check_f32(comb, op, "comb");
  const int64_t T = shared.size(0), dim = shared.size(1), k = slots.size(1);
  DI_CHECK(stream.dim() == 3 && stream.size(0) == T && stream.size(2) == dim, "{}: stream {} for [{}, hc, {}]", op,
           stream.describe(), T, dim);
  const int64_t hc = stream.size(1);
  DI_CHECK(post.numel() == T * hc && comb.numel() == T * hc * hc, "{}: post {} comb {} vs stream {}", op,
           post.describe(), comb.describe(), stream.describe());
  Tensor out = Tensor::empty({T, hc, dim}, DType::kF32, Device::kCUDA);
  if (out.numel() == 0) return out;
  side_join();  // the shared expert and the mixes (post, comb) may come from the side stream
  const dim3 grid(grid_for(dim, 256), static_cast<unsigned>(T));
  launch_pdl(moe_combine_expand_kernel, grid, 256, 0, nullptr, expert_out.data<float>(), slots.data<int32_t>(),
             shared.data<float>(), static_cast<int>(k), dim, round, stream.data<float>(), post.data<float>(),
             comb.data<float>(), static_cast<int>(hc), out.data<float>());
  DI_CUDA_CHECK(cudaGetLastError());
  return out;
}

// One thread per float4 of the copies' rows taken in order (grid-stride): the row's copy found by binary search over
// the copies' first rows (first[c] = the rows before copy c, first[n] = all), then its source and destination.
__global__ void copy_rows_kernel(const int64_t* first, const float* const* src, float* const* dst, int n, int64_t n4,
                                 int width4) {
  pdl_wait();
  pdl_launch_dependents();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n4;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / width4, c = i - r * width4;
    int lo = 0, hi = n - 1;  // the last copy whose first row is <= r
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (first[mid] <= r)
        lo = mid;
      else
        hi = mid - 1;
    }
    const int64_t at = (r - first[lo]) * width4 + c;
    reinterpret_cast<float4*>(dst[lo])[at] = reinterpret_cast<const float4*>(src[lo])[at];
  }
}

// ---- copy_bytes_many ----------------------------------------------------------------------------------------------
namespace {

constexpr int kParamCopies = 16;  // copies whose table travels in the launch's parameters

struct ByteCopies {
  const char* src[kParamCopies];
  char* dst[kParamCopies];
  int64_t first[kParamCopies + 1];  // first unit of each copy, then the total
  int shift[kParamCopies];          // log2 of the copy's unit: 16, 4 or 1 bytes
  int n;
};

__global__ void copy_bytes_kernel(ByteCopies c) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t total = c.first[c.n];
  for (int64_t u = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; u < total;
       u += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int i = 0;
    while (i + 1 < c.n && c.first[i + 1] <= u) ++i;
    const int64_t at = (u - c.first[i]) << c.shift[i];
    if (c.shift[i] == 4)
      *reinterpret_cast<uint4*>(c.dst[i] + at) = *reinterpret_cast<const uint4*>(c.src[i] + at);
    else if (c.shift[i] == 2)
      *reinterpret_cast<uint32_t*>(c.dst[i] + at) = *reinterpret_cast<const uint32_t*>(c.src[i] + at);
    else
      c.dst[i][at] = c.src[i][at];
  }
}

}  // namespace

void copy_bytes_many(const std::vector<ByteCopy>& copies) {
  ByteCopies c{};
  auto flush = [&] {
    if (c.n == 0) return;
    constexpr int kThreads = 256;
    const int64_t blocks = std::clamp<int64_t>((c.first[c.n] + kThreads - 1) / kThreads, 1, int64_t{1} << 16);
    launch_pdl(copy_bytes_kernel, static_cast<unsigned>(blocks), kThreads, 0, nullptr, c);
    DI_CUDA_CHECK(cudaGetLastError());
    c = ByteCopies{};
  };
  for (const ByteCopy& b : copies) {
    if (b.bytes <= 0) continue;
    const uintptr_t bits =
        reinterpret_cast<uintptr_t>(b.src) | reinterpret_cast<uintptr_t>(b.dst) | static_cast<uintptr_t>(b.bytes);
    const int shift = bits % 16 == 0 ? 4 : bits % 4 == 0 ? 2 : 0;
    if (c.n == kParamCopies) flush();
    c.src[c.n] = static_cast<const char*>(b.src);
    c.dst[c.n] = static_cast<char*>(b.dst);
    c.shift[c.n] = shift;
    c.first[c.n + 1] = c.first[c.n] + (b.bytes >> shift);
    ++c.n;
  }
  flush();
}

void copy_rows(const std::vector<ops::RowCopy>& copies, int64_t width) {
  std::vector<ops::RowCopy> cs;  // the non-empty ones
  bool aligned = width % 4 == 0;
  int64_t rows = 0;
  for (const ops::RowCopy& c : copies)
    if (c.rows > 0) {
      side_join_if_reads(c.src, static_cast<size_t>(c.rows * width) * sizeof(float));  // as cuda_copy: a side write
      cs.push_back(c);
      aligned = aligned && reinterpret_cast<uintptr_t>(c.src) % 16 == 0 && reinterpret_cast<uintptr_t>(c.dst) % 16 == 0;
      rows += c.rows;
    }
  const int n = static_cast<int>(cs.size());
  if (n == 0 || width == 0) return;
  if (n <= kParamCopies) {  // the table in the launch's parameters: no upload (an eager copy on the step's path)
    std::vector<ByteCopy> bs;
    for (const ops::RowCopy& c : cs) bs.push_back({c.dst, c.src, c.rows * width * static_cast<int64_t>(sizeof(float))});
    copy_bytes_many(bs);
    return;
  }
  if (!aligned) {  // a plain copy each
    flush_deferred();
    for (const ops::RowCopy& c : cs)
      DI_CUDA_CHECK(cudaMemcpyAsync(c.dst, c.src, static_cast<size_t>(c.rows * width) * sizeof(float),
                                    cudaMemcpyDeviceToDevice, current_stream()));
    return;
  }
  // One upload: the first rows [n + 1], the source pointers [n], the destination pointers [n].
  Tensor table = Tensor::empty({3 * static_cast<int64_t>(n) + 1}, DType::kI64);
  int64_t* t = table.data<int64_t>();
  int64_t r = 0;
  for (int i = 0; i < n; ++i) {
    t[i] = r;
    t[n + 1 + i] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(cs[i].src));
    t[2 * n + 1 + i] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(cs[i].dst));
    r += cs[i].rows;
  }
  t[n] = r;
  const Tensor dev_table = table.to(Device::kCUDA);  // queued without a synchronisation; lives until the launch
  const int64_t* first = dev_table.data<int64_t>();
  const int64_t n4 = rows * (width / 4);
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((n4 + kThreads - 1) / kThreads, int64_t{1} << 16);
  launch_pdl(copy_rows_kernel, static_cast<unsigned>(blocks), kThreads, 0, nullptr, first,
             reinterpret_cast<const float* const*>(first + n + 1), reinterpret_cast<float* const*>(first + 2 * n + 1),
             n, n4, static_cast<int>(width / 4));
  DI_CUDA_CHECK(cudaGetLastError());
}

// ---- gather_listed ------------------------------------------------------------------------------------------------
namespace {

// A warp per entry e of the lists (grid-stride): row j = idx[e] of the runs laid end to end into row e of dst, and
// idx[e] = e; an empty entry (j < 0 or j >= the runs' rows) becomes -1. V4: 16-byte units (every run and dst 16-byte
// aligned, width % 4 == 0).
template <class Runs, bool V4>
__global__ void gather_listed_kernel(const __grid_constant__ Runs runs, int32_t* idx, int64_t entries, float* dst,
                                     int width) {
  pdl_wait();
  pdl_launch_dependents();
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  const int64_t n_rows = runs.start(runs.n);
  for (int64_t e = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; e < entries; e += warps) {
    const int64_t j = idx[e];
    const bool valid = j >= 0 && j < n_rows;
    if (valid) {
      const float* src = runs.row(j, width);
      float* out = dst + e * width;
      if (V4) {
        for (int c = lane; c < width / 4; c += 32)
          reinterpret_cast<float4*>(out)[c] = reinterpret_cast<const float4*>(src)[c];
      } else {
        for (int c = lane; c < width; c += 32) out[c] = src[c];
      }
    }
    __syncwarp();  // every lane has read idx[e]
    if (lane == 0) idx[e] = valid ? static_cast<int32_t>(e) : -1;
  }
}

template <class Runs>
void launch_gather_listed(const Runs& runs, bool v4, const Tensor& idx, const Tensor& dst) {
  constexpr int kThreads = 256;
  const int64_t entries = idx.numel();
  const int64_t blocks = std::clamp<int64_t>((entries + kThreads / 32 - 1) / (kThreads / 32), 1, int64_t{1} << 16);
  const int w = static_cast<int>(dst.size(1));
  if (v4)
    launch_pdl(gather_listed_kernel<Runs, true>, static_cast<unsigned>(blocks), kThreads, 0, nullptr, runs,
               idx.data<int32_t>(), entries, dst.data<float>(), w);
  else
    launch_pdl(gather_listed_kernel<Runs, false>, static_cast<unsigned>(blocks), kThreads, 0, nullptr, runs,
               idx.data<int32_t>(), entries, dst.data<float>(), w);
  DI_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void gather_listed(const std::vector<ops::RowSegment>& segments, const Tensor& idx, const Tensor& dst) {
  DI_CHECK(idx.device() == Device::kCUDA && dst.device() == Device::kCUDA && idx.dtype() == DType::kI32 &&
               dst.dtype() == DType::kF32 && idx.is_contiguous() && dst.is_contiguous() && dst.dim() == 2 &&
               dst.size(0) == idx.numel(),
           "cuda::gather_listed: idx {} and dst {}", desc(idx), desc(dst));
  const int64_t width = dst.size(1);
  if (idx.numel() == 0 || width == 0) return;
  const RunTables t = run_tables(segments, width);
  const bool v4 = t.aligned && width % 4 == 0 && reinterpret_cast<uintptr_t>(dst.raw()) % 16 == 0;
  if (t.in_params())  // the table in the launch's parameters: no upload (a decode step at a short context)
    launch_gather_listed(t.param, v4, idx, dst);
  else
    launch_gather_listed(t.uploaded, v4, idx, dst);
}

void copy_into(const Tensor& dst, const Tensor& src) {
  DI_CHECK(dst.defined() && src.defined() && dst.device() == Device::kCUDA && src.device() == Device::kCUDA &&
               dst.is_contiguous() && src.is_contiguous() && dst.shape() == src.shape() && dst.dtype() == src.dtype(),
           "cuda::copy_into: dst {} and src {} must be contiguous CUDA tensors of one shape and dtype", desc(dst),
           desc(src));
  if (src.nbytes() > 0) {
    flush_deferred();
    DI_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDeviceToDevice, current_stream()));
  }
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
  launch_pdl(compress_pool_kernel, grid, 128, 0, nullptr, kv.data<float>(), score.data<float>(),
             ape.defined() ? ape.data<float>() : nullptr, static_cast<int>(r), d, w, overlap, has_prev, lead,
             out.data<float>());
  DI_CUDA_CHECK(cudaGetLastError());
  return out;
}

namespace {
__global__ void scale_kernel(float* x, int64_t n, float s, bool round) {
  pdl_wait();
  pdl_launch_dependents();
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
  launch_pdl(scale_kernel, grid_for(n, 256), 256, 0, nullptr, x.data<float>(), n, s, round);
  DI_CUDA_CHECK(cudaGetLastError());
}

void renorm_heads(Tensor& q, int64_t head_dim, float eps, bool round) {
  check_f32(q, "cuda::renorm_heads", "q");
  DI_CHECK(head_dim >= 1 && q.numel() % head_dim == 0, "cuda::renorm_heads: {} is not whole heads of {}", q.describe(),
           head_dim);
  const int64_t n = q.numel() / head_dim;
  if (n == 0) return;
  const int64_t smem = kRenormWarps * (head_dim + 1) * static_cast<int64_t>(sizeof(float));
  DI_CHECK(smem <= 48 * 1024 && (n + kRenormWarps - 1) / kRenormWarps < (int64_t{1} << 31),
           "cuda::renorm_heads: heads of {} in {} are too large", head_dim, q.describe());
  launch_pdl(renorm_heads_kernel, dim3(static_cast<unsigned>((n + kRenormWarps - 1) / kRenormWarps)), 32 * kRenormWarps,
             smem, nullptr, q.data<float>(), n, static_cast<int>(head_dim), eps, round);
  DI_CUDA_CHECK(cudaGetLastError());
}

// ---- sparse-attention index lists -------------------------------------------------------------------
namespace {

// One thread per (row, block): the block's max score, +inf for the block of the row's newest visible entry.
__global__ void block_max_kernel(const float* scores, int64_t T, int64_t n, int64_t bs, int64_t nb, int64_t start_pos,
                                 int64_t ratio, float* out) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= T * nb) return;
  const int64_t t = i / nb, b = i % nb;
  const float* row = scores + t * n;
  const int64_t end = min(n, (b + 1) * bs);
  float m = -INFINITY;
  for (int64_t j = b * bs; j < end; ++j) {
    const float v = row[j];
    m = v > m ? v : m;  // the value only feeds comparisons: -0 / +0 tie in the top-k either way
  }
  const int64_t visible = min(n, (start_pos + t + 1) / ratio);
  if (visible > 0 && b == (visible - 1) / bs) m = INFINITY;
  out[i] = m;
}

// out [T, keep]: the first kk columns from top [T, kk] (nullptr: none), then -1.
__global__ void pad_ids_kernel(const int32_t* top, int64_t T, int64_t kk, int64_t keep, int32_t* out) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= T * keep) return;
  const int64_t t = i / keep, c = i % keep;
  out[i] = c < kk ? top[t * kk + c] : -1;
}

// One thread per score: kept when its block is in the row's ascending id list (-1 entries trail).
__global__ void mask_to_blocks_kernel(float* scores, const int32_t* blocks, int64_t T, int64_t n, int64_t keep,
                                      int64_t bs) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= T * n) return;
  const int64_t t = i / n, j = i % n;
  const int32_t* row = blocks + t * keep;
  const int64_t b = j / bs;
  int64_t lo = 0, hi = keep;  // the first entry that is -1 or >= b
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    const int32_t v = __ldg(row + mid);
    if (v >= 0 && v < b)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (!(lo < keep && __ldg(row + lo) == b)) scores[i] = -INFINITY;
}

// Entry (t, c) of a chunk's index lists: ops::IndexLayout's rules.
__device__ int32_t index_entry(const ops::IndexLayout& l, int64_t t, int64_t c, const int32_t* picks) {
  const int64_t p = l.start_pos + t;
  int64_t v = -1;
  if (c < l.wcols) {
    const int64_t lo = max(max(int64_t{0}, p - l.window + 1), l.floor);
    const int64_t count = max(int64_t{0}, p - lo + 1);
    const int64_t k = l.pad_front ? c - (l.wcols - count) : c;
    if (k >= 0 && k < count) v = lo + k - l.wstart + l.base;
  } else if (c < l.wcols + l.kcols) {
    const int64_t k = c - l.wcols;
    const int64_t j = picks ? picks[t * l.kcols + k] : (k < (l.ratio > 0 ? (p + 1) / l.ratio : 0) ? k : -1);
    if (j >= 0) v = l.offset + j + l.base;
  }
  return static_cast<int32_t>(v);
}

// One thread per (row, column) of the index lists.
__global__ void sparse_index_kernel(ops::IndexLayout l, int64_t T, const int32_t* picks, int32_t* out) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t width = l.width > 0 ? l.width : l.wcols + l.kcols;
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= T * width) return;
  out[i] = index_entry(l, i / width, i % width, picks);
}

// sparse_index_many: a chunk's layout, its first row in the output and its picks (uploaded as one table).
struct IndexChunkDesc {
  ops::IndexLayout l;
  int64_t row0;
  const int32_t* picks;
};

// One thread per (row, column) of [rows, width]; the row's chunk by binary search over the chunks' first rows.
__global__ void sparse_index_many_kernel(const IndexChunkDesc* chunks, int n, int64_t rows, int64_t width,
                                         int32_t* out) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * width) return;
  const int64_t r = i / width;
  int lo = 0, hi = n - 1;  // the last chunk whose first row is <= r
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (chunks[mid].row0 <= r)
      lo = mid;
    else
      hi = mid - 1;
  }
  const IndexChunkDesc& d = chunks[lo];
  out[i] = index_entry(d.l, r - d.row0, i % width, d.picks);
}

}  // namespace

Tensor candidate_blocks(const Tensor& scores, int64_t start_pos, int64_t ratio, int64_t block_size, int64_t keep) {
  const char* op = "cuda::candidate_blocks";
  check_f32(scores, op, "scores");
  DI_CHECK(scores.dim() == 2 && ratio >= 1 && block_size >= 1 && keep >= 0,
           "{}: scores {} (want [T, n]), ratio {}, block_size {}, keep {}", op, scores.describe(), ratio, block_size,
           keep);
  const int64_t T = scores.size(0), n = scores.size(1), bs = block_size, nb = (n + bs - 1) / bs;
  const int64_t kk = std::min(keep, nb);
  if (T * keep == 0) return Tensor::empty({T, keep}, DType::kI32, Device::kCUDA);
  Tensor top;
  if (kk > 0) {
    Tensor bmax = Tensor::empty({T, nb}, DType::kF32, Device::kCUDA);
    launch_pdl(block_max_kernel, grid_for(T * nb, 256), 256, 0, nullptr, scores.data<float>(), T, n, bs, nb, start_pos,
               ratio, bmax.data<float>());
    DI_CUDA_CHECK(cudaGetLastError());
    top = topk_rows(bmax, kk, /*sort_by_index=*/true);
    if (kk == keep) return top;
  }
  Tensor out = Tensor::empty({T, keep}, DType::kI32, Device::kCUDA);
  launch_pdl(pad_ids_kernel, grid_for(T * keep, 256), 256, 0, nullptr, kk > 0 ? top.data<int32_t>() : nullptr, T, kk,
             keep, out.data<int32_t>());
  DI_CUDA_CHECK(cudaGetLastError());
  return out;
}

void mask_to_blocks(Tensor& scores, const Tensor& blocks, int64_t block_size) {
  const char* op = "cuda::mask_to_blocks";
  check_f32(scores, op, "scores");
  DI_CHECK(scores.dim() == 2 && blocks.defined() && blocks.device() == Device::kCUDA && blocks.dtype() == DType::kI32 &&
               blocks.dim() == 2 && blocks.is_contiguous() && blocks.size(0) == scores.size(0) && block_size >= 1,
           "{}: scores {} and blocks {} (want int32 [T, keep] on CUDA), block_size {}", op, scores.describe(),
           desc(blocks), block_size);
  const int64_t T = scores.size(0), n = scores.size(1), keep = blocks.size(1);
  if (T * n == 0) return;
  launch_pdl(mask_to_blocks_kernel, grid_for(T * n, 256), 256, 0, nullptr, scores.data<float>(), blocks.data<int32_t>(),
             T, n, keep, block_size);
  DI_CUDA_CHECK(cudaGetLastError());
}

Tensor sparse_index(const ops::IndexLayout& layout, int64_t T, const Tensor& picks, const Tensor& into) {
  const char* op = "cuda::sparse_index";
  DI_CHECK(!picks.defined() || (picks.device() == Device::kCUDA && picks.dtype() == DType::kI32 && picks.dim() == 2 &&
                                picks.size(0) == T && picks.size(1) == layout.kcols && picks.is_contiguous()),
           "{}: picks {} are not contiguous int32 [{}, {}] on CUDA", op, desc(picks), T, layout.kcols);
  const int64_t width = layout.width > 0 ? layout.width : layout.wcols + layout.kcols;
  Tensor out = into.defined() ? into : Tensor::empty({T, width}, DType::kI32, Device::kCUDA);  // into: ops checked it
  if (T * width == 0) return out;
  launch_pdl(sparse_index_kernel, grid_for(T * width, 256), 256, 0, nullptr, layout, T,
             picks.defined() ? picks.data<int32_t>() : nullptr, out.data<int32_t>());
  DI_CUDA_CHECK(cudaGetLastError());
  return out;
}

void sparse_index_many(const std::vector<ops::IndexChunk>& chunks, const Tensor& into) {
  std::vector<const ops::IndexChunk*> live;  // chunks with rows
  for (const ops::IndexChunk& k : chunks)
    if (k.T > 0) live.push_back(&k);
  const int64_t rows = into.size(0), width = into.size(1);
  if (rows * width == 0) return;
  if (live.size() == 1) {  // one chunk: its own launch, no table
    sparse_index(live[0]->layout, live[0]->T, live[0]->picks, into);
    return;
  }
  // The table travels as int64 words (the descriptors are 8-byte aligned), in one upload.
  static_assert(sizeof(IndexChunkDesc) % sizeof(int64_t) == 0, "descriptor size");
  const int64_t words = static_cast<int64_t>(live.size() * sizeof(IndexChunkDesc) / sizeof(int64_t));
  Tensor table = Tensor::empty({words}, DType::kI64);
  IndexChunkDesc* d = reinterpret_cast<IndexChunkDesc*>(table.data<int64_t>());
  int64_t r = 0;
  size_t i = 0;
  for (const ops::IndexChunk& k : chunks) {
    if (k.T > 0) d[i++] = IndexChunkDesc{k.layout, r, k.picks.defined() ? k.picks.data<int32_t>() : nullptr};
    r += k.T;
  }
  const Tensor dev_table = table.to(Device::kCUDA);  // queued without a synchronisation; lives until the launch
  launch_pdl(sparse_index_many_kernel, grid_for(rows * width, 256), 256, 0, nullptr,
             reinterpret_cast<const IndexChunkDesc*>(dev_table.data<int64_t>()), static_cast<int>(live.size()), rows,
             width, into.data<int32_t>());
  DI_CUDA_CHECK(cudaGetLastError());
}

}  // namespace deepinfer::cuda
