#include "structured/token_matcher.h"

#include <algorithm>
#include <numeric>

#include "deepinfer/error.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::structured {

TokenVocab::TokenVocab(std::vector<std::string> tokens, const std::vector<int32_t>& special_ids, int32_t eos_id)
    : bytes_(std::move(tokens)), special_(bytes_.size(), false), eos_id_(eos_id) {
  for (int32_t id : special_ids)
    if (id >= 0 && id < size()) special_[static_cast<size_t>(id)] = true;
  if (eos_id_ >= size()) eos_id_ = -1;
  for (int32_t i = 0; i < size(); ++i)
    if (!special_[static_cast<size_t>(i)] && i != eos_id_ && !bytes_[static_cast<size_t>(i)].empty()) sorted.push_back(i);
  std::sort(sorted.begin(), sorted.end(), [&](int32_t a, int32_t b) {
    return bytes_[static_cast<size_t>(a)] < bytes_[static_cast<size_t>(b)];
  });
  lcp.assign(sorted.size(), 0);
  for (size_t i = 0; i < sorted.size(); ++i) {
    const std::string& t = bytes_[static_cast<size_t>(sorted[i])];
    max_len = std::max(max_len, t.size());
    if (i == 0) continue;
    const std::string& p = bytes_[static_cast<size_t>(sorted[i - 1])];
    size_t k = 0;
    while (k < t.size() && k < p.size() && t[k] == p[k]) ++k;
    lcp[i] = static_cast<uint16_t>(std::min<size_t>(k, 65535));
  }
}

std::shared_ptr<const TokenVocab> TokenVocab::from_tokenizer(const Tokenizer& tok, int64_t vocab_size,
                                                             int32_t eos_id) {
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
  std::vector<uint32_t> m;
  compute(s, m);
  return cache_.emplace(std::move(key), std::move(m)).first->second;
}

void CompiledGrammar::compute(const MatchState& s, std::vector<uint32_t>& out) {
  const TokenVocab& v = *vocab_;
  out.assign(static_cast<size_t>(v.mask_words()), 0);
  auto set = [&](int32_t id) { out[static_cast<size_t>(id) >> 5] |= uint32_t{1} << (id & 31); };
  bool any = false;
  if (!s.stacks.empty()) {
    if (walk_.size() < v.max_len + 1) walk_.resize(v.max_len + 1);
    walk_[0] = s;
    size_t valid = 0;  // walk_[0..valid] hold the states of the previous token's prefix
    const size_t n = v.sorted.size();
    size_t i = 0;
    while (i < n) {
      const int32_t id = v.sorted[i];
      const std::string& t = v.bytes(id);
      size_t k = std::min<size_t>(v.lcp[i], valid);
      bool ok = true;
      for (; k < t.size(); ++k) {
        ++stats.bytes_advanced;
        if (!pda_.advance(walk_[k], static_cast<uint8_t>(t[k]), walk_[k + 1])) {
          ok = false;
          break;
        }
      }
      if (ok) {
        valid = t.size();
        set(id);
        any = true;
        ++i;
      } else {
        valid = k;  // states 0..k are good; every token sharing bytes 0..k is dead
        size_t j = i + 1;
        while (j < n && v.lcp[j] > k) ++j;
        i = j;
      }
    }
  }
  if ((s.accepting || !any) && v.eos_id() >= 0) set(v.eos_id());
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
