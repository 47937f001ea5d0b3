// linear_tc's one-row paths: dense E4M3 weights with 32 x 32 tiles at one row of x (V4.1's dense linears at decode
// batch 1) and one token's routed FP4 experts (grouped rows), the tensor-core contract's numbers (linear_tc.cuh) bit
// for bit, the weight streamed through shared memory by a producer warp instead of per-warp load rings.
//
// Why a third kernel: linear_tc_gemv.cu's warps each keep a ring of 3 items in registers, quantise all of x in every
// block (one block per 16-row unit on wide-K weights) and add a unit's stage totals in one thread per row at the end;
// at one row of x that left it latency-bound (wo_b [5120, 8192]: 20.6 us, 46% of the read ceiling on the H200, ncu:
// 0.57 eligible warps per scheduler, DRAM 32% busy). The contract's arithmetic is cheap (two MMAs and a fold per 32
// columns and 16 rows), so here a producer keeps the bytes in flight:
//   - Work: each matrix as chunks of 64 rows x 128 bytes (E4M3: one 128-column stage; FP4: two), 8 KB each, in
//     (matrix, row group, K) order; a persistent grid (two blocks per SM) gives each block a contiguous run of chunks,
//     so the SMs get equal shares whatever N.
//   - A producer warp streams the block's chunks into a ring of 8 slots with the 128-byte swizzle: E4M3 by the TMA,
//     from launch (the weight does not depend on the previous kernel: 64 KB per block in flight under its tail); FP4
//     by 16-byte cp.asyncs once the experts are known (griddepcontrol.wait; the experts are separate tensors).
//   - 8 consumer warps: warp w takes unit w % 4 (16 rows) of the block's chunks of parity w / 4. Per 32-column k step
//     a lane loads its codes of rows g and g + 8 (conflict-free under the swizzle: 8 bytes each for E4M3, a word of 8
//     nibbles for FP4, widened to E4M3 as the GEMM kernel does) and x's FP16 values of token 0 (zeros in lanes of
//     tokens 1..7), and issues tc_mma.cuh's kstep; each k step is its own fold block (tot += P * (sw * sx)), as the
//     decode GEMV's kScale32 / kFp4 modes.
//   - A stage's totals go to a per-call table T [M, S, N] in global memory; once a block has written its chunks' totals
//     it counts them on its (matrix, row group)s' arrival counters, and the block whose count completes a group adds
//     that group's S totals in stage order ((0 + T_0) + T_1 ...) and resets the counter, so the counters are zero
//     between calls (they come from a pool zeroed once, a slice per call site: calls of one site must not overlap).
//   - x is quantised per block (after griddepcontrol.wait) only for the rows and stages its chunks touch, as the
//     decode GEMV's pass does (codes as FP16, a scale per 32 columns).
// Measured (H100, bench_cuda_gemv BENCH_TC_ONE_ROW=1 and its grouped FP4 table; bench/RESULTS.md, fifty-seventh
// session): 63-68% of the read ceiling on the large E4M3 shapes (wo_b 21.6 us against the decode GEMV's 23.0, wq_b 20.6
// against 23.1), not the ~85% a plain read of the same bytes reaches. Not profiled yet; the likely limit is the
// consumers' ~204 SASS instructions per warp and chunk (F2FP 32, LDS 16, HMMA 8, the rest addressing, scale decode and
// the barrier waits) at 16 consumer warps an SM. Small weights (2-6 chunks a block) lose to the decode GEMV, hence
// mode 1's size rule below. One token's experts: w2 31.6 us against 36.4, w1 + w3 58.8 against 59.5 (the exact
// fp4_mma_gemv: 21.4 and 39.3); their loop is 666 instructions per warp and chunk (4,096 weights: 5.2 a weight and
// lane, against fp4_mma_gemv's 3.3), most of it the E2M1 -> E4M3 widening (LOP3 123, PRMT 64) and addressing (IMAD
// 123).
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <tuple>

