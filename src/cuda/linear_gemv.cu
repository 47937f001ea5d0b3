// Decode GEMV kernels (E4M3 / FP4 / BF16 weights, M <= 4 rows of x or grouped rows), bit-exact with the
// CPU op. The contract, the replayed summation order and the kernel shapes are in linear_gemv.cuh. FP4 has
// two kernels, chain_gemv (old) and fp4_pair_gemv (new, the default): fp4_variant below.
//
// Common to all kernels:
//  * Persistent blocks: block b serves the x-row group mt = b % mtiles (MT rows of x; grouped mode: one
//    row and its expert) and the weight "steps" (groups of rows) first = b / mtiles, first + stride, ...
//    with stride = gridDim.x / mtiles; x is staged once per block.
//  * x fake quantisation in the kernel: a block-wide pass reads its x rows (float4 through L2), keeps
//    the amax of every group of A columns as the bits of a non-negative float in shared memory (integer
//    atomicMax = float max; fmaxf from 0 drops NaNs, as prep_x_kernel's fmaxf loop), then every value is
//    quantised as e4m3_rne(x / s) * s with s = ue8m0_scale(max(amax, 1e-4), 448): linear.cu's prep_x
//    arithmetic, so the quantised x equals the CPU's fake_quant_fp8 bit for bit.
//  * Programmatic dependent launch: a dense-mode block issues its first weight loads (weights are not
//    produced by the previous kernel), then waits (griddepcontrol.wait) before reading x, the expert
//    ids or the expert tables.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <type_traits>

#include "core/env.h"
#include "cuda/common.cuh"
#include "cuda/device.h"
#include "cuda/fp_decode.cuh"
#include "cuda/linear_gemv.cuh"
#include "cuda/linear_gemv_bf16.cuh"
#include "cuda/linear_gemv_fp4_mma.cuh"
#include "cuda/linear_gemv_fp8.cuh"
#include "cuda/linear_gemv_fp8_bmma.cuh"
#include "cuda/linear_gemv_fp8_mma.cuh"
#include "cuda/linear_gemv_fp8_rows.cuh"
#include "cuda/linear_gemv_fp8_wgmma.cuh"
#include "cuda/quant.cuh"

namespace deepinfer::cuda {

// Blocks of `kernel` that fit one SM with this launch shape (cached; sets the kernel's dynamic shared
// memory limit to the opt-in maximum on first use).
int gemv_blocks_per_sm(const void* kernel, int threads, int64_t smem) {
  static std::mutex mu;
  static std::set<const void*> configured;
  static std::map<std::tuple<const void*, int, int64_t>, int> cache;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(kernel, threads, smem);
  const auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  if (configured.insert(kernel).second)
    DI_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_optin()));
  int n = 0;
  DI_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, static_cast<size_t>(smem)));
  DI_CHECK(n > 0, "cuda::gemv: a block of {} threads with {} bytes of shared memory does not fit an SM", threads, smem);
  cache.emplace(key, n);
  return n;
}

