// Sampler micro-benchmark: µs per sample() over a DeepSeek-V4-sized vocab (129,280) for each
// sampling mode, next to an anchor measured in the same run: a plain std::sort of the vocab's logits
// (a copy of the row, sorted descending). Two logit rows: "lm-like" (N(0, 3^2), a few tokens carry most
// of the mass, as in real decoding) and "flat" (N(0, 1): top_p keeps tens of thousands of tokens; the
// worst case for truncation).
//
//   ./build/bench/bench_sampler [ITERATIONS]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <random>
#include <vector>

#include "sampling/sampler.h"

namespace {

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Median of `reps` timings of `iters` calls, in µs per call.
template <typename F>
double time_us(int iters, F&& f) {
  std::vector<double> t;
  for (int rep = 0; rep < 7; ++rep) {
    const double t0 = now_us();
    for (int i = 0; i < iters; ++i) f(i);
    t.push_back((now_us() - t0) / iters);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 200;
  const int64_t V = 129280;
  std::mt19937_64 gen(1234);
  std::vector<int32_t> prompt, output;
  for (int i = 0; i < 2000; ++i) prompt.push_back(static_cast<int32_t>(gen() % V));
  for (int i = 0; i < 500; ++i) output.push_back(static_cast<int32_t>(gen() % V));

  struct Mode {
    const char* name;
    deepinfer::SamplingParams p;
    bool history;
  };
  std::vector<Mode> modes;
  auto add = [&](const char* name, auto set, bool history = false) {
    deepinfer::SamplingParams p;
    set(p);
    modes.push_back({name, p, history});
  };
  add("greedy", [](auto& p) { p.temperature = 0.0f; });
  add("temperature 0.7", [](auto& p) { p.temperature = 0.7f; });
  add("top_k 50", [](auto& p) { p.top_k = 50; });
  add("top_p 0.9", [](auto& p) { p.top_p = 0.9f; });
  add("min_p 0.05", [](auto& p) { p.min_p = 0.05f; });
  add("top_k 50 + top_p 0.9 + T 0.7", [](auto& p) {
    p.top_k = 50;
    p.top_p = 0.9f;
    p.temperature = 0.7f;
  });
  add(
      "penalties (rep 1.1, freq .5, pres .5) + top_p 0.9",
      [](auto& p) {
        p.repetition_penalty = 1.1f;
        p.frequency_penalty = 0.5f;
        p.presence_penalty = 0.5f;
        p.top_p = 0.9f;
      },
      true);
  add("greedy + logprobs 5", [](auto& p) {
    p.temperature = 0.0f;
    p.logprobs = 5;
  });

  for (double sigma : {3.0, 1.0}) {
    std::normal_distribution<float> nd(0.0f, static_cast<float>(sigma));
    std::vector<float> logits(static_cast<size_t>(V));
    for (auto& v : logits) v = nd(gen);
    fmt::print("\nvocab {}, logits {} (N(0, {}^2)), {} calls x 7 reps, median µs per call\n", V,
               sigma == 3.0 ? "lm-like" : "flat", sigma, iters);
    std::vector<float> buf(logits.size());
    const double anchor = time_us(iters / 4 + 1, [&](int) {
      std::copy(logits.begin(), logits.end(), buf.begin());
      std::sort(buf.begin(), buf.end(), std::greater<float>());
    });
    fmt::print("  {:<52} {:>9.1f} µs  (1.00x)\n", "anchor: std::sort of the vocab", anchor);
    for (const auto& m : modes) {
      int64_t sink = 0;
      const double us = time_us(iters, [&](int i) {
        deepinfer::SampleInput in;
        in.logits = logits.data();
        in.vocab = V;
        in.params = &m.p;
        in.seed = 42;
        in.position = i;
        if (m.history) {
          in.prompt_ids = &prompt;
          in.output_ids = &output;
        }
        sink += deepinfer::sample(in).token;
      });
      fmt::print("  {:<52} {:>9.1f} µs  ({:.2f}x)\n", m.name, us, us / anchor);
      if (sink == -1) fmt::print("");
    }
  }
  return 0;
}
