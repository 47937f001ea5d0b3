// Regex -> Expr: the subset of Python `re` that JSON Schema `pattern`s and users write. The whole
// text must match (a leading ^ and trailing $ are accepted and implied). Supported: literals (UTF-8),
// escapes \n \t \r \f \v \0 \xHH \uHHHH \UHHHHHHHH and escaped punctuation, classes [...] / [^...]
// with ranges and \d \w \s \D \W \S inside or outside (ASCII meanings: \d = [0-9], \w =
// [A-Za-z0-9_], \s = [ \t\n\r\f\v]), `.` (any character but \n), groups (...), (?:...), (?P<n>...),
// alternation |, quantifiers ? * + {m} {m,} {m,n} {,n} (lazy/possessive suffixes ignored: only the
// language matters). Not supported (an error names it): backreferences, lookaround, \b \B, inline
// flags, anchors in the middle.
#include <cctype>

#include "deepinfer/error.h"
#include "structured/structured.h"

namespace deepinfer::structured {

namespace {

const std::vector<CodeRange> kDigit = {{'0', '9'}};
const std::vector<CodeRange> kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const std::vector<CodeRange> kSpace = {{'\t', '\r'}, {' ', ' '}};

class RegexParser {
 public:
  RegexParser(std::string_view p, bool json) : p_(p), json_(json) {}

  Expr parse() {
    if (peek('^')) ++i_;
    Expr e = alt();
    if (i_ < p_.size()) err(p_[i_] == ')' ? "unbalanced ')'" : "unexpected character");
    return e;
  }

 private:
  [[noreturn]] void err(const std::string& what) const {
    fail("regex: {} at position {} in '{}'", what, i_, std::string(p_));
  }
  bool peek(char c) const { return i_ < p_.size() && p_[i_] == c; }
  bool at_end_anchor() const { return peek('$') && i_ + 1 == p_.size(); }

  uint32_t next_cp() {
    const unsigned char c = static_cast<unsigned char>(p_[i_]);
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i_ + static_cast<size_t>(n) > p_.size()) err("invalid UTF-8");
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(p_[i_ + static_cast<size_t>(k)]) & 0x3F);
    i_ += static_cast<size_t>(n);
    return cp;
  }

