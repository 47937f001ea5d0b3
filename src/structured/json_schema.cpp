// JSON Schema -> Grammar. Supported: type (one or a list), properties (generated in declared order when the
// schema comes as ordered JSON, e.g. parsed from text; nlohmann::json sorts keys),
// required, additionalProperties (false / true / a schema; absent = no extra properties unless
// JsonOptions::default_additional_properties), enum, const, anyOf / oneOf (alternation), allOf (merged
// when the parts are objects or agree keyword by keyword), items, prefixItems (and the older items: [..]
// with additionalItems), minItems / maxItems, minLength / maxLength, pattern (full match), format
// (date, time, date-time, uuid, email, ipv4, ipv6-less: others are ignored as annotations), integer
// minimum / maximum / exclusive bounds (exact digit-range grammars), number bounds when they are
// integers, $ref (local JSON pointers: #, #/$defs/x, #/definitions/x, any #/...) including recursion.
// Annotations (title, description, default, examples, $schema, $id, $comment, ...) are ignored; a
// keyword that changes what is valid and is not supported is an error naming it and its JSON path.
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "deepinfer/error.h"
#include "structured/structured.h"

namespace deepinfer::structured {

namespace {
using json = nlohmann::ordered_json;

const std::set<std::string> kUnsupported = {"patternProperties",
                                            "propertyNames",
                                            "dependentRequired",
                                            "dependentSchemas",
                                            "dependencies",
                                            "if",
                                            "then",
                                            "else",
                                            "not",
                                            "contains",
                                            "minContains",
                                            "maxContains",
                                            "minProperties",
                                            "maxProperties",
                                            "multipleOf",
                                            "unevaluatedProperties",
                                            "unevaluatedItems",
                                            "$dynamicRef",
                                            "$recursiveRef"};

const std::map<std::string, std::string> kFormats = {
    // Day ranges follow the month (30-day months, February 29 only in leap
    // years, no year 0000), so every generated date is a real calendar date (Python date.fromisoformat).
    {"date",
     R"(((\d{3}[1-9]|\d\d[1-9]0|\d[1-9]00|[1-9]000)-((0[13578]|1[02])-(0[1-9]|[12]\d|3[01])|(0[469]|11)-(0[1-9]|[12]\d|30)|02-(0[1-9]|1\d|2[0-8]))|(\d\d(0[48]|[2468][048]|[13579][26])|([2468][048]|[13579][26]|0[48])00)-02-29))"},
    {"time", R"(([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,6})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d))"},
    {"date-time",
     R"(((\d{3}[1-9]|\d\d[1-9]0|\d[1-9]00|[1-9]000)-((0[13578]|1[02])-(0[1-9]|[12]\d|3[01])|(0[469]|11)-(0[1-9]|[12]\d|30)|02-(0[1-9]|1\d|2[0-8]))|(\d\d(0[48]|[2468][048]|[13579][26])|([2468][048]|[13579][26]|0[48])00)-02-29)T([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,6})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d))"},
    {"uuid", R"([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})"},
    {"email",
     R"([a-zA-Z0-9_+-]+(\.[a-zA-Z0-9_+-]+)*@[a-zA-Z0-9]([a-zA-Z0-9-]{0,20}[a-zA-Z0-9])?(\.[a-zA-Z]{2,8}){1,3})"},
    {"ipv4", R"(((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d))"},
};

// Digits d..e (one position).
Expr digit_range(int lo, int hi) {
  if (lo == hi) return Expr::literal(std::string(1, static_cast<char>('0' + lo)));
  return Expr::cls({{static_cast<uint32_t>('0' + lo), static_cast<uint32_t>('0' + hi)}});
}
Expr any_digits(int64_t n) { return Expr::repeat(digit_range(0, 9), n, n); }

// Decimal strings of equal length, lo <= hi: every string between them.
Expr same_len_range(const std::string& lo, const std::string& hi) {
  const size_t n = lo.size();
  if (n == 1) return digit_range(lo[0] - '0', hi[0] - '0');
  if (lo[0] == hi[0]) return Expr::seq({Expr::literal(lo.substr(0, 1)), same_len_range(lo.substr(1), hi.substr(1))});
  const std::string zeros(n - 1, '0'), nines(n - 1, '9');
  std::vector<Expr> alts;
  const bool lo_full = lo.substr(1) == zeros, hi_full = hi.substr(1) == nines;
  const int a = lo[0] - '0' + (lo_full ? 0 : 1), b = hi[0] - '0' - (hi_full ? 0 : 1);
  if (!lo_full) alts.push_back(Expr::seq({Expr::literal(lo.substr(0, 1)), same_len_range(lo.substr(1), nines)}));
  if (a <= b) alts.push_back(Expr::seq({digit_range(a, b), any_digits(static_cast<int64_t>(n - 1))}));
  if (!hi_full) alts.push_back(Expr::seq({Expr::literal(hi.substr(0, 1)), same_len_range(zeros, hi.substr(1))}));
  return Expr::alt(std::move(alts));
}

// Canonical decimal integers in [lo, hi] (0 <= lo; hi < 0 = unbounded).
Expr nonneg_range(int64_t lo, int64_t hi) {
  std::vector<Expr> alts;
  std::string l = std::to_string(lo);
  const std::string h = hi < 0 ? "" : std::to_string(hi);
  while (true) {
    const std::string top(l.size(), '9');
    if (hi >= 0 && h.size() == l.size()) {
      alts.push_back(same_len_range(l, h));
      break;
    }
    if (hi < 0 && l.size() >= 19) {  // beyond int64 widths: any longer number
      alts.push_back(same_len_range(l, top));
      alts.push_back(
          Expr::seq({digit_range(1, 9), Expr::repeat(digit_range(0, 9), static_cast<int64_t>(l.size()), -1)}));
      break;
    }
    alts.push_back(same_len_range(l, top));
    l.assign(l.size() + 1, '0');
    l[0] = '1';
    if (hi < 0 && l.size() > 1) {
      alts.push_back(
          Expr::seq({digit_range(1, 9), Expr::repeat(digit_range(0, 9), static_cast<int64_t>(l.size() - 1), -1)}));
      break;
    }
  }
  return Expr::alt(std::move(alts));
}

// Canonical integers in [lo, hi] with optional bounds.
Expr int_range(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  std::vector<Expr> alts;
  // Negative values -m: m in [hi < 0 ? -hi : 1, lo ? -lo : unbounded].
  if (!lo || *lo < 0) {
    const int64_t a = (hi && *hi < 0) ? -*hi : 1;
    const int64_t b = lo ? -*lo : -1;
    if (b < 0 || a <= b) alts.push_back(Expr::seq({Expr::literal("-"), nonneg_range(a, b)}));
  }
  if (!hi || *hi >= 0) alts.push_back(nonneg_range(lo ? std::max<int64_t>(0, *lo) : 0, hi ? *hi : -1));
  DI_CHECK(!alts.empty(), "json schema: the integer bounds leave no value");
  return Expr::alt(std::move(alts));
}

class SchemaCompiler {
 public:
  SchemaCompiler(const json& root, const JsonOptions& opt, GrammarBuilder& b) : root_(root), opt_(opt), b_(b) {}

