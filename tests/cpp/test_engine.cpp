// EngineCore end to end on a tiny random-weight V4 checkpoint (tools/make_checkpoint.py): seeded
// determinism across batching, chunking and preemption; greedy parity with the one-sequence
// forward; a mixed load; stop strings; rejection, abort and memory accounting.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "deepinfer/error.h"
#include "engine/engine_core.h"
#include "engine/local_model_runner.h"
#include "model/model.h"
#include "st_writer.h"
#include "tiny_checkpoint.h"

namespace deepinfer {
namespace {

#define REQUIRE_CHECKPOINT()                                        \
  if (tiny_checkpoint().empty() || tiny_checkpoint("v41").empty())  \
  GTEST_SKIP() << "python3 with numpy is needed to write the tiny " \
                  "checkpoint (tools/make_checkpoint.py)"

EngineArgs tiny_args(const std::string& family = "v4") {
  EngineArgs a;
  a.model = tiny_checkpoint(family);
  a.max_model_len = 128;
  return a;
}

struct Case {
  std::vector<int32_t> prompt;
  SamplingParams params;
};

std::vector<Case> random_cases(int count, uint64_t seed, int max_prompt, int max_tokens) {
  std::mt19937_64 rng(seed);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<Case> cases;
  for (int i = 0; i < count; ++i) {
    Case c;
    // A third of the prompts are shorter than one ratio-4 group, so their state grows while decoding.
    const int len = i % 3 == 0 ? uni(1, 3) : uni(1, max_prompt);
    for (int t = 0; t < len; ++t) c.prompt.push_back(uni(2, 1023));
    SamplingParams& p = c.params;
    const float temps[] = {0.0f, 0.7f, 1.0f, 1.3f};
    p.temperature = temps[uni(0, 3)];
    p.top_k = uni(0, 1) ? 0 : uni(1, 50);
    p.top_p = uni(0, 1) ? 1.0f : 0.9f;
    p.max_tokens = uni(1, max_tokens);
    p.ignore_eos = uni(0, 1);
    if (len < 4) {  // these cross a ratio-4 group while decoding: their state grows
      p.max_tokens = std::max(p.max_tokens, 6);
      p.ignore_eos = true;
    }
    p.seed = rng();
    p.n = i % 10 == 0 ? 2 : 1;
    cases.push_back(c);
  }
  return cases;
}

using Tokens = std::vector<std::vector<int32_t>>;  // per child

Tokens tokens_of(const RequestOutput& o) {
  Tokens t;
  for (const CompletionOutput& c : o.outputs) t.push_back(c.token_ids);
  return t;
}

std::vector<Tokens> run_all(EngineCore& engine, const std::vector<Case>& cases, const std::vector<size_t>& order) {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<SamplingParams> params;
  for (size_t i : order) {
    prompts.push_back(cases[i].prompt);
    params.push_back(cases[i].params);
  }
  std::vector<RequestOutput> outs = engine.generate(prompts, params);
  std::vector<Tokens> result(cases.size());
  for (size_t k = 0; k < order.size(); ++k) {
    EXPECT_TRUE(outs[k].finished && !outs[k].error) << outs[k].error.value_or("");
    result[order[k]] = tokens_of(outs[k]);
  }
  return result;
}

// Every seeded request gives the same tokens alone, batched, shuffled, chunked and preempted.
void check_seeded_determinism(const std::string& family, int n_cases) {
  const std::vector<Case> cases = random_cases(n_cases, 1234, 40, 12);
  std::vector<size_t> order(cases.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;

  EngineArgs args = tiny_args(family);
  args.max_model_len = 64;
  EngineCore engine(args);
  std::vector<Tokens> alone(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) alone[i] = run_all(engine, {cases[i]}, {0})[0];
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_EQ(alone[i].size(), static_cast<size_t>(cases[i].params.n));
    for (const auto& t : alone[i]) ASSERT_FALSE(t.empty());
  }
  EXPECT_EQ(run_all(engine, cases, order), alone) << "all together";

  std::vector<size_t> shuffled = order;
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937_64(99));
  EngineArgs small = args;
  small.max_num_seqs = 7;
  EngineCore few(small);
  EXPECT_EQ(run_all(few, cases, shuffled), alone) << "shuffled, at most 7 sequences per step";

