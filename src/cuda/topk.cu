// CUDA row-wise top-k (radix select, ordered gather, bitonic sort by score). Contract in topk.cuh.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <atomic>
#include <string>

#include "core/env.h"
#include "cuda/common.cuh"
#include "cuda/device.h"
#include "cuda/fp_decode.cuh"
#include "cuda/topk.cuh"

namespace deepinfer::cuda {

namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxK = 4096;
constexpr int kStagedRows = 64;               // staging only for launches of up to this many rows (see topk.cuh)
constexpr int kClusterCtas = 8;               // a cluster row's slices (the portable cluster size)
constexpr int kClusterMinKeys = 8192;         // rows shorter than this stay on one block (a slice of 1k keys or more)
constexpr uint32_t kNegInfKey = 0x007fffffu;  // key of -inf
constexpr unsigned kFull = 0xffffffffu;

std::atomic<int> g_staging{-1};

// Larger float -> larger key (total order on non-NaN values; -0 < +0 is irrelevant: equal scores
// compare by index on the CPU, and -0 == +0 there). Zero signs are merged so that -0 and +0 tie.
__device__ __forceinline__ uint32_t order_key(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) == 0) u = 0;  // -0 -> +0
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// A row's keys: from shared memory when staged, else computed from the scores on every read.
template <bool kStaged>
struct RowKeys {
  const float* row;
  const uint32_t* staged;
  __device__ __forceinline__ uint32_t operator[](int i) const {
    if constexpr (kStaged) {
      return staged[i];
    } else {
      return order_key(row[i]);
    }
  }
};

