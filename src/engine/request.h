// Request: what a client asks for (prompt ids + SamplingParams), and RequestOutput: what it gets
// back, shaped like vLLM's `RequestOutput` / `CompletionOutput`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "sampling/sampling_params.h"

namespace deepinfer {

struct Request {
  std::string request_id;
  std::vector<int32_t> prompt_token_ids;
  SamplingParams params;
  double arrival_time = 0.0;  // seconds, steady clock
  // The request's seed: params.seed, or one drawn from the engine's generator at arrival. Every
  // random draw depends only on (seed of the sequence, output position), so a request's tokens do
  // not depend on the batch, the order or preemption. Child i of n > 1 samples with child_seed(seed, i).
  uint64_t seed = 0;
};

// Why a sequence stopped. kStop: EOS, a stop token or a stop string; kLength: max_tokens or
// max_model_len; kAbort: aborted by the client or rejected.
enum class FinishReason : uint8_t { kStop, kLength, kAbort };
const char* finish_reason_name(FinishReason r);  // "stop" | "length" | "abort"

struct TokenLogprobs {
  int32_t token = -1;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;  // the params.logprobs most likely tokens
};

struct CompletionOutput {
  int index = 0;                        // child index (0..n-1)
  std::vector<int32_t> token_ids;       // generated tokens (an EOS / stop token that ended it included)
  std::string text;                     // decoded text, only when a tokenizer is attached; cut before a stop string
  std::vector<TokenLogprobs> logprobs;  // one per token when params.logprobs >= 0
  double cumulative_logprob = 0.0;      // sum of the sampled tokens' logprobs
  std::optional<std::string> finish_reason;  // "stop" | "length" | "abort"; empty while running
  // The stop token id or stop string that ended it (vLLM's stop_reason); monostate for EOS/length.
  std::variant<std::monostate, int32_t, std::string> stop_reason;
  bool finished() const { return finish_reason.has_value(); }
};

struct RequestOutput {
  std::string request_id;
  std::vector<int32_t> prompt_token_ids;
  std::vector<CompletionOutput> outputs;  // n entries, by child index
  bool finished = false;                  // all children finished
  std::optional<std::string> error;       // set when the request was rejected (then finish_reason "abort")
  // params.prompt_logprobs >= 0: one entry per prompt token, the first empty (nothing predicts it),
  // entry i the raw logprob of prompt token i given tokens 0..i-1 plus the top prompt_logprobs tokens.
  std::vector<std::optional<TokenLogprobs>> prompt_logprobs;
};

}  // namespace deepinfer
