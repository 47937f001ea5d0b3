// fp8_wgmma_gemv: the E4M3 decode GEMV of the V4.1 linears (32 x 32 tiles, act_quant_block 32, 1 to 4 rows of x) on
// Hopper's asynchronous tensor cores, bit-identical to fp8_mma_gemv / fp8_walk_gemv and the CPU op. Why: the other
// E4M3 GEMVs spend 3 (fp8_mma_gemv) to 6 (fp8_walk_gemv) thread instructions per weight byte on loads, byte permutes,
// decodes and the products, and stay at 40-68% of the read ceiling at one row of x (bench/RESULTS.md); here the TMA
// moves the weights, wgmma forms the products, and the threads only add (about one instruction per product, the
// contract's own additions).
//
// The contract (linear_gemv.cuh, as fp8_mma_gemv states it): per 32-column tile, chain (j, l) holds one product, of
// element 8j + l; s[l] = ((p0 + p1) + p2) + p3 over j and tot[l] = fma(s[l], 2^(e-119), tot[l]) tile after tile; y =
// ((tot0 + tot4) + (tot2 + tot6)) + ((tot1 + tot5) + (tot3 + tot7)) + 0. With x = X 2^kx after the act quant (X an
// e4m3 value) and the weight code W, the tensor core's product D = W X is exact in fp32 and p = D 2^(kx-8), so s[l] =
// 2^(kx-8) (((D0 + D1) + D2) + D3) and tot[l] = fma(((D0 + D1) + D2) + D3, 2^(e + kx - 127), tot[l]): the same reals
// rounded the same way whenever every power of two involved is a normal float. fp8_mma_gemv's fast test decides it
// (kx in [-100, 100] for every x tile, e <= 246 and e + kx in [1, 254] for every code of the unit's row blocks); a
// unit that fails it takes that kernel's scalar path (gemv_fp8_slow.cuh).
//
// The products: wgmma.m64n32k32 with A = 64 weight rows x one 32-byte tile (the TMA's 128-byte-swizzled stage) and B
// = the diagonal of the tile's 32 x codes (one x row): D[n][k] = sum_k' W[n][k'] B[k'][k] with B's only nonzero in
// column k at row k is the one product W[n][k] X[k]. Lane (g, r) of warp w holds D rows 16w + g and 16w + g + 8 and
// columns 8i + 2r + e (i = 0..3): element 8i + 2r + e, i.e. all four products (j = i) of chains l = 2r and 2r + 1 of
// its two weight rows, so s and the fold need no exchange, every warp folds its own 16 rows, and the chains end in
// fp8_mma_gemv's lane layout (store_lane_rows). With MX x rows, B holds their diagonals side by side (N = 32 MX) and
// one MMA serves them all (two at 4 rows): a stage's time is its MMAs' (~80 ns a m64n32k32 on the H100,
// bench_cuda_wgmma_probe), so fewer, wider MMAs pay if a wide one costs less than its narrow parts (the probe's width
// table; this layout has not yet run on a GPU: the thirty-seventh session's machine time ran out).
//
// B in shared memory, K-major without swizzle: a tile's 32 x 32 bytes are 8 core matrices of 8 rows x 16 bytes, 128
// bytes apart along the rows (stride byte offset) and 512 along K (leading byte offset), so the diagonal's cores sit
// at +0, +128 (K bytes 0-15) and +768, +896 (16-31) of the tile's 1 KB and the other four stay zero; each ring slot
// holds a stage's 4 tiles per x row, zeroed once, and only the 32 diagonal bytes of a tile are written per stage.
//
// The pipeline: a block is a consumer warpgroup (warps 0-3) and a producer warp (4). Work comes in units of 64 weight
// rows x all of K (two row blocks of scale codes), strided over a persistent grid. Per stage of 128 columns (4 tiles)
// the producer's lane 0 sets the slot's full barrier to expect the TMA's 8 KB and issues the box (64 rows x 128 bytes,
// 128-byte swizzle; dense weights do not depend on the previous kernel, so the first boxes go out before
// griddepcontrol.wait), then the warp writes the stage's diagonal bytes from x's codes (after the consumers have
// quantised x: the x_ready barrier), and each lane fences its bytes into the async proxy and arrives on the full
// barrier (32 arrivals, so no lane's stores depend on another's release). The
// consumers quantise x (mma_x_chunks: codes, kx, the fast test), then per stage issue the 4 MMAs per x row and fold
// each tile's while the later tiles' run; a slot's empty barrier gets an arrive per consumer warp once its MMAs are
// done.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <string>

#include "core/env.h"
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

constexpr int kWgRows = 64;                            // weight rows per unit: the MMA's M
constexpr int kWgStageCols = 128;                      // columns per ring stage: 4 tiles, the swizzle's span
constexpr int kWgStageBytes = kWgRows * kWgStageCols;  // 8 KB of weights per stage
constexpr int kDiagTileBytes = 1024;                   // one 32 x 32 E4M3 (or 16 x 32 f16) diagonal B tile
constexpr int kWgDiagBytes = 4 * kDiagTileBytes;       // a stage's 4 diagonal B tiles of one x row (E4M3)
constexpr int kWgMaxXRows = 4;                         // x rows per call
constexpr int kWgMaxRawRows = 3;  // raw x: at 4 rows the A fragments and 4 rows' accumulators spill (76 bytes)
constexpr int kWgThreads = 32 * (kMmaWarps + 1);  // the consumer warpgroup and the producer warp
constexpr int kWgMaxStages = 16;
constexpr int kWgMaxK = 8192;                       // 64 stages: two code words per lane
constexpr int64_t kWgBlockSmemBudget = 200 * 1024;  // one block per SM
// One x row with more units than SMs (wq_b): two blocks per SM, each half the shared memory, so that two units' serial
// stage chains run side by side on an SM (a unit's stages are a chain: its fold is in tile order).
constexpr int64_t kWgPairSmemBudget = 110 * 1024;
template <int MX, bool RAW>
constexpr int kWgMinBlocks = MX == 1 && !RAW ? 2 : 1;  // __launch_bounds__: E4M3 x at MX = 1 fits 204 registers

