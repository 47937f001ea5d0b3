// DSML tool-call block grammar (tool_choice "required" / a named function). The shape is the one
// the prompt encoders write for an assistant turn's tool calls (tokenizer/encoding_v4.cpp,
// encoding_v41.cpp) and ToolCallParser reads back (D = "｜DSML｜"; V4 tag names, V4.1 writes
// " calls", " invoke", " parameter"):
//
//   root   ::= "\n\n"? "<D tool_calls>\n" invoke ("\n" invoke)* "\n</D tool_calls>"
//   invoke ::= "<D invoke name=\"NAME\">\n" params "\n</D invoke>"      (one alternative per tool)
//   params ::= param ("\n" param)*  in the declared property order, required ones present
//   param  ::= "<D parameter name=\"KEY\" string=\"true\">" RAW "</D parameter>"    string schemas
//            | "<D parameter name=\"KEY\" string=\"false\">" JSON "</D parameter>"  everything else
//
// RAW: any text without U+FF5C (so no closing tag, and no special-token spelling, can appear in a
// value), bounded by minLength / maxLength; enum / const strings are their raw texts; a pattern is
// matched raw. JSON (json_schema.cpp) is the parameter's schema, its strings without raw U+FF5C
// either. String schemas with a `format` use the JSON form (a quoted, checked string).
#include <set>

#include "deepinfer/error.h"
#include "structured/structured.h"

