// Tensor-core linear (FP8 MMA, swap AB) for E4M3 / E2M1 weights with the FP8 input site. Contract and
// numerics in linear_tc.cuh.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <numeric>
#include <string>

#include "cuda/common.cuh"
#include "cuda/device.h"
#include "cuda/fp_decode.cuh"
#include "cuda/linear.cuh"
#include "cuda/linear_tc.cuh"
#include "cuda/linear_tc_gemv.cuh"
#include "cuda/quant.cuh"
#include "cuda/tc_mma.cuh"

namespace deepinfer::cuda {

namespace {

enum Fmt : int { kFp8 = 0, kFp4 = 1 };

constexpr int kBK = 128;  // K columns per pipeline stage (4 MMA k steps of 32)
constexpr int kXS = 160;  // smem bytes per x-code row and per E4M3 weight row (128 + 32: LDS.64 conflict free)
constexpr int kW4S = 80;  // smem bytes per packed-FP4 weight row (64 + 16: LDS.32 conflict free)

// ---- x pre-pass: FP8 quantisation (the CPU's fake_quant_fp8, kept as codes + scales) ------------------------
// One warp per (row m < M, act group): codes xq[m * K + c] (e4m3 bytes), scales sx32[(c / 32) * M4 + m]
// (the group's scale, repeated for each 32 columns).
__global__ void __launch_bounds__(256) quant_x_kernel(const float* __restrict__ x, int64_t ldx, int M, int K, int act,
                                                      int M4, uint8_t* __restrict__ xq, float* __restrict__ sx32) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t gw = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int ngroups = K / act;
  if (gw >= static_cast<int64_t>(M) * ngroups) return;
  const int m = static_cast<int>(gw / ngroups), grp = static_cast<int>(gw % ngroups);
  const int lane = threadIdx.x & 31;
  const float* p = x + m * ldx + static_cast<int64_t>(grp) * act;
  float amax = 0.0f;
  for (int c = lane; c < act; c += 32) amax = fmaxf(amax, fabsf(p[c]));
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float s = tc::x_scale(amax), inv = tc::x_inv(s);
  uint8_t* q = xq + static_cast<int64_t>(m) * K + static_cast<int64_t>(grp) * act;
  for (int c = lane; c < act; c += 32) q[c] = tc::x_code(p[c], inv);
  for (int j = lane; j < act / 32; j += 32) sx32[(static_cast<int64_t>(grp) * (act / 32) + j) * M4 + m] = s;
}

// ---- the GEMM ------------------------------------------------------------------------------------------------
// Thread block: R = WR * MI * 16 weight rows [n0, n0 + R) x BT = WT * NI * 8 tokens [m0, m0 + BT), all of K in
// stages of kBK columns. Stage layout: weight rows [R][WS], x codes [BT][kXS], x scales [4][BT] floats,
// FP4 weight scales [R][4] bytes. Rows >= N and tokens >= M are not loaded (their smem holds stale data,
// which only reaches outputs that are never stored: every MMA output depends on its own row and column).
template <int FMT, int MI, int NI, int WR, int WT>
struct TcCfg {
  static constexpr int kR = WR * MI * 16;
  static constexpr int kBT = WT * NI * 8;
  static constexpr int kThreads = WR * WT * 32;
  static constexpr int kWS = FMT == kFp8 ? kXS : kW4S;
  static constexpr int kXOff = kR * kWS;
  static constexpr int kSxOff = kXOff + kBT * kXS;
  static constexpr int kSwOff = kSxOff + 4 * kBT * 4;
  static constexpr int kStage = (kSwOff + (FMT == kFp4 ? kR * 4 : 0) + 15) / 16 * 16;
};

// Grouped rows (linear_tc_grouped_gemm_into): x's R rows sorted by expert (row_expert ascending, as moe_group
// leaves them); block (row tile, expert e = blockIdx.y, list l = blockIdx.z) runs e's rows [offsets[e], offsets[e + 1])
// in tiles of up to BT tokens through matrix l E + e of the tables, writing y rows l R + r. Token groups of 8 past the
// tile's last row are skipped (warp-uniform), so BT is an upper bound, not a cost.
struct TcGroup {
  const int32_t* row_expert = nullptr;  // nullptr: a dense call
  const int32_t* offsets = nullptr;     // [E + 1] (the pre-pass's, from row_expert)
  const uint8_t* const* w_table = nullptr;
  const uint8_t* const* s_table = nullptr;
  int R = 0, E = 0;
};

// offsets[e] = the first row whose expert is >= e, for e in [0, E] (row_expert ascending). Thread r in [0, R] writes
// the entries of the experts between row r - 1's and row r's.
__global__ void __launch_bounds__(256)
    expert_offsets_kernel(const int32_t* __restrict__ ids, int R, int E, int32_t* __restrict__ offsets) {
  pdl_wait();
  pdl_launch_dependents();
  const int r = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (r > R) return;
  const int prev = r == 0 ? -1 : min(max(ids[r - 1], -1), E);
  const int cur = r == R ? E : min(max(ids[r], -1), E);
  for (int e = prev + 1; e <= cur; ++e) offsets[e] = r;
}

template <int FMT, int MI, int NI, int WR, int WT, int S>
__global__ void __launch_bounds__(WR* WT * 32)
    tc_kernel(const uint8_t* __restrict__ w_arg, int64_t ldw, const uint8_t* __restrict__ sc_arg, int64_t lds, int B,
              int N, int K, int M, int M4, const uint8_t* __restrict__ xq, const float* __restrict__ sx32, int fsteps,
              float* __restrict__ y_arg, bool round, TcGroup grp) {
  pdl_wait();
  pdl_launch_dependents();
  using C = TcCfg<FMT, MI, NI, WR, WT>;
  constexpr int R = C::kR, BT = C::kBT, NT = C::kThreads, WS = C::kWS;
  constexpr int WP = FMT == kFp8 ? kBK / 16 : kBK / 32;  // 16-byte pieces per weight row and stage
  extern __shared__ __align__(16) uint8_t smem[];
  const int tid = threadIdx.x;
  const int n0 = blockIdx.x * R;
  const int nk = K / kBK;
  const uint8_t* w = w_arg;
  const uint8_t* sc = sc_arg;
  float* y = y_arg;
  int m_first = blockIdx.y * BT, m_lo = 0, m_hi = M;  // the tiles start at m_first; rows [m_lo, m_hi) are stored
  const bool grouped = grp.row_expert != nullptr;
  if (grouped) {
    const int e = static_cast<int>(blockIdx.y), l = static_cast<int>(blockIdx.z);
    m_lo = grp.offsets[e];
    m_hi = grp.offsets[e + 1];
    if (m_lo >= m_hi) return;
    w = grp.w_table[static_cast<int64_t>(l) * grp.E + e];
    sc = grp.s_table[static_cast<int64_t>(l) * grp.E + e];
    y += static_cast<int64_t>(l) * grp.R * N;
    m_first = m_lo;
  }
  for (int m0 = m_first; m0 < m_hi; m0 += BT) {
    if (m0 != m_first) __syncthreads();  // the previous tile's last stage is read by every warp before it is reloaded
    // This warp's token groups of 8 that hold rows to store (the rest skip their MMAs: grouped tiles are ragged).
    const int live =
        grouped ? min(NI, max(0, (m_hi - m0 - (static_cast<int>(threadIdx.x >> 5) / WR) * NI * 8 + 7) / 8)) : NI;

    auto load = [&](int i) {
      uint8_t* st = smem + (i % S) * C::kStage;
      const int64_t k0 = static_cast<int64_t>(i) * kBK;
      const int64_t wb0 = FMT == kFp8 ? k0 : k0 / 2;
#pragma unroll
      for (int p = tid; p < R * WP; p += NT) {
        const int r = p / WP, o = p % WP;
        if (n0 + r < N) cp_async16(st + r * WS + o * 16, w + static_cast<int64_t>(n0 + r) * ldw + wb0 + o * 16);
      }
#pragma unroll
      for (int p = tid; p < BT * 8; p += NT) {
        const int t = p / 8, o = p % 8;
        if (m0 + t < M)
          cp_async16(st + C::kXOff + t * kXS + o * 16, xq + static_cast<int64_t>(m0 + t) * K + k0 + o * 16);
      }
      if (grouped) {  // 4 k steps x BT tokens, one by one: a grouped tile starts at any row
        for (int p = tid; p < 4 * BT; p += NT) {
          const int j = p / BT, q = p % BT;
          if (m0 + q < M) cp_async4(st + C::kSxOff + (j * BT + q) * 4, sx32 + (k0 / 32 + j) * M4 + m0 + q);
        }
      } else {
#pragma unroll
        for (int p = tid; p < BT; p += NT) {  // 4 k steps x BT / 4 pieces of 4 tokens
          const int j = p / (BT / 4), q = p % (BT / 4);
          if (m0 + 4 * q < M) cp_async16(st + C::kSxOff + (j * BT + 4 * q) * 4, sx32 + (k0 / 32 + j) * M4 + m0 + 4 * q);
        }
      }
      if constexpr (FMT == kFp4) {
        for (int p = tid; p < R; p += NT)
          if (n0 + p < N) cp_async4(st + C::kSwOff + p * 4, sc + static_cast<int64_t>(n0 + p) * lds + k0 / 32);
      }
    };

    for (int s = 0; s < S - 1; ++s) {
      if (s < nk) load(s);
      cp_async_commit();
    }

    const int lane = tid & 31, g = lane >> 2, t = lane & 3, warp = tid >> 5;
    const int rbase = (warp % WR) * MI * 16, tbase = (warp / WR) * NI * 8;
    float acc[MI][NI][4], tot[MI][NI][4], run[MI][NI][4];
#pragma unroll
    for (int a = 0; a < MI; ++a)
#pragma unroll
      for (int b = 0; b < NI; ++b)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[a][b][c] = tot[a][b][c] = run[a][b][c] = 0.0f;
    int cnt = 0;

    for (int it = 0; it < nk; ++it) {
      cp_async_wait<S - 2>();
      __syncthreads();  // stage it landed for everyone; stage it - 1 is free for reuse
      if (it + S - 1 < nk) load(it + S - 1);
      cp_async_commit();

      const uint8_t* st = smem + (it % S) * C::kStage;
      float swf[MI][4];  // E4M3 tile scales of this stage's 4 k steps (one per m16 tile: 16 | B)
      if constexpr (FMT == kFp8) {
#pragma unroll
        for (int a = 0; a < MI; ++a) {
          const int row = min(n0 + rbase + a * 16, N - 1);
          const uint8_t* srow = sc + static_cast<int64_t>(row / B) * lds;
#pragma unroll
          for (int j = 0; j < 4; ++j) swf[a][j] = e8m0_f32(__ldg(srow + (it * kBK + 32 * j) / B));
        }
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        // Lane (g, t) holds elements 8t .. 8t + 7 of the 32-column k step j for its rows / token: as e4m3 bytes
        // in two words (w0: 8t .. 8t + 3, w1: 8t + 4 .. 8t + 7), converted to f16 pairs; k16 half h uses word h
        // (f16 k slots 2t, 2t + 1 <- bytes 0, 1; slots 2t + 8, 2t + 9 <- bytes 2, 3), the same for A and B.
        uint32_t bf[2][NI][2];
#pragma unroll
        for (int b = 0; b < NI; ++b) {
          if (b >= live) break;
          const uint2 v = *reinterpret_cast<const uint2*>(st + C::kXOff + (tbase + b * 8 + g) * kXS + j * 32 + 8 * t);
          tc::b_frags(v.x, v.y, bf[0][b], bf[1][b]);
        }
#pragma unroll
        for (int a = 0; a < MI; ++a) {
          const int r0 = rbase + a * 16 + g;
          uint32_t lo0, lo1, hi0, hi1;  // e4m3 words: row r0 (lo) and r0 + 8 (hi), elements 8t.. (0) and 8t + 4.. (1)
          if constexpr (FMT == kFp8) {
            const uint2 l = *reinterpret_cast<const uint2*>(st + r0 * WS + j * 32 + 8 * t);
            const uint2 h = *reinterpret_cast<const uint2*>(st + (r0 + 8) * WS + j * 32 + 8 * t);
            lo0 = l.x, lo1 = l.y, hi0 = h.x, hi1 = h.y;
          } else {
            tc::fp4x8_to_e4m3(*reinterpret_cast<const uint32_t*>(st + r0 * WS + j * 16 + 4 * t), lo0, lo1);
            tc::fp4x8_to_e4m3(*reinterpret_cast<const uint32_t*>(st + (r0 + 8) * WS + j * 16 + 4 * t), hi0, hi1);
          }
#pragma unroll
          for (int b = 0; b < NI; ++b)
            if (b < live) tc::kstep(acc[a][b], lo0, lo1, hi0, hi1, bf[0][b], bf[1][b]);
        }
        if (++cnt == fsteps) {  // end of a fold block: tot += P * (sw * sx), in K order
          cnt = 0;
          float2 sxv[NI];
#pragma unroll
          for (int b = 0; b < NI; ++b)
            if (b < live)
              sxv[b] = *reinterpret_cast<const float2*>(st + C::kSxOff + (j * BT + tbase + b * 8 + 2 * t) * 4);
#pragma unroll
          for (int a = 0; a < MI; ++a) {
            float s0, s1;
            if constexpr (FMT == kFp8) {
              s0 = s1 = swf[a][j];
            } else {
              const int r0 = rbase + a * 16 + g;
              s0 = e8m0_f32(st[C::kSwOff + r0 * 4 + j]);
              s1 = e8m0_f32(st[C::kSwOff + (r0 + 8) * 4 + j]);
            }
#pragma unroll
            for (int b = 0; b < NI; ++b) {
              if (b >= live) break;
              tot[a][b][0] = __fmaf_rn(acc[a][b][0], __fmul_rn(s0, sxv[b].x), tot[a][b][0]);
              tot[a][b][1] = __fmaf_rn(acc[a][b][1], __fmul_rn(s0, sxv[b].y), tot[a][b][1]);
              tot[a][b][2] = __fmaf_rn(acc[a][b][2], __fmul_rn(s1, sxv[b].x), tot[a][b][2]);
              tot[a][b][3] = __fmaf_rn(acc[a][b][3], __fmul_rn(s1, sxv[b].y), tot[a][b][3]);
#pragma unroll
              for (int c = 0; c < 4; ++c) acc[a][b][c] = 0.0f;
            }
          }
        }
      }
      // End of a stage (a whole number of fold blocks: KS divides kBK): run += the stage's total, in K order.
      tc::add_total(run, tot);
    }
    cp_async_wait<0>();

#pragma unroll
    for (int a = 0; a < MI; ++a) {
#pragma unroll
      for (int b = 0; b < NI; ++b) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int n = n0 + rbase + a * 16 + g + (c >= 2 ? 8 : 0);
          const int m = m0 + tbase + b * 8 + 2 * t + (c & 1);
          if (n < N && m >= m_lo && m < m_hi) {
            const float v = run[a][b][c];
            y[static_cast<int64_t>(m) * N + n] = round ? round_to_bf16(v) : v;
          }
        }
      }
    }
    if (grp.row_expert == nullptr) break;  // a dense block owns one tile of tokens
  }
}

