// bench_cuda_bmma_probe: a probe of one design for the exact E4M3 decode GEMV at one row of x (tiles of 32 x 32, act
// quant 32: the V4.1 shapes the walk kernel serves, wo_b, wo_a's bytes, the shared expert, wq_a + wkv), run beside the
// engine's kernel (cuda::gemv_into, the default exact path) on the same data: the outputs compared bit for bit and both
// timed. Not wired into the engine: it tells whether the design is worth building there (bench/RESULTS.md, fifty-eighth
// session). Fast path only: the data is generated where every scale keeps the products' scaling exact (the engine's
// kernels also keep a scalar path for the rest).
//
// The design. The walk spends ~5 instructions a weight and lane (decode, two-lane tiles, the fold) and fp8_mma_gemv's
// 16 rows a warp leave too few warps on these shapes. Here the weights are the mma's B operand, so a warp owns 8 rows:
// mma.m16n8k16 (f16 -> f32) with A = diag(X) (x's act-quantised values X = e4m3_rne(x / s), exact in f16) and B = the
// weights' E4M3 values (cvt.rn.f16x2.e4m3x2, exact) gives D[k][n] = X[k] V[n][k], every product exact. With columns in
// natural order (MMA m of a tile takes its columns 16 m .. 16 m + 15), lane (g, t) receives the products of columns
// 16 m + g and 16 m + 8 + g of rows 2t and 2t + 1: over the tile's two MMAs the four products j = 0..3 of chain l = g
// of both rows, in the lane. So the contract's s[l] = ((p0 + p1) + p2) + p3 and tot[l] = fma(s, 2^(e - 119), tot) run
// in registers with no exchange (s of the D values times 2^(sx - 8) is exact, so the fold takes the combined power of
// two F = 2^(sx + e - 127)), and the row's hsum ((t0 + t4) + (t2 + t6)) + ((t1 + t5) + (t3 + t7)) is three shuffles at
// the end. B needs row g's bytes {2t, 2t + 1} and {2t + 8, 2t + 9} of each 16-byte half: a lane loads 32 contiguous
// bytes (tile t of a 128-byte segment of its row), permutes 2-byte units with 8 PRMTs so that the words each lane needs
// sit 4 bytes apart, stores them to a per-warp buffer, and ldmatrix hands every lane its words (two .x4 per segment).
// A per block: X's f16 halves as the diagonal lanes' (t = g / 2) whole fragments, 32 bytes per (chunk, g).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "cuda/common.cuh"
#include "cuda/fp_decode.cuh"
#include "cuda/gemv_mma.cuh"
#include "cuda/linear_gemv.cuh"
#include "cuda/quant.cuh"
#include "cuda_bench_util.cuh"

namespace di = deepinfer;

namespace {

constexpr int kWarps = 4;  // warps a block, 8 weight rows each
constexpr int kDepth = 4;  // 128-byte segments in flight per lane
constexpr int kRowStride =
    144;  // bytes per row of a warp's staging slot: ldmatrix's 8 rows hit distinct 16-byte groups
constexpr int kSlotBytes = 8 * kRowStride;

struct Params {
  const uint8_t* w;   // E4M3 codes [N, K], row stride ldw
  const uint8_t* sc;  // ue8m0 codes [N / 32, K / 32], row stride lds
  int64_t ldw, lds;
  const float* x;  // [K], raw
  float* y;        // [N]
  int N, K;
};

// D = diag(X) B over 16 columns: a = {R0, 0, 0, R3} (the diagonal lanes' X halves), b0 / b1 the weights' f16x2.
__device__ __forceinline__ void mma16(float (&d)[4], uint4 a, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %10, %10, %10};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1), "f"(0.0f));
}

