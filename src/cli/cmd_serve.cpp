// `deepinfer serve`: the OpenAI- and Anthropic-compatible HTTP server (src/server).
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>

#include "cli/commands.h"
#include "deepinfer/error.h"
#include "engine/engine_core.h"
#include "server/server.h"

namespace deepinfer::cli {

Runner add_serve(CLI::App& app) {
  struct Opts {
    std::string model, served_model_name;
    server::ServerOptions srv;
    int max_n = 128;
    EngineFlags eng;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("serve", "OpenAI- and Anthropic-compatible HTTP server");
  cmd->add_option("--model", o->model, "model directory (config.json, safetensors, tokenizer.json)")->required();
  cmd->add_option("--host", o->srv.host, "address to listen on")->capture_default_str();
  cmd->add_option("--port", o->srv.port, "TCP port (0: any free port)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  cmd->add_option("--api-key", o->srv.api_key, "require 'Authorization: Bearer KEY' (or 'x-api-key: KEY')");
  cmd->add_option("--served-model-name", o->served_model_name, "model name in the API (default: the directory name)");
  cmd->add_option("--max-request-body", o->srv.max_body_bytes,
                  "largest request body in bytes (413 beyond; suffixes K, M, G)")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  cmd->add_option("--http-threads", o->srv.http_threads, "threads serving HTTP I/O")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  cmd->add_option("--max-n", o->max_n, "largest n (choices per request)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->add_option("--max-queued-requests", o->srv.max_queued_requests,
                  "requests admitted and not finished (running + waiting); more are answered 429")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--drain-timeout", o->srv.drain_timeout_s, "seconds to finish in-flight requests on SIGTERM/SIGINT")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--header-timeout", o->srv.header_timeout_s,
                  "seconds a connection may idle or take to send a request's headers before it is closed")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  o->eng.add(cmd);
  return [o] {
    const std::filesystem::path dir(o->model);
    DI_CHECK(std::filesystem::is_regular_file(dir / "tokenizer.json"),
             "serve needs a tokenizer: {} does not exist (the model directory must hold tokenizer.json)",
             (dir / "tokenizer.json").string());
    EngineArgs args = o->eng.args(o->model);
    if (args.max_model_len == 0) {
      // As `chat`: do not size the default context after a (possibly 1M-token) config; --max-model-len raises it.
      const int64_t cfg_len = read_max_position_embeddings(o->model);
      args.max_model_len = cfg_len > 0 ? std::min<int64_t>(cfg_len, 16384) : 16384;
    }
    auto engine = std::make_unique<EngineCore>(args);
    DI_CHECK(engine->tokenizer() != nullptr, "serve needs a tokenizer in {}", o->model);
    server::ServerContext ctx;
    std::string name = o->served_model_name;
    if (name.empty()) name = std::filesystem::absolute(dir).lexically_normal().filename().string();
    if (name.empty()) name = std::filesystem::absolute(dir).lexically_normal().parent_path().filename().string();
    ctx.served_model_name = name;
    ctx.model_path = o->model;
    ctx.tokenizer = engine->tokenizer();
    ctx.family = engine->config().family;
    ctx.max_model_len = engine->max_model_len();
    ctx.max_n = o->max_n;
    ctx.created =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    return server::run_server(std::move(engine), std::move(ctx), o->srv);
  };
}

}  // namespace deepinfer::cli
