// The HTTP server of `deepinfer serve` (Boost.Beast/Asio): OpenAI-compatible /v1/chat/completions,
// /v1/completions, /v1/models; Anthropic-compatible /v1/messages; /health, /metrics, /tokenize,
// /detokenize, /beta/completions (FIM). Every route also answers without the /v1 prefix.
//
// Threads: one engine thread (AsyncEngine) steps the EngineCore; `http_threads` threads run the
// io_context. Each connection is a Session on its own strand; an engine output is posted to its
// session, which turns it into a JSON body or SSE events (chunked transfer encoding, keep-alive kept).
// A client that goes away aborts its request. SIGINT/SIGTERM: stop accepting, finish the requests in
// flight (at most `drain_timeout_s`), then return 0.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/engine_core.h"
#include "server/api.h"

namespace deepinfer::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;  // empty: no authentication
  uint64_t max_body_bytes = uint64_t{64} << 20;
  int http_threads = 2;
  double drain_timeout_s = 60.0;
  double header_timeout_s = 30.0;      // idle keep-alive wait + request line + headers; then the connection is closed
  int64_t max_queued_requests = 1024;  // requests admitted and unfinished; more get 429
};

// Serves until SIGINT/SIGTERM; returns the process exit code. Throws deepinfer::Error when the
// address cannot be bound.
int run_server(std::unique_ptr<EngineCore> engine, ServerContext ctx, const ServerOptions& opts);

}  // namespace deepinfer::server
