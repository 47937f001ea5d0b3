// Token-level matching: the allowed-token bitmask of a matcher state over a tokenizer's vocabulary,
// with a per-grammar cache keyed by the (hashable) byte-level state, and a per-sequence
// GrammarMatcher with accept_token / rollback / jump-forward.
//
// Mask computation walks the vocabulary as a byte trie without building one: token byte strings
// are sorted, each knows its common prefix length with the previous one, the byte-level states of
// the current prefix are kept per depth, and when byte k of a token fails every following token
// sharing those k+1 bytes is skipped (a dead prefix prunes its whole subtree).
//
// Special tokens (added tokens marked special) and ids without bytes are never allowed, except EOS:
// EOS is allowed exactly when the bytes so far form a complete sentence of the grammar, and is the
// only allowed token when the grammar cannot continue (forced). A state with nothing allowed (cannot
// happen for vocabularies that hold every single byte) allows EOS so a sequence always ends.
#pragma once

#include <cstdint>
#include <memory>
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

 private:
  std::vector<std::string> bytes_;
  std::vector<bool> special_;
  int32_t eos_id_ = -1;
};

struct MatcherStats {
  int64_t masks = 0, cache_hits = 0, bytes_advanced = 0;
};

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
  MatcherStats stats;
  size_t cache_limit_bytes = size_t{256} << 20;

 private:
  void compute(const MatchState& s, std::vector<uint32_t>& out);
  struct KeyHash {
    size_t operator()(const std::vector<int32_t>& k) const;
  };
  PdaMatcher pda_;
  std::shared_ptr<const TokenVocab> vocab_;
  std::unordered_map<std::vector<int32_t>, std::vector<uint32_t>, KeyHash> cache_;
  std::vector<MatchState> walk_;  // per-depth states of the trie walk
};

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
