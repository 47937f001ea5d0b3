// GPU benchmark of cuda::sparse_attention in decode shapes (V4.1-Flash: 64 heads x 512, top-k 512 +
// window 128 = 640 gathered KV rows per token) against the device-to-device copy ceiling measured in
// the same run. Needs a CUDA GPU (prints SKIP and exits 0 without one). Each timed call gathers fresh
// rows: idx sets are rotated over a 1 GiB float32 KV pool (L2 is 50-60 MB), and the calls are captured
// into a CUDA graph so launch gaps stay out of the figures.
//   ./build/bench/bench_cuda_attention            (BENCH_ATTN_CASES=MASK: only some tables, see main)
// HG: heads per CTA of the tiled kernel (4, 8, 16), or s4 / s8 / s16: heads per cluster of the split
// (decode) kernel; auto is what the op picks. Three more tables time the model's decode cases: a small
// L2-resident KV table (window + compressed rows, as the model builds one per layer call) with 512, 32
// or no valid picks (a long context, 128 tokens at ratio 4, a layer without compression).
// GB/s counts the bytes the op must move at least once: the gathered KV rows (T * K * D * 4), q and
// the output. Anchor: FlashMLA's sparse decode reaches ~3,000 GB/s on H800 with BF16/FP8 KV and tensor
// cores; this kernel keeps FP32 KV and FP32/FP64 CUDA-core math to replay the CPU's order.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda/attention.cuh"
#include "cuda/device.h"
#include "cuda/model_ops.cuh"
#include "cuda/topk.cuh"
#include "cuda_bench_util.cuh"
#include "deepinfer/dtype.h"
#include "deepinfer/error.h"

namespace di = deepinfer;

namespace {

#define CK(expr) DI_CUDA_CHECK(expr)

using deepinfer::bench::next_u32;
using deepinfer::bench::time_graph;

di::Tensor random_bf16_grid(const std::vector<int64_t>& shape, float sigma) {
  di::Tensor h = di::Tensor::empty(shape, di::DType::kF32);
  float* p = h.data<float>();
  for (int64_t i = 0; i < h.numel(); ++i) {
    // Sum of uniforms ~ normal enough for a benchmark.
    float s = 0.0f;
    for (int j = 0; j < 4; ++j) s += static_cast<float>(next_u32() % 65536) / 65536.0f - 0.5f;
    p[i] = di::round_bf16(s * sigma * 1.7f);
  }
  return di::cuda::copy_to_device(h);
}

// The indexer's top-k at decode (k = 512 picks listed by index, as V4.1's indexers ask) over rows of n index keys
// (a context of 4n tokens at ratio 4), in the three forms of cuda::topk_set_staging: the row over a cluster of 8 CTAs
// (from 8k keys), staged in one block's shared memory (up to ~57k keys), read from global memory on every pass. A form
// that does not apply to a row falls back to the next. Anchor: a device-to-device copy of the same rows (the bytes a
// one-pass kernel would move), timed in the same graph form. Scores on a BF16 grid, as index_scores leaves them.
void topk_table(cudaStream_t st) {
  constexpr int kCalls = 16;
  const int64_t k = 512;
  std::printf("\ntopk_rows, k = %lld by index (the indexer's decode picks), us per call\n", static_cast<long long>(k));
  std::printf("%4s %8s %10s %10s %10s %10s\n", "T", "n", "cluster", "staged", "global", "copy");
  for (int64_t T : {1, 4}) {
    for (int64_t n : {4096, 8192, 16384, 32768, 57344, 65536, 131072, 262144}) {
      const di::Tensor scores = random_bf16_grid({T, n}, 1.0f);
      di::Tensor out = di::Tensor::empty({T, k}, di::DType::kI32, di::Device::kCUDA);
      di::Tensor copy = di::Tensor::empty({T, n}, di::DType::kF32, di::Device::kCUDA);
      double us[3];
      for (int stage : {2, 1, 0}) {
        di::cuda::topk_set_staging(stage);
        di::cuda::topk_rows_into(scores, k, true, out, reinterpret_cast<CUstream_st*>(st));  // set-up outside capture
        CK(cudaStreamSynchronize(st));
        us[2 - stage] = 1e3 * time_graph(st, kCalls, [&](int) {
                          di::cuda::topk_rows_into(scores, k, true, out, reinterpret_cast<CUstream_st*>(st));
                        });
      }
      di::cuda::topk_set_staging(-1);
      const double copy_us =
          1e3 * time_graph(st, kCalls, [&](int) {
            CK(cudaMemcpyAsync(copy.data<float>(), scores.data<float>(), static_cast<size_t>(T * n) * sizeof(float),
                               cudaMemcpyDeviceToDevice, st));
          });
      std::printf("%4lld %8lld %10.1f %10.1f %10.1f %10.1f\n", static_cast<long long>(T), static_cast<long long>(n),
                  us[0], us[1], us[2], copy_us);
    }
  }
}

// The indexer's decode scores (V4.1-Flash: 64 heads of 128, one query row or four) over n keys of one table, with
// the decode kernel's groups of 8, 16 and 32 keys a warp (cuda::index_scores_set_group). Timed eagerly (each call
// allocates its output), 20 calls between two events after a warm-up. Anchor: the FP32 issue floor of the contract's
// products (a multiply and an add each: T x n x 64 x 128 x 2 instructions over every SM's 4 schedulers at 1.98 GHz,
// the H100's and H200's boost clock) and the read of the keys at the copy ceiling.
void index_table(cudaStream_t st, double copy_gbs, int sms) {
  constexpr int kCalls = 20;
  const int64_t nh = 64, d = 128;
  std::printf("\nindex_scores decode (64 heads x 128, BF16-rounded), us per call\n");
  std::printf("%4s %8s %10s %10s %10s %10s %10s\n", "T", "n", "group 8", "group 16", "group 32", "fp32 floor",
              "keys read");
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  const di::cuda::StreamScope scope(reinterpret_cast<CUstream_st*>(st));  // the ops' launches go to st
  for (int64_t T : {1, 4}) {
    for (int64_t n : {1024, 4096, 8192, 16384, 32768, 65536, 131072}) {
      const di::Tensor q = random_bf16_grid({T, nh, d}, 1.0f);
      const di::Tensor keys = random_bf16_grid({n, d}, 1.0f);
      const di::Tensor w = random_bf16_grid({T, nh}, 0.05f);
      const di::ops::KeyVisibility vis{di::Tensor(), 4 * n - 1, 4};
      double us[3];
      int col = 0;
      for (int group : {8, 16, 32}) {
        di::cuda::index_scores_set_group(group);
        di::cuda::index_scores(q, keys, w, vis, true);  // warm-up: the kernel's one-time set-up
        CK(cudaStreamSynchronize(st));
        CK(cudaEventRecord(a, st));
        for (int c = 0; c < kCalls; ++c) di::cuda::index_scores(q, keys, w, vis, true);
        CK(cudaEventRecord(b, st));
        CK(cudaEventSynchronize(b));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, a, b));
        us[col++] = 1e3 * ms / kCalls;
      }
      di::cuda::index_scores_set_group(0);
      const double floor_us = static_cast<double>(T) * n * nh * d * 2 / 32 / (sms * 4 * 1.98e9) * 1e6;
      const double read_us = static_cast<double>(n) * d * 4 / (copy_gbs / 2 * 1e3);
      std::printf("%4lld %8lld %10.1f %10.1f %10.1f %10.1f %10.1f\n", static_cast<long long>(T),
                  static_cast<long long>(n), us[0], us[1], us[2], floor_us, read_us);
    }
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
}

}  // namespace

