// fp8_wgmma_gemv: the E4M3 decode GEMV of the V4.1 linears (32 x 32 tiles, act_quant_block 32, 1 to 4 rows of x) on
// Hopper's asynchronous tensor cores, bit-identical to fp8_mma_gemv / fp8_walk_gemv and the CPU op. Why: the other
// E4M3 GEMVs spend 3 (fp8_mma_gemv) to 6 (fp8_walk_gemv) thread instructions per weight byte on loads, byte permutes,
// decodes and the products, and stay at 40-68% of the read ceiling at one row of x (bench/RESULTS.md); here the TMA
// moves the weights and wgmma forms the products, and the threads only add.
//
// The contract (linear_gemv.cuh, as fp8_mma_gemv states it): per 32-column tile, chain (j, l) holds one product, of
// element 8j + l; s[l] = ((p0 + p1) + p2) + p3 over j and tot[l] = fma(s[l], 2^(e-119), tot[l]) tile after tile; y =
// ((tot0 + tot4) + (tot2 + tot6)) + ((tot1 + tot5) + (tot3 + tot7)) + 0. With x = X 2^kx after the act quant (X an
// e4m3 value) and the weight code W, the tensor core's product D = W X is exact in fp32 and p = D 2^(kx-8), so s[l] =
// 2^(kx-8) (((D0 + D1) + D2) + D3) and tot[l] = fma(((D0 + D1) + D2) + D3, 2^(e + kx - 127), tot[l]): the same reals
// rounded the same way whenever every power of two involved is a normal float. fp8_mma_gemv's fast test decides it
// (kx in [-100, 100] for every x tile, e <= 246 and e + kx in [1, 254] for every code of the unit's row block); a
// unit that fails it takes that kernel's scalar path (gemv_fp8_slow.cuh).
//
// The products: wgmma.m64n32k32 with A = a diagonal of x's codes (registers) and B = 32 weight rows x one 32-byte tile
// (shared memory): D[m][n] = sum_k A[m][k] W[n][k] with a single nonzero A[m][k] per row m is the one product W[n][k]
// X[k]. Two MMAs per tile give warp w (x row w) all four products of its chains: in the first, its A rows g and g + 8
// hold elements g and 8 + g (chains j = 0, 1 of l = g), in the second 16 + g and 24 + g (j = 2, 3). So lane (g, r)
// holds, for each of its 8 columns n = 8i + 2r + e, the products p0..p3 of chain l = g of weight row n, and s and the
// fold need no exchange between lanes. The element 8h + g (h = 0, 1) sits in A register a_h of lane r = g / 4 + 2h at
// byte g % 4 (mma.m16n8k32's A layout, per warp): a prmt from the x codes staged per stage and lane pair. Warps beyond
// M hold zero rows (the MMA is the warpgroup's).
//
// The pipeline: a block is a consumer warpgroup (warps 0-3) and a producer warp (4). Work comes in units of 32 weight
// rows x all of K (one row block of scale codes), units strided over a persistent grid. The producer's lane 0 streams
// each unit in stages of 128 columns (4 tiles: a TMA box of 32 rows x 128 bytes with the 128-byte swizzle, 4 KB) into
// a ring of S slots, each with a full and an empty mbarrier; dense weights do not depend on the previous kernel, so it
// starts before griddepcontrol.wait. The consumers quantise the x rows (mma_x_chunks: codes, kx, the fast test), then
// per tile issue the two MMAs into one of two accumulator sets and fold the previous tile's while they run; a slot is
// released when the MMAs of its last tile have completed.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/device.h"
#include "cuda/fp_decode.cuh"
#include "cuda/gemv_fp8_slow.cuh"
#include "cuda/gemv_mma.cuh"
#include "cuda/hopper.cuh"
#include "cuda/linear_gemv_fp8.cuh"
#include "cuda/linear_gemv_fp8_wgmma.cuh"
#include "cuda/quant.cuh"

