// bf16_lane_gemv: the BF16 GEMV for one x row on narrow weights (the MoE gate [384, 5120], the compressors' and the
// indexer's BF16 projections at decode), bit-identical to chain_gemv and the CPU op (the order replayed is
// linear_gemv.cuh's: per output 32 chains v[j][l] over element 32c + 8j + l of every chunk c, v = fma(w, x, v) from
// +0, then s[l] = ((v0 + v1) + v2) + v3, tot[l] = fma(s, 1, 0) and the CPU's hsum).
//
// Why a third kernel: a row's 32 chains each run over all of K, so a row offers 32 lanes of work at most. chain_gemv
// gives a row 4 lanes (8 chains each): the gate's 384 rows fill 48 warps, 20.7 us on the H200 (bench_cuda_gemv), and
// the slab kernel with its x pre-pass took 8.1 + 3.5 us in the model (ncu). Here a warp is a row and lane c = 8j + l
// its chain (j, l): 384 warps for the gate.
//
// Thread mapping. Warp w of block b owns row 4b + w. The row streams in groups of 8 chunks (512 bytes): lane L loads
// bytes [16L, 16L + 16) of a group (one coalesced 512-byte warp load) into a per-warp shared buffer, and after a
// __syncwarp lane c reads element 32c' + c of each chunk c' = 0..7 of the group (2-byte loads, 64 contiguous bytes
// per warp: conflict free) and the matching x value, in chunk order. The buffer is double-buffered by group parity,
// so one __syncwarp per group orders both its store -> load and the previous group's loads -> this store. Groups
// stream through a register ring kLaneDepth deep; the first loads are issued before griddepcontrol.wait (dense
// weights are not written by the previous kernel). x (K floats) is staged in shared memory once per block.
// Row end: lanes l < 8 gather chains (1, l), (2, l), (3, l) from lanes 8 + l, 16 + l, 24 + l, then 3 shuffles form
// the CPU's hsum on lane 0, which stores.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/device.h"
#include "cuda/fp_decode.cuh"
#include "cuda/linear_gemv_bf16.cuh"
#include "cuda/linear_gemv_fp8.cuh"

