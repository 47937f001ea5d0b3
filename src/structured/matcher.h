// Byte-level pushdown matcher over a Grammar (grammar.h), in the style of llama.cpp's GBNF matcher:
// a state is the set of parse stacks whose top is a terminal (a byte set) that the next byte must
// match, plus whether the input so far is a complete sentence (accepting). Stacks are hash-consed
// nodes (position in Grammar::elems, parent node) in a StackArena, so a stack is one int32 id,
// equal stacks have equal ids, a state is a sorted vector of ids (hashable: the token-level mask
// cache is keyed on it), and copying or rolling back a state is copying that vector.
//
// A reference to a rule that is the last element of its alternative pushes no return frame (tail
// call), so repetitions run in constant stack depth; stacks deeper than kMaxDepth and states with
// more than kMaxStacks stacks are cut (bounded memory for pathological grammars).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "structured/grammar.h"

namespace deepinfer::structured {

struct MatchState {
  std::vector<int32_t> stacks;  // sorted node ids, each node's position is a terminal
  bool accepting = false;       // the bytes so far form a complete sentence
  bool dead() const { return stacks.empty() && !accepting; }
  bool operator==(const MatchState& o) const { return accepting == o.accepting && stacks == o.stacks; }
};

class PdaMatcher {
 public:
  static constexpr int32_t kMaxDepth = 2048;
  static constexpr size_t kMaxStacks = 4096;

  explicit PdaMatcher(std::shared_ptr<const Grammar> grammar);
  const Grammar& grammar() const { return *g_; }

  MatchState initial();
  // out = the state after byte b; returns !out.dead(). `out` must not alias `s`.
  bool advance(const MatchState& s, uint8_t b, MatchState& out);
  bool advance_bytes(MatchState& s, std::string_view bytes);  // in place; false (s dead) on a mismatch
  // Bytes allowed next (union of the stacks' terminals).
  ByteSet next_bytes(const MatchState& s) const;
  // Whole-string check: does `text` match the grammar completely.
  bool matches(std::string_view text);
  int64_t num_nodes() const { return static_cast<int64_t>(nodes_.size()); }

  // Stack nodes (for the token matcher's decomposition of a state into its stacks): the node of
  // (position, parent) (parent -1 = the bottom), its fields, and the state reached from one node
  // (its closure: the stacks it expands to, accepting when it pops past the bottom).
  int32_t make_node(int32_t pos, int32_t parent) { return node(pos, parent); }
  int32_t node_pos(int32_t n) const { return nodes_[static_cast<size_t>(n)].pos; }
  int32_t node_parent(int32_t n) const { return nodes_[static_cast<size_t>(n)].parent; }
  int32_t node_depth(int32_t n) const { return nodes_[static_cast<size_t>(n)].depth; }
  MatchState state_of_node(int32_t n);
  // The state at the start of `rule` with an empty stack below it (accepting = the rule matched).
  MatchState state_of_rule(int32_t rule);

 private:
  struct Node {
    int32_t pos, parent, depth;
  };
  int32_t node(int32_t pos, int32_t parent);
  void closure(int32_t start, MatchState& out);

  std::shared_ptr<const Grammar> g_;
  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, int32_t> index_;
  std::vector<uint32_t> seen_;  // closure epoch per node
  uint32_t epoch_ = 0;
  std::vector<int32_t> work_;
};

}  // namespace deepinfer::structured