namespace {

enum Fmt : int { kFp8 = 0, kFp4 = 1, kBf16 = 2 };

// Kernel parameters, by value.
struct Params : GemvCall {
  int mtiles;  // x-row groups
  int rows;    // weight rows per step
  int steps;   // ceil(N / rows)
  int tile;    // grouped, > 1: fp4_pair_gemv's tiles of up to `tile` rows of one expert (GemvArgs::tile_rows)
};

// ---- block work and x staging ------------------------------------------------------------------------
struct Work {
  int mt, m0, mrows;  // x rows [m0, m0 + mrows) of this block (mrows >= 1)
  int first, stride;  // weight steps first, first + stride, ...
};

template <int MT>
__device__ __forceinline__ Work block_work(const Params& p) {
  Work wk;
  wk.mt = static_cast<int>(blockIdx.x) % p.mtiles;
  wk.first = static_cast<int>(blockIdx.x) / p.mtiles;
  wk.stride = static_cast<int>(gridDim.x) / p.mtiles;
  wk.m0 = wk.mt * MT;
  wk.mrows = min(MT, p.M - wk.m0);
  return wk;
}

// The x row that row m of the call reads (GemvArgs::x_rows).
__device__ __forceinline__ int64_t x_row(const Params& p, int m) { return p.x_rows > 0 ? m % p.x_rows : m; }

// Grouped mode: the expert of row m (read after pdl_wait; through L2, as written by an earlier kernel).
__device__ __forceinline__ void expert_of(const Params& p, int m, const uint8_t*& w, const uint8_t*& sc) {
  const int e = __ldcg(p.row_expert + x_row(p, m)) + (p.x_rows > 0 ? m / p.x_rows * p.n_experts : 0);
  w = reinterpret_cast<const uint8_t*>(__ldcg(reinterpret_cast<const unsigned long long*>(p.w_table + e)));
  sc = p.s_table == nullptr
           ? nullptr
           : reinterpret_cast<const uint8_t*>(__ldcg(reinterpret_cast<const unsigned long long*>(p.s_table + e)));
}

// Pass 1 over x rows [m0, m0 + mrows) (float4 loads through L2, 4 per thread in flight): the group amax
// into gmax[MT][ng] (zeroed and synchronised by the caller; only when A > 0) and, when xs is not null,
// the raw rows into xs[MT][K] (zeros for rows >= mrows).
template <int MT>
__device__ void x_pass(const Params& p, const Work& wk, uint32_t* gmax, float* xs) {
  constexpr int kBatch = 4;
  const int k4 = p.K >> 2, nt = static_cast<int>(blockDim.x);
#pragma unroll 1
  for (int m = 0; m < MT; ++m) {
    const float4* src = reinterpret_cast<const float4*>(p.x + x_row(p, wk.m0 + m) * p.ldx);
    for (int base = static_cast<int>(threadIdx.x); base < k4; base += kBatch * nt) {
      float4 v[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int i = base + b * nt;
        v[b] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (i < k4 && m < wk.mrows) v[b] = __ldcg(src + i);
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int i = base + b * nt;
        if (i >= k4) break;
        if (xs != nullptr) reinterpret_cast<float4*>(xs + m * p.K)[i] = v[b];
        if (p.A > 0 && m < wk.mrows) fp8_group_max4(gmax + m * p.ng, 4 * i, v[b], p.A);
      }
    }
  }
}

// Pass 2 (after a barrier): each group's amax becomes its scale s = ue8m0_scale(max(amax, 1e-4), 448)
// (in place, as float bits) and ginv its reciprocal 1 / s, a power of two and exact (s is in
// [2^-22, 2^128]; 1 / inf = 0).
template <int MT>
__device__ void x_scales(const Params& p, uint32_t* gmax, float* ginv) {
  for (int i = static_cast<int>(threadIdx.x); i < MT * p.ng; i += static_cast<int>(blockDim.x)) {
    const float s = fp8_group_scale(__uint_as_float(gmax[i]));
    gmax[i] = __float_as_uint(s);
    ginv[i] = __fdiv_rn(1.0f, s);
  }
}

// ---- E4M3: K split across the block, tile sums folded in shared memory ----------------------------------
// Thread mapping. Warp w owns tiles [16w, 16w + 16) of every row; lanes 2p and 2p+1 (h = 0, 1) own
// tile t = 16w + p and load, for each of its G = B/32 chunks, the bytes [16h, 16h + 16) (so a warp's
// load instruction reads 32 lanes x 16 contiguous bytes = whole 32-byte sectors). Two shuffles per
// chunk swap words so that lane h holds the codes of elements 8j + 4h + i (j = 0..3, i = 0..3), i.e.
// every chain v[j][l] with l = 4h + i: the lane runs those 16 chains over the tile's chunks in order and
// forms s[l] = ((v0 + v1) + v2) + v3 itself. The s[l] of a step (R weight rows x MT x rows) go to shared memory
// as [row][x row][tile][8] (+8 floats of padding per (row, x row), so that the 4 fold groups of a warp
// hit different banks), the tile factors as fac[tile]; after a barrier, thread (row, x row, l) folds
// tot = fma(s, fac, tot) over the tiles in order and 8-lane shuffles give the CPU's hsum.
// The x window of a lane (G chunks x 16 columns x MT rows) is quantised once and kept in registers.
// Registers: the current and the next step's weights (2 x R x G uint4, R x G <= 4), x (16 G MT floats,
// G MT <= 4), the chains (16 MT floats per chunk).
template <int G>
struct Fp8Shape {
  static constexpr int kB = 32 * G;                  // tile size
  static constexpr int kRowsMax = 4 / G;             // weight rows per step
  static constexpr int kMtMax = G == 4 ? 1 : 2;      // x rows per block
  static constexpr int kWarpsMax = G == 1 ? 16 : 8;  // 16 tiles per warp: K <= 8192 (B 32, 64), 16384 (B 128)
  static constexpr int kThreadsMax = 32 * kWarpsMax;
};
// Register cap: the launch bound's, except that the common case (B 32, one x row) is held to 96, so that
// two blocks of 10 warps (K = 5120) fit an SM's 64K registers (the next step's loads of both in flight).
constexpr int fp8_max_regs(int MT, int G) {
  return MT == 1 && G == 1 ? 96
                           : std::min(255, 65536 / (G == 1   ? Fp8Shape<1>::kThreadsMax
                                                    : G == 2 ? Fp8Shape<2>::kThreadsMax
                                                             : Fp8Shape<4>::kThreadsMax));
}

// Shared memory of fp8_gemv, in floats (the host sizes the launch with the same function).
__host__ __device__ inline int fp8_srow(int T) { return 8 * T + 8; }
__host__ __device__ inline int64_t fp8_smem_floats(int R, int MT, int T, int ng) {
  return static_cast<int64_t>(R) * MT * fp8_srow(T) + ((T + 3) & ~3) + 2 * ((MT * ng + 3) & ~3) + R;
}

template <int MT, int G>
__global__ void __launch_bounds__(Fp8Shape<G>::kThreadsMax) __maxnreg__(fp8_max_regs(MT, G)) fp8_gemv(Params p) {
  using S = Fp8Shape<G>;
  constexpr int B = S::kB, RM = S::kRowsMax;
  static_assert(MT <= S::kMtMax, "x registers: 16 G MT floats");
  extern __shared__ __align__(16) float smem_f[];
  pdl_launch_dependents();
  const int K = p.K, N = p.N, R = p.rows;
  const int T = (K + B - 1) / B, srow = fp8_srow(T);
  float* sbuf = smem_f;                                                   // [R][MT][srow]
  float* fac = sbuf + R * MT * srow;                                      // [T]
  uint32_t* gmax = reinterpret_cast<uint32_t*>(fac + ((T + 3) & ~3));     // [MT][ng]: amax, then scale
  float* ginv = reinterpret_cast<float*>(gmax + ((MT * p.ng + 3) & ~3));  // [MT][ng]: 1 / scale
  int* nanflag = reinterpret_cast<int*>(ginv + ((MT * p.ng + 3) & ~3));   // [R]: 1 + iteration with a NaN code
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int h = lane & 1;
  const int t = warp * 16 + (lane >> 1);  // this lane pair's tile
  const bool active = t < T;
  const int nch = active ? min(G, (K - t * B) / 32) : 0;  // the last tile may be short
  const Work wk = block_work<MT>(p);
  const uint8_t* W = p.w;
  const uint8_t* SC = p.sc;

  // Rows [step R, step R + R) (clamped to N - 1) of this lane's tile half, and the tile's scale code.
  // cur: the step being computed; nxt: the following one, in flight meanwhile. The first two steps are
  // both issued before the x prologue.
  uint4 cur[RM][G], nxt[RM][G];
  uint32_t cur_e = 0, nxt_e = 0;
  auto load_step = [&](uint4(&dst)[RM][G], uint32_t& dst_e, int step) {
    const int n0 = step * R;
#pragma unroll
    for (int r = 0; r < RM; ++r) {
      const uint8_t* row = W + static_cast<int64_t>(min(n0 + r, N - 1)) * p.ldw + t * B + 16 * h;
#pragma unroll
      for (int c = 0; c < G; ++c)
        dst[r][c] = (r < R && c < nch) ? ldg_stream(row + 32 * c) : make_uint4(0u, 0u, 0u, 0u);
    }
    dst_e = active ? static_cast<uint32_t>(__ldg(SC + static_cast<int64_t>(n0 / B) * p.lds + t)) : 0u;
  };
  auto prefetch = [&]() {
    load_step(cur, cur_e, wk.first);
    if (wk.first + wk.stride < p.steps) load_step(nxt, nxt_e, wk.first + wk.stride);
  };

  const bool grouped = p.row_expert != nullptr;
  if (!grouped) prefetch();
  for (int i = static_cast<int>(threadIdx.x); i < MT * p.ng; i += static_cast<int>(blockDim.x)) gmax[i] = 0u;
  for (int i = static_cast<int>(threadIdx.x); i < R; i += static_cast<int>(blockDim.x)) nanflag[i] = 0;
  pdl_wait();
  if (grouped) {
    expert_of(p, wk.mt, W, SC);
    prefetch();
  }
  __syncthreads();  // gmax zeroed
  // Act-quant groups of 32 on tiles of 32: a lane pair's window of a row is one whole group, so the pair takes its
  // amax by a shuffle and quantises in registers (the same values: the group max is order-independent), with no
  // pass over x, no atomics and no block barriers; other groups take the two passes through shared memory.
  const bool pair_groups = G == 1 && p.A == 32;
  if (p.A > 0 && !pair_groups) {
    x_pass<MT>(p, wk, gmax, nullptr);
    __syncthreads();  // group amax complete
    x_scales<MT>(p, gmax, ginv);
    __syncthreads();  // group scales complete
  }

  // x window: xr[c][j][m] = x[m0 + m][t B + 32 c + 8 j + 4 h .. + 3], quantised.
  float4 xr[G][4][MT];
  if (pair_groups) {
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      float4 v[4];
      float a = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        v[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (nch > 0 && m < wk.mrows)
          v[j] = __ldcg(reinterpret_cast<const float4*>(p.x + x_row(p, wk.m0 + m) * p.ldx + t * B + 8 * j + 4 * h));
        a = amax4(a, v[j]);
      }
      a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 1));
      const float gs = fp8_group_scale(a), gi = __fdiv_rn(1.0f, gs);
#pragma unroll
      for (int j = 0; j < 4; ++j) xr[0][j][m] = fp8_fake_quant4_inv(v[j], gs, gi);
    }
  } else {
#pragma unroll
    for (int c = 0; c < G; ++c)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
          const int k = t * B + 32 * c + 8 * j + 4 * h;
          if (c < nch && m < wk.mrows) {
            v = __ldcg(reinterpret_cast<const float4*>(p.x + x_row(p, wk.m0 + m) * p.ldx + k));
            if (p.A > 0)
              v = fp8_fake_quant4_groups(v, k, p.A, reinterpret_cast<const float*>(gmax) + m * p.ng, ginv + m * p.ng);
          }
          xr[c][j][m] = v;
        }
  }

  int it = 0;
  for (int step = wk.first; step < p.steps; step += wk.stride, ++it) {
    if (it > 0) {  // nxt holds this step; issue the next one, in flight while this step is computed
#pragma unroll
      for (int r = 0; r < RM; ++r)
#pragma unroll
        for (int c = 0; c < G; ++c) cur[r][c] = nxt[r][c];
      cur_e = nxt_e;
      if (step + wk.stride < p.steps) load_step(nxt, nxt_e, step + wk.stride);
    }
    if (h == 0 && active) fac[t] = fp8_tile_factor(cur_e);

#pragma unroll
    for (int r = 0; r < RM; ++r) {
      if (r >= R) break;  // R is uniform over the block
      uint32_t nan = 0;
      float v[MT][4][4];
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int i = 0; i < 4; ++i) v[m][j][i] = 0.0f;
#pragma unroll
      for (int c = 0; c < G; ++c) {
        const uint4 q = cur[r][c];
        nan |= nan_bits(q.x) | nan_bits(q.y) | nan_bits(q.z) | nan_bits(q.w);
        // Chunk bytes b0..b31 = element index. Lane 0 loaded b0..15 (q.x = b0..3, q.y = b4..7, q.z = b8..11,
        // q.w = b12..15), lane 1 b16..31. Lane 0 wants j = 0..3 at l = 0..3: b0..3, b8..11, b16..19, b24..27;
        // lane 1 at l = 4..7: b4..7, b12..15, b20..23, b28..31. Lane 0 sends b4..7, b12..15 (q.y, q.w);
        // lane 1 sends b16..19, b24..27 (its q.x, q.z). All lanes take part (inactive ones carry zeros).
        const uint32_t r0 = __shfl_xor_sync(0xffffffffu, h ? q.x : q.y, 1);
        const uint32_t r1 = __shfl_xor_sync(0xffffffffu, h ? q.z : q.w, 1);
        const uint32_t wj[4] = {h ? r0 : q.x, h ? r1 : q.z, h ? q.y : r0, h ? q.w : r1};
        if (c < nch) {
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            float f[4];
            e4m3x4(wj[j], f);  // elements 32c + 8j + 4h + i, i = 0..3
#pragma unroll
            for (int m = 0; m < MT; ++m) {
              const float4 xv = xr[c][j][m];
              v[m][j][0] = __fmaf_rn(f[0], xv.x, v[m][j][0]);
              v[m][j][1] = __fmaf_rn(f[1], xv.y, v[m][j][1]);
              v[m][j][2] = __fmaf_rn(f[2], xv.z, v[m][j][2]);
              v[m][j][3] = __fmaf_rn(f[3], xv.w, v[m][j][3]);
            }
          }
        }
      }
      if (active) {
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          float s[4];
#pragma unroll
          for (int i = 0; i < 4; ++i)
            s[i] = __fadd_rn(__fadd_rn(__fadd_rn(v[m][0][i], v[m][1][i]), v[m][2][i]), v[m][3][i]);
          *reinterpret_cast<float4*>(sbuf + (r * MT + m) * srow + t * 8 + 4 * h) = make_float4(s[0], s[1], s[2], s[3]);
        }
      }
      const bool any_nan = __any_sync(0xffffffffu, (nan & 0x80808080u) != 0u);
      if (any_nan && lane == 0) atomicMax(nanflag + r, it + 1);
    }
    __syncthreads();  // the step's s, fac and NaN flags are complete

    // Fold: thread (r, m, l) = f; the 8 l of a (r, m) are 8 consecutive lanes (the loop is warp-uniform).
    const int nf = R * MT * 8;
    for (int base = warp * 32; base < nf; base += static_cast<int>(blockDim.x)) {
      const int f = base + lane, l = f & 7, g = f >> 3, m = g % MT, r = g / MT;
      const bool ok = f < nf;
      float tot = 0.0f;
      if (ok) {
        const float* sp = sbuf + g * srow + l;
#pragma unroll 8
        for (int tt = 0; tt < T; ++tt) tot = __fmaf_rn(sp[8 * tt], fac[tt], tot);
      }
      // hsum in the CPU's order: ((t0 + t4) + (t2 + t6)) + ((t1 + t5) + (t3 + t7)), + the empty tail.
      float hs = __fadd_rn(tot, __shfl_down_sync(0xffffffffu, tot, 4, 8));
      hs = __fadd_rn(hs, __shfl_down_sync(0xffffffffu, hs, 2, 8));
      hs = __fadd_rn(hs, __shfl_down_sync(0xffffffffu, hs, 1, 8));
      const int n = step * R + r;
      if (ok && l == 0 && n < N && m < wk.mrows) {
        const float o = nanflag[r] == it + 1 ? __uint_as_float(0x7fc00000u) : __fadd_rn(hs, 0.0f);
        p.y[static_cast<int64_t>(wk.m0 + m) * N + n] = p.round ? round_to_bf16(o) : o;
      }
    }
    __syncthreads();  // sbuf, fac and the flags are free for the next step
  }
}

