// The grammar core of structured outputs. Every front end (EBNF, regex, JSON Schema, choice) builds
// rules of `Expr` trees in a GrammarBuilder; build() lowers them to a flat byte-level `Grammar`:
// rules of alternatives, each a sequence of elements ending in kEnd, where an element is a byte set
// (a terminal: one byte out of a 256-bit set) or a reference to a rule. Unicode character classes
// become alternatives of UTF-8 byte-range sequences, quantifiers become helper rules (X* -> R ::= X R
// | "", X{m,n} -> a chain of m mandatory rules M_k ::= X M_{k-1} then n-m optional ones R_j ::= X
// R_{j-1} | ""), so the matcher (matcher.h) only ever sees bytes and rule references. Each such rule
// records its remaining budget (Grammar::loops), which the token matcher uses to share one mask
// computation over every position of a repetition.
//
// Limits (GrammarLimits) bound compile time and memory: repetition counts, total elements, rules.
// Left recursion (a rule reaching itself before consuming a byte with something left to match after
// the recursive reference) would grow the matcher's stacks forever and is rejected at build time.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace deepinfer::structured {

struct CodeRange {
  uint32_t lo = 0, hi = 0;  // inclusive
};

struct Expr {
  enum class Kind : uint8_t { kEmpty, kLiteral, kClass, kRef, kSeq, kAlt, kRepeat };
  Kind kind = Kind::kEmpty;
  std::string text;               // kLiteral: the bytes
  std::vector<CodeRange> ranges;  // kClass: code points (or bytes when byte_class), normalized
  bool byte_class = false;        // kClass over raw bytes 0..255
  int32_t rule = -1;              // kRef
  std::vector<Expr> items;        // kSeq, kAlt; kRepeat: exactly one
  int64_t min = 0, max = -1;      // kRepeat; max -1 = unbounded

  static Expr empty() { return {}; }
  static Expr literal(std::string bytes);
  // A class of code points; negated = the complement within U+0000..U+10FFFF minus surrogates.
  static Expr cls(std::vector<CodeRange> ranges, bool negated = false);
  static Expr bytes(std::vector<CodeRange> byte_ranges);
  static Expr ref(int32_t rule);
  static Expr seq(std::vector<Expr> items);
  static Expr alt(std::vector<Expr> items);
  static Expr repeat(Expr item, int64_t min, int64_t max);
  static Expr opt(Expr item) { return repeat(std::move(item), 0, 1); }
  static Expr star(Expr item) { return repeat(std::move(item), 0, -1); }
  static Expr plus(Expr item) { return repeat(std::move(item), 1, -1); }
};

// Sorted, merged ranges; surrogates removed when `code_points`.
std::vector<CodeRange> normalize_ranges(std::vector<CodeRange> r);
std::vector<CodeRange> complement_ranges(const std::vector<CodeRange>& r);
std::string utf8_encode(uint32_t cp);

struct GrammarLimits {
  int64_t max_repeat = 10000;        // m and n of {m,n}
  int64_t max_elements = 4'000'000;  // elements of the flat grammar
  int64_t max_rules = 500'000;
};

struct ByteSet {
  uint64_t w[4] = {0, 0, 0, 0};
  bool test(uint8_t b) const { return (w[b >> 6] >> (b & 63)) & 1; }
  void set(uint8_t b) { w[b >> 6] |= uint64_t{1} << (b & 63); }
  bool operator==(const ByteSet& o) const {
    return w[0] == o.w[0] && w[1] == o.w[1] && w[2] == o.w[2] && w[3] == o.w[3];
  }
  int count() const;
  int first() const;  // lowest byte in the set, -1 when empty
};

struct Grammar {
  enum class Kind : uint8_t { kEnd, kTerm, kRule };
  struct Elem {
    Kind kind = Kind::kEnd;
    int32_t arg = 0;  // kTerm: index into sets; kRule: rule id
  };
  std::vector<Elem> elems;                 // all alternatives back to back, each closed by kEnd
  std::vector<std::vector<int32_t>> alts;  // per rule: positions in elems where its alternatives start
  std::vector<ByteSet> sets;
  std::vector<std::string> names;  // per rule
  // Repetition loops (token_matcher.cpp uses them for its shared per-item masks). A rule made by the
  // lowering of X{m,n} / X* has alternative 0 = [item, next rule] (or [item] / [item, empty rule] at
  // the chain's end) and, when it may stop here, alternative 1 = "": budget = items it may still
  // match (-1 unbounded), min_rem = items it must still match. budget 0 = not a loop rule.
  struct Loop {
    int32_t budget = 0, min_rem = 0;
  };
  std::vector<Loop> loops;  // per rule
  int32_t root = 0;
  // Readable dump (GBNF-like) for tests and debugging.
  std::string to_string() const;
};

class GrammarBuilder {
 public:
  explicit GrammarBuilder(GrammarLimits limits = {}) : limits_(limits) {}
  // Declares a rule; a taken name gets a numeric suffix. Returns its id.
  int32_t add_rule(const std::string& name);
  int32_t find_rule(const std::string& name) const;  // -1 when not declared
  void define(int32_t rule, Expr body);
  bool defined(int32_t rule) const { return defined_[static_cast<size_t>(rule)]; }
  const std::string& name(int32_t rule) const { return names_[static_cast<size_t>(rule)]; }
  int32_t num_rules() const { return static_cast<int32_t>(names_.size()); }
  const GrammarLimits& limits() const { return limits_; }
  // Lowers every rule reachable from `root`. Throws deepinfer::Error on an undefined rule, left
  // recursion, a repetition count over the limit or a grammar over the size limits.
  Grammar build(int32_t root) const;

 private:
  GrammarLimits limits_;
  std::vector<std::string> names_;
  std::vector<Expr> bodies_;
  std::vector<bool> defined_;
  std::unordered_map<std::string, int32_t> by_name_;
};

}  // namespace deepinfer::structured
