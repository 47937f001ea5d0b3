#include "structured/token_matcher.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string_view>

#include "deepinfer/error.h"
#include "structured/structured.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::structured {

using VocabNode = TokenVocab::TrieNode;

namespace {
std::atomic<uint64_t> g_vocab_serial{1};
thread_local bool t_prebuilding = false;  // inside the vocabulary-level prebuild (its entries are pinned)
constexpr size_t kWidth = 64;             // stacks per walk state for the decomposition to be exact
constexpr size_t kMaxGroupStacks = 32;    // kWidth * 2 * this <= PdaMatcher::kMaxStacks
void set_bit(std::vector<uint32_t>& m, int32_t id) { m[static_cast<size_t>(id) >> 5] |= uint32_t{1} << (id & 31); }
void or_into(std::vector<uint32_t>& out, const std::vector<uint32_t>& b) {
  for (size_t i = 0; i < out.size(); ++i) out[i] |= b[i];
}
}  // namespace

// The walk of one repetition item X over the vocabulary (see token_matcher.h).
struct LoopEntry {
  bool usable = false;
  ByteSet first;  // bytes that can start an item
  int32_t max_rel_depth = 0;
  int32_t max_n = 0;
  std::vector<uint32_t> full_all;  // tokens made of items only (the last may be partial)
  std::vector<int32_t> by_n;       // those tokens by the number of items they start
  std::vector<int32_t> n_start;    // by_n[n_start[k], n_start[k + 1]) start k items
  struct Exit {
    int32_t id;
    uint16_t n, off;  // n whole items, then byte `off` cannot start an item
  };
  std::vector<Exit> exits;                // by the byte at off
  std::array<int32_t, 257> exit_start{};  // exits of byte b: [exit_start[b], exit_start[b + 1])
};

namespace {
class EntryBuilder {
 public:
  EntryBuilder(PdaMatcher& pda, const TokenVocab& v, Grammar::Elem item, LoopEntry& e,
               const std::vector<ByteSet>* prefix = nullptr)
      : pda_(pda), v_(v), e_(e) {
    if (prefix) prefix_ = *prefix;
    const Grammar& g = pda.grammar();
    full_n_.assign(static_cast<size_t>(v.size()), 0);
    if (item.kind == Grammar::Kind::kTerm) {
      term_ = true;
      set_ = g.sets[static_cast<size_t>(item.arg)];
      e.first = set_;
    } else {
      MatchState start = pda.state_of_rule(item.arg);
      if (start.accepting || start.stacks.empty() || start.stacks.size() > kWidth) {
        bad_ = true;
        return;
      }
      e.first = pda.next_bytes(start);
      intern(start);
    }
  }
  void run() {
    if (bad_) return;
    const int32_t n = static_cast<int32_t>(v_.trie_byte.size());
    if (prefix_.empty())
      term_ ? visit_term(0, n, 0) : visit(0, n, 0, 0, true, 0);
    else
      visit_prefix(0, n, 0);
    if (bad_) return;
    LoopEntry& e = e_;
    e.full_all.assign(static_cast<size_t>(v_.mask_words()), 0);
    e.max_n = 0;
    for (int32_t id : touched_) e.max_n = std::max<int32_t>(e.max_n, full_n_[static_cast<size_t>(id)]);
    e.n_start.assign(static_cast<size_t>(e.max_n) + 2, 0);
    for (int32_t id : touched_) ++e.n_start[full_n_[static_cast<size_t>(id)] + 1u];
    for (size_t k = 1; k < e.n_start.size(); ++k) e.n_start[k] += e.n_start[k - 1];
    e.by_n.assign(static_cast<size_t>(e.n_start.back()), 0);
    std::vector<int32_t> fill(e.n_start.begin(), e.n_start.end() - 1);
    for (int32_t id : touched_) {
      const uint16_t k = full_n_[static_cast<size_t>(id)];
      e.by_n[static_cast<size_t>(fill[k]++)] = id;
      set_bit(e.full_all, id);
    }
    // Exits by the byte at their offset (a counting sort; the byte was recorded with each).
    e.exit_start.fill(0);
    for (uint8_t b : exit_byte_) ++e.exit_start[b + 1u];
    for (size_t b = 1; b < 257; ++b) e.exit_start[b] += e.exit_start[b - 1];
    std::vector<LoopEntry::Exit> sorted(e.exits.size());
    std::array<int32_t, 256> pos;
    std::copy(e.exit_start.begin(), e.exit_start.end() - 1, pos.begin());
    for (size_t i = 0; i < e.exits.size(); ++i) sorted[static_cast<size_t>(pos[exit_byte_[i]]++)] = e.exits[i];
    e.exits = std::move(sorted);
    e.usable = true;
  }

