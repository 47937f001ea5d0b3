// EBNF -> Grammar. The dialect is GBNF's (llama.cpp), which xgrammar also reads:
//   grammar   ::= rule+                       rules are separated by whitespace/newlines
//   rule      ::= name "::=" alternatives     name: [A-Za-z_][A-Za-z0-9_.-]*
//   alternatives ::= sequence ("|" sequence)*
//   sequence  ::= (item quantifier?)*         an empty sequence matches ""
//   item      ::= "literal" | 'literal' | [class] | [^class] | name | "(" alternatives ")" | "."
//   quantifier ::= "?" | "*" | "+" | "{" m "}" | "{" m "," "}" | "{" m "," n "}" | "{" "," n "}"
// Literals and classes take the escapes \n \t \r \f \v \0 \\ \" \' \] \- \[ \/ \xHH \uHHHH \UHHHHHHHH;
// a class holds code points and ranges a-z; "." is any character. `#` starts a comment to the end of
// the line. The start rule is `root`. Errors name the line and column.
#include <cctype>

#include "deepinfer/error.h"
#include "structured/structured.h"

namespace deepinfer::structured {

namespace {

class EbnfParser {
 public:
  EbnfParser(std::string_view t, GrammarBuilder& b) : t_(t), b_(b) {}

  void parse() {
    skip();
    while (i_ < t_.size()) {
      const size_t at = i_;
      const std::string name = ident();
      if (name.empty()) err("expected a rule name");
      skip();
      if (t_.substr(i_, 3) != "::=") err("expected '::=' after rule name '" + name + "'");
      i_ += 3;
      const int32_t r = rule_id(name, at);
      if (b_.defined(r)) {
        i_ = at;
        err("rule '" + name + "' is defined twice");
      }
      defined_at_[r] = at;
      b_.define(r, alternatives());
      skip();
    }
    for (int32_t r = 0; r < b_.num_rules(); ++r)
      if (!b_.defined(r)) {
        i_ = first_use_[r];
        err("rule '" + b_.name(r) + "' is used but never defined");
      }
  }

 private:
  [[noreturn]] void err(const std::string& what) const {
    size_t line = 1, col = 1;
    for (size_t k = 0; k < i_ && k < t_.size(); ++k) {
      if (t_[k] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    fail("ebnf: {} at line {} column {}", what, line, col);
  }

  void skip() {
    while (i_ < t_.size()) {
      if (std::isspace(static_cast<unsigned char>(t_[i_]))) {
        ++i_;
      } else if (t_[i_] == '#') {
        while (i_ < t_.size() && t_[i_] != '\n') ++i_;
      } else {
        break;
      }
    }
  }

  static bool name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
  static bool name_char(char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
  }
  std::string ident() {
    if (i_ >= t_.size() || !name_start(t_[i_])) return {};
    const size_t s = i_;
    while (i_ < t_.size() && name_char(t_[i_])) ++i_;
    return std::string(t_.substr(s, i_ - s));
  }

  int32_t rule_id(const std::string& name, size_t at) {
    int32_t r = b_.find_rule(name);
    if (r < 0) {
      r = b_.add_rule(name);
      first_use_[r] = at;
    }
    return r;
  }

  bool rule_starts_here() {  // a name followed by ::= (the next rule)
    const size_t save = i_;
    const std::string n = ident();
    skip();
    const bool yes = !n.empty() && t_.substr(i_, 3) == "::=";
    i_ = save;
    return yes;
  }

  Expr alternatives() {
    std::vector<Expr> alts{sequence()};
    while (i_ < t_.size() && t_[i_] == '|') {
      ++i_;
      alts.push_back(sequence());
    }
    return Expr::alt(std::move(alts));
  }

  uint32_t hex(int n) {
    uint32_t v = 0;
    for (int k = 0; k < n; ++k) {
      if (i_ >= t_.size() || !std::isxdigit(static_cast<unsigned char>(t_[i_]))) err("bad hex escape");
      const char c = t_[i_++];
      v = v * 16 +
          static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : std::tolower(c) - 'a' + 10);
    }
    if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) err("escape is not a Unicode scalar value");
    return v;
  }

  uint32_t code_point() {
    if (i_ >= t_.size()) err("unexpected end of grammar");
    if (t_[i_] == '\\') {
      ++i_;
      if (i_ >= t_.size()) err("trailing backslash");
      const char c = t_[i_++];
      switch (c) {
        case 'n':
          return '\n';
        case 't':
          return '\t';
        case 'r':
          return '\r';
        case 'f':
          return '\f';
        case 'v':
          return '\v';
        case '0':
          return 0;
        case 'x':
          return hex(2);
        case 'u':
          return hex(4);
        case 'U':
          return hex(8);
        case '\\':
        case '"':
        case '\'':
        case ']':
        case '[':
        case '-':
        case '/':
        case '^':
          return static_cast<uint8_t>(c);
        default:
          --i_;
          err(std::string("unknown escape \\") + c);
      }
    }
    const unsigned char c = static_cast<unsigned char>(t_[i_]);
    const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i_ + static_cast<size_t>(n) > t_.size()) err("invalid UTF-8");
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(t_[i_ + static_cast<size_t>(k)]) & 0x3F);
    i_ += static_cast<size_t>(n);
    return cp;
  }

