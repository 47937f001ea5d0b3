// CUDA sparse attention (gathered KV, online softmax in 64-entry tiles). Contract in attention.cuh.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "cuda/attention.cuh"
#include "cuda/common.cuh"
#include "cuda/device.h"
#include "cuda/fp_decode.cuh"
#include "cuda/rms_norm.cuh"
#include "cuda/rope.cuh"

namespace deepinfer::cuda {

namespace {

// The output's inverse RoPE (ops::AttnDerotate) as the kernels take it; rope_dim 0: none.
struct Derot {
  RopeRows rows;
  int rope_dim = 0;
};

// The rotation of output column d (of D) of query row t: its pair's cos and negated sine (1, 0 outside the last
// rope_dim columns). Loaded at the kernel's start, so that the table's latency is not at its end.
__device__ __forceinline__ float2 derot_factors(int d, int D, int64_t t, const Derot& r) {
  const int r0 = D - r.rope_dim;
  if (r.rope_dim == 0 || d < r0 || d >= D) return make_float2(1.0f, 0.0f);
  const int64_t half = r.rope_dim / 2, i = (d - r0) >> 1;
  const int64_t p = rope_position(r.rows, t);
  return make_float2(r.rows.cs[p * half + i], -r.rows.sn[p * half + i]);
}

// Output column d (of D), value v as it would be stored, cs its derot_factors: the de-rotated value (columns outside
// the last rope_dim come back unchanged). Every lane of the warp calls it: the pair's other column is in lane ^ 1.
__device__ __forceinline__ float derotate(float v, int d, int D, const Derot& r, float2 cs, bool round) {
  const float other = __shfl_xor_sync(0xffffffffu, v, 1);
  const int r0 = D - r.rope_dim;
  if (d < r0 || d >= D) return v;
  const bool odd = ((d - r0) & 1) != 0;
  const float2 y = odd ? rope_rotate(other, v, cs.x, cs.y, round) : rope_rotate(v, other, cs.x, cs.y, round);
  return odd ? y.y : y.x;
}

constexpr int kTile = 64;      // entries per online-softmax tile (the CPU's)
constexpr int kThreads = 256;  // 8 warps
constexpr int kMaxD = 512;     // two output columns per thread

__device__ __forceinline__ float exp_f(float x) { return __double2float_rn(exp(static_cast<double>(x))); }

// Shared memory (floats): kv tile [64][D + 4] | q [HG][D] | pv [64][HG] (doubles: converted once per
// entry and head, not once per output column) | s [HG][64] | idx [64] | m, l, resc [HG].
__host__ __device__ constexpr int64_t smem_floats(int64_t D, int HG) {
  return kTile * (D + 4) + HG * D + 2 * kTile * HG + HG * kTile + kTile + 3 * HG;
}

template <int HG>
__global__ void __launch_bounds__(kThreads)
    sparse_attn_kernel(const float* __restrict__ q, const float* __restrict__ kv, const int32_t* __restrict__ idx,
                       const float* __restrict__ sink, float* __restrict__ out, int H, int D, int N, int K, float scale,
                       bool bf16_probs, bool round, Derot derot) {
  pdl_wait();
  pdl_launch_dependents();
  float2 rot0 = make_float2(1.0f, 0.0f), rot1 = rot0;  // the de-rotation of this thread's two output columns
  if (derot.rope_dim > 0) {
    rot0 = derot_factors(static_cast<int>(threadIdx.x), D, blockIdx.y, derot);
    rot1 = derot_factors(static_cast<int>(threadIdx.x) + kThreads, D, blockIdx.y, derot);
  }
  static_assert(HG == 4 || HG == 8 || HG == 16, "heads per CTA");
  constexpr int R = HG / 4;  // heads per thread in the score phase (64 entries x HG heads over 256 threads)
  extern __shared__ __align__(16) float smem[];
  const int LD = D + 4;
  float* kvs = smem;
  float* qs = kvs + kTile * LD;
  double* pvs = reinterpret_cast<double*>(qs + HG * D);    // [i][h]; 16-byte aligned (D % 4 == 0)
  float* ss = reinterpret_cast<float*>(pvs + kTile * HG);  // [h][i]
  int* ids = reinterpret_cast<int*>(ss + HG * kTile);
  float* m_s = reinterpret_cast<float*>(ids + kTile);
  float* l_s = m_s + HG;
  float* r_s = l_s + HG;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int h0 = blockIdx.x * HG;
  const int64_t t = blockIdx.y;
  const int nh = min(HG, H - h0);  // heads of this CTA

  for (int e = tid; e < HG * D; e += kThreads) {
    const int h = e / D, d = e % D;
    qs[e] = h < nh ? q[(t * H + h0 + h) * D + d] : 0.0f;
  }
  if (tid < HG) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0.0f;
  }
  const int d0 = tid, d1 = tid + kThreads;
  double acc[HG][2];
#pragma unroll
  for (int h = 0; h < HG; ++h) acc[h][0] = acc[h][1] = 0.0;