 private:
  static constexpr int32_t kDead = -1, kDone = -3;
  int32_t intern(const MatchState& s) {
    auto [it, fresh] = ids_.try_emplace(s.stacks, static_cast<int32_t>(states_.size()));
    if (fresh) {
      if (states_.size() >= 4096) bad_ = true;
      states_.push_back(s);
      trans_.resize(states_.size() * 256, -2);
      for (int32_t n : s.stacks) e_.max_rel_depth = std::max(e_.max_rel_depth, pda_.node_depth(n));
    }
    return it->second;
  }
  int32_t step(int32_t sid, uint8_t b) {
    if (term_) return set_.test(b) ? kDone : kDead;
    const size_t k = static_cast<size_t>(sid) * 256 + b;
    if (trans_[k] != -2) return trans_[k];
    MatchState nx;
    int32_t r;
    if (!pda_.advance(states_[static_cast<size_t>(sid)], b, nx)) {
      r = kDead;
    } else if (nx.accepting) {
      if (!nx.stacks.empty()) bad_ = true;  // the item may end or go on: boundaries are ambiguous
      r = kDone;
    } else {
      if (nx.stacks.size() > kWidth) bad_ = true;
      r = intern(nx);
    }
    trans_[k] = r;  // (intern may have resized trans_)
    return r;
  }
  void add_tokens(int32_t c, uint16_t n) {
    const VocabNode& nd = v_.trie[static_cast<size_t>(c)];
    for (int32_t k = nd.tok; k < nd.tok + nd.ntok; ++k) {
      const int32_t id = v_.trie_ids[static_cast<size_t>(k)];
      full_n_[static_cast<size_t>(id)] = n;
      touched_.push_back(id);
    }
  }
  // The fixed prefix (one byte of each set): tokens ending inside it or right after it count as
  // one (partial) item, so every budget takes them; items start at offset prefix_.size().
  void visit_prefix(int32_t lo, int32_t hi, size_t i) {
    for (int32_t c = lo; c < hi && !bad_; c = v_.trie_end[static_cast<size_t>(c)]) {
      if (!prefix_[i].test(v_.trie_byte[static_cast<size_t>(c)])) continue;
      const int32_t end = v_.trie_end[static_cast<size_t>(c)];
      add_tokens(c, 1);
      if (c + 1 >= end) continue;
      if (i + 1 < prefix_.size())
        visit_prefix(c + 1, end, i + 1);
      else
        term_ ? visit_term(c + 1, end, static_cast<uint16_t>(i + 1))
              : visit(c + 1, end, 0, 0, true, static_cast<uint16_t>(i + 1));
    }
  }
  // visit() for a single byte-set item (every byte is one whole item, so n counts the bytes since
  // offset d0): an iterative preorder pass, live nodes in order, dead subtrees skipped in O(1) with
  // their tokens as one range.
  void visit_term(int32_t lo, int32_t hi, uint16_t d0) {
    const VocabNode* trie = v_.trie.data();
    const int32_t* ids = v_.trie_ids.data();
    const int32_t* sub = v_.trie_sub_tok.data();
    std::array<uint8_t, 256> in;
    for (int b = 0; b < 256; ++b) in[static_cast<size_t>(b)] = set_.test(static_cast<uint8_t>(b)) ? 1 : 0;
    const bool exit0 = !prefix_.empty();
    std::vector<int32_t> ends{hi};
    int32_t c = lo;
    for (;;) {
      while (c >= ends.back()) {
        ends.pop_back();
        if (ends.empty()) return;
      }
      const VocabNode nd = trie[c];
      const uint16_t n = static_cast<uint16_t>(ends.size() - 1);  // items before this byte
      if (in[nd.byte]) {
        for (int32_t k = nd.tok; k < nd.tok + nd.ntok; ++k) {
          full_n_[static_cast<size_t>(ids[k])] = static_cast<uint16_t>(n + 1);
          touched_.push_back(ids[k]);
        }
        if (c + 1 < nd.end) ends.push_back(nd.end);
        ++c;
      } else {
        if (n > 0 || exit0)
          for (int32_t k = sub[c]; k < sub[nd.end]; ++k) {
            e_.exits.push_back({ids[k], n, static_cast<uint16_t>(d0 + n)});
            exit_byte_.push_back(nd.byte);
          }
        c = nd.end;
      }
    }
  }
  // Children of a trie range at byte offset d; sid = the item state (0 = an item starts here when
  // `boundary`), n = whole items so far.
  void visit(int32_t lo, int32_t hi, int32_t sid, uint16_t n, bool boundary, uint16_t d) {
    const VocabNode* trie = v_.trie.data();
    for (int32_t c = lo; c < hi && !bad_; c = trie[c].end) {
      const int32_t r = step(boundary ? 0 : sid, trie[c].byte);
      if (bad_) return;
      const int32_t end = trie[c].end;
      if (r == kDead) {
        // Every token below leaves the loop after n items at byte d (n = 0 only after a prefix: the
        // loop's own n = 0 exits are its context's stacks, which the state holds apart).
        if (boundary && (n > 0 || !prefix_.empty())) {
          const uint8_t b = trie[c].byte;
          for (int32_t k = v_.trie_sub_tok[static_cast<size_t>(c)]; k < v_.trie_sub_tok[static_cast<size_t>(end)];
               ++k) {
            e_.exits.push_back({v_.trie_ids[static_cast<size_t>(k)], n, d});
            exit_byte_.push_back(b);
          }
        }
        continue;
      }
      add_tokens(c, static_cast<uint16_t>(n + 1));
      if (c + 1 < end) {
        if (r == kDone)
          visit(c + 1, end, 0, static_cast<uint16_t>(n + 1), true, static_cast<uint16_t>(d + 1));
        else
          visit(c + 1, end, r, n, false, static_cast<uint16_t>(d + 1));
      }
    }
  }

  PdaMatcher& pda_;
  const TokenVocab& v_;
  LoopEntry& e_;
  bool term_ = false, bad_ = false;
  ByteSet set_;
  std::vector<MatchState> states_;
  std::map<std::vector<int32_t>, int32_t> ids_;
  std::vector<int32_t> trans_;
  std::vector<uint16_t> full_n_;
  std::vector<int32_t> touched_;
  std::vector<uint8_t> exit_byte_;  // the byte at each exit's offset
  std::vector<ByteSet> prefix_;
};

// X's structure (the rules it reaches, renumbered in visit order): equal keys behave the same.
std::string item_structure(const Grammar& g, Grammar::Elem item) {
  std::string k;
  auto put_set = [&](int32_t s) {
    k.append(reinterpret_cast<const char*>(g.sets[static_cast<size_t>(s)].w), sizeof(ByteSet::w));
  };
  if (item.kind == Grammar::Kind::kTerm) {
    k = "T";
    put_set(item.arg);
    return k;
  }
  std::vector<int32_t> order{item.arg};
  std::unordered_map<int32_t, int32_t> local{{item.arg, 0}};
  for (size_t i = 0; i < order.size(); ++i) {
    k += 'R';
    for (int32_t a : g.alts[static_cast<size_t>(order[i])]) {
      k += 'A';
      for (int32_t p = a; g.elems[static_cast<size_t>(p)].kind != Grammar::Kind::kEnd; ++p) {
        const Grammar::Elem& e = g.elems[static_cast<size_t>(p)];
        if (e.kind == Grammar::Kind::kTerm) {
          k += 't';
          put_set(e.arg);
        } else {
          auto [it, fresh] = local.try_emplace(e.arg, static_cast<int32_t>(order.size()));
          if (fresh) order.push_back(e.arg);
          k += 'r';
          k.append(reinterpret_cast<const char*>(&it->second), 4);
        }
      }
      if (k.size() > (size_t{1} << 16)) return "";  // too large to share
    }
  }
  return k;
}

size_t entry_bytes(const LoopEntry& e) {
  return e.full_all.size() * 4 + e.by_n.size() * 4 + e.n_start.size() * 4 + e.exits.size() * sizeof(LoopEntry::Exit) +
         2048;
}

// The process-wide loop entries, least recently used dropped past kSharedLoopBytes (entries live on in
// the grammars that hold them).
constexpr size_t kSharedLoopBytes = size_t{96} << 20;
struct SharedLoop {
  std::shared_ptr<const LoopEntry> e;
  size_t bytes = 0;
  uint64_t used = 0;
  bool pinned = false;  // vocabulary-level (prebuilt): not counted, not dropped
};
std::mutex g_loop_mu;
std::unordered_map<std::string, SharedLoop> g_loop_cache;
size_t g_loop_bytes = 0;
uint64_t g_loop_tick = 0;
}  // namespace

