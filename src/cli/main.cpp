// The `deepinfer` binary: one subcommand per task.
#include <cstdio>

#include "cli/commands.h"
#include "core/env.h"
#include "deepinfer/error.h"

int main(int argc, char** argv) {
  CLI::App app{"deepinfer: DeepSeek-V4 family inference engine"};
  app.require_subcommand(1);
  auto logits = deepinfer::cli::add_logits(app);
  auto generate = deepinfer::cli::add_generate(app);
  auto bench = deepinfer::cli::add_bench(app);
  auto perplexity = deepinfer::cli::add_perplexity(app);
  auto chat = deepinfer::cli::add_chat(app);
  auto serve = deepinfer::cli::add_serve(app);
  app.add_subcommand("env", "list the DEEPINFER_* environment variables and what this build supports");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  deepinfer::check_env();
  try {
    if (app.got_subcommand("env")) {
      std::fputs(deepinfer::env_table().c_str(), stdout);
      return 0;
    }
    if (app.got_subcommand("logits")) return logits();
    if (app.got_subcommand("generate")) return generate();
    if (app.got_subcommand("bench")) return bench();
    if (app.got_subcommand("perplexity")) return perplexity();
    if (app.got_subcommand("chat")) return chat();
    if (app.got_subcommand("serve")) return serve();
  } catch (const deepinfer::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