  const int32_t* list = idx + t * K;
  const int D4 = D / 4;
  for (int base = 0; base < K; base += kTile) {
    const int n = min(kTile, K - base);
    if (tid < kTile) {
      int j = tid < n ? list[base + tid] : -1;
      if (j >= N) j = -1;  // out of range: treated as empty (the CPU op rejects it up front)
      ids[tid] = j;
    }
    __syncthreads();
    // Gather the tile's rows.
    for (int c = tid; c < kTile * D4; c += kThreads) {
      const int i = c / D4, c4 = c % D4;
      const int j = ids[i];
      if (j >= 0) cp_async16(kvs + i * LD + c4 * 4, kv + static_cast<int64_t>(j) * D + c4 * 4);
    }
    cp_async_wait_all();
    __syncthreads();

    // Scores: thread (entry i, heads hb .. hb + R - 1), sequential fp32 dot as the CPU.
    {
      const int i = tid & (kTile - 1);
      const int hb = (tid >> 6) * R;
      const bool valid = ids[i] >= 0;
      float dot[R];
#pragma unroll
      for (int r = 0; r < R; ++r) dot[r] = 0.0f;
      if (valid && hb < nh) {
        const float4* kr = reinterpret_cast<const float4*>(kvs + i * LD);
        for (int c = 0; c < D4; ++c) {
          const float4 k4 = kr[c];
#pragma unroll
          for (int r = 0; r < R; ++r) {
            const float4 q4 = reinterpret_cast<const float4*>(qs + (hb + r) * D)[c];
            float a = dot[r];
            a = __fadd_rn(a, __fmul_rn(q4.x, k4.x));
            a = __fadd_rn(a, __fmul_rn(q4.y, k4.y));
            a = __fadd_rn(a, __fmul_rn(q4.z, k4.z));
            a = __fadd_rn(a, __fmul_rn(q4.w, k4.w));
            dot[r] = a;
          }
        }
      }
#pragma unroll
      for (int r = 0; r < R; ++r) ss[(hb + r) * kTile + i] = valid ? __fmul_rn(dot[r], scale) : -INFINITY;
    }
    __syncthreads();

    // Softmax step: one warp per head (warps 0..7 take heads w, w + 8).
    for (int h = warp; h < HG; h += kThreads / 32) {
      if (h >= nh) {
        if (lane == 0) r_s[h] = 1.0f;
        pvs[lane * HG + h] = 0.0;
        pvs[(lane + 32) * HG + h] = 0.0;
        continue;
      }
      const float s0 = ss[h * kTile + lane], s1 = ss[h * kTile + lane + 32];
      float tmax = fmaxf(s0, s1);
      for (int o = 16; o > 0; o >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, o));
      const float m_old = m_s[h];
      const float m_new = fmaxf(m_old, tmax);
      if (m_new == -INFINITY) {  // nothing valid yet: the CPU skips the tile
        if (lane == 0) r_s[h] = 1.0f;
        pvs[lane * HG + h] = 0.0;
        pvs[(lane + 32) * HG + h] = 0.0;
        continue;
      }
      const float p0 = s0 == -INFINITY ? 0.0f : exp_f(__fsub_rn(s0, m_new));
      const float p1 = s1 == -INFINITY ? 0.0f : exp_f(__fsub_rn(s1, m_new));
      pvs[lane * HG + h] = static_cast<double>(bf16_probs ? round_to_bf16(p0) : p0);
      pvs[(lane + 32) * HG + h] = static_cast<double>(bf16_probs ? round_to_bf16(p1) : p1);
      ss[h * kTile + lane] = p0;  // the probabilities replace the scores for the sequential sum
      ss[h * kTile + lane + 32] = p1;
      __syncwarp();
      if (lane == 0) {
        float4 pv4[kTile / 4];
#pragma unroll
        for (int c = 0; c < kTile / 4; ++c) pv4[c] = reinterpret_cast<const float4*>(ss + h * kTile)[c];
        float tsum = 0.0f;  // entries past n and empty ones are exact zeros: adding them changes nothing
#pragma unroll
        for (int c = 0; c < kTile / 4; ++c) {
          tsum = __fadd_rn(tsum, pv4[c].x);
          tsum = __fadd_rn(tsum, pv4[c].y);
          tsum = __fadd_rn(tsum, pv4[c].z);
          tsum = __fadd_rn(tsum, pv4[c].w);
        }
        const float rescale = exp_f(__fsub_rn(m_old, m_new));
        r_s[h] = rescale;
        l_s[h] = __fadd_rn(__fmul_rn(l_s[h], rescale), tsum);
        m_s[h] = m_new;
      }
    }
    __syncthreads();

    // P.V in FP64: rescale, then entries in order.
#pragma unroll
    for (int h = 0; h < HG; ++h) {
      const double rs = static_cast<double>(r_s[h]);
      acc[h][0] = __dmul_rn(acc[h][0], rs);
      acc[h][1] = __dmul_rn(acc[h][1], rs);
    }
    for (int i = 0; i < n; ++i) {
      if (ids[i] < 0) continue;  // uniform across the block
      const float* vr = kvs + i * LD;
      const double v0 = d0 < D ? static_cast<double>(vr[d0]) : 0.0;
      const double v1 = d1 < D ? static_cast<double>(vr[d1]) : 0.0;
#pragma unroll
      for (int c = 0; c < HG / 2; ++c) {
        const double2 p2 = reinterpret_cast<const double2*>(pvs + i * HG)[c];
        acc[c * 2][0] = __fma_rn(p2.x, v0, acc[c * 2][0]);
        acc[c * 2][1] = __fma_rn(p2.x, v1, acc[c * 2][1]);
        acc[c * 2 + 1][0] = __fma_rn(p2.y, v0, acc[c * 2 + 1][0]);
        acc[c * 2 + 1][1] = __fma_rn(p2.y, v1, acc[c * 2 + 1][1]);
      }
    }
    __syncthreads();  // the next tile overwrites ids, kvs, pvs
  }

#pragma unroll
  for (int h = 0; h < HG; ++h) {
    if (h >= nh) continue;  // uniform over the CTA (as m below)
    const float m = m_s[h];
    float* o = out + (t * H + h0 + h) * D;
    float v0 = 0.0f, v1 = 0.0f;
    if (m != -INFINITY) {
      const float l = __fadd_rn(l_s[h], exp_f(__fsub_rn(sink[h0 + h], m)));
      v0 = __fdiv_rn(__double2float_rn(acc[h][0]), l);
      v1 = __fdiv_rn(__double2float_rn(acc[h][1]), l);
      v0 = round ? round_to_bf16(v0) : v0;
      v1 = round ? round_to_bf16(v1) : v1;
    }
    if (derot.rope_dim > 0) {
      v0 = derotate(v0, d0, D, derot, rot0, round);
      v1 = derotate(v1, d1, D, derot, rot1, round);
    }
    if (d0 < D) o[d0] = v0;
    if (d1 < D) o[d1] = v1;
  }
}

// ---- The split kernel (decode: few query rows) ----------------------------------------------------------
// One cluster of kC CTAs per (token, group of HG heads). Every value goes through the same operations as
// in sparse_attn_kernel above; only who computes it, and when, changes:
//  1. Every CTA compacts the token's index list (valid = 0 <= id < N, in list order) and records where
//     each 64-entry tile starts in the compacted list.
//  2. Scores of ALL tiles at once: CTA r takes the r-th slice of the valid entries; each (entry, head)
//     score is a sequential fp32 dot over d = 0..D-1 (one thread forms the dots of two heads for one
//     entry side by side; the rows stream through shared memory in chunks as wide as it holds, the whole
//     row at decode; a thread keeps its dots in registers across chunks), times `scale`.
//  3. Per (head, tile) the max over the CTA's own scores goes to every CTA of the cluster (distributed
//     shared memory); a cluster barrier; each CTA then has every tile max, so m_new of every tile
//     (a running fmaxf, order-free: fmaxf ignores NaN and the sign of a zero max never reaches a
//     result) and m_old. Each CTA computes p = exp(s - m_new) of its own entries (0 for -inf scores
//     and for tiles still at m = -inf, as the CPU skips those) and stores p by list position into
//     every CTA; a cluster barrier.
//  4. Each CTA redoes the cheap per-tile bookkeeping for all its heads: the sequential fp32 tile sum
//     over the 64 positions in order (empty ones are exact zeros, as in the tiled kernel), rescale =
//     exp(m_old - m_new), l = l * rescale + tsum tile by tile; tiles at m = -inf rescale by 1.
//  5. P.V: CTA r owns output columns [r * DC, r * DC + DC) of the group's heads. Tile by tile the
//     accumulators are rescaled, then take one FP64 FMA per valid entry in list order; the entries'
//     column slices stream through shared memory (they were just read in step 2, so they come from L2).
//     Tiles without a valid entry are passed over (their rescale is exactly 1 and they add nothing): at a
//     short context most of the picks are empty.
template <int HG>
struct SplitCfg {
  static constexpr int kPvHeads = HG == 4 ? 4 : HG / 2;  // heads per P.V thread (one column each)
  static constexpr int kSlots = HG;  // score chains per thread at most: (kMaxK / kC) * HG / kThreads
};

