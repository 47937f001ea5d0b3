#include "engine/engine_core.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <unordered_map>

#include "core/logging.h"
#include "deepinfer/error.h"
#include "engine/local_model_runner.h"
#include "model/model.h"
#include "ops/ops.h"
#include "sampling/sampler.h"
#include "structured/structured.h"

namespace deepinfer {

namespace {
double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::unique_ptr<Tokenizer> load_tokenizer(const EngineArgs& args) {
  if (args.skip_tokenizer_init) return nullptr;
  const std::string dir = args.tokenizer.empty() ? args.model : args.tokenizer;
  if (!std::filesystem::exists(std::filesystem::path(dir) / "tokenizer.json")) {
    DI_CHECK(args.tokenizer.empty(), "tokenizer: no tokenizer.json in '{}'", args.tokenizer);
    return nullptr;  // a checkpoint without a tokenizer: token ids only
  }
  return std::make_unique<Tokenizer>(Tokenizer::from_pretrained(dir));
}
// The sampler's results as the scheduler takes them: results[k] is sequence seq_ids[k]'s token.
std::vector<SampledToken> sampled_tokens(std::vector<SampleResult>& results, const std::vector<int64_t>& seq_ids) {
  std::vector<SampledToken> sampled;
  sampled.reserve(results.size());
  for (size_t k = 0; k < results.size(); ++k) {
    SampleResult& r = results[k];
    sampled.push_back(SampledToken{seq_ids[k], r.token, r.logprob, std::move(r.top_logprobs)});
  }
  return sampled;
}

}  // namespace

EngineCore::EngineCore(const EngineArgs& args) {
  DI_CHECK(!args.model.empty(), "engine: no model directory given");
  const ops::Numerics numerics = args.numerics();
  const int64_t replay_keep = args.replay_keep_tokens();
  std::unique_ptr<Model> model = Model::load(args.model, args.resolved_device());
  if (args.enforce_eager) model->set_graphs(false);
  config_ = model->config();
  runner_ = std::make_unique<LocalModelRunner>(std::move(model), numerics, replay_keep, args.kv_cache_memory);
  tokenizer_ = load_tokenizer(args);
  EngineArgs a = args;
  if (a.max_model_len == 0) a.max_model_len = read_max_position_embeddings(args.model);
  DI_CHECK(a.max_model_len > 0, "engine: '{}' names no max_position_embeddings; pass --max-model-len", args.model);
  init(a);
}

EngineCore::EngineCore(const EngineArgs& args, const ModelConfig& config, std::unique_ptr<ModelRunner> runner,
                       std::unique_ptr<Tokenizer> tokenizer)
    : config_(config), runner_(std::move(runner)), tokenizer_(std::move(tokenizer)) {
  DI_CHECK(runner_ != nullptr, "engine: no model runner");
  DI_CHECK(args.max_model_len > 0, "engine: max_model_len must be set (got {})", args.max_model_len);
  init(args);
}

EngineCore::~EngineCore() = default;

void EngineCore::init(const EngineArgs& args) {
  max_model_len_ = args.max_model_len;
  kv_ = std::make_unique<KvCacheManager>(config_, args.kv_cache_memory);
  const int64_t need = kv_->bytes_for_tokens(max_model_len_);
  DI_CHECK(need <= args.kv_cache_memory,
           "kv-cache-memory ({} bytes) cannot hold one sequence of max_model_len {} tokens ({} bytes): raise "
           "--kv-cache-memory or lower --max-model-len",
           args.kv_cache_memory, max_model_len_, need);
  SchedulerConfig sc;
  sc.max_num_batched_tokens = args.max_num_batched_tokens;
  sc.max_num_seqs = args.max_num_seqs;
  sc.max_model_len = max_model_len_;
  sc.enable_chunked_prefill = args.enable_chunked_prefill;
  sc.eos_token_id = static_cast<int32_t>(config_.eos_token_id);
  scheduler_ = std::make_unique<Scheduler>(sc, *kv_);
  outputs_ = std::make_unique<OutputProcessor>(tokenizer_.get());
  seed_rng_.seed(args.seed);
  async_ = args.async_scheduling;
  if (async_) worker_ = std::make_unique<StepWorker>();
}

void EngineCore::process_updates(const std::vector<SeqUpdate>& updates, std::vector<RequestOutput>& outputs) {
  OutputProcessor::Result r = outputs_->process(updates);
  for (int64_t id : r.stopped_seq_ids) scheduler_->finish_sequence(id, FinishReason::kStop);
  for (RequestOutput& o : r.outputs) outputs.push_back(std::move(o));
}

void EngineCore::add_request(const std::string& request_id, std::vector<int32_t> prompt_token_ids,
                             const SamplingParams& params) {
  params.validate();
  std::optional<SoRequest> so;
  if (!params.so_args.is_null()) {
    DI_CHECK(tokenizer_ != nullptr, "request '{}': so_args needs a tokenizer (the engine has none)", request_id);
    DI_CHECK(params.min_tokens == 0, "request '{}': min_tokens cannot be combined with so_args", request_id);
    const std::string key = params.so_args.dump();
    auto it = so_grammars_.find(key);
    if (it == so_grammars_.end()) {
      structured::StructuredSpec spec;
      try {
        spec = structured::compile_so_args(params.so_args);
      } catch (const Error& e) {
        fail("request '{}': {}", request_id, e.what());
      }
      if (!so_vocab_) {
        so_vocab_ = structured::TokenVocab::from_tokenizer(*tokenizer_, config_.vocab_size,
                                                           static_cast<int32_t>(config_.eos_token_id));
        think_open_ = tokenizer_->token_to_id("<think>").value_or(-1);
        think_close_ = tokenizer_->token_to_id("</think>").value_or(-1);
      }
      if (so_grammars_.size() >= 64) so_grammars_.clear();  // bounded: compiled grammars are cheap to redo
      it = so_grammars_.emplace(key, std::make_shared<structured::CompiledGrammar>(spec.grammar, so_vocab_)).first;
      so = SoRequest{it->second, spec.after_think};
    } else {
      so = SoRequest{it->second, std::nullopt};
      if (params.so_args.contains("after_think")) so->after_think = params.so_args["after_think"].get<bool>();
    }
  }
  DI_CHECK(params.stop.empty() || tokenizer_ != nullptr,
           "request '{}': stop strings need a tokenizer (the engine has none; use stop_token_ids)", request_id);
  for (size_t i = 0; i < prompt_token_ids.size(); ++i)
    DI_CHECK(prompt_token_ids[i] >= 0 && prompt_token_ids[i] < config_.vocab_size,
             "request '{}': prompt token {} at index {} is outside the vocabulary [0, {})", request_id,
             prompt_token_ids[i], i, config_.vocab_size);
  auto req = std::make_shared<Request>();
  req->request_id = request_id;
  req->prompt_token_ids = std::move(prompt_token_ids);
  req->params = params;
  req->arrival_time = now_seconds();
  // Drawn even for seeded requests, so an unseeded request's seed depends only on the engine seed
  // and its arrival index.
  const uint64_t drawn = seed_rng_();
  req->seed = params.seed.value_or(drawn);
  scheduler_->add_request(req);  // throws (changing nothing) on length or a live id
  outputs_->add_request(req);
  if (so) so_requests_[request_id] = std::move(*so);
}

void EngineCore::abort_request(const std::string& request_id) {
  // The last step's tokens come first (async scheduling holds them until the next step).
  if (unprocessed_) {
    process_updates(*unprocessed_, pending_);
    unprocessed_.reset();
  }
  OutputProcessor::Result r = outputs_->process(scheduler_->abort_request(request_id));
  for (RequestOutput& o : r.outputs) {
    // Outputs are cumulative snapshots: the abort's supersedes an earlier one of the same request.
    std::erase_if(pending_, [&](const RequestOutput& p) { return p.request_id == o.request_id; });
    pending_.push_back(std::move(o));
  }
}

bool EngineCore::has_unfinished() const {
  return scheduler_->has_unfinished() || !pending_.empty() || unprocessed_.has_value();
}

// Raw logprob of each prompt token given its prefix (vLLM's prompt_logprobs), from the rows the
// runner returned for prefill chunks; entry 0 stays empty.
void EngineCore::record_prompt_logprobs(const ModelRunnerOutput& ro) {
  const float* p = ro.prompt_logits.data();
  for (size_t i = 0; i < ro.prompt_seq_ids.size(); ++i) {
    const int64_t rows = ro.prompt_rows[i];
    const Sequence* seq = scheduler_->sequence(ro.prompt_seq_ids[i]);
    if (seq) {
      const std::vector<int32_t>& prompt = seq->prompt();
      auto& dst = prompt_logprobs_[seq->request->request_id];
      dst.resize(prompt.size());
      for (int64_t r = 0; r < rows; ++r) {
        const size_t next = static_cast<size_t>(ro.prompt_pos[i] + r + 1);
        if (next >= prompt.size()) break;
        SampleResult lp = raw_logprobs(p + r * ro.vocab, ro.vocab, prompt[next], seq->request->params.prompt_logprobs);
        dst[next] = TokenLogprobs{prompt[next], lp.logprob, std::move(lp.top_logprobs)};
      }
    }
    p += rows * ro.vocab;
  }
}

SampleInput EngineCore::sample_input(const Sequence& seq, bool masks) const {
  SampleInput in;
  in.vocab = config_.vocab_size;
  in.params = &seq.request->params;
  in.seed = seq.seed;
  in.position = seq.num_output_tokens();
  in.prompt_ids = &seq.prompt();
  in.output_ids = &seq.output_token_ids;
  in.eos_id = static_cast<int32_t>(config_.eos_token_id);
  if (!masks) return in;
  auto m = so_masks_.find(seq.seq_id);
  if (m != so_masks_.end()) in.allowed_mask = &m->second;
  return in;
}

EngineCore::SamplePlan EngineCore::plan_sampling(const SchedulerOutput& so) const {
  SamplePlan plan;
  for (const ScheduledSeq& s : so.seqs) {
    if (!s.want_logits) continue;
    const Sequence* seq = scheduler_->sequence(s.seq_id);
    DI_CHECK(seq != nullptr, "engine: scheduled sequence {} is not live (internal error)", s.seq_id);
    plan.inputs.push_back(sample_input(*seq, false));  // no structured outputs: no masks (so_masks_ is the worker's)
    plan.seq_ids.push_back(s.seq_id);
  }
  return plan;
}

std::vector<SampledToken> EngineCore::sample_planned(const ModelRunnerOutput& ro, SamplePlan& plan) const {
  DI_CHECK(ro.seq_ids == plan.seq_ids, "engine: the model returned logits for other rows than the step planned");
  for (SampleInput& in : plan.inputs) in.vocab = ro.vocab;
  std::vector<SampleResult> results;
  if (ro.device_logits.defined()) {
    if (!plan.inputs.empty()) results = ops::sample_rows(ro.device_logits, plan.inputs);
  } else {
    for (size_t i = 0; i < plan.inputs.size(); ++i) {
      plan.inputs[i].logits = ro.row(i);
      results.push_back(sample(plan.inputs[i]));
    }
  }
  return sampled_tokens(results, plan.seq_ids);
}

// One token per row whose sequence is still live (a stop string may have ended one since it was
// scheduled). Host rows go through sample() one by one; rows left on the GPU (ro.device_logits) go through
// ops::sample_rows in one call, with the same results bit for bit. Either way a row sample() rejects
// (e.g. a grammar mask that allows nothing) throws out of step() with sample()'s message, the first bad
// row in row order, and no token of the step is kept.
std::vector<SampledToken> EngineCore::sample_rows(const ModelRunnerOutput& ro) const {
  const bool on_device = ro.device_logits.defined();
  std::vector<SampleInput> inputs;
  std::vector<int32_t> live;  // the row of each input
  std::vector<int64_t> seq_ids;
  inputs.reserve(ro.seq_ids.size());
  for (size_t i = 0; i < ro.seq_ids.size(); ++i) {
    const Sequence* seq = scheduler_->sequence(ro.seq_ids[i]);
    if (!seq) continue;
    SampleInput in = sample_input(*seq, true);
    in.logits = on_device ? nullptr : ro.row(i);
    in.vocab = ro.vocab;
    inputs.push_back(in);
    live.push_back(static_cast<int32_t>(i));
    seq_ids.push_back(seq->seq_id);
  }
  std::vector<SampleResult> results;
  if (on_device) {
    if (inputs.empty()) return {};
    Tensor rows = ro.device_logits;
    if (live.size() != ro.seq_ids.size()) {  // drop the finished sequences' rows on the device
      Tensor ids = Tensor::empty({static_cast<int64_t>(live.size())}, DType::kI32);
      std::copy(live.begin(), live.end(), ids.data<int32_t>());
      rows = ops::gather_rows(rows, ids.to(rows.device()));
    }
    results = ops::sample_rows(rows, inputs);
  } else {
    results.reserve(inputs.size());
    for (const SampleInput& in : inputs) results.push_back(sample(in));
  }
  return sampled_tokens(results, seq_ids);
}

// A model step that throws leaves the states of its sequences half advanced: their requests end
// with finish_reason "abort" and the error, their states are dropped, and every other request goes on.
void EngineCore::fail_batch(const SchedulerOutput& so, const std::string& message,
                            std::vector<RequestOutput>& outputs) {
  log_warn("engine: a model step failed; aborting the {} sequences it ran: {}", so.seqs.size(), message);
  std::vector<std::string> ids;
  for (const ScheduledSeq& s : so.seqs)
    if (const Sequence* seq = scheduler_->sequence(s.seq_id))
      if (std::find(ids.begin(), ids.end(), seq->request->request_id) == ids.end())
        ids.push_back(seq->request->request_id);
  for (const std::string& id : ids) {
    OutputProcessor::Result r = outputs_->process(scheduler_->abort_request(id));
    for (RequestOutput& o : r.outputs) {
      o.error = "the model step failed: " + message;
      std::erase_if(outputs, [&](const RequestOutput& p) { return p.request_id == o.request_id; });
      outputs.push_back(std::move(o));
    }
  }
}

EngineCore::SoSeq* EngineCore::so_seq(const Sequence& seq) {
  auto it = so_seqs_.find(seq.seq_id);
  if (it != so_seqs_.end()) return &it->second;
  auto r = so_requests_.find(seq.request->request_id);
  if (r == so_requests_.end()) return nullptr;
  SoSeq s;
  s.matcher = std::make_unique<structured::GrammarMatcher>(r->second.grammar);
  if (r->second.after_think) {
    s.waiting_think = *r->second.after_think && think_close_ >= 0;
  } else if (think_open_ >= 0 && think_close_ >= 0) {  // does the prompt end inside <think>?
    const std::vector<int32_t>& p = seq.prompt();
    for (auto i = p.rbegin(); i != p.rend(); ++i) {
      if (*i == think_close_) break;
      if (*i == think_open_) {
        s.waiting_think = true;
        break;
      }
    }
  }
  // Tokens generated before the matcher existed (none normally; kept for safety) are replayed.
  for (int32_t t : seq.output_token_ids) {
    if (s.waiting_think) {
      s.waiting_think = t != think_close_;
      continue;
    }
    s.matcher->accept_token(t);
  }
  return &so_seqs_.emplace(seq.seq_id, std::move(s)).first->second;
}

void EngineCore::prepare_masks(const SchedulerOutput& so) {
  so_masks_.clear();
  if (so_requests_.empty()) return;
  for (const ScheduledSeq& s : so.seqs) {
    if (!s.want_logits) continue;
    const Sequence* seq = scheduler_->sequence(s.seq_id);
    if (!seq || seq->is_finished()) continue;
    SoSeq* c = so_seq(*seq);
    if (!c || c->waiting_think) continue;
    so_masks_[s.seq_id] = c->matcher->next_token_bitmask();
  }
}

void EngineCore::accept_structured(std::vector<SeqUpdate>& updates) {
  if (so_seqs_.empty()) return;
  for (SeqUpdate& u : updates) {
    auto it = so_seqs_.find(u.seq_id);
    if (it == so_seqs_.end()) continue;
    SoSeq& c = it->second;
    if (u.token) {
      if (c.waiting_think) {
        c.waiting_think = u.token->token != think_close_;
      } else {
        const bool ok = c.matcher->accept_token(u.token->token);
        // EOS at a complete sentence (or a token the grammar cannot take, which the mask prevents)
        // ends the sequence, even under ignore_eos.
        if ((!ok || c.matcher->is_terminated()) && !u.finish_reason) {
          u.finish_reason = FinishReason::kStop;
          scheduler_->finish_sequence(u.seq_id, FinishReason::kStop);
        }
      }
    }
    if (u.finish_reason) so_seqs_.erase(it);
  }
}

std::vector<RequestOutput> EngineCore::step() {
  std::vector<RequestOutput> outputs = std::move(pending_);
  pending_.clear();
  if (scheduler_->has_unfinished()) {
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    const SchedulerOutput so = scheduler_->schedule();
    DI_CHECK(!so.empty(), "engine: the scheduler could not schedule any of {} waiting sequences (internal error)",
             scheduler_->num_waiting());
    const auto t1 = clock::now();
    ModelRunnerOutput ro;
    std::vector<int64_t> stopped_before;  // by a stop string in the previous step's tokens
    double overlap_s = 0;
    std::optional<std::string> failure;  // the model step threw: its requests fail, the engine goes on
    // Without structured outputs every sampler input is known before the model runs (no mask to wait for), so the
    // sampler is queued right behind the model: one device wait for both (measured on the H200, bench/RESULTS.md). A
    // sampling error there is not a model failure: the step samples again below as it otherwise does, on the rows
    // still live, and throws from there.
    const bool fused = so_requests_.empty();
    SamplePlan plan;
    if (fused) plan = plan_sampling(so);
    std::vector<SampledToken> sampled;
    bool sample_again = !fused;
    auto run_model = [&] {
      if (!fused) {
        ro = runner_->execute(so);
        return;
      }
      ro = runner_->execute_queued(so);
      try {
        sampled = sample_planned(ro, plan);
      } catch (const std::exception&) {
        sample_again = true;
      }
    };
    if (async_) {
      // The worker computes this step's grammar masks and processes the previous step's outputs while this thread runs
      // the model: the model, the step's critical path, never waits for a thread to wake. (With the model on the
      // worker, the two handoffs of a step cost 0.04-0.06 ms at batch 1 on the H200: bench/RESULTS.md.)
      std::optional<OutputProcessor::Result> processed;
      worker_->submit([&] {
        prepare_masks(so);
        if (unprocessed_) {
          const auto p0 = clock::now();
          processed = outputs_->process(*unprocessed_);
          overlap_s = std::chrono::duration<double>(clock::now() - p0).count();
        }
      });
      try {
        run_model();
      } catch (const std::exception& e) {
        failure = e.what();
      }
      worker_->wait();  // rethrows an output processor error, after the model step as before
      if (processed) {
        unprocessed_.reset();
        stopped_before = std::move(processed->stopped_seq_ids);
        for (RequestOutput& o : processed->outputs) outputs.push_back(std::move(o));
      }
    } else {
      prepare_masks(so);
      try {
        run_model();
      } catch (const std::exception& e) {
        failure = e.what();
      }
    }
    if (failure) {
      for (int64_t id : stopped_before) scheduler_->finish_sequence(id, FinishReason::kStop);
      fail_batch(so, *failure, outputs);
      for (int64_t id : scheduler_->take_freed_seq_ids()) runner_->free(id);
      return outputs;
    }
    const auto t2 = clock::now();
    record_prompt_logprobs(ro);
    // A sequence that a stop string ended has run one step too many: finishing it first drops the token.
    for (int64_t id : stopped_before) scheduler_->finish_sequence(id, FinishReason::kStop);
    if (sample_again) sampled = sample_rows(ro);
    const auto t3 = clock::now();
    std::vector<SeqUpdate> updates = scheduler_->update_from_output(so, sampled);
    accept_structured(updates);
    if (async_)
      unprocessed_ = std::move(updates);
    else
      process_updates(updates, outputs);
    stats_.output_s += overlap_s;
    ++num_steps_;
    const auto t4 = clock::now();
    auto secs = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
    stats_.schedule_s += secs(t0, t1);
    stats_.model_s += secs(t1, t2);
    stats_.sample_s += secs(t2, t3);
    stats_.output_s += secs(t3, t4);
    stats_.steps += 1;
    stats_.tokens += so.num_scheduled_tokens;
  } else if (unprocessed_) {  // async: the last step's tokens, with nothing left to overlap them with
    process_updates(*unprocessed_, outputs);
    unprocessed_.reset();
  }
  for (int64_t id : scheduler_->take_freed_seq_ids()) runner_->free(id);
  // Prompt logprobs go with every output of their request, aborted ones included, and are dropped
  // once the request has finished.
  for (RequestOutput& o : outputs) {
    auto it = prompt_logprobs_.find(o.request_id);
    if (it == prompt_logprobs_.end()) continue;
    o.prompt_logprobs = it->second;
    if (o.finished) prompt_logprobs_.erase(it);
  }
  for (const RequestOutput& o : outputs)
    if (o.finished) so_requests_.erase(o.request_id);
  if (!so_seqs_.empty())  // aborted or stopped sequences
    std::erase_if(so_seqs_, [&](const auto& kv) {
      const Sequence* q = scheduler_->sequence(kv.first);
      return q == nullptr || q->is_finished();
    });
  return outputs;
}

std::vector<RequestOutput> EngineCore::generate(const std::vector<std::vector<int32_t>>& prompts,
                                                const std::vector<SamplingParams>& params) {
  DI_CHECK(params.size() == 1 || params.size() == prompts.size(),
           "generate: give one SamplingParams for all prompts or one per prompt ({} for {} prompts)", params.size(),
           prompts.size());
  std::vector<RequestOutput> results(prompts.size());
  std::unordered_map<std::string, size_t> index;
  const std::string prefix = "gen" + std::to_string(num_generate_calls_++) + "-";
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string id = prefix + std::to_string(i);
    try {
      add_request(id, prompts[i], params.size() == 1 ? params[0] : params[i]);
      index[id] = i;
    } catch (const Error& e) {
      RequestOutput& o = results[i];
      o.request_id = id;
      o.prompt_token_ids = prompts[i];
      o.finished = true;
      o.error = e.what();
      CompletionOutput c;
      c.finish_reason = finish_reason_name(FinishReason::kAbort);
      o.outputs.push_back(c);
    }
  }
  while (has_unfinished()) {
    for (RequestOutput& o : step()) {
      auto it = index.find(o.request_id);
      if (o.finished && it != index.end()) results[it->second] = std::move(o);
    }
  }
  return results;
}

}  // namespace deepinfer
