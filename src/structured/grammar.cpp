#include "structured/grammar.h"

#include <algorithm>
#include <bit>
#include <functional>
#include <map>

#include "deepinfer/error.h"

namespace deepinfer::structured {

namespace {
constexpr uint32_t kMaxCp = 0x10FFFF;

// One UTF-8 byte-range sequence: bytes i in [lo[i], hi[i]].
struct Utf8Seq {
  int n = 0;
  uint8_t lo[4] = {0, 0, 0, 0}, hi[4] = {0, 0, 0, 0};
};

int utf8_len(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

void encode_fixed(uint32_t cp, int n, uint8_t* out) {
  if (n == 1) {
    out[0] = static_cast<uint8_t>(cp);
  } else if (n == 2) {
    out[0] = static_cast<uint8_t>(0xC0 | (cp >> 6));
    out[1] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
  } else if (n == 3) {
    out[0] = static_cast<uint8_t>(0xE0 | (cp >> 12));
    out[1] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
    out[2] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
  } else {
    out[0] = static_cast<uint8_t>(0xF0 | (cp >> 18));
    out[1] = static_cast<uint8_t>(0x80 | ((cp >> 12) & 0x3F));
    out[2] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
    out[3] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
  }
}

// Splits [lo, hi] (no surrogates inside) into UTF-8 sequences of byte ranges (the algorithm of Rust's
// regex-syntax Utf8Sequences).
void utf8_split(uint32_t lo, uint32_t hi, std::vector<Utf8Seq>& out) {
  if (lo > hi) return;
  static const uint32_t kBound[] = {0x7F, 0x7FF, 0xFFFF};
  for (uint32_t b : kBound)
    if (lo <= b && hi > b) {
      utf8_split(lo, b, out);
      utf8_split(b + 1, hi, out);
      return;
    }
  const int n = utf8_len(lo);
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (uint32_t{1} << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_split(lo, lo | m, out);
        utf8_split((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_split(lo, (hi & ~m) - 1, out);
        utf8_split(hi & ~m, hi, out);
        return;
      }
    }
  }
  Utf8Seq s;
  s.n = n;
  encode_fixed(lo, n, s.lo);
  encode_fixed(hi, n, s.hi);
  out.push_back(s);
}

struct SetHash {
  size_t operator()(const ByteSet& s) const {
    uint64_t h = 0x9E3779B97F4A7C15ull;
    for (uint64_t w : s.w) h = (h ^ w) * 0xFF51AFD7ED558CCDull;
    return static_cast<size_t>(h ^ (h >> 29));
  }
};

class Lowering {
 public:
  using Seq = std::vector<Grammar::Elem>;
  Lowering(const GrammarBuilder& b, const GrammarLimits& lim) : b_(b), lim_(lim) {
    rules_.resize(static_cast<size_t>(b.num_rules()));
    loops_.resize(rules_.size());
    for (int32_t i = 0; i < b.num_rules(); ++i) names_.push_back(b.name(i));
  }

  void lower_rule(int32_t r, const Expr& body) {
    std::vector<Seq> alts;
    if (body.kind == Expr::Kind::kAlt) {
      for (const Expr& e : body.items) {
        Seq s;
        lower(e, s);
        alts.push_back(std::move(s));
      }
    } else {
      Seq s;
      lower(body, s);
      alts.push_back(std::move(s));
    }
    rules_[static_cast<size_t>(r)] = std::move(alts);
  }

  Grammar finish(int32_t root) {
    Grammar g;
    g.root = root;
    g.sets = std::move(sets_);
    g.names = std::move(names_);
    g.loops = std::move(loops_);
    g.alts.resize(rules_.size());
    for (size_t r = 0; r < rules_.size(); ++r)
      for (const Seq& s : rules_[r]) {
        g.alts[r].push_back(static_cast<int32_t>(g.elems.size()));
        g.elems.insert(g.elems.end(), s.begin(), s.end());
        g.elems.push_back({Grammar::Kind::kEnd, 0});
      }
    DI_CHECK(static_cast<int64_t>(g.elems.size()) <= lim_.max_elements,
             "grammar: too large ({} elements, the limit is {})", g.elems.size(), lim_.max_elements);
    return g;
  }

 private:
  int32_t empty_rule() {
    if (empty_ < 0) empty_ = new_rule("empty");  // ::= ""
    if (rules_[static_cast<size_t>(empty_)].empty()) rules_[static_cast<size_t>(empty_)].push_back(Seq{});
    return empty_;
  }
  int32_t new_rule(const std::string& base) {
    DI_CHECK(static_cast<int64_t>(rules_.size()) < lim_.max_rules, "grammar: too many rules (limit {})",
             lim_.max_rules);
    rules_.emplace_back();
    loops_.emplace_back();
    names_.push_back(base + "_" + std::to_string(rules_.size() - 1));
    return static_cast<int32_t>(rules_.size() - 1);
  }
  void count(int64_t n) {
    total_ += n;
    DI_CHECK(total_ <= lim_.max_elements, "grammar: too large (over {} elements)", lim_.max_elements);
  }
  Grammar::Elem term(const ByteSet& s) {
    auto it = set_index_.find(s);
    if (it != set_index_.end()) return {Grammar::Kind::kTerm, it->second};
    const int32_t id = static_cast<int32_t>(sets_.size());
    sets_.push_back(s);
    set_index_.emplace(s, id);
    return {Grammar::Kind::kTerm, id};
  }
  Grammar::Elem rule_elem(int32_t r) { return {Grammar::Kind::kRule, r}; }

  // The expression as one element (a term or a rule reference), making a helper rule when needed.
  Grammar::Elem as_elem(const Expr& e) {
    Seq s;
    lower(e, s);
    if (s.size() == 1) return s[0];
    const int32_t r = new_rule("group");
    rules_[static_cast<size_t>(r)].push_back(std::move(s));
    return rule_elem(r);
  }

  void lower_class(const Expr& e, Seq& out) {
    if (e.byte_class) {
      ByteSet s;
      for (const CodeRange& r : e.ranges)
        for (uint32_t c = r.lo; c <= r.hi && c < 256; ++c) s.set(static_cast<uint8_t>(c));
      count(1);
      out.push_back(term(s));
      return;
    }
    std::vector<Utf8Seq> seqs;
    for (const CodeRange& r : e.ranges) utf8_split(r.lo, std::min(r.hi, kMaxCp), seqs);
    ByteSet ascii;
    bool has_ascii = false;
    std::vector<Seq> alts;
    for (const Utf8Seq& s : seqs) {
      if (s.n == 1) {
        for (uint32_t c = s.lo[0]; c <= s.hi[0]; ++c) ascii.set(static_cast<uint8_t>(c));
        has_ascii = true;
        continue;
      }
      Seq a;
      for (int i = 0; i < s.n; ++i) {
        ByteSet b;
        for (uint32_t c = s.lo[i]; c <= s.hi[i]; ++c) b.set(static_cast<uint8_t>(c));
        a.push_back(term(b));
      }
      count(s.n);
      alts.push_back(std::move(a));
    }
    if (alts.empty()) {
      DI_CHECK(has_ascii, "grammar: a character class matches nothing");
      count(1);
      out.push_back(term(ascii));
      return;
    }
    if (has_ascii) alts.insert(alts.begin(), Seq{term(ascii)});
    std::vector<uint32_t> key;
    for (const CodeRange& r : e.ranges) key.insert(key.end(), {r.lo, r.hi});
    auto it = class_rules_.find(key);
    if (it != class_rules_.end()) {
      out.push_back(rule_elem(it->second));
      return;
    }
    const int32_t r = new_rule("class");
    rules_[static_cast<size_t>(r)] = std::move(alts);
    class_rules_.emplace(std::move(key), r);
    out.push_back(rule_elem(r));
  }

  void lower(const Expr& e, Seq& out) {
    switch (e.kind) {
      case Expr::Kind::kEmpty:
        return;
      case Expr::Kind::kLiteral:
        count(static_cast<int64_t>(e.text.size()));
        for (char c : e.text) {
          ByteSet s;
          s.set(static_cast<uint8_t>(c));
          out.push_back(term(s));
        }
        return;
      case Expr::Kind::kClass:
        lower_class(e, out);
        return;
      case Expr::Kind::kRef:
        DI_CHECK(e.rule >= 0 && e.rule < b_.num_rules(), "grammar: reference to an unknown rule id {}", e.rule);
        count(1);
        out.push_back(rule_elem(e.rule));
        return;
      case Expr::Kind::kSeq:
        for (const Expr& i : e.items) lower(i, out);
        return;
      case Expr::Kind::kAlt: {
        if (e.items.size() == 1) return lower(e.items[0], out);
        const int32_t r = new_rule("alt");
        std::vector<Seq> alts;
        for (const Expr& i : e.items) {
          Seq s;
          lower(i, s);
          alts.push_back(std::move(s));
        }
        rules_[static_cast<size_t>(r)] = std::move(alts);
        count(1);
        out.push_back(rule_elem(r));
        return;
      }
      case Expr::Kind::kRepeat: {
        DI_CHECK(e.items.size() == 1, "grammar: a repetition needs exactly one item");
        DI_CHECK(e.min >= 0 && (e.max < 0 || e.max >= e.min), "grammar: bad repetition bounds {{{},{}}}", e.min, e.max);
        DI_CHECK(e.min <= lim_.max_repeat && e.max <= lim_.max_repeat,
                 "grammar: repetition count {} exceeds the limit {}", std::max(e.min, e.max), lim_.max_repeat);
        if (e.min == 1 && e.max == 1) return lower(e.items[0], out);
        if (e.max == 0) return;
        const Grammar::Elem item = as_elem(e.items[0]);
        // The item of a loop rule must not be a tail call (its return frame identifies the loop
        // position to the token matcher), so a chain's last rule ends with a shared empty rule.
        auto last = [&]() {
          if (item.kind == Grammar::Kind::kTerm) return Seq{item};
          return Seq{item, rule_elem(empty_rule())};
        };
        int32_t next = -1;  // the rule after the mandatory part
        int64_t opt_budget = 0;
        if (e.max < 0) {  // R ::= item R | ""
          next = new_rule("star");
          rules_[static_cast<size_t>(next)] = {Seq{item, rule_elem(next)}, Seq{}};
          loops_[static_cast<size_t>(next)] = {-1, 0};
          count(3);
          opt_budget = -1;
        } else if (e.max > e.min) {  // R_1 ::= item | "", R_k ::= item R_{k-1} | ""
          for (int64_t k = 1; k <= e.max - e.min; ++k) {
            const int32_t r = new_rule("rep");
            Seq s = next >= 0 ? Seq{item, rule_elem(next)} : last();
            rules_[static_cast<size_t>(r)] = {std::move(s), Seq{}};
            loops_[static_cast<size_t>(r)] = {static_cast<int32_t>(k), 0};
            count(3);
            next = r;
          }
          opt_budget = e.max - e.min;
        }
        // M_k ::= item M_{k-1}, M_0 = the optional part (k = 1..min).
        for (int64_t k = 1; k <= e.min; ++k) {
          const int32_t r = new_rule("req");
          Seq s = next >= 0 ? Seq{item, rule_elem(next)} : last();
          rules_[static_cast<size_t>(r)] = {std::move(s)};
          loops_[static_cast<size_t>(r)] = {opt_budget < 0 ? -1 : static_cast<int32_t>(k + opt_budget),
                                            static_cast<int32_t>(k)};
          count(3);
          next = r;
        }
        out.push_back(rule_elem(next));
        return;
      }
    }
  }

  const GrammarBuilder& b_;
  const GrammarLimits& lim_;
  std::vector<std::vector<Seq>> rules_;
  std::vector<Grammar::Loop> loops_;
  int32_t empty_ = -1;
  std::vector<std::string> names_;
  std::vector<ByteSet> sets_;
  std::unordered_map<ByteSet, int32_t, SetHash> set_index_;
  std::map<std::vector<uint32_t>, int32_t> class_rules_;
  int64_t total_ = 0;
};

// Rejects cycles of rule references made before any byte is consumed when a reference on the cycle
// has something after it (the matcher's stack would grow without bound). Pure tail cycles are fine.
void check_left_recursion(const Grammar& g) {
  const size_t n = g.alts.size();
  std::vector<bool> nullable(n, false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      if (nullable[r]) continue;
      for (int32_t a : g.alts[r]) {
        bool all = true;
        for (int32_t p = a; g.elems[static_cast<size_t>(p)].kind != Grammar::Kind::kEnd; ++p) {
          const Grammar::Elem& e = g.elems[static_cast<size_t>(p)];
          if (e.kind == Grammar::Kind::kTerm || !nullable[static_cast<size_t>(e.arg)]) {
            all = false;
            break;
          }
        }
        if (all) {
          nullable[r] = changed = true;
          break;
        }
      }
    }
  }
  struct Edge {
    int32_t to;
    bool grows;
  };
  std::vector<std::vector<Edge>> adj(n);
  for (size_t r = 0; r < n; ++r)
    for (int32_t a : g.alts[r])
      for (int32_t p = a; g.elems[static_cast<size_t>(p)].kind == Grammar::Kind::kRule; ++p) {
        const int32_t to = g.elems[static_cast<size_t>(p)].arg;
        adj[r].push_back({to, g.elems[static_cast<size_t>(p) + 1].kind != Grammar::Kind::kEnd});
        if (!nullable[static_cast<size_t>(to)]) break;
      }
  // Strongly connected components (iterative Tarjan).
  std::vector<int32_t> index(n, -1), low(n, 0), comp(n, -1), stk;
  std::vector<bool> on(n, false);
  int32_t counter = 0, ncomp = 0;
  for (size_t s = 0; s < n; ++s) {
    if (index[s] >= 0) continue;
    std::vector<std::pair<int32_t, size_t>> call{{static_cast<int32_t>(s), 0}};
    index[s] = low[s] = counter++;
    stk.push_back(static_cast<int32_t>(s));
    on[s] = true;
    while (!call.empty()) {
      auto& [v, i] = call.back();
      const size_t uv = static_cast<size_t>(v);
      if (i < adj[uv].size()) {
        const size_t w = static_cast<size_t>(adj[uv][i++].to);
        if (index[w] < 0) {
          index[w] = low[w] = counter++;
          stk.push_back(static_cast<int32_t>(w));
          on[w] = true;
          call.push_back({static_cast<int32_t>(w), 0});
        } else if (on[w]) {
          low[uv] = std::min(low[uv], index[w]);
        }
        continue;
      }
      if (low[uv] == index[uv]) {
        int32_t w;
        do {
          w = stk.back();
          stk.pop_back();
          on[static_cast<size_t>(w)] = false;
          comp[static_cast<size_t>(w)] = ncomp;
        } while (w != v);
        ++ncomp;
      }
      const int32_t done = v;
      call.pop_back();
      if (!call.empty()) {
        const size_t parent = static_cast<size_t>(call.back().first);
        low[parent] = std::min(low[parent], low[static_cast<size_t>(done)]);
      }
    }
  }
  for (size_t r = 0; r < n; ++r)
    for (const Edge& e : adj[r])
      if (e.grows && comp[r] == comp[static_cast<size_t>(e.to)])
        fail(
            "grammar: rule '{}' is left-recursive (through '{}' before consuming any input); rewrite it with "
            "repetition (e.g. a ::= b (\"x\" b)*)",
            g.names[r], g.names[static_cast<size_t>(e.to)]);
}
}  // namespace

int ByteSet::count() const {
  return std::popcount(w[0]) + std::popcount(w[1]) + std::popcount(w[2]) + std::popcount(w[3]);
}
int ByteSet::first() const {
  for (int i = 0; i < 4; ++i)
    if (w[i]) return i * 64 + std::countr_zero(w[i]);
  return -1;
}

std::vector<CodeRange> normalize_ranges(std::vector<CodeRange> r) {
  std::sort(r.begin(), r.end(), [](const CodeRange& a, const CodeRange& b) { return a.lo < b.lo; });
  std::vector<CodeRange> out;
  for (const CodeRange& x : r) {
    if (x.lo > x.hi) continue;
    if (!out.empty() && x.lo <= out.back().hi + 1)
      out.back().hi = std::max(out.back().hi, x.hi);
    else
      out.push_back(x);
  }
  return out;
}

std::vector<CodeRange> complement_ranges(const std::vector<CodeRange>& in) {
  std::vector<CodeRange> r = normalize_ranges(in);
  std::vector<CodeRange> out;
  uint32_t next = 0;
  for (const CodeRange& x : r) {
    if (x.lo > next) out.push_back({next, x.lo - 1});
    next = x.hi + 1;
  }
  if (next <= kMaxCp) out.push_back({next, kMaxCp});
  return out;
}

std::string utf8_encode(uint32_t cp) {
  uint8_t b[4];
  const int n = utf8_len(cp);
  encode_fixed(cp, n, b);
  return std::string(reinterpret_cast<const char*>(b), static_cast<size_t>(n));
}

Expr Expr::literal(std::string bytes) {
  Expr e;
  e.kind = Kind::kLiteral;
  e.text = std::move(bytes);
  return e;
}
Expr Expr::cls(std::vector<CodeRange> ranges, bool negated) {
  Expr e;
  e.kind = Kind::kClass;
  std::vector<CodeRange> r = negated ? complement_ranges(ranges) : normalize_ranges(std::move(ranges));
  // Remove surrogates (they have no UTF-8 form).
  std::vector<CodeRange> out;
  for (const CodeRange& x : r) {
    if (x.hi < 0xD800 || x.lo > 0xDFFF) {
      out.push_back(x);
      continue;
    }
    if (x.lo < 0xD800) out.push_back({x.lo, 0xD7FF});
    if (x.hi > 0xDFFF) out.push_back({0xE000, x.hi});
  }
  e.ranges = std::move(out);
  return e;
}
Expr Expr::bytes(std::vector<CodeRange> byte_ranges) {
  Expr e;
  e.kind = Kind::kClass;
  e.byte_class = true;
  e.ranges = normalize_ranges(std::move(byte_ranges));
  return e;
}
Expr Expr::ref(int32_t rule) {
  Expr e;
  e.kind = Kind::kRef;
  e.rule = rule;
  return e;
}
Expr Expr::seq(std::vector<Expr> items) {
  if (items.size() == 1) return std::move(items[0]);
  Expr e;
  e.kind = Kind::kSeq;
  e.items = std::move(items);
  return e;
}
Expr Expr::alt(std::vector<Expr> items) {
  if (items.size() == 1) return std::move(items[0]);
  Expr e;
  e.kind = Kind::kAlt;
  e.items = std::move(items);
  return e;
}
Expr Expr::repeat(Expr item, int64_t min, int64_t max) {
  Expr e;
  e.kind = Kind::kRepeat;
  e.items.push_back(std::move(item));
  e.min = min;
  e.max = max;
  return e;
}

int32_t GrammarBuilder::add_rule(const std::string& name) {
  std::string n = name;
  for (int i = 1; by_name_.count(n); ++i) n = name + "_" + std::to_string(i);
  DI_CHECK(static_cast<int64_t>(names_.size()) < limits_.max_rules, "grammar: too many rules (limit {})",
           limits_.max_rules);
  const int32_t id = static_cast<int32_t>(names_.size());
  names_.push_back(n);
  bodies_.emplace_back();
  defined_.push_back(false);
  by_name_.emplace(n, id);
  return id;
}

int32_t GrammarBuilder::find_rule(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? -1 : it->second;
}

void GrammarBuilder::define(int32_t rule, Expr body) {
  DI_CHECK(rule >= 0 && rule < num_rules(), "grammar: define of unknown rule {}", rule);
  bodies_[static_cast<size_t>(rule)] = std::move(body);
  defined_[static_cast<size_t>(rule)] = true;
}

Grammar GrammarBuilder::build(int32_t root) const {
  DI_CHECK(root >= 0 && root < num_rules(), "grammar: no root rule");
  for (int32_t r = 0; r < num_rules(); ++r)
    DI_CHECK(defined_[static_cast<size_t>(r)], "grammar: rule '{}' is referenced but never defined",
             names_[static_cast<size_t>(r)]);
  Lowering low(*this, limits_);
  for (int32_t r = 0; r < num_rules(); ++r) low.lower_rule(r, bodies_[static_cast<size_t>(r)]);
  Grammar g = low.finish(root);
  check_left_recursion(g);
  return g;
}

std::string Grammar::to_string() const {
  auto set_str = [&](const ByteSet& s) {
    std::string o;
    if (s.count() == 1) {
      const int b = s.first();
      if (b >= 0x20 && b < 0x7F && b != '"' && b != '\\') return fmt::format("\"{}\"", static_cast<char>(b));
    }
    fmt::memory_buffer buf;
    buf.push_back('[');
    for (int b = 0; b < 256; ++b) {
      if (!s.test(static_cast<uint8_t>(b))) continue;
      int e = b;
      while (e + 1 < 256 && s.test(static_cast<uint8_t>(e + 1))) ++e;
      auto one = [&](int c) {
        if (c >= 0x21 && c < 0x7F && c != ']' && c != '\\' && c != '-')
          buf.push_back(static_cast<char>(c));
        else
          fmt::format_to(std::back_inserter(buf), "\\x{:02X}", c);
      };
      one(b);
      if (e > b) {
        buf.push_back('-');
        one(e);
      }
      b = e;
    }
    buf.push_back(']');
    return fmt::to_string(buf);
  };
  std::string out;
  for (size_t r = 0; r < alts.size(); ++r) {
    out += names[r] + " ::=";
    for (size_t a = 0; a < alts[r].size(); ++a) {
      if (a) out += " |";
      for (int32_t p = alts[r][a]; elems[static_cast<size_t>(p)].kind != Kind::kEnd; ++p) {
        const Elem& e = elems[static_cast<size_t>(p)];
        out += ' ';
        out += e.kind == Kind::kTerm ? set_str(sets[static_cast<size_t>(e.arg)]) : names[static_cast<size_t>(e.arg)];
      }
      if (elems[static_cast<size_t>(alts[r][a])].kind == Kind::kEnd) out += " \"\"";
    }
    out += "\n";
  }
  return out;
}

}  // namespace deepinfer::structured