// A block's shared memory, byte offsets from its 1,024-byte aligned base: the ring (S slots of 8 KB of weights, then
// MX x 4 KB of diagonal B tiles), x's codes (per x row [K / 128 stages][32 elements][4 tiles]: one 4-byte word gives
// the producer an element's codes in a stage's 4 tiles), kx << 23 per x row and tile, the flags (x_ok, kx min, kx max)
// and the mbarriers (full[S], empty[S], x_ready); total includes the alignment slack.
// RAW (x not act-quantised): x's codes are f16 (2 bytes an element) and a tile's diagonal two f16 B tiles (2 KB).
struct WgSmem {
  int64_t slot, ring, xc, kxs, flags, bars, total;
};
__host__ __device__ constexpr int wg_diag_bytes(bool raw) { return raw ? 2 * kWgDiagBytes : kWgDiagBytes; }
__host__ __device__ inline WgSmem wg_smem(int K, int MX, int S, bool raw = false) {
  WgSmem m;
  m.slot = kWgStageBytes + int64_t{MX} * wg_diag_bytes(raw);
  m.ring = 0;
  m.xc = m.ring + S * m.slot;
  m.kxs = m.xc + int64_t{MX} * K * (raw ? 2 : 1);
  m.flags = m.kxs + int64_t{MX} * (K / 32) * 4;
  m.bars = m.flags + 16;
  m.total = m.bars + 16 * int64_t{S} + 8 + 1024;
  return m;
}

// Kernel parameters, by value (the tensor map of the weight is the kernel's first parameter).
struct WgParams : GemvCall {
  int units;         // ceil(N / 64)
  int groups;        // block-diagonal groups (1: dense): unit u belongs to group u / gunits
  int gunits;        // units per group
  int gx;            // x columns between two groups' slices of an x row (0 when dense)
  int stages;        // ring slots
  uint64_t hang_ns;  // the barrier waits' bound (gemv_fp8_wgmma_set_hang_ns; 0: none)
  int pipe;          // one x row: the pipelined stage loop (DEEPINFER_CUDA_WGMMA_PIPE, 0 for A/B)
};

// Pieces that took the slow path (gemv_fp8_wgmma_slow_warps).
__device__ unsigned long long g_wg_slow_warps;

// Where a bounded wait first gave up (gemv_fp8_wgmma_hang): 0 when none did, else hang_code's.
__device__ unsigned long long g_wg_hang;

// A wait's place: 1 + (block << 32 | warp << 24 | barrier << 20 | stage), barrier 0 = a slot's full barrier, 1 = its
// empty one, 2 = x_ready; stage: the block's stage count at the wait (20 bits).
enum WaitOn : int { kWaitFull = 0, kWaitEmpty = 1, kWaitXReady = 2 };
__device__ __forceinline__ unsigned long long hang_code(WaitOn barrier, int stage) {
  return 1ull + ((static_cast<unsigned long long>(blockIdx.x) << 32) |
                 (static_cast<unsigned long long>(threadIdx.x >> 5) << 24) |
                 (static_cast<unsigned long long>(barrier) << 20) |
                 (static_cast<unsigned long long>(stage) & 0xfffffu));
}

// A barrier wait (hang_ns 0: mbar_wait's, without bound). With a bound (tests, on a GPU the kernel has not run on):
// once the phase has not completed for hang_ns, the first thread to give up records where (g_wg_hang) and every waiting
// thread returns false, so that the kernel ends (its results wrong) instead of hanging, and the test can say which
// barrier never completed. The waiters of a barrier are whole warps, and the waits they skip past are their own, so
// no thread is left at a block barrier or a warpgroup instruction that a returned thread would have had to reach. The
// bounded loop is a call of its own, so that the stage loops keep their size.
__device__ __noinline__ bool wait_bounded(uint32_t bar, uint32_t parity, uint64_t hang_ns, unsigned long long code) {
  if (mbar_wait_ns(bar, parity, hang_ns)) return true;
  atomicCAS(&g_wg_hang, 0ull, code);
  return false;
}
__device__ __forceinline__ bool wait_or_give_up(uint32_t bar, uint32_t parity, uint64_t hang_ns, WaitOn on, int stage) {
  if (hang_ns == 0) {
    mbar_wait(bar, parity);
    return true;
  }
  return wait_bounded(bar, parity, hang_ns, hang_code(on, stage));
}

__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;" ::"n"(32 * kMmaWarps) : "memory"); }

// E4M3 x: a stage's diagonal B tiles hold its MX x rows side by side, tile q's B [32 x 32 MX] at q MX KB, so that one
// MMA of N = 32 MX serves every x row of a tile (or two of N = 64 at 4 rows: Jobs).
// Element k of x row m sits at column n = 32 m + k: core (n / 8, k / 16), row k % 8, byte k % 16, the cores 128 bytes
// apart along N and 512 MX along K. At MX = 1 that is the single row's 1 KB tile.
__device__ __forceinline__ int diag_offset(int MX, int m, int q, int k) {
  return q * MX * kDiagTileBytes + (4 * m + (k >> 3)) * 128 + (k >> 4) * 512 * MX + (k & 7) * 16 + (k & 15);
}

// The B descriptor of a diagonal tile of MX x rows at shared address addr: leading (K) byte offset 512 MX, stride (N)
// 128. The probe can swap the two (a layout diagnosis on a new GPU: diag_swap).
__device__ __forceinline__ uint64_t diag_desc(uint32_t addr, bool diag_swap = false, int MX = 1) {
  return diag_swap ? wgmma_desc_plain(addr, 128, 512) : wgmma_desc_plain(addr, 512 * MX, 128);
}

