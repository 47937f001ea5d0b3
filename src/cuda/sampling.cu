// CUDA sampling (sample() of sampler.h on GPU rows, bit for bit). Contract and design in sampling.cuh.
//
// Exactness, step by step (the CPU code is src/sampling/sampler.cpp):
//   - every FP32 operation of the CPU is done with the same operation (the _rn intrinsics, no FMA; the build
//     also passes --fmad=false): penalties, temperature division, x - max, the exp_nonpos polynomial, so the
//     processed logits and the weights w_i have the CPU's bits; masses (uint64)(double(w) * 2^40 + 0.5) too;
//   - every order-dependent choice is an integer one: maxima and top_k by 64-bit keys, top_p by integer
//     masses and ceil(top_p * total) rounded as the CPU's x87 long double product (see top_p_ceil);
//   - the race key -log(u) / w uses CUDA's double log (max 1 ulp), glibc's may differ by an ulp or two: the
//     GPU returns every token whose key is within 2^-30 of the GPU minimum (the CPU winner is provably among
//     them, the differences are < 2^-50 relative) and the host recomputes those keys with std::log;
//   - logprobs: the FP64 sum is the CPU's 8 sequential lanes, same terms, same order; log and the final
//     double -> float roundings run on the host with glibc, so they are the CPU's bits.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include "cuda/common.cuh"
#include "cuda/device.h"
#include "cuda/fp_decode.cuh"
#include "cuda/sampling.cuh"
#include "sampling/rng.h"

namespace deepinfer::cuda {

namespace {

constexpr int kThreads = 512;            // one block per row
constexpr int kBins = 2048;              // 11-bit digits (and the CPU's 2048 top_p buckets)
constexpr int kCollect = 1024;           // a select finishes in shared memory once <= this many candidates remain
constexpr int kMaxCand = 8;              // near-tied race keys sent back per row
constexpr int kMaxTop = 32;              // top logprobs done on the GPU (the API allows 20)
constexpr int64_t kMaxVocab = 1 << 20;   // the penalty bitmap lives in shared memory
constexpr double kCandMargin = 0x1p-30;  // race keys within this relative margin of the min go to the host
static_assert(kBins == 4 * kThreads, "find_digit gives every thread 4 bins");

// Row flags (RowParams::flags).
constexpr uint32_t kGreedy = 1, kHasMask = 2, kSkip = 4;
// kPlain: greedy with no penalty, mask or logprobs, whose pass 1 (bad logits, the raw argmax) is
// split over kSlices blocks by row_scan_kernel: one block of sample_kernel reading a 505 KB row one
// strided load after another per thread took ~0.1 ms, most of a batch-1 greedy step's sampling.
constexpr uint32_t kPlain = 8;
constexpr int kSlices = 32;
// kRace: a sampled row with no penalty, mask, top_k, top_p or logprobs (temperature and min_p only: the default of
// the OpenAI and DeepSeek APIs). Its pass 1 is row_scan_kernel's, and its race (step 8) is split over kRaceSlices
// blocks (race_kernel, then race_cand_kernel for the near-tied keys): in sample_kernel's one block per row the race
// over a 129,280-token row took ~0.3 ms (two passes of a Philox block, 4 weights and a bound per 4 tokens, 63 of them
// per thread), a fifth of a batch-1 engine step (ktrace, bench/RESULTS.md).
constexpr uint32_t kRace = 16;
constexpr int kRaceSlices = 64;
// Calls of more rows keep the race in sample_kernel: their blocks fill the GPU, and the split's extra passes cost as
// much as they save or more (bench_cuda_sampler, T 1.0, ms: 1 row 0.06 against 0.26, 32 rows 0.17-0.20 against
// 0.28-0.30, 64 rows 0.29 against 0.30, 256 rows 1.02 against 0.72).
constexpr int64_t kRaceMaxRows = 32;
constexpr int kRaceThreads = 256;
// Penalty list flags (SpecialEntry::flags).
constexpr uint32_t kRep = 1, kFreqPres = 2, kMaskTok = 4;
// RowCore::status.
constexpr int32_t kOk = 0, kBadLogit = 1, kEmptyMask = 2, kNothing = 3, kFallback = 4;

struct RowParams {
  uint64_t seed;
  uint64_t position;
  float temperature, top_p, min_p, rep, freq, pres;
  int32_t top_k;
  int32_t logprobs;
  uint32_t flags;
  uint32_t mask_word;   // the row's first word in the mask area
  uint32_t spec_begin;  // the row's penalty entries in the entry area
  uint32_t spec_count;
};

struct SpecialEntry {
  int32_t token;
  int32_t count;  // occurrences in the output
  uint32_t flags;
};

struct Candidate {
  int32_t id;
  uint32_t word;  // the token's Philox word
  float w;        // its final weight
};

struct RowCore {
  int32_t status;
  int32_t token;  // greedy: the argmax; else the GPU's race winner
  int32_t bad_index;
  float bad_value;
  int32_t n_cand;  // near-tied race keys (> kMaxCand: only the first kMaxCand stored)
  int32_t pad;
  Candidate cand[kMaxCand];
};

struct RowLogprobs {
  double sum;    // the CPU's sum_exp over the raw row
  int64_t rank;  // of RowCore::token
  float mx_raw;  // the raw row's max (value at its first index)
  float token_raw;
  int32_t n_top;
  int32_t pad;
  int32_t top_id[kMaxTop];  // best first
  float top_val[kMaxTop];   // their raw logits
};

struct KernelArgs {
  const float* logits;
  int64_t row_stride;
  int V;
  int lo_bits;    // bits of V - 1: the id part of a key
  int ld_digits;  // significand bits of the host's long double (the CPU's top_p target)
  const RowParams* params;
  const SpecialEntry* entries;
  const uint32_t* masks;
  float* overlay;       // [R, V], only the marked tokens are touched
  int32_t* part_bad;    // [R, kSlices]: row_scan_kernel's first non-finite index per slice (INT_MAX: none)
  uint64_t* part_best;  // [R, kSlices]: its best rank_key per slice (0: no finite logit)
  double* race_key;     // [R, kRaceSlices]: race_kernel's smallest key per slice (inf: none)
  int32_t* race_id;     // [R, kRaceSlices]: the lowest id with that key
  int32_t* cand_n;      // [R]: race_cand_kernel's near-tied keys (only the first kMaxCand stored)
  Candidate* cand;      // [R, kMaxCand]
  RowCore* core;
  RowLogprobs* lp;
};

// ---- the CPU's arithmetic ----------------------------------------------------------------------------

// sampler.cpp's exp_nonpos, operation for operation (constants are the float values of 1/720 ... 1/6).
__device__ __forceinline__ float exp_nonpos(float x) {
  const bool under = x < -87.0f;
  const float xc = under ? -87.0f : x;
  const float t = __fadd_rn(__fmul_rn(xc, 1.44269504f), 12582912.0f);
  const float n = __fsub_rn(t, 12582912.0f);
  const float r = __fsub_rn(__fsub_rn(xc, __fmul_rn(n, 0.693145752f)), __fmul_rn(n, 1.42860677e-6f));
  float p = 0x1.6c16c2p-10f;
  p = __fadd_rn(__fmul_rn(p, r), 0x1.111112p-7f);
  p = __fadd_rn(__fmul_rn(p, r), 0x1.555556p-5f);
  p = __fadd_rn(__fmul_rn(p, r), 0x1.555556p-3f);
  p = __fadd_rn(__fmul_rn(p, r), 0.5f);
  p = __fadd_rn(__fmul_rn(p, r), 1.0f);
  p = __fadd_rn(__fmul_rn(p, r), 1.0f);
  const uint32_t e = (__float_as_uint(t) - 0x4B400000u + 127u) << 23;
  const float v = __fmul_rn(p, __uint_as_float(e));
  return under ? 0.0f : v;
}

// top_p mass of a weight: (uint64_t)(double(w) * 2^40 + 0.5).
__device__ __forceinline__ uint64_t mass_of(float w) {
  return __double2ull_rz(__dadd_rn(__dmul_rn(static_cast<double>(w), 0x1p40), 0.5));
}

// Order-preserving 32-bit image of a float (-0 and +0 tie, as rank_key's v + 0.0f).
__device__ __forceinline__ uint32_t ord32(float v) {
  uint32_t u = __float_as_uint(v);
  if ((u & 0x7fffffffu) == 0) u = 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
// (value desc, id asc) as one integer, larger = better: the CPU's rank_key order (ids counted from V - 1 down
// so that the id part needs only lo_bits bits).
__device__ __forceinline__ uint64_t rank_key(float v, int i, int V) {
  return (static_cast<uint64_t>(ord32(v)) << 32) | static_cast<uint32_t>(V - 1 - i);
}

__device__ __forceinline__ uint4 philox_block(uint64_t seed, uint64_t pos, uint64_t draw) {
  uint32_t c0 = static_cast<uint32_t>(pos), c1 = static_cast<uint32_t>(pos >> 32);
  uint32_t c2 = static_cast<uint32_t>(draw), c3 = static_cast<uint32_t>(draw >> 32);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    const uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    const uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return make_uint4(c0, c1, c2, c3);
}
__device__ __forceinline__ uint32_t philox_word(const uint4& r, int j) {
  return j == 0 ? r.x : (j == 1 ? r.y : (j == 2 ? r.z : r.w));
}
__device__ __forceinline__ double open01(uint32_t x) { return (static_cast<double>(x) + 0.5) * 0x1p-32; }

// ceil(T) of the CPU's top_p target T = (long double)top_p * (long double)total: the exact product
// m * total * 2^e rounded to `digits` significant bits (nearest even; x87: 64), then rounded up to an integer.
// acc < T for an integer acc is then acc < ceil(T), an integer comparison.
__device__ uint64_t top_p_ceil(float top_p, uint64_t total, int digits) {
  const uint32_t b = __float_as_uint(top_p);
  const int ex = static_cast<int>((b >> 23) & 0xffu);
  uint64_t m = b & 0x7fffffu;
  int e = -149;
  if (ex != 0) {
    m |= 0x800000u;
    e = ex - 150;
  }
  unsigned __int128 q = static_cast<unsigned __int128>(m) * total;
  if (q == 0) return 0;
  const uint64_t hi = static_cast<uint64_t>(q >> 64), lo = static_cast<uint64_t>(q);
  const int nb = hi ? 128 - __clzll(static_cast<long long>(hi)) : 64 - __clzll(static_cast<long long>(lo));
  if (nb > digits) {
    const int d = nb - digits;
    const unsigned __int128 one = 1;
    const unsigned __int128 rem = q & ((one << d) - 1), half = one << (d - 1);
    q >>= d;
    if (rem > half || (rem == half && (q & 1))) ++q;
    e += d;
  }
  if (e >= 0) return static_cast<uint64_t>(q << e);  // <= total: fits
  const int s = -e;
  if (s >= 128) return 1;  // 0 < T < 1
  const unsigned __int128 one = 1;
  return static_cast<uint64_t>((q >> s) + ((q & ((one << s) - 1)) != 0 ? 1 : 0));
}

// ---- block helpers -----------------------------------------------------------------------------------

struct MinOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a < b ? a : b;
  }
};

// Sum over the threads with a larger index (exclusive suffix sum), for 64-bit values.
__device__ uint64_t block_suffix_excl(uint64_t v, uint64_t* warp_tot) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint64_t incl = v;
  for (int o = 1; o < 32; o <<= 1) {
    const uint64_t n = __shfl_down_sync(0xffffffffu, incl, o);
    if (lane + o < 32) incl += n;
  }
  __syncthreads();  // warp_tot may still be read by a previous call
  if (lane == 0) warp_tot[warp] = incl;
  __syncthreads();
  uint64_t above = incl - v;
  for (int w = warp + 1; w < kThreads / 32; ++w) above += warp_tot[w];
  return above;
}