__global__ void __launch_bounds__(32 * kWarps) bmma_gemv(Params p) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int K = p.K, nch = K / 32, nseg = K / 128;
  // A fragments [nch][8 g][2 m][R0, R1, R2, R3] (R1 = R2 = 0: one 16-byte load lands them in the mma's four
  // consecutive registers), sx << 23 per chunk, a zero fragment pair for the lanes off the diagonal, the staging slots.
  uint32_t* img = reinterpret_cast<uint32_t*>(smem);                      // K * 8 bytes
  int* kxw = reinterpret_cast<int*>(smem + 8 * K);                        // [nch]
  uint32_t* zeros = reinterpret_cast<uint32_t*>(smem + 8 * K + 4 * nch);  // 32 bytes
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int g = lane >> 2, t = lane & 3;
  uint8_t* stage = smem + 8 * K + 4 * nch + 32 + warp * 2 * kSlotBytes;

  // x: a warp per 32-column chunk, a lane per column (column 8 j + g' of the chunk).
  for (int c = warp; c < nch; c += kWarps) {
    const float v = p.x[32 * c + lane];
    const float s = di::cuda::warp_fp8_group_scale(fabsf(v));
    const float X = di::cuda::e4m3_rne(v / s);
    const uint32_t bits = __half_as_ushort(__float2half_rn(X));
    const int gg = lane & 7, j = lane >> 3;  // MMA m = j / 2: R0 for j even (row gg), R3 for j odd (row gg + 8)
    uint32_t* frag = img + (c * 8 + gg) * 8 + 4 * (j >> 1);
    frag[(j & 1) ? 3 : 0] = bits << (16 * (gg & 1));
    frag[(j & 1) ? 2 : 1] = 0u;
    if (lane == 0) kxw[c] = (static_cast<int>(__float_as_uint(s) >> 23) - 127) * (1 << 23);
  }
  if (threadIdx.x < 8) zeros[threadIdx.x] = 0u;
  __syncthreads();

  const bool diag = t == (g >> 1);
  const uint32_t img_base = static_cast<uint32_t>(__cvta_generic_to_shared(diag ? img + g * 8 : zeros));
  const int4* kx4 = reinterpret_cast<const int4*>(kxw);
  const uint32_t img_step = diag ? 256u : 0u;  // bytes per chunk
  const uint32_t stage_s = static_cast<uint32_t>(__cvta_generic_to_shared(stage));
  // ldmatrix row address of this lane: matrix i = lane / 8 (tile i / 2 of the pair, half i % 2), row lane % 8.
  const uint32_t lm_off = static_cast<uint32_t>((lane & 7) * kRowStride + (lane >> 4) * 32 + ((lane >> 3) & 1) * 16);

  const int groups = p.N / 8;
  for (int rg = blockIdx.x * kWarps + warp; rg < groups; rg += gridDim.x * kWarps) {
    const int n0 = rg * 8;
    const uint8_t* wrow = p.w + static_cast<int64_t>(n0 + g) * p.ldw + 32 * t;  // tile t of each segment of row g
    const uint32_t* codes = reinterpret_cast<const uint32_t*>(p.sc + static_cast<int64_t>(n0 / 32) * p.lds);
    uint4 q[kDepth][2];  // ring slot d: this lane's 32 bytes of a segment
    auto load = [&](int d, int seg) {
      q[d][0] = di::cuda::ldg_stream(wrow + 128 * seg);
      q[d][1] = di::cuda::ldg_stream(wrow + 128 * seg + 16);
    };
#pragma unroll
    for (int d = 0; d < kDepth; ++d)
      if (d < nseg) load(d, d);
    float tot0 = 0.0f, tot1 = 0.0f;  // chain l = g of rows n0 + 2t, n0 + 2t + 1
    for (int s0 = 0; s0 < nseg; s0 += kDepth) {
#pragma unroll
      for (int d = 0; d < kDepth; ++d) {
        const int seg = s0 + d;
        if (seg >= nseg) break;  // warp-uniform
        const uint32_t r[8] = {q[d][0].x, q[d][0].y, q[d][0].z, q[d][0].w, q[d][1].x, q[d][1].y, q[d][1].z, q[d][1].w};
        // Group u = units (u, 4 + u) for half 0 and (8 + u, 12 + u) for half 1: the word lane t = u needs.
        uint4 h0, h1;
        h0.x = di::cuda::prmt(r[0], r[2], 0x5410u), h0.y = di::cuda::prmt(r[0], r[2], 0x7632u);
        h0.z = di::cuda::prmt(r[1], r[3], 0x5410u), h0.w = di::cuda::prmt(r[1], r[3], 0x7632u);
        h1.x = di::cuda::prmt(r[4], r[6], 0x5410u), h1.y = di::cuda::prmt(r[4], r[6], 0x7632u);
        h1.z = di::cuda::prmt(r[5], r[7], 0x5410u), h1.w = di::cuda::prmt(r[5], r[7], 0x7632u);
        uint8_t* dst = stage + (seg & 1) * kSlotBytes + g * kRowStride + 32 * t;
        *reinterpret_cast<uint4*>(dst) = h0;
        *reinterpret_cast<uint4*>(dst + 16) = h1;
        if (seg + kDepth < nseg) load(d, seg + kDepth);
        __syncwarp();    // also orders this slot's reads two segments ago before the stores above
        uint32_t wv[8];  // [tile][half] words of this lane
        {
          uint32_t a[4], b[4];
          const uint32_t base = stage_s + static_cast<uint32_t>((seg & 1) * kSlotBytes) + lm_off;
          di::cuda::ldmatrix_x4(a, base);       // tiles 0, 1
          di::cuda::ldmatrix_x4(b, base + 64);  // tiles 2, 3
          wv[0] = a[0], wv[1] = a[1], wv[2] = a[2], wv[3] = a[3], wv[4] = b[0], wv[5] = b[1], wv[6] = b[2],
          wv[7] = b[3];
        }
        const uint32_t e4 = __ldg(codes + seg);  // the segment's 4 tile scale codes
        const int4 kq = kx4[seg];
        const int kxc[4] = {kq.x, kq.y, kq.z, kq.w};
        const uint32_t abase = img_base + static_cast<uint32_t>(4 * seg) * img_step;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const uint4 a0 = di::cuda::lds128(abase + c * img_step), a1 = di::cuda::lds128(abase + c * img_step + 16);
          float d0[4], d1[4];
          mma16(d0, a0, di::cuda::e4m3x2_lo(wv[2 * c]), di::cuda::e4m3x2_hi(wv[2 * c]));
          mma16(d1, a1, di::cuda::e4m3x2_lo(wv[2 * c + 1]), di::cuda::e4m3x2_hi(wv[2 * c + 1]));
          const float F = __int_as_float(static_cast<int>(di::cuda::prmt(e4, 0u, 0x4440u + c)) * (1 << 23) + kxc[c]);
          const float s0 = __fadd_rn(__fadd_rn(__fadd_rn(d0[0], d0[2]), d1[0]), d1[2]);
          const float s1 = __fadd_rn(__fadd_rn(__fadd_rn(d0[1], d0[3]), d1[1]), d1[3]);
          tot0 = __fmaf_rn(s0, F, tot0);
          tot1 = __fmaf_rn(s1, F, tot1);
        }
      }
    }
    // hsum over l = g: ((t0 + t4) + (t2 + t6)) + ((t1 + t5) + (t3 + t7)) + 0 (IEEE addition commutes).
    float u0 = __fadd_rn(tot0, __shfl_xor_sync(0xffffffffu, tot0, 16));
    float u1 = __fadd_rn(tot1, __shfl_xor_sync(0xffffffffu, tot1, 16));
    u0 = __fadd_rn(u0, __shfl_xor_sync(0xffffffffu, u0, 8));
    u1 = __fadd_rn(u1, __shfl_xor_sync(0xffffffffu, u1, 8));
    u0 = __fadd_rn(__fadd_rn(u0, __shfl_xor_sync(0xffffffffu, u0, 4)), 0.0f);
    u1 = __fadd_rn(__fadd_rn(u1, __shfl_xor_sync(0xffffffffu, u1, 4)), 0.0f);
    if (g == 0) p.y[n0 + 2 * t] = u0, p.y[n0 + 2 * t + 1] = u1;
    __syncwarp();  // the next row group's stores into the staging slots come after every lane's reads
  }
}

