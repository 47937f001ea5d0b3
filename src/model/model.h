// The DeepSeek-V4 and V4.1 models: embedding, mHC stream, attention + MoE blocks (+ Engram in
// V4.1), head. `Model` is what the engine and the CLI hold; ModelV4 / ModelV41 are the forwards.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "deepinfer/model_config.h"
#include "io/checkpoint.h"
#include "model/engram_hash.h"
#include "model/state.h"
#include "model/weights.h"
#include "ops/ops.h"

namespace deepinfer {

// Discrete decisions recorded during a forward, for comparison with references.
struct Trace {
  // layer -> [T * n_activated] routed expert ids per token, sorted ascending
  std::map<int64_t, std::vector<int32_t>> experts;
  // indexer layer -> [T * index_topk] selected compressed-entry ids per token, sorted ascending, -1 padded
  std::map<int64_t, std::vector<int32_t>> indexer;
  // V4.1 candidate source -> [T * candidate_topk_blocks] kept candidate blocks per token, sorted, -1 padded
  std::map<int64_t, std::vector<int32_t>> candidates;
};

struct ForwardOptions {
  ops::Numerics numerics;
  bool all_logits = true;  // logits for every token, or only the last
  Trace* trace = nullptr;  // optional
  // The logits stay on the model's device (for sampling there, ops::sample_rows) instead of coming back to
  // the host. A batch that wants no logits still returns its empty [0, vocab] tensor on the host.
  bool logits_device = false;
};

// One sequence's part of a batched forward: its next tokens (a prefill chunk or one decode token)
// and which logits it wants back.
struct SeqChunk {
  SequenceState* state = nullptr;
  std::vector<int32_t> tokens;
  bool want_logits = true;  // the logits of the chunk's last token
  bool all_logits = false;  // ... or of every token of the chunk (prompt logprobs, verification)
  // V4.1 SWA bounded replay (§5): positions below this skip the decoder layers (those after the
  // last kv source); their window attention starts here. 0: exact full prefill. Rows whose logits
  // are wanted must not be skipped.
  int64_t replay_from = 0;
};

// A loaded model of either family. One forward serves prefill, chunked prefill and one-token
// decode: each sequence runs its tokens at positions state.num_tokens... and its state advances.
class Model {
 public:
  virtual ~Model() = default;
  // Loads config.json and the checkpoint in `dir` and builds the model of its family (V4 or V4.1);
  // throws deepinfer::Error on any mismatch.
  // device: where the weights, the activations and the sequences' state live (kCUDA uploads the
  // weights, except the Engram tables and projections, which stay on the host).
  static std::unique_ptr<Model> load(const std::string& dir, Device device = Device::kCPU);

  const ModelConfig& config() const { return cfg_; }
  Device device() const { return device_; }
  std::unique_ptr<SequenceState> new_sequence(const StatePools& pools = {}) const {
    return std::make_unique<SequenceState>(cfg_, pools, device_);
  }
  // Returns float32 logits [T or 1, vocab] on the host (on the model's device with opts.logits_device).
  Tensor forward(const std::vector<int32_t>& tokens, SequenceState& state, const ForwardOptions& opts) const;
  // Several sequences in one forward: their tokens are stacked into one batch for every GEMM and
  // per-token op (the attention projections included); only attention's state-dependent middle runs
  // per sequence on its own state. Returns the wanted logits rows, sequence by sequence in batch order,
  // [rows, vocab] on the host (on the model's device with opts.logits_device). With the batch-invariant
  // kernels (the default) every row equals what the sequence would get alone. opts.all_logits is ignored
  // (each chunk says what it wants); opts.trace records the stacked rows.
  virtual Tensor forward_batch(const std::vector<SeqChunk>& batch, const ForwardOptions& opts) const = 0;
  // Stacks the linears that share an input (stack_linears in model/weights.h; the same logits to the bit).
  // A CUDA load does it; on the CPU it is there for the tests. Returns how many pairs were stacked.
  virtual int stack_linears() = 0;
  // Turns the CUDA graphs of the decode step on (the default on CUDA, DEEPINFER_CUDA_GRAPHS permitting) or off
  // (--enforce-eager; dropping the captured graphs). Same logits either way. No effect on the CPU.
  void set_graphs(bool on);
  // How the decode steps' dense pieces ran so far (captured into CUDA graphs, replayed, eager); zeros on the CPU.
  ops::SegmentGraphs::Stats graph_stats() const { return graphs_ ? graphs_->stats() : ops::SegmentGraphs::Stats{}; }

