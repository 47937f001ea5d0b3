// Sampling one token from one row of logits. Deterministic: the result depends only on the logits,
// the params, the history (penalties) and (seed, output position) through a counter-based
// generator, never on the batch a sequence ran in or on other sequences.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "sampling/sampling_params.h"

namespace deepinfer {

struct SampleInput {
  const float* logits = nullptr;  // [vocab], raw model output (FP32)
  int64_t vocab = 0;
  const SamplingParams* params = nullptr;
  uint64_t seed = 0;              // the sequence's seed (request seed, or derived per child for n > 1)
  int64_t position = 0;           // index of the token being sampled among the sequence's outputs
  const std::vector<int32_t>* prompt_ids = nullptr;  // for repetition_penalty
  const std::vector<int32_t>* output_ids = nullptr;  // for penalties and min_tokens
  int32_t eos_id = -1;            // masked while output count < min_tokens (with stop_token_ids)
  const std::vector<uint32_t>* allowed_mask = nullptr;  // optional bitmask over the vocab (grammar)
};

struct SampleResult {
  int32_t token = -1;
  float logprob = 0.0f;  // of the sampled token
  std::vector<std::pair<int32_t, float>> top_logprobs;  // when params->logprobs > 0
};

SampleResult sample(const SampleInput& in);

// Seed of child i of a request with seed s (n > 1): a fixed mix of (s, i).
uint64_t child_seed(uint64_t request_seed, uint64_t child);

}  // namespace deepinfer