// Shared memory of the selects (dynamic, carved by the kernel).
struct SelectMem {
  uint32_t* cnt;   // [kBins]
  uint64_t* wsum;  // [kBins]
  uint64_t* ckey;  // [kCollect]
  uint64_t* cw;    // [kCollect]
};

struct BlockVars {
  uint64_t warp_tot[kThreads / 32];
  uint64_t above;
  int count;
  int n;
  int bucket;
  int n_cand;
  Candidate cand[kMaxCand];
  int top_n;
  uint64_t top_key[kMaxTop];
  float top_val[kMaxTop];
  int top_id[kMaxTop];
};

// Adds (1, weight) to bin `digit` for the lanes with `valid`, aggregated over the lanes of the warp that share
// a bin (a warp of one bin issues one atomic, not 32). Every lane of the warp must call it.
__device__ __forceinline__ void hist_add(bool valid, uint32_t digit, uint64_t weight, bool unit, SelectMem sm) {
  if (__ballot_sync(0xffffffffu, valid) == 0) return;
  const uint32_t d = valid ? digit : 0xffffffffu;
  const unsigned peers = __match_any_sync(0xffffffffu, d);
  const int lane = threadIdx.x & 31;
  uint64_t wsum = 0;
  if (!unit) {
    for (int j = 0; j < 32; ++j) {
      const uint64_t wj = __shfl_sync(0xffffffffu, weight, j);
      if ((peers >> j) & 1u) wsum += wj;
    }
  }
  if (valid && lane == __ffs(peers) - 1) {
    atomicAdd(&sm.cnt[d], static_cast<uint32_t>(__popc(peers)));
    if (!unit && wsum != 0) atomicAdd(reinterpret_cast<unsigned long long*>(&sm.wsum[d]), wsum);
  }
}

__device__ void clear_bins(SelectMem sm) {
  __syncthreads();  // the bins may still be read
  for (int b = threadIdx.x; b < kBins; b += kThreads) {
    sm.cnt[b] = 0;
    sm.wsum[b] = 0;
  }
  __syncthreads();
}