namespace {
void clear_loops(bool pinned_too) {
  std::lock_guard<std::mutex> lock(g_loop_mu);
  for (auto it = g_loop_cache.begin(); it != g_loop_cache.end();)
    it = pinned_too || !it->second.pinned ? g_loop_cache.erase(it) : std::next(it);
  g_loop_bytes = 0;
}
}  // namespace

void clear_shared_loop_cache() { clear_loops(false); }
void clear_shared_loop_cache_all() { clear_loops(true); }

std::pair<size_t, size_t> shared_loop_cache_counts() {
  std::lock_guard<std::mutex> lock(g_loop_mu);
  size_t pinned = 0;
  for (const auto& [k, l] : g_loop_cache) pinned += l.pinned;
  return {g_loop_cache.size(), pinned};
}

namespace {
// The loop entries every JSON grammar needs, built by computing the masks along short canonical
// outputs of canonical schemas (compact and flexible whitespace): the entries those masks build are
// pinned in the shared cache. Item structures do not depend on the schema around them, so every
// later grammar with a JSON string / number / whitespace finds them.
void prebuild_vocab_entries(const std::shared_ptr<const TokenVocab>& v) {
  const char* env = std::getenv("DEEPINFER_SO_PREBUILD");
  if (env && env[0] == '0') return;
  static const std::pair<const char*, const char*> kCanon[] = {
      {R"({"type":"object","properties":{"a":{"type":"string"},"b":{"type":"integer"},"c":{"type":"number"},"d":{"type":"boolean"},"e":{"type":"array","items":{"type":"string"}},"f":{"type":"array","items":{"type":"integer"}}},"required":["a","b","c","d","e","f"]})",
       R"({"a":"x\\y\u00e9z\n","b":-120,"c":-1.25e+10,"d":true,"e":["p","q"],"f":[10,2]})"},
      {R"({"type":"string"})", R"("ab\"c")"},
      {R"({"type":"integer"})", "-120"},
      {R"({"type":"number"})", "-1.5E-3"},
  };
  t_prebuilding = true;
  try {
    for (int flex = 0; flex < 2; ++flex)
      for (const auto& [schema, out] : kCanon) {
        JsonOptions opt;
        opt.flexible_whitespace = flex != 0;
        auto g = std::make_shared<const Grammar>(json_schema_grammar(nlohmann::ordered_json::parse(schema), opt));
        GrammarMatcher m(std::make_shared<CompiledGrammar>(g, v));
        const std::string_view s(out);
        for (size_t i = 0; i <= s.size(); ++i) {
          m.next_token_bitmask();
          if (i < s.size() && !m.accept_string(s.substr(i, 1))) break;
        }
      }
  } catch (...) {
  }
  t_prebuilding = false;
}
}  // namespace

TokenVocab::TokenVocab(std::vector<std::string> tokens, const std::vector<int32_t>& special_ids, int32_t eos_id)
    : bytes_(std::move(tokens)), special_(bytes_.size(), false), eos_id_(eos_id) {
  serial = g_vocab_serial.fetch_add(1);
  for (int32_t id : special_ids)
    if (id >= 0 && id < size()) special_[static_cast<size_t>(id)] = true;
  if (eos_id_ >= size()) eos_id_ = -1;
  for (int32_t i = 0; i < size(); ++i)
    if (!special_[static_cast<size_t>(i)] && i != eos_id_ && !bytes_[static_cast<size_t>(i)].empty())
      sorted.push_back(i);
  std::sort(sorted.begin(), sorted.end(),
            [&](int32_t a, int32_t b) { return bytes_[static_cast<size_t>(a)] < bytes_[static_cast<size_t>(b)]; });
  lcp.assign(sorted.size(), 0);
  std::vector<int32_t> path;  // trie nodes of the previous token's bytes
  for (size_t i = 0; i < sorted.size(); ++i) {
    const std::string& t = bytes_[static_cast<size_t>(sorted[i])];
    max_len = std::max(max_len, t.size());
    size_t k = 0;
    if (i > 0) {
      const std::string& p = bytes_[static_cast<size_t>(sorted[i - 1])];
      while (k < t.size() && k < p.size() && t[k] == p[k]) ++k;
      lcp[i] = static_cast<uint16_t>(std::min<size_t>(k, 65535));
    }
    while (path.size() > k) {
      trie_end[static_cast<size_t>(path.back())] = static_cast<int32_t>(trie_byte.size());
      path.pop_back();
    }
    for (size_t j = k; j < t.size(); ++j) {
      path.push_back(static_cast<int32_t>(trie_byte.size()));
      trie_byte.push_back(static_cast<uint8_t>(t[j]));
      trie_end.push_back(0);
      trie_tok_begin.push_back(0);
      trie_tok_end.push_back(0);
    }
    const size_t last = static_cast<size_t>(path.back());
    if (trie_tok_end[last] != static_cast<int32_t>(trie_ids.size()))
      trie_tok_begin[last] = static_cast<int32_t>(trie_ids.size());
    trie_ids.push_back(sorted[i]);
    trie_tok_end[last] = static_cast<int32_t>(trie_ids.size());
  }
  for (int32_t n : path) trie_end[static_cast<size_t>(n)] = static_cast<int32_t>(trie_byte.size());
  trie_sub_tok.assign(trie_byte.size() + 1, static_cast<int32_t>(trie_ids.size()));
  for (size_t c = trie_byte.size(); c-- > 0;)
    trie_sub_tok[c] = trie_tok_end[c] > trie_tok_begin[c] ? trie_tok_begin[c] : trie_sub_tok[c + 1];
  trie.resize(trie_byte.size());
  for (size_t i = 0; i < trie.size(); ++i)
    trie[i] = {trie_end[i], trie_tok_begin[i], static_cast<uint16_t>(trie_tok_end[i] - trie_tok_begin[i]),
               trie_byte[i]};
}

