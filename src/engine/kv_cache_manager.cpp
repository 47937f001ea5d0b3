#include "engine/kv_cache_manager.h"

#include <algorithm>

#include "deepinfer/error.h"
#include "model/state.h"

namespace deepinfer {

namespace {
constexpr int64_t kFloat = sizeof(float);
constexpr int64_t kRows = RowPages::kRowsPerPage;
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int idx(KvPool p) { return static_cast<int>(p); }
}  // namespace

const char* kv_pool_name(KvPool p) {
  switch (p) {
    case KvPool::kWindow:
      return "window";
    case KvPool::kCompressor:
      return "compressor";
    case KvPool::kCompressed:
      return "compressed";
    case KvPool::kIndexKeys:
      return "index_keys";
  }
  return "?";
}

KvCacheManager::KvCacheManager(const ModelConfig& cfg, int64_t budget_bytes) : budget_bytes_(budget_bytes) {
  DI_CHECK(budget_bytes > 0, "kv-cache-memory must be positive (got {} bytes)", budget_bytes);
  page_bytes_[idx(KvPool::kWindow)] = cfg.window_size * cfg.head_dim * kFloat;
  page_bytes_[idx(KvPool::kCompressed)] = kRows * cfg.head_dim * kFloat;
  page_bytes_[idx(KvPool::kIndexKeys)] = kRows * cfg.index_head_dim * kFloat;
  int64_t compressor_bytes = 0;
  const bool v41 = cfg.family == ModelFamily::kV41;
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    const int64_t r = cfg.compress_ratio(l);
    ++num_window_pages_;
    // V4: every compressed layer owns compressed KV (C4 also index keys and a second compressor).
    // V4.1: only kv sources own compressed KV and index keys; ratio-2 sources an open-pair state.
    // (V4.1's Engram history, 4 bytes per token, is not counted.)
    const bool owns = r > 0 && (!v41 || cfg.is_kv_source(l));
    if (!owns) continue;
    ratio_.push_back(r);
    index_keys_.push_back(v41 || r == 4);
    const int64_t c = r == 4 ? 2 : 1;
    if (r > 1) {
      compressor_bytes += 4 * r * c * cfg.head_dim * kFloat;  // prev/cur kv and score rows
      ++num_compressor_pages_;
    }
    if (r == 4) {
      compressor_bytes += 4 * r * c * cfg.index_head_dim * kFloat;
      ++num_compressor_pages_;
    }
  }
  // Compressor pages differ per ratio: one nominal page size covers them (rounded up, never under).
  page_bytes_[idx(KvPool::kCompressor)] =
      num_compressor_pages_ > 0 ? ceil_div(compressor_bytes, num_compressor_pages_) : 0;
}

KvPages KvCacheManager::pages_for_tokens(int64_t num_tokens) const {
  KvPages p;
  if (num_tokens <= 0) return p;
  p.num_pages[idx(KvPool::kWindow)] = num_window_pages_;
  p.num_pages[idx(KvPool::kCompressor)] = num_compressor_pages_;
  for (size_t i = 0; i < ratio_.size(); ++i) {
    const int64_t rows = num_tokens / ratio_[i];
    p.num_pages[idx(KvPool::kCompressed)] += ceil_div(rows, kRows);
    if (index_keys_[i]) p.num_pages[idx(KvPool::kIndexKeys)] += ceil_div(rows, kRows);
  }
  for (int i = 0; i < kNumKvPools; ++i) p.num_bytes += p.num_pages[i] * page_bytes_[i];
  return p;
}

int64_t KvCacheManager::extra_bytes(const Sequence& seq, int64_t num_new_tokens, KvPages* pages) const {
  DI_CHECK(num_new_tokens >= 0, "kv cache: negative token count {}", num_new_tokens);
  *pages = pages_for_tokens(seq.num_computed_tokens + num_new_tokens);
  auto it = held_.find(seq.seq_id);
  const int64_t held = it == held_.end() ? 0 : it->second.num_bytes;
  return std::max<int64_t>(0, pages->num_bytes - held);
}

bool KvCacheManager::can_allocate(const Sequence& seq, int64_t num_new_tokens) const {
  KvPages pages;
  return used_bytes_ + extra_bytes(seq, num_new_tokens, &pages) <= budget_bytes_;
}

std::optional<KvPages> KvCacheManager::allocate(const Sequence& seq, int64_t num_new_tokens) {
  KvPages pages;
  const int64_t extra = extra_bytes(seq, num_new_tokens, &pages);
  if (used_bytes_ + extra > budget_bytes_) return std::nullopt;
  KvPages& held = held_[seq.seq_id];
  if (pages.num_bytes > held.num_bytes) {  // state only grows; a shorter request keeps what is held
    used_bytes_ += pages.num_bytes - held.num_bytes;
    held = pages;
  }
  return held;
}

void KvCacheManager::free(int64_t seq_id) {
  auto it = held_.find(seq_id);
  if (it == held_.end()) return;
  used_bytes_ -= it->second.num_bytes;
  held_.erase(it);
}

KvUsage KvCacheManager::usage() const {
  KvUsage u;
  u.budget_bytes = budget_bytes_;
  u.used_bytes = used_bytes_;
  u.num_sequences = static_cast<int64_t>(held_.size());
  for (const auto& [id, p] : held_)
    for (int i = 0; i < kNumKvPools; ++i) u.num_pages[i] += p.num_pages[i];
  return u;
}

}  // namespace deepinfer
