// bf16_tile_gemv: the BF16 GEMV for batches of x rows (the vocabulary head at decode batches), bit-identical to
// chain_gemv and the CPU op (the order replayed is linear_gemv.cuh's: per output 32 chains v[j][l] over element
// 32c + 8j + l of every chunk c, v = fma(w, x, v) from +0, then s[l] = ((v0 + v1) + v2) + v3, tot[l] =
// fma(s, 1, 0) and the CPU's hsum). Dense calls with act_quant_block 0 only.
//
// Why a second kernel: chain_gemv gives a lane one weight row's 8 chains (j fixed, l = 0..7) for MT x rows, so each
// x value read from shared memory feeds a single FMA: 4 bytes of shared memory per FMA, which held the head at M = 32
// to ~20% of the FMA peak (3.3 ms, bench_cuda_gemv's batched table). Here a lane owns 4 chains of 4 weight rows for
// 4 x rows: every x value feeds 4 rows and every weight value 4 x rows (1 byte of shared memory and 0.5 byte of
// weight per FMA).
//
// Thread mapping. Lane = 8 g + 4 h + t (row group g = 0..3, half h = 0..1, t = 0..3) owns chains (j = t, l = 4h + i),
// i = 0..3 -- columns 32c + 8t + 4h + i of every chunk -- of rows 4g .. 4g + 3 of its warp's 16 rows, for the
// block's MT x rows (4, or 8 from 5 rows of x where K allows: one read of the weights for up to 8 rows): acc[r][m][i].
// Per chunk it loads 8 bytes of each of its 4 rows (the 8 lanes of a row group read the row's 64-byte chunk) and one
// float4 of each x row (the 8 lanes of a quarter warp read 128 contiguous bytes). Weights stream through a register
// ring kTileDepth chunks deep that runs on across the rows of the block; the weight loads start before
// griddepcontrol.wait (dense weights are not written by the previous kernel). Row end: lanes t = 1..3 hand v to lane t
// = 0 of their (g, h) (shuffles of width 4): s, tot; lane h = 1 hands its 4 tots to lane h = 0 (a shuffle of width 8),
// which forms the hsum and stores. Blocks of 8 warps own 128 rows per step and are persistent; the x-row group is the
// fastest index of the block number, so the blocks that read the same weight rows for different x rows run side by side
// (L2 reuse).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/device.h"
#include "cuda/fp_decode.cuh"
#include "cuda/linear_gemv_bf16.cuh"
#include "cuda/linear_gemv_fp8.cuh"

namespace deepinfer::cuda {

namespace {

constexpr int kTileWarps = 8;                       // warps per block
constexpr int kWarpRows = 16;                       // weight rows per warp: 4 row groups of 4
constexpr int kBlockRows = kTileWarps * kWarpRows;  // weight rows per block step
constexpr int kTileDepth = 4;                       // chunks of weights in flight per lane
constexpr int kTileMaxK = 12288;                    // x rows in shared memory: MT * K floats

struct TileParams {
  const uint8_t* w;
  int64_t ldw;  // bytes between weight rows
  const float* x;
  int64_t ldx;  // floats between x rows
  float* y;     // [M, N]
  int N, K, M;
  int mtiles;  // x-row groups of MT
  int steps;   // ceil(N / kBlockRows)
  bool round;
};

template <int MT>
__global__ void __launch_bounds__(32 * kTileWarps, 1) bf16_tile_gemv(TileParams p) {
  extern __shared__ __align__(16) float xs_tile[];  // [MT][K]
  pdl_launch_dependents();
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 3, h = (lane >> 2) & 1, t = lane & 3;
  const int K = p.K, N = p.N, nch = K / 32;
  const int mt = static_cast<int>(blockIdx.x) % p.mtiles;
  const int first = static_cast<int>(blockIdx.x) / p.mtiles, stride = static_cast<int>(gridDim.x) / p.mtiles;
  const int m0 = mt * MT, mrows = min(MT, p.M - m0);
  const int row0 = warp * kWarpRows + 4 * g;  // this lane's first row within a block step
  const int koff = 8 * t + 4 * h;             // this lane's 4 columns within a chunk

  // Producer: the next (block step, chunk) this lane loads, for its 4 rows (clamped to N - 1).
  int ld_step = first, ld_c = 0;
  const uint8_t* ld_row[4];
  auto set_rows = [&]() {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int64_t n = min(ld_step * kBlockRows + row0 + r, N - 1);
      ld_row[r] = p.w + n * p.ldw + 2 * koff;
    }
  };
  auto load_next = [&](uint2(&dst)[4]) {
    if (ld_step >= p.steps) return;  // past the block's last step: the slot is never consumed
#pragma unroll
    for (int r = 0; r < 4; ++r) dst[r] = ldg_stream8(ld_row[r] + 64 * ld_c);
    if (++ld_c == nch) {
      ld_c = 0;
      ld_step += stride;
      if (ld_step < p.steps) set_rows();
    }
  };
  uint2 ring[kTileDepth][4];
  if (ld_step < p.steps) set_rows();
#pragma unroll
  for (int d = 0; d < kTileDepth; ++d) load_next(ring[d]);
  pdl_wait();

