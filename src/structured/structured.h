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
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

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
};
// Properties are generated in the schema's key order: the declared order for ordered_json (and for
// so_args whose json_schema value is JSON text), alphabetical for nlohmann::json (which sorts keys).
Grammar json_schema_grammar(const nlohmann::ordered_json& schema, const JsonOptions& opt = {}, GrammarLimits limits = {});
Grammar json_schema_grammar(const nlohmann::json& schema, const JsonOptions& opt = {}, GrammarLimits limits = {});
// Any JSON value whose top level is an object (so_args type "json_object").
Grammar json_object_grammar(const JsonOptions& opt = {}, GrammarLimits limits = {});

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
// "choice", "value": ..., optional "whitespace": "compact"|"flexible", "after_think": bool}.
StructuredSpec compile_so_args(const nlohmann::json& so_args);

}  // namespace deepinfer::structured
