// sample(): see sampler.h for the pipeline, the draw and the logprobs contract.
#include "sampling/sampler.h"

#include <deepinfer/error.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <queue>

#include "sampling/rng.h"

namespace deepinfer {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kSamplingEps = 1e-5f;  // vLLM's _SAMPLING_EPS: below it, temperature means greedy
constexpr double kMassScale = 0x1p40;  // top_p masses: multiples of 2^-40 of the largest weight

// exp(x) for x <= 0 in FP32, written out so that the scalar and the auto-vectorised (AVX2) loops give
// bitwise the same value (the build uses -ffp-contract=off: no FMA contraction): x = n ln2 + r,
// |r| <= ln2 / 2, e^r by its degree-6 Taylor polynomial (relative error < 2e-7), times 2^n built in
// the exponent bits. Inputs below -87 give 0 (weights under 1.6e-38 of the max never matter).
inline float exp_nonpos(float x) {
  // Selects are done on the bits (no conditional FP operation), so GCC vectorises it under the
  // default -ftrapping-math.
  const uint32_t lt = static_cast<uint32_t>(-static_cast<int32_t>(x < -87.0f));  // all ones if x < -87
  const float xc = std::bit_cast<float>((std::bit_cast<uint32_t>(x) & ~lt) | (std::bit_cast<uint32_t>(-87.0f) & lt));
  const float t = xc * 1.44269504f + 12582912.0f;  // 1.5 * 2^23 + round(xc / ln2)
  const float n = t - 12582912.0f;
  const float r = (xc - n * 0.693145752f) - n * 1.42860677e-6f;  // ln2 split in hi + lo
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const uint32_t e = (std::bit_cast<uint32_t>(t) - 0x4B400000u + 127u) << 23;  // 2^n
  const float v = p * std::bit_cast<float>(e);
  return std::bit_cast<float>(std::bit_cast<uint32_t>(v) & ~lt);
}

// Float -> int32 with the same order (for integer max reductions, which vectorise).
inline int32_t ordered_i32(float v) {
  const int32_t b = std::bit_cast<int32_t>(v + 0.0f);
  return b ^ ((b >> 31) & 0x7FFFFFFF);
}

// Philox4x32-10 for 8 consecutive draw blocks (counter words 2-3 = draw index), lane-wise so that the
// compiler vectorises it; the same values as philox_draw(seed, pos, draw0 + j).
void philox_x8(uint64_t seed, uint64_t pos, uint64_t draw0, uint32_t out[4][8]) {
  uint32_t c0[8], c1[8], c2[8], c3[8];
  for (int j = 0; j < 8; ++j) {
    const uint64_t d = draw0 + static_cast<uint64_t>(j);
    c0[j] = static_cast<uint32_t>(pos);
    c1[j] = static_cast<uint32_t>(pos >> 32);
    c2[j] = static_cast<uint32_t>(d);
    c3[j] = static_cast<uint32_t>(d >> 32);
  }
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    for (int j = 0; j < 8; ++j) {
      const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0[j];
      const uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2[j];
      const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1[j] ^ k0;
      const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3[j] ^ k1;
      c1[j] = static_cast<uint32_t>(p1);
      c3[j] = static_cast<uint32_t>(p0);
      c0[j] = n0;
      c2[j] = n2;
    }
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  for (int j = 0; j < 8; ++j) {
    out[0][j] = c0[j];
    out[1][j] = c1[j];
    out[2][j] = c2[j];
    out[3][j] = c3[j];
  }
}

// Total order of (value desc, id asc) as one unsigned key: larger key = better. -0 and +0 tie.
inline uint64_t rank_key(float v, uint32_t id) {
  const uint32_t b = std::bit_cast<uint32_t>(v + 0.0f);
  const uint32_t ord = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return (static_cast<uint64_t>(ord) << 32) | (0xFFFFFFFFu - id);
}
inline uint32_t key_id(uint64_t key) { return 0xFFFFFFFFu - static_cast<uint32_t>(key); }

// The k largest keys among values[i] > -inf, best first. O(V log k) with a size-k min-heap.
std::vector<uint64_t> top_keys(const float* v, int64_t vocab, int64_t k) {
  std::vector<uint64_t> out;
  if (k <= 0) return out;
  if (k <= 4096) {
    std::priority_queue<uint64_t, std::vector<uint64_t>, std::greater<uint64_t>> heap;
    for (int64_t i = 0; i < vocab; ++i) {
      if (!(v[i] > kNegInf)) continue;
      const uint64_t key = rank_key(v[i], static_cast<uint32_t>(i));
      if (static_cast<int64_t>(heap.size()) < k) {
        heap.push(key);
      } else if (key > heap.top()) {
        heap.pop();
        heap.push(key);
      }
    }
    out.resize(heap.size());
    for (size_t j = out.size(); j-- > 0;) {
      out[j] = heap.top();
      heap.pop();
    }
    return out;
  }
  for (int64_t i = 0; i < vocab; ++i) {
    if (v[i] > kNegInf) out.push_back(rank_key(v[i], static_cast<uint32_t>(i)));
  }
  if (static_cast<int64_t>(out.size()) > k) {
    std::nth_element(out.begin(), out.begin() + (k - 1), out.end(), std::greater<uint64_t>());
    out.resize(static_cast<size_t>(k));
  }
  std::sort(out.begin(), out.end(), std::greater<uint64_t>());
  return out;
}

struct KeyMass {
  uint64_t key;
  uint64_t mass;
};

// top_p cut: among `a` (unique keys, integer masses summing to `total`), the smallest key that
// survives, where an element survives iff the mass of the elements with larger keys is < target.
// Quickselect on mass (median-of-3 pivots; falls back to sorting a range after too many rounds).
uint64_t top_p_cut(std::vector<KeyMass>& a, long double target, uint64_t acc) {
  size_t lo = 0, hi = a.size();  // mass of the elements known to rank above a[lo, hi)
  uint64_t last_kept = a.empty() ? 0 : ~0ull;
  int rounds = 0;
  while (hi > lo) {
    if (hi - lo <= 48 || ++rounds > 64) {
      std::sort(a.begin() + lo, a.begin() + hi, [](const KeyMass& x, const KeyMass& y) { return x.key > y.key; });
      for (size_t i = lo; i < hi; ++i) {
        if (!(static_cast<long double>(acc) < target)) break;
        acc += a[i].mass;
        last_kept = a[i].key;
      }
      return last_kept;
    }
    // Median of three keys as pivot, moved to the end of the range.
    const size_t m = lo + (hi - lo) / 2;
    const uint64_t k0 = a[lo].key, k1 = a[m].key, k2 = a[hi - 1].key;
    size_t piv = (k0 < k1) ? ((k1 < k2) ? m : ((k0 < k2) ? hi - 1 : lo)) : ((k0 < k2) ? lo : ((k1 < k2) ? hi - 1 : m));
    std::swap(a[piv], a[hi - 1]);
    const uint64_t pk = a[hi - 1].key;
    // Partition: keys > pivot first.
    size_t store = lo;
    uint64_t up_mass = 0;
    for (size_t i = lo; i + 1 < hi; ++i) {
      if (a[i].key > pk) {
        up_mass += a[i].mass;
        std::swap(a[i], a[store]);
        ++store;
      }
    }
    std::swap(a[store], a[hi - 1]);  // the pivot sits at `store`
    if (!(static_cast<long double>(acc + up_mass) < target)) {
      hi = store;  // the pivot and everything below it are dropped; the cut lies above
    } else {
      acc += up_mass + a[store].mass;  // everything above and the pivot survive
      last_kept = a[store].key;
      lo = store + 1;
    }
  }
  return last_kept;
}

struct Scratch {
  std::vector<float> x;        // processed logits
  std::vector<float> w;        // exp(x - x_max) of finite tokens
  std::vector<int32_t> count;  // output token counts (all zero between calls)
  std::vector<uint8_t> seen;   // prompt/output membership (all zero between calls)
  std::vector<KeyMass> km;
  std::vector<uint64_t> hist;
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

void check_ids(const std::vector<int32_t>* ids, int64_t vocab, const char* what) {
  if (!ids) return;
  for (size_t i = 0; i < ids->size(); ++i) {
    const int32_t t = (*ids)[i];
    DI_CHECK(t >= 0 && t < vocab, "sample: {}[{}] = {} is not a token id of a vocab of {}", what, i, t, vocab);
  }
}

void apply_penalties(const SampleInput& in, const SamplingParams& p, Scratch& s) {
  const bool rep = p.repetition_penalty != 1.0f;
  const bool freq_pres = p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;
  if (!rep && !freq_pres) return;
  float* x = s.x.data();
  const std::vector<int32_t> empty;
  const std::vector<int32_t>& prompt = in.prompt_ids ? *in.prompt_ids : empty;
  const std::vector<int32_t>& out = in.output_ids ? *in.output_ids : empty;
  if (s.count.size() < static_cast<size_t>(in.vocab)) {
    s.count.assign(static_cast<size_t>(in.vocab), 0);
    s.seen.assign(static_cast<size_t>(in.vocab), 0);
  }
  if (rep) {
    const float r = p.repetition_penalty;
    for (const auto* ids : {&prompt, &out}) {
      for (int32_t t : *ids) {
        if (s.seen[t]) continue;
        s.seen[t] = 1;
        x[t] = x[t] > 0.0f ? x[t] / r : x[t] * r;
      }
    }
    for (const auto* ids : {&prompt, &out}) {
      for (int32_t t : *ids) s.seen[t] = 0;
    }
  }
  if (freq_pres) {
    for (int32_t t : out) ++s.count[t];
    for (int32_t t : out) {
      const int32_t c = s.count[t];
      if (c == 0) continue;  // already applied
      x[t] = x[t] - p.frequency_penalty * static_cast<float>(c);
      x[t] = x[t] - p.presence_penalty;
      s.count[t] = 0;
    }
  }
}

// Sum of exp(v[i] - mx) over i, in FP64 with a fixed order: 8 lane sums (lane = i % 8), added in
// lane order at the end. Independent of threads and of how the compiler vectorises.
double sum_exp(const float* v, int64_t n, float mx) {
  double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) lane[j] += static_cast<double>(exp_nonpos(v[i + j] - mx));
  }
  for (; i < n; ++i) lane[i & 7] += static_cast<double>(exp_nonpos(v[i] - mx));
  double s = 0.0;
  for (int j = 0; j < 8; ++j) s += lane[j];
  return s;
}

