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
// (4) the engine with sampling on the GPU (LocalModelRunner's device_logits through ops::sample_rows):
// greedy, seeded top-p / top-k and n = 2 requests with logprobs and prompt logprobs, against the same
// CUDA model with host logits and the CPU sampler (every token and logprob bit for bit: same logits,
// same sampling), and against the engine on the CPU (the same tokens; the logprobs differ by the two
// devices' logit differences, reported).
// (5) CUDA graphs: the decode step replayed as graphs against the same checkpoint launching every kernel
// (Model::set_graphs(false)), every logit bit for bit: one sequence, a batch whose size changes (each size captured
// at its second step), and positions across the RoPE table's 4,096-row growth (the graphs are captured again); the
// graphs must have been captured and replayed, and no capture may have failed.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cuda/graph.h"
#include "deepinfer/error.h"
#include "engine/engine_core.h"
#include "engine/local_model_runner.h"
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

// The engine over `dir` on `device`; device_logits: sample on the device (the default on CUDA) or not.
std::vector<di::RequestOutput> run_engine(const std::string& dir, di::Device device, bool device_logits,
                                          const std::vector<std::vector<int32_t>>& prompts,
                                          const std::vector<di::SamplingParams>& params) {
  di::EngineArgs args;
  args.model = dir;
  args.max_model_len = 256;
  args.max_num_batched_tokens = 64;  // the 100-token prompt prefills in chunks, next to decodes
  auto runner = std::make_unique<di::LocalModelRunner>(di::Model::load(dir, device), args.numerics());
  runner->set_device_logits(device_logits);
  DI_CHECK(runner->device_logits() == device_logits, "engine case: device_logits did not take");
  di::EngineCore engine(args, di::load_model_config(dir), std::move(runner));
  return engine.generate(prompts, params);
}

bool engine_case(const std::string& dir) {
  const int64_t vocab = di::load_model_config(dir).vocab_size;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<di::SamplingParams> params;
  for (uint32_t i = 0; i < 6; ++i) {
    prompts.push_back(prompt_ids(i == 0 ? 100 : i == 1 ? 37 : 5 + 3 * i, vocab, 40 + i));
    di::SamplingParams p;
    p.max_tokens = 24;
    p.ignore_eos = true;
    p.seed = 1000 + i;
    p.logprobs = 2;
    if (i % 3 == 0) {  // greedy
      p.temperature = 0.0f;
    } else if (i % 3 == 1) {  // seeded top-p
      p.temperature = 0.8f;
      p.top_p = 0.9f;
    } else {  // seeded top-k with a penalty
      p.top_k = 40;
      p.repetition_penalty = 1.1f;
    }
    if (i == 2) p.prompt_logprobs = 1;  // its prompt's rows come to the host, the rest are gathered
    if (i == 4) p.n = 2;
    params.push_back(p);
  }
  const auto gpu = run_engine(dir, di::Device::kCUDA, true, prompts, params);
  const auto gpu_host = run_engine(dir, di::Device::kCUDA, false, prompts, params);
  const auto cpu = run_engine(dir, di::Device::kCPU, false, prompts, params);
  int exact_mismatch = 0, cpu_mismatch = 0, tokens = 0;
  double max_lp_diff = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    for (const auto* o : {&gpu[i], &gpu_host[i], &cpu[i]})
      if (o->error) {
        std::printf("FAIL %s engine, request %zu: %s\n", dir.c_str(), i, o->error->c_str());
        return false;
      }
    for (size_t k = 0; k < gpu[i].outputs.size(); ++k) {
      const di::CompletionOutput &g = gpu[i].outputs[k], &h = gpu_host[i].outputs[k], &c = cpu[i].outputs[k];
      tokens += static_cast<int>(g.token_ids.size());
      bool same = g.token_ids == h.token_ids && g.logprobs.size() == h.logprobs.size();
      for (size_t t = 0; same && t < g.logprobs.size(); ++t)
        same = g.logprobs[t].logprob == h.logprobs[t].logprob && g.logprobs[t].top == h.logprobs[t].top;
      if (!same) std::printf("  request %zu child %zu: GPU sampling differs from the CPU sampler\n", i, k);
      exact_mismatch += !same;
      if (g.token_ids != c.token_ids) {
        size_t t = 0;
        while (t < g.token_ids.size() && t < c.token_ids.size() && g.token_ids[t] == c.token_ids[t]) ++t;
        std::printf("  request %zu child %zu (temperature %.1f): GPU and CPU engines diverge at token %zu\n", i, k,
                    params[i].temperature, t);
        ++cpu_mismatch;
      }
      for (size_t t = 0; t < std::min(g.logprobs.size(), c.logprobs.size()); ++t) {
        const double d = std::fabs(static_cast<double>(g.logprobs[t].logprob) - c.logprobs[t].logprob);
        max_lp_diff = std::max(max_lp_diff, d);
      }
    }
    const auto &gp = gpu[i].prompt_logprobs, &hp = gpu_host[i].prompt_logprobs;
    bool same = gp.size() == hp.size();
    for (size_t t = 0; same && t < gp.size(); ++t)
      same = gp[t].has_value() == hp[t].has_value() &&
             (!gp[t] || (gp[t]->logprob == hp[t]->logprob && gp[t]->top == hp[t]->top));
    if (!same) std::printf("  request %zu: prompt logprobs differ between the two GPU engines\n", i);
    exact_mismatch += !same;
  }
  const bool ok = exact_mismatch == 0 && cpu_mismatch == 0 && tokens > 0;
  std::printf(
      "%s %s engine, sampling on the GPU: %d tokens, %d outputs differ from the CPU sampler on the same "
      "logits, %d differ from the CPU engine (max |dlogprob| vs CPU %.3g)\n",
      ok ? "PASS" : "FAIL", dir.c_str(), tokens, exact_mismatch, cpu_mismatch, max_lp_diff);
  return ok;
}

