// `deepinfer chat`: an interactive chat over EngineCore. Reads one user message per stdin line
// (EOF or "/exit" ends), renders the conversation with the family's prompt encoder, streams the
// reply as it is generated: reasoning to stderr ("[thinking] " lines), content to stdout, tool calls
// as JSON lines on stdout. The assistant turn (with reasoning_content) joins the history.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "cli/commands.h"
#include "deepinfer/error.h"
#include "engine/engine_core.h"
#include "tokenizer/encoding.h"
#include "tokenizer/parsers.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::cli {

namespace {

// Writes reasoning text to stderr with "[thinking] " at the start of every line.
struct ThinkingPrinter {
  bool line_start = true;
  bool any = false;
  void write(const std::string& s) {
    for (char c : s) {
      if (line_start) std::fputs("[thinking] ", stderr);
      std::fputc(c, stderr);
      line_start = c == '\n';
      any = true;
    }
    std::fflush(stderr);
  }
  void end() {
    if (any && !line_start) std::fputc('\n', stderr);
    std::fflush(stderr);
  }
};

std::string trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && (s[a] == ' ' || s[a] == '\t' || s[a] == '\r' || s[a] == '\n')) ++a;
  while (b > a && (s[b - 1] == ' ' || s[b - 1] == '\t' || s[b - 1] == '\r' || s[b - 1] == '\n')) --b;
  return s.substr(a, b - a);
}

}  // namespace

Runner add_chat(CLI::App& app) {
  struct Opts {
    std::string model, reasoning_effort, system;
    bool thinking = false;
    int max_tokens = 256;
    float temperature = 1.0f, top_p = 1.0f;
    EngineFlags eng;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("chat", "interactive chat: one user message per stdin line (EOF or /exit ends)");
  cmd->add_option("--model", o->model, "model directory (with tokenizer.json)")->required();
  cmd->add_flag("--thinking", o->thinking, "thinking mode: reasoning goes to stderr as [thinking] lines");
  cmd->add_option("--reasoning-effort", o->reasoning_effort, "reasoning effort (V4: high | max)");
  cmd->add_option("--system", o->system, "system message");
  cmd->add_option("--max-tokens", o->max_tokens, "most tokens per reply")->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--temperature", o->temperature, "sampling temperature (0: greedy)")->check(CLI::Range(0.0f, 100.0f));
  cmd->add_option("--top-p", o->top_p, "nucleus sampling")->check(CLI::Range(0.0f, 1.0f));
  o->eng.add(cmd);
  return [o] {
    const std::string tok_json = (std::filesystem::path(o->model) / "tokenizer.json").string();
    DI_CHECK(std::filesystem::is_regular_file(tok_json),
             "chat needs a tokenizer: {} does not exist (the model directory must hold tokenizer.json)", tok_json);
    EngineArgs args = o->eng.args(o->model);
    if (args.max_model_len == 0) {
      // A chat does not need the config's (possibly 1M-token) context: cap the default.
      const int64_t cfg_len = read_max_position_embeddings(o->model);
      args.max_model_len = cfg_len > 0 ? std::min<int64_t>(cfg_len, 16384) : 16384;
    }
    EngineCore engine(args);
    const Tokenizer* tok = engine.tokenizer();
    DI_CHECK(tok != nullptr, "chat needs a tokenizer in {}", o->model);
    const bool v41 = engine.config().family == ModelFamily::kV41;

    EncodeOptions enc;
    enc.family = v41 ? EncodingFamily::kV41 : EncodingFamily::kV4;
    enc.thinking = o->thinking;
    if (!o->reasoning_effort.empty()) enc.reasoning_effort = o->reasoning_effort;

    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    if (!o->system.empty()) messages.push_back({{"role", "system"}, {"content", o->system}});
    const bool tty = isatty(STDIN_FILENO) != 0;
    std::string line;
    int turn = 0;
    while (true) {
      if (tty) {
        std::fputs("> ", stderr);
        std::fflush(stderr);
      }
      if (!std::getline(std::cin, line)) break;
      const std::string user = trim(line);
      if (user == "/exit") break;
      if (user.empty()) continue;
      messages.push_back({{"role", "user"}, {"content", user}});
      const std::vector<int32_t> prompt = tok->encode(encode_messages(messages, enc), false);

      SamplingParams sp;
      sp.max_tokens = o->max_tokens;
      sp.temperature = o->temperature;
      sp.top_p = o->top_p;
      sp.seed = o->eng.seed + static_cast<uint64_t>(turn);
      sp.skip_special_tokens = false;
      const std::string id = "chat-" + std::to_string(turn++);
      engine.add_request(id, prompt, sp);

      IncrementalDetokenizer detok(*tok, false);
      parsers::ChatOutputParser parser(v41 ? parsers::Family::kV41 : parsers::Family::kV4, o->thinking);
      ThinkingPrinter think;
      std::string reasoning, content;
      nlohmann::ordered_json tool_calls = nlohmann::ordered_json::array();
      auto emit = [&](const parsers::ChatOutputParser::Deltas& d) {
        if (!d.reasoning.empty()) {
          think.write(d.reasoning);
          reasoning += d.reasoning;
        }
        if (!d.content.empty()) {
          if (think.any) think.end();
          std::fwrite(d.content.data(), 1, d.content.size(), stdout);
          content += d.content;
        }
        for (const parsers::ToolCall& c : d.tool_calls) {
          nlohmann::ordered_json j = {{"id", c.id}, {"name", c.name}, {"arguments", c.arguments}};
          std::printf("%s\n", j.dump().c_str());
          tool_calls.push_back(
              {{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
        }
        std::fflush(stdout);
      };
      size_t seen = 0;
      bool finished = false;
      std::string finish_reason;
      while (!finished && engine.has_unfinished()) {
        for (const RequestOutput& r : engine.step()) {
          if (r.request_id != id || r.outputs.empty()) continue;
          DI_CHECK(!r.error.has_value(), "chat: request rejected: {}", r.error.value_or(""));
          const CompletionOutput& c = r.outputs[0];
          for (; seen < c.token_ids.size(); ++seen) emit(parser.feed(detok.push(c.token_ids[seen])));
          if (r.finished) {
            finished = true;
            finish_reason = c.finish_reason.value_or("");
          }
        }
      }
      emit(parser.feed(detok.flush()));
      emit(parser.finish());
      think.end();
      std::fputc('\n', stdout);
      std::fflush(stdout);
      if (finish_reason == "length") std::fprintf(stderr, "[reply cut at --max-tokens %d]\n", o->max_tokens);

      nlohmann::ordered_json reply = {{"role", "assistant"}, {"content", content}};
      if (!reasoning.empty()) reply["reasoning_content"] = reasoning;
      if (!tool_calls.empty()) reply["tool_calls"] = tool_calls;
      messages.push_back(std::move(reply));
    }
    return 0;
  };
}

}  // namespace deepinfer::cli
