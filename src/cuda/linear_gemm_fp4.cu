// fp4_gemm: the exact FP4 linear tiled over rows of x and of the weight. Contract and order in linear_gemm_fp4.cuh.
//
// Block: 512 threads, 16 warps as 8 (chain l) x 2 (x-row groups), own 64 weight rows x 16 rows of x. Lane q owns
// weight rows n0 + 2q and + 1; warp (l, g) owns chain l (all four j) of the x rows m0 + 8g .. + 7. Each output's 32
// chains live in 8 threads (one per l) for the whole of K, 64 accumulators a thread; at the end each thread forms
// s[l] = ((v0 + v1) + v2) + v3 and tot[l] = fma(s, 1, 0), and the 8 totals meet in shared memory for the CPU's hsum.
// Why the chains go across warps and not across a thread's registers: all 32 chains of 8 x rows x 2 weight rows would
// be 512 registers; a warp per l keeps every x value a warp reads the same for all its lanes (one broadcast LDS.128 for
// a row's four j) and its weight reads 256 contiguous bytes (two wavefronts per LDS.64).
// K streams in stages of 128 columns (4 chunks of 32): the raw weight rows (64 bytes each) and the x rows by cp.async
// through a ring of 4 slots, 2 stages ahead; each thread decodes 16 weights of a stage (a half chunk of one row: 8
// bytes, the chunk's scale code) into fp32 in the chain-major layout [chunk][l][j][64 rows] of one of two buffers,
// while the compute reads the other: one barrier per stage. Weights through fp4_word_weights (fp_decode.cuh): exact
// fp16 arithmetic for scale codes 104..128, the exact fp32 decode otherwise (255 = NaN propagates as on the CPU).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <mutex>

#include "cuda/common.cuh"
#include "cuda/fp_decode.cuh"
#include "cuda/linear_gemm_fp4.cuh"

namespace deepinfer::cuda {

namespace {

constexpr int kThreads = 512;
constexpr int kTM = 8;                    // x rows per warp
constexpr int kBM = 2 * kTM;              // x rows per block pass
constexpr int kBN = 64;                   // weight rows per block (2 per lane)
constexpr int kKS = 128;                  // columns per stage
constexpr int kRawRow = kKS / 2;          // packed bytes per weight row and stage
constexpr int kRawStride = kRawRow + 16;  // staged raw row: 16-byte aligned cp.async targets
constexpr int kRawBytes = kBN * kRawStride;
constexpr int kXBytes = kBM * kKS * 4;
constexpr int kSlotBytes = kRawBytes + kXBytes;
constexpr int kSlots = 4, kAhead = 2;  // a slot is refilled only after its x was read (two stages later)
constexpr int kWsFloats = kKS * kBN;   // one decoded stage [4 chunks][8 l][4 j][64 rows]

// Shared memory: the ring, two decoded stages (then the totals [8 l][16 x rows][64 weight rows]), the scale codes
// [64 rows][K / 32].
int64_t gemm_smem(int64_t K) { return int64_t{kSlots} * kSlotBytes + 2 * int64_t{kWsFloats} * 4 + kBN * (K / 32); }

__global__ void __launch_bounds__(kThreads, 1)
    fp4_gemm_kernel(const uint8_t* __restrict__ w, int64_t ldw, const uint8_t* __restrict__ sc, int64_t lds, int N,
                    int K, const float* __restrict__ xp, int M, float* __restrict__ y, bool round, Fp4GemmGroups grp) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int l = warp & 7, g = warp >> 3;
  const int n0 = blockIdx.x * kBN;
  const int T = K / 32, nst = K / kKS;
  int m_lo, m_hi;
  if (grp.table != nullptr) {  // the expert's rows and matrix come from the previous kernels: wait first
    pdl_wait();
    pdl_launch_dependents();
    const int e = static_cast<int>(blockIdx.y), li = static_cast<int>(blockIdx.z);
    m_lo = grp.offsets[e], m_hi = grp.offsets[e + 1];
    if (m_lo >= m_hi) return;
    w = grp.table[li * grp.E + e], sc = grp.table[(grp.L + li) * grp.E + e];
    y += static_cast<int64_t>(li) * grp.R * N;
  } else {
    m_lo = blockIdx.y * kBM, m_hi = min(M, m_lo + kBM);
  }
  float* ws = reinterpret_cast<float*>(smem + kSlots * kSlotBytes);
  uint8_t* codes = reinterpret_cast<uint8_t*>(ws + 2 * kWsFloats);

