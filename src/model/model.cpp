// What both families share: loading by family, batch stacking, the embedding and the RoPE tables.
#include "model/model.h"

#include <algorithm>
#include <cstring>

#include "core/debug_dump.h"
#include "cpu/threads.h"
#include "deepinfer/error.h"
#include "model/layers_v4.h"

namespace deepinfer {

std::unique_ptr<Model> Model::load(const std::string& dir, Device device) {
  const ModelConfig cfg = load_model_config(dir);
  if (cfg.family == ModelFamily::kV41) return ModelV41::load(dir, cfg, device);
  return ModelV4::load(dir, cfg, device);
}

void Model::open(const std::string& dir, const ModelConfig& cfg, Device device) {
  cpu::configure_threads();
  ops::init_device(device);
  device_ = device;
  cfg_ = cfg;
  DI_CHECK(!cfg.weights_fp8 || cfg.o_lora_rank % cfg.fp8_block == 0,
           "{}: o_lora_rank {} must be a multiple of the FP8 block {} (wo_a is split per group)", cfg.source,
           cfg.o_lora_rank, cfg.fp8_block);
  ckpt_ = Checkpoint::open(dir);
  init_rope();
  if (device == Device::kCUDA) graphs_ = std::make_unique<ops::SegmentGraphs>(device);
}

void Model::set_graphs(bool on) {
  if (device_ != Device::kCUDA) return;
  if (!on) graphs_.reset();
  if (on && !graphs_) graphs_ = std::make_unique<ops::SegmentGraphs>(device_);
}

bool Model::begin_graphs(const std::vector<SeqChunk>& batch, const ForwardOptions& opts, int64_t rows) const {
  if (!graphs_ || opts.trace != nullptr || dump_enabled() || !ops::graphs_enabled(device_, rows)) return false;
  for (const SeqChunk& c : batch)
    if (c.tokens.size() != 1) return false;  // prefill chunks: shapes follow the chunk lengths
  // A replayed piece's RoPE reads the tables without growing them: cover this step's positions first.
  int64_t next = 0;
  for (const SeqChunk& c : batch) next = std::max(next, c.state->num_tokens + 1);
  for (const ops::RopeFreqs& f : rope_) ops::rope_reserve(f, next, device_);
  return graphs_->begin_step(rows);
}

std::vector<Tensor> Model::run_piece(bool graphs, int64_t key, const std::vector<Tensor>& inputs,
                                     const ops::SegmentFn& fn) const {
  return graphs ? graphs_->run(key, inputs, fn) : fn(inputs);
}

void Model::end_graphs(bool graphs) const {
  if (graphs) graphs_->end_step();
}

Tensor Model::piece_input(bool graphs, int64_t key, size_t i) const {
  return graphs ? graphs_->input_buffer(key, i) : Tensor();
}

Tensor Model::device_positions(const std::vector<int64_t>& positions) const {
  if (device_ == Device::kCPU) return Tensor();
  Tensor t = Tensor::empty({static_cast<int64_t>(positions.size())}, DType::kI64);
  std::copy(positions.begin(), positions.end(), t.data<int64_t>());
  return t.to(device_);
}

Tensor Model::forward(const std::vector<int32_t>& tokens, SequenceState& state, const ForwardOptions& opts) const {
  SeqChunk chunk{&state, tokens, true, opts.all_logits};
  return forward_batch({chunk}, opts);
}

void Model::init_rope() {
  const ModelConfig& cfg = cfg_;
  rope_.clear();
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    // Compressed layers use compress_rope_theta with YaRN; window-only layers plain rope_theta.
    if (cfg.compress_ratio(l) > 0)
      rope_.push_back(ops::rope_freqs(cfg.rope_head_dim, cfg.compress_rope_theta, cfg.rope_factor, cfg.original_seq_len,
                                      cfg.beta_fast, cfg.beta_slow));
    else
      rope_.push_back(ops::rope_freqs(cfg.rope_head_dim, cfg.rope_theta, 1.0, 0, cfg.beta_fast, cfg.beta_slow));
  }
}

std::vector<int32_t> Model::stack_batch(const std::vector<SeqChunk>& batch, std::vector<int64_t>& offset) const {
  DI_CHECK(!batch.empty(), "forward: empty batch");
  offset.assign(batch.size() + 1, 0);
  std::vector<int32_t> tokens;
  for (size_t b = 0; b < batch.size(); ++b) {
    const SeqChunk& c = batch[b];
    DI_CHECK(c.state != nullptr && !c.tokens.empty(), "forward: sequence {} of the batch has no state or no tokens", b);
    DI_CHECK(static_cast<int64_t>(c.state->layers.size()) == cfg_.n_layers, "forward: state is for another model");
    for (size_t o = 0; o < b; ++o)
      DI_CHECK(batch[o].state != c.state, "forward: the same sequence appears twice in one batch");
    for (size_t i = 0; i < c.tokens.size(); ++i)
      DI_CHECK(c.tokens[i] >= 0 && c.tokens[i] < cfg_.vocab_size,
               "token id {} at index {} of sequence {} is outside the vocabulary [0, {})", c.tokens[i], i, b,
               cfg_.vocab_size);
    offset[b + 1] = offset[b] + static_cast<int64_t>(c.tokens.size());
    tokens.insert(tokens.end(), c.tokens.begin(), c.tokens.end());
  }
  return tokens;
}

std::vector<int64_t> Model::stacked_positions(const std::vector<int64_t>& starts, const std::vector<int64_t>& offsets) {
  std::vector<int64_t> pos(offsets.back());
  for (size_t b = 0; b < starts.size(); ++b)
    for (int64_t r = offsets[b]; r < offsets[b + 1]; ++r) pos[r] = starts[b] + (r - offsets[b]);
  return pos;
}

std::vector<int64_t> Model::wanted_rows(const std::vector<SeqChunk>& batch, const std::vector<int64_t>& offset) {
  std::vector<int64_t> rows;
  for (size_t b = 0; b < batch.size(); ++b) {
    if (batch[b].all_logits)
      for (int64_t r = offset[b]; r < offset[b + 1]; ++r) rows.push_back(r);
    else if (batch[b].want_logits)
      rows.push_back(offset[b + 1] - 1);
  }
  return rows;
}

bool Model::every_row(const std::vector<int64_t>& rows, int64_t n) {
  if (static_cast<int64_t>(rows.size()) != n) return false;
  for (int64_t i = 0; i < n; ++i)
    if (rows[static_cast<size_t>(i)] != i) return false;
  return true;
}

Tensor Model::embed_stream(const Tensor& embed, const std::vector<int32_t>& tokens) const {
  return ops::embedding(embed, ids_tensor(tokens, device_), cfg_.hc_mult);  // [T, hc, dim]: hc identical copies
}

}  // namespace deepinfer
