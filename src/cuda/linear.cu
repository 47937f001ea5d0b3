// CUDA linear layer (FP8 / FP4 / BF16 weights), bit-exact with the CPU op. Contract in linear.cuh.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>

#include "cuda/common.cuh"
#include "cuda/device.h"
#include "cuda/linear.cuh"
#include "cuda/quant.cuh"

namespace deepinfer::cuda {

namespace {

enum Fmt : int { kFp8 = 0, kFp4 = 1, kBf16 = 2 };

constexpr int kSlab = 512;  // bytes of each weight row per pipeline stage
constexpr int kStages = 4;
constexpr int kLanes = 32;  // threads per weight row: one warp, thread 8j + l owns accumulator v[j][l]

// ---- x pre-pass: optional FP8 fake quantisation, transposed into xt[tile][K][MT] ---------------------
__global__ void prep_x_kernel(const float* x, int64_t ldx, int M, int K, int MT, int64_t group, bool quant, float* xt) {
  const int m = blockIdx.y;
  const int64_t c0 = blockIdx.x * group;
  const int64_t c1 = min(c0 + group, static_cast<int64_t>(K));
  float* out = xt + (static_cast<int64_t>(m / MT) * K) * MT + m % MT;
  if (m >= M) {  // padding rows of the last tile
    for (int64_t c = c0 + threadIdx.x; c < c1; c += blockDim.x) out[c * MT] = 0.0f;
    return;
  }
  const float* p = x + m * ldx;
  if (!quant) {
    for (int64_t c = c0 + threadIdx.x; c < c1; c += blockDim.x) out[c * MT] = p[c];
    return;
  }
  float amax = 0.0f;  // as fake_quant_fp8_kernel (quant.cu), bit for bit the CPU op
  for (int64_t c = c0 + threadIdx.x; c < c1; c += blockDim.x) amax = fmaxf(amax, fabsf(p[c]));
  amax = block_reduce(amax, MaxOp{}, 0.0f);
  const float s = ue8m0_scale(fmaxf(amax, 1e-4f), kE4M3Max);
  for (int64_t c = c0 + threadIdx.x; c < c1; c += blockDim.x) out[c * MT] = e4m3_rne(p[c] / s) * s;
}

// ---- decoders -------------------------------------------------------------------------------------------
// e4m3 code -> e4m3 * 2^-8 exactly, through the fp16 bits the CPU uses (sign-extend, << 7, clear bit 14).
__device__ __forceinline__ float e4m3_f16(uint32_t code) {
  const uint16_t h = static_cast<uint16_t>((static_cast<int32_t>(static_cast<int8_t>(code)) << 7) & 0xbfff);
  return __half2float(__ushort_as_half(h));
}
// e2m1 code (0..15) -> value.
__device__ __forceinline__ float e2m1_f32(uint32_t c) {
  const uint32_t e = (c >> 1) & 3u, m = c & 1u;
  float v = e != 0 ? __uint_as_float(((e + 126u) << 23) | (m << 22)) : (m != 0 ? 0.5f : 0.0f);
  return (c & 8u) != 0 ? -v : v;
}
__device__ __forceinline__ float e8m0_f32(uint32_t e) {
  if (e == 255u) return __uint_as_float(0x7fc00000u);
  if (e == 0u) return __uint_as_float(0x00400000u);  // 2^-127, subnormal
  return __uint_as_float(e << 23);
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

template <int MT>
__device__ __forceinline__ void load_x(const float* p, float (&v)[MT]) {
  if constexpr (MT % 4 == 0) {
#pragma unroll
    for (int i = 0; i < MT / 4; ++i) {
      const float4 q = reinterpret_cast<const float4*>(p)[i];
      v[4 * i] = q.x, v[4 * i + 1] = q.y, v[4 * i + 2] = q.z, v[4 * i + 3] = q.w;
    }
  } else if constexpr (MT == 2) {
    const float2 q = *reinterpret_cast<const float2*>(p);
    v[0] = q.x, v[1] = q.y;
  } else {
    v[0] = *p;
  }
}

// ---- the GEMV: blockDim.x = rows * 8; grid (ceil(N / rows), M tiles) ------------------------------------
template <int FMT, int MT>
__global__ void __launch_bounds__(256)
    linear_kernel(const uint8_t* __restrict__ w, int64_t ldw, const uint8_t* __restrict__ sc, int64_t lds, int B, int N,
                  int K, const float* __restrict__ xt, float* __restrict__ y, int M, bool round) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int rows = blockDim.x / kLanes;
  const int r = threadIdx.x / kLanes, t = threadIdx.x % kLanes, j = t >> 3, l = t & 7;
  const int n0 = blockIdx.x * rows;
  const int n = min(n0 + r, N - 1);  // rows past N compute a copy of row N-1 and write nothing
  const int tile = blockIdx.y;
  const float* xtile = xt + static_cast<int64_t>(tile) * K * MT;

  constexpr int kChunkBytes = FMT == kFp8 ? 32 : (FMT == kFp4 ? 16 : 64);
  constexpr int kChunksPerSlab = kSlab / kChunkBytes;
  constexpr int kXSlab = kChunksPerSlab * 32 * MT * 4;  // bytes of x per stage
  const int stage_bytes = rows * kSlab + kXSlab;
  const int64_t row_bytes = FMT == kFp8 ? K : (FMT == kFp4 ? K / 2 : 2 * static_cast<int64_t>(K));
  const int nslab = static_cast<int>((row_bytes + kSlab - 1) / kSlab);
  const int nchunks = K / 32;
  const int64_t x_bytes = static_cast<int64_t>(K) * MT * 4;

  // Scales, loaded once: FP8 the one scale row of this block's rows (rows divides B), FP4 [rows][K/32].
  uint8_t* ssm = smem + kStages * stage_bytes;
  if constexpr (FMT == kFp8) {
    const int kb = (K + B - 1) / B;
    for (int i = threadIdx.x; i < kb; i += blockDim.x) ssm[i] = sc[static_cast<int64_t>(n0 / B) * lds + i];
  } else if constexpr (FMT == kFp4) {
    for (int i = threadIdx.x; i < rows * nchunks; i += blockDim.x)
      ssm[i] = sc[static_cast<int64_t>(min(n0 + i / nchunks, N - 1)) * lds + i % nchunks];
  }

  auto load_slab = [&](int i) {
    if (i < nslab) {
      uint8_t* st = smem + (i % kStages) * stage_bytes;
      for (int p = threadIdx.x; p < rows * (kSlab / 16); p += blockDim.x) {
        const int rr = p / (kSlab / 16);
        const int64_t off = static_cast<int64_t>(i) * kSlab + (p % (kSlab / 16)) * 16;
        if (off < row_bytes) {
          const int nn = min(n0 + rr, N - 1);
          cp_async16(st + rr * kSlab + (off - static_cast<int64_t>(i) * kSlab), w + nn * ldw + off);
        }
      }
      const auto* xs = reinterpret_cast<const uint8_t*>(xtile) + static_cast<int64_t>(i) * kXSlab;
      for (int p = threadIdx.x; p < kXSlab / 16; p += blockDim.x) {
        if (static_cast<int64_t>(i) * kXSlab + p * 16 < x_bytes) cp_async16(st + rows * kSlab + p * 16, xs + p * 16);
      }
    }
    cp_async_commit();  // an empty group past the end keeps the wait counts uniform
  };

  float v[MT], tot[MT];
#pragma unroll
  for (int m = 0; m < MT; ++m) v[m] = tot[m] = 0.0f;
  bool nan = false;
  // s = ((v0 + v1) + v2) + v3 from the threads j = 0..3 of lane l; tot = fma(s, fac, tot) (meaningful in j == 0).
  auto flush = [&](float fac) {
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      const float v1 = __shfl_down_sync(0xffffffffu, v[m], 8);
      const float v2 = __shfl_down_sync(0xffffffffu, v[m], 16);
      const float v3 = __shfl_down_sync(0xffffffffu, v[m], 24);
      const float s = ((v[m] + v1) + v2) + v3;
      tot[m] = __fmaf_rn(s, fac, tot[m]);
      v[m] = 0.0f;
    }
  };

#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) load_slab(i);
  for (int i = 0; i < nslab; ++i) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // slab i (and the scales) visible to all; everyone is done with slab i - 1's stage
    load_slab(i + kStages - 1);
    const uint8_t* rowp = smem + (i % kStages) * stage_bytes + r * kSlab;
    const float* xsm = reinterpret_cast<const float*>(smem + (i % kStages) * stage_bytes + rows * kSlab);
    const int cend = min(kChunksPerSlab, nchunks - i * kChunksPerSlab);
#pragma unroll 4
    for (int c = 0; c < cend; ++c) {
      const int gc = i * kChunksPerSlab + c;
      const int k0 = gc * 32;
      float wv;
      int kk;  // k within the slab
      if constexpr (FMT == kFp8) {
        const uint32_t code = rowp[c * 32 + t];
        nan |= (code & 0x7fu) == 0x7fu;
        wv = e4m3_f16(code);
        kk = c * 32 + t;
      } else if constexpr (FMT == kFp4) {
        // v0: low nibble of byte l (k = 2l), v1: low nibble of byte 8 + l (16 + 2l), v2 / v3: the high nibbles.
        const uint32_t b = rowp[c * 16 + l + 8 * (j & 1)];
        const float f = e8m0_f32(ssm[r * nchunks + gc]);
        wv = e2m1_f32((j & 2) != 0 ? (b >> 4) : (b & 15u)) * f;
        kk = c * 32 + 16 * (j & 1) + 2 * l + (j >> 1);
      } else {
        wv = __uint_as_float(static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(rowp + c * 64)[t]) << 16);
        kk = c * 32 + t;
      }
      {
        float xv[MT];
        load_x<MT>(xsm + kk * MT, xv);
#pragma unroll
        for (int m = 0; m < MT; ++m) v[m] = __fmaf_rn(wv, xv[m], v[m]);
      }
      if constexpr (FMT == kFp8) {
        if ((k0 + 32) % B == 0 || k0 + 32 >= K) {  // end of a scale tile
          const uint32_t e = ssm[k0 / B];
          // 2^(e-119): the CPU's factor for the 2^-8-scaled codes (e > 246: see linear.cuh).
          const float fac = e <= 246u ? __uint_as_float((e + 8u) << 23) : e8m0_f32(e) * 256.0f;
          flush(fac);
        }
      }
    }
  }
  cp_async_wait<0>();
  if constexpr (FMT != kFp8) flush(1.0f);

  // hsum over tot[l] of threads 0..7 of the row's warp, in the CPU's order.
  const bool row_nan = __any_sync(0xffffffffu, nan);
  float out[MT];
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    float h = tot[m] + __shfl_down_sync(0xffffffffu, tot[m], 4, 8);  // l = 0..3: tot[l] + tot[l + 4]
    h = h + __shfl_down_sync(0xffffffffu, h, 2, 8);                  // l = 0..1: h[0] + h[2], h[1] + h[3]
    h = h + __shfl_down_sync(0xffffffffu, h, 1, 8);                  // l = 0
    out[m] = h + 0.0f;                                               // + the (empty) scalar tail
  }
  if (t == 0 && n0 + r < N) {
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      const int mm = tile * MT + m;
      if (mm < M) {
        float o = row_nan ? __uint_as_float(0x7fc00000u) : out[m];
        y[static_cast<int64_t>(mm) * N + n0 + r] = round ? round_to_bf16(o) : o;
      }
    }
  }
}

