// CUDA fake quantisation (FP8 e4m3, ue8m0 scales) and bf16 rounding. Contracts in quant.cuh.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "cuda/common.cuh"
#include "cuda/device.h"
#include "cuda/fp_decode.cuh"
#include "cuda/quant.cuh"

namespace deepinfer::cuda {

namespace {

// One thread block per (row, group): find the group's amax, derive the scale, quantise.
// Groups are numbered row-major: blockIdx.x = row * groups_per_row + group.
__global__ void fake_quant_fp8_kernel(float* x, int64_t row_stride, int64_t col_begin, int64_t col_end, int64_t block,
                                      int64_t groups_per_row) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t row = blockIdx.x / groups_per_row;
  const int64_t group = blockIdx.x % groups_per_row;
  const int64_t c0 = col_begin + group * block;
  const int64_t c1 = min(c0 + block, col_end);
  float* p = x + row * row_stride;

  // 1. amax over the group (max is order-independent, so this is exact).
  float amax = 0.0f;
  for (int64_t c = c0 + threadIdx.x; c < c1; c += blockDim.x) amax = fmaxf(amax, fabsf(p[c]));
  amax = block_reduce(amax, MaxOp{}, 0.0f);

  // 2. Power-of-two scale with the 1e-4 floor; dividing by it is exact.
  const float s = fp8_group_scale(amax);

  // 3. Quantise and write back the dequantised value q * s (exact in fp32).
  for (int64_t c = c0 + threadIdx.x; c < c1; c += blockDim.x) p[c] = fp8_fake_quant(p[c], s);
}

// Elementwise bf16 rounding over rows; a grid-stride loop over all rows * cols values.
__global__ void round_bf16_kernel(float* x, int64_t rows, int64_t cols, int64_t row_stride) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float* v = x + (i / cols) * row_stride + i % cols;
    *v = round_to_bf16(*v);
  }
}

// FP4 group quantisers: one warp per (row, group), lanes striding over the group's columns.
// kE4M3Scale false: ue8m0 scale, x * (1/s) (exact, s is a power of two); true: e4m3 scale, x / s.
template <bool kE4M3Scale>
__global__ void fake_quant_fp4_kernel(float* x, int64_t rows, int64_t row_stride, int64_t cols, int64_t block,
                                      int64_t groups_per_row, float floor) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t gw = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (gw >= rows * groups_per_row) return;  // whole warps leave together
  const int lane = threadIdx.x & 31;
  const int64_t row = gw / groups_per_row;
  const int64_t c0 = (gw % groups_per_row) * block;
  const int64_t c1 = min(c0 + block, cols);
  float* p = x + row * row_stride;
  float amax = 0.0f;
  for (int64_t c = c0 + lane; c < c1; c += 32) amax = fmaxf(amax, fabsf(p[c]));
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  amax = fmaxf(amax, floor);
  if (!kE4M3Scale) {
    const float s = ue8m0_scale(amax, 6.0f);
    const float inv = __fdiv_rn(1.0f, s);
    for (int64_t c = c0 + lane; c < c1; c += 32) {
      const float v = fminf(fmaxf(__fmul_rn(p[c], inv), -6.0f), 6.0f);
      p[c] = __fmul_rn(round_e2m1_grid(v), s);
    }
  } else {
    const float t = __fmul_rn(amax, 1.0f / 6.0f);
    // deepinfer::f32_to_e4m3 saturates (448) below the midpoint 464 and gives NaN from it on.
    const float s = t >= 464.0f ? __uint_as_float(0x7fc00000u) : e4m3_rne(t);
    for (int64_t c = c0 + lane; c < c1; c += 32) {
      const float v = fminf(fmaxf(__fdiv_rn(p[c], s), -6.0f), 6.0f);
      p[c] = __fmul_rn(round_e2m1_grid(v), s);
    }
  }
}

// Dequantisation: one thread per output element, grid-stride.
__global__ void dequant_kernel(int fmt, const uint8_t* w, int64_t ldw, const uint8_t* s, int64_t lds, int64_t B,
                               int64_t N, int64_t K, float* out) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t total = N * K;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t n = i / K, k = i % K;
    const uint8_t* wr = w + n * ldw;
    float v;
    if (fmt == 0) {  // F32
      v = reinterpret_cast<const float*>(wr)[k];
    } else if (fmt == 1) {  // BF16
      v = __uint_as_float(static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(wr)[k]) << 16);
    } else if (fmt == 2) {  // E4M3, scale tile [n / B][k / B]
      v = __fmul_rn(e4m3_decode(wr[k]), e8m0_decode(s[(n / B) * lds + k / B]));
    } else {  // E2M1x2: low nibble = even column; scale [n][k / 32]
      const uint8_t byte = wr[k / 2];
      const uint32_t code = (k & 1) ? (byte >> 4) : (byte & 15u);
      const float mag =
          (code & 7u) < 4u
              ? 0.5f * static_cast<float>(code & 7u)
              : ((code & 7u) == 4u ? 2.0f : ((code & 7u) == 5u ? 3.0f : ((code & 7u) == 6u ? 4.0f : 6.0f)));
      const float e = (code & 8u) ? -mag : mag;
      v = __fmul_rn(e, e8m0_decode(s[n * lds + k / 32]));
    }
    out[i] = v;
  }
}