#include "core/env.h"
#include "cuda/common.cuh"
#include "cuda/device.h"
#include "cuda/fp_decode.cuh"
#include "cuda/hopper.cuh"
#include "cuda/linear_tc_gemv.cuh"
#include "cuda/tc_mma.cuh"

namespace deepinfer::cuda {

namespace {

constexpr int kRows = 64;                 // rows per chunk (a TMA box): 4 units of 16
constexpr int kCols = 128;                // columns per E4M3 chunk: one stage of the contract
constexpr int kChunkBytes = kRows * 128;  // a chunk: 64 rows of 128 bytes (E4M3: one stage; FP4: two)
constexpr int kRing = 8;                  // ring slots per block
constexpr int kConsumers = 8;             // consumer warps
constexpr int kThreads = 32 * (kConsumers + 1);
constexpr int kMaxGroups = 64;  // row groups one block may finish (bounded by the takes)
constexpr int kMaxK = 16384;
constexpr int kMaxXRows = 4;  // FP4 grouped: the matrices (so x rows) one block's chunks may touch
constexpr uint32_t kPoolCounters = 1u << 20;

// Shared memory (after aligning to 1,024 bytes for the swizzle): the ring, X rows of x as FP16 values [K] and then 16
// zero bytes, their scales [K / 32], the full / empty barriers, the list of row groups this block finishes.
struct Smem {
  int ring, xh, sx, bars, list, total;
};
__host__ __device__ inline Smem smem_layout(int K, int X) {
  Smem s{};
  s.ring = 0;
  s.xh = kRing * kChunkBytes;
  s.sx = s.xh + X * 2 * K + 16;
  s.bars = (s.sx + X * (K / 32) * 4 + 7) / 8 * 8;
  s.list = s.bars + 2 * kRing * 8;
  s.total = s.list + (kMaxGroups + 1) * 4 + 1024;  // + the alignment slack
  return s;
}

// A call: M matrices (1 for a dense call; lists x x_rows for a grouped FP4 call, matrix m = list m / x_rows of row m %
// x_rows's expert) of [N, K], each weight chunked as (row group of 64, CPG chunks along K: S stages of 128 columns).
struct StreamArgs {
  const uint8_t* sc;  // dense E4M3: E8M0 tile scales [ceil(N / 32), K / 32], row stride lds (4-byte aligned rows)
  int64_t lds;
  int N, K, S, act, M, RG, CPG;
  const float* x;  // [x_rows, K], row stride ldx
  int64_t ldx;
  float* y;       // [M, N]
  float* T;       // [M, S, N] stage totals (the call's scratch)
  uint32_t* cnt;  // [M RG] arrival counters, zero between calls
  bool round;
  // Grouped FP4 (the expert tables, as linear_tc_gemv's grouped mode)
  const int32_t* row_expert;
  const uint8_t* const* w_table;
  const uint8_t* const* s_table;
  int x_rows, n_experts;
  int64_t ldw;
};

__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;" ::"n"(32 * kConsumers) : "memory"); }

// After a block's chunks: its stage totals are in T. Counts them on the (matrix, row group)s they belong to (group q =
// chunk / CPG: matrix q / RG, row group q % RG); the block whose count completes a group adds that group's S totals of
// each row in stage order ((0 + T_0) + T_1 ...: the contract's sum), writes y and zeroes the counter for the next call.
__device__ __forceinline__ void finish(const StreamArgs& p, int64_t c0, int64_t c1, int* list, int tid) {
  __threadfence();
  consumers_sync();
  const int q0 = static_cast<int>(c0 / p.CPG), groups = c1 > c0 ? static_cast<int>((c1 - 1) / p.CPG) - q0 + 1 : 0;
  if (tid == 0) list[kMaxGroups] = 0;
  consumers_sync();
  if (tid < groups) {
    const int q = q0 + tid;
    const int64_t lo = max(c0, static_cast<int64_t>(q) * p.CPG), hi = min(c1, static_cast<int64_t>(q + 1) * p.CPG);
    const uint32_t mine = static_cast<uint32_t>(hi - lo);
    if (atomicAdd(p.cnt + q, mine) + mine == static_cast<uint32_t>(p.CPG)) {
      p.cnt[q] = 0u;  // every other block has counted: zero for the next call
      list[atomicAdd(list + kMaxGroups, 1)] = q;
    }
  }
  consumers_sync();
  const int done = list[kMaxGroups];
  if (done == 0) return;
  __threadfence();
  const int N = p.N, S = p.S;
  for (int e = tid; e < done * kRows; e += 32 * kConsumers) {
    const int q = list[e / kRows], m = q / p.RG, row = (q % p.RG) * kRows + e % kRows;
    if (row >= N) continue;
    const float* Tr = p.T + static_cast<int64_t>(m) * S * N + row;
    float run = 0.0f;
    int s = 0;
    for (; s + 8 <= S; s += 8) {
      float v[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = __ldcg(Tr + static_cast<int64_t>(s + k) * N);
#pragma unroll
      for (int k = 0; k < 8; ++k) run = __fadd_rn(run, v[k]);
    }
    for (; s < S; ++s) run = __fadd_rn(run, __ldcg(Tr + static_cast<int64_t>(s) * N));
    p.y[static_cast<int64_t>(m) * N + row] = p.round ? round_to_bf16(run) : run;
  }
}

__device__ __forceinline__ void init_bars(uint32_t bars, uint32_t full_count, int tid) {
  if (tid == 0) {
    for (int i = 0; i < kRing; ++i) {
      mbar_init(bars + 8 * i, full_count);
      mbar_init(bars + 8 * (kRing + i), 4);  // the 4 unit warps of a chunk
    }
    mbar_init_fence();
  }
  __syncthreads();
}

// ---- dense E4M3, 32 x 32 tiles, one row of x ---------------------------------------------------------------------
__global__ void __launch_bounds__(kThreads, 2)
    tc_stream_kernel(const __grid_constant__ CUtensorMap wmap, StreamArgs p) {
  pdl_launch_dependents();
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = smem_align1024(smem_raw);
  const int K = p.K, N = p.N, S = p.S;
  const Smem L = smem_layout(K, 1);
  const uint32_t ring = smem_u32(smem + L.ring);
  const uint32_t bars = smem_u32(smem + L.bars);  // full[i] at bars + 8 i, empty[i] at bars + 8 (kRing + i)
  const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  const int64_t C = static_cast<int64_t>(p.RG) * S;
  const int64_t c0 = C * blockIdx.x / gridDim.x, c1 = C * (blockIdx.x + 1) / gridDim.x;
  const int n = static_cast<int>(c1 - c0);
  init_bars(bars, 1, tid);

  if (warp == kConsumers) {  // the producer
    if (lane == 0) {
      const uint64_t pol = l2_evict_first();
      for (int i = 0; i < n; ++i) {
        const int slot = i % kRing;
        if (i >= kRing) mbar_wait(bars + 8 * (kRing + slot), static_cast<uint32_t>((i / kRing - 1) & 1));
        const int64_t c = c0 + i;
        mbar_expect_tx(bars + 8 * slot, kChunkBytes);
        tma_load_2d(ring + slot * kChunkBytes, &wmap, bars + 8 * slot, static_cast<int>(c % S) * kCols,
                    static_cast<int>(c / S) * kRows, pol);
        mbar_arrive(bars + 8 * slot);  // the phase completes once the box's bytes have landed too
      }
    }
    return;
  }

  // The consumers. x's FP8 input site for the stages this block's chunks touch (all of them once the run spans S).
  pdl_wait();
  uint8_t* xh = smem + L.xh;
  float* sx = reinterpret_cast<float*>(smem + L.sx);
  tc::x_pass_row<32 * kConsumers, true>(p.x, K, p.act, S, static_cast<int>(c0 % S), min(n, S), xh, sx, 1, tid);
  if (tid < 4) reinterpret_cast<uint32_t*>(xh + 2 * K)[tid] = 0u;  // the zero block of tokens 1..7
  consumers_sync();

  const int g = lane >> 2, t = lane & 3, u = warp & 3;
  // Token g's FP16 values of column k at xb + 2 k (tokens 1..7: the zero block, whatever k).
  const uint8_t* xb = g == 0 ? xh + 16 * t : xh + 2 * K;
  const int xstep = g == 0 ? 2 : 0;
  int swz[4];  // the lane's byte offset of k step j in a 128-byte row: piece 2 j + t / 2 swizzled by the row (g), + 8
               // (t & 1)
#pragma unroll
  for (int j = 0; j < 4; ++j) swz[j] = (((2 * j + (t >> 1)) ^ g) << 4) + 8 * (t & 1);
  for (int i = warp >> 2; i < n; i += 2) {
    const int slot = i % kRing;
    const int64_t c = c0 + i;
    const int s = static_cast<int>(c % S), rg = static_cast<int>(c / S);
    const int n0 = rg * kRows + 16 * u;
    const uint32_t scw =
        __ldg(reinterpret_cast<const uint32_t*>(p.sc + static_cast<int64_t>(min(n0, N - 1) / 32) * p.lds + 4 * s));
    mbar_wait(bars + 8 * slot, static_cast<uint32_t>((i / kRing) & 1));
    const uint8_t* rowp = smem + L.ring + slot * kChunkBytes + (16 * u + g) * 128;
    float tot0 = 0.0f, tot2 = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint2 r0 = *reinterpret_cast<const uint2*>(rowp + swz[j]);
      const uint2 r1 = *reinterpret_cast<const uint2*>(rowp + 8 * 128 + swz[j]);
      const uint4 xv = *reinterpret_cast<const uint4*>(xb + (s * kCols + 32 * j) * xstep);
      const uint32_t b0[2] = {xv.x, xv.y}, b1[2] = {xv.z, xv.w};
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      tc::kstep(acc, r0.x, r0.y, r1.x, r1.y, b0, b1);
      const float f = __fmul_rn(e8m0_f32((scw >> (8 * j)) & 0xffu), sx[s * 4 + j]);
      tot0 = __fmaf_rn(acc[0], f, tot0);
      tot2 = __fmaf_rn(acc[2], f, tot2);
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(bars + 8 * (kRing + slot));
    if (t == 0) {  // token 0's totals of rows g and g + 8
      float* Ts = p.T + static_cast<int64_t>(s) * N;
      if (n0 + g < N) Ts[n0 + g] = tot0;
      if (n0 + g + 8 < N) Ts[n0 + g + 8] = tot2;
    }
  }
  finish(p, c0, c1, reinterpret_cast<int*>(smem + L.list), tid);
}

// ---- grouped packed FP4 (the routed experts of one token): a matrix per row of y, its expert read on the device -----
// A chunk is 64 rows x 256 columns (two stages, 128 bytes a row), copied by the producer warp's 16-byte cp.asyncs into
// the slot with the 128-byte swizzle (piece c of row r at r 128 + (c ^ r % 8) 16); lane (g, t) then reads k step j's
// 8 codes of row g as the word at piece j (swizzled), byte 4 t: one conflict-free 4-byte load per row and k step.
__device__ __forceinline__ const uint8_t* expert_ptr(const uint8_t* const* table, const StreamArgs& p, int m) {
  const int e = __ldcg(p.row_expert + m % p.x_rows) + m / p.x_rows * p.n_experts;
  return reinterpret_cast<const uint8_t*>(__ldcg(reinterpret_cast<const unsigned long long*>(table + e)));
}

__global__ void __launch_bounds__(kThreads, 2) tc_stream_fp4_kernel(StreamArgs p) {
  pdl_launch_dependents();
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = smem_align1024(smem_raw);
  const int K = p.K, N = p.N, S = p.S, P = p.CPG;
  const Smem L = smem_layout(K, kMaxXRows);
  const uint32_t bars = smem_u32(smem + L.bars);
  const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  const int64_t per_m = static_cast<int64_t>(p.RG) * P, C = per_m * p.M;
  const int64_t c0 = C * blockIdx.x / gridDim.x, c1 = C * (blockIdx.x + 1) / gridDim.x;
  const int n = static_cast<int>(c1 - c0);
  const int mf = static_cast<int>(c0 / per_m);  // the block's first matrix
  init_bars(bars, 32, tid);                     // full: every producer lane's cp.asyncs

  if (warp == kConsumers) {  // the producer (the experts come from the previous kernel)
    pdl_wait();
    int m_have = -1;
    const uint8_t* w = nullptr;
    for (int i = 0; i < n; ++i) {
      const int slot = i % kRing;
      if (i >= kRing) mbar_wait(bars + 8 * (kRing + slot), static_cast<uint32_t>((i / kRing - 1) & 1));
      const int64_t c = c0 + i;
      const int m = static_cast<int>(c / per_m), rem = static_cast<int>(c % per_m), rg = rem / P, sp = rem % P;
      if (m != m_have) w = expert_ptr(p.w_table, p, m), m_have = m;
      uint8_t* dst = smem + L.ring + slot * kChunkBytes;
#pragma unroll
      for (int k = 0; k < 16; ++k) {
        const int piece = lane + 32 * k, r = piece >> 3, pc = piece & 7, row = rg * kRows + r;
        if (row < N)
          cp_async16(dst + r * 128 + ((pc ^ (r & 7)) << 4), w + static_cast<int64_t>(row) * p.ldw + sp * 128 + pc * 16);
      }
      asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bars + 8 * slot) : "memory");
    }
    cp_async_wait_all();
    return;
  }

