// ModelRunner: does what the scheduler decided. Takes a SchedulerOutput, returns one logits row
// per sequence that wanted logits; owns each sequence's model state, keyed by seq_id.
#pragma once

#include <cstdint>

#include "engine/scheduler_output.h"

namespace deepinfer {

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  // Drops the state of out.freed_seq_ids, then runs out.seqs in one batch. A ScheduledSeq with
  // start_pos 0 starts a fresh state; otherwise the held state must be at start_pos.
  virtual ModelRunnerOutput execute(const SchedulerOutput& out) = 0;
  // As execute, but device_logits may still be being computed on the device (queued, not waited for): for a caller
  // that queues the sampler right behind the model, which waits once for both. Default: execute.
  virtual ModelRunnerOutput execute_queued(const SchedulerOutput& out) { return execute(out); }
  // Drops one sequence's state (no-op for an unknown id).
  virtual void free(int64_t seq_id) = 0;
  // Sequences whose state the runner holds (for tests and leak checks).
  virtual int64_t num_states() const = 0;
};

}  // namespace deepinfer
