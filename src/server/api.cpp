#include "server/api.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <variant>

#include "deepinfer/error.h"
#include "tokenizer/encoding.h"
#include "tokenizer/parsers.h"

namespace deepinfer::server {

namespace {

using parsers::ToolCall;

const char* default_type(int status) {
  switch (status) {
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 413:
      return "request_too_large";
    case 429:
      return "rate_limit_error";
    default:
      return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

std::string random_hex(size_t n) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) s += digits[rng() & 15];
  return s;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

OJson parse_body(const std::string& body) {
  OJson j;
  try {
    j = OJson::parse(body);
  } catch (const nlohmann::json::exception& e) {
    throw ApiError(400, fmt::format("the request body is not valid JSON: {}", e.what()));
  }
  if (!j.is_object()) throw ApiError(400, fmt::format("the request body must be a JSON object, got JSON {}", j.type_name()));
  return j;
}

bool has(const OJson& j, const char* k) { return j.contains(k) && !j.at(k).is_null(); }

// Type checks of the fields the server reads itself (SamplingParams::from_json checks the sampling ones).
void expect_type(const OJson& j, const char* k, bool ok, const char* want) {
  if (!ok) throw ApiError(400, fmt::format("field '{}' must be {}, got JSON {}", k, want, j.at(k).type_name()), k);
}
bool get_bool(const OJson& j, const char* k, bool dflt) {
  if (!has(j, k)) return dflt;
  expect_type(j, k, j.at(k).is_boolean(), "a boolean");
  return j.at(k).get<bool>();
}

// Extracts the field name of a SamplingParams error ("... field 'x' ..." or "...: x must ...").
std::string param_of(const std::string& msg) {
  auto a = msg.find("field '");
  if (a != std::string::npos) {
    auto b = msg.find('\'', a + 7);
    if (b != std::string::npos) return msg.substr(a + 7, b - a - 7);
  }
  const std::string pre = "SamplingParams: ";
  if (msg.rfind(pre, 0) == 0) {
    auto e = msg.find(' ', pre.size());
    std::string p = msg.substr(pre.size(), e == std::string::npos ? std::string::npos : e - pre.size());
    auto br = p.find('[');
    return br == std::string::npos ? p : p.substr(0, br);
  }
  return "";
}

SamplingParams sampling_from(const OJson& j) {
  try {
    return SamplingParams::from_json(nlohmann::json::parse(j.dump()));
  } catch (const Error& e) {
    throw ApiError(400, e.what(), param_of(e.what()));
  }
}

void check_model(const OJson& j, const ServerContext& ctx) {
  if (!has(j, "model")) return;
  expect_type(j, "model", j.at("model").is_string(), "a string");
  const std::string m = j.at("model").get<std::string>();
  if (m != ctx.served_model_name && m != ctx.model_path)
    throw ApiError(404, fmt::format("The model `{}` does not exist (this server serves `{}`)", m, ctx.served_model_name),
                   "model", "model_not_found");
}

// n, max_tokens defaults and the context check; `max_given`: the request set max_tokens.
void finish_params(SamplingParams& p, bool max_given, int default_max, size_t prompt_len, const ServerContext& ctx) {
  if (p.n > ctx.max_n) throw ApiError(400, fmt::format("n must be at most {}, got {}", ctx.max_n, p.n), "n");
  const int64_t plen = static_cast<int64_t>(prompt_len);
  if (plen == 0) throw ApiError(400, "the prompt is empty", "prompt");
  if (plen >= ctx.max_model_len) {
    throw ApiError(400,
                   fmt::format("This model's maximum context length is {} tokens. However, your prompt has {} tokens "
                               "(no room left for the completion). Please reduce the length of the prompt.",
                               ctx.max_model_len, plen),
                   "messages", "context_length_exceeded");
  }
  const int64_t room = ctx.max_model_len - plen;
  int64_t want = max_given ? p.max_tokens : (default_max > 0 ? default_max : room);
  p.max_tokens = static_cast<int>(std::min<int64_t>(want, room));
  p.min_tokens = std::min(p.min_tokens, p.max_tokens);
  try {
    p.validate();
  } catch (const Error& e) {
    throw ApiError(400, e.what(), param_of(e.what()));
  }
}

size_t stop_holdback(const SamplingParams& p) {
  size_t h = 0;
  for (const std::string& s : p.stop) h = std::max(h, s.size());
  return h > 0 ? h - 1 : 0;
}

// ---- per-child incremental output ---------------------------------------------------------------

struct Delta {
  std::string reasoning, content;
  std::vector<ToolCall> calls;
  size_t tok_from = 0, tok_to = 0;
  bool finished = false;
  bool any_text() const { return !reasoning.empty() || !content.empty() || !calls.empty(); }
};

struct ChildState {
  size_t sent = 0, tokens_seen = 0;
  std::unique_ptr<parsers::ChatOutputParser> parser;  // chat / messages; null for completions
  parsers::Utf8Carry rc, cc;
  std::string reasoning, content;
  std::vector<ToolCall> calls;
  bool done = false;
  std::string finish_reason;
  std::variant<std::monostate, int32_t, std::string> stop_reason;
  size_t num_tokens = 0;
};

Delta advance(ChildState& st, const CompletionOutput& c, size_t holdback) {
  Delta d;
  if (st.done) return d;
  const std::string& t = c.text;
  const bool fin = c.finished();
  size_t end = fin ? t.size() : (t.size() > holdback ? t.size() - holdback : 0);
  std::string chunk;
  if (end > st.sent && st.sent <= t.size()) chunk = t.substr(st.sent, end - st.sent);
  st.sent = std::max(st.sent, end);
  if (st.parser) {
    auto a = st.parser->feed(chunk);
    d.reasoning = st.rc.push(a.reasoning);
    d.content = st.cc.push(a.content);
    d.calls = std::move(a.calls_placeholder_do_not_use);
  }
  return d;
}

}  // namespace
}  // namespace deepinfer::server