std::shared_ptr<const TokenVocab> TokenVocab::from_tokenizer(const Tokenizer& tok, int64_t vocab_size, int32_t eos_id) {
  std::vector<std::string> tokens(static_cast<size_t>(vocab_size));
  std::vector<int32_t> special;
  const int32_t n = std::min<int32_t>(tok.vocab_size(), static_cast<int32_t>(vocab_size));
  for (int32_t i = 0; i < n; ++i) {
    tokens[static_cast<size_t>(i)] = tok.token_bytes(i);
    if (tok.is_special(i)) special.push_back(i);
  }
  return std::make_shared<TokenVocab>(std::move(tokens), special, eos_id);
}

size_t CompiledGrammar::KeyHash::operator()(const std::vector<int32_t>& k) const {
  uint64_t h = 0xCBF29CE484222325ull;
  for (int32_t x : k) h = (h ^ static_cast<uint32_t>(x)) * 0x100000001B3ull;
  return static_cast<size_t>(h ^ (h >> 31));
}

CompiledGrammar::CompiledGrammar(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenVocab> vocab)
    : pda_(std::move(grammar)), vocab_(std::move(vocab)) {
  DI_CHECK(vocab_ != nullptr, "structured: no vocabulary");
  if (!t_prebuilding) std::call_once(vocab_->prebuild_once, prebuild_vocab_entries, vocab_);
  const Grammar& g = pda_.grammar();
  rule_of_pos_.assign(g.elems.size(), -1);
  for (size_t r = 0; r < g.alts.size(); ++r)
    for (int32_t a : g.alts[r])
      for (int32_t p = a;; ++p) {
        rule_of_pos_[static_cast<size_t>(p)] = static_cast<int32_t>(r);
        if (g.elems[static_cast<size_t>(p)].kind == Grammar::Kind::kEnd) break;
      }
  walk_.resize(vocab_->max_len + 2);
  // Byte classes: refine the partition of 0..255 by every terminal set.
  byte_class_.fill(0);
  num_classes_ = 1;
  for (const ByteSet& bs : g.sets) {
    if (num_classes_ == 256) break;
    std::array<int16_t, 512> remap;
    remap.fill(-1);
    int16_t nn = 0;
    for (int b = 0; b < 256; ++b) {
      const int k = byte_class_[static_cast<size_t>(b)] * 2 + (bs.test(static_cast<uint8_t>(b)) ? 1 : 0);
      if (remap[static_cast<size_t>(k)] < 0) remap[static_cast<size_t>(k)] = nn++;
      byte_class_[static_cast<size_t>(b)] = static_cast<uint8_t>(remap[static_cast<size_t>(k)]);
    }
    num_classes_ = nn;
  }
}

void CompiledGrammar::dfa_clear() {
  dstates_.clear();
  dwidth_.clear();
  dtrans_.clear();
  dindex_.clear();
  dfa_bytes_ = 0;
  dfa_over_ = false;
}

int32_t CompiledGrammar::dfa_intern(std::vector<int32_t>&& stacks) {
  auto it = dindex_.find(stacks);
  if (it != dindex_.end()) return it->second;
  const int32_t id = static_cast<int32_t>(dstates_.size());
  dfa_bytes_ += stacks.size() * 8 + static_cast<size_t>(num_classes_) * 4 + 128;
  if (dfa_bytes_ > dfa_limit_bytes) dfa_over_ = true;
  MatchState st;
  st.stacks = stacks;
  dwidth_.push_back(static_cast<uint32_t>(stacks.size()));
  dindex_.emplace(std::move(stacks), id);
  dstates_.push_back(std::move(st));
  dtrans_.resize(dtrans_.size() + static_cast<size_t>(num_classes_), -2);
  return id;
}

int32_t CompiledGrammar::dfa_fill(int32_t sid, uint8_t b) {
  int32_t r = -1;
  if (pda_.advance(dstates_[static_cast<size_t>(sid)], b, dtmp_)) r = dfa_intern(std::move(dtmp_.stacks));
  dtrans_[static_cast<size_t>(sid) * static_cast<size_t>(num_classes_) + byte_class_[b]] = r;
  return r;
}

void CompiledGrammar::visit_dfa(int32_t lo, int32_t hi, int32_t sid) {
  // Iterative preorder walk.
  const VocabNode* trie = vocab_->trie.data();
  const int32_t* ids = vocab_->trie_ids.data();
  const size_t nc = static_cast<size_t>(num_classes_);
  WalkFrame* fr = frames_.data();
  int top = 0;
  fr[0] = {lo, hi, sid};
  while (top >= 0) {
    WalkFrame& f = fr[top];
    if (f.c >= f.hi) {
      --top;
      continue;
    }
    const int32_t c = f.c;
    const VocabNode nd = trie[c];
    f.c = nd.end;
    int32_t t = dtrans_[static_cast<size_t>(f.sid) * nc + byte_class_[nd.byte]];
    if (t == -2) {
      t = dfa_fill(f.sid, nd.byte);
      if (dfa_over_) return;
    }
    if (t < 0) continue;
    const uint32_t w = dwidth_[static_cast<size_t>(t)];
    if (w > width_limit_) {
      wide_ = true;
      return;
    }
    hits_.insert(hits_.end(), ids + nd.tok, ids + nd.tok + nd.ntok);
    if (c + 1 < nd.end && w) fr[++top] = {c + 1, nd.end, t};
  }
}