// ---- host side --------------------------------------------------------------------------------------------
struct Args {
  const uint8_t* w;
  int64_t ldw;
  const uint8_t* sc;
  int64_t lds;
  int B, N, K, M, M4;
  const uint8_t* xq;
  const float* sx32;
  int fsteps;
  float* y;
  bool round;
  TcGroup grp;  // grouped rows (grp.row_expert set): a block per (row tile, expert, list)
  int lists = 1;
};

template <int FMT, int MI, int NI, int WR, int WT, int S>
void launch(const Args& a, cudaStream_t stream) {
  using C = TcCfg<FMT, MI, NI, WR, WT>;
  auto* kernel = tc_kernel<FMT, MI, NI, WR, WT, S>;
  static std::once_flag once;
  std::call_once(once, [&] {
    DI_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, S * C::kStage));
  });
  const bool grouped = a.grp.row_expert != nullptr;
  const dim3 grid(static_cast<unsigned>((a.N + C::kR - 1) / C::kR),
                  static_cast<unsigned>(grouped ? a.grp.E : (a.M + C::kBT - 1) / C::kBT),
                  static_cast<unsigned>(grouped ? a.lists : 1));
  launch_pdl(kernel, grid, C::kThreads, S * C::kStage, stream, a.w, a.ldw, a.sc, a.lds, a.B, a.N, a.K, a.M, a.M4, a.xq,
             a.sx32, a.fsteps, a.y, a.round, a.grp);
  DI_CUDA_CHECK(cudaGetLastError());
}

