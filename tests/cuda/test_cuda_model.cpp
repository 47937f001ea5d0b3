// End-to-end GPU check of the CUDA backend (issue 8): a checkpoint runs on the CPU and on the GPU
// (weights, activations and sequence state in HBM), and greedy decoding must pick the same token at
// every step. Prints one PASS / FAIL line per case and exits non-zero on any failure; needs a CUDA GPU
// (prints SKIP and exits 0 without one, as CI has none).
//
//   ./deepinfer_cuda_model_tests CKPT_DIR [CKPT_DIR ...]
//
// Cases per checkpoint: (1) a 100-token prompt prefilled in one chunk, then 64 greedy decode steps,
// fed the CPU's tokens on both devices so one divergence does not hide the later steps; (2) the same
// with the prompt in chunks of 7 on the GPU; (3) three sequences of different lengths decoded in
// one batch on the GPU against each alone on the CPU. Reports the largest |logit difference|.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "deepinfer/error.h"
#include "model/model.h"
#include "ops/ops.h"

namespace di = deepinfer;

namespace {

int argmax(const float* row, int64_t n) { return static_cast<int>(std::max_element(row, row + n) - row); }

std::vector<int32_t> prompt_ids(int64_t n, int64_t vocab, uint32_t seed) {
  std::vector<int32_t> ids(n);
  uint32_t s = seed * 2654435761u + 12345u;
  for (auto& v : ids) {
    s = s * 1664525u + 1013904223u;
    v = static_cast<int32_t>((s >> 8) % static_cast<uint32_t>(vocab));
  }
  return ids;
}

struct Compare {
  int steps = 0, token_mismatch = 0;
  double max_diff = 0, max_abs = 0;
  void add(const di::Tensor& cpu, const di::Tensor& gpu) {
    const int64_t V = cpu.size(1);
    for (int64_t r = 0; r < cpu.size(0); ++r) {
      const float* a = cpu.data<float>() + r * V;
      const float* b = gpu.data<float>() + r * V;
      for (int64_t i = 0; i < V; ++i) {
        max_diff = std::max(max_diff, static_cast<double>(std::fabs(a[i] - b[i])));
        max_abs = std::max(max_abs, static_cast<double>(std::fabs(a[i])));
      }
      token_mismatch += argmax(a, V) != argmax(b, V);
      ++steps;
    }
  }
};

bool report(const std::string& name, const Compare& c) {
  const bool ok = c.token_mismatch == 0 && c.steps > 0;
  std::printf("%s %s: %d steps, %d greedy-token mismatches, max |dlogit| %.3g (max |logit| %.3g)\n",
              ok ? "PASS" : "FAIL", name.c_str(), c.steps, c.token_mismatch, c.max_diff, c.max_abs);
  return ok;
}

// Prefill `prompt` (in chunks of `chunk`, 0 = one chunk) then `steps` greedy decode steps; the tokens
// fed are the CPU's greedy picks on both devices.
bool single(const di::Model& cpu, const di::Model& gpu, const std::string& name, int64_t chunk, int steps) {
  const di::ModelConfig& cfg = cpu.config();
  const std::vector<int32_t> prompt = prompt_ids(100, cfg.vocab_size, 1);
  di::ForwardOptions fo;
  fo.all_logits = false;
  auto sc = cpu.new_sequence();
  auto sg = gpu.new_sequence();
  Compare cmp;
  di::Tensor lc = cpu.forward(prompt, *sc, fo), lg;
  if (chunk <= 0) {
    lg = gpu.forward(prompt, *sg, fo);
  } else {
    for (size_t i = 0; i < prompt.size(); i += chunk) {
      std::vector<int32_t> part(prompt.begin() + i, prompt.begin() + std::min(prompt.size(), i + chunk));
      lg = gpu.forward(part, *sg, fo);
    }
  }
  cmp.add(lc, lg);
  for (int s = 0; s < steps; ++s) {
    const int32_t next = argmax(lc.data<float>(), cfg.vocab_size);
    lc = cpu.forward({next}, *sc, fo);
    lg = gpu.forward({next}, *sg, fo);
    cmp.add(lc, lg);
  }
  return report(name, cmp);
}

// Three sequences (prompts of 100, 37 and 5 tokens) decoded together on the GPU, alone on the CPU.
bool batched(const di::Model& cpu, const di::Model& gpu, const std::string& name, int steps) {
  const di::ModelConfig& cfg = cpu.config();
  const std::vector<int64_t> lens = {100, 37, 5};
  di::ForwardOptions fo;
  fo.all_logits = false;
  std::vector<std::unique_ptr<di::SequenceState>> sc, sg;
  std::vector<std::vector<int32_t>> next(lens.size());
  Compare cmp;
  std::vector<di::SeqChunk> batch;
  for (size_t b = 0; b < lens.size(); ++b) {
    sc.push_back(cpu.new_sequence());
    sg.push_back(gpu.new_sequence());
    next[b] = prompt_ids(lens[b], cfg.vocab_size, static_cast<uint32_t>(7 + b));
  }
  for (int s = 0; s <= steps; ++s) {
    batch.clear();
    for (size_t b = 0; b < lens.size(); ++b) batch.push_back(di::SeqChunk{sg[b].get(), next[b], true, false});
    const di::Tensor lg = gpu.forward_batch(batch, fo);
    for (size_t b = 0; b < lens.size(); ++b) {
      const di::Tensor lc = cpu.forward(next[b], *sc[b], fo);
      cmp.add(lc, lg.slice(0, static_cast<int64_t>(b), static_cast<int64_t>(b) + 1));
      next[b] = {argmax(lc.data<float>(), cfg.vocab_size)};
    }
  }
  return report(name, cmp);
}

}  // namespace

int main(int argc, char** argv) {
  if (!di::ops::device_available(di::Device::kCUDA)) {
    std::printf("SKIP: no CUDA device\n");
    return 0;
  }
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CKPT_DIR [CKPT_DIR ...]\n", argv[0]);
    return 2;
  }
  int failed = 0;
  for (int a = 1; a < argc; ++a) {
    const std::string dir = argv[a];
    try {
      auto cpu = di::Model::load(dir, di::Device::kCPU);
      auto gpu = di::Model::load(dir, di::Device::kCUDA);
      failed += !single(*cpu, *gpu, dir + " prefill+64 decode", 0, 64);
      failed += !single(*cpu, *gpu, dir + " chunked prefill (7)+16 decode", 7, 16);
      failed += !batched(*cpu, *gpu, dir + " batch of 3 +32 decode", 32);
    } catch (const std::exception& e) {
      std::printf("FAIL %s: threw: %s\n", dir.c_str(), e.what());
      ++failed;
    }
  }
  std::printf("%s: %d failed\n", failed ? "FAILED" : "ALL PASSED", failed);
  return failed ? 1 : 0;
}
