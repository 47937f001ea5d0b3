// Structured outputs: grammar core, EBNF / regex / JSON Schema front ends, the token matcher.
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <regex>

#include "deepinfer/error.h"
#include "structured/structured.h"
#include "structured/token_matcher.h"
#include "structured_test_util.h"
#include "tokenizer/tokenizer.h"

using namespace deepinfer;
using namespace deepinfer::structured;
using deepinfer::structured::test_util::error_of;
using deepinfer::structured::test_util::M;
using nlohmann::json;

TEST(StructuredEbnf, BasicsAndQuantifiers) {
  Grammar g = ebnf_grammar(R"(
    # a comment
    root ::= "a" b* ("x" | 'y')? c{2,3} [0-9]+
    b ::= [bB]
    c ::= "c"
  )");
  EXPECT_TRUE(M(g, "acc1"));
  EXPECT_TRUE(M(g, "abBbxccc42"));
  EXPECT_FALSE(M(g, "acccc1"));
  EXPECT_FALSE(M(g, "ac1"));
  EXPECT_FALSE(M(g, "abcc"));
  EXPECT_FALSE(M(g, "axycc1"));
}

TEST(StructuredEbnf, EscapesUnicodeAndNegation) {
  Grammar g = ebnf_grammar(R"(root ::= "\"" [^"\\\n]* "\"" "\u00e9" [\u4e00-\u9fff]{1,2})");
  EXPECT_TRUE(M(g, "\"hi there\"é中"));
  EXPECT_TRUE(M(g, "\"ü€\"é中文"));
  EXPECT_FALSE(M(g, "\"a\"b\"é中"));
  EXPECT_FALSE(M(g, "\"\"éa"));
  Grammar any = ebnf_grammar("root ::= .{3}");
  EXPECT_TRUE(M(any, "a😀b"));
  EXPECT_FALSE(M(any, "ab"));
}

TEST(StructuredEbnf, Recursion) {
  Grammar g = ebnf_grammar(R"g(root ::= "(" root ")" | "")g");
  EXPECT_TRUE(M(g, ""));
  EXPECT_TRUE(M(g, "((()))"));
  EXPECT_FALSE(M(g, "(()"));
  // Right recursion and nullable repetition are fine.
  Grammar r = ebnf_grammar(R"(root ::= "a" root | "b"
  x ::= ("a"?)*)");
  EXPECT_TRUE(M(r, "aaab"));
}

TEST(StructuredEbnf, Errors) {
  EXPECT_NE(error_of([] { ebnf_grammar("root ::= foo"); }).find("'foo' is used but never defined"), std::string::npos);
  EXPECT_NE(error_of([] { ebnf_grammar("root ::= \"abc"); }).find("unterminated string literal at line 1"),
            std::string::npos);
  EXPECT_NE(error_of([] { ebnf_grammar("x ::= \"a\""); }).find("no 'root' rule"), std::string::npos);
  EXPECT_NE(error_of([] { ebnf_grammar("root ::= root \"a\" | \"b\""); }).find("left-recursive"), std::string::npos);
  EXPECT_NE(error_of([] { ebnf_grammar("root ::= \"a\"{1000000}"); }).find("exceeds the limit"), std::string::npos);
  EXPECT_NE(error_of([] { ebnf_grammar("root ::= \"a\"\n\nroot ::= \"b\""); }).find("defined twice at line 3"),
            std::string::npos);
  EXPECT_NE(error_of([] { ebnf_grammar("root ::= [z-a]"); }).find("bad character range"), std::string::npos);
  GrammarLimits small;
  small.max_elements = 100;
  EXPECT_NE(error_of([&] { ebnf_grammar("root ::= (\"abc\"{100}){100}", "root", small); }).find("too large"),
            std::string::npos);
}

TEST(StructuredRegex, AgainstStdRegex) {
  const std::vector<std::string> patterns = {"abc",
                                             "a|b|cd",
                                             "a*b+c?",
                                             "[a-c]{2,3}x",
                                             "(ab|cd){1,2}",
                                             "\\d{3}-\\d{4}",
                                             "[^a-z]+",
                                             "a.c",
                                             "(?:x|y)*z",
                                             "\\w+@\\w+\\.com",
                                             "[+-]?(0|[1-9][0-9]*)(\\.[0-9]+)?",
                                             "^ab$",
                                             "a{2}b{0,1}c{1,}",
                                             "\\s?\\S\\D\\W"};
  const std::vector<std::string> inputs = {
      "",      "abc",  "a",    "cd",    "b",    "aab",         "bbc",         "abcx",  "acx",
      "abcdx", "ab",   "abcd", "cdcd",  "abab", "123-4567",    "12-4567",     "ABC",   "abc1",
      "a-c",   "a\nc", "z",    "xyxz",  "w",    "me@site.com", "me@site.org", "-12.5", "0",
      "01",    "3.",   "+7",   "aabcc", "aac",  "aab",         " a1_",        "xa-!",  "aa"};
  for (const std::string& p : patterns) {
    Grammar g = regex_grammar(p);
    std::regex re(p, std::regex::ECMAScript);
    for (const std::string& s : inputs)
      EXPECT_EQ(M(g, s), std::regex_match(s, re)) << "pattern " << p << " input '" << s << "'";
  }
}

TEST(StructuredRegex, Errors) {
  EXPECT_NE(error_of([] { regex_grammar("(ab"); }).find("missing ')'"), std::string::npos);
  EXPECT_NE(error_of([] { regex_grammar("ab)"); }).find("unbalanced ')' at position 2"), std::string::npos);
  EXPECT_NE(error_of([] { regex_grammar("*a"); }).find("nothing to repeat at position 0"), std::string::npos);
  EXPECT_NE(error_of([] { regex_grammar("(a)\\1"); }).find("backreferences"), std::string::npos);
  EXPECT_NE(error_of([] { regex_grammar("(?=a)"); }).find("lookaround"), std::string::npos);
  EXPECT_NE(error_of([] { regex_grammar("[abc"); }).find("unterminated character class"), std::string::npos);
  EXPECT_NE(error_of([] { regex_grammar("a{5,2}"); }).find("min > max"), std::string::npos);
  EXPECT_NE(error_of([] { regex_grammar("a{99999}"); }).find("exceeds the limit"), std::string::npos);
}

TEST(StructuredChoice, OneOfN) {
  Grammar g = choice_grammar({"yes", "no", "maybe", "yes!"});
  EXPECT_TRUE(M(g, "yes"));
  EXPECT_TRUE(M(g, "yes!"));
  EXPECT_FALSE(M(g, "ye"));
  EXPECT_FALSE(M(g, "nope"));
}

struct SchemaCase {
  const char* schema;
  std::vector<const char*> accept, reject;
};

TEST(StructuredJsonSchema, AcceptReject) {
  const std::vector<SchemaCase> cases = {
      {R"({"type":"string"})", {R"("")", R"("a\"b\\c\u00e9\n")", "\"é中\""}, {"\"a", "1", R"("a"b")", "\"\x01\""}},
      {R"({"type":"integer"})", {"0", "-5", "1234"}, {"01", "-0x", "1.5", "+1", ""}},
      {R"({"type":"number"})", {"0", "-1.25", "3e10", "2.5E-3"}, {"1.", ".5", "--1", "1e"}},
      {R"({"type":"boolean"})", {"true", "false"}, {"True", "1"}},
      {R"({"type":"null"})", {"null"}, {"nil"}},
      {R"({"type":["integer","null"]})", {"5", "null"}, {"\"5\""}},
      {R"({"enum":["a",1,null,{"k":[true]}]})", {"\"a\"", "1", "null", R"({"k":[true]})"}, {"\"b\"", "2"}},
      {R"({"const":"x"})", {"\"x\""}, {"\"y\""}},
      {R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"}},"required":["b"]})",
       {R"({"a":1,"b":"x"})", R"({"b":"x"})"},
       {R"({"a":1})", R"({"b":"x","a":1})", R"({"b":"x","c":1})", "{}"}},
      {R"({"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":{"type":"boolean"}})",
       {"{}", R"({"a":1,"zz":true})", R"({"q":false})"},
       {R"({"q":1})"}},
      {R"({"type":"object","properties":{"x":{"type":"integer"},"y":{"type":"integer"}}})",
       {"{}", R"({"x":1})", R"({"y":2})", R"({"x":1,"y":2})"},
       {R"({,"y":2})", R"({"x":1,})"}},
      {R"({"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":3})",
       {"[1,2]", "[1,2,3]"},
       {"[]", "[1]", "[1,2,3,4]", "[1,]"}},
      {R"({"type":"array","prefixItems":[{"type":"string"},{"type":"integer"}],"items":false})",
       {"[]", R"(["a"])", R"(["a",1])"},
       {R"(["a",1,2])", "[1]"}},
      {R"({"type":"array"})", {"[]", R"([1,"a",{"b":null},[true]])"}, {"[1,]"}},
      {R"({"type":"string","minLength":2,"maxLength":3})", {"\"ab\"", "\"abc\"", R"("\n\t")"}, {"\"a\"", "\"abcd\""}},
      {R"({"type":"string","pattern":"^[A-Z]{2}\\d+$"})", {"\"AB1\"", "\"ZZ123\""}, {"\"A1\"", "\"AB\""}},
      {R"({"type":"string","pattern":"a\"b"})", {R"("a\"b")"}, {R"("a"b")"}},
      {R"({"type":"string","format":"date"})", {"\"2024-02-29\""}, {"\"2024-13-01\"", "\"24-01-01\""}},
      {R"({"type":"string","format":"uuid"})", {"\"123e4567-e89b-12d3-a456-426614174000\""}, {"\"123\""}},
      {R"({"type":"string","format":"ipv4"})", {"\"192.168.0.1\""}, {"\"256.1.1.1\"", "\"1.2.3\""}},
      {R"({"type":"string","format":"date-time"})",
       {"\"2024-01-02T03:04:05Z\"", "\"2024-01-02T03:04:05.123+01:00\""},
       {"\"2024-01-02 03:04:05\""}},
      {R"({"type":"integer","minimum":-12,"maximum":305})",
       {"-12", "-1", "0", "9", "10", "99", "100", "305", "299"},
       {"-13", "306", "310", "1000", "-0"}},
      {R"({"type":"integer","exclusiveMinimum":0,"exclusiveMaximum":10})", {"1", "9"}, {"0", "10", "-1"}},
      {R"({"type":"integer","minimum":7})", {"7", "8", "10", "123456789012"}, {"6", "0", "-7"}},
      {R"({"type":"integer","maximum":-3})", {"-3", "-4", "-100"}, {"-2", "0", "5"}},
      {R"({"type":"number","minimum":0,"maximum":1})", {"0", "1", "0.5", "0.001"}, {"-0.5", "1.5", "2", "-1"}},
      {R"({"type":"number","minimum":-90,"maximum":90})",
       {"-90", "-89.99", "0", "45.5", "90"},
       {"-90.5", "90.1", "91"}},
      {R"({"type":"number","exclusiveMinimum":0})", {"0.1", "5", "1.5"}, {"0", "-1"}},
      {R"({"anyOf":[{"type":"integer"},{"type":"string","maxLength":1}]})", {"3", "\"a\""}, {"\"ab\"", "true"}},
      {R"({"allOf":[{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]},
                   {"properties":{"b":{"type":"boolean"}},"required":["b"]}]})",
       {R"({"a":1,"b":true})"},
       {R"({"a":1})", R"({"b":true})"}},
      {R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},"next":{"anyOf":[{"$ref":"#/$defs/node"},{"type":"null"}]}},"required":["v","next"]}},"$ref":"#/$defs/node"})",
       {R"({"v":1,"next":null})", R"({"v":1,"next":{"v":2,"next":{"v":3,"next":null}}})"},
       {R"({"v":1,"next":{"v":2}})"}},
      {R"({"type":"object","properties":{"children":{"type":"array","items":{"$ref":"#"}}},"required":["children"]})",
       {R"({"children":[]})", R"({"children":[{"children":[]},{"children":[{"children":[]}]}]})"},
       {R"({"children":[{}]})"}},
      {R"({})", {"1", "\"x\"", "[]", "{\"a\":[1,{}]}"}, {"", "[1,]"}},
  };
  for (const SchemaCase& c : cases) {
    Grammar g = json_schema_grammar(nlohmann::ordered_json::parse(c.schema));
    for (const char* a : c.accept) EXPECT_TRUE(M(g, a)) << c.schema << " should accept " << a;
    for (const char* r : c.reject) EXPECT_FALSE(M(g, r)) << c.schema << " should reject " << r;
  }
}