  pdl_wait();
  // x's rows of the block's matrices (slot j: matrix mf + j), each for the stages its chunks there touch.
  const int ml = n > 0 ? static_cast<int>((c1 - 1) / per_m) : mf;
  for (int j = 0; j <= ml - mf; ++j) {
    const int m = mf + j;
    const int64_t lo = max(c0, static_cast<int64_t>(m) * per_m), hi = min(c1, static_cast<int64_t>(m + 1) * per_m);
    const int cnt = static_cast<int>(hi - lo), sp0 = static_cast<int>(lo % P);
    tc::x_pass_row<32 * kConsumers, true>(p.x + static_cast<int64_t>(m % p.x_rows) * p.ldx, K, p.act, S, 2 * sp0,
                                          min(2 * cnt, S), smem + L.xh + j * 2 * K,
                                          reinterpret_cast<float*>(smem + L.sx) + j * (K / 32), 1, tid);
  }
  if (tid < 4) reinterpret_cast<uint32_t*>(smem + L.xh + kMaxXRows * 2 * K)[tid] = 0u;  // the zero block
  consumers_sync();

  const int g = lane >> 2, t = lane & 3, u = warp & 3;
  int swz[8];  // k step j's word of the lane in a 128-byte row: piece j swizzled by the row (g), byte 4 t
#pragma unroll
  for (int j = 0; j < 8; ++j) swz[j] = ((j ^ g) << 4) + 4 * t;
  int m_have = -1;
  const uint8_t* sc = nullptr;
  for (int i = warp >> 2; i < n; i += 2) {
    const int slot = i % kRing;
    const int64_t c = c0 + i;
    const int m = static_cast<int>(c / per_m), rem = static_cast<int>(c % per_m), rg = rem / P, sp = rem % P;
    if (m != m_have) sc = expert_ptr(p.s_table, p, m), m_have = m;
    const int n0 = rg * kRows + 16 * u;
    // Rows g and g + 8's scale codes of the chunk's two stages (a word of 4 codes per stage).
    const uint8_t* s0p = sc + static_cast<int64_t>(min(n0 + g, N - 1)) * p.lds + 8 * sp;
    const uint8_t* s1p = sc + static_cast<int64_t>(min(n0 + g + 8, N - 1)) * p.lds + 8 * sp;
    const uint32_t sw[2][2] = {
        {__ldg(reinterpret_cast<const uint32_t*>(s0p)), __ldg(reinterpret_cast<const uint32_t*>(s1p))},
        {__ldg(reinterpret_cast<const uint32_t*>(s0p + 4)), __ldg(reinterpret_cast<const uint32_t*>(s1p + 4))}};
    const int xj = m - mf;
    const uint8_t* xb = g == 0 ? smem + L.xh + xj * 2 * K + 16 * t : smem + L.xh + kMaxXRows * 2 * K;
    const int xstep = g == 0 ? 2 : 0;
    const float* sxj = reinterpret_cast<const float*>(smem + L.sx) + xj * (K / 32);
    mbar_wait(bars + 8 * slot, static_cast<uint32_t>((i / kRing) & 1));
    const uint8_t* rowp = smem + L.ring + slot * kChunkBytes + (16 * u + g) * 128;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int s = 2 * sp + h;
      float tot0 = 0.0f, tot2 = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t w0 = *reinterpret_cast<const uint32_t*>(rowp + swz[4 * h + j]);
        const uint32_t w1 = *reinterpret_cast<const uint32_t*>(rowp + 8 * 128 + swz[4 * h + j]);
        const uint4 xv = *reinterpret_cast<const uint4*>(xb + (s * kCols + 32 * j) * xstep);
        const uint32_t b0[2] = {xv.x, xv.y}, b1[2] = {xv.z, xv.w};
        uint32_t lo0, lo1, hi0, hi1;
        tc::fp4x8_to_e4m3(w0, lo0, lo1);
        tc::fp4x8_to_e4m3(w1, hi0, hi1);
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        tc::kstep(acc, lo0, lo1, hi0, hi1, b0, b1);
        const float sxv = sxj[s * 4 + j];
        tot0 = __fmaf_rn(acc[0], __fmul_rn(e8m0_f32((sw[h][0] >> (8 * j)) & 0xffu), sxv), tot0);
        tot2 = __fmaf_rn(acc[2], __fmul_rn(e8m0_f32((sw[h][1] >> (8 * j)) & 0xffu), sxv), tot2);
      }
      if (t == 0) {
        float* Ts = p.T + (static_cast<int64_t>(m) * S + s) * N;
        if (n0 + g < N) Ts[n0 + g] = tot0;
        if (n0 + g + 8 < N) Ts[n0 + g + 8] = tot2;
      }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(bars + 8 * (kRing + slot));
  }
  finish(p, c0, c1, reinterpret_cast<int*>(smem + L.list), tid);
}