// A ring position: the slot of a stage and the parity of its full barrier's phase (round / S, mod 2). The producer
// waits for the slot's previous release, the empty barrier's phase of the round before: the opposite parity.
struct RingPos {
  int slot = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void next(int S) {
    if (++slot == S) slot = 0, phase ^= 1u;
  }
};

// Zeros for the diagonal tiles at diag (bytes, a multiple of 16), by the block's threads; the caller fences them.
__device__ __forceinline__ void zero_diagonals(uint8_t* diag, int bytes, int tid) {
  for (int i = tid; i < bytes / 16; i += kWgThreads)
    *reinterpret_cast<uint4*>(diag + 16 * i) = make_uint4(0u, 0u, 0u, 0u);
}

// The TMA box of a stage (columns c0.., rows c1..) into dst, its bytes expected on the slot's full barrier (one lane).
__device__ __forceinline__ void load_stage(uint32_t full, uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                           uint64_t policy) {
  mbar_expect_tx(full, kWgStageBytes);
  tma_load_2d(dst, map, full, c0, c1, policy);
}

// The producer warp's part of a stage: element `lane` of x row m's 4 tiles (one word of x's codes) into the slot's
// diagonal tiles, then fenced into the async proxy. RAW: the element's 4 f16 codes (8 bytes), tile q's element going
// to its f16 B tile 2q + lane / 16 (k 0-15, then 16-31: a wgmma.m64n32k16 each) at row n = lane, k = lane % 16.
template <int MX, bool RAW>
__device__ __forceinline__ void write_diagonals(uint8_t* diag, const uint8_t* xc, int K, int st, int lane) {
#pragma unroll
  for (int m = 0; m < MX; ++m) {
    if constexpr (RAW) {
      const uint2 w8 = *reinterpret_cast<const uint2*>(xc + 2 * static_cast<int64_t>(m) * K + st * 256 + 8 * lane);
      const uint32_t h4[4] = {w8.x & 0xffffu, w8.x >> 16, w8.y & 0xffffu, w8.y >> 16};
      const int k = lane & 15;
      const int off = (lane >> 4) * kDiagTileBytes + (lane >> 3) * 128 + (k >> 3) * 512 + (lane & 7) * 16 + (k & 7) * 2;
#pragma unroll
      for (int q = 0; q < 4; ++q)
        *reinterpret_cast<uint16_t*>(diag + m * wg_diag_bytes(true) + 2 * q * kDiagTileBytes + off) =
            static_cast<uint16_t>(h4[q]);
    } else {
      const uint32_t w4 = *reinterpret_cast<const uint32_t*>(xc + static_cast<int64_t>(m) * K + st * 128 + 4 * lane);
#pragma unroll
      for (int q = 0; q < 4; ++q) diag[diag_offset(MX, m, q, lane)] = static_cast<uint8_t>(w4 >> (8 * q));
    }
  }
  fence_proxy_async();
}

// One tile's fold for one x row: lane (g, r) has, for row g + 8h and chain l = 2r + e, the products p_j = d[4j + 2h +
// e], j = 0..3.
__device__ __forceinline__ void fold_tile(float (&tot)[2][2], const float (&d)[16], float F) {
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float s =
          __fadd_rn(__fadd_rn(__fadd_rn(d[2 * h + e], d[4 + 2 * h + e]), d[8 + 2 * h + e]), d[12 + 2 * h + e]);
      tot[h][e] = __fmaf_rn(s, F, tot[h][e]);
    }
}

// A stage's MMAs as jobs, each one commit group: job j is tile j / kJobsPerTile for the x rows of group j %
// kJobsPerTile (kGroupRows rows each). E4M3 x: a job is one MMA for its rows (N = 32 kGroupRows): all MX rows up to 3,
// two pairs at 4 (a 64-register D at 4 rows makes ptxas serialise the MMAs, C7512). RAW: a job is up to 2 x rows' MMAs
// (one per row). One x row: the 4 tiles' jobs all in flight (64 accumulator registers); more: two jobs in flight, since
// a stage's 4 MX row tiles at once leave ptxas short of registers (C7511).
template <int MX, bool RAW>
struct Jobs {
  static constexpr int kGroupRows = RAW ? (MX == 1 ? 1 : 2) : MX == 4 ? 2 : MX;
  static constexpr int kJobsPerTile = (MX + kGroupRows - 1) / kGroupRows;
  static constexpr int kJobs = 4 * kJobsPerTile;
  static constexpr int kDepth = MX == 1 ? 4 : 2;
};

// RAW: a lane's A fragments of tile q, built from the TMA's raw E4M3 box (64 rows x 128 bytes, 128-byte swizzle: the
// 16-byte piece c of row n at (c ^ n % 8) * 16): for k half h (columns 32 q + 16 h ..) a[h][0] / a[h][2] = row g's
// bytes at 2r and 8 + 2r of the half, a[h][1] / a[h][3] row g + 8's, each pair one cvt to f16x2. row0: the slot's
// address of the lane's row g (16 warp + g) plus 2r; swz[c] = (c ^ g) * 16, the lane's swizzled offset of piece c (rows
// g and g + 8 share it).
__device__ __forceinline__ void raw_a_fragments(uint32_t (&a)[2][4], const uint8_t* row0, const int* swz, int q) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint8_t* piece = row0 + swz[2 * q + h];
#pragma unroll
    for (int s2 = 0; s2 < 2; ++s2) {
      a[h][2 * s2] = cvt_f16x2_e4m3x2(*reinterpret_cast<const uint16_t*>(piece + 8 * s2));
      a[h][2 * s2 + 1] = cvt_f16x2_e4m3x2(*reinterpret_cast<const uint16_t*>(piece + 8 * 128 + 8 * s2));
    }
  }
}

