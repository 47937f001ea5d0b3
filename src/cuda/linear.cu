// CUDA linear layer (FP8 / FP4 / BF16 weights), bit-exact with the CPU op. Contract in linear.cuh.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <type_traits>

#include "core/env.h"
#include "cuda/common.cuh"
#include "cuda/device.h"
#include "cuda/fp_decode.cuh"
#include "cuda/linear.cuh"
#include "cuda/linear_gemm_fp4.cuh"
#include "cuda/linear_gemm_fp8.cuh"
#include "cuda/linear_gemv.cuh"
#include "cuda/linear_gemv_bf16.cuh"
#include "cuda/linear_tc.cuh"
#include "cuda/linear_tc_bf16.cuh"
#include "cuda/quant.cuh"

namespace deepinfer::cuda {

namespace {

enum Fmt : int { kFp8 = 0, kFp4 = 1, kBf16 = 2 };

constexpr int kRows = 8;  // weight rows per thread block (divides every E4M3 tile size, so one scale row)

// ---- x pre-pass: optional FP8 fake quantisation into the padded x layout ---------------------------------
// x of rows [t*MT, t*MT + MT) lives at xt + t * tile_floats: groups of gk = 32 * G columns (G = the
// E4M3 tile in chunks; 1 for FP4 / BF16), each group [gk][MT] floats followed by 4 pad floats, so
// that threads reading consecutive groups hit different shared-memory banks. perm (with MT = 1 and gk = xg = K): a
// tiled GEMM's layout instead, each row's 32-column chunks permuted by fp8_gemm_x_pos (kPermFp8) or fp4_gemm_x_pos
// (kPermFp4).
enum XPerm : int { kPermNone = 0, kPermFp8 = 1, kPermFp4 = 2 };
__device__ __forceinline__ float& prep_x_at(float* out, int64_t c, int MT, int gk, int xg, int perm) {
  if (perm == kPermFp8) c = fp8_gemm_x_pos(c);
  if (perm == kPermFp4) c = fp4_gemm_x_pos(c);
  return out[(c / gk) * xg + (c % gk) * MT];
}

// Block (group g of x row m): columns [g group, (g + 1) group) of row m. kWarpGroups: a warp per group, 8 groups a
// block (act_quant_block up to 1,024: a block of a 32-column group's 32 threads left the pre-pass bound by block
// launches, ~0.6 ms for a prefill chunk's experts); else a block per group.
constexpr int kPrepWarps = 8;
template <bool kWarpGroups>
__global__ void prep_x_kernel(const float* x, int64_t ldx, int M, int K, int MT, int gk, int xg, int64_t tile_floats,
                              int64_t group, int64_t groups, bool quant, int perm, float* xt) {
  pdl_wait();
  pdl_launch_dependents();
  const int m = blockIdx.y;
  const int64_t g = kWarpGroups ? int64_t{blockIdx.x} * kPrepWarps + threadIdx.x / 32 : int64_t{blockIdx.x};
  if (g >= groups) return;
  const int tid = kWarpGroups ? threadIdx.x % 32 : threadIdx.x, nt = kWarpGroups ? 32 : blockDim.x;
  const int64_t c0 = g * group;
  const int64_t c1 = min(c0 + group, static_cast<int64_t>(K));
  float* out = xt + static_cast<int64_t>(m / MT) * tile_floats + m % MT;
  if (m >= M) {  // padding rows of the last tile
    for (int64_t c = c0 + tid; c < c1; c += nt) prep_x_at(out, c, MT, gk, xg, perm) = 0.0f;
    return;
  }
  const float* p = x + m * ldx;
  if (!quant) {
    for (int64_t c = c0 + tid; c < c1; c += nt) prep_x_at(out, c, MT, gk, xg, perm) = p[c];
    return;
  }
  float amax = 0.0f;  // as fake_quant_fp8_kernel (quant.cu), bit for bit the CPU op (a max: any order)
  for (int64_t c = c0 + tid; c < c1; c += nt) amax = fmaxf(amax, fabsf(p[c]));
  if constexpr (kWarpGroups) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  } else {
    amax = block_reduce(amax, MaxOp{}, 0.0f);
  }
  const float s = fp8_group_scale(amax);
  for (int64_t c = c0 + tid; c < c1; c += nt) prep_x_at(out, c, MT, gk, xg, perm) = fp8_fake_quant(p[c], s);
}

// prep_x_kernel over `rows` rows of x (rows past x's own are the last tile's padding, zeroed), per row its groups of
// act_quant_block columns (act_quant_block 0: x copied as is, in groups of 2,048).
void launch_prep_x(const Tensor& x, int64_t rows, int MT, int gk, int xg, int64_t tile_floats, int64_t act_quant_block,
                   XPerm perm, float* xt, cudaStream_t stream, const char* op) {
  const int64_t K = x.size(1);
  const bool quant = act_quant_block > 0;
  const int64_t group = quant ? act_quant_block : 2048, groups = (K + group - 1) / group;
  DI_CHECK(groups < (int64_t{1} << 31) && rows < 65536, "{}: x {} is too large for one launch", op, x.describe());
  const bool warps = quant && group <= 1024;
  const int64_t blocks = warps ? (groups + kPrepWarps - 1) / kPrepWarps : groups;
  launch_pdl(warps ? prep_x_kernel<true> : prep_x_kernel<false>,
             dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(rows)),
             warps ? 32 * kPrepWarps : threads_for(group, 256), 0, stream, x.data<float>(), x.strides()[0],
             static_cast<int>(x.size(0)), static_cast<int>(K), MT, gk, xg, tile_floats, group, groups, quant,
             static_cast<int>(perm), xt);
  DI_CUDA_CHECK(cudaGetLastError());
}