int64_t bmma_smem(int K) { return 8 * int64_t{K} + 4 * (K / 32) + 32 + int64_t{kWarps} * 2 * kSlotBytes; }

struct Shape {
  const char* name;
  int N, K;
};

}  // namespace

int main() {
  return di::bench::bench_main("bench_cuda_bmma_probe", [] {
    cudaStream_t st;
    DI_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const double read_gbs = di::bench::read_ceiling_gbs(st, size_t{1} << 30);
    std::printf(
        "# bmma probe: the exact E4M3 GEMV at one x row, B = the weights (8 rows a warp), against cuda::gemv_into\n");
    std::printf("read ceiling %.0f GB/s\n\n", read_gbs);
    std::printf("| weight [N, K] | engine us | probe us | probe / engine | probe %% of read | outputs differing |\n");
    std::printf("|---|---|---|---|---|---|\n");
    DI_CUDA_CHECK(cudaFuncSetAttribute(bmma_gemv, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(bmma_smem(8192))));
    const Shape shapes[] = {{"wo_b", 5120, 8192},
                            {"[8192, 4096] (wo_a's bytes)", 8192, 4096},
                            {"shared w1 / w3", 2304, 5120},
                            {"shared w2", 5120, 2304},
                            {"wq_a + wkv", 1792, 5120}};
    for (const Shape& sh : shapes) {
      const int N = sh.N, K = sh.K;
      const int64_t bytes = int64_t{N} * K;
      const int copies = static_cast<int>(std::max<int64_t>(2, (int64_t{512} << 20) / bytes + 1));
      std::vector<di::Tensor> w, sc;
      for (int i = 0; i < copies; ++i) {
        w.push_back(di::bench::dev_bytes({N, K}, di::DType::kU8, 0, 255, true));
        sc.push_back(di::bench::dev_bytes({N / 32, K / 32}, di::DType::kU8, 112, 124));
      }
      const di::Tensor x = di::bench::dev_act({1, K});
      di::Tensor y_ref = di::Tensor::empty({1, N}, di::DType::kF32, di::Device::kCUDA);
      di::Tensor y_new = di::Tensor::empty({1, N}, di::DType::kF32, di::Device::kCUDA);
      auto args = [&](int i) {
        di::cuda::GemvArgs a;
        a.fmt = 0;
        a.w = static_cast<const uint8_t*>(w[static_cast<size_t>(i)].raw());
        a.ldw = K;
        a.scale = static_cast<const uint8_t*>(sc[static_cast<size_t>(i)].raw());
        a.lds = K / 32;
        a.B = 32;
        a.N = N;
        a.K = K;
        a.x = x.data<float>();
        a.ldx = K;
        a.M = 1;
        a.act_quant_block = 32;
        a.y = y_ref.data<float>();
        return a;
      };
      auto probe = [&](int i) {
        Params p;
        p.w = static_cast<const uint8_t*>(w[static_cast<size_t>(i)].raw());
        p.sc = static_cast<const uint8_t*>(sc[static_cast<size_t>(i)].raw());
        p.ldw = K;
        p.lds = K / 32;
        p.x = x.data<float>();
        p.y = y_new.data<float>();
        p.N = N;
        p.K = K;
        const int blocks = (N / 8 + kWarps - 1) / kWarps;
        bmma_gemv<<<blocks, 32 * kWarps, bmma_smem(K), st>>>(p);
      };
      di::cuda::gemv_into(args(0), st);  // eager first: the engine's kernels set their limits
      probe(0);
      DI_CUDA_CHECK(cudaStreamSynchronize(st));
      std::vector<float> a(static_cast<size_t>(N)), b(static_cast<size_t>(N));
      DI_CUDA_CHECK(cudaMemcpy(a.data(), y_ref.raw(), 4 * static_cast<size_t>(N), cudaMemcpyDeviceToHost));
      DI_CUDA_CHECK(cudaMemcpy(b.data(), y_new.raw(), 4 * static_cast<size_t>(N), cudaMemcpyDeviceToHost));
      int differ = 0;
      for (int n = 0; n < N; ++n) differ += std::memcmp(&a[static_cast<size_t>(n)], &b[static_cast<size_t>(n)], 4) != 0;
      const double ref_ms =
          di::bench::time_graph(st, 2 * copies, [&](int i) { di::cuda::gemv_into(args(i % copies), st); });
      const double new_ms = di::bench::time_graph(st, 2 * copies, [&](int i) { probe(i % copies); });
      const double gbs = static_cast<double>(bytes) / new_ms / 1e6;
      std::printf("| %s [%d, %d] | %.2f | %.2f | %.2fx | %.0f%% | %d of %d |\n", sh.name, N, K, ref_ms * 1e3,
                  new_ms * 1e3, ref_ms / new_ms, 100.0 * gbs / read_gbs, differ, N);
    }
    DI_CUDA_CHECK(cudaStreamDestroy(st));
  });
}