constexpr int kC = 8;             // CTAs per cluster (the portable maximum)
constexpr int kSplitMaxK = 2048;  // longest index list the split kernel takes
constexpr int kNsts = 4;          // score chunk stages at most
constexpr int kNstv = 3;          // P.V tile stages at least (more where the score stages leave the room)
constexpr int kMaxNstv = 5;

// Shared-memory layout of the split kernel, in 4-byte words (every array starts 16-byte aligned).
// The score phase streams the CTA's rows through shared memory in chunks of `cw` columns (row stride sst =
// cw + 4: conflict-free float4 reads) in a ring of `nst` stages, each chunk behind a block barrier; chunks
// as wide as shared memory allows (split_plan) take fewer barriers: a window-only layer's rows fit whole.
struct SplitLayout {
  int ntiles, Kp, Emax, DC, QS, cw, sst, nst, nstv;
  int vrow, vpos, lst, tstart, tlist, wcnt, qs, P, sown, pm, tm, mn, mo, rs, ts, lf, mf, pvd, region;
  int words;
};

inline SplitLayout split_layout(int K, int D, int HG, int cw, int nst) {
  auto r4 = [](int64_t x) { return static_cast<int>((x + 3) / 4 * 4); };
  SplitLayout L{};
  L.ntiles = (K + kTile - 1) / kTile;
  L.Kp = L.ntiles * kTile;
  L.Emax = (K + kC - 1) / kC;
  L.DC = ((D / 4 + kC - 1) / kC) * 4;
  L.QS = D + 4;
  L.cw = cw;
  L.sst = cw + 4;
  L.nst = std::min(nst, (D + cw - 1) / cw);  // a ring longer than the chunks is never used
  const int stages = L.nst;
  const int HT = HG * L.ntiles;
  int o = 0;
  L.vrow = o, o += r4(K);
  L.vpos = o, o += r4(K);
  L.lst = o, o += r4(K);
  L.tstart = o, o += r4(L.ntiles + 1);
  L.tlist = o, o += r4(L.ntiles + 1);
  L.wcnt = o, o += r4(kThreads / 32);
  L.qs = o, o += r4(HG * L.QS);
  L.P = o, o += r4(HG * L.Kp);
  L.sown = o, o += r4(HG * L.Emax);
  L.pm = o, o += r4(kC * HT);
  L.tm = o, o += r4(HT);
  L.mn = o, o += r4(HT);
  L.mo = o, o += r4(HT);
  L.rs = o, o += r4(HT);
  L.ts = o, o += r4(HT);
  L.lf = o, o += r4(HG);
  L.mf = o, o += r4(HG);
  L.pvd = o, o += 2 * kTile * HG * 2;  // two tiles of doubles [64][HG]
  // The region holds the score stages, then the P.V tile stages: as many of those as about fit in the same room.
  const int64_t score_words = int64_t{stages} * L.Emax * L.sst, tile_words = int64_t{kTile} * L.DC;
  L.nstv = static_cast<int>(std::clamp<int64_t>((score_words + tile_words / 2) / tile_words, kNstv, kMaxNstv));
  L.region = o, o += r4(std::max<int64_t>(score_words, L.nstv * tile_words));
  L.words = o;
  return L;
}

// cp.async.wait_group with a count known at run time (0..3: rings of up to 5 stages).
__device__ __forceinline__ void cp_async_wait_upto(int pending) {
  if (pending >= 3)
    cp_async_wait<3>();
  else if (pending == 2)
    cp_async_wait<2>();
  else if (pending == 1)
    cp_async_wait<1>();
  else
    cp_async_wait<0>();
}

__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory"); }
// Stores v at the address of `local` in the shared memory of cluster CTA `rank`.
__device__ __forceinline__ void st_cluster(const float* local, unsigned rank, float v) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(local));
  unsigned ra;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(ra) : "r"(a), "r"(rank));
  asm volatile("st.shared::cluster.f32 [%0], %1;\n" ::"r"(ra), "f"(v) : "memory");
}

// Two chains over one k row: a += qa[d] * k[d], b += qb[d] * k[d] over n4 float4 groups, d ascending, as the CPU.
__device__ __forceinline__ void dot_pair(float& a, float& b, const float* qa, const float* qb, const float* k, int n4) {
#pragma unroll 4
  for (int g = 0; g < n4; ++g) {
    const float4 k4 = reinterpret_cast<const float4*>(k)[g];
    const float4 q4 = reinterpret_cast<const float4*>(qa)[g];
    const float4 r4 = reinterpret_cast<const float4*>(qb)[g];
    a = __fadd_rn(a, __fmul_rn(q4.x, k4.x));
    b = __fadd_rn(b, __fmul_rn(r4.x, k4.x));
    a = __fadd_rn(a, __fmul_rn(q4.y, k4.y));
    b = __fadd_rn(b, __fmul_rn(r4.y, k4.y));
    a = __fadd_rn(a, __fmul_rn(q4.z, k4.z));
    b = __fadd_rn(b, __fmul_rn(r4.z, k4.z));
    a = __fadd_rn(a, __fmul_rn(q4.w, k4.w));
    b = __fadd_rn(b, __fmul_rn(r4.w, k4.w));
  }
}

// A 16-byte cp.async without the compiler memory barrier of common.cuh's cp_async16, for the staging loops: the
// loads of their row indices can then run ahead of the copies. Safe where every read of the destination follows a
// cp_async_wait (which keeps its barrier) and nothing else writes the destination meanwhile.
__device__ __forceinline__ void cp_async16_relaxed(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}