const std::vector<uint32_t>& CompiledGrammar::mask(const MatchState& s) {
  ++stats.masks;
  std::vector<int32_t> key = s.stacks;
  key.push_back(s.accepting ? -2 : -1);
  auto it = cache_.find(key);
  if (it != cache_.end()) {
    ++stats.cache_hits;
    return it->second;
  }
  const size_t entry = static_cast<size_t>(vocab_->mask_words()) * 4 + key.size() * 4 + 64;
  if ((cache_.size() + 1) * entry > cache_limit_bytes) cache_.clear();  // bounded memory
  trim();
  std::vector<uint32_t> m;
  compute(s, m);
  return cache_.emplace(std::move(key), std::move(m)).first->second;
}

void CompiledGrammar::trim() {
  if (aux_bytes_ <= cache_limit_bytes) return;
  stack_masks_.clear();
  prefix_loops_.clear();
  budget_.clear();
  exits_.clear();
  expected_.clear();
  aux_bytes_ = 0;
}

void CompiledGrammar::visit(int32_t lo, int32_t hi, size_t d) {
  const TokenVocab& v = *vocab_;
  const ByteSet nb = pda_.next_bytes(walk_[d]);
  for (int32_t c = lo; c < hi && !wide_; c = v.trie_end[static_cast<size_t>(c)]) {
    const uint8_t b = v.trie_byte[static_cast<size_t>(c)];
    if (!nb.test(b)) continue;
    ++stats.bytes_advanced;
    MatchState& nx = walk_[d + 1];
    if (!pda_.advance(walk_[d], b, nx)) continue;
    if (nx.stacks.size() > width_limit_) wide_ = true;
    for (int32_t k = v.trie_tok_begin[static_cast<size_t>(c)]; k < v.trie_tok_end[static_cast<size_t>(c)]; ++k)
      hits_.push_back(v.trie_ids[static_cast<size_t>(k)]);
    if (c + 1 < v.trie_end[static_cast<size_t>(c)] && !nx.stacks.empty())
      visit(c + 1, v.trie_end[static_cast<size_t>(c)], d + 1);
  }
}

bool CompiledGrammar::walk(const MatchState& s, size_t width_limit, bool dfa) {
  hits_.clear();
  wide_ = false;
  width_limit_ = width_limit;
  if (s.stacks.empty()) return true;
  if (dfa) {
    if (dfa_bytes_ > dfa_limit_bytes) dfa_clear();
    frames_.resize(vocab_->max_len + 2);
    const int32_t root = dfa_intern(std::vector<int32_t>(s.stacks));
    if (!dfa_over_) {
      visit_dfa(0, static_cast<int32_t>(vocab_->trie.size()), root);
      if (!dfa_over_) return !wide_;
    }
    dfa_clear();  // over its memory bound: the plain walk
    hits_.clear();
    wide_ = false;
  }
  walk_[0] = s;
  visit(0, static_cast<int32_t>(vocab_->trie_byte.size()), 0);
  return !wide_;
}

void CompiledGrammar::compute_full(const MatchState& s, std::vector<uint32_t>& out) {
  out.assign(static_cast<size_t>(vocab_->mask_words()), 0);
  walk(s, SIZE_MAX, false);
  for (int32_t id : hits_) set_bit(out, id);
}

void CompiledGrammar::compute_walk(const MatchState& s, std::vector<uint32_t>& out) {
  out.assign(static_cast<size_t>(vocab_->mask_words()), 0);
  walk(s, SIZE_MAX, true);
  for (int32_t id : hits_) set_bit(out, id);
}

void CompiledGrammar::compute(const MatchState& s, std::vector<uint32_t>& out) {
  const TokenVocab& v = *vocab_;
  bool ok = false;
  if (!s.stacks.empty() && s.stacks.size() <= kMaxGroupStacks) {
    out.assign(static_cast<size_t>(v.mask_words()), 0);
    ok = compute_fast(s, out);
  }
  if (!ok) {
    if (!s.stacks.empty()) ++stats.full_walks;
    compute_walk(s, out);
  }
  bool any = false;
  for (uint32_t w : out)
    if (w) {
      any = true;
      break;
    }
  if ((s.accepting || !any) && v.eos_id() >= 0) set_bit(out, v.eos_id());
}

const CompiledGrammar::StackMask* CompiledGrammar::stack_mask(int32_t node) {
  auto it = stack_masks_.find(node);
  if (it != stack_masks_.end()) return &it->second;
  MatchState one;
  one.stacks = {node};
  ++stats.stack_walks;
  if (!walk(one, kWidth)) return nullptr;
  StackMask m;
  if (hits_.size() * 32 > static_cast<size_t>(vocab_->size())) {
    m.bits.assign(static_cast<size_t>(vocab_->mask_words()), 0);
    for (int32_t id : hits_) set_bit(m.bits, id);
    aux_bytes_ += m.bits.size() * 4 + 64;
  } else {
    m.ids = hits_;
    aux_bytes_ += m.ids.size() * 4 + 64;
  }
  return &stack_masks_.emplace(node, std::move(m)).first->second;
}

std::shared_ptr<const LoopEntry> CompiledGrammar::loop_entry(Grammar::Elem item, uint64_t key,
                                                             const std::vector<ByteSet>* prefix) {
  auto it = loops_.find(key);
  if (it != loops_.end()) return it->second;
  std::string structure = item_structure(pda_.grammar(), item);
  if (prefix && !structure.empty()) {
    std::string p = "P" + std::to_string(prefix->size());
    for (const ByteSet& b : *prefix) p.append(reinterpret_cast<const char*>(b.w), sizeof(ByteSet::w));
    structure = p + structure;
  }
  const std::string gkey = structure.empty() ? "" : std::to_string(vocab_->serial) + ":" + structure;
  std::shared_ptr<const LoopEntry> e;
  if (!gkey.empty()) {
    std::lock_guard<std::mutex> lock(g_loop_mu);
    auto g = g_loop_cache.find(gkey);
    if (g != g_loop_cache.end()) {
      e = g->second.e;
      g->second.used = ++g_loop_tick;
    }
  }
  if (!e) {
    auto built = std::make_shared<LoopEntry>();
    EntryBuilder b(pda_, *vocab_, item, *built, prefix);
    b.run();
    e = built;
    if (!gkey.empty()) {
      std::lock_guard<std::mutex> lock(g_loop_mu);
      const size_t bytes = entry_bytes(*e);
      while (!t_prebuilding && g_loop_bytes + bytes > kSharedLoopBytes) {
        auto old = g_loop_cache.end();
        for (auto i = g_loop_cache.begin(); i != g_loop_cache.end(); ++i)
          if (!i->second.pinned && (old == g_loop_cache.end() || i->second.used < old->second.used)) old = i;
        if (old == g_loop_cache.end()) break;
        g_loop_bytes -= old->second.bytes;
        g_loop_cache.erase(old);
      }
      if (g_loop_cache.emplace(gkey, SharedLoop{e, bytes, ++g_loop_tick, t_prebuilding}).second && !t_prebuilding)
        g_loop_bytes += bytes;
    }
  }
  loops_.emplace(key, e);
  return e;
}