// The grouped GEMM's tile in force (linear_tc_set_grouped_variant): 0 = by rows per expert (the default), 1-4 = the
// tiles of grouped_tile() below wherever (tests, benchmarks). Every tile gives the same bits (each output's MMA chain
// is its own row's and token's).
std::atomic<int> g_grouped_variant{0};

// Grouped rows: 128 weight rows per block (four warps of two m16 tiles each) in four stages, tiles of 8, 16, 32 or 64
// tokens that walk an expert's rows (variants 1-4). Measured on the H200 (bench/RESULTS.md, twenty-fifth and
// twenty-sixth sessions; bench_cuda_gemv's grouped tables, FP4 experts of the V4.1-Flash shape): below 8 rows per
// expert (decode batches) tiles of 8 win (one m16 tile per warp, three stages and two warps lose too); at 8-16 rows
// tiles of 16 (9-20% faster than 8); from 32 rows (prefill chunks) tiles of 32 (33% faster than 8 at 64 rows); tiles
// of 64 lose everywhere (twice the shared memory: fewer blocks per SM).
int grouped_tile(const Args& a) {
  const int v = g_grouped_variant.load(std::memory_order_relaxed);
  if (v != 0) return v;
  const int64_t per_expert = a.M / std::max(1, a.grp.E);  // rows per expert, on average
  return per_expert >= 32 ? 3 : per_expert >= 8 ? 2 : 1;
}

