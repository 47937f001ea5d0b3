// fp8_gemm: the exact E4M3 linear tiled over rows of x and of the weight. Contract and order in linear_gemm_fp8.cuh.
//
// Block: 256 threads, 8 warps as 4 (x rows) x 2 (chain halves), own 64 weight rows x BM rows of x. Lane q owns weight
// rows n0 + 2q and + 1; warp (wm, h) owns the x rows m0 + wm TM .. + TM - 1 and the chains l = 4h .. 4h + 3. So a
// thread keeps TM x 2 outputs' 4 chain totals in registers for the whole of K (the two halves meet in shared memory
// for the final hsum), every x value a warp reads is the same for all its lanes (one shared-memory wavefront per
// LDS.128) and its weight reads are 256 contiguous bytes (two).
// K streams in stages of 128 columns (4 chunks of 32) through a ring of kStages: the raw weight rows and the x rows
// by cp.async, then every thread decodes its 16-byte pieces of the stage's weights once into fp32 (e4m3 * 2^-8, exact)
// in the chain-major layout [chunk][l][j][64 rows], which the compute reads as float2 per lane.
// Per stage, tile and chain l, a thread loads its rows' 4 (j) weights (4 LDS.64) and its x rows' 4 values (one
// LDS.128 each: the x layout puts chain l's values side by side), then forms per output the tile sum and its fold.
// Tiles of one chunk (B = 32) whose stage of x passes fast_raw_x (act-quantised x always does, short of group scales
// of 2^91) form s = ((p0 + p1) + p2) + p3 as fma(w3, x3, fma(w2, x2, fma(w1, x1, w0 x0))): every product is then exact
// in fp32, so each FMA rounds the same sum as the add it replaces (fp8_walk_gemv's fast path); 5 FP32 instructions per
// 4 products instead of 8.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <type_traits>

#include "cuda/common.cuh"
#include "cuda/fp_decode.cuh"
#include "cuda/gemv_fp8_x.cuh"
#include "cuda/linear_gemm_fp8.cuh"

namespace deepinfer::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarpsM = 4;            // warps along the rows of x (then 2 along the chains)
constexpr int kBN = 64;               // weight rows per block (2 per lane)
constexpr int kKS = 128;              // columns per stage
constexpr int kRawStride = kKS + 16;  // bytes per staged raw weight row: conflict-free 16-byte reads
constexpr int kStages = 3;
constexpr int kWsFloats = kKS * kBN;  // the decoded stage [4 chunks][8 l][4 j][64 rows]

// Rows of x per warp: 8 for tiles of one chunk (64 chain totals, transient products), 4 for longer tiles, whose 4
// chains per output and l stay live across the tile's chunks.
template <int G>
struct GemmCfg {
  static constexpr int kTM = G == 1 ? 8 : 4;
  static constexpr int kBM = kWarpsM * kTM;
  static constexpr int kRawBytes = kBN * kRawStride;
  static constexpr int kXBytes = kBM * kKS * 4;
  static constexpr int kStageBytes = kRawBytes + kXBytes;
};

// Shared memory: the ring [kStages][raw | x], the decoded stage, the tile factors [frows][T], the NaN flags [64].
template <int G>
int64_t gemm_smem(int K) {
  constexpr int B = 32 * G, frows = (kBN + B - 1) / B + 1;
  return int64_t{kStages} * GemmCfg<G>::kStageBytes + int64_t{kWsFloats} * 4 + int64_t{frows} * (K / B) * 4 + kBN * 4;
}
int64_t gemm_smem_for(int B, int K) {
  return B == 32 ? gemm_smem<1>(K) : (B == 64 ? gemm_smem<2>(K) : gemm_smem<4>(K));
}