const CompiledGrammar::ExitInfo& CompiledGrammar::exit_info(const LoopEntry& e, uint64_t key, int32_t ctx) {
  auto [it, fresh] = exits_.try_emplace({key, ctx});
  ExitInfo& x = it->second;
  if (!fresh) return x;
  MatchState c;
  if (ctx < 0)
    c.accepting = true;  // leaving the loop ends the sentence
  else
    c = pda_.state_of_node(ctx);
  if (c.dead() || c.stacks.size() > kWidth) return x;
  const ByteSet a = pda_.next_bytes(c);
  for (int i = 0; i < 4; ++i)
    if (a.w[i] & e.first.w[i]) return x;  // the context could take the next item's bytes too
  const TokenVocab& v = *vocab_;
  std::unordered_map<std::string_view, bool> seen;
  MatchState s, tmp;
  for (int b = 0; b < 256; ++b) {
    if (!a.test(static_cast<uint8_t>(b))) continue;
    for (int32_t i = e.exit_start[static_cast<size_t>(b)]; i < e.exit_start[static_cast<size_t>(b) + 1]; ++i) {
      const LoopEntry::Exit& ex = e.exits[static_cast<size_t>(i)];
      const std::string_view suffix = std::string_view(v.bytes(ex.id)).substr(ex.off);
      auto [si, sfresh] = seen.try_emplace(suffix, false);
      if (sfresh) {
        s = c;
        bool ok = true;
        for (char ch : suffix) {
          if (!pda_.advance(s, static_cast<uint8_t>(ch), tmp)) {
            ok = false;
            break;
          }
          if (tmp.stacks.size() > kWidth) return x;  // (x.usable stays false)
          std::swap(s, tmp);
        }
        si->second = ok;
      }
      if (si->second) x.ok.push_back({ex.n, ex.id});
    }
  }
  std::sort(x.ok.begin(), x.ok.end());
  aux_bytes_ += x.ok.size() * 8 + 128;
  x.usable = true;
  return x;
}

const std::vector<uint32_t>& CompiledGrammar::budget_bits(const LoopEntry& e, uint64_t key, int32_t j) {
  if (j < 0 || j >= e.max_n) return e.full_all;
  auto it = budget_.find({key, j});
  if (it != budget_.end()) return it->second;
  // From the nearest cached budget of this item (or from nothing / from all), adding or removing the
  // tokens in between.
  const std::vector<uint32_t>* base = nullptr;
  int32_t bj = 0;
  auto hi = budget_.lower_bound({key, j});
  if (hi != budget_.end() && hi->first.first == key) {
    base = &hi->second;
    bj = hi->first.second;
  }
  if (hi != budget_.begin()) {
    auto lo = std::prev(hi);
    if (lo->first.first == key && (!base || j - lo->first.second < bj - j)) {
      base = &lo->second;
      bj = lo->first.second;
    }
  }
  const int32_t ntok = static_cast<int32_t>(e.by_n.size());
  auto count_between = [&](int32_t a, int32_t b) {  // tokens with n in (a, b]
    return e.n_start[static_cast<size_t>(std::min(b, e.max_n)) + 1] -
           e.n_start[static_cast<size_t>(std::min(a, e.max_n)) + 1];
  };
  if (!base || std::abs(count_between(std::min(j, bj), std::max(j, bj))) >
                   std::min(count_between(0, j), ntok - count_between(0, j))) {
    base = nullptr;
    bj = count_between(0, j) <= ntok - count_between(0, j) ? 0 : e.max_n;
  }
  std::vector<uint32_t> m = base ? *base : (bj == 0 ? std::vector<uint32_t>(e.full_all.size(), 0) : e.full_all);
  const int32_t a = std::min(j, bj), b = std::max(j, bj);
  for (int32_t i = e.n_start[static_cast<size_t>(a) + 1]; i < e.n_start[static_cast<size_t>(b) + 1]; ++i) {
    const int32_t id = e.by_n[static_cast<size_t>(i)];
    if (bj < j)
      set_bit(m, id);
    else
      m[static_cast<size_t>(id) >> 5] &= ~(uint32_t{1} << (id & 31));
  }
  aux_bytes_ += m.size() * 4 + 64;
  return budget_.emplace(std::make_pair(key, j), std::move(m)).first->second;
}

bool CompiledGrammar::find_loop(int32_t top, int32_t& rule, int32_t& ctx) const {
  const Grammar& g = pda_.grammar();
  const int32_t tp = pda_.node_pos(top);
  const int32_t tr = rule_of_pos_[static_cast<size_t>(tp)];
  if (g.loops[static_cast<size_t>(tr)].budget != 0 && tp == g.alts[static_cast<size_t>(tr)][0]) {
    rule = tr;
    ctx = pda_.node_parent(top);
    return true;
  }
  int32_t m = pda_.node_parent(top);
  for (int k = 0; k < 8 && m >= 0; ++k, m = pda_.node_parent(m)) {
    const int32_t p = pda_.node_pos(m);
    const int32_t r = rule_of_pos_[static_cast<size_t>(p)];
    if (g.loops[static_cast<size_t>(r)].budget != 0 && p == g.alts[static_cast<size_t>(r)][0] + 1) {
      rule = r;
      ctx = pda_.node_parent(m);
      return true;
    }
  }
  return false;
}

const std::vector<int32_t>& CompiledGrammar::expected_stacks(int32_t rule, int32_t ctx) {
  const int32_t start = pda_.make_node(pda_.grammar().alts[static_cast<size_t>(rule)][0], ctx);
  auto ex = expected_.find(start);
  if (ex == expected_.end()) {
    MatchState st = pda_.state_of_node(start);
    aux_bytes_ += st.stacks.size() * 4 + 64;
    ex = expected_.emplace(start, std::move(st.stacks)).first;
  }
  return ex->second;
}

