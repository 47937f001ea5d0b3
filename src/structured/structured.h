// Structured outputs (issue 6): constrained decoding by a grammar. Front ends build a byte-level
// Grammar (grammar.h) from
//   - an EBNF grammar (ebnf.cpp; the dialect is described in docs/design.md and README.md),
//   - a regular expression (regex.cpp; the Python `re` / JSON Schema `pattern` subset, full match),
//   - a JSON Schema or "any JSON object" (json_schema.cpp),
//   - a list of choices;
// compile_so_args (so_args.cpp) turns SamplingParams::so_args into one. token_matcher.h matches it
// over a tokenizer's vocabulary (masks, accept, rollback). Every error is a deepinfer::Error whose
// message points at the problem (position, line:col or JSON path).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "structured/grammar.h"

namespace deepinfer::structured {

// ---- regex (regex.cpp)
// The regex as an expression of `b`. json_string: the text is the content of a JSON string, so
// characters that JSON must escape (", \, control characters) appear in their escaped form.
Expr regex_expr(std::string_view pattern, GrammarBuilder& b, bool json_string = false);
Grammar regex_grammar(std::string_view pattern, GrammarLimits limits = {});
// One character out of `ranges` (code points); json_string: in its JSON-string form (", \ and control
// characters escaped).
Expr char_expr(const std::vector<CodeRange>& ranges, bool json_string);

// ---- EBNF (ebnf.cpp)
Grammar ebnf_grammar(std::string_view text, const std::string& root = "root", GrammarLimits limits = {});

// ---- JSON (json_schema.cpp)
struct JsonOptions {
  // "compact": no whitespace at all (default); flexible: up to `max_ws` of [ \t\n] between tokens.
  bool flexible_whitespace = false;
  int max_ws = 4;
  // Objects without "additionalProperties" get no extra properties (the schema allows them; not
  // generating them keeps outputs minimal and valid). Set true to allow any extra property.
  bool default_additional_properties = false;
  // Strings never hold a raw U+FF5C (the bar of DeepSeek's special tokens and of the DSML markers;
  // the escape \uff5c still can): DSML tool-call values must not be able to spell a closing tag.
  bool no_fullwidth_bar = false;
};
// Properties are generated in the schema's key order: the declared order for ordered_json (and for
// so_args whose json_schema value is JSON text), alphabetical for nlohmann::json (which sorts keys).
Grammar json_schema_grammar(const nlohmann::ordered_json& schema, const JsonOptions& opt = {},
                            GrammarLimits limits = {});
Grammar json_schema_grammar(const nlohmann::json& schema, const JsonOptions& opt = {}, GrammarLimits limits = {});
// Any JSON value whose top level is an object (so_args type "json_object").
Grammar json_object_grammar(const JsonOptions& opt = {}, GrammarLimits limits = {});
// Adds the rules of `schema` to `b` and returns the expression of one JSON value it allows (no
// whitespace around it). `root` is the document its $refs resolve in (schema may be a part of it);
// `path` names it in error messages.
Expr json_schema_expr(const nlohmann::ordered_json& root, const nlohmann::ordered_json& schema, GrammarBuilder& b,
                      const JsonOptions& opt = {}, const std::string& path = "$");

// ---- DSML tool calls (dsml_tools.cpp)
// The tool-call block of the DeepSeek chat format, as tokenizer/encoding_v4*.cpp write it and
// tokenizer/tool_call_parser.cpp reads it, restricted to the given tools: invoke names from `tools`,
// parameter names from each tool's parameters.properties (declared order, required ones present,
// no others), string="true" values as raw text for string schemas, string="false" values as JSON
// matching the parameter's schema. Used for tool_choice "required" / a named function.
struct DsmlToolsOptions {
  bool v41 = true;            // V4.1 tag names ("<｜DSML｜ calls>", " invoke", " parameter") or V4's
  bool parallel = true;       // one or more invokes; false: exactly one
  bool flexible_json = true;  // string="false" JSON may hold single spaces/newlines between tokens
};
// tools: [{"name": ..., "parameters": {JSON Schema of an object}}, ...] (OpenAI's function objects
// are accepted too: {"type": "function", "function": {...}}).
Grammar dsml_tools_grammar(const nlohmann::ordered_json& tools, const DsmlToolsOptions& opt = {},
                           GrammarLimits limits = {});

// ---- choice
Grammar choice_grammar(const std::vector<std::string>& choices, GrammarLimits limits = {});

// ---- so_args (so_args.cpp)
struct StructuredSpec {
  std::shared_ptr<const Grammar> grammar;
  // so_args "after_think": true = the constraint starts after the </think> token, false = at once,
  // unset = detect from the prompt (the engine checks whether it ends inside <think>).
  std::optional<bool> after_think;
};
// Validates and compiles so_args = {"type": "json_schema"|"regex"|"ebnf"|"grammar"|"json_object"|
// "choice"|"dsml_tools", "value": ..., optional "whitespace": "compact"|"flexible", "after_think": bool}.
// dsml_tools (what the server sends for tool_choice required / named): value = {"tools": [...],
// "family": "v4"|"v41", "parallel": bool}, as an object or as its JSON text (which keeps the
// schemas' property order).
StructuredSpec compile_so_args(const nlohmann::json& so_args);

}  // namespace deepinfer::structured