TEST(StructuredJsonSchema, FlexibleWhitespaceAndJsonObject) {
  JsonOptions o;
  o.flexible_whitespace = true;
  Grammar g =
      json_schema_grammar(json::parse(R"({"type":"object","properties":{"a":{"type":"array"}},"required":["a"]})"), o);
  EXPECT_TRUE(M(g, "{ \"a\" : [ 1 , 2 ] }"));
  Grammar obj = json_object_grammar();
  EXPECT_TRUE(M(obj, R"({"a":[1,2.5,"x"],"b":{}})"));
  EXPECT_FALSE(M(obj, "[1]"));
  EXPECT_FALSE(M(obj, "\"x\""));
}

TEST(StructuredJsonSchema, Errors) {
  auto e = [](const char* s) { return error_of([&] { json_schema_grammar(json::parse(s)); }); };
  EXPECT_NE(
      e(R"({"type":"object","properties":{"a":{"not":{}}}})").find("keyword 'not' is not supported at $.properties.a"),
      std::string::npos);
  EXPECT_NE(e(R"({"$ref":"#/$defs/missing"})").find("does not resolve"), std::string::npos);
  EXPECT_NE(e(R"({"type":"strng"})").find("unknown type 'strng'"), std::string::npos);
  EXPECT_NE(e(R"({"type":"string","pattern":"(a"})").find("$.pattern"), std::string::npos);
  EXPECT_NE(e(R"({"type":"integer","minimum":5,"maximum":1})").find("leave no value"), std::string::npos);
  EXPECT_NE(e(R"({"type":"array","uniqueItems":true})").find("uniqueItems"), std::string::npos);
  EXPECT_NE(e(R"({"allOf":[{"type":"string"},{"type":"integer"}]})").find("cannot merge"), std::string::npos);
  EXPECT_NE(e(R"({"type":"string","minLength":100000})").find("limit"), std::string::npos);
  EXPECT_NE(error_of([] {
              compile_so_args(json{{"type", "regex"}, {"value", 5}});
            }).find("must be a string"),
            std::string::npos);
  EXPECT_NE(error_of([] { compile_so_args(json{{"type", "xml"}}); }).find("unknown type 'xml'"), std::string::npos);
}

namespace {
// A byte-level vocabulary: 0 BOS (special), 1 EOS, 2 a special, then all 256 single bytes and some merges.
std::shared_ptr<const TokenVocab> small_vocab() {
  std::vector<std::string> t = {"<s>", "</s>", "<think>"};
  for (int b = 0; b < 256; ++b) t.push_back(std::string(1, static_cast<char>(b)));
  for (const char* m : {"{\"", "\":", "\"}", "true", "false", "null", "12", "ab", "abc", "\",\"", "}", "  ", "xyz"})
    t.push_back(m);
  return std::make_shared<TokenVocab>(t, std::vector<int32_t>{0, 2}, 1);
}
int32_t id_of(const TokenVocab& v, const std::string& s) {
  for (int32_t i = 3; i < v.size(); ++i)
    if (v.bytes(i) == s) return i;
  return -1;
}
bool allowed(const std::vector<uint32_t>& m, int32_t id) { return (m[static_cast<size_t>(id) >> 5] >> (id & 31)) & 1; }
}  // namespace

TEST(StructuredTokenMatcher, MaskMatchesBruteForce) {
  auto v = small_vocab();
  for (const char* schema :
       {R"({"type":"object","properties":{"a":{"type":"boolean"},"b":{"type":"string"}},"required":["a"]})",
        R"({"type":"array","items":{"type":"integer"}})"}) {
    auto g = std::make_shared<const Grammar>(json_schema_grammar(json::parse(schema)));
    auto cg = std::make_shared<CompiledGrammar>(g, v);
    GrammarMatcher m(cg);
    PdaMatcher ref(g);
    std::string text;
    // Walk a few greedy steps: at each one, the mask must equal "prefix + token is a viable prefix".
    for (int step = 0; step < 12 && !m.is_terminated(); ++step) {
      const std::vector<uint32_t> mask = m.next_token_bitmask();
      int32_t pick = -1;
      for (int32_t id = 0; id < v->size(); ++id) {
        bool want;
        if (id == 1) {
          MatchState s = ref.initial();
          want = ref.advance_bytes(s, text) && s.accepting;
        } else if (v->is_special(id)) {
          want = false;
        } else {
          MatchState s = ref.initial();
          want = ref.advance_bytes(s, text + v->bytes(id));
        }
        ASSERT_EQ(allowed(mask, id), want) << "step " << step << " token " << id << " '" << v->bytes(id) << "'";
        if (want && (pick < 0 || v->bytes(id).size() > v->bytes(pick).size())) pick = id;
      }
      ASSERT_GE(pick, 0);
      ASSERT_TRUE(m.accept_token(pick));
      if (pick != 1) text += v->bytes(pick);
    }
  }
}

TEST(StructuredTokenMatcher, AcceptRollbackEosAndForced) {
  auto v = small_vocab();
  auto g = std::make_shared<const Grammar>(regex_grammar("abc(d|xyz)"));
  GrammarMatcher m(std::make_shared<CompiledGrammar>(g, v));
  EXPECT_EQ(m.forced_bytes(), "abc");
  EXPECT_FALSE(m.accept_token(1));  // EOS not allowed yet
  EXPECT_FALSE(m.accept_token(0));  // specials never
  EXPECT_TRUE(m.accept_token(id_of(*v, "ab")));
  EXPECT_FALSE(m.accept_token(id_of(*v, "d")));
  EXPECT_TRUE(m.accept_token(id_of(*v, "c")));
  EXPECT_FALSE(m.is_completed());
  EXPECT_TRUE(m.accept_token(id_of(*v, "xyz")));
  EXPECT_TRUE(m.is_completed());
  const auto& mask = m.next_token_bitmask();
  int n = 0;
  for (int32_t id = 0; id < v->size(); ++id) n += allowed(mask, id);
  EXPECT_EQ(n, 1);  // only EOS: forced
  EXPECT_TRUE(allowed(mask, 1));
  EXPECT_EQ(m.num_accepted(), 3);
  m.rollback(1);
  EXPECT_FALSE(m.is_completed());
  EXPECT_TRUE(m.accept_token(id_of(*v, "d")));
  EXPECT_TRUE(m.accept_token(1));
  EXPECT_TRUE(m.is_terminated());
  m.rollback(2);
  EXPECT_EQ(m.num_accepted(), 2);
  EXPECT_FALSE(m.is_terminated());
  EXPECT_THROW(m.rollback(3), Error);
}

TEST(StructuredTokenMatcher, CacheHitsInsideStrings) {
  auto v = small_vocab();
  auto cg = std::make_shared<CompiledGrammar>(
      std::make_shared<const Grammar>(json_schema_grammar(json::parse(R"({"type":"string"})"))), v);
  GrammarMatcher m(cg);
  ASSERT_TRUE(m.accept_token(id_of(*v, "\"")));
  for (int i = 0; i < 5; ++i) {
    m.next_token_bitmask();
    ASSERT_TRUE(m.accept_token(id_of(*v, "ab")));
  }
  EXPECT_GE(cg->stats.cache_hits, 4);
}

namespace {
// Random token strings over an alphabet that exercises JSON, regexes and UTF-8 (multi-byte
// characters, split characters, quotes inside tokens, newlines, long runs).
std::shared_ptr<const TokenVocab> random_vocab(uint64_t seed, int n_merges) {
  std::vector<std::string> t = {"<s>", "</s>", "<think>"};
  for (int b = 0; b < 256; ++b) t.push_back(std::string(1, static_cast<char>(b)));
  const std::vector<std::string> alpha = {"a", "b",  "c", "x",  "Z",    "0",    "1",  "7", " ", "\"",
                                          ",", ":",  "{", "}",  "[",    "]",    "\\", "n", "u", "-",
                                          ".", "\n", "é", "中", "\xe4", "\xb8", "@",  "_", "e"};
  std::mt19937_64 rng(seed);
  for (int i = 0; i < n_merges; ++i) {
    const int len = 2 + static_cast<int>(rng() % (rng() % 8 == 0 ? 24 : 6));
    std::string s;
    for (int k = 0; k < len; ++k) s += alpha[rng() % alpha.size()];
    t.push_back(s);
  }
  for (const char* m : {"\":\"", "\",\"", "\"}", "\"]", "true", "false", "null", "abc\",", "      ", "ab\"x"})
    t.push_back(m);
  return std::make_shared<TokenVocab>(t, std::vector<int32_t>{0, 2}, 1);
}

std::vector<std::pair<std::string, Grammar>> decomposition_grammars() {
  std::vector<std::pair<std::string, Grammar>> g;
  g.emplace_back("schema-bounded", json_schema_grammar(json::parse(R"({"type":"object","properties":{
      "name":{"type":"string","minLength":2,"maxLength":12},
      "tags":{"type":"array","items":{"type":"string","maxLength":5},"minItems":1,"maxItems":3},
      "n":{"type":"integer","minimum":-50,"maximum":5000}, "free":{"type":"string"}},
      "required":["name","tags","n","free"]})")));
  g.emplace_back("schema-recursive", json_schema_grammar(json::parse(R"({"$defs":{"c":{"type":"object","properties":{
      "author":{"type":"string","pattern":"^@[a-z]{1,10}$"},"text":{"type":"string","maxLength":40},
      "replies":{"type":"array","items":{"$ref":"#/$defs/c"},"maxItems":2}},"required":["author","text","replies"]}},
      "$ref":"#/$defs/c"})")));
  JsonOptions flex;
  flex.flexible_whitespace = true;
  g.emplace_back("json-object-flexible", json_object_grammar(flex));
  g.emplace_back("regex-words", regex_grammar(R"([a-z]{2,6}( [A-Z]\w{0,8})?\d{1,3})"));
  g.emplace_back("regex-line", regex_grammar(R"([^\n]{0,30}\n[0-9a-f]{4,})"));
  g.emplace_back("ebnf-sql", ebnf_grammar(R"(root ::= "SELECT " cols " FROM " ident (" WHERE " cond)? ";"
cols ::= "*" | ident (", " ident){0,3}
ident ::= [a-z] [a-z_]{0,7}
cond ::= ident (" = " | " < " | " > ") num
num ::= "0" | [1-9] [0-9]{0,4})"));
  g.emplace_back("ebnf-nullable-items", ebnf_grammar(R"(root ::= ("a"? "b"?){2,5} ("x" | "中"){1,3} "c")"));
  return g;
}

// Random walks (uniform over the allowed tokens, EOS included) comparing each mask with the
// definition: bit i set iff the byte matcher accepts every byte of token i from the state (EOS iff
// complete, or nothing else allowed; specials never). `brute_every`: check every token by
// brute force on every n-th step (0 = never), the trie walk from the whole state on every step.
void check_random_walks(const std::shared_ptr<const TokenVocab>& v, int seeds, int steps, int brute_every,
                        bool expect_loops) {
  for (auto& [name, grammar] : decomposition_grammars()) {
    auto g = std::make_shared<const Grammar>(grammar);
    auto cg = std::make_shared<CompiledGrammar>(g, v);
    PdaMatcher& ref = cg->pda();  // the same node arena as the masks' states
    for (int seed = 0; seed < seeds; ++seed) {
      std::mt19937_64 rng(static_cast<uint64_t>(seed) * 7919 + 1);
      GrammarMatcher m(cg);
      MatchState state = ref.initial();
      for (int step = 0; step < steps && !m.is_terminated(); ++step) {
        const std::vector<uint32_t> mask = m.next_token_bitmask();
        std::vector<uint32_t> full;
        cg->compute_full(state, full);
        bool any = false;
        for (uint32_t w : full) any |= w != 0;
        if ((state.accepting || !any) && v->eos_id() >= 0)
          full[static_cast<size_t>(v->eos_id()) >> 5] |= 1u << (v->eos_id() & 31);
        for (size_t w = 0; w < mask.size(); ++w)
          if (mask[w] != full[w])
            for (int b = 0; b < 32; ++b) {
              const int32_t id = static_cast<int32_t>(w * 32 + static_cast<size_t>(b));
              ASSERT_EQ(allowed(mask, id), allowed(full, id)) << "brute " <<
                  [&] {
                    MatchState x = state;
                    return ref.advance_bytes(x, v->bytes(id));
                  }() << " " << name << " seed " << seed << " step "
                                                              << step << " token " << id << " '" << v->bytes(id) << "'";
            }
        if (brute_every > 0 && step % brute_every == 0)
          for (int32_t id = 0; id < v->size(); ++id) {
            bool want;
            if (id == v->eos_id())
              want = allowed(full, id);
            else if (v->is_special(id) || v->bytes(id).empty())
              want = false;
            else {
              MatchState s = state;
              want = ref.advance_bytes(s, v->bytes(id));
            }
            ASSERT_EQ(allowed(mask, id), want) << name << " seed " << seed << " step " << step << " token " << id;
          }
        std::vector<int32_t> ok;
        for (int32_t id = 0; id < v->size(); ++id)
          if (allowed(mask, id)) ok.push_back(id);
        ASSERT_FALSE(ok.empty());
        const int32_t pick = ok[rng() % ok.size()];
        ASSERT_TRUE(m.accept_token(pick)) << name << " token " << pick;
        if (pick != v->eos_id()) ASSERT_TRUE(ref.advance_bytes(state, v->bytes(pick)));
      }
    }
    if (expect_loops && name.rfind("ebnf-nullable", 0) != 0) EXPECT_GT(cg->stats.loop_groups, 0) << name;
    if (expect_loops && name.rfind("ebnf-sql", 0) == 0) EXPECT_GT(cg->stats.prefix_groups, 0) << name;
  }
}

// The positions a short fixed prefix before a loop (`" " ident` with ident ::= [a-z] [a-z_]{0,7},
// `"\"" [a-z]{1,6}`, a literal's last bytes) against the brute-force definition, token by token.
void check_prefix_positions(const std::shared_ptr<const TokenVocab>& v) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {R"(root ::= "SELECT " cols " FROM " ident (" WHERE " cond)? ";"
cols ::= "*" | ident (", " ident){0,3}
ident ::= [a-z] [a-z_]{0,7}
cond ::= ident (" = " | " < " | " > ") num
num ::= "0" | [1-9] [0-9]{0,4})",
       {"SELECT", "SELECT ", "SELECT a", "SELECT a,", "SELECT a, b,", "SELECT a, b, c,", "SELECT a, b, c, d",
        "SELECT * FRO", "SELECT * FROM", "SELECT * FROM ", "SELECT ab FROM t WHERE", "SELECT a FROM t WHERE x =",
        "SELECT a FROM t WHERE x = ", "SELECT a FROM t WHERE x <", "SELECT a FROM t WHERE xyz_abcd >"}},
      {R"(root ::= "[" (item ("," item){0,4})? "]"
item ::= "\"" [a-z]{1,6} "\"" | [0-9]{1,3} | "true" | "false")",
       {"", "[", "[\"ab\"", "[\"ab\",", "[1,2", "[1,2,\"x\",3,"}},
      {R"(root ::= "x" ([a-c] [0-9]{2,4} ";")* "." ("ab" [a-z]+)?)", {"", "x", "xa1", "xa12;", "xa12;b123;", "x."}},
  };
  for (const auto& [text, prefixes] : cases) {
    auto g = std::make_shared<const Grammar>(ebnf_grammar(text));
    auto cg = std::make_shared<CompiledGrammar>(g, v);
    PdaMatcher& ref = cg->pda();
    for (const std::string& p : prefixes) {
      MatchState state = ref.initial();
      ASSERT_TRUE(ref.advance_bytes(state, p)) << p;
      std::vector<uint32_t> fast, full;
      cg->compute(state, fast);
      cg->compute_full(state, full);
      bool any = false;
      for (uint32_t w : full) any |= w != 0;
      if ((state.accepting || !any) && v->eos_id() >= 0)
        full[static_cast<size_t>(v->eos_id()) >> 5] |= 1u << (v->eos_id() & 31);
      for (int32_t id = 0; id < v->size(); ++id) {
        bool want;
        if (id == v->eos_id())
          want = allowed(full, id);
        else if (v->is_special(id) || v->bytes(id).empty())
          want = false;
        else {
          MatchState s = state;
          want = ref.advance_bytes(s, v->bytes(id));
        }
        ASSERT_EQ(allowed(fast, id), want) << "'" << p << "' token " << id << " '" << v->bytes(id) << "'";
      }
    }
    EXPECT_GT(cg->stats.prefix_groups, 0) << text;
  }
}
}  // namespace

