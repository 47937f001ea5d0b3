// CUDA sparse attention (gathered KV, online softmax in 64-entry tiles). Contract in attention.cuh.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda/attention.cuh"
#include "cuda/common.cuh"
#include "cuda/device.h"

namespace deepinfer::cuda {

namespace {

constexpr int kTile = 64;      // entries per online-softmax tile (the CPU's)
constexpr int kThreads = 256;  // 8 warps
constexpr int kMaxD = 512;     // two output columns per thread

__device__ __forceinline__ float exp_f(float x) { return __double2float_rn(exp(static_cast<double>(x))); }

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// Shared memory (floats): kv tile [64][D + 4] | q [HG][D] | pv [64][HG] | s [HG][64] | idx [64] | m, l, resc [HG].
__host__ __device__ constexpr int64_t smem_floats(int64_t D, int HG) {
  return kTile * (D + 4) + HG * D + kTile * HG + HG * kTile + kTile + 3 * HG;
}

template <int HG>
__global__ void __launch_bounds__(kThreads)
    sparse_attn_kernel(const float* __restrict__ q, const float* __restrict__ kv, const int32_t* __restrict__ idx,
                       const float* __restrict__ sink, float* __restrict__ out, int H, int D, int N, int K, float scale,
                       bool bf16_probs, bool round) {
  static_assert(HG == 4 || HG == 8 || HG == 16, "heads per CTA");
  constexpr int R = HG / 4;  // heads per thread in the score phase (64 entries x HG heads over 256 threads)
  extern __shared__ __align__(16) float smem[];
  const int LD = D + 4;
  float* kvs = smem;
  float* qs = kvs + kTile * LD;
  float* pvs = qs + HG * D;      // [i][h]
  float* ss = pvs + kTile * HG;  // [h][i]
  int* ids = reinterpret_cast<int*>(ss + HG * kTile);
  float* m_s = reinterpret_cast<float*>(ids + kTile);
  float* l_s = m_s + HG;
  float* r_s = l_s + HG;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int h0 = blockIdx.x * HG;
  const int64_t t = blockIdx.y;
  const int nh = min(HG, H - h0);  // heads of this CTA

  for (int e = tid; e < HG * D; e += kThreads) {
    const int h = e / D, d = e % D;
    qs[e] = h < nh ? q[(t * H + h0 + h) * D + d] : 0.0f;
  }
  if (tid < HG) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0.0f;
  }
  const int d0 = tid, d1 = tid + kThreads;
  double acc[HG][2];
#pragma unroll
  for (int h = 0; h < HG; ++h) acc[h][0] = acc[h][1] = 0.0;

