// Token-level stop rules (vLLM v1 `check_stop`), applied after each appended token. Stop strings
// need text and live in the OutputProcessor.
#pragma once

#include <cstdint>
#include <optional>

#include "engine/sequence.h"

namespace deepinfer {

struct StopDecision {
  FinishReason reason = FinishReason::kStop;
  std::optional<int32_t> stop_token;  // the stop_token_ids entry that matched
};

// Order: nothing before min_tokens; EOS (unless ignore_eos); stop_token_ids; then length
// (max_tokens outputs, or max_model_len tokens in all).
std::optional<StopDecision> check_stop(const Sequence& seq, int32_t eos_id, int64_t max_model_len);

}  // namespace deepinfer