  int32_t compile_root() {
    const int32_t r = b_.add_rule("root");
    b_.define(r, Expr::seq({ws(), schema(root_, "$"), ws()}));
    return r;
  }

  Expr ws() {
    if (!opt_.flexible_whitespace) return Expr::empty();
    return Expr::repeat(Expr::cls({{' ', ' '}, {'\t', '\t'}, {'\n', '\n'}}), 0, opt_.max_ws);
  }
  Expr tok(const std::string& s) { return Expr::seq({ws(), Expr::literal(s), ws()}); }

  // Shared rules of the any-JSON grammar.
  int32_t any_rule(const std::string& which) {
    if (any_.empty()) {
      for (const char* n : {"json_value", "json_object", "json_array", "json_string", "json_number", "json_char"})
        any_[n] = b_.add_rule(n);
      const Expr hex = Expr::cls({{'0', '9'}, {'A', 'F'}, {'a', 'f'}});
      std::vector<CodeRange> plain = {{0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0x10FFFF}};
      if (opt_.no_fullwidth_bar) plain = {{0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0xFF5B}, {0xFF5D, 0x10FFFF}};
      b_.define(any_["json_char"],
                Expr::alt({Expr::cls(plain),
                           Expr::seq({Expr::literal("\\"),
                                      Expr::alt({Expr::cls({{'"', '"'},
                                                            {'\\', '\\'},
                                                            {'/', '/'},
                                                            {'b', 'b'},
                                                            {'f', 'f'},
                                                            {'n', 'n'},
                                                            {'r', 'r'},
                                                            {'t', 't'}}),
                                                 Expr::seq({Expr::literal("u"), Expr::repeat(hex, 4, 4)})})})}));
      b_.define(any_["json_string"],
                Expr::seq({Expr::literal("\""), Expr::star(Expr::ref(any_["json_char"])), Expr::literal("\"")}));
      b_.define(any_["json_number"], number_expr());
      const Expr v = Expr::ref(any_["json_value"]);
      const Expr kv = Expr::seq({Expr::ref(any_["json_string"]), tok(":"), v});
      b_.define(any_["json_object"],
                Expr::seq({Expr::literal("{"), ws(), Expr::opt(Expr::seq({kv, Expr::star(Expr::seq({tok(","), kv}))})),
                           ws(), Expr::literal("}")}));
      b_.define(any_["json_array"],
                Expr::seq({Expr::literal("["), ws(), Expr::opt(Expr::seq({v, Expr::star(Expr::seq({tok(","), v}))})),
                           ws(), Expr::literal("]")}));
      b_.define(any_["json_value"], Expr::alt({Expr::ref(any_["json_object"]), Expr::ref(any_["json_array"]),
                                               Expr::ref(any_["json_string"]), Expr::ref(any_["json_number"]),
                                               Expr::literal("true"), Expr::literal("false"), Expr::literal("null")}));
    }
    return any_.at(which);
  }