// A job's MMAs (RAW: from raw_row0 and swz, raw_a_fragments'), one commit group.
template <int MX, bool RAW = false>
__device__ __forceinline__ void issue_job(float (&d)[Jobs<MX, RAW>::kGroupRows][16], uint32_t slot_addr, int j,
                                          bool diag_swap = false, const uint8_t* raw_row0 = nullptr,
                                          const int* swz = nullptr) {
  constexpr int G = Jobs<MX, RAW>::kGroupRows, JT = Jobs<MX, RAW>::kJobsPerTile;
  const int q = j / JT, m0 = (j % JT) * G;
  if constexpr (RAW) {
    uint32_t a[2][4];
    raw_a_fragments(a, raw_row0, swz, q);
    wgmma_fence();  // the A registers just written
#pragma unroll
    for (int i = 0; i < G; ++i)
      if (m0 + i < MX) {
        const uint32_t b = slot_addr + kWgStageBytes + (m0 + i) * wg_diag_bytes(true) + 2 * q * kDiagTileBytes;
        wgmma_m64n32k16_f16_rs_first(d[i], a[0], diag_desc(b));
        wgmma_m64n32k16_f16_rs_acc(d[i], a[1], diag_desc(b + kDiagTileBytes));
      }
  } else {
    // One MMA for the job's G rows m0..: B = their diagonals, columns 32 (m - m0) .. of the tile's B (4 cores of 128
    // bytes per row), so D's columns 32 i .. 32 i + 31 are x row m0 + i's, d[i]'s layout (G rows of 16).
    static_assert(G * JT == MX, "E4M3 x: the jobs of a tile cover its rows exactly");
    wgmma_e4m3_ss<32 * G>(reinterpret_cast<float(&)[16 * G]>(d), wgmma_desc_sw128(slot_addr + 32 * q),
                          diag_desc(slot_addr + kWgStageBytes + q * MX * kDiagTileBytes + m0 * 512, diag_swap, MX));
  }
  wgmma_commit();
}

template <int MX, bool RAW>
__device__ __forceinline__ void fold_job(float (&tot)[MX][2][2], float (&d)[Jobs<MX, RAW>::kGroupRows][16],
                                         const float (&F)[4][MX], int j) {
  constexpr int G = Jobs<MX, RAW>::kGroupRows, JT = Jobs<MX, RAW>::kJobsPerTile;
  const int q = j / JT, m0 = (j % JT) * G;
#pragma unroll
  for (int i = 0; i < G; ++i)
    if (m0 + i < MX) {
      wgmma_fence_operands(d[i]);
      fold_tile(tot[m0 + i], d[i], F[q][m0 + i]);
    }
}

// wgmma_wait with a count known only after unrolling.
__device__ __forceinline__ void wgmma_wait_upto(int n) {
  if (n >= 3)
    wgmma_wait<3>();
  else if (n == 2)
    wgmma_wait<2>();
  else if (n == 1)
    wgmma_wait<1>();
  else
    wgmma_wait<0>();
}

template <int MX, bool RAW>
__global__ void __launch_bounds__(kWgThreads, kWgMinBlocks<MX, RAW>)
    fp8_wgmma_gemv(const __grid_constant__ CUtensorMap wmap, WgParams p) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  pdl_launch_dependents();
  const int K = p.K, N = p.N, S = p.stages, nst = K / kWgStageCols, nch = K / 32;
  const WgSmem sm = wg_smem(K, MX, S, RAW);
  uint8_t* smem = smem_align1024(smem_raw);
  const uint32_t ring = smem_u32(smem + sm.ring);
  uint8_t* xc = smem + sm.xc;
  int* kxs = reinterpret_cast<int*>(smem + sm.kxs);
  int* flags = reinterpret_cast<int*>(smem + sm.flags);
  const uint32_t bars = smem_u32(smem + sm.bars);  // full[s] at bars + 8 s, empty[s] at bars + 8 (S + s)
  const uint32_t x_ready = bars + 16 * S;
  // warp as a shuffle from lane 0: the compiler then knows it, and the consumer / producer branch on it, to be
  // warp-uniform, and keeps what the stage loops derive from uniform values in uniform registers.
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = __shfl_sync(0xffffffffu, tid >> 5, 0);
  // This block's group, its index among the group's blocks and their count: it takes the group's units bg, bg + bpg,
  // ... (dense: one group, every unit).
  const int grp = static_cast<int>(blockIdx.x) % p.groups, bg = static_cast<int>(blockIdx.x) / p.groups,
            bpg = static_cast<int>(gridDim.x) / p.groups;
  const float* xg = p.x + static_cast<int64_t>(grp) * p.gx;  // the group's slice of x row 0

  // The diagonal tiles' zeros, once (only their diagonals are written later), fenced into the async proxy.
  for (int s = 0; s < S; ++s)
    zero_diagonals(smem + sm.ring + s * sm.slot + kWgStageBytes, MX * wg_diag_bytes(RAW), tid);
  fence_proxy_async();
  if (tid == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(bars + 8 * s, 32);               // every producer lane, after its diagonal bytes (and the TMA's bytes)
      mbar_init(bars + 8 * (S + s), kMmaWarps);  // one arrive per consumer warp
    }
    mbar_init(x_ready, 32 * kMmaWarps);  // every consumer thread, after its x codes
    mbar_init_fence();
    flags[0] = 1, flags[1] = INT_MAX, flags[2] = INT_MIN;
  }
  __syncthreads();  // the last block-wide barrier: the producer warp leaves the consumers' barriers alone below

  if (warp == kMmaWarps) {
    // Stage i of this block: unit grp gunits + bg + (i / nst) bpg, columns 128 (i % nst). The first S boxes go out at
    // once (before the x codes exist); box i >= S waits for the slot's release; each stage's diagonals follow the x
    // codes.
    const uint64_t policy = l2_evict_first();
    const int mine = (p.gunits - bg + bpg - 1) / bpg, total = mine * nst;
    int lu = grp * p.gunits + bg, lst = 0;  // the next box to load
    auto load_next = [&](int slot) {
      if (lane == 0)
        load_stage(bars + 8 * slot, ring + slot * static_cast<uint32_t>(sm.slot), &wmap, lst * kWgStageCols,
                   lu * kWgRows, policy);
      if (++lst == nst) lst = 0, lu += bpg;
    };
    for (int i = 0; i < min(S, total); ++i) load_next(i);
    if (!wait_or_give_up(x_ready, 0, p.hang_ns, kWaitXReady, 0)) return;
    RingPos pos;
    for (int i = 0, st = 0; i < total; ++i) {
      if (i >= S) {
        // The consumers' release of stage i - S.
        if (!wait_or_give_up(bars + 8 * (S + pos.slot), pos.phase ^ 1u, p.hang_ns, kWaitEmpty, i)) return;
        load_next(pos.slot);
      }
      write_diagonals<MX, RAW>(smem + sm.ring + pos.slot * sm.slot + kWgStageBytes, xc, K, st, lane);
      mbar_arrive(bars + 8 * pos.slot);  // each lane releases its own fenced bytes
      if (++st == nst) st = 0;
      pos.next(S);
    }
    return;
  }

  // The consumers: x quantised per tile (a warp per tile, a lane per column) into its codes and kx, and the flags. RAW:
  // x as X 2^kx with X f16-exact per tile (kx = E(amax) - 15, so the largest X is in [2^15, 2^16)), its f16 codes.
  pdl_wait();
