// GPU probe of what bounds a stage of fp8_wgmma_gemv (src/cuda/linear_gemv_fp8_wgmma.cu): its pipeline's pieces
// with the arithmetic taken away, one at a time. Needs a CUDA GPU (prints SKIP and exits 0 without one).
//   ./build/bench/bench_cuda_wgmma_probe
//
// Why: on the H200 the kernel spends ~330 ns per 128-column stage of a 64-row unit, whatever N, with one block per SM
// or two (bench/RESULTS.md, thirty-sixth session), so an SM moves ~8 KB per 330 ns (~25 GB/s) while the HBM could
// give each of 132 SMs ~33 GB/s and an SM alone far more. Pipelining the MMAs against the fold changed nothing. This
// probe keeps the kernel's block (a consumer warpgroup and a producer warp), its ring of S slots with a full and an
// empty mbarrier each, its TMA boxes (64 rows x 128 bytes, 128-byte swizzle, L2 evict-first) and its MMAs (4 x
// wgmma.m64n32k32 E4M3 per 8 KB, B a diagonal tile in shared memory), and times them apart:
//   tma       the producer's boxes, the consumers only wait and release (the TMA ring alone);
//   mma       the consumers' MMAs on a slot never loaded (the producer only arrives): the tensor core alone;
//   tma+mma   both, as the kernel does them (4 MMAs, commit, wait, a fold of their registers);
//   +diag     tma+mma plus the producer's per-stage diagonal writes (a byte per lane and tile), fence.proxy.async and
//             32 arrivals, the kernel's producer;
//   tma+mma8  two boxes per stage (256 columns) and their 8 MMAs as one commit group;
//   bulk, bulk+mma  tma and tma+mma with each box a contiguous 8 KB (cp.async.bulk, no tensor map): what a weight
//             stored unit by unit, stage by stage would cost.
// The kernel's tensor map asks L2 to fetch 256-byte granules for 128-byte box rows, and its loads are evict-first; the
// tma rows with "promo" and "hint" other than 256 / first try the other settings.
// Units of 64 rows x all of K are dealt to the blocks in turn (the kernel's persistent grid); each call reads a fresh
// weight copy (rotating over >= 512 MiB, L2 is 50-60 MB). Reported: us per call, ns per 8 KB box per block, GB/s and
// the share of the read ceiling measured in the same run (the plain read kernel over 2 GiB).
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "cuda/common.cuh"
#include "cuda/device.h"
#include "cuda/hopper.cuh"
#include "cuda_bench_util.cuh"

namespace {

using deepinfer::DType;
using deepinfer::Tensor;
namespace bench = deepinfer::bench;
namespace cuda = deepinfer::cuda;

constexpr int kRows = 64;                 // rows per unit and box: the MMA's M
constexpr int kCols = 128;                // bytes per box row: the swizzle's span
constexpr int kBoxBytes = kRows * kCols;  // 8 KB
constexpr int kThreads = 160;             // 4 consumer warps and a producer warp
constexpr int kDiagBytes = 4096;          // 4 diagonal B tiles of 1 KB

enum Mode : int { kTma = 0, kMma = 1, kTmaMma = 2, kTmaMmaDiag = 3, kTmaMma8 = 4, kBulk = 5, kBulkMma = 6 };
const char* const kModeNames[] = {"tma", "mma", "tma+mma", "+diag", "tma+mma8", "bulk", "bulk+mma"};

struct ProbeParams {
  int units, nst, S;  // units of 64 rows, stages per unit, ring slots
  const uint8_t* w;   // the weight (bulk modes: unit u's stage st at (u nst + st) 8 KB)
  int evict_normal;   // 1: the TMA's L2 hint evict-normal instead of evict-first
  float* out;
};

// A contiguous copy of `bytes` from global src into shared dst, completing on bar (cp.async.bulk).
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(bar)
               : "memory");
}

