// Tensor-core linear without an input site (the vocabulary head; wo_a's groups): x split into three bf16 pieces,
// mma.m16n8k16 bf16, BF16 weights or E4M3 weights turned into bf16 in the kernel. Contract, numerics and kernel shape
// in linear_tc_bf16.cuh.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <mutex>
#include <string>

#include "cuda/common.cuh"
#include "cuda/device.h"
#include "cuda/fp_decode.cuh"
#include "cuda/linear_tc_bf16.cuh"
#include "cuda/tc_mma.cuh"

namespace deepinfer::cuda {

namespace {

constexpr int kBK = 64;       // K columns per pipeline stage (4 MMA k steps of 16)
constexpr int kRS = kBK + 8;  // smem row stride in bf16 (144 bytes: the 8 rows of an ldmatrix hit 8 bank groups)
constexpr int kPieces = 3;    // x = hi + mid + lo
constexpr int kMinHeadRows = 16384;
// E4M3 weights: K in kKSeg contiguous segments, each folded on its own and the segment totals added in K order
// (linear_tc_bf16.cuh), so that a decode call can give each segment a warp of its own.
constexpr int kKSeg = 4;

// ---- x pre-pass: the three pieces, xp[(p M + m) K + k] -----------------------------------------------------------
__global__ void __launch_bounds__(256)
    split_x_kernel(const float* __restrict__ x, int64_t ldx, int M, int K, __nv_bfloat16* __restrict__ xp) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t MK = static_cast<int64_t>(M) * K;
  if (i >= MK) return;
  const int64_t m = i / K, k = i % K;
  const float v = x[m * ldx + k];
  const __nv_bfloat16 hi = __float2bfloat16_rz(v);  // toward zero: a finite x never gives an infinite piece
  __nv_bfloat16 mid = __float2bfloat16_rn(0.0f), lo = mid;
  if (isfinite(v)) {  // inf and NaN stay in hi alone
    const float r1 = v - __bfloat162float(hi);
    mid = __float2bfloat16_rn(r1);
    lo = __float2bfloat16_rn(r1 - __bfloat162float(mid));
  }
  xp[i] = hi;
  xp[MK + i] = mid;
  xp[2 * MK + i] = lo;
}

// ---- the GEMM ----------------------------------------------------------------------------------------------------
// d += A(16x16 bf16, row) . B(16x8 bf16, col), FP32 accumulation.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// WK: warps that split K (1, or kKSeg for E4M3 decode calls: warp group w walks segment w; a stage then holds a
// sub-stage per segment).
template <int MI, int NI, int WR, bool W8, int WK = 1>
struct Bf16Cfg {
  static constexpr int kR = WR * MI * 16;  // weight rows per block
  static constexpr int kBT = NI * 8;       // tokens per block
  static constexpr int kThreads = WR * WK * 32;
  // Bytes per weight row in a stage: BF16 rows of kRS elements, or E4M3 rows of kBK bytes + 16 (2-byte fragment loads
  // of 8 rows 80 bytes apart fall in 8 distinct banks).
  static constexpr int kWRow = W8 ? kBK + 16 : kRS * 2;
  static constexpr int kXOff = kR * kWRow;                      // bytes: weight rows, then x pieces' token rows
  static constexpr int kSub = kXOff + kPieces * kBT * kRS * 2;  // bytes of one segment's sub-stage
  static constexpr int kStage = WK * kSub;                      // bytes
  static_assert(WK == 1 || (W8 && WK == kKSeg), "K splits only E4M3 calls, a warp group per segment");
};

// Two e4m3 codes (the low / high byte of v) -> a bf16x2 of the same values (exact; NaN stays NaN), through f16 and f32.
__device__ __forceinline__ uint32_t e4m3x2_bf16x2(uint32_t v) {
  uint32_t h;
  asm("{.reg .b16 l, u;\n mov.b32 {l, u}, %1;\n cvt.rn.f16x2.e4m3x2 %0, l;\n}" : "=r"(h) : "r"(v));
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
  return *reinterpret_cast<const uint32_t*>(&b);
}

// One group's problem (blockIdx.z): its weight rows, their scales (E4M3), its columns of the x pieces, its columns of
// y. A plain call is one group.
struct Bf16Problem {
  const uint8_t* w;  // [groups N, K] rows, ldw bytes apart
  int64_t ldw;
  const uint8_t* sc;  // E4M3: E8M0 [groups N / B, K / B], lds apart
  int64_t lds;
  int B;         // E4M3 scale block (rows and columns)
  int N, K, M;   // one group's rows and columns; tokens
  int64_t ldxp;  // x pieces' row stride (elements): groups K
  const __nv_bfloat16* xp;
  float* y;  // [M, ldy]
  int64_t ldy;
  bool round;
};

// Block (token tile blockIdx.x, row tile blockIdx.y, group blockIdx.z). Stage layout: weight rows [R] (bf16 or e4m3
// bytes), then the pieces' token rows [3][BT] (bf16, rows of kRS). Rows >= N and tokens >= M are not loaded: their
// stale smem only reaches outputs that are never stored (an MMA output depends on its own row and column only).
// E4M3: each B-column scale block's products of piece q go to acc[q], then tot = fma((acc[0] + acc[1]) + acc[2],
// scale, tot) in K order (rows g and g + 8 of an m16 tile share a scale row: B is a multiple of 32); the scales come
// from a table of the block's scale rows in shared memory.
template <int MI, int NI, int WR, int S, bool W8, int WK>
__global__ void __launch_bounds__(WR* WK * 32) tc_bf16_kernel(Bf16Problem p) {
  pdl_wait();
  pdl_launch_dependents();
  using C = Bf16Cfg<MI, NI, WR, W8, WK>;
  constexpr int R = C::kR, BT = C::kBT, NT = C::kThreads, WB = C::kWRow;
  extern __shared__ __align__(16) uint8_t smb[];
  const int tid = threadIdx.x;
  const int m0 = blockIdx.x * BT, n0 = blockIdx.y * R, grp = blockIdx.z;
  const int N = p.N, K = p.K, M = p.M;
  const int KW = K / WK;                                // columns per warp group
  const int nk = KW / kBK;                              // stages
  const int seg_stages = W8 ? K / kKSeg / kBK : nk;     // stages per K segment (E4M3)
  const int64_t MX = static_cast<int64_t>(M) * p.ldxp;  // elements per piece
  const uint8_t* w = p.w + static_cast<int64_t>(grp) * N * p.ldw;
  const __nv_bfloat16* xp = p.xp + static_cast<int64_t>(grp) * K;
  float* y = p.y + static_cast<int64_t>(grp) * N;

  auto load = [&](int i) {
    constexpr int WP = W8 ? kBK / 16 : kBK / 8;  // 16-byte pieces per weight row and stage
#pragma unroll
    for (int q = tid; q < WK * R * WP; q += NT) {
      const int ws = q / (R * WP), r = (q / WP) % R, o = q % WP;
      const int64_t k0 = static_cast<int64_t>(ws) * KW + static_cast<int64_t>(i) * kBK;
      uint8_t* st = smb + (i % S) * C::kStage + ws * C::kSub;
      if (n0 + r < N)
        cp_async16(st + r * WB + o * 16, w + static_cast<int64_t>(n0 + r) * p.ldw + (W8 ? k0 : 2 * k0) + o * 16);
    }
#pragma unroll
    for (int q = tid; q < WK * kPieces * BT * 8; q += NT) {
      const int ws = q / (kPieces * BT * 8), pc = (q / (BT * 8)) % kPieces, t = (q / 8) % BT, o = q % 8;
      const int64_t k0 = static_cast<int64_t>(ws) * KW + static_cast<int64_t>(i) * kBK;
      uint8_t* st = smb + (i % S) * C::kStage + ws * C::kSub;
      if (m0 + t < M)
        cp_async16(st + C::kXOff + ((pc * BT + t) * kRS + o * 8) * 2,
                   xp + pc * MX + static_cast<int64_t>(m0 + t) * p.ldxp + k0 + o * 8);
    }
  };

  for (int s = 0; s < S - 1; ++s) {
    if (s < nk) load(s);
    cp_async_commit();
  }
  // E4M3: the block's scale rows, whole, into shared memory after the stages (a fold then reads shared memory, not a
  // global load on the accumulator chain's path; ordered by the main loop's first barrier).
  const int KB = W8 ? K / p.B : 0, srow0 = W8 ? (grp * N + n0) / p.B : 0;
  uint8_t* ssc = smb + S * C::kStage;
  if constexpr (W8) {
    const int srows = (grp * N + min(n0 + R, N) - 1) / p.B - srow0 + 1;
    for (int q = tid; q < srows * KB; q += NT)
      ssc[q] = __ldg(p.sc + static_cast<int64_t>(srow0 + q / KB) * p.lds + q % KB);
  }

  const int lane = tid & 31, warp = (tid >> 5) % WR, ws = (tid >> 5) / WR, g = lane >> 2, t = lane & 3;
  const int rbase = warp * MI * 16;
  // This block's token groups of 8 that hold tokens (a ragged last tile skips the rest: warp-uniform).
  const int live = min(NI, (M - m0 + 7) / 8);
  // acc: BF16 weights, one chain over K for the three pieces; E4M3, one per piece (three independent MMA chains, a
  // third of the latency each) over a scale block, summed hi + mid + lo at its fold into tot.
  constexpr int P = W8 ? kPieces : 1;
  float acc[P][MI][NI][4], tot[MI][NI][4], run[MI][NI][4];  // run: E4M3, the segment totals so far
#pragma unroll
  for (int a = 0; a < MI; ++a)
#pragma unroll
    for (int b = 0; b < NI; ++b)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        tot[a][b][c] = run[a][b][c] = 0.0f;
#pragma unroll
        for (int q = 0; q < P; ++q) acc[q][a][b][c] = 0.0f;
      }
  const int fold_steps = W8 ? p.B / 16 : 0;  // k16 steps per scale block
  int cnt = 0;

