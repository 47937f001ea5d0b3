// Scheduler and KvCacheManager without a model (vLLM tests/v1/core style): requests and sampled
// tokens are built by hand; the tests assert on queues, budgets, chunks, preemption and frees.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "deepinfer/error.h"
#include "engine/kv_cache_manager.h"
#include "engine/scheduler.h"
#include "sampling/sampler.h"

namespace deepinfer {
namespace {

// Two layers: ratio 4 (compressed + index keys) and ratio 128.
ModelConfig tiny_config() {
  ModelConfig c;
  c.vocab_size = 100;
  c.n_layers = 2;
  c.head_dim = 64;
  c.index_head_dim = 32;
  c.window_size = 16;
  c.compress_ratios = {4, 128};
  c.eos_token_id = 1;
  return c;
}

std::shared_ptr<const Request> make_request(const std::string& id, int num_prompt_tokens, int max_tokens = 16,
                                            int n = 1) {
  auto r = std::make_shared<Request>();
  r->request_id = id;
  for (int i = 0; i < num_prompt_tokens; ++i) r->prompt_token_ids.push_back(10 + i % 50);
  r->params.max_tokens = max_tokens;
  r->params.n = n;
  r->seed = 7;
  return r;
}

struct Fixture {
  ModelConfig cfg = tiny_config();
  KvCacheManager kv;
  Scheduler sched;
  explicit Fixture(SchedulerConfig sc, int64_t kv_bytes = int64_t{1} << 30)
      : kv(cfg, kv_bytes), sched((sc.eos_token_id = 1, sc), kv) {}
  // Sample token `tok` for every sequence of `out` that wanted logits.
  std::vector<SeqUpdate> run(const SchedulerOutput& out, int32_t tok = 50) {
    std::vector<SampledToken> sampled;
    for (const ScheduledSeq& s : out.seqs)
      if (s.want_logits) sampled.push_back(SampledToken{s.seq_id, tok, 0.0f, {}});
    return sched.update_from_output(out, sampled);
  }
};

SchedulerConfig config(int64_t budget, int64_t max_seqs = 64, int64_t max_len = 1000) {
  SchedulerConfig sc;
  sc.max_num_batched_tokens = budget;
  sc.max_num_seqs = max_seqs;
  sc.max_model_len = max_len;
  return sc;
}

TEST(KvCacheManager, PagesFollowTheStateLayout) {
  const ModelConfig cfg = tiny_config();
  KvCacheManager kv(cfg, 1 << 30);
  EXPECT_EQ(kv.bytes_for_tokens(0), 0);
  const KvPages p1 = kv.pages_for_tokens(1);
  EXPECT_EQ(p1.num_pages[static_cast<int>(KvPool::kWindow)], 2);
  EXPECT_EQ(p1.num_pages[static_cast<int>(KvPool::kCompressor)], 3);  // two compressors + the indexer's
  EXPECT_EQ(p1.num_pages[static_cast<int>(KvPool::kCompressed)], 0);
  const KvPages p4 = kv.pages_for_tokens(4);  // the first ratio-4 group is complete
  EXPECT_EQ(p4.num_pages[static_cast<int>(KvPool::kCompressed)], 1);
  EXPECT_EQ(p4.num_pages[static_cast<int>(KvPool::kIndexKeys)], 1);
  EXPECT_EQ(p4.num_bytes - p1.num_bytes, 64 * 64 * 4 + 64 * 32 * 4);
  EXPECT_EQ(kv.pages_for_tokens(127).num_pages[static_cast<int>(KvPool::kCompressed)], 1);
  EXPECT_EQ(kv.pages_for_tokens(128).num_pages[static_cast<int>(KvPool::kCompressed)], 2);  // + ratio 128
  EXPECT_EQ(kv.pages_for_tokens(256).num_pages[static_cast<int>(KvPool::kCompressed)], 2);  // 64 + 2 rows
  EXPECT_EQ(kv.pages_for_tokens(260).num_pages[static_cast<int>(KvPool::kCompressed)], 3);  // 65 + 2 rows
}

TEST(KvCacheManager, ShortageIsAValueAndFreeReturnsEverything) {
  const ModelConfig cfg = tiny_config();
  const int64_t one = KvCacheManager(cfg, 1).bytes_for_tokens(4);
  KvCacheManager kv(cfg, 2 * one);
  Sequence a, b, c;
  a.seq_id = 1, b.seq_id = 2, c.seq_id = 3;
  ASSERT_TRUE(kv.allocate(a, 4).has_value());
  ASSERT_TRUE(kv.allocate(b, 4).has_value());
  EXPECT_FALSE(kv.can_allocate(c, 1));
  EXPECT_FALSE(kv.allocate(c, 1).has_value());
  EXPECT_EQ(kv.usage().used_bytes, 2 * one);
  EXPECT_EQ(kv.usage().num_sequences, 2);
  EXPECT_TRUE(kv.allocate(a, 3).has_value());  // already covered: no growth
  EXPECT_EQ(kv.usage().used_bytes, 2 * one);
  kv.free(a.seq_id);
  kv.free(a.seq_id);  // twice is harmless
  EXPECT_TRUE(kv.allocate(c, 2).has_value());
  kv.free(b.seq_id);
  kv.free(c.seq_id);
  EXPECT_EQ(kv.usage().used_bytes, 0);
  EXPECT_EQ(kv.usage().num_sequences, 0);
  EXPECT_THROW(KvCacheManager(cfg, 0), Error);
}

TEST(Scheduler, RunningDecodesFirstThenChunkedPrefills) {
  Fixture f(config(10));
  f.sched.add_request(make_request("a", 6));
  f.sched.add_request(make_request("b", 6));
  SchedulerOutput o1 = f.sched.schedule();
  ASSERT_EQ(o1.seqs.size(), 2u);
  EXPECT_EQ(o1.seqs[0].tokens.size(), 6u);
  EXPECT_TRUE(o1.seqs[0].want_logits);
  EXPECT_EQ(o1.seqs[1].tokens.size(), 4u);  // chunked to the budget
  EXPECT_FALSE(o1.seqs[1].want_logits);
  EXPECT_EQ(o1.num_scheduled_tokens, 10);
  auto u1 = f.run(o1);
  ASSERT_EQ(u1.size(), 1u);
  EXPECT_EQ(u1[0].request_id, "a");

  SchedulerOutput o2 = f.sched.schedule();
  ASSERT_EQ(o2.seqs.size(), 2u);
  EXPECT_EQ(o2.seqs[0].seq_id, o1.seqs[0].seq_id);  // a's decode token first
  EXPECT_EQ(o2.seqs[0].tokens, std::vector<int32_t>{50});
  EXPECT_EQ(o2.seqs[0].start_pos, 6);
  EXPECT_EQ(o2.seqs[1].start_pos, 4);  // the rest of b's prompt
  EXPECT_EQ(o2.seqs[1].tokens.size(), 2u);
  EXPECT_TRUE(o2.seqs[1].want_logits);
  EXPECT_EQ(f.run(o2).size(), 2u);
  EXPECT_EQ(f.sched.num_running(), 2u);
  EXPECT_EQ(f.sched.num_waiting(), 0u);
}

TEST(Scheduler, WithoutChunkedPrefillALongPromptWaits) {
  SchedulerConfig sc = config(10, 64, 10);
  sc.enable_chunked_prefill = false;
  Fixture f(sc);
  f.sched.add_request(make_request("a", 6));
  f.sched.add_request(make_request("b", 6));
  SchedulerOutput o = f.sched.schedule();
  ASSERT_EQ(o.seqs.size(), 1u);
  EXPECT_EQ(f.sched.num_waiting(), 1u);
  sc.max_model_len = 11;  // the budget must hold one whole prompt
  EXPECT_THROW(sc.validate(), Error);
}

TEST(Scheduler, MaxNumSeqsLimitsTheBatch) {
  Fixture f(config(100, 2));
  for (int i = 0; i < 5; ++i) f.sched.add_request(make_request("r" + std::to_string(i), 3));
  SchedulerOutput o = f.sched.schedule();
  EXPECT_EQ(o.seqs.size(), 2u);
  EXPECT_EQ(f.sched.num_waiting(), 3u);
}

TEST(Scheduler, RejectsTooLongEmptyAndDuplicateAndStaysUsable) {
  Fixture f(config(64, 64, 20));
  EXPECT_THROW(f.sched.add_request(make_request("long", 21)), Error);
  try {
    f.sched.add_request(make_request("long", 21));
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("maximum model length"), std::string::npos) << e.what();
  }
  EXPECT_THROW(f.sched.add_request(make_request("empty", 0)), Error);
  f.sched.add_request(make_request("ok", 20, 5));
  EXPECT_THROW(f.sched.add_request(make_request("ok", 3)), Error);
  EXPECT_EQ(f.sched.num_waiting(), 1u);
  SchedulerOutput o = f.sched.schedule();
  ASSERT_EQ(o.seqs.size(), 1u);
  auto u = f.run(o);
  ASSERT_EQ(u.size(), 1u);  // 20 prompt + 1 output > max_model_len 20: length
  ASSERT_TRUE(u[0].finish_reason.has_value());
  EXPECT_EQ(*u[0].finish_reason, FinishReason::kLength);
  EXPECT_FALSE(f.sched.has_unfinished());
  EXPECT_EQ(f.kv.usage().used_bytes, 0);
}

TEST(Scheduler, PreemptsTheMostRecentlyStartedByRecompute) {
  const ModelConfig cfg = tiny_config();
  KvCacheManager probe(cfg, 1);
  // Room for three sequences below 4 tokens, but not for one of them to pass 4 tokens.
  const int64_t budget = 3 * probe.bytes_for_tokens(3) + (probe.bytes_for_tokens(4) - probe.bytes_for_tokens(3)) / 2;
  Fixture f(config(64), budget);
  f.sched.add_request(make_request("a", 3));
  f.sched.add_request(make_request("b", 3));
  f.sched.add_request(make_request("c", 3));
  f.sched.add_request(make_request("d", 3));
  SchedulerOutput o1 = f.sched.schedule();
  ASSERT_EQ(o1.seqs.size(), 3u);  // d does not fit
  EXPECT_EQ(f.sched.num_waiting(), 1u);
  f.run(o1, 60);
  const int64_t c_id = o1.seqs[2].seq_id;
  const int64_t b_id = o1.seqs[1].seq_id;

  // a grows to 4 tokens: c (the last started) is preempted; what it frees lets b grow too.
  SchedulerOutput o2 = f.sched.schedule();
  ASSERT_EQ(o2.seqs.size(), 2u);
  EXPECT_EQ(o2.seqs[0].seq_id, o1.seqs[0].seq_id);
  EXPECT_EQ(o2.seqs[1].seq_id, b_id);
  EXPECT_EQ(f.sched.num_preemptions(), 1);
  EXPECT_EQ(o2.freed_seq_ids, std::vector<int64_t>{c_id});
  EXPECT_EQ(f.sched.waiting_ids().front(), c_id);  // back to the front of the queue, before d
  const Sequence* c = f.sched.sequence(c_id);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->num_computed_tokens, 0);
  EXPECT_EQ(c->output_token_ids, std::vector<int32_t>{60});  // kept
  EXPECT_EQ(c->status, SequenceStatus::kPreempted);
  f.run(o2, 61);