template <int HG>
__global__ void __cluster_dims__(kC, 1, 1) __launch_bounds__(kThreads, HG == 16 ? 1 : 2)
    sparse_attn_split_kernel(const float* __restrict__ q, const float* __restrict__ kv, const int32_t* __restrict__ idx,
                             const float* __restrict__ sink, float* __restrict__ out, int H, int D, int N, int K,
                             float scale, bool bf16_probs, bool round, SplitLayout L, Derot derot, bool early_sink) {
  // early_sink (norm_prefetch): the sink of head h0 + tid (step 4's threads tid < HG), a weight that no earlier kernel
  // writes, read before griddepcontrol.wait instead of in step 4, where its HBM latency held those threads' P.V.
  const int h0s = static_cast<int>(blockIdx.x / kC) * HG + static_cast<int>(threadIdx.x);
  const float sink_h = early_sink && threadIdx.x < HG && h0s < H ? __ldg(sink + h0s) : 0.0f;
  pdl_wait();
  pdl_launch_dependents();
  // The de-rotation of this thread's P.V output column (step 5: c0 + cl), loaded now (derot_factors).
  const float2 rot =
      derot.rope_dim > 0
          ? derot_factors(static_cast<int>(blockIdx.x % kC) * L.DC + static_cast<int>(threadIdx.x) % L.DC, D,
                          blockIdx.y, derot)
          : make_float2(1.0f, 0.0f);
  static_assert(HG == 4 || HG == 8 || HG == 16, "heads per cluster");
  constexpr int HPT = SplitCfg<HG>::kPvHeads;
  constexpr int MC = SplitCfg<HG>::kSlots;
  extern __shared__ __align__(16) float smem[];
  int* vrow = reinterpret_cast<int*>(smem + L.vrow);  // compacted valid entries: kv row, list position
  int* vpos = reinterpret_cast<int*>(smem + L.vpos);
  int* tstart = reinterpret_cast<int*>(smem + L.tstart);  // [ntiles + 1]: first compacted entry of each tile
  int* wcnt = reinterpret_cast<int*>(smem + L.wcnt);
  float* qs = smem + L.qs;                                // [HG][QS]
  float* P = smem + L.P;                                  // [HG][Kp] probabilities by list position (0 where empty)
  float* sown = smem + L.sown;                            // [HG][Emax] scores of this CTA's entries
  float* PM = smem + L.pm;                                // [kC][HG][ntiles] tile maxima of each CTA's entries
  float* TM = smem + L.tm;                                // [HG][ntiles] tile maxima
  float* MN = smem + L.mn;                                // m after the tile (m_new)
  float* MO = smem + L.mo;                                // m before the tile (m_old)
  float* RS = smem + L.rs;                                // rescale of the tile (1 where skipped)
  float* TS = smem + L.ts;                                // tile sum
  int* tlist = reinterpret_cast<int*>(smem + L.tlist);    // the tiles holding valid entries, in order; then count
  float* LF = smem + L.lf;                                // [HG] l + exp(sink - m)
  float* MF = smem + L.mf;                                // [HG] final m
  double* pvd = reinterpret_cast<double*>(smem + L.pvd);  // [2][64][HG] probabilities as used in P.V
  float* region = smem + L.region;                        // score chunk stages, then P.V tile stages

  // Nothing may be stored into another CTA's shared memory before every CTA of the cluster runs.
  cluster_arrive_relaxed();

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const unsigned rank = blockIdx.x % kC;
  const int h0 = static_cast<int>(blockIdx.x / kC) * HG;
  const int64_t t = blockIdx.y;
  const int nh = min(HG, H - h0);
  const int ntiles = L.ntiles, Kp = L.Kp, Emax = L.Emax, QS = L.QS;

  // ---- 1. q, the index list compacted -------------------------------------------------------------------
  // The list (one cp.async group) and q (a second) are all in flight at once; the compaction waits for the list
  // only, the scores' first chunk wait covers q.
  const int32_t* list = idx + t * K;
  int* lst = reinterpret_cast<int*>(smem + L.lst);
  for (int pos = tid; pos < K; pos += kThreads) cp_async4(lst + pos, list + pos);
  cp_async_commit();
  const int D4 = D / 4;
  for (int e = tid; e < HG * D4; e += kThreads) {
    const int h = e / D4, c4 = e - h * D4;
    float* dst = qs + h * QS + 4 * c4;
    if (h < nh)
      cp_async16(dst, q + (t * H + h0 + h) * D + 4 * c4);
    else
      *reinterpret_cast<float4*>(dst) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  cp_async_commit();
  for (int e = tid; e < HG * Kp; e += kThreads) P[e] = 0.0f;  // before the cluster barrier A
  cp_async_wait<1>();
  __syncthreads();  // the list
  int V = 0;        // valid entries so far (then in all)
#pragma unroll 1
  for (int r = 0; r * kThreads < K; ++r) {
    const int pos = r * kThreads + tid;
    const int j = pos < K ? lst[pos] : -1;
    const bool valid = pos < K && j >= 0 && j < N;
    const unsigned bal = __ballot_sync(0xffffffffu, valid);
    if (lane == 0) wcnt[warp] = __popc(bal);
    __syncthreads();
    int before = 0, total = 0;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) {
      const int c = wcnt[w];
      before += w < warp ? c : 0;
      total += c;
    }
    const int e = V + before + __popc(bal & ((1u << lane) - 1u));
    if (valid) {
      vrow[e] = j;
      vpos[e] = pos;
    }
    if (pos < K && (pos & (kTile - 1)) == 0) tstart[pos / kTile] = e;
    V += total;
    __syncthreads();  // wcnt is rewritten by the next round
  }
  if (tid == 0) {  // an empty tile changes nothing in P.V (rescale 1, no entries): only the others are walked
    tstart[ntiles] = V;
    int c = 0;
    for (int j = 0; j < ntiles; ++j)
      if (tstart[j + 1] > tstart[j]) tlist[c++] = j;
    tlist[ntiles] = c;
  }

  // ---- 2. scores of this CTA's entries ------------------------------------------------------------------
  const int E = (V + kC - 1) / kC;
  const int e0 = min(V, static_cast<int>(rank) * E);
  const int nown = min(V, e0 + E) - e0;
  // Pair slot p = s * kThreads + tid: entry e0 + p % nown, heads 2 (p / nown) and 2 (p / nown) + 1, two chains that
  // share each k load (half the shared-memory reads of a chain per thread; a warp's lanes read one or two head
  // pairs' q, a broadcast). Measured on the H200: a decode call at K = 128 13.4 us against 14.4.
  const int npairs = nown * (HG / 2);
  const int wbase = warp * 32;
  const int ns = npairs > wbase ? (npairs - wbase - 1) / kThreads + 1 : 0;  // pair slots live in this warp
  constexpr int MP = MC / 2;
  int qoff[MP], koff[MP];
  float dot[MP][2];
#pragma unroll
  for (int s = 0; s < MP; ++s) {
    const int pr = s * kThreads + tid;
    const bool live = pr < npairs;
    const int hp = live ? pr / nown : 0, el = live ? pr - hp * nown : 0;
    qoff[s] = 2 * hp * QS;
    koff[s] = el * L.sst;
    dot[s][0] = dot[s][1] = 0.0f;
  }
  __syncthreads();  // vrow, tstart, qs
  const int cw = L.cw, sst = L.sst;
  const int nck = (D + cw - 1) / cw;
  const int sstage = Emax * sst;
  const int ahead = max(1, L.nst - 1);  // chunks in flight ahead of the one computed (a ring of one: nck = 1)
  auto issue_chunk = [&](int k) {
    if (k < nck) {
      const int n4 = min(cw, D - k * cw) / 4;
      float* st = region + (k % L.nst) * sstage;
      if (kThreads % n4 == 0) {  // each thread keeps one column group and steps over rows: no division per copy
        const int c4 = tid % n4, step = kThreads / n4;
#pragma unroll 4
        for (int el = tid / n4; el < nown; el += step)
          cp_async16_relaxed(st + el * sst + c4 * 4, kv + static_cast<int64_t>(vrow[e0 + el]) * D + k * cw + c4 * 4);
      } else {
#pragma unroll 4
        for (int x = tid; x < nown * n4; x += kThreads) {
          const int el = x / n4, c4 = x - el * n4;
          cp_async16_relaxed(st + el * sst + c4 * 4, kv + static_cast<int64_t>(vrow[e0 + el]) * D + k * cw + c4 * 4);
        }
      }
    }
    cp_async_commit();
  };
#pragma unroll
  for (int k = 0; k < ahead; ++k) issue_chunk(k);
  for (int k = 0; k < nck; ++k) {
    cp_async_wait_upto(ahead - 1);
    __syncthreads();  // chunk k landed for all; chunk k - 1 read by all (its stage is refilled next)
    if (L.nst > 1) issue_chunk(k + ahead);
    const int n4 = min(cw, D - k * cw) / 4;
    const float* st = region + (k % L.nst) * sstage;
    const float* qk = qs + k * cw;
#pragma unroll
    for (int s = 0; s < MP; ++s)
      if (s < ns) dot_pair(dot[s][0], dot[s][1], qk + qoff[s], qk + qoff[s] + QS, st + koff[s], n4);
  }
#pragma unroll
  for (int s = 0; s < MP; ++s) {
    const int pr = s * kThreads + tid;
    if (pr < npairs) {
      const int hp = pr / nown, el = pr - hp * nown;
      sown[2 * hp * Emax + el] = __fmul_rn(dot[s][0], scale);
      sown[(2 * hp + 1) * Emax + el] = __fmul_rn(dot[s][1], scale);
    }
  }
  __syncthreads();  // sown complete; every stage read (the region now takes P.V tiles)

  // P.V roles: threads [0, npv) own (column, kPvHeads heads); the others (helpers) stage tiles and convert p.
  const int DC = L.DC;
  const int c0 = static_cast<int>(rank) * DC;
  const int ncol4 = max(0, min(DC, D - c0)) / 4;
  const int npv = DC * (HG / HPT);  // <= 128
  const bool helper = tid >= npv;
  const int hid = tid - npv, nhelp = kThreads - npv;
  const int vstage = kTile * DC;
  // P.V walks the tiles with valid entries (u-th: tile tlist[u]); stages and p buffers go by u.
  const int nnt = tlist[ntiles];
  // A helper's copies: where the helpers are a whole number of rows' column groups, each keeps its group (c4 fixed)
  // and steps over rows, with no division per copy (measured on the H100: 37.8 -> 34.3 us a decode call at 640
  // entries; the helpers had been the P.V loop's critical path, its threads waiting at the tile barrier). The score
  // chunks' copies above take the same form; one helper for both measured 0.6-1.2 us a call slower (H100,
  // bench/RESULTS.md forty-seventh session), so the two loops stay apart.
  const bool fixed_c4 = ncol4 > 0 && nhelp % ncol4 == 0;
  const int my_c4 = fixed_c4 ? hid % ncol4 : 0, my_i0 = fixed_c4 ? hid / ncol4 : 0, di = fixed_c4 ? nhelp / ncol4 : 0;
  auto issue_tile = [&](int u) {  // helpers only
    if (u < nnt) {
      const int j = tlist[u];
      const int tb = tstart[j], nv = tstart[j + 1] - tb;
      float* st = region + (u % L.nstv) * vstage;
      if (fixed_c4) {
#pragma unroll 4
        for (int i = my_i0; i < nv; i += di)
          cp_async16_relaxed(st + i * DC + my_c4 * 4, kv + static_cast<int64_t>(vrow[tb + i]) * D + c0 + my_c4 * 4);
      } else {
#pragma unroll 4
        for (int x = hid; x < nv * ncol4; x += nhelp) {
          const int i = x / ncol4, c4 = x - i * ncol4;
          cp_async16_relaxed(st + i * DC + c4 * 4, kv + static_cast<int64_t>(vrow[tb + i]) * D + c0 + c4 * 4);
        }
      }
    }
    cp_async_commit();
  };
  auto convert_tile = [&](int u) {  // helpers only: pv of the valid entries as doubles, [i][h]
    const int j = tlist[u];
    const int tb = tstart[j], nv = tstart[j + 1] - tb;
    double* pd = pvd + (u & 1) * kTile * HG;
    // In batches of 4 per thread, every load first: each value is two dependent shared loads (its list position,
    // then p), and the stores in between would otherwise keep the next value's loads from starting early.
    constexpr int kB = 4;
    const int n = nv * HG;
    for (int x0 = hid; x0 < n; x0 += kB * nhelp) {
      float p[kB];
#pragma unroll
      for (int b = 0; b < kB; ++b) {
        const int x = x0 + b * nhelp, i = x / HG, h = x - i * HG;
        p[b] = x < n ? P[h * Kp + vpos[tb + i]] : 0.0f;
      }
#pragma unroll
      for (int b = 0; b < kB; ++b) {
        const int x = x0 + b * nhelp;
        if (x < n) pd[x] = static_cast<double>(bf16_probs ? round_to_bf16(p[b]) : p[b]);
      }
    }
  };
  if (helper) {
#pragma unroll
    for (int u = 0; u < L.nstv - 1; ++u) issue_tile(u);
  }

  // ---- 3. tile maxima to every CTA; m per tile; p of this CTA's entries to every CTA --------------------
  cluster_wait();  // every CTA of the cluster has started
  for (int x = tid; x < HG * ntiles; x += kThreads) {
    const int h = x / ntiles, j = x - h * ntiles;
    const int lo = max(tstart[j], e0) - e0, hi = min(tstart[j + 1], e0 + nown) - e0;
    float m = -INFINITY;
    for (int el = lo; el < hi; ++el) m = fmaxf(m, sown[h * Emax + el]);
    float* dst = PM + (rank * HG + h) * ntiles + j;
#pragma unroll
    for (unsigned r = 0; r < kC; ++r) st_cluster(dst, r, m);
  }
  cluster_arrive();
  cluster_wait();  // barrier A: every PM written
  for (int x = tid; x < HG * ntiles; x += kThreads) {
    float m = -INFINITY;
#pragma unroll
    for (int r = 0; r < kC; ++r) m = fmaxf(m, PM[r * HG * ntiles + x]);
    TM[x] = m;
  }
  __syncthreads();
  for (int x = tid; x < HG * ntiles; x += kThreads) {
    const int h = x / ntiles, j = x - h * ntiles;
    float mo = -INFINITY;
    for (int i = 0; i < j; ++i) mo = fmaxf(mo, TM[h * ntiles + i]);
    MO[x] = mo;
    MN[x] = fmaxf(mo, TM[x]);
  }
  __syncthreads();
  for (int x = tid; x < HG * nown; x += kThreads) {
    const int h = x / nown, el = x - h * nown;
    const int pos = vpos[e0 + el];
    const float m_new = MN[h * ntiles + pos / kTile];
    const float s = sown[h * Emax + el];
    const float p = (m_new == -INFINITY || s == -INFINITY) ? 0.0f : exp_f(__fsub_rn(s, m_new));
    float* dst = P + h * Kp + pos;
#pragma unroll
    for (unsigned r = 0; r < kC; ++r) st_cluster(dst, r, p);
  }
  cluster_arrive();
  cluster_wait();  // barrier B: P complete in every CTA (no cluster access after this)

  // ---- 4. tile sums, rescales, l ------------------------------------------------------------------------
  for (int x = tid; x < HG * ntiles; x += kThreads) {
    const int h = x / ntiles, j = x - h * ntiles;
    const float m_new = MN[x];
    if (m_new == -INFINITY) {  // the CPU skips the tile
      RS[x] = 1.0f;
      TS[x] = 0.0f;
      continue;
    }
    const float4* p4 = reinterpret_cast<const float4*>(P + h * Kp + j * kTile);
    float tsum = 0.0f;
#pragma unroll
    for (int c = 0; c < kTile / 4; ++c) {
      const float4 v = p4[c];
      tsum = __fadd_rn(tsum, v.x);
      tsum = __fadd_rn(tsum, v.y);
      tsum = __fadd_rn(tsum, v.z);
      tsum = __fadd_rn(tsum, v.w);
    }
    TS[x] = tsum;
    RS[x] = exp_f(__fsub_rn(MO[x], m_new));
  }
  if (helper && nnt > 0) convert_tile(0);
  __syncthreads();
  if (tid < HG) {
    const int h = tid;
    float l = 0.0f;
    for (int j = 0; j < ntiles; ++j)
      if (MN[h * ntiles + j] != -INFINITY) l = __fadd_rn(__fmul_rn(l, RS[h * ntiles + j]), TS[h * ntiles + j]);
    const float m = ntiles > 0 ? MN[h * ntiles + ntiles - 1] : -INFINITY;
    MF[h] = m;
    LF[h] = (h < nh && m != -INFINITY) ? __fadd_rn(l, exp_f(__fsub_rn(early_sink ? sink_h : sink[h0 + h], m))) : 0.0f;
  }

  // ---- 5. P.V in FP64, tile by tile ---------------------------------------------------------------------
  const int cl = tid % DC, hq = tid / DC;  // P.V threads: column c0 + cl, heads hq * HPT ..
  const bool col_ok = !helper && cl < ncol4 * 4;
  double acc[HPT];
#pragma unroll
  for (int u = 0; u < HPT; ++u) acc[u] = 0.0;
  auto pv_tile = [&](int w) {  // P.V threads: the w-th walked tile into acc
    const int j = tlist[w];
    const int nv = tstart[j + 1] - tstart[j];
#pragma unroll
    for (int u = 0; u < HPT; ++u) acc[u] = __dmul_rn(acc[u], static_cast<double>(RS[(hq * HPT + u) * ntiles + j]));
    const float* vs = region + (w % L.nstv) * vstage + cl;
    const double* pd = pvd + (w & 1) * kTile * HG + hq * HPT;
    // Entries in batches of kPvBatch: every load of a batch first, then its FMAs in entry order, so a batch
    // costs one shared-memory round trip and the FMA chains (one per head) run back to back (one entry at a
    // time waited on its loads and conversion: ~50 cycles per entry, 1.6 us per full tile).
    constexpr int kPvBatch = HPT <= 4 ? 8 : 4;
    int i = 0;
#pragma unroll 1
    for (; i + kPvBatch <= nv; i += kPvBatch) {
      double v[kPvBatch];
      double2 p2[kPvBatch][HPT / 2];
#pragma unroll
      for (int e = 0; e < kPvBatch; ++e) {
        v[e] = static_cast<double>(vs[(i + e) * DC]);
#pragma unroll
        for (int u = 0; u < HPT / 2; ++u) p2[e][u] = reinterpret_cast<const double2*>(pd + (i + e) * HG)[u];
      }
#pragma unroll
      for (int e = 0; e < kPvBatch; ++e) {
#pragma unroll
        for (int u = 0; u < HPT / 2; ++u) {
          acc[2 * u] = __fma_rn(p2[e][u].x, v[e], acc[2 * u]);
          acc[2 * u + 1] = __fma_rn(p2[e][u].y, v[e], acc[2 * u + 1]);
        }
      }
    }
#pragma unroll 1
    for (; i < nv; ++i) {
      const double v = static_cast<double>(vs[i * DC]);
#pragma unroll
      for (int u = 0; u < HPT / 2; ++u) {
        const double2 p2 = reinterpret_cast<const double2*>(pd + i * HG)[u];
        acc[2 * u] = __fma_rn(p2.x, v, acc[2 * u]);
        acc[2 * u + 1] = __fma_rn(p2.y, v, acc[2 * u + 1]);
      }
    }
  };
  for (int w = 0; w < nnt; ++w) {
    if (helper) cp_async_wait_upto(L.nstv - 2);
    __syncthreads();  // the w-th tile staged and converted; the one before consumed
    if (helper) {
      issue_tile(w + L.nstv - 1);
      if (w + 1 < nnt) convert_tile(w + 1);
    } else if (col_ok) {
      pv_tile(w);
    }
  }
  if (nnt == 0) __syncthreads();  // MF, LF

  // Every thread goes through the stores (the de-rotation's shuffle pairs columns d, d ^ 1: lanes l, l ^ 1, since DC
  // and c0 are even); only P.V threads of real heads store.
  const int d = c0 + cl;
#pragma unroll
  for (int u = 0; u < HPT; ++u) {
    const int h = hq * HPT + u;
    const bool store = col_ok && h < nh;
    float v = 0.0f;
    if (store && MF[h] != -INFINITY) {
      v = __fdiv_rn(__double2float_rn(acc[u]), LF[h]);
      v = round ? round_to_bf16(v) : v;
    }
    if (derot.rope_dim > 0) v = derotate(v, d, D, derot, rot, round);
    if (store) out[(t * H + h0 + h) * D + d] = v;
  }
}