  const int32_t* list = idx + t * K;
  const int D4 = D / 4;
  for (int base = 0; base < K; base += kTile) {
    const int n = min(kTile, K - base);
    if (tid < kTile) {
      int j = tid < n ? list[base + tid] : -1;
      if (j >= N) j = -1;  // out of range: treated as empty (the CPU op rejects it up front)
      ids[tid] = j;
    }
    __syncthreads();
    // Gather the tile's rows.
    for (int c = tid; c < kTile * D4; c += kThreads) {
      const int i = c / D4, c4 = c % D4;
      const int j = ids[i];
      if (j >= 0) cp_async16(kvs + i * LD + c4 * 4, kv + static_cast<int64_t>(j) * D + c4 * 4);
    }
    cp_async_wait_all();
    __syncthreads();

    // Scores: thread (entry i, heads hb .. hb + R - 1), sequential fp32 dot as the CPU.
    {
      const int i = tid & (kTile - 1);
      const int hb = (tid >> 6) * R;
      const bool valid = ids[i] >= 0;
      float dot[R];
#pragma unroll
      for (int r = 0; r < R; ++r) dot[r] = 0.0f;
      if (valid && hb < nh) {
        const float4* kr = reinterpret_cast<const float4*>(kvs + i * LD);
        for (int c = 0; c < D4; ++c) {
          const float4 k4 = kr[c];
#pragma unroll
          for (int r = 0; r < R; ++r) {
            const float4 q4 = reinterpret_cast<const float4*>(qs + (hb + r) * D)[c];
            float a = dot[r];
            a = __fadd_rn(a, __fmul_rn(q4.x, k4.x));
            a = __fadd_rn(a, __fmul_rn(q4.y, k4.y));
            a = __fadd_rn(a, __fmul_rn(q4.z, k4.z));
            a = __fadd_rn(a, __fmul_rn(q4.w, k4.w));
            dot[r] = a;
          }
        }
      }
#pragma unroll
      for (int r = 0; r < R; ++r) ss[(hb + r) * kTile + i] = valid ? __fmul_rn(dot[r], scale) : -INFINITY;
    }
    __syncthreads();

    // Softmax step: one warp per head (warps 0..7 take heads w, w + 8).
    for (int h = warp; h < HG; h += kThreads / 32) {
      if (h >= nh) {
        if (lane == 0) r_s[h] = 1.0f;
        pvs[lane * HG + h] = 0.0f;
        pvs[(lane + 32) * HG + h] = 0.0f;
        continue;
      }
      const float s0 = ss[h * kTile + lane], s1 = ss[h * kTile + lane + 32];
      float tmax = fmaxf(s0, s1);
      for (int o = 16; o > 0; o >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, o));
      const float m_old = m_s[h];
      const float m_new = fmaxf(m_old, tmax);
      if (m_new == -INFINITY) {  // nothing valid yet: the CPU skips the tile
        if (lane == 0) r_s[h] = 1.0f;
        pvs[lane * HG + h] = 0.0f;
        pvs[(lane + 32) * HG + h] = 0.0f;
        continue;
      }
      const float p0 = s0 == -INFINITY ? 0.0f : exp_f(__fsub_rn(s0, m_new));
      const float p1 = s1 == -INFINITY ? 0.0f : exp_f(__fsub_rn(s1, m_new));
      pvs[lane * HG + h] = bf16_probs ? round_to_bf16(p0) : p0;
      pvs[(lane + 32) * HG + h] = bf16_probs ? round_to_bf16(p1) : p1;
      ss[h * kTile + lane] = p0;  // the probabilities replace the scores for the sequential sum
      ss[h * kTile + lane + 32] = p1;
      __syncwarp();
      if (lane == 0) {
        float4 pv4[kTile / 4];
#pragma unroll
        for (int c = 0; c < kTile / 4; ++c) pv4[c] = reinterpret_cast<const float4*>(ss + h * kTile)[c];
        float tsum = 0.0f;  // entries past n and empty ones are exact zeros: adding them changes nothing
#pragma unroll
        for (int c = 0; c < kTile / 4; ++c) {
          tsum = __fadd_rn(tsum, pv4[c].x);
          tsum = __fadd_rn(tsum, pv4[c].y);
          tsum = __fadd_rn(tsum, pv4[c].z);
          tsum = __fadd_rn(tsum, pv4[c].w);
        }
        const float rescale = exp_f(__fsub_rn(m_old, m_new));
        r_s[h] = rescale;
        l_s[h] = __fadd_rn(__fmul_rn(l_s[h], rescale), tsum);
        m_s[h] = m_new;
      }
    }
    __syncthreads();

    // P.V in FP64: rescale, then entries in order.
#pragma unroll
    for (int h = 0; h < HG; ++h) {
      const double rs = static_cast<double>(r_s[h]);
      acc[h][0] = __dmul_rn(acc[h][0], rs);
      acc[h][1] = __dmul_rn(acc[h][1], rs);
    }
    for (int i = 0; i < n; ++i) {
      if (ids[i] < 0) continue;  // uniform across the block
      const float* vr = kvs + i * LD;
      const double v0 = d0 < D ? static_cast<double>(vr[d0]) : 0.0;
      const double v1 = d1 < D ? static_cast<double>(vr[d1]) : 0.0;
#pragma unroll
      for (int c = 0; c < HG / 4; ++c) {
        const float4 p4 = reinterpret_cast<const float4*>(pvs + i * HG)[c];
        const float pp[4] = {p4.x, p4.y, p4.z, p4.w};
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const double p = static_cast<double>(pp[u]);
          acc[c * 4 + u][0] = __fma_rn(p, v0, acc[c * 4 + u][0]);
          acc[c * 4 + u][1] = __fma_rn(p, v1, acc[c * 4 + u][1]);
        }
      }
    }
    __syncthreads();  // the next tile overwrites ids, kvs, pvs
  }

#pragma unroll
  for (int h = 0; h < HG; ++h) {
    if (h >= nh) continue;
    const float m = m_s[h];
    float* o = out + (t * H + h0 + h) * D;
    if (m == -INFINITY) {
      if (d0 < D) o[d0] = 0.0f;
      if (d1 < D) o[d1] = 0.0f;
      continue;
    }
    const float l = __fadd_rn(l_s[h], exp_f(__fsub_rn(sink[h0 + h], m)));
    if (d0 < D) {
      const float v = __fdiv_rn(__double2float_rn(acc[h][0]), l);
      o[d0] = round ? round_to_bf16(v) : v;
    }
    if (d1 < D) {
      const float v = __fdiv_rn(__double2float_rn(acc[h][1]), l);
      o[d1] = round ? round_to_bf16(v) : v;
    }
  }
}