  EngineArgs chunked = args;
  chunked.max_num_batched_tokens = 5;  // every prompt longer than 5 tokens is prefilled in chunks
  EngineCore chunky(chunked);
  EXPECT_EQ(run_all(chunky, cases, shuffled), alone) << "budget of 5 tokens per step";

  EngineArgs tight = args;
  {
    KvCacheManager probe(load_model_config(args.model), 1);
    // Room for two grown sequences and one short one, plus half a growth: short prompts are
    // admitted next to long ones, then cannot all grow past their first ratio-4 group.
    const int64_t grown = probe.bytes_for_tokens(args.max_model_len), fresh = probe.bytes_for_tokens(1);
    tight.kv_cache_memory = 2 * grown + fresh + (probe.bytes_for_tokens(4) - fresh) / 2;
  }
  EngineCore preempting(tight);
  EXPECT_EQ(run_all(preempting, cases, order), alone) << "tiny kv budget";
  EXPECT_GT(preempting.scheduler().num_preemptions(), 0);
  EXPECT_EQ(preempting.kv_cache().usage().used_bytes, 0);
  EXPECT_EQ(preempting.runner().num_states(), 0);
}

TEST(Engine, SeededRequestsGiveTheSameTokensAloneBatchedShuffledChunkedAndPreempted) {
  REQUIRE_CHECKPOINT();
  check_seeded_determinism("v4", 200);
}

// V4.1: ratio-2 pairs, shared compressed KV, the Engram history and the candidate source all cross
// chunk and preemption boundaries.
TEST(Engine, SeededRequestsGiveTheSameTokensV41) {
  REQUIRE_CHECKPOINT();
  check_seeded_determinism("v41", 200);
}

int32_t argmax(const Tensor& logits) {
  const float* p = logits.data<float>();
  int64_t best = 0;
  for (int64_t i = 1; i < logits.numel(); ++i)
    if (p[i] > p[best]) best = i;
  return static_cast<int32_t>(best);
}

// seq_seed pins each sequence's draw stream: child i of an n = 3 request equals an n = 1 request
// with seq_seed + i, in any batch; without seq_seed the children follow `seed`.
TEST(Engine, SeqSeedPinsEachSequence) {
  REQUIRE_CHECKPOINT();
  EngineCore engine(tiny_args());
  SamplingParams p;
  p.temperature = 1.0f;
  p.max_tokens = 12;
  p.ignore_eos = true;
  p.n = 3;
  p.seq_seed = 1000;
  const std::vector<int32_t> prompt = {5, 17, 42, 7, 300};
  std::vector<RequestOutput> outs = engine.generate({prompt, {9, 9, 9}}, {p, p});
  ASSERT_EQ(outs[0].outputs.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    SamplingParams one = p;
    one.n = 1;
    one.seq_seed = 1000 + static_cast<uint64_t>(i);
    std::vector<RequestOutput> alone = engine.generate({prompt}, {one});
    EXPECT_EQ(alone[0].outputs[0].token_ids, outs[0].outputs[static_cast<size_t>(i)].token_ids) << "child " << i;
  }
  EXPECT_NE(outs[0].outputs[0].token_ids, outs[0].outputs[1].token_ids);
}

// Async scheduling (output processing of step N-1 during the model of step N) changes nothing in
// the outputs, stop strings included (they end sequences that already ran one more step).
TEST(Engine, AsyncSchedulingGivesTheSameOutputs) {
  REQUIRE_CHECKPOINT();
  std::vector<Case> cases = random_cases(60, 77, 30, 16);
  for (size_t i = 0; i < cases.size(); ++i) {
    if (i % 3 == 0) cases[i].params.stop = {"a", "e", " "};  // common enough to end early
  }
  std::vector<size_t> order(cases.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  for (const std::string family : {"v4", "v41"}) {
    EngineArgs sync_args = tiny_args(family), async_args = tiny_args(family);
    sync_args.async_scheduling = false;
    sync_args.max_model_len = async_args.max_model_len = 64;
    EngineCore sync_engine(sync_args), async_engine(async_args);
    std::vector<std::vector<int32_t>> prompts;
    std::vector<SamplingParams> params;
    for (const Case& c : cases) {
      prompts.push_back(c.prompt);
      params.push_back(c.params);
    }
    const std::vector<RequestOutput> s = sync_engine.generate(prompts, params);
    const std::vector<RequestOutput> y = async_engine.generate(prompts, params);
    int stopped = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
      ASSERT_EQ(s[i].outputs.size(), y[i].outputs.size());
      for (size_t k = 0; k < s[i].outputs.size(); ++k) {
        EXPECT_EQ(s[i].outputs[k].token_ids, y[i].outputs[k].token_ids) << family << " request " << i;
        EXPECT_EQ(s[i].outputs[k].text, y[i].outputs[k].text) << family << " request " << i;
        EXPECT_EQ(s[i].outputs[k].finish_reason, y[i].outputs[k].finish_reason) << family << " request " << i;
        stopped += s[i].outputs[k].finish_reason == "stop";
      }
    }
    EXPECT_GT(stopped, 0) << "no request ended on a stop string: the test does not exercise the overlap";
    // A sequence ended by a stop string computes at most one token more than without the overlap.
    EXPECT_LE(async_engine.stats().tokens, sync_engine.stats().tokens + stopped) << family;
    EXPECT_EQ(async_engine.kv_cache().usage().used_bytes, 0);
    EXPECT_EQ(async_engine.runner().num_states(), 0);
  }
}

// A runner that fails on its n-th execute (an internal error in the model step).
class FailingRunner final : public ModelRunner {
 public:
  FailingRunner(std::unique_ptr<ModelRunner> inner, int fail_at) : inner_(std::move(inner)), fail_at_(fail_at) {}
  ModelRunnerOutput execute(const SchedulerOutput& out) override {
    if (++calls_ == fail_at_) {
      ModelRunnerOutput half = inner_->execute(out);  // the states advance, then the step "fails"
      throw Error("injected failure");
    }
    return inner_->execute(out);
  }
  void free(int64_t seq_id) override { inner_->free(seq_id); }
  int64_t num_states() const override { return inner_->num_states(); }