// The smallest key among the valid elements whose weight above (the weights of the valid elements with larger
// keys, plus `above0`) is < target; ~0 if none. elem(i, key, weight) -> valid. Keys must be unique. `known`: the
// number of valid elements if known (else INT_MAX). unit: every weight is 1.
template <class Elem>
__device__ uint64_t select_cut(const Elem& elem, int V, int lo_bits, uint64_t target, uint64_t above0, int known,
                               bool unit, SelectMem sm, BlockVars& bv) {
  int shifts[8], widths[8], nd = 0;
  shifts[nd] = 53, widths[nd++] = 11;
  shifts[nd] = 42, widths[nd++] = 11;
  shifts[nd] = 32, widths[nd++] = 10;
  for (int left = lo_bits; left > 0;) {
    const int w = left < 11 ? left : 11;
    left -= w;
    shifts[nd] = left, widths[nd++] = w;
  }
  uint64_t prefix = 0, mask = 0, above = above0;
  const int tid = threadIdx.x;
  for (int di = 0; di < nd && known > kCollect; ++di) {
    clear_bins(sm);
    const int shift = shifts[di];
    const uint64_t dmask = (uint64_t{1} << widths[di]) - 1;
    for (int base = 0; base < V; base += kThreads) {
      const int i = base + tid;
      uint64_t key = 0, w = 0;
      const bool valid = i < V && elem(i, key, w) && (key & mask) == prefix;
      hist_add(valid, static_cast<uint32_t>((key >> shift) & dmask), w, unit, sm);
    }
    __syncthreads();
    // Thread t owns bins [4t, 4t + 4): the lowest non-empty bin whose weight above is < target.
    uint64_t wb[4], mine = 0;
    for (int k = 0; k < 4; ++k) {
      wb[k] = unit ? sm.cnt[4 * tid + k] : sm.wsum[4 * tid + k];
      mine += wb[k];
    }
    uint64_t a = block_suffix_excl(mine, bv.warp_tot);
    int best = INT_MAX;
    uint64_t best_above = 0;
    for (int k = 3; k >= 0; --k) {
      if (sm.cnt[4 * tid + k] > 0 && above + a < target) {
        best = 4 * tid + k;
        best_above = a;
      }
      a += wb[k];
    }
    const int dstar = block_reduce(best, MinOp{}, INT_MAX);
    if (dstar == INT_MAX) return ~uint64_t{0};
    if (best == dstar) {
      bv.above = best_above;
      bv.count = static_cast<int>(sm.cnt[dstar]);
    }
    __syncthreads();
    above += bv.above;
    known = bv.count;
    prefix |= static_cast<uint64_t>(dstar) << shift;
    mask |= dmask << shift;
  }
  // Finish: gather the remaining candidates, then each one's weight above by a scan of the others.
  __syncthreads();
  if (tid == 0) bv.n = 0;
  __syncthreads();
  for (int base = 0; base < V; base += kThreads) {
    const int i = base + tid;
    uint64_t key = 0, w = 0;
    const bool valid = i < V && elem(i, key, w) && (key & mask) == prefix;
    const unsigned ballot = __ballot_sync(0xffffffffu, valid);
    if (ballot == 0) continue;
    const int lane = tid & 31, leader = __ffs(ballot) - 1;
    int slot = 0;
    if (lane == leader) slot = atomicAdd(&bv.n, __popc(ballot));
    slot = __shfl_sync(0xffffffffu, slot, leader) + __popc(ballot & ((1u << lane) - 1u));
    if (valid && slot < kCollect) {
      sm.ckey[slot] = key;
      sm.cw[slot] = w;
    }
  }
  __syncthreads();
  const int n = bv.n < kCollect ? bv.n : kCollect;
  uint64_t best = ~uint64_t{0};
  for (int e = tid; e < n; e += kThreads) {
    const uint64_t ke = sm.ckey[e];
    uint64_t a = above;
    for (int j = 0; j < n; ++j) a += sm.ckey[j] > ke ? sm.cw[j] : 0;
    if (a < target && ke < best) best = ke;
  }
  return block_reduce(best, MinOp{}, ~uint64_t{0});
}

// ---- one row ----------------------------------------------------------------------------------------

// The processed logits of steps 1-3 (before temperature) and the cuts of steps 5-7, evaluated per token.
struct RowView {
  const float* raw;
  const uint32_t* mask;     // null: no grammar mask
  const uint32_t* special;  // null: no penalised or min_tokens-masked token
  const float* overlay;
  int V;
  float t;
  bool div_t;
  // steps 5-7
  bool topk;
  uint64_t cut_k;
  float mx_t;
  bool topp;
  uint32_t bucket;
  uint64_t cut_p;
  bool minp;
  float min_p;

  __device__ __forceinline__ float x_of(int i, float r) const {
    if (mask != nullptr && !((mask[i >> 5] >> (i & 31)) & 1u)) return -INFINITY;
    if (special != nullptr && ((special[i >> 5] >> (i & 31)) & 1u)) return overlay[i];
    return r;
  }
  __device__ __forceinline__ float xt_of(int i, float r) const {
    const float x = x_of(i, r);
    return div_t ? __fdiv_rn(x, t) : x;
  }
  // After top_k (-inf = dropped).
  __device__ __forceinline__ float xk_of(int i, float r) const {
    const float xt = xt_of(i, r);
    if (topk && xt > -INFINITY && rank_key(xt, i, V) < cut_k) return -INFINITY;
    return xt;
  }
  // The weight after top_k (xk: the logit after top_k).
  __device__ __forceinline__ float wk_of(int i, float r, float& xk) const {
    xk = xk_of(i, r);
    return exp_nonpos(__fsub_rn(xk, mx_t));
  }
  // The final weight (0 = not a survivor).
  __device__ __forceinline__ float w_of(int i, float r) const {
    float xk;
    float w = wk_of(i, r, xk);
    if (topp) {
      const uint32_t bi = __float_as_uint(w) >> 20;
      const bool keep = mass_of(w) > 0 && (bi > bucket || (bi == bucket && rank_key(xk, i, V) >= cut_p));
      w = keep ? w : 0.0f;
    }
    if (minp) w = w < min_p ? 0.0f : w;
    return w;
  }
};

// ---- step 8, the race (shared by sample_kernel and the split race kernels) -------------------------------

// The race weights of tokens 4g .. 4g+3 (one Philox block each); false when none can win.
__device__ __forceinline__ bool group_weights(const RowView& rv, int g, float (&w)[4]) {
  bool any = false;
  for (int j = 0; j < 4; ++j) {
    const int i = 4 * g + j;
    w[j] = i < rv.V ? rv.w_of(i, rv.raw[i]) : 0.0f;
    any |= w[j] > 0.0f;
  }
  return any;
}

// The race's order on (key, id): the smaller key wins, the lower id on ties.
__device__ __forceinline__ void keep_min(double key, int id, double& best, int& best_id) {
  if (key < best || (key == best && id < best_id)) {
    best = key;
    best_id = id;
  }
}

// The block's smallest key and the lowest id holding it (every thread gets both).
__device__ __forceinline__ double block_min_key(double key, int id, int& min_id) {
  const double m = block_reduce(key, MinOp{}, static_cast<double>(INFINITY));
  min_id = block_reduce(key == m ? id : INT_MAX, MinOp{}, INT_MAX);
  return m;
}

// row_scan_kernel's slices of `row` folded into this thread's bad / best (the caller reduces them over the block).
__device__ __forceinline__ void fold_scan_slices(const KernelArgs& a, int row, int& bad, uint64_t& best) {
  for (int s = threadIdx.x; s < kSlices; s += blockDim.x) {
    bad = min(bad, a.part_bad[row * kSlices + s]);
    best = max(best, a.part_best[row * kSlices + s]);
  }
}

// The race's seed: the key of the max token `arg`, as on the CPU.
__device__ __forceinline__ double arg_key(const RowView& rv, uint64_t seed, uint64_t pos, int arg) {
  const uint4 r_arg = philox_block(seed, pos, static_cast<uint64_t>(arg) >> 2);
  return -log(open01(philox_word(r_arg, arg & 3))) / static_cast<double>(rv.w_of(arg, rv.raw[arg]));
}

// The race over groups g0 + t, g0 + t + stride, ... below g1 (arg itself skipped: it is the seed): the smallest key
// into my_best and the lowest id with it into my_id. A token is skipped when 1 - u > bound * w proves its key above
// the thread's best so far (E = -log u >= 1 - u; 1e-9 covers every rounding), so the result is the same for any split
// of the groups and any order.
__device__ __forceinline__ void race_groups(const RowView& rv, uint64_t seed, uint64_t pos, int arg, int g0, int g1,
                                            int t, int stride, double& my_best, int& my_id) {
  for (int g = g0 + t; g < g1; g += stride) {
    float w[4];
    if (!group_weights(rv, g, w)) continue;
    const uint4 r4 = philox_block(seed, pos, static_cast<uint64_t>(g));
    for (int j = 0; j < 4; ++j) {
      const int i = 4 * g + j;
      if (!(w[j] > 0.0f) || i == arg) continue;
      const double u = open01(philox_word(r4, j)), wd = static_cast<double>(w[j]);
      if (1.0 - u > my_best * (1.0 + 1e-9) * wd) continue;
      keep_min(-log(u) / wd, i, my_best, my_id);
    }
  }
}