template <int MT>
__device__ __forceinline__ void load_x2(const float* p, float (&v)[2 * MT]) {  // 2 * MT consecutive floats
  if constexpr (MT == 1) {
    const float2 q = *reinterpret_cast<const float2*>(p);
    v[0] = q.x, v[1] = q.y;
  } else {
#pragma unroll
    for (int i = 0; i < MT / 2; ++i) {
      const float4 q = reinterpret_cast<const float4*>(p)[i];
      v[4 * i] = q.x, v[4 * i + 1] = q.y, v[4 * i + 2] = q.z, v[4 * i + 3] = q.w;
    }
  }
}

// Streams rows [n0, n0 + kRows) of W (clamped to N - 1) and the matching x groups through `stages`
// shared-memory stages with 16-byte cp.async; slab i = row bytes [i * slab, ...) and x groups
// [i * gps, ...). Every thread of the block calls these.
struct Stream {
  const uint8_t* w;
  int64_t ldw, row_bytes;
  int n0, N, slab, rp, stage_bytes;
  const float* xtile;
  int xg, gps, ngroups, nslab;
  uint8_t* smem;
  int stages;
  // kFull: 16-byte pieces of a full slab row when known at compile time (0: not known), so that the
  // piece -> (row, offset) split of full slabs is a shift rather than a division.
  template <int kFull>
  __device__ __forceinline__ void weights(int i, int tid, int nt) const {
    if (i >= nslab) return;
    uint8_t* st = smem + (i % stages) * stage_bytes;
    const int64_t k0 = static_cast<int64_t>(i) * slab;
    const int pieces = static_cast<int>(min(static_cast<int64_t>(slab), row_bytes - k0)) >> 4;
    auto copy = [&](int p, int r) {
      const int o = (p - r * pieces) << 4;
      const int n = min(n0 + r, N - 1);
      cp_async16(st + r * rp + o, w + n * ldw + k0 + o);
    };
    if (kFull > 0 && pieces == kFull) {
      for (int p = tid; p < kRows * kFull; p += nt) copy(p, p / (kFull > 0 ? kFull : 1));
    } else {
      for (int p = tid; p < kRows * pieces; p += nt) copy(p, p / pieces);
    }
  }
  __device__ __forceinline__ void x(int i, int tid, int nt) const {
    if (i >= nslab) return;
    uint8_t* st = smem + (i % stages) * stage_bytes + kRows * rp;
    const int pieces = min(gps, ngroups - i * gps) * xg / 4;
    const auto* src = reinterpret_cast<const uint8_t*>(xtile + static_cast<int64_t>(i) * gps * xg);
    for (int p = tid; p < pieces; p += nt) cp_async16(st + p * 16, src + p * 16);
  }
};

// ---- FP8 (E4M3 + E8M0 tiles of B = 32 G): one thread per (row, tile) ------------------------------------
// A tile's sums s[l] = ((v0 + v1) + v2) + v3 do not depend on other tiles, so the 8 rows x TPS tiles
// of a slab are computed by TPS * 8 threads at once (thread: row tid % 8, tile tid / 8; for G > 1 the
// v[j][l] chains run over the tile's G chunks in the thread). They go to shared memory, and 64 * MT
// threads (row, m, l) fold them into tot[l] = fma(s, 2^(e-119), tot) in tile order, one slab behind.
template <int MT, bool T32>
struct Fp8Cfg {
  static constexpr int kTps = T32 ? 32 : 16;  // tiles per slab
  static constexpr int kThreads = kRows * kTps;
  static constexpr int kStages = (T32 && MT < 4) ? 4 : 3;
  static constexpr int kLP = kTps + 4;          // fold buffer floats per (row, m, l)
  static constexpr int kRP = MT * 8 * kLP + 4;  // fold buffer floats per row
};