namespace deepinfer::cuda {

namespace {

constexpr int kLaneWarps = 4;  // rows per block
// Groups (512 bytes of the row) in flight per warp: 20 = all of a 5,120-column row (the gate), issued before
// griddepcontrol.wait, so that the weight's HBM latency passes while the previous kernel runs (the gate is launched
// early, beside the norm that makes its x). With a ring of 8 the gate [384, 5120] ended 15 us after the norm in the
// decode step (ktrace; its 96 blocks waited on three HBM round trips each), with 20 it ends 5 us after.
constexpr int kLaneDepth = 20;
constexpr int kLaneGroupBytes = 512;  // 8 chunks of 32 BF16 values
constexpr int kLaneMaxK = 12288;      // x in shared memory
constexpr int64_t kLaneMaxN = 8192;   // wider weights keep the slab kernel (the head streams at ~97% of HBM there)

struct LaneParams {
  const uint8_t* w;
  int64_t ldw;  // bytes between weight rows
  const float* x;
  float* y;  // [N]
  int N, K;
  bool round;
};

__global__ void __launch_bounds__(32 * kLaneWarps) bf16_lane_gemv(LaneParams p) {
  extern __shared__ __align__(16) float smem_lane[];
  pdl_launch_dependents();
  const int K = p.K, groups = K / 256;
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  float* xs = smem_lane;                                                           // [K]
  uint8_t* buf = reinterpret_cast<uint8_t*>(xs + K) + warp * 2 * kLaneGroupBytes;  // [2][512] per warp
  const int n = static_cast<int>(blockIdx.x) * kLaneWarps + warp;
  const bool live = n < p.N;
  const uint8_t* row = p.w + static_cast<int64_t>(live ? n : 0) * p.ldw + 16 * lane;

  uint4 ring[kLaneDepth];
#pragma unroll
  for (int d = 0; d < kLaneDepth; ++d)
    ring[d] = live && d < groups ? ldg_stream(row + d * kLaneGroupBytes) : make_uint4(0u, 0u, 0u, 0u);
  pdl_wait();
  for (int i = static_cast<int>(threadIdx.x); i < K / 4; i += 32 * kLaneWarps) cp_async16(xs + 4 * i, p.x + 4 * i);
  cp_async_wait_all();
  __syncthreads();
  if (!live) return;  // whole warps

  float acc = 0.0f;  // chain (j, l) = (lane / 8, lane % 8)
  for (int g0 = 0; g0 < groups; g0 += kLaneDepth) {
#pragma unroll
    for (int d = 0; d < kLaneDepth; ++d) {
      const int g = g0 + d;
      if (g >= groups) break;  // uniform over the warp
      uint8_t* b = buf + (g & 1) * kLaneGroupBytes;
      *reinterpret_cast<uint4*>(b + 16 * lane) = ring[d];
      const int gn = g + kLaneDepth;
      ring[d] = gn < groups ? ldg_stream(row + static_cast<int64_t>(gn) * kLaneGroupBytes) : make_uint4(0u, 0u, 0u, 0u);
      __syncwarp();
      const float* xg = xs + 256 * g + lane;
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const uint32_t h = *reinterpret_cast<const uint16_t*>(b + 2 * (32 * c + lane));
        acc = __fmaf_rn(__uint_as_float(h << 16), xg[32 * c], acc);
      }
    }
  }
  // s[l] = ((v0 + v1) + v2) + v3 on lanes l < 8, tot[l] = fma(s, 1, 0); hsum ((t0 + t4) + (t2 + t6)) + ((t1 + t5) +
  // (t3 + t7)) on lane 0.
  const float v1 = __shfl_down_sync(0xffffffffu, acc, 8), v2 = __shfl_down_sync(0xffffffffu, acc, 16),
              v3 = __shfl_down_sync(0xffffffffu, acc, 24);
  const float tot = __fmaf_rn(__fadd_rn(__fadd_rn(__fadd_rn(acc, v1), v2), v3), 1.0f, 0.0f);
  const float u = __fadd_rn(tot, __shfl_down_sync(0xffffffffu, tot, 4));  // lane i < 4: tot[i] + tot[4 + i]
  const float v = __fadd_rn(u, __shfl_down_sync(0xffffffffu, u, 2));      // lane 0 / 1: the two halves
  const float out = __fadd_rn(__fadd_rn(v, __shfl_down_sync(0xffffffffu, v, 1)), 0.0f);
  if (lane == 0) p.y[n] = p.round ? round_to_bf16(out) : out;
}

}  // namespace

bool gemv_bf16_lane_supported(const GemvArgs& a) {
  return a.fmt == 2 && a.row_expert == nullptr && a.act_quant_block == 0 && a.M == 1 && a.N <= kLaneMaxN &&
         a.K % 256 == 0 && a.K <= kLaneMaxK && a.ldw % 16 == 0 && reinterpret_cast<uintptr_t>(a.w) % 16 == 0;
}

void gemv_bf16_lane_into(const GemvArgs& a, cudaStream_t stream) {
  DI_CHECK(gemv_bf16_lane_supported(a) && a.N > 0, "cuda::gemv: bf16_lane_gemv does not take this call");
  LaneParams p = {};
  p.w = a.w;
  p.ldw = a.ldw;
  p.x = a.x;
  p.y = a.y;
  p.N = a.N;
  p.K = a.K;
  p.round = a.round;
  const int64_t smem = 4 * static_cast<int64_t>(a.K) + kLaneWarps * 2 * kLaneGroupBytes;
  DI_CHECK(gemv_blocks_per_sm(reinterpret_cast<const void*>(bf16_lane_gemv), 32 * kLaneWarps, smem) >= 1,
           "cuda::gemv: bf16_lane_gemv does not fit an SM ({} bytes of shared memory)", smem);
  const int64_t grid = (a.N + kLaneWarps - 1) / kLaneWarps;
  launch_pdl(bf16_lane_gemv, dim3(static_cast<unsigned>(grid)), 32 * kLaneWarps, smem, stream, p);
}

}  // namespace deepinfer::cuda
