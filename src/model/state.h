// Per-sequence decode state of the V4 and V4.1 families (docs/v4-architecture.md §2.7), kept in fixed-size
// pages per kind (window rows, compressed entries, index keys) so a KV-cache manager can page
// each pool on its own. Values are the already fake-quantised latents, as float32.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "deepinfer/model_config.h"

namespace deepinfer {

// Append-only rows of fixed width, stored in pages of kRowsPerPage rows.
class RowPages {
 public:
  static constexpr int64_t kRowsPerPage = 64;
  explicit RowPages(int64_t width = 0) : width_(width) {}
  int64_t width() const { return width_; }
  int64_t rows() const { return rows_; }
  float* append();  // returns the new row (uninitialised)
  const float* row(int64_t i) const { return pages_[i / kRowsPerPage].get() + (i % kRowsPerPage) * width_; }
  float* row(int64_t i) { return pages_[i / kRowsPerPage].get() + (i % kRowsPerPage) * width_; }
  int64_t num_pages() const { return static_cast<int64_t>(pages_.size()); }

 private:
  int64_t width_;
  int64_t rows_ = 0;
  std::vector<std::unique_ptr<float[]>> pages_;
};

// Ring of the last `window` rows: slot = position mod window.
class WindowRing {
 public:
  WindowRing() = default;
  WindowRing(int64_t window, int64_t width) : window_(window), width_(width), data_(window * width) {}
  float* slot(int64_t pos) { return data_.data() + (pos % window_) * width_; }
  const float* slot(int64_t pos) const { return data_.data() + (pos % window_) * width_; }
  int64_t window() const { return window_; }

 private:
  int64_t window_ = 0, width_ = 0;
  std::vector<float> data_;
};

// Open-group state of one compressor: the FP32 kv and gate-score rows (ape already added) of the
// tokens of the group being filled and, with overlap (ratio 4), of the previous complete group.
struct CompressorState {
  int64_t ratio = 0, width = 0;  // width = c * d
  bool has_prev = false;
  std::vector<float> prev_kv, prev_score;  // [ratio, width]
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
  explicit SequenceState(const ModelConfig& cfg);
};

}  // namespace deepinfer