TEST(StructuredTokenMatcher, PrefixIntoLoopMatchesBruteForce) {
  for (uint64_t vs : {1, 2, 5}) check_prefix_positions(random_vocab(vs, 3000));
  const char* path = std::getenv("DEEPINFER_V4_TOKENIZER");
  if (!path || !*path) GTEST_SKIP() << "DEEPINFER_V4_TOKENIZER (path to the V4 tokenizer.json) is not set";
  const Tokenizer t = Tokenizer::from_file(path);
  check_prefix_positions(TokenVocab::from_tokenizer(t, 129280, 1));
}

TEST(StructuredTokenMatcher, DecompositionMatchesBruteForceRandomVocab) {
  for (uint64_t vs : {1, 2}) check_random_walks(random_vocab(vs, 3000), 6, 60, 1, true);
}

TEST(StructuredTokenMatcher, PrebuiltVocabEntriesMatchBruteForce) {
  // The vocabulary-level loop entries (built on a vocabulary's first compile, kept by
  // clear_shared_loop_cache), those alone after a clear, and none at all (DEEPINFER_SO_PREBUILD=0 at
  // the first compile: the truly fresh case) all give the brute-force masks.
  clear_shared_loop_cache_all();
  auto v = random_vocab(7, 3000);
  check_random_walks(v, 3, 60, 1, true);
  const size_t pinned = shared_loop_cache_counts().second;
  EXPECT_GE(pinned, 20u);  // string character and escapes (compact, flexible), digits, whitespace, prefixes
  clear_shared_loop_cache();
  EXPECT_EQ(shared_loop_cache_counts(), std::make_pair(pinned, pinned));
  check_random_walks(v, 3, 60, 1, true);
  setenv("DEEPINFER_SO_PREBUILD", "0", 1);
  auto fresh = random_vocab(7, 3000);
  check_random_walks(fresh, 3, 60, 1, true);
  unsetenv("DEEPINFER_SO_PREBUILD");
  EXPECT_EQ(shared_loop_cache_counts().second, pinned);  // none of the fresh vocabulary's
  clear_shared_loop_cache_all();
  EXPECT_EQ(shared_loop_cache_counts().first, 0u);
  check_random_walks(v, 2, 60, 1, true);  // (v's pinned entries dropped: rebuilt on use, not pinned)
}

