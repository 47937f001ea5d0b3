// Pieces shared by the tensor-core decode GEMVs (fp4_mma_gemv, fp8_mma_gemv): the launch shape and shared-memory
// layout, the parameter block (with fp4_mma_gemv's x pre-pass scratch and its layout), a block's rows,
// the prologue's flags and walk over x, the exact one-product-per-output mma, and on the host the slow-path counter
// read and the launch.
#pragma once

#include <climits>
#include <cstdint>

#include "cuda/linear_gemv_fp8.cuh"

#ifdef __CUDACC__
#include <cuda_fp16.h>

#include "cuda/device.h"
#endif

namespace deepinfer::cuda {

// The launch shape both kernels use: blocks of kMmaWarps warps, each on its own 16 weight rows per step; a ring of
// kMmaDepth segments in flight per lane; K up to kMmaMaxK (shared memory grows with K); kMmaTStride words per row of a
// warp's transpose buffer (conflict-free 4-byte reads, and ldmatrix rows: 80 bytes apart, 8 rows hit 8 bank groups).
constexpr int kMmaWarps = 4;
constexpr int kMmaRowsPerStep = 16 * kMmaWarps;
constexpr int kMmaDepth = 4;
constexpr int kMmaMaxK = 8192;
constexpr int kMmaTStride = 20;

// A block's shared memory, dynamic only (gemv_blocks_per_sm opts the kernels in to the largest dynamic size, which
// leaves no room for static shared memory), byte offsets: the B images (K * 4 bytes), a kx word per 32-column chunk,
// zero_bytes zeros (the B image of the lanes that hold no x), the block's flags (x_ok, kx min, kx max), per warp its
// scale codes (codes_warp bytes: codes_per_warp, 16-byte aligned) and 2 transpose buffers [16][kMmaTStride words].
struct MmaSmem {
  int64_t img, kxs, zeros, flags, codes, codes_warp, tbuf, total;
};
__host__ __device__ inline MmaSmem mma_smem(int K, int zero_bytes, int64_t codes_per_warp, int warps = kMmaWarps) {
  MmaSmem m;
  const int64_t nch = K / 32;
  m.img = 0;
  m.kxs = m.img + int64_t{K} * 4;
  m.zeros = m.kxs + (nch * 4 + 15) / 16 * 16;
  m.flags = m.zeros + zero_bytes;
  m.codes = m.flags + 16;
  m.codes_warp = (codes_per_warp + 15) / 16 * 16;
  m.tbuf = m.codes + warps * m.codes_warp;
  m.total = m.tbuf + warps * 2 * 16 * kMmaTStride * 4;
  return m;
}

// Kernel parameters, by value (copy_gemv_args fills the call's fields).
struct MmaParams : GemvCall {
  int mtiles;                       // x rows served: M (dense: each against the one weight)
  int steps;                        // ceil(N / rows per step)
  const uint8_t* images = nullptr;  // fp4_mma_gemv: the x pre-pass's scratch (fp4_mma_images_layout of its x rows:
                                    // x_rows if > 0, else M)
};

// fp4_mma_gemv's x pre-pass scratch, byte offsets: per x row its B images (K * 4 bytes, the kernel's shared-memory
// layout), then per x row its kx words [K / 32], then per x row and chunk kx where the chunk qualifies, else INT_MIN.
struct MmaImagesLayout {
  int64_t img, kxs, rec, total;
};
__host__ __device__ inline MmaImagesLayout fp4_mma_images_layout(int64_t rows, int K) {
  MmaImagesLayout m;
  m.img = 0;
  m.kxs = rows * K * 4;
  m.rec = m.kxs + rows * (K / 32) * 4;
  m.total = m.rec + rows * (K / 32) * 4;
  return m;
}

#ifdef __CUDACC__
// A block's x row and, in grouped mode, its expert's weight and scale rows (read after pdl_wait: the ids and tables
// may come from the previous kernel), as linear_gemv.cu's expert_of.
__device__ __forceinline__ const float* mma_block_rows(const MmaParams& p, int mt, const uint8_t*& w,
                                                       const uint8_t*& sc) {
  const int64_t xrow = p.x_rows > 0 ? mt % p.x_rows : mt;
  w = p.w;
  sc = p.sc;
  if (p.row_expert != nullptr) {
    const int e = __ldcg(p.row_expert + xrow) + (p.x_rows > 0 ? mt / p.x_rows * p.n_experts : 0);
    w = reinterpret_cast<const uint8_t*>(__ldcg(reinterpret_cast<const unsigned long long*>(p.w_table + e)));
    sc = reinterpret_cast<const uint8_t*>(__ldcg(reinterpret_cast<const unsigned long long*>(p.s_table + e)));
  }
  return p.x + xrow * p.ldx;
}

// The block's flags (x_ok = 1, kx min, kx max: mma_x_chunks fills them) and the zero block of B images (nzero words);
// the caller's barrier completes them.
__device__ __forceinline__ void mma_block_flags(int* flags, uint32_t* zeros, int nzero) {
  if (threadIdx.x == 0) flags[0] = 1, flags[1] = INT_MAX, flags[2] = INT_MIN;
  if (threadIdx.x < nzero) zeros[threadIdx.x] = 0u;
}

// mma_block_flags, then the wait for the previous kernel.
__device__ __forceinline__ void mma_block_init(int* flags, uint32_t* zeros, int nzero) {
  mma_block_flags(flags, zeros, nzero);
  __syncthreads();
  pdl_wait();
}

// What an mma GEMV's prologue learns of one 32-column chunk of x: its exponent kx and whether it is exact in the
// kernel's form (warp-uniform).
struct MmaChunk {
  int kx;
  bool ok;
};

// A 32-column chunk of x (a lane per column, v) as X 2^kx with X exact in f16: kx = E(amax) - 15, so that the largest X
// is in [2^15, 2^16). ok (warp-uniform) when x is finite, kx is in [kx_lo, kx_hi] and every X is exact with no x lost
// below fp32's range; bits: this lane's f16 code (0 when the chunk's kx is out of range).
struct F16Chunk {
  uint32_t bits;
  int kx;
  bool ok;
};
__device__ __forceinline__ F16Chunk f16_chunk(float v, int kx_lo, int kx_hi) {
  const uint32_t amax = __reduce_max_sync(0xffffffffu, __float_as_uint(v) & 0x7fffffffu);  // NaN sorts above inf
  const int kx = amax != 0u ? static_cast<int>(amax >> 23) - 127 - 15 : 0;
  bool ok = amax < 0x7f800000u && kx >= kx_lo && kx <= kx_hi;
  uint32_t bits = 0u;
  if (ok) {  // warp-uniform
    const float X = __fmul_rn(v, __uint_as_float(static_cast<uint32_t>(127 - kx) << 23));
    const __half hx = __float2half_rn(X);
    bits = __half_as_ushort(hx);
    ok = __half2float(hx) == X && ((X == 0.0f) == (v == 0.0f));
  }
  return F16Chunk{bits, kx, __all_sync(0xffffffffu, ok) != 0};
}

// A warp's fold of its chunks into the block's flags (mma_block_flags'): x_ok, kx min, kx max (warp-uniform values).
__device__ __forceinline__ void mma_fold_flags(int* flags, int lane, bool ok, int kmin, int kmax) {
  if (lane == 0) {
    if (!ok) atomicAnd(&flags[0], 0);
    atomicMin(&flags[1], kmin);
    atomicMax(&flags[2], kmax);
  }
}

// The x walk of an mma GEMV's prologue: warp w takes chunks w, w + kMmaWarps, ... of x row xr (nch chunks of 32
// columns), a lane per column, 16 chunks' loads in flight; chunk(c, v) (v: column 32 c + lane) builds the chunk's B
// images and returns its MmaChunk. The warps then fold x_ok, kx min and kx max into flags (mma_fold_flags); the
// caller's barrier completes them.
template <int kWarps = kMmaWarps, typename ChunkFn>
__device__ __forceinline__ void mma_x_chunks(const float* xr, int nch, int warp, int lane, int* flags,
                                             ChunkFn&& chunk) {
  bool ok = true;
  int kmin = INT_MAX, kmax = INT_MIN;
  constexpr int kBatch = 16;
  for (int cb = warp; cb < nch; cb += kBatch * kWarps) {
    float xv[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int c = cb + u * kWarps;
      xv[u] = c < nch ? __ldcg(xr + 32 * c + lane) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int c = cb + u * kWarps;
      if (c >= nch) break;  // warp-uniform
      const MmaChunk m = chunk(c, xv[u]);
      ok = ok && m.ok;
      kmin = min(kmin, m.kx);
      kmax = max(kmax, m.kx);
    }
  }
  mma_fold_flags(flags, lane, ok, kmin, kmax);
}

// Whether a warp's E4M3 row block takes the fast path (warp-uniform): ok (x's chunks all exact) and every scale code
// of its row block (codes: nch bytes in shared memory, 4-byte aligned, nch % 4 == 0) in [lo, hi].
__device__ __forceinline__ bool mma_codes_fast(const uint8_t* codes, int nch, int lane, bool ok, int lo, int hi) {
  bool fast = ok && lo <= hi;
  for (int i = lane; i < nch / 4; i += 32) {
    const uint32_t e4 = reinterpret_cast<const uint32_t*>(codes)[i];
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int v = static_cast<int>((e4 >> (8 * b)) & 0xffu);
      fast = fast && v >= lo && v <= hi;
    }
  }
  return __all_sync(0xffffffffu, fast) != 0;
}

