// fp8_mma_gemv: the E4M3 decode GEMV (32 x 32 tiles, act_quant_block 32: the V4.1 linears) with its products formed
// by the tensor cores, bit-identical to fp8_gemv / fp8_walk_gemv and the CPU op. Why: fp8_walk_gemv spends ~6 issue
// slots per weight byte (two hardware decodes per weight pair, fp16 -> fp32 converts, the FMAs, exchanges and folds)
// and reaches ~2 TB/s on the V4.1 shapes at decode; here an mma forms the products, which leaves ~3 slots per byte.
//
// The contract (linear_gemv.cuh) for a 32-column tile: the chains restart, so chain (j, l) holds one product
// p = w x of element 8j + l (w = e4m3 * 2^-8, x fake-quantised per 32 columns as X * s, X = e4m3_rne(x / s), s a power
// of two), s[l] = ((p0 + p1) + p2) + p3 over j, and tot[l] = fma(s[l], 2^(e-119), tot[l]) tile after tile. With the
// weight code decoded to fp16 (exact) and X in fp16 (exact), mma.m16n8k8 against B = diag(X) gives D = code * X
// exactly, p = D * 2^(kx-8) (kx = log2 s), so s[l] = 2^(kx-8) * (((D0 + D1) + D2) + D3) and tot = fma(sum of D, 2^(e +
// kx - 127), tot): the same reals rounded the same way, whenever every power of two involved is a normal float
// (checked).
//
// Thread mapping (lane = 4 g + r): a warp owns 16 weight rows; lane (g, r) owns rows g and g + 8 and, of each 32-byte
// tile, the byte pairs 8j + 2r, 8j + 2r + 1 (j = 0..3): the chains (j, l) for l = 2r, 2r + 1, all four j, so s[l] is
// the lane's own. Rows are walked in segments of 64 bytes (2 tiles): lane t loads bytes [16t, 16t + 16) of the segment
// of both rows (16-byte streaming loads, a ring of kMmaDepth segments in flight; a warp load reads 8 rows x 64
// contiguous bytes), regroups them with 4 byte permutes so that word r holds the pairs 2r and 8 + 2r of its 16 bytes,
// and a per-warp transpose buffer in shared memory hands lane r word r of each half tile: pairs j = 0, 1 (first half)
// and 2, 3 (second half). Each pair, decoded to fp16x2, is the lane's a0 (row g) / a1 (row g + 8) of the mma of A-tile
// j.
//
// B images: column k = 2r + e of A-tile j is element 8j + k, held (B = diag) by lane (g' = k, r' = k / 2), half k % 2:
// the 8 lanes with r' = g' / 2. The block fake-quantises its x row once (a warp per tile, the CPU's arithmetic) and
// writes those lanes' words to shared memory (8 per tile each); in the main loop they read their 32 bytes per segment
// and every other lane a shared zero block. A warp takes the fast path for its rows when every x tile's kx is in
// [-100, 100] and every scale code e of its row block has e <= 246 and 1 <= e + kx <= 254; otherwise it forms every
// product with scalar loads (e4m3 * 2^-8 times the quantised x, fp8_tile_factor), the CPU's order.
#include <cuda_fp16.h>
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
#include "cuda/linear_gemv_fp8.cuh"
#include "cuda/linear_gemv_fp8_mma.cuh"
#include "cuda/quant.cuh"

