// Streaming output parsers: goldens (tests/data/parsers/goldens.json, from tools/parsers/make_goldens.py),
// every-byte and random splits against the one-shot parse, fuzzing, and edge cases.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "tokenizer/parsers.h"

using namespace deepinfer::parsers;

namespace {

struct Result {
  std::string reasoning, content;
  std::vector<ToolCall> calls;
  bool operator==(const Result& o) const {
    if (reasoning != o.reasoning || content != o.content || calls.size() != o.calls.size()) return false;
    for (std::size_t i = 0; i < calls.size(); ++i)
      if (calls[i].index != o.calls[i].index || calls[i].id != o.calls[i].id || calls[i].name != o.calls[i].name ||
          calls[i].arguments != o.calls[i].arguments)
        return false;
    return true;
  }
};

std::ostream& operator<<(std::ostream& os, const Result& r) {
  os << "{reasoning=" << nlohmann::json(r.reasoning).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
     << " content=" << nlohmann::json(r.content).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
     << " calls=[";
  for (auto& c : r.calls) os << c.id << ":" << c.name << c.arguments << " ";
  return os << "]}";
}

void add(Result& r, ChatOutputParser::Deltas d) {
  r.reasoning += d.reasoning;
  r.content += d.content;
  for (auto& c : d.tool_calls) r.calls.push_back(std::move(c));
}

Result parse_split(Family f, bool thinking, std::string_view text, const std::vector<std::size_t>& cuts) {
  ChatOutputParser p(f, thinking);
  Result r;
  std::size_t prev = 0;
  for (std::size_t c : cuts) {
    add(r, p.feed(text.substr(prev, c - prev)));
    prev = c;
  }
  add(r, p.feed(text.substr(prev)));
  add(r, p.finish());
  return r;
}

Result parse_once(Family f, bool thinking, std::string_view text) { return parse_split(f, thinking, text, {}); }

Result parse_bytewise(Family f, bool thinking, std::string_view text) {
  ChatOutputParser p(f, thinking);
  Result r;
  for (char ch : text) add(r, p.feed(std::string_view(&ch, 1)));
  add(r, p.finish());
  return r;
}

std::vector<std::size_t> random_cuts(std::mt19937& rng, std::size_t n) {
  std::vector<std::size_t> cuts;
  if (n == 0) return cuts;
  std::size_t k = std::uniform_int_distribution<std::size_t>(1, std::min<std::size_t>(n, 12))(rng);
  for (std::size_t i = 0; i < k; ++i) cuts.push_back(std::uniform_int_distribution<std::size_t>(0, n)(rng));
  std::sort(cuts.begin(), cuts.end());
  return cuts;  // repeated cuts give empty chunks, which must be harmless too
}

struct Golden {
  std::string name;
  Family family;
  bool thinking;
  std::string text;
  Result expected;
};

std::vector<Golden> load_goldens() {
  std::ifstream in(std::string(DEEPINFER_SOURCE_DIR) + "/tests/data/parsers/goldens.json");
  EXPECT_TRUE(in.good());
  nlohmann::json j = nlohmann::json::parse(in);
  std::vector<Golden> out;
  for (auto& g : j) {
    Golden x;
    x.name = g["name"];
    x.family = g["family"] == "v4.1" ? Family::kV41 : Family::kV4;
    x.thinking = g["thinking"];
    x.text = g["text"];
    x.expected.reasoning = g["expected"]["reasoning"];
    x.expected.content = g["expected"]["content"];
    std::size_t i = 0;
    for (auto& c : g["expected"]["tool_calls"]) {
      ToolCall tc;
      tc.index = i;
      tc.id = "call_" + std::to_string(i++);
      tc.name = c["name"];
      tc.arguments = c["arguments"];
      x.expected.calls.push_back(tc);
    }
    out.push_back(std::move(x));
  }
  return out;
}

const std::vector<Golden>& goldens() {
  static const std::vector<Golden> g = load_goldens();
  return g;
}

}  // namespace

