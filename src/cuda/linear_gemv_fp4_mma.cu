// fp4_mma_gemv: the FP4 decode GEMV with its products formed by the tensor cores, bit-identical to fp4_pair_gemv
// and the CPU op (linear_gemv.cuh's order: 32 chains per row, v = fma(w, x, v) chunk after chunk from +0, then
// the fixed fold). Why: fp4_pair_gemv spends ~5.7 issue slots per 4-bit weight (the fp16 decode, a scale multiply,
// an fp16 -> fp32 convert, the FMA and their bookkeeping), which holds it to about a third of the HBM bandwidth at
// decode. Here the scale multiply and the convert go: a quarter of an mma per weight forms the exact fp32 product.
//
// The idea. mma.m16n8k8 (f16 x f16 -> f32) with B = diag(x) gives D[row][k] = A[row][k] * x[k]: per lane the
// products of its own four A elements (rows g and g + 8, columns 2t and 2t + 1), exact (an fp16 pattern of a
// weight has 2 significant bits, an fp16 x at most 11, and the product is added to nothing but zeros). The CPU's
// step is fma(w, x, v) with w = e2m1 * 2^(e-127); fp4_half_patterns gives the fp16 pattern P = e2m1 * 2^-14, and
// when x is written as X * 2^kx with X an fp16 value (kx per 32-column chunk of x), w x = D * S with D = P X and
// S = 2^(e + kx - 113), a power of two, so fma(D, S, v) = round(w x + v) = fma(w, x, v) bit for bit whenever S is
// a normal float and w finite (checked; the slow path below otherwise).
//
// Thread mapping (lane = 4 g + t): a warp owns 16 weight rows; lane (g, t) owns rows g and g + 8 (the mma's A
// fragment rows) and of each 16-byte chunk of them the word t (bytes 4t .. 4t+3, 8 nibbles): the chains of byte
// q = 4t + 2p + e (p, e = 0, 1), nibble h, i.e. chains (2h + t/2, 4(t%2) + 2p + e), 8 per row. A row is walked in
// segments of 128 columns (4 chunks): lane t loads chunk t of the segment of both rows (16-byte streaming loads, a
// ring of kMmaDepth segments in flight; a warp load reads 8 rows x 64 contiguous bytes) and a per-warp transpose buffer
// in shared memory hands it word t of each chunk instead (4-byte loads straight from global memory measured slower:
// 4x the L1 requests per byte), read back by two ldmatrix.x4 (a row's 4 words in one instruction).
// fp4_half_patterns turns a word into 4 fp16x2 A fragments (pair p, nibble h), each one mma with the same word of row
// g + 8. Chunks run in order, so every chain sees its products in K order. The fold (s[l] over j = 0..3, the CPU's
// hsum) needs one shuffle across lanes t and t ^ 2 and one across t and t ^ 1.
// A step's scale codes go to a per-warp shared buffer by cp.async (issued with the step's first weight loads).
//
// B images. Column k = 2t + e of the A-tile (chunk c, pair p, nibble h) is x column 32c + 8t + 4p + 2e + h; B's b0 in
// lane (g', t') holds B[2t'][g'], B[2t'+1][g'], so only the 8 lanes with t' = g' / 2 hold a nonzero half (k = g').
// A block writes, from its x row, those lanes' 16 words per segment (one per A-tile) to shared memory once (512
// bytes per segment); in the main loop each of those lanes reads its 64 bytes per segment (4 x 16-byte loads) and
// every other lane reads a shared zero block (no selects). For calls of few x rows a pre-pass kernel (fp4_mma_images)
// builds every row's images once and the blocks copy theirs in (cp.async) instead of building them.
// x qualifies ("x_ok") when every chunk of it is exactly X * 2^kx with kx = E(amax) - 15 (-127 <= kx <= 112): what
// the model's grouped expert calls pass (x fake-quantised by gather_rows / swiglu) and most bf16 rows. A warp takes
// the fast path for its 16 rows when x qualifies and every scale code e of its rows keeps S normal
// (1 <= e + kx + 14 <= 254 for the block's extreme kx) and w finite (e <= 252); otherwise it forms every chain
// with scalar loads and fp4_weight's exact decode (the CPU's order, as the other kernels): NaN scales (255), raw
// fp32 x and everything else.
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/device.h"
#include "cuda/fp_decode.cuh"
#include "cuda/gemv_mma.cuh"
#include "cuda/linear_gemv_fp4_mma.cuh"
#include "cuda/linear_gemv_fp8.cuh"