int main() {
  if (di::cuda::device_count() == 0) {
    std::printf("SKIP: no CUDA device\n");
    return 0;
  }
  di::cuda::init();
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));

  // ---- ceiling: a device-to-device copy over 1 GiB ------------------------------------------------------
  const double copy_gbs = deepinfer::bench::copy_ceiling_gbs(st, size_t{1} << 30);
  std::printf("HBM ceiling: D2D copy %.0f GB/s (read + write)\n", copy_gbs);

  const int64_t H = 64, D = 512, K = 640;
  const int64_t N = (int64_t{1} << 30) / (D * 4);  // 1 GiB of float32 KV rows
  // The pool: one random 64 MiB chunk, repeated (host generation of 1 GiB would dominate the run).
  di::Tensor kv = di::Tensor::empty({N, D}, di::DType::kF32, di::Device::kCUDA);
  {
    const int64_t chunk = (int64_t{64} << 20) / (D * 4);
    const di::Tensor c = random_bf16_grid({chunk, D}, 1.0f);
    for (int64_t r = 0; r < N; r += chunk)
      CK(cudaMemcpy(kv.data<float>() + r * D, c.data<float>(), static_cast<size_t>(std::min(chunk, N - r) * D * 4),
                    cudaMemcpyDeviceToDevice));
  }
  const di::Tensor sink = random_bf16_grid({H}, 1.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  constexpr int kCalls = 16;

  std::printf("\nsparse_attention decode: H=%lld D=%lld K=%lld (fp32 KV pool %lld rows), bf16 probs, rounded out\n",
              static_cast<long long>(H), static_cast<long long>(D), static_cast<long long>(K),
              static_cast<long long>(N));
  std::printf("%6s %4s %10s %10s %8s %9s\n", "T", "HG", "us/call", "GB/s", "%copy", "TFLOP/s");
  // BENCH_ATTN_CASES: a bit mask of the tables to run (1: the 1 GiB pool, 2 / 4 / 8: the model's decode cases with
  // 512, 32 or no valid picks, 16: the indexer's top-k, 32: its scores); all by default. Lets a profiler's first launch
  // be the case wanted.
  const char* cases_env = std::getenv("BENCH_ATTN_CASES");
  const int cases = cases_env != nullptr ? std::atoi(cases_env) : 63;
  for (int64_t T : {1, 2, 4, 8, 16, 32, 64, 128}) {
    if ((cases & 1) == 0) break;
    const di::Tensor q = random_bf16_grid({T, H, D}, 1.0f);
    std::vector<di::Tensor> idx(kCalls);
    for (int c = 0; c < kCalls; ++c) {
      di::Tensor h = di::Tensor::empty({T, K}, di::DType::kI32);
      for (int64_t i = 0; i < T * K; ++i) h.data<int32_t>()[i] = static_cast<int32_t>(next_u32() % N);
      idx[c] = di::cuda::copy_to_device(h);
    }
    di::Tensor out = di::Tensor::empty({T, H, D}, di::DType::kF32, di::Device::kCUDA);
    const double bytes = static_cast<double>(T) * K * D * 4 + 2.0 * T * H * D * 4 + T * K * 4;
    const double flops = 4.0 * T * H * K * D;
    for (int hg : {0, 4, 8, 16, -4, -8, -16}) {
      if (hg < 0 && T > 16) continue;  // the split kernel is for decode-sized T
      const double ms = time_graph(st, kCalls, [&](int c) {
        di::cuda::sparse_attention_into(q, kv, idx[c], sink, scale, true, true, out, reinterpret_cast<CUstream_st*>(st),
                                        hg);
      });
      const double gbs = bytes / ms / 1e6;
      char hgs[8];
      std::snprintf(hgs, sizeof hgs, "%s",
                    hg == 0 ? "auto" : (hg < 0 ? "s" + std::to_string(-hg) : std::to_string(hg)).c_str());
      std::printf("%6lld %4s %10.1f %10.0f %7.1f%% %9.2f\n", static_cast<long long>(T), hgs, ms * 1e3, gbs,
                  100.0 * gbs / copy_gbs, flops / ms / 1e9);
    }
  }
  std::printf("\nanchor: FlashMLA sparse decode ~3000 GB/s on H800 (BF16/FP8 KV, tensor cores)\n");

  // ---- the model's decode case: a fresh, L2-resident table (window 128 + 1024 compressed rows), each row
  // the full window then up to 512 ascending picks (a long context: 512 valid; a context of 128 tokens at
  // ratio 4: 32 valid, the rest -1; a layer without compression: the window alone, K = 128) -----------------
  struct Case {
    int64_t K, picks;
  };
  int case_bit = 2;
  for (const Case cs : {Case{K, K - 128}, Case{K, 32}, Case{128, 0}}) {
    const bool run_case = (cases & case_bit) != 0;
    case_bit <<= 1;
    if (!run_case) continue;
    const int64_t W = 128, NC = 1024, NT = W + NC, KC = cs.K;
    const di::Tensor table = random_bf16_grid({NT, D}, 1.0f);
    std::printf(
        "\nsparse_attention decode, L2-resident table (%lld rows) as in the model, K=%lld (window %lld + "
        "%lld valid picks)\n",
        static_cast<long long>(NT), static_cast<long long>(KC), static_cast<long long>(W),
        static_cast<long long>(cs.picks));
    std::printf("%6s %4s %10s\n", "T", "HG", "us/call");
    for (int64_t T : {1, 2, 4, 8}) {
      const di::Tensor q = random_bf16_grid({T, H, D}, 1.0f);
      di::Tensor h = di::Tensor::empty({T, KC}, di::DType::kI32);
      for (int64_t t = 0; t < T; ++t) {
        int32_t* row = h.data<int32_t>() + t * KC;
        for (int64_t i = 0; i < W; ++i) row[i] = static_cast<int32_t>(i);
        int64_t need = cs.picks, o = W;
        for (int64_t c = 0; c < NC; ++c)  // ascending picks (selection sampling)
          if (static_cast<int64_t>(next_u32() % static_cast<uint32_t>(NC - c)) < need) {
            row[o++] = static_cast<int32_t>(W + c);
            --need;
          }
        for (; o < KC; ++o) row[o] = -1;
      }
      const di::Tensor idx = di::cuda::copy_to_device(h);
      di::Tensor out = di::Tensor::empty({T, H, D}, di::DType::kF32, di::Device::kCUDA);
      for (int hg : {0, 4, 8, 16, -4, -8, -16}) {
        const double ms = time_graph(st, kCalls, [&](int) {
          di::cuda::sparse_attention_into(q, table, idx, sink, scale, true, true, out,
                                          reinterpret_cast<CUstream_st*>(st), hg);
        });
        std::printf("%6lld %4s %10.1f\n", static_cast<long long>(T),
                    hg == 0 ? "auto" : (hg < 0 ? "s" + std::to_string(-hg) : std::to_string(hg)).c_str(), ms * 1e3);
      }
    }
  }
  if ((cases & 16) != 0) topk_table(st);
  if ((cases & 32) != 0) index_table(st, copy_gbs, prop.multiProcessorCount);
  CK(cudaStreamDestroy(st));
  return 0;
}
