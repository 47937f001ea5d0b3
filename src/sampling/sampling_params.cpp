// SamplingParams::validate and ::from_json. Ranges follow vLLM's SamplingParams._verify_args.
#include "sampling/sampling_params.h"

#include <deepinfer/error.h>

#include <cmath>
#include <limits>

namespace deepinfer {

void SamplingParams::validate() const {
  // Comparisons are written so that NaN fails them.
  DI_CHECK(n >= 1, "SamplingParams: n must be at least 1, got {}", n);
  DI_CHECK(temperature >= 0.0f && std::isfinite(temperature),
           "SamplingParams: temperature must be a finite number >= 0 (0 = greedy), got {}", temperature);
  DI_CHECK(top_p > 0.0f && top_p <= 1.0f, "SamplingParams: top_p must be in (0, 1], got {}", top_p);
  DI_CHECK(top_k == -1 || top_k >= 0, "SamplingParams: top_k must be -1 or 0 (disabled) or at least 1, got {}", top_k);
  DI_CHECK(min_p >= 0.0f && min_p <= 1.0f, "SamplingParams: min_p must be in [0, 1], got {}", min_p);
  DI_CHECK(presence_penalty >= -2.0f && presence_penalty <= 2.0f,
           "SamplingParams: presence_penalty must be in [-2, 2], got {}", presence_penalty);
  DI_CHECK(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f,
           "SamplingParams: frequency_penalty must be in [-2, 2], got {}", frequency_penalty);
  DI_CHECK(repetition_penalty > 0.0f && std::isfinite(repetition_penalty),
           "SamplingParams: repetition_penalty must be a finite number > 0 (1 = off), got {}", repetition_penalty);
  DI_CHECK(max_tokens >= 1, "SamplingParams: max_tokens must be at least 1, got {}", max_tokens);
  DI_CHECK(min_tokens >= 0 && min_tokens <= max_tokens,
           "SamplingParams: min_tokens must be in [0, max_tokens = {}], got {}", max_tokens, min_tokens);
  DI_CHECK(logprobs >= -1 && logprobs <= 20, "SamplingParams: logprobs must be in [-1, 20] (-1 = none), got {}",
           logprobs);
  DI_CHECK(prompt_logprobs >= -1 && prompt_logprobs <= 20,
           "SamplingParams: prompt_logprobs must be in [-1, 20] (-1 = none), got {}", prompt_logprobs);
  for (size_t i = 0; i < stop.size(); ++i) {
    DI_CHECK(!stop[i].empty(), "SamplingParams: stop[{}] is an empty string; stop strings must be non-empty", i);
  }
  for (size_t i = 0; i < stop_token_ids.size(); ++i) {
    DI_CHECK(stop_token_ids[i] >= 0, "SamplingParams: stop_token_ids[{}] must be a token id >= 0, got {}", i,
             stop_token_ids[i]);
  }
  DI_CHECK(so_args.is_null() || so_args.is_object(), "SamplingParams: so_args must be an object or null, got a JSON {}",
           so_args.type_name());
}

namespace {

[[noreturn]] void type_error(const char* key, const char* want, const nlohmann::json& v) {
  fail("SamplingParams: field '{}' must be {}, got JSON {} {}", key, want, v.type_name(), v.dump());
}

float get_float(const char* key, const nlohmann::json& v) {
  if (!v.is_number()) type_error(key, "a number", v);
  return static_cast<float>(v.get<double>());
}

// Integers; an integral float (16.0) is accepted like pydantic's lax mode, 16.5 is not.
int64_t get_int64(const char* key, const nlohmann::json& v) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      fail("SamplingParams: field '{}' = {} is out of range", key, u);
    }
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) return static_cast<int64_t>(d);
  }
  type_error(key, "an integer", v);
}

int get_int(const char* key, const nlohmann::json& v) {
  const int64_t x = get_int64(key, v);
  if (x < std::numeric_limits<int>::min() || x > std::numeric_limits<int>::max()) {
    fail("SamplingParams: field '{}' = {} does not fit a 32-bit integer", key, x);
  }
  return static_cast<int>(x);
}

bool get_bool(const char* key, const nlohmann::json& v) {
  if (!v.is_boolean()) type_error(key, "true or false", v);
  return v.get<bool>();
}