  uint32_t hex(int digits) {
    uint32_t v = 0;
    for (int k = 0; k < digits; ++k) {
      if (i_ >= p_.size() || !std::isxdigit(static_cast<unsigned char>(p_[i_]))) err("bad hex escape");
      const char c = p_[i_++];
      v = v * 16 +
          static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : (std::tolower(c) - 'a' + 10));
    }
    if (v > 0x10FFFF) err("code point out of range");
    return v;
  }

  // After a backslash: a class (\d...) into `cls` (returns true) or one code point into `cp`.
  bool escape(std::vector<CodeRange>& cls, uint32_t& cp, bool in_class) {
    if (i_ >= p_.size()) err("trailing backslash");
    const char c = p_[i_++];
    switch (c) {
      case 'd':
        cls = kDigit;
        return true;
      case 'w':
        cls = kWord;
        return true;
      case 's':
        cls = kSpace;
        return true;
      case 'D':
        cls = complement_ranges(kDigit);
        return true;
      case 'W':
        cls = complement_ranges(kWord);
        return true;
      case 'S':
        cls = complement_ranges(kSpace);
        return true;
      case 'n':
        cp = '\n';
        return false;
      case 't':
        cp = '\t';
        return false;
      case 'r':
        cp = '\r';
        return false;
      case 'f':
        cp = '\f';
        return false;
      case 'v':
        cp = '\v';
        return false;
      case '0':
        cp = 0;
        return false;
      case 'a':
        cp = 7;
        return false;
      case 'x':
        cp = hex(2);
        return false;
      case 'u':
        cp = hex(4);
        return false;
      case 'U':
        cp = hex(8);
        return false;
      case 'b':
        if (in_class) {
          cp = 8;
          return false;
        }
        --i_;
        err("word boundary \\b is not supported");
      case 'B':
        --i_;
        err("\\B is not supported");
      case 'A':
      case 'Z':
      case 'z':
        --i_;
        err("anchors \\A \\Z are not supported");
      default:
        break;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      --i_;
      err("backreferences are not supported");
    }
    if (std::isalpha(static_cast<unsigned char>(c))) {
      --i_;
      err(std::string("unknown escape \\") + c);
    }
    --i_;
    cp = next_cp();
    return false;
  }

  Expr char_class() {  // after '['
    bool neg = false;
    if (peek('^')) {
      neg = true;
      ++i_;
    }
    std::vector<CodeRange> r;
    bool first = true;
    while (true) {
      if (i_ >= p_.size()) err("unterminated character class");
      if (p_[i_] == ']' && !first) {
        ++i_;
        break;
      }
      first = false;
      uint32_t lo;
      std::vector<CodeRange> cls;
      if (p_[i_] == '\\') {
        ++i_;
        if (escape(cls, lo, true)) {
          r.insert(r.end(), cls.begin(), cls.end());
          continue;
        }
      } else {
        lo = next_cp();
      }
      uint32_t hi = lo;
      if (peek('-') && i_ + 1 < p_.size() && p_[i_ + 1] != ']') {
        ++i_;
        if (p_[i_] == '\\') {
          ++i_;
          if (escape(cls, hi, true)) err("a class escape cannot end a range");
        } else {
          hi = next_cp();
        }
        if (hi < lo) err("bad character range");
      }
      r.push_back({lo, hi});
    }
    return char_expr(neg ? complement_ranges(r) : normalize_ranges(r), json_);
  }

  Expr alt() {
    std::vector<Expr> alts{seq()};
    while (peek('|')) {
      ++i_;
      alts.push_back(seq());
    }
    return Expr::alt(std::move(alts));
  }

  bool read_int(int64_t& v) {
    const size_t s = i_;
    v = 0;
    while (i_ < p_.size() && std::isdigit(static_cast<unsigned char>(p_[i_]))) {
      v = std::min<int64_t>(v * 10 + (p_[i_] - '0'), int64_t{1} << 40);
      ++i_;
    }
    return i_ > s;
  }

  // A {m,n} quantifier at i_ (which is '{'); false (i_ unchanged) when it is a literal '{'.
  bool brace(int64_t& mn, int64_t& mx) {
    const size_t save = i_;
    ++i_;
    int64_t a = 0, b = -1;
    const bool has_a = read_int(a);
    if (peek('}')) {
      if (!has_a) {
        i_ = save;
        return false;
      }
      ++i_;
      mn = mx = a;
      return true;
    }
    if (!peek(',')) {
      i_ = save;
      return false;
    }
    ++i_;
    const bool has_b = read_int(b);
    if (!peek('}')) {
      i_ = save;
      return false;
    }
    ++i_;
    mn = has_a ? a : 0;
    mx = has_b ? b : -1;
    if (mx >= 0 && mx < mn) {
      i_ = save;
      err("bad repetition bounds (min > max)");
    }
    return true;
  }

  Expr seq() {
    std::vector<Expr> items;
    while (i_ < p_.size() && p_[i_] != '|' && p_[i_] != ')') {
      if (at_end_anchor()) {
        ++i_;
        break;
      }
      Expr a = atom();
      while (i_ < p_.size()) {
        int64_t mn, mx;
        const size_t qpos = i_;
        if (peek('*')) {
          ++i_;
          mn = 0, mx = -1;
        } else if (peek('+')) {
          ++i_;
          mn = 1, mx = -1;
        } else if (peek('?')) {
          ++i_;
          mn = 0, mx = 1;
        } else if (peek('{') && brace(mn, mx)) {
        } else {
          break;
        }
        if (peek('?') || peek('+')) ++i_;  // lazy / possessive: same language
        if (a.kind == Expr::Kind::kEmpty) {
          i_ = qpos;
          err("nothing to repeat");
        }
        a = Expr::repeat(std::move(a), mn, mx);
      }
      items.push_back(std::move(a));
    }
    if (items.empty()) return Expr::empty();
    return Expr::seq(std::move(items));
  }

  Expr atom() {
    const char c = p_[i_];
    if (c == '(') {
      ++i_;
      if (peek('?')) {
        ++i_;
        if (peek(':')) {
          ++i_;
        } else if (peek('P') && i_ + 1 < p_.size() && p_[i_ + 1] == '<') {
          const size_t close = p_.find('>', i_);
          if (close == std::string_view::npos) err("unterminated group name");
          i_ = close + 1;
        } else if (peek('=') || peek('!') || peek('<')) {
          err("lookaround assertions are not supported");
        } else {
          err("inline flags and other (?...) groups are not supported");
        }
      }
      Expr e = alt();
      if (!peek(')')) err("missing ')'");
      ++i_;
      return e;
    }
    if (c == '[') {
      ++i_;
      return char_class();
    }
    if (c == '.') {
      ++i_;
      return char_expr(complement_ranges({{'\n', '\n'}}), json_);
    }
    if (c == '^') err("'^' is only supported at the start");
    if (c == '$') err("'$' is only supported at the end");
    if (c == '*' || c == '+' || c == '?') err("nothing to repeat");
    if (c == '\\') {
      ++i_;
      std::vector<CodeRange> cls;
      uint32_t cp;
      if (escape(cls, cp, false)) return char_expr(normalize_ranges(cls), json_);
      return char_expr({{cp, cp}}, json_);
    }
    const uint32_t cp = next_cp();
    return char_expr({{cp, cp}}, json_);
  }

  std::string_view p_;
  bool json_;
  size_t i_ = 0;
};

}  // namespace