 private:
  std::unique_ptr<ModelRunner> inner_;
  int fail_at_, calls_ = 0;
};

// A failed model step ends the requests it ran (abort + error) and nothing else: a request that was
// waiting runs afterwards and gives the tokens it gives on a healthy engine; no state leaks.
TEST(Engine, AFailedStepAbortsItsRequestsAndTheEngineGoesOn) {
  REQUIRE_CHECKPOINT();
  for (const bool async : {false, true}) {
    EngineArgs args = tiny_args("v41");
    args.max_num_seqs = 2;
    args.async_scheduling = async;
    const ModelConfig cfg = load_model_config(args.model);
    auto inner = std::make_unique<LocalModelRunner>(Model::load(args.model), args.numerics());
    EngineCore engine(args, cfg, std::make_unique<FailingRunner>(std::move(inner), 3));
    SamplingParams p;
    p.temperature = 0.8f;
    p.seed = 5;
    p.max_tokens = 8;
    p.ignore_eos = true;
    const std::vector<std::vector<int32_t>> prompts = {{5, 6, 7}, {8, 9}, {10, 11, 12, 13}};
    std::vector<RequestOutput> outs = engine.generate(prompts, {p});
    EXPECT_TRUE(outs[0].error.has_value() && outs[1].error.has_value()) << async;
    EXPECT_NE(outs[0].error.value_or("").find("injected failure"), std::string::npos);
    EXPECT_EQ(outs[0].outputs[0].finish_reason, "abort");
    ASSERT_FALSE(outs[2].error.has_value()) << outs[2].error.value_or("");
    EngineCore healthy(tiny_args("v41"));
    EXPECT_EQ(outs[2].outputs[0].token_ids, healthy.generate({prompts[2]}, {p})[0].outputs[0].token_ids) << async;
    EXPECT_EQ(engine.runner().num_states(), 0);
    EXPECT_EQ(engine.kv_cache().usage().used_bytes, 0);
  }
}

// A structured-output request gets its grammar's masks in both scheduling modes: every output is one of the choices,
// and the two modes give the same text (the masks were once computed only on the async path).
TEST(Engine, StructuredOutputsAreMaskedInBothModes) {
  REQUIRE_CHECKPOINT();
  std::vector<std::string> texts[2];
  for (const bool async : {false, true}) {
    EngineArgs args = tiny_args("v41");
    args.async_scheduling = async;
    EngineCore engine(args);
    std::vector<std::vector<int32_t>> prompts;
    std::vector<SamplingParams> params;
    for (int i = 0; i < 6; ++i) {
      SamplingParams p;
      p.temperature = 1.0f;
      p.seed = 100 + i;
      p.max_tokens = 24;
      p.so_args = {{"type", "choice"}, {"value", {"hello world", "goodbye", "yes"}}};
      prompts.push_back({5, 6, static_cast<int32_t>(7 + i)});
      params.push_back(p);
    }
    for (const RequestOutput& o : engine.generate(prompts, params)) {
      ASSERT_FALSE(o.error.has_value()) << *o.error;
      const std::string& t = o.outputs[0].text;
      EXPECT_TRUE(t == "hello world" || t == "goodbye" || t == "yes") << "async " << async << ": '" << t << "'";
      texts[async].push_back(t);
    }
  }
  EXPECT_EQ(texts[0], texts[1]);
}

// A runner whose `poison_at`-th step returns a NaN logit in its first row (a model that produced garbage).
class NanRunner final : public ModelRunner {
 public:
  NanRunner(std::unique_ptr<ModelRunner> inner, int poison_at) : inner_(std::move(inner)), poison_at_(poison_at) {}
  ModelRunnerOutput execute(const SchedulerOutput& out) override { return poison(inner_->execute(out)); }
  ModelRunnerOutput execute_queued(const SchedulerOutput& out) override { return poison(inner_->execute_queued(out)); }
  void free(int64_t seq_id) override { inner_->free(seq_id); }
  int64_t num_states() const override { return inner_->num_states(); }