  // Once a is gone, c re-prefills prompt + its output as known tokens and samples its position 1.
  f.sched.abort_request("a");
  SchedulerOutput o3 = f.sched.schedule();
  ASSERT_EQ(o3.seqs.size(), 2u);
  EXPECT_EQ(o3.seqs[0].seq_id, b_id);
  EXPECT_EQ(o3.seqs[1].seq_id, c_id);
  EXPECT_EQ(o3.seqs[1].start_pos, 0);
  EXPECT_EQ(o3.seqs[1].tokens, (std::vector<int32_t>{10, 11, 12, 60}));
  EXPECT_TRUE(o3.seqs[1].want_logits);
}

TEST(Scheduler, TheLastRunningSequencePreemptsItself) {
  const ModelConfig cfg = tiny_config();
  KvCacheManager probe(cfg, 1);
  const int64_t b3 = probe.bytes_for_tokens(3), b4 = probe.bytes_for_tokens(4);
  Fixture f(config(64), b4 + b3 + (b4 - b3) / 2);
  f.sched.add_request(make_request("a", 4));
  f.sched.add_request(make_request("b", 3));
  SchedulerOutput o1 = f.sched.schedule();
  ASSERT_EQ(o1.seqs.size(), 2u);
  f.run(o1, 60);
  // a decodes within its pages; b must grow, there is no room and b is the last: b preempts itself.
  SchedulerOutput o2 = f.sched.schedule();
  ASSERT_EQ(o2.seqs.size(), 1u);
  EXPECT_EQ(o2.seqs[0].seq_id, o1.seqs[0].seq_id);
  EXPECT_EQ(f.sched.num_preemptions(), 1);
  EXPECT_EQ(f.sched.waiting_ids(), std::vector<int64_t>{o1.seqs[1].seq_id});
  f.run(o2, 61);
  f.sched.abort_request("a");
  SchedulerOutput o3 = f.sched.schedule();
  ASSERT_EQ(o3.seqs.size(), 1u);
  EXPECT_EQ(o3.seqs[0].tokens, (std::vector<int32_t>{10, 11, 12, 60}));
  EXPECT_EQ(o2.freed_seq_ids, std::vector<int64_t>{o1.seqs[1].seq_id});  // b's state goes at once
  EXPECT_EQ(o3.freed_seq_ids, std::vector<int64_t>{o1.seqs[0].seq_id});  // a's abort
}

