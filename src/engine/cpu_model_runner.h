// CpuModelRunner: the ModelRunner over a Model (V4 or V4.1) on the CPU: a SequenceState per sequence, one
// forward_batch per step.
#pragma once

#include <memory>
#include <unordered_map>

#include "engine/model_runner.h"
#include "model/model.h"

namespace deepinfer {

class CpuModelRunner final : public ModelRunner {
 public:
  // replay_keep_tokens > 0: V4.1 bounded replay (SeqChunk::replay_from) for prefill chunks.
  CpuModelRunner(std::unique_ptr<Model> model, const ops::Numerics& numerics, int64_t replay_keep_tokens = 0);

  ModelRunnerOutput execute(const SchedulerOutput& out) override;
  void free(int64_t seq_id) override { states_.erase(seq_id); }
  int64_t num_states() const override { return static_cast<int64_t>(states_.size()); }

  const Model& model() const { return *model_; }
  // The state held for seq_id, or nullptr (tests compare it with the KV accounting).
  const SequenceState* state(int64_t seq_id) const;

 private:
  std::unique_ptr<Model> model_;
  ForwardOptions opts_;
  int64_t replay_keep_ = 0;
  std::unordered_map<int64_t, std::unique_ptr<SequenceState>> states_;
};

}  // namespace deepinfer
