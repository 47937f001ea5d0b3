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

// Where the radix select stands: picked are the keys whose top bits (mask) lie above `prefix`, and the first `rem` in
// index order of those equal to it; with `all` (no more candidates than k) every candidate.
struct Boundary {
  uint32_t prefix = 0, mask = 0;
  int rem = 0;
  bool all = true;
  // Before the first pass, over `candidates` keys.
  __device__ Boundary(int candidates, int k) : rem(candidates <= k ? 0 : k), all(candidates <= k) {}
  __device__ bool in_play(uint32_t key) const { return key != kNegInfKey && (key & mask) == prefix; }
  __device__ bool above(uint32_t key) const { return key != kNegInfKey && (all || (key & mask) > prefix); }
  __device__ bool on(uint32_t key) const { return !all && in_play(key); }
  // The bin the pass at `shift` found (boundary_bin): its keys are the ones in play from now on.
  __device__ void narrow(int digit, int shift, int left) {
    prefix |= static_cast<uint32_t>(digit) << shift;
    mask |= 255u << shift;
    rem = left;
  }
};

// Clears a radix pass's histogram and low bits (a barrier must follow).
__device__ __forceinline__ void clear_pass(int* hist, unsigned* low) {
  for (int b = threadIdx.x; b < 256; b += kThreads) hist[b] = 0;
  if (threadIdx.x == 0) *low = 0;
}

// One radix pass over this block's keys [0, n): hist counts the digit at `shift` of every key in play, and *low
// gathers the or of their bits below that digit: zero means the keys still in play are equal once the digit is
// chosen, and the passes after it would find them all in bin 0.
template <class Keys>
__device__ void hist_pass(const Keys& keys, int n, int shift, const Boundary& bd, int* hist, unsigned* low_out) {
  const uint32_t low_mask = (1u << shift) - 1u;
  uint32_t low = 0;
  for (int c0 = 0; c0 < n; c0 += kThreads) {  // warp-uniform trip count (hist_add's ballot)
    const int i = c0 + static_cast<int>(threadIdx.x);
    const uint32_t key = i < n ? keys[i] : kNegInfKey;
    const bool in_play = bd.in_play(key);
    hist_add(hist, (key >> shift) & 255u, in_play);
    if (in_play) low |= key & low_mask;
  }
  low = __reduce_or_sync(kFull, low);
  if ((threadIdx.x & 31) == 0 && low != 0) atomicOr(low_out, low);
}

// The ordered gather, by warps that each own a contiguous stretch [lo, hi) of the block's n keys in index order
// (whole 32-key steps). Pass A: the warp's keys above the boundary and on it, into warp_above / warp_on (a barrier
// must follow before they are read); every lane gets its warp's stretch and its count on the boundary.
template <class Keys>
__device__ void gather_counts(const Keys& keys, int n, const Boundary& bd, int* warp_above, int* warp_on, int* lo,
                              int* hi, int* on) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int seg = ((n + kWarps - 1) / kWarps + 31) & ~31;
  *lo = min(n, warp * seg);
  *hi = min(n, *lo + seg);
  int a = 0, e = 0;
  for (int c0 = *lo; c0 < *hi; c0 += 32) {
    const int i = c0 + lane;
    const uint32_t key = i < *hi ? keys[i] : kNegInfKey;
    a += __popc(__ballot_sync(kFull, bd.above(key)));
    e += __popc(__ballot_sync(kFull, bd.on(key)));
  }
  if (lane == 0) {
    warp_above[warp] = a;
    warp_on[warp] = e;
  }
  *on = e;
}

// The gather's scan over stretches in index order (the CTAs of a cluster, then a CTA's warps): advances *base (output
// slots) and *on_before (boundary keys) past the first `count` stretches, whose counts above the boundary and on it
// are above[] / on[]; each stretch picks its first boundary keys while fewer than rem have been picked before it.
__device__ __forceinline__ void scan_slots(const int* above, const int* on, int count, int rem, int* base,
                                           int* on_before) {
  for (int w = 0; w < count; ++w) {
    *base += above[w] + min(max(rem - *on_before, 0), on[w]);
    *on_before += on[w];
  }
}
// How many of its `on` boundary keys a stretch picks (its first ones), after `on_before` boundary keys before it.
__device__ __forceinline__ int take_of(int rem, int on_before, int on) { return min(max(rem - on_before, 0), on); }