template <int MT, bool T32>
__global__ void __launch_bounds__(Fp8Cfg<MT, T32>::kThreads)
    fp8_kernel(const uint8_t* __restrict__ w, int64_t ldw, const uint8_t* __restrict__ sc, int64_t lds, int B, int N,
               int K, const float* __restrict__ xt, int64_t tile_floats, float* __restrict__ y, int M, bool round) {
  using C = Fp8Cfg<MT, T32>;
  constexpr int TPS = C::kTps, NT = C::kThreads, ST = C::kStages, LP = C::kLP, RP = C::kRP;
  constexpr int LG = 4 / MT;  // l values per float4 of x
  constexpr int kFullPieces = T32 ? TPS * 32 / 16 : 0;
  extern __shared__ __align__(16) uint8_t smem[];
  const int tid = threadIdx.x;
  const int G = T32 ? 1 : B / 32;
  const int T = (K + B - 1) / B;
  Stream s;
  s.w = w, s.ldw = ldw, s.row_bytes = K, s.n0 = blockIdx.x * kRows, s.N = N;
  s.slab = TPS * B, s.rp = s.slab + 16, s.xg = G * 32 * MT + 4;
  s.stage_bytes = kRows * s.rp + TPS * s.xg * 4;
  s.xtile = xt + blockIdx.y * tile_floats, s.gps = TPS, s.ngroups = T, s.nslab = (T + TPS - 1) / TPS;
  s.smem = smem, s.stages = ST;
  const int n0 = s.n0, nslab = s.nslab, xg = s.xg;

  // Only min(ST, nslab) stages are ever used (slab i lives in stage i % ST): the others are not allocated.
  float* sbuf = reinterpret_cast<float*>(smem + min(ST, nslab) * s.stage_bytes);  // [2][kRows][RP]
  float* fac = sbuf + 2 * kRows * RP;                                             // [nslab * TPS]
  int* nanrow = reinterpret_cast<int*>(fac + nslab * TPS);                        // [kRows]

#pragma unroll
  for (int i = 0; i < ST - 1; ++i) s.template weights<kFullPieces>(i, tid, NT);
  const uint8_t* srow = sc + static_cast<int64_t>(n0 / B) * lds;
  for (int i = tid; i < nslab * TPS; i += NT) {
    float f = 0.0f;
    if (i < T) f = fp8_tile_factor(srow[i]);  // 2^(e-119), the CPU's factor for the 2^-8-scaled codes
    fac[i] = f;
  }
  if (tid < kRows) nanrow[tid] = 0;
  pdl_wait();
#pragma unroll
  for (int i = 0; i < ST - 1; ++i) {
    s.x(i, tid, NT);
    cp_async_commit();
  }

  const int cr = tid & 7, ct = tid >> 3;                       // compute: row, tile in the slab
  const int fl = tid & 7, fr = (tid >> 3) & 7, fm = tid >> 6;  // fold: l, row, m
  const bool folder = tid < 64 * MT;
  float tot = 0.0f;
  uint32_t nanacc = 0;
  auto fold = [&](int j) {
    const float* sp = sbuf + (j & 1) * kRows * RP + fr * RP + (fm * 8 + fl) * LP;
    const float* fp = fac + j * TPS;
    const int nt = min(TPS, T - j * TPS);
    if (nt == TPS) {
#pragma unroll
      for (int q = 0; q < TPS / 4; ++q) {
        const float4 v = reinterpret_cast<const float4*>(sp)[q];
        const float4 f = reinterpret_cast<const float4*>(fp)[q];
        tot = __fmaf_rn(v.x, f.x, tot);
        tot = __fmaf_rn(v.y, f.y, tot);
        tot = __fmaf_rn(v.z, f.z, tot);
        tot = __fmaf_rn(v.w, f.w, tot);
      }
    } else {
      for (int t = 0; t < nt; ++t) tot = __fmaf_rn(sp[t], fp[t], tot);
    }
  };

  for (int i = 0; i < nslab; ++i) {
    cp_async_wait<ST - 2>();
    __syncthreads();  // slab i landed for everyone; slab i-1's stage and fold buffer (i+1)&1 are free
    s.template weights<kFullPieces>(i + ST - 1, tid, NT);
    s.x(i + ST - 1, tid, NT);
    cp_async_commit();
    if (i > 0 && folder) fold(i - 1);
    const int tile = i * TPS + ct;
    if (tile < T) {
      const uint8_t* st = smem + (i % ST) * s.stage_bytes;
      const uint8_t* wp = st + cr * s.rp + ct * B;
      const float* xp = reinterpret_cast<const float*>(st + kRows * s.rp) + ct * xg;
      float* so = sbuf + (i & 1) * kRows * RP + cr * RP + ct;
      if constexpr (T32) {
        const uint4 a = reinterpret_cast<const uint4*>(wp)[0], b = reinterpret_cast<const uint4*>(wp)[1];
        const uint32_t wd[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        float wf[32];
#pragma unroll
        for (int q = 0; q < 8; ++q) {
          nanacc |= nan_bits(wd[q]);
          e4m3x4(wd[q], wf + 4 * q);
        }
#pragma unroll
        for (int l0 = 0; l0 < 8; l0 += LG) {
          float xv[4][4];
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const float4 q = *reinterpret_cast<const float4*>(xp + (8 * j + l0) * MT);
            xv[j][0] = q.x, xv[j][1] = q.y, xv[j][2] = q.z, xv[j][3] = q.w;
          }
#pragma unroll
          for (int d = 0; d < LG; ++d) {
#pragma unroll
            for (int m = 0; m < MT; ++m) {
              const int l = l0 + d;
              const float p0 = __fmaf_rn(wf[l], xv[0][d * MT + m], 0.0f);
              const float p1 = __fmaf_rn(wf[8 + l], xv[1][d * MT + m], 0.0f);
              const float p2 = __fmaf_rn(wf[16 + l], xv[2][d * MT + m], 0.0f);
              const float p3 = __fmaf_rn(wf[24 + l], xv[3][d * MT + m], 0.0f);
              so[(m * 8 + l) * LP] = __fadd_rn(__fadd_rn(__fadd_rn(p0, p1), p2), p3);
            }
          }
        }
      } else {
        const int nch = min(G, (K - tile * B) / 32);
        float v[MT][32];
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
          for (int e = 0; e < 32; ++e) v[m][e] = 0.0f;
        for (int q = 0; q < nch; ++q) {
          const uint4 a = reinterpret_cast<const uint4*>(wp + q * 32)[0];
          const uint4 b = reinterpret_cast<const uint4*>(wp + q * 32)[1];
          const uint32_t wd[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
          float wf[32];
#pragma unroll
          for (int u = 0; u < 8; ++u) {
            nanacc |= nan_bits(wd[u]);
            e4m3x4(wd[u], wf + 4 * u);
          }
          const float* xq = xp + q * 32 * MT;
#pragma unroll
          for (int l0 = 0; l0 < 8; l0 += LG) {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              const float4 x4 = *reinterpret_cast<const float4*>(xq + (8 * j + l0) * MT);
              const float xv[4] = {x4.x, x4.y, x4.z, x4.w};
#pragma unroll
              for (int d = 0; d < LG; ++d)
#pragma unroll
                for (int m = 0; m < MT; ++m) {
                  const int e = 8 * j + l0 + d;
                  v[m][e] = __fmaf_rn(wf[e], xv[d * MT + m], v[m][e]);
                }
            }
          }
        }
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
          for (int l = 0; l < 8; ++l)
            so[(m * 8 + l) * LP] = __fadd_rn(__fadd_rn(__fadd_rn(v[m][l], v[m][8 + l]), v[m][16 + l]), v[m][24 + l]);
      }
    }
  }
  cp_async_wait<0>();
  if ((nanacc & 0x80808080u) != 0) nanrow[cr] = 1;
  __syncthreads();
  if (folder) {
    fold(nslab - 1);
    // hsum over tot[l] in the CPU's order: ((t0 + t4) + (t2 + t6)) + ((t1 + t5) + (t3 + t7)), + the empty tail.
    float h = __fadd_rn(tot, __shfl_down_sync(0xffffffffu, tot, 4, 8));
    h = __fadd_rn(h, __shfl_down_sync(0xffffffffu, h, 2, 8));
    h = __fadd_rn(h, __shfl_down_sync(0xffffffffu, h, 1, 8));
    const float out = __fadd_rn(h, 0.0f);
    const int n = n0 + fr, mm = blockIdx.y * MT + fm;
    if (fl == 0 && n < N && mm < M) {
      const float o = nanrow[fr] != 0 ? __uint_as_float(0x7fc00000u) : out;
      y[static_cast<int64_t>(mm) * N + n] = round ? round_to_bf16(o) : o;
    }
  }
}

