// Tensor-core linear for BF16 weights (the vocabulary head): x split into three bf16 pieces, mma.m16n8k16 bf16.
// Contract, numerics and kernel shape in linear_tc_bf16.cuh.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <mutex>
#include <string>

#include "cuda/common.cuh"
#include "cuda/device.h"
#include "cuda/fp_decode.cuh"
#include "cuda/linear_tc_bf16.cuh"

namespace deepinfer::cuda {

namespace {

constexpr int kBK = 64;       // K columns per pipeline stage (4 MMA k steps of 16)
constexpr int kRS = kBK + 8;  // smem row stride in bf16 (144 bytes: the 8 rows of an ldmatrix hit 8 bank groups)
constexpr int kPieces = 3;    // x = hi + mid + lo
constexpr int kMinHeadRows = 16384;

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
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* p) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(s));
}
// d += A(16x16 bf16, row) . B(16x8 bf16, col), FP32 accumulation.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <int MI, int NI, int WR>
struct Bf16Cfg {
  static constexpr int kR = WR * MI * 16;  // weight rows per block
  static constexpr int kBT = NI * 8;       // tokens per block
  static constexpr int kThreads = WR * 32;
  static constexpr int kXOff = kR * kRS;                         // bf16 elements: weight rows, then x pieces
  static constexpr int kStage = (kR + kPieces * kBT) * kRS * 2;  // bytes
};

// Block (token tile blockIdx.x, row tile blockIdx.y). Stage layout (bf16, rows of kRS): weight rows [R], then the
// pieces' token rows [3][BT]. Rows >= N and tokens >= M are not loaded: their stale smem only reaches outputs that are
// never stored (an MMA output depends on its own row and column only).
template <int MI, int NI, int WR, int S>
__global__ void __launch_bounds__(WR * 32)
    tc_bf16_kernel(const __nv_bfloat16* __restrict__ w, int64_t ldw, int N, int K, int M,
                   const __nv_bfloat16* __restrict__ xp, float* __restrict__ y, bool round) {
  pdl_wait();
  pdl_launch_dependents();
  using C = Bf16Cfg<MI, NI, WR>;
  constexpr int R = C::kR, BT = C::kBT, NT = C::kThreads;
  extern __shared__ __align__(16) __nv_bfloat16 sm[];
  const int tid = threadIdx.x;
  const int m0 = blockIdx.x * BT, n0 = blockIdx.y * R;
  const int nk = K / kBK;
  const int64_t MK = static_cast<int64_t>(M) * K;

  auto load = [&](int i) {
    __nv_bfloat16* st = sm + (i % S) * (C::kStage / 2);
    const int64_t k0 = static_cast<int64_t>(i) * kBK;
#pragma unroll
    for (int p = tid; p < R * 8; p += NT) {
      const int r = p / 8, o = p % 8;
      if (n0 + r < N) cp_async16(st + r * kRS + o * 8, w + static_cast<int64_t>(n0 + r) * ldw + k0 + o * 8);
    }
#pragma unroll
    for (int p = tid; p < kPieces * BT * 8; p += NT) {
      const int q = p / (BT * 8), t = (p / 8) % BT, o = p % 8;
      if (m0 + t < M)
        cp_async16(st + C::kXOff + (q * BT + t) * kRS + o * 8,
                   xp + q * MK + static_cast<int64_t>(m0 + t) * K + k0 + o * 8);
    }
  };

  for (int s = 0; s < S - 1; ++s) {
    if (s < nk) load(s);
    cp_async_commit();
  }

  const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int rbase = warp * MI * 16;
  // This block's token groups of 8 that hold tokens (a ragged last tile skips the rest: warp-uniform).
  const int live = min(NI, (M - m0 + 7) / 8);
  float acc[MI][NI][4];
#pragma unroll
  for (int a = 0; a < MI; ++a)
#pragma unroll
    for (int b = 0; b < NI; ++b)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[a][b][c] = 0.0f;

  // ldmatrix addresses: A (x4) lane l -> row l % 16, columns (l / 16) 8; B (x2) lane l -> token l % 8, columns
  // ((l / 8) % 2) 8 (lanes 16..31 repeat 0..15; .x2 reads the first 16 addresses).
  const int a_row = rbase + (lane & 15), a_col = (lane >> 4) * 8;
  const int b_tok = lane & 7, b_col = ((lane >> 3) & 1) * 8;

  for (int it = 0; it < nk; ++it) {
    cp_async_wait<S - 2>();
    __syncthreads();  // stage it landed for everyone; stage it - 1 is free for reuse
    if (it + S - 1 < nk) load(it + S - 1);
    cp_async_commit();

    const __nv_bfloat16* st = sm + (it % S) * (C::kStage / 2);
#pragma unroll
    for (int j = 0; j < kBK / 16; ++j) {
      uint32_t af[MI][4];
#pragma unroll
      for (int a = 0; a < MI; ++a) ldmatrix_x4(af[a], st + (a_row + a * 16) * kRS + j * 16 + a_col);
#pragma unroll
      for (int b = 0; b < NI; ++b) {
        if (b >= live) break;
        uint32_t bf[kPieces][2];
#pragma unroll
        for (int q = 0; q < kPieces; ++q)
          ldmatrix_x2(bf[q], st + C::kXOff + (q * BT + b * 8 + b_tok) * kRS + j * 16 + b_col);
#pragma unroll
        for (int a = 0; a < MI; ++a)
#pragma unroll
          for (int q = 0; q < kPieces; ++q) mma_bf16(acc[a][b], af[a], bf[q]);  // hi, mid, lo: the contract's order
      }
    }
  }
  cp_async_wait<0>();

#pragma unroll
  for (int a = 0; a < MI; ++a)
#pragma unroll
    for (int b = 0; b < NI; ++b)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int n = n0 + rbase + a * 16 + g + (c >= 2 ? 8 : 0);
        const int m = m0 + b * 8 + 2 * t + (c & 1);
        if (n < N && m < M) {
          const float v = acc[a][b][c];
          y[static_cast<int64_t>(m) * N + n] = round ? round_to_bf16(v) : v;
        }
      }
}