#pragma unroll 1
  for (int m = 0; m < MX; ++m) {
    int* km = kxs + m * nch;
    if constexpr (RAW) {
      uint16_t* xm = reinterpret_cast<uint16_t*>(xc) + static_cast<int64_t>(m) * K;
      mma_x_chunks(xg + m * p.ldx, nch, warp, lane, flags, [&](int c, float v) {
        // kx in [-80, 100]: 2^-kx and every product W X 2^(kx - 8) (|W X| >= 2^-33) normal floats.
        const F16Chunk f = f16_chunk(v, -80, 100);
        xm[(c >> 2) * 128 + 4 * lane + (c & 3)] = static_cast<uint16_t>(f.bits);
        if (lane == 0) km[c] = f.kx * (1 << 23);
        return MmaChunk{f.kx, f.ok};
      });
    } else {
      uint8_t* xm = xc + static_cast<int64_t>(m) * K;
      mma_x_chunks(xg + m * p.ldx, nch, warp, lane, flags, [&](int c, float v) {
        const Fp8Tile q = fp8_tile_code(v);
        xm[(c >> 2) * 128 + 4 * lane + (c & 3)] = __nv_cvt_float_to_fp8(q.X, __NV_SATFINITE, __NV_E4M3);
        if (lane == 0) km[c] = q.kx * (1 << 23);
        return MmaChunk{q.kx, fp8_kx_ok(q.kx)};
      });
    }
  }
  mbar_arrive(x_ready);  // this thread's codes are in (the producer writes the diagonals from them)
  consumers_sync();      // codes, kx and flags complete
  const bool x_ok = flags[0] != 0;
  int lo, hi;
  fp8_fast_codes(flags, lo, hi);
  const int g = lane >> 2, r = lane & 3;

  RingPos pos;   // of the next stage
  int seen = 0;  // stages waited for (a bounded wait's record)
  int swz[8];    // RAW: the lane's swizzled piece offsets (raw_a_fragments)