// fp8_wgmma_gemv's diagonal tile layout at one x row (its diag_offset(1, 0, q, k) within tile q): element k at core
// (k / 8, k / 16), row k % 8, byte k % 16.
__device__ __forceinline__ int diag_offset(int k) { return (k >> 3) * 128 + (k >> 4) * 512 + (k & 7) * 16 + (k & 15); }

// The probe's smem: the ring (S slots of BOXES boxes), the diagonal tiles, the barriers (full[S], empty[S]).
__host__ __device__ inline int64_t probe_smem(int S, int boxes) {
  return int64_t{S} * boxes * kBoxBytes + kDiagBytes + 16 * S + 1024;
}

template <int MODE, int BOXES>
__global__ void __launch_bounds__(kThreads, 1) probe_kernel(const __grid_constant__ CUtensorMap map, ProbeParams p) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = cuda::smem_align1024(smem_raw);
  const int S = p.S, slot_bytes = BOXES * kBoxBytes;
  const uint32_t ring = cuda::smem_u32(smem);
  uint8_t* diag = smem + S * slot_bytes;
  const uint32_t diag_addr = cuda::smem_u32(diag);
  const uint32_t bars = cuda::smem_u32(diag + kDiagBytes);  // full[s] at + 8 s, empty[s] at + 8 (S + s)
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  for (int i = tid; i < kDiagBytes / 16; i += kThreads) reinterpret_cast<uint4*>(diag)[i] = make_uint4(0u, 0u, 0u, 0u);
  cuda::fence_proxy_async();
  if (tid == 0) {
    for (int s = 0; s < S; ++s) {
      cuda::mbar_init(bars + 8 * s, 32);
      cuda::mbar_init(bars + 8 * (S + s), 4);
    }
    cuda::mbar_init_fence();
  }
  __syncthreads();
  const int grid = static_cast<int>(gridDim.x), b = static_cast<int>(blockIdx.x);
  const int total = (p.units - b + grid - 1) / grid * p.nst;

  if (warp == 4) {  // the producer
    const uint64_t policy = p.evict_normal ? cuda::l2_evict_normal() : cuda::l2_evict_first();
    int slot = 0, unit = b, st = 0;
    uint32_t phase = 0;
    for (int i = 0; i < total; ++i) {
      if (i >= S) cuda::mbar_wait(bars + 8 * (S + slot), phase ^ 1u);
      const uint32_t full = bars + 8 * slot;
      if ((MODE == kBulk || MODE == kBulkMma) && lane == 0) {
        cuda::mbar_expect_tx(full, slot_bytes);
        bulk_load(ring + slot * slot_bytes, p.w + (static_cast<int64_t>(unit) * p.nst + st) * slot_bytes, slot_bytes,
                  full);
      } else if (MODE != kMma && lane == 0) {
        cuda::mbar_expect_tx(full, slot_bytes);
#pragma unroll
        for (int x = 0; x < BOXES; ++x)
          cuda::tma_load_2d(ring + slot * slot_bytes + x * kBoxBytes, &map, full, (st * BOXES + x) * kCols,
                            unit * kRows, policy);
      }
      if (MODE == kTmaMmaDiag) {
#pragma unroll
        for (int q = 0; q < 4; ++q) diag[q * 1024 + diag_offset(lane)] = 0;  // the kernel's 4 byte stores per lane
        cuda::fence_proxy_async();
      }
      cuda::mbar_arrive(full);
      if (++st == p.nst) st = 0, unit += grid;
      if (++slot == S) slot = 0, phase ^= 1u;
    }
    return;
  }

  float acc = 0.0f;
  int slot = 0;
  uint32_t phase = 0;
  const uint64_t bdesc = cuda::wgmma_desc_plain(diag_addr, 512, 128);
  for (int i = 0; i < total; ++i) {
    cuda::mbar_wait(bars + 8 * slot, phase);
    if (MODE != kTma && MODE != kBulk) {
      const uint32_t slot_addr = ring + slot * slot_bytes;
      constexpr int kGroups = MODE == kTmaMma8 ? 1 : BOXES, kPer = MODE == kTmaMma8 ? 4 * BOXES : 4;
#pragma unroll
      for (int gi = 0; gi < kGroups; ++gi) {
        float d[kPer][16];
        cuda::wgmma_fence();
#pragma unroll
        for (int m = 0; m < kPer; ++m) {
          const int box = gi + m / 4, q = m % 4;
          cuda::wgmma_m64n32k32_e4m3_ss(d[m], cuda::wgmma_desc_sw128(slot_addr + box * kBoxBytes + 32 * q),
                                        cuda::desc_plus(bdesc, q * 1024));
        }
        cuda::wgmma_commit();
        cuda::wgmma_wait<0>();
#pragma unroll
        for (int m = 0; m < kPer; ++m) {
          cuda::wgmma_fence_operands(d[m]);
#pragma unroll
          for (int e = 0; e < 16; ++e) acc = __fadd_rn(acc, d[m][e]);
        }
      }
    }
    __syncwarp();
    if (lane == 0) cuda::mbar_arrive(bars + 8 * (S + slot));
    if (++slot == S) slot = 0, phase ^= 1u;
  }
  if (acc == 12345.0f) *p.out = acc;  // never true (the diagonal tiles are zeros); keeps the MMAs
}