namespace deepinfer::cuda {

namespace {

constexpr int kWgRows = 32;                            // weight rows per unit: the MMA's N
constexpr int kWgStageCols = 128;                      // columns per ring stage: 4 tiles, the swizzle's span
constexpr int kWgStageBytes = kWgRows * kWgStageCols;  // 4 KB
constexpr int kWgMaxXRows = 4;                         // x rows per call: one consumer warp each
constexpr int kWgThreads = 32 * (kMmaWarps + 1);       // the consumer warpgroup and the producer warp
constexpr int kWgMaxStages = 16;
constexpr int kWgMaxK = 8192;                       // 64 stages: two code words per lane
constexpr int64_t kWgBlockSmemBudget = 113 * 1024;  // two blocks per SM (228 KB, 1 KB reserved per block)

// A block's shared memory, byte offsets from its 1,024-byte aligned base (the ring's swizzle atoms): the ring (S
// stages of 4 KB), x's codes (per x row [K / 128 stages][8 g][2 h][8 bytes]: byte 2q + t of (g, h) is element 16t + 8h
// + g of the stage's tile q), kx << 23 per x row and tile, 16 zero bytes (the x codes of the lanes without A data),
// the flags (x_ok, kx min, kx max) and the mbarriers (full[S], then empty[S]); total includes the alignment slack.
struct WgSmem {
  int64_t ring, xl, kxs, zeros, flags, bars, total;
};
__host__ __device__ inline WgSmem wg_smem(int K, int M, int S) {
  WgSmem m;
  m.ring = 0;
  m.xl = m.ring + int64_t{S} * kWgStageBytes;
  m.kxs = m.xl + int64_t{M} * K;
  m.zeros = m.kxs + int64_t{M} * (K / 32) * 4;
  m.flags = m.zeros + 16;
  m.bars = m.flags + 16;
  m.total = m.bars + 16 * int64_t{S} + 1024;
  return m;
}

// Kernel parameters, by value (the tensor map of the weight is the kernel's first parameter).
struct WgParams : GemvCall {
  int units;   // ceil(N / 32)
  int stages;  // ring slots
};

// Pieces that took the slow path (gemv_fp8_wgmma_slow_warps).
__device__ unsigned long long g_wg_slow_warps;

// The prmt selector that puts byte src of a word into byte b and zeros elsewhere (selector 4: byte 0 of the zero
// operand).
__device__ __forceinline__ uint32_t place_byte(uint32_t src, uint32_t b) {
  return (0x4444u & ~(0xfu << (4 * b))) | (src << (4 * b));
}

__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;" ::"n"(32 * kMmaWarps) : "memory"); }

// One tile's fold: lane (g, r) has, for column n = 8i + 2r + e, chain l = g's products p0 = d[0][4i + e], p1 =
// d[0][4i + 2 + e], p2 = d[1][4i + e], p3 = d[1][4i + 2 + e].
__device__ __forceinline__ void fold_tile(float (&tot)[4][2], const float (&d)[2][16], float F) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float s =
          __fadd_rn(__fadd_rn(__fadd_rn(d[0][4 * i + e], d[0][4 * i + 2 + e]), d[1][4 * i + e]), d[1][4 * i + 2 + e]);
      tot[i][e] = __fmaf_rn(s, F, tot[i][e]);
    }
}

// Where x's code of element k (the lane of the prologue) of tile c goes in its x row's staging: stage c / 4, (g, h) =
// (k % 8, k / 8 % 2), byte 2 (c % 4) + k / 16 of that pair's 8 bytes.
__device__ __forceinline__ int xl_offset(int c, int k) {
  return ((c >> 2) * 16 + (k & 7) * 2 + ((k >> 3) & 1)) * 8 + 2 * (c & 3) + (k >> 4);
}

// A lane's prmt selectors: [tile % 2][MMA of the pair] for a_0 / a_2 (lo) and a_1 / a_3 (hi). Lane (g, r) holds A data
// when r = g / 4 + 2h (a_lane): element 8h + g (first MMA) and 16 + 8h + g (second) at byte g % 4 of a_h / a_{2+h}.
struct ASel {
  uint32_t lo[2][2], hi[2][2];
};
__device__ __forceinline__ ASel a_selectors(bool a_lane, int g, int r) {
  ASel s;
  const uint32_t h = static_cast<uint32_t>(r) >> 1, b = static_cast<uint32_t>(g) & 3u;
#pragma unroll
  for (int qq = 0; qq < 2; ++qq)
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      const uint32_t v = place_byte(2 * qq + t, b);
      s.lo[qq][t] = a_lane && h == 0 ? v : 0x4444u;
      s.hi[qq][t] = a_lane && h == 1 ? v : 0x4444u;
    }
  return s;
}