// Pass B: emit(pos, i, key) for every pick of [lo, hi), at positions base, base + 1, ... in index order.
template <class Keys, class Emit>
__device__ void warp_picks(const Keys& keys, int lo, int hi, const Boundary& bd, int base, int take, Emit emit) {
  const int lane = threadIdx.x & 31;
  const unsigned below_lane = (1u << lane) - 1u;
  int on_seen = 0;
  for (int c0 = lo; c0 < hi; c0 += 32) {
    const int i = c0 + lane;
    const uint32_t key = i < hi ? keys[i] : kNegInfKey;
    const bool is_on = bd.on(key);
    const unsigned onb = __ballot_sync(kFull, is_on);
    const bool pick = bd.above(key) || (is_on && on_seen + __popc(onb & below_lane) < take);
    const unsigned pb = __ballot_sync(kFull, pick);
    if (pick) emit(base + __popc(pb & below_lane), i, key);
    base += __popc(pb);
    on_seen += __popc(onb);
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
  __shared__ int warp_above[kWarps], warp_on[kWarps];
  __shared__ int s_digit, s_rem, s_whole;
  __shared__ unsigned s_low;
  const float* row = scores + static_cast<int64_t>(blockIdx.x) * ld;
  int32_t* o = out + static_cast<int64_t>(blockIdx.x) * k;
  const int tid = threadIdx.x, warp = tid >> 5;
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

  // Radix select of the boundary, 8 bits a pass. It ends early once the boundary bin is taken whole, or once the keys
  // still in play are equal (hist_pass): scores on the BF16 grid, as index_scores leaves them, take two passes.
  Boundary bd(cnt, k);
  if (!bd.all) {
    for (int shift = 24; shift >= 0; shift -= 8) {
      clear_pass(hist, &s_low);
      __syncthreads();
      hist_pass(keys, n, shift, bd, hist, &s_low);
      __syncthreads();
      if (tid < 32) boundary_bin(hist, bd.rem, &s_digit, &s_rem, &s_whole);
      __syncthreads();
      bd.narrow(s_digit, shift, s_rem);
      const bool whole = s_whole != 0 || s_low == 0;
      __syncthreads();
      if (whole) break;
    }
  }

  // Ordered gather (gather_counts, scan_slots, warp_picks).
  int lo, hi, on, base = 0, on_before = 0;
  gather_counts(keys, n, bd, warp_above, warp_on, &lo, &hi, &on);
  __syncthreads();
  scan_slots(warp_above, warp_on, warp, bd.rem, &base, &on_before);
  warp_picks(keys, lo, hi, bd, base, take_of(bd.rem, on_before, on), [&](int pos, int i, uint32_t key) {
    if (by_index) {
      o[pos] = i;
    } else {
      sel[pos] = (static_cast<unsigned long long>(~key) << 32) | static_cast<unsigned long long>(i);
    }
  });
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
  __shared__ int warp_above[kWarps], warp_on[kWarps];
  __shared__ int cta_above[kClusterCtas], cta_on[kClusterCtas];
  __shared__ int s_cnt, s_total, s_above, s_on;
  __shared__ int s_digit, s_rem, s_whole;
  __shared__ unsigned s_low, s_glow;
  const int rank = static_cast<int>(cluster.block_rank());
  const int64_t t = blockIdx.x / kClusterCtas;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int per = ((n + kClusterCtas - 1) / kClusterCtas + 31) & ~31;
  const int s_lo = min(n, rank * per), s_n = min(n, s_lo + per) - s_lo;
  const float* row = scores + t * ld + s_lo;
  int32_t* o = out + t * k;
  const RowKeys<true> keys{nullptr, slice_keys};

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

  Boundary bd(total, k);
  if (!bd.all) {
    for (int shift = 24; shift >= 0; shift -= 8) {
      clear_pass(hist, &s_low);
      __syncthreads();
      hist_pass(keys, s_n, shift, bd, hist, &s_low);
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
      if (tid < 32) boundary_bin(ghist, bd.rem, &s_digit, &s_rem, &s_whole);
      __syncthreads();
      bd.narrow(s_digit, shift, s_rem);
      const bool whole = s_whole != 0 || s_glow == 0;
      cluster.sync();  // no CTA reads this one's histogram any more: the next pass may clear it
      if (whole) break;
    }
  }

  int lo, hi, on, base = 0, on_before = 0;
  gather_counts(keys, s_n, bd, warp_above, warp_on, &lo, &hi, &on);
  __syncthreads();
  if (tid == 0) {  // this slice's counts, for the CTAs after it
    int a = 0, e = 0;
    for (int w = 0; w < kWarps; ++w) a += warp_above[w], e += warp_on[w];
    s_above = a;
    s_on = e;
  }
  cluster.sync();
  if (tid < kClusterCtas) {  // every slice's counts, read in parallel
    cta_above[tid] = *cluster.map_shared_rank(&s_above, tid);
    cta_on[tid] = *cluster.map_shared_rank(&s_on, tid);
  }
  cluster.sync();  // also: no CTA leaves while another still reads its counts
  scan_slots(cta_above, cta_on, rank, bd.rem, &base, &on_before);  // the slices before this one
  scan_slots(warp_above, warp_on, warp, bd.rem, &base, &on_before);
  warp_picks(keys, lo, hi, bd, base, take_of(bd.rem, on_before, on),
             [&](int pos, int i, uint32_t) { o[pos] = s_lo + i; });
  for (int i = m + rank * kThreads + tid; i < k; i += kThreads * kClusterCtas) o[i] = -1;
}

// 0: every row from global memory; 1: a row staged in one block's shared memory where it fits; 2: as 1, but a decode
// row of kClusterMinKeys+ keys listed by index over a cluster of CTAs (topk_cluster_kernel).
int staging_mode() {
  static const int env = env_switch("DEEPINFER_CUDA_TOPK_STAGE", 2);
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