bool CompiledGrammar::add_loop(const LoopEntry& e, uint64_t key, int32_t rule, int32_t ctx,
                               std::vector<uint32_t>& out) {
  if (!e.usable) return false;
  const int32_t base_depth = ctx < 0 ? 0 : pda_.node_depth(ctx);
  if (base_depth + 1 + e.max_rel_depth + 8 > PdaMatcher::kMaxDepth) return false;
  const ExitInfo& x = exit_info(e, key, ctx);
  if (!x.usable) return false;
  const Grammar::Loop lp = pda_.grammar().loops[static_cast<size_t>(rule)];
  if (e.by_n.size() < out.size()) {  // few tokens: set them (cheaper than a bitset pass)
    const int32_t j = lp.budget < 0 ? e.max_n : std::min(lp.budget, e.max_n);
    for (int32_t i = e.n_start[1]; i < e.n_start[static_cast<size_t>(j) + 1]; ++i)
      set_bit(out, e.by_n[static_cast<size_t>(i)]);
  } else {
    or_into(out, budget_bits(e, key, lp.budget));
  }
  for (const auto& [n, id] : x.ok) {
    if (lp.budget >= 0 && n > lp.budget) break;
    if (n >= lp.min_rem) set_bit(out, id);
  }
  return true;
}

bool CompiledGrammar::prefix_expand(int32_t node, std::vector<ByteSet>& prefix, PrefixLoop& r) {
  if (r.parts.size() >= kMaxPrefixParts) return false;
  const Grammar& g = pda_.grammar();
  // One stack whose top is a byte set: every byte of the set leads to the same state.
  const Grammar::Elem& top = g.elems[static_cast<size_t>(pda_.node_pos(node))];
  if (top.kind != Grammar::Kind::kTerm) return false;
  const ByteSet& set = g.sets[static_cast<size_t>(top.arg)];
  const int b = set.first();
  if (b < 0) return false;
  MatchState st, nx;
  st.stacks = {node};
  if (!pda_.advance(st, static_cast<uint8_t>(b), nx) || nx.stacks.empty() || nx.stacks.size() > kWidth) return false;
  prefix.push_back(set);
  // A loop position: exactly the item's start stacks, plus the context's own stacks (and
  // acceptance) when the loop may stop there.
  for (int32_t t : nx.stacks) {
    int32_t rule = -1, ctx = -1;
    if (!find_loop(t, rule, ctx)) continue;
    MatchState want;
    want.stacks = expected_stacks(rule, ctx);
    if (g.loops[static_cast<size_t>(rule)].min_rem == 0) {
      MatchState c;
      if (ctx < 0)
        c.accepting = true;
      else
        c = pda_.state_of_node(ctx);
      want.accepting = c.accepting;
      want.stacks.insert(want.stacks.end(), c.stacks.begin(), c.stacks.end());
      std::sort(want.stacks.begin(), want.stacks.end());
      want.stacks.erase(std::unique(want.stacks.begin(), want.stacks.end()), want.stacks.end());
    }
    if (!(want == nx)) break;
    const Grammar::Elem item = g.elems[static_cast<size_t>(g.alts[static_cast<size_t>(rule)][0])];
    std::string pk(reinterpret_cast<const char*>(&item), sizeof(item));
    for (const ByteSet& p : prefix) pk.append(reinterpret_cast<const char*>(p.w), sizeof(ByteSet::w));
    auto [ki, kfresh] = prefix_keys_.try_emplace(pk, (uint64_t{1} << 63) | prefix_keys_.size());
    PrefixPart part;
    part.key = ki->second;
    part.rule = rule;
    part.ctx = ctx;
    part.entry = loop_entry(item, part.key, &prefix);
    r.parts.push_back(std::move(part));
    prefix.pop_back();
    return true;
  }
  if (prefix.size() < static_cast<size_t>(kMaxPrefix)) {
    // Each stack after the set on its own (the tokens that end right after it come with them).
    for (int32_t m : nx.stacks)
      if (!prefix_expand(m, prefix, r)) return false;
    prefix.pop_back();
    return true;
  }
  prefix.pop_back();
  PrefixPart part;  // a walk from this stack over the trie below the prefix
  part.stack = node;
  part.prefix = prefix;
  r.parts.push_back(std::move(part));
  return true;
}

CompiledGrammar::PrefixLoop& CompiledGrammar::prefix_loop(int32_t node) {
  auto [it, fresh] = prefix_loops_.try_emplace(node);
  PrefixLoop& r = it->second;  // (references into an unordered_map stay valid)
  if (!fresh) return r;
  std::vector<ByteSet> prefix;
  r.usable = prefix_expand(node, prefix, r);
  bool loop = false;
  for (const PrefixPart& p : r.parts) loop |= p.entry != nullptr;
  if (!r.usable || !loop) {
    r.usable = false;
    r.parts.clear();
  }
  return r;
}

void CompiledGrammar::visit_prefix(int32_t lo, int32_t hi, const std::vector<ByteSet>& prefix, size_t i, int32_t root) {
  const VocabNode* trie = vocab_->trie.data();
  const int32_t* ids = vocab_->trie_ids.data();
  for (int32_t c = lo; c < hi && !wide_ && !dfa_over_; c = trie[c].end) {
    const VocabNode nd = trie[c];
    if (!prefix[i].test(nd.byte)) continue;
    if (i + 1 < prefix.size()) {
      visit_prefix(c + 1, nd.end, prefix, i + 1, root);
      continue;
    }
    hits_.insert(hits_.end(), ids + nd.tok, ids + nd.tok + nd.ntok);
    if (c + 1 < nd.end) visit_dfa(c + 1, nd.end, root);
  }
}

