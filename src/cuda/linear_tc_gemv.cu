// linear_tc's decode path: up to 8 rows of x against an E4M3 or packed FP4 weight, or grouped rows (a matrix per row
// of x: linear_tc_grouped), with linear_tc.cuh's numbers bit for bit.
//
// Why a second kernel: linear_tc.cu's GEMM kernel gives each block 16 weight rows and walks all of K in one warp
// behind a cp.async pipeline, so at one row of x a narrow weight has a few hundred warps in all, each a long serial
// chain (wo_b [5120, 8192] took 84 us against fp8_walk_gemv's 19). The contract lets K split: a row's result is the
// in-order sum of its 128-column stages' totals, and a stage's total depends only on that stage. So here an "item" is
// (16-row unit, stage), a block owns U units (U > 1 for short rows, so that x's pass serves more rows) and its warps
// take the items in turn, each warp keeping a ring of 3 items' weights in registers (loaded two items ahead; the first
// two before griddepcontrol.wait). A stage's totals go to shared memory and, once every warp is done, 16 x M threads
// per unit add them in stage order. x is quantised by every block itself (the FP8 input site, as linear_tc.cu's
// pre-pass does), so there is one launch and no workspace.
//
// Per 32-column k step a lane converts its 16 weight bytes (rows g and g + 8; FP4: 8 bytes, decoded to E4M3 first as
// the GEMM kernel does) and x's 8 codes of token g (zeros for tokens >= M) to FP16 (at one or two rows of x and in
// grouped calls the x pass stores the FP16 values, so a k step's B fragments are one shared-memory load: `tc` decode
// 1.34-1.36 -> 1.32 ms at batch 1, 16.8 -> 16.4-16.5 at 32) and issues the step's two MMAs (tc_mma.cuh's kstep, as
// the GEMM kernel); at the end of a fold block it adds acc * (sw * sx) into the stage total
// with the GEMM kernel's FMA. Only the C fragment's columns below M are used; the MMA computes the others for nothing,
// which costs no more instructions.
//
// Measured (bench_cuda_gemv, M = 1, us, this kernel / the exact contract's kernel): wq_a [1280, 5120] 4.8 / walk 8.8,
// wkv [512, 5120] 3.6 / 14.9, indexer wq_b [4096, 1280] 4.4 / 5.4, shared w2 [5120, 2304] 7.3 / 8.1, wo_b [5120,
// 8192] 20.1 / 19.4, wq_b [32768, 1280] 18.9 / fp8_mma_gemv 13.9; at M = 2 it is ahead on every V4.1 shape. The FP4
// mode is slower than fp4_mma_gemv: the grouped experts at one token, w1 + w3 58.5 / 42.1 us, w2 36.6 / 21.6 (the
// E2M1 -> E4M3 -> FP16 decode costs ~355 instructions per 1 KB item against the exact kernel's ~286).
#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>

#include "cuda/common.cuh"
#include "cuda/device.h"
#include "cuda/fp_decode.cuh"
#include "cuda/linear_tc_gemv.cuh"
#include "cuda/tc_mma.cuh"

