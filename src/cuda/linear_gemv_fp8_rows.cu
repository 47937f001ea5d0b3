// fp8_rows_gemv: the E4M3 decode GEMV for batches of x rows, bit-identical to fp8_walk_gemv and the CPU op
// (linear_gemv.cuh's order). Why a fourth kernel: fp8_walk_gemv gives each lane pair a tile of its own, so each x value
// it reads from shared memory serves one weight row, and at 4-8 rows of x those reads bound it (wq_b [32768, 1280]:
// 96 us at M = 8 against 16 at M = 1). Here the lanes of a warp walk 16 weight rows side by side over the same
// columns, so each 16-byte read of x is a broadcast that serves all 16 rows, and each lane keeps its chains' tile
// folds in registers over the whole of K (no shared buffer for the tile sums, no fold pass).
//
// Thread mapping. Lane 2 r + h owns row r of the warp's 16-row group and half h of every 32-column chunk of it (a
// warp load: 16 rows x 32 contiguous bytes, one sector each). One shuffle pair per chunk gives lane h the codes of
// elements 8 j + 4 h + i (j, i = 0..3; fp8_walk_gemv's exchange), so the lane runs chains (j, l = 4 h + i) of its row.
// Per x row m and tile: tiles of 32 (G = 1) with fast x, s = fma(w3, x3, fma(w2, x2, fma(w1, x1, fma(w0, x0, 0))));
// otherwise v[j] = fma(w, x, v[j]) chunk after chunk of the tile from +0 and s = ((v0 + v1) + v2) + v3, as
// fp8_walk_gemv; then tot[m][i] = fma(s, tile factor, tot[m][i]), tile after tile from +0. At the end of the row one
// shuffle forms t_i + t_(i+4), and lane h = 0 the CPU's hsum ((u0 + u2) + (u1 + u3)) + 0 and stores y.
//
// Work. A block (one per SM, up to 16 warps) serves MT rows of x against one matrix (an x-row group); its warps take
// 16-row groups interleaved over the group's blocks (fp8_walk_gemv's order). Dense: the x rows in order. Grouped
// calls with a known row period P (GemvArgs::row_period: wo_a's 8 groups, the shared expert's w1 + w3 over one
// matrix) split into classes (list l, residue q), whose x rows q, q + P, q + 2P, ... share the matrix of table entry
// l n_experts + row_expert[q], read after the previous kernel completes. The host picks MT (1, 2, 4, 8; at most 2 for
// tiles of 64 or 128) as large as the rows of a class allow while the (row group, x-row group) tasks still give
// every SM 8 warps, and x fits shared memory: narrow weights (wo_b, the shared w2) run several x-row groups side by
// side and L2 serves their repeated weight reads. Each lane keeps a ring of D chunks in flight (the item after the
// last chunk of a row group is the first of the next).
// x: the block's MT rows staged and fake-quantised as fp8_walk_gemv's (gemv_fp8_x.cuh), unswizzled: the two float4 a
// warp reads per load sit in one 32-byte span.
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cuda/common.cuh"
#include "cuda/device.h"
#include "cuda/fp_decode.cuh"
#include "cuda/gemv_fp8_x.cuh"
#include "cuda/linear_gemv_fp8.cuh"
#include "cuda/linear_gemv_fp8_rows.cuh"