// Logits of one forward of `batch` (decode tokens) on each model, compared bit for bit; counts rows and mismatches.
struct Exact {
  int rows = 0, differ = 0;
  void add(const di::Tensor& a, const di::Tensor& b) {
    rows += static_cast<int>(a.size(0));
    differ += a.shape() != b.shape() || std::memcmp(a.raw(), b.raw(), a.nbytes()) != 0;
  }
};

bool graphs_case(const std::string& dir, int span_form) {
  // The middles join the graphs here in the span form given, whatever DEEPINFER_CUDA_GRAPH_MIDDLES says
  // (src/cuda/graph.h).
  struct Middles {
    int prev;
    explicit Middles(int form) : prev(di::cuda::set_graph_middles(form)) {}
    ~Middles() { di::cuda::set_graph_middles(prev); }
  } middles_on(span_form);
  const di::ModelConfig& cfg = di::load_model_config(dir);
  auto graphs = di::Model::load(dir, di::Device::kCUDA);
  auto eager = di::Model::load(dir, di::Device::kCUDA);
  eager->set_graphs(false);
  di::ForwardOptions fo;
  fo.all_logits = false;
  Exact ex;
  // Sequences: prompts of 100, 37, 5 and 4,090 tokens (the last crosses position 4,096 while decoding).
  const std::vector<int64_t> lens = {100, 37, 5, 4090};
  std::vector<std::unique_ptr<di::SequenceState>> sg, se;
  std::vector<int32_t> next;
  for (size_t b = 0; b < lens.size(); ++b) {
    sg.push_back(graphs->new_sequence());
    se.push_back(eager->new_sequence());
    const std::vector<int32_t> p = prompt_ids(lens[b], cfg.vocab_size, static_cast<uint32_t>(70 + b));
    const di::Tensor a = graphs->forward(p, *sg[b], fo), e = eager->forward(p, *se[b], fo);
    ex.add(a, e);
    next.push_back(argmax(e.data<float>(), cfg.vocab_size));
  }
  // Steps over changing subsets: {0}, {0,1,2}, {0,1}, {0,1,2}, {3}, {0,3} ... each subset several steps in a row.
  const std::vector<std::vector<size_t>> plan = {{0}, {0, 1, 2}, {0, 1}, {0, 1, 2}, {3}, {0, 3}, {1, 2, 3}, {0}};
  for (const std::vector<size_t>& subset : plan) {
    for (int s = 0; s < 5; ++s) {
      std::vector<di::SeqChunk> bg, be;
      for (size_t b : subset) {
        bg.push_back(di::SeqChunk{sg[b].get(), {next[b]}, true, false});
        be.push_back(di::SeqChunk{se[b].get(), {next[b]}, true, false});
      }
      const di::Tensor a = graphs->forward_batch(bg, fo), e = eager->forward_batch(be, fo);
      ex.add(a, e);
      for (size_t i = 0; i < subset.size(); ++i)
        next[subset[i]] = argmax(e.data<float>() + static_cast<int64_t>(i) * cfg.vocab_size, cfg.vocab_size);
    }
  }
  const di::ops::SegmentGraphs::Stats st = graphs->graph_stats(), se_st = eager->graph_stats();
  // The middles are inside the graphs in this case (set_graph_middles, above): some spans must have run as one graph.
  const bool ok = ex.differ == 0 && st.captures > 0 && st.replays > 0 && st.failures == 0 && se_st.replays == 0 &&
                  st.spans_merged > 0;
  std::printf(
      "%s %s CUDA graphs (span form %d): %d logits rows, %d forwards differ from eager; %lld pieces captured, %lld "
      "replayed, "
      "%lld eager, %lld failed captures; spans (middles and pieces) launched as one graph %lld, one by one %lld\n",
      ok ? "PASS" : "FAIL", dir.c_str(), span_form, ex.rows, ex.differ, static_cast<long long>(st.captures),
      static_cast<long long>(st.replays), static_cast<long long>(st.eager), static_cast<long long>(st.failures),
      static_cast<long long>(st.spans_merged), static_cast<long long>(st.spans_split));
  return ok;
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
      failed += !engine_case(dir);
      for (int form : {1, 2}) failed += !graphs_case(dir, form);
    } catch (const std::exception& e) {
      std::printf("FAIL %s: threw: %s\n", dir.c_str(), e.what());
      ++failed;
    }
  }
  std::printf("%s: %d failed\n", failed ? "FAILED" : "ALL PASSED", failed);
  return failed ? 1 : 0;
}