template <int FMT>
void dispatch_grouped(const Args& a, cudaStream_t stream) {
  switch (grouped_tile(a)) {
    case 1:
      launch<FMT, 2, 1, 4, 1, 4>(a, stream);
      break;
    case 2:
      launch<FMT, 2, 2, 4, 1, 4>(a, stream);
      break;
    case 3:
      launch<FMT, 2, 4, 4, 1, 4>(a, stream);
      break;
    default:
      launch<FMT, 2, 4, 4, 2, 4>(a, stream);  // 8 warps: 128 rows x 64 tokens
      break;
  }
}

// Decode pipelines: as many stages as fit about 96 KiB (deep, to keep enough weight bytes in flight with few
// blocks per SM), at most 12 (FP8) / 24 (FP4, half the bytes a stage), at least 3.
template <int FMT, int NI, int WR>
constexpr int decode_stages() {
  constexpr int kStage = TcCfg<FMT, 1, NI, WR, 1>::kStage;
  constexpr int kMax = FMT == kFp8 ? 12 : 24;
  constexpr int s = 96 * 1024 / kStage;
  return s < 3 ? 3 : (s > kMax ? kMax : s);
}

template <int FMT>
void dispatch(const Args& a, cudaStream_t stream) {
  if (a.M <= 64) {
    // One pass over the weight: every token of the batch in one tile; 16 or 64 weight rows per block,
    // so that there are about two blocks per SM or more.
    const bool wide = (a.N + 63) / 64 >= 2 * sm_count();
    auto go = [&](auto ni) {
      constexpr int NI = decltype(ni)::value;
      if (wide)
        launch<FMT, 1, NI, 4, 1, decode_stages<FMT, NI, 4>()>(a, stream);
      else
        launch<FMT, 1, NI, 1, 1, decode_stages<FMT, NI, 1>()>(a, stream);
    };
    if (a.M <= 8)
      go(std::integral_constant<int, 1>{});
    else if (a.M <= 16)
      go(std::integral_constant<int, 2>{});
    else if (a.M <= 32)
      go(std::integral_constant<int, 4>{});
    else
      go(std::integral_constant<int, 8>{});
  } else if (a.M <= 256) {
    launch<FMT, 2, 4, 2, 2, 4>(a, stream);  // 64 x 64 tiles, 4 warps of 32 x 32
  } else {
    launch<FMT, 2, 8, 4, 2, 4>(a, stream);  // 128 x 128 tiles, 8 warps of 32 x 64
  }
}