// Every token of the same groups whose key is within thr (the near-tied keys the host settles with glibc's log):
// add(Candidate) for each.
template <typename Add>
__device__ __forceinline__ void race_near(const RowView& rv, uint64_t seed, uint64_t pos, double thr, int g0, int g1,
                                          int t, int stride, Add add) {
  for (int g = g0 + t; g < g1; g += stride) {
    float w[4];
    if (!group_weights(rv, g, w)) continue;
    const uint4 r4 = philox_block(seed, pos, static_cast<uint64_t>(g));
    for (int j = 0; j < 4; ++j) {
      if (!(w[j] > 0.0f)) continue;
      const double u = open01(philox_word(r4, j)), wd = static_cast<double>(w[j]);
      if (1.0 - u > thr * (1.0 + 1e-9) * wd) continue;
      if (-log(u) / wd <= thr) add(Candidate{4 * g + j, philox_word(r4, j), w[j]});
    }
  }
}

// A kRace row's pass 1 from row_scan_kernel's slices and its view for the race (every thread of the block calls it):
// false when the row has a bad logit, no finite one, or its max overflows at its temperature (sample_kernel reports
// those rows; the race kernels leave them).
__device__ bool race_row(const KernelArgs& a, int row, const RowParams& p, RowView& rv, int& arg) {
  int bad = INT_MAX;
  uint64_t best = 0;
  fold_scan_slices(a, row, bad, best);
  bad = block_reduce(bad, MinOp{}, INT_MAX);
  best = block_reduce(best, MaxOp{}, uint64_t{0});
  rv = RowView{};
  rv.raw = a.logits + static_cast<int64_t>(row) * a.row_stride;
  rv.V = a.V;
  rv.t = p.temperature;
  rv.div_t = p.temperature != 1.0f;
  rv.minp = p.min_p > 0.0f;
  rv.min_p = p.min_p;
  if (bad != INT_MAX || best == 0) return false;
  arg = a.V - 1 - static_cast<int>(static_cast<uint32_t>(best));
  rv.mx_t = rv.xt_of(arg, rv.raw[arg]);
  return rv.mx_t < INFINITY;
}

// The groups of race slice s: [g0, g1).
__device__ __forceinline__ void race_slice(int V, int s, int& g0, int& g1) {
  const int groups = (V + 3) / 4, per = (groups + kRaceSlices - 1) / kRaceSlices;
  g0 = min(groups, s * per);
  g1 = min(groups, g0 + per);
}

// The race of the kRace rows over slice blockIdx.x of row blockIdx.y: the slice's smallest key (seeded with the max
// token's) and the lowest id with it; sample_kernel reduces the slices.
__global__ void __launch_bounds__(kRaceThreads) race_kernel(KernelArgs a) {
  pdl_wait();
  pdl_launch_dependents();
  const int row = blockIdx.y, s = blockIdx.x;
  const RowParams p = a.params[row];
  if ((p.flags & kRace) == 0) return;
  if (s == 0 && threadIdx.x == 0) a.cand_n[row] = 0;  // race_cand_kernel counts from here
  RowView rv;
  int arg = 0;
  double my_best = INFINITY;
  int my_id = INT_MAX;
  if (race_row(a, row, p, rv, arg)) {
    my_best = arg_key(rv, p.seed, p.position, arg);
    my_id = arg;
    int g0, g1;
    race_slice(a.V, s, g0, g1);
    race_groups(rv, p.seed, p.position, arg, g0, g1, static_cast<int>(threadIdx.x), kRaceThreads, my_best, my_id);
  }
  int id;
  const double m = block_min_key(my_best, my_id, id);
  if (threadIdx.x == 0) {
    a.race_key[row * kRaceSlices + s] = m;
    a.race_id[row * kRaceSlices + s] = id;
  }
}

// The near-tied keys of the kRace rows over the same slices, against the row's minimum from race_kernel: appended to
// the row's candidate list (any order: the host takes the lowest (key, id) among them).
__global__ void __launch_bounds__(kRaceThreads) race_cand_kernel(KernelArgs a) {
  pdl_wait();
  pdl_launch_dependents();
  const int row = blockIdx.y, s = blockIdx.x;
  const RowParams p = a.params[row];
  if ((p.flags & kRace) == 0) return;
  RowView rv;
  int arg = 0;
  const bool ok = race_row(a, row, p, rv, arg);
  double m = INFINITY;
  for (int j = threadIdx.x; j < kRaceSlices; j += kRaceThreads) m = MinOp{}(m, a.race_key[row * kRaceSlices + j]);
  const double gmin = block_reduce(m, MinOp{}, static_cast<double>(INFINITY));
  if (!ok || !(gmin < INFINITY)) return;
  int g0, g1;
  race_slice(a.V, s, g0, g1);
  race_near(rv, p.seed, p.position, gmin * (1.0 + kCandMargin), g0, g1, static_cast<int>(threadIdx.x), kRaceThreads,
            [&](const Candidate& c) {
              const int slot = atomicAdd(&a.cand_n[row], 1);
              if (slot < kMaxCand) a.cand[row * kMaxCand + slot] = c;
            });
}

// Pass 1 of the kPlain rows over slice blockIdx.x of row blockIdx.y: what sample_kernel's first loop computes
// for such a row (x = the raw logit), reduced per slice; sample_kernel reduces the slices.
__global__ void __launch_bounds__(256) row_scan_kernel(KernelArgs a) {
  pdl_wait();
  pdl_launch_dependents();
  const int row = blockIdx.y, s = blockIdx.x, V = a.V;
  if ((a.params[row].flags & (kPlain | kRace)) == 0) return;
  const float* raw = a.logits + static_cast<int64_t>(row) * a.row_stride;
  const int per = (V + kSlices - 1) / kSlices, i0 = s * per, i1 = min(V, i0 + per);
  int bad = INT_MAX;
  uint64_t best = 0;
  for (int i = i0 + static_cast<int>(threadIdx.x); i < i1; i += 256) {
    const float r = raw[i];
    if (!(r < INFINITY)) bad = min(bad, i);
    if (r > -INFINITY) best = max(best, rank_key(r, i, V));
  }
  bad = block_reduce(bad, MinOp{}, INT_MAX);
  best = block_reduce(best, MaxOp{}, uint64_t{0});
  if (threadIdx.x == 0) {
    a.part_bad[row * kSlices + s] = bad;
    a.part_best[row * kSlices + s] = best;
  }
}

