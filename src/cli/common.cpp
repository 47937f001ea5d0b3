#include <charconv>

#include "cli/commands.h"
#include "deepinfer/error.h"

namespace deepinfer::cli {

void NumericsFlags::add(CLI::App* cmd) {
  cmd->add_option("--device", device, "where the model runs: cuda, cpu, or auto (cuda when a GPU is visible)")
      ->check(CLI::IsMember({"auto", "cuda", "cpu"}));
  cmd->add_option("--dtype", dtype, "activation precision between ops: bfloat16 (the model's contract) or float32")
      ->check(CLI::IsMember({"bfloat16", "float32"}));
  cmd->add_flag("--no-simulate-qat", no_qat, "turn off the FP8/FP4 fake-quantisation sites");
}

ops::Numerics NumericsFlags::numerics() const { return ops::Numerics{dtype == "bfloat16", !no_qat}; }

std::vector<int32_t> parse_ids(const std::string& s, const char* what) {
  std::vector<int32_t> out;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    std::string tok = s.substr(i, j - i);
    while (!tok.empty() && tok.front() == ' ') tok.erase(tok.begin());
    while (!tok.empty() && tok.back() == ' ') tok.pop_back();
    int32_t v = 0;
    auto [p, ec] = std::from_chars(tok.data(), tok.data() + tok.size(), v);
    DI_CHECK(!tok.empty() && ec == std::errc() && p == tok.data() + tok.size() && v >= 0,
             "{}: '{}' is not a non-negative token id (expected a comma-separated list like 0,17,5)", what, tok);
    out.push_back(v);
    i = j + 1;
  }
  DI_CHECK(!out.empty(), "{}: no token ids given", what);
  return out;
}

}  // namespace deepinfer::cli
