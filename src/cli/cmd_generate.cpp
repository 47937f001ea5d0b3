// `deepinfer generate`: greedy continuation of a prompt given as token ids.
#include <chrono>
#include <cstdio>

#include "cli/commands.h"
#include "deepinfer/error.h"
#include "model/model.h"

namespace deepinfer::cli {

namespace {
int32_t argmax(const Tensor& logits) {
  const float* p = logits.data<float>();
  int64_t best = 0;
  for (int64_t i = 1; i < logits.numel(); ++i)
    if (p[i] > p[best]) best = i;
  return static_cast<int32_t>(best);
}
}  // namespace

Runner add_generate(CLI::App& app) {
  struct Opts {
    std::string model, ids;
    int max_tokens = 32;
    bool ignore_eos = false;
    NumericsFlags num;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("generate", "greedy generation from prompt token ids");
  cmd->add_option("--model", o->model, "model directory")->required();
  cmd->add_option("--prompt-ids", o->ids, "comma-separated prompt token ids")->required();
  cmd->add_option("--max-tokens", o->max_tokens, "tokens to generate")->check(CLI::Range(1, 1 << 20));
  cmd->add_flag("--ignore-eos", o->ignore_eos, "keep going after the end-of-sentence token");
  o->num.add(cmd);
  return [o] {
    std::vector<int32_t> prompt = parse_ids(o->ids, "--prompt-ids");
    auto model = Model::load(o->model);
    auto state = model->new_sequence();
    ForwardOptions fo{o->num.numerics(), false, nullptr};
    using clock = std::chrono::steady_clock;
    auto t0 = clock::now();
    int32_t next = argmax(model->forward(prompt, *state, fo));
    auto t1 = clock::now();
    std::vector<int32_t> out{next};
    while (static_cast<int>(out.size()) < o->max_tokens &&
           (o->ignore_eos || next != static_cast<int32_t>(model->config().eos_token_id))) {
      next = argmax(model->forward({next}, *state, fo));
      out.push_back(next);
    }
    auto t2 = clock::now();
    for (size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? "," : "", out[i]);
    std::printf("\n");
    const double pre = std::chrono::duration<double>(t1 - t0).count();
    const double dec = std::chrono::duration<double>(t2 - t1).count();
    std::fprintf(stderr, "prefill %zu tokens in %.3f s (%.1f tok/s); decode %zu tokens in %.3f s (%.1f tok/s)\n",
                 prompt.size(), pre, prompt.size() / pre, out.size() - 1, dec, dec > 0 ? (out.size() - 1) / dec : 0.0);
    return 0;
  };
}

}  // namespace deepinfer::cli
