// Sampling a batch of rows through the op layer (ops::sample_rows) and the engine's device-logits path:
// on the CPU both must give exactly what sample() gives row by row, so the GPU path (the same op and
// the same plumbing, with cuda::sample_rows underneath) is checked here for everything but the kernel.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <variant>
#include <vector>

#include "deepinfer/error.h"
#include "engine/engine_core.h"
#include "engine/local_model_runner.h"
#include "model/model.h"
#include "ops/ops.h"
#include "sample_inputs.h"
#include "sampling/sampler.h"
#include "st_writer.h"
#include "tiny_checkpoint.h"

namespace deepinfer {
namespace {

// One row's inputs, owning what SampleInput points to, with its seed and position.
struct RowSpec : SampleRowInputs {
  uint64_t seed = 0;
  int64_t position = 0;
  SampleInput input(const float* logits, int64_t vocab) const {
    return SampleRowInputs::input(logits, vocab, seed, position);
  }
};

void expect_same(const SampleResult& a, const SampleResult& b, const std::string& what) {
  EXPECT_EQ(a.token, b.token) << what;
  EXPECT_EQ(a.has_logprobs, b.has_logprobs) << what;
  // Bit for bit: the op must not recompute anything differently.
  EXPECT_EQ(std::memcmp(&a.logprob, &b.logprob, sizeof(float)), 0) << what << ": " << a.logprob << " vs " << b.logprob;
  EXPECT_EQ(a.rank, b.rank) << what;
  EXPECT_EQ(a.top_logprobs, b.top_logprobs) << what;
}

// A [R, V] logits tensor with rows of different shapes (flat, peaked, ties) and row specs that cover
// greedy, seeded temperature / top-k / top-p / min-p draws, penalties, min_tokens, masks and logprobs.
struct Batch {
  int64_t V = 0;
  Tensor logits;
  std::vector<RowSpec> rows;
};

Batch make_batch(int64_t R, int64_t V, uint64_t seed) {
  Batch b;
  b.V = V;
  b.logits = Tensor::empty({R, V}, DType::kF32);
  std::mt19937_64 g(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (int64_t r = 0; r < R; ++r) {
    float* row = b.logits.data<float>() + r * V;
    for (int64_t i = 0; i < V; ++i) row[i] = normal(g);
    if (r % 5 == 1) row[g() % V] += 12.0f;             // one dominant token
    if (r % 5 == 2) row[3] = row[7] = row[11] = 9.0f;  // a tie at the top
    if (r % 5 == 3)
      for (int64_t i = 0; i < V; i += 2) row[i] = -INFINITY;  // half the vocab masked
  }
  for (int64_t r = 0; r < R; ++r) {
    RowSpec s;
    s.seed = g();
    SamplingParams& p = s.p;
    switch (r % 8) {
      case 0:  // greedy
        p.temperature = 0.0f;
        break;
      case 1:
        p.temperature = 0.8f;
        p.top_p = 0.9f;
        break;
      case 2:
        p.top_k = 20;
        break;
      case 3:
        p.temperature = 1.3f;
        p.min_p = 0.05f;
        break;
      case 4:
        p.temperature = 0.7f;
        p.top_p = 0.5f;
        p.logprobs = 5;
        break;
      case 5:  // greedy with the sampled token's logprob
        p.temperature = 0.0f;
        p.logprobs = 0;
        break;
      case 6:
        p.repetition_penalty = 1.3f;
        p.frequency_penalty = 0.5f;
        p.presence_penalty = 0.2f;
        break;
      default:
        p.temperature = 0.9f;
        p.min_tokens = 4;
        p.stop_token_ids = {5, 6};
        break;
    }
    for (int k = 0; k < 6; ++k) s.prompt.push_back(static_cast<int32_t>(g() % V));
    for (int k = 0; k < 3; ++k) s.output.push_back(static_cast<int32_t>(g() % V));
    s.position = static_cast<int64_t>(s.output.size());
    s.eos = 1;
    if (r % 3 == 0) {  // a grammar-like mask: every id with bit pattern ...01 or ...10, plus a few
      s.mask.assign(static_cast<size_t>((V + 31) / 32), 0x66666666u);
      s.mask[0] |= 1u;
    }
    b.rows.push_back(std::move(s));
  }
  return b;
}

std::vector<SampleInput> inputs_of(const Batch& b, bool with_pointers) {
  std::vector<SampleInput> in;
  for (size_t r = 0; r < b.rows.size(); ++r)
    in.push_back(b.rows[r].input(with_pointers ? b.logits.data<float>() + r * b.V : nullptr, with_pointers ? b.V : 0));
  return in;
}

TEST(SampleRows, CpuOpEqualsSampleRowByRow) {
  for (const int64_t V : {int64_t{37}, int64_t{1000}, int64_t{129280}}) {
    const Batch b = make_batch(V > 100000 ? 16 : 40, V, 11 + static_cast<uint64_t>(V));
    // The op ignores the inputs' logits pointers (null here) and takes vocab 0 as "the columns".
    const std::vector<SampleResult> got = ops::sample_rows(b.logits, inputs_of(b, false));
    ASSERT_EQ(got.size(), b.rows.size());
    const std::vector<SampleInput> ref = inputs_of(b, true);
    for (size_t r = 0; r < ref.size(); ++r)
      expect_same(got[r], sample(ref[r]), "V " + std::to_string(V) + " row " + std::to_string(r));
  }
}

// Seeded draws: many positions of one top-p row give the same tokens through the op as through sample().
TEST(SampleRows, SeededTopPDrawsMatchOverPositions) {
  Batch b = make_batch(1, 500, 3);
  b.rows[0].p = SamplingParams{};
  b.rows[0].p.temperature = 1.0f;
  b.rows[0].p.top_p = 0.95f;
  b.rows[0].mask.clear();
  b.rows[0].output.clear();
  std::map<int32_t, int> seen;
  for (int64_t pos = 0; pos < 200; ++pos) {
    b.rows[0].position = pos;
    const SampleResult got = ops::sample_rows(b.logits, inputs_of(b, false))[0];
    expect_same(got, sample(inputs_of(b, true)[0]), "position " + std::to_string(pos));
    ++seen[got.token];
  }
  EXPECT_GT(seen.size(), 3u) << "the draws should vary with the position";
}

// A row slice of a larger tensor (rows dense, not the whole storage) is read at the right offsets.
TEST(SampleRows, RowSliceOfALargerTensor) {
  const Batch b = make_batch(12, 300, 5);
  const Tensor part = b.logits.slice(0, 4, 10);
  std::vector<SampleInput> in = inputs_of(b, false);
  in = std::vector<SampleInput>(in.begin() + 4, in.begin() + 10);
  const std::vector<SampleResult> got = ops::sample_rows(part, in);
  const std::vector<SampleInput> ref = inputs_of(b, true);
  ASSERT_EQ(got.size(), 6u);
  for (size_t r = 0; r < got.size(); ++r) expect_same(got[r], sample(ref[r + 4]), "row " + std::to_string(r + 4));
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Bad rows throw what sample() throws for the first of them (an empty grammar mask, then a NaN); misuse of
// the op itself (row count, vocab, dtype) is named.
TEST(SampleRows, ErrorsAreSamplesForTheFirstBadRow) {
  Batch b = make_batch(6, 64, 9);
  b.rows[2].mask.assign(2, 0u);                        // nothing allowed
  b.logits.data<float>()[4 * 64 + 3] = std::nanf("");  // row 4: NaN
  const std::string want = error_of([&] { sample(inputs_of(b, true)[2]); });
  ASSERT_FALSE(want.empty());
  EXPECT_EQ(error_of([&] { ops::sample_rows(b.logits, inputs_of(b, false)); }), want);
  b.rows[2].mask.clear();
  EXPECT_EQ(error_of([&] { ops::sample_rows(b.logits, inputs_of(b, false)); }),
            error_of([&] { sample(inputs_of(b, true)[4]); }));

  const Batch ok = make_batch(3, 64, 1);
  std::vector<SampleInput> in = inputs_of(ok, false);
  EXPECT_NE(error_of([&] {
              ops::sample_rows(ok.logits, std::vector<SampleInput>(in.begin(), in.end() - 1));
            }).find("3 logits rows for 2 inputs"),
            std::string::npos);
  in[1].vocab = 65;
  EXPECT_NE(error_of([&] { ops::sample_rows(ok.logits, in); }).find("row 1 has vocab 65"), std::string::npos);
  EXPECT_NE(error_of([&] {
              ops::sample_rows(Tensor::zeros({3, 64}, DType::kBF16), inputs_of(ok, false));
            }).find("float32"),
            std::string::npos);
  EXPECT_TRUE(ops::sample_rows(Tensor::empty({0, 64}, DType::kF32), {}).empty());
}

// ---- the engine over device logits ------------------------------------------------------------

// Forwards to a LocalModelRunner and counts the steps whose rows came as device_logits (on a CPU model
// with set_device_logits(true) they are a CPU tensor: the GPU's plumbing with the CPU's op underneath).
class CountingRunner final : public ModelRunner {
 public:
  explicit CountingRunner(std::unique_ptr<LocalModelRunner> inner) : inner_(std::move(inner)) {}
  ModelRunnerOutput execute(const SchedulerOutput& out) override { return count(inner_->execute(out), false); }
  // The engine's steps without structured outputs queue their sampler behind the model (EngineCore::sample_planned).
  ModelRunnerOutput execute_queued(const SchedulerOutput& out) override {
    return count(inner_->execute_queued(out), true);
  }
  void free(int64_t seq_id) override { inner_->free(seq_id); }
  int64_t num_states() const override { return inner_->num_states(); }
  int device_steps = 0, prompt_steps = 0, gathered_steps = 0, queued_steps = 0, waited_steps = 0;

 private:
  ModelRunnerOutput count(ModelRunnerOutput ro, bool queued) {
    (queued ? queued_steps : waited_steps) += 1;
    if (!ro.seq_ids.empty()) {
      EXPECT_TRUE(ro.device_logits.defined() && ro.logits.empty());
      EXPECT_EQ(ro.device_logits.size(0), static_cast<int64_t>(ro.seq_ids.size()));
      device_steps += ro.device_logits.defined();
      prompt_steps += !ro.prompt_seq_ids.empty();
      gathered_steps += ro.device_logits.defined() && !ro.prompt_seq_ids.empty();
    }
    return ro;
  }
  std::unique_ptr<LocalModelRunner> inner_;
};

// The engine gives the same outputs (tokens, logprobs, prompt logprobs, text, finish reasons) with the
// rows to sample kept as a tensor and sampled by ops::sample_rows in one call as with host rows and
// sample() per row: greedy and seeded requests, n = 2, logprobs, prompt logprobs (rows gathered out
// of all-logits chunks), stop strings under async scheduling (rows of sequences finished meanwhile are
// dropped) and a structured-output mask.
TEST(SampleRows, EngineOverDeviceLogitsGivesTheSameOutputs) {
  if (tiny_checkpoint("v4").empty() || tiny_checkpoint("v41").empty())
    GTEST_SKIP() << "python3 with numpy is needed to write the tiny checkpoint (tools/make_checkpoint.py)";
  for (const std::string family : {"v4", "v41"}) {
    EngineArgs args;
    args.model = tiny_checkpoint(family);
    args.max_model_len = 64;
    args.max_num_batched_tokens = 48;  // some prompts prefill in chunks
    std::mt19937_64 rng(2024);
    auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    std::vector<std::vector<int32_t>> prompts;
    std::vector<SamplingParams> params;
    for (int i = 0; i < 24; ++i) {
      std::vector<int32_t> prompt;
      for (int t = uni(1, 30); t > 0; --t) prompt.push_back(uni(3, 1000));
      SamplingParams p;
      p.temperature = i % 4 == 0 ? 0.0f : 0.8f;
      p.top_p = i % 3 == 0 ? 0.9f : 1.0f;
      p.top_k = i % 5 == 0 ? 20 : 0;
      p.max_tokens = uni(1, 14);
      p.seed = rng();
      if (i % 6 == 1) p.logprobs = 3;
      if (i % 7 == 2) p.prompt_logprobs = 2;
      if (i % 5 == 3) p.stop = {"a", "e", " "};
      if (i % 8 == 4) p.n = 2;
      if (i % 9 == 5) p.repetition_penalty = 1.2f, p.presence_penalty = 0.3f;
      if (i == 10) {  // a grammar mask on its rows
        p.so_args = {{"type", "choice"}, {"value", {"hello world", "goodbye"}}};
        p.max_tokens = 16;
      }
      prompts.push_back(prompt);
      params.push_back(p);
    }
    EngineCore host(args);
    auto local = std::make_unique<LocalModelRunner>(Model::load(args.model), args.numerics());
    EXPECT_FALSE(local->device_logits()) << "a CPU model returns host logits by default";
    local->set_device_logits(true);
    auto counting = std::make_unique<CountingRunner>(std::move(local));
    CountingRunner* spy = counting.get();
    EngineCore device(args, load_model_config(args.model), std::move(counting),
                      std::make_unique<Tokenizer>(Tokenizer::from_pretrained(args.model)));
    const std::vector<RequestOutput> a = host.generate(prompts, params);
    const std::vector<RequestOutput> b = device.generate(prompts, params);
    int stopped = 0;
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      const std::string what = family + " request " + std::to_string(i);
      ASSERT_FALSE(a[i].error.has_value()) << what << ": " << *a[i].error;
      ASSERT_FALSE(b[i].error.has_value()) << what << ": " << *b[i].error;
      ASSERT_EQ(a[i].outputs.size(), b[i].outputs.size()) << what;
      for (size_t k = 0; k < a[i].outputs.size(); ++k) {
        const CompletionOutput &x = a[i].outputs[k], &y = b[i].outputs[k];
        EXPECT_EQ(x.token_ids, y.token_ids) << what;
        EXPECT_EQ(x.text, y.text) << what;
        EXPECT_EQ(x.finish_reason, y.finish_reason) << what;
        EXPECT_EQ(x.cumulative_logprob, y.cumulative_logprob) << what;
        ASSERT_EQ(x.logprobs.size(), y.logprobs.size()) << what;
        for (size_t t = 0; t < x.logprobs.size(); ++t) {
          EXPECT_EQ(x.logprobs[t].logprob, y.logprobs[t].logprob) << what;
          EXPECT_EQ(x.logprobs[t].top, y.logprobs[t].top) << what;
        }
        stopped += x.finish_reason == "stop" && std::holds_alternative<std::string>(x.stop_reason);
      }
      ASSERT_EQ(a[i].prompt_logprobs.size(), b[i].prompt_logprobs.size()) << what;
      for (size_t t = 0; t < a[i].prompt_logprobs.size(); ++t) {
        ASSERT_EQ(a[i].prompt_logprobs[t].has_value(), b[i].prompt_logprobs[t].has_value()) << what;
        if (!a[i].prompt_logprobs[t]) continue;
        EXPECT_EQ(a[i].prompt_logprobs[t]->token, b[i].prompt_logprobs[t]->token) << what;
        EXPECT_EQ(a[i].prompt_logprobs[t]->logprob, b[i].prompt_logprobs[t]->logprob) << what;
        EXPECT_EQ(a[i].prompt_logprobs[t]->top, b[i].prompt_logprobs[t]->top) << what;
      }
    }
    EXPECT_GT(stopped, 0) << family << ": no stop string ended a request (the dropped-row path is not exercised)";
    EXPECT_GT(spy->device_steps, 0) << family;
    EXPECT_GT(spy->gathered_steps, 0) << family << ": no step mixed prompt-logprob rows with rows to sample";
    // Steps while the structured request lives sample after the model's wait; the others queue the sampler behind it.
    EXPECT_GT(spy->waited_steps, 0) << family;
    EXPECT_GT(spy->queued_steps, 0) << family;
    EXPECT_EQ(device.runner().num_states(), 0);
  }
}

}  // namespace
}  // namespace deepinfer