// A stage's A registers ([tile][a_0, a_1 of the first MMA; a_2, a_3 of the second]) from the lane's 8 staged bytes.
__device__ __forceinline__ void stage_a(uint32_t (&a)[4][4], uint2 xw, const ASel& s) {
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint32_t word = q < 2 ? xw.x : xw.y;
    a[q][0] = prmt(word, 0u, s.lo[q & 1][0]);
    a[q][1] = prmt(word, 0u, s.hi[q & 1][0]);
    a[q][2] = prmt(word, 0u, s.lo[q & 1][1]);
    a[q][3] = prmt(word, 0u, s.hi[q & 1][1]);
  }
}

// A stage's 8 MMAs on the tile at shared address tile0 (4 commit groups, a tile's pair each).
__device__ __forceinline__ void issue_stage(float (&d)[4][2][16], const uint32_t (&a)[4][4], uint32_t tile0) {
  wgmma_fence();
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint64_t desc = wgmma_desc_sw128(tile0 + 32 * q);
    wgmma_m64n32k32_e4m3(d[q][0], a[q][0], a[q][1], 0u, 0u, desc);
    wgmma_m64n32k32_e4m3(d[q][1], 0u, 0u, a[q][2], a[q][3], desc);
    wgmma_commit();
  }
}

__global__ void __launch_bounds__(kWgThreads, 1) fp8_wgmma_gemv(const __grid_constant__ CUtensorMap wmap, WgParams p) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  pdl_launch_dependents();
  const int K = p.K, M = p.M, N = p.N, S = p.stages, nst = K / kWgStageCols, nch = K / 32;
  const WgSmem sm = wg_smem(K, M, S);
  const uint32_t raw = smem_u32(smem_raw);
  uint8_t* smem = smem_raw + (((raw + 1023u) & ~1023u) - raw);
  const uint32_t ring = smem_u32(smem + sm.ring);
  uint8_t* xl = smem + sm.xl;
  int* kxs = reinterpret_cast<int*>(smem + sm.kxs);
  uint32_t* zeros = reinterpret_cast<uint32_t*>(smem + sm.zeros);
  int* flags = reinterpret_cast<int*>(smem + sm.flags);
  const uint32_t bars = smem_u32(smem + sm.bars);  // full[s] at bars + 8 s, empty[s] at bars + 8 (S + s)
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;

  if (tid == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(bars + 8 * s, 1);                // the producer's arrive (and the TMA's bytes)
      mbar_init(bars + 8 * (S + s), kMmaWarps);  // one arrive per consumer warp
    }
    mbar_init_fence();
  }
  mma_block_flags(flags, zeros, 4);
  __syncthreads();  // the last block-wide barrier: the producer warp leaves the consumers' barriers alone below

  if (warp == kMmaWarps) {
    if (lane == 0) {
      const uint64_t policy = l2_evict_first();
      int slot = 0;
      uint32_t phase = 0;  // of the slot's empty barrier, which is waited for from the ring's second round on
      bool refill = false;
      for (int u = static_cast<int>(blockIdx.x); u < p.units; u += static_cast<int>(gridDim.x))
        for (int st = 0; st < nst; ++st) {
          if (refill) mbar_wait(bars + 8 * (S + slot), phase);
          mbar_arrive_expect_tx(bars + 8 * slot, kWgStageBytes);
          tma_load_2d(ring + slot * kWgStageBytes, &wmap, bars + 8 * slot, st * kWgStageCols, u * kWgRows, policy);
          if (++slot == S) slot = 0, phase = refill ? phase ^ 1u : phase, refill = true;
        }
    }
    return;
  }

  // The consumers: x quantised per tile (a warp per tile, a lane per column) into its codes and kx, and the flags.
  pdl_wait();
  for (int m = 0; m < M; ++m) {
    uint8_t* xm = xl + static_cast<int64_t>(m) * K;
    int* km = kxs + m * nch;
    mma_x_chunks(p.x + m * p.ldx, nch, warp, lane, flags, [&](int c, float v) {
      const float s = tile_scale(v);
      const int kx = static_cast<int>(__float_as_uint(s) >> 23) - 127;       // s = 2^kx (inf for an infinite amax)
      const float inv = __uint_as_float((254u << 23) - __float_as_uint(s));  // 2^-kx (unused when kx is out of range)
      const uint8_t code = __nv_cvt_float_to_fp8(e4m3_rne(__fmul_rn(v, inv)), __NV_SATFINITE, __NV_E4M3);
      xm[xl_offset(c, lane)] = code;
      if (lane == 0) km[c] = kx * (1 << 23);
      return MmaChunk{kx, kx >= -100 && kx <= 100};
    });
  }
  consumers_sync();  // codes, kx and flags complete
  const bool x_ok = flags[0] != 0;
  const int lo = max(0, 1 - flags[1]), hi = min(246, 254 - flags[2]);  // e <= 246 and e + kx in [1, 254]

  const int g = lane >> 2, r = lane & 3;
  const bool a_lane = warp < M && (r & 1) == (g >> 2);
  const ASel sel = a_selectors(a_lane, g, r);
  const uint32_t h = static_cast<uint32_t>(r) >> 1;
  const uint8_t* xw_base =
      a_lane ? xl + static_cast<int64_t>(warp) * K + (g * 2 + h) * 8 : reinterpret_cast<uint8_t*>(zeros);
  const int xw_stride = a_lane ? 128 : 0;
  const int* kx_row = kxs + (warp < M ? warp : 0) * nch;

  int slot = 0;  // the ring slot of the next stage and the parity of its full barrier's phase
  uint32_t phase = 0;
  for (int u = static_cast<int>(blockIdx.x); u < p.units; u += static_cast<int>(gridDim.x)) {
    const uint8_t* srow = p.sc + static_cast<int64_t>(u) * p.lds;
    // The unit's scale codes, a word (4 tiles, one stage) per lane and stage: lane holds stages lane and lane + 32.
    const uint32_t cw0 = lane < nst ? __ldg(reinterpret_cast<const unsigned int*>(srow) + lane) : 0u;
    const uint32_t cw1 = lane + 32 < nst ? __ldg(reinterpret_cast<const unsigned int*>(srow) + lane + 32) : 0u;
    bool fast = x_ok && lo <= hi;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int v0 = static_cast<int>((cw0 >> (8 * q)) & 0xffu), v1 = static_cast<int>((cw1 >> (8 * q)) & 0xffu);
      fast = fast && (lane >= nst || (v0 >= lo && v0 <= hi)) && (lane + 32 >= nst || (v1 >= lo && v1 <= hi));
    }
    fast = __all_sync(0xffffffffu, fast);  // the same in the four warps: the same codes and flags

    if (fast) {
      float tot[4][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}, {0.0f, 0.0f}, {0.0f, 0.0f}};  // [i][e]: column 8i + 2r + e