namespace deepinfer::structured {

namespace {

using ojson = nlohmann::ordered_json;

constexpr uint32_t kBar = 0xFF5C;  // "｜"

struct Dialect {
  std::string block_open, block_close, invoke_open, invoke_close, param_open, param_close;
};

Dialect dialect(bool v41) {
  const std::string d =
      "\xEF\xBD\x9C"
      "DSML\xEF\xBD\x9C";
  const std::string sp = v41 ? " " : "";
  const std::string block = v41 ? " calls" : "tool_calls";
  return {"<" + d + block + ">",     "</" + d + block + ">",     "<" + d + sp + "invoke",
          "</" + d + sp + "invoke>", "<" + d + sp + "parameter", "</" + d + sp + "parameter>"};
}

// A name the parser can read back: it ends at the first '"', and the tag ends at the first '>'.
void check_name(const std::string& name, const std::string& what) {
  DI_CHECK(!name.empty(), "dsml_tools: {} is empty", what);
  DI_CHECK(name.find('"') == std::string::npos && name.find('>') == std::string::npos,
           "dsml_tools: {} '{}' holds '\"' or '>', which a DSML tool call cannot spell", what, name);
}

// A schema whose values are strings, written as string="true" raw text.
bool raw_string_schema(const ojson& s) {
  if (!s.is_object()) return false;
  for (const char* k : {"anyOf", "oneOf", "allOf", "$ref", "format"})
    if (s.contains(k)) return false;
  if (s.contains("const")) return s["const"].is_string();
  if (s.contains("enum")) {
    if (!s["enum"].is_array() || s["enum"].empty()) return false;
    for (const ojson& v : s["enum"])
      if (!v.is_string()) return false;
    return !s.contains("type") || s["type"] == "string";
  }
  return s.contains("type") && s["type"] == "string" &&
         !(s.contains("pattern") && (s.contains("minLength") || s.contains("maxLength")));
}

Expr raw_string_expr(const ojson& s, GrammarBuilder& b, const std::string& path) {
  if (s.contains("const")) return Expr::literal(s["const"].get<std::string>());
  if (s.contains("enum")) {
    std::vector<Expr> alts;
    for (const ojson& v : s["enum"]) alts.push_back(Expr::literal(v.get<std::string>()));
    return Expr::alt(std::move(alts));
  }
  if (s.contains("pattern")) {
    DI_CHECK(s["pattern"].is_string(), "dsml_tools: {}.pattern must be a string", path);
    try {
      return regex_expr(s["pattern"].get<std::string>(), b, false);
    } catch (const Error& e) {
      fail("dsml_tools: {}.pattern: {}", path, e.what());
    }
  }
  const Expr ch = Expr::cls({{kBar, kBar}}, true);
  int64_t mn = 0, mx = -1;
  if (s.contains("minLength")) {
    DI_CHECK(s["minLength"].is_number_integer(), "dsml_tools: {}.minLength must be an integer", path);
    mn = s["minLength"].get<int64_t>();
  }
  if (s.contains("maxLength")) {
    DI_CHECK(s["maxLength"].is_number_integer(), "dsml_tools: {}.maxLength must be an integer", path);
    mx = s["maxLength"].get<int64_t>();
  }
  DI_CHECK(mn >= 0 && (mx < 0 || mx >= mn), "dsml_tools: {}: bad minLength/maxLength", path);
  DI_CHECK(mn <= b.limits().max_repeat && mx <= b.limits().max_repeat,
           "dsml_tools: {}: minLength/maxLength over the limit {}", path, b.limits().max_repeat);
  if (mn == 0 && mx < 0) {
    const int32_t r = b.add_rule("raw_text");
    b.define(r, Expr::star(ch));
    return Expr::ref(r);
  }
  return Expr::repeat(ch, mn, mx);
}

// The invoke of one tool: its header, its parameters, its closing tag.
Expr invoke_expr(const ojson& tool, size_t index, const Dialect& d, const DsmlToolsOptions& opt, GrammarBuilder& b) {
  const ojson& fn = tool.contains("function") && tool["function"].is_object() ? tool["function"] : tool;
  const std::string where = "tools[" + std::to_string(index) + "]";
  DI_CHECK(fn.contains("name") && fn["name"].is_string(), "dsml_tools: {} needs a string 'name'", where);
  const std::string name = fn["name"].get<std::string>();
  check_name(name, "tool name");
  const ojson params = fn.contains("parameters") && !fn["parameters"].is_null() ? fn["parameters"] : ojson::object();
  DI_CHECK(params.is_object(), "dsml_tools: {} ('{}'): parameters must be a JSON Schema object", where, name);
  struct Prop {
    std::string key;
    const ojson* schema;
    bool required;
  };
  std::set<std::string> req;
  if (params.contains("required")) {
    DI_CHECK(params["required"].is_array(), "dsml_tools: {} ('{}'): parameters.required must be a list", where, name);
    for (const ojson& r : params["required"]) {
      DI_CHECK(r.is_string(), "dsml_tools: {} ('{}'): parameters.required must hold strings", where, name);
      req.insert(r.get<std::string>());
    }
  }
  std::vector<Prop> props;
  static const ojson kAny = ojson::object();
  if (params.contains("properties")) {
    DI_CHECK(params["properties"].is_object(), "dsml_tools: {} ('{}'): parameters.properties must be an object", where,
             name);
    for (auto it = params["properties"].begin(); it != params["properties"].end(); ++it)
      props.push_back({it.key(), &it.value(), req.count(it.key()) > 0});
  }
  for (const std::string& r : req) {
    bool found = false;
    for (const Prop& p : props) found |= p.key == r;
    if (!found) props.push_back({r, &kAny, true});  // required but undeclared: any value
  }
  JsonOptions jo;
  jo.flexible_whitespace = opt.flexible_json;
  jo.max_ws = 1;
  jo.no_fullwidth_bar = true;
  auto item = [&](const Prop& p) {
    check_name(p.key, "parameter name");
    const std::string path = "$." + name + "." + p.key;
    const std::string head = d.param_open + " name=\"" + p.key + "\" string=\"";
    std::vector<Expr> forms;
    if (raw_string_schema(*p.schema)) {
      forms.push_back(Expr::seq(
          {Expr::literal(head + "true\">"), raw_string_expr(*p.schema, b, path), Expr::literal(d.param_close)}));
    } else {
      forms.push_back(Expr::seq({Expr::literal(head + "false\">"), json_schema_expr(params, *p.schema, b, jo, path),
                                 Expr::literal(d.param_close)}));
    }
    return Expr::alt(std::move(forms));
  };
  // S_i: the parameters from i on after one was written; F_i: when none was written yet.
  const size_t n = props.size();
  std::vector<int32_t> S(n + 1), F(n + 1);
  for (size_t i = 0; i <= n; ++i) {
    S[i] = b.add_rule(name + "_s" + std::to_string(i));
    F[i] = b.add_rule(name + "_f" + std::to_string(i));
  }
  b.define(S[n], Expr::empty());
  b.define(F[n], Expr::empty());
  for (size_t i = n; i-- > 0;) {
    const Expr it = item(props[i]);
    const Expr next = Expr::seq({Expr::literal("\n"), it});
    if (props[i].required) {
      b.define(S[i], Expr::seq({next, Expr::ref(S[i + 1])}));
      b.define(F[i], Expr::seq({it, Expr::ref(S[i + 1])}));
    } else {
      b.define(S[i], Expr::seq({Expr::opt(next), Expr::ref(S[i + 1])}));
      b.define(F[i], Expr::alt({Expr::seq({it, Expr::ref(S[i + 1])}), Expr::ref(F[i + 1])}));
    }
  }
  const int32_t inv = b.add_rule("invoke_" + name);
  b.define(inv, Expr::seq({Expr::literal(d.invoke_open + " name=\"" + name + "\">\n"), Expr::ref(F[0]),
                           Expr::literal("\n" + d.invoke_close)}));
  return Expr::ref(inv);
}

}  // namespace

Grammar dsml_tools_grammar(const nlohmann::ordered_json& tools, const DsmlToolsOptions& opt, GrammarLimits limits) {
  DI_CHECK(tools.is_array() && !tools.empty(), "dsml_tools: 'tools' must be a non-empty list of tools");
  const Dialect d = dialect(opt.v41);
  GrammarBuilder b(limits);
  const int32_t root = b.add_rule("root");
  std::vector<Expr> invokes;
  for (size_t i = 0; i < tools.size(); ++i) {
    DI_CHECK(tools[i].is_object(), "dsml_tools: tools[{}] must be an object", i);
    invokes.push_back(invoke_expr(tools[i], i, d, opt, b));
  }
  const int32_t invoke = b.add_rule("invoke");
  b.define(invoke, Expr::alt(std::move(invokes)));
  Expr calls = Expr::ref(invoke);
  if (opt.parallel) calls = Expr::seq({calls, Expr::star(Expr::seq({Expr::literal("\n"), Expr::ref(invoke)}))});
  b.define(root, Expr::seq({Expr::opt(Expr::literal("\n\n")), Expr::literal(d.block_open + "\n"), calls,
                            Expr::literal("\n" + d.block_close)}));
  return b.build(root);
}

}  // namespace deepinfer::structured
