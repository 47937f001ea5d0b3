// fp8_bmma_gemv: the E4M3 decode GEMV (32 x 32 tiles, act_quant_block 32: the V4.1 linears) with the weights as the
// tensor cores' B operand, so a warp owns 8 weight rows (fp8_mma_gemv's A operand takes 16, which leaves too few warps
// on the narrow V4.1 weights: wo_b, wo_a, the shared expert, wq_a + wkv). Bit-identical to fp8_walk_gemv and the CPU
// op (the order of linear_gemv.cuh). bench_cuda_bmma_probe measured the design before it came here.
//
// The products: mma.m16n8k16 (f16 -> f32) with A = diag(X) over 16 columns (X = e4m3_rne(x / s), x's act-quantised
// value, exact in f16) and B = the weights' E4M3 values (cvt.rn.f16x2.e4m3x2, exact) gives D[k][n] = X[k] V[n][k],
// every product exact. MMA m of a 32-column tile takes columns 16 m .. 16 m + 15, so lane (g, t) receives columns
// 16 m + g and 16 m + 8 + g of rows 2t and 2t + 1: over the tile's two MMAs the four products j = 0..3 of chain l = g
// of both rows. The contract's s[l] = ((p0 + p1) + p2) + p3 and tot[l] = fma(s[l], 2^(e - 119), tot[l]) then run in
// the lane's registers (s of the D values times 2^(kx - 8) is exact, so the fold takes the power of two F = 2^(e + kx
// - 127), as fp8_mma_gemv), and the row's hsum ((t0 + t4) + (t2 + t6)) + ((t1 + t5) + (t3 + t7)) is three shuffles.
//
// The B fragments: lane (g, t) needs row g's bytes {2t, 2t + 1} and {2t + 8, 2t + 9} of each 16-byte half. It loads 32
// contiguous bytes (tile t of a 128-byte segment of row g; a ring of kDepth segments in flight), permutes 2-byte
// units with 8 PRMTs so that the words each lane needs sit 4 bytes apart, stores them to its warp's staging slot, and
// two ldmatrix.x4 hand every lane its 8 words of the segment. The A fragments: the block quantises its x row once (a
// warp per tile) into the diagonal lanes' (t = g / 2) whole fragments {R0, 0, 0, R3}, 32 bytes per (chunk, g); the
// other lanes read a shared zero block.
//
// The fast path's range is fp8_mma_gemv's: every x tile's kx in [-100, 100] and every scale code e of the warp's row
// block with e <= 246 and 1 <= e + kx <= 254; otherwise the warp forms every product with scalar loads (slow_rows, the
// CPU's order).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/env.h"
#include "cuda/common.cuh"
#include "cuda/device.h"
#include "cuda/fp_decode.cuh"
#include "cuda/gemv_fp8_slow.cuh"
#include "cuda/gemv_mma.cuh"
#include "cuda/linear_gemv_fp8.cuh"
#include "cuda/linear_gemv_fp8_bmma.cuh"
#include "cuda/linear_gemv_fp8_mma.cuh"
#include "cuda/quant.cuh"

namespace deepinfer::cuda {

namespace {

constexpr int kBmmaRowStride = 144;  // bytes per row of a staging slot: ldmatrix's 8 rows hit distinct
                                     // 16-byte bank groups
constexpr int kBmmaSlotBytes = 8 * kBmmaRowStride;

// The block's shared memory, byte offsets: the A fragments [K / 32][8 g][2 m][4 words] (K * 8 bytes), kx << 23 per
// chunk, 32 zero bytes, the flags (x_ok, kx min, kx max), per warp its row block's scale codes [K / 32] and 2 staging
// slots.
struct BmmaSmem {
  int64_t img, kxs, zeros, flags, codes, codes_warp, stage, total;
};
__host__ __device__ inline BmmaSmem bmma_smem(int K, int warps) {
  BmmaSmem m;
  const int64_t nch = K / 32;
  m.img = 0;
  m.kxs = int64_t{K} * 8;
  m.zeros = m.kxs + (nch * 4 + 15) / 16 * 16;
  m.flags = m.zeros + 32;
  m.codes = m.flags + 16;
  m.codes_warp = (nch + 15) / 16 * 16;
  m.stage = m.codes + warps * m.codes_warp;
  m.total = m.stage + warps * 2 * kBmmaSlotBytes;
  return m;
}

// Warps that took the slow path (gemv_fp8_bmma_slow_warps).
__device__ unsigned long long g_bmma_slow_warps;

// D = diag(X) B over 16 columns: a = {R0, 0, 0, R3} (the diagonal lanes' X halves; zeros elsewhere), b0 / b1 the
// weights' f16x2 (rows 2t, 2t + 1 of column g: B's k = 2t, 2t + 1 and 2t + 8, 2t + 9).
__device__ __forceinline__ void mma_b16(float (&d)[4], uint4 a, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %10, %10, %10};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1), "f"(0.0f));
}