bool CompiledGrammar::apply_prefix(PrefixLoop& p, std::vector<uint32_t>& out) {
  for (PrefixPart& part : p.parts) {
    if (part.entry) {
      if (!add_loop(*part.entry, part.key, part.rule, part.ctx, out)) return false;
      continue;
    }
    if (!part.walked) {
      hits_.clear();
      wide_ = false;
      width_limit_ = kWidth;
      if (dfa_bytes_ > dfa_limit_bytes) dfa_clear();
      frames_.resize(vocab_->max_len + 2);
      const int32_t root = dfa_intern(std::vector<int32_t>{part.stack});
      if (!dfa_over_) visit_prefix(0, static_cast<int32_t>(vocab_->trie.size()), part.prefix, 0, root);
      const bool over = dfa_over_;
      if (over) dfa_clear();
      if (over || wide_) return false;  // (the caller falls back to the stack's own walk)
      part.ids = hits_;
      part.walked = true;
      aux_bytes_ += part.ids.size() * 4 + 64;
    }
    for (int32_t id : part.ids) set_bit(out, id);
  }
  return true;
}

bool CompiledGrammar::compute_fast(const MatchState& s, std::vector<uint32_t>& out) {
  const Grammar& g = pda_.grammar();
  const size_t ns = s.stacks.size();
  std::vector<char> done(ns, 0);
  size_t width = ns * 2 * kWidth;  // bound on the stacks of the walk from the whole state
  if (use_loops) {
    // Loop positions: (loop rule, the node below it) found from each stack's top frames.
    std::vector<std::pair<int32_t, int32_t>> tried;
    for (size_t i = 0; i < ns; ++i) {
      if (done[i]) continue;
      int32_t rule = -1, ctx = -1;
      if (!find_loop(s.stacks[i], rule, ctx)) continue;
      if (std::find(tried.begin(), tried.end(), std::make_pair(rule, ctx)) != tried.end()) continue;
      tried.push_back({rule, ctx});
      const std::vector<int32_t>& expected = expected_stacks(rule, ctx);
      std::vector<size_t> idx;
      bool all = !expected.empty();
      for (int32_t n : expected) {
        auto f = std::lower_bound(s.stacks.begin(), s.stacks.end(), n);
        if (f == s.stacks.end() || *f != n) {
          all = false;
          break;
        }
        idx.push_back(static_cast<size_t>(f - s.stacks.begin()));
      }
      if (!all) continue;
      const Grammar::Elem item = g.elems[static_cast<size_t>(g.alts[static_cast<size_t>(rule)][0])];
      const uint64_t key = (static_cast<uint64_t>(item.kind) << 32) | static_cast<uint32_t>(item.arg);
      std::shared_ptr<const LoopEntry> e = loop_entry(item, key);
      if (!add_loop(*e, key, rule, ctx, out)) continue;
      for (size_t k : idx) done[k] = 1;
      ++stats.loop_groups;
    }
  }
  for (size_t i = 0; i < ns; ++i) {
    if (done[i]) continue;
    if (use_loops) {
      // A short fixed prefix of byte sets into loop positions: the loops' walks shifted by it. (Each
      // part's walk stays within 2 * kWidth stacks: the whole state's within kMaxStacks.)
      PrefixLoop& p = prefix_loop(s.stacks[i]);
      if (p.usable && width + (p.parts.size() - 1) * 2 * kWidth <= PdaMatcher::kMaxStacks) {
        if (apply_prefix(p, out)) {
          width += (p.parts.size() - 1) * 2 * kWidth;
          ++stats.prefix_groups;
          continue;
        }
        p.usable = false;  // (what it set is allowed too)
      }
    }
    const StackMask* m = stack_mask(s.stacks[i]);
    if (!m) return false;
    if (!m->bits.empty())
      or_into(out, m->bits);
    else
      for (int32_t id : m->ids) set_bit(out, id);
  }
  return true;
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<CompiledGrammar> g) : g_(std::move(g)) { reset(); }

void GrammarMatcher::reset() {
  history_.clear();
  history_.push_back({g_->pda().initial(), false});
}

const std::vector<uint32_t>& GrammarMatcher::next_token_bitmask() {
  if (is_terminated()) {
    thread_local std::vector<uint32_t> eos_only;
    eos_only.assign(static_cast<size_t>(g_->vocab().mask_words()), 0);
    const int32_t e = g_->vocab().eos_id();
    if (e >= 0) eos_only[static_cast<size_t>(e) >> 5] |= uint32_t{1} << (e & 31);
    return eos_only;
  }
  return g_->mask(history_.back().state);
}

bool GrammarMatcher::is_token_allowed(int32_t id) {
  if (id < 0 || id >= g_->vocab().size()) return false;
  const std::vector<uint32_t>& m = next_token_bitmask();
  return (m[static_cast<size_t>(id) >> 5] >> (id & 31)) & 1;
}

bool GrammarMatcher::accept_token(int32_t id) {
  const TokenVocab& v = g_->vocab();
  if (id < 0 || id >= v.size() || is_terminated()) return false;
  const MatchState& cur = history_.back().state;
  if (id == v.eos_id()) {
    if (!cur.accepting && !is_token_allowed(id)) return false;
    history_.push_back({cur, true});
    return true;
  }
  if (v.is_special(id) || v.bytes(id).empty()) return false;
  MatchState s = cur;
  if (!g_->pda().advance_bytes(s, v.bytes(id))) return false;
  history_.push_back({std::move(s), false});
  return true;
}

bool GrammarMatcher::accept_string(std::string_view bytes) {
  if (is_terminated()) return false;
  MatchState s = history_.back().state;
  if (!g_->pda().advance_bytes(s, bytes)) return false;
  history_.push_back({std::move(s), false});
  return true;
}

void GrammarMatcher::rollback(int64_t n) {
  DI_CHECK(n >= 0 && n <= num_accepted(), "structured: rollback({}) past the {} accepted tokens", n, num_accepted());
  history_.resize(history_.size() - static_cast<size_t>(n));
}

std::string GrammarMatcher::forced_bytes() {
  std::string out;
  MatchState s = history_.back().state, next;
  while (!s.accepting && !s.stacks.empty() && out.size() < 4096) {
    const ByteSet b = g_->pda().next_bytes(s);
    if (b.count() != 1) break;
    const uint8_t c = static_cast<uint8_t>(b.first());
    if (!g_->pda().advance(s, c, next)) break;
    out.push_back(static_cast<char>(c));
    std::swap(s, next);
  }
  return out;
}

}  // namespace deepinfer::structured