// ---- wgmma m64nNk32 E4M3 by width N (the tensor core alone) ----------------------------------------------------
// A diagonal B of one x row is 32 columns wide, of MX rows side by side 32 MX (fp8_wgmma_gemv's 2-4-row calls). Whether
// a wide MMA costs less than its narrow parts decides whether merging rows pays. Patterns per "stage" of 4 K steps
// (tiles q = 0..3 of an 8 KB A box): 0 "single", each MMA its own commit and wait (its latency exposed); 1 "four", 4
// MMAs into 4 D, one commit and wait (fp8_wgmma_gemv's stage; N <= 64 for the registers).
const char* const kWidthPatterns[] = {"single", "four"};

template <int N, int PATTERN>
__global__ void __launch_bounds__(128, 1) mma_width_kernel(int stages, float* out) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = cuda::smem_align1024(smem_raw);
  const int tid = static_cast<int>(threadIdx.x);
  for (int i = tid; i < (kBoxBytes + 32 * N) / 16; i += 128)
    reinterpret_cast<uint4*>(smem)[i] = make_uint4(0u, 0u, 0u, 0u);
  cuda::fence_proxy_async();
  __syncthreads();
  const uint32_t a0 = cuda::smem_u32(smem), b0 = a0 + kBoxBytes;
  // B: K-major without swizzle, 32 x N bytes: N / 8 core matrices along N (128 bytes apart), 2 along K (16 N apart).
  const uint64_t bdesc = cuda::wgmma_desc_plain(b0, 16 * N, 128);
  constexpr int kD = PATTERN == 0 ? 1 : 4;  // accumulators in flight
  float acc = 0.0f;
  for (int st = 0; st < stages; ++st) {
#pragma unroll
    for (int q0 = 0; q0 < 4; q0 += kD) {
      float d[kD][N / 2];
      cuda::wgmma_fence();
#pragma unroll
      for (int q = 0; q < kD; ++q) cuda::wgmma_e4m3_ss<N>(d[q], cuda::wgmma_desc_sw128(a0 + 32 * (q0 + q)), bdesc);
      cuda::wgmma_commit();
      cuda::wgmma_wait<0>();
#pragma unroll
      for (int q = 0; q < kD; ++q) {
        cuda::wgmma_fence_operands(d[q]);
#pragma unroll
        for (int i = 0; i < N / 2; ++i) acc = __fadd_rn(acc, d[q][i]);
      }
    }
  }
  if (acc == 12345.0f) *out = acc;  // never true (zeros); keeps the MMAs
}

struct WidthConfig {
  int N, pattern;
  void (*kernel)(int, float*);
};

struct Shape {
  const char* name;
  int units, K;
};