#pragma unroll
  for (int c = 0; c < 8; ++c) swz[c] = (c ^ g) << 4;
  for (int ul = bg; ul < p.gunits; ul += bpg) {
    const int u = grp * p.gunits + ul;
    // The unit's two row blocks of scale codes (rows 64u .. 64u + 63), a word (a stage's 4 tiles) per lane and stage:
    // lane holds stages lane and lane + 32. A row block past N (the last unit of a ragged N) is not read.
    uint32_t cw[2][2];
    bool fast = x_ok && lo <= hi;
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const int rb = 2 * u + b;
      const bool real = rb * 32 < N;
      const unsigned int* srow = reinterpret_cast<const unsigned int*>(p.sc + static_cast<int64_t>(rb) * p.lds);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int st = lane + 32 * hh;
        cw[b][hh] = real && st < nst ? __ldg(srow + st) : 0x7f7f7f7fu;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int v = static_cast<int>((cw[b][hh] >> (8 * q)) & 0xffu);
          fast = fast && (!real || st >= nst || (v >= lo && v <= hi));
        }
      }
    }
    fast = __all_sync(0xffffffffu, fast);  // the same in the four warps: the same codes and flags
    const int rb_w = warp >> 1;            // this warp's row block in the unit

    // Stage st's 2^(e + kx - 127) per tile and x row.
    auto stage_scales = [&](int st, float(&F)[4][MX]) {
      const uint32_t mine = rb_w == 0 ? (st < 32 ? cw[0][0] : cw[0][1]) : (st < 32 ? cw[1][0] : cw[1][1]);
      const uint32_t cwd = __shfl_sync(0xffffffffu, mine, st & 31);
#pragma unroll
      for (int m = 0; m < MX; ++m) {
        const int4 kx4 = *reinterpret_cast<const int4*>(kxs + m * nch + 4 * st);
        const int kxq[4] = {kx4.x, kx4.y, kx4.z, kx4.w};
#pragma unroll
        for (int q = 0; q < 4; ++q)
          F[q][m] = __int_as_float(static_cast<int>((cwd >> (8 * q)) & 0xffu) * (1 << 23) + kxq[q]);
      }
    };
    if (fast && MX == 1 && p.pipe != 0 && nst % 2 == 0) {
      if constexpr (MX == 1) {
        // One x row: the stage loop pipelined two deep. A stage's 4 MMAs are one commit group, issued into one of two
        // accumulator sets before the previous stage is folded, so that the fold, the barrier traffic and the next
        // stage's descriptors overlap the tensor core's work instead of following it. The loop is unrolled by two so
        // that each set keeps its registers.
        float tot[MX][2][2] = {};
        float da[4][1][16], db[4][1][16];
        // Slot 0's descriptors of tile 0 (A: the weights' box; B: the diagonal tile, or RAW's first f16 one).
        const uint64_t a0 = wgmma_desc_sw128(ring), b0 = diag_desc(ring + kWgStageBytes);
        auto issue_stage = [&](float(&d)[4][1][16], const RingPos& at) {
          const uint32_t slot_off = at.slot * static_cast<uint32_t>(sm.slot);
          wgmma_fence();
          if constexpr (RAW) {
            const uint8_t* raw_row0 = smem + sm.ring + slot_off + (16 * warp + g) * 128 + 2 * r;
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              uint32_t a[2][4];
              raw_a_fragments(a, raw_row0, swz, q);
              wgmma_fence();  // the A registers just written
              const uint32_t b = slot_off + 2 * q * kDiagTileBytes;
              wgmma_m64n32k16_f16_rs_first(d[q][0], a[0], desc_plus(b0, b));
              wgmma_m64n32k16_f16_rs_acc(d[q][0], a[1], desc_plus(b0, b + kDiagTileBytes));
            }
          } else {
#pragma unroll
            for (int q = 0; q < 4; ++q)
              wgmma_m64n32k32_e4m3_ss(d[q][0], desc_plus(a0, slot_off + 32 * q),
                                      desc_plus(b0, slot_off + q * kDiagTileBytes));
          }
          wgmma_commit();
        };
        auto fold_stage = [&](float(&d)[4][1][16], int st, const RingPos& at) {
          float F[4][MX];
          stage_scales(st, F);
#pragma unroll
          for (int q = 0; q < 4; ++q) fold_job<MX, RAW>(tot, d[q], F, q);
          __syncwarp();
          if (lane == 0) mbar_arrive(bars + 8 * (S + at.slot));  // the slot's MMAs are done: the producer may refill it
        };
        // Waits for stage `at`'s bytes and issues its MMAs into d; false when a bounded wait gave up.
        auto next_stage = [&](float(&d)[4][1][16], const RingPos& at) {
          if (!wait_or_give_up(bars + 8 * at.slot, at.phase, p.hang_ns, kWaitFull, seen++)) {
            wgmma_wait<0>();
            return false;
          }
          issue_stage(d, at);
          return true;
        };
        // Stage st + 1's MMAs are issued before stage st (complete) is folded, and all are complete again before the
        // next issue: stage pairs (2i, 2i + 1) alternate the sets, da holding 2i when a pair starts. Nothing is in
        // flight at a branch or across the loop's back edge, and a set is read only after the wait that retired it:
        // otherwise ptxas serialises the MMAs (C7514, C7518).
        RingPos pa = pos, pb;
        if (!next_stage(da, pa)) return;
        pos.next(S);
        wgmma_wait<0>();
#pragma unroll 1
        for (int i = 0; i < nst / 2 - 1; ++i) {
          pb = pos;
          if (!next_stage(db, pb)) return;
          pos.next(S);
          fold_stage(da, 2 * i, pa);
          wgmma_wait<0>();
          pa = pos;
          if (!next_stage(da, pa)) return;
          pos.next(S);
          fold_stage(db, 2 * i + 1, pb);
          wgmma_wait<0>();
        }
        pb = pos;
        if (!next_stage(db, pb)) return;
        pos.next(S);
        fold_stage(da, nst - 2, pa);
        wgmma_wait<0>();
        fold_stage(db, nst - 1, pb);
#pragma unroll
        for (int m = 0; m < MX; ++m) store_lane_rows(p, m, u * kWgRows + 16 * warp + g, r, tot[m]);
      }
    } else if (fast) {
      float tot[MX][2][2];  // [x row][h][e]: row 16 warp + g + 8h, chain 2r + e
#pragma unroll
      for (int m = 0; m < MX; ++m) tot[m][0][0] = tot[m][0][1] = tot[m][1][0] = tot[m][1][1] = 0.0f;
#pragma unroll 1
      for (int st = 0; st < nst; ++st) {
        // A stage's MMAs are issued and folded within the iteration: accumulators in flight across the loop's back
        // edge make ptxas serialise every MMA (C7514; bench/RESULTS.md, thirty-fourth session).
        float F[4][MX];
        stage_scales(st, F);
        const uint32_t slot_addr = ring + pos.slot * static_cast<uint32_t>(sm.slot);
        const uint8_t* raw_row0 = smem + sm.ring + pos.slot * sm.slot + (16 * warp + g) * 128 + 2 * r;  // RAW's A
        if (!wait_or_give_up(bars + 8 * pos.slot, pos.phase, p.hang_ns, kWaitFull, seen++)) return;
        // ptxas gives every MMA between two full drains registers of its own, so 3-4 x rows drain after each half.
        constexpr int J = Jobs<MX, RAW>::kJobs, D = Jobs<MX, RAW>::kDepth, H = MX >= 3 ? 2 : 1, JH = J / H;
#pragma unroll
        for (int half = 0; half < H; ++half) {
          float d[JH][Jobs<MX, RAW>::kGroupRows][16];
          wgmma_fence();
#pragma unroll
          for (int jj = 0; jj < JH; ++jj) {
            issue_job<MX, RAW>(d[jj], slot_addr, half * JH + jj, false, raw_row0, swz);
            if (jj >= D - 1) {
              wgmma_wait<D - 1>();
              fold_job<MX, RAW>(tot, d[jj - D + 1], F, half * JH + jj - D + 1);
            }
          }
#pragma unroll
          for (int jj = JH - D + 1; jj < JH; ++jj) {
            wgmma_wait_upto(JH - 1 - jj);
            fold_job<MX, RAW>(tot, d[jj], F, half * JH + jj);
          }
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(bars + 8 * (S + pos.slot));  // the slot's MMAs are done: the producer may refill it
        pos.next(S);
      }
#pragma unroll
      for (int m = 0; m < MX; ++m) store_lane_rows(p, m, u * kWgRows + 16 * warp + g, r, tot[m]);
    } else {
      // The scalar path: (x row, 16-row group) pieces over the warps; then the unit's stages are released unread.
      for (int piece = warp; piece < 4 * MX; piece += kMmaWarps) {
        const int m = piece >> 2, base = u * kWgRows + 16 * (piece & 3);
        if (base >= N) continue;  // warp-uniform
        const uint8_t* b0p = p.w + static_cast<int64_t>(min(base + g, N - 1)) * p.ldw;
        const uint8_t* b1p = p.w + static_cast<int64_t>(min(base + g + 8, N - 1)) * p.ldw;
        float tot2[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
        if (lane == 0) atomicAdd(&g_wg_slow_warps, 1ull);
        slow_rows(xg + m * p.ldx, b0p, b1p, p.sc + static_cast<int64_t>(base / 32) * p.lds, nch, lane, r, tot2, !RAW);
        store_lane_rows(p, m, base + g, r, tot2);
      }
#pragma unroll 1
      for (int st = 0; st < nst; ++st) {
        if (!wait_or_give_up(bars + 8 * pos.slot, pos.phase, p.hang_ns, kWaitFull, seen++)) return;
        __syncwarp();
        if (lane == 0) mbar_arrive(bars + 8 * (S + pos.slot));
        pos.next(S);
      }
    }
  }
}