// hist[bin] += 1 for every lane where `active`, with one atomic per distinct bin of the warp: a row's keys crowd
// into few bins (in the first pass nearly all share the sign and exponent byte), where one atomic per lane would
// serialise on one address.
__device__ __forceinline__ void hist_add(int* hist, uint32_t bin, bool active) {
  const unsigned act = __ballot_sync(kFull, active);
  if (!active) return;
  const unsigned peers = __match_any_sync(act, bin);
  if (static_cast<int>(threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&hist[bin], __popc(peers));
}

// By the first warp: the bin of hist[256] that holds the rem-th largest key (bins in descending order), how many of
// its keys are still to pick, and whether that is all of them.
__device__ __forceinline__ void boundary_bin(const int* hist, int rem, int* s_digit, int* s_rem, int* s_whole) {
  const int lane = threadIdx.x & 31;
  // Lane l owns bins [8l, 8l + 8); suffix sums over lanes find the bin holding the rem-th largest.
  int own = 0;
  for (int b = 0; b < 8; ++b) own += hist[8 * lane + b];
  int suffix = own;  // sum over lanes >= lane
  for (int d = 1; d < 32; d <<= 1) {
    const int v = __shfl_down_sync(kFull, suffix, d);
    if (lane + d < 32) suffix += v;
  }
  const unsigned hit = __ballot_sync(kFull, suffix >= rem);
  const int L = 31 - __clz(hit);  // the highest lane whose suffix still reaches rem
  if (lane == L) {
    int cum = suffix - own;  // count in bins above this lane's
    for (int b = 8 * lane + 7; b >= 8 * lane; --b) {
      if (cum + hist[b] >= rem) {
        *s_digit = b;
        *s_rem = rem - cum;
        *s_whole = hist[b] == rem - cum;
        break;
      }
      cum += hist[b];
    }
  }
}

// Dynamic shared memory: [P] 64-bit sort keys when the list is ordered by score (P = the power of two >= k), then
// the row's [n] staged keys when kStaged.
template <bool kStaged>
__global__ void __launch_bounds__(kThreads)
    topk_rows_kernel(const float* scores, int64_t ld, int n, int k, bool by_index, int32_t* out) {
  pdl_wait();
  pdl_launch_dependents();
  extern __shared__ unsigned long long dyn[];
  __shared__ int hist[256];
  __shared__ int warp_above[kWarps], warp_eq[kWarps];
  __shared__ int s_digit, s_rem, s_whole;
  __shared__ unsigned s_low;
  const float* row = scores + static_cast<int64_t>(blockIdx.x) * ld;
  int32_t* o = out + static_cast<int64_t>(blockIdx.x) * k;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int P = 1;
  while (P < k) P <<= 1;
  unsigned long long* sel = dyn;
  uint32_t* staged = reinterpret_cast<uint32_t*>(dyn + (by_index ? 0 : P));

  // Candidates (everything but -inf), staging the keys on the way.
  int cnt = 0;
#pragma unroll 4
  for (int i = tid; i < n; i += kThreads) {
    const uint32_t key = order_key(row[i]);
    if constexpr (kStaged) staged[i] = key;
    cnt += key != kNegInfKey;
  }
  cnt = block_reduce(cnt, SumOp{}, 0);  // its barriers also publish the staged keys
  const RowKeys<kStaged> keys{row, staged};
  const int m = min(cnt, k);

  // Radix select of the boundary: picked are the keys whose top bits (mask) lie above `prefix`, and the first `rem`
  // in index order of those equal to it. The select ends early once the boundary bin is taken whole, or once the
  // keys still in play have no bits set below the digit just read: they are then equal, and every pass after would
  // find them in bin 0 (scores on the BF16 grid, as index_scores leaves them, need two passes, not four).
  uint32_t prefix = 0, mask = 0;
  int rem = 0;
  const bool all = cnt <= k;
  if (!all) {
    rem = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int b = tid; b < 256; b += kThreads) hist[b] = 0;
      if (tid == 0) s_low = 0;
      __syncthreads();
      const uint32_t low_mask = (1u << shift) - 1u;
      uint32_t low = 0;                           // this thread's in-play keys' bits below the digit, or-ed
      for (int c0 = 0; c0 < n; c0 += kThreads) {  // warp-uniform trip count (hist_add's ballot)
        const int i = c0 + tid;
        const uint32_t key = i < n ? keys[i] : kNegInfKey;
        const bool in_play = key != kNegInfKey && (key & mask) == prefix;
        hist_add(hist, (key >> shift) & 255u, in_play);
        if (in_play) low |= key & low_mask;
      }
      low = __reduce_or_sync(kFull, low);
      if (lane == 0 && low != 0) atomicOr(&s_low, low);
      __syncthreads();
      if (tid < 32) boundary_bin(hist, rem, &s_digit, &s_rem, &s_whole);
      __syncthreads();
      prefix |= static_cast<uint32_t>(s_digit) << shift;
      mask |= 255u << shift;
      rem = s_rem;
      const bool whole = s_whole != 0 || s_low == 0;
      __syncthreads();
      if (whole) break;
    }
  }

  // Ordered gather: warp w owns [lo, hi); pass A counts its picks above the boundary and its keys on it, a scan over
  // the warps gives each its first output slot and its share of the `rem` boundary keys, pass B writes.
  const int seg = ((n + kWarps - 1) / kWarps + 31) & ~31;
  const int lo = min(n, warp * seg), hi = min(n, lo + seg);
  auto above_of = [&](uint32_t key) { return key != kNegInfKey && (all || (key & mask) > prefix); };
  auto on_boundary = [&](uint32_t key) { return !all && key != kNegInfKey && (key & mask) == prefix; };
  int above = 0, eq = 0;
  for (int c0 = lo; c0 < hi; c0 += 32) {
    const int i = c0 + lane;
    const uint32_t key = i < hi ? keys[i] : kNegInfKey;
    above += __popc(__ballot_sync(kFull, above_of(key)));
    eq += __popc(__ballot_sync(kFull, on_boundary(key)));
  }
  if (lane == 0) {
    warp_above[warp] = above;
    warp_eq[warp] = eq;
  }
  __syncthreads();
  int base = 0, eq_before = 0;
  for (int w = 0; w < warp; ++w) {
    base += warp_above[w] + min(max(rem - eq_before, 0), warp_eq[w]);
    eq_before += warp_eq[w];
  }
  const int take = min(max(rem - eq_before, 0), eq);  // this warp's boundary keys to pick, its first ones
  const unsigned below_lane = (1u << lane) - 1u;
  int eq_seen = 0;
  for (int c0 = lo; c0 < hi; c0 += 32) {
    const int i = c0 + lane;
    const uint32_t key = i < hi ? keys[i] : kNegInfKey;
    const bool is_eq = on_boundary(key);
    const unsigned eqb = __ballot_sync(kFull, is_eq);
    const bool pick = above_of(key) || (is_eq && eq_seen + __popc(eqb & below_lane) < take);
    const unsigned pb = __ballot_sync(kFull, pick);
    if (pick) {
      const int pos = base + __popc(pb & below_lane);
      if (by_index) {
        o[pos] = i;
      } else {
        sel[pos] = (static_cast<unsigned long long>(~key) << 32) | static_cast<unsigned long long>(i);
      }
    }
    base += __popc(pb);
    eq_seen += __popc(eqb);
  }
  if (by_index) {  // already in index order
    for (int i = m + tid; i < k; i += kThreads) o[i] = -1;
    return;
  }
  __syncthreads();
  for (int i = m + tid; i < P; i += kThreads) sel[i] = ~0ull;
  __syncthreads();
  // Bitonic sort of sel[0, P), ascending.
  for (int size = 2; size <= P; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = tid; i < P / 2; i += kThreads) {
        const int a_at = 2 * i - (i & (stride - 1));
        const int b_at = a_at + stride;
        const bool up = (a_at & size) == 0;
        const unsigned long long a = sel[a_at], b = sel[b_at];
        if ((a > b) == up) {
          sel[a_at] = b;
          sel[b_at] = a;
        }
      }
      __syncthreads();
    }
  }
  for (int i = tid; i < k; i += kThreads) o[i] = i < m ? static_cast<int32_t>(sel[i] & 0xffffffffull) : -1;
}

