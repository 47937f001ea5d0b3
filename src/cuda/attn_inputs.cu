// CUDA attention inputs: the q and kv low-rank norms, the kv RoPE and FP8 fake quant in one launch. Contract in
// attn_inputs.cuh.
//
// Why one kernel: at decode each of the four ops is a one-block launch of a few microseconds, four per layer. The
// arithmetic is the ops' own device functions (norm_weights_vec / norm_row_apply, rope_rotate, warp_fake_quant_fp8), so
// the bits are theirs: the norm groups its FP64 sum by the thread count rms_norm would launch for that row
// (norm_vec_threads), RoPE and the fake quant are elementwise or an order-independent max.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "cuda/attn_inputs.cuh"
#include "cuda/common.cuh"
#include "cuda/device.h"
#include "cuda/fp_decode.cuh"
#include "cuda/quant.cuh"
#include "cuda/rms_norm.cuh"
#include "cuda/rope.cuh"

namespace deepinfer::cuda {

namespace {

// One half's rows: row t at x + t * stride, `cols` = 4 * n4 values, normalised by the block's first nt threads
// (rms_norm's launch width for it) into y (contiguous).
struct NormRows {
  const float* x;
  int64_t stride, cols;
  int n4, nt;
  float* y;
};

struct AttnArgs {
  NormRows q, kv;
  float eps;
  bool round;
  bool early_w;      // the norm weights loaded before griddepcontrol.wait (norm_prefetch)
  int64_t rope_dim;  // RoPE on kv's last rope_dim columns (0: none)
  RopeRows rope;
  int64_t quant_end, quant_block;  // fake_quant_fp8 of kv's [0, quant_end) (quant_block 0: none)
};

// Row t of h into norm_row_apply's layout (every load issued before the first use).
__device__ __forceinline__ void load_row(const NormRows& h, int64_t t, float4 (&v)[kNormVecMax]) {
  const float4* xr = reinterpret_cast<const float4*>(h.x + t * h.stride);
  const int tid = static_cast<int>(threadIdx.x);
#pragma unroll
  for (int k = 0; k < kNormVecMax; ++k) {
    const int c = tid + k * h.nt;
    v[k] = tid < h.nt && c < h.n4 ? xr[c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
}

// Block (t, 0) normalises row t of qa into qr; block (t, 1) row t of kva into shared memory, rotates its RoPE
// tail, fake-quantises [0, quant_end) one group per warp, and writes it to kv. blockDim = the larger nt.
template <typename WQ, typename WK>
__global__ void __launch_bounds__(kNormVecThreads) attn_inputs_kernel(AttnArgs a, const WQ* q_w, const WK* kv_w) {
  // The half's norm weight first (norm_weights_vec: before the wait unless a.early_w is off).
  float4 wv[kNormVecMax];
  const bool q_half = blockIdx.y == 0;
  auto weights = [&] {
    if (q_half)
      norm_weights_vec(wv, a.q.n4, a.q.nt, q_w);
    else
      norm_weights_vec(wv, a.kv.n4, a.kv.nt, kv_w);
  };
  if (a.early_w) weights();
  pdl_wait();
  pdl_launch_dependents();
  const int64_t t = blockIdx.x;
  const int tid = static_cast<int>(threadIdx.x), nthreads = static_cast<int>(blockDim.x);
  float4 v[kNormVecMax];
  if (q_half) {
    load_row(a.q, t, v);
    if (!a.early_w) weights();
    norm_row_apply(v, wv, a.q.cols, q_w != nullptr, a.eps, a.round);
    float4* yr = reinterpret_cast<float4*>(a.q.y + t * a.q.cols);
#pragma unroll
    for (int k = 0; k < kNormVecMax; ++k) {
      const int c = tid + k * a.q.nt;
      if (tid < a.q.nt && c < a.q.n4) yr[c] = v[k];
    }
    return;
  }
  extern __shared__ float4 row4[];  // the kv row, a.kv.n4 float4
  const NormRows& h = a.kv;
  load_row(h, t, v);
  if (!a.early_w) weights();
  norm_row_apply(v, wv, h.cols, kv_w != nullptr, a.eps, a.round);
#pragma unroll
  for (int k = 0; k < kNormVecMax; ++k) {
    const int c = tid + k * h.nt;
    if (tid < h.nt && c < h.n4) row4[c] = v[k];
  }
  __syncthreads();
  float* row = reinterpret_cast<float*>(row4);
  const int64_t half = a.rope_dim / 2;
  if (half > 0) {  // apply_rope with one head of the row's width: rope_kernel's rotation
    const int64_t p = rope_position(a.rope, t);
    float* r = row + (h.cols - a.rope_dim);
    for (int64_t i = tid; i < half; i += nthreads) {
      const float2 y = rope_rotate(r[2 * i], r[2 * i + 1], a.rope.cs[p * half + i], a.rope.sn[p * half + i], a.round);
      r[2 * i] = y.x;
      r[2 * i + 1] = y.y;
    }
    __syncthreads();
  }
  if (a.quant_block > 0) {
    const int64_t groups = (a.quant_end + a.quant_block - 1) / a.quant_block;
    for (int64_t g = tid >> 5; g < groups; g += nthreads >> 5) {
      const int64_t c0 = g * a.quant_block;
      warp_fake_quant_fp8(row, c0, min(c0 + a.quant_block, a.quant_end), tid & 31);
    }
    __syncthreads();
  }
  float4* yr = reinterpret_cast<float4*>(h.y + t * h.cols);
  for (int c = tid; c < h.n4; c += nthreads) yr[c] = row4[c];
}

// fn(pointer) with w's data typed by its dtype (float nullptr when undefined).
template <typename Fn>
void with_weight(const Tensor& w, Fn&& fn) {
  if (w.defined() && w.dtype() == DType::kBF16)
    fn(static_cast<const __nv_bfloat16*>(w.data<__nv_bfloat16>()));
  else
    fn(w.defined() ? static_cast<const float*>(w.data<float>()) : static_cast<const float*>(nullptr));
}

}  // namespace

ops::AttnInputs attn_input_norms(const Tensor& qa, const Tensor& q_w, const Tensor& kva, const Tensor& kv_w, float eps,
                                 bool round, int64_t rope_dim, const int64_t* positions, const ops::RopeFreqs& f,
                                 int64_t quant_end, int64_t quant_block) {
  const char* op = "cuda::attn_input_norms";
  DI_CHECK(qa.defined() && kva.defined() && qa.dim() == 2 && kva.dim() == 2,
           "{}: qa and kva must be 2-D [T, width], got {} and {}", op,
           qa.defined() ? qa.describe() : std::string("undefined"),
           kva.defined() ? kva.describe() : std::string("undefined"));
  const Rows q = as_rows(qa, op), kv = as_rows(kva, op);
  check_norm_weight(q_w, q.cols, op);
  check_norm_weight(kv_w, kv.cols, op);
  DI_CHECK(q.rows == kv.rows, "{}: qa has {} rows, kva {}", op, q.rows, kv.rows);
  DI_CHECK(
      rope_dim >= 0 && rope_dim % 2 == 0 && rope_dim <= kv.cols && static_cast<int64_t>(f.freq.size()) * 2 == rope_dim,
      "{}: rope dim {} (table for {}) does not fit kv rows of {}", op, rope_dim, f.freq.size() * 2, kv.cols);
  DI_CHECK(quant_block <= 0 || (0 <= quant_end && quant_end <= kv.cols),
           "{}: quant columns [0, {}) out of range for kv rows of {}", op, quant_end, kv.cols);
  const int64_t T = q.rows;
  const bool fused = T > 0 && q.cols > 0 && kv.cols > 0 && norm_vec_fits(q.data, q.cols, q.row_stride, q_w) &&
                     norm_vec_fits(kv.data, kv.cols, kv.row_stride, kv_w);
  if (!fused) {  // the ops one after the other: the same bits
    ops::AttnInputs r{cuda::rms_norm(qa, q_w, eps, round), cuda::rms_norm(kva, kv_w, eps, round)};
    if (T > 0 && rope_dim > 0) cuda::apply_rope(r.kv, kv.cols, rope_dim, positions, f, false, round);
    if (quant_block > 0) cuda::fake_quant_fp8(r.kv, 0, quant_end, quant_block);
    return r;
  }
  DI_CHECK(T < (int64_t{1} << 31), "{}: {} rows is too many for one launch", op, T);
  ops::AttnInputs out{Tensor::empty({T, q.cols}, DType::kF32, Device::kCUDA),
                      Tensor::empty({T, kv.cols}, DType::kF32, Device::kCUDA)};
  AttnArgs a;
  a.q = NormRows{
      q.data, q.row_stride, q.cols, static_cast<int>(q.cols / 4), norm_vec_threads(q.cols), out.qr.data<float>()};
  a.kv = NormRows{
      kv.data, kv.row_stride, kv.cols, static_cast<int>(kv.cols / 4), norm_vec_threads(kv.cols), out.kv.data<float>()};
  a.eps = eps;
  a.round = round;
  a.early_w = norm_prefetch();
  a.rope_dim = rope_dim;
  a.quant_end = quant_end;
  a.quant_block = std::max<int64_t>(quant_block, 0);
  const int threads = std::max(a.q.nt, a.kv.nt);
  const auto smem = static_cast<int64_t>(kv.cols * sizeof(float));
  const dim3 grid(static_cast<unsigned>(T), 2);
  auto launch = [&](const RopeRows& rope) {
    a.rope = rope;
    with_weight(q_w, [&](auto* wq) {
      with_weight(kv_w, [&](auto* wk) {
        using WQ = std::remove_const_t<std::remove_pointer_t<decltype(wq)>>;
        using WK = std::remove_const_t<std::remove_pointer_t<decltype(wk)>>;
        launch_pdl(attn_inputs_kernel<WQ, WK>, grid, threads, smem, nullptr, a, wq, wk);
      });
    });
    DI_CUDA_CHECK(cudaGetLastError());
  };
  if (rope_dim > 0)
    with_rope_rows(f, positions, T, op, launch);
  else
    launch(RopeRows{});
  return out;
}

}  // namespace deepinfer::cuda
