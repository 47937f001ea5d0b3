// SamplingParams: vLLM's names and meanings, plus DeepInfer's seq_seed and so_args.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace deepinfer {

struct SamplingParams {
  int n = 1;
  float temperature = 1.0f;  // 0 = greedy
  float top_p = 1.0f;        // (0, 1]
  int top_k = 0;             // 0 or -1 = off
  float min_p = 0.0f;        // [0, 1]
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  int max_tokens = 16;
  int min_tokens = 0;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  int logprobs = -1;  // -1 = none; k >= 0: the sampled token's logprob + top-k
  int prompt_logprobs = -1;
  std::optional<uint64_t> seed;      // request seed; unseeded requests get one drawn at arrival
  std::optional<uint64_t> seq_seed;  // DeepInfer: sequence i of the request samples with seq_seed + i (overrides seed)
  bool skip_special_tokens = true;
  nlohmann::json so_args;  // structured output (wired by its own issue); null = none

  // Throws deepinfer::Error naming the offending field and its allowed range.
  void validate() const;
  static SamplingParams from_json(const nlohmann::json& j);  // vLLM/OpenAI field names
};

}  // namespace deepinfer
