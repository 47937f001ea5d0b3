// The protocol layer of `deepinfer serve`: OpenAI chat completions / completions and Anthropic
// messages requests -> (prompt ids, SamplingParams), and engine outputs -> JSON bodies or SSE
// events. No HTTP here (server.cpp owns the sockets); every function may throw ApiError, which the
// server turns into an OpenAI- (or Anthropic-) shaped error response.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "deepinfer/model_config.h"
#include "engine/request.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::server {

using OJson = nlohmann::ordered_json;

struct ApiError : std::runtime_error {
  ApiError(int status, std::string message, std::string param = "", std::string code = "", std::string type = "");
  int status;
  std::string param, code, type;
};

// OpenAI's error body {"error": {"message", "type", "param", "code"}}.
OJson openai_error_body(int status, const std::string& message, const std::string& param = "",
                        const std::string& code = "", const std::string& type = "");
// Anthropic's {"type": "error", "error": {"type", "message"}}.
OJson anthropic_error_body(int status, const std::string& message);

// JSON text of `j`; invalid UTF-8 (model text can hold any bytes) becomes U+FFFD.
std::string dump(const OJson& j);

struct ServerContext {
  std::string served_model_name;
  std::string model_path;
  const Tokenizer* tokenizer = nullptr;
  ModelFamily family = ModelFamily::kV41;
  int64_t max_model_len = 0;
  int max_n = 128;
  int64_t created = 0;  // unix time the server started (the models list's "created")
};

enum class Api { kChat, kCompletion, kMessages };

// Turns engine outputs into a response. One builder per HTTP request; not thread safe (the server
// calls it from the request's strand only).
class ResponseBuilder {
 public:
  virtual ~ResponseBuilder() = default;
  // Streaming: the SSE text sent right after the headers.
  virtual std::string stream_start() = 0;
  // Consumes a cumulative output snapshot. Streaming: returns the SSE text to send now (after the
  // final snapshot it includes the closing events). Non-streaming: returns "".
  virtual std::string on_output(const RequestOutput& out) = 0;
  // The prompt's length, known before the first output (Anthropic's message_start reports it).
  virtual void set_prompt_tokens(int64_t n) = 0;
  // Non-streaming: the response body, after the final snapshot.
  virtual OJson final_body() = 0;
  // Streaming: an error event that ends the stream.
  virtual std::string stream_error(const std::string& message) = 0;
};

struct Job {
  std::string request_id;
  std::vector<int32_t> prompt;
  // /v1/completions with several prompts: prompts 1.. (prompt 0 is `prompt`). Each runs as its own
  // engine request (`request_id`-k); the builder numbers choice j of prompt k as k * n + j.
  std::vector<std::vector<int32_t>> more_prompts;
  SamplingParams params;
  bool stream = false;
  std::unique_ptr<ResponseBuilder> builder;
};

// Parse and validate a request body; throws ApiError (400/404) on anything wrong.
Job prepare_chat(const std::string& body, const ServerContext& ctx);
Job prepare_completion(const std::string& body, const ServerContext& ctx, bool fim);
Job prepare_messages(const std::string& body, const ServerContext& ctx);

// GET /v1/models
OJson models_body(const ServerContext& ctx);
// POST /tokenize ({"prompt": text} or {"messages": [...]}), POST /detokenize ({"tokens": [...]}).
OJson tokenize_body(const std::string& body, const ServerContext& ctx);
OJson detokenize_body(const std::string& body, const ServerContext& ctx);

}  // namespace deepinfer::server