// D = A diag(B): with B's only nonzeros on its diagonal, d0 / d1 are rows g, columns 2t / 2t + 1 (the lane's own a0
// times the diagonal's x), d2 / d3 rows g + 8: four exact products per lane (fp16 x fp16 into fp32, summed with zeros).
__device__ __forceinline__ void mma_f16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%7, %7, %7, %7};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a0), "r"(a1), "r"(b0), "f"(0.0f));
}

// Host: a kernel's slow-path warp counter (a __device__ unsigned long long), after a device sync; reset sets it to 0.
inline int64_t mma_read_counter(const void* symbol, bool reset) {
  unsigned long long n = 0;
  flush_deferred();
  DI_CUDA_CHECK(cudaDeviceSynchronize());
  DI_CUDA_CHECK(cudaMemcpyFromSymbol(&n, symbol, sizeof n));
  if (reset) {
    const unsigned long long zero = 0;
    DI_CUDA_CHECK(cudaMemcpyToSymbol(symbol, &zero, sizeof zero));
  }
  return static_cast<int64_t>(n);
}

// Host: launches an mma GEMV kernel for the call a (threads per block, rows per step, dynamic shared memory smem):
// one x row per block (grouped: against its expert's weight; dense: all against the one weight; the x row is the
// fastest index of the block number, so the blocks that read the same weight rows run side by side and L2 serves all
// but the first), launch_persistent's grid; images: fp4_mma_gemv's x pre-pass scratch, if any.
inline void mma_launch(void (*kernel)(MmaParams), const GemvArgs& a, int threads, int rows_per_step, int64_t smem,
                       cudaStream_t stream, const uint8_t* images = nullptr) {
  MmaParams p = {};
  copy_gemv_args(a, p);
  p.images = images;
  p.mtiles = a.M;
  p.steps = (a.N + rows_per_step - 1) / rows_per_step;
  launch_persistent(kernel, p, threads, smem, stream);
}
#endif

}  // namespace deepinfer::cuda