TEST(Parsers, GoldensLoaded) { EXPECT_GE(goldens().size(), 60u); }

TEST(Parsers, GoldensOneShot) {
  for (const auto& g : goldens()) {
    EXPECT_EQ(parse_once(g.family, g.thinking, g.text), g.expected) << g.name;
    // Arguments are always valid JSON objects.
    for (auto& c : g.expected.calls) EXPECT_TRUE(nlohmann::json::parse(c.arguments).is_object()) << g.name;
  }
}

TEST(Parsers, GoldensEveryByteSplit) {
  std::size_t checks = 0;
  for (const auto& g : goldens()) {
    for (std::size_t k = 0; k <= g.text.size(); ++k) {
      ASSERT_EQ(parse_split(g.family, g.thinking, g.text, {k}), g.expected) << g.name << " split at " << k;
      ++checks;
    }
    ASSERT_EQ(parse_bytewise(g.family, g.thinking, g.text), g.expected) << g.name << " byte by byte";
    // Every pair of cut points on short texts (a tag split three ways).
    if (g.text.size() <= 160)
      for (std::size_t a = 0; a <= g.text.size(); a += 3)
        for (std::size_t b = a; b <= g.text.size(); b += 2)
          ASSERT_EQ(parse_split(g.family, g.thinking, g.text, {a, b}), g.expected) << g.name << " " << a << "," << b;
  }
  EXPECT_GT(checks, 1000u);
}

TEST(Parsers, GoldensRandomSplits) {
  std::mt19937 rng(1234);
  for (const auto& g : goldens())
    for (int t = 0; t < 50; ++t) {
      auto cuts = random_cuts(rng, g.text.size());
      ASSERT_EQ(parse_split(g.family, g.thinking, g.text, cuts), g.expected) << g.name << " trial " << t;
    }
}

TEST(Parsers, ToolCallsStreamAtInvokeClose) {
  const std::string block =
      "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n"
      "<｜DSML｜parameter name=\"a\" string=\"false\">1</｜DSML｜parameter>\n</｜DSML｜invoke>";
  ToolCallParser p(Family::kV4);
  auto d = p.feed("Hi" + block);
  EXPECT_EQ(d.content, "Hi");
  ASSERT_EQ(d.tool_calls.size(), 1u);  // emitted before the block closes
  EXPECT_EQ(d.tool_calls[0].arguments, "{\"a\": 1}");
  EXPECT_TRUE(p.in_block());
  d = p.feed("\n</｜DSML｜tool_calls>");
  EXPECT_TRUE(d.tool_calls.empty());
  EXPECT_FALSE(p.in_block());
  EXPECT_TRUE(p.finish().content.empty());
}

TEST(Parsers, PartialTagNeverLeaks) {
  ReasoningParser r(true);
  auto d = r.feed("abc</th");
  EXPECT_EQ(d.reasoning, "abc");
  d = r.feed("ink>x");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "x");
  ToolCallParser t(Family::kV41);
  EXPECT_EQ(t.feed("ok\n").content, "ok");
  EXPECT_EQ(t.feed("\n<｜DSML｜ ca").content, "");
  EXPECT_EQ(t.feed("t").content, "\n\n<｜DSML｜ cat");
}

TEST(Parsers, IdGenerator) {
  const std::string text =
      "<｜DSML｜tool_calls><｜DSML｜invoke name=\"a\"></｜DSML｜invoke>"
      "<｜DSML｜invoke name=\"b\"></｜DSML｜invoke></｜DSML｜tool_calls>";
  ChatOutputParser p(Family::kV4, false, [](std::size_t i) { return "chatcmpl-x-" + std::to_string(i * 10); });
  auto d = p.feed(text);
  ASSERT_EQ(d.tool_calls.size(), 2u);
  EXPECT_EQ(d.tool_calls[0].id, "chatcmpl-x-0");
  EXPECT_EQ(d.tool_calls[1].id, "chatcmpl-x-10");
  EXPECT_EQ(d.tool_calls[1].arguments, "{}");
  ToolCallParser q(Family::kV4, [](std::size_t) -> std::string { throw std::runtime_error("boom"); });
  auto e = q.feed(text);
  ASSERT_EQ(e.tool_calls.size(), 2u);
  EXPECT_EQ(e.tool_calls[1].id, "call_1");  // a throwing generator falls back to the default
}