// grp.table null: one matrix (w, sc) on x rows 0..M-1 into y rows 0..M-1. Else matrix blockIdx.z = l P + p of
// Fp8GemmGroups, M = R / P.
template <int G>
__global__ void __launch_bounds__(kThreads, 2)
    fp8_gemm_kernel(const uint8_t* __restrict__ w, int64_t ldw, const uint8_t* __restrict__ sc, int64_t lds, int N,
                    int K, const float* __restrict__ xp, int M, float* __restrict__ y, bool round, Fp8GemmGroups grp) {
  using C = GemmCfg<G>;
  constexpr int TM = C::kTM, BM = C::kBM, B = 32 * G, TPS = kKS / B;
  constexpr int XPT = BM * kKS / kThreads;  // x values per thread in a stage (the fast-path test)
  extern __shared__ __align__(16) uint8_t smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp % kWarpsM, h = warp / kWarpsM;
  const int m0 = blockIdx.x * BM, n0 = blockIdx.y * kBN;
  const int T = K / B, nst = K / kKS;
  int64_t ldx = K, ldy = N;    // between consecutive rows of the matrix's x and y
  if (grp.table != nullptr) {  // the matrix's expert id may come from the previous kernel: wait first
    pdl_wait();
    const int p = static_cast<int>(blockIdx.z) % grp.P, l = static_cast<int>(blockIdx.z) / grp.P;
    const int e = l * grp.E + grp.row_expert[p];
    w = grp.table[e], sc = grp.table[grp.L * grp.E + e];
    xp += static_cast<int64_t>(p) * K, ldx = static_cast<int64_t>(grp.P) * K;
    y += (static_cast<int64_t>(l) * grp.R + p) * N, ldy = static_cast<int64_t>(grp.P) * N;
  }
  const int frows = (kBN + B - 1) / B + 1;
  float* ws = reinterpret_cast<float*>(smem + kStages * C::kStageBytes);
  float* fac = ws + kWsFloats;  // [frows][T]: 2^(e-119) of scale rows n0 / B + r
  int* nanrow = reinterpret_cast<int*>(fac + frows * T);

  auto raw_at = [&](int st) { return smem + st * C::kStageBytes; };
  auto x_at = [&](int st) { return reinterpret_cast<float*>(smem + st * C::kStageBytes + C::kRawBytes); };
  auto issue_w = [&](int s) {  // 64 rows x 8 pieces: 2 per thread
    if (s >= nst) return;
    uint8_t* dst = raw_at(s % kStages);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int p = tid + i * kThreads, r = p >> 3, o = (p & 7) * 16;
      const int n = min(n0 + r, N - 1);
      cp_async16(dst + r * kRawStride + o, w + n * ldw + static_cast<int64_t>(s) * kKS + o);
    }
  };
  auto issue_x = [&](int s) {  // BM rows x 32 pieces
    if (s >= nst) return;
    float* dst = x_at(s % kStages);
#pragma unroll
    for (int i = 0; i < BM * 32 / kThreads; ++i) {
      const int p = tid + i * kThreads, r = p >> 5, o = (p & 31) * 4;
      const int m = min(m0 + r, M - 1);
      cp_async16(dst + r * kKS + o, xp + m * ldx + static_cast<int64_t>(s) * kKS + o);
    }
  };

  // The weights and their scales do not depend on the previous kernel: their first stages stream before the wait.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue_w(s);
  const int srow0 = n0 / B, srows = (N + B - 1) / B;
  for (int i = tid; i < frows * T; i += kThreads) {
    const int r = min(srow0 + i / T, srows - 1), t = i % T;
    fac[i] = fp8_tile_factor(sc[r * lds + t]);
  }
  if (tid < kBN) nanrow[tid] = 0;
  pdl_wait();
  pdl_launch_dependents();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    issue_x(s);
    cp_async_commit();
  }

  float tot[TM][2][4] = {};  // [x row][weight row][chain 4h + i], from +0
  uint32_t nanacc = 0;
  const int dn = tid & (kBN - 1), dp = tid >> 6;  // decode: weight row, first 16-byte piece (then + 4)
  const int nl = 2 * lane;                        // the thread's first weight row in the block
  const float* fr = fac + ((n0 + nl) / B - srow0) * T;
  const float2* wl = reinterpret_cast<const float2*>(ws) + nl / 2;

  for (int s = 0; s < nst; ++s) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage s landed for all; stage s - 1's slot and the decoded buffer are free
    issue_w(s + kStages - 1);
    issue_x(s + kStages - 1);
    cp_async_commit();
    // Decode: piece p of row dn holds columns 16p .. 16p + 15: chunk p / 2, j = 2 (p & 1) + u / 2, l = 4 (u & 1) + i.
    const uint8_t* raw = raw_at(s % kStages);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int p = dp + 4 * i;
      const uint4 v4 = *reinterpret_cast<const uint4*>(raw + dn * kRawStride + p * 16);
      const uint32_t wd[4] = {v4.x, v4.y, v4.z, v4.w};
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        nanacc |= nan_bits(wd[u]);
        float f[4];
        e4m3x4(wd[u], f);
        const int j = 2 * (p & 1) + (u >> 1), l0 = 4 * (u & 1);
