// `deepinfer bench`: serving-style throughput/latency benchmark over EngineCore with synthetic
// random-token prompts (ignore_eos, so every request produces exactly --output-len tokens). Also
// defines the engine flags shared by the engine-backed subcommands (EngineFlags).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <map>
#include <random>

#include "cli/commands.h"
#include "deepinfer/error.h"
#include "engine/engine_core.h"

namespace deepinfer::cli {

void EngineFlags::add(CLI::App* cmd) {
  cmd->add_option("--max-num-batched-tokens", max_num_batched_tokens, "token budget of one engine step")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-num-seqs", max_num_seqs, "sequences in one engine step")->check(CLI::PositiveNumber);
  cmd->add_option("--max-model-len", max_model_len,
                  "prompt + output tokens per request (default: the config's max_position_embeddings)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--kv-cache-memory", kv_cache_memory, "bytes of per-sequence state (suffixes K, M, G: 1024-based)")
      ->transform(CLI::AsSizeValue(false));
  cmd->add_option("--seed", seed, "engine seed (draws the seeds of unseeded requests)");
  cmd->add_flag("--no-async-scheduling", no_async_scheduling,
                "process each step's outputs before the next step's model work instead of during it");
  cmd->add_flag("--enforce-eager", enforce_eager,
                "launch every decode kernel one by one instead of replaying CUDA graphs (same outputs)");
  num.add(cmd);
}

EngineArgs EngineFlags::args(const std::string& model) const {
  EngineArgs a;
  a.model = model;
  a.max_num_batched_tokens = max_num_batched_tokens;
  a.max_num_seqs = max_num_seqs;
  a.max_model_len = max_model_len;
  a.kv_cache_memory = kv_cache_memory;
  a.seed = seed;
  a.async_scheduling = !no_async_scheduling;
  a.enforce_eager = enforce_eager;
  a.device = num.device;
  a.dtype = num.dtype;
  a.simulate_qat = !num.no_qat;
  return a;
}

namespace {

// Linear-interpolated percentile (numpy's default) of an unsorted sample; 0 for an empty one.
double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double pos = q / 100.0 * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

}  // namespace

Runner add_bench(CLI::App& app) {
  struct Opts {
    std::string model;
    int input_len = 64, output_len = 32, num_prompts = 16, concurrency = 0;
    float temperature = 1.0f;
    EngineFlags eng;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("bench", "throughput and latency (TTFT, TPOT) on synthetic random-token prompts");
  cmd->add_option("--model", o->model, "model directory")->required();
  cmd->add_option("--input-len", o->input_len, "prompt tokens per request")->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--output-len", o->output_len, "generated tokens per request")->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--num-prompts", o->num_prompts, "number of requests")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--concurrency", o->concurrency, "at most this many requests in flight (default: all at once)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--temperature", o->temperature, "sampling temperature of every request (0: greedy)")
      ->check(CLI::NonNegativeNumber);
  o->eng.add(cmd);
  return [o] {
    EngineArgs args = o->eng.args(o->model);
    args.skip_tokenizer_init = true;
    EngineCore engine(args);
    const int64_t need = static_cast<int64_t>(o->input_len) + o->output_len;
    DI_CHECK(need <= engine.max_model_len(), "--input-len + --output-len ({}) exceeds max_model_len ({})", need,
             engine.max_model_len());

    std::mt19937_64 rng(o->eng.seed);
    std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(engine.config().vocab_size - 1));
    std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(o->num_prompts));
    for (auto& p : prompts) {
      p.resize(static_cast<size_t>(o->input_len));
      for (auto& t : p) t = pick(rng);
    }
    SamplingParams sp;
    sp.max_tokens = o->output_len;
    sp.ignore_eos = true;
    sp.temperature = o->temperature;