namespace deepinfer::cuda {

namespace {

constexpr int kStageCols = 128;  // linear_tc.cu's kBK: the columns whose total is one term of a row's sum
constexpr int kMaxWarps = 16;

// x in shared memory: up to kX16Rows rows of x (decode at one or two tokens, every grouped call) as the FP16 values
// of their codes [M][K] (the B fragments then load as they are: one 16-byte load per k step instead of an 8-byte one,
// four conversions and two selects), then 16 zero bytes that the lanes of tokens >= M read; more rows as the codes
// [M][K] bytes (converted per k step). Then x's scales [K / 32][8] floats (per 32 columns and token) and the stage
// totals [U][K / 128][16][M2] floats (M2 = M rounded up to even).
constexpr int kX16Rows = 2;
__host__ __device__ inline int64_t tc_gemv_xs_bytes(int M, int K) {
  return M <= kX16Rows ? static_cast<int64_t>(M) * K * 2 + 16 : (static_cast<int64_t>(M) * K + 15) / 16 * 16;
}
__host__ __device__ inline int64_t tc_gemv_smem(int M, int K, int U) {
  return tc_gemv_xs_bytes(M, K) + static_cast<int64_t>(K / 32) * 8 * 4 +
         static_cast<int64_t>(U) * (K / kStageCols) * 16 * ((M + 1) & ~1) * 4;
}

// Weight and scale layouts: E4M3 with 32 x 32 tiles and 4-byte aligned scale rows (V4.1; fold blocks of one k step),
// E4M3 with 128 x 128 tiles and act_quant_block 128 (V4; one fold block per stage), any other E4M3 (codes read per
// fold block), packed FP4 with a scale per row and 32 columns (the routed experts).
enum ScaleMode : int { kScale32 = 0, kScale128 = 1, kScaleAny = 2, kFp4 = 3 };

// One ring slot: an item's weight words per lane (4 k steps x rows g, g + 8: 8 bytes each for E4M3, 4 for FP4) and
// its scale codes where the layout allows a load per item (kScale32: the 4 codes of 32 x 32 tiles as one word, byte j
// for k step j; kScale128: the stage's one code; kFp4: rows g and g + 8's words of 4 codes).
template <int SM>
struct Slot {
  static constexpr int kWords = SM == kFp4 ? 1 : 2;
  uint32_t w[4][2][kWords];
  uint32_t sc[SM == kFp4 ? 2 : 1];
};

// Block: U units of 16 weight rows (blockIdx.x U, ...); its items (unit u, stage s), item i = u S + s, go to the warps
// in turn (warp w: items w, w + W, ...), each loaded two items ahead of its MMAs (a ring of 3 slots, rotated by
// unrolling). W warps per block: 8 with 3 blocks per SM (<= 85 registers, so that wo_b's 320 units all start at once),
// or 16 for the calls with few units.
// Grouped calls (p.row_expert): blockIdx.y is the row of y; the block's matrix is looked up after griddepcontrol.wait
// (the ids come from the previous kernel), and its one row of x is quantised alone.
template <int W, int SM, bool X16>
__global__ void __launch_bounds__(32 * W, W == 8 ? 3 : 1) tc_gemv_kernel(TcGemvArgs p, int U) {
  pdl_launch_dependents();
  extern __shared__ __align__(16) uint8_t smem_tcg[];
  constexpr int nt = 32 * W, nw = W;
  constexpr int kRowBytes = SM == kFp4 ? kStageCols / 2 : kStageCols;  // a row's weight bytes per stage
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const bool grouped = p.row_expert != nullptr;
  const int vm = static_cast<int>(blockIdx.y);  // grouped: the row of y
  const int K = p.K, N = p.N, M = grouped ? 1 : p.M, S = K / kStageCols, M2 = (M + 1) & ~1;
  const int fsteps = SM == kScale32 || SM == kFp4 ? 1 : SM == kScale128 ? 4 : p.fsteps;
  const float* X = grouped ? p.x + static_cast<int64_t>(vm % p.x_rows) * p.ldx : p.x;
  float* Y = grouped ? p.y + static_cast<int64_t>(vm) * N : p.y;
  const uint8_t* Wt = p.w;
  const uint8_t* SC = p.sc;
  uint8_t* xq = smem_tcg;
  float* sx = reinterpret_cast<float*>(smem_tcg + tc_gemv_xs_bytes(M, K));
  float* stash = sx + (K / 32) * 8;
  const int u0 = static_cast<int>(blockIdx.x) * U;
  const int items = min(U, (N + 15) / 16 - u0) * S;

  // The loader: item (unit lu, stage ls) with pointers at this lane's bytes of rows g, g + 8 and at the unit's scale
  // codes of the stage; advanced nw items at a time, re-based only when it moves to another unit.
  int lu = warp / S, ls = warp % S;
  const uint8_t *lr0 = nullptr, *lr1 = nullptr, *lsc = nullptr, *lsc1 = nullptr;
  auto base = [&]() {
    const int n0 = (u0 + lu) * 16;
    const int64_t row0 = min(n0 + g, N - 1), row1 = min(n0 + g + 8, N - 1);
    const int64_t kb = static_cast<int64_t>(ls) * kRowBytes + (SM == kFp4 ? 4 : 8) * t;
    lr0 = Wt + row0 * p.ldw + kb;
    lr1 = Wt + row1 * p.ldw + kb;
    if constexpr (SM == kScale32) lsc = SC + static_cast<int64_t>(n0 / 32) * p.lds + 4 * ls;
    if constexpr (SM == kScale128) lsc = SC + static_cast<int64_t>(n0 / 128) * p.lds + ls;
    if constexpr (SM == kFp4) lsc = SC + row0 * p.lds + 4 * ls, lsc1 = SC + row1 * p.lds + 4 * ls;
  };
  auto load = [&](Slot<SM>& d) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if constexpr (SM == kFp4) {
        d.w[j][0][0] = ldg_stream4(lr0 + 16 * j);
        d.w[j][1][0] = ldg_stream4(lr1 + 16 * j);
      } else {
        const uint2 a = ldg_stream8(lr0 + 32 * j), b = ldg_stream8(lr1 + 32 * j);
        d.w[j][0][0] = a.x, d.w[j][0][Slot<SM>::kWords - 1] = a.y;
        d.w[j][1][0] = b.x, d.w[j][1][Slot<SM>::kWords - 1] = b.y;
      }
    }
    if constexpr (SM == kScale32) d.sc[0] = __ldg(reinterpret_cast<const uint32_t*>(lsc));
    if constexpr (SM == kScale128) d.sc[0] = __ldg(lsc);
    if constexpr (SM == kFp4) {
      d.sc[0] = __ldg(reinterpret_cast<const uint32_t*>(lsc));
      d.sc[1] = __ldg(reinterpret_cast<const uint32_t*>(lsc1));
    }
    ls += nw;
    if (ls < S) {
      lr0 += nw * kRowBytes, lr1 += nw * kRowBytes;
      if constexpr (SM == kScale32 || SM == kFp4) lsc += 4 * nw;
      if constexpr (SM == kFp4) lsc1 += 4 * nw;
      if constexpr (SM == kScale128) lsc += nw;
    } else {
      for (; ls >= S; ls -= S) ++lu;
      base();
    }
  };
  Slot<SM> ra, rb, rc;
  if (!grouped) {  // the weights do not depend on the previous kernel
    base();
    if (warp < items) load(ra);
    if (warp + nw < items) load(rb);
  }
  pdl_wait();
  if (grouped) {
    const int e = __ldcg(p.row_expert + vm % p.x_rows) + vm / p.x_rows * p.n_experts;
    Wt = reinterpret_cast<const uint8_t*>(__ldcg(reinterpret_cast<const unsigned long long*>(p.w_table + e)));
    SC = reinterpret_cast<const uint8_t*>(__ldcg(reinterpret_cast<const unsigned long long*>(p.s_table + e)));
    base();
    if (warp < items) load(ra);
    if (warp + nw < items) load(rb);
  }