 private:
  ModelRunnerOutput poison(ModelRunnerOutput ro) {
    if (++calls_ == poison_at_ && !ro.logits.empty()) ro.logits[7] = std::nanf("");
    return ro;
  }
  std::unique_ptr<ModelRunner> inner_;
  int poison_at_, calls_ = 0;
};

// The sampler runs in the model's job when no request has structured outputs (EngineCore::sample_planned); a row it
// rejects still throws out of step() with sample()'s message, in both scheduling modes, and the steps before it gave
// the healthy engine's tokens.
TEST(Engine, ASamplingErrorThrowsFromStepInBothModes) {
  REQUIRE_CHECKPOINT();
  for (const bool async : {false, true}) {
    EngineArgs args = tiny_args("v41");
    args.async_scheduling = async;
    const ModelConfig cfg = load_model_config(args.model);
    auto inner = std::make_unique<LocalModelRunner>(Model::load(args.model), args.numerics());
    EngineCore engine(args, cfg, std::make_unique<NanRunner>(std::move(inner), 4));
    EngineCore healthy(args);
    SamplingParams p;
    p.temperature = 0.8f;
    p.seed = 9;
    p.max_tokens = 8;
    p.ignore_eos = true;
    engine.add_request("r", {5, 6, 7}, p);
    healthy.add_request("r", {5, 6, 7}, p);
    for (int step = 1; step < 4; ++step) {
      const std::vector<RequestOutput> a = engine.step(), b = healthy.step();
      ASSERT_EQ(a.size(), b.size()) << async << " step " << step;
      for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].outputs[0].token_ids, b[i].outputs[0].token_ids) << async;
    }
    try {
      engine.step();
      ADD_FAILURE() << "no error from the poisoned step (async " << async << ")";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("logit of token 7 is nan"), std::string::npos) << e.what();
    }
  }
}