  // ldmatrix addresses: A (x4) lane l -> row l % 16, columns (l / 16) 8; B (x2) lane l -> token l % 8, columns
  // ((l / 8) % 2) 8 (lanes 16..31 repeat 0..15; .x2 reads the first 16 addresses).
  const int a_row = rbase + (lane & 15), a_col = (lane >> 4) * 8;
  const int b_tok = lane & 7, b_col = ((lane >> 3) & 1) * 8;

  for (int it = 0; it < nk; ++it) {
    cp_async_wait<S - 2>();
    __syncthreads();  // stage it landed for everyone; stage it - 1 is free for reuse
    if (it + S - 1 < nk) load(it + S - 1);
    cp_async_commit();

    const uint8_t* st = smb + (it % S) * C::kStage + ws * C::kSub;
    const __nv_bfloat16* sx = reinterpret_cast<const __nv_bfloat16*>(st + C::kXOff);
#pragma unroll
    for (int j = 0; j < kBK / 16; ++j) {
      uint32_t af[MI][4];
#pragma unroll
      for (int a = 0; a < MI; ++a) {
        if constexpr (W8) {  // the A fragment from e4m3 pairs: (g, 2t), (g + 8, 2t), (g, 2t + 8), (g + 8, 2t + 8)
          const uint8_t* r0 = st + (rbase + a * 16 + g) * WB + j * 16 + 2 * t;
          af[a][0] = e4m3x2_bf16x2(*reinterpret_cast<const uint16_t*>(r0));
          af[a][1] = e4m3x2_bf16x2(*reinterpret_cast<const uint16_t*>(r0 + 8 * WB));
          af[a][2] = e4m3x2_bf16x2(*reinterpret_cast<const uint16_t*>(r0 + 8));
          af[a][3] = e4m3x2_bf16x2(*reinterpret_cast<const uint16_t*>(r0 + 8 * WB + 8));
        } else {
          ldmatrix_x4(af[a], st + ((a_row + a * 16) * kRS + j * 16 + a_col) * 2);
        }
      }
#pragma unroll
      for (int b = 0; b < NI; ++b) {
        if (b >= live) break;
        uint32_t bf[kPieces][2];
#pragma unroll
        for (int q = 0; q < kPieces; ++q) ldmatrix_x2(bf[q], sx + (q * BT + b * 8 + b_tok) * kRS + j * 16 + b_col);
#pragma unroll
        for (int a = 0; a < MI; ++a)
#pragma unroll
          for (int q = 0; q < kPieces; ++q) mma_bf16(acc[W8 ? q : 0][a][b], af[a], bf[q]);  // hi, mid, lo
      }
      if constexpr (W8) {
        if (++cnt == fold_steps) {  // end of a scale block: tot += acc * scale, in K order
          cnt = 0;
          const int kb = (ws * KW + it * kBK + j * 16) / p.B;
#pragma unroll
          for (int a = 0; a < MI; ++a) {
            const int row = min(n0 + rbase + a * 16, N - 1) + grp * N;
            const float sw = e8m0_f32(ssc[(row / p.B - srow0) * KB + kb]);
#pragma unroll
            for (int b = 0; b < NI; ++b) {
              if (b >= live) break;
#pragma unroll
              for (int c = 0; c < 4; ++c) {
                const float blk = __fadd_rn(__fadd_rn(acc[0][a][b][c], acc[1 % P][a][b][c]), acc[2 % P][a][b][c]);
                tot[a][b][c] = __fmaf_rn(blk, sw, tot[a][b][c]);
#pragma unroll
                for (int q = 0; q < P; ++q) acc[q][a][b][c] = 0.0f;
              }
            }
          }
        }
      }
    }
    if constexpr (W8) {
      if ((it + 1) % seg_stages == 0) tc::add_total(run, tot);  // end of a K segment: run += its total, in K order
    }
  }
  cp_async_wait<0>();

