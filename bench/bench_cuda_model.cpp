// End-to-end GPU benchmark of a checkpoint on the CUDA backend (issue 8): decode tokens/s per
// sequence and in total at several batch sizes, and prefill tokens/s of one long prompt, each against
// the memory roofline: the bytes a step must move (the weights it touches plus the sequence state
// it reads) divided by the device-to-device copy bandwidth measured in the same run.
//
//   ./bench_cuda_model CKPT_DIR [--batches 1,8,32,128,256] [--context 128] [--steps 8] [--prefill 4096] [--eager]
//                     [--gemv-fp4 1|2|3|4] [--gemv-fp8 1..7] [--gemv-bf16 1|2|3] [--queued]
//
// Decode steps replay CUDA graphs (captured at each batch size's second untimed step) unless --eager. --gemv-fp4
// picks the FP4 decode GEMV kernel (cuda::gemv_set_fp4_variant: 1 chain_gemv, 2 fp4_pair_gemv, 3 fp4_mma_gemv up to
// 42 x rows per list (the default), 4 fp4_mma_gemv wherever it takes the call) and --gemv-fp8 the E4M3 one
// (cuda::gemv_set_fp8_variant: 1 fp8_gemv, 2 fp8_walk_gemv, 3 by shape, 4 fp8_mma_gemv wherever it takes the call, 5
// by shape with fp8_mma_gemv and fp8_rows_gemv for the calls where they measured faster (the default), 6
// fp8_rows_gemv wherever it takes the call, 7 fp8_wgmma_gemv wherever it takes the call) and --gemv-bf16 the BF16 one
// (cuda::gemv_set_bf16_variant: 1 chain_gemv, 2 bf16_lane_gemv / bf16_tile_gemv wherever they take the call, 3 by rows
// of x (the default)): the same logits either way, so an A/B of the kernels end to end.
//
// Bytes per decode step (the roofline's numerator), from the checkpoint's own tensor sizes:
//   every non-expert weight once (attention, compressors, indexers, norms, hc, gate, shared expert,
//   the head; the embedding only for the B rows it gathers; Engram tables excluded: host-side), plus
//   each routed expert the step's tokens hit (counted from the forward's trace), plus the state read:
//   per sequence and layer the window rows and compressed entries attended (as the engine stores
//   them, float32) and the index keys scored.
// "head ms": the head alone at the batch's rows; "layers' fraction": (roofline bytes less the head's) / bandwidth
// against the step less the head, i.e. how the layers alone fare (a whole model has 43 of them). "host ms / step": the
// time until forward_batch returns (its kernels queued, not run): when it nears the step's time, the host and not the
// GPU sets the pace. --queued adds, per batch size, the same number of steps queued back to back with one wait at the
// end (the tokens fixed, no sampler): the step the GPU would take if the host never waited for a sampled token, the
// bound of feeding the sampled token back on the device (the overlap schedulers of vLLM and SGLang); the gap between
// the two is the round trip through the host per step. Prints SKIP and exits 0 without a GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "cuda/device.h"
#include "cuda/linear_gemv.cuh"
#include "deepinfer/error.h"
#include "io/checkpoint.h"
#include "model/model.h"
#include "ops/ops.h"
#include "sampling/sampler.h"
#include "sampling/sampling_params.h"

namespace di = deepinfer;

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Device-to-device copy bandwidth (bytes read + written per second) over a 2 GiB buffer.
double copy_bandwidth() {
  const size_t n = size_t{1} << 30;
  void *a = nullptr, *b = nullptr;
  DI_CUDA_CHECK(cudaMalloc(&a, n));
  DI_CUDA_CHECK(cudaMalloc(&b, n));
  DI_CUDA_CHECK(cudaMemset(a, 1, n));
  cudaEvent_t e0, e1;
  DI_CUDA_CHECK(cudaEventCreate(&e0));
  DI_CUDA_CHECK(cudaEventCreate(&e1));
  for (int i = 0; i < 2; ++i) DI_CUDA_CHECK(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice));
  DI_CUDA_CHECK(cudaEventRecord(e0));
  const int reps = 10;
  for (int i = 0; i < reps; ++i) DI_CUDA_CHECK(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice));
  DI_CUDA_CHECK(cudaEventRecord(e1));
  DI_CUDA_CHECK(cudaEventSynchronize(e1));
  float ms = 0;
  DI_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  DI_CUDA_CHECK(cudaFree(a));
  DI_CUDA_CHECK(cudaFree(b));
  return 2.0 * n * reps / (ms * 1e-3);
}