  // x's FP8 input site into shared memory, row by row (tc_mma.cuh's pass; a scale per 32 columns and token).
  for (int m = 0; m < M; ++m)
    tc::x_pass_row<nt, X16>(X + static_cast<int64_t>(m) * p.ldx, K, p.act, S, 0, S,
                            xq + static_cast<int64_t>(m) * K * (X16 ? 2 : 1), sx + m, 8, tid);
  if constexpr (X16)
    if (tid < 4) reinterpret_cast<uint32_t*>(xq + static_cast<int64_t>(M) * K * 2)[tid] = 0u;  // the zero block
  __syncthreads();

  // Item after item: process slot `cur`, refill `nxt2` (the slot of the item before) with the item two ahead.
  int cu = warp / S, cs = warp % S;  // the current item's unit and stage
  const bool gm = g < M;
  const uint8_t* xg = xq + min(g, M - 1) * K + 8 * t;
  // X16: token g's FP16 values at column k are at xh + 2 k (lanes of tokens >= M: the zero block, whatever k).
  const uint8_t* xh = gm ? xq + static_cast<int64_t>(g) * K * 2 + 16 * t : xq + static_cast<int64_t>(M) * K * 2;
  const int xh_step = gm ? 2 : 0;
  const float* sxt = sx + 2 * t;
  auto step = [&](int i, Slot<SM>& cur, Slot<SM>& nxt2) {
    if (i + 2 * nw < items) load(nxt2);
    const int k0 = cs * kStageCols;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, tot[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    int cnt = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      // Token g's codes (lanes of tokens >= M read token M - 1's and feed zeros: no branch).
      uint32_t b0[2], b1[2];
      if constexpr (X16) {
        const uint4 v = *reinterpret_cast<const uint4*>(xh + (k0 + 32 * j) * xh_step);
        b0[0] = v.x, b0[1] = v.y, b1[0] = v.z, b1[1] = v.w;
      } else {
        const uint2 v = *reinterpret_cast<const uint2*>(xg + k0 + 32 * j);
        tc::b_frags(gm ? v.x : 0u, gm ? v.y : 0u, b0, b1);
      }
      if constexpr (SM == kFp4) {
        uint32_t lo0, lo1, hi0, hi1;
        tc::fp4x8_to_e4m3(cur.w[j][0][0], lo0, lo1);
        tc::fp4x8_to_e4m3(cur.w[j][1][0], hi0, hi1);
        tc::kstep(acc, lo0, lo1, hi0, hi1, b0, b1);
      } else {
        tc::kstep(acc, cur.w[j][0][0], cur.w[j][0][Slot<SM>::kWords - 1], cur.w[j][1][0],
                  cur.w[j][1][Slot<SM>::kWords - 1], b0, b1);
      }
      if (++cnt == fsteps) {  // end of a fold block: tot += P * (sw * sx), as the GEMM kernel
        cnt = 0;
        float s0, s1;
        if constexpr (SM == kFp4) {
          s0 = e8m0_f32((cur.sc[0] >> (8 * j)) & 0xffu);
          s1 = e8m0_f32((cur.sc[1] >> (8 * j)) & 0xffu);
        } else {
          uint32_t code;
          if constexpr (SM == kScale32)
            code = (cur.sc[0] >> (8 * j)) & 0xffu;
          else if constexpr (SM == kScale128)
            code = cur.sc[0];
          else
            code = __ldg(SC + static_cast<int64_t>((u0 + cu) * 16 / p.B) * p.lds + (k0 + 32 * j) / p.B);
          s0 = s1 = e8m0_f32(code);
        }
        const float2 sxv = *reinterpret_cast<const float2*>(sxt + (k0 / 32 + j) * 8);
        tot[0] = __fmaf_rn(acc[0], __fmul_rn(s0, sxv.x), tot[0]);
        tot[1] = __fmaf_rn(acc[1], __fmul_rn(s0, sxv.y), tot[1]);
        tot[2] = __fmaf_rn(acc[2], __fmul_rn(s1, sxv.x), tot[2]);
        tot[3] = __fmaf_rn(acc[3], __fmul_rn(s1, sxv.y), tot[3]);
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[c] = 0.0f;
      }
    }
    if (2 * t < M) {  // the stage's totals of tokens 2t, 2t + 1 for rows g and g + 8
      float* st = stash + static_cast<int64_t>(i) * 16 * M2 + 2 * t;
      *reinterpret_cast<float2*>(st + g * M2) = make_float2(tot[0], tot[1]);
      *reinterpret_cast<float2*>(st + (g + 8) * M2) = make_float2(tot[2], tot[3]);
    }
    for (cs += nw; cs >= S; cs -= S) ++cu;
  };
  for (int i = warp; i < items; i += 3 * nw) {
    step(i, ra, rc);
    if (i + nw >= items) break;
    step(i + nw, rb, ra);
    if (i + 2 * nw >= items) break;
    step(i + 2 * nw, rc, rb);
  }
  __syncthreads();