// Batch invariance at the model: a target sequence's logits (every row) are bitwise identical alone
// and in 50 random batch compositions (1-4 other sequences of random lengths, random order, prefill
// in random chunk sizes so prefill and decode rows of different sequences mix), for both families.
TEST(Model, BatchInvarianceOverFiftyRandomCompositions) {
  REQUIRE_CHECKPOINT();
  for (const std::string family : {"v4", "v41"}) {
    auto model = Model::load(tiny_checkpoint(family));
    ForwardOptions fo;
    std::mt19937_64 rng(42);
    auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    std::vector<int32_t> target;
    for (int i = 0; i < 37; ++i) target.push_back(uni(3, 1023));
    // Runs the sequences with the given chunk size; returns every row of sequence `who`.
    auto run = [&](const std::vector<std::vector<int32_t>>& seqs, size_t who, int chunk) {
      std::vector<std::unique_ptr<SequenceState>> st;
      for (size_t b = 0; b < seqs.size(); ++b) st.push_back(model->new_sequence());
      std::vector<float> rows;
      size_t longest = 0;
      for (const auto& q : seqs) longest = std::max(longest, q.size());
      for (size_t i = 0; i < longest; i += static_cast<size_t>(chunk)) {
        std::vector<SeqChunk> batch;
        std::vector<size_t> members;
        for (size_t b = 0; b < seqs.size(); ++b) {
          if (i >= seqs[b].size()) continue;
          std::vector<int32_t> part(seqs[b].begin() + static_cast<std::ptrdiff_t>(i),
                                    seqs[b].begin() + static_cast<std::ptrdiff_t>(std::min(seqs[b].size(), i + chunk)));
          batch.push_back(SeqChunk{st[b].get(), std::move(part), true, true});
          members.push_back(b);
        }
        Tensor out = model->forward_batch(batch, fo);
        const int64_t V = out.size(1);
        int64_t row = 0;
        for (size_t k = 0; k < batch.size(); ++k) {
          const int64_t n = static_cast<int64_t>(batch[k].tokens.size());
          if (members[k] == who)
            rows.insert(rows.end(), out.data<float>() + row * V, out.data<float>() + (row + n) * V);
          row += n;
        }
      }
      return rows;
    };
    const std::vector<float> alone = run({target}, 0, static_cast<int>(target.size()));
    for (int trial = 0; trial < 50; ++trial) {
      std::vector<std::vector<int32_t>> seqs;
      const int others = uni(1, 4);
      for (int o = 0; o < others; ++o) {
        std::vector<int32_t> q(static_cast<size_t>(uni(1, 45)));
        for (auto& t : q) t = uni(3, 1023);
        seqs.push_back(q);
      }
      const size_t who = static_cast<size_t>(uni(0, others));
      seqs.insert(seqs.begin() + static_cast<std::ptrdiff_t>(who), target);
      const int chunk = trial % 5 == 0 ? 64 : uni(1, 12);
      ASSERT_EQ(run(seqs, who, chunk), alone) << family << " trial " << trial << " chunk " << chunk;
    }
  }
}

// The GPU load stacks wq_a and wkv into one linear (Model::stack_linears): the logits must not move a bit. Run here on
// the CPU, for both families, over a prefill and a few decode steps.
TEST(Model, StackedLinearsGiveTheSameLogits) {
  REQUIRE_CHECKPOINT();
  for (const std::string family : {"v4", "v41"}) {
    auto plain = Model::load(tiny_checkpoint(family));
    auto stacked = Model::load(tiny_checkpoint(family));
    ASSERT_EQ(stacked->stack_linears(), plain->config().n_layers) << family;
    ForwardOptions fo{ops::Numerics{}, false, nullptr};
    auto a = plain->new_sequence();
    auto b = stacked->new_sequence();
    std::vector<int32_t> tokens = {3, 17, 42, 7, 900, 11, 5, 64, 2};
    for (int step = 0; step < 4; ++step) {
      const Tensor la = plain->forward(tokens, *a, fo), lb = stacked->forward(tokens, *b, fo);
      ASSERT_EQ(la.shape(), lb.shape());
      ASSERT_EQ(std::memcmp(la.raw(), lb.raw(), la.nbytes()), 0) << family << " step " << step;
      tokens = {argmax(la)};
    }
  }
}

