#include "structured/matcher.h"

#include <algorithm>

#include "deepinfer/error.h"

namespace deepinfer::structured {

PdaMatcher::PdaMatcher(std::shared_ptr<const Grammar> grammar) : g_(std::move(grammar)) {
  DI_CHECK(g_ != nullptr, "matcher: no grammar");
}

int32_t PdaMatcher::node(int32_t pos, int32_t parent) {
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(pos)) << 32) | static_cast<uint32_t>(parent + 1);
  auto it = index_.find(key);
  if (it != index_.end()) return it->second;
  const int32_t id = static_cast<int32_t>(nodes_.size());
  const int32_t depth = parent < 0 ? 1 : nodes_[static_cast<size_t>(parent)].depth + 1;
  nodes_.push_back({pos, parent, depth});
  index_.emplace(key, id);
  return id;
}

void PdaMatcher::closure(int32_t start, MatchState& out) {
  work_.clear();
  work_.push_back(start);
  while (!work_.empty()) {
    const int32_t n = work_.back();
    work_.pop_back();
    if (seen_.size() <= static_cast<size_t>(n)) seen_.resize(nodes_.size() * 2 + 16, 0);
    if (seen_[static_cast<size_t>(n)] == epoch_) continue;
    seen_[static_cast<size_t>(n)] = epoch_;
    const Node nd = nodes_[static_cast<size_t>(n)];
    if (nd.depth > kMaxDepth) continue;
    const Grammar::Elem& e = g_->elems[static_cast<size_t>(nd.pos)];
    switch (e.kind) {
      case Grammar::Kind::kEnd:
        if (nd.parent < 0)
          out.accepting = true;
        else
          work_.push_back(nd.parent);
        break;
      case Grammar::Kind::kTerm:
        if (out.stacks.size() < kMaxStacks) out.stacks.push_back(n);
        break;
      case Grammar::Kind::kRule: {
        const bool tail = g_->elems[static_cast<size_t>(nd.pos) + 1].kind == Grammar::Kind::kEnd;
        const int32_t ret = tail ? nd.parent : node(nd.pos + 1, nd.parent);
        for (int32_t a : g_->alts[static_cast<size_t>(e.arg)]) work_.push_back(node(a, ret));
        break;
      }
    }
  }
}

MatchState PdaMatcher::initial() {
  MatchState s;
  ++epoch_;
  for (int32_t a : g_->alts[static_cast<size_t>(g_->root)]) closure(node(a, -1), s);
  std::sort(s.stacks.begin(), s.stacks.end());
  s.stacks.erase(std::unique(s.stacks.begin(), s.stacks.end()), s.stacks.end());
  return s;
}

MatchState PdaMatcher::state_of_node(int32_t n) {
  MatchState s;
  ++epoch_;
  closure(n, s);
  std::sort(s.stacks.begin(), s.stacks.end());
  s.stacks.erase(std::unique(s.stacks.begin(), s.stacks.end()), s.stacks.end());
  return s;
}

MatchState PdaMatcher::state_of_rule(int32_t rule) {
  MatchState s;
  ++epoch_;
  for (int32_t a : g_->alts[static_cast<size_t>(rule)]) closure(node(a, -1), s);
  std::sort(s.stacks.begin(), s.stacks.end());
  s.stacks.erase(std::unique(s.stacks.begin(), s.stacks.end()), s.stacks.end());
  return s;
}

bool PdaMatcher::advance(const MatchState& s, uint8_t b, MatchState& out) {
  out.stacks.clear();
  out.accepting = false;
  ++epoch_;
  for (int32_t n : s.stacks) {
    const Node nd = nodes_[static_cast<size_t>(n)];
    const Grammar::Elem& e = g_->elems[static_cast<size_t>(nd.pos)];
    if (!g_->sets[static_cast<size_t>(e.arg)].test(b)) continue;
    closure(node(nd.pos + 1, nd.parent), out);
  }
  if (out.stacks.size() > 1) {
    std::sort(out.stacks.begin(), out.stacks.end());
    out.stacks.erase(std::unique(out.stacks.begin(), out.stacks.end()), out.stacks.end());
  }
  return !out.dead();
}

bool PdaMatcher::advance_bytes(MatchState& s, std::string_view bytes) {
  MatchState tmp;
  for (char c : bytes) {
    if (!advance(s, static_cast<uint8_t>(c), tmp)) {
      s = MatchState{};
      return false;
    }
    std::swap(s, tmp);
  }
  return true;
}

ByteSet PdaMatcher::next_bytes(const MatchState& s) const {
  ByteSet u;
  for (int32_t n : s.stacks) {
    const ByteSet& b =
        g_->sets[static_cast<size_t>(g_->elems[static_cast<size_t>(nodes_[static_cast<size_t>(n)].pos)].arg)];
    for (int i = 0; i < 4; ++i) u.w[i] |= b.w[i];
  }
  return u;
}

bool PdaMatcher::matches(std::string_view text) {
  MatchState s = initial();
  return advance_bytes(s, text) && s.accepting;
}

}  // namespace deepinfer::structured
