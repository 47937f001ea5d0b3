// Subcommands of the `deepinfer` binary. Each registers its options on the app and returns the
// function that runs it.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

#include "engine/engine_args.h"
#include "ops/ops.h"

namespace deepinfer::cli {

using Runner = std::function<int()>;
Runner add_logits(CLI::App& app);
Runner add_generate(CLI::App& app);
Runner add_bench(CLI::App& app);
Runner add_perplexity(CLI::App& app);
Runner add_chat(CLI::App& app);
Runner add_serve(CLI::App& app);

// Shared model flags: --device cuda|cpu|auto, --dtype bfloat16|float32, --no-simulate-qat.
struct NumericsFlags {
  std::string device = env_value("DEEPINFER_DEVICE");
  std::string dtype = "bfloat16";
  bool no_qat = false;
  void add(CLI::App* cmd);
  ops::Numerics numerics() const;
  Device resolved_device() const { return resolve_device(device); }
};

// Shared engine flags (vLLM names): --max-num-batched-tokens, --max-num-seqs, --max-model-len,
// --kv-cache-memory, --seed, --no-async-scheduling, plus the numerics flags. Defined in cmd_bench.cpp.
struct EngineFlags {
  int64_t max_num_batched_tokens = 2048;
  int64_t max_num_seqs = 64;
  int64_t max_model_len = 0;  // 0: the config's max_position_embeddings
  int64_t kv_cache_memory = int64_t{4} << 30;
  uint64_t seed = 0;
  bool no_async_scheduling = false;
  bool enforce_eager = false;
  NumericsFlags num;
  void add(CLI::App* cmd);
  EngineArgs args(const std::string& model) const;
};

// "0,17,5" -> {0, 17, 5}; throws deepinfer::Error on anything else.
std::vector<int32_t> parse_ids(const std::string& s, const char* what);

}  // namespace deepinfer::cli