#pragma unroll 1
      for (int st = 0; st < nst; ++st) {
        // A stage's 8 MMAs are issued and folded within the iteration (4 commit groups, a tile's pair each; the
        // folds of the earlier tiles run under the later tiles' MMAs): accumulators in flight across the loop's back
        // edge would make ptxas serialise every MMA (C7514).
        const uint2 xw = *reinterpret_cast<const uint2*>(xw_base + st * xw_stride);
        const uint32_t cw = __shfl_sync(0xffffffffu, st < 32 ? cw0 : cw1, st & 31);
        const int4 kx4 = *reinterpret_cast<const int4*>(kx_row + 4 * st);
        uint32_t a[4][4];
        stage_a(a, xw, sel);
        mbar_wait(bars + 8 * slot, phase);
        float d[4][2][16];
        issue_stage(d, a, ring + slot * kWgStageBytes);
        const int kxq[4] = {kx4.x, kx4.y, kx4.z, kx4.w};
        float F[4];  // 2^(e + kx - 127) per tile
#pragma unroll
        for (int q = 0; q < 4; ++q)
          F[q] = __int_as_float(static_cast<int>((cw >> (8 * q)) & 0xffu) * (1 << 23) + kxq[q]);
        wgmma_wait<3>();
        wgmma_fence_operands(d[0][0]);
        wgmma_fence_operands(d[0][1]);
        if (warp < M) fold_tile(tot, d[0], F[0]);
        wgmma_wait<2>();
        wgmma_fence_operands(d[1][0]);
        wgmma_fence_operands(d[1][1]);
        if (warp < M) fold_tile(tot, d[1], F[1]);
        wgmma_wait<1>();
        wgmma_fence_operands(d[2][0]);
        wgmma_fence_operands(d[2][1]);
        if (warp < M) fold_tile(tot, d[2], F[2]);
        wgmma_wait<0>();
        wgmma_fence_operands(d[3][0]);
        wgmma_fence_operands(d[3][1]);
        if (warp < M) fold_tile(tot, d[3], F[3]);
        __syncwarp();
        if (lane == 0) mbar_arrive(bars + 8 * (S + slot));  // the slot's MMAs are done: the producer may refill it
        if (++slot == S) slot = 0, phase ^= 1u;
      }
      if (warp < M) {
        // y = ((tot0 + tot4) + (tot2 + tot6)) + ((tot1 + tot5) + (tot3 + tot7)) + 0 over the chains l = g.
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float u4 = __fadd_rn(tot[i][e], __shfl_xor_sync(0xffffffffu, tot[i][e], 16));
            const float u2 = __fadd_rn(u4, __shfl_xor_sync(0xffffffffu, u4, 8));
            const float out = __fadd_rn(__fadd_rn(u2, __shfl_xor_sync(0xffffffffu, u2, 4)), 0.0f);
            const int n = u * kWgRows + 8 * i + 2 * r + e;
            if (g == 0 && n < N) p.y[static_cast<int64_t>(warp) * N + n] = p.round ? round_to_bf16(out) : out;
          }
      }
    } else {
      // The scalar path: (x row, 16-row half) pieces over the warps; then the unit's stages are released unread.
      for (int piece = warp; piece < 2 * M; piece += kMmaWarps) {
        const int m = piece >> 1, base = u * kWgRows + 16 * (piece & 1);
        if (base >= N) continue;  // warp-uniform
        const uint8_t* b0p = p.w + static_cast<int64_t>(min(base + g, N - 1)) * p.ldw;
        const uint8_t* b1p = p.w + static_cast<int64_t>(min(base + g + 8, N - 1)) * p.ldw;
        float tot2[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
        if (lane == 0) atomicAdd(&g_wg_slow_warps, 1ull);
        slow_rows(p.x + m * p.ldx, b0p, b1p, srow, nch, lane, r, tot2);
        store_lane_rows(p, m, base + g, r, tot2);
      }
#pragma unroll 1
      for (int st = 0; st < nst; ++st) {
        mbar_wait(bars + 8 * slot, phase);
        __syncwarp();
        if (lane == 0) mbar_arrive(bars + 8 * (S + slot));
        if (++slot == S) slot = 0, phase ^= 1u;
      }
    }
  }
}