Expr char_expr(const std::vector<CodeRange>& ranges, bool json_string) {
  if (!json_string) {
    if (ranges.size() == 1 && ranges[0].lo == ranges[0].hi) return Expr::literal(utf8_encode(ranges[0].lo));
    return Expr::cls(ranges);
  }
  // JSON string content: everything but '"', '\\' and U+0000..U+001F stands for itself.
  std::vector<CodeRange> plain;
  std::vector<Expr> alts;
  for (const CodeRange& r : ranges) {
    for (uint32_t c = r.lo; c <= std::min<uint32_t>(r.hi, 0x1F); ++c) {
      switch (c) {
        case '\n':
          alts.push_back(Expr::literal("\\n"));
          break;
        case '\t':
          alts.push_back(Expr::literal("\\t"));
          break;
        case '\r':
          alts.push_back(Expr::literal("\\r"));
          break;
        case '\b':
          alts.push_back(Expr::literal("\\b"));
          break;
        case '\f':
          alts.push_back(Expr::literal("\\f"));
          break;
        default:
          alts.push_back(Expr::literal(fmt::format("\\u{:04x}", c)));
      }
    }
    if (r.lo <= '"' && r.hi >= '"') alts.push_back(Expr::literal("\\\""));
    if (r.lo <= '\\' && r.hi >= '\\') alts.push_back(Expr::literal("\\\\"));
    plain.push_back({std::max<uint32_t>(r.lo, 0x20), r.hi});
  }
  std::vector<CodeRange> cut;
  for (const CodeRange& r : plain) {
    if (r.lo > r.hi) continue;
    uint32_t lo = r.lo;
    for (uint32_t x : {uint32_t{'"'}, uint32_t{'\\'}}) {
      if (x < lo || x > r.hi) continue;
      if (x > lo) cut.push_back({lo, x - 1});
      lo = x + 1;
    }
    if (lo <= r.hi) cut.push_back({lo, r.hi});
  }
  cut = normalize_ranges(cut);
  if (!cut.empty()) {
    if (cut.size() == 1 && cut[0].lo == cut[0].hi)
      alts.insert(alts.begin(), Expr::literal(utf8_encode(cut[0].lo)));
    else
      alts.insert(alts.begin(), Expr::cls(cut));
  }
  DI_CHECK(!alts.empty(), "regex: a character class matches nothing");
  return Expr::alt(std::move(alts));
}

Expr regex_expr(std::string_view pattern, GrammarBuilder&, bool json_string) {
  return RegexParser(pattern, json_string).parse();
}

Grammar regex_grammar(std::string_view pattern, GrammarLimits limits) {
  GrammarBuilder b(limits);
  const int32_t root = b.add_rule("root");
  b.define(root, regex_expr(pattern, b, false));
  return b.build(root);
}

Grammar choice_grammar(const std::vector<std::string>& choices, GrammarLimits limits) {
  DI_CHECK(!choices.empty(), "choice: the list of choices is empty");
  GrammarBuilder b(limits);
  const int32_t root = b.add_rule("root");
  std::vector<Expr> alts;
  for (const std::string& c : choices) alts.push_back(Expr::literal(c));
  b.define(root, Expr::alt(std::move(alts)));
  return b.build(root);
}

}  // namespace deepinfer::structured