  auto raw_at = [&](int s) { return smem + (s % kSlots) * kSlotBytes; };
  auto x_at = [&](int s) { return reinterpret_cast<float*>(smem + (s % kSlots) * kSlotBytes + kRawBytes); };
  auto issue_w = [&](int s) {  // 64 rows x 4 pieces
    if (s < nst && tid < kBN * 4) {
      const int r = tid >> 2, o = (tid & 3) * 16;
      const int n = min(n0 + r, N - 1);
      cp_async16(raw_at(s) + r * kRawStride + o, w + n * ldw + static_cast<int64_t>(s) * kRawRow + o);
    }
  };
  auto issue_x = [&](int s, int m0) {  // 16 rows x 32 pieces
    if (s < nst) {
      const int r = tid >> 5, o = (tid & 31) * 4;
      const int m = min(m0 + r, m_hi - 1);
      cp_async16(x_at(s) + r * kKS + o, xp + static_cast<int64_t>(m) * K + static_cast<int64_t>(s) * kKS + o);
    }
  };

  // The weights and their scales do not depend on the previous kernel (dense calls): the first stages and the codes
  // load before the wait.
  for (int s = 0; s < kAhead; ++s) issue_w(s);
  for (int i = tid; i < kBN * T; i += kThreads) {
    const int n = min(n0 + i / T, N - 1);
    codes[i] = sc[n * lds + i % T];
  }
  if (grp.table == nullptr) {
    pdl_wait();
    pdl_launch_dependents();
  }

  const int dn = tid & (kBN - 1), dc = (tid >> 6) & 3, dh = tid >> 8;  // decode: row, chunk of the stage, half
  const float2* wl = reinterpret_cast<const float2*>(ws) + lane;       // weight rows n0 + 2 lane, + 1
  auto decode = [&](int s) {  // stage s into buffer s & 1, a word (4 bytes: 8 weights) at a time
    const uint2 v = *reinterpret_cast<const uint2*>(raw_at(s) + dn * kRawStride + dc * 16 + dh * 8);
    const uint32_t e = codes[dn * T + s * 4 + dc];
    float* out = ws + (s & 1) * kWsFloats + (dc * 32 + dh) * kBN + dn;  // [dc][l][j][row], j = dh or 2 + dh
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float f[8];
      fp4_word_weights(h == 0 ? v.x : v.y, e, f, f + 4);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        out[((4 * h + i) * 4) * kBN] = f[i];
        out[((4 * h + i) * 4 + 2) * kBN] = f[4 + i];
      }
    }
  };

  for (int m0 = m_lo; m0 < m_hi; m0 += kBM) {
    const bool live = m0 + g * kTM < m_hi;  // warp-uniform: this warp's x rows hold a row to store
    float acc[kTM][2][4] = {};              // [x row][weight row][j], from +0
    auto compute = [&](int s) {             // the stage's 4 chunks into the chains, in K order
      const float2* wb = wl + (s & 1) * (kWsFloats / 2);
      const float* xs = x_at(s) + g * kTM * kKS + 4 * l;
#pragma unroll 1
      for (int c = 0; c < 4; ++c) {
        float2 wv[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) wv[j] = wb[((c * 8 + l) * 4 + j) * (kBN / 2)];
#pragma unroll
        for (int m = 0; m < kTM; ++m) {
          const float4 x4 = *reinterpret_cast<const float4*>(xs + m * kKS + c * 32);
          const float xv[4] = {x4.x, x4.y, x4.z, x4.w};
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            acc[m][0][j] = __fmaf_rn(wv[j].x, xv[j], acc[m][0][j]);
            acc[m][1][j] = __fmaf_rn(wv[j].y, xv[j], acc[m][1][j]);
          }
        }
      }
    };
    if (m0 != m_lo) {
      __syncthreads();  // the previous pass's totals are read
      for (int s = 0; s < kAhead; ++s) issue_w(s);
    }
    for (int s = 0; s < kAhead; ++s) {
      issue_x(s, m0);
      cp_async_commit();
    }
    // Iteration s: stage s has landed for every thread; compute(s - 2) and decode(s - 1) are done everywhere, so
    // slot (s + 2) % 4 (stage s - 2) and buffer s & 1 are free. Then decode(s) beside compute(s - 1).
    for (int s = 0; s < nst; ++s) {
      cp_async_wait<kAhead - 1>();
      __syncthreads();
      issue_w(s + kAhead);
      issue_x(s + kAhead, m0);
      cp_async_commit();
      decode(s);
      if (s > 0 && live) compute(s - 1);
    }
    __syncthreads();
    if (live) compute(nst - 1);
    __syncthreads();  // every decoded buffer read: they take the totals
    float* tot = ws;  // [l][16 x rows][64 weight rows]