  static Expr number_expr() {
    const Expr d = Expr::cls({{'0', '9'}});
    return Expr::seq({Expr::opt(Expr::literal("-")),
                      Expr::alt({Expr::literal("0"), Expr::seq({Expr::cls({{'1', '9'}}), Expr::star(d)})}),
                      Expr::opt(Expr::seq({Expr::literal("."), Expr::plus(d)})),
                      Expr::opt(Expr::seq({Expr::cls({{'e', 'e'}, {'E', 'E'}}),
                                           Expr::opt(Expr::cls({{'+', '+'}, {'-', '-'}})), Expr::plus(d)}))});
  }

  [[noreturn]] static void err(const std::string& path, const std::string& what) {
    fail("json schema: {} at {}", what, path);
  }

  const json& resolve(const std::string& ref, const std::string& path) {
    if (ref.empty() || ref[0] != '#') err(path, "only local $ref ('#...') is supported, got '" + ref + "'");
    try {
      return root_.at(json::json_pointer(ref.substr(1)));
    } catch (const std::exception&) {
      err(path, "$ref '" + ref + "' does not resolve");
    }
  }

  Expr ref_expr(const std::string& ref, const std::string& path) {
    auto it = refs_.find(ref);
    if (it != refs_.end()) return Expr::ref(it->second);
    const json& target = resolve(ref, path);
    std::string name = ref.substr(ref.rfind('/') + 1);
    if (name.empty() || name == "#") name = "root_ref";
    const int32_t r = b_.add_rule(name);
    refs_[ref] = r;
    b_.define(r, schema(target, ref));
    return Expr::ref(r);
  }

  // Merges allOf parts into one schema object.
  json merge_all_of(const json& s, const std::string& path) {
    json out = s;
    out.erase("allOf");
    const json& parts = s.at("allOf");
    if (!parts.is_array() || parts.empty()) err(path + ".allOf", "allOf must be a non-empty array");
    for (size_t i = 0; i < parts.size(); ++i) {
      const std::string p = path + ".allOf[" + std::to_string(i) + "]";
      json part = parts[i];
      if (part.is_object() && part.contains("$ref")) {
        json t = resolve(part["$ref"].get<std::string>(), p);
        part.erase("$ref");
        for (auto& [k, v] : t.items())
          if (!part.contains(k)) part[k] = v;
      }
      if (part.is_object() && part.contains("allOf")) part = merge_all_of(part, p);
      if (part.is_boolean() && part.get<bool>()) continue;
      if (!part.is_object()) err(p, "allOf part must be an object schema");
      for (auto& [k, v] : part.items()) {
        if (k == "properties") {
          for (auto& [pk, pv] : v.items()) {
            if (out["properties"].contains(pk) && out["properties"][pk] != pv)
              err(p + ".properties." + pk, "allOf: property '" + pk + "' has two different schemas (cannot merge)");
            out["properties"][pk] = pv;
          }
        } else if (k == "required") {
          for (const json& r : v)
            if (!out.contains("required") ||
                std::find(out["required"].begin(), out["required"].end(), r) == out["required"].end())
              out["required"].push_back(r);
        } else if (out.contains(k) && out[k] != v) {
          err(p, "allOf: keyword '" + k + "' differs between the parts (cannot merge)");
        } else {
          out[k] = v;
        }
      }
    }
    return out;
  }