namespace deepinfer::cuda {

namespace {

// This kernel's shared memory (mma_smem): the B images [K / 128 segments][8 lanes][16 words], per chunk (kx + 14) <<
// 23, 64 zero bytes, and per warp the scale codes of its 16 rows [16][K / 32].
__host__ __device__ inline MmaSmem fp4_mma_smem(int K) { return mma_smem(K, 64, int64_t{16} * (K / 32)); }

// Warps that took the slow path (gemv_fp4_mma_slow_warps: tests check which path ran).
__device__ unsigned long long g_slow_warps;

// Every byte of the 4 scale codes e in [lo, hi].
__device__ __forceinline__ bool codes_in(uint32_t e, int lo, int hi) {
  bool ok = true;
#pragma unroll
  for (int b = 0; b < 4; ++b) {
    const int v = static_cast<int>((e >> (8 * b)) & 0xffu);
    ok = ok && v >= lo && v <= hi;
  }
  return ok;
}

// The x images of one 32-column chunk c of an x row (a lane per column, v = x[32 c + lane]): the lane's B image half
// into img (the row's [K / 128 segments][8 lanes][16 words]), the chunk's (kx + 14) << 23 into kxs[c] and whether it
// qualifies with its kx (MmaChunk; warp-uniform).
__device__ __forceinline__ MmaChunk fp4_chunk_image(int c, float v, int lane, uint32_t* img, int* kxs) {
  const F16Chunk f = f16_chunk(v, -127, 112);  // 2^-kx a normal float
  // Column j = lane of chunk c = 8 t' + 4 p + 2 e + h: A-tile 4 (c % 4) + 2 p + h, data lane g' = 2 t' + e, half e.
  const int tp = lane >> 3, pp = (lane >> 2) & 1, e = (lane >> 1) & 1, h = lane & 1;
  img[((c >> 2) * 8 + 2 * tp + e) * 16 + 4 * (c & 3) + 2 * pp + h] = f.bits << (16 * e);
  if (lane == 0) kxs[c] = (f.kx + 14) * (1 << 23);
  return MmaChunk{f.kx, f.ok};
}

// The x pre-pass (one launch per call, before fp4_mma_gemv): every x row's B images, kx words and per-chunk record
// (kx where the chunk qualifies, INT_MIN where not) into the call's scratch (fp4_mma_images_layout), a warp per chunk.
// Built once per x row here instead of once per block in the GEMV's prologue: at batch 1, 432 blocks each over all
// 160 chunks of K = 5,120, a sixth to a fifth of the GEMV's instructions (bench/RESULTS.md, eighteenth session).
__global__ void __launch_bounds__(256) fp4_mma_images(const float* x, int64_t ldx, int64_t rows, int K, uint8_t* out) {
  pdl_wait();
  pdl_launch_dependents();
  const int nch = K / 32, lane = static_cast<int>(threadIdx.x) & 31;
  const int c = static_cast<int>(blockIdx.x) * 8 + (static_cast<int>(threadIdx.x) >> 5);
  const int64_t r = blockIdx.y;
  if (c >= nch) return;  // warp-uniform
  const MmaImagesLayout L = fp4_mma_images_layout(rows, K);
  uint32_t* img = reinterpret_cast<uint32_t*>(out + L.img + r * K * 4);
  int* kxs = reinterpret_cast<int*>(out + L.kxs) + r * nch;
  const MmaChunk m = fp4_chunk_image(c, __ldg(x + r * ldx + 32 * c + lane), lane, img, kxs);
  if (lane == 0) reinterpret_cast<int*>(out + L.rec)[r * nch + c] = m.ok ? m.kx : INT_MIN;
}

__global__ void __launch_bounds__(32 * kMmaWarps, 4) fp4_mma_gemv(MmaParams p) {
  extern __shared__ __align__(16) uint8_t smem_b[];
  pdl_launch_dependents();
  const int K = p.K, N = p.N, nseg = K / 128, nch = K / 32;
  const MmaSmem sm = fp4_mma_smem(K);
  uint32_t* img = reinterpret_cast<uint32_t*>(smem_b + sm.img);  // [nseg][8][16]
  int* kxs = reinterpret_cast<int*>(smem_b + sm.kxs);            // [nch]
  uint32_t* zeros = reinterpret_cast<uint32_t*>(smem_b + sm.zeros);
  int* flags = reinterpret_cast<int*>(smem_b + sm.flags);
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int g = lane >> 2, t = lane & 3;
  uint8_t* codes = smem_b + sm.codes + warp * sm.codes_warp;                                     // [16][nch]
  uint32_t* tbuf = reinterpret_cast<uint32_t*>(smem_b + sm.tbuf) + warp * 2 * 16 * kMmaTStride;  // [2][16][kMmaTStride]
  // This lane's ldmatrix row address in a transpose buffer (lane 8 c + r: chunk c of row r; rows g + 8 are 8 rows on).
  const uint32_t tb_src = static_cast<uint32_t>(((lane & 7) * kMmaTStride + 4 * (lane >> 3)) * 4);
  const int mt = static_cast<int>(blockIdx.x) % p.mtiles;
  const int first = static_cast<int>(blockIdx.x) / p.mtiles, stride = static_cast<int>(gridDim.x) / p.mtiles;
  mma_block_init(flags, zeros, 16);

  const uint8_t *W = nullptr, *SC = nullptr;
  const float* xr = mma_block_rows(p, mt, W, SC);

  // A step's rows, its first ring segments (lane t: chunk t of the segment of rows g and g + 8, 16-byte streaming
  // loads) and its scale codes (cp.async into the warp's buffer): issued for the block's first step before the x
  // images are built, so that the weight stream's latency overlaps that prologue; for a later step at its start.
  int base = 0;
  const uint8_t *wr0 = W, *wr1 = W;
  uint4 q0[kMmaDepth], q1[kMmaDepth];
  const bool codes8 =
      (reinterpret_cast<uintptr_t>(SC) | static_cast<uintptr_t>(p.lds) | static_cast<uintptr_t>(nch)) % 8 == 0;
  auto begin = [&](int step) {
    base = step * kMmaRowsPerStep + warp * 16;
    if (base >= N) return;  // warp-uniform: this warp has no rows in the step
    const int64_t n0 = min(base + g, N - 1), n1 = min(base + g + 8, N - 1);
    wr0 = W + n0 * p.ldw + 16 * t;
    wr1 = W + n1 * p.ldw + 16 * t;
#pragma unroll
    for (int d = 0; d < kMmaDepth; ++d)
      if (d < nseg) q0[d] = ldg_stream(wr0 + 64 * d), q1[d] = ldg_stream(wr1 + 64 * d);
    const int piece = codes8 ? 8 : 4, per_row = nch / piece;
    for (int i = lane; i < 16 * per_row; i += 32) {
      const int r = i / per_row, c = (i - r * per_row) * piece;
      const uint8_t* src = SC + static_cast<int64_t>(min(base + r, N - 1)) * p.lds + c;
      if (codes8)
        cp_async8(codes + r * nch + c, src);
      else
        cp_async4(codes + r * nch + c, src);
    }
    cp_async_commit();
  };
  if (first < p.steps) begin(first);

  // The row's B images and kx words from the pre-pass (cp.async into this block's shared memory), and whether x
  // qualifies with its kx range (each thread folds a few chunk records, a warp's fold goes to the flags); without a
  // pre-pass the block builds them itself (a warp per chunk, a lane per column).
  if (p.images == nullptr) {
    mma_x_chunks(xr, nch, warp, lane, flags, [&](int c, float v) { return fp4_chunk_image(c, v, lane, img, kxs); });
  } else {
    const MmaImagesLayout L = fp4_mma_images_layout(p.x_rows > 0 ? p.x_rows : p.M, K);  // the host's xrows
    const int64_t xrow = p.x_rows > 0 ? mt % p.x_rows : mt;
    const uint8_t* gimg = p.images + L.img + xrow * K * 4;
    const uint8_t* gkxs = p.images + L.kxs + xrow * nch * 4;
    const int tid = static_cast<int>(threadIdx.x), nthr = static_cast<int>(blockDim.x);
    for (int i = tid; i < K / 4; i += nthr) cp_async16(smem_b + sm.img + 16 * i, gimg + 16 * i);
    for (int i = tid; i < nch / 4; i += nthr) cp_async16(smem_b + sm.kxs + 16 * i, gkxs + 16 * i);
    cp_async_commit();
    const int* rec = reinterpret_cast<const int*>(p.images + L.rec) + xrow * nch;
    bool ok = true;
    int kmin = INT_MAX, kmax = INT_MIN;
    for (int c = tid; c < nch; c += nthr) {
      const int k = __ldg(rec + c);
      ok = ok && k != INT_MIN;  // kmin / kmax then do not matter: x_ok is false
      kmin = min(kmin, k);
      kmax = max(kmax, k);
    }
    mma_fold_flags(flags, lane, __all_sync(0xffffffffu, ok) != 0, __reduce_min_sync(0xffffffffu, kmin),
                   __reduce_max_sync(0xffffffffu, kmax));
    cp_async_wait_all();  // also the first step's scale codes (begin's group)
  }
  __syncthreads();  // images, kx, flags complete
  const bool x_ok = flags[0] != 0;
  const int lo = max(0, -13 - flags[1]), hi = min(252, 240 - flags[2]);  // e + kx + 14 in [1, 254], e <= 252

  // B: lanes with t == g / 2 read their image row, the others the zero block (shared-space byte addresses).
  const bool data_lane = t == (g >> 1);
  const uint32_t bsrc = static_cast<uint32_t>(__cvta_generic_to_shared(data_lane ? img + 16 * g : zeros));
  const uint32_t bstep = data_lane ? 512u : 0u;  // bytes per segment
  const int4* kx4s = reinterpret_cast<const int4*>(kxs);
  const uint32_t* crow0 = reinterpret_cast<const uint32_t*>(codes + g * nch);  // the codes of rows g, g + 8
  const uint32_t* crow1 = reinterpret_cast<const uint32_t*>(codes + (g + 8) * nch);

  for (int step = first; step < p.steps; step += stride) {
    if (step != first) begin(step);
    if (base >= N) continue;  // warp-uniform; no block barrier below
    cp_async_wait_all();
    __syncwarp();           // the warp's codes are in
    float acc[2][2][2][2];  // [row][p][h][e]
#pragma unroll
    for (int a = 0; a < 16; ++a) (&acc[0][0][0][0])[a] = 0.0f;
    bool fast = x_ok && lo <= hi;
    for (int j = t; j < nseg; j += 4) fast = fast && codes_in(crow0[j], lo, hi) && codes_in(crow1[j], lo, hi);
    fast = __all_sync(0xffffffffu, fast);

    if (fast) {
      for (int s0 = 0; s0 < nseg; s0 += kMmaDepth) {
#pragma unroll
        for (int d = 0; d < kMmaDepth; ++d) {
          const int seg = s0 + d;
          if (seg >= nseg) break;  // uniform
          // Chunk t of rows g, g + 8 through the warp's transpose buffer: lane t then reads word t of each chunk.
          uint32_t* tb = tbuf + (seg & 1) * 16 * kMmaTStride;
          *reinterpret_cast<uint4*>(tb + g * kMmaTStride + 4 * t) = q0[d];
          *reinterpret_cast<uint4*>(tb + (g + 8) * kMmaTStride + 4 * t) = q1[d];
          if (seg + kMmaDepth < nseg)
            q0[d] = ldg_stream(wr0 + 64 * (seg + kMmaDepth)), q1[d] = ldg_stream(wr1 + 64 * (seg + kMmaDepth));
          __syncwarp();  // also orders the reads of this buffer two segments ago before its writes above
          // Word t of chunks 0..3 of rows g and g + 8: two ldmatrix.x4 (matrix c = chunk c of 8 rows), one instruction
          // for the 4 words that took 4 ld.shared.b32 (bench/RESULTS.md, fifty-sixth session).
          const uint32_t tbs = static_cast<uint32_t>(__cvta_generic_to_shared(tb)) + tb_src;
          uint32_t w0[4], w1[4];
          ldmatrix_x4(w0, tbs);
          ldmatrix_x4(w1, tbs + 8 * kMmaTStride * 4);
          const uint32_t e0 = crow0[seg], e1 = crow1[seg];
          uint32_t bw[16];  // B of A-tile 4c + 2p + h
          const uint32_t bp = bsrc + static_cast<uint32_t>(seg) * bstep;
#pragma unroll
          for (int v = 0; v < 4; ++v) {
            const uint4 u = lds128(bp + 16u * v);
            bw[4 * v] = u.x, bw[4 * v + 1] = u.y, bw[4 * v + 2] = u.z, bw[4 * v + 3] = u.w;
          }
          const int4 kx = kx4s[seg];
          const int kxc[4] = {kx.x, kx.y, kx.z, kx.w};
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            // 2^(e + kx - 113) of rows n0 / n1 in chunk c.
            const float S0 = __int_as_float(static_cast<int>(prmt(e0, 0u, 0x4440u + c)) * (1 << 23) + kxc[c]);
            const float S1 = __int_as_float(static_cast<int>(prmt(e1, 0u, 0x4440u + c)) * (1 << 23) + kxc[c]);
            uint32_t lo0[2], hi0[2], lo1[2], hi1[2];
            fp4_half_patterns(w0[c], lo0, hi0);
            fp4_half_patterns(w1[c], lo1, hi1);
#pragma unroll
            for (int pp = 0; pp < 2; ++pp)
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                float dd[4];
                mma_f16(dd, h ? hi0[pp] : lo0[pp], h ? hi1[pp] : lo1[pp], bw[4 * c + 2 * pp + h]);
                acc[0][pp][h][0] = __fmaf_rn(dd[0], S0, acc[0][pp][h][0]);
                acc[0][pp][h][1] = __fmaf_rn(dd[1], S0, acc[0][pp][h][1]);
                acc[1][pp][h][0] = __fmaf_rn(dd[2], S1, acc[1][pp][h][0]);
                acc[1][pp][h][1] = __fmaf_rn(dd[3], S1, acc[1][pp][h][1]);
              }
          }
        }
      }
    } else {
      // Slow path: the lane's chains one weight at a time, fp4_weight's exact decode (any scale code), x as given.
      if (lane == 0) atomicAdd(&g_slow_warps, 1ull);
      const uint8_t* b0p = wr0 - 16 * t + 4 * t;  // word t of each chunk of row g
      const uint8_t* b1p = wr1 - 16 * t + 4 * t;
      const uint8_t* s0p = reinterpret_cast<const uint8_t*>(crow0);
      const uint8_t* s1p = reinterpret_cast<const uint8_t*>(crow1);
#pragma unroll 1
      for (int ch = 0; ch < nch; ++ch) {
        const uint32_t e0 = s0p[ch], e1 = s1p[ch];
        const uint32_t b0 = __ldg(reinterpret_cast<const unsigned int*>(b0p + 16 * ch));
        const uint32_t b1 = __ldg(reinterpret_cast<const unsigned int*>(b1p + 16 * ch));
#pragma unroll
        for (int pp = 0; pp < 2; ++pp)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int q = 2 * pp + e;  // byte q of the word = byte 4t + q of the chunk
            const float xl = __ldcg(xr + 32 * ch + 8 * t + 2 * q), xh = __ldcg(xr + 32 * ch + 8 * t + 2 * q + 1);
            acc[0][pp][0][e] = __fmaf_rn(fp4_weight(e2m1_top(b0 << (28 - 8 * q)), e0), xl, acc[0][pp][0][e]);
            acc[0][pp][1][e] = __fmaf_rn(fp4_weight(e2m1_top(b0 << (24 - 8 * q)), e0), xh, acc[0][pp][1][e]);
            acc[1][pp][0][e] = __fmaf_rn(fp4_weight(e2m1_top(b1 << (28 - 8 * q)), e1), xl, acc[1][pp][0][e]);
            acc[1][pp][1][e] = __fmaf_rn(fp4_weight(e2m1_top(b1 << (24 - 8 * q)), e1), xh, acc[1][pp][1][e]);
          }
      }
    }
    __syncwarp();  // the codes buffer is free for the next step's cp.async