// ---- FP4 / BF16: the v[j][l] chains run over all of K ---------------------------------------------------
// 16 threads per row, 8 rows per 128-thread block; thread q of a row owns two chains: BF16 elements
// 2q, 2q + 1 of each 32-chunk ((j, l) = (q / 4, 2 (q % 4) + {0, 1})); FP4 byte q of each 16-byte chunk
// (low nibble = element 2q: chain (q / 8, q % 8); high nibble: chain (2 + q / 8, q % 8)).
template <int FMT, int MT>
struct ChainCfg {
  static constexpr int kCps = FMT == kBf16 ? 16 : 32;  // chunks per slab
  static constexpr int kChunkBytes = FMT == kBf16 ? 64 : 16;
  static constexpr int kThreads = 128;
  static constexpr int kStages = MT >= 4 ? 3 : 4;
};

template <int FMT, int MT>
__global__ void __launch_bounds__(128)
    chain_kernel(const uint8_t* __restrict__ w, int64_t ldw, const uint8_t* __restrict__ sc, int64_t lds, int N, int K,
                 const float* __restrict__ xt, int64_t tile_floats, float* __restrict__ y, int M, bool round) {
  using C = ChainCfg<FMT, MT>;
  constexpr int CPS = C::kCps, CB = C::kChunkBytes, NT = C::kThreads, ST = C::kStages;
  constexpr int kFullPieces = CPS * CB / 16;
  extern __shared__ __align__(16) uint8_t smem[];
  const int tid = threadIdx.x;
  const int nchunks = K / 32;
  Stream s;
  s.w = w, s.ldw = ldw, s.row_bytes = static_cast<int64_t>(nchunks) * CB, s.n0 = blockIdx.x * kRows, s.N = N;
  s.slab = CPS * CB, s.rp = s.slab + 64, s.xg = 32 * MT + 4;
  s.stage_bytes = kRows * s.rp + CPS * s.xg * 4;
  s.xtile = xt + blockIdx.y * tile_floats, s.gps = CPS, s.ngroups = nchunks, s.nslab = (nchunks + CPS - 1) / CPS;
  s.smem = smem, s.stages = ST;
  const int n0 = s.n0, nslab = s.nslab, xg = s.xg;
  uint8_t* ssm = smem + min(ST, nslab) * s.stage_bytes;  // FP4 scales [kRows][nchunks] (after the used stages)

#pragma unroll
  for (int i = 0; i < ST - 1; ++i) s.template weights<kFullPieces>(i, tid, NT);
  if constexpr (FMT == kFp4) {
    for (int i = tid; i < kRows * nchunks; i += NT) {
      const int r = i / nchunks;
      ssm[i] = sc[static_cast<int64_t>(min(n0 + r, N - 1)) * lds + (i - r * nchunks)];
    }
  }
  pdl_wait();
#pragma unroll
  for (int i = 0; i < ST - 1; ++i) {
    s.x(i, tid, NT);
    cp_async_commit();
  }

  const int r = tid >> 4, q = tid & 15;
  float v0[MT], v1[MT];
#pragma unroll
  for (int m = 0; m < MT; ++m) v0[m] = v1[m] = 0.0f;

  for (int i = 0; i < nslab; ++i) {
    cp_async_wait<ST - 2>();
    __syncthreads();
    s.template weights<kFullPieces>(i + ST - 1, tid, NT);
    s.x(i + ST - 1, tid, NT);
    cp_async_commit();
    const uint8_t* st = smem + (i % ST) * s.stage_bytes;
    const uint8_t* wp = st + r * s.rp;
    const float* xs = reinterpret_cast<const float*>(st + kRows * s.rp) + 2 * q * MT;
    const int cend = min(CPS, nchunks - i * CPS);
#pragma unroll 4
    for (int c = 0; c < cend; ++c) {
      float f0, f1;
      if constexpr (FMT == kBf16) {
        const uint32_t u = *reinterpret_cast<const uint32_t*>(wp + c * 64 + 4 * q);
        f0 = __uint_as_float(u << 16);
        f1 = __uint_as_float(u & 0xffff0000u);
      } else {
        const uint32_t b = wp[c * 16 + q];
        const uint32_t e = ssm[r * nchunks + i * CPS + c];
        f0 = fp4_weight(e2m1_top(b << 28), e);  // e2m1 * 2^(e-127), one rounding as the CPU's
        f1 = fp4_weight(e2m1_top(b << 24), e);
      }
      float xv[2 * MT];
      load_x2<MT>(xs + c * xg, xv);
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        v0[m] = __fmaf_rn(f0, xv[m], v0[m]);
        v1[m] = __fmaf_rn(f1, xv[MT + m], v1[m]);
      }
    }
  }
  cp_async_wait<0>();

  const int n = n0 + r;
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    float out;
    if constexpr (FMT == kBf16) {
      // s[l] = ((v[0][l] + v[1][l]) + v[2][l]) + v[3][l]: threads q, q + 4, q + 8, q + 12; lanes q < 4 keep
      // tot[2q] (a) and tot[2q + 1] (b); then the CPU's hsum order.
      float a = __fadd_rn(__fadd_rn(__fadd_rn(v0[m], __shfl_down_sync(0xffffffffu, v0[m], 4, 16)),
                                    __shfl_down_sync(0xffffffffu, v0[m], 8, 16)),
                          __shfl_down_sync(0xffffffffu, v0[m], 12, 16));
      float b = __fadd_rn(__fadd_rn(__fadd_rn(v1[m], __shfl_down_sync(0xffffffffu, v1[m], 4, 16)),
                                    __shfl_down_sync(0xffffffffu, v1[m], 8, 16)),
                          __shfl_down_sync(0xffffffffu, v1[m], 12, 16));
      a = __fmaf_rn(a, 1.0f, 0.0f);
      b = __fmaf_rn(b, 1.0f, 0.0f);
      a = __fadd_rn(a, __shfl_down_sync(0xffffffffu, a, 2, 16));  // q = 0: t0 + t4, q = 1: t2 + t6
      b = __fadd_rn(b, __shfl_down_sync(0xffffffffu, b, 2, 16));  // q = 0: t1 + t5, q = 1: t3 + t7
      a = __fadd_rn(a, __shfl_down_sync(0xffffffffu, a, 1, 16));
      b = __fadd_rn(b, __shfl_down_sync(0xffffffffu, b, 1, 16));
      out = __fadd_rn(__fadd_rn(a, b), 0.0f);
    } else {
      // s[l] = ((lo_l + lo_{l+8}) + hi_l) + hi_{l+8} in threads q = l < 8, then hsum over l.
      float t = __fadd_rn(__fadd_rn(__fadd_rn(v0[m], __shfl_down_sync(0xffffffffu, v0[m], 8, 16)), v1[m]),
                          __shfl_down_sync(0xffffffffu, v1[m], 8, 16));
      t = __fmaf_rn(t, 1.0f, 0.0f);
      float h = __fadd_rn(t, __shfl_down_sync(0xffffffffu, t, 4, 16));
      h = __fadd_rn(h, __shfl_down_sync(0xffffffffu, h, 2, 16));
      h = __fadd_rn(h, __shfl_down_sync(0xffffffffu, h, 1, 16));
      out = __fadd_rn(h, 0.0f);
    }
    const int mm = blockIdx.y * MT + m;
    if (q == 0 && n < N && mm < M) y[static_cast<int64_t>(mm) * N + n] = round ? round_to_bf16(out) : out;
  }
}

