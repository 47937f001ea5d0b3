#include "engine/scheduler.h"

#include <algorithm>

#include "deepinfer/error.h"
#include "engine/stop_checker.h"
#include "sampling/sampler.h"

namespace deepinfer {

void SchedulerConfig::validate() const {
  DI_CHECK(max_num_batched_tokens > 0, "max_num_batched_tokens must be positive (got {})", max_num_batched_tokens);
  DI_CHECK(max_num_seqs > 0, "max_num_seqs must be positive (got {})", max_num_seqs);
  DI_CHECK(max_model_len > 0, "max_model_len must be positive (got {})", max_model_len);
  DI_CHECK(enable_chunked_prefill || max_num_batched_tokens >= max_model_len,
           "without chunked prefill max_num_batched_tokens ({}) must be >= max_model_len ({}): raise "
           "--max-num-batched-tokens, lower --max-model-len or enable chunked prefill",
           max_num_batched_tokens, max_model_len);
}

Scheduler::Scheduler(const SchedulerConfig& config, KvCacheManager& kv) : config_(config), kv_(kv) {
  config_.validate();
}

void Scheduler::add_request(std::shared_ptr<const Request> request) {
  DI_CHECK(request != nullptr, "add_request: null request");
  const Request& r = *request;
  const int64_t len = static_cast<int64_t>(r.prompt_token_ids.size());
  DI_CHECK(len > 0, "request '{}': the prompt is empty", r.request_id);
  DI_CHECK(len <= config_.max_model_len,
           "request '{}': the prompt ({} tokens) is longer than the maximum model length ({}); shorten it "
           "or raise --max-model-len",
           r.request_id, len, config_.max_model_len);
  DI_CHECK(r.params.n >= 1, "request '{}': n must be >= 1 (got {})", r.request_id, r.params.n);
  DI_CHECK(!request_seqs_.contains(r.request_id), "request id '{}' is already in use", r.request_id);
  std::vector<int64_t>& ids = request_seqs_[r.request_id];
  for (int i = 0; i < r.params.n; ++i) {
    auto seq = std::make_unique<Sequence>();
    seq->seq_id = next_seq_id_++;
    seq->request = request;
    seq->child_index = i;
    // seq_seed (DeepInfer) pins each sequence's draw stream directly: child i uses seq_seed + i, so
    // any child can be reproduced alone as an n = 1 request with seq_seed + i.
    if (r.params.seq_seed)
      seq->seed = *r.params.seq_seed + static_cast<uint64_t>(i);
    else
      seq->seed = r.params.n == 1 ? r.seed : child_seed(r.seed, static_cast<uint64_t>(i));
    ids.push_back(seq->seq_id);
    waiting_.push_back(seq.get());
    seqs_.emplace(seq->seq_id, std::move(seq));
  }
}

ScheduledSeq Scheduler::make_scheduled(const Sequence& seq, int64_t num_new_tokens) const {
  ScheduledSeq s;
  s.seq_id = seq.seq_id;
  s.start_pos = seq.num_computed_tokens;
  s.tokens.reserve(static_cast<size_t>(num_new_tokens));
  for (int64_t i = 0; i < num_new_tokens; ++i) s.tokens.push_back(seq.token_at(seq.num_computed_tokens + i));
  s.want_logits = seq.num_computed_tokens + num_new_tokens == seq.num_tokens();
  s.num_prompt_tokens = static_cast<int64_t>(seq.prompt().size());
  // Prompt logprobs come from the first child's prefill (a re-prefill after preemption recomputes
  // the same values).
  s.want_prompt_logits = seq.request->params.prompt_logprobs >= 0 && seq.child_index == 0 &&
                         seq.num_computed_tokens < static_cast<int64_t>(seq.prompt().size());
  return s;
}

SchedulerOutput Scheduler::schedule() {
  SchedulerOutput out;
  int64_t budget = config_.max_num_batched_tokens;
  bool preempted_any = false;

  // 1. Running sequences: decode tokens and unfinished prefills.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence* seq = running_[i];
    const int64_t num_new = std::min(seq->num_tokens() - seq->num_computed_tokens, budget);
    if (num_new <= 0) {
      ++i;
      continue;
    }
    bool fits = true;
    while (!kv_.allocate(*seq, num_new)) {
      Sequence* victim = running_.back();  // the most recently started
      preempt(victim);
      preempted_any = true;
      if (victim == seq) {
        fits = false;
        break;
      }
    }
    if (!fits) break;
    out.seqs.push_back(make_scheduled(*seq, num_new));
    budget -= num_new;
    ++i;
  }

