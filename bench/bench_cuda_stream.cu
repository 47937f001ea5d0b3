// GPU benchmark of the decode GEMVs' weight access pattern without their arithmetic: how fast HBM serves a weight
// matrix when every warp streams its own rows the way fp8_walk_gemv does, and how that changes with the order of the
// reads. Needs a CUDA GPU (prints SKIP and exits 0 without one).
//   ./build/bench/bench_cuda_stream
//
// Why: fp8_walk_gemv reaches ~2.1-2.5 TB/s on the V4.1 decode shapes against ~4 TB/s for a plain read, and neither
// fewer instructions per weight nor more loads in flight made it faster (bench/RESULTS.md). This bench takes the
// arithmetic away and keeps the walk's shape: one block of 16 warps per SM, each warp owning groups of 4 rows (dealt
// out as the walk deals them), every lane loading 16 bytes per 512-byte piece with the walk's streaming load
// (ld.global.nc.L1::no_allocate.L2::256B), a ring of D items in flight per lane. The configuration's name says what
// an item is: "4x512" (the walk: 512 bytes of each of the 4 rows of the group), "2x1K" (1 KB of each of 2 rows, the
// group's rows in two passes), "1x2K" (2 KB of one row, the rows one after another), "1x4K". `work` adds a dependent
// chain of that many FMAs per item (a stand-in for the arithmetic's latency). Only whole items are read (a row's tail
// beyond its last whole item is skipped, and GB/s counts the bytes read). Each configuration is timed on V4.1 dense
// decode shapes, rotating over weight copies of >= 512 MiB (L2 is 50-60 MB), and reported as us per call, GB/s and %
// of the read ceiling measured in the same run (the plain read kernel over 2 GiB).
//
// "bulk S" rows: the walk's items (4 rows x 512 bytes a warp) brought by bulk copies (cp.async.bulk, the TMA's 1-D
// form, one elected lane issuing an item's 4 row pieces as the walk's bulk ring does) into a per-warp ring of S stages
// in shared memory, each lane then reading its 16 bytes of each row from there. Why: ncu gives the walk's warps
// long_scoreboard as their first stall (bench/RESULTS.md, sixty-first session): too few bytes in flight, since a lane's
// ring lives in its registers (8 KB a warp at most, ~64 KB an SM). A bulk copy holds no register and no L1 miss slot
// while in flight, so S stages of 2 KB put 2 S KB a warp in flight; these rows say whether the walk's access pattern
// goes faster that way before the walk is rebuilt on it.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "cuda/common.cuh"
#include "cuda/device.h"
#include "cuda/fp_decode.cuh"
#include "cuda/hopper.cuh"
#include "cuda_bench_util.cuh"

