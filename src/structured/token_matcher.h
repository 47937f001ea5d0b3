// Token-level matching: the allowed-token bitmask of a matcher state over a tokenizer's vocabulary,
// with a per-grammar cache keyed by the (hashable) byte-level state, and a per-sequence
// GrammarMatcher with accept_token / rollback / jump-forward.
//
// Mask computation. A token is allowed from a state iff it is allowed from one of the state's stacks,
// so a state's mask is the union of per-stack parts:
//  - repetition loops (Grammar::loops): the stacks at the start of an item of X{m,n} / X* (all of
//    X's first terminals under one return frame) share one precomputed walk of X's own automaton
//    over the vocabulary (LoopEntry: per token, how many items it spans when made of items only, or
//    after how many items it leaves the loop through a byte that cannot start an item). The budget
//    of the position (items left, items still required) then selects a bitset (cumulative by item
//    count), and the few "leaving" tokens are checked once per context (the frame below the loop)
//    on their suffix. Entries are keyed by X's structure and shared by every grammar over the same
//    vocabulary (one process-wide cache), so e.g. every JSON string position of every schema uses
//    one walk. Valid only when the context cannot start with a byte that starts an item (checked).
//    The entries every JSON grammar needs are built on a vocabulary's first compile and kept
//    (TokenVocab::prebuild_once), so a new request does not pay them.
//  - a stack whose top byte sets (up to kMaxPrefix; after each set, every stack on its own) lead into
//    loop positions (exactly the item's start stacks, plus the context's when the loop may stop): a
//    loop entry of "one byte of each prefix set, then items" (the same walk below the prefix, shared
//    the same way; n = 0 leaving tokens are the context's, checked like the others), and walks from
//    below the prefix for the stacks left over. E.g. `" " ident` with ident ::= [a-z] [a-z_]{0,7}.
//  - every other stack: a trie walk from that single stack, cached per stack node.
// Both fall back to a full walk from the whole state whenever the pathological-grammar cuts of the
// byte matcher (stack depth, stacks per state) could make the union differ from it, so masks are
// always exactly "the byte matcher accepts every byte of the token from this state".
// Walks use the vocabulary's byte trie (preorder arrays, subtree skip in O(1)) and step through a
// lazily built DFA over matcher states (per grammar, byte classes, memory-bounded), so a matcher
// transition is computed once per (state, byte class) instead of once per trie node.
//
// Special tokens (added tokens marked special) and ids without bytes are never allowed, except EOS:
// EOS is allowed exactly when the bytes so far form a complete sentence of the grammar, and is the
// only allowed token when the grammar cannot continue (forced). A state with nothing allowed (cannot
// happen for vocabularies that hold every single byte) allows EOS so a sequence always ends.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "structured/matcher.h"

namespace deepinfer {
class Tokenizer;
}

namespace deepinfer::structured {

class TokenVocab {
 public:
  // tokens[i] = bytes of id i; special ids are never allowed; eos_id may be -1.
  TokenVocab(std::vector<std::string> tokens, const std::vector<int32_t>& special_ids, int32_t eos_id);
  // From a tokenizer, sized to `vocab_size` ids (the model's; ids past the tokenizer are never allowed).
  static std::shared_ptr<const TokenVocab> from_tokenizer(const Tokenizer& tok, int64_t vocab_size, int32_t eos_id);

  int32_t size() const { return static_cast<int32_t>(bytes_.size()); }
  int32_t eos_id() const { return eos_id_; }
  const std::string& bytes(int32_t id) const { return bytes_[static_cast<size_t>(id)]; }
  bool is_special(int32_t id) const { return special_[static_cast<size_t>(id)]; }
  int64_t mask_words() const { return (size() + 31) / 32; }

  // Sorted walk order (non-special, non-empty tokens) and LCP with the previous entry.
  std::vector<int32_t> sorted;
  std::vector<uint16_t> lcp;
  size_t max_len = 0;
  // Byte trie of the sorted tokens, nodes in preorder: the node's byte, the end of its subtree
  // (exclusive; also its next sibling), and its tokens trie_ids[tok_begin, tok_end).
  std::vector<uint8_t> trie_byte;
  std::vector<int32_t> trie_end, trie_tok_begin, trie_tok_end, trie_ids;
  // The tokens of subtree [c, trie_end[c]) are trie_ids[trie_sub_tok[c], trie_sub_tok[trie_end[c]]).
  std::vector<int32_t> trie_sub_tok;
  // The same nodes packed for the walks: subtree end, tokens [tok, tok + ntok), byte.
  struct TrieNode {
    int32_t end, tok;
    uint16_t ntok;
    uint8_t byte;
  };
  std::vector<TrieNode> trie;
  uint64_t serial = 0;  // unique per vocabulary object (key of the shared loop cache)
  // The vocabulary-level loop entries (those every JSON grammar uses: the string character, digits,
  // whitespace, their quote/colon prefixes) are built once, on the first grammar compiled over this
  // vocabulary, and kept for the vocabulary's life (clear_shared_loop_cache leaves them). Skipped
  // when DEEPINFER_SO_PREBUILD=0 at that first compile (the truly fresh case).
  mutable std::once_flag prebuild_once;