// ---- host side --------------------------------------------------------------------------------------------
template <typename F>
void allow_smem(F* kernel, int64_t smem, int K) {
  const int optin = smem_optin();
  DI_CHECK(smem <= optin, "cuda::linear: {} bytes of shared memory needed, {} available (K = {})", smem, optin, K);
  DI_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
}

template <int MT, bool T32>
void launch_fp8(dim3 grid, const uint8_t* w, int64_t ldw, const uint8_t* s, int64_t lds, int B, int N, int K,
                const float* xt, int64_t tile_floats, float* y, int M, bool round, cudaStream_t stream) {
  using C = Fp8Cfg<MT, T32>;
  const int G = B / 32;
  const int64_t T = (K + B - 1) / B, nslab = (T + C::kTps - 1) / C::kTps;
  const int64_t stage = kRows * (C::kTps * B + 16) + C::kTps * (G * 32 * MT + 4) * 4;
  const int64_t smem =
      std::min<int64_t>(C::kStages, nslab) * stage + 2 * kRows * C::kRP * 4 + nslab * C::kTps * 4 + kRows * 4;
  static std::once_flag once;
  std::call_once(once, [&] { allow_smem(fp8_kernel<MT, T32>, smem, K); });
  DI_CHECK(smem <= smem_optin(), "cuda::linear: {} bytes of shared memory needed (K = {}, B = {})", smem, K, B);
  launch_pdl(fp8_kernel<MT, T32>, grid, C::kThreads, smem, stream, w, ldw, s, lds, B, N, K, xt, tile_floats, y, M,
             round);
}

template <int FMT, int MT>
void launch_chain(dim3 grid, const uint8_t* w, int64_t ldw, const uint8_t* s, int64_t lds, int N, int K,
                  const float* xt, int64_t tile_floats, float* y, int M, bool round, cudaStream_t stream) {
  using C = ChainCfg<FMT, MT>;
  const int64_t stage = kRows * (C::kCps * C::kChunkBytes + 64) + C::kCps * (32 * MT + 4) * 4;
  const int64_t nslab = (K / 32 + C::kCps - 1) / C::kCps;
  const int64_t smem =
      std::min<int64_t>(C::kStages, nslab) * stage + (FMT == kFp4 ? (kRows * (K / 32) + 15) / 16 * 16 : 0);
  static std::once_flag once;
  std::call_once(once, [&] { allow_smem(chain_kernel<FMT, MT>, smem, K); });
  DI_CHECK(smem <= smem_optin(), "cuda::linear: {} bytes of shared memory needed (K = {})", smem, K);
  launch_pdl(chain_kernel<FMT, MT>, grid, C::kThreads, smem, stream, w, ldw, s, lds, N, K, xt, tile_floats, y, M,
             round);
}

// The most rows of x that linear_exact sends to the decode GEMV (DEEPINFER_CUDA_GEMV_ROWS, its default in the env
// table; 1 keeps every call of 2+ rows on the slab kernels).
int64_t gemv_rows_max() {
  static const int64_t v = env_int("DEEPINFER_CUDA_GEMV_ROWS", 1);
  return v;
}

std::atomic<int64_t> fp8_gemm_rows_set{-1};  // linear_set_fp8_gemm_rows (-1: DEEPINFER_CUDA_FP8_GEMM_ROWS)
std::atomic<int64_t> fp4_gemm_rows_set{-1};  // linear_set_fp4_gemm_rows (-1: DEEPINFER_CUDA_FP4_GEMM_ROWS)

