// Prompt encoders vs DeepSeek's reference scripts: every golden in tests/data/encoding/{v4,v41}.json
// (made by tools/encoding/make_goldens.py) must come out byte-identical, or throw where the
// reference raised.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "deepinfer/error.h"
#include "tokenizer/encoding.h"

namespace deepinfer {
namespace {

using Json = nlohmann::ordered_json;

Json load_goldens(const std::string& family) {
  std::ifstream in(std::string(DEEPINFER_SOURCE_DIR) + "/tests/data/encoding/" + family + ".json");
  EXPECT_TRUE(in.good()) << "missing goldens for " << family;
  std::stringstream ss;
  ss << in.rdbuf();
  return Json::parse(ss.str());
}

EncodeOptions options_of(const Json& o, EncodingFamily family) {
  EncodeOptions opts;
  opts.family = family;
  opts.thinking = o.at("thinking").get<bool>();
  opts.reasoning_effort = o.at("reasoning_effort");
  opts.drop_thinking = o.at("drop_thinking").get<bool>();
  opts.add_default_bos_token = o.at("add_default_bos_token").get<bool>();
  opts.context = o.at("context");
  opts.tools = o.at("tools");
  opts.response_format = o.at("response_format");
  return opts;
}

void check_family(const std::string& name, EncodingFamily family) {
  Json doc = load_goldens(name);
  const Json& cases = doc.at("cases");
  ASSERT_GE(cases.size(), 100u);
  int ok = 0;
  for (const auto& c : cases) {
    const std::string case_name = c.at("name").get<std::string>();
    EncodeOptions opts = options_of(c.at("options"), family);
    if (c.contains("expected")) {
      std::string got;
      try {
        got = encode_messages(c.at("messages"), opts);
      } catch (const Error& e) {
        ADD_FAILURE() << name << "/" << case_name << ": threw " << e.what();
        continue;
      }
      EXPECT_EQ(got, c.at("expected").get<std::string>()) << name << "/" << case_name;
      ok += got == c.at("expected").get<std::string>();
    } else {
      EXPECT_THROW(encode_messages(c.at("messages"), opts), Error)
          << name << "/" << case_name << " (reference: " << c.at("error").get<std::string>() << ")";
      ++ok;
    }
  }
  EXPECT_EQ(ok, static_cast<int>(cases.size()));
}

TEST(Encoding, V4GoldensByteIdentical) { check_family("v4", EncodingFamily::kV4); }
TEST(Encoding, V41GoldensByteIdentical) { check_family("v41", EncodingFamily::kV41); }

TEST(Encoding, QuickExamples) {
  EncodeOptions opts;
  opts.family = EncodingFamily::kV4;
  Json msgs = Json::parse(R"([{"role":"system","content":"You are a helpful assistant."},
                              {"role":"user","content":"What is 2+2?"}])");
  EXPECT_EQ(encode_messages(msgs, opts),
            "<｜begin▁of▁sentence｜>You are a helpful assistant.<｜User｜>What is 2+2?<｜Assistant｜><think>");
  opts.family = EncodingFamily::kV41;
  opts.thinking = false;
  EXPECT_EQ(
      encode_messages(msgs, opts),
      "<｜begin▁of▁sentence｜><｜System｜>You are a helpful assistant.<｜User｜>What is 2+2?<｜Assistant｜></think>");
  opts.thinking = true;
  opts.reasoning_effort = 30;
  EXPECT_EQ(encode_messages_json(R"([{"role":"user","content":"hi"}])", opts),
            "<｜begin▁of▁sentence｜><｜System｜>Reasoning Effort: 30 (range 1-100, the higher the value, the "
            "more thorough the reasoning)\n\n<｜User｜>hi<｜Assistant｜><think>");
}

TEST(Encoding, BadInputThrows) {
  EncodeOptions opts;
  EXPECT_THROW(encode_messages_json("not json", opts), Error);
  EXPECT_THROW(encode_messages_json(R"({"role":"user"})", opts), Error);
  EXPECT_THROW(encode_messages_json(R"([1, 2])", opts), Error);
  opts.reasoning_effort = "ultra";
  EXPECT_THROW(encode_messages_json(R"([{"role":"user","content":"x"}])", opts), Error);
}

TEST(Encoding, PythonJsonDumps) {
  EXPECT_EQ(python_json_dumps(Json::parse(R"({"b": [1, 2.0, 1e20, 1e-7, 0.0001, 1e16, 1e15, -0.0, true, null],
                                              "a": "é\n\"\u0001"})")),
            "{\"b\": [1, 2.0, 1e+20, 1e-07, 0.0001, 1e+16, 1000000000000000.0, -0.0, true, null], "
            "\"a\": \"é\\n\\\"\\u0001\"}");
}

}  // namespace
}  // namespace deepinfer
