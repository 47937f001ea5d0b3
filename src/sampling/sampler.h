// Sampling one token from one row of logits. Deterministic: the result depends only on the logits,
// the params, the history (penalties) and (seed, output position) through a counter-based
// generator, never on the batch a sequence ran in or on other sequences.
//
// Pipeline of sample() (vLLM's order; every step works on a private FP32 copy of the row):
//   1. penalties: repetition_penalty on every token seen in prompt or output (logit > 0: divided,
//      else multiplied), then frequency_penalty * count and presence_penalty * [count > 0] subtracted
//      for tokens of the output (vLLM's apply_penalties);
//   2. min_tokens: while the output holds fewer than min_tokens tokens, eos_id (unless ignore_eos) and
//      every stop_token_ids entry are masked (-inf);
//   3. allowed_mask: a token is allowed iff bit (i % 32) of word i / 32 is set; an empty mask (no
//      allowed token inside the vocab) or a mask that leaves nothing after step 2 is a deepinfer::Error;
//   4. temperature < 1e-5 (vLLM's _SAMPLING_EPS): greedy, the argmax with ties to the lowest id, and
//      steps 5-7 are skipped; otherwise logits are divided by the temperature (FP32);
//   5. top_k: exactly the k best tokens by (logit desc, id asc) survive (ties by id, as top-k everywhere
//      in deepinfer; vLLM keeps every token tied with the k-th);
//   6. top_p: the shortest prefix of the survivors in (logit desc, id asc) order whose probability mass
//      reaches top_p of the survivors' mass (vLLM: a token survives iff the mass ranked strictly above it
//      is < top_p). Masses are exact integers: w_i = exp(x_i - x_max) rounded to a multiple of 2^-40, so
//      the cut does not depend on any summation order (the selection runs in O(V) without a full sort);
//   7. min_p: survivors with p_i < min_p * p_max are dropped (on the renormalised survivors, which is
//      the same as w_i < min_p); order top_k -> top_p -> min_p is vLLM V0's (V1 applies min_p first);
//   8. the draw.
//
// The draw is Gumbel-max in its "exponential race" form: every surviving token i gets its own uniform
// u_i = Philox4x32-10(key = seed, counter = (position, i / 4)) word i % 4, E_i = -log(u_i) ~ Exp(1),
// and the token with the smallest E_i / w_i wins (ties: lowest id); P(i wins) = w_i / sum w, exactly
// the softmax of the survivors. Why this and not inverse-CDF with one uniform:
//   - each token's key is computed from that token alone, so the winner does not depend on how the
//     survivors are ordered or summed (no prefix sum, no sort, no floating-point accumulation order);
//     the result is the same for any thread count or loop order by construction;
//   - it is stable under masking: removing tokens that did not win (a grammar mask, a smaller top_k)
//     never changes the winner, so (seed, position) keeps meaning the same draw across configurations;
//   - it needs no sort of the survivors. The cost, a log per survivor, is avoided for almost all
//     tokens by the exact bound E_i >= 1 - u_i (a token is skipped only if it provably cannot win).
//
// Logprobs (vLLM V1's default logprobs_mode "raw_logprobs"): the log-softmax of the RAW logits (before
// penalties, masks and temperature), in FP64 with the sum over ids in ascending order. Computed only
// when params->logprobs >= 0: `logprob` and `rank` of the sampled token, and `top_logprobs` holds the
// params->logprobs best tokens by (logit desc, id asc), best first.
//
// Everything runs single-threaded on the calling thread in a fixed order; scratch buffers are
// thread_local, so concurrent calls from different threads are safe.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "sampling/sampling_params.h"

namespace deepinfer {

struct SampleInput {
  const float* logits = nullptr;  // [vocab], raw model output (FP32)
  int64_t vocab = 0;
  const SamplingParams* params = nullptr;
  uint64_t seed = 0;     // the sequence's seed (request seed, or derived per child for n > 1)
  int64_t position = 0;  // index of the token being sampled among the sequence's outputs
  const std::vector<int32_t>* prompt_ids = nullptr;     // for repetition_penalty
  const std::vector<int32_t>* output_ids = nullptr;     // for penalties and min_tokens (count = size();
                                                        // without it, `position` is the output count)
  int32_t eos_id = -1;                                  // masked while output count < min_tokens (with stop_token_ids)
  const std::vector<uint32_t>* allowed_mask = nullptr;  // optional bitmask over the vocab (grammar)
};

struct SampleResult {
  int32_t token = -1;
  float logprob = 0.0f;       // of the sampled token (raw log-softmax); 0 unless params->logprobs >= 0
  bool has_logprobs = false;  // params->logprobs >= 0: logprob, rank and top_logprobs are filled
  int64_t rank = 0;           // 1-based rank of the sampled token by (raw logit desc, id asc)
  std::vector<std::pair<int32_t, float>> top_logprobs;  // when params->logprobs > 0
};

// Throws deepinfer::Error on bad input (null pointers, vocab <= 0, NaN or +inf logits, token ids out of
// range, a mask shorter than the vocab, nothing left to sample). Never aborts.
SampleResult sample(const SampleInput& in);

// For tests and debugging: the logits after steps 1-4 (penalties, min_tokens, mask, temperature unless
// greedy; -inf = masked), and the distribution the draw samples from after steps 5-7 (the survivors'
// renormalised softmax; one-hot on the argmax when greedy).
std::vector<float> processed_logits(const SampleInput& in);
std::vector<double> sampling_probs(const SampleInput& in);

// Raw log-softmax of one logits row for `token` (its logprob and rank) and the top `k` tokens by
// (logit desc, id asc): what sample() returns as logprobs; for prompt_logprobs. k in [0, vocab].
SampleResult raw_logprobs(const float* logits, int64_t vocab, int32_t token, int k);

// Seed of child i of a request with seed s (n > 1): a fixed mix of (s, i). Child 0 keeps s;
// child i > 0 gets splitmix64(s ^ (0x9E3779B97F4A7C15 * i)).
uint64_t child_seed(uint64_t request_seed, uint64_t child);

}  // namespace deepinfer