TEST(StructuredTokenMatcher, DecompositionMatchesBruteForceV4Vocab) {
  const char* path = std::getenv("DEEPINFER_V4_TOKENIZER");
  if (!path || !*path) GTEST_SKIP() << "DEEPINFER_V4_TOKENIZER (path to the V4 tokenizer.json) is not set";
  const Tokenizer t = Tokenizer::from_file(path);
  check_random_walks(TokenVocab::from_tokenizer(t, 129280, 1), 2, 40, 13, true);
}

TEST(StructuredTokenMatcher, WalkDfaBoundFallsBackToPlainWalk) {
  // The walk DFA over a memory bound (none at all, or overflowing in the middle of a walk) gives the
  // same masks as with room, through the plain per-byte walk.
  auto v = random_vocab(4, 3000);
  for (auto& [name, grammar] : decomposition_grammars()) {
    auto g = std::make_shared<const Grammar>(grammar);
    for (size_t limit : {size_t{1}, size_t{6000}}) {
      auto cg = std::make_shared<CompiledGrammar>(g, v);
      auto tight = std::make_shared<CompiledGrammar>(g, v);
      tight->dfa_limit_bytes = limit;
      tight->use_loops = false;
      std::mt19937_64 rng(limit);
      GrammarMatcher m(cg), t(tight);
      for (int step = 0; step < 40 && !m.is_terminated(); ++step) {
        const std::vector<uint32_t> mask = m.next_token_bitmask();
        ASSERT_EQ(mask, t.next_token_bitmask()) << name << " limit " << limit << " step " << step;
        std::vector<int32_t> ok;
        for (int32_t id = 0; id < v->size(); ++id)
          if (allowed(mask, id)) ok.push_back(id);
        const int32_t pick = ok[rng() % ok.size()];
        ASSERT_TRUE(m.accept_token(pick));
        ASSERT_TRUE(t.accept_token(pick));
      }
    }
  }
}

TEST(StructuredTokenMatcher, LoopEntriesSharedAcrossPositions) {
  // Every position of a long bounded string is a new state, but they share one loop walk: no
  // per-state walks inside the string.
  auto v = random_vocab(3, 2000);
  auto g = std::make_shared<const Grammar>(json_schema_grammar(json::parse(R"({"type":"string","maxLength":300})")));
  auto cg = std::make_shared<CompiledGrammar>(g, v);
  GrammarMatcher m(cg);
  ASSERT_TRUE(m.accept_token(id_of(*v, "\"")));
  for (int i = 0; i < 100; ++i) {
    m.next_token_bitmask();
    ASSERT_TRUE(m.accept_token(id_of(*v, "a")));
  }
  EXPECT_EQ(cg->stats.full_walks, 0);
  EXPECT_GE(cg->stats.loop_groups, 100);
  EXPECT_LE(cg->stats.stack_walks, 4);
}