// ---- BF16 / FP4: the chains run over all of K -----------------------------------------------------------
// Thread mapping. Lane = 4 q + t: quad q is a row (warp w owns rows 8w + q of each step of 8 x warps
// rows), t its quarter. The lane walks the row in 64-byte steps, loading the 16 bytes [64 s + 16 t, + 16):
//  * BF16: step s = chunk s; the lane's bytes are elements 32 s + 8 t + l (l = 0..7) = chains (t, l).
//  * FP4: step s = chunks 4s .. 4s+3 (16 bytes each); the lane loaded chunk 4s + t whole. A per-warp
//    shared-memory transpose (one 16-byte store, __syncwarp, four 4-byte loads; rows 80 bytes apart, so
//    conflict free) gives it bytes 4t .. 4t+3 of each of the four chunks instead: byte 4t + i holds
//    element 8t + 2i (low nibble, chain (t/2, 4(t%2) + i)) and 8t + 2i + 1 (high nibble, chain
//    (2 + t/2, 4(t%2) + i)), x columns 32c + 8t .. 8t+7. Double-buffered by step parity, so one
//    __syncwarp per step orders both the store -> load and the load -> next store of a buffer.
// Every chain is updated chunk after chunk in K order. kSteps loads per lane are in flight: a ring of
// registers refilled as it is consumed, running on across the rows of the block (no drain per row).
// x (quantised) sits in shared memory [MT][K]; the 8 quads of a warp read the same columns (broadcast).
constexpr int kSteps = 8;

template <int FMT>
__device__ __forceinline__ int chain_steps(int nch) {
  return FMT == kBf16 ? nch : (nch + 3) / 4;
}

// FP4 scale codes of chunks 4s .. 4s+3 of one row (byte u = chunk 4s + u; 0 beyond the row).
__device__ __forceinline__ uint32_t fp4_scale_word(const uint8_t* srow, int s, int nch, bool aligned) {
  const int c0 = 4 * s;
  if (aligned && c0 + 4 <= nch) return __ldg(reinterpret_cast<const unsigned int*>(srow + c0));
  uint32_t e = 0;
#pragma unroll
  for (int u = 0; u < 4; ++u)
    if (c0 + u < nch) e |= static_cast<uint32_t>(__ldg(srow + c0 + u)) << (8 * u);
  return e;
}

// True iff no byte of e exceeds 128 (then every chunk takes fp4_weight's single-multiply branch).
__device__ __forceinline__ bool fp4_scales_small(uint32_t e) {
  // A byte b > 128 has bit 7 set and a nonzero low part: (b & 0x7f) + 0x7f sets bit 7 (no carry out).
  return (e & ((e & 0x7f7f7f7fu) + 0x7f7f7f7fu) & 0x80808080u) == 0u;
}

// One FP4 chunk word of a lane: W = bytes 4t .. 4t+3 of chunk c with scale code e; xp = x[32c + 8t] of x
// row 0. acc[m][i] / acc[m][4 + i] are the chains of the low / high nibble of byte 4t + i, whose x
// columns are 8t + 2i and 8t + 2i + 1.
template <int MT, bool kSmall>
__device__ __forceinline__ void fp4_word(uint32_t W, uint32_t e, const float* xp, int K, float (&acc)[MT][8]) {
  float f0[4], f1[4];
  const float g = __uint_as_float((e + 126u) << 23);  // 2^(e-1), used only when e <= 128
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float l0 = e2m1_top(W << (28 - 8 * i)), h0 = e2m1_top(W << (24 - 8 * i));  // e2m1 * 2^-126
    if (kSmall) {                                                                    // fp4_weight's e <= 128 branch
      f0[i] = __fmul_rn(l0, g);
      f1[i] = __fmul_rn(h0, g);
    } else {
      f0[i] = fp4_weight(l0, e);
      f1[i] = fp4_weight(h0, e);
    }
  }
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    const float4 a = *reinterpret_cast<const float4*>(xp + m * K);      // columns 8t + 0..3
    const float4 b = *reinterpret_cast<const float4*>(xp + m * K + 4);  // columns 8t + 4..7
    acc[m][0] = __fmaf_rn(f0[0], a.x, acc[m][0]);
    acc[m][4] = __fmaf_rn(f1[0], a.y, acc[m][4]);
    acc[m][1] = __fmaf_rn(f0[1], a.z, acc[m][1]);
    acc[m][5] = __fmaf_rn(f1[1], a.w, acc[m][5]);
    acc[m][2] = __fmaf_rn(f0[2], b.x, acc[m][2]);
    acc[m][6] = __fmaf_rn(f1[2], b.y, acc[m][6]);
    acc[m][3] = __fmaf_rn(f0[3], b.z, acc[m][3]);
    acc[m][7] = __fmaf_rn(f1[3], b.w, acc[m][7]);
  }
}

__host__ __device__ inline int64_t chain_smem_bytes(int fmt, int MT, int K, int ng, int warps) {
  return 4 * (static_cast<int64_t>(MT) * K + 2 * ((MT * ng + 3) & ~3)) + (fmt == kFp4 ? warps * 2 * 8 * 20 * 4 : 0);
}