    // The fold. Chain (j, l) with l = 4 (t % 2) + 2p + e: j = 2h + t / 2, so lanes t and t ^ 2 hold the four j of each
    // of their l. s[l] = ((v0 + v1) + v2) + v3, tot = fma(s, 1, 0), u_i = tot[i] + tot[4 + i] (lanes t, t ^ 1; i = 2p
    // + e), y = ((u0 + u2) + (u1 + u3)) + 0.
    const bool low = t < 2;  // holds j = 0 and 2
#pragma unroll
    for (int a = 0; a < 2; ++a) {
      float u[2][2];
#pragma unroll
      for (int pp = 0; pp < 2; ++pp)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float own0 = acc[a][pp][0][e], own1 = acc[a][pp][1][e];
          const float oth0 = __shfl_xor_sync(0xffffffffu, own0, 2), oth1 = __shfl_xor_sync(0xffffffffu, own1, 2);
          const float sl = __fadd_rn(__fadd_rn(__fadd_rn(own0, oth0), low ? own1 : oth1), low ? oth1 : own1);
          const float tot = __fmaf_rn(sl, 1.0f, 0.0f);
          u[pp][e] = __fadd_rn(tot, __shfl_xor_sync(0xffffffffu, tot, 1));
        }
      const float out = __fadd_rn(__fadd_rn(__fadd_rn(u[0][0], u[1][0]), __fadd_rn(u[0][1], u[1][1])), 0.0f);
      const int n = base + g + 8 * a;
      if (t == 0 && n < N) p.y[static_cast<int64_t>(mt) * N + n] = p.round ? round_to_bf16(out) : out;
    }
  }
}

}  // namespace