struct WeightBytes {
  double dense = 0;            // read once per step whatever the batch (the head included)
  double head = 0;             // of which the head
  double embed_row = 0;        // one embedding row
  std::vector<double> expert;  // per layer: bytes of one routed expert (w1 + w2 + w3 + scales)
};

WeightBytes weight_bytes(const std::string& dir, const di::ModelConfig& cfg) {
  di::Checkpoint ck = di::Checkpoint::open(dir);
  WeightBytes w;
  w.expert.assign(cfg.n_layers, 0.0);
  for (const std::string& n : ck.names()) {
    const di::TensorInfo& t = ck.info(n);
    const double bytes = static_cast<double>(t.end - t.begin);
    if (n.rfind("mtp.", 0) == 0 || n.find(".engram.") != std::string::npos) continue;
    if (n == "embed.weight" || n == "model.embed_tokens.weight") {
      w.embed_row = bytes / std::max<int64_t>(1, t.shape[0]);
      continue;
    }
    const size_t e = n.find(".ffn.experts.");
    if (e != std::string::npos) {
      const int64_t layer = std::stoll(n.substr(n.find("layers.") + 7));
      if (n.find(".ffn.experts.0.") != std::string::npos && layer < cfg.n_layers) w.expert[layer] += bytes;
      continue;
    }
    w.dense += bytes;
    if (n == "head.weight") w.head = bytes;
  }
  return w;
}

// The head alone at `rows` rows of x, as the model calls it (linear_f32: FP32 out, no act quant), ms per call: with
// 4 layers the head (1.3 GB, read near the HBM ceiling at batch 1) is about half a step's bytes, while a whole model
// has 43 layers, so the table also gives the layers' own fraction of their roofline.
double head_ms(const di::Tensor& head, int64_t rows, int64_t dim) {
  const di::Tensor x = di::Tensor::full({rows, dim}, 0.01f).to(di::Device::kCUDA);
  const di::ops::QWeight w{head, {}, 0};
  di::ops::linear(x, w, {0, false});  // warm-up
  di::ops::synchronize(di::Device::kCUDA);
  const int reps = 10;
  const double t0 = now_s();
  for (int i = 0; i < reps; ++i) di::ops::linear(x, w, {0, false});
  di::ops::synchronize(di::Device::kCUDA);
  return (now_s() - t0) / reps * 1e3;
}

// State bytes one sequence's decode step reads at position p (float32 rows, as stored).
double state_bytes(const di::ModelConfig& cfg, int64_t p) {
  double b = 0;
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    const int64_t r = cfg.compress_ratio(l);
    int64_t rows = std::min<int64_t>(p + 1, cfg.window_size);
    if (r > 0) {
      const int64_t n = (p + 1) / r;
      rows += std::min<int64_t>(n, cfg.index_topk);
      b += static_cast<double>(n) * cfg.index_head_dim * 4;  // index keys scored
    }
    b += static_cast<double>(rows) * cfg.head_dim * 4;
  }
  return b;
}

