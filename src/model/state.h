// Per-sequence decode state of the V4 and V4.1 families (docs/v4-architecture.md §2.7), kept in fixed-size
// pages per kind (window rows, compressed entries, index keys) so a KV-cache manager can page
// each pool on its own. Values are the already fake-quantised latents, as float32. Everything lives
// on the model's device (host memory or HBM): the pointers handed out are that device's, and the
// model moves rows with copy_bytes().
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <vector>

#include "deepinfer/model_config.h"
#include "deepinfer/tensor.h"
#include "ops/ops.h"

namespace deepinfer {

// A pool of equal-sized float pages for one kind of per-sequence state (window rings, compressed
// entries, index keys). Pages are allocated on first use, at most `capacity` of them, and reused
// once released. The engine admits work only while its KvCacheManager's byte accounting fits the
// budget, so a pool does not run dry there; if it does (a bookkeeping bug) acquire() throws
// instead of growing past the budget.
class PagePool {
 public:
  PagePool(int64_t page_floats, int64_t capacity, Device device = Device::kCPU);
  float* acquire();
  void release(float* page);
  int64_t page_floats() const { return page_floats_; }
  int64_t capacity() const { return capacity_; }
  int64_t in_use() const;
  int64_t allocated() const;  // pages ever allocated (the pool's footprint)
  Device device() const { return device_; }

 private:
  int64_t page_floats_, capacity_;
  Device device_;
  mutable std::mutex mu_;  // the model may run on the engine's worker thread
  std::vector<Tensor> pages_;
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
  explicit RowPages(int64_t width = 0, std::shared_ptr<PagePool> pool = nullptr, Device device = Device::kCPU);
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
  Device device() const { return device_; }
  // Appends the rows of `src` (float32 [n, width], any device); page by page.
  void append_rows(const Tensor& src);
  // Appends the rows of `src` (float32 [n, width] contiguous on this store's device) as copies into `out`, a run per
  // page (ops::copy_rows: one launch for the appends of many sequences); the rows count from now, their values land
  // when the copies run.
  void append_copies(const Tensor& src, std::vector<ops::RowCopy>& out);
  // Copies rows [0, rows()) into dst (float32 [rows(), width] contiguous, any device); page by page.
  void copy_to(const Tensor& dst) const;
  // Rows [0, rows()) as runs of contiguous rows, page by page, appended to `out` (ops::gather_segments).
  void segments(std::vector<ops::RowSegment>& out) const;
  // Rows [0, rows()) as one paged segment (ops::RowSegment: the page addresses and, on CUDA, their copy in device
  // memory), appended to `out` unless the store is empty. The device copy is brought up to date here, by one upload of
  // the pages added since the last call (at decode, one page in 64 steps): the kernels that read the rows in place then
  // take the store as one entry of their launch's parameters, where a run per page made a long context's table too
  // large for them and cost an upload per layer and step.
  void paged_segment(std::vector<ops::RowSegment>& out) const;

 private:
  void clear();
  // Appends n rows in runs that each stay inside one page: run(first row of the run, its index among the n, rows).
  template <typename RunFn>
  void append_runs(int64_t n, RunFn&& run);
  int64_t width_;
  int64_t rows_ = 0;
  std::shared_ptr<PagePool> pool_;
  Device device_ = Device::kCPU;
  std::vector<float*> pages_;
  std::vector<Tensor> own_;  // without a pool
  // On CUDA, pages_'s addresses in device memory (int64 [capacity]); the first device_synced_ are current.
  mutable Tensor device_pages_;
  mutable int64_t device_synced_ = 0;
};

// Ring of the last `window` rows: slot = position mod window (one pool page when given).
class WindowRing {
 public:
  WindowRing() = default;
  WindowRing(int64_t window, int64_t width, std::shared_ptr<PagePool> pool = nullptr, Device device = Device::kCPU);
  ~WindowRing();
  WindowRing(WindowRing&& o) noexcept;
  WindowRing& operator=(WindowRing&& o) noexcept;
  WindowRing(const WindowRing&) = delete;
  WindowRing& operator=(const WindowRing&) = delete;

  float* slot(int64_t pos) { return data_ + (pos % window_) * width_; }
  const float* slot(int64_t pos) const { return data_ + (pos % window_) * width_; }
  int64_t window() const { return window_; }
  Device device() const { return device_; }
  // The rows of positions [p0, p1) (all within the last `window` positions) as runs of contiguous rows (up to the
  // ring's end, then from its start: at most two), appended to `out` (ops::gather_segments).
  void segments(int64_t p0, int64_t p1, std::vector<ops::RowSegment>& out) const;
  // The copies that write src rows (float32 [p1 - p0, width], contiguous on the ring's device) as positions
  // [p0, p1), p1 - p0 <= window, appended to `out` (ops::copy_rows).
  void write_copies(int64_t p0, int64_t p1, const Tensor& src, std::vector<ops::RowCopy>& out);

 private:
  void clear();
  int64_t window_ = 0, width_ = 0;
  std::shared_ptr<PagePool> pool_;
  Device device_ = Device::kCPU;
  float* data_ = nullptr;
  Tensor own_;
};

// Open-group state of one compressor: the FP32 kv and gate-score rows of the tokens of the group
// being filled and, with overlap (ratio 4), of the previous complete group (scores without the V4
// position bias `ape`, which compress_pool adds). On the model's device.
struct CompressorState {
  int64_t ratio = 0, width = 0;  // width = c * d
  Tensor prev_kv, prev_score;    // [ratio, width]
  Tensor cur_kv, cur_score;      // [ratio, width], first `cur_count` rows valid
  int64_t cur_count = 0;
  void init(int64_t r, int64_t w, Device device) {
    ratio = r;
    width = w;
    prev_kv = Tensor::zeros({r, w}, DType::kF32, device);
    // An empty previous group (kv 0, score -inf: what compress_pool reads without one), so that a batch's pooling can
    // read every state's previous group alike (compressor_pool_batch).
    prev_score = Tensor::full({r, w}, -std::numeric_limits<float>::infinity()).to(device);
    cur_kv = Tensor::zeros({r, w}, DType::kF32, device);
    cur_score = Tensor::zeros({r, w}, DType::kF32, device);
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
  // pools: where window rings, compressed entries and index keys get their pages (null: own them,
  // on `device`; pools bring their own device, which must be the same).
  explicit SequenceState(const ModelConfig& cfg, const StatePools& pools = {}, Device device = Device::kCPU);
};

}  // namespace deepinfer