__global__ void __launch_bounds__(kThreads) sample_kernel(KernelArgs a) {
  pdl_wait();
  pdl_launch_dependents();
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ BlockVars bv;
  SelectMem sm;
  sm.wsum = reinterpret_cast<uint64_t*>(smem);
  sm.ckey = sm.wsum + kBins;
  sm.cw = sm.ckey + kCollect;
  sm.cnt = reinterpret_cast<uint32_t*>(sm.cw + kCollect);
  uint32_t* special_bits = sm.cnt + kBins;

  const int row = blockIdx.x, tid = threadIdx.x, V = a.V;
  const RowParams p = a.params[row];
  const float* raw = a.logits + static_cast<int64_t>(row) * a.row_stride;
  RowCore& out = a.core[row];
  const bool skip = (p.flags & kSkip) != 0;
  const bool greedy = (p.flags & kGreedy) != 0;
  const bool want_lp = !skip && p.logprobs >= 0;

  // Steps 1-2: the penalised and min_tokens-masked tokens into the bitmap and the overlay.
  RowView rv{};
  rv.raw = raw;
  rv.V = V;
  rv.mask = (!skip && (p.flags & kHasMask)) ? a.masks + p.mask_word : nullptr;
  if (!skip && p.spec_count > 0) {
    const int words = (V + 31) / 32;
    for (int w = tid; w < words; w += kThreads) special_bits[w] = 0;
    __syncthreads();
    float* overlay = a.overlay + static_cast<int64_t>(row) * V;  // allocated when some row has a list
    const SpecialEntry* list = a.entries + p.spec_begin;
    for (uint32_t e = tid; e < p.spec_count; e += kThreads) {
      const SpecialEntry se = list[e];
      atomicOr(&special_bits[se.token >> 5], 1u << (se.token & 31));
      float x = raw[se.token];
      if (se.flags & kRep) x = x > 0.0f ? __fdiv_rn(x, p.rep) : __fmul_rn(x, p.rep);
      if ((se.flags & kFreqPres) && se.count > 0) {
        x = __fsub_rn(x, __fmul_rn(p.freq, static_cast<float>(se.count)));
        x = __fsub_rn(x, p.pres);
      }
      if (se.flags & kMaskTok) x = -INFINITY;
      overlay[se.token] = x;
    }
    __syncthreads();
    rv.special = special_bits;
    rv.overlay = overlay;
  }
  rv.t = p.temperature;
  rv.div_t = p.temperature != 1.0f;

  // Pass 1: bad logits, the processed max (first index), the allowed count, the finite counts.
  const bool count_t = !greedy && p.top_k > 0;
  int bad = INT_MAX, allowed = 0, n_fin_t = 0, n_fin_raw = 0;
  uint64_t best = 0, raw_best = 0;  // 0: no finite value (every real key is larger)
  const bool plain = (p.flags & (kPlain | kRace)) != 0;
  if (plain) fold_scan_slices(a, row, bad, best);
  for (int i = plain ? V : tid; i < V; i += kThreads) {
    const float r = raw[i];
    if (!(r < INFINITY)) bad = min(bad, i);
    if (skip) continue;
    const float x = rv.x_of(i, r);
    if (x > -INFINITY) best = max(best, rank_key(x, i, V));
    if (rv.mask != nullptr) allowed += (rv.mask[i >> 5] >> (i & 31)) & 1u;
    if (count_t) n_fin_t += (rv.div_t ? __fdiv_rn(x, rv.t) : x) > -INFINITY;
    if (want_lp && r > -INFINITY) {
      ++n_fin_raw;
      raw_best = max(raw_best, rank_key(r, i, V));
    }
  }
  bad = block_reduce(bad, MinOp{}, INT_MAX);
  best = block_reduce(best, MaxOp{}, uint64_t{0});
  if (tid == 0) {
    out.n_cand = 0;
    out.token = -1;
    out.bad_index = bad == INT_MAX ? -1 : bad;
    out.bad_value = bad == INT_MAX ? 0.0f : raw[bad];
  }
  if (bad != INT_MAX || skip) {
    if (tid == 0) out.status = bad != INT_MAX ? kBadLogit : kOk;
    return;
  }
  if (rv.mask != nullptr) {
    allowed = block_reduce(allowed, SumOp{}, 0);
    if (allowed == 0) {
      if (tid == 0) out.status = kEmptyMask;
      return;
    }
  }
  if (best == 0) {
    if (tid == 0) out.status = kNothing;
    return;
  }
  const int arg = V - 1 - static_cast<int>(static_cast<uint32_t>(best));
  int token = arg;

  if (!greedy) {
    rv.mx_t = rv.xt_of(arg, raw[arg]);
    if (!(rv.mx_t < INFINITY)) {  // x / t overflowed: the CPU's arithmetic turns into NaNs; let it run there
      if (tid == 0) out.status = kFallback;
      return;
    }
    // Step 5: top_k, a select on (x desc, id asc) with unit weights: kept iff fewer than k rank above.
    if (p.top_k > 0) {
      n_fin_t = block_reduce(n_fin_t, SumOp{}, 0);
      if (p.top_k < n_fin_t) {
        auto finite_t = [&](int i, uint64_t& key, uint64_t& w) {
          const float xt = rv.xt_of(i, raw[i]);
          key = rank_key(xt, i, V);
          w = 1;
          return xt > -INFINITY;
        };
        rv.cut_k = select_cut(finite_t, V, a.lo_bits, static_cast<uint64_t>(p.top_k), 0, n_fin_t, true, sm, bv);
        rv.topk = true;
      }
    }
    // Step 6: top_p. The masses per bucket (w's bits >> 20, the CPU's histogram), the bucket holding the cut
    // (the CPU's walk from the top), then the exact cut inside it by a select weighted by the masses.
    if (p.top_p < 1.0f) {
      clear_bins(sm);
      uint64_t total = 0;
      for (int base = 0; base < V; base += kThreads) {
        const int i = base + tid;
        float w = 0.0f, xk;
        if (i < V) w = rv.wk_of(i, raw[i], xk);
        const uint64_t m = mass_of(w);
        total += m;
        hist_add(i < V, __float_as_uint(w) >> 20, m, false, sm);
      }
      total = block_reduce(total, SumOp{}, uint64_t{0});
      const uint64_t target = top_p_ceil(p.top_p, total, a.ld_digits);
      __syncthreads();
      // b = the largest bucket >= 1 whose suffix mass (itself and above) reaches the target, else 0.
      uint64_t wb[4], mine = 0;
      for (int k = 0; k < 4; ++k) {
        wb[k] = sm.wsum[4 * tid + k];
        mine += wb[k];
      }
      uint64_t s = block_suffix_excl(mine, bv.warp_tot);
      int b = 0;
      uint64_t b_above = 0;
      for (int k = 3; k >= 0; --k) {
        const int d = 4 * tid + k;
        if (d >= 1 && b == 0 && s + wb[k] >= target) {
          b = d;
          b_above = s;
        }
        s += wb[k];
      }
      const int bucket = block_reduce(b, MaxOp{}, 0);
      __syncthreads();
      if (bucket > 0 && b == bucket) {
        bv.above = b_above;
        bv.count = static_cast<int>(sm.cnt[bucket]);
      }
      if (bucket == 0 && tid == 0) {
        bv.above = total - sm.wsum[0];
        bv.count = INT_MAX;
      }
      __syncthreads();
      const uint64_t acc = bv.above;
      const int known = bv.count;
      auto in_bucket = [&](int i, uint64_t& key, uint64_t& w) {
        float xk;
        const float wk = rv.wk_of(i, raw[i], xk);
        key = rank_key(xk, i, V);
        w = mass_of(wk);
        return wk > 0.0f && (__float_as_uint(wk) >> 20) == static_cast<uint32_t>(bucket);
      };
      rv.cut_p = select_cut(in_bucket, V, a.lo_bits, target, acc, known, false, sm, bv);
      rv.bucket = static_cast<uint32_t>(bucket);
      rv.topp = true;
    }
    // Step 7: min_p.
    rv.minp = p.min_p > 0.0f;
    rv.min_p = p.min_p;

    // Step 8: the race (race_groups), seeded with the max token as on the CPU; kRace rows ran it in race_kernel.
    const uint64_t pos = p.position;
    const bool race = (p.flags & kRace) != 0;
    const int groups = (V + 3) / 4;
    double my_best = INFINITY;
    int my_id = INT_MAX;
    if (race) {  // race_kernel's slices
      for (int s = tid; s < kRaceSlices; s += kThreads)
        keep_min(a.race_key[row * kRaceSlices + s], a.race_id[row * kRaceSlices + s], my_best, my_id);
    } else {
      my_best = arg_key(rv, p.seed, pos, arg);
      my_id = arg;
      race_groups(rv, p.seed, pos, arg, 0, groups, tid, kThreads, my_best, my_id);
    }
    const double gmin = block_min_key(my_best, my_id, token);
    // Every token within kCandMargin of the min: the CPU's winner (glibc log) is among them.
    if (gmin < INFINITY) {
      if (!race) {  // (kRace rows: race_cand_kernel's list)
        if (tid == 0) bv.n_cand = 0;
        __syncthreads();
        race_near(rv, p.seed, pos, gmin * (1.0 + kCandMargin), 0, groups, tid, kThreads, [&](const Candidate& c) {
          const int slot = atomicAdd(&bv.n_cand, 1);
          if (slot < kMaxCand) bv.cand[slot] = c;
        });
        __syncthreads();
      }
      if (tid == 0) {
        const int n = race ? a.cand_n[row] : bv.n_cand;
        const Candidate* list = race ? a.cand + row * kMaxCand : bv.cand;
        out.n_cand = n;
        for (int c = 0; c < kMaxCand && c < n; ++c) out.cand[c] = list[c];
      }
    }
  }
  if (tid == 0) {
    out.status = kOk;
    out.token = token;
  }
  if (!want_lp) return;

  // Logprobs of the raw row: its max, the rank of `token` and the top `logprobs` (the sum: lse_sum_kernel).
  RowLogprobs& lp = a.lp[row];
  raw_best = block_reduce(raw_best, MaxOp{}, uint64_t{0});
  const int k = p.logprobs < V ? p.logprobs : V;
  uint64_t cut_r = 0;
  if (k > 0) {
    n_fin_raw = block_reduce(n_fin_raw, SumOp{}, 0);
    if (k < n_fin_raw) {
      auto finite_raw = [&](int i, uint64_t& key, uint64_t& w) {
        const float r = raw[i];
        key = rank_key(r, i, V);
        w = 1;
        return r > -INFINITY;
      };
      cut_r = select_cut(finite_raw, V, a.lo_bits, static_cast<uint64_t>(k), 0, n_fin_raw, true, sm, bv);
    }
  }
  __syncthreads();
  if (tid == 0) bv.top_n = 0;
  __syncthreads();
  const float lt = raw[token];
  int above = 0;
  for (int i = tid; i < V; i += kThreads) {
    const float r = raw[i];
    above += (r > lt || (r == lt && i < token)) ? 1 : 0;
    if (k > 0 && r > -INFINITY) {
      const uint64_t key = rank_key(r, i, V);
      if (key >= cut_r) {
        const int slot = atomicAdd(&bv.top_n, 1);
        if (slot < kMaxTop) {
          bv.top_key[slot] = key;
          bv.top_val[slot] = r;
          bv.top_id[slot] = i;
        }
      }
    }
  }
  above = block_reduce(above, SumOp{}, 0);
  __syncthreads();
  const int n_top = bv.top_n < kMaxTop ? bv.top_n : kMaxTop;
  if (tid < n_top) {  // best first: position = how many keys are larger
    int pos_in = 0;
    for (int j = 0; j < n_top; ++j) pos_in += bv.top_key[j] > bv.top_key[tid] ? 1 : 0;
    lp.top_id[pos_in] = bv.top_id[tid];
    lp.top_val[pos_in] = bv.top_val[tid];
  }
  if (tid == 0) {
    const int rarg = V - 1 - static_cast<int>(static_cast<uint32_t>(raw_best));
    lp.mx_raw = raw[rarg];
    lp.token_raw = lt;
    lp.rank = above + 1;
    lp.n_top = n_top;
    lp.sum = 0.0;
  }
}