TEST(Parsers, InvalidUtf8) {
  const std::string bad = "a\xff\xfe b \xc3 c \xe2\x82";
  ChatOutputParser p(Family::kV4, false);
  Result r;
  add(r, p.feed(bad + "<｜DSML｜tool_calls><｜DSML｜invoke name=\"f\"><｜DSML｜parameter name=\"k\" string=\"true\">" +
                bad +
                "</｜DSML｜parameter><｜DSML｜parameter name=\"j\" string=\"false\">\"\xff\"</｜DSML｜parameter>"
                "</｜DSML｜invoke></｜DSML｜tool_calls>"));
  add(r, p.finish());
  EXPECT_EQ(r.content, bad);  // content bytes pass through verbatim
  ASSERT_EQ(r.calls.size(), 1u);
  auto args = nlohmann::json::parse(r.calls[0].arguments);  // valid UTF-8 JSON
  EXPECT_EQ(args["k"], "a\xEF\xBF\xBD\xEF\xBF\xBD b \xEF\xBF\xBD c \xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(args["j"], "\"\xEF\xBF\xBD\"");  // invalid JSON literal → string
}

TEST(Parsers, JsonQuoteMatchesPython) {
  EXPECT_EQ(json_quote("a\"b\\c\n\r\t\b\f\x01\x1f\x7f é 中"), "\"a\\\"b\\\\c\\n\\r\\t\\b\\f\\u0001\\u001f\x7f é 中\"");
  EXPECT_EQ(json_quote(""), "\"\"");
}

TEST(Parsers, Utf8Carry) {
  const std::string s = "a中b😀c";
  for (std::size_t k = 0; k <= s.size(); ++k) {
    Utf8Carry u;
    std::string a = u.push(s.substr(0, k));
    std::string b = u.push(s.substr(k));
    std::string c = u.finish();
    EXPECT_EQ(a + b + c, s);
    EXPECT_TRUE(nlohmann::json::accept(nlohmann::json(a).dump())) << k;
    EXPECT_TRUE(c.empty());
  }
  Utf8Carry u;
  EXPECT_EQ(u.push("x\xe4\xb8"), "x");
  EXPECT_EQ(u.finish(), "\xe4\xb8");
  EXPECT_EQ(u.push("\xff"), "\xff");
}

TEST(Parsers, FuzzRandomBytes) {
  std::mt19937 rng(42);
  const std::vector<std::string> pieces = {"<think>",
                                           "</think>",
                                           "<｜DSML｜tool_calls>",
                                           "</｜DSML｜tool_calls>",
                                           "<｜DSML｜ calls>",
                                           "<｜DSML｜invoke name=\"f\">",
                                           "</｜DSML｜invoke>",
                                           "<｜DSML｜parameter name=\"k\" string=\"true\">",
                                           "<｜DSML｜ parameter name=\"k\" string=\"false\">",
                                           "</｜DSML｜parameter>",
                                           "</｜DSML｜ parameter>",
                                           "<｜DSML｜ invoke name=\"g\">",
                                           "\n\n",
                                           "<",
                                           "\"",
                                           "<｜end▁of▁sentence｜>",
                                           "｜DSML｜",
                                           "[1,",
                                           "{\"a\":",
                                           "\xff",
                                           "\xe4\xb8"};
  for (int t = 0; t < 3000; ++t) {
    std::string text;
    int n = std::uniform_int_distribution<int>(0, 40)(rng);
    for (int i = 0; i < n; ++i) {
      if (rng() % 3 == 0) {
        text += pieces[rng() % pieces.size()];
      } else {
        int m = rng() % 6;
        for (int k = 0; k < m; ++k) text.push_back(static_cast<char>(rng() & 0xff));
      }
    }
    for (Family f : {Family::kV4, Family::kV41})
      for (bool thinking : {false, true}) {
        Result once = parse_once(f, thinking, text);
        for (auto& c : once.calls) ASSERT_TRUE(nlohmann::json::accept(c.arguments)) << c.arguments;
        auto cuts = random_cuts(rng, text.size());
        ASSERT_EQ(parse_split(f, thinking, text, cuts), once) << "trial " << t;
        if (t % 10 == 0) ASSERT_EQ(parse_bytewise(f, thinking, text), once) << "trial " << t;
      }
  }
}

