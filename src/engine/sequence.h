// Sequence: one generation stream of a request (n > 1 gives n sequences, each with its own seed).
// Tokens are prompt + outputs; num_computed_tokens of them are in the model state. The scheduler
// owns sequences; nothing outside the engine holds pointers to them.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "engine/request.h"

namespace deepinfer {

enum class SequenceStatus : uint8_t { kWaiting, kRunning, kPreempted, kFinished };

struct Sequence {
  int64_t seq_id = 0;  // unique in the engine
  std::shared_ptr<const Request> request;
  int child_index = 0;
  uint64_t seed = 0;  // request seed (n == 1) or child_seed(request seed, child_index)
  SequenceStatus status = SequenceStatus::kWaiting;
  std::vector<int32_t> output_token_ids;
  // Tokens whose state the runner holds. Reset to 0 by preemption: the re-prefill then runs the
  // prompt and the outputs already generated, as known tokens.
  int64_t num_computed_tokens = 0;
  int64_t num_preemptions = 0;
  std::optional<FinishReason> finish_reason;

  const std::vector<int32_t>& prompt() const { return request->prompt_token_ids; }
  int64_t num_prompt_tokens() const { return static_cast<int64_t>(prompt().size()); }
  int64_t num_output_tokens() const { return static_cast<int64_t>(output_token_ids.size()); }
  int64_t num_tokens() const { return num_prompt_tokens() + num_output_tokens(); }
  int32_t token_at(int64_t i) const {
    return i < num_prompt_tokens() ? prompt()[i] : output_token_ids[i - num_prompt_tokens()];
  }
  bool is_finished() const { return status == SequenceStatus::kFinished; }
};

}  // namespace deepinfer
