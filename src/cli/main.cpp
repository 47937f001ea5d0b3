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
  } catch (const deepinfer::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
