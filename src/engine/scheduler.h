// Scheduler: continuous batching over sequences (vLLM v1 `sched/scheduler.py`, nano-vllm).
//
// Each step hands out a token budget (max_num_batched_tokens) to at most max_num_seqs sequences:
//   1. running sequences first, in the order they started: a decode token, or the next chunk of
//      a prefill that did not fit; when the KvCacheManager cannot cover one, the most recently
//      started running sequence is preempted by recompute (its state freed, back to the front of
//      the waiting queue with num_computed_tokens = 0) until it fits or preempts itself;
//   2. then, if nothing was preempted this step, waiting sequences in arrival order, their prompt
//      (plus, after preemption, the tokens they had already generated) cut to the remaining budget
//      (chunked prefill).
// The decision is a plain SchedulerOutput; update_from_output() advances the counts, appends the
// sampled tokens and applies the token-level stop rules.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/kv_cache_manager.h"
#include "engine/scheduler_output.h"
#include "engine/sequence.h"

namespace deepinfer {

struct SchedulerConfig {
  int64_t max_num_batched_tokens = 2048;
  int64_t max_num_seqs = 64;
  int64_t max_model_len = 0;  // prompt + outputs, in tokens
  bool enable_chunked_prefill = true;
  int32_t eos_token_id = -1;
  // Throws deepinfer::Error naming the field (positive sizes; without chunked prefill the budget
  // must hold a whole max_model_len prompt).
  void validate() const;
};

class Scheduler {
 public:
  // kv must outlive the scheduler.
  Scheduler(const SchedulerConfig& config, KvCacheManager& kv);

  // Queues the request's params.n sequences (child i seeded with child_seed(seed, i) when n > 1).
  // Throws deepinfer::Error, changing nothing, for an empty prompt, a prompt longer than
  // max_model_len, or a request id that is still live.
  void add_request(std::shared_ptr<const Request> request);

  SchedulerOutput schedule();

  // Closes the loop of one step: advances num_computed_tokens by what ran, appends each sampled
  // token and finishes sequences that hit a stop rule (freeing their state). Returns one update
  // per sequence that got a token. Sequences finished meanwhile (abort) are skipped.
  std::vector<SeqUpdate> update_from_output(const SchedulerOutput& out, const std::vector<SampledToken>& sampled);

  // Finishes every live sequence of the request with reason kAbort; returns their updates
  // (empty for an unknown or already finished id).
  std::vector<SeqUpdate> abort_request(const std::string& request_id);
  // Finishes one live sequence (a stop string found by the output processor). No-op if not live.
  void finish_sequence(int64_t seq_id, FinishReason reason);

  // Ids of sequences finished or preempted since the last call (or the last schedule(), which
  // hands them to the runner in SchedulerOutput::freed_seq_ids): their runner state can go.
  std::vector<int64_t> take_freed_seq_ids() { return std::exchange(freed_seq_ids_, {}); }

  // A live (waiting or running) sequence, or nullptr.
  const Sequence* sequence(int64_t seq_id) const;
  std::vector<int64_t> waiting_ids() const;
  std::vector<int64_t> running_ids() const;
  size_t num_waiting() const { return waiting_.size(); }
  size_t num_running() const { return running_.size(); }
  bool has_unfinished() const { return !waiting_.empty() || !running_.empty(); }
  int64_t num_preemptions() const { return num_preemptions_; }
  const SchedulerConfig& config() const { return config_; }

 private:
  void preempt(Sequence* seq);
  void finish(Sequence* seq, FinishReason reason);  // erases seq
  ScheduledSeq make_scheduled(const Sequence& seq, int64_t num_new_tokens) const;

  SchedulerConfig config_;
  KvCacheManager& kv_;
  int64_t next_seq_id_ = 0;
  int64_t num_preemptions_ = 0;
  std::unordered_map<int64_t, std::unique_ptr<Sequence>> seqs_;         // live sequences
  std::unordered_map<std::string, std::vector<int64_t>> request_seqs_;  // live request -> seq ids
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;      // in start order: the back is the first to be preempted
  std::vector<int64_t> freed_seq_ids_;  // for the next SchedulerOutput
};

}  // namespace deepinfer