// Why linear_tc cannot take this call ("" when it can).
std::string unsupported(const Tensor& x, const ops::QWeight& qw, const ops::LinearOpts& opts) {
  const std::string why = dense_operands_why(x, qw.w);
  if (!why.empty()) return why;
  const Tensor& w = qw.w;
  const int64_t M = x.size(0), N = w.size(0), K = w.size(1);
  if (x.size(1) != K) return "x and the weight disagree on K";
  if (opts.act_quant_block <= 0 || opts.act_quant_block % 32 != 0)
    return "needs the FP8 input site (act_quant_block a positive multiple of 32)";
  if (K % kBK != 0) return "needs K % 128 == 0";
  if (K % opts.act_quant_block != 0) return "needs K to be a multiple of act_quant_block";
  if (M >= (int64_t{1} << 22) || N >= (int64_t{1} << 30) || K >= (int64_t{1} << 30)) return "too large";
  if (M * K >= (int64_t{1} << 40)) return "too large";
  const Tensor& s = qw.scale;
  int64_t srows = 0, scols = 0, KS = 0;
  if (w.dtype() == DType::kE4M3) {
    if (qw.block <= 0 || qw.block % 32 != 0) return "needs an E4M3 block that is a multiple of 32";
    srows = (N + qw.block - 1) / qw.block, scols = (K + qw.block - 1) / qw.block;
    KS = std::gcd(opts.act_quant_block, qw.block);
    if (w.strides()[0] % 16 != 0) return "needs 16-byte aligned weight rows";
  } else if (w.dtype() == DType::kE2M1x2) {
    if (!w.is_contiguous()) return "a packed FP4 weight must be contiguous";
    srows = N, scols = K / 32;
    KS = 32;
  } else {
    return "only E4M3 and packed E2M1 weights";
  }
  if (reinterpret_cast<uintptr_t>(w.raw()) % 16 != 0) return "needs a 16-byte aligned weight";
  if (K % KS != 0) return "needs K to be a multiple of gcd(act_quant_block, block)";
  if (kBK % KS != 0) return "needs gcd(act_quant_block, block) to divide 128 (a stage holds whole fold blocks)";
  if (!s.defined() || s.device() != Device::kCUDA || s.dtype() != DType::kE8M0 || s.dim() != 2 || s.size(0) != srows ||
      s.size(1) != scols || (scols > 1 && s.strides()[1] != 1))
    return "the scale does not match the weight";
  if (w.dtype() == DType::kE2M1x2 && (s.strides()[0] % 4 != 0 || reinterpret_cast<uintptr_t>(s.raw()) % 4 != 0))
    return "needs 4-byte aligned FP4 scale rows";
  return "";
}

