// Subcommands of the `deepinfer` binary. Each registers its options on the app and returns the
// function that runs it.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

#include "ops/ops.h"

namespace deepinfer::cli {

using Runner = std::function<int()>;
Runner add_logits(CLI::App& app);
Runner add_generate(CLI::App& app);

// Shared numerics flags: --dtype bfloat16|float32, --no-simulate-qat.
struct NumericsFlags {
  std::string dtype = "bfloat16";
  bool no_qat = false;
  void add(CLI::App* cmd);
  ops::Numerics numerics() const;
};

// "0,17,5" -> {0, 17, 5}; throws deepinfer::Error on anything else.
std::vector<int32_t> parse_ids(const std::string& s, const char* what);

}  // namespace deepinfer::cli