// The layout probe (gemv_fp8_wgmma_probe): one stage of the kernel's path for one x row, the TMA load of a [64, 128]
// weight tile, the diagonal tiles of x's codes and the 4 MMAs (RAW: x's f16 codes, the A fragments built from the raw
// box and 8 f16 MMAs), each tile's D written out whole: out[(q * 64 + row) * 32 + column].
template <bool RAW>
__global__ void __launch_bounds__(kWgThreads)
    fp8_wgmma_probe(const __grid_constant__ CUtensorMap wmap, const uint8_t* x_codes, float* out, bool diag_swap,
                    uint64_t hang_ns) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* slot = smem_align1024(smem_raw);  // 8 KB of weights, the diagonals, the codes
  uint8_t* xc = slot + kWgStageBytes + wg_diag_bytes(RAW);
  const int code_bytes = RAW ? 2 : 1;
  const uint32_t bar = smem_u32(xc + code_bytes * kWgStageCols);
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5, g = lane >> 2, r = lane & 3;
  zero_diagonals(slot + kWgStageBytes, wg_diag_bytes(RAW), tid);
  if (tid < kWgStageCols) {  // tile tid / 32, element tid % 32, as the kernel lays x's codes out
    const int at = 4 * (tid & 31) + (tid >> 5);
    if constexpr (RAW)
      reinterpret_cast<uint16_t*>(xc)[at] = reinterpret_cast<const uint16_t*>(x_codes)[tid];
    else
      xc[at] = x_codes[tid];
  }
  fence_proxy_async();  // the zeros, for wgmma's reads
  if (tid == 0) {
    mbar_init(bar, 32);  // the producer warp's lanes
    mbar_init_fence();
  }
  __syncthreads();
  if (warp == kMmaWarps) {
    if (lane == 0) load_stage(bar, smem_u32(slot), &wmap, 0, 0, l2_evict_first());
    write_diagonals<1, RAW>(slot + kWgStageBytes, xc, kWgStageCols, 0, lane);
    mbar_arrive(bar);
    return;
  }
  if (!wait_or_give_up(bar, 0, hang_ns, kWaitFull, 0)) return;
  int swz[8];
#pragma unroll
  for (int c = 0; c < 8; ++c) swz[c] = (c ^ g) << 4;
  float d[4][1][16];
  wgmma_fence();
#pragma unroll
  for (int q = 0; q < 4; ++q)
    issue_job<1, RAW>(d[q], smem_u32(slot), q, diag_swap, slot + (16 * warp + g) * 128 + 2 * r, swz);
  wgmma_wait<0>();
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    wgmma_fence_operands(d[q][0]);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int row = 16 * warp + g + 8 * ((i >> 1) & 1), col = 8 * (i >> 2) + 2 * r + (i & 1);
      out[(q * 64 + row) * 32 + col] = d[q][0][i];
    }
  }
}

// The bound of the barrier waits of the launches from now on (gemv_fp8_wgmma_set_hang_ns).
std::atomic<uint64_t> g_hang_ns{0};

}  // namespace

void gemv_fp8_wgmma_set_hang_ns(uint64_t ns) { g_hang_ns.store(ns, std::memory_order_relaxed); }

std::string gemv_fp8_wgmma_hang() {
  const auto code = static_cast<unsigned long long>(mma_read_counter(&g_wg_hang, true));
  if (code == 0) return std::string();
  const unsigned long long c = code - 1;
  static const char* const kOn[] = {"full", "empty", "x_ready", "?"};
  return fmt::format("block {} warp {} waited past the bound on a {} barrier (stage {})", c >> 32, (c >> 24) & 0xff,
                     kOn[std::min<unsigned long long>((c >> 20) & 0xf, 3)], c & 0xfffff);
}