// x's pre-pass and the GEMM kernel (dense: grp unset; grouped: the experts' layout is w's). The caller has checked
// the call (unsupported() is empty).
void run_gemm(const Tensor& x, const ops::QWeight& qw, const ops::LinearOpts& opts, Tensor& y, const TcGroup& grp,
              int lists, cudaStream_t stream) {
  const int64_t M = x.size(0), N = qw.w.size(0), K = qw.w.size(1);
  const int act = static_cast<int>(opts.act_quant_block);
  const int64_t M4 = (M + 3) / 4 * 4;
  const int64_t code_bytes = (M * K + 255) / 256 * 256;
  const int64_t sx_bytes = (K / 32) * M4 * 4;
  const bool grouped = grp.row_expert != nullptr;
  const Tensor ws_buf = call_scratch(static_cast<size_t>(code_bytes + sx_bytes + (grouped ? (grp.E + 1) * 4 : 0)));
  uint8_t* ws = static_cast<uint8_t*>(ws_buf.raw());
  Args a{};
  a.xq = ws;
  a.sx32 = reinterpret_cast<const float*>(ws + code_bytes);
  a.grp = grp, a.lists = lists;
  if (grouped) {  // each expert's first row, for the GEMM's blocks
    int32_t* offsets = reinterpret_cast<int32_t*>(ws + code_bytes + sx_bytes);
    a.grp.offsets = offsets;
    expert_offsets_into(grp.row_expert, static_cast<int>(M), grp.E, offsets, stream);
  }

  const int64_t warps = M * (K / act);
  launch_pdl(quant_x_kernel, static_cast<unsigned>((warps + 7) / 8), 256, 0, stream, x.data<float>(), x.strides()[0],
             static_cast<int>(M), static_cast<int>(K), act, static_cast<int>(M4), ws,
             reinterpret_cast<float*>(ws + code_bytes));
  DI_CUDA_CHECK(cudaGetLastError());

  a.w = static_cast<const uint8_t*>(qw.w.raw());
  a.sc = static_cast<const uint8_t*>(qw.scale.raw());
  a.lds = qw.scale.strides()[0];
  a.N = static_cast<int>(N), a.K = static_cast<int>(K), a.M = static_cast<int>(M), a.M4 = static_cast<int>(M4);
  a.y = y.data<float>();
  a.round = opts.round_out_bf16;
  if (qw.w.dtype() == DType::kE4M3) {
    a.ldw = qw.w.strides()[0];
    a.B = static_cast<int>(qw.block);
    a.fsteps = static_cast<int>(std::gcd(opts.act_quant_block, qw.block) / 32);
    grouped ? dispatch_grouped<kFp8>(a, stream) : dispatch<kFp8>(a, stream);
  } else {
    a.ldw = K / 2;
    a.B = 32;
    a.fsteps = 1;
    grouped ? dispatch_grouped<kFp4>(a, stream) : dispatch<kFp4>(a, stream);
  }
}

}  // namespace