struct Config {
  int mode, boxes, S;
  void (*kernel)(const CUtensorMap, ProbeParams);
  int promo = 256, evict_normal = 0;  // the tensor map's L2 promotion (bytes), the load's L2 hint
};

}  // namespace

int main() {
  return bench::bench_main("bench_cuda_wgmma_probe", [] {
    cuda::init();
    const int sms = cuda::sm_count();
    cudaStream_t st;
    DI_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const double ceiling = bench::read_ceiling_gbs(st, size_t{2} << 30);
    float* sink = nullptr;
    DI_CUDA_CHECK(cudaMalloc(&sink, 4));

    const Shape shapes[] = {{"wq_a-like [1280, 5120]: 20 units", 20, 5120},
                            {"wo_b [5120, 8192]: 80 units", 80, 8192},
                            {"[8448, 5120]: 132 units", 132, 5120},
                            {"[16896, 5120]: 264 units", 264, 5120}};
    std::vector<Config> configs;
    for (int S : {4, 8, 13}) {
      configs.push_back({kTma, 1, S, probe_kernel<kTma, 1>});
      configs.push_back({kMma, 1, S, probe_kernel<kMma, 1>});
      configs.push_back({kTmaMma, 1, S, probe_kernel<kTmaMma, 1>});
      configs.push_back({kTmaMmaDiag, 1, S, probe_kernel<kTmaMmaDiag, 1>});
      configs.push_back({kBulk, 1, S, probe_kernel<kBulk, 1>});
      configs.push_back({kBulkMma, 1, S, probe_kernel<kBulkMma, 1>});
    }
    for (int promo : {0, 128, 256})
      for (int hint : {0, 1})
        if (promo != 256 || hint != 0) configs.push_back({kTma, 1, 8, probe_kernel<kTma, 1>, promo, hint});
    configs.push_back({kTmaMma, 1, 8, probe_kernel<kTmaMma, 1>, 0, 1});
    for (int S : {3, 6}) {
      configs.push_back({kTma, 2, S, probe_kernel<kTma, 2>});
      configs.push_back({kTmaMma, 2, S, probe_kernel<kTmaMma, 2>});
      configs.push_back({kTmaMma8, 2, S, probe_kernel<kTmaMma8, 2>});
    }
    std::printf("read ceiling (2 GiB, plain read kernel): %.0f GB/s, %d SMs\n\n", ceiling, sms);

    // The tensor core alone by MMA width: 40 stages of 4 MMAs per block, 1 or 2 blocks per SM.
    const WidthConfig widths[] = {
        {32, 0, mma_width_kernel<32, 0>}, {32, 1, mma_width_kernel<32, 1>}, {64, 0, mma_width_kernel<64, 0>},
        {64, 1, mma_width_kernel<64, 1>}, {96, 0, mma_width_kernel<96, 0>}, {128, 0, mma_width_kernel<128, 0>},
    };
    constexpr int kWidthStages = 40;
    std::printf(
        "| wgmma m64nNk32 E4M3, N | pattern | blocks | us | ns per 4 MMAs per block | MACs per SM-cycle at 1.755 GHz "
        "|\n");
    std::printf("|---|---|---|---|---|---|\n");
    for (const WidthConfig& c : widths) {
      const int64_t smem = kBoxBytes + 32 * c.N + 1024;
      DI_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(c.kernel),
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
      for (int blocks : {20, sms, 2 * sms}) {
        try {
          c.kernel<<<blocks, 128, static_cast<size_t>(smem), st>>>(kWidthStages, sink);
          DI_CUDA_CHECK(cudaGetLastError());
          DI_CUDA_CHECK(cudaStreamSynchronize(st));
          const double ms = bench::time_graph(
              st, 16, [&](int) { c.kernel<<<blocks, 128, static_cast<size_t>(smem), st>>>(kWidthStages, sink); });
          const double ns = ms * 1e6 / kWidthStages;
          const double per_sm = blocks > sms ? 2.0 : 1.0;
          const double macs = per_sm * 4.0 * 64 * c.N * 32 / (ns * 1.755);
          std::printf("| %d | %s | %d | %.2f | %.0f | %.0f |\n", c.N, kWidthPatterns[c.pattern], blocks, ms * 1e3, ns,
                      macs);
        } catch (const std::exception& e) {
          std::printf("| %d | %s | %d | error: %s | | |\n", c.N, kWidthPatterns[c.pattern], blocks, e.what());
          return;
        }
      }
    }
    std::printf("\n");

    std::printf(
        "| units [N, K] | mode | box cols x slots | promo / hint | blocks / SM | us | ns per 8 KB box per block | "
        "GB/s | %% of read |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|\n");
    for (const Shape& s : shapes) {
      const int64_t rows = int64_t{s.units} * kRows;
      const size_t bytes = static_cast<size_t>(rows) * s.K;
      const int copies = static_cast<int>((size_t{512} << 20) / bytes + 1);
      std::vector<Tensor> w;
      std::vector<CUtensorMap> maps[3];  // by promotion: none, 128, 256
      for (int c = 0; c < copies; ++c) {
        w.push_back(bench::dev_bytes({rows, s.K}, DType::kU8, 0, 255));
        for (int m = 0; m < 3; ++m)
          maps[m].push_back(cuda::tensor_map_u8_sw128(w.back().raw(), rows, s.K, s.K, kRows, kCols, 128 * m));
      }
      for (const Config& c : configs) {
        const int nst = s.K / (kCols * c.boxes);
        const int64_t smem = probe_smem(c.S, c.boxes);
        // Set per configuration: configurations share kernels with other ring sizes.
        DI_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(c.kernel),
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
        int per_sm = 0;
        DI_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, reinterpret_cast<const void*>(c.kernel),
                                                                    kThreads, static_cast<size_t>(smem)));
        const int grid = std::min(s.units, per_sm * sms);
        if (grid <= 0) {
          std::printf("| %s | %s | %d x %d | %d / - | no block fits | | | | |\n", s.name, kModeNames[c.mode],
                      kCols * c.boxes, c.S, c.promo);
          continue;
        }
        {  // one plain launch first, so that an error names its configuration
          const ProbeParams p{s.units, nst, c.S, static_cast<const uint8_t*>(w[0].raw()), c.evict_normal, sink};
          c.kernel<<<grid, kThreads, static_cast<size_t>(smem), st>>>(maps[c.promo / 128][0], p);
          const cudaError_t e = cudaGetLastError();
          if (e != cudaSuccess) {
            std::printf("| %s | %s | %d x %d | launch error: %s (grid %d, smem %lld) | | | | | |\n", s.name,
                        kModeNames[c.mode], kCols * c.boxes, c.S, cudaGetErrorString(e), grid,
                        static_cast<long long>(smem));
            continue;
          }
          DI_CUDA_CHECK(cudaStreamSynchronize(st));
        }
        const double ms = bench::time_graph(st, 2 * copies, [&](int i) {
          const ProbeParams p{s.units,        nst, c.S, static_cast<const uint8_t*>(w[i % copies].raw()),
                              c.evict_normal, sink};
          c.kernel<<<grid, kThreads, static_cast<size_t>(smem), st>>>(maps[c.promo / 128][i % copies], p);
          DI_CUDA_CHECK(cudaGetLastError());
        });
        const int boxes_per_block = (s.units + grid - 1) / grid * nst * c.boxes;
        const double gbs = static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
        std::printf("| %s | %s | %d x %d | %d / %s | %d | %.2f | %.0f | %.0f | %.0f%% |\n", s.name, kModeNames[c.mode],
                    kCols * c.boxes, c.S, c.promo, c.evict_normal ? "normal" : "first",
                    std::min(per_sm, (s.units + sms - 1) / sms), ms * 1e3, ms * 1e6 / boxes_per_block, gbs,
                    100.0 * gbs / ceiling);
      }
    }
    DI_CUDA_CHECK(cudaFree(sink));
    DI_CUDA_CHECK(cudaStreamDestroy(st));
  });
}