#pragma unroll
        for (int e = 0; e < 4; ++e) ws[(((p >> 1) * 8 + l0 + e) * 4 + j) * kBN + dn] = f[e];
      }
    }
    const float* xstage = x_at(s % kStages);
    bool slow = false;  // a value of this stage's x outside the fast path (tiles of one chunk only)
    if constexpr (G == 1) {
#pragma unroll
      for (int i = 0; i < XPT; ++i) slow = slow || !fast_raw_x(xstage[tid + i * kThreads]);
    }
    const bool fast_stage = G == 1 && __syncthreads_or(slow) == 0;  // also: the decoded stage is complete
    if constexpr (G != 1) __syncthreads();
    const float* xs = xstage + wm * TM * kKS + 4 * (4 * h);
    // The stage's tiles, with the tile sums' form a compile-time choice (a run-time one inside the unrolled loops
    // is predicated: both forms issued).
    auto tiles = [&](auto fast_c) {
      [[maybe_unused]] constexpr bool fast = decltype(fast_c)::value;
#pragma unroll 1
      for (int tt = 0; tt < TPS; ++tt) {
        const float f = fr[s * TPS + tt];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int l = 4 * h + i;
          if constexpr (G == 1) {  // one product per chain: each output's tile sum folded at once
            float2 wv[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) wv[j] = wl[((tt * 8 + l) * 4 + j) * (kBN / 2)];
#pragma unroll
            for (int m = 0; m < TM; ++m) {
              const float4 x4 = *reinterpret_cast<const float4*>(xs + m * kKS + tt * 32 + 4 * i);
              const float xv[4] = {x4.x, x4.y, x4.z, x4.w};
#pragma unroll
              for (int n = 0; n < 2; ++n) {
                const float w0 = n == 0 ? wv[0].x : wv[0].y, w1 = n == 0 ? wv[1].x : wv[1].y;
                const float w2 = n == 0 ? wv[2].x : wv[2].y, w3 = n == 0 ? wv[3].x : wv[3].y;
                float sum;
                if constexpr (fast) {  // every product exact: the adds as an FMA chain
                  sum = __fmaf_rn(w3, xv[3], __fmaf_rn(w2, xv[2], __fmaf_rn(w1, xv[1], __fmaf_rn(w0, xv[0], 0.0f))));
                } else {
                  const float p0 = __fmaf_rn(w0, xv[0], 0.0f), p1 = __fmaf_rn(w1, xv[1], 0.0f);
                  const float p2 = __fmaf_rn(w2, xv[2], 0.0f), p3 = __fmaf_rn(w3, xv[3], 0.0f);
                  sum = __fadd_rn(__fadd_rn(__fadd_rn(p0, p1), p2), p3);
                }
                tot[m][n][i] = __fmaf_rn(sum, f, tot[m][n][i]);
              }
            }
          } else {  // the chains v[j] over the tile's G chunks, then the tile sum
            float v[TM][2][4];
#pragma unroll
            for (int g = 0; g < G; ++g) {
              const int c = tt * G + g;
              float2 wv[4];
#pragma unroll
              for (int j = 0; j < 4; ++j) wv[j] = wl[((c * 8 + l) * 4 + j) * (kBN / 2)];
#pragma unroll
              for (int m = 0; m < TM; ++m) {
                const float4 x4 = *reinterpret_cast<const float4*>(xs + m * kKS + c * 32 + 4 * i);
                const float xv[4] = {x4.x, x4.y, x4.z, x4.w};
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                  v[m][0][j] = __fmaf_rn(wv[j].x, xv[j], g == 0 ? 0.0f : v[m][0][j]);
                  v[m][1][j] = __fmaf_rn(wv[j].y, xv[j], g == 0 ? 0.0f : v[m][1][j]);
                }
              }
            }
#pragma unroll
            for (int m = 0; m < TM; ++m)
#pragma unroll
              for (int n = 0; n < 2; ++n) {
                const float sum = __fadd_rn(__fadd_rn(__fadd_rn(v[m][n][0], v[m][n][1]), v[m][n][2]), v[m][n][3]);
                tot[m][n][i] = __fmaf_rn(sum, f, tot[m][n][i]);
              }
          }
        }
      }
    };
    if (fast_stage)
      tiles(std::true_type{});
    else
      tiles(std::false_type{});
  }
  cp_async_wait<0>();
  if ((nanacc & 0x80808080u) != 0) nanrow[dn] = 1;
  __syncthreads();  // every stage read: the decoded buffer takes the second half's totals
  // The CPU's hsum ((t0 + t4) + (t2 + t6)) + ((t1 + t5) + (t3 + t7)), + the empty tail: warp (wm, 0) holds t0..t3,
  // warp (wm, 1) t4..t7 (a + b == b + a in IEEE arithmetic).
  float* half = ws + (wm * 32 + lane) * (TM * 8);
  if (h == 1) {
#pragma unroll
    for (int m = 0; m < TM; ++m)
#pragma unroll
      for (int c = 0; c < 2; ++c)
        *reinterpret_cast<float4*>(half + (m * 2 + c) * 4) =
            make_float4(tot[m][c][0], tot[m][c][1], tot[m][c][2], tot[m][c][3]);
  }
  __syncthreads();
  if (h == 1) return;
  const int n = n0 + nl;
  const bool nan0 = nanrow[nl] != 0, nan1 = nanrow[nl + 1] != 0;