 protected:
  // Checks the batch and stacks its tokens: offsets[b]..offsets[b+1] are sequence b's rows.
  std::vector<int32_t> stack_batch(const std::vector<SeqChunk>& batch, std::vector<int64_t>& offsets) const;
  // A decode step's dense pieces (the layer's input mixing and attention projections; its output projection, FFN
  // mixing and MoE) as CUDA graphs (ops::SegmentGraphs): begin_graphs says whether this forward replays them (a
  // decode-only batch on CUDA of a size that graphs_enabled takes, no trace, no dump), run_piece runs one of them
  // (key: its place in the step) through graphs_ then, else directly, and end_graphs closes the step.
  bool begin_graphs(const std::vector<SeqChunk>& batch, const ForwardOptions& opts, int64_t rows) const;
  std::vector<Tensor> run_piece(bool graphs, int64_t key, const std::vector<Tensor>& inputs,
                                const ops::SegmentFn& fn) const;
  void end_graphs(bool graphs) const;
  // Where piece `key` takes its input i from during a replay (ops::SegmentGraphs::input_buffer; undefined otherwise):
  // the attention writes o there, so the replay copies nothing in.
  Tensor piece_input(bool graphs, int64_t key, size_t i) const;
  // Each stacked row's position on the device (int64 [T]; undefined on the CPU): ops::DevicePositions binds it.
  Tensor device_positions(const std::vector<int64_t>& positions) const;
  // Each stacked row's position: sequence b's rows offsets[b]..offsets[b+1] run from starts[b] on.
  static std::vector<int64_t> stacked_positions(const std::vector<int64_t>& starts,
                                                const std::vector<int64_t>& offsets);
  // The rows whose logits the batch wants, in order.
  static std::vector<int64_t> wanted_rows(const std::vector<SeqChunk>& batch, const std::vector<int64_t>& offsets);
  // Whether `rows` is 0, 1, ..., n - 1 (every row wanted, in order: a decode step), so the head's gather is skipped.
  static bool every_row(const std::vector<int64_t>& rows, int64_t n);
  // The embedding rows of `tokens`, expanded to hc identical copies: [T, hc, dim].
  Tensor embed_stream(const Tensor& embed, const std::vector<int32_t>& tokens) const;

  ModelConfig cfg_;
  Device device_ = Device::kCPU;
  Checkpoint ckpt_;                                     // owns the mappings the weights borrow
  std::vector<ops::RopeFreqs> rope_;                    // per layer
  mutable std::unique_ptr<ops::SegmentGraphs> graphs_;  // a CUDA model's (one forward at a time)
  // What every family's load does first: threads, the config checks the forward relies on, the
  // checkpoint mapping and the RoPE tables (the weights are bound by the family).
  void open(const std::string& dir, const ModelConfig& cfg, Device device);
  void init_rope();
};

class ModelV4 final : public Model {
 public:
  static std::unique_ptr<ModelV4> load(const std::string& dir, const ModelConfig& cfg, Device device);
  Tensor forward_batch(const std::vector<SeqChunk>& batch, const ForwardOptions& opts) const override;
  int stack_linears() override { return deepinfer::stack_linears(w_.layers); }

 private:
  ModelWeights w_;
};

class ModelV41 final : public Model {
 public:
  static std::unique_ptr<ModelV41> load(const std::string& dir, const ModelConfig& cfg, Device device);
  Tensor forward_batch(const std::vector<SeqChunk>& batch, const ForwardOptions& opts) const override;
  int stack_linears() override { return deepinfer::stack_linears(w_.layers); }

 private:
  ModelWeightsV41 w_;
  EngramHash engram_;
  mutable std::mutex initial_pre_mu_;
  mutable Tensor initial_pre_;  // layer 0's incoming pre-mix for the most rows seen so far (read-only)
};

}  // namespace deepinfer
