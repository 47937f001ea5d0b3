#include "model/state.h"

#include <algorithm>
#include <utility>

#include "deepinfer/error.h"

namespace deepinfer {

PagePool::PagePool(int64_t page_floats, int64_t capacity) : page_floats_(page_floats), capacity_(capacity) {
  DI_CHECK(page_floats > 0 && capacity >= 0, "page pool: bad page size {} or capacity {}", page_floats, capacity);
}

float* PagePool::acquire() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!free_.empty()) {
    float* p = free_.back();
    free_.pop_back();
    return p;
  }
  DI_CHECK(static_cast<int64_t>(pages_.size()) < capacity_,
           "state pool exhausted: all {} pages of {} floats are in use (the KV budget accounting let too much in)",
           capacity_, page_floats_);
  pages_.push_back(std::make_unique<float[]>(page_floats_));
  return pages_.back().get();
}

void PagePool::release(float* page) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(page);
}

int64_t PagePool::in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(pages_.size() - free_.size());
}

int64_t PagePool::allocated() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(pages_.size());
}

RowPages::RowPages(int64_t width, std::shared_ptr<PagePool> pool) : width_(width), pool_(std::move(pool)) {
  DI_CHECK(!pool_ || pool_->page_floats() == kRowsPerPage * width_, "row pages of width {} from a pool of {}-float pages",
           width_, pool_ ? pool_->page_floats() : 0);
}
RowPages::~RowPages() { clear(); }
RowPages::RowPages(RowPages&& o) noexcept
    : width_(o.width_), rows_(o.rows_), pool_(std::move(o.pool_)), pages_(std::move(o.pages_)), own_(std::move(o.own_)) {
  o.rows_ = 0;
  o.pages_.clear();
}
RowPages& RowPages::operator=(RowPages&& o) noexcept {
  if (this != &o) {
    clear();
    width_ = o.width_;
    rows_ = std::exchange(o.rows_, 0);
    pool_ = std::move(o.pool_);
    pages_ = std::move(o.pages_);
    own_ = std::move(o.own_);
    o.pages_.clear();
  }
  return *this;
}
void RowPages::clear() {
  if (pool_)
    for (float* p : pages_) pool_->release(p);
  pages_.clear();
  own_.clear();
  rows_ = 0;
}

float* RowPages::append() {
  if (rows_ % kRowsPerPage == 0) {
    if (pool_) {
      pages_.push_back(pool_->acquire());
    } else {
      own_.push_back(std::make_unique<float[]>(kRowsPerPage * width_));
      pages_.push_back(own_.back().get());
    }
  }
  return row(rows_++);
}

WindowRing::WindowRing(int64_t window, int64_t width, std::shared_ptr<PagePool> pool)
    : window_(window), width_(width), pool_(std::move(pool)) {
  if (pool_) {
    DI_CHECK(pool_->page_floats() == window * width, "window ring of {}x{} from a pool of {}-float pages", window,
             width, pool_->page_floats());
    data_ = pool_->acquire();
  } else {
    own_ = std::make_unique<float[]>(window * width);
    data_ = own_.get();
  }
  std::fill(data_, data_ + window * width, 0.0f);
}
WindowRing::~WindowRing() { clear(); }
WindowRing::WindowRing(WindowRing&& o) noexcept
    : window_(o.window_), width_(o.width_), pool_(std::move(o.pool_)), data_(std::exchange(o.data_, nullptr)),
      own_(std::move(o.own_)) {}
WindowRing& WindowRing::operator=(WindowRing&& o) noexcept {
  if (this != &o) {
    clear();
    window_ = o.window_;
    width_ = o.width_;
    pool_ = std::move(o.pool_);
    data_ = std::exchange(o.data_, nullptr);
    own_ = std::move(o.own_);
  }
  return *this;
}
void WindowRing::clear() {
  if (pool_ && data_) pool_->release(data_);
  data_ = nullptr;
  own_.reset();
}

SequenceState::SequenceState(const ModelConfig& cfg, const StatePools& pools) {
  layers.resize(cfg.n_layers);
  if (cfg.family == ModelFamily::kV41) {
    // V4.1: every layer has its window ring; only kv sources hold compressed KV, index keys and
    // (ratio 2) the open pair of the compressor.
    for (int64_t l = 0; l < cfg.n_layers; ++l) {
      LayerState& s = layers[l];
      s.window = WindowRing(cfg.window_size, cfg.head_dim, pools.window);
      if (!cfg.is_kv_source(l)) continue;
      s.compressed = RowPages(cfg.head_dim, pools.compressed);
      s.index_keys = RowPages(cfg.index_head_dim, pools.index_keys);
      if (cfg.compress_ratio(l) > 1) s.compressor.init(cfg.compress_ratio(l), cfg.head_dim);
    }
    return;
  }
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    LayerState& s = layers[l];
    s.window = WindowRing(cfg.window_size, cfg.head_dim, pools.window);
    const int64_t r = cfg.compress_ratio(l);
    if (r > 0) {
      const int64_t c = r == 4 ? 2 : 1;
      s.compressed = RowPages(cfg.head_dim, pools.compressed);
      s.compressor.init(r, c * cfg.head_dim);
      if (r == 4) {
        s.index_keys = RowPages(cfg.index_head_dim, pools.index_keys);
        s.index_compressor.init(r, c * cfg.index_head_dim);
      }
    }
  }
}

}  // namespace deepinfer