template <int FMT, int MT>
__global__ void __launch_bounds__(256) chain_gemv(Params p) {
  extern __shared__ __align__(16) float smem_f[];
  pdl_launch_dependents();
  const int K = p.K, N = p.N, nch = K / 32, nsteps = chain_steps<FMT>(nch);
  float* xs = smem_f;                                                           // [MT][K]
  uint32_t* gmax = reinterpret_cast<uint32_t*>(xs + MT * K);                    // [MT][ng]: amax, then scale
  float* ginv = reinterpret_cast<float*>(gmax + ((MT * p.ng + 3) & ~3));        // [MT][ng]: 1 / scale
  uint32_t* tbuf = reinterpret_cast<uint32_t*>(ginv + ((MT * p.ng + 3) & ~3));  // FP4: [warps][2][8][20]
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int q = lane >> 2, t = lane & 3;
  const int row_in_step = warp * 8 + q;
  const Work wk = block_work<MT>(p);
  const uint8_t* W = p.w;
  const uint8_t* SC = p.sc;

  // Producer: the next (weight step, 64-byte step) this lane loads.
  int ld_step = wk.first, ld_s = 0;
  const uint8_t* ld_row = nullptr;
  const uint8_t* ld_srow = nullptr;
  bool sc_aligned = false;
  auto ld_rows = [&]() {
    const int64_t n = min(ld_step * p.rows + row_in_step, N - 1);
    ld_row = W + n * p.ldw + 16 * t;
    if (FMT == kFp4) ld_srow = SC + n * p.lds;
  };
  auto load_next = [&](uint4& wq, uint32_t& eq) {
    wq = make_uint4(0u, 0u, 0u, 0u);
    eq = 0u;
    if (ld_step < p.steps) {
      if (FMT == kBf16 || 4 * ld_s + t < nch) wq = ldg_stream(ld_row + 64 * ld_s);
      if (FMT == kFp4) eq = fp4_scale_word(ld_srow, ld_s, nch, sc_aligned);
      if (++ld_s == nsteps) {
        ld_s = 0;
        ld_step += wk.stride;
        if (ld_step < p.steps) ld_rows();
      }
    }
  };
  uint4 wbuf[kSteps];
  uint32_t ebuf[kSteps];
  auto prime = [&]() {
    sc_aligned = FMT == kFp4 && (reinterpret_cast<uintptr_t>(SC) % 4 == 0) && (p.lds % 4 == 0);
    if (ld_step < p.steps) ld_rows();
#pragma unroll
    for (int u = 0; u < kSteps; ++u) load_next(wbuf[u], ebuf[u]);
  };

  const bool grouped = p.row_expert != nullptr;
  if (!grouped) prime();
  for (int i = static_cast<int>(threadIdx.x); i < MT * p.ng; i += static_cast<int>(blockDim.x)) gmax[i] = 0u;
  pdl_wait();
  if (grouped) {
    expert_of(p, wk.mt, W, SC);
    prime();
  }
  __syncthreads();  // gmax zeroed
  x_pass<MT>(p, wk, gmax, xs);
  __syncthreads();  // raw x and group amax complete
  if (p.A > 0) {
    x_scales<MT>(p, gmax, ginv);
    __syncthreads();  // group scales complete
                      // Quantise xs in place, a float4 per step (one group per float4 when A % 4 == 0).
#pragma unroll 1
    for (int m = 0; m < wk.mrows; ++m) {
      const float* gs = reinterpret_cast<const float*>(gmax) + m * p.ng;
      const float* gi = ginv + m * p.ng;
      for (int i = static_cast<int>(threadIdx.x); i < K / 4; i += static_cast<int>(blockDim.x)) {
        float4* v = reinterpret_cast<float4*>(xs + m * K) + i;
        *v = fp8_fake_quant4_groups(*v, 4 * i, p.A, gs, gi);
      }
    }
    __syncthreads();  // quantised x complete
  }

  // Consumer: the same sequence of (weight step, 64-byte step), kSteps behind the producer.
  float acc[MT][8];  // BF16: chains (t, l); FP4: [0..3] low nibbles, [4..7] high nibbles of bytes 4t + i
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int l = 0; l < 8; ++l) acc[m][l] = 0.0f;
  int step = wk.first, s = 0;

  // End of a row: s[l] = ((v0 + v1) + v2) + v3, tot[l] = fma(s, 1, 0), the CPU's hsum; lane t == 0 stores.
  auto finish_row = [&]() {
    const int n = step * p.rows + row_in_step;
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      float out;
      if constexpr (FMT == kBf16) {
        float tot[8];
#pragma unroll
        for (int l = 0; l < 8; ++l) {  // lanes t + 1, t + 2, t + 3 hold chains (1, l), (2, l), (3, l) for t = 0
          const float v = acc[m][l];
          const float sl = __fadd_rn(
              __fadd_rn(__fadd_rn(v, __shfl_down_sync(0xffffffffu, v, 1, 4)), __shfl_down_sync(0xffffffffu, v, 2, 4)),
              __shfl_down_sync(0xffffffffu, v, 3, 4));
          tot[l] = __fmaf_rn(sl, 1.0f, 0.0f);
        }
        out = __fadd_rn(__fadd_rn(__fadd_rn(tot[0], tot[4]), __fadd_rn(tot[2], tot[6])),
                        __fadd_rn(__fadd_rn(tot[1], tot[5]), __fadd_rn(tot[3], tot[7])));
      } else {
        // Lane t in {0, 1} forms l = 4t + i: chains (0, l), (2, l) are its own low / high nibbles,
        // (1, l), (3, l) those of lane t + 2. Then lane 0 holds tot[0..3] and lane 1 tot[4..7].
        float u[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float a = acc[m][i], b = acc[m][4 + i];
          const float sl = __fadd_rn(__fadd_rn(__fadd_rn(a, __shfl_down_sync(0xffffffffu, a, 2, 4)), b),
                                     __shfl_down_sync(0xffffffffu, b, 2, 4));
          const float tot = __fmaf_rn(sl, 1.0f, 0.0f);
          u[i] = __fadd_rn(tot, __shfl_down_sync(0xffffffffu, tot, 1, 4));  // lane 0: tot[i] + tot[4 + i]
        }
        out = __fadd_rn(__fadd_rn(u[0], u[2]), __fadd_rn(u[1], u[3]));
      }
      out = __fadd_rn(out, 0.0f);
      if (t == 0 && n < N && m < wk.mrows)
        p.y[static_cast<int64_t>(wk.m0 + m) * N + n] = p.round ? round_to_bf16(out) : out;
    }
  };

  for (;;) {
#pragma unroll
    for (int u = 0; u < kSteps; ++u) {
      if (step >= p.steps) return;  // uniform over the block
      const uint4 wq = wbuf[u];
      const uint32_t eq = ebuf[u];
      load_next(wbuf[u], ebuf[u]);
      if constexpr (FMT == kBf16) {
        const float* xp = xs + 32 * s + 8 * t;
        const uint32_t wv[4] = {wq.x, wq.y, wq.z, wq.w};
        float f[8];
#pragma unroll
        for (int i = 0; i < 4; ++i) {  // bf16 element 2i in the low half of word i
          f[2 * i] = __uint_as_float(wv[i] << 16);
          f[2 * i + 1] = __uint_as_float(wv[i] & 0xffff0000u);
        }
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          const float4 a = *reinterpret_cast<const float4*>(xp + m * K);
          const float4 b = *reinterpret_cast<const float4*>(xp + m * K + 4);
          const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
          for (int l = 0; l < 8; ++l) acc[m][l] = __fmaf_rn(f[l], xv[l], acc[m][l]);
        }
      } else {
        uint32_t* tb = tbuf + ((warp * 2 + (u & 1)) * 8 + q) * 20;
        *reinterpret_cast<uint4*>(tb + 4 * t) = wq;  // chunk 4s + t
        __syncwarp();
        uint32_t wd[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) wd[c] = tb[4 * c + t];  // bytes 4t .. 4t+3 of chunk 4s + c
        // Chunks 4s + c in K order (the row's last step may be short: uniform over the block).
        auto chunks = [&](auto small) {
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            if (4 * s + c >= nch) break;
            fp4_word<MT, decltype(small)::value>(wd[c], (eq >> (8 * c)) & 0xffu, xs + 32 * (4 * s + c) + 8 * t, K, acc);
          }
        };
        if (fp4_scales_small(eq))
          chunks(std::true_type{});
        else
          chunks(std::false_type{});
      }
      if (++s == nsteps) {
        finish_row();
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
          for (int l = 0; l < 8; ++l) acc[m][l] = 0.0f;
        s = 0;
        step += wk.stride;
      }
    }
  }
}

// ---- FP4, pair kernel (the default FP4 variant; chain_gemv above is the previous one) ------------------------
// Thread mapping. Lane = 2 r + h: pair r is a weight row (warp w owns rows 16 w + r of each step of 16 x warps
// rows), h its half. Lane h loads chunks 2t + h (t = 0, 1, ...: 16 bytes each, so that a warp's load reads 16
// rows x 32 contiguous bytes, whole sectors) and two shuffles per 32 bytes swap halves: lane h then holds bytes
// 8h .. 8h+7 of every chunk. Byte q = 8h + l (l = 0..7) of a chunk feeds chain (h, l) (low nibble, x column
// 2q) and chain (2 + h, l) (high nibble, column 2q + 1): the lane owns these 16 chains for the whole row, and
// nothing else crosses lanes before the row's end (no shared-memory transpose, no __syncwarp). x columns
// 32c + 16h .. +15 of chunk c are 4 float4 broadcasts from shared memory per x row.
// Weight values (each equal to fp4_weight(e2m1_top(nibble), e) bit for bit):
//  * fast path: e in [104, 127] for the 4 chunks of a ring slot (every checkpoint scale): a 32-bit word (8
//    nibbles) becomes four fp16x2 words with 11 integer ops (fp4_half_patterns): nibble S E E M becomes the
//    fp16 S.000EE.M000000000 = e2m1 * 2^-14 exactly (subnormal for 0.5); one mul.f16x2 by 2^(e-113) (a normal
//    fp16) per two nibbles gives e2m1 * 2^(e-127), a multiple of 2^(e-128) >= 2^-24 with at most 2 significant
//    bits and below 2^16, so exact in fp16 (subnormals are kept: no .ftz); cvt.f32.f16 is exact. Per 8 nibbles
//    and x row: 31 instructions (11 integer, 4 mul.f16x2, 8 cvt, 8 FFMA) instead of 39 with e2m1_top + FMUL.
//  * otherwise, per chunk: the same for e in [104, 128], chain_gemv's exact fp32 decode for any other code (255
//    = NaN included).
// Every chain is updated chunk after chunk in K order with v = fma(w, x, v), as the CPU. The loads run through
// a register ring of kSlots slots (per lane: 2 x 16 bytes and the slot's 4 scale codes), refilled as it is
// consumed and running on across the rows of the warp (no drain per row); warps do not synchronise after the x
// prologue. Row end: lane h forms s[l] for l = 4h .. 4h+3 (one shuffle pair per l), tot[l] = fma(s, 1, 0), and
// one more shuffle per l gives lane 0 the CPU's hsum.
// kEven (the model's shapes): K % 128 == 0 and 4-byte aligned scale rows, so that a slot's chunks all exist and
// its 4 codes are one aligned word; the pointers then simply advance. Otherwise chunk and code loads are checked.

// A lane's half chunk into its chains: acc[m][l] += w[l] x[2l], acc[m][8 + l] += w[8 + l] x[2l + 1], with
// x = xp + m K (columns 16h .. 16h+15 of the chunk).
template <int MT>
__device__ __forceinline__ void fp4_pair_fma(const float (&w)[16], const float* xp, int K, float (&acc)[MT][16]) {
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    float xv[16];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float4 v = *reinterpret_cast<const float4*>(xp + m * K + 4 * j);
      xv[4 * j] = v.x, xv[4 * j + 1] = v.y, xv[4 * j + 2] = v.z, xv[4 * j + 3] = v.w;
    }
#pragma unroll
    for (int l = 0; l < 8; ++l) {
      acc[m][l] = __fmaf_rn(w[l], xv[2 * l], acc[m][l]);
      acc[m][8 + l] = __fmaf_rn(w[8 + l], xv[2 * l + 1], acc[m][8 + l]);
    }
  }
}

// True iff every byte of the 4 codes e4 is in [104, 127]: per byte, (b & 0x7f) + 24 stays in its byte and has
// bit 7 set iff b & 0x7f >= 104; bit 7 of b itself must be clear.
__device__ __forceinline__ bool fp4_fast4(uint32_t e4) {
  return (((e4 & 0x7f7f7f7fu) + 0x18181818u) & ~e4 & 0x80808080u) == 0x80808080u;
}

