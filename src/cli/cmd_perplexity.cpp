// `deepinfer perplexity`: mean negative log-likelihood and perplexity of a text file under the model,
// over (possibly overlapping) windows of at most --max-tokens-per-window tokens.
//
// Windows start at 0, S, 2S, ... (S = --stride, default W) and each runs as a fresh sequence. A
// window [s, e) scores the targets t in [max(s + 1, previous e), e): every token is scored at most
// once, with the most context the window gives it; token 0 (and, when S >= W, the first token of
// each window) has no context and is not scored.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/commands.h"
#include "deepinfer/error.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::cli {

Runner add_perplexity(CLI::App& app) {
  struct Opts {
    std::string model, text_file;
    int64_t window = 0, stride = 0, max_model_len = 0;
    bool bos = false, show_ids = false;
    NumericsFlags num;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd =
      app.add_subcommand("perplexity", "perplexity of a text file (tokenised with the model's tokenizer.json)");
  cmd->add_option("--model", o->model, "model directory (with tokenizer.json)")->required();
  cmd->add_option("--text-file", o->text_file, "UTF-8 text to score")->required();
  cmd->add_option("--max-tokens-per-window", o->window, "tokens per window (default: --max-model-len, else 1024)")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 30));
  cmd->add_option("--stride", o->stride, "window start step (default: the window size)")->check(CLI::PositiveNumber);
  cmd->add_option("--max-model-len", o->max_model_len, "longest sequence one window may hold")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--add-bos", o->bos, "prepend the tokenizer's BOS token (then the first text token is scored too)");
  cmd->add_flag("--show-token-ids", o->show_ids, "print the token ids to stderr (comma-separated)");
  o->num.add(cmd);
  return [o] {
    DI_CHECK(std::filesystem::is_regular_file(o->text_file), "--text-file {}: no such file", o->text_file);
    std::ifstream f(o->text_file, std::ios::binary);
    DI_CHECK(f.good(), "--text-file {}: cannot open", o->text_file);
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string text = ss.str();
    DI_CHECK(!text.empty(), "--text-file {}: the file is empty", o->text_file);
    const std::string tok_json = (std::filesystem::path(o->model) / "tokenizer.json").string();
    DI_CHECK(std::filesystem::is_regular_file(tok_json),
             "perplexity needs a tokenizer: {} does not exist (the model directory must hold tokenizer.json)",
             tok_json);
    const Tokenizer tok = Tokenizer::from_pretrained(o->model);
    std::vector<int32_t> ids = tok.encode(text, false);
    if (o->bos) {
      DI_CHECK(tok.bos_id() >= 0, "--add-bos: the tokenizer has no BOS token");
      ids.insert(ids.begin(), tok.bos_id());
    }
    if (o->show_ids) {
      std::string list;
      for (size_t i = 0; i < ids.size(); ++i) list += (i ? "," : "") + std::to_string(ids[i]);
      std::fprintf(stderr, "token ids: %s\n", list.c_str());
    }
    DI_CHECK(ids.size() >= 2, "--text-file {}: {} token(s); perplexity needs at least 2", o->text_file, ids.size());

    int64_t window = o->window > 0 ? o->window : (o->max_model_len > 0 ? o->max_model_len : 1024);
    if (o->max_model_len > 0) window = std::min(window, o->max_model_len);
    DI_CHECK(window >= 2, "the window must hold at least 2 tokens (got {})", window);
    const int64_t stride = o->stride > 0 ? o->stride : window;
    DI_CHECK(stride <= window, "--stride ({}) must not exceed the window ({})", stride, window);

    auto model = Model::load(o->model, o->num.resolved_device());
    const int64_t vocab = model->config().vocab_size;
    const ForwardOptions fo{o->num.numerics(), true, nullptr};
    const int64_t n = static_cast<int64_t>(ids.size());
    double nll = 0.0;
    int64_t scored = 0, windows = 0, prev_end = 0;
    for (int64_t s = 0; s < n - 1 && prev_end < n; s += stride) {
      const int64_t e = std::min(s + window, n);
      const int64_t first_target = std::max(s + 1, prev_end);
      if (first_target < e) {
        std::vector<int32_t> part(ids.begin() + s, ids.begin() + e);
        auto state = model->new_sequence();
        const Tensor logits = model->forward(part, *state, fo);
        DI_CHECK(logits.numel() == (e - s) * vocab, "perplexity: unexpected logits size {}", logits.numel());
        const float* p = logits.data<float>();
        for (int64_t t = first_target; t < e; ++t) {
          const float* row = p + (t - 1 - s) * vocab;  // position t-1 predicts token t
          double mx = row[0];
          for (int64_t v = 1; v < vocab; ++v) mx = std::max(mx, static_cast<double>(row[v]));
          double sum = 0.0;
          for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(row[v]) - mx);
          const int32_t target = ids[static_cast<size_t>(t)];
          DI_CHECK(target >= 0 && target < vocab, "token id {} is outside the model's vocabulary ({})", target, vocab);
          nll -= static_cast<double>(row[target]) - mx - std::log(sum);
          ++scored;
        }
        ++windows;
      }
      prev_end = e;
    }
    const double mean = nll / static_cast<double>(scored);
    std::printf("tokens: %lld\n", static_cast<long long>(n));
    std::printf("scored tokens: %lld\n", static_cast<long long>(scored));
    std::printf("windows: %lld (size %lld, stride %lld)\n", static_cast<long long>(windows),
                static_cast<long long>(window), static_cast<long long>(stride));
    std::printf("mean NLL: %.9f\n", mean);
    std::printf("perplexity: %.9f\n", std::exp(mean));
    return 0;
  };
}

}  // namespace deepinfer::cli
