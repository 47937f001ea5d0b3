#include "engine/stop_checker.h"

#include <algorithm>

namespace deepinfer {

std::optional<StopDecision> check_stop(const Sequence& seq, int32_t eos_id, int64_t max_model_len) {
  const SamplingParams& p = seq.request->params;
  if (seq.output_token_ids.empty()) return std::nullopt;
  if (seq.num_output_tokens() >= p.min_tokens) {
    const int32_t last = seq.output_token_ids.back();
    if (!p.ignore_eos && last == eos_id) return StopDecision{FinishReason::kStop, std::nullopt};
    if (std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), last) != p.stop_token_ids.end())
      return StopDecision{FinishReason::kStop, last};
  }
  if (seq.num_output_tokens() >= p.max_tokens || seq.num_tokens() >= max_model_len)
    return StopDecision{FinishReason::kLength, std::nullopt};
  return std::nullopt;
}

}  // namespace deepinfer