__host__ __device__ inline int64_t pair_smem_bytes(int MT, int K, int ng) {
  return 4 * (static_cast<int64_t>(MT) * K + 2 * ((MT * ng + 3) & ~3));
}

// Ring slots (2 steps = 4 chunks each, 128 bytes per lane in flight with 4) and register caps: 4 (MT <= 2) or
// 3 blocks of 128 threads per SM.
__host__ __device__ constexpr int pair_slots(int MT) { return MT <= 2 ? 4 : 2; }
constexpr int pair_max_regs(int MT) { return MT <= 2 ? 128 : 168; }

template <int MT, bool kEven>
__global__ void __launch_bounds__(128) __maxnreg__(pair_max_regs(MT)) fp4_pair_gemv(Params p) {
  constexpr int kSlots = pair_slots(MT);
  extern __shared__ __align__(16) float smem_f[];
  pdl_launch_dependents();
  const int K = p.K, N = p.N, nch = K / 32, nsu = (nch + 3) / 4;          // slots (4 chunks) per row
  float* xs = smem_f;                                                     // [MT][K]
  uint32_t* gmax = reinterpret_cast<uint32_t*>(xs + MT * K);              // [MT][ng]: amax, then scale
  float* ginv = reinterpret_cast<float*>(gmax + ((MT * p.ng + 3) & ~3));  // [MT][ng]: 1 / scale
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int h = lane & 1;
  const int row_in_step = warp * 16 + (lane >> 1);
  Work wk = block_work<MT>(p);  // grouped tile mode: m0 / mrows set after pdl_wait
  const uint8_t* W = p.w;
  const uint8_t* SC = p.sc;

  // Producer: the next (weight step, slot) this lane loads: chunks 4 su + h and 4 su + 2 + h, codes 4 su .. +3.
  int ld_step = wk.first, ld_su = 0;
  bool ld_live = ld_step < p.steps;
  const uint8_t* ld_row = nullptr;   // kEven: at the slot; else at the row (+ 16 h)
  const uint8_t* ld_srow = nullptr;  // likewise for the codes
  auto ld_rows = [&]() {
    const int64_t n = min(ld_step * p.rows + row_in_step, N - 1);
    ld_row = W + n * p.ldw + 16 * h;
    ld_srow = SC + n * p.lds;
  };
  auto load_next = [&](uint4& w0, uint4& w1, uint32_t& e4) {
    if (!ld_live) return;  // past the warp's last row: the slot is never consumed
    if constexpr (kEven) {
      w0 = ldg_stream(ld_row);
      w1 = ldg_stream(ld_row + 32);
      e4 = __ldg(reinterpret_cast<const unsigned int*>(ld_srow));
      ld_row += 64;
      ld_srow += 4;
    } else {
      const int c = 4 * ld_su;
      w0 = c + h < nch ? ldg_stream(ld_row + 32 * c / 2) : make_uint4(0u, 0u, 0u, 0u);
      w1 = c + 2 + h < nch ? ldg_stream(ld_row + 32 * c / 2 + 32) : make_uint4(0u, 0u, 0u, 0u);
      e4 = 0u;
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (c + j < nch) e4 |= static_cast<uint32_t>(__ldg(ld_srow + c + j)) << (8 * j);
    }
    if (++ld_su == nsu) {
      ld_su = 0;
      ld_step += wk.stride;
      ld_live = ld_step < p.steps;
      if (ld_live) ld_rows();
    }
  };
  uint4 wb0[kSlots], wb1[kSlots];
  uint32_t eb[kSlots];
  auto prime = [&]() {
    if (ld_live) ld_rows();
#pragma unroll
    for (int u = 0; u < kSlots; ++u) load_next(wb0[u], wb1[u], eb[u]);
  };

  const bool grouped = p.row_expert != nullptr;
  if (!grouped) prime();
  for (int i = static_cast<int>(threadIdx.x); i < MT * p.ng; i += static_cast<int>(blockDim.x)) gmax[i] = 0u;
  pdl_wait();
  if (grouped && p.tile > 1) {
    // Tile mode (rows sorted by expert within each list): block mt serves row mt and the rows after it that share
    // its expert, up to the next multiple of `tile`, when row mt starts such a tile (its list's first row, a
    // multiple of `tile`, or an expert change); otherwise a tile that starts earlier holds the row, and the
    // block has nothing to do. Every thread reads the same ids, so the exit is uniform.
    const int xr = p.x_rows > 0 ? p.x_rows : p.M, m = wk.mt, r = m % xr;
    const int e = __ldcg(p.row_expert + r);
    if (r % p.tile != 0 && __ldcg(p.row_expert + r - 1) == e) return;
    int cnt = 1;
    while (cnt < p.tile && (r + cnt) % p.tile != 0 && r + cnt < xr && __ldcg(p.row_expert + r + cnt) == e) ++cnt;
    wk.m0 = m;
    wk.mrows = cnt;
  }
  // x rows [m0, m0 + mrows) into xs (zeros beyond): 16-byte cp.async, all in flight at once (grouped: while
  // the expert's pointers are read).
  const int k4 = K / 4;
  for (int i = static_cast<int>(threadIdx.x); i < MT * k4; i += static_cast<int>(blockDim.x)) {
    const int m = i / k4, c = i - m * k4;
    float4* dst = reinterpret_cast<float4*>(xs) + i;
    if (m < wk.mrows)
      cp_async16(dst, p.x + x_row(p, wk.m0 + m) * p.ldx + 4 * c);
    else
      *dst = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  if (grouped) {
    expert_of(p, wk.mt, W, SC);
    prime();
  }
  cp_async_wait_all();
  __syncthreads();  // raw x complete, gmax zeroed
  if (p.A > 0) {    // the quantisation of chain_gemv (x_scales, fp8_fake_quant_inv), in place
    for (int i = static_cast<int>(threadIdx.x); i < wk.mrows * k4; i += static_cast<int>(blockDim.x)) {
      const int m = i / k4, c = i - m * k4;
      fp8_group_max4(gmax + m * p.ng, 4 * c, reinterpret_cast<const float4*>(xs)[i], p.A);
    }
    __syncthreads();  // group amax complete
    x_scales<MT>(p, gmax, ginv);
    __syncthreads();  // group scales complete
    for (int i = static_cast<int>(threadIdx.x); i < wk.mrows * k4; i += static_cast<int>(blockDim.x)) {
      const int m = i / k4, k = 4 * (i - m * k4);
      const float* gs = reinterpret_cast<const float*>(gmax) + m * p.ng;
      const float* gi = ginv + m * p.ng;
      float4* v = reinterpret_cast<float4*>(xs) + i;
      *v = fp8_fake_quant4_groups(*v, k, p.A, gs, gi);
    }
    __syncthreads();  // quantised x complete
  }

  // Consumer: the same sequence of (weight step, slot), kSlots behind the producer.
  float acc[MT][16];  // [l]: chain (h, l); [8 + l]: chain (2 + h, l)
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int l = 0; l < 16; ++l) acc[m][l] = 0.0f;
  int step = wk.first, su = 0;

  // End of a row: lane h forms l = 4h + i: s = ((v0 + v1) + v2) + v3 from its own chains (h, l), (2 + h, l) and
  // the partner's; tot = fma(s, 1, 0); lane 0 then adds tot[i] + tot[4 + i] and forms the CPU's hsum.
  auto finish_row = [&]() {
    const int n = step * p.rows + row_in_step;
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      float u[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float own_lo = h ? acc[m][4 + i] : acc[m][i], own_hi = h ? acc[m][12 + i] : acc[m][8 + i];
        const float snd_lo = h ? acc[m][i] : acc[m][4 + i], snd_hi = h ? acc[m][8 + i] : acc[m][12 + i];
        const float rcv_lo = __shfl_xor_sync(0xffffffffu, snd_lo, 1);
        const float rcv_hi = __shfl_xor_sync(0xffffffffu, snd_hi, 1);
        // Chains (0, l) and (1, l) are own_lo and rcv_lo in some order (a + b == b + a), then (2, l), (3, l).
        const float v2 = h ? rcv_hi : own_hi, v3 = h ? own_hi : rcv_hi;
        const float sl = __fadd_rn(__fadd_rn(__fadd_rn(own_lo, rcv_lo), v2), v3);
        const float tot = __fmaf_rn(sl, 1.0f, 0.0f);
        u[i] = __fadd_rn(tot, __shfl_xor_sync(0xffffffffu, tot, 1));  // lane 0: tot[i] + tot[4 + i]
      }
      const float out = __fadd_rn(__fadd_rn(__fadd_rn(u[0], u[2]), __fadd_rn(u[1], u[3])), 0.0f);
      if (h == 0 && n < N && m < wk.mrows)
        p.y[static_cast<int64_t>(wk.m0 + m) * N + n] = p.round ? round_to_bf16(out) : out;
    }
  };

  for (;;) {
#pragma unroll
    for (int u = 0; u < kSlots; ++u) {
      if (step >= p.steps) return;  // uniform over the warp
      const uint4 q0 = wb0[u], q1 = wb1[u];
      const uint32_t e4 = eb[u];
      // Lane 0 loaded chunks 4 su and 4 su + 2, lane 1 chunks 4 su + 1 and 4 su + 3; each sends the halves the
      // other owns. c[j][0..1] = bytes 8h .. 8h+7 of chunk 4 su + j. (Before the slot is refilled, so that the
      // new loads need no copy of the old registers.)
      uint32_t c[4][2];
      {
        const uint32_t r0 = __shfl_xor_sync(0xffffffffu, h ? q0.x : q0.z, 1);
        const uint32_t r1 = __shfl_xor_sync(0xffffffffu, h ? q0.y : q0.w, 1);
        const uint32_t r2 = __shfl_xor_sync(0xffffffffu, h ? q1.x : q1.z, 1);
        const uint32_t r3 = __shfl_xor_sync(0xffffffffu, h ? q1.y : q1.w, 1);
        c[0][0] = h ? r0 : q0.x, c[0][1] = h ? r1 : q0.y;
        c[1][0] = h ? q0.z : r0, c[1][1] = h ? q0.w : r1;
        c[2][0] = h ? r2 : q1.x, c[2][1] = h ? r3 : q1.y;
        c[3][0] = h ? q1.z : r2, c[3][1] = h ? q1.w : r3;
      }
      load_next(wb0[u], wb1[u], eb[u]);
      const float* xp = xs + 128 * su + 16 * h;
      if (kEven && fp4_fast4(e4)) {
        // 2^(e_j - 113) in both halves of sc[j]: byte j of d = 4 (e_j - 98) < 128 moved to bytes 1 and 3.
        const uint32_t d = (e4 - 0x62626262u) << 2;
        const uint32_t sc[4] = {prmt(d, 0u, 0x0404u), prmt(d, 0u, 0x1414u), prmt(d, 0u, 0x2424u), prmt(d, 0u, 0x3434u)};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          float w[16];
          fp4_fast_weights(c[j][0], c[j][1], sc[j], w);
          fp4_pair_fma<MT>(w, xp + 32 * j, K, acc);
        }
      } else {
#pragma unroll 1
        for (int j = 0; j < 4; ++j) {
          if (!kEven && 4 * su + j >= nch) break;  // uniform
          const uint32_t A = j == 0 ? c[0][0] : j == 1 ? c[1][0] : j == 2 ? c[2][0] : c[3][0];
          const uint32_t B = j == 0 ? c[0][1] : j == 1 ? c[1][1] : j == 2 ? c[2][1] : c[3][1];
          float w[16];
          fp4_any_weights(A, B, (e4 >> (8 * j)) & 0xffu, w);
          fp4_pair_fma<MT>(w, xp + 32 * j, K, acc);
        }
      }
      if (++su == nsu) {
        finish_row();
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
          for (int l = 0; l < 16; ++l) acc[m][l] = 0.0f;
        su = 0;
        step += wk.stride;
      }
    }
  }
}

