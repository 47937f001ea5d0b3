// Per-sequence decode state of the V4 and V4.1 families (docs/v4-architecture.md §2.7), kept in fixed-size
// pages per kind (window rows, compressed entries, index keys) so a KV-cache manager can page
// each pool on its own. Values are the already fake-quantised latents, as float32.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "deepinfer/model_config.h"

namespace deepinfer {

// A pool of equal-sized float pages for one kind of per-sequence state (window rings, compressed
// entries, index keys). Pages are allocated on first use, at most `capacity` of them, and reused
// once released. The engine admits work only while its KvCacheManager's byte accounting fits the
// budget, so a pool does not run dry there; if it does (a bookkeeping bug) acquire() throws
// instead of growing past the budget.
class PagePool {
 public:
  PagePool(int64_t page_floats, int64_t capacity);
  float* acquire();
  void release(float* page);
  int64_t page_floats() const { return page_floats_; }
  int64_t capacity() const { return capacity_; }
  int64_t in_use() const;
  int64_t allocated() const;  // pages ever allocated (the pool's footprint)

 private:
  int64_t page_floats_, capacity_;
  mutable std::mutex mu_;  // the model may run on the engine's worker thread
  std::vector<std::unique_ptr<float[]>> pages_;
  std::vector<float*> free_;
};

// The pools a sequence's state draws from; any of them may be null (own allocations).
struct StatePools {
  std::shared_ptr<PagePool> window, compressed, index_keys;
};

// Append-only rows of fixed width, stored in pages of kRowsPerPage rows (from a pool when given).
class RowPages {
 public:
  static constexpr int64_t kRowsPerPage = 64;
  explicit RowPages(int64_t width = 0, std::shared_ptr<PagePool> pool = nullptr);
  ~RowPages();
  RowPages(RowPages&& o) noexcept;
  RowPages& operator=(RowPages&& o) noexcept;
  RowPages(const RowPages&) = delete;
  RowPages& operator=(const RowPages&) = delete;

  int64_t width() const { return width_; }
  int64_t rows() const { return rows_; }
  float* append();  // returns the new row (uninitialised)
  const float* row(int64_t i) const { return pages_[i / kRowsPerPage] + (i % kRowsPerPage) * width_; }
  float* row(int64_t i) { return pages_[i / kRowsPerPage] + (i % kRowsPerPage) * width_; }
  int64_t num_pages() const { return static_cast<int64_t>(pages_.size()); }

 private:
  void clear();
  int64_t width_;
  int64_t rows_ = 0;
  std::shared_ptr<PagePool> pool_;
  std::vector<float*> pages_;
  std::vector<std::unique_ptr<float[]>> own_;  // without a pool
};

// Ring of the last `window` rows: slot = position mod window (one pool page when given).
class WindowRing {
 public:
  WindowRing() = default;
  WindowRing(int64_t window, int64_t width, std::shared_ptr<PagePool> pool = nullptr);
  ~WindowRing();
  WindowRing(WindowRing&& o) noexcept;
  WindowRing& operator=(WindowRing&& o) noexcept;
  WindowRing(const WindowRing&) = delete;
  WindowRing& operator=(const WindowRing&) = delete;

  float* slot(int64_t pos) { return data_ + (pos % window_) * width_; }
  const float* slot(int64_t pos) const { return data_ + (pos % window_) * width_; }
  int64_t window() const { return window_; }

 private:
  void clear();
  int64_t window_ = 0, width_ = 0;
  std::shared_ptr<PagePool> pool_;
  float* data_ = nullptr;
  std::unique_ptr<float[]> own_;
};

// Open-group state of one compressor: the FP32 kv and gate-score rows (ape already added) of the
// tokens of the group being filled and, with overlap (ratio 4), of the previous complete group.
struct CompressorState {
  int64_t ratio = 0, width = 0;  // width = c * d
  bool has_prev = false;
  std::vector<float> prev_kv, prev_score;  // [ratio, width]; scores without the V4 position bias (ape)
  std::vector<float> cur_kv, cur_score;    // [ratio, width], first `cur_count` rows valid
  int64_t cur_count = 0;
  void init(int64_t r, int64_t w) {
    ratio = r;
    width = w;
    prev_kv.assign(r * w, 0.0f);
    prev_score.assign(r * w, 0.0f);
    cur_kv.assign(r * w, 0.0f);
    cur_score.assign(r * w, 0.0f);
  }
};

struct LayerState {
  WindowRing window;
  RowPages compressed;  // compressed KV entries [n, head_dim]
  RowPages index_keys;  // indexer keys [n, index_head_dim]
  CompressorState compressor, index_compressor;
};

struct SequenceState {
  int64_t num_tokens = 0;  // tokens already processed = next position
  std::vector<LayerState> layers;
  // V4.1 Engram: the compressed token id of every processed position (one history serves all
  // engram layers; only the last max_ngram_size - 1 are read, §2.7).
  std::vector<int32_t> engram_ids;
  // V4.1 bounded replay: the decoder layers hold window KV only from this position on.
  int64_t replay_floor = 0;
  // pools: where window rings, compressed entries and index keys get their pages (null: own them).
  explicit SequenceState(const ModelConfig& cfg, const StatePools& pools = {});
};

}  // namespace deepinfer