  if constexpr (WK > 1) {  // the segments' totals (one per warp group) added in K order by group 0
    __syncthreads();       // every warp is past its last stage: the stages' memory is free
    float* red = reinterpret_cast<float*>(smb);  // [WK][WR][32][MI NI 4]
    constexpr int V = MI * NI * 4;
#pragma unroll
    for (int a = 0; a < MI; ++a)
#pragma unroll
      for (int b = 0; b < NI; ++b)
#pragma unroll
        for (int c = 0; c < 4; ++c) red[((ws * WR + warp) * 32 + lane) * V + (a * NI + b) * 4 + c] = run[a][b][c];
    __syncthreads();
    if (ws != 0) return;
#pragma unroll
    for (int a = 0; a < MI; ++a)
#pragma unroll
      for (int b = 0; b < NI; ++b)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          float v = 0.0f;
#pragma unroll
          for (int q = 0; q < WK; ++q) v = __fadd_rn(v, red[((q * WR + warp) * 32 + lane) * V + (a * NI + b) * 4 + c]);
          run[a][b][c] = v;
        }
  }

#pragma unroll
  for (int a = 0; a < MI; ++a)
#pragma unroll
    for (int b = 0; b < NI; ++b)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int n = n0 + rbase + a * 16 + g + (c >= 2 ? 8 : 0);
        const int m = m0 + b * 8 + 2 * t + (c & 1);
        if (n < N && m < M) {
          const float v = W8 ? run[a][b][c] : acc[0][a][b][c];
          y[static_cast<int64_t>(m) * p.ldy + n] = p.round ? round_to_bf16(v) : v;
        }
      }
}