// ---- host side --------------------------------------------------------------------------------------------
struct Workspace {
  std::mutex mu;
  float* p = nullptr;
  size_t bytes = 0;
};
Workspace& workspace() {
  static Workspace ws;
  return ws;
}
float* workspace_for(size_t bytes) {
  Workspace& ws = workspace();
  std::lock_guard<std::mutex> lock(ws.mu);
  if (ws.bytes < bytes) {
    if (ws.p != nullptr) {
      DI_CUDA_CHECK(cudaDeviceSynchronize());
      DI_CUDA_CHECK(cudaFree(ws.p));
      ws.p = nullptr;
      ws.bytes = 0;
    }
    const size_t want = std::max<size_t>(bytes, size_t{1} << 20);
    DI_CUDA_CHECK(cudaMalloc(&ws.p, want));
    ws.bytes = want;
  }
  return ws.p;
}

int sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    DI_CUDA_CHECK(cudaGetDevice(&dev));
    DI_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    return v;
  }();
  return n;
}

template <int FMT, int MT>
void launch(dim3 grid, int threads, const uint8_t* w, int64_t ldw, const uint8_t* s, int64_t lds, int B, int N, int K,
            const float* xt, float* y, int M, bool round, cudaStream_t stream) {
  constexpr int kChunkBytes = FMT == kFp8 ? 32 : (FMT == kFp4 ? 16 : 64);
  const int rows = threads / kLanes;
  const int64_t scale_bytes = FMT == kFp8 ? (K + B - 1) / B : (FMT == kFp4 ? static_cast<int64_t>(rows) * (K / 32) : 0);
  const int64_t smem = kStages * (rows * kSlab + (kSlab / kChunkBytes) * 32 * MT * 4) + scale_bytes;
  static int optin = 0;
  static std::once_flag once;
  std::call_once(once, [] {
    int dev = 0;
    DI_CUDA_CHECK(cudaGetDevice(&dev));
    DI_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    DI_CUDA_CHECK(cudaFuncSetAttribute(linear_kernel<FMT, MT>, cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
  });
  DI_CHECK(smem <= optin, "cuda::linear: {} bytes of shared memory needed, {} available (K = {})", smem, optin, K);
  linear_kernel<FMT, MT>
      <<<grid, threads, static_cast<size_t>(smem), stream>>>(w, ldw, s, lds, B, N, K, xt, y, M, round);
}

template <int FMT>
void launch_mt(int MT, dim3 grid, int threads, const uint8_t* w, int64_t ldw, const uint8_t* s, int64_t lds, int B,
               int N, int K, const float* xt, float* y, int M, bool round, cudaStream_t stream) {
  switch (MT) {
    case 1:
      return launch<FMT, 1>(grid, threads, w, ldw, s, lds, B, N, K, xt, y, M, round, stream);
    case 2:
      return launch<FMT, 2>(grid, threads, w, ldw, s, lds, B, N, K, xt, y, M, round, stream);
    case 4:
      return launch<FMT, 4>(grid, threads, w, ldw, s, lds, B, N, K, xt, y, M, round, stream);
    default:
      return launch<FMT, 8>(grid, threads, w, ldw, s, lds, B, N, K, xt, y, M, round, stream);
  }
}

}  // namespace

void linear_into(const Tensor& x, const ops::QWeight& qw, const ops::LinearOpts& opts, Tensor& y,
                 CUstream_st* stream_ptr) {
  const char* op = "cuda::linear";
  const cudaStream_t stream = stream_ptr;
  DI_CHECK(x.defined() && x.device() == Device::kCUDA && x.dtype() == DType::kF32 && x.dim() == 2,
           "{}: x must be a 2-D float32 CUDA tensor, got {}", op, x.describe());
  DI_CHECK(x.size(1) <= 1 || x.strides()[1] == 1, "{}: x's rows must be dense, got {}", op, x.describe());
  const Tensor& w = qw.w;
  DI_CHECK(w.defined() && w.device() == Device::kCUDA && w.dim() == 2,
           "{}: the weight must be a 2-D CUDA tensor, got {}", op, w.describe());
  DI_CHECK(w.size(1) <= 1 || w.strides()[1] == 1, "{}: the weight's rows must be dense, got {}", op, w.describe());
  const int64_t M = x.size(0), N = w.size(0), K = w.size(1);
  DI_CHECK(x.size(1) == K, "{}: input {} has K = {} but weight {} has in = {}", op, x.describe(), x.size(1),
           w.describe(), K);
  DI_CHECK(y.defined() && y.device() == Device::kCUDA && y.dtype() == DType::kF32 && y.is_contiguous() &&
               y.dim() == 2 && y.size(0) == M && y.size(1) == N,
           "{}: output {} is not a contiguous float32 CUDA [{}, {}]", op, y.describe(), M, N);
  DI_CHECK(opts.act_quant_block >= 0, "{}: act_quant_block must be >= 0, got {}", op, opts.act_quant_block);
  DI_CHECK(K % 32 == 0, "{}: the CUDA kernel needs in % 32 == 0, got {}", op, w.describe());
  DI_CHECK(N < (int64_t{1} << 31) && K < (int64_t{1} << 30) && M < (int64_t{1} << 30), "{}: {} is too large", op,
           w.describe());
  if (M == 0 || N == 0) return;
  if (K == 0) {
    DI_CUDA_CHECK(cudaMemsetAsync(y.raw(), 0, y.nbytes(), stream));
    return;
  }

  int fmt = kBf16;
  int64_t esize_num = 2, esize_den = 1;  // bytes per element = num / den
  const uint8_t* s = nullptr;
  int64_t lds = 0;
  int B = 0;
  auto check_scale = [&](int64_t rows, int64_t cols) {
    const Tensor& sct = qw.scale;
    DI_CHECK(sct.defined() && sct.device() == Device::kCUDA && sct.dtype() == DType::kE8M0 && sct.dim() == 2 &&
                 sct.size(0) == rows && sct.size(1) == cols && (cols <= 1 || sct.strides()[1] == 1),
             "{}: scale {} does not match weight {}: expected a dense CUDA float8_e8m0 [{}, {}]", op,
             sct.defined() ? sct.describe() : std::string("(undefined)"), w.describe(), rows, cols);
    s = static_cast<const uint8_t*>(sct.raw());
    lds = sct.strides()[0];
  };
  switch (w.dtype()) {
    case DType::kBF16:
      DI_CHECK(!qw.scale.defined(), "{}: a bfloat16 weight takes no scale", op);
      break;
    case DType::kE4M3:
      fmt = kFp8, esize_num = 1;
      DI_CHECK(qw.block > 0 && qw.block % 32 == 0,
               "{}: the CUDA kernel needs an E4M3 tile size that is a multiple of 32, got {}", op, qw.block);
      B = static_cast<int>(qw.block);
      check_scale((N + B - 1) / B, (K + B - 1) / B);
      break;
    case DType::kE2M1x2:
      fmt = kFp4, esize_num = 1, esize_den = 2;
      DI_CHECK(w.is_contiguous(), "{}: a packed FP4 weight must be contiguous, got {}", op, w.describe());
      check_scale(N, K / 32);
      break;
    default:
      fail("{}: unsupported weight {} on CUDA (expected bfloat16, float8_e4m3 or packed float4_e2m1)", op,
           w.describe());
  }
  const int64_t ldw = fmt == kFp4 ? K / 2 : w.strides()[0] * esize_num / esize_den;
  DI_CHECK(reinterpret_cast<uintptr_t>(w.raw()) % 16 == 0 && ldw % 16 == 0,
           "{}: the CUDA kernel needs 16-byte aligned weight rows, got {}", op, w.describe());

  const int MT = M <= 1 ? 1 : M <= 2 ? 2 : M <= 4 ? 4 : 8;
  const int64_t tiles = (M + MT - 1) / MT;
  DI_CHECK(tiles * MT < 65536, "{}: M = {} is too large for one launch", op, M);
  float* xt = workspace_for(static_cast<size_t>(tiles * MT * K) * sizeof(float));

  // x pre-pass: one block per (row, group).
  const bool quant = opts.act_quant_block > 0;
  const int64_t group = quant ? opts.act_quant_block : 2048;
  const int64_t groups = (K + group - 1) / group;
  DI_CHECK(groups < (int64_t{1} << 31), "{}: too many activation groups", op);
  prep_x_kernel<<<dim3(static_cast<unsigned>(groups), static_cast<unsigned>(tiles * MT)), threads_for(group, 256), 0,
                  stream>>>(x.data<float>(), x.strides()[0], static_cast<int>(M), static_cast<int>(K), MT, group, quant,
                            xt);
  DI_CUDA_CHECK(cudaGetLastError());

  // Rows (warps) per block: 8, halved while that leaves fewer than two blocks per multiprocessor.
  int rows = 8;
  while (rows > 1 && ((N + rows - 1) / rows) * tiles < 2 * sm_count()) rows /= 2;
  const dim3 grid(static_cast<unsigned>((N + rows - 1) / rows), static_cast<unsigned>(tiles));
  const auto* wp = static_cast<const uint8_t*>(w.raw());
  float* yp = y.data<float>();
  const int Ni = static_cast<int>(N), Ki = static_cast<int>(K), Mi = static_cast<int>(M);
  const int threads = rows * kLanes;
  if (fmt == kFp8)
    launch_mt<kFp8>(MT, grid, threads, wp, ldw, s, lds, B, Ni, Ki, xt, yp, Mi, opts.round_out_bf16, stream);
  else if (fmt == kFp4)
    launch_mt<kFp4>(MT, grid, threads, wp, ldw, s, lds, B, Ni, Ki, xt, yp, Mi, opts.round_out_bf16, stream);
  else
    launch_mt<kBf16>(MT, grid, threads, wp, ldw, s, lds, B, Ni, Ki, xt, yp, Mi, opts.round_out_bf16, stream);
  DI_CUDA_CHECK(cudaGetLastError());
}

Tensor linear(const Tensor& x, const ops::QWeight& w, const ops::LinearOpts& opts) {
  DI_CHECK(x.defined() && x.dim() == 2 && w.w.defined() && w.w.dim() == 2,
           "cuda::linear: expected x [M, K] and W [N, K]");
  Tensor y = Tensor::empty({x.size(0), w.w.size(0)}, DType::kF32, Device::kCUDA);
  linear_into(x, w, opts, y);
  return y;
}

}  // namespace deepinfer::cuda
