// The DSML tool-call grammar (src/structured/dsml_tools.cpp): it accepts the tool-call blocks the
// prompt encoders write (both families), and only calls of the allowed tools with their declared
// parameters; what it accepts, ToolCallParser reads back into schema-shaped arguments.
#include <gtest/gtest.h>

#include "deepinfer/error.h"
#include "structured/structured.h"
#include "structured/token_matcher.h"
#include "structured_test_util.h"
#include "tokenizer/encoding.h"
#include "tokenizer/parsers.h"

using namespace deepinfer;
using namespace deepinfer::structured;
using deepinfer::structured::test_util::error_of;
using deepinfer::structured::test_util::M;
using ojson = nlohmann::ordered_json;

namespace {

const char* kTools = R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer", "minimum": 1, "maximum": 7},
                   "unit": {"enum": ["c", "f"]}, "detail": {"type": "boolean"}},
    "required": ["city", "days"]}}},
  {"type": "function", "function": {"name": "search", "parameters": {"type": "object",
    "properties": {"query": {"type": "string"}, "filters": {"type": "object", "properties": {"lang": {"type": "string"}},
                   "required": ["lang"]}, "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}}},
    "required": ["query"], "$defs": {"tag": {"type": "string", "maxLength": 5}}}}},
  {"type": "function", "function": {"name": "now"}}
])";

// The tool-call block an encoder writes for `calls` (an assistant message), from "\n\n<" to the end.
std::string encoded_block(const ojson& calls, EncodingFamily fam) {
  ojson msgs = ojson::array();
  msgs.push_back({{"role", "system"}, {"content", "s"}});
  msgs.push_back({{"role", "user"}, {"content", "u"}});
  msgs.push_back({{"role", "assistant"}, {"content", ""}, {"tool_calls", calls}});
  EncodeOptions o;
  o.family = fam;
  o.thinking = false;
  o.tools = ojson::parse(kTools);
  const std::string p = encode_messages(msgs, o);
  const std::string open = fam == EncodingFamily::kV41 ? "\n\n<｜DSML｜ calls>" : "\n\n<｜DSML｜tool_calls>";
  const std::string close = fam == EncodingFamily::kV41 ? "</｜DSML｜ calls>" : "</｜DSML｜tool_calls>";
  const size_t a = p.rfind(open), b = p.rfind(close);
  EXPECT_NE(a, std::string::npos);
  EXPECT_NE(b, std::string::npos);
  return p.substr(a, b + close.size() - a);
}

ojson call(const std::string& name, const ojson& args) {
  return {{"type", "function"}, {"function", {{"name", name}, {"arguments", args.dump()}}}};
}

std::vector<parsers::ToolCall> parse(const std::string& text, bool v41) {
  parsers::ToolCallParser p(v41 ? parsers::Family::kV41 : parsers::Family::kV4);
  auto a = p.feed(text);
  auto b = p.finish();
  EXPECT_EQ(a.content + b.content, "");
  for (auto& c : b.tool_calls) a.tool_calls.push_back(c);
  return a.tool_calls;
}

}  // namespace

TEST(DsmlTools, AcceptsWhatTheEncodersWrite) {
  const ojson tools = ojson::parse(kTools);
  for (bool v41 : {false, true}) {
    DsmlToolsOptions o;
    o.v41 = v41;
    const Grammar g = dsml_tools_grammar(tools, o);
    const auto fam = v41 ? EncodingFamily::kV41 : EncodingFamily::kV4;
    const ojson one = ojson::array({call("get_weather", {{"city", "Paris <b>"}, {"days", 3}, {"unit", "c"}})});
    const ojson two = ojson::array(
        {call("search", {{"query", "a\nb \"q\""}, {"filters", {{"lang", "en"}}}, {"tags", {"x", "yz"}}}),
         call("now", ojson::object()), call("get_weather", {{"city", ""}, {"days", 7}, {"detail", false}})});
    for (const ojson& calls : {one, two}) {
      const std::string block = encoded_block(calls, fam);
      EXPECT_TRUE(M(g, block)) << block;
      EXPECT_TRUE(M(g, block.substr(2))) << "without the leading blank line";
      // The parser reads it back into the same calls.
      auto parsed = parse(block, v41);
      ASSERT_EQ(parsed.size(), calls.size());
      for (size_t i = 0; i < parsed.size(); ++i) {
        EXPECT_EQ(parsed[i].name, calls[i]["function"]["name"]);
        EXPECT_EQ(ojson::parse(parsed[i].arguments),
                  ojson::parse(calls[i]["function"]["arguments"].get<std::string>()));
      }
    }
    // The other family's block is not accepted.
    EXPECT_FALSE(M(g, encoded_block(one, v41 ? EncodingFamily::kV4 : EncodingFamily::kV41)));
  }
}

