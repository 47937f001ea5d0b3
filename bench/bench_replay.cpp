// V4.1 SWA bounded replay (DeepInfer's DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE=compact): what it saves
// and what it costs. A random prompt is prefilled exactly (the anchor, replay off) and with the
// decoder layers (those after the last kv source) run only over the last KEEP tokens; then both
// states decode greedily from the same tokens (teacher-forced on the exact run's choices) and the
// logits are compared step by step.
//
//   ./build/bench/bench_replay MODEL_DIR [PROMPT_TOKENS=2048] [STEPS=32] [KEEP...=140]
//
// Prints, per KEEP: prefill ms (median of 3) and its ratio to the exact prefill, the layer-rows the
// prefill computes (sum over layers of the rows it runs) and the fraction saved, then the logit
// deviation against the exact run over the first logits and the decode steps: max |delta|, mean KL
// and argmax agreement.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <random>
#include <vector>

#include "model/model.h"

using namespace deepinfer;

namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Run {
  double prefill_ms = 0;
  std::vector<std::vector<float>> logits;  // after the prefill, then after each decode step
};

// Prefill (3 timed repetitions on fresh states, the last one kept) then teacher-forced decode.
Run run(const Model& m, const std::vector<int32_t>& prompt, const std::vector<int32_t>& forced, int64_t keep) {
  ForwardOptions fo;
  fo.all_logits = false;
  Run r;
  std::vector<double> t;
  std::unique_ptr<SequenceState> st;
  Tensor first;
  for (int rep = 0; rep < 3; ++rep) {
    st = m.new_sequence();
    SeqChunk c{st.get(), prompt, true, false};
    c.replay_from = keep > 0 ? std::max<int64_t>(0, static_cast<int64_t>(prompt.size()) - keep) : 0;
    const double t0 = now_ms();
    first = m.forward_batch({c}, fo);
    t.push_back(now_ms() - t0);
  }
  std::sort(t.begin(), t.end());
  r.prefill_ms = t[1];
  const int64_t V = m.config().vocab_size;
  r.logits.emplace_back(first.data<float>(), first.data<float>() + V);
  for (int32_t tok : forced) {
    Tensor l = m.forward({tok}, *st, fo);
    r.logits.emplace_back(l.data<float>(), l.data<float>() + V);
  }
  return r;
}

int32_t argmax(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

double kl(const std::vector<float>& p_logits, const std::vector<float>& q_logits) {
  auto lse = [](const std::vector<float>& x) {
    const double m = *std::max_element(x.begin(), x.end());
    double s = 0;
    for (float v : x) s += std::exp(v - m);
    return m + std::log(s);
  };
  const double lp = lse(p_logits), lq = lse(q_logits);
  double k = 0;
  for (size_t i = 0; i < p_logits.size(); ++i) {
    const double a = p_logits[i] - lp, b = q_logits[i] - lq;
    k += std::exp(a) * (a - b);
  }
  return k;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fmt::print(stderr, "usage: bench_replay MODEL_DIR [PROMPT_TOKENS] [STEPS] [KEEP...]\n");
    return 2;
  }
  const int64_t P = argc > 2 ? std::atoll(argv[2]) : 2048, S = argc > 3 ? std::atoll(argv[3]) : 32;
  std::vector<int64_t> keeps;
  for (int i = 4; i < argc; ++i) keeps.push_back(std::atoll(argv[i]));
  if (keeps.empty()) keeps.push_back(140);
  auto model = Model::load(argv[1]);
  const ModelConfig& cfg = model->config();
  if (cfg.family != ModelFamily::kV41 || cfg.kv_source_layers.empty()) {
    fmt::print(stderr, "bench_replay needs a V4.1 model with kv sources\n");
    return 2;
  }
  std::mt19937_64 gen(7);
  std::vector<int32_t> prompt(P);
  for (auto& t : prompt) t = static_cast<int32_t>(3 + gen() % (cfg.vocab_size - 3));

  // The anchor: exact prefill; its greedy tokens drive every run's decode.
  Run exact = run(*model, prompt, {}, 0);
  std::vector<int32_t> forced;
  {
    auto st = model->new_sequence();
    ForwardOptions fo;
    fo.all_logits = false;
    Tensor l = model->forward(prompt, *st, fo);
    std::vector<float> v(l.data<float>(), l.data<float>() + cfg.vocab_size);
    for (int64_t s = 0; s < S; ++s) {
      forced.push_back(argmax(v));
      l = model->forward({forced.back()}, *st, fo);
      v.assign(l.data<float>(), l.data<float>() + cfg.vocab_size);
    }
  }
  exact = run(*model, prompt, forced, 0);

  const int64_t last = cfg.kv_source_layers.back(), L = cfg.n_layers, dec = L - last - 1;
  fmt::print("model {} ({} layers, decoder layers {}..{}), prompt {} tokens, {} decode steps\n", argv[1], L, last + 1,
             L - 1, P, S);
  fmt::print("{:>10} {:>11} {:>8} {:>12} {:>7} {:>12} {:>10} {:>9}\n", "keep", "prefill ms", "ratio", "layer-rows",
             "saved", "max|dlogit|", "mean KL", "argmax");
  const double full_rows = static_cast<double>(L * P);
  fmt::print("{:>10} {:>11.1f} {:>8.2f} {:>12.0f} {:>6.1f}% {:>12} {:>10} {:>9}\n", "off", exact.prefill_ms, 1.0,
             full_rows, 0.0, "-", "-", "-");
  for (int64_t keep : keeps) {
    Run r = run(*model, prompt, forced, keep);
    const double rows = static_cast<double>((last + 1) * P + dec * std::min(keep, P));
    double maxd = 0, kls = 0;
    int agree = 0;
    for (size_t i = 0; i < r.logits.size(); ++i) {
      for (size_t v = 0; v < r.logits[i].size(); ++v)
        maxd = std::max(maxd, static_cast<double>(std::fabs(r.logits[i][v] - exact.logits[i][v])));
      kls += kl(exact.logits[i], r.logits[i]);
      agree += argmax(exact.logits[i]) == argmax(r.logits[i]);
    }
    const double n = static_cast<double>(r.logits.size());
    fmt::print("{:>10} {:>11.1f} {:>8.2f} {:>12.0f} {:>6.1f}% {:>12.4g} {:>10.4g} {:>8.1f}%\n", keep, r.prefill_ms,
               r.prefill_ms / exact.prefill_ms, rows, 100.0 * (1.0 - rows / full_rows), maxd, kls / n,
               100.0 * agree / n);
  }
  return 0;
}