#pragma unroll
  for (int m = 0; m < TM; ++m) {
    float o[2];
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const float4 u = *reinterpret_cast<const float4*>(half + (m * 2 + c) * 4);
      const float(&t)[4] = tot[m][c];
      const float hs = __fadd_rn(__fadd_rn(__fadd_rn(t[0], u.x), __fadd_rn(t[2], u.z)),
                                 __fadd_rn(__fadd_rn(t[1], u.y), __fadd_rn(t[3], u.w)));
      const float out = (c == 0 ? nan0 : nan1) ? __uint_as_float(0x7fc00000u) : __fadd_rn(hs, 0.0f);
      o[c] = round ? round_to_bf16(out) : out;
    }
    const int mm = m0 + wm * TM + m;
    if (mm >= M) continue;
    float* yr = y + mm * ldy;
    if (n + 1 < N && (N & 1) == 0) {
      *reinterpret_cast<float2*>(yr + n) = make_float2(o[0], o[1]);
    } else {
      if (n < N) yr[n] = o[0];
      if (n + 1 < N) yr[n + 1] = o[1];
    }
  }
}

template <int G>
void launch(const uint8_t* w, int64_t ldw, const uint8_t* sc, int64_t lds, int N, int K, const float* xp, int M,
            float* y, bool round, const Fp8GemmGroups& grp, int Z, cudaStream_t stream) {
  const int64_t smem = gemm_smem<G>(K);
  static std::once_flag once;
  std::call_once(once, [] {
    DI_CUDA_CHECK(cudaFuncSetAttribute(fp8_gemm_kernel<G>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_optin()));
  });
  DI_CHECK(smem <= smem_optin(), "cuda::fp8_gemm: {} bytes of shared memory needed (K = {})", smem, K);
  const dim3 grid(static_cast<unsigned>((M + GemmCfg<G>::kBM - 1) / GemmCfg<G>::kBM),
                  static_cast<unsigned>((N + kBN - 1) / kBN), static_cast<unsigned>(Z));
  launch_pdl(fp8_gemm_kernel<G>, grid, kThreads, smem, stream, w, ldw, sc, lds, N, K, xp, M, y, round, grp);
}

}  // namespace

bool fp8_gemm_supported(int B, int64_t K) {
  return (B == 32 || B == 64 || B == 128) && K >= kKS && K % kKS == 0 && gemm_smem_for(B, K) <= smem_optin();
}

void fp8_gemm_into(const uint8_t* w, int64_t ldw, const uint8_t* scale, int64_t lds, int B, int N, int K,
                   const float* xp, int M, float* y, bool round, cudaStream_t stream) {
  DI_CHECK(fp8_gemm_supported(B, K) && M >= 1 && N >= 1 && (N + kBN - 1) / kBN <= 65535,  // grid.y: weight tiles
           "cuda::fp8_gemm: unsupported call (B = {}, K = {}, M = {}, N = {})", B, K, M, N);
  const Fp8GemmGroups one;
  if (B == 32)
    launch<1>(w, ldw, scale, lds, N, K, xp, M, y, round, one, 1, stream);
  else if (B == 64)
    launch<2>(w, ldw, scale, lds, N, K, xp, M, y, round, one, 1, stream);
  else
    launch<4>(w, ldw, scale, lds, N, K, xp, M, y, round, one, 1, stream);
}

void fp8_gemm_grouped_into(const Fp8GemmGroups& g, int64_t ldw, int64_t lds, int B, int N, int K, const float* xp,
                           float* y, bool round, cudaStream_t stream) {
  const int64_t Z = int64_t{g.L} * g.P;
  DI_CHECK(fp8_gemm_supported(B, K) && g.table != nullptr && g.row_expert != nullptr && g.L >= 1 && g.E >= 1 &&
               g.P >= 1 && g.R >= g.P && g.R % g.P == 0 && Z <= 65535 && N >= 1 && (N + kBN - 1) / kBN <= 65535,
           "cuda::fp8_gemm_grouped: unsupported call (B = {}, K = {}, N = {}, {} lists of {}, period {} of {} rows)", B,
           K, N, g.L, g.E, g.P, g.R);
  const int M = g.R / g.P, z = static_cast<int>(Z);
  if (B == 32)
    launch<1>(nullptr, ldw, nullptr, lds, N, K, xp, M, y, round, g, z, stream);
  else if (B == 64)
    launch<2>(nullptr, ldw, nullptr, lds, N, K, xp, M, y, round, g, z, stream);
  else
    launch<4>(nullptr, ldw, nullptr, lds, N, K, xp, M, y, round, g, z, stream);
}

}  // namespace deepinfer::cuda