  Expr schema(const json& s, const std::string& path) {
    if (++depth_ > 200) err(path, "schema nested too deeply");
    Expr e = schema_inner(s, path);
    --depth_;
    return e;
  }

  Expr schema_inner(const json& s0, const std::string& path) {
    if (s0.is_boolean()) {
      if (s0.get<bool>()) return Expr::ref(any_rule("json_value"));
      err(path, "schema 'false' matches nothing");
    }
    if (!s0.is_object()) err(path, std::string("a schema must be an object or a boolean, got ") + s0.type_name());
    json merged;
    const json* sp = &s0;
    if (s0.contains("allOf")) {
      merged = merge_all_of(s0, path);
      sp = &merged;
    }
    const json& s = *sp;
    for (auto& [k, v] : s.items()) {
      if (kUnsupported.count(k)) err(path, "keyword '" + k + "' is not supported");
      if (k == "uniqueItems" && v == true) err(path, "keyword 'uniqueItems' is not supported");
    }
    if (s.contains("$ref")) {
      if (s.size() > 1) {
        // $ref next to other keywords: only annotations are allowed beside it.
        for (auto& [k, v] : s.items())
          if (k != "$ref" && k != "description" && k != "title" && k != "default" && k != "$comment" &&
              k != "examples" && k != "$defs" && k != "definitions" && k != "$schema" && k != "$id")
            err(path, "keyword '" + k + "' next to $ref is not supported");
      }
      return ref_expr(s["$ref"].get<std::string>(), path);
    }
    if (s.contains("const")) return Expr::literal(s["const"].dump());
    if (s.contains("enum")) {
      const json& en = s["enum"];
      if (!en.is_array() || en.empty()) err(path + ".enum", "enum must be a non-empty array");
      std::vector<Expr> alts;
      for (const json& v : en) alts.push_back(Expr::literal(v.dump()));
      return Expr::alt(std::move(alts));
    }
    for (const char* k : {"anyOf", "oneOf"}) {
      if (!s.contains(k)) continue;
      const json& parts = s[k];
      if (!parts.is_array() || parts.empty()) err(path + "." + k, std::string(k) + " must be a non-empty array");
      json base = s;
      base.erase(k);
      std::vector<Expr> alts;
      for (size_t i = 0; i < parts.size(); ++i) {
        json part = parts[i];
        // Keywords beside anyOf apply to every branch (e.g. a shared "type").
        if (part.is_object())
          for (auto& [bk, bv] : base.items())
            if (!part.contains(bk) && bk != "anyOf" && bk != "oneOf") part[bk] = bv;
        alts.push_back(schema(part, path + "." + k + "[" + std::to_string(i) + "]"));
      }
      return Expr::alt(std::move(alts));
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const json& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array()) {
        for (const json& x : t) types.push_back(x.get<std::string>());
      } else {
        err(path + ".type", "type must be a string or a list of strings");
      }
    } else {
      if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties"))
        types.push_back("object");
      else if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems") || s.contains("maxItems"))
        types.push_back("array");
      else if (s.contains("pattern") || s.contains("minLength") || s.contains("maxLength") || s.contains("format"))
        types.push_back("string");
      else if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") ||
               s.contains("exclusiveMaximum"))
        types.push_back("number");
      else
        return Expr::ref(any_rule("json_value"));
    }
    std::vector<Expr> alts;
    for (const std::string& t : types) alts.push_back(typed(t, s, path));
    return Expr::alt(std::move(alts));
  }

  Expr typed(const std::string& t, const json& s, const std::string& path) {
    if (t == "string") return string_expr(s, path);
    if (t == "integer") return integer_expr(s, path);
    if (t == "number") return number_bounded(s, path);
    if (t == "boolean") return Expr::alt({Expr::literal("true"), Expr::literal("false")});
    if (t == "null") return Expr::literal("null");
    if (t == "object") return object_expr(s, path);
    if (t == "array") return array_expr(s, path);
    err(path + ".type", "unknown type '" + t + "'");
  }