TEST(Scheduler, ChunkedPrefillSharesTheBudgetWithDecodes) {
  Fixture f(config(3));
  f.sched.add_request(make_request("a", 2));
  SchedulerOutput o = f.sched.schedule();
  f.run(o, 70);
  o = f.sched.schedule();
  f.run(o, 71);  // a decodes one token per step from now on
  f.sched.add_request(make_request("b", 7));
  std::vector<size_t> chunks;
  std::vector<bool> wants;
  while (f.sched.sequence(1) && f.sched.sequence(1)->num_output_tokens() == 0) {
    o = f.sched.schedule();
    for (const ScheduledSeq& s : o.seqs)
      if (s.seq_id == 1) {
        chunks.push_back(s.tokens.size());
        wants.push_back(s.want_logits);
      }
    f.run(o, 72);
  }
  EXPECT_EQ(chunks, (std::vector<size_t>{2, 2, 2, 1}));  // a's decode takes 1 of the 3 each step
  EXPECT_EQ(wants, (std::vector<bool>{false, false, false, true}));
}

TEST(Scheduler, AbortFreesWaitingAndRunning) {
  Fixture f(config(5, 1));
  f.sched.add_request(make_request("a", 3, 16, 2));  // n = 2: two sequences
  f.sched.add_request(make_request("b", 3));
  SchedulerOutput o = f.sched.schedule();
  ASSERT_EQ(o.seqs.size(), 1u);
  EXPECT_EQ(f.sched.num_waiting(), 2u);
  auto u = f.sched.abort_request("a");
  ASSERT_EQ(u.size(), 2u);
  EXPECT_EQ(*u[0].finish_reason, FinishReason::kAbort);
  EXPECT_EQ(f.sched.num_running(), 0u);
  EXPECT_EQ(f.sched.num_waiting(), 1u);
  EXPECT_EQ(f.kv.usage().used_bytes, 0);
  EXPECT_TRUE(f.sched.abort_request("a").empty());  // unknown now
  EXPECT_TRUE(f.sched.update_from_output(o, {SampledToken{o.seqs[0].seq_id, 5, 0.0f, {}}}).empty());
  SchedulerOutput o2 = f.sched.schedule();
  EXPECT_EQ(o2.freed_seq_ids.size(), 2u);
  ASSERT_EQ(o2.seqs.size(), 1u);
}

