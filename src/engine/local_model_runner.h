// LocalModelRunner: the ModelRunner over a Model (V4 or V4.1) in this process, on the model's device (CPU or
// CUDA): a SequenceState per sequence (in that device's memory), one
// forward_batch per step. On CUDA the rows to sample stay on the GPU (ModelRunnerOutput::device_logits,
// sampled there by ops::sample_rows); only prompt-logprob rows are copied to the host.
#pragma once

#include <memory>
#include <unordered_map>

#include "engine/model_runner.h"
#include "model/model.h"

namespace deepinfer {

class LocalModelRunner final : public ModelRunner {
 public:
  // replay_keep_tokens > 0: V4.1 bounded replay (SeqChunk::replay_from) for prefill chunks.
  // state_budget_bytes > 0: sequences take their window rings, compressed entries and index keys
  // from page pools that never grow past that many bytes each (the KvCacheManager's budget);
  // 0: every sequence allocates its own.
  LocalModelRunner(std::unique_ptr<Model> model, const ops::Numerics& numerics, int64_t replay_keep_tokens = 0,
                   int64_t state_budget_bytes = 0);
  const StatePools& pools() const { return pools_; }

  ModelRunnerOutput execute(const SchedulerOutput& out) override { return run(out, true); }
  ModelRunnerOutput execute_queued(const SchedulerOutput& out) override { return run(out, false); }
  void free(int64_t seq_id) override { states_.erase(seq_id); }
  int64_t num_states() const override { return static_cast<int64_t>(states_.size()); }

  const Model& model() const { return *model_; }
  // Whether the rows to sample stay on the model's device as ModelRunnerOutput::device_logits (default: on
  // for a model on CUDA, off on the CPU). Tests set it both ways: off on CUDA gives host rows for the CPU
  // sampler; on for a CPU model runs the device path's plumbing with CPU tensors.
  void set_device_logits(bool on) { opts_.logits_device = on; }
  bool device_logits() const { return opts_.logits_device; }
  // The state held for seq_id, or nullptr (tests compare it with the KV accounting).
  const SequenceState* state(int64_t seq_id) const;

 private:
  ModelRunnerOutput run(const SchedulerOutput& out, bool wait);

  std::unique_ptr<Model> model_;
  ForwardOptions opts_;
  int64_t replay_keep_ = 0;
  StatePools pools_;  // declared before states_: outlives them
  std::unordered_map<int64_t, std::unique_ptr<SequenceState>> states_;
};

}  // namespace deepinfer