 private:
  std::vector<std::string> bytes_;
  std::vector<bool> special_;
  int32_t eos_id_ = -1;
};

struct MatcherStats {
  int64_t masks = 0, cache_hits = 0, bytes_advanced = 0;
  int64_t full_walks = 0, stack_walks = 0, loop_groups = 0, prefix_groups = 0;
};

struct LoopEntry;

// A grammar bound to a vocabulary: the shared byte-level arena and the mask cache. Not thread-safe:
// every GrammarMatcher of one CompiledGrammar must be used from one thread at a time.
class CompiledGrammar {
 public:
  CompiledGrammar(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenVocab> vocab);
  const Grammar& grammar() const { return pda_.grammar(); }
  const TokenVocab& vocab() const { return *vocab_; }
  PdaMatcher& pda() { return pda_; }
  // The allowed-token mask of `s` (bit i % 32 of word i / 32), cached.
  const std::vector<uint32_t>& mask(const MatchState& s);
  // Uncached: the mask by one trie walk from the whole state (reference for tests), and by the
  // per-stack decomposition (what mask() uses).
  void compute_full(const MatchState& s, std::vector<uint32_t>& out);
  void compute_walk(const MatchState& s, std::vector<uint32_t>& out);  // the same through the walk DFA
  void compute(const MatchState& s, std::vector<uint32_t>& out);
  MatcherStats stats;
  size_t cache_limit_bytes = size_t{256} << 20;
  bool use_loops = true;                      // tests: false = per-stack walks only
  size_t dfa_limit_bytes = size_t{32} << 20;  // the walk DFA's memory bound (tests: tiny = plain walks)

 private:
  struct KeyHash {
    size_t operator()(const std::vector<int32_t>& k) const;
  };
  struct StackMask {
    std::vector<int32_t> ids;    // sparse
    std::vector<uint32_t> bits;  // dense (ids empty)
  };
  struct ExitInfo {
    bool usable = false;
    std::vector<std::pair<int32_t, int32_t>> ok;  // (items before leaving, token), by items
  };
  bool compute_fast(const MatchState& s, std::vector<uint32_t>& out);
  // Tokens into hits_; false when too wide. `dfa`: through the cached state transitions (else the
  // plain per-byte matcher walk, the reference of compute_full).
  bool walk(const MatchState& s, size_t width_limit, bool dfa = true);
  void visit(int32_t lo, int32_t hi, size_t d);
  void visit_dfa(int32_t lo, int32_t hi, int32_t sid);
  // Lazily built DFA over matcher states (stack sets), bytes merged into classes that no terminal
  // distinguishes: the trie walks step by table lookup. Bounded (cleared between walks when over
  // dfa_limit_bytes; a walk that overflows it mid-way is redone by the plain walk).
  int32_t dfa_intern(std::vector<int32_t>&& stacks);
  int32_t dfa_fill(int32_t sid, uint8_t b);
  void dfa_clear();
  const StackMask* stack_mask(int32_t node);
  // The loop entry of item X (key: its element), or with `prefix`, of "one byte of each prefix set,
  // then items of X" (key: a local one of the prefix and X).
  std::shared_ptr<const LoopEntry> loop_entry(Grammar::Elem item, uint64_t key,
                                              const std::vector<ByteSet>* prefix = nullptr);
  // The loop position (rule, the node below it) that stack top `top` is at the start of an item of.
  bool find_loop(int32_t top, int32_t& rule, int32_t& ctx) const;
  const std::vector<int32_t>& expected_stacks(int32_t rule, int32_t ctx);
  // ORs the loop part of a position (budget bits, then the leaving tokens); false when unusable.
  bool add_loop(const LoopEntry& e, uint64_t key, int32_t rule, int32_t ctx, std::vector<uint32_t>& out);
  // A single stack whose top byte sets (up to kMaxPrefix of them, each stack after a set on its own)
  // lead into loop positions (exactly the item's start stacks, plus the context's when the loop may
  // stop): its tokens are the loop entries of "prefix, then items" (parts with an entry) and walks
  // of the stacks left over from below their prefix (the others). Not usable without a loop part.
  struct PrefixPart {
    std::shared_ptr<const LoopEntry> entry;
    uint64_t key = 0;
    int32_t rule = -1, ctx = -1;
    int32_t stack = -1;  // walk part: the stack, walked below `prefix`
    std::vector<ByteSet> prefix;
    bool walked = false;
    std::vector<int32_t> ids;
  };
  struct PrefixLoop {
    bool usable = false;
    std::vector<PrefixPart> parts;
  };
  static constexpr int kMaxPrefix = 2;
  static constexpr size_t kMaxPrefixParts = 4;
  bool prefix_expand(int32_t node, std::vector<ByteSet>& prefix, PrefixLoop& r);
  PrefixLoop& prefix_loop(int32_t node);
  bool apply_prefix(PrefixLoop& p, std::vector<uint32_t>& out);
  void visit_prefix(int32_t lo, int32_t hi, const std::vector<ByteSet>& prefix, size_t i, int32_t root);
  const ExitInfo& exit_info(const LoopEntry& e, uint64_t key, int32_t ctx);
  const std::vector<uint32_t>& budget_bits(const LoopEntry& e, uint64_t key, int32_t j);
  void trim();