struct Args {
  const __nv_bfloat16* w;
  int64_t ldw;
  int N, K, M;
  const __nv_bfloat16* xp;
  float* y;
  bool round;
};

template <int MI, int NI, int WR, int S>
void launch(const Args& a, cudaStream_t stream) {
  using C = Bf16Cfg<MI, NI, WR>;
  auto* kernel = tc_bf16_kernel<MI, NI, WR, S>;
  constexpr int smem = S * C::kStage;
  static std::once_flag once;
  std::call_once(once, [&] {
    DI_CHECK(smem <= smem_optin(), "cuda::linear_tc_bf16: a {}-byte pipeline exceeds the device's {} bytes", smem,
             smem_optin());
    DI_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  });
  const dim3 grid(static_cast<unsigned>((a.M + C::kBT - 1) / C::kBT), static_cast<unsigned>((a.N + C::kR - 1) / C::kR));
  launch_pdl(kernel, grid, C::kThreads, smem, stream, a.w, a.ldw, a.N, a.K, a.M, a.xp, a.y, a.round);
  DI_CUDA_CHECK(cudaGetLastError());
}

// Tiles from M (every configuration gives the same bits: the contract's MMA chain per output), two stages each (the
// blocks are short-lived and many; a third or fourth stage costs more in blocks per SM than it hides). Measured on the
// head [129280, 5120] against 1-4 MMA tiles per warp, 2-8 warps and 2-5 stages (bench/RESULTS.md, twenty-fifth
// session): decode batches 64 weight rows x 8 tokens per block, then 256 rows x 16 / 32 tokens.
void dispatch(const Args& a, cudaStream_t stream) {
  if (a.M <= 8)
    launch<1, 1, 4, 2>(a, stream);
  else if (a.M <= 16)
    launch<2, 2, 8, 2>(a, stream);
  else
    launch<2, 4, 8, 2>(a, stream);
}