// ---- host side -----------------------------------------------------------------------------------------------
constexpr int64_t kSmemBudget = 96 << 10;  // per block: keeps 2+ blocks per SM

int fp8_warps_max(int G) {
  return G == 1 ? Fp8Shape<1>::kWarpsMax : G == 2 ? Fp8Shape<2>::kWarpsMax : Fp8Shape<4>::kWarpsMax;
}

void launch_fp8(Params p, int B, cudaStream_t stream) {
  const int G = B / 32, T = (p.K + B - 1) / B, warps = (T + 15) / 16;
  const bool grouped = p.row_expert != nullptr;
  const int MT = grouped ? 1
                         : std::min(p.M, G == 1   ? Fp8Shape<1>::kMtMax
                                         : G == 2 ? Fp8Shape<2>::kMtMax
                                                  : Fp8Shape<4>::kMtMax);
  p.mtiles = (p.M + MT - 1) / MT;
  // Rows per step: 4 / G, fewer when the grid would not cover the GPU twice or the s buffer is large.
  int R = 4 / G;
  while (R > 1 && static_cast<int64_t>((p.N + R - 1) / R) * p.mtiles < 2 * sm_count()) R /= 2;
  while (R > 1 && 4 * fp8_smem_floats(R, MT, T, p.ng) > kSmemBudget) R /= 2;
  p.rows = R;
  p.steps = (p.N + R - 1) / R;
  const int64_t smem = 4 * fp8_smem_floats(R, MT, T, p.ng);
  void (*kernel)(Params) = nullptr;
  if (G == 1)
    kernel = MT == 1 ? fp8_gemv<1, 1> : fp8_gemv<2, 1>;
  else if (G == 2)
    kernel = MT == 1 ? fp8_gemv<1, 2> : fp8_gemv<2, 2>;
  else
    kernel = fp8_gemv<1, 4>;
  launch_persistent(kernel, p, 32 * warps, smem, stream);
}

void launch_chain(Params p, int fmt, cudaStream_t stream) {
  const bool grouped = p.row_expert != nullptr;
  int MT = grouped ? 1 : std::min(p.M, 4);
  while (MT > 1 && chain_smem_bytes(fmt, MT, p.K, p.ng, 8) > kSmemBudget) --MT;
  p.mtiles = (p.M + MT - 1) / MT;
  // 8 warps (64 rows per step) when that still gives two blocks per SM of work, else 4 (32 rows).
  const int warps = static_cast<int64_t>((p.N + 63) / 64) * p.mtiles >= 2 * sm_count() ? 8 : 4;
  p.rows = 8 * warps;
  p.steps = (p.N + p.rows - 1) / p.rows;
  const int64_t smem = chain_smem_bytes(fmt, MT, p.K, p.ng, warps);
  void (*kernel)(Params) = nullptr;
  if (fmt == kFp4)
    kernel = MT == 1   ? chain_gemv<kFp4, 1>
             : MT == 2 ? chain_gemv<kFp4, 2>
             : MT == 3 ? chain_gemv<kFp4, 3>
                       : chain_gemv<kFp4, 4>;
  else
    kernel = MT == 1   ? chain_gemv<kBf16, 1>
             : MT == 2 ? chain_gemv<kBf16, 2>
             : MT == 3 ? chain_gemv<kBf16, 3>
                       : chain_gemv<kBf16, 4>;
  launch_persistent(kernel, p, 32 * warps, smem, stream);
}

// FP4 pair kernel. Warps per block W in {4, 2, 1} (16 W rows per step): the one that puts the fewest rows on the
// busiest SM (blocks spread evenly over the SMs, each doing ceil(steps per x-row group / its blocks) steps), the
// larger W on ties. MT as launch_chain.
void launch_fp4_pair(Params p, int tile_rows, cudaStream_t stream) {
  const bool grouped = p.row_expert != nullptr;
  // Grouped tile mode: up to 4 rows of one expert per block (one block slot per row; see the kernel).
  int MT = grouped ? std::min(std::max(tile_rows, 1), 4) : std::min(p.M, 4);
  while (MT > 1 && pair_smem_bytes(MT, p.K, p.ng) > kSmemBudget) --MT;
  p.tile = grouped ? MT : 0;
  p.mtiles = grouped ? p.M : (p.M + MT - 1) / MT;
  // kEven: K % 128 == 0 and 4-byte aligned scale rows (fp4_pair_gemv).
  const bool even = p.K % 128 == 0 && reinterpret_cast<uintptr_t>(p.sc) % 4 == 0 && p.lds % 4 == 0;
  void (*kernel)(Params) = nullptr;
  if (even)
    kernel = MT == 1   ? fp4_pair_gemv<1, true>
             : MT == 2 ? fp4_pair_gemv<2, true>
             : MT == 3 ? fp4_pair_gemv<3, true>
                       : fp4_pair_gemv<4, true>;
  else
    kernel = MT == 1   ? fp4_pair_gemv<1, false>
             : MT == 2 ? fp4_pair_gemv<2, false>
             : MT == 3 ? fp4_pair_gemv<3, false>
                       : fp4_pair_gemv<4, false>;
  const int64_t smem = pair_smem_bytes(MT, p.K, p.ng);
  const int64_t sms = sm_count();
  int best_w = 4;
  int64_t best_cost = -1;
  for (const int w : {4, 2, 1}) {
    const int64_t steps = (p.N + 16 * w - 1) / (16 * w);
    const int64_t work = steps * p.mtiles;
    const int64_t resident =
        static_cast<int64_t>(gemv_blocks_per_sm(reinterpret_cast<const void*>(kernel), 32 * w, smem)) * sms;
    const int64_t grid = std::max<int64_t>(p.mtiles, std::min(work, resident) / p.mtiles * p.mtiles);
    const int64_t per_block = (steps + grid / p.mtiles - 1) / (grid / p.mtiles);
    const int64_t cost = (grid + sms - 1) / sms * per_block * w;
    if (best_cost < 0 || cost < best_cost) best_cost = cost, best_w = w;
  }
  p.rows = 16 * best_w;
  p.steps = (p.N + p.rows - 1) / p.rows;
  launch_persistent(kernel, p, 32 * best_w, smem, stream);
}

// The FP4 kernel in force: 1 = chain_gemv, 2 = fp4_pair_gemv, 3 = fp4_mma_gemv (linear_gemv_fp4_mma.cu) for the calls
// it takes of up to 42 x rows per list, fp4_pair_gemv otherwise (the default; fp4_uses_mma), 4 = fp4_mma_gemv wherever
// it takes the call (tests, benchmarks). gemv_set_fp4_variant.
constexpr int kFp4DefaultVariant = 3;
std::atomic<int> g_fp4_variant{kFp4DefaultVariant};

int fp4_variant() { return g_fp4_variant.load(std::memory_order_relaxed); }

// The BF16 kernel in force: 1 = chain_gemv, 2 = bf16_lane_gemv / bf16_tile_gemv (linear_gemv_bf16*.cu) for the calls
// they take, 3 = by rows of x (the default; bf16_uses_tile). gemv_set_bf16_variant.
constexpr int kBf16DefaultVariant = 3;
std::atomic<int> g_bf16_variant{kBf16DefaultVariant};