  PdaMatcher pda_;
  std::shared_ptr<const TokenVocab> vocab_;
  std::unordered_map<std::vector<int32_t>, std::vector<uint32_t>, KeyHash> cache_;
  std::vector<MatchState> walk_;  // per-depth states of the trie walk
  std::vector<int32_t> hits_;
  struct WalkFrame {
    int32_t c, hi, sid;
  };
  std::vector<WalkFrame> frames_;
  size_t width_limit_ = 0;
  bool wide_ = false;
  std::vector<int32_t> rule_of_pos_;
  std::array<uint8_t, 256> byte_class_{};
  int32_t num_classes_ = 1;
  std::vector<MatchState> dstates_;
  std::vector<uint32_t> dwidth_;  // stacks per state
  std::vector<int32_t> dtrans_;   // state * num_classes_ + class: -2 unknown, -1 dead, else state
  std::unordered_map<std::vector<int32_t>, int32_t, KeyHash> dindex_;
  size_t dfa_bytes_ = 0;
  bool dfa_over_ = false;
  MatchState dtmp_;
  std::unordered_map<int32_t, StackMask> stack_masks_;
  std::unordered_map<int32_t, std::vector<int32_t>> expected_;  // node (loop rule start, ctx) -> its stacks
  std::unordered_map<uint64_t, std::shared_ptr<const LoopEntry>> loops_;
  std::unordered_map<int32_t, PrefixLoop> prefix_loops_;
  std::unordered_map<std::string, uint64_t> prefix_keys_;
  std::map<std::pair<uint64_t, int32_t>, ExitInfo> exits_;
  std::map<std::pair<uint64_t, int32_t>, std::vector<uint32_t>> budget_;
  size_t aux_bytes_ = 0;
};

// Drops the process-wide loop entries (tests and benchmarks of cold starts), except the
// vocabulary-level prebuilt ones (see TokenVocab::prebuild_once; a vocabulary whose first compile
// ran with DEEPINFER_SO_PREBUILD=0 has none: the truly fresh case). _all drops those too (they are
// not rebuilt for vocabularies already prebuilt).
void clear_shared_loop_cache();
void clear_shared_loop_cache_all();
// (entries, of which vocabulary-level) in the process-wide cache (tests).
std::pair<size_t, size_t> shared_loop_cache_counts();

class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<CompiledGrammar> g);

  // Allowed tokens for the next step (a reference into the cache: valid until the next call).
  const std::vector<uint32_t>& next_token_bitmask();
  bool is_token_allowed(int32_t id);
  // Advances by one token; false (state unchanged) when the token is not allowed. EOS at an
  // accepting state terminates the matcher.
  bool accept_token(int32_t id);
  bool accept_string(std::string_view bytes);
  // Undoes the last n accepted tokens (n <= num_accepted()).
  void rollback(int64_t n);
  int64_t num_accepted() const { return static_cast<int64_t>(history_.size()) - 1; }
  bool is_completed() const { return history_.back().state.accepting; }  // EOS would be accepted
  bool is_terminated() const { return history_.back().terminated; }      // EOS was accepted
  // Jump-forward: the bytes every continuation must start with (stops at an accepting state or a
  // choice between bytes); empty when none.
  std::string forced_bytes();
  void reset();

 private:
  struct Entry {
    MatchState state;
    bool terminated = false;
  };
  std::shared_ptr<CompiledGrammar> g_;
  std::vector<Entry> history_;
};

}  // namespace deepinfer::structured