namespace deepinfer::cuda {

namespace {

// This kernel's shared memory (mma_smem): the B images [K / 64 segments][8 lanes][8 words], per tile kx << 23, 32 zero
// bytes, and per warp the scale codes of its row block [K / 32].
__host__ __device__ inline MmaSmem fp8_mma_smem(int K) { return mma_smem(K, 32, K / 32); }

// Warps that took the slow path (gemv_fp8_mma_slow_warps).
__device__ unsigned long long g_slow_warps;

// A segment's 16 bytes of rows g and g + 8 (v0, v1), regrouped (word r' = pairs r' and 4 + r') into the warp's
// transpose buffer tb; the caller syncs the warp before segment_sums reads it.
__device__ __forceinline__ void stage_segment(uint4 v0, uint4 v1, uint32_t* tb, int g, int r) {
  const uint4 u0 = make_uint4(prmt(v0.x, v0.z, 0x5410u), prmt(v0.x, v0.z, 0x7632u), prmt(v0.y, v0.w, 0x5410u),
                              prmt(v0.y, v0.w, 0x7632u));
  const uint4 u1 = make_uint4(prmt(v1.x, v1.z, 0x5410u), prmt(v1.x, v1.z, 0x7632u), prmt(v1.y, v1.w, 0x5410u),
                              prmt(v1.y, v1.w, 0x7632u));
  *reinterpret_cast<uint4*>(tb + g * kMmaTStride + 4 * r) = u0;
  *reinterpret_cast<uint4*>(tb + (g + 8) * kMmaTStride + 4 * r) = u1;
}

// The chain sums of a staged segment's two tiles: sl[cs][2 a + e] = ((D0 + D1) + D2) + D3 of row g + 8 a, chain l =
// 2 r + e, tile cs; bp is the lane's B image of the segment (a data lane's 32 bytes, or the zero block).
__device__ __forceinline__ void segment_sums(const uint32_t* tb, int g, int r, uint32_t bp, float (&sl)[2][4]) {
  uint32_t bw[8];  // B of tile cs, A-tile j: bw[4 cs + j]
  {
    const uint4 a = lds128(bp), b = lds128(bp + 16u);
    bw[0] = a.x, bw[1] = a.y, bw[2] = a.z, bw[3] = a.w, bw[4] = b.x, bw[5] = b.y, bw[6] = b.z, bw[7] = b.w;
  }
#pragma unroll
  for (int cs = 0; cs < 2; ++cs) {
    // Words r of the tile's two halves: pairs j = 0, 1 and 2, 3 of rows g, g + 8.
    const uint32_t h00 = tb[g * kMmaTStride + 8 * cs + r], h01 = tb[g * kMmaTStride + 8 * cs + 4 + r];
    const uint32_t h10 = tb[(g + 8) * kMmaTStride + 8 * cs + r], h11 = tb[(g + 8) * kMmaTStride + 8 * cs + 4 + r];
    const uint32_t a0[4] = {e4m3x2_lo(h00), e4m3x2_hi(h00), e4m3x2_lo(h01), e4m3x2_hi(h01)};
    const uint32_t a1[4] = {e4m3x2_lo(h10), e4m3x2_hi(h10), e4m3x2_lo(h11), e4m3x2_hi(h11)};
    float dd[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j) mma_f16(dd[j], a0[j], a1[j], bw[4 * cs + j]);
#pragma unroll
    for (int q = 0; q < 4; ++q) sl[cs][q] = __fadd_rn(__fadd_rn(__fadd_rn(dd[0][q], dd[1][q]), dd[2][q]), dd[3][q]);
  }
}

__global__ void __launch_bounds__(32 * kMmaWarps, 4) fp8_mma_gemv(MmaParams p) {
  extern __shared__ __align__(16) uint8_t smem_b[];
  pdl_launch_dependents();
  const int K = p.K, N = p.N, nseg = K / 64, nch = K / 32;
  const MmaSmem sm = fp8_mma_smem(K);
  uint32_t* img = reinterpret_cast<uint32_t*>(smem_b + sm.img);  // [nseg][8][8]
  int* kxs = reinterpret_cast<int*>(smem_b + sm.kxs);            // [nch]
  uint32_t* zeros = reinterpret_cast<uint32_t*>(smem_b + sm.zeros);
  int* flags = reinterpret_cast<int*>(smem_b + sm.flags);
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, r = lane & 3;
  uint8_t* codes = smem_b + sm.codes + warp * sm.codes_warp;                                     // [nch]
  uint32_t* tbuf = reinterpret_cast<uint32_t*>(smem_b + sm.tbuf) + warp * 2 * 16 * kMmaTStride;  // [2][16][kMmaTStride]
  const int mt = static_cast<int>(blockIdx.x) % p.mtiles;
  const int first = static_cast<int>(blockIdx.x) / p.mtiles, stride = static_cast<int>(gridDim.x) / p.mtiles;
  mma_block_flags(flags, zeros, 8);

  // A dense call's weights and codes are not written by the previous kernel (gemv_into's contract), so they are its
  // block's first step; a grouped call's expert pointers may be, so they wait.
  const bool grouped = p.row_expert != nullptr;
  const uint8_t *W = p.w, *SC = p.sc;

  // A step's rows, its first ring segments and its row block's scale codes (cp.async into the warp's buffer): issued
  // for the block's first step before griddepcontrol.wait (dense) or before x is quantised (grouped), for a later step
  // at its start.
  int base = 0;
  const uint8_t *wr0 = W, *wr1 = W;
  uint4 q0[kMmaDepth], q1[kMmaDepth];
  auto begin = [&](int step) {
    base = step * kMmaRowsPerStep + warp * 16;
    if (base >= N) return;  // warp-uniform
    const int64_t n0 = min(base + g, N - 1), n1 = min(base + g + 8, N - 1);
    wr0 = W + n0 * p.ldw + 16 * r;
    wr1 = W + n1 * p.ldw + 16 * r;
#pragma unroll
    for (int d = 0; d < kMmaDepth; ++d)
      if (d < nseg) q0[d] = ldg_stream(wr0 + 64 * d), q1[d] = ldg_stream(wr1 + 64 * d);
    const uint8_t* srow = SC + static_cast<int64_t>(base / 32) * p.lds;
    for (int i = lane; i < nch / 4; i += 32) cp_async4(codes + 4 * i, srow + 4 * i);
    cp_async_commit();
  };
  if (!grouped && first < p.steps) begin(first);
  __syncthreads();  // flags and zeros set
  pdl_wait();
  const float* xr = mma_block_rows(p, mt, W, SC);
  if (grouped && first < p.steps) begin(first);

  // x quantised per tile (a warp per tile, a lane per column) into the B images.
  mma_x_chunks(xr, nch, warp, lane, flags, [&](int c, float v) {
    const Fp8Tile q = fp8_tile_code(v);  // fp8_fake_quant_inv's code value, exact in fp16
    const uint32_t bits = __half_as_ushort(__float2half_rn(q.X));
    // Element l = lane of tile c: A-tile l / 8, data lane g' = l % 8, half g' % 2; segment c / 2, slot 4 (c % 2) + j.
    const int gp = lane & 7;
    img[((c >> 1) * 8 + gp) * 8 + 4 * (c & 1) + (lane >> 3)] = bits << (16 * (gp & 1));
    if (lane == 0) kxs[c] = q.kx * (1 << 23);
    return MmaChunk{q.kx, fp8_kx_ok(q.kx)};
  });
  __syncthreads();  // images, kx, flags complete
  const bool x_ok = flags[0] != 0;
  int lo, hi;
  fp8_fast_codes(flags, lo, hi);

  const bool data_lane = r == (g >> 1);
  const uint32_t bsrc = static_cast<uint32_t>(__cvta_generic_to_shared(data_lane ? img + 8 * g : zeros));
  const uint32_t bstep = data_lane ? 256u : 0u;  // bytes per segment
  const int2* kx2s = reinterpret_cast<const int2*>(kxs);

  for (int step = first; step < p.steps; step += stride) {
    if (step != first) begin(step);
    if (base >= N) continue;  // warp-uniform; no block barrier below
    cp_async_wait_all();
    __syncwarp();                                    // the row block's codes are in
    float tot[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};  // [row][e]: chains l = 2r + e
    const bool fast = mma_codes_fast(codes, nch, lane, x_ok, lo, hi);
    if (fast) {
      for (int s0 = 0; s0 < nseg; s0 += kMmaDepth) {
#pragma unroll
        for (int d = 0; d < kMmaDepth; ++d) {
          const int seg = s0 + d;
          if (seg >= nseg) break;  // uniform
          uint32_t* tb = tbuf + (seg & 1) * 16 * kMmaTStride;
          stage_segment(q0[d], q1[d], tb, g, r);
          if (seg + kMmaDepth < nseg)
            q0[d] = ldg_stream(wr0 + 64 * (seg + kMmaDepth)), q1[d] = ldg_stream(wr1 + 64 * (seg + kMmaDepth));
          __syncwarp();  // also orders the reads of this buffer two segments ago before its writes above
          float sl[2][4];
          segment_sums(tb, g, r, bsrc + static_cast<uint32_t>(seg) * bstep, sl);
          const int2 kx = kx2s[seg];
          const uint32_t e2 = reinterpret_cast<const uint16_t*>(codes)[seg];
#pragma unroll
          for (int cs = 0; cs < 2; ++cs) {
            // 2^(e + kx - 127) of the tile.
            const float F = __int_as_float(static_cast<int>((e2 >> (8 * cs)) & 0xffu) * (1 << 23) + (cs ? kx.y : kx.x));
#pragma unroll
            for (int a = 0; a < 2; ++a)
#pragma unroll
              for (int e = 0; e < 2; ++e) tot[a][e] = __fmaf_rn(sl[cs][2 * a + e], F, tot[a][e]);
          }
        }
      }
    } else {
      if (lane == 0) atomicAdd(&g_slow_warps, 1ull);
      slow_rows(xr, wr0 - 16 * r, wr1 - 16 * r, codes, nch, lane, r, tot);
    }
    __syncwarp();  // the codes buffer is free for the next step's cp.async
    store_lane_rows(p, mt, base + g, r, tot);
  }
}

}  // namespace

bool gemv_fp8_mma_supported(const GemvArgs& a) {
  if (a.fmt != 0 || !gemv_supported(a) || a.M <= 0 || a.N <= 0) return false;
  if (a.B != 32 || a.act_quant_block != 32 || a.K % 128 != 0 || a.K > kMmaMaxK || a.lds % 4 != 0) return false;
  if (a.row_expert == nullptr && reinterpret_cast<uintptr_t>(a.scale) % 4 != 0) return false;
  return true;
}

int64_t gemv_fp8_mma_slow_warps(bool reset) { return mma_read_counter(&g_slow_warps, reset); }

void gemv_fp8_mma_into(const GemvArgs& a, cudaStream_t stream) {
  DI_CHECK(gemv_fp8_mma_supported(a), "cuda::gemv: fp8_mma_gemv does not take this call (N {}, K {}, M {}, B {})", a.N,
           a.K, a.M, a.B);
  mma_launch(fp8_mma_gemv, a, 32 * kMmaWarps, kMmaRowsPerStep, fp8_mma_smem(a.K).total, stream);
}

}  // namespace deepinfer::cuda