// stack_rows: E4M3 weights whose first part is whole scale tiles are stacked (the old weights become views of the
// stacked rows, bytes unchanged); layouts it cannot stack leave both weights as they were.
TEST(Model, StackRowsStacksWholeTilesOnly) {
  auto e4m3 = [](int64_t n, int64_t k, uint8_t fill) {
    ops::QWeight q;
    q.w = Tensor::empty({n, k}, DType::kE4M3);
    std::memset(q.w.raw(), fill, q.w.nbytes());
    q.scale = Tensor::empty({(n + 31) / 32, (k + 31) / 32}, DType::kE8M0);
    std::memset(q.scale.raw(), 120 + fill % 7, q.scale.nbytes());
    q.block = 32;
    return q;
  };
  ops::QWeight a = e4m3(64, 96, 3), b = e4m3(32, 96, 5), out;
  stack_rows(a, b, out);
  ASSERT_TRUE(out.w.defined());
  EXPECT_EQ(out.w.shape(), (Shape{96, 96}));
  EXPECT_EQ(out.scale.shape(), (Shape{3, 3}));
  EXPECT_EQ(a.w.shape(), (Shape{64, 96}));
  EXPECT_EQ(b.w.raw(), static_cast<const uint8_t*>(out.w.raw()) + 64 * 96);  // a view of the stacked rows
  EXPECT_EQ(static_cast<const uint8_t*>(b.w.raw())[0], 5);
  EXPECT_EQ(static_cast<const uint8_t*>(b.scale.raw())[0], 120 + 5 % 7);
  // a's rows not whole tiles, other input widths, other formats: not stacked, nothing moved.
  for (auto [na, kb, bf16] : {std::tuple<int64_t, int64_t, bool>{40, 96, false}, {64, 128, false}, {64, 96, true}}) {
    ops::QWeight x = e4m3(na, 96, 1), y = e4m3(32, kb, 2), o;
    if (bf16) y = ops::QWeight{Tensor::zeros({32, 96}, DType::kBF16), {}, 0};
    const void* xw = x.w.raw();
    stack_rows(x, y, o);
    EXPECT_FALSE(o.w.defined()) << na << " " << kb << " " << bf16;
    EXPECT_EQ(x.w.raw(), xw);
  }
}

TEST(Engine, GreedyEqualsTheOneSequenceForward) {
  REQUIRE_CHECKPOINT();
  const std::vector<std::vector<int32_t>> prompts = {{0, 17, 42, 7}, {5}, {3, 9, 200, 11, 600, 8, 8, 1000, 44, 2}};
  SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = 16;
  p.ignore_eos = true;
  EngineArgs args = tiny_args();
  args.max_num_batched_tokens = 4;
  EngineCore engine(args);
  std::vector<RequestOutput> outs = engine.generate(prompts, {p});

  auto model = Model::load(tiny_checkpoint());
  ForwardOptions fo{ops::Numerics{}, false, nullptr};
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto state = model->new_sequence();
    std::vector<int32_t> ref{argmax(model->forward(prompts[i], *state, fo))};
    while (ref.size() < 16) ref.push_back(argmax(model->forward({ref.back()}, *state, fo)));
    EXPECT_EQ(outs[i].outputs.at(0).token_ids, ref) << "prompt " << i;
    EXPECT_EQ(outs[i].outputs[0].finish_reason, "length");
  }
}