// The E4M3 kernel in force: 1 = fp8_gemv, 2 = fp8_walk_gemv (linear_gemv_fp8.cu), 3 = by shape (fp8_uses_walk),
// 4 = fp8_mma_gemv wherever it takes the call, 5 = by shape with fp8_mma_gemv for the dense calls where it measured
// faster and fp8_rows_gemv (linear_gemv_fp8_rows.cu) for the dense decode batches where it measured faster (the
// default; fp8_uses_mma, fp8_uses_rows; since the thirty-sixth session fp8_wgmma_gemv for single-row calls on N >=
// 16,384, fp8_uses_wgmma), 6 = fp8_rows_gemv wherever it takes the call, the default elsewhere, 7 = fp8_wgmma_gemv
// (linear_gemv_fp8_wgmma.cu) wherever it takes the call, the default elsewhere, 8 = fp8_bmma_gemv
// (linear_gemv_fp8_bmma.cu) wherever it takes the call, the default elsewhere. gemv_set_fp8_variant.
constexpr int kFp8DefaultVariant = 5;
std::atomic<int> g_fp8_variant{kFp8DefaultVariant};

// fp8_walk_gemv's form: 1 = the pair form (two lanes per tile, a shuffle exchange per 32 bytes), 2 = the whole-chunk
// form where it applies (gemv_fp8_walk_into), 3 = the whole-chunk form fed by the bulk ring where it applies, 0 = by
// DEEPINFER_CUDA_WALK_WHOLE (1, the default: the whole-chunk form) and DEEPINFER_CUDA_WALK_BULK (0, the default: the
// register ring). gemv_set_fp8_walk_form.
std::atomic<int> g_walk_form{0};

int walk_form() {
  static const int env = env_switch("DEEPINFER_CUDA_WALK_WHOLE", 1) == 0  ? 1
                         : env_switch("DEEPINFER_CUDA_WALK_BULK", 0) != 0 ? 3
                                                                          : 2;
  const int f = g_walk_form.load(std::memory_order_relaxed);
  return f == 0 ? env : f;
}

}  // namespace

int gemv_set_fp4_variant(int v) {
  DI_CHECK(v >= 0 && v <= 4, "gemv_set_fp4_variant: {} is not 0 .. 4", v);
  return g_fp4_variant.exchange(v == 0 ? kFp4DefaultVariant : v, std::memory_order_relaxed);
}

int gemv_set_fp8_variant(int v) {
  DI_CHECK(v >= 0 && v <= 8, "gemv_set_fp8_variant: {} is not 0 .. 8", v);
  return g_fp8_variant.exchange(v == 0 ? kFp8DefaultVariant : v, std::memory_order_relaxed);
}

int gemv_fp8_variant() { return g_fp8_variant.load(std::memory_order_relaxed); }

int gemv_set_fp8_walk_form(int form) {
  DI_CHECK(form >= 0 && form <= 3, "gemv_set_fp8_walk_form: {} is not 0 .. 3", form);
  return g_walk_form.exchange(form, std::memory_order_relaxed);
}

int gemv_set_bf16_variant(int v) {
  DI_CHECK(v >= 0 && v <= 3, "gemv_set_bf16_variant: {} is not 0 .. 3", v);
  return g_bf16_variant.exchange(v == 0 ? kBf16DefaultVariant : v, std::memory_order_relaxed);
}

bool gemv_fp8_uses_walk(bool grouped, int64_t N, int64_t M) {
  // By shape (bench_cuda_gemv on the H200, V4.1 shapes at M = 1): a warp of fp8_walk_gemv walks 2 or 4 rows
  // over the whole of K, so it needs many row groups to fill the GPU. It won from N = 1,280 (wq_a [1280, 5120] 8.8
  // us against 9.3 for fp8_gemv, the shared w1 / w3 [2304, 5120] 9.6 against 12.3, wq_b [32768, 1280] 17.3 against
  // 29.7, wo_b [5120, 8192] 20.8 against 40.8) and on grouped calls (wo_a's 8 x [1024, 4096]: 17.6 against 28.6);
  // fp8_gemv, which splits K across a block, won on narrower weights (wq_a [1024, 5120] 9.1 against 10.4, wkv
  // [512, 5120] 8.5 against 14.9). Dense calls of 2+ rows of x: fp8_walk_gemv beat fp8_gemv on every V4.1 shape
  // from M = 2 to 64 (bench_cuda_gemv's batched table), 1.1x to 2.3x. In the model wq_a and wkv run stacked, [1792,
  // 5120] in V4.1: a batch-1 step's ktrace gave that call 13.2-13.4 us on fp8_gemv against 14.5-17.1 on the walk
  // kernel (from the norm before it to its end), hence the threshold above it (bench/RESULTS.md, twenty-first
  // session: bench_cuda_model +0.56% [-0.4%, +1.5%]). DEEPINFER_CUDA_WALK_MIN_ROWS moves the threshold (A/B).
  static const int64_t walk_min_rows = env_int("DEEPINFER_CUDA_WALK_MIN_ROWS", 1);
  const int v = gemv_fp8_variant();
  return v == 2 || (v >= 3 && (grouped || N >= walk_min_rows || M >= 2));
}

