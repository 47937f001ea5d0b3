// SamplingParams::so_args -> a compiled Grammar. Validation happens here, at add_request time.
#include "deepinfer/error.h"
#include "structured/structured.h"

namespace deepinfer::structured {

StructuredSpec compile_so_args(const nlohmann::json& so) {
  DI_CHECK(so.is_object(), "so_args: must be an object {{\"type\": ..., \"value\": ...}}, got a JSON {}",
           so.type_name());
  for (auto& [k, v] : so.items())
    DI_CHECK(k == "type" || k == "value" || k == "whitespace" || k == "after_think",
             "so_args: unknown key '{}' (expected type, value, whitespace, after_think)", k);
  DI_CHECK(so.contains("type") && so["type"].is_string(),
           "so_args: 'type' must be one of json_schema, regex, ebnf, json_object, choice, dsml_tools");
  const std::string type = so["type"].get<std::string>();
  JsonOptions opt;
  if (so.contains("whitespace")) {
    const nlohmann::json& w = so["whitespace"];
    DI_CHECK(w == "compact" || w == "flexible", "so_args: 'whitespace' must be \"compact\" or \"flexible\"");
    opt.flexible_whitespace = w == "flexible";
  }
  StructuredSpec spec;
  if (so.contains("after_think")) {
    DI_CHECK(so["after_think"].is_boolean(), "so_args: 'after_think' must be a boolean");
    spec.after_think = so["after_think"].get<bool>();
  }
  const nlohmann::json value = so.contains("value") ? so["value"] : nlohmann::json();
  Grammar g;
  if (type == "json_schema") {
    nlohmann::ordered_json schema = nlohmann::ordered_json::parse(value.dump());
    if (value.is_string()) {
      try {
        schema = nlohmann::ordered_json::parse(value.get<std::string>());
      } catch (const nlohmann::ordered_json::exception& e) {
        fail("so_args: the json_schema value is not valid JSON: {}", e.what());
      }
    }
    DI_CHECK(schema.is_object() || schema.is_boolean(), "so_args: json_schema 'value' must be a schema object");
    g = json_schema_grammar(schema, opt);
  } else if (type == "json_object") {
    g = json_object_grammar(opt);
  } else if (type == "regex") {
    DI_CHECK(value.is_string(), "so_args: regex 'value' must be a string");
    g = regex_grammar(value.get<std::string>());
  } else if (type == "ebnf" || type == "grammar") {
    DI_CHECK(value.is_string(), "so_args: ebnf 'value' must be a string");
    g = ebnf_grammar(value.get<std::string>());
  } else if (type == "choice") {
    DI_CHECK(value.is_array() && !value.empty(), "so_args: choice 'value' must be a non-empty list of strings");
    std::vector<std::string> c;
    for (const nlohmann::json& x : value) {
      DI_CHECK(x.is_string(), "so_args: choice entries must be strings");
      c.push_back(x.get<std::string>());
    }
    g = choice_grammar(c);
  } else if (type == "dsml_tools") {
    nlohmann::ordered_json v = nlohmann::ordered_json::parse(value.dump());
    if (value.is_string()) {
      try {
        v = nlohmann::ordered_json::parse(value.get<std::string>());
      } catch (const nlohmann::ordered_json::exception& e) {
        fail("so_args: the dsml_tools value is not valid JSON: {}", e.what());
      }
    }
    DI_CHECK(v.is_object(),
             "so_args: dsml_tools 'value' must be {{\"tools\": [...], \"family\": ..., \"parallel\": ...}}");
    for (auto& [k, x] : v.items())
      DI_CHECK(k == "tools" || k == "family" || k == "parallel",
               "so_args: dsml_tools: unknown key '{}' (expected tools, family, parallel)", k);
    DsmlToolsOptions o;
    if (v.contains("family")) {
      DI_CHECK(v["family"] == "v4" || v["family"] == "v41", "so_args: dsml_tools 'family' must be \"v4\" or \"v41\"");
      o.v41 = v["family"] == "v41";
    }
    if (v.contains("parallel")) {
      DI_CHECK(v["parallel"].is_boolean(), "so_args: dsml_tools 'parallel' must be a boolean");
      o.parallel = v["parallel"].get<bool>();
    }
    if (so.contains("whitespace")) o.flexible_json = opt.flexible_whitespace;
    g = dsml_tools_grammar(v.contains("tools") ? v["tools"] : nlohmann::ordered_json(), o);
  } else {
    fail("so_args: unknown type '{}' (expected json_schema, regex, ebnf, json_object, choice, dsml_tools)", type);
  }
  spec.grammar = std::make_shared<const Grammar>(std::move(g));
  return spec;
}

}  // namespace deepinfer::structured