namespace {

using deepinfer::DType;
using deepinfer::Tensor;
using deepinfer::cuda::ldg_stream;  // the walk's streaming 16-byte load
namespace bench = deepinfer::bench;

constexpr int kWarps = 16;   // warps per block, one block per SM (the walk's launch)
constexpr int kGroup = 4;    // rows per warp group (the walk's R at one x row)
constexpr int kPiece = 512;  // bytes per warp load (32 lanes x 16)

// I rows of the group interleaved per item, P consecutive 512-byte pieces of each per item (I * P = 4 loads per lane
// per item at I = 4, P = 1), a ring of D items; the group's kGroup rows in kGroup / I passes over K.
template <int I, int P, int D>
__global__ void __launch_bounds__(32 * kWarps, 1)
    stream_rows(const uint8_t* __restrict__ w, int64_t ldw, int K, int groups, int work, float* out) {
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int nb = static_cast<int>(gridDim.x), nw = static_cast<int>(blockDim.x) >> 5;
  const int items_per_pass = K / (kPiece * P);
  const int items = items_per_pass * (kGroup / I);
  uint32_t acc = 0;
  float f = 1.0f;
  for (int g = warp * nb + static_cast<int>(blockIdx.x); g < groups; g += nb * nw) {
    const uint8_t* base = w + static_cast<int64_t>(g) * kGroup * ldw + 16 * lane;
    auto addr = [&](int it, int r, int p) {  // item it: pass it / items_per_pass, rows I * pass + r
      const int pass = it / items_per_pass, k = it - pass * items_per_pass;
      return base + static_cast<int64_t>(I * pass + r) * ldw + static_cast<int64_t>(k * P + p) * kPiece;
    };
    uint4 ring[D][I][P];
#pragma unroll
    for (int d = 0; d < D; ++d)
#pragma unroll
      for (int r = 0; r < I; ++r)
#pragma unroll
        for (int p = 0; p < P; ++p) ring[d][r][p] = d < items ? ldg_stream(addr(d, r, p)) : make_uint4(0u, 0u, 0u, 0u);
    for (int i0 = 0; i0 < items; i0 += D) {
#pragma unroll
      for (int d = 0; d < D; ++d) {
        const int it = i0 + d;
        if (it >= items) break;
#pragma unroll
        for (int r = 0; r < I; ++r)
#pragma unroll
          for (int p = 0; p < P; ++p) acc ^= ring[d][r][p].x ^ ring[d][r][p].y ^ ring[d][r][p].z ^ ring[d][r][p].w;
        float x = __uint_as_float((acc & 0x007fffffu) | 0x3f800000u);
        for (int j = 0; j < work; ++j) f = __fmaf_rn(f, x, -0.5f);  // a dependent chain of `work` FMAs
        if (it + D < items) {
#pragma unroll
          for (int r = 0; r < I; ++r)
#pragma unroll
            for (int p = 0; p < P; ++p) ring[d][r][p] = ldg_stream(addr(it + D, r, p));
        }
      }
    }
  }
  if (acc == 0x12345678u && f == 123.0f) *out = f;  // never true for the data used; keeps the loads
}

constexpr int kItemBytes = kGroup * kPiece;  // the walk's item: 512 bytes of each of the group's 4 rows

// Shared memory of stream_bulk<S>: per warp S stages of an item, then S mbarriers.
constexpr int bulk_smem(int S) { return kWarps * S * (kItemBytes + 8); }

// The walk's items (stream_rows<4, 1, D>'s order: a warp's groups one after another, a group's items along K) through a
// per-warp ring of S shared-memory stages filled by bulk copies: item q of the warp's sequence in stage q % S, whose
// mbarrier completes its (q / S)-th phase when the item's 2 KB have landed; the stage is refilled with item q + S once
// every lane has read it. The sequence runs on across the warp's groups (no drain at a group's end).
template <int S>
__global__ void __launch_bounds__(32 * kWarps, 1)
    stream_bulk(const uint8_t* __restrict__ w, int64_t ldw, int K, int groups, int work, float* out) {
  extern __shared__ __align__(16) uint8_t smem_bulk[];
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int nb = static_cast<int>(gridDim.x), nw = static_cast<int>(blockDim.x) >> 5;
  const int items = K / kPiece;  // per group
  const int first = warp * nb + static_cast<int>(blockIdx.x), stride = nb * nw;
  const int my_groups = first < groups ? (groups - first + stride - 1) / stride : 0;
  const int total = my_groups * items;
  const uint32_t stage0 = deepinfer::cuda::smem_u32(smem_bulk + warp * S * kItemBytes);
  const uint32_t bar0 = deepinfer::cuda::smem_u32(smem_bulk + kWarps * S * kItemBytes + warp * S * 8);
  if (lane == 0)
    for (int s = 0; s < S; ++s) deepinfer::cuda::mbar_init(bar0 + 8 * s, 1);
  deepinfer::cuda::mbar_init_fence();
  __syncwarp();
  auto issue = [&](int q) {  // by the warp (one elected lane issues, as the walk's bulk ring): item q into stage q % S
    const int g = first + (q / items) * stride, k = q % items, s = q % S;
    const void* src[kGroup];
    for (int r = 0; r < kGroup; ++r)
      src[r] = w + (static_cast<int64_t>(g) * kGroup + r) * ldw + static_cast<int64_t>(k) * kPiece;
    deepinfer::cuda::bulk_pieces_elect<kGroup, kPiece>(stage0 + s * kItemBytes, kPiece, src, kPiece, bar0 + 8 * s);
  };
  for (int q = 0; q < S && q < total; ++q) issue(q);
  uint32_t acc = 0;
  float f = 1.0f;
  for (int q = 0; q < total; ++q) {
    const int s = q % S;
    deepinfer::cuda::mbar_wait(bar0 + 8 * s, static_cast<uint32_t>((q / S) & 1));
#pragma unroll
    for (int r = 0; r < kGroup; ++r) {
      const uint4 v = deepinfer::cuda::lds128(stage0 + s * kItemBytes + r * kPiece + 16 * lane);
      acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    __syncwarp();  // every lane has its bytes of stage s: it may be refilled
    if (q + S < total) issue(q + S);
    float x = __uint_as_float((acc & 0x007fffffu) | 0x3f800000u);
    for (int j = 0; j < work; ++j) f = __fmaf_rn(f, x, -0.5f);  // a dependent chain of `work` FMAs
  }
  if (acc == 0x12345678u && f == 123.0f) *out = f;  // never true for the data used; keeps the loads
}

struct StreamShape {
  const char* name;
  int N, K;
};

struct Config {
  const char* name;
  void (*kernel)(const uint8_t*, int64_t, int, int, int, float*);
  int pieces;    // consecutive 512-byte pieces of a row per item (P)
  int smem = 0;  // dynamic shared memory (the bulk rows)
};

}  // namespace

int main() {
  return bench::bench_main("bench_cuda_stream", [] {
    deepinfer::cuda::init();
    const int sms = deepinfer::cuda::sm_count();
    cudaStream_t st;
    DI_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const double ceiling = bench::read_ceiling_gbs(st, size_t{2} << 30);
    float* sink = nullptr;
    DI_CUDA_CHECK(cudaMalloc(&sink, 4));

    const StreamShape shapes[] = {{"attn.wo_b [5120, 8192]", 5120, 8192},
                                  {"attn.wq_b [32768, 1280]", 32768, 1280},
                                  {"shared w1/w3 [2304, 5120]", 2304, 5120}};
    const Config configs[] = {
        {"4x512 D2 (walk)", stream_rows<4, 1, 2>, 1},
        {"4x512 D4", stream_rows<4, 1, 4>, 1},
        {"4x512 D1", stream_rows<4, 1, 1>, 1},
        {"2x1K D2", stream_rows<2, 2, 2>, 2},
        {"1x2K D2", stream_rows<1, 4, 2>, 4},
        {"1x2K D1", stream_rows<1, 4, 1>, 4},
        {"1x4K D1", stream_rows<1, 8, 1>, 8},
        {"4x512 bulk S3", stream_bulk<3>, 1, bulk_smem(3)},
        {"4x512 bulk S6", stream_bulk<6>, 1, bulk_smem(6)},
    };
    for (const Config& c : configs)
      if (c.smem > 0)
        DI_CUDA_CHECK(cudaFuncSetAttribute(c.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, c.smem));
    std::printf("read ceiling (2 GiB, plain read kernel): %.0f GB/s\n\n", ceiling);
    std::printf("| weight [N, K] | item (rows x bytes), ring | work (FMAs / item) | us | GB/s | %% of read |\n");
    std::printf("|---|---|---|---|---|---|\n");
    for (const StreamShape& s : shapes) {
      const size_t bytes = static_cast<size_t>(s.N) * s.K;
      const int copies = static_cast<int>((size_t{512} << 20) / bytes + 1);
      std::vector<Tensor> w;
      for (int c = 0; c < copies; ++c) w.push_back(bench::dev_bytes({s.N, s.K}, DType::kU8, 0, 255));
      const int groups = s.N / kGroup;
      const int blocks = std::min(sms, (groups + kWarps - 1) / kWarps);
      for (const Config& c : configs) {
        // Whole items only: the bytes read are the row's first K / (512 P) pieces of P.
        const size_t read = static_cast<size_t>(s.N) * (s.K / (kPiece * c.pieces)) * kPiece * c.pieces;
        if (read == 0) continue;  // a row shorter than one item
        for (int work : {0, 64, 256}) {
          const double ms = bench::time_graph(st, 2 * copies, [&](int i) {
            c.kernel<<<blocks, 32 * kWarps, c.smem, st>>>(static_cast<const uint8_t*>(w[i % copies].raw()), s.K, s.K,
                                                          groups, work, sink);
          });
          const double gbs = static_cast<double>(read) / (ms * 1e-3) / 1e9;
          std::printf("| %s | %s | %d | %.2f | %.0f | %.0f%% |\n", s.name, c.name, work, ms * 1e3, gbs,
                      100.0 * gbs / ceiling);
        }
      }
    }
    DI_CUDA_CHECK(cudaFree(sink));
    DI_CUDA_CHECK(cudaStreamDestroy(st));
  });
}