void check_dev(const Tensor& t, DType dt, const char* what) {
  DI_CHECK(t.defined() && t.device() == Device::kCUDA && t.dtype() == dt && t.is_contiguous(),
           "cuda::sparse_attention: {} must be a contiguous {} CUDA tensor, got {}", what, dtype_name(dt),
           t.defined() ? t.describe() : std::string("undefined"));
}

template <int HG>
void launch(const Tensor& q, const Tensor& kv, const Tensor& idx, const Tensor& sink, float scale, bool bf16_probs,
            bool round, Tensor& out, cudaStream_t stream, const Derot& derot) {
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2);
  const size_t smem = static_cast<size_t>(smem_floats(D, HG)) * sizeof(float);
  static const bool configured = [] {  // per instantiation, once, for the largest D
    DI_CUDA_CHECK(cudaFuncSetAttribute(sparse_attn_kernel<HG>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem_floats(kMaxD, HG) * sizeof(float))));
    return true;
  }();
  (void)configured;
  const dim3 grid(static_cast<unsigned>((H + HG - 1) / HG), static_cast<unsigned>(T));
  launch_pdl(sparse_attn_kernel<HG>, grid, kThreads, smem, stream, q.data<float>(), kv.data<float>(),
             idx.data<int32_t>(), sink.data<float>(), out.data<float>(), static_cast<int>(H), static_cast<int>(D),
             static_cast<int>(kv.size(0)), static_cast<int>(idx.size(1)), scale, bf16_probs, round, derot);
  DI_CUDA_CHECK(cudaGetLastError());
}

