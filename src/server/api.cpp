#include "server/api.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <variant>

#include "deepinfer/error.h"
#include "structured/structured.h"
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
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

OJson parse_body(const std::string& body) {
  OJson j;
  try {
    j = OJson::parse(body);
  } catch (const nlohmann::json::exception& e) {
    throw ApiError(400, fmt::format("the request body is not valid JSON: {}", e.what()));
  }
  if (!j.is_object())
    throw ApiError(400, fmt::format("the request body must be a JSON object, got JSON {}", j.type_name()));
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
    throw ApiError(404,
                   fmt::format("The model `{}` does not exist (this server serves `{}`)", m, ctx.served_model_name),
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
  const size_t end = fin ? t.size() : (t.size() > holdback ? t.size() - holdback : 0);
  std::string chunk;
  if (end > st.sent && st.sent <= t.size()) chunk = t.substr(st.sent, end - st.sent);
  st.sent = std::max(st.sent, end);
  if (st.parser) {
    auto a = st.parser->feed(chunk);
    d.reasoning = std::move(a.reasoning);
    d.content = std::move(a.content);
    d.calls = std::move(a.tool_calls);
    if (fin) {
      auto b = st.parser->finish();
      d.reasoning += b.reasoning;
      d.content += b.content;
      for (auto& call : b.tool_calls) d.calls.push_back(std::move(call));
    }
    d.reasoning = st.rc.push(d.reasoning);
  } else {
    d.content = std::move(chunk);
  }
  d.content = st.cc.push(d.content);
  if (fin) {
    d.reasoning += st.rc.finish();
    d.content += st.cc.finish();
  }
  d.tok_from = st.tokens_seen;
  d.tok_to = c.token_ids.size();
  st.tokens_seen = d.tok_to;
  st.num_tokens = c.token_ids.size();
  st.reasoning += d.reasoning;
  st.content += d.content;
  for (const ToolCall& call : d.calls) st.calls.push_back(call);
  if (fin) {
    st.done = true;
    d.finished = true;
    st.finish_reason = *c.finish_reason;
    st.stop_reason = c.stop_reason;
  }
  return d;
}

OJson stop_reason_json(const ChildState& st) {
  if (std::holds_alternative<int32_t>(st.stop_reason)) return std::get<int32_t>(st.stop_reason);
  if (std::holds_alternative<std::string>(st.stop_reason)) return std::get<std::string>(st.stop_reason);
  return nullptr;
}

std::string sse(const OJson& j) { return "data: " + dump(j) + "\n\n"; }
std::string sse_event(const char* event, const OJson& j) {
  return std::string("event: ") + event + "\ndata: " + dump(j) + "\n\n";
}

// Shared state of the three builders.
class BuilderBase : public ResponseBuilder {
 public:
  BuilderBase(const ServerContext& ctx, std::string id, int n, bool stream, const SamplingParams& p, bool chat_parser,
              bool thinking)
      : ctx_(ctx),
        id_(std::move(id)),
        created_(unix_now()),
        stream_(stream),
        holdback_(stop_holdback(p)),
        logprobs_(p.logprobs),
        thinking_(thinking) {
    kids_.resize(static_cast<size_t>(n));
    const auto fam = ctx.family == ModelFamily::kV41 ? parsers::Family::kV41 : parsers::Family::kV4;
    if (chat_parser) {
      for (auto& k : kids_)
        k.parser =
            std::make_unique<parsers::ChatOutputParser>(fam, thinking, [](size_t) { return "call_" + random_hex(24); });
    }
  }

  void set_prompt_tokens(int64_t n) override { prompt_tokens_ = n; }

 protected:
  int64_t completion_tokens() const {
    int64_t s = 0;
    for (const auto& k : kids_) s += static_cast<int64_t>(k.num_tokens);
    return s;
  }
  int64_t reasoning_tokens() const {
    int64_t s = 0;
    if (!ctx_.tokenizer) return 0;
    for (const auto& k : kids_)
      if (!k.reasoning.empty())  // re-encoding may split differently: never more than were generated
        s += static_cast<int64_t>(std::min(ctx_.tokenizer->encode(k.reasoning, false).size(), k.num_tokens));
    return s;
  }
  OJson usage() const {
    const int64_t c = completion_tokens();
    OJson u = {{"prompt_tokens", prompt_tokens_}, {"completion_tokens", c}, {"total_tokens", prompt_tokens_ + c}};
    u["prompt_tokens_details"] = {{"cached_tokens", 0}};
    u["completion_tokens_details"] = {{"reasoning_tokens", reasoning_tokens()}};
    u["prompt_cache_hit_tokens"] = 0;
    u["prompt_cache_miss_tokens"] = prompt_tokens_;
    return u;
  }
  std::string token_text(int32_t id) const {
    if (!ctx_.tokenizer || id < 0 || id >= ctx_.tokenizer->vocab_size()) return "";
    return ctx_.tokenizer->token_bytes(id);
  }
  // OpenAI chat logprobs entries of tokens [from, to).
  OJson chat_logprobs(const CompletionOutput& c, size_t from, size_t to) const {
    OJson arr = OJson::array();
    auto entry = [&](int32_t tok, float lp) {
      const std::string s = token_text(tok);
      OJson bytes = OJson::array();
      for (unsigned char ch : s) bytes.push_back(static_cast<int>(ch));
      return OJson{{"token", s}, {"logprob", lp}, {"bytes", bytes}};
    };
    for (size_t i = from; i < to && i < c.logprobs.size(); ++i) {
      OJson e = entry(c.logprobs[i].token, c.logprobs[i].logprob);
      OJson top = OJson::array();
      for (const auto& [tok, lp] : c.logprobs[i].top) top.push_back(entry(tok, lp));
      e["top_logprobs"] = top;
      arr.push_back(e);
    }
    return OJson{{"content", arr}};
  }

  const ServerContext& ctx_;
  std::string id_;
  int64_t created_;
  bool stream_;
  size_t holdback_;
  int logprobs_;
  bool thinking_;
  int64_t prompt_tokens_ = 0;
  std::vector<ChildState> kids_;
  RequestOutput last_;
};

// ---- chat completions ---------------------------------------------------------------------------

class ChatBuilder : public BuilderBase {
 public:
  ChatBuilder(const ServerContext& ctx, std::string id, const SamplingParams& p, bool stream, bool include_usage,
              bool thinking)
      : BuilderBase(ctx, std::move(id), p.n, stream, p, true, thinking), include_usage_(include_usage) {}

  std::string stream_start() override {
    std::string s;
    for (size_t i = 0; i < kids_.size(); ++i) {
      OJson delta = {{"role", "assistant"}, {"content", ""}};
      if (thinking_) delta["reasoning_content"] = "";
      s += sse(chunk(i, delta, nullptr, nullptr));
    }
    return s;
  }

  std::string on_output(const RequestOutput& out) override {
    prompt_tokens_ = static_cast<int64_t>(out.prompt_token_ids.size());
    std::string s;
    for (const CompletionOutput& c : out.outputs) {
      const size_t i = static_cast<size_t>(c.index);
      if (i >= kids_.size()) continue;
      Delta d = advance(kids_[i], c, holdback_);
      if (!stream_) continue;
      const bool lp = logprobs_ >= 0 && d.tok_to > d.tok_from;
      if (d.any_text() || lp) {
        OJson delta = OJson::object();
        if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
        if (!d.content.empty()) delta["content"] = d.content;
        if (!d.calls.empty()) {
          OJson calls = OJson::array();
          for (const ToolCall& call : d.calls)
            calls.push_back({{"index", call.index},
                             {"id", call.id},
                             {"type", "function"},
                             {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
          delta["tool_calls"] = calls;
        }
        s += sse(chunk(i, delta, lp ? chat_logprobs(c, d.tok_from, d.tok_to) : OJson(nullptr), nullptr));
      }
      if (d.finished) s += sse(chunk(i, OJson::object(), nullptr, finish_reason(kids_[i])));
    }
    if (out.finished) {
      last_ = out;
      if (stream_) {
        if (include_usage_) {
          OJson j = base("chat.completion.chunk");
          j["choices"] = OJson::array();
          j["usage"] = usage();
          s += sse(j);
        }
        s += "data: [DONE]\n\n";
      }
    }
    return s;
  }

  OJson final_body() override {
    OJson j = base("chat.completion");
    OJson choices = OJson::array();
    for (size_t i = 0; i < kids_.size(); ++i) {
      const ChildState& k = kids_[i];
      OJson msg = {{"role", "assistant"}, {"content", k.content}};
      if (thinking_) msg["reasoning_content"] = k.reasoning;
      if (!k.calls.empty()) {
        OJson calls = OJson::array();
        for (const ToolCall& call : k.calls)
          calls.push_back({{"id", call.id},
                           {"type", "function"},
                           {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
        msg["tool_calls"] = calls;
      }
      OJson lp = nullptr;
      if (logprobs_ >= 0 && i < last_.outputs.size())
        lp = chat_logprobs(last_.outputs[i], 0, last_.outputs[i].logprobs.size());
      choices.push_back({{"index", i},
                         {"message", msg},
                         {"logprobs", lp},
                         {"finish_reason", finish_reason(k)},
                         {"stop_reason", stop_reason_json(k)}});
    }
    j["choices"] = choices;
    j["usage"] = usage();
    return j;
  }

  std::string stream_error(const std::string& message) override {
    return sse(openai_error_body(500, message)) + "data: [DONE]\n\n";
  }

 private:
  static std::string finish_reason(const ChildState& k) {
    if (k.finish_reason == "stop" && !k.calls.empty()) return "tool_calls";
    return k.finish_reason;
  }
  OJson base(const char* object) const {
    return OJson{{"id", id_},
                 {"object", object},
                 {"created", created_},
                 {"model", ctx_.served_model_name},
                 {"system_fingerprint", "deepinfer"}};
  }
  OJson chunk(size_t index, OJson delta, OJson logprobs, OJson finish) const {
    OJson j = base("chat.completion.chunk");
    j["choices"] = OJson::array({OJson{{"index", index},
                                       {"delta", std::move(delta)},
                                       {"logprobs", std::move(logprobs)},
                                       {"finish_reason", std::move(finish)}}});
    return j;
  }

  bool include_usage_;
};

// ---- completions --------------------------------------------------------------------------------

// One prompt of a completions request: its ids and, with echo, the text echoed before each choice.
struct CompletionPrompt {
  std::vector<int32_t> ids;
  std::string echo;
};

class CompletionBuilder : public BuilderBase {
 public:
  // Choice i belongs to prompt i / n (prompt-major, as OpenAI and vLLM index them).
  CompletionBuilder(const ServerContext& ctx, std::string id, const SamplingParams& p, bool stream, bool include_usage,
                    std::vector<CompletionPrompt> prompts, bool echo, bool return_token_ids)
      : BuilderBase(ctx, std::move(id), p.n * static_cast<int>(prompts.size()), stream, p, false, false),
        include_usage_(include_usage),
        n_(static_cast<size_t>(p.n)),
        prompts_(std::move(prompts)),
        echo_(echo),
        return_ids_(return_token_ids),
        outs_(kids_.size()),
        prompt_lps_(prompts_.size()),
        offsets_(kids_.size(), 0),
        started_(kids_.size(), false) {
    for (const auto& pr : prompts_) prompt_tokens_ += static_cast<int64_t>(pr.ids.size());
  }

  std::string stream_start() override { return ""; }
  void set_prompt_tokens(int64_t) override {}

  std::string on_output(const RequestOutput& out) override {
    std::string s;
    for (const CompletionOutput& c : out.outputs) {
      const size_t i = static_cast<size_t>(c.index);
      if (i >= kids_.size()) continue;
      const size_t k = i / n_;
      if (!out.prompt_logprobs.empty()) prompt_lps_[k] = out.prompt_logprobs;
      outs_[i] = c;
      Delta d = advance(kids_[i], c, holdback_);
      if (!stream_) continue;
      const bool first = !started_[i];
      started_[i] = true;
      const bool lp = logprobs_ >= 0 && (d.tok_to > d.tok_from || (first && echo_));
      if (!d.content.empty() || lp || d.finished || (first && (echo_ || return_ids_))) {
        OJson j = base();
        OJson fr = d.finished ? OJson(kids_[i].finish_reason) : OJson(nullptr);
        OJson lps = nullptr;
        if (lp) {
          lps = empty_logprobs();
          if (first && echo_) append_prompt_logprobs(lps, k, i);
          append_logprobs(lps, c, d.tok_from, d.tok_to, i);
        }
        OJson choice = {{"index", i},
                        {"text", (first && echo_ ? prompts_[k].echo : std::string()) + d.content},
                        {"logprobs", lps},
                        {"finish_reason", fr},
                        {"stop_reason", d.finished ? stop_reason_json(kids_[i]) : OJson(nullptr)}};
        if (return_ids_) {
          if (first) choice["prompt_token_ids"] = ids_json(prompts_[k].ids, 0, prompts_[k].ids.size());
          choice["token_ids"] = ids_json(c.token_ids, d.tok_from, d.tok_to);
        }
        j["choices"] = OJson::array({std::move(choice)});
        s += sse(j);
      }
    }
    if (out.finished) {
      if (stream_) {
        if (include_usage_) {
          OJson j = base();
          j["choices"] = OJson::array();
          j["usage"] = usage();
          s += sse(j);
        }
        s += "data: [DONE]\n\n";
      }
    }
    return s;
  }

  OJson final_body() override {
    OJson j = base();
    OJson choices = OJson::array();
    for (size_t i = 0; i < kids_.size(); ++i) {
      const size_t k = i / n_;
      OJson lp = nullptr;
      if (logprobs_ >= 0) {
        offsets_[i] = 0;
        lp = empty_logprobs();
        if (echo_) append_prompt_logprobs(lp, k, i);
        append_logprobs(lp, outs_[i], 0, outs_[i].logprobs.size(), i);
      }
      OJson choice = {{"index", i},
                      {"text", (echo_ ? prompts_[k].echo : std::string()) + kids_[i].content},
                      {"logprobs", lp},
                      {"finish_reason", kids_[i].finish_reason},
                      {"stop_reason", stop_reason_json(kids_[i])}};
      if (return_ids_) {
        choice["prompt_token_ids"] = ids_json(prompts_[k].ids, 0, prompts_[k].ids.size());
        choice["token_ids"] = ids_json(outs_[i].token_ids, 0, outs_[i].token_ids.size());
      }
      choices.push_back(std::move(choice));
    }
    j["choices"] = choices;
    j["usage"] = usage();
    j["usage"].erase("completion_tokens_details");
    return j;
  }

  std::string stream_error(const std::string& message) override {
    return sse(openai_error_body(500, message)) + "data: [DONE]\n\n";
  }

 private:
  OJson base() const {
    return OJson{{"id", id_},
                 {"object", "text_completion"},
                 {"created", created_},
                 {"model", ctx_.served_model_name},
                 {"system_fingerprint", "deepinfer"}};
  }
  static OJson ids_json(const std::vector<int32_t>& ids, size_t from, size_t to) {
    OJson a = OJson::array();
    for (size_t t = from; t < to && t < ids.size(); ++t) a.push_back(ids[t]);
    return a;
  }
  static OJson empty_logprobs() {
    return OJson{{"tokens", OJson::array()},
                 {"token_logprobs", OJson::array()},
                 {"top_logprobs", OJson::array()},
                 {"text_offset", OJson::array()}};
  }
  void push_entry(OJson& lp, int32_t tok, OJson logprob, OJson top, size_t choice) {
    const std::string t = token_text(tok);
    lp["tokens"].push_back(t);
    lp["token_logprobs"].push_back(std::move(logprob));
    lp["top_logprobs"].push_back(std::move(top));
    lp["text_offset"].push_back(offsets_[choice]);
    offsets_[choice] += static_cast<int64_t>(t.size());
  }
  // echo: the prompt's tokens first (the first one has no logprob: nothing predicts it).
  void append_prompt_logprobs(OJson& lp, size_t k, size_t choice) {
    const auto& ids = prompts_[k].ids;
    const auto& plp = prompt_lps_[k];
    for (size_t t = 0; t < ids.size(); ++t) {
      if (t < plp.size() && plp[t]) {
        OJson top = OJson::object();
        for (const auto& [tok, v] : plp[t]->top) top[token_text(tok)] = v;
        push_entry(lp, ids[t], plp[t]->logprob, std::move(top), choice);
      } else {
        push_entry(lp, ids[t], nullptr, nullptr, choice);
      }
    }
  }
  void append_logprobs(OJson& lp, const CompletionOutput& c, size_t from, size_t to, size_t choice) {
    for (size_t t = from; t < to && t < c.logprobs.size(); ++t) {
      OJson top = OJson::object();
      for (const auto& [tok, v] : c.logprobs[t].top) top[token_text(tok)] = v;
      push_entry(lp, c.logprobs[t].token, c.logprobs[t].logprob, std::move(top), choice);
    }
  }

  bool include_usage_;
  size_t n_;
  std::vector<CompletionPrompt> prompts_;
  bool echo_, return_ids_;
  std::vector<CompletionOutput> outs_;                                 // latest snapshot per choice
  std::vector<std::vector<std::optional<TokenLogprobs>>> prompt_lps_;  // per prompt (echo + logprobs)
  std::vector<int64_t> offsets_;                                       // text_offset per choice
  std::vector<bool> started_;
};

// ---- Anthropic messages -------------------------------------------------------------------------

class MessagesBuilder : public BuilderBase {
 public:
  MessagesBuilder(const ServerContext& ctx, std::string id, const SamplingParams& p, bool stream, bool thinking)
      : BuilderBase(ctx, std::move(id), 1, stream, p, true, thinking) {}

  std::string stream_start() override {
    OJson msg = {{"id", id_},
                 {"type", "message"},
                 {"role", "assistant"},
                 {"model", ctx_.served_model_name},
                 {"content", OJson::array()},
                 {"stop_reason", nullptr},
                 {"stop_sequence", nullptr},
                 {"usage", {{"input_tokens", prompt_tokens_}, {"output_tokens", 0}}}};
    return sse_event("message_start", {{"type", "message_start"}, {"message", msg}});
  }

  std::string on_output(const RequestOutput& out) override {
    prompt_tokens_ = static_cast<int64_t>(out.prompt_token_ids.size());
    std::string s;
    if (out.outputs.empty()) return s;
    Delta d = advance(kids_[0], out.outputs[0], holdback_);
    if (!d.reasoning.empty()) {
      s += open("thinking");
      s += sse_event("content_block_delta", {{"type", "content_block_delta"},
                                             {"index", block_},
                                             {"delta", {{"type", "thinking_delta"}, {"thinking", d.reasoning}}}});
      blocks_.back()["thinking"] = blocks_.back()["thinking"].get<std::string>() + d.reasoning;
    }
    if (!d.content.empty()) {
      s += open("text");
      s += sse_event("content_block_delta", {{"type", "content_block_delta"},
                                             {"index", block_},
                                             {"delta", {{"type", "text_delta"}, {"text", d.content}}}});
      blocks_.back()["text"] = blocks_.back()["text"].get<std::string>() + d.content;
    }
    for (const ToolCall& call : d.calls) {
      s += close();
      OJson input = OJson::parse(call.arguments, nullptr, false);
      if (input.is_discarded() || !input.is_object()) input = OJson::object();
      OJson start = {{"type", "tool_use"}, {"id", call.id}, {"name", call.name}, {"input", OJson::object()}};
      blocks_.push_back({{"type", "tool_use"}, {"id", call.id}, {"name", call.name}, {"input", input}});
      block_ = static_cast<int>(blocks_.size()) - 1;
      s += sse_event("content_block_start",
                     {{"type", "content_block_start"}, {"index", block_}, {"content_block", start}});
      s += sse_event("content_block_delta",
                     {{"type", "content_block_delta"},
                      {"index", block_},
                      {"delta", {{"type", "input_json_delta"}, {"partial_json", call.arguments}}}});
      current_ = "tool_use";
      s += close();
    }
    if (out.finished) {
      last_ = out;
      s += close();
      s += sse_event("message_delta", {{"type", "message_delta"},
                                       {"delta", {{"stop_reason", stop_reason()}, {"stop_sequence", stop_sequence()}}},
                                       {"usage", {{"output_tokens", completion_tokens()}}}});
      s += sse_event("message_stop", {{"type", "message_stop"}});
    }
    return stream_ ? s : std::string();
  }

  OJson final_body() override {
    OJson content = OJson::array();
    for (const OJson& b : blocks_) content.push_back(b);
    return OJson{{"id", id_},
                 {"type", "message"},
                 {"role", "assistant"},
                 {"model", ctx_.served_model_name},
                 {"content", content},
                 {"stop_reason", stop_reason()},
                 {"stop_sequence", stop_sequence()},
                 {"usage", {{"input_tokens", prompt_tokens_}, {"output_tokens", completion_tokens()}}}};
  }

  std::string stream_error(const std::string& message) override {
    return sse_event("error", anthropic_error_body(500, message));
  }

 private:
  std::string open(const char* type) {
    if (current_ == type) return "";
    std::string s = close();
    OJson block = {{"type", type}};
    if (std::string(type) == "thinking") {
      block["thinking"] = "";
      block["signature"] = "";
    } else {
      block["text"] = "";
    }
    blocks_.push_back(block);
    block_ = static_cast<int>(blocks_.size()) - 1;
    current_ = type;
    return s + sse_event("content_block_start",
                         {{"type", "content_block_start"}, {"index", block_}, {"content_block", block}});
  }
  std::string close() {
    if (current_.empty()) return "";
    current_.clear();
    return sse_event("content_block_stop", {{"type", "content_block_stop"}, {"index", block_}});
  }
  OJson stop_reason() const {
    const ChildState& k = kids_[0];
    if (k.finish_reason.empty()) return nullptr;
    if (k.finish_reason == "length") return "max_tokens";
    if (!k.calls.empty()) return "tool_use";
    if (std::holds_alternative<std::string>(k.stop_reason)) return "stop_sequence";
    return "end_turn";
  }
  OJson stop_sequence() const {
    const ChildState& k = kids_[0];
    if (std::holds_alternative<std::string>(k.stop_reason)) return std::get<std::string>(k.stop_reason);
    return nullptr;
  }

  std::vector<OJson> blocks_;
  std::string current_;
  int block_ = -1;
};

// ---- prompts ------------------------------------------------------------------------------------

// V4 accepts null | "high" | "max"; V4.1 null | "low" | "high" | "max" | 1..100. OpenAI's other
// levels map as the official API does (minimal -> low, medium/xhigh -> high, ultra -> max).
OJson map_effort(const OJson& e, ModelFamily fam, const char* field) {
  if (e.is_null()) return nullptr;
  if (e.is_number_integer() && fam == ModelFamily::kV41) {
    const int64_t v = e.get<int64_t>();
    if (v < 1 || v > 100)
      throw ApiError(400, fmt::format("{} must be in 1..100 when an integer, got {}", field, v), field);
    return v;
  }
  if (!e.is_string()) throw ApiError(400, fmt::format("{} must be a string (low | high | max)", field), field);
  std::string s = e.get<std::string>();
  if (s == "minimal") s = "low";
  if (s == "medium" || s == "xhigh") s = "high";
  if (s == "ultra") s = "max";
  if (s != "low" && s != "high" && s != "max")
    throw ApiError(400, fmt::format("{} must be one of low, high, max; got '{}'", field, s), field);
  if (fam == ModelFamily::kV4) return s == "max" ? OJson("max") : OJson("high");
  return s;
}

// tool_choice: "auto" (default) | "none" | "required" | {"type": "function", "function": {"name": f}}.
struct ToolChoice {
  enum Mode { kAuto, kNone, kRequired, kNamed } mode = kAuto;
  std::string name;
};

ToolChoice parse_tool_choice(const OJson& req) {
  ToolChoice t;
  if (!has(req, "tool_choice")) return t;
  const OJson& tc = req["tool_choice"];
  if (tc.is_string()) {
    const std::string s = tc.get<std::string>();
    if (s == "auto") return t;
    if (s == "none")
      t.mode = ToolChoice::kNone;
    else if (s == "required")
      t.mode = ToolChoice::kRequired;
    else
      throw ApiError(400, fmt::format("tool_choice '{}' is not one of auto, none, required", s), "tool_choice");
    return t;
  }
  if (tc.is_object() && tc.value("type", "") == "function" && tc.contains("function") && tc["function"].is_object() &&
      tc["function"].contains("name") && tc["function"]["name"].is_string()) {
    t.mode = ToolChoice::kNamed;
    t.name = tc["function"]["name"].get<std::string>();
    return t;
  }
  if (tc.is_object() && tc.value("type", "") == "function" && tc.contains("name") && tc["name"].is_string()) {
    t.mode = ToolChoice::kNamed;  // the Responses API's flat spelling
    t.name = tc["name"].get<std::string>();
    return t;
  }
  throw ApiError(400,
                 "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": "
                 "{\"name\": ...}}",
                 "tool_choice");
}

// Messages of an OpenAI chat request -> the encoder's format. Throws ApiError on a malformed message.
OJson normalize_messages(const OJson& msgs, ModelFamily fam) {
  if (!msgs.is_array()) throw ApiError(400, "field 'messages' must be a list of message objects", "messages");
  if (msgs.empty()) throw ApiError(400, "field 'messages' must not be empty", "messages");
  OJson out = OJson::array();
  for (size_t i = 0; i < msgs.size(); ++i) {
    const OJson& m = msgs[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object())
      throw ApiError(400, fmt::format("{} must be an object, got JSON {}", where, m.type_name()), where);
    if (!m.contains("role") || !m["role"].is_string())
      throw ApiError(400, fmt::format("{}.role must be a string", where), where + ".role");
    std::string role = m["role"].get<std::string>();
    if (role != "system" && role != "developer" && role != "user" && role != "assistant" && role != "tool")
      throw ApiError(400,
                     fmt::format("{}.role '{}' is not one of system, developer, user, assistant, tool", where, role),
                     where + ".role");
    if (role == "tool" && !(m.contains("tool_call_id") && m["tool_call_id"].is_string()))
      throw ApiError(400, fmt::format("{}.tool_call_id must be a string (the id of the tool call it answers)", where),
                     where + ".tool_call_id");
    OJson n = m;
    if (role == "developer" && fam == ModelFamily::kV41) n["role"] = "system";
    if (n.contains("content")) {
      OJson& c = n["content"];
      if (c.is_array()) {
        // Text parts are joined; other parts are kept for V4.1 (images) and rejected for V4.
        bool all_text = true;
        std::string text;
        for (const OJson& part : c) {
          if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
            throw ApiError(400, fmt::format("{}.content parts must be objects with a 'type'", where),
                           where + ".content");
          if (part["type"] == "text") {
            if (!part.contains("text") || !part["text"].is_string())
              throw ApiError(400, fmt::format("{}.content text parts need a string 'text'", where), where + ".content");
            text += part["text"].get<std::string>();
          } else {
            all_text = false;
          }
        }
        if (all_text) {
          c = text;
        } else if (fam == ModelFamily::kV4) {
          throw ApiError(400, fmt::format("{}.content: only text parts are supported by this model", where),
                         where + ".content");
        }
      } else if (!c.is_string() && !c.is_null()) {
        throw ApiError(400, fmt::format("{}.content must be a string, a list of parts or null", where),
                       where + ".content");
      }
    }
    if (role == "assistant") {
      if (n.contains("tool_calls") && !n["tool_calls"].is_null() && !n["tool_calls"].is_array())
        throw ApiError(400, fmt::format("{}.tool_calls must be a list", where), where + ".tool_calls");
      if (n.contains("reasoning_content") && !n["reasoning_content"].is_null() && !n["reasoning_content"].is_string())
        throw ApiError(400, fmt::format("{}.reasoning_content must be a string", where), where + ".reasoning_content");
      if (get_bool(n, "prefix", false)) {
        n["wo_eos"] = true;
        n.erase("prefix");
      }
    }
    out.push_back(std::move(n));
  }
  return out;
}

std::string render_chat(const OJson& req, const ServerContext& ctx, bool thinking) {
  EncodeOptions enc;
  enc.family = ctx.family == ModelFamily::kV41 ? EncodingFamily::kV41 : EncodingFamily::kV4;
  enc.thinking = thinking;
  if (has(req, "reasoning_effort"))
    enc.reasoning_effort = map_effort(req["reasoning_effort"], ctx.family, "reasoning_effort");
  OJson messages = normalize_messages(req.contains("messages") ? req["messages"] : OJson(), ctx.family);
  OJson tools = nullptr;
  if (has(req, "tools")) {
    expect_type(req, "tools", req["tools"].is_array(), "a list of tools");
    for (const OJson& t : req["tools"]) {
      if (!t.is_object() || !t.contains("function") || !t["function"].is_object() || !t["function"].contains("name") ||
          !t["function"]["name"].is_string())
        throw ApiError(400, "every tool must be {\"type\": \"function\", \"function\": {\"name\": ..., ...}}", "tools");
    }
    if (!req["tools"].empty()) tools = req["tools"];
  }
  if (parse_tool_choice(req).mode == ToolChoice::kNone) tools = nullptr;
  if (!tools.is_null()) {
    if (messages[0]["role"] != "system" && messages[0]["role"] != "developer")
      messages.insert(messages.begin(), OJson{{"role", "system"}, {"content", ""}});
    enc.tools = tools;
  }
  if (has(req, "response_format")) {
    const OJson& rf = req["response_format"];
    if (!rf.is_object()) throw ApiError(400, "response_format must be an object", "response_format");
    if (rf.value("type", "") != "text") enc.response_format = rf;
  }
  try {
    return encode_messages(messages, enc);
  } catch (const Error& e) {
    throw ApiError(400, e.what(), "messages");
  }
}

// tool_choice "required" / a named function: the output must be a DSML tool-call block of the
// allowed tool(s), enforced by the structured-output engine (so_args type "dsml_tools", see
// structured/dsml_tools.cpp), after the reasoning when thinking is on. A named function gets exactly
// one call, "required" one or more (one with parallel_tool_calls: false). Call after render_chat
// (which checked the tools' shape).
void apply_tool_choice(const OJson& req, SamplingParams& params, const ServerContext& ctx) {
  const ToolChoice tc = parse_tool_choice(req);
  if (tc.mode == ToolChoice::kAuto || tc.mode == ToolChoice::kNone) return;
  const char* what = tc.mode == ToolChoice::kRequired ? "\"required\"" : "a named function";
  if (!has(req, "tools") || !req["tools"].is_array() || req["tools"].empty())
    throw ApiError(400, fmt::format("tool_choice {} needs a non-empty 'tools' list", what), "tool_choice");
  if (!params.so_args.is_null())
    throw ApiError(400,
                   fmt::format("tool_choice {} cannot be combined with response_format or so_args (both constrain "
                               "the output)",
                               what),
                   "tool_choice");
  bool parallel = tc.mode == ToolChoice::kRequired;
  if (has(req, "parallel_tool_calls")) {
    expect_type(req, "parallel_tool_calls", req["parallel_tool_calls"].is_boolean(), "a boolean");
    parallel = parallel && req["parallel_tool_calls"].get<bool>();
  }
  OJson allowed = OJson::array();
  for (const OJson& t : req["tools"]) {
    const OJson& fn = t["function"];
    if (tc.mode == ToolChoice::kNamed && fn["name"] != tc.name) continue;
    OJson entry = {{"name", fn["name"]}};
    if (fn.contains("parameters") && !fn["parameters"].is_null()) entry["parameters"] = fn["parameters"];
    allowed.push_back(std::move(entry));
    if (tc.mode == ToolChoice::kNamed) break;
  }
  if (allowed.empty())
    throw ApiError(400, fmt::format("tool_choice names the function '{}', which is not in 'tools'", tc.name),
                   "tool_choice");
  const OJson value = {
      {"tools", allowed}, {"family", ctx.family == ModelFamily::kV41 ? "v41" : "v4"}, {"parallel", parallel}};
  nlohmann::json so = {{"type", "dsml_tools"}, {"value", dump(value)}};
  // Compiled here as well (the engine compiles it again, cached) so a schema the grammar cannot take
  // is a 400 before a stream starts.
  try {
    structured::compile_so_args(so);
  } catch (const Error& e) {
    throw ApiError(400, fmt::format("tools: {}", e.what()), "tools");
  }
  params.so_args = std::move(so);
}

bool chat_thinking(const OJson& req) {
  bool thinking = true;
  if (has(req, "thinking")) {
    const OJson& t = req["thinking"];
    if (t.is_boolean()) {
      thinking = t.get<bool>();
    } else if (t.is_object() && t.contains("type") && t["type"].is_string()) {
      const std::string ty = t["type"].get<std::string>();
      if (ty != "enabled" && ty != "disabled")
        throw ApiError(400, fmt::format("thinking.type must be \"enabled\" or \"disabled\", got \"{}\"", ty),
                       "thinking");
      thinking = ty == "enabled";
    } else {
      throw ApiError(400, "thinking must be {\"type\": \"enabled\" | \"disabled\"}", "thinking");
    }
  }
  if (has(req, "chat_template_kwargs") && req["chat_template_kwargs"].is_object()) {
    const OJson& k = req["chat_template_kwargs"];
    for (const char* key : {"thinking", "enable_thinking"})
      if (k.contains(key) && k[key].is_boolean()) thinking = k[key].get<bool>();
  }
  return thinking;
}

std::vector<int32_t> tokenize(const ServerContext& ctx, const std::string& text, bool add_special) {
  if (!ctx.tokenizer) throw ApiError(400, "this server has no tokenizer: send token ids");
  try {
    return ctx.tokenizer->encode(text, add_special);
  } catch (const Error& e) {
    throw ApiError(400, e.what(), "prompt");
  }
}

void check_ids(const std::vector<int32_t>& ids, const ServerContext& ctx, const char* param) {
  const int32_t vocab = ctx.tokenizer ? ctx.tokenizer->vocab_size() : INT32_MAX;
  for (int32_t id : ids)
    if (id < 0 || id >= vocab)
      throw ApiError(400, fmt::format("token id {} is outside the vocabulary [0, {})", id, vocab), param);
}

std::vector<int32_t> ids_from_json(const OJson& a, const ServerContext& ctx, const char* param) {
  std::vector<int32_t> ids;
  for (const OJson& v : a) {
    if (!v.is_number_integer()) throw ApiError(400, fmt::format("{} must hold integers (token ids)", param), param);
    const int64_t x = v.get<int64_t>();
    if (x < 0 || x > INT32_MAX) throw ApiError(400, fmt::format("token id {} is out of range", x), param);
    ids.push_back(static_cast<int32_t>(x));
  }
  check_ids(ids, ctx, param);
  return ids;
}

bool stream_flags(const OJson& req, bool* include_usage) {
  const bool stream = get_bool(req, "stream", false);
  *include_usage = false;
  if (has(req, "stream_options")) {
    expect_type(req, "stream_options", req["stream_options"].is_object(), "an object");
    *include_usage = get_bool(req["stream_options"], "include_usage", false);
  }
  return stream;
}

std::string next_id(const char* prefix) { return std::string(prefix) + random_hex(24); }

}  // namespace

ApiError::ApiError(int s, std::string message, std::string p, std::string c, std::string t)
    : std::runtime_error(std::move(message)), status(s), param(std::move(p)), code(std::move(c)), type(std::move(t)) {}

OJson openai_error_body(int status, const std::string& message, const std::string& param, const std::string& code,
                        const std::string& type) {
  return OJson{{"error",
                {{"message", message},
                 {"type", type.empty() ? default_type(status) : type},
                 {"param", param.empty() ? OJson(nullptr) : OJson(param)},
                 {"code", code.empty() ? OJson(status) : OJson(code)}}}};
}

OJson anthropic_error_body(int status, const std::string& message) {
  return OJson{{"type", "error"}, {"error", {{"type", default_type(status)}, {"message", message}}}};
}

std::string dump(const OJson& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

// response_format json_object / json_schema is enforced through the structured-output engine (the
// official API only asks the model): so_args {"type": "json_object"} or {"type": "json_schema",
// "value": <the schema as JSON text, so its property order is kept>}. The constraint starts after
// the reasoning when thinking is on (the engine starts it after </think>).
void apply_response_format(const OJson& req, SamplingParams& params) {
  if (!has(req, "response_format")) return;
  const OJson& rf = req["response_format"];
  if (!rf.is_object()) throw ApiError(400, "response_format must be an object", "response_format");
  const std::string type = rf.value("type", "");
  if (type == "text") return;
  if (!params.so_args.is_null())
    throw ApiError(400, "give either response_format or so_args, not both", "response_format");
  if (type == "json_object") {
    params.so_args = {{"type", "json_object"}};
  } else if (type == "json_schema") {
    if (!rf.contains("json_schema") || !rf["json_schema"].is_object() || !rf["json_schema"].contains("schema"))
      throw ApiError(400, "response_format json_schema needs json_schema.schema", "response_format.json_schema");
    params.so_args = {{"type", "json_schema"}, {"value", dump(rf["json_schema"]["schema"])}};
  } else {
    throw ApiError(400, fmt::format("response_format type '{}' is not one of text, json_object, json_schema", type),
                   "response_format.type");
  }
}

Job prepare_chat(const std::string& body, const ServerContext& ctx) {
  OJson req = parse_body(body);
  check_model(req, ctx);
  if (!req.contains("messages")) throw ApiError(400, "field 'messages' is required", "messages");
  bool include_usage = false;
  Job job;
  job.stream = stream_flags(req, &include_usage);
  const bool thinking = chat_thinking(req);
  // Chat text keeps special tokens: the reasoning and tool-call markers are parsed from it.
  if (!has(req, "skip_special_tokens")) req["skip_special_tokens"] = false;
  job.params = sampling_from(req);
  apply_response_format(req, job.params);
  job.prompt = tokenize(ctx, render_chat(req, ctx, thinking), false);
  apply_tool_choice(req, job.params, ctx);
  finish_params(job.params, has(req, "max_tokens") || has(req, "max_completion_tokens"), 0, job.prompt.size(), ctx);
  job.request_id = next_id("chatcmpl-");
  job.builder = std::make_unique<ChatBuilder>(ctx, job.request_id, job.params, job.stream, include_usage, thinking);
  return job;
}

// /v1/completions (and FIM at /beta/completions). `prompt`: a string, a list of token ids, a list
// of strings or a list of token-id lists; several prompts run as one engine request each and their
// choices are numbered prompt-major (index = prompt * n + child). `echo` puts the prompt text (the
// string as sent, or the ids decoded) before each choice's text, with the prompt tokens' logprobs
// when `logprobs` is set. `best_of` must equal n (every sampled completion is returned). vLLM's
// `return_token_ids` adds prompt_token_ids / token_ids to each choice.
Job prepare_completion(const std::string& body, const ServerContext& ctx, bool fim) {
  OJson req = parse_body(body);
  check_model(req, ctx);
  if (!req.contains("prompt")) throw ApiError(400, "field 'prompt' is required", "prompt");
  const OJson& p = req["prompt"];
  Job job;
  const bool echo = get_bool(req, "echo", false);
  const bool return_ids = get_bool(req, "return_token_ids", false);
  std::string suffix;
  if (has(req, "suffix")) {
    expect_type(req, "suffix", req["suffix"].is_string(), "a string");
    suffix = req["suffix"].get<std::string>();
    if (!fim && !suffix.empty())
      throw ApiError(400, "suffix (fill in the middle) is served at POST /beta/completions", "suffix");
  }
  // The prompts as sent: strings or id lists.
  std::vector<OJson> items;
  const char* shape =
      "field 'prompt' must be a string, a list of token ids, a list of strings or a list of token-id lists";
  if (p.is_string()) {
    items.push_back(p);
  } else if (p.is_array() && !p.empty() && p[0].is_number()) {
    items.push_back(p);
  } else if (p.is_array() && !p.empty()) {
    for (const OJson& x : p) {
      if (!x.is_string() && !x.is_array()) throw ApiError(400, shape, "prompt");
      items.push_back(x);
    }
  } else {
    throw ApiError(400, p.is_array() ? "field 'prompt' must not be an empty list" : shape, "prompt");
  }
  if (fim && (items.size() != 1 || !items[0].is_string()))
    throw ApiError(400, "fill in the middle takes one text prompt (a string)", "prompt");
  if (fim && echo) throw ApiError(400, "echo is not supported for fill in the middle", "echo");
  bool include_usage = false;
  job.stream = stream_flags(req, &include_usage);
  job.params = sampling_from(req);
  if (has(req, "best_of")) {
    expect_type(req, "best_of", req["best_of"].is_number_integer(), "an integer");
    const int64_t best_of = req["best_of"].get<int64_t>();
    if (best_of != job.params.n)
      throw ApiError(400,
                     fmt::format("best_of must equal n ({}), got {}: this server returns every sampled completion and "
                                 "does not rank candidates",
                                 job.params.n, best_of),
                     "best_of");
  }
  if (static_cast<int64_t>(items.size()) * job.params.n > ctx.max_n)
    throw ApiError(400,
                   fmt::format("{} prompts x n = {} completions is over the limit of {} per request", items.size(),
                               static_cast<int64_t>(items.size()) * job.params.n, ctx.max_n),
                   "prompt");
  std::vector<CompletionPrompt> prompts;
  for (const OJson& x : items) {
    CompletionPrompt cp;
    if (fim) {
      const std::string b =
          "<\xef\xbd\x9c"
          "fim\xe2\x96\x81"
          "begin\xef\xbd\x9c>";
      const std::string h =
          "<\xef\xbd\x9c"
          "fim\xe2\x96\x81"
          "hole\xef\xbd\x9c>";
      const std::string e =
          "<\xef\xbd\x9c"
          "fim\xe2\x96\x81"
          "end\xef\xbd\x9c>";
      auto id_of = [&](const std::string& t) -> int32_t {
        return ctx.tokenizer ? ctx.tokenizer->token_to_id(t).value_or(-1) : -1;
      };
      const int32_t bid = id_of(b), hid = id_of(h), eid = id_of(e);
      if (bid < 0 || hid < 0 || eid < 0) throw ApiError(400, "this model's tokenizer has no fill-in-the-middle tokens");
      // <｜begin▁of▁sentence｜><｜fim▁begin｜>prefix<｜fim▁hole｜>suffix<｜fim▁end｜>: BOS and the markers
      // as ids, prefix and suffix tokenized on their own (as prompt text: added-token spellings count).
      if (ctx.tokenizer->bos_id() >= 0) cp.ids.push_back(ctx.tokenizer->bos_id());
      cp.ids.push_back(bid);
      for (int32_t t : tokenize(ctx, x.get<std::string>(), false)) cp.ids.push_back(t);
      cp.ids.push_back(hid);
      for (int32_t t : tokenize(ctx, suffix, false)) cp.ids.push_back(t);
      cp.ids.push_back(eid);
    } else if (x.is_string()) {
      cp.ids = tokenize(ctx, x.get<std::string>(), true);
      if (echo) cp.echo = x.get<std::string>();
    } else {
      cp.ids = ids_from_json(x, ctx, "prompt");
      if (echo && ctx.tokenizer) cp.echo = ctx.tokenizer->decode(cp.ids, job.params.skip_special_tokens);
    }
    prompts.push_back(std::move(cp));
  }
  if (echo && job.params.logprobs >= 0)
    job.params.prompt_logprobs = std::max(job.params.prompt_logprobs, job.params.logprobs);
  const bool max_given = has(req, "max_tokens") || has(req, "max_completion_tokens");
  // Every prompt must fit; max_tokens is capped by the longest one's room.
  size_t longest = 0;
  for (const auto& cp : prompts) {
    finish_params(job.params, max_given, 16, cp.ids.size(), ctx);
    longest = std::max(longest, cp.ids.size());
  }
  finish_params(job.params, max_given, 16, longest, ctx);
  job.request_id = next_id("cmpl-");
  job.prompt = prompts[0].ids;
  for (size_t k = 1; k < prompts.size(); ++k) job.more_prompts.push_back(prompts[k].ids);
  job.builder = std::make_unique<CompletionBuilder>(ctx, job.request_id, job.params, job.stream, include_usage,
                                                    std::move(prompts), echo, return_ids);
  return job;
}

Job prepare_messages(const std::string& body, const ServerContext& ctx) {
  OJson req = parse_body(body);
  check_model(req, ctx);
  if (!has(req, "max_tokens")) throw ApiError(400, "max_tokens: Field required", "max_tokens");
  if (!req.contains("messages") || !req["messages"].is_array() || req["messages"].empty())
    throw ApiError(400, "messages: must be a non-empty list", "messages");
  // Anthropic -> OpenAI chat messages.
  OJson msgs = OJson::array();
  if (has(req, "system")) {
    const OJson& s = req["system"];
    std::string text;
    if (s.is_string()) {
      text = s.get<std::string>();
    } else if (s.is_array()) {
      for (const OJson& b : s)
        if (b.is_object() && b.value("type", "") == "text" && b.contains("text") && b["text"].is_string())
          text += b["text"].get<std::string>();
    } else {
      throw ApiError(400, "system: must be a string or a list of text blocks", "system");
    }
    msgs.push_back({{"role", "system"}, {"content", text}});
  }
  for (size_t i = 0; i < req["messages"].size(); ++i) {
    const OJson& m = req["messages"][i];
    const std::string where = fmt::format("messages.{}", i);
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      throw ApiError(400, where + ": must be an object with a string 'role'", where);
    const std::string role = m["role"].get<std::string>();
    if (role != "user" && role != "assistant")
      throw ApiError(400, where + ".role: must be 'user' or 'assistant'", where);
    const OJson c = m.contains("content") ? m["content"] : OJson("");
    if (c.is_string()) {
      msgs.push_back({{"role", role}, {"content", c}});
      continue;
    }
    if (!c.is_array()) throw ApiError(400, where + ".content: must be a string or a list of blocks", where);
    std::string text, thinking;
    OJson calls = OJson::array();
    for (const OJson& b : c) {
      if (!b.is_object() || !b.contains("type") || !b["type"].is_string())
        throw ApiError(400, where + ".content: every block needs a 'type'", where);
      const std::string ty = b["type"].get<std::string>();
      if (ty == "text") {
        text += b.value("text", "");
      } else if (ty == "thinking") {
        thinking += b.value("thinking", "");
      } else if (ty == "redacted_thinking") {
      } else if (ty == "tool_use" && role == "assistant") {
        calls.push_back(
            {{"id", b.value("id", "")},
             {"type", "function"},
             {"function", {{"name", b.value("name", "")}, {"arguments", dump(b.value("input", OJson::object()))}}}});
      } else if (ty == "tool_result" && role == "user") {
        if (!text.empty()) {
          msgs.push_back({{"role", "user"}, {"content", text}});
          text.clear();
        }
        std::string result;
        const OJson rc = b.contains("content") ? b["content"] : OJson("");
        if (rc.is_string()) {
          result = rc.get<std::string>();
        } else if (rc.is_array()) {
          for (const OJson& rb : rc)
            if (rb.is_object() && rb.value("type", "") == "text") result += rb.value("text", "");
        }
        msgs.push_back({{"role", "tool"}, {"tool_call_id", b.value("tool_use_id", "")}, {"content", result}});
      } else {
        throw ApiError(400, fmt::format("{}.content: block type '{}' is not supported here", where, ty), where);
      }
    }
    if (role == "assistant") {
      OJson a = {{"role", "assistant"}, {"content", text}};
      if (!thinking.empty()) a["reasoning_content"] = thinking;
      if (!calls.empty()) a["tool_calls"] = calls;
      msgs.push_back(a);
    } else if (!text.empty()) {
      msgs.push_back({{"role", "user"}, {"content", text}});
    }
  }
  OJson oa = {{"messages", msgs}};
  if (has(req, "tools")) {
    if (!req["tools"].is_array()) throw ApiError(400, "tools: must be a list", "tools");
    OJson tools = OJson::array();
    for (const OJson& t : req["tools"]) {
      if (!t.is_object() || !t.contains("name") || !t["name"].is_string())
        throw ApiError(400, "tools: every tool needs a string 'name'", "tools");
      tools.push_back({{"type", "function"},
                       {"function",
                        {{"name", t["name"]},
                         {"description", t.value("description", "")},
                         {"parameters", t.value("input_schema", OJson::object())}}}});
    }
    if (!tools.empty()) oa["tools"] = tools;
  }
  // tool_choice {"type": "auto" | "any" | "tool" (+ "name") | "none", "disable_parallel_tool_use"}.
  if (has(req, "tool_choice")) {
    const OJson& tc = req["tool_choice"];
    if (!tc.is_object() || !tc.contains("type") || !tc["type"].is_string())
      throw ApiError(400, "tool_choice: must be an object with a 'type' (auto, any, tool, none)", "tool_choice");
    const std::string ty = tc["type"].get<std::string>();
    if (ty == "none") {
      oa.erase("tools");
    } else if (ty == "any") {
      oa["tool_choice"] = "required";
    } else if (ty == "tool") {
      if (!tc.contains("name") || !tc["name"].is_string())
        throw ApiError(400, "tool_choice: type 'tool' needs a string 'name'", "tool_choice");
      oa["tool_choice"] = {{"type", "function"}, {"function", {{"name", tc["name"]}}}};
    } else if (ty != "auto") {
      throw ApiError(400, fmt::format("tool_choice.type: '{}' is not one of auto, any, tool, none", ty), "tool_choice");
    }
    if (tc.contains("disable_parallel_tool_use") && tc["disable_parallel_tool_use"].is_boolean() &&
        tc["disable_parallel_tool_use"].get<bool>())
      oa["parallel_tool_calls"] = false;
  }
  if (has(req, "thinking")) oa["thinking"] = req["thinking"];
  if (has(req, "output_config") && req["output_config"].is_object() && req["output_config"].contains("effort"))
    oa["reasoning_effort"] = req["output_config"]["effort"];
  const bool thinking = chat_thinking(oa);
  // Sampling fields under their OpenAI names.
  OJson sp = {{"max_tokens", req["max_tokens"]}, {"skip_special_tokens", false}};
  for (const char* k : {"temperature", "top_p", "top_k", "seed"})
    if (has(req, k)) sp[k] = req[k];
  if (has(req, "stop_sequences")) sp["stop"] = req["stop_sequences"];
  Job job;
  job.stream = get_bool(req, "stream", false);
  job.params = sampling_from(sp);
  job.prompt = tokenize(ctx, render_chat(oa, ctx, thinking), false);
  apply_tool_choice(oa, job.params, ctx);
  finish_params(job.params, true, 0, job.prompt.size(), ctx);
  job.request_id = next_id("msg_");
  job.builder = std::make_unique<MessagesBuilder>(ctx, job.request_id, job.params, job.stream, thinking);
  job.builder->set_prompt_tokens(static_cast<int64_t>(job.prompt.size()));
  return job;
}

OJson models_body(const ServerContext& ctx) {
  OJson m = {{"id", ctx.served_model_name},       {"object", "model"},      {"created", ctx.created},
             {"owned_by", "deepinfer"},           {"root", ctx.model_path}, {"parent", nullptr},
             {"max_model_len", ctx.max_model_len}};
  return OJson{{"object", "list"}, {"data", OJson::array({m})}};
}

OJson tokenize_body(const std::string& body, const ServerContext& ctx) {
  OJson req = parse_body(body);
  check_model(req, ctx);
  std::vector<int32_t> ids;
  if (req.contains("messages")) {
    ids = tokenize(ctx, render_chat(req, ctx, chat_thinking(req)), false);
  } else if (req.contains("prompt") && req["prompt"].is_string()) {
    ids = tokenize(ctx, req["prompt"].get<std::string>(), get_bool(req, "add_special_tokens", true));
  } else {
    throw ApiError(400, "give 'prompt' (a string) or 'messages' (a chat)", "prompt");
  }
  OJson toks = OJson::array();
  for (int32_t id : ids) toks.push_back(id);
  return OJson{{"count", ids.size()}, {"max_model_len", ctx.max_model_len}, {"tokens", toks}};
}

OJson detokenize_body(const std::string& body, const ServerContext& ctx) {
  OJson req = parse_body(body);
  check_model(req, ctx);
  if (!req.contains("tokens") || !req["tokens"].is_array())
    throw ApiError(400, "field 'tokens' must be a list of token ids", "tokens");
  const std::vector<int32_t> ids = ids_from_json(req["tokens"], ctx, "tokens");
  if (!ctx.tokenizer) throw ApiError(400, "this server has no tokenizer");
  return OJson{{"prompt", ctx.tokenizer->decode(ids, false)}};
}

}  // namespace deepinfer::server
