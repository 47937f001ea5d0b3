// EngineCore: the offline engine loop. One step is schedule -> execute -> sample -> update:
//
//   SchedulerOutput   so  = scheduler.schedule();        // which tokens of which sequences
//   ModelRunnerOutput ro  = runner.execute(so);          // a logits row per sequence at its end
//   SampledToken...       = sample(row, seed, position)  // position = the sequence's output count
//   scheduler.update_from_output(so, sampled)            // append, token-level stops, free
//   output processor                                     // text, stop strings, RequestOutputs
//
// Because every draw depends only on (sequence seed, output position) and the kernels are batch
// invariant, a request's tokens do not depend on what else runs, the token budget, the order of
// arrival or preemption. Sampling runs where the logits are: on the CPU for a CPU model, on the GPU
// (ops::sample_rows over the runner's device_logits, one call per step) for a CUDA model, with the
// same tokens and logprobs bit for bit.
//
// Async scheduling (EngineArgs::async_scheduling, on by default): a worker thread runs the output
// processor (detokenising, stop strings) on step N-1's tokens while the engine thread runs step N's
// model (the model stays on the critical path's thread: no thread has to wake for it); a sequence
// that a stop string ends there has already been scheduled into step N, and its token from step N is
// dropped. Outputs are identical either way; each output arrives one step() call later.
//
// Structured outputs (SamplingParams::so_args, src/structured): add_request compiles the grammar
// (errors throw there); each sequence gets a GrammarMatcher; the allowed-token masks of a step are
// computed before sampling (under async scheduling on the worker while the model runs) and
// passed to the sampler; every sampled token advances its matcher right after update_from_output,
// and a matcher that accepted EOS (grammar complete) finishes its sequence with "stop". When the
// prompt ends inside <think> (or so_args "after_think": true) the constraint starts after </think>.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "deepinfer/model_config.h"
#include "engine/engine_args.h"
#include "engine/kv_cache_manager.h"
#include "engine/model_runner.h"
#include "engine/output_processor.h"
#include "engine/request.h"
#include "engine/scheduler.h"
#include "engine/step_worker.h"
#include "sampling/sampler.h"
#include "structured/token_matcher.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {

// Where a step's time goes (seconds, summed over steps): for the scheduling-overhead benchmark. A step without
// structured outputs queues its sampling behind the model in one job: its sampling time is part of model_s then.
struct EngineStats {
  double schedule_s = 0, model_s = 0, sample_s = 0, output_s = 0;
  int64_t steps = 0, tokens = 0;
};

class EngineCore {
 public:
  // Loads args.model on the CPU (and its tokenizer unless skip_tokenizer_init). Throws
  // deepinfer::Error on a bad option or when kv_cache_memory cannot hold one max_model_len sequence.
  explicit EngineCore(const EngineArgs& args);
  // Over any runner (tests use a fake one). args.model is not read; max_model_len must be set.
  EngineCore(const EngineArgs& args, const ModelConfig& config, std::unique_ptr<ModelRunner> runner,
             std::unique_ptr<Tokenizer> tokenizer = nullptr);
  ~EngineCore();

  // Queues a request. Throws deepinfer::Error, leaving the engine as it was, when the params are
  // invalid, a token id is outside the vocabulary, the prompt is empty or longer than
  // max_model_len, the id is live, or a feature is asked for that is not there yet.
  void add_request(const std::string& request_id, std::vector<int32_t> prompt_token_ids, const SamplingParams& params);
  // Finishes the request with finish_reason "abort"; its final output comes from the next step().
  // Unknown or finished ids are ignored.
  void abort_request(const std::string& request_id);

  // One engine step; returns a cumulative snapshot of every request that changed. If the model
  // step throws, the requests it ran end with finish_reason "abort" and `error` set; the others go on.
  std::vector<RequestOutput> step();
  bool has_unfinished() const;