namespace {

// bf16_lane_gemv for the single-row calls it takes under variants 2 and 3 (bench_cuda_gemv, M = 1: the gate [384,
// 5120] took 20.7 us on chain_gemv and 8.0 on the slab kernel).
bool bf16_uses_lane(const GemvArgs& a) {
  return g_bf16_variant.load(std::memory_order_relaxed) != 1 && gemv_bf16_lane_supported(a);
}

bool fp4_uses_mma(const GemvArgs& a) {
  // bench_cuda_model (4-layer flash-shape checkpoints, ms per step, fp4_mma_gemv against fp4_pair_gemv): V4.1 batch 1
  // 1.31 / 1.38, batch 3 2.44 / 2.85, batch 4 2.93 / 3.52, batch 6 4.44 / 5.21, batch 7 4.23-4.26 / 4.24-4.25, batch
  // 8 4.79 / 4.80; V4 batch 3 2.56 / 2.72, batch 6 4.19 / 4.55, batch 7 4.39 / 4.88-4.91, batch 8 4.74 / 4.53 (V4
  // slower from there). So the default gives it the calls of up to 42 x rows per list (seven tokens at top-6).
  constexpr int kMmaMaxRows = 42;
  const int v = fp4_variant();
  const int rows = a.x_rows > 0 ? a.x_rows : a.M;
  if (v != 4 && !(v == 3 && rows <= kMmaMaxRows)) return false;
  return gemv_fp4_mma_supported(a);
}

bool fp8_uses_mma(const GemvArgs& a) {
  // bench_cuda_gemv on the H200, V4.1 shapes at M = 1: fp8_mma_gemv walks 16 rows per warp over all of K, so it needs
  // many rows to fill the GPU: wq_b [32768, 1280] 15.4 us against fp8_walk_gemv's 16.3, but wo_b [5120, 8192] 62.8
  // against 19.3 and wq_a [1280, 5120] 21.8 against 8.8 (20 blocks of 4 warps for the whole GPU). Dense calls of M
  // rows run M blocks per weight step side by side (L2 serves the repeats); the batched table: wq_b at M = 3 / 5 / 8
  // 35.4 / 55.4 / 86.2 us against the walk kernel's 50.0 / 95.7 / 95.9 (equal at M = 2), and at M = 5-6, where the
  // walk kernel's second pass of 4 x rows is nearly empty, wo_b [5120, 8192] 76.4 against 90.8 and the shared w2
  // [5120, 2304] 23.2 against 29.9; slower elsewhere (wq_a, the shared w1 / w3, M >= 16 on N = 5,120).
  constexpr int64_t kMmaMinRows = 16384;
  const int v = gemv_fp8_variant();
  if (v == 4) return gemv_fp8_mma_supported(a);
  if ((v != 5 && v != 6) || a.row_expert != nullptr) return false;
  const bool wide = a.N >= kMmaMinRows && (a.M == 1 || (a.M >= 3 && a.M <= 64));
  const bool second_pass = a.N >= 4096 && (a.M == 5 || a.M == 6);
  return (wide || second_pass) && gemv_fp8_mma_supported(a);
}

bool fp8_uses_bmma(const GemvArgs& a) {
  // fp8_bmma_gemv (8 weight rows a warp) for the calls that read each weight row once: dense at one row of x, grouped
  // with one x row per matrix (wo_a's groups, the shared expert's w1 / w3 at one token), under the default variant
  // when DEEPINFER_CUDA_BMMA is 1. Off by default: exact, but slower in the model (H100, 4-layer V4.1 flash-shape,
  // batch 1, alternated ktraces: +226 us a step at depth 4, +178 at depth 8, +180 with 2 warps a block, +346 with 1;
  // bench/RESULTS.md, fifty-ninth session).
  static const bool on = env_switch("DEEPINFER_CUDA_BMMA", 1) != 0;
  const int v = gemv_fp8_variant();
  if (v == 8) return gemv_fp8_bmma_supported(a);
  if (v != 5 || !on) return false;
  const int xr = a.x_rows > 0 ? a.x_rows : a.M;
  const bool one_row = a.row_expert == nullptr ? a.M == 1 : a.row_period > 0 && xr == a.row_period;
  return one_row && gemv_fp8_bmma_supported(a);
}

bool fp8_uses_wgmma(const GemvArgs& a) {
  // bench_cuda_gemv on the H200 at one row of x (bench/RESULTS.md, thirty-sixth session): a 64-row unit of
  // fp8_wgmma_gemv is a serial chain of 128-column stages (~330 ns each), so it wins only where many units share the
  // GPU: wq_b [32768, 1280] 13.2 us (two blocks per SM) against fp8_mma_gemv's 14.0 and the walk's 15.2; slower on
  // every narrower dense weight (wq_a + wkv 13.3 against 8.5, wo_b 22.6 against 17.2, the shared w2 8.1 against 6.7)
  // and on wo_a's groups (19.0 against 13.6). Variant 7 gives it every call it takes.
  constexpr int64_t kWgmmaMinRows = 16384;
  const int v = gemv_fp8_variant();
  if (v == 7) return gemv_fp8_wgmma_supported(a);
  // Dense calls of 2 .. DEEPINFER_CUDA_WGMMA_ROWS rows of act-quantised x on weights of 4,096+ rows, the rows'
  // diagonals side by side in one MMA per tile. Off by default (1): a wgmma of N = 32 MX costs about MX times one of
  // N = 32 (bench_cuda_wgmma_probe on the H100: 59 / 96 / 133 / 171 ns for N = 32 / 64 / 96 / 128), so the merged
  // MMAs saved little (wo_b at 4 rows 63.3 -> 60.5 us against the walk's 47.8) and the model A / B at 4 rows lost
  // 0.8% (bench/RESULTS.md, thirty-eighth session).
  static const int multi = [] {
    const int64_t n = env_int("DEEPINFER_CUDA_WGMMA_ROWS", 1);
    DI_CHECK(n <= 4, "DEEPINFER_CUDA_WGMMA_ROWS must be 1 .. 4 (got {})", n);
    return static_cast<int>(n);
  }();
  constexpr int64_t kWgmmaMultiMinRows = 4096;
  if (v != 5) return false;
  const bool shape =
      a.M == 1 ? a.N >= kWgmmaMinRows : a.M <= multi && a.N >= kWgmmaMultiMinRows && a.act_quant_block != 0;
  return shape && gemv_fp8_wgmma_supported(a);  // supported: dense calls only (no row_expert)
}

bool fp8_uses_rows(const GemvArgs& a) {
  // bench_cuda_gemv's batched table on the H200 (V4.1 shapes, us; fp8_rows_gemv against the fastest other kernel):
  // wq_b [32768, 1280] at M = 2 / 4 / 8 / 16 / 64: 19.7 / 26.8 / 39.8 / 72.2 / 270 against 24.8 / 45.7 / 86.7 / 164 /
  // 663; wo_b [5120, 8192] at M = 5 / 8 / 16 / 64: 71.3 / 77.5 / 115 / 358 against 77.0 / 91.0 / 164 / 619, but
  // slower at M = 1-4 (too few 16-row tasks: 46.2 against 19.4 at M = 1); the shared w2 [5120, 2304] at M = 5 / 8 /
  // 16: 21.8 / 24.1 / 34.1 against 23.4 / 30.0 / 53.1. So the default takes dense calls of 2-64 rows of x on N >=
  // 16,384 and of 5-64 rows on N >= 4,096.
  const int v = gemv_fp8_variant();
  if (v == 6) return gemv_fp8_rows_supported(a);
  if (v != 5) return false;
  if (a.row_expert != nullptr) {
    // Grouped calls with a known row period (bench_cuda_gemv's grouped decode table, us, rows against walk): wo_a's 8
    // groups [1024, 4096] at 8 / 16 / 32 tokens 55.1 / 75.7 / 132 against 61.9 / 117 / 232, but slower at 1-4 tokens
    // (43.5 against 14.9 at one: 512 16-row tasks); the shared expert's w1 + w3 (2 lists of one [2304, 5120] matrix)
    // at 16 / 32 tokens 75.0 / 135 against 85.0 / 162, slower up to 8 (58.2 against 47.5). So: from 8 x rows per
    // matrix at 8+ matrices per list, from 16 otherwise, to 64.
    const int xr = a.x_rows > 0 ? a.x_rows : a.M, per_matrix = a.row_period > 0 ? xr / a.row_period : 0;
    const int from = a.row_period >= 8 ? 8 : 16;
    return per_matrix >= from && per_matrix <= 64 && gemv_fp8_rows_supported(a);
  }
  if (a.M > 64) return false;
  const bool wide = a.N >= 16384 && a.M >= 2, batch = a.N >= 4096 && a.M >= 5;
  return (wide || batch) && gemv_fp8_rows_supported(a);
}

bool bf16_uses_tile(const GemvArgs& a) {
  // By rows of x (bench_cuda_gemv's batched table, the head [129280, 5120] on the H200): bf16_tile_gemv against
  // chain_gemv 689 / 844 us at M = 5 and 6 (chain_gemv's passes of 4 rows read the head twice from 5 rows on), 691 /
  // 845 at M = 8, 2,488 / 3,284 at M = 32; even at M = 4 (431 / 433) and slower at M = 3 (434 / 397) and 2 (435 /
  // 325). End to end (bench_cuda_model, V4.1 flash shape) tile from 5 rows took batch 5 from 4.08 to 3.97 ms, 6 from
  // 4.42 to 4.31, 7 from 4.55 to 4.44.
  constexpr int64_t kTileMinRows = 5;
  const int v = g_bf16_variant.load(std::memory_order_relaxed);
  return (v == 2 || (v == 3 && a.M >= kTileMinRows)) && gemv_bf16_tile_supported(a);
}

}  // namespace

bool gemv_supported(const GemvArgs& a) {
  if (a.M < 0 || a.N < 0) return false;
  if (a.M == 0 || a.N == 0) return true;
  if (a.fmt != kFp8 && a.fmt != kFp4 && a.fmt != kBf16) return false;
  if (a.K < 32 || a.K > 16384 || a.K % 32 != 0) return false;
  if (a.x == nullptr || a.y == nullptr || reinterpret_cast<uintptr_t>(a.x) % 16 != 0 || a.ldx % 4 != 0 ||
      (a.M > 1 && a.ldx < a.K))
    return false;
  if (a.act_quant_block < 0 || (a.act_quant_block > 0 && (a.K + a.act_quant_block - 1) / a.act_quant_block > 512))
    return false;
  const bool grouped = a.row_expert != nullptr;
  if (a.row_period < 0) return false;
  if (grouped) {
    if (a.w_table == nullptr || (a.fmt != kBf16 && a.s_table == nullptr)) return false;
    if (a.x_rows < 0 || (a.x_rows > 0 && (a.M % a.x_rows != 0 || a.n_experts <= 0))) return false;
    if (a.row_period > 0 && (a.x_rows > 0 ? a.x_rows : a.M) % a.row_period != 0) return false;
  } else {
    if (a.w == nullptr || reinterpret_cast<uintptr_t>(a.w) % 16 != 0) return false;
    if (a.fmt != kBf16 && a.scale == nullptr) return false;
  }
  const int64_t row_bytes = a.fmt == kFp8 ? a.K : a.fmt == kFp4 ? a.K / 2 : 2 * static_cast<int64_t>(a.K);
  if (a.ldw % 16 != 0 || a.ldw < row_bytes) return false;
  if (a.fmt == kFp8) {
    if (a.B != 32 && a.B != 64 && a.B != 128) return false;
    const int T = (a.K + a.B - 1) / a.B;
    if (T > 16 * fp8_warps_max(a.B / 32) || a.lds < T) return false;
  }
  if (a.fmt == kFp4 && a.lds < a.K / 32) return false;
  return true;
}

void gemv_into(const GemvArgs& a, CUstream_st* stream) {
  DI_CHECK(gemv_supported(a),
           "cuda::gemv: unsupported call (fmt {}, N {}, K {}, M {}, B {}, act_quant_block {}, grouped {})", a.fmt, a.N,
           a.K, a.M, a.B, a.act_quant_block, a.row_expert != nullptr);
  if (a.M == 0 || a.N == 0) return;
  Params p = {};
  copy_gemv_args(a, p);
  if (a.fmt == kFp8 && fp8_uses_wgmma(a))
    gemv_fp8_wgmma_into(a, stream);
  else if (a.fmt == kFp8 && fp8_uses_bmma(a))
    gemv_fp8_bmma_into(a, stream);
  else if (a.fmt == kFp8 && fp8_uses_rows(a))
    gemv_fp8_rows_into(a, stream);
  else if (a.fmt == kFp8 && fp8_uses_mma(a))
    gemv_fp8_mma_into(a, stream);
  else if (a.fmt == kFp8 && gemv_fp8_uses_walk(a.row_expert != nullptr, a.N, a.M))
    gemv_fp8_walk_into(a, walk_form(), stream);
  else if (a.fmt == kFp8)
    launch_fp8(p, a.B, stream);
  else if (a.fmt == kFp4 && fp4_uses_mma(a))
    gemv_fp4_mma_into(a, stream);
  else if (a.fmt == kFp4 && fp4_variant() >= 2)
    launch_fp4_pair(p, a.tile_rows, stream);
  else if (a.fmt == kBf16 && bf16_uses_lane(a))
    gemv_bf16_lane_into(a, stream);
  else if (a.fmt == kBf16 && bf16_uses_tile(a))
    gemv_bf16_tile_into(a, stream);
  else
    launch_chain(p, a.fmt, stream);
}

}  // namespace deepinfer::cuda
