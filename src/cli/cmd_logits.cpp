// `deepinfer logits`: float32 little-endian logits [n_tokens, vocab] for every position, by one
// prefill forward or (--decode) one token at a time; --trace dumps routed experts and indexer picks.
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "cli/commands.h"
#include "deepinfer/error.h"
#include "model/model.h"

namespace deepinfer::cli {

namespace {
void write_file(const std::string& path, const void* data, size_t n) {
  std::ofstream f(path, std::ios::binary);
  DI_CHECK(f.good(), "cannot open {} for writing", path);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
  DI_CHECK(f.good(), "failed writing {}", path);
}
}  // namespace

Runner add_logits(CLI::App& app) {
  struct Opts {
    std::string model, ids, out, trace;
    bool decode = false;
    int chunk = 0;
    NumericsFlags num;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("logits", "write the logits of every position of a token sequence");
  cmd->add_option("--model", o->model, "model directory (config.json + safetensors)")->required();
  cmd->add_option("--input-ids", o->ids, "comma-separated token ids")->required();
  cmd->add_option("--out", o->out, "output file: float32 [n_tokens, vocab]")->required();
  cmd->add_option("--trace", o->trace, "directory for routed experts / indexer picks (int32 files)");
  cmd->add_flag("--decode", o->decode, "run one token per forward through the decode path");
  cmd->add_option("--chunk", o->chunk, "chunked prefill: at most this many tokens per forward")
      ->check(CLI::PositiveNumber);
  o->num.add(cmd);
  return [o] {
    std::vector<int32_t> ids = parse_ids(o->ids, "--input-ids");
    auto model = ModelV4::load(o->model);
    const ModelConfig& cfg = model->config();
    auto state = model->new_sequence();
    Trace trace;
    ForwardOptions fo{o->num.numerics(), true, o->trace.empty() ? nullptr : &trace};
    std::vector<float> logits;
    logits.reserve(ids.size() * cfg.vocab_size);
    auto append = [&](const Tensor& t) { logits.insert(logits.end(), t.data<float>(), t.data<float>() + t.numel()); };
    const size_t step = o->decode ? 1 : (o->chunk > 0 ? static_cast<size_t>(o->chunk) : ids.size());
    for (size_t i = 0; i < ids.size(); i += step) {
      std::vector<int32_t> part(ids.begin() + i, ids.begin() + std::min(ids.size(), i + step));
      append(model->forward(part, *state, fo));
    }
    write_file(o->out, logits.data(), logits.size() * sizeof(float));
    if (!o->trace.empty()) {
      std::filesystem::create_directories(o->trace);
      for (const auto& [l, v] : trace.experts)
        write_file(o->trace + "/experts.L" + std::to_string(l) + ".i32", v.data(), v.size() * 4);
      for (const auto& [l, v] : trace.indexer)
        write_file(o->trace + "/indexer.L" + std::to_string(l) + ".i32", v.data(), v.size() * 4);
    }
    std::fprintf(stderr, "wrote %zu x %lld logits to %s\n", ids.size(), static_cast<long long>(cfg.vocab_size),
                 o->out.c_str());
    return 0;
  };
}

}  // namespace deepinfer::cli