uint64_t get_seed(const char* key, const nlohmann::json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer()) {
    const int64_t s = v.get<int64_t>();
    if (s < 0) fail("SamplingParams: field '{}' must be in [0, 2^64 - 1], got {}", key, s);
    return static_cast<uint64_t>(s);
  }
  if (v.is_number_float()) {
    fail("SamplingParams: field '{}' must be an integer in [0, 2^64 - 1], got {} (a non-integer or beyond 2^64 - 1)",
         key, v.dump());
  }
  type_error(key, "an integer in [0, 2^64 - 1]", v);
}

}  // namespace

SamplingParams SamplingParams::from_json(const nlohmann::json& j) {
  if (!j.is_object()) fail("SamplingParams: expected a JSON object, got JSON {}", j.type_name());
  SamplingParams p;
  // A key whose value is null means "not given" (OpenAI clients send explicit nulls).
  auto has = [&](const char* k) { return j.contains(k) && !j.at(k).is_null(); };
  if (has("n")) p.n = get_int("n", j.at("n"));
  if (has("temperature")) p.temperature = get_float("temperature", j.at("temperature"));
  if (has("top_p")) p.top_p = get_float("top_p", j.at("top_p"));
  if (has("top_k")) p.top_k = get_int("top_k", j.at("top_k"));
  if (has("min_p")) p.min_p = get_float("min_p", j.at("min_p"));
  if (has("presence_penalty")) p.presence_penalty = get_float("presence_penalty", j.at("presence_penalty"));
  if (has("frequency_penalty")) p.frequency_penalty = get_float("frequency_penalty", j.at("frequency_penalty"));
  if (has("repetition_penalty")) p.repetition_penalty = get_float("repetition_penalty", j.at("repetition_penalty"));
  // max_completion_tokens is OpenAI's newer name for max_tokens; both given must agree.
  if (has("max_tokens")) p.max_tokens = get_int("max_tokens", j.at("max_tokens"));
  if (has("max_completion_tokens")) {
    const int m = get_int("max_completion_tokens", j.at("max_completion_tokens"));
    if (has("max_tokens") && m != p.max_tokens) {
      fail("SamplingParams: max_tokens ({}) and max_completion_tokens ({}) disagree; give one of them", p.max_tokens,
           m);
    }
    p.max_tokens = m;
  }
  if (has("min_tokens")) p.min_tokens = get_int("min_tokens", j.at("min_tokens"));
  if (has("stop")) {
    const auto& s = j.at("stop");
    if (s.is_string()) {
      p.stop = {s.get<std::string>()};
    } else if (s.is_array()) {
      for (size_t i = 0; i < s.size(); ++i) {
        if (!s[i].is_string()) type_error("stop", "a string or a list of strings", s);
        p.stop.push_back(s[i].get<std::string>());
      }
    } else {
      type_error("stop", "a string or a list of strings", s);
    }
  }
  if (has("stop_token_ids")) {
    const auto& s = j.at("stop_token_ids");
    if (!s.is_array()) type_error("stop_token_ids", "a list of integers", s);
    for (size_t i = 0; i < s.size(); ++i) p.stop_token_ids.push_back(get_int("stop_token_ids", s[i]));
  }
  if (has("ignore_eos")) p.ignore_eos = get_bool("ignore_eos", j.at("ignore_eos"));
  // logprobs: an integer (vLLM, OpenAI completions) or a boolean with top_logprobs (OpenAI chat).
  if (has("logprobs")) {
    const auto& v = j.at("logprobs");
    if (v.is_boolean()) {
      p.logprobs = v.get<bool>() ? (has("top_logprobs") ? get_int("top_logprobs", j.at("top_logprobs")) : 0) : -1;
    } else {
      p.logprobs = get_int("logprobs", v);
    }
  } else if (has("top_logprobs")) {
    p.logprobs = get_int("top_logprobs", j.at("top_logprobs"));
  }
  if (has("prompt_logprobs")) p.prompt_logprobs = get_int("prompt_logprobs", j.at("prompt_logprobs"));
  if (has("seed")) p.seed = get_seed("seed", j.at("seed"));
  if (has("seq_seed")) p.seq_seed = get_seed("seq_seed", j.at("seq_seed"));
  if (has("skip_special_tokens")) p.skip_special_tokens = get_bool("skip_special_tokens", j.at("skip_special_tokens"));
  if (j.contains("so_args")) p.so_args = j.at("so_args");
  p.validate();
  return p;
}

}  // namespace deepinfer