// Max of v (ordered int reduction) and the first index holding it; -1 if every value is -inf.
std::pair<int64_t, float> first_max(const float* v, int64_t n) {
  int32_t m = ordered_i32(kNegInf);
  for (int64_t i = 0; i < n; ++i) m = std::max(m, ordered_i32(v[i]));
  if (m == ordered_i32(kNegInf)) return {-1, kNegInf};
  int64_t arg = 0;
  while (ordered_i32(v[arg]) != m) ++arg;
  return {arg, v[arg]};
}

}  // namespace

SampleResult raw_logprobs(const float* logits, int64_t vocab, int32_t token, int k) {
  DI_CHECK(logits != nullptr && vocab > 0, "raw_logprobs: empty logits row");
  DI_CHECK(token >= 0 && token < vocab, "raw_logprobs: token {} is outside the vocab of {}", token, vocab);
  DI_CHECK(k >= 0 && k <= vocab, "raw_logprobs: k = {} must be in [0, vocab = {}]", k, vocab);
  const float mx = first_max(logits, vocab).second;
  DI_CHECK(mx > kNegInf, "raw_logprobs: every logit is -inf");
  const double lse = static_cast<double>(mx) + std::log(sum_exp(logits, vocab, mx));
  const float lt = logits[token];
  int64_t above = 0;
  for (int64_t i = 0; i < vocab; ++i) above += (logits[i] > lt) ? 1 : 0;
  for (int64_t i = 0; i < token; ++i) above += (logits[i] == lt) ? 1 : 0;
  SampleResult r;
  r.token = token;
  r.has_logprobs = true;
  r.logprob = static_cast<float>(static_cast<double>(lt) - lse);
  r.rank = above + 1;
  if (k > 0) {
    for (uint64_t key : top_keys(logits, vocab, k)) {
      const uint32_t id = key_id(key);
      r.top_logprobs.emplace_back(static_cast<int32_t>(id), static_cast<float>(static_cast<double>(logits[id]) - lse));
    }
  }
  return r;
}