#pragma unroll
    for (int m = 0; m < kTM; ++m) {
      float t[2];
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        const float(&v)[4] = acc[m][n];
        t[n] = __fmaf_rn(__fadd_rn(__fadd_rn(__fadd_rn(v[0], v[1]), v[2]), v[3]), 1.0f, 0.0f);
      }
      *reinterpret_cast<float2*>(tot + (l * kBM + g * kTM + m) * kBN + 2 * lane) = make_float2(t[0], t[1]);
    }
    __syncthreads();
    // The CPU's hsum ((t0 + t4) + (t2 + t6)) + ((t1 + t5) + (t3 + t7)), + the empty tail: thread (x row tid / 32,
    // weight rows 2 lane, + 1).
    const int mr = tid >> 5, m = m0 + mr, n = n0 + 2 * lane;
    float o[2];
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      float u[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) u[i] = tot[(i * kBM + mr) * kBN + 2 * lane + c];
      const float hs = __fadd_rn(__fadd_rn(__fadd_rn(u[0], u[4]), __fadd_rn(u[2], u[6])),
                                 __fadd_rn(__fadd_rn(u[1], u[5]), __fadd_rn(u[3], u[7])));
      const float out = __fadd_rn(hs, 0.0f);
      o[c] = round ? round_to_bf16(out) : out;
    }
    if (m < m_hi) {
      float* yr = y + static_cast<int64_t>(m) * N;
      if (n + 1 < N && (N & 1) == 0) {
        *reinterpret_cast<float2*>(yr + n) = make_float2(o[0], o[1]);
      } else {
        if (n < N) yr[n] = o[0];
        if (n + 1 < N) yr[n + 1] = o[1];
      }
    }
  }
  cp_async_wait<0>();
}

void launch(const uint8_t* w, int64_t ldw, const uint8_t* sc, int64_t lds, int N, int K, const float* xp, int M,
            float* y, bool round, const Fp4GemmGroups& grp, dim3 grid, cudaStream_t stream) {
  const int64_t smem = gemm_smem(K);
  static std::once_flag once;
  std::call_once(once, [] {
    DI_CUDA_CHECK(cudaFuncSetAttribute(fp4_gemm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_optin()));
  });
  DI_CHECK(smem <= smem_optin(), "cuda::fp4_gemm: {} bytes of shared memory needed (K = {})", smem, K);
  launch_pdl(fp4_gemm_kernel, grid, kThreads, smem, stream, w, ldw, sc, lds, N, K, xp, M, y, round, grp);
}

}  // namespace

bool fp4_gemm_supported(int64_t K) { return K >= kKS && K % kKS == 0 && gemm_smem(K) <= smem_optin(); }

void fp4_gemm_into(const uint8_t* w, int64_t ldw, const uint8_t* scale, int64_t lds, int N, int K, const float* xp,
                   int M, float* y, bool round, cudaStream_t stream) {
  DI_CHECK(fp4_gemm_supported(K) && M >= 1 && N >= 1 && (M + kBM - 1) / kBM <= 65535,  // grid.y: x-row tiles
           "cuda::fp4_gemm: unsupported call (K = {}, M = {}, N = {})", K, M, N);
  const dim3 grid(static_cast<unsigned>((N + kBN - 1) / kBN), static_cast<unsigned>((M + kBM - 1) / kBM));
  launch(w, ldw, scale, lds, N, K, xp, M, y, round, Fp4GemmGroups{}, grid, stream);
}

void fp4_gemm_grouped_into(const Fp4GemmGroups& g, int64_t ldw, int64_t lds, int N, int K, const float* xp, float* y,
                           bool round, cudaStream_t stream) {
  DI_CHECK(fp4_gemm_supported(K) && g.table != nullptr && g.offsets != nullptr && g.L >= 1 && g.L <= 65535 &&
               g.E >= 1 && g.E <= 65535 && g.R >= 1 && N >= 1,
           "cuda::fp4_gemm_grouped: unsupported call (K = {}, N = {}, {} lists of {} experts, {} rows)", K, N, g.L, g.E,
           g.R);
  const dim3 grid(static_cast<unsigned>((N + kBN - 1) / kBN), static_cast<unsigned>(g.E), static_cast<unsigned>(g.L));
  launch(nullptr, ldw, nullptr, lds, N, K, xp, g.R, y, round, g, grid, stream);
}

}  // namespace deepinfer::cuda