namespace deepinfer::cuda {

namespace {

struct RowsParams : GemvCall {  // grouped mode only with a row period (gemv_fp8_rows_supported)
  int C;                        // 32-column chunks per row: K / 32
  int period;                   // grouped: GemvArgs::row_period (dense: 1)
  int classes;                  // the x-row classes that share a matrix: dense 1, grouped lists x period
  int mc;                       // x rows per class: dense M, grouped x_rows / period
  int mtiles;                   // x-row groups of MT rows per class
  int groups;                   // 16-row groups: ceil(N / 16)
};

constexpr int kRowsMaxWarps = 16;               // one block per SM (128 registers per thread)
constexpr int64_t kRowsSmemBudget = 200 << 10;  // per block

// Shared memory in floats (dynamic only: the kernel is opted in to the largest dynamic size, which leaves no room for
// static shared memory): x [MT][K], the act-quant scales and reciprocals [MT][ng] each, the matrix's two row pointers.
__host__ __device__ inline int64_t rows_smem_floats(int MT, int K, int ng) {
  return static_cast<int64_t>(MT) * K + 2 * ((MT * ng + 3) & ~3) + 4;
}

// Chunks in flight per lane: fewer where a chunk's work is long (8 rows of x) and the unrolled pass would outgrow the
// instruction cache. Tiles of 64 or 128 columns (G = 2, 4 chunks) hold 16 chains per x row over a tile: at most 2 x
// rows per block and 4 chunks in flight there (the registers: 4 rows spilled 2.5 KB); 6 at 4 rows of x (8 spilled).
template <int MT, int G>
struct RowsShape {
  static_assert(G == 1 || MT <= 2, "tiles of 64 or 128 columns: at most 2 rows of x");
  static constexpr int kD = MT >= 8 || G > 1 ? 4 : MT == 4 ? 6 : 8;
};

// kGrouped: a grouped call (separate instances, so that the dense ones keep the call's pointers in the parameter
// bank and their x rows plain: one instance for both lost ~10% at 8 rows of x, wq_b 39.8 against 44.1 us).
template <int MT, int G, bool kGrouped>
__global__ void __launch_bounds__(32 * kRowsMaxWarps, 1) fp8_rows_gemv(RowsParams p) {
  constexpr int D = RowsShape<MT, G>::kD, B = 32 * G;
  extern __shared__ __align__(16) float smem_rows[];
  pdl_launch_dependents();
  const int tid = static_cast<int>(threadIdx.x), nthreads = static_cast<int>(blockDim.x);
  const int lane = tid & 31, warp = tid >> 5, nw = nthreads >> 5;
  const int h = lane & 1, r = lane >> 1;
  const int N = p.N, K = p.K, C = p.C;
  float* xs = smem_rows;                                                  // [MT][K]
  uint32_t* gmax = reinterpret_cast<uint32_t*>(xs + MT * K);              // [MT][ng]
  float* ginv = reinterpret_cast<float*>(gmax + ((MT * p.ng + 3) & ~3));  // [MT][ng]
  // The block's x-row group: class c (grouped: list l, residue q; its x rows q + period m, its matrix the table entry
  // l n_experts + row_expert[q]) and rows [m0, m0 + mrows) of it.
  const int xgroups = p.classes * p.mtiles;
  const int xg = static_cast<int>(blockIdx.x) % xgroups;
  const int c = xg / p.mtiles, mt = xg - c * p.mtiles;
  const int nb = static_cast<int>(gridDim.x) / xgroups;
  const int gw = warp * nb + static_cast<int>(blockIdx.x) / xgroups;
  const int gstride = nb * nw;
  const int m0 = mt * MT, mrows = min(MT, p.mc - m0);
  const int l = c / p.period, q = c - l * p.period;
  auto x_row = [&](int m) {
    return kGrouped ? q + static_cast<int64_t>(p.period) * (m0 + m) : static_cast<int64_t>(m0 + m);
  };
  const int64_t y_base = kGrouped ? static_cast<int64_t>(l) * p.x_rows : 0;
  // Grouped: the class's weight and scale rows (its table entry) in shared memory rather than registers, read once per
  // row group (each thread writes the value it then reads, all the same); dense calls read the call's.
  const uint8_t** mat = reinterpret_cast<const uint8_t**>(ginv + ((MT * p.ng + 3) & ~3));

  // The ring: slot d holds this lane's 16 bytes of one 32-column chunk of its row and the chunk's tile scale code (the
  // 16 rows of a group share a scale row). The loader walks a row pointer by a chunk per item and moves to its next
  // row group after the last chunk.
  uint4 ring[D];
  uint32_t ring_e[D];
  int lg = gw, lt = 0;
  bool lv = lg < p.groups;
  const uint8_t* lp = nullptr;
  const uint8_t* ls = nullptr;
  auto set_rows = [&]() {
    const int n0 = lg * 16;
    lp = (kGrouped ? mat[0] : p.w) + static_cast<int64_t>(min(n0 + r, N - 1)) * p.ldw + 16 * h;
    ls = (kGrouped ? mat[1] : p.sc) + static_cast<int64_t>(n0 / B) * p.lds;
  };
  auto load_item = [&](int d) {
    ring[d] = lv ? ldg_stream(lp) : make_uint4(0u, 0u, 0u, 0u);
    ring_e[d] = lv ? static_cast<uint32_t>(__ldg(ls + lt / G)) : 0u;
    lp += 32;
    if (++lt == C) {
      lt = 0, lg += gstride, lv = lg < p.groups;
      if (lv) set_rows();
    }
  };
  auto prime = [&]() {
    if (lv) set_rows();
#pragma unroll
    for (int d = 0; d < D; ++d) load_item(d);
  };
  if constexpr (!kGrouped) prime();              // dense weights do not depend on the previous kernel
  const bool one_pass = fp8_one_pass_x(p.A, K);  // x in one pass (fp8_stage_quantise_x)
  if (!one_pass)
    for (int i = tid; i < MT * p.ng; i += nthreads) gmax[i] = 0u;
  pdl_wait();

  auto slot = [](int col4) { return col4; };
  auto matrix = [&]() {  // the class's matrix (the ids and tables may come from upstream)
    const int e = __ldcg(p.row_expert + q) + l * p.n_experts;
    mat[0] = reinterpret_cast<const uint8_t*>(__ldcg(reinterpret_cast<const unsigned long long*>(p.w_table + e)));
    mat[1] = reinterpret_cast<const uint8_t*>(__ldcg(reinterpret_cast<const unsigned long long*>(p.s_table + e)));
    prime();
  };
  bool fast;
  if (one_pass) {
    if constexpr (kGrouped) matrix();
    fast = fp8_stage_quantise_x<MT>(xs, K, p.x, p.ldx, mrows, K, p.A, x_row, slot);
  } else {
    fp8_stage_x<MT>(xs, K, p.x, p.ldx, mrows, K, x_row, slot);
    if constexpr (kGrouped) matrix();  // while x is in flight
    cp_async_wait_all();
    __syncthreads();  // raw x complete, gmax zeroed
    fast = fp8_quantise_x<MT>(xs, K, gmax, ginv, p.A, p.ng, mrows, K, slot);
  }

  const float* xl = xs + 4 * h;  // x[m][32 k + 8 j + 4 h + i] = xl[m K + 32 k + 8 j + i] (chunk k)
  auto walk = [&](auto fast_tag) {
    constexpr bool kFast = decltype(fast_tag)::value;
    constexpr bool kFused = G == 1 && kFast;  // the tile's chain sums fused into one fma chain (exact products)
    float tot[MT][4];
    // Tiles of 64 / 128: the chains (j, i) of each x row over a tile's chunks.
    constexpr int kV = G == 1 ? 1 : MT;
    float v[kV][4][4];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int i = 0; i < 4; ++i) tot[m][i] = 0.0f;
#pragma unroll
    for (int m = 0; m < kV; ++m)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) v[m][j][i] = 0.0f;
    int cg = gw, ct = 0;
    while (cg < p.groups) {
#pragma unroll
      for (int d = 0; d < D; ++d) {
        if (cg >= p.groups) break;  // uniform over the warp
        const uint4 qw = ring[d];
        const float fac = fp8_tile_factor(ring_e[d]);
        load_item(d);    // the slot is consumed: refill it with the item D ahead
        uint32_t wj[4];  // lane 2r loaded bytes 0..15 of the chunk, lane 2r + 1 bytes 16..31
        pair_words(qw, h, wj);
        float wf[4][4];
#pragma unroll
        for (int j = 0; j < 4; ++j) decode4<!kFast>(wj[j], wf[j]);
        const float* xt = xl + 32 * ct;
        [[maybe_unused]] const int cc = ct % G;  // the chunk within its tile
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          if constexpr (kFused) {
            float s[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              const float4 xv = *reinterpret_cast<const float4*>(xt + m * K + 8 * j);
              s[0] = __fmaf_rn(wf[j][0], xv.x, j == 0 ? 0.0f : s[0]);
              s[1] = __fmaf_rn(wf[j][1], xv.y, j == 0 ? 0.0f : s[1]);
              s[2] = __fmaf_rn(wf[j][2], xv.z, j == 0 ? 0.0f : s[2]);
              s[3] = __fmaf_rn(wf[j][3], xv.w, j == 0 ? 0.0f : s[3]);
            }
#pragma unroll
            for (int i = 0; i < 4; ++i) tot[m][i] = __fmaf_rn(s[i], fac, tot[m][i]);
          } else if constexpr (G == 1) {  // each product rounded, then the chain sums
            float vv[4][4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              const float4 xv = *reinterpret_cast<const float4*>(xt + m * K + 8 * j);
              vv[j][0] = __fmaf_rn(wf[j][0], xv.x, 0.0f);
              vv[j][1] = __fmaf_rn(wf[j][1], xv.y, 0.0f);
              vv[j][2] = __fmaf_rn(wf[j][2], xv.z, 0.0f);
              vv[j][3] = __fmaf_rn(wf[j][3], xv.w, 0.0f);
            }
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const float s = __fadd_rn(__fadd_rn(__fadd_rn(vv[0][i], vv[1][i]), vv[2][i]), vv[3][i]);
              tot[m][i] = __fmaf_rn(s, fac, tot[m][i]);
            }
          } else {
            const int vm = m;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              const float4 xv = *reinterpret_cast<const float4*>(xt + m * K + 8 * j);
              v[vm][j][0] = __fmaf_rn(wf[j][0], xv.x, cc == 0 ? 0.0f : v[vm][j][0]);
              v[vm][j][1] = __fmaf_rn(wf[j][1], xv.y, cc == 0 ? 0.0f : v[vm][j][1]);
              v[vm][j][2] = __fmaf_rn(wf[j][2], xv.z, cc == 0 ? 0.0f : v[vm][j][2]);
              v[vm][j][3] = __fmaf_rn(wf[j][3], xv.w, cc == 0 ? 0.0f : v[vm][j][3]);
            }
            if (cc == G - 1 || ct + 1 == C) {  // the tile's last chunk (a short last tile too): sums into the fold
#pragma unroll
              for (int i = 0; i < 4; ++i) {
                const float s = __fadd_rn(__fadd_rn(__fadd_rn(v[vm][0][i], v[vm][1][i]), v[vm][2][i]), v[vm][3][i]);
                tot[m][i] = __fmaf_rn(s, fac, tot[m][i]);
              }
            }
          }
        }
        if (++ct == C) {
          // hsum in the CPU's order: ((t0 + t4) + (t2 + t6)) + ((t1 + t5) + (t3 + t7)) + 0; lane h = 0 stores.
          const int n = cg * 16 + r;
#pragma unroll
          for (int m = 0; m < MT; ++m) {
            float u[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) u[i] = __fadd_rn(tot[m][i], __shfl_xor_sync(0xffffffffu, tot[m][i], 1));
            const float o = __fadd_rn(__fadd_rn(__fadd_rn(u[0], u[2]), __fadd_rn(u[1], u[3])), 0.0f);
            if (h == 0 && n < N && m < mrows) p.y[(y_base + x_row(m)) * N + n] = p.round ? round_to_bf16(o) : o;
#pragma unroll
            for (int i = 0; i < 4; ++i) tot[m][i] = 0.0f;
          }
          ct = 0;
          cg += gstride;
        }
      }
    }
  };
  if (fast)
    walk(std::true_type{});
  else
    walk(std::false_type{});
}