TEST(Engine, AThousandMixedRequestsFinishRightAndFreeEverything) {
  REQUIRE_CHECKPOINT();
  std::mt19937_64 rng(5);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<std::vector<int32_t>> prompts;
  std::vector<SamplingParams> params;
  for (int i = 0; i < 1000; ++i) {
    std::vector<int32_t> prompt(static_cast<size_t>(uni(1, 60)));
    for (int32_t& t : prompt) t = uni(0, 1023);
    SamplingParams p;
    p.temperature = uni(0, 1) ? 0.0f : 1.0f;
    p.max_tokens = uni(1, 20);
    p.min_tokens = uni(0, 3) == 0 ? std::min(p.max_tokens, 3) : 0;
    p.ignore_eos = uni(0, 1);
    if (uni(0, 2) == 0) p.stop_token_ids = {uni(2, 1023), uni(2, 1023)};
    p.seed = static_cast<uint64_t>(i);
    prompts.push_back(prompt);
    params.push_back(p);
  }
  prompts.push_back(std::vector<int32_t>(200, 5));  // longer than max_model_len: rejected, not fatal
  params.push_back(SamplingParams{});
  EngineArgs args = tiny_args();
  args.max_num_batched_tokens = 256;
  EngineCore engine(args);
  const std::vector<RequestOutput> outs = engine.generate(prompts, params);
  ASSERT_EQ(outs.size(), 1001u);
  EXPECT_TRUE(outs[1000].error.has_value());
  EXPECT_EQ(outs[1000].outputs.at(0).finish_reason, "abort");
  std::map<std::string, int> reasons;
  for (size_t i = 0; i < 1000; ++i) {
    const SamplingParams& p = params[i];
    ASSERT_TRUE(outs[i].finished);
    ASSERT_FALSE(outs[i].error.has_value());
    const CompletionOutput& c = outs[i].outputs.at(0);
    const auto n = static_cast<int>(c.token_ids.size());
    ASSERT_TRUE(c.finish_reason.has_value());
    ++reasons[*c.finish_reason];
    ASSERT_GE(n, 1);
    EXPECT_LE(n, p.max_tokens);
    const int32_t last = c.token_ids.back();
    const bool stop_token = std::count(p.stop_token_ids.begin(), p.stop_token_ids.end(), last) > 0;
    const bool eos = !p.ignore_eos && last == engine.config().eos_token_id;
    // No stop before min_tokens, and none missed afterwards.
    for (int k = std::max(p.min_tokens, 1); k < n; ++k) {
      const int32_t t = c.token_ids[static_cast<size_t>(k - 1)];
      EXPECT_FALSE(std::count(p.stop_token_ids.begin(), p.stop_token_ids.end(), t) > 0 ||
                   (!p.ignore_eos && t == engine.config().eos_token_id))
          << "request " << i << " ran past a stop token at " << k - 1;
    }
    if (*c.finish_reason == "length") {
      EXPECT_EQ(n, p.max_tokens) << "request " << i;
    } else {
      ASSERT_EQ(*c.finish_reason, "stop") << "request " << i;
      EXPECT_TRUE(stop_token || eos) << "request " << i;
      EXPECT_GE(n, p.min_tokens);
      if (stop_token && !eos) EXPECT_EQ(std::get<int32_t>(c.stop_reason), last);
    }
  }
  EXPECT_GT(reasons["length"], 0);
  EXPECT_FALSE(engine.has_unfinished());
  EXPECT_EQ(engine.kv_cache().usage().used_bytes, 0);
  EXPECT_EQ(engine.kv_cache().usage().num_sequences, 0);
  EXPECT_EQ(engine.runner().num_states(), 0);
}

TEST(Engine, StopStringsCutTheText) {
  REQUIRE_CHECKPOINT();
  EngineCore engine(tiny_args());
  ASSERT_NE(engine.tokenizer(), nullptr);
  SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = 24;
  p.ignore_eos = true;
  const std::vector<int32_t> prompt = {0, 17, 42, 7};
  const RequestOutput full = engine.generate({prompt}, {p})[0];
  const std::string text = full.outputs[0].text;
  EXPECT_EQ(text, engine.tokenizer()->decode(full.outputs[0].token_ids, true));
  ASSERT_GE(text.size(), 6u);
  const std::string stop = text.substr(text.size() / 2, 2);
  p.stop = {stop};
  const RequestOutput cut = engine.generate({prompt}, {p})[0];
  const CompletionOutput& c = cut.outputs[0];
  EXPECT_EQ(c.finish_reason, "stop");
  EXPECT_EQ(std::get<std::string>(c.stop_reason), stop);
  EXPECT_EQ(c.text, text.substr(0, text.find(stop)));
  EXPECT_LE(c.token_ids.size(), full.outputs[0].token_ids.size());
  EXPECT_EQ(engine.kv_cache().usage().used_bytes, 0);
}