  // A row's result: its stage totals added in K order from 0 (the GEMM kernel's `run`).
  for (int e = tid; e < (items / S) * 16 * M; e += nt) {
    const int m = e % M, r = (e / M) % 16, u = e / (16 * M), n = (u0 + u) * 16 + r;
    const float* st = stash + static_cast<int64_t>(u) * S * 16 * M2 + r * M2 + m;
    float run = 0.0f;
    for (int s = 0; s < S; ++s) run = __fadd_rn(run, st[s * 16 * M2]);
    if (n < N) Y[static_cast<int64_t>(m) * N + n] = p.round ? round_to_bf16(run) : run;
  }
}

// Units per block and warps per block for a call: about 4 items per warp; more units per block when a unit has few
// stages (wide, short weights: the x pass is then shared by more rows), 16 warps when the units are too few to give
// every SM 8 warps.
struct TcGemvShape {
  int U, nw;
};
TcGemvShape tc_gemv_shape(int N, int K) {
  const int S = K / kStageCols, units = (N + 15) / 16;
  TcGemvShape sh{std::max(1, 32 / S), 8};
  const int64_t sms = sm_count();
  while (sh.U > 1 && (tc_gemv_smem(8, K, sh.U) > (64 << 10) || (units + sh.U - 1) / sh.U < 2 * sms)) --sh.U;
  const int64_t blocks = (units + sh.U - 1) / sh.U;
  if (sh.U == 1 && blocks < sms && S >= 32) sh.nw = kMaxWarps;
  return sh;
}

}  // namespace