// The kernel for MT rows of x and tiles of 32 G columns.
template <int G, bool kGrouped>
void (*rows_kernel(int MT))(RowsParams) {
  if constexpr (G == 1) {
    if (MT >= 4) return MT == 8 ? fp8_rows_gemv<8, 1, kGrouped> : fp8_rows_gemv<4, 1, kGrouped>;
  }
  return MT == 1 ? fp8_rows_gemv<1, G, kGrouped> : fp8_rows_gemv<2, G, kGrouped>;
}

template <bool kGrouped>
void (*rows_kernel(int G, int MT))(RowsParams) {
  return G == 1 ? rows_kernel<1, kGrouped>(MT) : G == 2 ? rows_kernel<2, kGrouped>(MT) : rows_kernel<4, kGrouped>(MT);
}

}  // namespace

bool gemv_fp8_rows_supported(const GemvArgs& a) {
  if (a.fmt != 0 || (a.B != 32 && a.B != 64 && a.B != 128) || a.M <= 0 || a.N <= 0 || !gemv_supported(a)) return false;
  // Grouped: only with a known period of the experts over the x rows (gemv_supported checks that it divides them).
  if (a.row_expert != nullptr && a.row_period <= 0) return false;
  const int A = static_cast<int>(a.act_quant_block < a.K ? a.act_quant_block : a.K);
  const int ng = A > 0 ? (a.K + A - 1) / A : 0;
  return 4 * rows_smem_floats(1, a.K, ng) <= kRowsSmemBudget;
}