// The E4M3 scale table's largest size (bytes): (R / 32 + 1) scale rows of at most kMaxScaleCols columns.
constexpr int kMaxScaleCols = 1024;

template <int MI, int NI, int WR, int S, bool W8, int WK = 1>
void launch(const Bf16Problem& p, int groups, cudaStream_t stream) {
  using C = Bf16Cfg<MI, NI, WR, W8, WK>;
  auto* kernel = tc_bf16_kernel<MI, NI, WR, S, W8, WK>;
  constexpr int table_max = W8 ? (C::kR / 32 + 1) * kMaxScaleCols : 0;
  constexpr int red = WK > 1 ? WK * WR * 32 * MI * NI * 4 * 4 : 0;  // the segment totals' exchange (reuses stages)
  static_assert(red <= S * C::kStage, "the segment totals do not fit the stages' memory");
  constexpr int smem_max = S * C::kStage + table_max;
  const int smem = S * C::kStage + (W8 ? (C::kR / p.B + 1) * (p.K / p.B) : 0);
  static std::once_flag once;
  std::call_once(once, [&] {
    DI_CHECK(smem_max <= smem_optin(), "cuda::linear_tc_bf16: a {}-byte pipeline exceeds the device's {} bytes",
             smem_max, smem_optin());
    DI_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_max));
  });
  const dim3 grid(static_cast<unsigned>((p.M + C::kBT - 1) / C::kBT), static_cast<unsigned>((p.N + C::kR - 1) / C::kR),
                  static_cast<unsigned>(groups));
  launch_pdl(kernel, grid, C::kThreads, smem, stream, p);
  DI_CUDA_CHECK(cudaGetLastError());
}