bool linear_tc_supported(const Tensor& x, const ops::QWeight& w, const ops::LinearOpts& opts) {
  return unsupported(x, w, opts).empty();
}

void linear_tc_into(const Tensor& x, const ops::QWeight& qw, const ops::LinearOpts& opts, Tensor& y,
                    CUstream_st* stream_ptr) {
  const char* op = "cuda::linear_tc";
  const std::string why = unsupported(x, qw, opts);
  DI_CHECK(why.empty(), "{}: unsupported call (x {}, weight {}): {}", op, x.defined() ? x.describe() : "undefined",
           qw.w.defined() ? qw.w.describe() : "undefined", why);
  const cudaStream_t stream = stream_ptr;
  const int64_t M = x.size(0), N = qw.w.size(0), K = qw.w.size(1);
  check_linear_out(y, M, N, op);
  if (M == 0 || N == 0) return;

  const int act = static_cast<int>(opts.act_quant_block);
  {  // decode batches: the GEMV of the same contract (linear_tc_gemv.cu)
    const bool fp4 = qw.w.dtype() == DType::kE2M1x2;
    TcGemvArgs g{};
    g.w = static_cast<const uint8_t*>(qw.w.raw()), g.ldw = fp4 ? K / 2 : qw.w.strides()[0];
    g.sc = static_cast<const uint8_t*>(qw.scale.raw()), g.lds = qw.scale.strides()[0];
    g.sc4 = g.lds % 4 == 0 && reinterpret_cast<uintptr_t>(g.sc) % 4 == 0;
    g.fp4 = fp4;
    g.B = fp4 ? 32 : static_cast<int>(qw.block), g.N = static_cast<int>(N), g.K = static_cast<int>(K);
    g.M = static_cast<int>(M);
    g.act = act, g.fsteps = fp4 ? 1 : static_cast<int>(std::gcd(opts.act_quant_block, qw.block) / 32);
    g.x = x.data<float>(), g.ldx = x.strides()[0];
    g.y = y.data<float>(), g.round = opts.round_out_bf16;
    if (tc_stream_takes(g, stream)) {
      tc_stream_into(g, stream);
      return;
    }
    if (tc_gemv_takes(g)) {
      tc_gemv_into(g, stream);
      return;
    }
  }
  run_gemm(x, qw, opts, y, TcGroup{}, 1, stream);
}