namespace {

// Steps 1-7 of sampler.h into the scratch buffers: s.x holds the processed logits (after temperature
// unless greedy), s.w the survivors' weights exp(x - x_max) (0 = dropped; unset when greedy).
// Returns the index of the max of s.x (first on ties) and whether the draw is greedy.
struct Prepared {
  int64_t arg;
  bool greedy;
};

Prepared prepare(const SampleInput& in, Scratch& s) {
  DI_CHECK(in.logits != nullptr, "sample: logits is null");
  DI_CHECK(in.params != nullptr, "sample: params is null");
  DI_CHECK(in.vocab > 0 && in.vocab < (int64_t{1} << 31), "sample: vocab must be in [1, 2^31), got {}", in.vocab);
  DI_CHECK(in.position >= 0, "sample: position must be >= 0, got {}", in.position);
  const SamplingParams& p = *in.params;
  const int64_t V = in.vocab;
  s.x.resize(static_cast<size_t>(V));
  float* x = s.x.data();
  {
    uint32_t bad = 0;  // NaN or +inf anywhere
    for (int64_t i = 0; i < V; ++i) {
      const float v = in.logits[i];
      bad |= static_cast<uint32_t>(!(v < std::numeric_limits<float>::infinity()));
      x[i] = v;
    }
    if (bad) {
      for (int64_t i = 0; i < V; ++i) {
        const float v = in.logits[i];
        DI_CHECK(!std::isnan(v) && v != std::numeric_limits<float>::infinity(),
                 "sample: logit of token {} is {}; logits must be finite or -inf", i, v);
      }
    }
  }
  check_ids(in.prompt_ids, V, "prompt_ids");
  check_ids(in.output_ids, V, "output_ids");

  // 1. penalties.
  apply_penalties(in, p, s);

  // 2. min_tokens.
  const int64_t n_out = in.output_ids ? static_cast<int64_t>(in.output_ids->size()) : in.position;
  if (n_out < p.min_tokens) {
    if (in.eos_id >= 0 && in.eos_id < V && !p.ignore_eos) x[in.eos_id] = kNegInf;
    for (int32_t t : p.stop_token_ids) {
      if (t >= 0 && t < V) x[t] = kNegInf;
    }
  }

  // 3. allowed_mask.
  if (in.allowed_mask) {
    const auto& m = *in.allowed_mask;
    const size_t words = static_cast<size_t>((V + 31) / 32);
    DI_CHECK(m.size() >= words, "sample: allowed_mask has {} words; a vocab of {} needs {}", m.size(), V, words);
    int64_t allowed = 0;
    for (int64_t i = 0; i < V; ++i) {
      const bool ok = (m[static_cast<size_t>(i >> 5)] >> (i & 31)) & 1u;
      allowed += ok;
      if (!ok) x[i] = kNegInf;
    }
    DI_CHECK(allowed > 0, "sample: allowed_mask allows no token of the vocab of {} (an empty grammar mask)", V);
  }

  // Max (first index on ties).
  auto [arg, mx] = first_max(x, V);
  DI_CHECK(arg >= 0,
           "sample: no token can be sampled: min_tokens ({}), stop_token_ids, eos and allowed_mask mask the whole "
           "vocab (or every logit is -inf)",
           p.min_tokens);

  const bool greedy = p.temperature < kSamplingEps;
  if (!greedy) {
    // 4. temperature (-inf stays -inf; dividing by t > 0 keeps the order, so arg stays the max).
    if (p.temperature != 1.0f) {
      const float t = p.temperature;
      for (int64_t i = 0; i < V; ++i) x[i] = x[i] / t;
      mx = x[arg];
    }
    // 5. top_k: exactly k survivors by (x desc, id asc).
    if (p.top_k > 0) {
      int64_t n_finite = 0;
      for (int64_t i = 0; i < V; ++i) n_finite += x[i] > kNegInf ? 1 : 0;
      if (p.top_k < n_finite) {
        const uint64_t cut = top_keys(x, V, p.top_k).back();
        for (int64_t i = 0; i < V; ++i) {
          if (x[i] > kNegInf && rank_key(x[i], static_cast<uint32_t>(i)) < cut) x[i] = kNegInf;
        }
      }
    }
    // Weights relative to the max (the max itself has weight 1 and survives every step).
    s.w.resize(static_cast<size_t>(V));
    float* w = s.w.data();
    for (int64_t i = 0; i < V; ++i) w[i] = exp_nonpos(x[i] - mx);  // -inf -> 0

    // 6. top_p over the survivors, with exact integer masses. A histogram of the masses over 2048
    // buckets of w (its float bits >> 20: exponent and 3 mantissa bits, monotone in w) finds the bucket
    // holding the cut; only that bucket's tokens are ranked exactly.
    if (p.top_p < 1.0f) {
      s.hist.assign(2048, 0);
      uint64_t total = 0;
      for (int64_t i = 0; i < V; ++i) {
        const uint64_t mass = static_cast<uint64_t>(static_cast<double>(w[i]) * kMassScale + 0.5);
        s.hist[std::bit_cast<uint32_t>(w[i]) >> 20] += mass;
        total += mass;
      }
      const long double target = static_cast<long double>(p.top_p) * static_cast<long double>(total);
      uint64_t acc = 0;
      uint32_t b = 2047;
      while (b > 0 && !(static_cast<long double>(acc + s.hist[b]) >= target)) acc += s.hist[b--];
      // Tokens in buckets above b survive; below b, or with zero mass (ranked after all positive masses,
      // so never reached for top_p < 1), they are dropped; inside b, the exact cut decides.
      s.km.clear();
      for (int64_t i = 0; i < V; ++i) {
        if ((std::bit_cast<uint32_t>(w[i]) >> 20) == b && w[i] > 0.0f) {
          s.km.push_back({rank_key(x[i], static_cast<uint32_t>(i)),
                          static_cast<uint64_t>(static_cast<double>(w[i]) * kMassScale + 0.5)});
        }
      }
      const uint64_t cut = top_p_cut(s.km, target, acc);
      for (int64_t i = 0; i < V; ++i) {
        const uint32_t bi = std::bit_cast<uint32_t>(w[i]) >> 20;
        const uint64_t mass = static_cast<uint64_t>(static_cast<double>(w[i]) * kMassScale + 0.5);
        const bool keep = mass > 0 && (bi > b || (bi == b && rank_key(x[i], static_cast<uint32_t>(i)) >= cut));
        w[i] = keep ? w[i] : 0.0f;
      }
    }
    // 7. min_p: p_i < min_p * p_max  <=>  w_i < min_p (w relative to the max, which survived).
    if (p.min_p > 0.0f) {
      const float mp = p.min_p;
      for (int64_t i = 0; i < V; ++i) w[i] = w[i] < mp ? 0.0f : w[i];
    }
  }
  return {arg, greedy};
}

}  // namespace