// The counter pool: zeroed once, a slice per (call site, groups); a slice is nullptr while the pool is not made or
// when it is spent. Made by ensure_pool outside a stream capture (the zeroing is a synchronous memset); slices are
// host bookkeeping.
struct Pool {
  std::mutex mu;
  std::atomic<bool> ready{false};  // base is made (read without the lock on every linear_tc call)
  uint32_t* base = nullptr;
  uint32_t used = 0;
  bool failed = false;
  std::map<std::tuple<const void*, int>, uint32_t*> slices;
};
Pool& pool() {
  static Pool p;
  return p;
}

// Whether a capture is under way on `stream` (null: the backend's stream) or on the backend's stream.
bool capturing(cudaStream_t stream) {
  for (cudaStream_t s : {stream != nullptr ? stream : current_stream(), current_stream()}) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s, &st) != cudaSuccess) {
      (void)cudaGetLastError();
      return true;
    }
    if (st != cudaStreamCaptureStatusNone) return true;
  }
  return false;
}

// Makes the pool at the first call outside a capture (a prefill's, say, before any decode step is captured).
void ensure_pool(cudaStream_t stream) {
  Pool& P = pool();
  if (P.ready.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(P.mu);
  if (P.base != nullptr || P.failed || capturing(stream)) return;
  void* b = nullptr;
  if (cudaMalloc(&b, kPoolCounters * sizeof(uint32_t)) != cudaSuccess ||
      cudaMemset(b, 0, kPoolCounters * sizeof(uint32_t)) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
    (void)cudaGetLastError();
    P.failed = true;
    return;
  }
  P.base = static_cast<uint32_t*>(b);
  P.ready.store(true, std::memory_order_release);
}

// The call site's slice of `groups` counters (made on first use when may_create), or nullptr.
uint32_t* counters_for(const void* site, int groups, bool may_create) {
  Pool& P = pool();
  std::lock_guard<std::mutex> lock(P.mu);
  const auto key = std::make_tuple(site, groups);
  if (auto it = P.slices.find(key); it != P.slices.end()) return it->second;
  if (!may_create || P.base == nullptr || P.used + static_cast<uint32_t>(groups) > kPoolCounters) return nullptr;
  uint32_t* s = P.base + P.used;
  P.used += static_cast<uint32_t>(groups);
  P.slices.emplace(key, s);
  return s;
}

int grid_blocks(int64_t chunks) { return static_cast<int>(std::min<int64_t>(chunks, 2 * sm_count())); }

std::atomic<int> g_stream{-1};  // -1: DEEPINFER_CUDA_TC_STREAM, read on first use
int mode() {
  int v = g_stream.load(std::memory_order_relaxed);
  if (v < 0) {
    v = env_switch("DEEPINFER_CUDA_TC_STREAM", 2);
    g_stream.store(v, std::memory_order_relaxed);
  }
  return v;
}

// Mode 1's rule for dense calls: at least 24 chunks per SM (12 per block), i.e. weights of ~26 MB and more on a
// 132-SM GPU. Below that a block's fixed costs (its x pass, the pipeline's fill, the arrival count and the row sums)
// outweigh its chunks: bench_cuda_gemv's one-row table on the H100 (bench/RESULTS.md, fifty-seventh session) had the
// stream faster on wq_b [32768, 1280] (1.12x), wo_b [5120, 8192] (1.07x) and a [8192, 4096] weight (1.45x), and slower
// at 2.4-5.5 chunks a block (wq_a + wkv 0.57x, the indexer's wq_b 0.63x, the shared w2 0.80x). Grouped FP4 calls
// (16-33 chunks a block at one token) always.
bool large_enough(int64_t chunks) { return chunks >= 24 * static_cast<int64_t>(sm_count()); }

// The chunks of a call and whether its blocks stay within kMaxGroups row groups and kMaxXRows matrices.
struct Plan {
  int S, CPG, RG, M;
  int64_t chunks;
  int blocks;
  bool ok;
};
Plan plan_of(const TcGemvArgs& a) {
  Plan pl{};
  const bool fp4 = a.fp4;
  pl.S = a.K / kCols;
  pl.CPG = fp4 ? pl.S / 2 : pl.S;
  pl.RG = (a.N + kRows - 1) / kRows;
  pl.M = fp4 ? a.M : 1;
  pl.chunks = static_cast<int64_t>(pl.M) * pl.RG * pl.CPG;
  pl.blocks = grid_blocks(pl.chunks);
  const int64_t per_block = (pl.chunks + pl.blocks - 1) / pl.blocks;
  pl.ok = per_block / pl.CPG + 2 <= kMaxGroups &&
          (!fp4 || per_block / (static_cast<int64_t>(pl.RG) * pl.CPG) + 2 <= kMaxXRows) &&
          smem_layout(a.K, fp4 ? kMaxXRows : 1).total <= smem_optin();
  return pl;
}

}  // namespace