    using clock = std::chrono::steady_clock;
    struct Timing {
      clock::time_point arrival, first, last;
      size_t n_out = 0;
      bool done = false;
    };
    std::vector<Timing> tm(prompts.size());
    std::map<std::string, size_t> index;
    const size_t limit = o->concurrency > 0 ? static_cast<size_t>(o->concurrency) : prompts.size();
    size_t next = 0, in_flight = 0;
    auto admit = [&] {
      while (next < prompts.size() && in_flight < limit) {
        const std::string id = "bench-" + std::to_string(next);
        SamplingParams p = sp;
        p.seed = o->eng.seed + next;
        tm[next].arrival = clock::now();
        engine.add_request(id, prompts[next], p);
        index[id] = next;
        ++next;
        ++in_flight;
      }
    };

    engine.reset_stats();
    const auto t0 = clock::now();
    admit();
    while (engine.has_unfinished() || next < prompts.size()) {
      std::vector<RequestOutput> outs = engine.step();
      const auto now = clock::now();
      for (const RequestOutput& r : outs) {
        auto it = index.find(r.request_id);
        if (it == index.end() || r.outputs.empty()) continue;
        Timing& t = tm[it->second];
        DI_CHECK(!r.error.has_value(), "request {} was rejected: {}", r.request_id, r.error.value_or(""));
        const size_t n = r.outputs[0].token_ids.size();
        if (n > 0 && t.n_out == 0) t.first = now;
        if (n > t.n_out) t.last = now;
        t.n_out = n;
        if (r.finished && !t.done) {
          t.done = true;
          --in_flight;
        }
      }
      admit();
    }
    const double total = std::chrono::duration<double>(clock::now() - t0).count();

    std::vector<double> ttft, tpot, e2e;
    size_t out_tokens = 0;
    for (const Timing& t : tm) {
      out_tokens += t.n_out;
      if (t.n_out == 0) continue;
      const double f = std::chrono::duration<double>(t.first - t.arrival).count();
      const double l = std::chrono::duration<double>(t.last - t.arrival).count();
      ttft.push_back(f * 1e3);
      e2e.push_back(l * 1e3);
      if (t.n_out > 1) tpot.push_back((l - f) * 1e3 / static_cast<double>(t.n_out - 1));
    }
    const size_t in_tokens = prompts.size() * static_cast<size_t>(o->input_len);
    const EngineStats& st = engine.stats();
    const double step_s = st.schedule_s + st.model_s + st.sample_s + st.output_s;
    std::printf("%-28s %14zu\n", "requests", prompts.size());
    std::printf("%-28s %14s\n", "concurrency", o->concurrency > 0 ? std::to_string(o->concurrency).c_str() : "all");
    std::printf("%-28s %14d\n", "input len", o->input_len);
    std::printf("%-28s %14d\n", "output len", o->output_len);
    std::printf("%-28s %14.3f\n", "total time (s)", total);
    std::printf("%-28s %14zu\n", "input tokens", in_tokens);
    std::printf("%-28s %14zu\n", "output tokens", out_tokens);
    std::printf("%-28s %14.1f\n", "input tok/s", total > 0 ? static_cast<double>(in_tokens) / total : 0.0);
    std::printf("%-28s %14.1f\n", "output tok/s", total > 0 ? static_cast<double>(out_tokens) / total : 0.0);
    std::printf("%-28s %14.2f\n", "TTFT p50 (ms)", percentile(ttft, 50));
    std::printf("%-28s %14.2f\n", "TTFT p99 (ms)", percentile(ttft, 99));
    std::printf("%-28s %14.2f\n", "TPOT p50 (ms)", percentile(tpot, 50));
    std::printf("%-28s %14.2f\n", "TPOT p99 (ms)", percentile(tpot, 99));
    std::printf("%-28s %14.2f\n", "E2E latency p50 (ms)", percentile(e2e, 50));
    std::printf("%-28s %14.2f\n", "E2E latency p99 (ms)", percentile(e2e, 99));
    std::printf("%-28s %14lld\n", "steps", static_cast<long long>(st.steps));
    std::printf("%-28s %14.1f\n", "model share of step time (%)", step_s > 0 ? 100.0 * st.model_s / step_s : 0.0);
    return 0;
  };
}

}  // namespace deepinfer::cli
