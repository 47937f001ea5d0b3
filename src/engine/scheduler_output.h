// The plain records that cross between deciding (Scheduler), doing (ModelRunner) and sampling:
// no pointers into scheduler state (vLLM v1 `sched/output.py`, `outputs.py`); the one tensor is the
// runner's logits when they stay on the GPU for sampling there.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "deepinfer/tensor.h"
#include "engine/request.h"

namespace deepinfer {

// One sequence's work in a step. A step is a token count per sequence: a whole prompt, a prefill
// chunk, the re-prefill after preemption and a decode token are all just `tokens`.
struct ScheduledSeq {
  int64_t seq_id = 0;
  int64_t start_pos = 0;            // = num_computed_tokens before the step; 0 means a fresh state
  std::vector<int32_t> tokens;      // the tokens to run, at positions start_pos ...
  bool want_logits = false;         // the chunk reaches the end of the known tokens: sample after it
  bool want_prompt_logits = false;  // every row of the chunk, for prompt_logprobs
  int64_t num_prompt_tokens = 0;    // the request's prompt (bounded replay counts back from its end)
};

struct SchedulerOutput {
  std::vector<ScheduledSeq> seqs;      // running first (in running order), then newly started
  int64_t num_scheduled_tokens = 0;    // sum of tokens over seqs (<= max_num_batched_tokens)
  std::vector<int64_t> freed_seq_ids;  // finished, aborted or preempted since the last step:
                                       // the runner drops their state before running seqs
  bool empty() const { return seqs.empty(); }
};

// The model's answer: one logits row per sequence that wanted logits, in SchedulerOutput order, either
// on the host (`logits`) or, when the model runs on a GPU, left there (`device_logits`; `logits` is
// empty then) so that the sampler reads them in place and only the sampled tokens cross the bus.
struct ModelRunnerOutput {
  std::vector<int64_t> seq_ids;
  int64_t vocab = 0;
  std::vector<float> logits;  // [seq_ids.size(), vocab] on the host, unless device_logits is defined
  Tensor device_logits;       // float32 [seq_ids.size(), vocab] on the model's device, or undefined
  // Row i on the host; only when device_logits is undefined.
  const float* row(size_t i) const { return logits.data() + i * static_cast<size_t>(vocab); }
  // prompt_logprobs (always on the host: rare, and read by the CPU): for prompt_seq_ids[i], prompt_rows[i]
  // consecutive rows of prompt_logits, the first at position prompt_pos[i] (the logits after that
  // position's token).
  std::vector<int64_t> prompt_seq_ids, prompt_pos, prompt_rows;
  std::vector<float> prompt_logits;
};

// A token the sampler picked for a sequence (fed back through Scheduler::update_from_output).
struct SampledToken {
  int64_t seq_id = 0;
  int32_t token = -1;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top_logprobs;
};

// What update_from_output reports per sequence that got a token (or was finished) this step.
struct SeqUpdate {
  int64_t seq_id = 0;
  std::string request_id;
  int child_index = 0;
  std::optional<SampledToken> token;
  std::optional<FinishReason> finish_reason;  // set when the sequence finished this step
  std::optional<int32_t> stop_token;          // the stop_token_ids entry that ended it
};

}  // namespace deepinfer