// ---- one row over a cluster of CTAs (decode rows of 8k+ keys, listed by index) --------------------------------------
// The select and the ordered gather of topk_rows_kernel with the row cut into kClusterCtas slices in index order, one
// per CTA of a cluster, each staged in its CTA's shared memory: a pass's histogram is the sum of the CTAs' slice
// histograms (read through distributed shared memory, so every CTA finds the same boundary), and the gather's scan
// runs over the CTAs (rank order) before each CTA's warps. A long row's passes then run on eight SMs, not one.
__global__ void __cluster_dims__(kClusterCtas, 1, 1) __launch_bounds__(kThreads)
    topk_cluster_kernel(const float* scores, int64_t ld, int n, int k, int32_t* out) {
  pdl_wait();
  pdl_launch_dependents();
  cg::cluster_group cluster = cg::this_cluster();
  extern __shared__ uint32_t slice_keys[];
  __shared__ int hist[256], ghist[256];
  __shared__ int warp_above[kWarps], warp_eq[kWarps];
  __shared__ int s_cnt, s_total, s_above, s_eq, s_base, s_eq_before;
  __shared__ int s_digit, s_rem, s_whole;
  __shared__ unsigned s_low, s_glow;
  const int rank = static_cast<int>(cluster.block_rank());
  const int64_t t = blockIdx.x / kClusterCtas;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int per = ((n + kClusterCtas - 1) / kClusterCtas + 31) & ~31;
  const int s_lo = min(n, rank * per), s_n = min(n, s_lo + per) - s_lo;
  const float* row = scores + t * ld + s_lo;
  int32_t* o = out + t * k;

  int cnt = 0;
#pragma unroll 4
  for (int i = tid; i < s_n; i += kThreads) {
    const uint32_t key = order_key(row[i]);
    slice_keys[i] = key;
    cnt += key != kNegInfKey;
  }
  cnt = block_reduce(cnt, SumOp{}, 0);
  if (tid == 0) s_cnt = cnt;
  cluster.sync();
  if (warp == 0) {
    int v = lane < kClusterCtas ? *cluster.map_shared_rank(&s_cnt, lane) : 0;
    for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(kFull, v, d);
    if (lane == 0) s_total = v;
  }
  __syncthreads();
  const int total = s_total;
  const int m = min(total, k);
  const bool all = total <= k;

  uint32_t prefix = 0, mask = 0;
  int rem = 0;
  if (!all) {
    rem = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int b = tid; b < 256; b += kThreads) hist[b] = 0;
      if (tid == 0) s_low = 0;
      __syncthreads();
      const uint32_t low_mask = (1u << shift) - 1u;
      uint32_t low = 0;
      for (int c0 = 0; c0 < s_n; c0 += kThreads) {
        const int i = c0 + tid;
        const uint32_t key = i < s_n ? slice_keys[i] : kNegInfKey;
        const bool in_play = key != kNegInfKey && (key & mask) == prefix;
        hist_add(hist, (key >> shift) & 255u, in_play);
        if (in_play) low |= key & low_mask;
      }
      low = __reduce_or_sync(kFull, low);
      if (lane == 0 && low != 0) atomicOr(&s_low, low);
      cluster.sync();  // every slice's histogram is complete
      if (tid < 256) {
        int v = 0;
        for (int r = 0; r < kClusterCtas; ++r) v += cluster.map_shared_rank(hist, r)[tid];
        ghist[tid] = v;
      }
      if (tid == 256) {
        unsigned l = 0;
        for (int r = 0; r < kClusterCtas; ++r) l |= *cluster.map_shared_rank(&s_low, r);
        s_glow = l;
      }
      __syncthreads();
      if (tid < 32) boundary_bin(ghist, rem, &s_digit, &s_rem, &s_whole);
      __syncthreads();
      prefix |= static_cast<uint32_t>(s_digit) << shift;
      mask |= 255u << shift;
      rem = s_rem;
      const bool whole = s_whole != 0 || s_glow == 0;
      cluster.sync();  // no CTA reads this one's histogram any more: the next pass may clear it
      if (whole) break;
    }
  }

  const int seg = ((s_n + kWarps - 1) / kWarps + 31) & ~31;
  const int lo = min(s_n, warp * seg), hi = min(s_n, lo + seg);
  auto above_of = [&](uint32_t key) { return key != kNegInfKey && (all || (key & mask) > prefix); };
  auto on_boundary = [&](uint32_t key) { return !all && key != kNegInfKey && (key & mask) == prefix; };
  int above = 0, eq = 0;
  for (int c0 = lo; c0 < hi; c0 += 32) {
    const int i = c0 + lane;
    const uint32_t key = i < hi ? slice_keys[i] : kNegInfKey;
    above += __popc(__ballot_sync(kFull, above_of(key)));
    eq += __popc(__ballot_sync(kFull, on_boundary(key)));
  }
  if (lane == 0) {
    warp_above[warp] = above;
    warp_eq[warp] = eq;
  }
  __syncthreads();
  if (tid == 0) {
    int a = 0, e = 0;
    for (int w = 0; w < kWarps; ++w) a += warp_above[w], e += warp_eq[w];
    s_above = a;
    s_eq = e;
  }
  cluster.sync();
  if (tid == 0) {  // the slots and boundary keys of the slices before this one
    int base = 0, eq_before = 0;
    for (int r = 0; r < rank; ++r) {
      const int e = *cluster.map_shared_rank(&s_eq, r);
      base += *cluster.map_shared_rank(&s_above, r) + min(max(rem - eq_before, 0), e);
      eq_before += e;
    }
    s_base = base;
    s_eq_before = eq_before;
  }
  cluster.sync();  // also: no CTA leaves while another still reads its counts
  int base = s_base, eq_before = s_eq_before;
  for (int w = 0; w < warp; ++w) {
    base += warp_above[w] + min(max(rem - eq_before, 0), warp_eq[w]);
    eq_before += warp_eq[w];
  }
  const int take = min(max(rem - eq_before, 0), eq);
  const unsigned below_lane = (1u << lane) - 1u;
  int eq_seen = 0;
  for (int c0 = lo; c0 < hi; c0 += 32) {
    const int i = c0 + lane;
    const uint32_t key = i < hi ? slice_keys[i] : kNegInfKey;
    const bool is_eq = on_boundary(key);
    const unsigned eqb = __ballot_sync(kFull, is_eq);
    const bool pick = above_of(key) || (is_eq && eq_seen + __popc(eqb & below_lane) < take);
    const unsigned pb = __ballot_sync(kFull, pick);
    if (pick) o[base + __popc(pb & below_lane)] = s_lo + i;
    base += __popc(pb);
    eq_seen += __popc(eqb);
  }
  for (int i = m + rank * kThreads + tid; i < k; i += kThreads * kClusterCtas) o[i] = -1;
}

