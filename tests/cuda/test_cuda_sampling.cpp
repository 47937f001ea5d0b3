// GPU sampling (src/cuda/sampling.cu) against the CPU sample() (src/sampling/sampler.cpp): random batches of
// rows with every sampling mode, history and mask, and every field compared exactly (token, rank, top ids, and
// the logprob floats bit for bit). Then the errors: a clear deepinfer::Error, and the next call still works.
// Prints PASS / FAIL per case; exit 0 all passed, 1 a failure, 2 no GPU.
//   ./build/src/cuda/deepinfer_cuda_sampling_tests [CASES]
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cuda/device.h"
#include "cuda/sampling.cuh"
#include "cuda_test_util.h"
#include "deepinfer/error.h"
#include "deepinfer/tensor.h"
#include "sampling/sampler.h"
#include "sampling/sampling_params.h"

namespace {

namespace di = deepinfer;
using cuda_test::bits;
using cuda_test::run_case;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// One batch: host logits [R, V], the params, histories and masks the inputs point to.
struct Batch {
  int64_t R = 0, V = 0;
  std::vector<float> logits;
  std::vector<di::SamplingParams> params;
  std::vector<std::vector<int32_t>> prompts, outputs;
  std::vector<std::vector<uint32_t>> masks;
  std::vector<char> has_mask;
  std::vector<di::SampleInput> inputs;  // logits point into `logits`