// A segment's 32 bytes of this lane (tile t of row g) regrouped and stored to the warp's staging slot: group u of a
// 16-byte half = its 2-byte units (u, 4 + u) and (8 + u, 12 + u), the word lane t = u of the row needs.
__device__ __forceinline__ void stage_tile(uint4 v0, uint4 v1, uint8_t* dst) {
  const uint4 h0 = make_uint4(prmt(v0.x, v0.z, 0x5410u), prmt(v0.x, v0.z, 0x7632u), prmt(v0.y, v0.w, 0x5410u),
                              prmt(v0.y, v0.w, 0x7632u));
  const uint4 h1 = make_uint4(prmt(v1.x, v1.z, 0x5410u), prmt(v1.x, v1.z, 0x7632u), prmt(v1.y, v1.w, 0x5410u),
                              prmt(v1.y, v1.w, 0x7632u));
  *reinterpret_cast<uint4*>(dst) = h0;
  *reinterpret_cast<uint4*>(dst + 16) = h1;
}

// kDepth: 128-byte segments in flight per lane (4: 4 KB a warp; 8: 8 KB, as fp8_walk_gemv's 16 loads per lane);
// kWarps: warps a block, 8 weight rows each per step (fewer spread a narrow weight over more SMs, each block then
// quantising x with fewer warps).
template <int kDepth, int kWarps>
__global__ void __launch_bounds__(32 * kWarps, kDepth == 4 ? 4 : 3) fp8_bmma_gemv(MmaParams p) {
  extern __shared__ __align__(16) uint8_t smem_b[];
  pdl_launch_dependents();
  const int K = p.K, N = p.N, nch = K / 32, nseg = K / 128;
  const BmmaSmem sm = bmma_smem(K, kWarps);
  uint32_t* img = reinterpret_cast<uint32_t*>(smem_b + sm.img);
  int* kxs = reinterpret_cast<int*>(smem_b + sm.kxs);
  uint32_t* zeros = reinterpret_cast<uint32_t*>(smem_b + sm.zeros);
  int* flags = reinterpret_cast<int*>(smem_b + sm.flags);
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  uint8_t* codes = smem_b + sm.codes + warp * sm.codes_warp;  // [nch]
  uint8_t* stage = smem_b + sm.stage + warp * 2 * kBmmaSlotBytes;
  const int mt = static_cast<int>(blockIdx.x) % p.mtiles;
  const int first = static_cast<int>(blockIdx.x) / p.mtiles, stride = static_cast<int>(gridDim.x) / p.mtiles;
  mma_block_flags(flags, zeros, 8);

  // As fp8_mma_gemv: a dense call's weights and codes are not the previous kernel's output, so the block's first step
  // is issued before griddepcontrol.wait; a grouped call's expert pointers may be, so it waits.
  const bool grouped = p.row_expert != nullptr;
  const uint8_t *W = p.w, *SC = p.sc;

  int base = 0;
  const uint8_t* wrow = W;
  uint4 q[kDepth][2];  // ring slot d: this lane's 32 bytes of a segment
  auto load = [&](int d, int seg) {
    q[d][0] = ldg_stream(wrow + 128 * seg);
    q[d][1] = ldg_stream(wrow + 128 * seg + 16);
  };
  // A step's rows (row g of the warp's 8; past N: the last row, whose results are not stored), its first ring
  // segments and its row block's scale codes (cp.async into the warp's buffer).
  auto begin = [&](int step) {
    base = step * 8 * kWarps + warp * 8;
    if (base >= N) return;  // warp-uniform
    wrow = W + static_cast<int64_t>(min(base + g, N - 1)) * p.ldw + 32 * t;
#pragma unroll
    for (int d = 0; d < kDepth; ++d)
      if (d < nseg) load(d, d);
    const uint8_t* srow = SC + static_cast<int64_t>(base / 32) * p.lds;
    for (int i = lane; i < nch / 4; i += 32) cp_async4(codes + 4 * i, srow + 4 * i);
    cp_async_commit();
  };
  if (!grouped && first < p.steps) begin(first);
  __syncthreads();  // flags and zeros set
  pdl_wait();
  const float* xr = mma_block_rows(p, mt, W, SC);
  if (grouped && first < p.steps) begin(first);

  // x quantised per tile (a warp per tile, a lane per column 8 j + g' of the tile) into the diagonal lanes' A
  // fragments: MMA m = j / 2, R0 (row g') for j even, R3 (row g' + 8) for j odd, the f16 in half g' % 2.
  mma_x_chunks<kWarps>(xr, nch, warp, lane, flags, [&](int c, float v) {
    const Fp8Tile q = fp8_tile_code(v);
    const uint32_t bits = __half_as_ushort(__float2half_rn(q.X));
    const int gp = lane & 7, j = lane >> 3;
    uint32_t* frag = img + (c * 8 + gp) * 8 + 4 * (j >> 1);
    frag[(j & 1) ? 3 : 0] = bits << (16 * (gp & 1));
    frag[(j & 1) ? 2 : 1] = 0u;
    if (lane == 0) kxs[c] = q.kx * (1 << 23);
    return MmaChunk{q.kx, fp8_kx_ok(q.kx)};
  });
  __syncthreads();  // fragments, kx, flags complete
  const bool x_ok = flags[0] != 0;
  int lo, hi;
  fp8_fast_codes(flags, lo, hi);

  const bool diag = t == (g >> 1);
  const uint32_t a_base = static_cast<uint32_t>(__cvta_generic_to_shared(diag ? img + g * 8 : zeros));
  const uint32_t a_step = diag ? 256u : 0u;  // bytes per chunk
  const int4* kx4 = reinterpret_cast<const int4*>(kxs);
  const uint32_t stage_s = static_cast<uint32_t>(__cvta_generic_to_shared(stage));
  // ldmatrix row address of this lane: matrix i = lane / 8 (tile i / 2 of the pair, half i % 2), row lane % 8.
  const uint32_t lm_off =
      static_cast<uint32_t>((lane & 7) * kBmmaRowStride + (lane >> 4) * 32 + ((lane >> 3) & 1) * 16);
  uint8_t* my_stage = stage + g * kBmmaRowStride + 32 * t;

  for (int step = first; step < p.steps; step += stride) {
    if (step != first) begin(step);
    if (base >= N) continue;  // warp-uniform; no block barrier below
    cp_async_wait_all();
    __syncwarp();  // the row block's codes are in
    const bool fast = mma_codes_fast(codes, nch, lane, x_ok, lo, hi);
    if (fast) {
      float tot0 = 0.0f, tot1 = 0.0f;  // chain l = g of rows base + 2t, base + 2t + 1
      for (int s0 = 0; s0 < nseg; s0 += kDepth) {
#pragma unroll
        for (int d = 0; d < kDepth; ++d) {
          const int seg = s0 + d;
          if (seg >= nseg) break;  // warp-uniform
          stage_tile(q[d][0], q[d][1], my_stage + (seg & 1) * kBmmaSlotBytes);
          if (seg + kDepth < nseg) load(d, seg + kDepth);
          __syncwarp();           // also orders this slot's reads two segments ago before the stores above
          uint32_t wa[4], wb[4];  // [tile][half] words: tiles 0, 1 and 2, 3
          const uint32_t lm = stage_s + static_cast<uint32_t>((seg & 1) * kBmmaSlotBytes) + lm_off;
          ldmatrix_x4(wa, lm);
          ldmatrix_x4(wb, lm + 64);
          const uint32_t wv[8] = {wa[0], wa[1], wa[2], wa[3], wb[0], wb[1], wb[2], wb[3]};
          const uint32_t e4 = reinterpret_cast<const uint32_t*>(codes)[seg];  // the segment's 4 tile scale codes
          const int4 kq = kx4[seg];
          const int kxc[4] = {kq.x, kq.y, kq.z, kq.w};
          const uint32_t abase = a_base + static_cast<uint32_t>(4 * seg) * a_step;
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const uint4 a0 = lds128(abase + c * a_step), a1 = lds128(abase + c * a_step + 16);
            float d0[4], d1[4];
            mma_b16(d0, a0, e4m3x2_lo(wv[2 * c]), e4m3x2_hi(wv[2 * c]));
            mma_b16(d1, a1, e4m3x2_lo(wv[2 * c + 1]), e4m3x2_hi(wv[2 * c + 1]));
            // 2^(e + kx - 127) of the tile.
            const float F = __int_as_float(static_cast<int>(prmt(e4, 0u, 0x4440u + c)) * (1 << 23) + kxc[c]);
            const float s0v = __fadd_rn(__fadd_rn(__fadd_rn(d0[0], d0[2]), d1[0]), d1[2]);
            const float s1v = __fadd_rn(__fadd_rn(__fadd_rn(d0[1], d0[3]), d1[1]), d1[3]);
            tot0 = __fmaf_rn(s0v, F, tot0);
            tot1 = __fmaf_rn(s1v, F, tot1);
          }
        }
      }
      // hsum over l = g: ((t0 + t4) + (t2 + t6)) + ((t1 + t5) + (t3 + t7)) + 0 (IEEE addition commutes, so every
      // lane of a t holds the same sums).
      float u0 = __fadd_rn(tot0, __shfl_xor_sync(0xffffffffu, tot0, 16));
      float u1 = __fadd_rn(tot1, __shfl_xor_sync(0xffffffffu, tot1, 16));
      u0 = __fadd_rn(u0, __shfl_xor_sync(0xffffffffu, u0, 8));
      u1 = __fadd_rn(u1, __shfl_xor_sync(0xffffffffu, u1, 8));
      u0 = __fadd_rn(__fadd_rn(u0, __shfl_xor_sync(0xffffffffu, u0, 4)), 0.0f);
      u1 = __fadd_rn(__fadd_rn(u1, __shfl_xor_sync(0xffffffffu, u1, 4)), 0.0f);
      const int n = base + 2 * t;
      float* yr = p.y + static_cast<int64_t>(mt) * N;
      if (g == 0 && n < N) yr[n] = p.round ? round_to_bf16(u0) : u0;
      if (g == 0 && n + 1 < N) yr[n + 1] = p.round ? round_to_bf16(u1) : u1;
    } else {
      if (lane == 0) atomicAdd(&g_bmma_slow_warps, 1ull);
      // Lane (g, r = t) takes row base + g, chains 2t + e (slow_rows' mapping with one row).
      float tot[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
      const uint8_t* row = wrow - 32 * t;
      slow_rows<1>(xr, row, row, codes, nch, lane, t, tot);
      store_lane_rows<1>(p, mt, base + g, t, tot);
    }
    __syncwarp();  // the staging slots and codes buffer are free for the next step
  }
}

}  // namespace