void linear_tc_grouped_gemm_into(const Tensor& x, const Tensor& row_expert, const uint8_t* const* w_table,
                                 const uint8_t* const* s_table, int lists, int n_experts, const ops::QWeight& w0,
                                 const ops::LinearOpts& opts, Tensor& y) {
  const char* op = "cuda::linear_tc_grouped_gemm";
  const std::string why = unsupported(x, w0, opts);
  DI_CHECK(why.empty(), "{}: unsupported call (x {}, weight {}): {}", op, x.describe(), w0.w.describe(), why);
  DI_CHECK(row_expert.defined() && row_expert.device() == Device::kCUDA && row_expert.dtype() == DType::kI32 &&
               row_expert.is_contiguous() && row_expert.numel() == x.size(0),
           "{}: row_expert must be int32 [{}] on CUDA", op, x.size(0));
  DI_CHECK(lists >= 1 && lists <= 65535 && n_experts >= 1 && n_experts <= 65535, "{}: {} lists of {} experts", op,
           lists, n_experts);
  const int64_t R = x.size(0), N = w0.out();
  check_linear_out(y, lists * R, N, op);
  if (R == 0 || N == 0) return;
  TcGroup grp;
  grp.row_expert = row_expert.data<int32_t>();
  grp.w_table = w_table, grp.s_table = s_table;
  grp.R = static_cast<int>(R), grp.E = n_experts;
  run_gemm(x, w0, opts, y, grp, lists, nullptr);
}

void expert_offsets_into(const int32_t* ids, int R, int E, int32_t* offsets, cudaStream_t stream) {
  launch_pdl(expert_offsets_kernel, static_cast<unsigned>((R + 1 + 255) / 256), 256, 0, stream, ids, R, E, offsets);
  DI_CUDA_CHECK(cudaGetLastError());
}

int linear_tc_set_grouped_variant(int v) {
  DI_CHECK(v >= 0 && v <= 4, "linear_tc_set_grouped_variant: {} is not 0 .. 4", v);
  return g_grouped_variant.exchange(v, std::memory_order_relaxed);
}

Tensor linear_tc(const Tensor& x, const ops::QWeight& w, const ops::LinearOpts& opts) {
  DI_CHECK(x.defined() && x.dim() == 2 && w.w.defined() && w.w.dim() == 2,
           "cuda::linear_tc: expected x [M, K] and W [N, K]");
  Tensor y = Tensor::empty({x.size(0), w.w.size(0)}, DType::kF32, Device::kCUDA);
  linear_tc_into(x, w, opts, y);
  return y;
}

}  // namespace deepinfer::cuda