// 0: every row from global memory; 1: a row staged in one block's shared memory where it fits; 2: as 1, but a decode
// row of kClusterMinKeys+ keys listed by index over a cluster of CTAs (topk_cluster_kernel).
int staging_mode() {
  static const int env = [] {
    const std::string v = env_value("DEEPINFER_CUDA_TOPK_STAGE");
    DI_CHECK(v == "0" || v == "1" || v == "2", "DEEPINFER_CUDA_TOPK_STAGE must be '0', '1' or '2' (got '{}')", v);
    return v[0] - '0';
  }();
  const int mode = g_staging.load(std::memory_order_relaxed);
  return mode < 0 ? env : mode;
}

// A staging kernel's room for dynamic shared memory (the opt-in limit less its static arrays), raised once.
template <typename Kernel>
size_t room_of(Kernel kernel) {
  cudaFuncAttributes a{};
  DI_CUDA_CHECK(cudaFuncGetAttributes(&a, kernel));
  const size_t r = static_cast<size_t>(smem_optin()) - a.sharedSizeBytes;
  DI_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(r)));
  return r;
}
size_t staged_room() {
  static const size_t room = room_of(topk_rows_kernel<true>);
  return room;
}
size_t cluster_room() {
  static const size_t room = room_of(topk_cluster_kernel);
  return room;
}