template <bool kE4M3Scale>
void launch_fp4(Tensor& x, int64_t block, float floor, const char* op) {
  const Rows r = as_rows(x, op);
  DI_CHECK(block > 0, "{}: block must be positive, got {}", op, block);
  if (r.rows == 0 || r.cols == 0) return;
  const int64_t groups_per_row = (r.cols + block - 1) / block;
  const int64_t warps = r.rows * groups_per_row;
  constexpr int kThreads = 256;
  const int64_t blocks = (warps * 32 + kThreads - 1) / kThreads;
  DI_CHECK(blocks < (int64_t{1} << 31), "{}: {} groups is too many for one launch", op, warps);
  launch_pdl(fake_quant_fp4_kernel<kE4M3Scale>, static_cast<unsigned>(blocks), kThreads, 0, nullptr, r.data, r.rows,
             r.row_stride, r.cols, block, groups_per_row, floor);
  DI_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void fake_quant_fp4(Tensor& x, int64_t block) {
  launch_fp4<false>(x, block, 6.0f * std::ldexp(1.0f, -126), "cuda::fake_quant_fp4");
}

void fake_quant_fp4_e4m3_scale(Tensor& x, int64_t block) {
  launch_fp4<true>(x, block, 6.0f * std::ldexp(1.0f, -9), "cuda::fake_quant_fp4_e4m3_scale");
}

Tensor dequantize(const ops::QWeight& qw) {
  const Tensor& w = qw.w;
  const char* op = "cuda::dequantize";
  DI_CHECK(w.defined() && w.dim() == 2 && w.device() == Device::kCUDA, "{}: expected a 2-D CUDA weight, got {}", op,
           w.defined() ? w.describe() : std::string("undefined"));
  const int64_t N = w.size(0), K = w.size(1);
  DI_CHECK(K <= 1 || w.strides()[1] == 1, "{}: the weight's rows must be dense, got {}", op, w.describe());
  int fmt = 0;
  int64_t ldw = 0, lds = 0, B = 0;
  const uint8_t* sp = nullptr;
  auto check_scale = [&](int64_t rows, int64_t cols) {
    const Tensor& s = qw.scale;
    DI_CHECK(s.defined() && s.device() == Device::kCUDA && s.dtype() == DType::kE8M0 && s.dim() == 2 &&
                 s.size(0) == rows && s.size(1) == cols && (cols <= 1 || s.strides()[1] == 1),
             "{}: scale {} does not fit weight {} (expected E8M0 [{}, {}] on CUDA)", op,
             s.defined() ? s.describe() : std::string("undefined"), w.describe(), rows, cols);
    sp = static_cast<const uint8_t*>(s.raw());
    lds = s.strides()[0];
  };
  switch (w.dtype()) {
    case DType::kF32:
      fmt = 0;
      ldw = w.strides()[0] * 4;
      break;
    case DType::kBF16:
      fmt = 1;
      ldw = w.strides()[0] * 2;
      break;
    case DType::kE4M3:
      DI_CHECK(qw.block > 0, "{}: an E4M3 weight needs a positive tile size, got {}", op, qw.block);
      fmt = 2;
      B = qw.block;
      ldw = w.strides()[0];
      check_scale((N + B - 1) / B, (K + B - 1) / B);
      break;
    case DType::kE2M1x2:
      DI_CHECK(K % 32 == 0 && w.is_contiguous(), "{}: an FP4 weight must be contiguous with in % 32 == 0, got {}", op,
               w.describe());
      fmt = 3;
      ldw = K / 2;
      check_scale(N, K / 32);
      break;
    default:
      fail("{}: unsupported weight dtype {}", op, w.describe());
  }
  Tensor out = Tensor::empty({N, K}, DType::kF32, Device::kCUDA);
  if (N == 0 || K == 0) return out;
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((N * K + kThreads - 1) / kThreads, int64_t{1} << 20);
  launch_pdl(dequant_kernel, static_cast<unsigned>(blocks), kThreads, 0, nullptr, fmt,
             static_cast<const uint8_t*>(w.raw()), ldw, sp, lds, B, N, K, out.data<float>());
  DI_CUDA_CHECK(cudaGetLastError());
  return out;
}

void fake_quant_fp8(Tensor& x, int64_t col_begin, int64_t col_end, int64_t block) {
  const Rows r = as_rows(x, "cuda::fake_quant_fp8");
  DI_CHECK(block > 0, "cuda::fake_quant_fp8: block must be positive, got {}", block);
  DI_CHECK(0 <= col_begin && col_begin <= col_end && col_end <= r.cols,
           "cuda::fake_quant_fp8: columns [{}, {}) out of range for {}", col_begin, col_end, x.describe());
  if (r.rows == 0 || col_begin == col_end) return;
  const int64_t groups_per_row = (col_end - col_begin + block - 1) / block;
  const int64_t grid = r.rows * groups_per_row;
  DI_CHECK(grid < (int64_t{1} << 31), "cuda::fake_quant_fp8: {} groups is too many for one launch", grid);
  const int threads = threads_for(block, 256);
  launch_pdl(fake_quant_fp8_kernel, static_cast<unsigned>(grid), threads, 0, nullptr, r.data, r.row_stride, col_begin,
             col_end, block, groups_per_row);
  DI_CUDA_CHECK(cudaGetLastError());
}

void round_bf16(Tensor& x, bool enable) {
  if (!enable) return;
  const Rows r = as_rows(x, "cuda::round_bf16");
  const int64_t n = r.rows * r.cols;
  if (n == 0) return;
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 65536);
  launch_pdl(round_bf16_kernel, static_cast<unsigned>(blocks), kThreads, 0, nullptr, r.data, r.rows, r.cols,
             r.row_stride);
  DI_CUDA_CHECK(cudaGetLastError());
}

}  // namespace deepinfer::cuda