// Clusters of the split kernel at hg heads that can run at once with `smem` bytes per CTA (cached per shape).
int split_active_clusters(int hg, int64_t smem) {
  static std::mutex mu;
  static std::map<std::pair<int, int64_t>, int> cache;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(hg, smem);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(kC);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = static_cast<size_t>(smem);
  int n = 0;
  const auto kernel =
      hg == 4 ? sparse_attn_split_kernel<4> : (hg == 8 ? sparse_attn_split_kernel<8> : sparse_attn_split_kernel<16>);
  DI_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_optin()));
  DI_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&n, kernel, &cfg));
  cache.emplace(key, n);
  return n;
}

// The split kernel's layout for T rows at hg heads per cluster: the widest score chunks (fewest barriers) that
// need no more waves of clusters than the narrowest (32 columns, 4 stages): a whole row in one stage when it fits
// beside the rest (a layer without compression, K = 128), else e.g. 64 columns in 3 stages (K = 640 at one row).
SplitLayout split_plan(int64_t T, int64_t H, int64_t D, int64_t K, int hg) {
  const int64_t clusters = T * ((H + hg - 1) / hg);
  auto waves = [&](const SplitLayout& L) {
    const int64_t bytes = int64_t{L.words} * 4;
    if (bytes > smem_optin()) return int64_t{1} << 40;
    const int n = split_active_clusters(hg, bytes);
    return n > 0 ? (clusters + n - 1) / n : int64_t{1} << 40;
  };
  const SplitLayout narrow = split_layout(static_cast<int>(K), static_cast<int>(D), hg, 32, kNsts);
  const int64_t base = waves(narrow);
  const int whole = (static_cast<int>(D) + 31) / 32 * 32;
  const std::pair<int, int> tries[] = {{whole, 1}, {256, 2}, {128, 3}, {128, 2}, {64, 4}, {64, 3}, {64, 2}};
  for (const auto& [cw, nst] : tries) {
    if (cw > whole) continue;
    const SplitLayout L = split_layout(static_cast<int>(K), static_cast<int>(D), hg, cw, nst);
    if (waves(L) <= base) return L;
  }
  return narrow;
}