TEST(DsmlTools, RejectsWrongNamesParamsAndValues) {
  const ojson tools = ojson::parse(kTools);
  DsmlToolsOptions o;
  o.v41 = false;
  const Grammar g = dsml_tools_grammar(tools, o);
  auto block = [](const std::string& invokes) {
    return "<｜DSML｜tool_calls>\n" + invokes + "\n</｜DSML｜tool_calls>";
  };
  auto inv = [](const std::string& name, const std::string& params) {
    return "<｜DSML｜invoke name=\"" + name + "\">\n" + params + "\n</｜DSML｜invoke>";
  };
  auto par = [](const std::string& k, bool str, const std::string& v) {
    return "<｜DSML｜parameter name=\"" + k + "\" string=\"" + (str ? "true" : "false") + "\">" + v +
           "</｜DSML｜parameter>";
  };
  const std::string city = par("city", true, "Rome"), days = par("days", false, "2");
  EXPECT_TRUE(M(g, block(inv("get_weather", city + "\n" + days))));
  EXPECT_TRUE(M(g, block(inv("get_weather", city + "\n" + days + "\n" + par("unit", true, "f")))));
  EXPECT_TRUE(M(g, block(inv("now", ""))));
  EXPECT_FALSE(M(g, block(inv("get_wether", city + "\n" + days)))) << "unknown tool";
  EXPECT_FALSE(M(g, block(inv("get_weather", city)))) << "required 'days' missing";
  EXPECT_FALSE(M(g, block(inv("get_weather", days + "\n" + city)))) << "declared order";
  EXPECT_FALSE(M(g, block(inv("get_weather", city + "\n" + days + "\n" + par("colour", true, "red")))))
      << "undeclared parameter";
  EXPECT_FALSE(M(g, block(inv("get_weather", city + "\n" + par("days", false, "9"))))) << "maximum 7";
  EXPECT_FALSE(M(g, block(inv("get_weather", city + "\n" + par("days", true, "2"))))) << "integer as raw text";
  EXPECT_FALSE(M(g, block(inv("get_weather", par("city", true, "a very long city") + "\n" + days)))) << "maxLength";
  EXPECT_FALSE(M(g, block(inv("get_weather", par("city", true, "a｜b") + "\n" + days)))) << "U+FF5C in raw text";
  EXPECT_FALSE(M(g, block(inv("get_weather", city + "\n" + days + "\n" + par("unit", true, "k"))))) << "enum";
  EXPECT_FALSE(M(g, block(""))) << "no invoke";
  EXPECT_FALSE(M(g, "hello " + block(inv("now", "")))) << "text before the block";
  EXPECT_FALSE(M(g, block(inv("now", "")) + "\nbye")) << "text after the block";
  EXPECT_FALSE(M(g, block(inv("search", par("query", true, "q") + "\n" + par("filters", false, "{}")))))
      << "nested required";
  EXPECT_TRUE(M(g, block(inv("search", par("query", true, "q") + "\n" + par("filters", false, "{\"lang\": \"de\"}")))));

  // Named / non-parallel: exactly one invoke of the one tool.
  o.parallel = false;
  const Grammar one = dsml_tools_grammar(ojson::array({tools[2]}), o);
  EXPECT_TRUE(M(one, block(inv("now", ""))));
  EXPECT_FALSE(M(one, block(inv("now", "") + "\n" + inv("now", ""))));
  EXPECT_FALSE(M(one, block(inv("get_weather", city + "\n" + days))));
}

TEST(DsmlTools, SoArgsAndErrors) {
  const ojson v = {{"tools", ojson::parse(kTools)}, {"family", "v41"}, {"parallel", false}};
  StructuredSpec s = compile_so_args({{"type", "dsml_tools"}, {"value", v.dump()}, {"after_think", true}});
  ASSERT_TRUE(s.grammar);
  EXPECT_TRUE(s.after_think.value_or(false));
  EXPECT_TRUE(
      M(*s.grammar, "<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"now\">\n\n</｜DSML｜ invoke>\n</｜DSML｜ calls>"));
  EXPECT_NE(error_of([] {
              compile_so_args({{"type", "dsml_tools"}, {"value", {{"tools", nlohmann::json::array()}}}});
            }).find("non-empty"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              compile_so_args({{"type", "dsml_tools"}, {"value", {{"tools", {{{"name", "a\"b"}}}}}}});
            }).find("cannot spell"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              compile_so_args(
                  {{"type", "dsml_tools"},
                   {"value",
                    {{"tools", {{{"name", "f"}, {"parameters", {{"properties", {{"x", {{"type", "bogus"}}}}}}}}}}}}});
            }).find("bogus"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              compile_so_args({{"type", "dsml_tools"}, {"value", {{"family", "v5"}}}});
            }).find("family"),
            std::string::npos);
}