bool tc_gemv_takes(const TcGemvArgs& a) {
  const bool grouped = a.row_expert != nullptr;
  const int M = grouped ? 1 : a.M;
  return M >= 1 && M <= 8 && (a.act == 32 || a.act == 64 || a.act == 128) && a.K % kStageCols == 0 &&
         reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && a.ldx % 4 == 0 && (!a.fp4 || a.sc4) &&
         (!grouped || (a.x_rows > 0 && a.M % a.x_rows == 0)) &&
         tc_gemv_smem(M, a.K, tc_gemv_shape(a.N, a.K).U) <= smem_optin();
}

void tc_gemv_into(const TcGemvArgs& a, CUstream_st* stream) {
  const bool grouped = a.row_expert != nullptr;
  const TcGemvShape sh = tc_gemv_shape(a.N, a.K);
  const int units = (a.N + 15) / 16;
  const int mode = a.fp4                                 ? kFp4
                   : a.B == 32 && a.fsteps == 1 && a.sc4 ? kScale32
                   : a.B == 128 && a.fsteps == 4         ? kScale128
                                                         : kScaleAny;
  using Kernel = void (*)(TcGemvArgs, int);
  static const Kernel kernels[2][2][4] = {{{tc_gemv_kernel<8, kScale32, false>, tc_gemv_kernel<8, kScale128, false>,
                                            tc_gemv_kernel<8, kScaleAny, false>, tc_gemv_kernel<8, kFp4, false>},
                                           {tc_gemv_kernel<16, kScale32, false>, tc_gemv_kernel<16, kScale128, false>,
                                            tc_gemv_kernel<16, kScaleAny, false>, tc_gemv_kernel<16, kFp4, false>}},
                                          {{tc_gemv_kernel<8, kScale32, true>, tc_gemv_kernel<8, kScale128, true>,
                                            tc_gemv_kernel<8, kScaleAny, true>, tc_gemv_kernel<8, kFp4, true>},
                                           {tc_gemv_kernel<16, kScale32, true>, tc_gemv_kernel<16, kScale128, true>,
                                            tc_gemv_kernel<16, kScaleAny, true>, tc_gemv_kernel<16, kFp4, true>}}};
  static std::once_flag once;
  std::call_once(once, [] {
    for (const auto& x16 : kernels)
      for (const auto& row : x16)
        for (Kernel k : row)
          DI_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_optin()));
  });
  const dim3 grid(static_cast<unsigned>((units + sh.U - 1) / sh.U), static_cast<unsigned>(grouped ? a.M : 1));
  const int rows = grouped ? 1 : a.M;
  launch_pdl(kernels[rows <= kX16Rows ? 1 : 0][sh.nw == 8 ? 0 : 1][mode], grid, 32 * sh.nw,
             tc_gemv_smem(rows, a.K, sh.U), stream, a, sh.U);
  DI_CUDA_CHECK(cudaGetLastError());
}

}  // namespace deepinfer::cuda