TEST(Scheduler, ChildrenGetChildSeeds) {
  Fixture f(config(64));
  f.sched.add_request(make_request("a", 3, 4, 3));
  const Sequence* s0 = f.sched.sequence(0);
  const Sequence* s2 = f.sched.sequence(2);
  ASSERT_TRUE(s0 && s2);
  EXPECT_EQ(s0->seed, child_seed(7, 0));
  EXPECT_EQ(s2->seed, child_seed(7, 2));
  EXPECT_NE(s0->seed, s2->seed);
}

TEST(Scheduler, StopRules) {
  Fixture f(config(64));
  auto eos = std::make_shared<Request>(*make_request("eos", 2, 5));
  auto ign = std::make_shared<Request>(*make_request("ign", 2, 2));
  ign->params.ignore_eos = true;
  auto stop = std::make_shared<Request>(*make_request("stop", 2, 5));
  stop->params.stop_token_ids = {1, 33};
  auto mint = std::make_shared<Request>(*make_request("min", 2, 5));
  mint->params.min_tokens = 2;
  for (auto& r : {eos, ign, stop, mint}) f.sched.add_request(r);
  SchedulerOutput o = f.sched.schedule();
  auto pick = [&](int64_t id) -> int32_t { return id == 2 ? 33 : 1; };  // stop gets 33, others EOS
  std::vector<SampledToken> sampled;
  for (const ScheduledSeq& s : o.seqs) sampled.push_back(SampledToken{s.seq_id, pick(s.seq_id), 0.0f, {}});
  auto u = f.sched.update_from_output(o, sampled);
  ASSERT_EQ(u.size(), 4u);
  EXPECT_EQ(u[0].finish_reason, FinishReason::kStop);  // eos
  EXPECT_FALSE(u[1].finish_reason.has_value());        // ignore_eos
  EXPECT_EQ(u[2].finish_reason, FinishReason::kStop);
  EXPECT_EQ(u[2].stop_token, 33);
  EXPECT_FALSE(u[3].finish_reason.has_value());  // min_tokens 2
  o = f.sched.schedule();
  ASSERT_EQ(o.seqs.size(), 2u);
  u = f.run(o, 1);
  EXPECT_EQ(u[0].finish_reason, FinishReason::kLength);  // ign: max_tokens 2
  EXPECT_EQ(u[1].finish_reason, FinishReason::kStop);    // min: EOS counts from the 2nd token
  EXPECT_FALSE(f.sched.has_unfinished());
  EXPECT_EQ(f.kv.usage().used_bytes, 0);
}

}  // namespace
}  // namespace deepinfer