  int64_t integer() {
    if (i_ >= t_.size() || !std::isdigit(static_cast<unsigned char>(t_[i_]))) err("expected a number");
    int64_t v = 0;
    while (i_ < t_.size() && std::isdigit(static_cast<unsigned char>(t_[i_]))) {
      v = std::min<int64_t>(v * 10 + (t_[i_] - '0'), int64_t{1} << 40);
      ++i_;
    }
    if (v > b_.limits().max_repeat)
      err(fmt::format("repetition count {} exceeds the limit {}", v, b_.limits().max_repeat));
    return v;
  }

  Expr item() {
    const char c = t_[i_];
    if (c == '"' || c == '\'') {
      ++i_;
      std::string s;
      while (true) {
        if (i_ >= t_.size() || t_[i_] == '\n') err("unterminated string literal");
        if (t_[i_] == c) {
          ++i_;
          break;
        }
        s += utf8_encode(code_point());
      }
      return Expr::literal(std::move(s));
    }
    if (c == '[') {
      ++i_;
      bool neg = false;
      if (i_ < t_.size() && t_[i_] == '^') {
        neg = true;
        ++i_;
      }
      std::vector<CodeRange> r;
      while (true) {
        if (i_ >= t_.size()) err("unterminated character class");
        if (t_[i_] == ']') {
          ++i_;
          break;
        }
        const uint32_t lo = code_point();
        uint32_t hi = lo;
        if (i_ + 1 < t_.size() && t_[i_] == '-' && t_[i_ + 1] != ']') {
          ++i_;
          hi = code_point();
          if (hi < lo) err("bad character range");
        }
        r.push_back({lo, hi});
      }
      Expr e = Expr::cls(std::move(r), neg);
      if (e.ranges.empty()) err("character class matches nothing");
      return e;
    }
    if (c == '(') {
      ++i_;
      skip();
      Expr e = alternatives();
      if (i_ >= t_.size() || t_[i_] != ')') err("missing ')'");
      ++i_;
      return e;
    }
    if (c == '.') {
      ++i_;
      return Expr::cls({}, true);
    }
    if (name_start(c)) {
      const size_t at = i_;
      const std::string n = ident();
      return Expr::ref(rule_id(n, at));
    }
    err(std::string("unexpected character '") + c + "'");
  }

  Expr sequence() {
    std::vector<Expr> items;
    while (true) {
      skip();
      if (i_ >= t_.size() || t_[i_] == '|' || t_[i_] == ')') break;
      if (rule_starts_here()) break;
      Expr e = item();
      while (i_ < t_.size()) {
        const char q = t_[i_];
        if (q == '?' || q == '*' || q == '+') {
          ++i_;
          e = Expr::repeat(std::move(e), q == '+' ? 1 : 0, q == '?' ? 1 : -1);
        } else if (q == '{') {
          ++i_;
          skip();
          int64_t mn = 0, mx = -1;
          if (i_ < t_.size() && t_[i_] == ',') {
            ++i_;
            skip();
            mx = integer();
          } else {
            mn = integer();
            skip();
            if (i_ < t_.size() && t_[i_] == ',') {
              ++i_;
              skip();
              if (i_ < t_.size() && t_[i_] != '}') mx = integer();
            } else {
              mx = mn;
            }
          }
          skip();
          if (i_ >= t_.size() || t_[i_] != '}') err("expected '}'");
          if (mx >= 0 && mx < mn) err("bad repetition bounds (min > max)");
          ++i_;
          e = Expr::repeat(std::move(e), mn, mx);
        } else {
          break;
        }
      }
      items.push_back(std::move(e));
    }
    if (items.empty()) return Expr::empty();
    return Expr::seq(std::move(items));
  }

  std::string_view t_;
  GrammarBuilder& b_;
  size_t i_ = 0;
  std::unordered_map<int32_t, size_t> first_use_, defined_at_;
};

}  // namespace

Grammar ebnf_grammar(std::string_view text, const std::string& root, GrammarLimits limits) {
  GrammarBuilder b(limits);
  EbnfParser(text, b).parse();
  const int32_t r = b.find_rule(root);
  DI_CHECK(r >= 0, "ebnf: the grammar has no '{}' rule (the start rule)", root);
  return b.build(r);
}

}  // namespace deepinfer::structured