// The scores' and k's checks (both entry points, before anything is allocated).
void check_args(const Tensor& scores, int64_t k) {
  const char* op = "cuda::topk_rows";
  DI_CHECK(scores.defined() && scores.device() == Device::kCUDA && scores.dtype() == DType::kF32 && scores.dim() == 2 &&
               (scores.size(1) <= 1 || scores.strides()[1] == 1),
           "{}: expected float32 [T, n] on CUDA with dense rows, got {}", op,
           scores.defined() ? scores.describe() : std::string("undefined"));
  DI_CHECK(k >= 0 && k <= kMaxK, "{}: k = {} outside [0, {}]", op, k, kMaxK);
  DI_CHECK(scores.size(1) < (int64_t{1} << 31) && scores.size(0) < (int64_t{1} << 31), "{}: {} is too large", op,
           scores.describe());
}

}  // namespace

void topk_set_staging(int mode) { g_staging.store(mode < 0 ? -1 : (mode > 2 ? 2 : mode), std::memory_order_relaxed); }

void topk_rows_into(const Tensor& scores, int64_t k, bool sort_by_index, Tensor& out, CUstream_st* stream) {
  check_args(scores, k);
  const int64_t T = scores.size(0), n = scores.size(1);
  DI_CHECK(out.defined() && out.device() == Device::kCUDA && out.dtype() == DType::kI32 && out.dim() == 2 &&
               out.size(0) == T && out.size(1) == k && out.is_contiguous(),
           "cuda::topk_rows: expected the output int32 [{}, {}] on CUDA, dense, got {}", T, k,
           out.defined() ? out.describe() : std::string("undefined"));
  if (T == 0 || k == 0) return;
  int64_t P = 1;
  while (P < k) P <<= 1;
  const size_t sort_bytes = sort_by_index ? 0 : static_cast<size_t>(P) * sizeof(unsigned long long);
  const size_t staged_bytes = sort_bytes + static_cast<size_t>(n) * sizeof(uint32_t);
  auto* st = reinterpret_cast<cudaStream_t>(stream);
  const int mode = staging_mode();
  const int64_t per = ((n + kClusterCtas - 1) / kClusterCtas + 31) & ~int64_t{31};
  if (mode == 2 && sort_by_index && T <= kStagedRows && n >= kClusterMinKeys &&
      static_cast<size_t>(per) * sizeof(uint32_t) <= cluster_room()) {
    launch_pdl(topk_cluster_kernel, static_cast<unsigned>(T * kClusterCtas), kThreads,
               static_cast<size_t>(per) * sizeof(uint32_t), st, scores.data<float>(), scores.strides()[0],
               static_cast<int>(n), static_cast<int>(k), out.data<int32_t>());
  } else if (mode >= 1 && T <= kStagedRows && staged_bytes <= staged_room()) {
    launch_pdl(topk_rows_kernel<true>, static_cast<unsigned>(T), kThreads, staged_bytes, st, scores.data<float>(),
               scores.strides()[0], static_cast<int>(n), static_cast<int>(k), sort_by_index, out.data<int32_t>());
  } else {  // sort_bytes <= 32 KiB: within the default dynamic limit
    launch_pdl(topk_rows_kernel<false>, static_cast<unsigned>(T), kThreads, sort_bytes, st, scores.data<float>(),
               scores.strides()[0], static_cast<int>(n), static_cast<int>(k), sort_by_index, out.data<int32_t>());
  }
  DI_CUDA_CHECK(cudaGetLastError());
}

Tensor topk_rows(const Tensor& scores, int64_t k, bool sort_by_index) {
  check_args(scores, k);
  Tensor out = Tensor::empty({scores.size(0), k}, DType::kI32, Device::kCUDA);
  topk_rows_into(scores, k, sort_by_index, out);
  return out;
}

}  // namespace deepinfer::cuda
