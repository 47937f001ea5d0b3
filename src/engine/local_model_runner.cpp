#include "engine/local_model_runner.h"

#include <algorithm>
#include <cstring>

#include "deepinfer/error.h"
#include "ops/ops.h"

namespace deepinfer {

LocalModelRunner::LocalModelRunner(std::unique_ptr<Model> model, const ops::Numerics& numerics,
                                   int64_t replay_keep_tokens, int64_t state_budget_bytes)
    : model_(std::move(model)), replay_keep_(replay_keep_tokens) {
  DI_CHECK(model_ != nullptr, "LocalModelRunner: no model");
  if (state_budget_bytes > 0) {
    const ModelConfig& cfg = model_->config();
    auto pool = [&](int64_t page_floats) {
      return std::make_shared<PagePool>(page_floats, state_budget_bytes / (page_floats * 4), model_->device());
    };
    pools_.window = pool(cfg.window_size * cfg.head_dim);
    pools_.compressed = pool(RowPages::kRowsPerPage * cfg.head_dim);
    pools_.index_keys = pool(RowPages::kRowsPerPage * cfg.index_head_dim);
  }
  opts_.numerics = numerics;
  opts_.all_logits = false;
  opts_.logits_device = model_->device() != Device::kCPU;
}

const SequenceState* LocalModelRunner::state(int64_t seq_id) const {
  auto it = states_.find(seq_id);
  return it == states_.end() ? nullptr : it->second.get();
}

ModelRunnerOutput LocalModelRunner::run(const SchedulerOutput& out, bool wait) {
  for (int64_t id : out.freed_seq_ids) states_.erase(id);
  ModelRunnerOutput result;
  result.vocab = model_->config().vocab_size;
  if (out.seqs.empty()) return result;

  std::vector<SeqChunk> batch;
  batch.reserve(out.seqs.size());
  for (const ScheduledSeq& s : out.seqs) {
    std::unique_ptr<SequenceState>& st = states_[s.seq_id];
    if (s.start_pos == 0) st = model_->new_sequence(pools_);
    DI_CHECK(st != nullptr && st->num_tokens == s.start_pos,
             "model runner: sequence {} is scheduled from position {} but its state holds {} tokens", s.seq_id,
             s.start_pos, st ? st->num_tokens : -1);
    SeqChunk chunk{st.get(), s.tokens, s.want_logits, s.want_prompt_logits};
    // Bounded replay: the prompt's decoder layers run only over its last replay_keep_ tokens (never
    // when every row's logits are wanted). Counted from the prompt, not from what is known now, so
    // the re-prefill of a preempted sequence (prompt + outputs) rebuilds exactly the state it had:
    // its outputs went through every layer when they were decoded.
    if (replay_keep_ > 0 && !s.want_prompt_logits && model_->config().family == ModelFamily::kV41)
      chunk.replay_from = std::max<int64_t>(0, s.num_prompt_tokens - replay_keep_);
    batch.push_back(std::move(chunk));
    if (s.want_logits) result.seq_ids.push_back(s.seq_id);
  }
  Tensor logits = model_->forward_batch(batch, opts_);
  // forward_batch returns, per chunk in order, all its rows (all_logits) or its last row.
  auto logit_rows = [](const ScheduledSeq& s) -> int64_t {
    return s.want_prompt_logits ? static_cast<int64_t>(s.tokens.size()) : s.want_logits ? 1 : 0;
  };
  int64_t rows_used = 0;
  for (const ScheduledSeq& s : out.seqs) rows_used += logit_rows(s);
  DI_CHECK(logits.size(0) == rows_used && logits.size(1) == result.vocab,
           "model runner: forward returned {} logits rows, expected {}", logits.size(0), rows_used);
  const size_t V = static_cast<size_t>(result.vocab);
  if (opts_.logits_device) {
    // The rows to sample stay on the device: the last row of each chunk that wants one. Without prompt
    // logprobs (the usual step) those are all the rows, in order; otherwise they are gathered there and
    // only the prompt rows come to the host.
    std::vector<int32_t> wanted;
    int64_t r = 0;
    for (const ScheduledSeq& s : out.seqs) {
      const int64_t n = logit_rows(s);
      if (s.want_prompt_logits) {
        result.prompt_seq_ids.push_back(s.seq_id);
        result.prompt_pos.push_back(s.start_pos);
        result.prompt_rows.push_back(n);
        const Tensor host = logits.slice(0, r, r + n).to(Device::kCPU);
        result.prompt_logits.insert(result.prompt_logits.end(), host.data<float>(), host.data<float>() + n * V);
      }
      if (s.want_logits) wanted.push_back(static_cast<int32_t>(r + n - 1));
      r += n;
    }
    // Each chunk gives at most one row to sample: as many as there are rows means every row, in order.
    if (!wanted.empty() && wanted.size() == static_cast<size_t>(rows_used)) {
      result.device_logits = logits;
    } else if (!wanted.empty()) {
      Tensor ids = Tensor::empty({static_cast<int64_t>(wanted.size())}, DType::kI32);
      std::copy(wanted.begin(), wanted.end(), ids.data<int32_t>());
      result.device_logits = ops::gather_rows(logits, ids.to(logits.device()));
    }
    // execute waits here for the model's queued GPU work, so that EngineStats keeps model and sampling time apart;
    // execute_queued leaves it to the sampler queued behind it (one wait for both: the engine's usual step).
    if (wait) ops::synchronize(logits.device());
    return result;
  }
  const float* p = logits.data<float>();
  for (const ScheduledSeq& s : out.seqs) {
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    if (s.want_prompt_logits) {
      result.prompt_seq_ids.push_back(s.seq_id);
      result.prompt_pos.push_back(s.start_pos);
      result.prompt_rows.push_back(n);
      result.prompt_logits.insert(result.prompt_logits.end(), p, p + n * V);
      if (s.want_logits) result.logits.insert(result.logits.end(), p + (n - 1) * V, p + n * V);
      p += n * V;
    } else if (s.want_logits) {
      result.logits.insert(result.logits.end(), p, p + V);
      p += V;
    }
  }
  return result;
}

}  // namespace deepinfer