template <int HG>
void launch_split(const Tensor& q, const Tensor& kv, const Tensor& idx, const Tensor& sink, float scale,
                  bool bf16_probs, bool round, Tensor& out, cudaStream_t stream, const SplitLayout& L,
                  const Derot& derot) {
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2);
  static const bool configured = [] {
    DI_CUDA_CHECK(
        cudaFuncSetAttribute(sparse_attn_split_kernel<HG>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_optin()));
    return true;
  }();
  (void)configured;
  const size_t smem = static_cast<size_t>(L.words) * sizeof(float);
  const dim3 grid(static_cast<unsigned>((H + HG - 1) / HG * kC), static_cast<unsigned>(T));
  launch_pdl(sparse_attn_split_kernel<HG>, grid, kThreads, smem, stream, q.data<float>(), kv.data<float>(),
             idx.data<int32_t>(), sink.data<float>(), out.data<float>(), static_cast<int>(H), static_cast<int>(D),
             static_cast<int>(kv.size(0)), static_cast<int>(idx.size(1)), scale, bf16_probs, round, L, derot,
             norm_prefetch());
  DI_CUDA_CHECK(cudaGetLastError());
}

// The split kernel's heads per cluster for this shape (0: use the tiled kernel). Few query rows (decode): the tiled
// kernel would run T * H / 4 CTAs on a GPU of sm_count() SMs, each walking its tiles one after another. The split
// kernel takes the rows while clusters of 16 heads for all of them fit on the GPU at once (T <= 4 at H = 64), with 8
// heads per cluster where that layout fits (then 16, then 4). bench_cuda_attention on the H200 at H = 64, the model's
// decode cases (K = 640 with 512 / 32 valid picks, K = 128), us: T = 1 8 heads 39.3 / 18.3 / 14.7, 4 heads 41.0 /
// 20.1 / 15.6; T = 2 8 heads 56.7 / 26.9 / 18.7, 4 heads 67.5 / 37.1 / 29.0 (32 clusters of 4 heads take a second
// wave: 30 fit); T = 4 8 heads 96.2 / 49.6 / 35.0, 16 heads 120.3 / 56.1 / 26.8; T = 8 the tiled kernel 133 / 72
// / 31.5. The chosen heads' layout goes to *layout (planned once per call).
int auto_split_hg(int64_t T, int64_t H, int64_t D, int64_t K, SplitLayout* layout) {
  if (K < 1 || K > kSplitMaxK) return 0;
  if (T * ((H + 15) / 16) * kC > sm_count()) return 0;
  for (int hg : {8, 16, 4}) {
    const SplitLayout L = split_plan(T, H, D, K, hg);
    if (int64_t{L.words} * 4 <= smem_optin()) {
      *layout = L;
      return hg;
    }
  }
  return 0;
}