void gemv_fp8_rows_into(const GemvArgs& a, cudaStream_t stream) {
  DI_CHECK(gemv_fp8_rows_supported(a), "cuda::gemv: fp8_rows_gemv does not take this call (N {}, K {}, M {}, B {})",
           a.N, a.K, a.M, a.B);
  RowsParams p = {};
  copy_gemv_args(a, p);
  const int G = a.B / 32;
  p.C = p.K / 32;
  p.groups = (p.N + 15) / 16;
  if (a.row_expert != nullptr) {
    const int xr = a.x_rows > 0 ? a.x_rows : a.M, lists = a.M / xr;
    p.x_rows = xr;  // (plain grouped mode: one list over all M rows)
    p.n_experts = a.x_rows > 0 ? a.n_experts : 0;
    p.period = a.row_period;
    p.classes = lists * p.period;
    p.mc = xr / p.period;
  } else {
    p.period = 1, p.classes = 1, p.mc = p.M;
  }
  // x rows per block: as many as a class has (to 8; 2 for tiles of 64 or 128), halved while the tasks would leave an
  // SM fewer than 8 warps or x would not fit shared memory.
  const int64_t sms = sm_count();
  int MT = p.mc <= 1 ? 1 : p.mc <= 2 || G > 1 ? 2 : p.mc <= 4 ? 4 : 8;
  auto tasks = [&](int mt) { return static_cast<int64_t>(p.groups) * p.classes * ((p.mc + mt - 1) / mt); };
  while (MT > 1 && (4 * rows_smem_floats(MT, p.K, p.ng) > kRowsSmemBudget || tasks(MT) < 8 * sms)) MT /= 2;
  p.mtiles = (p.mc + MT - 1) / MT;
  // One block per SM, as many as the x-row groups can use; warps per block as fp8_walk_gemv's (launch_sm_blocks).
  const int64_t xgroups = static_cast<int64_t>(p.classes) * p.mtiles;
  const int64_t per_mt = std::min<int64_t>(p.groups, std::max<int64_t>(1, sms / xgroups));
  void (*kernel)(RowsParams) = a.row_expert != nullptr ? rows_kernel<true>(G, MT) : rows_kernel<false>(G, MT);
  launch_sm_blocks(
      kernel, p, xgroups, per_mt, p.groups, kRowsMaxWarps, [&](int) { return 4 * rows_smem_floats(MT, p.K, p.ng); },
      "fp8_rows_gemv", stream);
}

}  // namespace deepinfer::cuda