// The exact linear: when `decode_gemv`, the tiled E4M3 GEMM (linear_gemm_fp8.cuh) for calls of many rows and the
// decode GEMV (linear_gemv.cuh) for the few-row calls it takes; else this file's slab kernels. All replay the CPU op's
// order, so the choice never changes a bit.
void linear_exact(const Tensor& x, const ops::QWeight& qw, const ops::LinearOpts& opts, Tensor& y, cudaStream_t stream,
                  bool decode_gemv) {
  const char* op = "cuda::linear";
  DI_CHECK(x.defined() && x.device() == Device::kCUDA && x.dtype() == DType::kF32 && x.dim() == 2,
           "{}: x must be a 2-D float32 CUDA tensor, got {}", op, x.describe());
  DI_CHECK(x.size(1) <= 1 || x.strides()[1] == 1, "{}: x's rows must be dense, got {}", op, x.describe());
  const Tensor& w = qw.w;
  DI_CHECK(w.defined() && w.device() == Device::kCUDA && w.dim() == 2,
           "{}: the weight must be a 2-D CUDA tensor, got {}", op, w.describe());
  DI_CHECK(w.size(1) <= 1 || w.strides()[1] == 1, "{}: the weight's rows must be dense, got {}", op, w.describe());
  const int64_t M = x.size(0), N = w.size(0), K = w.size(1);
  DI_CHECK(x.size(1) == K, "{}: input {} has K = {} but weight {} has in = {}", op, x.describe(), x.size(1),
           w.describe(), K);
  check_linear_out(y, M, N, op);
  DI_CHECK(opts.act_quant_block >= 0, "{}: act_quant_block must be >= 0, got {}", op, opts.act_quant_block);
  DI_CHECK(K % 32 == 0, "{}: the CUDA kernel needs in % 32 == 0, got {}", op, w.describe());
  DI_CHECK(N < (int64_t{1} << 31) && K < (int64_t{1} << 30) && M < (int64_t{1} << 30), "{}: {} is too large", op,
           w.describe());
  if (M == 0 || N == 0) return;
  if (K == 0) {
    flush_deferred();
    DI_CUDA_CHECK(cudaMemsetAsync(y.raw(), 0, y.nbytes(), stream != nullptr ? stream : current_stream()));
    return;
  }

  const WeightLayout wl = weight_layout(qw, op);
  const int fmt = wl.fmt, B = wl.B;
  const int64_t ldw = wl.ldw, lds = wl.lds;
  const uint8_t* s = wl.scale;
  // The decode GEMV takes the single-row E4M3 calls of up to kGemvMaxRows weight rows, where it
  // measured faster than the slab kernel (bench_cuda_gemv, V4.1 shapes at M = 1: wkv [512, 5120]
  // 1.34x, wq_a [1280, 5120] 1.21x); on wider weights and on FP4 / BF16 single rows the slab kernel
  // is as fast or faster (its grouped mode is what the routed experts use: linear_grouped.cu).
  constexpr int64_t kGemvMaxRows = 2048;
  // Single-row E4M3 calls on the weights where fp8_walk_gemv measured fastest (gemv_fp8_uses_walk: from 2,048
  // rows, so wq_b, wo_b, the shared expert's w1 / w3 and w2, the indexer's wq_b; narrower ones, wq_a + wkv among them,
  // take the GEMV's fp8_gemv by the row limit above) also go to the GEMV, which needs no prep_x launch; under variant 2
  // (forced) every single-row E4M3 call does.
  const bool walk = fmt == kFp8 && M == 1 && gemv_fp8_uses_walk(false, N);
  // Calls of 2 <= M <= gemv_rows_max() rows (decode batches, prefill chunks) on the shapes where
  // bench_cuda_gemv's batched table (M = 2..64, V4.1 shapes) and bench_cuda_model measured the GEMV faster: the
  // BF16 head (chain_gemv, 1.2x to 1.8x; on narrow BF16 weights, the gate [384, 5120], the slab kernel was
  // 2.7x faster at M = 32); E4M3 on fp8_walk_gemv from 4,096 weight rows (wq_b 1.7x to 2.1x, wo_b up to 1.6x,
  // shared w2 1.1x to 1.7x) and, for K >= 4,096, on narrower weights once N * M >= 32,768 (shared w1 / w3
  // [2304, 5120] from M = 16, wq_a [1024, 5120] from 32, wkv [512, 5120] at 64); below that the slab kernel's
  // x pre-pass and 8-row slabs won. Both kernels scale linearly in M past 16, so the ratios hold at larger M
  // (prefill of 4,096 tokens 1.23x end to end).
  constexpr int64_t kWalkBatchRows = 32768, kBf16GemvMinN = 16384;
  const bool batch =
      M >= 2 && M <= gemv_rows_max() &&
      ((fmt == kBf16 && N >= kBf16GemvMinN) || (fmt == kFp8 && (N >= 4096 || (K >= 4096 && N * M >= kWalkBatchRows))));
  // Single-row BF16 calls on narrow weights (the gate, the compressors' and indexer's projections) go to
  // bf16_lane_gemv where it takes them (a warp per row: the gate [384, 5120] took 8.0 us on the slab kernel, plus its
  // x pre-pass's launch).
  const bool bf16_row = fmt == kBf16 && M == 1;
  if (decode_gemv && fmt == kFp8 && fp8_gemm_takes(M, M, B, K)) {
    const Tensor xq = fp8_gemm_x(x, opts.act_quant_block, stream);
    fp8_gemm_into(static_cast<const uint8_t*>(w.raw()), ldw, s, lds, B, static_cast<int>(N), static_cast<int>(K),
                  xq.data<float>(), static_cast<int>(M), y.data<float>(), opts.round_out_bf16, stream);
    return;
  }
  if (decode_gemv && fmt == kFp4 && fp4_gemm_takes(M, M, K)) {
    const Tensor xq = fp4_gemm_x(x, opts.act_quant_block, stream);
    fp4_gemm_into(static_cast<const uint8_t*>(w.raw()), ldw, s, lds, static_cast<int>(N), static_cast<int>(K),
                  xq.data<float>(), static_cast<int>(M), y.data<float>(), opts.round_out_bf16, stream);
    return;
  }
  if (decode_gemv && ((fmt == kFp8 && ((M == 1 && N <= kGemvMaxRows) || walk)) || batch || bf16_row)) {
    GemvArgs a;
    a.fmt = fmt, a.w = static_cast<const uint8_t*>(w.raw()), a.ldw = ldw, a.scale = s, a.lds = lds, a.B = B;
    a.N = static_cast<int>(N), a.K = static_cast<int>(K);
    a.x = x.data<float>(), a.ldx = x.strides()[0], a.M = static_cast<int>(M);
    a.act_quant_block = opts.act_quant_block, a.round = opts.round_out_bf16, a.y = y.data<float>();
    if (gemv_supported(a) && (!bf16_row || gemv_bf16_lane_supported(a))) {
      gemv_into(a, stream);
      return;
    }
  }

  // x rows per pass: MT <= 4 (<= 2 for E4M3 tiles above 32, whose chains keep 32 MT accumulators).
  const int mt_max = fmt == kFp8 && B != 32 ? 2 : 4;
  const int MT = M <= 1 ? 1 : (M <= 2 ? 2 : mt_max);
  const int64_t tiles = (M + MT - 1) / MT;
  DI_CHECK(tiles * MT < 65536, "{}: M = {} is too large for one launch", op, M);
  const int gk = fmt == kFp8 ? B : 32;  // x group: one E4M3 tile, else one 32-chunk
  const int xg = gk * MT + 4;
  const int64_t tile_floats = (K + gk - 1) / gk * xg;
  const Tensor xt_buf = call_scratch(static_cast<size_t>(tiles * tile_floats) * sizeof(float));
  float* xt = xt_buf.data<float>();

  launch_prep_x(x, tiles * MT, MT, gk, xg, tile_floats, opts.act_quant_block, kPermNone, xt, stream, op);

  const dim3 grid(static_cast<unsigned>((N + kRows - 1) / kRows), static_cast<unsigned>(tiles));
  const auto* wp = static_cast<const uint8_t*>(w.raw());
  float* yp = y.data<float>();
  const int Ni = static_cast<int>(N), Ki = static_cast<int>(K), Mi = static_cast<int>(M);
  const bool rnd = opts.round_out_bf16;
  if (fmt == kFp8) {
    if (B == 32) {
      if (MT == 1)
        launch_fp8<1, true>(grid, wp, ldw, s, lds, B, Ni, Ki, xt, tile_floats, yp, Mi, rnd, stream);
      else if (MT == 2)
        launch_fp8<2, true>(grid, wp, ldw, s, lds, B, Ni, Ki, xt, tile_floats, yp, Mi, rnd, stream);
      else
        launch_fp8<4, true>(grid, wp, ldw, s, lds, B, Ni, Ki, xt, tile_floats, yp, Mi, rnd, stream);
    } else {
      if (MT == 1)
        launch_fp8<1, false>(grid, wp, ldw, s, lds, B, Ni, Ki, xt, tile_floats, yp, Mi, rnd, stream);
      else
        launch_fp8<2, false>(grid, wp, ldw, s, lds, B, Ni, Ki, xt, tile_floats, yp, Mi, rnd, stream);
    }
  } else {
    auto go = [&](auto fmt_c) {
      constexpr int F = decltype(fmt_c)::value;
      if (MT == 1)
        launch_chain<F, 1>(grid, wp, ldw, s, lds, Ni, Ki, xt, tile_floats, yp, Mi, rnd, stream);
      else if (MT == 2)
        launch_chain<F, 2>(grid, wp, ldw, s, lds, Ni, Ki, xt, tile_floats, yp, Mi, rnd, stream);
      else
        launch_chain<F, 4>(grid, wp, ldw, s, lds, Ni, Ki, xt, tile_floats, yp, Mi, rnd, stream);
    };
    if (fmt == kFp4)
      go(std::integral_constant<int, kFp4>{});
    else
      go(std::integral_constant<int, kBf16>{});
  }
}

}  // namespace

