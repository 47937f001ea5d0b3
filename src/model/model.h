// The DeepSeek-V4 model: embedding, mHC stream, attention + MoE blocks, head. One forward serves
// prefill, chunked prefill and one-token decode: it runs `tokens` at positions
// state.num_tokens ... and advances the state.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "deepinfer/model_config.h"
#include "io/checkpoint.h"
#include "model/state.h"
#include "model/weights.h"
#include "ops/ops.h"

namespace deepinfer {

// Discrete decisions recorded during a forward, for comparison with references.
struct Trace {
  // layer -> [T * n_activated] routed expert ids per token, sorted ascending
  std::map<int64_t, std::vector<int32_t>> experts;
  // C4 layer -> [T * index_topk] selected compressed-entry ids per token, sorted ascending, -1 padded
  std::map<int64_t, std::vector<int32_t>> indexer;
};

struct ForwardOptions {
  ops::Numerics numerics;
  bool all_logits = true;   // logits for every token, or only the last
  Trace* trace = nullptr;   // optional
};

// One sequence's part of a batched forward: its next tokens (a prefill chunk or one decode token)
// and which logits it wants back.
struct SeqChunk {
  SequenceState* state = nullptr;
  std::vector<int32_t> tokens;
  bool want_logits = true;   // the logits of the chunk's last token
  bool all_logits = false;   // ... or of every token of the chunk (prompt logprobs, verification)
};

class ModelV4 {
 public:
  // Loads config.json and the checkpoint in `dir`; throws deepinfer::Error on any mismatch.
  static std::unique_ptr<ModelV4> load(const std::string& dir);

  const ModelConfig& config() const { return cfg_; }
  std::unique_ptr<SequenceState> new_sequence() const { return std::make_unique<SequenceState>(cfg_); }
  // Returns float32 logits [T or 1, vocab].
  Tensor forward(const std::vector<int32_t>& tokens, SequenceState& state, const ForwardOptions& opts) const;
  // Several sequences in one forward: their tokens are stacked into one batch for every GEMM and
  // per-token op; attention runs per sequence on its own state. Returns the wanted logits rows,
  // sequence by sequence in batch order, [rows, vocab]. With the batch-invariant kernels (the
  // default) every row equals what the sequence would get alone. opts.all_logits is ignored
  // (each chunk says what it wants); opts.trace records the stacked rows.
  Tensor forward_batch(const std::vector<SeqChunk>& batch, const ForwardOptions& opts) const;

 private:
  ModelConfig cfg_;
  Checkpoint ckpt_;  // owns the mappings the weights borrow
  ModelWeights w_;
  std::vector<ops::RopeFreqs> rope_;  // per layer
};

}  // namespace deepinfer