  Expr string_expr(const json& s, const std::string& path) {
    const bool has_len = s.contains("minLength") || s.contains("maxLength");
    std::string pattern;
    if (s.contains("pattern")) {
      pattern = s["pattern"].get<std::string>();
    } else if (s.contains("format")) {
      auto it = kFormats.find(s["format"].get<std::string>());
      if (it != kFormats.end()) pattern = it->second;
    }
    if (!pattern.empty()) {
      if (has_len) err(path, "pattern/format together with minLength/maxLength is not supported");
      try {
        return Expr::seq({Expr::literal("\""), regex_expr(pattern, b_, true), Expr::literal("\"")});
      } catch (const Error& e) {
        err(path + ".pattern", e.what());
      }
    }
    if (!has_len) return Expr::ref(any_rule("json_string"));
    const int64_t mn = s.value("minLength", int64_t{0});
    const int64_t mx = s.contains("maxLength") ? s["maxLength"].get<int64_t>() : -1;
    if (mn < 0 || (mx >= 0 && mx < mn)) err(path, "bad minLength/maxLength");
    if (mn > b_.limits().max_repeat || mx > b_.limits().max_repeat)
      err(path, fmt::format("minLength/maxLength over the limit {}", b_.limits().max_repeat));
    return Expr::seq(
        {Expr::literal("\""), Expr::repeat(Expr::ref(any_rule("json_char")), mn, mx), Expr::literal("\"")});
  }

  static std::optional<double> num(const json& s, const char* k) {
    if (!s.contains(k)) return std::nullopt;
    if (!s[k].is_number()) return std::nullopt;  // draft-4 boolean exclusive* handled by caller
    return s[k].get<double>();
  }

  void bounds(const json& s, const std::string& path, std::optional<double>& lo, bool& lo_ex, std::optional<double>& hi,
              bool& hi_ex) {
    lo = num(s, "minimum");
    hi = num(s, "maximum");
    lo_ex = hi_ex = false;
    if (s.contains("exclusiveMinimum")) {
      if (s["exclusiveMinimum"].is_boolean()) {
        lo_ex = s["exclusiveMinimum"].get<bool>();
      } else if (auto x = num(s, "exclusiveMinimum"); x && (!lo || *x >= *lo)) {
        lo = x;
        lo_ex = true;
      }
    }
    if (s.contains("exclusiveMaximum")) {
      if (s["exclusiveMaximum"].is_boolean()) {
        hi_ex = s["exclusiveMaximum"].get<bool>();
      } else if (auto x = num(s, "exclusiveMaximum"); x && (!hi || *x <= *hi)) {
        hi = x;
        hi_ex = true;
      }
    }
    constexpr double kLim = 9.0e15;
    if ((lo && std::fabs(*lo) > kLim) || (hi && std::fabs(*hi) > kLim))
      err(path, "numeric bounds beyond 9e15 are not supported");
  }

  Expr integer_expr(const json& s, const std::string& path) {
    std::optional<double> lo, hi;
    bool lo_ex, hi_ex;
    bounds(s, path, lo, lo_ex, hi, hi_ex);
    std::optional<int64_t> a, b;
    if (lo) a = static_cast<int64_t>(lo_ex ? std::floor(*lo) + 1 : std::ceil(*lo));
    if (hi) b = static_cast<int64_t>(hi_ex ? std::ceil(*hi) - 1 : std::floor(*hi));
    if (a && b && *a > *b) err(path, "the integer bounds leave no value");
    return int_range(a, b);
  }

