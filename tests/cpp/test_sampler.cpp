// Sampling: SamplingParams validation and JSON, the Philox RNG, and sample()'s pipeline.
#include <deepinfer/error.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "sample_inputs.h"
#include "sampling/rng.h"
#include "sampling/sampler.h"
#include "sampling/sampling_params.h"

using namespace deepinfer;

namespace {

// Expects validate() to throw an Error whose message names `field`.
template <typename F>
void expect_invalid(F set, const std::string& field) {
  SamplingParams p;
  set(p);
  try {
    p.validate();
    ADD_FAILURE() << "no error for " << field;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
  }
}

// A row with its own logits.
struct Row : SampleRowInputs {
  std::vector<float> logits;
  SampleInput in(uint64_t seed = 0, int64_t pos = 0) const {
    return input(logits.data(), static_cast<int64_t>(logits.size()), seed, pos);
  }
};

std::vector<float> log_of(std::vector<double> q) {
  std::vector<float> l;
  for (double v : q) l.push_back(static_cast<float>(std::log(v)));
  return l;
}

std::set<int32_t> support(const std::vector<double>& probs) {
  std::set<int32_t> s;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] > 0) s.insert(static_cast<int32_t>(i));
  }
  return s;
}

// Tokens actually drawn over positions [0, n).
std::set<int32_t> drawn(const Row& r, int n, uint64_t seed = 7) {
  std::set<int32_t> s;
  for (int i = 0; i < n; ++i) s.insert(sample(r.in(seed, i)).token);
  return s;
}

}  // namespace

// ---- SamplingParams -------------------------------------------------------------------------------

TEST(SamplingParams, DefaultsAreValid) { EXPECT_NO_THROW(SamplingParams{}.validate()); }

TEST(SamplingParams, ValidationNamesEachField) {
  expect_invalid([](auto& p) { p.n = 0; }, "n must");
  expect_invalid([](auto& p) { p.temperature = -0.1f; }, "temperature");
  expect_invalid([](auto& p) { p.temperature = NAN; }, "temperature");
  expect_invalid([](auto& p) { p.top_p = 0.0f; }, "top_p");
  expect_invalid([](auto& p) { p.top_p = 1.01f; }, "top_p");
  expect_invalid([](auto& p) { p.top_k = -2; }, "top_k");
  expect_invalid([](auto& p) { p.min_p = -0.01f; }, "min_p");
  expect_invalid([](auto& p) { p.min_p = 1.5f; }, "min_p");
  expect_invalid([](auto& p) { p.presence_penalty = 2.5f; }, "presence_penalty");
  expect_invalid([](auto& p) { p.frequency_penalty = -2.5f; }, "frequency_penalty");
  expect_invalid([](auto& p) { p.repetition_penalty = 0.0f; }, "repetition_penalty");
  expect_invalid([](auto& p) { p.max_tokens = 0; }, "max_tokens");
  expect_invalid([](auto& p) { p.min_tokens = -1; }, "min_tokens");
  expect_invalid([](auto& p) { p.min_tokens = 17; }, "min_tokens");
  expect_invalid([](auto& p) { p.logprobs = 21; }, "logprobs");
  expect_invalid([](auto& p) { p.logprobs = -2; }, "logprobs");
  expect_invalid([](auto& p) { p.prompt_logprobs = 21; }, "prompt_logprobs");
  expect_invalid([](auto& p) { p.stop = {"ok", ""}; }, "stop[1]");
  expect_invalid([](auto& p) { p.stop_token_ids = {-1}; }, "stop_token_ids");
  // Boundaries that are allowed.
  SamplingParams p;
  p.top_k = -1;
  p.top_p = 1.0f;
  p.min_p = 1.0f;
  p.presence_penalty = -2.0f;
  p.frequency_penalty = 2.0f;
  p.min_tokens = p.max_tokens;
  p.logprobs = 20;
  p.prompt_logprobs = -1;
  p.temperature = 0.0f;
  EXPECT_NO_THROW(p.validate());
}