bool tc_stream_takes(const TcGemvArgs& a, CUstream_st* stream) {
  const int md = mode();
  if (md == 0) return false;
  ensure_pool(stream);
  const bool grouped = a.row_expert != nullptr;
  if ((a.act != 32 && a.act != 64 && a.act != 128) || a.K > kMaxK || a.N < 1 ||
      reinterpret_cast<uintptr_t>(a.x) % 16 != 0 || a.ldx % 4 != 0 || !a.sc4)
    return false;
  if (grouped) {  // the routed experts of one token: packed FP4, one row of x per (list, pair)
    if (!a.fp4 || a.K % 256 != 0 || a.x_rows < 1 || a.M % a.x_rows != 0 || a.ldw % 16 != 0) return false;
  } else {  // a dense E4M3 call at one row of x with 32 x 32 tiles
    if (a.M != 1 || a.fp4 || a.B != 32 || a.fsteps != 1 || a.K % kCols != 0 || a.ldw % 16 != 0 ||
        reinterpret_cast<uintptr_t>(a.w) % 16 != 0)
      return false;
  }
  const Plan pl = plan_of(a);
  if (!pl.ok || (md == 1 && !grouped && !large_enough(pl.chunks))) return false;
  const void* key = grouped ? static_cast<const void*>(a.w_table) : static_cast<const void*>(a.w);
  return counters_for(key, pl.M * pl.RG, true) != nullptr;
}