// The layout probe (gemv_fp8_wgmma_probe): one stage of the kernel's path, the TMA load of a [32, 128] weight tile and
// the 8 MMAs against x row 0's codes, each MMA's D written out whole: out[((q * 2 + t) * 64 + row) * 32 + column].
__global__ void __launch_bounds__(32 * kMmaWarps)
    fp8_wgmma_probe(const __grid_constant__ CUtensorMap wmap, const uint8_t* x_codes, float* out) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  uint8_t* tile = smem_raw + (((raw + 1023u) & ~1023u) - raw);  // 4 KB, then the staging, the zeros, the barrier
  uint8_t* xl = tile + kWgStageBytes;
  uint32_t* zeros = reinterpret_cast<uint32_t*>(xl + kWgStageCols);
  const uint32_t bar = smem_u32(zeros + 4);
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5, g = lane >> 2, r = lane & 3;
  xl[xl_offset(tid >> 5, lane)] = x_codes[tid];  // 128 threads: the 4 tiles' 32 codes
  if (tid < 4) zeros[tid] = 0u;
  if (tid == 0) {
    mbar_init(bar, 1);
    mbar_init_fence();
  }
  __syncthreads();
  if (tid == 0) {
    mbar_arrive_expect_tx(bar, kWgStageBytes);
    tma_load_2d(smem_u32(tile), &wmap, bar, 0, 0, l2_evict_first());
  }
  const bool a_lane = warp == 0 && (r & 1) == (g >> 2);
  const uint32_t h = static_cast<uint32_t>(r) >> 1;
  const uint2 xw = *reinterpret_cast<const uint2*>(a_lane ? xl + (g * 2 + h) * 8 : reinterpret_cast<uint8_t*>(zeros));
  uint32_t a[4][4];
  stage_a(a, xw, a_selectors(a_lane, g, r));
  mbar_wait(bar, 0);
  float d[4][2][16];
  issue_stage(d, a, smem_u32(tile));
  wgmma_wait<0>();