WeightLayout weight_layout(const ops::QWeight& qw, const char* op) {
  const Tensor& w = qw.w;
  DI_CHECK(w.defined() && w.device() == Device::kCUDA && w.dim() == 2,
           "{}: the weight must be a 2-D CUDA tensor, got {}", op,
           w.defined() ? w.describe() : std::string("(undefined)"));
  DI_CHECK(w.size(1) <= 1 || w.strides()[1] == 1, "{}: the weight's rows must be dense, got {}", op, w.describe());
  const int64_t N = w.size(0), K = w.size(1);
  WeightLayout l;
  int64_t esize_num = 2, esize_den = 1;  // bytes per element = num / den
  auto check_scale = [&](int64_t rows, int64_t cols) {
    const Tensor& sct = qw.scale;
    DI_CHECK(sct.defined() && sct.device() == Device::kCUDA && sct.dtype() == DType::kE8M0 && sct.dim() == 2 &&
                 sct.size(0) == rows && sct.size(1) == cols && (cols <= 1 || sct.strides()[1] == 1),
             "{}: scale {} does not match weight {}: expected a dense CUDA float8_e8m0 [{}, {}]", op,
             sct.defined() ? sct.describe() : std::string("(undefined)"), w.describe(), rows, cols);
    l.scale = static_cast<const uint8_t*>(sct.raw());
    l.lds = sct.strides()[0];
  };
  switch (w.dtype()) {
    case DType::kBF16:
      DI_CHECK(!qw.scale.defined(), "{}: a bfloat16 weight takes no scale", op);
      l.fmt = kBf16;
      break;
    case DType::kE4M3:
      l.fmt = kFp8, esize_num = 1;
      DI_CHECK(qw.block > 0 && qw.block % 32 == 0,
               "{}: the CUDA kernel needs an E4M3 tile size that is a multiple of 32, got {}", op, qw.block);
      l.B = static_cast<int>(qw.block);
      check_scale((N + l.B - 1) / l.B, (K + l.B - 1) / l.B);
      break;
    case DType::kE2M1x2:
      l.fmt = kFp4, esize_num = 1, esize_den = 2;
      DI_CHECK(w.is_contiguous(), "{}: a packed FP4 weight must be contiguous, got {}", op, w.describe());
      check_scale(N, K / 32);
      break;
    default:
      fail("{}: unsupported weight {} on CUDA (expected bfloat16, float8_e4m3 or packed float4_e2m1)", op,
           w.describe());
  }
  l.ldw = l.fmt == kFp4 ? K / 2 : w.strides()[0] * esize_num / esize_den;
  DI_CHECK(reinterpret_cast<uintptr_t>(w.raw()) % 16 == 0 && l.ldw % 16 == 0,
           "{}: the CUDA kernel needs 16-byte aligned weight rows, got {}", op, w.describe());
  return l;
}