  // 2. Waiting sequences, in order, while budget, seats and memory last.
  while (!preempted_any && !waiting_.empty() && budget > 0 &&
         static_cast<int64_t>(running_.size()) < config_.max_num_seqs) {
    Sequence* seq = waiting_.front();
    int64_t num_new = seq->num_tokens() - seq->num_computed_tokens;
    if (num_new > budget && !config_.enable_chunked_prefill) break;
    num_new = std::min(num_new, budget);
    if (!kv_.allocate(*seq, num_new)) break;
    waiting_.pop_front();
    seq->status = SequenceStatus::kRunning;
    running_.push_back(seq);
    out.seqs.push_back(make_scheduled(*seq, num_new));
    budget -= num_new;
  }

  out.num_scheduled_tokens = config_.max_num_batched_tokens - budget;
  out.freed_seq_ids = take_freed_seq_ids();
  return out;
}

std::vector<SeqUpdate> Scheduler::update_from_output(const SchedulerOutput& out,
                                                     const std::vector<SampledToken>& sampled) {
  for (const ScheduledSeq& s : out.seqs) {
    auto it = seqs_.find(s.seq_id);
    if (it == seqs_.end()) continue;  // finished meanwhile
    Sequence& seq = *it->second;
    DI_CHECK(seq.num_computed_tokens == s.start_pos && seq.status == SequenceStatus::kRunning,
             "update_from_output: sequence {} does not match the step that ran (stale SchedulerOutput?)", s.seq_id);
    seq.num_computed_tokens += static_cast<int64_t>(s.tokens.size());
  }
  std::vector<SeqUpdate> updates;
  for (const SampledToken& t : sampled) {
    auto it = seqs_.find(t.seq_id);
    if (it == seqs_.end()) continue;
    Sequence* seq = it->second.get();
    DI_CHECK(seq->num_computed_tokens == seq->num_tokens(),
             "update_from_output: sequence {} got a token before its known tokens were computed", t.seq_id);
    seq->output_token_ids.push_back(t.token);
    SeqUpdate u{seq->seq_id, seq->request->request_id, seq->child_index, t, std::nullopt, std::nullopt};
    if (auto stop = check_stop(*seq, config_.eos_token_id, config_.max_model_len)) {
      u.finish_reason = stop->reason;
      u.stop_token = stop->stop_token;
      finish(seq, stop->reason);
    }
    updates.push_back(std::move(u));
  }
  return updates;
}

std::vector<SeqUpdate> Scheduler::abort_request(const std::string& request_id) {
  std::vector<SeqUpdate> updates;
  auto it = request_seqs_.find(request_id);
  if (it == request_seqs_.end()) return updates;
  const std::vector<int64_t> ids = it->second;  // finish() edits the map
  for (int64_t id : ids) {
    Sequence* seq = seqs_.at(id).get();
    updates.push_back(SeqUpdate{id, request_id, seq->child_index, std::nullopt, FinishReason::kAbort, std::nullopt});
    finish(seq, FinishReason::kAbort);
  }
  return updates;
}

void Scheduler::finish_sequence(int64_t seq_id, FinishReason reason) {
  auto it = seqs_.find(seq_id);
  if (it != seqs_.end()) finish(it->second.get(), reason);
}

void Scheduler::preempt(Sequence* seq) {
  DI_CHECK(!running_.empty() && running_.back() == seq, "preempt: sequence {} is not the last running", seq->seq_id);
  running_.pop_back();
  kv_.free(seq->seq_id);
  freed_seq_ids_.push_back(seq->seq_id);
  seq->status = SequenceStatus::kPreempted;
  seq->num_computed_tokens = 0;  // recompute: prompt + outputs become the next prefill
  ++seq->num_preemptions;
  ++num_preemptions_;
  waiting_.push_front(seq);
}

void Scheduler::finish(Sequence* seq, FinishReason reason) {
  const int64_t id = seq->seq_id;
  if (seq->status == SequenceStatus::kRunning) {
    running_.erase(std::find(running_.begin(), running_.end(), seq));
  } else {
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), seq));
  }
  kv_.free(id);
  freed_seq_ids_.push_back(id);
  auto rit = request_seqs_.find(seq->request->request_id);
  std::erase(rit->second, id);
  if (rit->second.empty()) request_seqs_.erase(rit);
  seq->status = SequenceStatus::kFinished;
  seq->finish_reason = reason;
  seqs_.erase(id);  // seq is gone from here on
}

const Sequence* Scheduler::sequence(int64_t seq_id) const {
  auto it = seqs_.find(seq_id);
  return it == seqs_.end() ? nullptr : it->second.get();
}

std::vector<int64_t> Scheduler::waiting_ids() const {
  std::vector<int64_t> ids;
  for (const Sequence* s : waiting_) ids.push_back(s->seq_id);
  return ids;
}

std::vector<int64_t> Scheduler::running_ids() const {
  std::vector<int64_t> ids;
  for (const Sequence* s : running_) ids.push_back(s->seq_id);
  return ids;
}

}  // namespace deepinfer