  Expr number_bounded(const json& s, const std::string& path) {
    std::optional<double> lo, hi;
    bool lo_ex, hi_ex;
    bounds(s, path, lo, lo_ex, hi, hi_ex);
    if (!lo && !hi) return Expr::ref(any_rule("json_number"));
    auto integral = [](const std::optional<double>& x) { return !x || std::floor(*x) == *x; };
    if (!integral(lo) || !integral(hi)) err(path, "number bounds that are not integers are not supported");
    // Integer values (bounds applied with their exclusivity), then values with a nonzero fraction,
    // which lie strictly between two integers: i.f (i >= 0) needs a <= i and i + 1 <= b; -m.f (m >= 0)
    // needs a <= -(m + 1) and -m <= b.
    const Expr nonzero_frac =
        Expr::seq({Expr::literal("."), Expr::star(Expr::cls({{'0', '9'}})), Expr::cls({{'1', '9'}})});
    std::optional<int64_t> a, b;
    if (lo) a = static_cast<int64_t>(*lo);
    if (hi) b = static_cast<int64_t>(*hi);
    std::vector<Expr> alts;
    std::optional<int64_t> ai = a, bi = b;
    if (ai && lo_ex) *ai += 1;
    if (bi && hi_ex) *bi -= 1;
    if (!ai || !bi || *ai <= *bi) alts.push_back(int_range(ai, bi));
    {
      const int64_t l = a ? std::max<int64_t>(*a, 0) : 0;
      std::optional<int64_t> h;
      if (b) h = *b - 1;
      if (!h || *h >= l) alts.push_back(Expr::seq({int_range(l, h), nonzero_frac}));
    }
    {
      const int64_t l = b ? std::max<int64_t>(0, -*b) : 0;
      std::optional<int64_t> h;
      if (a) h = -*a - 1;
      if (!h || *h >= l) alts.push_back(Expr::seq({Expr::literal("-"), int_range(l, h), nonzero_frac}));
    }
    if (alts.empty()) err(path, "the number bounds leave no value");
    return Expr::alt(std::move(alts));
  }

  Expr object_expr(const json& s, const std::string& path) {
    struct Prop {
      std::string name;
      json schema;
      bool required;
    };
    std::vector<Prop> props;
    std::set<std::string> req;
    if (s.contains("required"))
      for (const json& r : s["required"]) req.insert(r.get<std::string>());
    if (s.contains("properties")) {
      if (!s["properties"].is_object()) err(path + ".properties", "properties must be an object");
      for (auto& [k, v] : s["properties"].items()) props.push_back({k, v, req.count(k) > 0});
    }
    json addl = opt_.default_additional_properties ? json(true) : json(false);
    if (s.contains("additionalProperties")) addl = s["additionalProperties"];
    for (const std::string& r : req) {
      bool found = false;
      for (const Prop& p : props) found |= p.name == r;
      if (!found) {
        if (addl.is_boolean() && !addl.get<bool>() && s.contains("additionalProperties"))
          err(path + ".required", "required property '" + r + "' is not allowed by additionalProperties: false");
        props.push_back({r, addl.is_boolean() ? json(true) : addl, true});
      }
    }
    const bool extra = !(addl.is_boolean() && !addl.get<bool>());
    auto kv = [&](const Prop& p, size_t i) {
      return Expr::seq({Expr::literal(json(p.name).dump()), tok(":"),
                        schema(p.schema, path + ".properties." + p.name + (i == SIZE_MAX ? "" : ""))});
    };
    Expr extra_kv;
    if (extra)
      extra_kv =
          Expr::seq({Expr::ref(any_rule("json_string")), tok(":"), schema(addl, path + ".additionalProperties")});
    // S_i: the rest from property i when something was emitted; F_i: when nothing was.
    const size_t n = props.size();
    std::vector<int32_t> S(n + 1), F(n + 1);
    const std::string base = "obj" + std::to_string(b_.num_rules());
    for (size_t i = 0; i <= n; ++i) {
      S[i] = b_.add_rule(base + "_s" + std::to_string(i));
      F[i] = b_.add_rule(base + "_f" + std::to_string(i));
    }
    if (extra) {
      b_.define(S[n], Expr::star(Expr::seq({tok(","), extra_kv})));
      b_.define(F[n], Expr::opt(Expr::seq({extra_kv, Expr::ref(S[n])})));
    } else {
      b_.define(S[n], Expr::empty());
      b_.define(F[n], Expr::empty());
    }
    for (size_t i = n; i-- > 0;) {
      Expr item = kv(props[i], i);
      if (props[i].required) {
        b_.define(S[i], Expr::seq({tok(","), item, Expr::ref(S[i + 1])}));
        b_.define(F[i], Expr::seq({item, Expr::ref(S[i + 1])}));
      } else {
        b_.define(S[i], Expr::seq({Expr::opt(Expr::seq({tok(","), item})), Expr::ref(S[i + 1])}));
        b_.define(F[i], Expr::alt({Expr::seq({item, Expr::ref(S[i + 1])}), Expr::ref(F[i + 1])}));
      }
    }
    return Expr::seq({Expr::literal("{"), ws(), Expr::ref(F[0]), ws(), Expr::literal("}")});
  }