void check_dev(const Tensor& t, DType dt, const char* what) {
  DI_CHECK(t.defined() && t.device() == Device::kCUDA && t.dtype() == dt && t.is_contiguous(),
           "cuda::sparse_attention: {} must be a contiguous {} CUDA tensor, got {}", what, dtype_name(dt),
           t.defined() ? t.describe() : std::string("undefined"));
}

template <int HG>
void launch(const Tensor& q, const Tensor& kv, const Tensor& idx, const Tensor& sink, float scale, bool bf16_probs,
            bool round, Tensor& out, cudaStream_t stream) {
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2);
  const size_t smem = static_cast<size_t>(smem_floats(D, HG)) * sizeof(float);
  static const bool configured = [] {  // per instantiation, once, for the largest D
    DI_CUDA_CHECK(cudaFuncSetAttribute(sparse_attn_kernel<HG>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem_floats(kMaxD, HG) * sizeof(float))));
    return true;
  }();
  (void)configured;
  const dim3 grid(static_cast<unsigned>((H + HG - 1) / HG), static_cast<unsigned>(T));
  sparse_attn_kernel<HG><<<grid, kThreads, smem, stream>>>(q.data<float>(), kv.data<float>(), idx.data<int32_t>(),
                                                           sink.data<float>(), out.data<float>(), static_cast<int>(H),
                                                           static_cast<int>(D), static_cast<int>(kv.size(0)),
                                                           static_cast<int>(idx.size(1)), scale, bf16_probs, round);
  DI_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void sparse_attention_into(const Tensor& q, const Tensor& kv, const Tensor& idx, const Tensor& sink, float scale,
                           bool bf16_probs, bool round, Tensor& out, CUstream_st* stream, int heads_per_cta) {
  check_dev(q, DType::kF32, "q");
  check_dev(kv, DType::kF32, "kv");
  check_dev(idx, DType::kI32, "idx");
  check_dev(sink, DType::kF32, "sink");
  check_dev(out, DType::kF32, "out");
  DI_CHECK(q.dim() == 3 && kv.dim() == 2 && idx.dim() == 2, "cuda::sparse_attention: q {} kv {} idx {}", q.describe(),
           kv.describe(), idx.describe());
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2);
  DI_CHECK(kv.size(1) == D && idx.size(0) == T && sink.numel() == H && out.numel() == T * H * D,
           "cuda::sparse_attention: shapes q {} kv {} idx {} sink {} out {}", q.describe(), kv.describe(),
           idx.describe(), sink.describe(), out.describe());
  DI_CHECK(D % 4 == 0 && D <= kMaxD && D > 0, "cuda::sparse_attention: head dim {} must be a multiple of 4 in [4, {}]",
           D, kMaxD);
  DI_CHECK(T < 65536 && kv.size(0) < (int64_t{1} << 31) && idx.size(1) < (int64_t{1} << 31),
           "cuda::sparse_attention: too large: q {} kv {} idx {}", q.describe(), kv.describe(), idx.describe());
  DI_CHECK(reinterpret_cast<uintptr_t>(kv.raw()) % 16 == 0, "cuda::sparse_attention: kv rows must be 16-byte aligned");
  if (T == 0 || H == 0) return;
  int hg = heads_per_cta;
  if (hg == 0) {
    // Enough CTAs to fill the GPU (132 SMs, one 512-wide CTA per SM) with the most heads per CTA.
    const int64_t target = 132;
    hg = T * ((H + 15) / 16) >= target ? 16 : (T * ((H + 7) / 8) >= target ? 8 : 4);
  }
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  if (hg == 16)
    launch<16>(q, kv, idx, sink, scale, bf16_probs, round, out, s);
  else if (hg == 8)
    launch<8>(q, kv, idx, sink, scale, bf16_probs, round, out, s);
  else if (hg == 4)
    launch<4>(q, kv, idx, sink, scale, bf16_probs, round, out, s);
  else
    fail("cuda::sparse_attention: heads per CTA must be 4, 8 or 16, got {}", hg);
}

Tensor sparse_attention(const Tensor& q, const Tensor& kv, const Tensor& idx, const Tensor& sink, float scale,
                        bool bf16_probs, bool round) {
  DI_CHECK(q.defined() && q.dim() == 3, "cuda::sparse_attention: q must be [T, H, D]");
  Tensor out = Tensor::empty(q.shape(), DType::kF32, Device::kCUDA);
  sparse_attention_into(q, kv, idx, sink, scale, bf16_probs, round, out);
  return out;
}

}  // namespace deepinfer::cuda