TEST(Engine, RejectsBadRequestsAbortsAndStaysUsable) {
  REQUIRE_CHECKPOINT();
  EngineCore engine(tiny_args());
  SamplingParams p;
  p.max_tokens = 50;
  p.ignore_eos = true;
  EXPECT_THROW(engine.add_request("long", std::vector<int32_t>(129, 3), p), Error);
  EXPECT_THROW(engine.add_request("vocab", {1, 5000}, p), Error);
  SamplingParams bad = p;
  bad.temperature = -1.0f;
  EXPECT_THROW(engine.add_request("bad", {1, 2}, bad), Error);
  EXPECT_FALSE(engine.has_unfinished());

  engine.add_request("a", {4, 5, 6}, p);
  engine.add_request("b", {7, 8}, p);
  for (int i = 0; i < 3; ++i) engine.step();
  engine.abort_request("a");
  engine.abort_request("nope");  // ignored
  bool saw_abort = false, b_done = false;
  while (engine.has_unfinished()) {
    for (const RequestOutput& o : engine.step()) {
      if (o.request_id == "a") {
        EXPECT_TRUE(o.finished);
        EXPECT_EQ(o.outputs[0].finish_reason, "abort");
        EXPECT_EQ(o.outputs[0].token_ids.size(), 3u);
        saw_abort = true;
      }
      if (o.request_id == "b" && o.finished) {
        EXPECT_EQ(o.outputs[0].token_ids.size(), 50u);
        EXPECT_EQ(o.outputs[0].finish_reason, "length");
        b_done = true;
      }
    }
  }
  EXPECT_TRUE(saw_abort && b_done);
  EXPECT_EQ(engine.kv_cache().usage().used_bytes, 0);
  EXPECT_EQ(engine.runner().num_states(), 0);
  // A too-small budget is refused at construction with a message saying what to change.
  EngineArgs tiny = tiny_args();
  tiny.kv_cache_memory = 1000;
  EXPECT_THROW(EngineCore{tiny}, Error);
}

// The manager's page counts are the pages the sequences really hold, and those come from the
// runner's pools: in use while the sequence lives, back in the pool (reused, not reallocated) after.
TEST(Engine, KvAccountingMatchesTheRunnerState) {
  REQUIRE_CHECKPOINT();
  for (const std::string family : {"v4", "v41"}) {
    EngineCore engine(tiny_args(family));
    SamplingParams p;
    p.max_tokens = 100;
    p.ignore_eos = true;
    engine.add_request("a", std::vector<int32_t>(20, 9), p);
    const auto& runner = dynamic_cast<const LocalModelRunner&>(engine.runner());
    const StatePools& pools = runner.pools();
    ASSERT_TRUE(pools.window && pools.compressed && pools.index_keys);
    for (int step = 0; step < 90; ++step) {  // the 100th token would finish it
      engine.step();
      const SequenceState* st = runner.state(0);
      ASSERT_NE(st, nullptr);
      const KvPages want = engine.kv_cache().pages_for_tokens(st->num_tokens);
      int64_t compressed = 0, index = 0;
      for (const LayerState& l : st->layers) {
        compressed += l.compressed.num_pages();
        index += l.index_keys.num_pages();
      }
      ASSERT_EQ(compressed, want.num_pages[static_cast<int>(KvPool::kCompressed)]) << family << st->num_tokens;
      ASSERT_EQ(index, want.num_pages[static_cast<int>(KvPool::kIndexKeys)]) << family << st->num_tokens;
      ASSERT_EQ(pools.compressed->in_use(), compressed) << family;
      ASSERT_EQ(pools.index_keys->in_use(), index) << family;
      ASSERT_EQ(pools.window->in_use(), want.num_pages[static_cast<int>(KvPool::kWindow)]) << family;
      ASSERT_GE(engine.kv_cache().usage().used_bytes, want.num_bytes);
    }
    while (engine.has_unfinished()) engine.step();
    EXPECT_EQ(pools.window->in_use() + pools.compressed->in_use() + pools.index_keys->in_use(), 0) << family;
    // A second request reuses the freed pages: the pools do not grow.
    const int64_t allocated = pools.compressed->allocated() + pools.window->allocated();
    engine.add_request("b", std::vector<int32_t>(20, 7), p);
    while (engine.has_unfinished()) engine.step();
    EXPECT_EQ(pools.compressed->allocated() + pools.window->allocated(), allocated) << family;
  }
}

}  // namespace
}  // namespace deepinfer