void linear_into(const Tensor& x, const ops::QWeight& w, const ops::LinearOpts& opts, Tensor& y, CUstream_st* stream) {
  linear_exact(x, w, opts, y, stream, false);
}

void linear_exact_into(const Tensor& x, const ops::QWeight& w, const ops::LinearOpts& opts, Tensor& y,
                       CUstream_st* stream) {
  linear_exact(x, w, opts, y, stream, true);
}

void linear_set_fp8_gemm_rows(int64_t rows) { fp8_gemm_rows_set.store(rows < 0 ? -1 : rows); }

int64_t fp8_gemm_rows_min() {
  static const int64_t v = env_int("DEEPINFER_CUDA_FP8_GEMM_ROWS", 0);
  const int64_t set = fp8_gemm_rows_set.load(std::memory_order_relaxed);
  return set >= 0 ? set : v;
}

void linear_set_fp4_gemm_rows(int64_t rows) { fp4_gemm_rows_set.store(rows < 0 ? -1 : rows); }

int64_t fp4_gemm_rows_min() {
  static const int64_t v = env_int("DEEPINFER_CUDA_FP4_GEMM_ROWS", 0);
  const int64_t set = fp4_gemm_rows_set.load(std::memory_order_relaxed);
  return set >= 0 ? set : v;
}

namespace {

// The tiled GEMMs' common conditions: their threshold `from` (0: never) reached, and x's rows within the pre-pass's
// grid.y (tiled_x).
bool tiled_takes(int64_t from, int64_t rows, int64_t x_rows) { return from > 0 && rows >= from && x_rows < 65536; }

// x [M, K] act-quantised by the pre-pass into a tiled GEMM's layout `perm`, in a call scratch.
Tensor tiled_x(const Tensor& x, int64_t act_quant_block, XPerm perm, cudaStream_t stream, const char* op) {
  const int64_t M = x.size(0), K = x.size(1);
  const Tensor xq = call_scratch(static_cast<size_t>(M * K) * sizeof(float));
  launch_prep_x(x, M, 1, static_cast<int>(K), static_cast<int>(K), K, act_quant_block, perm, xq.data<float>(), stream,
                op);
  return xq;
}

}  // namespace

bool fp8_gemm_takes(int64_t rows, int64_t x_rows, int B, int64_t K) {
  return tiled_takes(fp8_gemm_rows_min(), rows, x_rows) && fp8_gemm_supported(B, K);
}

Tensor fp8_gemm_x(const Tensor& x, int64_t act_quant_block, cudaStream_t stream) {
  return tiled_x(x, act_quant_block, kPermFp8, stream, "cuda::fp8_gemm");
}

bool fp4_gemm_takes(int64_t rows, int64_t x_rows, int64_t K) {
  return tiled_takes(fp4_gemm_rows_min(), rows, x_rows) && fp4_gemm_supported(K);
}

Tensor fp4_gemm_x(const Tensor& x, int64_t act_quant_block, cudaStream_t stream) {
  return tiled_x(x, act_quant_block, kPermFp4, stream, "cuda::fp4_gemm");
}

int64_t tc_from_rows() {
  constexpr int64_t kAutoTcRows = 64;
  static const int64_t tc_from = [] {
    const std::string v = env_value("DEEPINFER_CUDA_GEMM");
    DI_CHECK(v == "exact" || v == "tc" || v == "auto", "DEEPINFER_CUDA_GEMM must be 'exact', 'tc' or 'auto' (got '{}')",
             v);
    return v == "tc" ? int64_t{0} : v == "auto" ? kAutoTcRows : INT64_MAX;
  }();
  return tc_from;
}

Tensor linear(const Tensor& x, const ops::QWeight& w, const ops::LinearOpts& opts) {
  DI_CHECK(x.defined() && x.dim() == 2 && w.w.defined() && w.w.dim() == 2,
           "cuda::linear: expected x [M, K] and W [N, K]");
  Tensor y = Tensor::empty({x.size(0), w.w.size(0)}, DType::kF32, Device::kCUDA);
  // DEEPINFER_CUDA_GEMM=tc: the tensor-core kernel (linear_tc.cuh, within tolerance of the CPU op) for
  // the quantised weights at the FP8 input site; "exact" (default): this file's bit-exact kernel;
  // "auto": tc from kAutoTcRows rows of x up, exact below (fast decode and fast prefill, but a row's
  // result then depends on how many rows share the call: not batch-invariant).
  // The BF16 vocabulary heads take their own tensor-core kernel under the same switch (linear_tc_bf16.cuh).
  if (x.size(0) >= tc_from_rows() && linear_tc_supported(x, w, opts))
    linear_tc_into(x, w, opts, y);
  else if (x.size(0) >= tc_from_rows() && linear_tc_bf16_takes(x, w, opts))
    linear_tc_bf16_into(x, w, opts, y);
  else
    linear_exact(x, w, opts, y, nullptr, true);
  return y;
}

}  // namespace deepinfer::cuda