// The CPU's sum_exp over a raw row: lane j (i % 8 == j) adds its terms in ascending i in FP64, then the lanes
// are added in order. Sequential by definition, so 8 threads per row; latency-bound, only for logprobs rows.
__global__ void __launch_bounds__(32) lse_sum_kernel(KernelArgs a) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ double lane_sum[8];
  const int row = blockIdx.x, lane = threadIdx.x, V = a.V;
  const RowParams& p = a.params[row];
  if ((p.flags & kSkip) || p.logprobs < 0 || a.core[row].status != kOk) return;
  const float* raw = a.logits + static_cast<int64_t>(row) * a.row_stride;
  const float mx = a.lp[row].mx_raw;
  if (lane < 8) {
    double acc = 0.0;
#pragma unroll 8
    for (int i = lane; i < V; i += 8) acc = __dadd_rn(acc, static_cast<double>(exp_nonpos(__fsub_rn(raw[i], mx))));
    lane_sum[lane] = acc;
  }
  __syncwarp();
  if (lane == 0) {
    double s = 0.0;
    for (int j = 0; j < 8; ++j) s = __dadd_rn(s, lane_sum[j]);
    a.lp[row].sum = s;
  }
}

// ---- host -------------------------------------------------------------------------------------------

constexpr size_t kFixedSmem = kBins * sizeof(uint64_t) + 2 * kCollect * sizeof(uint64_t) + kBins * sizeof(uint32_t);

size_t align16(size_t n) { return (n + 15) / 16 * 16; }

// Pinned host staging that grows on demand: the call's upload, and its results (copied down, or written there by the
// kernel through the mapped address `dev`).
struct PinnedBuffer {
  void* p = nullptr;
  void* dev = nullptr;  // the same memory as the device addresses it (mapped pinned memory)
  size_t bytes = 0;
  void* get(size_t want) {
    if (bytes < want) {
      if (p != nullptr) DI_CUDA_CHECK(cudaFreeHost(p));
      p = dev = nullptr;
      bytes = 0;
      const size_t n = std::max<size_t>(want, size_t{1} << 16) * 2;
      DI_CUDA_CHECK(cudaMallocHost(&p, n));
      DI_CUDA_CHECK(cudaHostGetDevicePointer(&dev, p, 0));
      bytes = n;
    }
    return p;
  }
};

struct Workspace {
  std::mutex mu;
  PinnedBuffer up, down;
  GrowingBuffer d_up, d_res, d_overlay, d_part;
  size_t smem_set = 0;
  std::vector<int32_t> slot;  // token -> index in the row's penalty list (-1 = none)
};

Workspace& workspace() {
  static Workspace* w = new Workspace();  // never destroyed: no CUDA calls at process exit
  return *w;
}

void check_ids(const std::vector<int32_t>* ids, int64_t vocab, const char* what) {
  if (!ids) return;
  for (size_t i = 0; i < ids->size(); ++i) {
    const int32_t t = (*ids)[i];
    DI_CHECK(t >= 0 && t < vocab, "sample: {}[{}] = {} is not a token id of a vocab of {}", what, i, t, vocab);
  }
}

std::vector<float> row_to_host(const float* dev_row, int64_t V) {
  std::vector<float> h(static_cast<size_t>(V));
  flush_deferred();
  DI_CUDA_CHECK(cudaMemcpy(h.data(), dev_row, static_cast<size_t>(V) * sizeof(float), cudaMemcpyDeviceToHost));
  return h;
}

// The CPU sampler on a host copy of one row (the rows the GPU leaves to it).
SampleResult sample_on_host(const float* dev_row, int64_t V, const SampleInput& in) {
  const std::vector<float> h = row_to_host(dev_row, V);
  SampleInput hin = in;
  hin.logits = h.data();
  hin.vocab = V;
  return sample(hin);
}

}  // namespace