  Expr array_expr(const json& s, const std::string& path) {
    std::vector<json> prefix;
    json items = true;
    if (s.contains("prefixItems")) {
      for (const json& x : s["prefixItems"]) prefix.push_back(x);
      if (s.contains("items")) items = s["items"];
    } else if (s.contains("items") && s["items"].is_array()) {  // draft 4-7 tuple form
      for (const json& x : s["items"]) prefix.push_back(x);
      if (s.contains("additionalItems")) items = s["additionalItems"];
    } else if (s.contains("items")) {
      items = s["items"];
    }
    const int64_t p = static_cast<int64_t>(prefix.size());
    int64_t mn = s.value("minItems", int64_t{0});
    int64_t mx = s.contains("maxItems") ? s["maxItems"].get<int64_t>() : -1;
    const bool no_more = items.is_boolean() && !items.get<bool>();
    if (no_more) mx = mx < 0 ? p : std::min(mx, p);
    if (mn < 0 || (mx >= 0 && mx < mn)) err(path, "minItems/maxItems leave no array");
    if (mn > b_.limits().max_repeat || mx > b_.limits().max_repeat)
      err(path, fmt::format("minItems/maxItems over the limit {}", b_.limits().max_repeat));
    std::vector<Expr> elems;
    for (int64_t i = 0; i < p; ++i)
      elems.push_back(schema(prefix[static_cast<size_t>(i)], path + ".prefixItems[" + std::to_string(i) + "]"));
    Expr rest_item;
    if (mx < 0 || mx > p) {
      const int32_t r = b_.add_rule("item");
      b_.define(r, schema(items, path + ".items"));
      rest_item = Expr::ref(r);
    }
    auto elem = [&](int64_t k) {
      Expr v = k < p ? elems[static_cast<size_t>(k)] : rest_item;
      return k == 0 ? v : Expr::seq({tok(","), v});
    };
    // tail(k): the elements from index k on, given k are there.
    std::function<Expr(int64_t)> tail = [&](int64_t k) -> Expr {
      if (mx >= 0 && k >= mx) return Expr::empty();
      if (k >= p) {
        const int64_t lo = std::max<int64_t>(0, mn - k);
        const int64_t hi = mx < 0 ? -1 : mx - k;
        if (k == 0) {
          // no element yet: first without comma
          Expr more =
              Expr::repeat(Expr::seq({tok(","), rest_item}), std::max<int64_t>(0, lo - 1), hi < 0 ? -1 : hi - 1);
          Expr some = Expr::seq({rest_item, more});
          return lo > 0 ? some : Expr::opt(some);
        }
        return Expr::repeat(Expr::seq({tok(","), rest_item}), lo, hi);
      }
      Expr here = Expr::seq({elem(k), tail(k + 1)});
      return k < mn ? here : Expr::opt(here);
    };
    return Expr::seq({Expr::literal("["), ws(), tail(0), ws(), Expr::literal("]")});
  }

  const json& root_;
  const JsonOptions& opt_;
  GrammarBuilder& b_;
  std::map<std::string, int32_t> any_;
  std::map<std::string, int32_t> refs_;
  int depth_ = 0;
};

}  // namespace

Grammar json_schema_grammar(const nlohmann::json& schema, const JsonOptions& opt, GrammarLimits limits) {
  return json_schema_grammar(nlohmann::ordered_json::parse(schema.dump()), opt, limits);
}

Grammar json_schema_grammar(const nlohmann::ordered_json& schema, const JsonOptions& opt, GrammarLimits limits) {
  GrammarBuilder b(limits);
  SchemaCompiler c(schema, opt, b);
  const int32_t root = c.compile_root();
  return b.build(root);
}

Expr json_schema_expr(const nlohmann::ordered_json& root, const nlohmann::ordered_json& schema, GrammarBuilder& b,
                      const JsonOptions& opt, const std::string& path) {
  SchemaCompiler c(root, opt, b);
  return c.schema(schema, path);
}

Grammar json_object_grammar(const JsonOptions& opt, GrammarLimits limits) {
  GrammarBuilder b(limits);
  SchemaCompiler c(nlohmann::ordered_json::object(), opt, b);
  const int32_t root = b.add_rule("root");
  b.define(root, Expr::seq({c.ws(), Expr::ref(c.any_rule("json_object")), c.ws()}));
  return b.build(root);
}

}  // namespace deepinfer::structured