bool gemv_fp4_mma_supported(const GemvArgs& a) {
  if (a.fmt != 1 || !gemv_supported(a) || a.M <= 0 || a.N <= 0) return false;
  if (a.act_quant_block != 0 || a.K % 128 != 0 || a.K > kMmaMaxK || a.lds % 4 != 0) return false;
  if (a.row_expert == nullptr && reinterpret_cast<uintptr_t>(a.scale) % 4 != 0) return false;
  return true;
}

int64_t gemv_fp4_mma_slow_warps(bool reset) { return mma_read_counter(&g_slow_warps, reset); }

void gemv_fp4_mma_into(const GemvArgs& a, cudaStream_t stream) {
  DI_CHECK(gemv_fp4_mma_supported(a), "cuda::gemv: fp4_mma_gemv does not take this call (N {}, K {}, M {})", a.N, a.K,
           a.M);
  // The x pre-pass for calls of few distinct x rows, where each row's images would otherwise be built by many blocks
  // (batch 1: 6 rows, 36 blocks each for w1 + w3). Measured on the H200 (bench/RESULTS.md, eighteenth session):
  // bench_cuda_gemv's grouped table at one token, w1 + w3 38.5 us against 42.3, w2 20.2 against 21.5;
  // bench_cuda_model on the V4.1 flash shape, batch 1, 1.205 ms against 1.235 (means of four alternated runs). With
  // more rows (the table's 4 tokens: 24 rows, 11 blocks each) it lost, w1 + w3 146 us against 130 (back to back in
  // the bench's graph, a GEMV's prologue overlaps the previous call's tail; behind the pre-pass it cannot). Both
  // prologues build the same images, so the choice never changes a bit.
  constexpr int64_t kPrepassMaxRows = 8;
  const int64_t xrows = a.x_rows > 0 ? a.x_rows : a.M, nch = a.K / 32;
  if (xrows > kPrepassMaxRows) {
    mma_launch(fp4_mma_gemv, a, 32 * kMmaWarps, kMmaRowsPerStep, fp4_mma_smem(a.K).total, stream);
    return;
  }
  const Tensor scratch = call_scratch(static_cast<size_t>(fp4_mma_images_layout(xrows, a.K).total));
  uint8_t* images = static_cast<uint8_t*>(scratch.raw());
  launch_pdl(fp4_mma_images, dim3(static_cast<unsigned>((nch + 7) / 8), static_cast<unsigned>(xrows)), 256, 0, stream,
             a.x, static_cast<int64_t>(a.ldx), xrows, a.K, images);
  mma_launch(fp4_mma_gemv, a, 32 * kMmaWarps, kMmaRowsPerStep, fp4_mma_smem(a.K).total, stream, images);
}

}  // namespace deepinfer::cuda