// Tiles from M (every configuration gives the same bits: the contract's MMA chain per output), two stages each for
// BF16 weights (the blocks are short-lived and many; a third or fourth stage costs more in blocks per SM than it
// hides). Measured on the head [129280, 5120] against 1-4 MMA tiles per warp, 2-8 warps and 2-5 stages
// (bench/RESULTS.md, twenty-fifth session): decode batches 64 weight rows x 8 tokens per block, then 256 rows x 16 / 32
// tokens. E4M3 weights (wo_a's groups: 8 x [1024, 4096], too few m16 tiles to fill the GPU at decode with a warp each
// over all of K) take 32 rows x 8 tokens per block at decode, a warp per m16 tile and K segment, four stages: 256
// blocks for wo_a, one wave at two blocks per SM (16 rows and three stages, 512 blocks at three per SM, measured
// slower: bench/RESULTS.md, twenty-sixth session).
template <bool W8>
void dispatch(const Bf16Problem& p, int groups, cudaStream_t stream) {
  if (p.M <= 8) {
    if constexpr (W8)
      launch<1, 1, 2, 4, W8, kKSeg>(p, groups, stream);
    else
      launch<1, 1, 4, 2, W8>(p, groups, stream);
  } else if (p.M <= 16) {
    launch<2, 2, 8, 2, W8>(p, groups, stream);
  } else {
    launch<2, 4, 8, 2, W8>(p, groups, stream);
  }
}

std::string unsupported(const Tensor& x, const ops::QWeight& qw, int64_t groups, const ops::LinearOpts& opts) {
  const std::string why = dense_operands_why(x, qw.w);
  if (!why.empty()) return why;
  const Tensor& w = qw.w;
  if (opts.act_quant_block != 0) return "takes no input site (act_quant_block 0)";
  if (groups < 1 || groups > 65535 || w.size(0) % groups != 0) return "the weight's rows do not split into the groups";
  const int64_t M = x.size(0), N = w.size(0) / groups, K = w.size(1);
  if (x.size(1) != groups * K) return "x's columns are not groups x the weight's";
  if (K <= 0 || K % kBK != 0) return "needs K > 0 and K % 64 == 0";
  if (M >= (int64_t{1} << 22) || N * groups >= (int64_t{1} << 22) || K >= (int64_t{1} << 30) ||
      M * K * groups >= (int64_t{1} << 36))
    return "too large";
  if (w.dtype() == DType::kBF16) {
    if (qw.scale.defined()) return "a bfloat16 weight takes no scale";
    if (reinterpret_cast<uintptr_t>(w.raw()) % 16 != 0 || (w.size(0) > 1 && w.strides()[0] % 8 != 0))
      return "needs 16-byte aligned weight rows";
  } else if (w.dtype() == DType::kE4M3) {
    const Tensor& s = qw.scale;
    const int64_t B = qw.block;
    if (B <= 0 || B % 32 != 0 || (kBK % B != 0 && B % kBK != 0))
      return "needs an E4M3 block of 32, 64 or a multiple of 64";
    if (N % B != 0 || K % B != 0) return "needs each group's rows and columns in whole scale blocks";
    if (K / B > kMaxScaleCols) return "too many scale blocks per row (the kernel keeps a block's scale rows in smem)";
    if (K % (kKSeg * kBK) != 0 || (K / kKSeg) % B != 0)
      return "needs K in 4 segments of whole 64-column stages and whole scale blocks";
    if (!s.defined() || s.device() != Device::kCUDA || s.dtype() != DType::kE8M0 || s.dim() != 2 ||
        s.size(0) != groups * N / B || s.size(1) != K / B || (s.size(1) > 1 && s.strides()[1] != 1))
      return "the scale does not match the weight";
    if (reinterpret_cast<uintptr_t>(w.raw()) % 16 != 0 || (w.size(0) > 1 && w.strides()[0] % 16 != 0))
      return "needs 16-byte aligned weight rows";
  } else {
    return "only bfloat16 and E4M3 weights";
  }
  return "";
}