bool gemv_fp8_bmma_supported(const GemvArgs& a) { return gemv_fp8_mma_supported(a); }

int64_t gemv_fp8_bmma_slow_warps(bool reset) { return mma_read_counter(&g_bmma_slow_warps, reset); }

void gemv_fp8_bmma_into(const GemvArgs& a, cudaStream_t stream) {
  DI_CHECK(gemv_fp8_bmma_supported(a), "cuda::gemv: fp8_bmma_gemv does not take this call (N {}, K {}, M {}, B {})",
           a.N, a.K, a.M, a.B);
  // DEEPINFER_CUDA_BMMA_DEPTH: segments in flight per lane, 4 (the default) or 8; DEEPINFER_CUDA_BMMA_WARPS: warps a
  // block, 4 (the default), 2 or 1 (A / B).
  static const int depth = [] {
    const int64_t d = env_int("DEEPINFER_CUDA_BMMA_DEPTH", 4);  // the table's default: 4
    DI_CHECK(d == 4 || d == 8, "DEEPINFER_CUDA_BMMA_DEPTH must be 4 or 8 (got {})", d);
    return static_cast<int>(d);
  }();
  static const int warps = [] {
    const int64_t w = env_int("DEEPINFER_CUDA_BMMA_WARPS", 1);  // the table's default: 4
    DI_CHECK(w == 1 || w == 2 || w == 4, "DEEPINFER_CUDA_BMMA_WARPS must be 1, 2 or 4 (got {})", w);
    return static_cast<int>(w);
  }();
  void (*kernel)(MmaParams) = depth == 8 ? (warps == 4   ? fp8_bmma_gemv<8, 4>
                                            : warps == 2 ? fp8_bmma_gemv<8, 2>
                                                         : fp8_bmma_gemv<8, 1>)
                                         : (warps == 4   ? fp8_bmma_gemv<4, 4>
                                            : warps == 2 ? fp8_bmma_gemv<4, 2>
                                                         : fp8_bmma_gemv<4, 1>);
  mma_launch(kernel, a, 32 * warps, 8 * warps, bmma_smem(a.K, warps).total, stream);
}

}  // namespace deepinfer::cuda