TEST(Parsers, FuzzNoMarkupIsPreserved) {
  std::mt19937 rng(7);
  for (int t = 0; t < 2000; ++t) {
    std::string text(rng() % 300, '\0');
    for (auto& c : text) {
      c = static_cast<char>(rng() & 0xff);
      if (c == '<') c = '>';
    }
    auto cuts = random_cuts(rng, text.size());
    Result chat = parse_split(t % 2 ? Family::kV4 : Family::kV41, false, text, cuts);
    ASSERT_EQ(chat.content, text);
    ASSERT_TRUE(chat.reasoning.empty() && chat.calls.empty());
    Result think = parse_split(Family::kV4, true, text, cuts);
    ASSERT_EQ(think.reasoning, text);
    ASSERT_TRUE(think.content.empty());
  }
}

TEST(Parsers, HugeInputs) {
  auto t0 = std::chrono::steady_clock::now();
  std::string big(8 << 20, 'x');
  for (std::size_t i = 0; i < big.size(); i += 97) big[i] = '<';  // many marker-like starts
  ChatOutputParser p(Family::kV4, false);
  Result r;
  for (std::size_t i = 0; i < big.size(); i += 4096) add(r, p.feed(std::string_view(big).substr(i, 4096)));
  add(r, p.finish());
  EXPECT_EQ(r.content, big);

  // A 4 MiB parameter value streamed in 64-byte chunks, and a very deep JSON literal.
  std::string value(4 << 20, 'v');
  std::string deep = std::string(200000, '[') + std::string(200000, ']');
  std::string text = "<｜DSML｜tool_calls><｜DSML｜invoke name=\"f\"><｜DSML｜parameter name=\"k\" string=\"true\">" +
                     value + "</｜DSML｜parameter><｜DSML｜parameter name=\"d\" string=\"false\">" + deep +
                     "</｜DSML｜parameter></｜DSML｜invoke></｜DSML｜tool_calls>";
  ToolCallParser q(Family::kV4);
  std::vector<ToolCall> calls;
  for (std::size_t i = 0; i < text.size(); i += 64)
    for (auto& c : q.feed(std::string_view(text).substr(i, 64)).tool_calls) calls.push_back(c);
  EXPECT_TRUE(q.finish().content.empty());
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].arguments.size(), value.size() + deep.size() + 16);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 20.0);
}

TEST(Parsers, UnclosedHugeHeaderDegrades) {
  std::string text = "<｜DSML｜tool_calls><｜DSML｜invoke name=\"" + std::string(10000, 'n');
  ToolCallParser q(Family::kV4);
  std::string content = q.feed(text).content;
  EXPECT_FALSE(content.empty());  // over 4 KiB without '>': abandoned without waiting for finish
  content += q.finish().content;
  EXPECT_EQ(content, text);
}

TEST(Parsers, FeedAfterFinishIsHarmless) {
  ChatOutputParser p(Family::kV41, true);
  auto a = p.feed("r</think>c");
  auto b = p.finish();
  EXPECT_EQ(a.reasoning + b.reasoning, "r");
  EXPECT_EQ(a.content + b.content, "c");
  EXPECT_NO_THROW(p.feed("more"));
  EXPECT_NO_THROW(p.finish());
}