std::vector<float> processed_logits(const SampleInput& in) {
  Scratch& s = scratch();
  prepare(in, s);
  return std::vector<float>(s.x.begin(), s.x.begin() + in.vocab);
}

std::vector<double> sampling_probs(const SampleInput& in) {
  Scratch& s = scratch();
  const Prepared pr = prepare(in, s);
  std::vector<double> out(static_cast<size_t>(in.vocab), 0.0);
  if (pr.greedy) {
    out[static_cast<size_t>(pr.arg)] = 1.0;
    return out;
  }
  double sum = 0.0;
  for (int64_t i = 0; i < in.vocab; ++i) sum += static_cast<double>(s.w[i]);
  for (int64_t i = 0; i < in.vocab; ++i) out[static_cast<size_t>(i)] = static_cast<double>(s.w[i]) / sum;
  return out;
}

SampleResult sample(const SampleInput& in) {
  Scratch& s = scratch();
  const Prepared pr = prepare(in, s);
  const SamplingParams& p = *in.params;
  const int64_t V = in.vocab;
  const int64_t arg = pr.arg;
  int32_t token = static_cast<int32_t>(arg);
  if (!pr.greedy) {
    const float* w = s.w.data();
    // 8. exponential race: argmin E_i / w_i over w_i > 0, E_i = -log(u_i). Seeded with the max token;
    // a token is skipped when the bound E_i >= 1 - u_i proves E_i / w_i > best (1e-9 relative margin).
    const uint64_t pos = static_cast<uint64_t>(in.position);
    int64_t best_i = arg;
    double best = -std::log(u32_to_open01(philox_draw(in.seed, pos, static_cast<uint64_t>(arg) >> 2)[arg & 3])) /
                  static_cast<double>(w[arg]);
    uint32_t r[4][8];
    for (int64_t b0 = 0; b0 < V; b0 += 32) {  // 8 Philox blocks of 4 tokens
      const int64_t e = std::min<int64_t>(b0 + 32, V);
      float wmax = 0.0f;
      for (int64_t i = b0; i < e; ++i) wmax = std::max(wmax, w[i]);
      if (!(wmax > 0.0f)) continue;
      philox_x8(in.seed, pos, static_cast<uint64_t>(b0) >> 2, r);
      const double bound = best * (1.0 + 1e-9);
      for (int64_t i = b0; i < e; ++i) {
        const int64_t d = i - b0;
        const double u = u32_to_open01(r[d & 3][d >> 2]);
        const double wi = static_cast<double>(w[i]);
        if (!(wi > 0.0) || 1.0 - u > bound * wi || i == arg) continue;  // E_i / w_i >= (1 - u) / w_i > best
        const double key = -std::log(u) / wi;
        if (key < best || (key == best && i < best_i)) {
          best = key;
          best_i = i;
        }
      }
    }
    token = static_cast<int32_t>(best_i);
  }

  SampleResult res;
  if (p.logprobs >= 0) res = raw_logprobs(in.logits, V, token, static_cast<int>(std::min<int64_t>(p.logprobs, V)));
  res.token = token;
  return res;
}

uint64_t child_seed(uint64_t request_seed, uint64_t child) {
  if (child == 0) return request_seed;
  return splitmix64_mix(request_seed ^ (0x9E3779B97F4A7C15ull * child));
}

}  // namespace deepinfer