  // x rows [m0, m0 + mrows) into shared memory, zeros for the rows beyond M.
  const int k4 = K / 4;
  for (int i = tid; i < MT * k4; i += static_cast<int>(blockDim.x)) {
    const int m = i / k4, c = i - m * k4;
    float4* dst = reinterpret_cast<float4*>(xs_tile) + i;
    if (m < mrows)
      cp_async16(dst, p.x + static_cast<int64_t>(m0 + m) * p.ldx + 4 * c);
    else
      *dst = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  cp_async_wait_all();
  __syncthreads();

  float acc[4][MT][4];

  // End of a block step: the outputs of this lane's 4 rows (lane (g, 0, 0) stores them).
  auto finish = [&](int step) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int n = step * kBlockRows + row0 + r;
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        float tot[4], hi[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {  // lanes t + 1, t + 2, t + 3 hold chains (1, l), (2, l), (3, l) for t = 0
          const float v = acc[r][m][i];
          const float sl = __fadd_rn(
              __fadd_rn(__fadd_rn(v, __shfl_down_sync(0xffffffffu, v, 1, 4)), __shfl_down_sync(0xffffffffu, v, 2, 4)),
              __shfl_down_sync(0xffffffffu, v, 3, 4));
          tot[i] = __fmaf_rn(sl, 1.0f, 0.0f);  // lane (g, h, 0): tot[4h + i]
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) hi[i] = __shfl_down_sync(0xffffffffu, tot[i], 4, 8);  // tot[4 + i]
        float out = __fadd_rn(__fadd_rn(__fadd_rn(tot[0], hi[0]), __fadd_rn(tot[2], hi[2])),
                              __fadd_rn(__fadd_rn(tot[1], hi[1]), __fadd_rn(tot[3], hi[3])));
        out = __fadd_rn(out, 0.0f);
        if ((lane & 7) == 0 && n < N && m < mrows)
          p.y[static_cast<int64_t>(m0 + m) * N + n] = p.round ? round_to_bf16(out) : out;
      }
    }
  };

  // Consumer: the same sequence of (block step, chunk), kTileDepth behind the producer (nch % kTileDepth == 0, so
  // chunk c of every step sits in slot c % kTileDepth).
  for (int step = first; step < p.steps; step += stride) {  // uniform over the block
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[r][m][i] = 0.0f;
#pragma unroll 1
    for (int c0 = 0; c0 < nch; c0 += kTileDepth) {
#pragma unroll
      for (int d = 0; d < kTileDepth; ++d) {
        const uint2 wq[4] = {ring[d][0], ring[d][1], ring[d][2], ring[d][3]};
        load_next(ring[d]);
        float wf[4][4];  // element koff + i of row r: bf16 2i in the low half of word i / 2
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          wf[r][0] = __uint_as_float(wq[r].x << 16);
          wf[r][1] = __uint_as_float(wq[r].x & 0xffff0000u);
          wf[r][2] = __uint_as_float(wq[r].y << 16);
          wf[r][3] = __uint_as_float(wq[r].y & 0xffff0000u);
        }
        const float* xp = xs_tile + 32 * (c0 + d) + koff;
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          const float4 xv4 = *reinterpret_cast<const float4*>(xp + m * K);
          const float xv[4] = {xv4.x, xv4.y, xv4.z, xv4.w};
#pragma unroll
          for (int r = 0; r < 4; ++r)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[r][m][i] = __fmaf_rn(wf[r][i], xv[i], acc[r][m][i]);
        }
      }
    }
    finish(step);
  }
}

}  // namespace

bool gemv_bf16_tile_supported(const GemvArgs& a) {
  return a.fmt == 2 && a.row_expert == nullptr && a.act_quant_block == 0 && a.K <= kTileMaxK &&
         a.K % (32 * kTileDepth) == 0 && a.ldw % 8 == 0;
}

void gemv_bf16_tile_into(const GemvArgs& a, cudaStream_t stream) {
  DI_CHECK(gemv_bf16_tile_supported(a) && a.M > 0 && a.N > 0, "cuda::gemv: bf16_tile_gemv does not take this call");
  TileParams p = {};
  p.w = a.w;
  p.ldw = a.ldw;
  p.x = a.x;
  p.ldx = a.ldx;
  p.y = a.y;
  p.N = a.N;
  p.K = a.K;
  p.M = a.M;
  p.round = a.round;
  p.steps = (a.N + kBlockRows - 1) / kBlockRows;
  // 8 x rows per block from 5 rows of x where they fit shared memory (bench_cuda_gemv, the head [129280, 5120] at M =
  // 8: groups of 4 rows read it twice), else 4. Persistent blocks (gemv_blocks_per_sm fails clearly when a block does
  // not fit an SM).
  const bool eight = a.M > 4 && int64_t{4} * 8 * a.K <= smem_optin();
  const int mt = eight ? 8 : 4;
  p.mtiles = (a.M + mt - 1) / mt;
  const int64_t smem = int64_t{4} * mt * a.K;
  if (eight)
    launch_persistent(bf16_tile_gemv<8>, p, 32 * kTileWarps, smem, stream);
  else
    launch_persistent(bf16_tile_gemv<4>, p, 32 * kTileWarps, smem, stream);
}

}  // namespace deepinfer::cuda