void run(const Tensor& x, const ops::QWeight& qw, int64_t groups, const ops::LinearOpts& opts, Tensor& y,
         cudaStream_t stream, const char* op) {
  const std::string why = unsupported(x, qw, groups, opts);
  DI_CHECK(why.empty(), "{}: unsupported call (x {}, weight {}, {} groups): {}", op,
           x.defined() ? x.describe() : "undefined", qw.w.defined() ? qw.w.describe() : "undefined", groups, why);
  const int64_t M = x.size(0), N = qw.w.size(0) / groups, K = qw.w.size(1), KX = groups * K;
  check_linear_out(y, M, groups * N, op);
  if (M == 0 || N == 0) return;
  const int64_t MK = M * KX;
  const Tensor ws = call_scratch(static_cast<size_t>(kPieces * MK) * 2);
  auto* xp = static_cast<__nv_bfloat16*>(ws.raw());
  launch_pdl(split_x_kernel, static_cast<unsigned>((MK + 255) / 256), 256, 0, stream, x.data<float>(), x.strides()[0],
             static_cast<int>(M), static_cast<int>(KX), xp);
  DI_CUDA_CHECK(cudaGetLastError());
  const bool w8 = qw.w.dtype() == DType::kE4M3;
  Bf16Problem p{};
  p.w = static_cast<const uint8_t*>(qw.w.raw());
  p.ldw = qw.w.strides()[0] * (w8 ? 1 : 2);
  p.sc = w8 ? static_cast<const uint8_t*>(qw.scale.raw()) : nullptr;
  p.lds = w8 ? qw.scale.strides()[0] : 0;
  p.B = w8 ? static_cast<int>(qw.block) : 0;
  p.N = static_cast<int>(N), p.K = static_cast<int>(K), p.M = static_cast<int>(M);
  p.ldxp = KX, p.xp = xp;
  p.y = y.data<float>(), p.ldy = groups * N;
  p.round = opts.round_out_bf16;
  w8 ? dispatch<true>(p, static_cast<int>(groups), stream) : dispatch<false>(p, static_cast<int>(groups), stream);
}

}  // namespace

bool linear_tc_bf16_supported(const Tensor& x, const ops::QWeight& w, const ops::LinearOpts& opts) {
  return w.w.defined() && w.w.dtype() == DType::kBF16 && unsupported(x, w, 1, opts).empty();
}

bool linear_tc_bf16_takes(const Tensor& x, const ops::QWeight& w, const ops::LinearOpts& opts) {
  return w.w.defined() && w.w.dim() == 2 && w.w.size(0) >= kMinHeadRows && linear_tc_bf16_supported(x, w, opts);
}

void linear_tc_bf16_into(const Tensor& x, const ops::QWeight& qw, const ops::LinearOpts& opts, Tensor& y,
                         CUstream_st* stream_ptr) {
  const char* op = "cuda::linear_tc_bf16";
  DI_CHECK(!qw.w.defined() || qw.w.dtype() == DType::kBF16, "{}: weight {} is not bfloat16", op, qw.w.describe());
  run(x, qw, 1, opts, y, stream_ptr, op);
}

Tensor linear_tc_bf16(const Tensor& x, const ops::QWeight& w, const ops::LinearOpts& opts) {
  DI_CHECK(x.defined() && x.dim() == 2 && w.w.defined() && w.w.dim() == 2,
           "cuda::linear_tc_bf16: expected x [M, K] and W [N, K]");
  Tensor y = Tensor::empty({x.size(0), w.w.size(0)}, DType::kF32, Device::kCUDA);
  linear_tc_bf16_into(x, w, opts, y);
  return y;
}

bool linear_tc_groups_supported(const Tensor& x, const ops::QWeight& w, int64_t groups, const ops::LinearOpts& opts) {
  return unsupported(x, w, groups, opts).empty();
}

Tensor linear_tc_groups(const Tensor& x, const ops::QWeight& w, int64_t groups, const ops::LinearOpts& opts) {
  DI_CHECK(x.defined() && x.dim() == 2 && w.w.defined() && w.w.dim() == 2,
           "cuda::linear_tc_groups: expected x [M, groups K] and W [groups N, K]");
  Tensor y = Tensor::empty({x.size(0), w.w.size(0)}, DType::kF32, Device::kCUDA);
  run(x, w, groups, opts, y, nullptr, "cuda::linear_tc_groups");
  return y;
}

}  // namespace deepinfer::cuda