#pragma unroll
  for (int q = 0; q < 4; ++q)
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      wgmma_fence_operands(d[q][t]);
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const int row = 16 * warp + g + 8 * ((i >> 1) & 1), col = 8 * (i >> 2) + 2 * r + (i & 1);
        out[((q * 2 + t) * 64 + row) * 32 + col] = d[q][t][i];
      }
    }
}

}  // namespace

void gemv_fp8_wgmma_probe(const uint8_t* w, const uint8_t* x_codes, float* out, cudaStream_t stream) {
  const CUtensorMap map = tensor_map_u8_sw128(w, kWgRows, kWgStageCols, kWgStageCols, kWgRows, kWgStageCols);
  const int smem = kWgStageBytes + kWgStageCols + 32 + 1024;
  fp8_wgmma_probe<<<1, 32 * kMmaWarps, smem, stream != nullptr ? stream : current_stream()>>>(map, x_codes, out);
  DI_CUDA_CHECK(cudaGetLastError());
}

bool gemv_fp8_wgmma_supported(const GemvArgs& a) {
  if (a.fmt != 0 || !gemv_supported(a) || a.M < 1 || a.M > kWgMaxXRows || a.N <= 0 || a.row_expert != nullptr)
    return false;
  if (a.B != 32 || a.act_quant_block != 32 || a.K % kWgStageCols != 0 || a.K > kWgMaxK || a.lds % 4 != 0) return false;
  return reinterpret_cast<uintptr_t>(a.scale) % 4 == 0;
}

int64_t gemv_fp8_wgmma_slow_warps(bool reset) { return mma_read_counter(&g_wg_slow_warps, reset); }

void gemv_fp8_wgmma_into(const GemvArgs& a, cudaStream_t stream) {
  DI_CHECK(gemv_fp8_wgmma_supported(a), "cuda::gemv: fp8_wgmma_gemv does not take this call (N {}, K {}, M {}, B {})",
           a.N, a.K, a.M, a.B);
  WgParams p = {};
  copy_gemv_args(a, p);
  p.units = (a.N + kWgRows - 1) / kWgRows;
  // As many ring slots as two blocks per SM leave beside the x codes (at least 2, at most kWgMaxStages).
  const int64_t fixed = wg_smem(a.K, a.M, 0).total;
  p.stages =
      static_cast<int>(std::clamp<int64_t>((kWgBlockSmemBudget - fixed) / (kWgStageBytes + 16), 2, kWgMaxStages));
  const int64_t smem = wg_smem(a.K, a.M, p.stages).total;
  const CUtensorMap map = tensor_map_u8_sw128(a.w, a.N, a.K, a.ldw, kWgRows, kWgStageCols);
  const int64_t resident =
      static_cast<int64_t>(gemv_blocks_per_sm(reinterpret_cast<const void*>(fp8_wgmma_gemv), kWgThreads, smem)) *
      sm_count();
  const int64_t grid = std::min<int64_t>(p.units, resident);
  launch_pdl(fp8_wgmma_gemv, dim3(static_cast<unsigned>(grid)), kWgThreads, smem, stream, map, p);
}

}  // namespace deepinfer::cuda