std::vector<SampleResult> sample_rows(const Tensor& logits, const std::vector<SampleInput>& rows) {
  const Rows lr = as_rows(logits, "cuda::sample_rows");
  const int64_t R = lr.rows, V = lr.cols;
  DI_CHECK(R == static_cast<int64_t>(rows.size()), "cuda::sample_rows: {} logits rows for {} inputs", R, rows.size());
  if (R == 0) return {};
  DI_CHECK(R <= INT_MAX, "cuda::sample_rows: too many rows ({})", R);
  for (size_t r = 0; r < rows.size(); ++r) {
    const SampleInput& in = rows[r];
    DI_CHECK(in.params != nullptr, "sample: params is null");
    DI_CHECK(in.vocab == 0 || in.vocab == V, "cuda::sample_rows: row {} has vocab {} but the logits have {} columns", r,
             in.vocab, V);
  }
  DI_CHECK(V > 0 && V < (int64_t{1} << 31), "sample: vocab must be in [1, 2^31), got {}", V);
  for (const SampleInput& in : rows) DI_CHECK(in.position >= 0, "sample: position must be >= 0, got {}", in.position);
  const float* dev_logits = lr.data;
  auto dev_row = [&](int64_t r) { return dev_logits + r * lr.row_stride; };

  std::vector<SampleResult> results(rows.size());
  if (V > kMaxVocab) {  // the bitmap would not fit shared memory: the CPU on host copies
    for (int64_t r = 0; r < R; ++r) results[static_cast<size_t>(r)] = sample_on_host(dev_row(r), V, rows[r]);
    return results;
  }
  static_assert(std::numeric_limits<long double>::digits >= 64, "top_p_ceil assumes an exact uint64 -> long double");

  Workspace& ws = workspace();
  std::lock_guard<std::mutex> lock(ws.mu);
  const int words = static_cast<int>((V + 31) / 32);
  if (static_cast<int64_t>(ws.slot.size()) < V) ws.slot.assign(static_cast<size_t>(V), -1);

  // ---- pack params, penalty lists and masks --------------------------------------------------------
  std::vector<RowParams> params(rows.size());
  std::vector<SpecialEntry> entries;
  std::vector<uint32_t> masks;
  std::vector<std::string> host_error(rows.size());
  std::vector<char> on_host(rows.size(), 0);  // sampled by the CPU on a host copy
  bool any_special = false, any_lp = false, any_plain = false, any_race = false;
  for (size_t r = 0; r < rows.size(); ++r) {
    const SampleInput& in = rows[r];
    const SamplingParams& p = *in.params;
    RowParams& rp = params[r];
    rp = RowParams{};
    rp.seed = in.seed;
    rp.position = static_cast<uint64_t>(in.position);
    rp.temperature = p.temperature;
    rp.top_p = p.top_p;
    rp.min_p = p.min_p;
    rp.rep = p.repetition_penalty;
    rp.freq = p.frequency_penalty;
    rp.pres = p.presence_penalty;
    rp.top_k = p.top_k;
    rp.logprobs = p.logprobs;
    rp.flags = p.temperature < 1e-5f ? kGreedy : 0;  // the CPU's kSamplingEps
    try {  // sample()'s checks after the logits' (those run on the GPU and come first)
      check_ids(in.prompt_ids, V, "prompt_ids");
      check_ids(in.output_ids, V, "output_ids");
      if (in.allowed_mask) {
        DI_CHECK(in.allowed_mask->size() >= static_cast<size_t>(words),
                 "sample: allowed_mask has {} words; a vocab of {} needs {}", in.allowed_mask->size(), V, words);
      }
    } catch (const Error& e) {
      host_error[r] = e.what();
    }
    if (!host_error[r].empty() || p.logprobs > kMaxTop) {
      on_host[r] = host_error[r].empty();
      rp.flags |= kSkip;  // the GPU only checks the logits
      continue;
    }
    if (in.allowed_mask) {
      rp.flags |= kHasMask;
      rp.mask_word = static_cast<uint32_t>(masks.size());
      masks.insert(masks.end(), in.allowed_mask->begin(), in.allowed_mask->begin() + words);
    }
    any_lp |= p.logprobs >= 0;
    // Penalties and min_tokens as one list of distinct tokens.
    const bool rep = p.repetition_penalty != 1.0f;
    const bool freq_pres = p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;
    const int64_t n_out = in.output_ids ? static_cast<int64_t>(in.output_ids->size()) : in.position;
    const bool min_mask = n_out < p.min_tokens;
    const size_t begin = entries.size();
    auto entry = [&](int32_t t) -> SpecialEntry& {
      int32_t& s = ws.slot[static_cast<size_t>(t)];
      if (s < 0) {
        s = static_cast<int32_t>(entries.size() - begin);
        entries.push_back(SpecialEntry{t, 0, 0});
      }
      return entries[begin + static_cast<size_t>(s)];
    };
    if (rep) {
      for (const auto* ids : {in.prompt_ids, in.output_ids})
        if (ids)
          for (int32_t t : *ids) entry(t).flags |= kRep;
    }
    if (freq_pres && in.output_ids) {
      for (int32_t t : *in.output_ids) {
        SpecialEntry& e = entry(t);
        ++e.count;
        e.flags |= kFreqPres;
      }
    }
    if (min_mask) {
      if (in.eos_id >= 0 && in.eos_id < V && !p.ignore_eos) entry(in.eos_id).flags |= kMaskTok;
      for (int32_t t : p.stop_token_ids)
        if (t >= 0 && t < V) entry(t).flags |= kMaskTok;
    }
    for (size_t e = begin; e < entries.size(); ++e) ws.slot[static_cast<size_t>(entries[e].token)] = -1;
    rp.spec_begin = static_cast<uint32_t>(begin);
    rp.spec_count = static_cast<uint32_t>(entries.size() - begin);
    any_special |= rp.spec_count > 0;
    // No penalty, mask or logprobs: pass 1 reads the raw row alone (row_scan_kernel).
    const bool raw_row = !(rp.flags & kHasMask) && rp.spec_count == 0 && p.logprobs < 0;
    if (raw_row && (rp.flags & kGreedy)) {
      rp.flags |= kPlain;
      any_plain = true;
    } else if (raw_row && p.top_k <= 0 && !(p.top_p < 1.0f) && R <= kRaceMaxRows) {
      rp.flags |= kRace;
      any_race = true;
    }
  }

  const size_t off_entries = align16(params.size() * sizeof(RowParams));
  const size_t off_masks = off_entries + align16(entries.size() * sizeof(SpecialEntry));
  const size_t up_bytes = off_masks + masks.size() * sizeof(uint32_t);
  char* up = static_cast<char*>(ws.up.get(up_bytes));
  std::memcpy(up, params.data(), params.size() * sizeof(RowParams));
  if (!entries.empty()) std::memcpy(up + off_entries, entries.data(), entries.size() * sizeof(SpecialEntry));
  if (!masks.empty()) std::memcpy(up + off_masks, masks.data(), masks.size() * sizeof(uint32_t));
  // Rows with no penalty entries and no masks (greedy and plain sampling): the kernels read the row parameters straight
  // from the pinned staging through its mapped address, so no host -> device copy precedes them (a 64-byte copy took
  // ~2 us of a batch-1 step, ktrace). The host writes the staging again only in the next call, after this one's
  // synchronisation.
  const bool mapped_up = entries.empty() && masks.empty();
  char* d_up = mapped_up ? static_cast<char*>(ws.up.dev) : static_cast<char*>(ws.d_up.get(up_bytes));
  const size_t core_bytes = static_cast<size_t>(R) * sizeof(RowCore);
  const size_t res_bytes = core_bytes + static_cast<size_t>(R) * sizeof(RowLogprobs);
  char* d_res = static_cast<char*>(ws.d_res.get(res_bytes));
  float* d_overlay =
      any_special ? static_cast<float*>(ws.d_overlay.get(static_cast<size_t>(R * V) * sizeof(float))) : nullptr;
  flush_deferred();
  if (!mapped_up) DI_CUDA_CHECK(cudaMemcpyAsync(d_up, up, up_bytes, cudaMemcpyHostToDevice, current_stream()));

  KernelArgs ka{};
  ka.logits = dev_logits;
  ka.row_stride = lr.row_stride;
  ka.V = static_cast<int>(V);
  ka.lo_bits = V > 1 ? 64 - __builtin_clzll(static_cast<unsigned long long>(V - 1)) : 1;
  ka.ld_digits = std::numeric_limits<long double>::digits;
  ka.params = reinterpret_cast<const RowParams*>(d_up);
  ka.entries = reinterpret_cast<const SpecialEntry*>(d_up + off_entries);
  ka.masks = reinterpret_cast<const uint32_t*>(d_up + off_masks);
  ka.overlay = d_overlay;
  if (any_plain || any_race) {  // [R, kSlices] best, bad; [R, kRaceSlices] key, id; [R, kMaxCand] cand; [R] cand_n
    const size_t r = static_cast<size_t>(R), scan = r * kSlices * (sizeof(uint64_t) + sizeof(int32_t));
    const size_t race = r * kRaceSlices * (sizeof(double) + sizeof(int32_t));
    const size_t cand = r * kMaxCand * sizeof(Candidate);
    char* d_part = static_cast<char*>(ws.d_part.get(scan + race + cand + r * sizeof(int32_t)));
    ka.part_best = reinterpret_cast<uint64_t*>(d_part);
    ka.part_bad = reinterpret_cast<int32_t*>(d_part + r * kSlices * sizeof(uint64_t));
    ka.race_key = reinterpret_cast<double*>(d_part + scan);
    ka.race_id = reinterpret_cast<int32_t*>(d_part + scan + r * kRaceSlices * sizeof(double));
    ka.cand = reinterpret_cast<Candidate*>(d_part + scan + race);
    ka.cand_n = reinterpret_cast<int32_t*>(d_part + scan + race + cand);
  }
  // Without logprobs the sampler writes its results straight into the pinned host buffer (cudaMallocHost memory is
  // mapped into the device's address space under unified addressing), so no device -> host copy follows the kernel:
  // the copy started ~7 us after the kernel's end (ktrace). With logprobs lse_sum_kernel reads what sample_kernel
  // wrote, which stays in device memory.
  char* down = static_cast<char*>(ws.down.get(res_bytes));
  const bool direct = !any_lp;
  char* res_at = direct ? static_cast<char*>(ws.down.dev) : d_res;
  ka.core = reinterpret_cast<RowCore*>(res_at);
  ka.lp = reinterpret_cast<RowLogprobs*>(res_at + core_bytes);
  const size_t smem = kFixedSmem + (any_special ? static_cast<size_t>(words) * sizeof(uint32_t) : 0);
  if (smem > ws.smem_set) {
    DI_CHECK(smem <= static_cast<size_t>(smem_optin()), "cuda::sample_rows: {} bytes of shared memory needed", smem);
    DI_CUDA_CHECK(
        cudaFuncSetAttribute(sample_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    ws.smem_set = smem;
  }
  if (any_plain || any_race) {
    launch_pdl(row_scan_kernel, dim3(kSlices, static_cast<unsigned>(R)), 256, 0, nullptr, ka);
    DI_CUDA_CHECK(cudaGetLastError());
  }
  if (any_race) {
    launch_pdl(race_kernel, dim3(kRaceSlices, static_cast<unsigned>(R)), kRaceThreads, 0, nullptr, ka);
    DI_CUDA_CHECK(cudaGetLastError());
    launch_pdl(race_cand_kernel, dim3(kRaceSlices, static_cast<unsigned>(R)), kRaceThreads, 0, nullptr, ka);
    DI_CUDA_CHECK(cudaGetLastError());
  }
  launch_pdl(sample_kernel, static_cast<unsigned>(R), kThreads, smem, nullptr, ka);
  DI_CUDA_CHECK(cudaGetLastError());
  if (any_lp) {
    launch_pdl(lse_sum_kernel, static_cast<unsigned>(R), 32, 0, nullptr, ka);
    DI_CUDA_CHECK(cudaGetLastError());
  }
  const size_t down_bytes = any_lp ? res_bytes : core_bytes;
  if (!direct) DI_CUDA_CHECK(cudaMemcpyAsync(down, d_res, down_bytes, cudaMemcpyDeviceToHost, current_stream()));
  DI_CUDA_CHECK(cudaStreamSynchronize(current_stream()));
  const RowCore* core = reinterpret_cast<const RowCore*>(down);
  const RowLogprobs* lps = reinterpret_cast<const RowLogprobs*>(down + core_bytes);

  // ---- per row, in row order: errors as sample() reports them, then the result -----------------------
  for (int64_t r = 0; r < R; ++r) {
    const SampleInput& in = rows[static_cast<size_t>(r)];
    const SamplingParams& p = *in.params;
    const RowCore& c = core[r];
    SampleResult& res = results[static_cast<size_t>(r)];
    if (c.status == kBadLogit) {
      fail("cuda::sample_rows: row {}: sample: logit of token {} is {}; logits must be finite or -inf", r, c.bad_index,
           c.bad_value);
    }
    if (!host_error[static_cast<size_t>(r)].empty())
      fail("cuda::sample_rows: row {}: {}", r, host_error[static_cast<size_t>(r)]);
    if (c.status == kEmptyMask) {
      fail("cuda::sample_rows: row {}: sample: allowed_mask allows no token of the vocab of {} (an empty grammar mask)",
           r, V);
    }
    if (c.status == kNothing) {
      fail(
          "cuda::sample_rows: row {}: sample: no token can be sampled: min_tokens ({}), stop_token_ids, eos and "
          "allowed_mask mask the whole vocab (or every logit is -inf)",
          r, p.min_tokens);
    }
    if (on_host[static_cast<size_t>(r)] || c.status == kFallback || c.n_cand > kMaxCand) {
      res = sample_on_host(dev_row(r), V, in);
      continue;
    }
    int32_t token = c.token;
    if (c.n_cand > 0) {  // the CPU's key of each near-tied token, with glibc's log: the lowest (key, id) wins
      double best = 0.0;
      token = -1;
      for (int j = 0; j < c.n_cand; ++j) {
        const double key = -std::log(u32_to_open01(c.cand[j].word)) / static_cast<double>(c.cand[j].w);
        if (token < 0 || key < best || (key == best && c.cand[j].id < token)) {
          best = key;
          token = c.cand[j].id;
        }
      }
    }
    if (p.logprobs >= 0) {
      const int k = static_cast<int>(std::min<int64_t>(p.logprobs, V));
      if (token != c.token) {  // the GPU's rank was for another token (a near tie): the CPU on the row
        const std::vector<float> h = row_to_host(dev_row(r), V);
        res = raw_logprobs(h.data(), V, token, k);
      } else {  // raw_logprobs' arithmetic on the GPU's exact sum and values
        const RowLogprobs& lp = lps[r];
        const double lse = static_cast<double>(lp.mx_raw) + std::log(lp.sum);
        res.has_logprobs = true;
        res.logprob = static_cast<float>(static_cast<double>(lp.token_raw) - lse);
        res.rank = lp.rank;
        for (int j = 0; j < lp.n_top && j < k; ++j)
          res.top_logprobs.emplace_back(lp.top_id[j], static_cast<float>(static_cast<double>(lp.top_val[j]) - lse));
      }
    }
    res.token = token;
  }
  return results;
}

}  // namespace deepinfer::cuda
