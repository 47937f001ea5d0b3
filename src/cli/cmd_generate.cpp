// `deepinfer generate`: greedy continuation of a prompt given as token ids or as text.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "cli/commands.h"
#include "deepinfer/error.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

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
    std::string model, ids, text;
    int max_tokens = 32;
    bool ignore_eos = false;
    NumericsFlags num;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("generate", "greedy generation from prompt token ids or text");
  cmd->add_option("--model", o->model, "model directory")->required();
  auto* ids_opt = cmd->add_option("--prompt-ids", o->ids, "comma-separated prompt token ids (prints ids)");
  auto* text_opt = cmd->add_option("--prompt", o->text,
                                   "prompt text, tokenised with the model's tokenizer.json (prints the prompt and its "
                                   "continuation as text)");
  ids_opt->excludes(text_opt);
  text_opt->excludes(ids_opt);
  cmd->add_option("--max-tokens", o->max_tokens, "tokens to generate")->check(CLI::Range(1, 1 << 20));
  cmd->add_flag("--ignore-eos", o->ignore_eos, "keep going after the end-of-sentence token");
  o->num.add(cmd);
  return [o] {
    DI_CHECK(!o->ids.empty() || !o->text.empty(), "give the prompt with --prompt-ids or --prompt");
    std::unique_ptr<Tokenizer> tok;
    std::vector<int32_t> prompt;
    if (!o->text.empty()) {
      DI_CHECK(std::filesystem::is_regular_file(std::filesystem::path(o->model) / "tokenizer.json"),
               "--prompt needs the model directory's tokenizer.json ({} has none); use --prompt-ids", o->model);
      tok = std::make_unique<Tokenizer>(Tokenizer::from_pretrained(o->model));
      prompt = tok->encode(o->text, false);
      DI_CHECK(!prompt.empty(), "--prompt: the text encodes to no tokens");
    } else {
      prompt = parse_ids(o->ids, "--prompt-ids");
    }
    auto model = Model::load(o->model, o->num.resolved_device());
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
    if (tok) {
      std::printf("%s%s\n", o->text.c_str(), tok->decode(out, true).c_str());
    } else {
      for (size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? "," : "", out[i]);
      std::printf("\n");
    }
    const double pre = std::chrono::duration<double>(t1 - t0).count();
    const double dec = std::chrono::duration<double>(t2 - t1).count();
    std::fprintf(stderr, "prefill %zu tokens in %.3f s (%.1f tok/s); decode %zu tokens in %.3f s (%.1f tok/s)\n",
                 prompt.size(), pre, prompt.size() / pre, out.size() - 1, dec, dec > 0 ? (out.size() - 1) / dec : 0.0);
    return 0;
  };
}

}  // namespace deepinfer::cli