void gemv_fp8_wgmma_probe(const uint8_t* w, const uint8_t* x_codes, float* out, cudaStream_t stream, bool diag_swap,
                          bool raw) {
  const CUtensorMap map = tensor_map_u8_sw128(w, kWgRows, kWgStageCols, kWgStageCols, kWgRows, kWgStageCols);
  const int smem = kWgStageBytes + wg_diag_bytes(raw) + (raw ? 2 : 1) * kWgStageCols + 8 + 1024;
  cudaStream_t st = stream != nullptr ? stream : current_stream();
  const uint64_t hang = g_hang_ns.load(std::memory_order_relaxed);
  if (raw)
    fp8_wgmma_probe<true><<<1, kWgThreads, smem, st>>>(map, x_codes, out, diag_swap, hang);
  else
    fp8_wgmma_probe<false><<<1, kWgThreads, smem, st>>>(map, x_codes, out, diag_swap, hang);
  DI_CUDA_CHECK(cudaGetLastError());
}

bool gemv_fp8_wgmma_supported(const GemvArgs& a) {
  if (a.fmt != 0 || !gemv_supported(a) || a.M < 1 || a.M > kWgMaxXRows || a.N <= 0 || a.row_expert != nullptr)
    return false;
  if (a.B != 32 || (a.act_quant_block != 32 && a.act_quant_block != 0) || a.K % kWgStageCols != 0 || a.K > kWgMaxK ||
      a.lds % 4 != 0)
    return false;
  if (a.act_quant_block == 0 && a.M > kWgMaxRawRows) return false;
  return reinterpret_cast<uintptr_t>(a.scale) % 4 == 0;
}

bool gemv_fp8_wgmma_groups_supported(const GemvArgs& a, int groups) {
  if (groups < 1 || !gemv_fp8_wgmma_supported(a)) return false;
  return groups == 1 || (a.N % (kWgRows * groups) == 0 && a.ldx >= int64_t{groups} * a.K);
}

int64_t gemv_fp8_wgmma_slow_warps(bool reset) { return mma_read_counter(&g_wg_slow_warps, reset); }

namespace {

template <int MX, bool RAW>
void launch_wgmma(const GemvArgs& a, int groups, cudaStream_t stream) {
  WgParams p = {};
  copy_gemv_args(a, p);
  p.units = (a.N + kWgRows - 1) / kWgRows;
  p.groups = groups;
  p.gunits = p.units / groups;  // groups > 1: N % (64 groups) == 0 (gemv_fp8_wgmma_groups_supported)
  p.gx = groups > 1 ? a.K : 0;
  p.hang_ns = g_hang_ns.load(std::memory_order_relaxed);
  static const int64_t pipe_mode = env_int("DEEPINFER_CUDA_WGMMA_PIPE", 0);  // 1: both, 2: the pipeline alone, 0: none
  p.pipe = pipe_mode != 0 ? 1 : 0;
  // As many ring slots as the blocks' share of an SM leaves beside x's codes (at least 2, at most kWgMaxStages).
  const bool pair = kWgMinBlocks<MX, RAW> == 2 && p.units > sm_count() && pipe_mode == 1;
  const int64_t budget = pair ? kWgPairSmemBudget : kWgBlockSmemBudget;
  const WgSmem none = wg_smem(a.K, MX, 0, RAW);
  p.stages = static_cast<int>(std::clamp<int64_t>((budget - none.total) / (none.slot + 16), 2, kWgMaxStages));
  const int64_t smem = wg_smem(a.K, MX, p.stages, RAW).total;
  const CUtensorMap map = tensor_map_u8_sw128(a.w, a.N, a.K, a.ldw, kWgRows, kWgStageCols);
  const int64_t resident = static_cast<int64_t>(gemv_blocks_per_sm(
                               reinterpret_cast<const void*>(fp8_wgmma_gemv<MX, RAW>), kWgThreads, smem)) *
                           sm_count();
  // Every group the same number of blocks (at least one), each block within one group.
  const int64_t grid = groups * std::clamp<int64_t>(resident / groups, 1, p.gunits);
  launch_pdl(fp8_wgmma_gemv<MX, RAW>, dim3(static_cast<unsigned>(grid)), kWgThreads, smem, stream, map, p);
}

}  // namespace

void gemv_fp8_wgmma_groups_into(const GemvArgs& a, int groups, cudaStream_t stream) {
  DI_CHECK(gemv_fp8_wgmma_groups_supported(a, groups),
           "cuda::gemv: fp8_wgmma_gemv does not take this call (N {}, K {}, M {}, B {}, {} groups)", a.N, a.K, a.M, a.B,
           groups);
  // One instance per x-row count and x kind (act quant 32: E4M3 x codes; raw x: f16 codes, A built in registers).
  const bool raw = a.act_quant_block == 0;
  switch (a.M) {
    case 1:
      raw ? launch_wgmma<1, true>(a, groups, stream) : launch_wgmma<1, false>(a, groups, stream);
      break;
    case 2:
      raw ? launch_wgmma<2, true>(a, groups, stream) : launch_wgmma<2, false>(a, groups, stream);
      break;
    case 3:
      raw ? launch_wgmma<3, true>(a, groups, stream) : launch_wgmma<3, false>(a, groups, stream);
      break;
    default:
      launch_wgmma<4, false>(a, groups, stream);  // raw x: at most 3 rows (gemv_fp8_wgmma_supported)
      break;
  }
}

void gemv_fp8_wgmma_into(const GemvArgs& a, cudaStream_t stream) { gemv_fp8_wgmma_groups_into(a, 1, stream); }

}  // namespace deepinfer::cuda