std::string unsupported(const Tensor& x, const ops::QWeight& qw, const ops::LinearOpts& opts) {
  if (!x.defined() || x.device() != Device::kCUDA || x.dtype() != DType::kF32 || x.dim() != 2)
    return "x must be a 2-D float32 CUDA tensor";
  if (x.size(1) > 1 && x.strides()[1] != 1) return "x's rows must be dense";
  const Tensor& w = qw.w;
  if (!w.defined() || w.device() != Device::kCUDA || w.dim() != 2 || w.dtype() != DType::kBF16)
    return "the weight must be a 2-D bfloat16 CUDA tensor";
  if (qw.scale.defined()) return "a bfloat16 weight takes no scale";
  if (w.size(1) > 1 && w.strides()[1] != 1) return "the weight's rows must be dense";
  if (opts.act_quant_block != 0) return "takes no input site (act_quant_block 0)";
  const int64_t M = x.size(0), N = w.size(0), K = w.size(1);
  if (x.size(1) != K) return "x and the weight disagree on K";
  if (K <= 0 || K % kBK != 0) return "needs K > 0 and K % 64 == 0";
  if (M >= (int64_t{1} << 22) || N >= (int64_t{1} << 22) || K >= (int64_t{1} << 30) || M * K >= (int64_t{1} << 36))
    return "too large";
  if (reinterpret_cast<uintptr_t>(w.raw()) % 16 != 0 || (N > 1 && w.strides()[0] % 8 != 0))
    return "needs 16-byte aligned weight rows";
  return "";
}

}  // namespace

bool linear_tc_bf16_supported(const Tensor& x, const ops::QWeight& w, const ops::LinearOpts& opts) {
  return unsupported(x, w, opts).empty();
}

bool linear_tc_bf16_takes(const Tensor& x, const ops::QWeight& w, const ops::LinearOpts& opts) {
  return w.w.defined() && w.w.dim() == 2 && w.w.size(0) >= kMinHeadRows && linear_tc_bf16_supported(x, w, opts);
}

void linear_tc_bf16_into(const Tensor& x, const ops::QWeight& qw, const ops::LinearOpts& opts, Tensor& y,
                         CUstream_st* stream_ptr) {
  const char* op = "cuda::linear_tc_bf16";
  const std::string why = unsupported(x, qw, opts);
  DI_CHECK(why.empty(), "{}: unsupported call (x {}, weight {}): {}", op, x.defined() ? x.describe() : "undefined",
           qw.w.defined() ? qw.w.describe() : "undefined", why);
  const cudaStream_t stream = stream_ptr;
  const int64_t M = x.size(0), N = qw.w.size(0), K = qw.w.size(1);
  check_linear_out(y, M, N, op);
  if (M == 0 || N == 0) return;
  const int64_t MK = M * K;
  const Tensor ws = call_scratch(static_cast<size_t>(kPieces * MK) * 2);
  auto* xp = static_cast<__nv_bfloat16*>(ws.raw());
  launch_pdl(split_x_kernel, static_cast<unsigned>((MK + 255) / 256), 256, 0, stream, x.data<float>(), x.strides()[0],
             static_cast<int>(M), static_cast<int>(K), xp);
  DI_CUDA_CHECK(cudaGetLastError());
  Args a{};
  a.w = static_cast<const __nv_bfloat16*>(qw.w.raw());
  a.ldw = qw.w.strides()[0];
  a.N = static_cast<int>(N), a.K = static_cast<int>(K), a.M = static_cast<int>(M);
  a.xp = xp;
  a.y = y.data<float>();
  a.round = opts.round_out_bf16;
  dispatch(a, stream);
}

Tensor linear_tc_bf16(const Tensor& x, const ops::QWeight& w, const ops::LinearOpts& opts) {
  DI_CHECK(x.defined() && x.dim() == 2 && w.w.defined() && w.w.dim() == 2,
           "cuda::linear_tc_bf16: expected x [M, K] and W [N, K]");
  Tensor y = Tensor::empty({x.size(0), w.w.size(0)}, DType::kF32, Device::kCUDA);
  linear_tc_bf16_into(x, w, opts, y);
  return y;
}

}  // namespace deepinfer::cuda