  void finish(const std::vector<uint64_t>& seeds, const std::vector<int64_t>& positions, int32_t eos) {
    inputs.assign(static_cast<size_t>(R), di::SampleInput{});
    for (int64_t r = 0; r < R; ++r) {
      di::SampleInput& in = inputs[static_cast<size_t>(r)];
      in.logits = logits.data() + r * V;
      in.vocab = V;
      in.params = &params[static_cast<size_t>(r)];
      in.seed = seeds[static_cast<size_t>(r)];
      in.position = positions[static_cast<size_t>(r)];
      in.prompt_ids = &prompts[static_cast<size_t>(r)];
      in.output_ids = &outputs[static_cast<size_t>(r)];
      in.eos_id = eos;
      in.allowed_mask = has_mask[static_cast<size_t>(r)] ? &masks[static_cast<size_t>(r)] : nullptr;
    }
  }
};

// Logits of one row in one of several shapes.
void fill_row(float* x, int64_t V, int shape, std::mt19937_64& g) {
  std::normal_distribution<float> n(0.0f, 1.0f);
  switch (shape) {
    case 0:  // lm-like
      for (int64_t i = 0; i < V; ++i) x[i] = 3.0f * n(g);
      break;
    case 1:  // flat
      for (int64_t i = 0; i < V; ++i) x[i] = 0.3f * n(g);
      break;
    case 2:  // very peaked: one token far above the rest
      for (int64_t i = 0; i < V; ++i) x[i] = n(g);
      x[g() % V] = 60.0f;
      break;
    case 3:  // many ties: values on a coarse grid
      for (int64_t i = 0; i < V; ++i) x[i] = std::round(2.0f * n(g)) * 0.5f;
      break;
    case 4:  // all equal (one big bucket, ties everywhere)
      for (int64_t i = 0; i < V; ++i) x[i] = 1.25f;
      break;
    case 5:  // some -inf and -0 / +0
      for (int64_t i = 0; i < V; ++i) {
        const uint64_t k = g() % 8;
        x[i] = k == 0 ? kNegInf : (k == 1 ? -0.0f : (k == 2 ? 0.0f : 2.0f * n(g)));
      }
      break;
    default:  // wide range, large magnitudes
      for (int64_t i = 0; i < V; ++i) x[i] = 40.0f * n(g);
      break;
  }
}

// A random batch: shapes, params, penalties, min_tokens, masks and logprobs drawn per row.
Batch random_batch(int64_t R, int64_t V, uint64_t seed, bool big_logprobs = false) {
  std::mt19937_64 g(seed);
  Batch b;
  b.R = R;
  b.V = V;
  b.logits.resize(static_cast<size_t>(R * V));
  b.params.resize(static_cast<size_t>(R));
  b.prompts.resize(static_cast<size_t>(R));
  b.outputs.resize(static_cast<size_t>(R));
  b.masks.resize(static_cast<size_t>(R));
  b.has_mask.assign(static_cast<size_t>(R), 0);
  std::vector<uint64_t> seeds(static_cast<size_t>(R));
  std::vector<int64_t> positions(static_cast<size_t>(R));
  const int32_t eos = static_cast<int32_t>(V > 2 ? V - 2 : 0);
  auto pick = [&](std::initializer_list<double> v) { return *(v.begin() + g() % v.size()); };
  const size_t words = static_cast<size_t>((V + 31) / 32);
  for (int64_t r = 0; r < R; ++r) {
    const size_t ri = static_cast<size_t>(r);
    fill_row(b.logits.data() + r * V, V, static_cast<int>(g() % 7), g);
    di::SamplingParams& p = b.params[ri];
    p.temperature = static_cast<float>(pick({0.0, 0.0, 0.3, 0.7, 1.0, 1.0, 1.5, 1e-6}));
    p.top_k = static_cast<int>(pick({0, 0, 1, 5, 50, 1000, -1}));
    p.top_p = static_cast<float>(pick({1.0, 1.0, 0.9, 0.5, 0.99, 0.1}));
    p.min_p = static_cast<float>(pick({0.0, 0.0, 0.05, 0.2}));
    p.logprobs = static_cast<int>(big_logprobs ? pick({40.0, 20.0}) : pick({-1.0, -1.0, 0.0, 5.0, 20.0}));
    const int hist = static_cast<int>(g() % 4);
    if (hist > 0) {
      p.repetition_penalty = static_cast<float>(pick({1.0, 1.1, 0.8, 1.3}));
      p.frequency_penalty = static_cast<float>(pick({0.0, 0.5, -0.4}));
      p.presence_penalty = static_cast<float>(pick({0.0, 0.6, -1.0}));
      const int np = static_cast<int>(g() % 300), no = static_cast<int>(g() % 60);
      for (int i = 0; i < np; ++i) b.prompts[ri].push_back(static_cast<int32_t>(g() % V));
      for (int i = 0; i < no; ++i)  // repeats, so that counts > 1 occur
        b.outputs[ri].push_back(static_cast<int32_t>(i > 0 && g() % 3 == 0 ? b.outputs[ri][g() % i] : g() % V));
    }
    if (g() % 4 == 0) {
      p.min_tokens = static_cast<int>(b.outputs[ri].size() + g() % 3);
      p.stop_token_ids = {static_cast<int32_t>(g() % V), static_cast<int32_t>(V + 5)};
      p.ignore_eos = g() % 3 == 0;
    }
    const int m = static_cast<int>(g() % 6);
    if (m >= 4) {
      b.has_mask[ri] = 1;
      b.masks[ri].assign(words + (g() % 2), 0u);
      if (m == 4) {  // a single allowed token
        const int64_t t = static_cast<int64_t>(g() % V);
        b.masks[ri][static_cast<size_t>(t >> 5)] |= 1u << (t & 31);
      } else {
        for (size_t w = 0; w < words; ++w) b.masks[ri][w] = static_cast<uint32_t>(g()) & static_cast<uint32_t>(g());
        b.masks[ri][0] |= 1u;  // never empty
      }
    }
    seeds[ri] = g();
    positions[ri] = static_cast<int64_t>(g() % 5000);
  }
  b.finish(seeds, positions, eos);
  return b;
}

std::string fmt_float(float f) {
  char s[64];
  std::snprintf(s, sizeof s, "%.9g (0x%08x)", static_cast<double>(f), bits(f));
  return s;
}

// "" if every field of a and b is identical (floats bit for bit).
std::string compare(const di::SampleResult& gpu, const di::SampleResult& cpu) {
  if (gpu.token != cpu.token) return "token " + std::to_string(gpu.token) + " != cpu " + std::to_string(cpu.token);
  if (gpu.has_logprobs != cpu.has_logprobs) return "has_logprobs differs";
  if (bits(gpu.logprob) != bits(cpu.logprob))
    return "logprob " + fmt_float(gpu.logprob) + " != cpu " + fmt_float(cpu.logprob);
  if (gpu.rank != cpu.rank) return "rank " + std::to_string(gpu.rank) + " != cpu " + std::to_string(cpu.rank);
  if (gpu.top_logprobs.size() != cpu.top_logprobs.size()) {
    return "top_logprobs size " + std::to_string(gpu.top_logprobs.size()) + " != cpu " +
           std::to_string(cpu.top_logprobs.size());
  }
  for (size_t j = 0; j < gpu.top_logprobs.size(); ++j) {
    if (gpu.top_logprobs[j].first != cpu.top_logprobs[j].first)
      return "top_logprobs[" + std::to_string(j) + "] id " + std::to_string(gpu.top_logprobs[j].first) + " != cpu " +
             std::to_string(cpu.top_logprobs[j].first);
    if (bits(gpu.top_logprobs[j].second) != bits(cpu.top_logprobs[j].second))
      return "top_logprobs[" + std::to_string(j) + "] value " + fmt_float(gpu.top_logprobs[j].second) + " != cpu " +
             fmt_float(cpu.top_logprobs[j].second);
  }
  return "";
}

std::string describe(const Batch& b, int64_t r) {
  const di::SamplingParams& p = b.params[static_cast<size_t>(r)];
  char s[256];
  std::snprintf(s, sizeof s,
                " [row %lld: T %g top_k %d top_p %g min_p %g rep %g freq %g pres %g min_tokens %d lp %d mask %d]",
                static_cast<long long>(r), static_cast<double>(p.temperature), p.top_k, static_cast<double>(p.top_p),
                static_cast<double>(p.min_p), static_cast<double>(p.repetition_penalty),
                static_cast<double>(p.frequency_penalty), static_cast<double>(p.presence_penalty), p.min_tokens,
                p.logprobs, static_cast<int>(b.has_mask[static_cast<size_t>(r)]));
  return s;
}

di::Tensor to_device(const Batch& b) {
  di::Tensor t = di::Tensor::empty({b.R, b.V}, di::DType::kF32);
  std::copy(b.logits.begin(), b.logits.end(), t.data<float>());
  return di::cuda::copy_to_device(t);
}

// GPU vs CPU on every row. When the CPU throws on a row (a random single allowed token that min_tokens or a
// -inf logit removes), the GPU call must throw the same message (the first such row's).
std::string check_batch(const Batch& b) {
  std::vector<di::SampleResult> cpu(static_cast<size_t>(b.R));
  std::string cpu_error;
  for (int64_t r = 0; r < b.R && cpu_error.empty(); ++r) {
    try {
      cpu[static_cast<size_t>(r)] = di::sample(b.inputs[static_cast<size_t>(r)]);
    } catch (const di::Error& e) {
      cpu_error = std::string("row ") + std::to_string(r) + ": " + e.what();
    }
  }
  if (!cpu_error.empty()) {
    try {
      di::cuda::sample_rows(to_device(b), b.inputs);
    } catch (const di::Error& e) {
      const std::string m = e.what();
      return m.find(cpu_error) == std::string::npos ? "gpu error '" + m + "' != cpu '" + cpu_error + "'" : "";
    }
    return "the cpu threw '" + cpu_error + "' but the gpu did not";
  }
  const std::vector<di::SampleResult> gpu = di::cuda::sample_rows(to_device(b), b.inputs);
  if (gpu.size() != cpu.size()) return "wrong number of results";
  for (int64_t r = 0; r < b.R; ++r) {
    const std::string d = compare(gpu[static_cast<size_t>(r)], cpu[static_cast<size_t>(r)]);
    if (!d.empty()) return d + describe(b, r);
  }
  return "";
}

// The call must throw a deepinfer::Error whose message contains `want`.
std::string expect_error(const Batch& b, const std::string& want) {
  try {
    di::cuda::sample_rows(to_device(b), b.inputs);
  } catch (const di::Error& e) {
    const std::string m = e.what();
    return m.find(want) == std::string::npos ? "error '" + m + "' does not mention '" + want + "'" : "";
  }
  return "no error thrown (expected '" + want + "')";
}

// A batch of `R` plain rows (lm-like logits, temperature 0.8, top_p 0.9) to poison one row of.
Batch plain_batch(int64_t R, int64_t V, uint64_t seed) {
  Batch b = random_batch(R, V, seed);
  for (auto& p : b.params) p = di::SamplingParams{};
  for (auto& p : b.params) {
    p.temperature = 0.8f;
    p.top_p = 0.9f;
  }
  std::fill(b.has_mask.begin(), b.has_mask.end(), 0);
  std::vector<uint64_t> seeds(static_cast<size_t>(R), 7);
  std::vector<int64_t> pos(static_cast<size_t>(R), 3);
  b.finish(seeds, pos, static_cast<int32_t>(V - 2));
  return b;
}

// A batch of `R` race rows (temperature t and min_p only, the split race of sample_rows: every row its own seed and
// position) over `random_batch`'s logits shapes.
Batch race_batch(int64_t R, int64_t V, uint64_t seed, float t, float min_p) {
  Batch b = random_batch(R, V, seed);
  std::fill(b.has_mask.begin(), b.has_mask.end(), 0);
  std::vector<uint64_t> seeds(static_cast<size_t>(R));
  std::vector<int64_t> pos(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) {
    di::SamplingParams& p = b.params[static_cast<size_t>(r)];
    p = di::SamplingParams{};
    p.temperature = t;
    p.min_p = min_p;
    seeds[static_cast<size_t>(r)] = seed * 1000003 + static_cast<uint64_t>(r);
    pos[static_cast<size_t>(r)] = r * 7;
  }
  b.finish(seeds, pos, static_cast<int32_t>(V > 2 ? V - 2 : 0));
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  const int n_random = argc > 1 ? std::atoi(argv[1]) : 40;
  return cuda_test::run_test_program([&] {
    const int64_t kV = 129280;
    // Random batches, small and model-sized vocabs.
    std::mt19937_64 g(2024);
    for (int c = 0; c < n_random; ++c) {
      const int64_t V = c % 3 == 0 ? kV : static_cast<int64_t>(1 + g() % 3000);
      const int64_t R = c % 5 == 0 ? 64 : static_cast<int64_t>(1 + g() % 16);
      const uint64_t seed = g();
      run_case("random batch " + std::to_string(c) + " (R " + std::to_string(R) + ", V " + std::to_string(V) + ")",
               [&] { return check_batch(random_batch(R, V, seed)); });
    }
    // Fixed modes over a model-sized vocab, 32 rows each (every row its own shape and history).
    struct Mode {
      const char* name;
      void (*set)(di::SamplingParams&);
    };
    const Mode modes[] = {
        {"greedy", [](di::SamplingParams& p) { p.temperature = 0.0f; }},
        {"temperature 0.7", [](di::SamplingParams& p) { p.temperature = 0.7f; }},
        {"top_p 0.9 T 0.7",
         [](di::SamplingParams& p) {
           p.temperature = 0.7f;
           p.top_p = 0.9f;
         }},
        {"top_k 50", [](di::SamplingParams& p) { p.top_k = 50; }},
        {"top_k 1", [](di::SamplingParams& p) { p.top_k = 1; }},
        {"top_k 50 top_p 0.9 min_p 0.05",
         [](di::SamplingParams& p) {
           p.top_k = 50;
           p.top_p = 0.9f;
           p.min_p = 0.05f;
         }},
        {"min_p 0.1", [](di::SamplingParams& p) { p.min_p = 0.1f; }},
        {"top_p 0.999 flat", [](di::SamplingParams& p) { p.top_p = 0.999f; }},
        {"greedy logprobs 20",
         [](di::SamplingParams& p) {
           p.temperature = 0.0f;
           p.logprobs = 20;
         }},
        {"top_p 0.9 logprobs 5",
         [](di::SamplingParams& p) {
           p.top_p = 0.9f;
           p.logprobs = 5;
         }},
        {"logprobs 0", [](di::SamplingParams& p) { p.logprobs = 0; }},
    };
    int mi = 0;
    for (const Mode& m : modes) {
      run_case(std::string("mode ") + m.name + " (R 32, V 129280)", [&] {
        Batch b = random_batch(32, kV, 1000 + mi);
        for (auto& p : b.params) {
          const auto keep_hist = p;
          p = di::SamplingParams{};
          p.repetition_penalty = keep_hist.repetition_penalty;
          p.frequency_penalty = keep_hist.frequency_penalty;
          p.presence_penalty = keep_hist.presence_penalty;
          m.set(p);
        }
        return check_batch(b);
      });
      ++mi;
    }
    // Logprobs beyond the GPU's 32 (the CPU path on a host copy) mixed with GPU rows.
    run_case("logprobs 40 (host rows)", [&] { return check_batch(random_batch(8, 5000, 77, true)); });
    // Many seeds on one row: the race over many draws (tokens distributed as the CPU's).
    run_case("one row, 256 seeds", [&] {
      Batch b = plain_batch(256, kV, 5);
      for (int64_t r = 1; r < b.R; ++r) std::copy(b.logits.begin(), b.logits.begin() + kV, b.logits.begin() + r * kV);
      std::vector<uint64_t> seeds(256);
      std::vector<int64_t> pos(256);
      for (int i = 0; i < 256; ++i)
        seeds[static_cast<size_t>(i)] = static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull,
        pos[static_cast<size_t>(i)] = i;
      b.finish(seeds, pos, static_cast<int32_t>(kV - 2));
      return check_batch(b);
    });

    // The split race (temperature / min_p rows: race_kernel and race_cand_kernel over slices of the row).
    run_case("race T 1.0 (R 32, V 129280)", [&] { return check_batch(race_batch(32, kV, 31, 1.0f, 0.0f)); });
    run_case("race T 0.6 min_p 0.05 (R 8, V 129280)", [&] { return check_batch(race_batch(8, kV, 32, 0.6f, 0.05f)); });
    run_case("race T 1.5 (R 5, V 37)", [&] { return check_batch(race_batch(5, 37, 33, 1.5f, 0.0f)); });
    run_case("race T 1.0 (R 3, V 1)", [&] { return check_batch(race_batch(3, 1, 34, 1.0f, 0.0f)); });
    run_case("race, one row, 256 seeds", [&] {
      Batch b = race_batch(256, kV, 35, 1.0f, 0.0f);
      for (int64_t r = 1; r < b.R; ++r) std::copy(b.logits.begin(), b.logits.begin() + kV, b.logits.begin() + r * kV);
      return check_batch(b);
    });
    run_case("race mixed with greedy and top_p rows (R 12, V 129280)", [&] {
      Batch b = race_batch(12, kV, 36, 0.9f, 0.0f);
      for (int64_t r = 0; r < b.R; r += 3) b.params[static_cast<size_t>(r)].temperature = 0.0f;
      for (int64_t r = 1; r < b.R; r += 3) b.params[static_cast<size_t>(r)].top_p = 0.8f;
      return check_batch(b);
    });
    run_case("race whose max overflows at T 1e-4 (the host samples it)", [&] {
      Batch b = race_batch(4, 3000, 37, 1e-4f, 0.0f);
      for (int64_t i = 0; i < 40; ++i) b.logits[static_cast<size_t>(2 * b.V + i * 7)] = 1e35f;
      return check_batch(b);
    });
    run_case("error: race NaN logit, then race rows again", [&] {
      Batch bad = race_batch(6, 3000, 38, 1.0f, 0.0f);
      bad.logits[static_cast<size_t>(4 * bad.V + 9)] = std::nanf("");
      const std::string e = expect_error(bad, "logit of token 9 is nan");
      if (!e.empty()) return e;
      return check_batch(race_batch(6, 3000, 39, 1.0f, 0.0f));
    });

    run_case("error: race row of -inf logits", [&] {
      Batch bad = race_batch(3, 3000, 40, 1.0f, 0.0f);
      std::fill(bad.logits.begin() + bad.V, bad.logits.begin() + 2 * bad.V, kNegInf);
      return expect_error(bad, "no token can be sampled");
    });

    // Errors: a clear message, nothing corrupted (the next call matches the CPU again).
    auto error_then_ok = [&](const std::string& name, auto poison, const std::string& want) {
      run_case("error: " + name, [&] {
        Batch bad = plain_batch(6, 3000, 11);
        poison(bad);
        const std::string e = expect_error(bad, want);
        if (!e.empty()) return e;
        return check_batch(plain_batch(6, 3000, 12));
      });
    };
    error_then_ok(
        "NaN logit", [](Batch& b) { b.logits[static_cast<size_t>(3 * b.V + 17)] = std::nanf(""); },
        "logit of token 17 is nan");
    error_then_ok(
        "+inf logit", [](Batch& b) { b.logits[static_cast<size_t>(2 * b.V + 5)] = INFINITY; },
        "logit of token 5 is inf");
    error_then_ok(
        "empty mask",
        [](Batch& b) {
          b.masks[4].assign(static_cast<size_t>((b.V + 31) / 32), 0u);
          b.has_mask[4] = 1;
          b.inputs[4].allowed_mask = &b.masks[4];
        },
        "empty grammar mask");
    error_then_ok(
        "mask too short",
        [](Batch& b) {
          b.masks[1].assign(3, ~0u);
          b.inputs[1].allowed_mask = &b.masks[1];
        },
        "allowed_mask has 3 words");
    error_then_ok(
        "prompt id out of range",
        [](Batch& b) {
          b.prompts[2] = {1, 2, static_cast<int32_t>(b.V)};
        },
        "prompt_ids[2]");
    error_then_ok(
        "nothing left (mask x min_tokens)",
        [](Batch& b) {
          const int32_t eos = static_cast<int32_t>(b.V - 2);
          b.masks[0].assign(static_cast<size_t>((b.V + 31) / 32), 0u);
          b.masks[0][static_cast<size_t>(eos >> 5)] |= 1u << (eos & 31);
          b.inputs[0].allowed_mask = &b.masks[0];
          b.params[0].min_tokens = 5;
          b.outputs[0].clear();
        },
        "no token can be sampled");
    error_then_ok(
        "every logit -inf",
        [](Batch& b) { std::fill(b.logits.begin() + 5 * b.V, b.logits.begin() + 6 * b.V, kNegInf); },
        "no token can be sampled");
  });
}