TEST(SamplingParams, FromJsonNamesAndAliases) {
  auto p = SamplingParams::from_json(nlohmann::json::parse(
      R"({"n": 2, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "min_p": 0.1, "presence_penalty": 0.5,
          "frequency_penalty": -0.5, "repetition_penalty": 1.2, "max_completion_tokens": 64, "min_tokens": 2,
          "stop": "###", "stop_token_ids": [1, 2], "ignore_eos": true, "logprobs": 5, "prompt_logprobs": 0,
          "seed": 18446744073709551615, "seq_seed": 3, "skip_special_tokens": false, "so_args": {"json": {}},
          "model": "ignored", "stream": true, "user": null})"));
  EXPECT_EQ(p.n, 2);
  EXPECT_FLOAT_EQ(p.temperature, 0.5f);
  EXPECT_EQ(p.top_k, 40);
  EXPECT_EQ(p.max_tokens, 64);
  EXPECT_EQ(p.stop, std::vector<std::string>{"###"});
  EXPECT_EQ(p.stop_token_ids, (std::vector<int32_t>{1, 2}));
  EXPECT_TRUE(p.ignore_eos);
  EXPECT_EQ(p.logprobs, 5);
  EXPECT_EQ(*p.seed, 18446744073709551615ull);
  EXPECT_EQ(*p.seq_seed, 3u);
  EXPECT_FALSE(p.skip_special_tokens);
  EXPECT_TRUE(p.so_args.is_object());
  auto q = SamplingParams::from_json(
      nlohmann::json::parse(R"({"stop": ["a", "b"], "max_tokens": 8.0, "logprobs": true, "top_logprobs": 3,
                                "temperature": null})"));
  EXPECT_EQ(q.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(q.max_tokens, 8);
  EXPECT_EQ(q.logprobs, 3);
  EXPECT_FLOAT_EQ(q.temperature, 1.0f);
  EXPECT_EQ(SamplingParams::from_json(nlohmann::json::parse(R"({"logprobs": false})")).logprobs, -1);
}

TEST(SamplingParams, FromJsonRejectsWrongTypesAndRanges) {
  for (const char* bad :
       {R"({"temperature": "0.5"})", R"({"top_k": 1.5})", R"({"stop": 3})", R"({"stop": ["a", 1]})", R"({"seed": -1})",
        R"({"seed": 1.5})", R"({"ignore_eos": 1})", R"({"n": 0})", R"({"max_tokens": 4, "max_completion_tokens": 5})",
        R"({"stop_token_ids": 3})", R"({"top_p": 0})", R"([1, 2])", R"({"max_tokens": 3000000000})"}) {
    EXPECT_THROW(SamplingParams::from_json(nlohmann::json::parse(bad)), Error) << bad;
  }
}

// ---- RNG -----------------------------------------------------------------------------------------

// Random123's kat_vectors for philox4x32 with 10 rounds (counter[4] key[2] -> output[4]).
TEST(Philox, Random123KnownAnswers) {
  EXPECT_EQ(philox4x32({0, 0, 0, 0}, {0, 0}), (PhiloxCounter{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(philox4x32({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
            (PhiloxCounter{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(philox4x32({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
            (PhiloxCounter{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

// Values from an independent Python implementation written from the paper (tools in the report).
TEST(Philox, MatchesIndependentReimplementation) {
  EXPECT_EQ(philox4x32({1, 2, 3, 4}, {5, 6}), (PhiloxCounter{0xc0c839bc, 0x889c87c5, 0x61986739, 0x2d4623d0}));
  EXPECT_EQ(philox4x32({7, 0, 123456789, 0}, {0xdeadbeef, 0x12345678}),
            (PhiloxCounter{0x149f4c22, 0x4f789de7, 0x615ba4b9, 0xc1473c37}));
  // philox_draw's layout: key = seed (lo, hi), counter = (position lo, hi, draw lo, hi).
  EXPECT_EQ(philox_draw(0x12345678deadbeefull, 0, 123456789),
            philox4x32({0, 0, 123456789, 0}, {0xdeadbeef, 0x12345678}));
}

TEST(Philox, ChildSeed) {
  EXPECT_EQ(child_seed(42, 0), 42u);
  std::set<uint64_t> seen;
  for (uint64_t i = 0; i < 1000; ++i) seen.insert(child_seed(42, i));
  EXPECT_EQ(seen.size(), 1000u);
  EXPECT_EQ(child_seed(42, 3), child_seed(42, 3));
  EXPECT_NE(child_seed(42, 1), child_seed(43, 1));
}

// ---- sample() ------------------------------------------------------------------------------------

TEST(Sampler, GreedyTiesGoToLowestId) {
  Row r;
  r.logits = {0.5f, 2.0f, -1.0f, 2.0f, 2.0f};
  r.p.temperature = 0.0f;
  for (int pos = 0; pos < 20; ++pos) EXPECT_EQ(sample(r.in(pos * 977u, pos)).token, 1);
  r.p.temperature = 5e-6f;  // below vLLM's epsilon: greedy too
  EXPECT_EQ(sample(r.in(3, 3)).token, 1);
}

TEST(Sampler, DeterministicInSeedAndPosition) {
  Row r;
  for (int i = 0; i < 1000; ++i) r.logits.push_back(static_cast<float>(std::sin(i * 0.37) * 2.0));
  r.p.temperature = 1.0f;
  std::vector<int32_t> a, b;
  for (int pos = 0; pos < 200; ++pos) a.push_back(sample(r.in(99, pos)).token);
  for (int pos = 199; pos >= 0; --pos) b.push_back(sample(r.in(99, pos)).token);  // reversed order
  std::reverse(b.begin(), b.end());
  EXPECT_EQ(a, b);
  // Other threads, interleaved with other sequences' calls.
  std::vector<int32_t> c(200), d(200);
  std::thread t1([&] {
    for (int pos = 0; pos < 200; pos += 2) c[pos] = sample(r.in(99, pos)).token;
  });
  std::thread t2([&] {
    for (int pos = 1; pos < 200; pos += 2) {
      sample(r.in(5, pos));
      c[pos] = sample(r.in(99, pos)).token;
    }
  });
  t1.join();
  t2.join();
  EXPECT_EQ(a, c);
  // Positions are not all alike, and another seed gives another sequence.
  EXPECT_GT(std::set<int32_t>(a.begin(), a.end()).size(), 50u);
  for (int pos = 0; pos < 200; ++pos) d[pos] = sample(r.in(100, pos)).token;
  int same = 0;
  for (int i = 0; i < 200; ++i) same += a[i] == d[i];
  EXPECT_LT(same, 40);
}

// Chi-square goodness of fit over 40,000 positions, 8 tokens (7 degrees of freedom). The threshold
// 40.52 is the 1 - 1e-6 quantile of chi2(7): a correct sampler fails with probability 1e-6 per seed;
// the seeds are fixed, so the test is deterministic.
TEST(Sampler, ChiSquareMatchesSoftmax) {
  Row r;
  r.logits = {1.0f, 0.0f, -0.5f, 2.0f, 0.3f, -2.0f, 1.5f, 0.0f};
  for (float t : {1.0f, 0.7f}) {
    for (uint64_t seed : {1ull, 0xfeedbeefcafeull}) {
      r.p.temperature = t;
      const int n = 40000;
      std::vector<double> want(8);
      double z = 0;
      for (int i = 0; i < 8; ++i) z += want[i] = std::exp(static_cast<double>(r.logits[i]) / t);
      std::vector<int> cnt(8, 0);
      for (int pos = 0; pos < n; ++pos) ++cnt[sample(r.in(seed, pos)).token];
      double chi2 = 0;
      for (int i = 0; i < 8; ++i) {
        const double e = want[i] / z * n;
        chi2 += (cnt[i] - e) * (cnt[i] - e) / e;
      }
      EXPECT_LT(chi2, 40.52) << "temperature " << t << " seed " << seed;
    }
  }
}

TEST(Sampler, ChiSquareAfterTopP) {  // survivors {3, 6, 0} renormalised; 2 degrees of freedom (1e-6: 27.63)
  Row r;
  r.logits = {1.0f, 0.0f, -0.5f, 2.0f, 0.3f, -2.0f, 1.5f, 0.0f};
  r.p.top_p = 0.7f;
  const auto probs = sampling_probs(r.in());
  EXPECT_EQ(support(probs), (std::set<int32_t>{0, 3, 6}));
  std::vector<int> cnt(8, 0);
  const int n = 30000;
  for (int pos = 0; pos < n; ++pos) ++cnt[sample(r.in(11, pos)).token];
  double chi2 = 0;
  for (int i : {0, 3, 6}) chi2 += (cnt[i] - probs[i] * n) * (cnt[i] - probs[i] * n) / (probs[i] * n);
  EXPECT_EQ(cnt[1] + cnt[2] + cnt[4] + cnt[5] + cnt[7], 0);
  EXPECT_LT(chi2, 27.63);
}

TEST(Sampler, TopKKeepsExactlyKWithTiesById) {
  Row r;
  r.logits = {1.0f, 3.0f, 3.0f, 2.0f, 3.0f, 0.0f};
  r.p.top_k = 2;
  EXPECT_EQ(support(sampling_probs(r.in())), (std::set<int32_t>{1, 2}));
  EXPECT_EQ(drawn(r, 300), (std::set<int32_t>{1, 2}));
  r.p.top_k = 4;
  EXPECT_EQ(support(sampling_probs(r.in())), (std::set<int32_t>{1, 2, 3, 4}));
  r.p.top_k = 100;  // larger than the vocab: off
  EXPECT_EQ(support(sampling_probs(r.in())).size(), 6u);
  r.p.top_k = -1;
  EXPECT_EQ(support(sampling_probs(r.in())).size(), 6u);
}

TEST(Sampler, TopPKeepsShortestPrefix) {
  Row r;
  r.logits = log_of({0.1, 0.4, 0.2, 0.3});  // order: 1 (.4), 3 (.3), 2 (.2), 0 (.1)
  auto kept = [&](float top_p) {
    r.p.top_p = top_p;
    return support(sampling_probs(r.in()));
  };
  EXPECT_EQ(kept(0.3f), (std::set<int32_t>{1}));
  EXPECT_EQ(kept(0.65f), (std::set<int32_t>{1, 3}));
  EXPECT_EQ(kept(0.75f), (std::set<int32_t>{1, 3, 2}));  // mass above token 2 is 0.7 < 0.75
  EXPECT_EQ(kept(0.95f), (std::set<int32_t>{0, 1, 2, 3}));
  r.p.top_p = 0.65f;
  EXPECT_EQ(drawn(r, 300), (std::set<int32_t>{1, 3}));
  // Ties: four equal tokens, ranked by id.
  r.logits = {0.0f, 0.0f, 0.0f, 0.0f};
  EXPECT_EQ(kept(0.5f), (std::set<int32_t>{0, 1}));  // mass above token 2 is exactly 0.5: dropped
  EXPECT_EQ(kept(0.6f), (std::set<int32_t>{0, 1, 2}));
  // After top_k the survivors are renormalised: top_k 2 of {.4,.3,...} then top_p .6 of {4/7, 3/7}.
  r.logits = log_of({0.1, 0.4, 0.2, 0.3});
  r.p.top_k = 2;
  EXPECT_EQ(kept(0.55f), (std::set<int32_t>{1}));
  EXPECT_EQ(kept(0.6f), (std::set<int32_t>{1, 3}));
}

TEST(Sampler, TopPOnALargeVocabMatchesSortedReference) {
  Row r;
  const int V = 50000;
  for (int i = 0; i < V; ++i) r.logits.push_back(static_cast<float>(std::fmod(i * 0.618034, 1.0) * 4.0));
  r.logits[777] = r.logits[778];  // a tie
  for (float tp : {0.1f, 0.5f, 0.9f, 0.99f}) {
    r.p.top_p = tp;
    const auto probs = sampling_probs(r.in());
    // Reference: sort by (logit desc, id asc), keep while the mass before is < top_p (FP64 softmax).
    std::vector<int> idx(V);
    for (int i = 0; i < V; ++i) idx[i] = i;
    std::sort(idx.begin(), idx.end(),
              [&](int a, int b) { return r.logits[a] != r.logits[b] ? r.logits[a] > r.logits[b] : a < b; });
    double z = 0;
    for (int i = 0; i < V; ++i) z += std::exp(static_cast<double>(r.logits[i]) - 4.0);
    double acc = 0;
    size_t n_keep = 0;
    for (int i : idx) {
      if (!(acc < tp * z)) break;
      acc += std::exp(static_cast<double>(r.logits[i]) - 4.0);
      ++n_keep;
    }
    const auto got = support(probs);
    EXPECT_NEAR(static_cast<double>(got.size()), static_cast<double>(n_keep), 1.0) << tp;  // FP rounding at the edge
    for (size_t k = 0; k + 1 < std::min(got.size(), n_keep); ++k) EXPECT_TRUE(got.count(idx[k])) << tp;
  }
}

TEST(Sampler, MinPRelativeToMax) {
  Row r;
  r.logits = log_of({0.05, 0.5, 0.15, 0.3});
  r.p.min_p = 0.25f;  // threshold 0.125
  EXPECT_EQ(support(sampling_probs(r.in())), (std::set<int32_t>{1, 2, 3}));
  r.p.min_p = 0.5f;  // threshold 0.25
  EXPECT_EQ(support(sampling_probs(r.in())), (std::set<int32_t>{1, 3}));
  EXPECT_EQ(drawn(r, 300), (std::set<int32_t>{1, 3}));
  r.p.min_p = 1.0f;
  EXPECT_EQ(support(sampling_probs(r.in())), (std::set<int32_t>{1}));
}

TEST(Sampler, PenaltiesMatchHandComputation) {
  Row r;
  r.logits = {2.0f, -1.0f, 0.5f, 3.0f, 1.0f};
  r.prompt = {0, 0};
  r.output = {1, 2, 2};
  r.p.repetition_penalty = 2.0f;
  r.p.frequency_penalty = 0.5f;
  r.p.presence_penalty = 0.25f;
  const auto x = processed_logits(r.in());
  EXPECT_FLOAT_EQ(x[0], 1.0f);    // prompt: 2 / 2
  EXPECT_FLOAT_EQ(x[1], -2.75f);  // -1 * 2 - 0.5 * 1 - 0.25
  EXPECT_FLOAT_EQ(x[2], -1.0f);   // 0.5 / 2 - 0.5 * 2 - 0.25
  EXPECT_FLOAT_EQ(x[3], 3.0f);    // untouched
  EXPECT_FLOAT_EQ(x[4], 1.0f);
  r.p.temperature = 0.5f;  // temperature divides after the penalties
  EXPECT_FLOAT_EQ(processed_logits(r.in())[1], -5.5f);
  // Greedy follows the penalised logits.
  r.logits = {3.0f, 2.9f};
  r.output = {0};
  r.prompt = {};
  r.p = SamplingParams{};
  r.p.temperature = 0.0f;
  r.p.presence_penalty = 0.2f;
  EXPECT_EQ(sample(r.in()).token, 1);
}

TEST(Sampler, MinTokensMasksEosAndStopIds) {
  Row r;
  r.logits = {0.0f, 5.0f, 4.0f, 1.0f};
  r.eos = 1;
  r.p.temperature = 0.0f;
  r.p.min_tokens = 2;
  r.p.stop_token_ids = {2};
  r.output = {3};
  EXPECT_EQ(sample(r.in()).token, 3);
  r.output = {3, 3};  // reached min_tokens: nothing masked
  EXPECT_EQ(sample(r.in()).token, 1);
  r.output = {3};
  r.p.ignore_eos = true;  // eos not a stop token then (vLLM), so not masked
  EXPECT_EQ(sample(r.in()).token, 1);
  r.p.ignore_eos = false;
  r.p.temperature = 1.0f;
  EXPECT_EQ(support(sampling_probs(r.in())), (std::set<int32_t>{0, 3}));
}

TEST(Sampler, AllowedMaskRestrictsAndEmptyMaskIsAnError) {
  Row r;
  for (int i = 0; i < 70; ++i) r.logits.push_back(static_cast<float>(i % 7));
  r.mask.assign(3, 0u);
  r.mask[0] = 1u << 3;  // token 3
  r.mask[2] = 1u << 5;  // token 69
  EXPECT_EQ(support(sampling_probs(r.in())), (std::set<int32_t>{3, 69}));
  EXPECT_EQ(drawn(r, 200), (std::set<int32_t>{3, 69}));
  r.p.temperature = 0.0f;
  EXPECT_EQ(sample(r.in()).token, 69);  // logit 6 > 3
  r.mask.assign(3, 0u);
  r.mask[2] = 0xFFFFFFC0u;  // bits beyond the vocab only
  EXPECT_THROW(sample(r.in()), Error);
  r.mask.assign(2, ~0u);  // too short
  EXPECT_THROW(sample(r.in()), Error);
  // A mask that only allows eos while min_tokens masks it: an Error, not a crash.
  r.mask.assign(3, 0u);
  r.mask[0] = 1u;
  r.eos = 0;
  r.p.min_tokens = 1;
  EXPECT_THROW(sample(r.in()), Error);
}

TEST(Sampler, BadInputIsAnError) {
  Row r;
  r.logits = {0.0f, NAN};
  EXPECT_THROW(sample(r.in()), Error);
  r.logits = {0.0f, 1.0f};
  r.output = {2};
  EXPECT_THROW(sample(r.in()), Error);
  r.output = {};
  SampleInput in = r.in();
  in.params = nullptr;
  EXPECT_THROW(sample(in), Error);
  r.logits = {-INFINITY, -INFINITY};
  EXPECT_THROW(sample(r.in()), Error);
}

TEST(Sampler, LogprobsAreRawLogSoftmaxOrderedByValueThenId) {
  Row r;
  r.logits = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f};
  r.p.temperature = 0.0f;
  r.p.repetition_penalty = 5.0f;  // penalties do not change the reported (raw) logprobs
  r.prompt = {1};
  r.p.logprobs = 3;
  const SampleResult res = sample(r.in());
  EXPECT_EQ(res.token, 3);  // token 1 penalised to 0.6
  double z = 0;
  for (float v : r.logits) z += std::exp(static_cast<double>(v));
  const double lse = std::log(z);
  EXPECT_TRUE(res.has_logprobs);
  EXPECT_NEAR(res.logprob, 3.0 - lse, 1e-6);
  EXPECT_EQ(res.rank, 2);  // behind token 1 (same logit, lower id)
  ASSERT_EQ(res.top_logprobs.size(), 3u);
  EXPECT_EQ(res.top_logprobs[0].first, 1);
  EXPECT_EQ(res.top_logprobs[1].first, 3);
  EXPECT_EQ(res.top_logprobs[2].first, 2);
  EXPECT_NEAR(res.top_logprobs[2].second, 2.0 - lse, 1e-6);
  r.p.logprobs = 0;
  EXPECT_TRUE(sample(r.in()).top_logprobs.empty());
  r.p.logprobs = -1;
  EXPECT_FALSE(sample(r.in()).has_logprobs);
}