int tc_stream_set(int m) {
  DI_CHECK(m >= 0 && m <= 2, "tc_stream_set: {} is not 0, 1 or 2", m);
  const int prev = mode();
  g_stream.store(m, std::memory_order_relaxed);
  return prev;
}

void tc_stream_into(const TcGemvArgs& a, CUstream_st* stream) {
  const bool grouped = a.row_expert != nullptr;
  const Plan pl = plan_of(a);
  const void* key = grouped ? static_cast<const void*>(a.w_table) : static_cast<const void*>(a.w);
  uint32_t* cnt = counters_for(key, pl.M * pl.RG, false);
  DI_CHECK(cnt != nullptr && pl.ok, "cuda: tc_stream_into on a call tc_stream_takes refused");
  const Tensor T = call_scratch(static_cast<size_t>(pl.M) * pl.S * a.N * sizeof(float));
  StreamArgs p{};
  p.sc = a.sc, p.lds = a.lds, p.N = a.N, p.K = a.K, p.S = pl.S, p.act = a.act, p.M = pl.M, p.RG = pl.RG;
  p.CPG = pl.CPG, p.x = a.x, p.ldx = a.ldx, p.y = a.y, p.T = T.data<float>(), p.cnt = cnt, p.round = a.round;
  p.row_expert = a.row_expert, p.w_table = a.w_table, p.s_table = a.s_table, p.x_rows = a.x_rows;
  p.n_experts = a.n_experts, p.ldw = a.ldw;
  static std::once_flag once;
  std::call_once(once, [] {
    DI_CUDA_CHECK(cudaFuncSetAttribute(tc_stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_optin()));
    DI_CUDA_CHECK(
        cudaFuncSetAttribute(tc_stream_fp4_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_optin()));
  });
  const dim3 grid(static_cast<unsigned>(pl.blocks));
  if (grouped) {
    launch_pdl(tc_stream_fp4_kernel, grid, kThreads, smem_layout(a.K, kMaxXRows).total, stream, p);
  } else {
    const CUtensorMap map = tensor_map_u8_sw128(a.w, a.N, a.K, a.ldw, kRows, kCols);
    launch_pdl(tc_stream_kernel, grid, kThreads, smem_layout(a.K, 1).total, stream, map, p);
  }
  DI_CUDA_CHECK(cudaGetLastError());
}

}  // namespace deepinfer::cuda