// The launch of one call after sparse_attention_into's checks: the kernel and its heads per CTA / cluster.
void dispatch(const Tensor& q, const Tensor& kv, const Tensor& idx, const Tensor& sink, float scale, bool bf16_probs,
              bool round, Tensor& out, CUstream_st* stream, int heads_per_cta, const Derot& derot) {
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2);
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  int split_hg = heads_per_cta < 0 ? -heads_per_cta : 0;
  SplitLayout L{};
  // The split kernel stages q by 16-byte cp.async: q must be 16-byte aligned (the tiled kernel takes any q).
  const bool q16 = reinterpret_cast<uintptr_t>(q.raw()) % 16 == 0;
  if (heads_per_cta == 0 && q16) split_hg = auto_split_hg(T, H, D, idx.size(1), &L);
  if (split_hg != 0) {
    const int64_t K = idx.size(1);
    DI_CHECK(split_hg == 4 || split_hg == 8 || split_hg == 16,
             "cuda::sparse_attention: heads per cluster must be 4, 8 or 16, got {}", split_hg);
    DI_CHECK(q16, "cuda::sparse_attention: the split kernel needs q 16-byte aligned");
    DI_CHECK(K >= 1 && K <= kSplitMaxK,
             "cuda::sparse_attention: the split kernel takes 1 to {} indices per row, got {}", kSplitMaxK, K);
    if (heads_per_cta != 0) L = split_plan(T, H, D, K, split_hg);  // forced heads: auto_split_hg did not plan
    DI_CHECK(static_cast<int64_t>(L.words) * 4 <= smem_optin(),
             "cuda::sparse_attention: the split kernel needs {} bytes of shared memory for K {} D {} heads {}",
             static_cast<int64_t>(L.words) * 4, K, D, split_hg);
    if (split_hg == 4)
      launch_split<4>(q, kv, idx, sink, scale, bf16_probs, round, out, s, L, derot);
    else if (split_hg == 8)
      launch_split<8>(q, kv, idx, sink, scale, bf16_probs, round, out, s, L, derot);
    else
      launch_split<16>(q, kv, idx, sink, scale, bf16_probs, round, out, s, L, derot);
    return;
  }
  int hg = heads_per_cta;
  if (hg == 0) {
    // Enough CTAs to fill the GPU (one 512-wide CTA per SM) with the most heads per CTA; the bar is the
    // SM count rounded down to a multiple of 32 (128 on the H200: measured best at H = 64 is 4 heads
    // for T = 8, 8 for T = 16, 16 from T = 32).
    const int64_t target = sm_count() / 32 * 32;
    hg = T * ((H + 15) / 16) >= target ? 16 : (T * ((H + 7) / 8) >= target ? 8 : 4);
  }
  if (hg == 16)
    launch<16>(q, kv, idx, sink, scale, bf16_probs, round, out, s, derot);
  else if (hg == 8)
    launch<8>(q, kv, idx, sink, scale, bf16_probs, round, out, s, derot);
  else if (hg == 4)
    launch<4>(q, kv, idx, sink, scale, bf16_probs, round, out, s, derot);
  else
    fail("cuda::sparse_attention: heads per CTA must be 4, 8 or 16, got {}", hg);
}

}  // namespace

void sparse_attention_into(const Tensor& q, const Tensor& kv, const Tensor& idx, const Tensor& sink, float scale,
                           bool bf16_probs, bool round, Tensor& out, CUstream_st* stream, int heads_per_cta,
                           const ops::AttnDerotate* derotate) {
  check_dev(q, DType::kF32, "q");
  check_dev(kv, DType::kF32, "kv");
  check_dev(idx, DType::kI32, "idx");
  check_dev(sink, DType::kF32, "sink");
  check_dev(out, DType::kF32, "out");
  DI_CHECK(q.dim() == 3 && kv.dim() == 2 && idx.dim() == 2, "cuda::sparse_attention: q {} kv {} idx {}", q.describe(),
           kv.describe(), idx.describe());
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2);
  DI_CHECK(kv.size(1) == D && idx.size(0) == T && sink.numel() == H && out.numel() == T * H * D,
           "cuda::sparse_attention: shapes q {} kv {} idx {} sink {} out {}", q.describe(), kv.describe(),
           idx.describe(), sink.describe(), out.describe());
  DI_CHECK(D % 4 == 0 && D <= kMaxD && D > 0, "cuda::sparse_attention: head dim {} must be a multiple of 4 in [4, {}]",
           D, kMaxD);
  DI_CHECK(T < 65536 && kv.size(0) < (int64_t{1} << 31) && idx.size(1) < (int64_t{1} << 31),
           "cuda::sparse_attention: too large: q {} kv {} idx {}", q.describe(), kv.describe(), idx.describe());
  DI_CHECK(reinterpret_cast<uintptr_t>(kv.raw()) % 16 == 0, "cuda::sparse_attention: kv rows must be 16-byte aligned");
  if (T == 0 || H == 0) return;
  if (derotate) {
    DI_CHECK(derotate->freqs && derotate->positions && derotate->rope_dim > 0 && derotate->rope_dim % 2 == 0 &&
                 derotate->rope_dim <= D &&
                 static_cast<int64_t>(derotate->freqs->freq.size()) * 2 == derotate->rope_dim,
             "cuda::sparse_attention: the de-rotation needs positions and a table of rope_dim / 2 frequencies, an even "
             "rope_dim in (0, {}], got {}",
             D, derotate->rope_dim);
    // The table and the rows' positions as apply_rope finds them; the launch is queued under the table's lock.
    with_rope_rows(*derotate->freqs, derotate->positions, T, "cuda::sparse_attention", [&](const RopeRows& rows) {
      Derot d;
      d.rows = rows;
      d.rope_dim = static_cast<int>(derotate->rope_dim);
      dispatch(q, kv, idx, sink, scale, bf16_probs, round, out, stream, heads_per_cta, d);
    });
    return;
  }
  dispatch(q, kv, idx, sink, scale, bf16_probs, round, out, stream, heads_per_cta, Derot{});
}

Tensor sparse_attention(const Tensor& q, const Tensor& kv, const Tensor& idx, const Tensor& sink, float scale,
                        bool bf16_probs, bool round, const ops::AttnDerotate* derotate) {
  DI_CHECK(q.defined() && q.dim() == 3, "cuda::sparse_attention: q must be [T, H, D]");
  Tensor out = Tensor::empty(q.shape(), DType::kF32, Device::kCUDA);
  sparse_attention_into(q, kv, idx, sink, scale, bf16_probs, round, out, nullptr, 0, derotate);
  return out;
}

}  // namespace deepinfer::cuda