  // Adds the prompts (params: one for all, or one per prompt), runs to completion and returns the
  // final outputs in prompt order. A rejected prompt gets an output with finish_reason "abort" and
  // `error` set; the others run normally.
  std::vector<RequestOutput> generate(const std::vector<std::vector<int32_t>>& prompts,
                                      const std::vector<SamplingParams>& params);

  const ModelConfig& config() const { return config_; }
  const Scheduler& scheduler() const { return *scheduler_; }
  const KvCacheManager& kv_cache() const { return *kv_; }
  const ModelRunner& runner() const { return *runner_; }
  const Tokenizer* tokenizer() const { return tokenizer_.get(); }
  int64_t max_model_len() const { return max_model_len_; }
  int64_t num_steps() const { return num_steps_; }
  const EngineStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 private:
  void init(const EngineArgs& args);
  SampleInput sample_input(const Sequence& seq, bool masks) const;  // logits unset; masks: the step's grammar mask
  std::vector<SampledToken> sample_rows(const ModelRunnerOutput& ro) const;
  // The sampling of a step planned before its model runs: one input per row of the SchedulerOutput that wants logits
  // (ModelRunnerOutput::seq_ids' order). It points into the sequences, which nothing changes before the step's
  // update_from_output; a row whose sequence a stop string ends meanwhile is sampled too, and its token dropped there.
  struct SamplePlan {
    std::vector<SampleInput> inputs;
    std::vector<int64_t> seq_ids;
  };
  SamplePlan plan_sampling(const SchedulerOutput& so) const;
  std::vector<SampledToken> sample_planned(const ModelRunnerOutput& ro, SamplePlan& plan) const;
  void record_prompt_logprobs(const ModelRunnerOutput& ro);
  // Structured outputs.
  struct SoRequest {
    std::shared_ptr<structured::CompiledGrammar> grammar;
    std::optional<bool> after_think;
  };
  struct SoSeq {
    std::unique_ptr<structured::GrammarMatcher> matcher;
    bool waiting_think = false;  // the constraint starts after the </think> token
  };
  SoSeq* so_seq(const Sequence& seq);
  void prepare_masks(const SchedulerOutput& so);
  void accept_structured(std::vector<SeqUpdate>& updates);
  std::shared_ptr<const structured::TokenVocab> so_vocab_;
  std::unordered_map<std::string, std::shared_ptr<structured::CompiledGrammar>> so_grammars_;  // by so_args text
  std::unordered_map<std::string, SoRequest> so_requests_;                                     // by request id
  std::unordered_map<int64_t, SoSeq> so_seqs_;                                                 // by sequence id
  std::unordered_map<int64_t, std::vector<uint32_t>> so_masks_;  // the masks of the step being sampled
  int32_t think_open_ = -1, think_close_ = -1;

  ModelConfig config_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<Tokenizer> tokenizer_;
  int64_t max_model_len_ = 0;
  std::unique_ptr<KvCacheManager> kv_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<OutputProcessor> outputs_;
  std::vector<RequestOutput> pending_;  // finished outside step() (abort), returned by the next step
  bool async_ = true;
  std::optional<std::vector<SeqUpdate>> unprocessed_;  // async: the last step's updates, not yet processed
  std::unique_ptr<StepWorker> worker_;
  // Runs the output processor on `updates`, finishing the sequences that stop strings end.
  void process_updates(const std::vector<SeqUpdate>& updates, std::vector<RequestOutput>& outputs);
  void fail_batch(const SchedulerOutput& so, const std::string& message, std::vector<RequestOutput>& outputs);
  std::mt19937_64 seed_rng_;
  int64_t num_steps_ = 0;
  int64_t num_generate_calls_ = 0;
  EngineStats stats_;
  std::unordered_map<std::string, std::vector<std::optional<TokenLogprobs>>> prompt_logprobs_;  // by request id
};

}  // namespace deepinfer