std::vector<int32_t> ids(int64_t n, int64_t vocab, uint32_t seed) {
  std::vector<int32_t> v(n);
  uint32_t s = seed * 2654435761u + 99u;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<int32_t>((s >> 8) % static_cast<uint32_t>(vocab));
  }
  return v;
}

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> out;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    out.push_back(std::stoll(s.substr(i, j - i)));
    i = j + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (!di::ops::device_available(di::Device::kCUDA)) {
    std::printf("SKIP: no CUDA device\n");
    return 0;
  }
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: %s CKPT_DIR [--batches 1,8,32] [--context N] [--steps N] [--prefill N] [--eager] "
                 "[--gemv-fp4 1|2|3|4] [--gemv-fp8 1..7] [--gemv-bf16 1|2|3] [--queued]\n",
                 argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  std::vector<int64_t> batches = {1, 8, 32, 128, 256};
  int64_t context = 128, steps = 8, prefill = 4096;
  bool eager = false, queued = false;
  for (int a = 2; a < argc; a += 2) {
    const std::string k = argv[a];
    if (k == "--eager" || k == "--queued") {  // flags: no value
      (k == "--eager" ? eager : queued) = true;
      --a;
      continue;
    }
    if (a + 1 >= argc) {
      std::fprintf(stderr, "option %s needs a value\n", k.c_str());
      return 2;
    }
    const std::string v = argv[a + 1];
    if (k == "--batches")
      batches = parse_list(v);
    else if (k == "--context")
      context = std::stoll(v);
    else if (k == "--steps")
      steps = std::stoll(v);
    else if (k == "--prefill")
      prefill = std::stoll(v);
    else if (k == "--gemv-fp4")
      di::cuda::gemv_set_fp4_variant(std::stoi(v));
    else if (k == "--gemv-fp8")
      di::cuda::gemv_set_fp8_variant(std::stoi(v));
    else if (k == "--gemv-bf16")
      di::cuda::gemv_set_bf16_variant(std::stoi(v));
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  try {
    const double t_load = now_s();
    auto model = di::Model::load(dir, di::Device::kCUDA);
    if (eager) model->set_graphs(false);  // every kernel launched one by one (the A/B of the CUDA graphs)
    di::ops::synchronize(di::Device::kCUDA);
    const di::ModelConfig& cfg = model->config();
    std::printf("model %s: %lld layers, dim %lld, %lld experts top-%lld, vocab %lld; loaded to the GPU in %.1f s\n",
                dir.c_str(), static_cast<long long>(cfg.n_layers), static_cast<long long>(cfg.dim),
                static_cast<long long>(cfg.n_routed_experts), static_cast<long long>(cfg.n_activated_experts),
                static_cast<long long>(cfg.vocab_size), now_s() - t_load);
    const double bw = copy_bandwidth();
    const WeightBytes wb = weight_bytes(dir, cfg);
    di::Tensor head;  // the head on the GPU once more, for head_ms
    {
      di::Checkpoint ck = di::Checkpoint::open(dir);
      if (ck.has("head.weight"))
        head = ck.take("head.weight", {cfg.vocab_size, cfg.dim}, {di::DType::kBF16, di::DType::kF32})
                   .to(di::Device::kCUDA);
    }
    std::printf("D2D copy bandwidth (read + write) %.0f GB/s; dense weights %.3f GB, one routed expert %.1f MB\n\n",
                bw / 1e9, wb.dense / 1e9, (wb.expert.empty() ? 0.0 : wb.expert[0]) / 1e6);

    di::ForwardOptions fo;
    fo.all_logits = false;
    fo.logits_device = true;  // sampled on the GPU below, as the engine does
    di::SamplingParams greedy;
    greedy.temperature = 0.0f;
    std::printf(
        "| batch | context | ms / step | tokens/s per seq | tokens/s total | GB / step (roofline) | roofline ms | "
        "fraction of roofline | host ms / step | head ms | layers' fraction |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (const int64_t B : batches) {
      // B sequences with `context` tokens each, prefilled 4096 tokens per forward at most: several sequences a
      // forward at a short context, a long one in chunks of 4096 (as one forward, a 64k-token context gave no decode
      // row on an 80 GB H100: bench/RESULTS.md, forty-third session).
      std::vector<std::unique_ptr<di::SequenceState>> seqs;
      for (int64_t b = 0; b < B; ++b) seqs.push_back(model->new_sequence());
      constexpr int64_t kPrefillChunk = 4096;
      const int64_t per = std::max<int64_t>(1, kPrefillChunk / context);
      for (int64_t b0 = 0; b0 < B; b0 += per) {
        const int64_t b1 = std::min(B, b0 + per);
        std::vector<std::vector<int32_t>> prompts;
        for (int64_t b = b0; b < b1; ++b) prompts.push_back(ids(context, cfg.vocab_size, static_cast<uint32_t>(b)));
        for (int64_t c0 = 0; c0 < context; c0 += kPrefillChunk) {
          const int64_t c1 = std::min(context, c0 + kPrefillChunk);
          std::vector<di::SeqChunk> batch;
          for (int64_t b = b0; b < b1; ++b) {
            const std::vector<int32_t>& p = prompts[static_cast<size_t>(b - b0)];
            batch.push_back(
                {seqs[b].get(), std::vector<int32_t>(p.begin() + c0, p.begin() + c1), c1 == context, false});
          }
          model->forward_batch(batch, fo);
        }
      }
      std::vector<int32_t> next(B, 1);
      std::vector<di::SampleInput> greedy_rows(static_cast<size_t>(B));
      for (di::SampleInput& in : greedy_rows) in.params = &greedy, in.vocab = cfg.vocab_size;
      // One decode row per sequence, fed `next`: the timed loop's step and --queued's.
      auto decode_batch = [&] {
        std::vector<di::SeqChunk> batch;
        for (int64_t b = 0; b < B; ++b) batch.push_back({seqs[b].get(), {next[b]}, true, false});
        return batch;
      };
      double total = 0, host = 0, bytes = 0;
      // 4 warm-up steps: 2 traced (the step's bytes), then the batch size's first untraced step (eager) and its second,
      // which captures the CUDA graphs (later steps replay them).
      constexpr int64_t kWarm = 4;
      for (int64_t s = 0; s < steps + kWarm; ++s) {
        const std::vector<di::SeqChunk> batch = decode_batch();
        di::Trace trace;
        di::ForwardOptions f2 = fo;
        f2.trace = &trace;
        const double t0 = now_s();
        const di::Tensor logits = model->forward_batch(batch, s >= 2 ? fo : f2);
        const double dt_host = now_s() - t0;  // the forward's host side: its launches are queued
        // The next tokens as the engine picks them: greedy, sampled on the GPU (ops::sample_rows); only
        // the token ids come back to the host.
        const std::vector<di::SampleResult> picked = di::ops::sample_rows(logits, greedy_rows);
        const double dt = now_s() - t0;
        for (int64_t b = 0; b < B; ++b) next[b] = picked[static_cast<size_t>(b)].token;
        if (s == kWarm - 1) di::ops::reset_op_profile();  // DEEPINFER_OP_PROFILE: the timed steps only
        if (s < kWarm) {  // the step's bytes, from its trace (the timed steps route alike)
          if (s == 1) {
            bytes = wb.dense + B * wb.embed_row;
            for (const auto& [layer, ex] : trace.experts)
              bytes += std::set<int32_t>(ex.begin(), ex.end()).size() * wb.expert[layer];
            for (int64_t b = 0; b < B; ++b) bytes += state_bytes(cfg, seqs[b]->num_tokens);
          }
          continue;
        }
        total += dt;
        host += dt_host;
      }
      const double ms = total / steps * 1e3, roof_ms = bytes / bw * 1e3;
      // The layers' own fraction: the step less the head (timed alone), against the roofline less the head's bytes.
      const double h_ms = head.defined() ? head_ms(head, B, cfg.dim) : 0.0;
      const double layers_frac = (bytes - wb.head) / bw * 1e3 / std::max(1e-9, ms - h_ms);
      std::printf("| %lld | %lld | %.2f | %.1f | %.1f | %.3f | %.3f | %.1f%% | %.2f | %.3f | %.1f%% |\n",
                  static_cast<long long>(B), static_cast<long long>(context), ms, 1e3 / ms, B * 1e3 / ms, bytes / 1e9,
                  roof_ms, 100.0 * roof_ms / ms, host / steps * 1e3, h_ms, 100.0 * layers_frac);
      if (queued) {  // the same steps with no round trip through the host (see the header)
        const double q0 = now_s();
        for (int64_t s = 0; s < steps; ++s) model->forward_batch(decode_batch(), fo);
        di::ops::synchronize(di::Device::kCUDA);
        const double q_ms = (now_s() - q0) / steps * 1e3;
        std::printf(
            "|   queued: %lld steps back to back, no sampler | %lld | %.2f | %.1f | %.1f | | | %.1f%% | | | |\n",
            static_cast<long long>(steps), static_cast<long long>(context), q_ms, 1e3 / q_ms, B * 1e3 / q_ms,
            100.0 * roof_ms / q_ms);
      }
      std::fflush(stdout);
    }
    const di::ops::SegmentGraphs::Stats gs = model->graph_stats();
    std::printf(
        "\ncuda graphs%s: %lld decode pieces captured, %lld replayed, %lld run eagerly, %lld failed captures; spans "
        "(middles and pieces) launched as one graph %lld, one by one %lld\n",
        eager ? " (off: --eager)" : "", static_cast<long long>(gs.captures), static_cast<long long>(gs.replays),
        static_cast<long long>(gs.eager), static_cast<long long>(gs.failures), static_cast<long long>(gs.spans_merged),
        static_cast<long long>(gs.spans_split));
    if (prefill > 0) {
      auto seq = model->new_sequence();
      const std::vector<int32_t> p = ids(prefill, cfg.vocab_size, 4242);
      auto warm = model->new_sequence();
      model->forward(ids(64, cfg.vocab_size, 1), *warm, fo);
      di::cuda::synchronize();
      const double t0 = now_s();
      model->forward(p, *seq, fo);
      di::cuda::synchronize();  // the logits stay on the GPU: wait for the forward itself
      const double dt = now_s() - t0;
      std::printf("\nprefill %lld tokens in one forward: %.3f s, %.0f tokens/s\n", static_cast<long long>(prefill), dt,
                  prefill / dt);
    }
  } catch (const std::exception& e) {
    std::printf("FAILED: %s\n", e.what());
    return 1;
  }
  return 0;
}
